// stash-bench-paging: the in-process parts of the data path, with Google Benchmark.
//
//   BM_RingAllocFree/<pages>   page ring alloc + free through the paging rules (PlanStash,
//                              RingPageAt into a page record, head publish; ReturnPages, tail
//                              publish) on a permuted free list of <pages> pages. O(1) per page:
//                              1k and 1M pages must run at the same rate.
//   BM_TierAllocFree/<pages>   the same through the daemon's Tier (its mutex, PublishAlloc/Free
//                              with their counters): what the pool worker pays per stash.
//   BM_Memcpy/<MiB>            one memcpy: the baseline of the copy kernels.
//   BM_StashPages/<MiB>/<KiB>  the host stash copy of a <MiB> stash into <KiB> pages of a
//   BM_PopPages/<MiB>/<KiB>    permuted ring, and the reload copy back.
//   BM_TicketId                RandomNonZeroU64, the ticket of a Stash() (a getrandom call).
//   BM_ThreadHandoff           a condition-variable round trip between two threads (two hops).
//   BM_PoolFirstTouch/<MiB>/<populate>   the first write into a fresh memfd pool region,
//                              page fault by page fault (0) or MAP_POPULATE'd (1).
//   BM_MapClientBuffer/<MiB>/<populate>  the first read through a new mapping of an existing
//                              client buffer (what the daemon's first copy from it pays).
//
// stash-bench runs this binary and puts its figures into its table; it also runs by hand.
#include <benchmark/benchmark.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "common/random.h"
#include "daemon/tiers/tier.h"
#include "stash/kernels/paging.h"

namespace {

namespace k = stash::kernels;

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;

// Stashes live at once (the layers between their forward and their backward) and pages each.
constexpr size_t kLiveStashes = 64;
constexpr uint64_t kPagesPerStash = 4;
constexpr uint64_t kRingPageBytes = 256 * kKiB;

// A free list after many steps: every page id once, in no particular order.
std::vector<uint64_t> PermutedIds(uint64_t pages) {
  std::vector<uint64_t> ids(pages);
  std::iota(ids.begin(), ids.end(), uint64_t{0});
  std::mt19937_64 rng(42);
  std::shuffle(ids.begin(), ids.end(), rng);
  return ids;
}

struct Record {
  uint64_t pages = 0;
  uint64_t ids[kPagesPerStash] = {};
};

// Takes a stash of kPagesPerStash pages from `ring` into `record` (the planning and ring part of
// a stash, without its copy) and publishes the new head.
inline void Alloc(k::PageRing& ring, Record& record) {
  const k::StashPlan plan = k::PlanStash(static_cast<int64_t>(kPagesPerStash), 1, kPagesPerStash,
                                         kRingPageBytes, kRingPageBytes, ring, nullptr);
  for (uint64_t slot = 0; slot < plan.pages; ++slot) {
    record.ids[slot] = k::RingPageAt(ring, plan.head, slot);
  }
  record.pages = plan.pages;
  ring.head += plan.pages;
}

// Returns a stash's pages to the ring's tail and publishes the new tail.
inline void Free(k::PageRing& ring, const Record& record) {
  k::ReturnPages(ring, ring.tail, record.ids, 0, record.pages);
  ring.tail += record.pages;
}

void BM_RingAllocFree(benchmark::State& state) {
  const auto pages = static_cast<uint64_t>(state.range(0));
  std::vector<uint64_t> ids = PermutedIds(pages);
  k::PageRing ring{ids.data(), pages, 0, pages};
  std::vector<Record> live(kLiveStashes);
  for (Record& r : live) Alloc(ring, r);
  size_t next = 0;
  for (auto _ : state) {
    // Backward returns the oldest stash while forward takes a new one: the ring keeps turning.
    Free(ring, live[next]);
    Alloc(ring, live[next]);
    benchmark::DoNotOptimize(live[next].ids);
    next = next + 1 == kLiveStashes ? 0 : next + 1;
  }
  if (k::RingFree(ring) != pages - kLiveStashes * kPagesPerStash) {
    state.SkipWithError("ring lost pages");
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * kPagesPerStash));
  state.SetLabel("items = page alloc+free pairs");
}
BENCHMARK(BM_RingAllocFree)->Arg(1024)->Arg(1 << 20);

