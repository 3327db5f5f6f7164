// Test harness for the paging rules (docs/design.md), shared by tests/kernels/paging_test.cc (host)
// and tests/gpu/paging_gpu_test.cc (CUDA parity):
//  - HostTier: a tier in anonymous memory (MAP_NORESERVE, so a > 4 GiB tier costs only the pages
//    a test touches) with its free ring;
//  - HostStash / HostReload: the paging.h functions driven the way the host backend drives them
//    (plan, copy by page-slot slices, publish head; pop, zero tail, return pages, publish tail);
//  - TierHolds: an independent check of a tier's bytes that does not use paging.h;
//  - PagingCase and PagingCases(): the test matrix, one named case per upstream branch.
#ifndef STASH_TESTS_KERNELS_PAGING_HARNESS_H_
#define STASH_TESTS_KERNELS_PAGING_HARNESS_H_

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "stash/kernels/paging.h"

namespace stash::kernels::test {

// The seed of a test's random inputs: $STASH_TEST_SEED when set (to replay a failure), else a
// fresh one.
inline uint64_t TestSeed() {
  const char* env = std::getenv("STASH_TEST_SEED");
  if (env != nullptr && *env != '\0') return std::strtoull(env, nullptr, 0);
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) ^ device();
}

// Declares `std::mt19937_64 rng` seeded by TestSeed(); the seed is printed with every failure
// of the enclosing scope and recorded as the test's `seed` property.
#define STASH_SEEDED_RNG(rng)                                             \
  const uint64_t rng##_seed = ::stash::kernels::test::TestSeed();         \
  SCOPED_TRACE(::testing::Message() << "STASH_TEST_SEED=" << rng##_seed); \
  ::testing::Test::RecordProperty("seed", std::to_string(rng##_seed));    \
  std::mt19937_64 rng(rng##_seed)

// The byte a tier holds at `tier_offset` before any stash: position dependent, so a copy to the
// wrong place or of the wrong length cannot leave it intact by accident.
inline uint8_t PatternByte(uint64_t tier_offset) {
  uint64_t x = (tier_offset + 1) * 0x9E3779B97F4A7C15ull;
  x ^= x >> 31;
  return static_cast<uint8_t>(x >> 56);
}

// The byte a destination holds before a reload.
constexpr uint8_t kUntouchedDst = 0xEE;
// The entry a page record holds before a stash.
constexpr uint64_t kUnwrittenRecord = 0xDEADBEEFDEADBEEFull;
// Tiers at most this large are watched whole; larger ones only around the pages a test uses.
constexpr uint64_t kWatchWholeTierBytes = uint64_t{64} << 20;

inline std::vector<uint8_t> RandomBytes(uint64_t n, std::mt19937_64& rng) {
  std::vector<uint8_t> bytes(n);
  for (auto& b : bytes) b = static_cast<uint8_t>(rng());
  return bytes;
}

// A tier (`capacity` pages of `page_bytes`) and its free ring: identity ids, head 0,
// tail = capacity (all free). Not copyable: the ring points into the object.
class HostTier {
 public:
  HostTier(uint64_t capacity, uint64_t page_bytes)
      : page_bytes_(page_bytes), bytes_(capacity * page_bytes), ids_(capacity) {
    if (bytes_ > 0) {
      void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (p != MAP_FAILED) base_ = static_cast<uint8_t*>(p);
    }
    std::iota(ids_.begin(), ids_.end(), uint64_t{0});
    ring_ = PageRing{ids_.data(), capacity, 0, capacity};
    if (bytes_ <= kWatchWholeTierBytes) {
      watched_.resize(capacity);
      std::iota(watched_.begin(), watched_.end(), uint64_t{0});
    }
  }
  ~HostTier() {
    if (base_ != nullptr) munmap(base_, bytes_);
  }
  HostTier(const HostTier&) = delete;
  HostTier& operator=(const HostTier&) = delete;

  bool mapped() const { return bytes_ == 0 || base_ != nullptr; }
  uint8_t* base() const { return base_; }
  uint64_t bytes() const { return bytes_; }
  uint64_t page_bytes() const { return page_bytes_; }
  uint64_t capacity() const { return ring_.capacity; }
  PageRing& ring() { return ring_; }
  const PageRing& ring() const { return ring_; }
  std::vector<uint64_t>& ids() { return ids_; }
  const std::vector<uint64_t>& ids() const { return ids_; }
  // The pages whose every byte the checks look at (all of them for a small tier).
  const std::vector<uint64_t>& watched() const { return watched_; }

  // Parks the ring: head at `head` (64-bit, any value), `free` pages free.
  void Park(uint64_t head, uint64_t free) {
    ring_.head = head;
    ring_.tail = head + free;
  }

  // A random permutation of the ids: an identity free list hides page-mapping bugs.
  void Permute(std::mt19937_64& rng) { std::shuffle(ids_.begin(), ids_.end(), rng); }

  // Moves the ids >= `threshold` to the ring slots starting at the head, in random order, so a
  // stash there lands in pages whose byte offsets are >= threshold * page_bytes. Keeps the ids a
  // permutation.
  void PutHighIdsAtHead(uint64_t threshold, std::mt19937_64& rng) {
    Permute(rng);
    std::stable_partition(ids_.begin(), ids_.end(),
                          [threshold](uint64_t id) { return id >= threshold; });
    const uint64_t cap = capacity();
    const uint64_t start = ring_.head % cap;  // ids_[0] must end up at slot `start`
    std::rotate(ids_.begin(), ids_.begin() + static_cast<int64_t>((cap - start) % cap), ids_.end());
  }

  // Watches the pages at ring slots [head, head + slots) and their neighbours (for tiers too big
  // to watch whole).
  void WatchRingWindow(uint64_t slots) {
    std::vector<uint64_t> pages = watched_;
    for (uint64_t s = 0; s < slots && s < capacity(); ++s) {
      const uint64_t id = ids_[(ring_.head + s) % capacity()];
      pages.push_back(id);
      if (id > 0) pages.push_back(id - 1);
      if (id + 1 < capacity()) pages.push_back(id + 1);
    }
    std::sort(pages.begin(), pages.end());
    pages.erase(std::unique(pages.begin(), pages.end()), pages.end());
    watched_ = pages;
  }

  // Writes the pattern over every watched page.
  void FillPattern() {
    for (uint64_t page : watched_) {
      for (uint64_t i = page * page_bytes_; i < (page + 1) * page_bytes_; ++i) {
        base_[i] = PatternByte(i);
      }
    }
  }

 private:
  uint64_t page_bytes_;
  uint64_t bytes_;
  uint8_t* base_ = nullptr;
  std::vector<uint64_t> ids_;
  std::vector<uint64_t> watched_;
  PageRing ring_{};
};

// One stash's request, as the client sends it.
struct StashGeometry {
  int64_t count = 0;      // raw count as read from memory
  uint32_t divisor = 1;   // 1 or 32 (0 = 1)
  uint64_t max_rows = 0;  // static row budget
  uint64_t row_bytes = 0;
  uint64_t max_bytes() const { return max_rows * row_bytes; }
};

// The tier a plan chose, or nullptr.
inline HostTier* PlacedTier(const StashPlan& plan, HostTier& device, HostTier* host) {
  if (plan.placement == Placement::kDevice) return &device;
  if (plan.placement == Placement::kHost) return host;
  return nullptr;
}

// A stash the way the host backend runs it: plan; copy the page slots in `slices` consecutive
// ranges, each on its own worker thread reading the ring at the plan's head snapshot; publish
// the head after every worker joined. `record` must hold PagesFor(max_bytes) entries.
inline StashPlan HostStash(const uint8_t* src, const StashGeometry& g, uint64_t page_bytes,
                           HostTier& device, HostTier* host, uint64_t* record, int slices = 1) {
  const StashPlan plan = PlanStash(g.count, g.divisor, g.max_rows, g.row_bytes, page_bytes,
                                   device.ring(), host != nullptr ? &host->ring() : nullptr);
  HostTier* tier = PlacedTier(plan, device, host);
  if (tier == nullptr) return plan;
  const PagedSpan span{tier->base(), page_bytes, record, plan.bytes};
  if (slices <= 1) {
    StashPages(src, tier->ring(), plan.head, span, 0, plan.pages);
  } else {
    const uint64_t per_slice = (plan.pages + slices - 1) / slices;
    std::vector<std::thread> workers;
    for (int i = 0; i < slices; ++i) {
      const uint64_t first = std::min(plan.pages, i * per_slice);
      const uint64_t end = std::min(plan.pages, first + per_slice);
      workers.emplace_back(
          [&, first, end] { StashPages(src, tier->ring(), plan.head, span, first, end); });
    }
    for (auto& worker : workers) worker.join();
  }
  tier->ring().head = plan.head + plan.pages;
  return plan;
}

// A reload the way the host backend runs it: pop, zero the tail if asked, return the pages in
// slot order at the tail, publish the tail. `dst` nullptr = release (return pages only).
inline void HostReload(uint8_t* dst, const StashPlan& plan, const StashGeometry& g,
                       uint64_t page_bytes, HostTier& device, HostTier* host,
                       const uint64_t* record, bool zero_tail) {
  HostTier* tier = PlacedTier(plan, device, host);
  if (tier == nullptr) return;
  const PagedSpan span{tier->base(), page_bytes, const_cast<uint64_t*>(record), plan.bytes};
  if (dst != nullptr) {
    PopPages(dst, span, 0, plan.pages);
    if (zero_tail) ZeroBytes(dst, plan.bytes, g.max_bytes());
  }
  ReturnPages(tier->ring(), tier->ring().tail, record, 0, plan.pages);
  tier->ring().tail += plan.pages;
}

// Independent of paging.h: every watched page of `tier` is as a stash of `bytes` bytes of `src`
// taken at ring slots [head_before, ...) of `ids_before` must leave it. The page at slot s holds
// src[s * page_bytes, ...) up to the stash's end, then the pattern; every other page is all
// pattern. bytes = 0 checks that the tier is all pattern.
inline ::testing::AssertionResult TierHolds(const HostTier& tier,
                                            const std::vector<uint64_t>& ids_before,
                                            uint64_t head_before, const uint8_t* src,
                                            uint64_t bytes) {
  const uint64_t pb = tier.page_bytes();
  std::unordered_map<uint64_t, uint64_t> slot_of_page;
  for (uint64_t s = 0; s * pb < bytes; ++s) {
    slot_of_page[ids_before[(head_before + s) % ids_before.size()]] = s;
  }
  for (uint64_t page : tier.watched()) {
    const auto owner = slot_of_page.find(page);
    for (uint64_t i = 0; i < pb; ++i) {
      const uint64_t offset = page * pb + i;
      uint8_t want = PatternByte(offset);
      const char* what = "pattern";
      if (owner != slot_of_page.end() && owner->second * pb + i < bytes) {
        want = src[owner->second * pb + i];
        what = "stash byte";
      }
      if (tier.base()[offset] != want) {
        return ::testing::AssertionFailure()
               << "page " << page << " byte " << i << " (tier offset " << offset << ") is "
               << int{tier.base()[offset]} << ", want " << what << " " << int{want};
      }
    }
  }
  return ::testing::AssertionSuccess();
}

// The ring's ids are a permutation of [0, capacity) (true at rest, when every page is free).
inline ::testing::AssertionResult RingIsPermutation(const HostTier& tier) {
  std::vector<uint64_t> sorted = tier.ids();
  std::sort(sorted.begin(), sorted.end());
  for (uint64_t i = 0; i < sorted.size(); ++i) {
    if (sorted[i] != i) {
      return ::testing::AssertionFailure()
             << "ring ids are not a permutation: sorted[" << i << "] = " << sorted[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// The ids in the ring's free window [head, tail), sorted. Slots outside the window hold stale
// ids of pages someone owns, so only the window is a set of free pages.
inline std::vector<uint64_t> FreeIds(const HostTier& tier) {
  std::vector<uint64_t> ids;
  for (uint64_t slot = tier.ring().head; slot != tier.ring().tail; ++slot) {
    ids.push_back(tier.ids()[slot % tier.capacity()]);
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

// One row of the test matrix: two tiers in a given state and one stash + reload.
struct PagingCase {
  std::string name;
  uint64_t page_bytes = 256;
  uint64_t device_pages = 16;  // device tier capacity
  uint64_t device_head = 0;    // parked head (monotonic)
  uint64_t device_free = 16;   // free pages at the head
  uint64_t host_pages = 0;     // host tier capacity; 0 = no host tier (nullptr to PlanStash)
  uint64_t host_head = 0;
  uint64_t host_free = 0;
  bool host_tier_empty = false;  // pass a host ring of capacity 0 instead of nullptr
  bool permute = true;           // shuffle both free lists
  bool high_ids = false;         // ids >= 2^32 / page_bytes at the device head (offsets > 2^32)
  StashGeometry geometry;
  uint64_t src_misalign = 0;  // source pointer offset from 16-byte alignment, 0..15
  uint64_t dst_misalign = 0;  // destination pointer offset, 0..15
  bool zero_tail = false;
  Placement expected = Placement::kDevice;
};

inline PagingCase NamedCase(const std::string& name) {
  PagingCase c;
  c.name = name;
  return c;
}

// gtest prints a case by its name.
inline void PrintTo(const PagingCase& c, std::ostream* os) { *os << c.name; }

inline uint64_t NeededPages(const PagingCase& c) {
  const uint32_t divisor = c.geometry.divisor == 0 ? 1 : c.geometry.divisor;
  if (c.geometry.count < 0) return 0;
  return PagesFor(
      (static_cast<uint64_t>(c.geometry.count) + divisor - 1) / divisor * c.geometry.row_bytes,
      c.page_bytes);
}

// The matrix of docs/design.md (upstream's branches, research/domain.md §5).
inline std::vector<PagingCase> PagingCases() {
  std::vector<PagingCase> cases;
  auto add = [&cases](PagingCase c) { cases.push_back(std::move(c)); };
  {  // Exactly one page.
    PagingCase c = NamedCase("single_page");
    c.device_pages = 8, c.device_free = 8;
    c.geometry = {4, 1, 8, 64};
    add(c);
  }
  {  // 700 bytes: neither a multiple of 16 nor of the page.
    PagingCase c = NamedCase("ragged_tail");
    c.geometry = {100, 1, 128, 7};
    add(c);
  }
  {  // Head at slot 14 of 16 (after three laps): slots 14, 15, 0, 1, 2.
    PagingCase c = NamedCase("ring_wrap_around");
    c.device_head = 3 * 16 + 14;
    c.geometry = {41, 1, 64, 31};
    add(c);
  }
  {  // Many pages over a shuffled list, head mid-ring, 64-byte ragged tail.
    PagingCase c = NamedCase("permuted_free_list");
    c.device_pages = 64, c.device_head = 37, c.device_free = 64;
    c.geometry = {300, 1, 320, 48};
    add(c);
  }
  {  // The device has one page too few: the whole stash goes to the host tier.
    PagingCase c = NamedCase("host_spill");
    c.device_head = 5, c.device_free = 3;
    c.host_pages = 32, c.host_head = 29, c.host_free = 32;
    c.geometry = {60, 1, 64, 16};
    c.expected = Placement::kHost;
    add(c);
  }
  {  // The device has exactly the pages: it wins over the host tier.
    PagingCase c = NamedCase("device_exact_fit");
    c.device_head = 5, c.device_free = 4;
    c.host_pages = 32, c.host_free = 32;
    c.geometry = {60, 1, 64, 16};
    add(c);
  }
  {  // Neither tier has the pages.
    PagingCase c = NamedCase("overflow");
    c.device_head = 5, c.device_free = 3;
    c.host_pages = 32, c.host_head = 7, c.host_free = 3;
    c.geometry = {60, 1, 64, 16};
    c.expected = Placement::kOverflow;
    add(c);
  }
  {  // The device is short and there is no host tier at all.
    PagingCase c = NamedCase("overflow_without_host_tier");
    c.device_free = 3;
    c.geometry = {60, 1, 64, 16};
    c.expected = Placement::kOverflow;
    add(c);
  }
  {  // The device is short and the host tier has no pages.
    PagingCase c = NamedCase("overflow_with_empty_host_tier");
    c.device_free = 3;
    c.host_tier_empty = true;
    c.geometry = {60, 1, 64, 16};
    c.expected = Placement::kOverflow;
    add(c);
  }
  {  // Zero rows: an empty stash on the device even with no free page; zero_tail zeroes it all.
    PagingCase c = NamedCase("zero_count");
    c.device_head = 16, c.device_free = 0;
    c.geometry = {0, 1, 40, 24};
    c.zero_tail = true;
    add(c);
  }
  {  // Upstream's case: 128-token buffer, hidden 16 bf16 (32 B rows), 64-token pages, max 65,
     // count 66. Both rows fit in the second page, but rows > max_rows.
    PagingCase c = NamedCase("count_over_max_rows");
    c.page_bytes = 2048, c.device_pages = 2, c.device_free = 2;
    c.geometry = {66, 1, 65, 32};
    c.expected = Placement::kOverflow;
    add(c);
  }
  {  // The same buffer at exactly max_rows fits.
    PagingCase c = NamedCase("count_at_max_rows");
    c.page_bytes = 2048, c.device_pages = 2, c.device_free = 2;
    c.geometry = {65, 1, 65, 32};
    add(c);
  }
  {  // Columnwise scale_inv: ceil(351 / 32) = 11 rows (the partial last block is a row).
    PagingCase c = NamedCase("divisor_32");
    c.geometry = {32 * 10 + 31, 32, 12, 96};
    add(c);
  }
  {  // A negative count is a bad request: nothing taken.
    PagingCase c = NamedCase("negative_count");
    c.geometry = {-5, 1, 64, 16};
    c.expected = Placement::kInvalidCount;
    add(c);
  }
  {  // 259 bytes: the last page holds 3 bytes, less than one vector.
    PagingCase c = NamedCase("tiny_last_page");
    c.geometry = {37, 1, 40, 7};
    c.zero_tail = true;
    add(c);
  }
  {  // Source and destination off 16-byte alignment.
    PagingCase c = NamedCase("unaligned_source_and_destination");
    c.geometry = {100, 1, 128, 7};
    c.src_misalign = 7, c.dst_misalign = 13;
    add(c);
  }
  {  // zero_tail after a ragged stash, up to a max that is not a multiple of 16 either:
     // [1200, 1524) of the destination becomes zero and nothing past it.
    PagingCase c = NamedCase("zero_tail");
    c.geometry = {100, 1, 127, 12};
    c.zero_tail = true;
    c.dst_misalign = 3;
    add(c);
  }
  {  // 64 KiB pages, several chunks each (a GPU block copies 16 KiB): 20 rows of 7168 bytes
     // over slots 6, 7, 0 of 8, ragged mid-chunk; zero tail up to 30 rows, destination unaligned.
    PagingCase c = NamedCase("large_pages");
    c.page_bytes = uint64_t{1} << 16;
    c.device_pages = 8, c.device_head = 2 * 8 + 6, c.device_free = 8;
    c.geometry = {20, 1, 30, 7168};
    c.zero_tail = true;
    c.dst_misalign = 5;
    add(c);
  }
  {  // 5 GiB tier of 64 KiB pages; the stash lands in pages >= 2^32 / 64 KiB and the head is
     // parked past 2^32 too. DeepSeek-V3-like 7168-byte rows, ragged last page.
    PagingCase c = NamedCase("offsets_past_4gib");
    c.page_bytes = uint64_t{1} << 16;
    c.device_pages = 81920;
    c.device_head = (uint64_t{1} << 32) + 12345;
    c.device_free = 81920;
    c.high_ids = true;
    c.geometry = {37, 1, 64, 7168};
    c.zero_tail = true;
    add(c);
  }
  return cases;
}

// The case of PagingCases() called `name`.
inline PagingCase FindPagingCase(const std::string& name) {
  for (PagingCase& c : PagingCases()) {
    if (c.name == name) return c;
  }
  ADD_FAILURE() << "no paging case named " << name;
  return NamedCase(name);
}

// A case made concrete: tiers in their starting state, the source, a destination, a record.
struct PreparedCase {
  PagingCase c;
  std::unique_ptr<HostTier> device;
  std::unique_ptr<HostTier> host;  // nullptr unless the case has a host tier
  std::vector<uint8_t> src_buffer;
  const uint8_t* src = nullptr;  // src_buffer + src_misalign
  std::vector<uint8_t> dst_buffer;
  uint8_t* dst = nullptr;  // dst_buffer + dst_misalign; 64 guard bytes after max_bytes
  std::vector<uint64_t> record;

  HostTier* host_or_null() const { return host.get(); }
};

// Bytes to add to `p` to reach a 16-byte boundary.
inline uint64_t AlignUp16(const void* p) { return (16 - reinterpret_cast<uintptr_t>(p) % 16) % 16; }

inline std::unique_ptr<PreparedCase> Prepare(const PagingCase& c, std::mt19937_64& rng) {
  auto p = std::make_unique<PreparedCase>();
  p->c = c;
  p->device = std::make_unique<HostTier>(c.device_pages, c.page_bytes);
  p->device->Park(c.device_head, c.device_free);
  if (c.high_ids) {
    p->device->PutHighIdsAtHead((uint64_t{1} << 32) / c.page_bytes + 1, rng);
  } else if (c.permute) {
    p->device->Permute(rng);
  }
  if (p->device->watched().empty()) p->device->WatchRingWindow(NeededPages(c) + 1);
  if (c.host_pages > 0 || c.host_tier_empty) {
    p->host = std::make_unique<HostTier>(c.host_pages, c.page_bytes);
    p->host->Park(c.host_head, c.host_free);
    if (c.permute) p->host->Permute(rng);
  }
  if (!p->device->mapped() || (p->host && !p->host->mapped())) return p;
  p->device->FillPattern();
  if (p->host) p->host->FillPattern();
  const uint64_t max_bytes = c.geometry.max_bytes();
  // Both pointers get exactly the misalignment the case asks for, whatever the allocator
  // returned: 16-byte aligned plus the case's offset.
  p->src_buffer = RandomBytes(max_bytes + 16 + c.src_misalign, rng);
  p->src = p->src_buffer.data() + AlignUp16(p->src_buffer.data()) + c.src_misalign;
  p->dst_buffer.assign(max_bytes + 16 + 64 + c.dst_misalign, kUntouchedDst);
  p->dst = p->dst_buffer.data() + AlignUp16(p->dst_buffer.data()) + c.dst_misalign;
  p->record.assign(PagesFor(max_bytes, c.page_bytes) + 1, kUnwrittenRecord);
  return p;
}

inline bool Mapped(const PreparedCase& p) {
  return p.device->mapped() && (!p.host || p.host->mapped());
}

}  // namespace stash::kernels::test

#endif  // STASH_TESTS_KERNELS_PAGING_HARNESS_H_