void BM_TierAllocFree(benchmark::State& state) {
  const auto pages = static_cast<uint64_t>(state.range(0));
  // 4 KiB pages keep the tier's (never touched, MAP_NORESERVE) memory at 4 GiB of address space.
  auto tier = stash::daemon::Tier::Create("bench", 0, 4 * kKiB, pages);
  if (!tier.ok()) {
    state.SkipWithError(tier.status().ToString().c_str());
    return;
  }
  stash::daemon::Tier& t = **tier;
  auto take = [&](Record& r) {
    stash::MutexLock lock(&t.mu());
    const k::StashPlan plan = k::PlanStash(static_cast<int64_t>(kPagesPerStash), 1, kPagesPerStash,
                                           4 * kKiB, 4 * kKiB, t.ring(), nullptr);
    for (uint64_t slot = 0; slot < plan.pages; ++slot) {
      r.ids[slot] = k::RingPageAt(t.ring(), plan.head, slot);
    }
    r.pages = plan.pages;
    t.PublishAlloc(plan.pages, plan.pages * 4 * kKiB);
  };
  auto give = [&](const Record& r) {
    stash::MutexLock lock(&t.mu());
    k::ReturnPages(t.ring(), t.ring().tail, r.ids, 0, r.pages);
    t.PublishFree(r.pages, r.pages * 4 * kKiB);
  };
  std::vector<Record> live(kLiveStashes);
  for (Record& r : live) take(r);
  size_t next = 0;
  for (auto _ : state) {
    give(live[next]);
    take(live[next]);
    benchmark::DoNotOptimize(live[next].ids);
    next = next + 1 == kLiveStashes ? 0 : next + 1;
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * kPagesPerStash));
  state.SetLabel("items = page alloc+free pairs");
}
BENCHMARK(BM_TierAllocFree)->Arg(1024)->Arg(1 << 20);

struct FreeBytes {
  void operator()(uint8_t* p) const { std::free(p); }
};
using Bytes = std::unique_ptr<uint8_t[], FreeBytes>;

// Touched (so no page fault is timed), 64-byte aligned bytes; `bytes` is a multiple of 64.
Bytes Touched(uint64_t bytes, uint8_t fill) {
  Bytes p(static_cast<uint8_t*>(std::aligned_alloc(64, bytes)));
  std::memset(p.get(), fill, bytes);
  return p;
}

void BM_Memcpy(benchmark::State& state) {
  const uint64_t bytes = static_cast<uint64_t>(state.range(0)) * kMiB;
  auto src = Touched(bytes, 1);
  auto dst = Touched(bytes, 0);
  for (auto _ : state) {
    std::memcpy(dst.get(), src.get(), bytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}
BENCHMARK(BM_Memcpy)->Arg(64)->Unit(benchmark::kMillisecond)->UseRealTime();

// A stash of range(0) MiB in a tier of twice as many pages of range(1) KiB, permuted.
struct PagedFixture {
  PagedFixture(uint64_t bytes_in, uint64_t page_bytes_in)
      : bytes(bytes_in),
        page_bytes(page_bytes_in),
        pages(2 * k::PagesFor(bytes_in, page_bytes_in)),
        ids(PermutedIds(pages)),
        record(pages),
        src(Touched(bytes, 1)),
        dst(Touched(bytes, 0)),
        tier(Touched(pages * page_bytes, 0)),
        ring{ids.data(), pages, 0, pages},
        span{tier.get(), page_bytes, record.data(), bytes} {}

  uint64_t bytes, page_bytes, pages;
  std::vector<uint64_t> ids, record;
  Bytes src, dst, tier;
  k::PageRing ring;
  k::PagedSpan span;
};

void BM_StashPages(benchmark::State& state) {
  PagedFixture f(static_cast<uint64_t>(state.range(0)) * kMiB,
                 static_cast<uint64_t>(state.range(1)) * kKiB);
  const uint64_t n = k::PagesFor(f.bytes, f.page_bytes);
  for (auto _ : state) {
    k::StashPages(f.src.get(), f.ring, 0, f.span, 0, n);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * f.bytes));
}
BENCHMARK(BM_StashPages)
    ->Args({64, 64})
    ->Args({64, 256})
    ->Args({64, 1024})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_PopPages(benchmark::State& state) {
  PagedFixture f(static_cast<uint64_t>(state.range(0)) * kMiB,
                 static_cast<uint64_t>(state.range(1)) * kKiB);
  const uint64_t n = k::PagesFor(f.bytes, f.page_bytes);
  k::StashPages(f.src.get(), f.ring, 0, f.span, 0, n);
  for (auto _ : state) {
    k::PopPages(f.dst.get(), f.span, 0, n);
    benchmark::ClobberMemory();
  }
  if (std::memcmp(f.dst.get(), f.src.get(), f.bytes) != 0) state.SkipWithError("bytes differ");
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * f.bytes));
}
BENCHMARK(BM_PopPages)
    ->Args({64, 64})
    ->Args({64, 256})
    ->Args({64, 1024})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// A wake-up of a sleeping thread, the hop a stash takes twice more than a unary RPC: the daemon's
// gRPC thread hands the request to the pool worker (condition variable), and the client's gRPC
// thread hands the answer to the thread blocked in Wait. Each iteration is one round trip: two
// hops, so the time per hop is half the iteration time.
void BM_ThreadHandoff(benchmark::State& state) {
  std::mutex mu;
  std::condition_variable to_worker, to_caller;
  uint64_t sent = 0, answered = 0;  // guarded by mu
  bool stop = false;                // guarded by mu
  std::thread worker([&] {
    std::unique_lock<std::mutex> lock(mu);
    while (true) {
      to_worker.wait(lock, [&] { return stop || sent > answered; });
      if (stop) return;
      answered = sent;
      to_caller.notify_one();
    }
  });
  for (auto _ : state) {
    std::unique_lock<std::mutex> lock(mu);
    ++sent;
    to_worker.notify_one();
    to_caller.wait(lock, [&] { return answered == sent; });
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    stop = true;
  }
  to_worker.notify_one();
  worker.join();
  state.SetLabel("time = two hops");
}
BENCHMARK(BM_ThreadHandoff)->Unit(benchmark::kMicrosecond)->UseRealTime();

// The ticket every Stash() draws (and the request id of every other call): one getrandom(2).
void BM_TicketId(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(stash::RandomNonZeroU64());
}
BENCHMARK(BM_TicketId)->Unit(benchmark::kMicrosecond);

// One memfd region of `bytes` bytes, mapped shared like the daemon's tiers (MAP_NORESERVE).
uint8_t* MapMemfd(int fd, uint64_t bytes, int extra_flags) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | extra_flags, fd, 0);
  return p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
}

// The first stash into a cold pool: a fresh memfd region written once, its pages allocated by
// one page fault each (range(1) = 0, what Tier::Create does today) or up front by MAP_POPULATE
// (range(1) = 1).
void BM_PoolFirstTouch(benchmark::State& state) {
  const uint64_t bytes = static_cast<uint64_t>(state.range(0)) * kMiB;
  const int flags = MAP_NORESERVE | (state.range(1) != 0 ? MAP_POPULATE : 0);
  for (auto _ : state) {
    const int fd = memfd_create("stash-bench-pool", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      state.SkipWithError("memfd_create/ftruncate failed");
      break;
    }
    uint8_t* p = MapMemfd(fd, bytes, flags);
    close(fd);
    if (p == nullptr) {
      state.SkipWithError("mmap failed");
      break;
    }
    std::memset(p, 1, bytes);
    benchmark::ClobberMemory();
    munmap(p, bytes);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}
BENCHMARK(BM_PoolFirstTouch)
    ->Args({64, 0})
    ->Args({64, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// The first copy out of a client buffer the daemon has just mapped: the pages exist (the client
// wrote them), but this mapping takes one minor fault per page (range(1) = 0, today) unless it
// is mapped with MAP_POPULATE (range(1) = 1).
void BM_MapClientBuffer(benchmark::State& state) {
  const uint64_t bytes = static_cast<uint64_t>(state.range(0)) * kMiB;
  const int fd = memfd_create("stash-bench-client", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    state.SkipWithError("memfd_create/ftruncate failed");
    return;
  }
  uint8_t* client = MapMemfd(fd, bytes, 0);
  Bytes dst = Touched(bytes, 0);
  if (client == nullptr) {
    state.SkipWithError("mmap failed");
    close(fd);
    return;
  }
  std::memset(client, 1, bytes);
  const int flags = state.range(1) != 0 ? MAP_POPULATE : 0;
  for (auto _ : state) {
    uint8_t* p = MapMemfd(fd, bytes, flags);
    std::memcpy(dst.get(), p, bytes);
    benchmark::ClobberMemory();
    munmap(p, bytes);
  }
  munmap(client, bytes);
  close(fd);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}
BENCHMARK(BM_MapClientBuffer)
    ->Args({64, 0})
    ->Args({64, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
