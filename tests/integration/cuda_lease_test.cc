// Mapped mode's leases of GPU chunks from stashd --backend=cuda. Built twice: on the CUDA driver
// stand-in (tests/cuda_standin; ctest puts it first on LD_LIBRARY_PATH as libcuda.so.1 for this
// binary and the stashd it starts, in one registry, so the VRAM budget counts both processes),
// and as cuda_lease_gpu_test (label gpu, STASH_LEASES_ON_GPU) against the real driver in the
// GPU check, where it skips without a device. The daemon's pool is VMM chunks
// (daemon/cuda/vmm_chunk_memory.h) lent out of daemon-copy's device ring by kernels on its copy
// stream (daemon/cuda/cuda_chunk_lender.h). This test is the rank: it speaks the descriptor
// protocol raw (tests/integration/raw_lease.h), imports each chunk's POSIX fd and maps it with the
// client library's CudaLeaseMemory, as mapped mode's GPU seam will.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "client/mapped/cuda/cuda_lease_memory.h"
#include "common/cuda_driver.h"
#include "stash/client.h"
#include "tests/cuda_device.h"
#include "tests/integration/daemon_stats.h"
#include "tests/integration/harness.h"
#include "tests/integration/host_buffers.h"
#include "tests/integration/raw_lease.h"

namespace stash::testing {

using client::CudaLeaseMemory;
namespace {

namespace v1 = stash::v1;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kPage = 64 << 10;
constexpr uint64_t kChunk = 2 << 20;  // the stand-in's (and an H100's) allocation granularity
constexpr uint64_t kChunkPages = kChunk / kPage;

class CudaLeases : public ::testing::Test {
 protected:
  void SetUp() override {
#if defined(STASH_LEASES_ON_GPU)
    std::string why;
    d_ = DriverWithADevice(&why);
    if (d_ == nullptr) GTEST_SKIP() << why;
#else
    setenv("STASH_STANDIN_REGISTRY", registry_.path().c_str(), 1);
    setenv("STASH_STANDIN_DEVICES", "2", 1);
    ASSERT_NE(std::getenv("LD_LIBRARY_PATH"), nullptr) << "run it through ctest";
    auto driver = CudaDriver::Get();
    ASSERT_TRUE(driver.ok()) << driver.status().ToString();
    ASSERT_EQ((*driver)->Init(0), CUDA_SUCCESS);
    d_ = *driver;
#endif
  }
  void TearDown() override { unsetenv("STASH_STANDIN_VRAM_BYTES"); }
  // A pool of 8 MiB on each GPU: 4 chunks of 32 pages.
  void StartDaemon(const std::vector<std::string>& more = {}) {
    std::vector<std::string> flags = {"--backend=cuda", "--page-bytes=64KiB", "--pool-bytes=8MiB",
                                      "--chunk-bytes=2MiB", "--host-tier-bytes=0"};
    flags.insert(flags.end(), more.begin(), more.end());  // a later --pool-bytes wins
    daemon_ = std::make_unique<DaemonProcess>(flags);
    ASSERT_TRUE(daemon_->Ready()) << daemon_->process().Stderr();
  }
  v1::TierStats Gpu(int device) { return TierNamed("gpu" + std::to_string(device)); }
  // GPU `device`'s share of the host tier.
  v1::TierStats Host(int device) { return TierNamed("host" + std::to_string(device)); }
  v1::TierStats TierNamed(const std::string& name) {
    const v1::GetStatsResponse stats = DaemonStats(daemon_->socket());
    for (const v1::TierStats& t : stats.tiers()) {
      if (t.name() == name) return t;
    }
    return {};
  }
  std::string RawUuid(int device) {
    CUdevice dev = 0;
    EXPECT_EQ(d_->DeviceGet(&dev, device), CUDA_SUCCESS);
    CUuuid uuid{};
    EXPECT_EQ(d_->DeviceGetUuid(&uuid, dev), CUDA_SUCCESS);
    return std::string(reinterpret_cast<const char*>(uuid.bytes), 16);
  }
  // The bytes of a mapped slot, read through the driver as a kernel would see them.
  std::vector<uint8_t> Read(const CudaLeaseMemory& memory, uint64_t slot,
                            uint32_t tier = kernels::kLeaseDevice) {
    std::vector<uint8_t> out(kChunk);
    const PrimaryContext::Scope scope(*context_);
    const auto at = reinterpret_cast<CUdeviceptr>(memory.base(tier) + slot * kChunk);
    EXPECT_EQ(d_->MemcpyDtoH(out.data(), at, kChunk), CUDA_SUCCESS);
    return out;
  }
  // A daemon-copy client of the daemon (device 0, no host spill unless asked); null when it
  // cannot open.
  std::unique_ptr<Client> DaemonCopier(bool allow_host_spill = false) {
    Options o;
    o.socket = daemon_->socket();
    o.backend = Backend::kCuda;
    o.allow_host_spill = allow_host_spill;
    auto copier = Client::Open(o);
    EXPECT_TRUE(copier.ok()) << copier.status().ToString();
    return copier.ok() ? std::move(copier).value() : nullptr;
  }
  // Unmaps slots [0, slots) of `tier` (their work was on the legacy stream) and reaps until the
  // GPU finished that work; returns how many slots are free again.
  static size_t UnmapAndReap(CudaLeaseMemory& memory, uint64_t slots,
                             uint32_t tier = kernels::kLeaseDevice) {
    for (uint64_t slot = 0; slot < slots; ++slot) {
      EXPECT_TRUE(memory.Unmap(tier, slot, nullptr).ok());
    }
    size_t freed = 0;
    for (const Clock::time_point until = Clock::now() + std::chrono::seconds(10 * TimeScale());
         freed < slots && Clock::now() < until;) {
      freed += memory.Reap().freed.size();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return freed;
  }
  void Fill(const CudaLeaseMemory& memory, uint64_t slot, uint8_t value,
            uint32_t tier = kernels::kLeaseDevice) {
    const PrimaryContext::Scope scope(*context_);
    const auto at = reinterpret_cast<CUdeviceptr>(memory.base(tier) + slot * kChunk);
    EXPECT_EQ(d_->MemsetD8Async(at, value, kChunk, nullptr), CUDA_SUCCESS);
    EXPECT_EQ(d_->CtxSynchronize(), CUDA_SUCCESS);
  }
  std::unique_ptr<CudaLeaseMemory> Memory() {
    auto context = PrimaryContext::Retain(d_, 0);
    EXPECT_TRUE(context.ok()) << context.status().ToString();
    context_ = std::make_unique<PrimaryContext>(std::move(context).value());
    auto memory = CudaLeaseMemory::Create(d_, 0, kChunk, {8 * kChunk, 0, 4 * kChunk});
    EXPECT_TRUE(memory.ok()) << memory.status().ToString();
    return memory.ok() ? std::move(memory).value() : nullptr;
  }

  TempDir registry_;
  const CudaDriver* d_ = nullptr;
  std::unique_ptr<PrimaryContext> context_;
  std::unique_ptr<DaemonProcess> daemon_;
};

// A mapped session on the cuda backend leases GPU chunks: each comes with its GPU's UUID and a
// VMM export this process imports and maps, zero-filled; daemon-copy stashes stay out of leased
// chunks while they are held; returned chunks go back to daemon-copy's ring, and chunks
// daemon-copy wrote are renewed before they are lent again (a new lease reads zeros only).
TEST_F(CudaLeases, GpuChunksAreLentZeroedWithTheirGpusUuidAndDaemonCopyStaysOutOfThem) {
  StartDaemon();
  RawSession session(daemon_->socket(), getpid(), v1::MODE_MAPPED, v1::BACKEND_CUDA);
  ASSERT_FALSE(session.welcome().session_id().empty());
  EXPECT_EQ(session.welcome().chunk_bytes(), kChunk);
  UniqueFd channel = ConnectUnix(daemon_->socket() + ".fd");
  ASSERT_TRUE(channel.valid());
  Lease lease = AskLease(channel.get(), session.welcome().session_id(),
                         session.welcome().descriptor_secret(), 2 * kChunkPages);
  ASSERT_EQ(lease.last.code(), 0) << lease.last.message();
  ASSERT_EQ(lease.chunks.size(), 2u);
  EXPECT_EQ(Gpu(0).chunks_leased(), 2u);
  EXPECT_EQ(Gpu(0).pages_used(), 2 * kChunkPages);

  auto memory = Memory();
  ASSERT_NE(memory, nullptr);
  for (size_t i = 0; i < lease.chunks.size(); ++i) {
    const v1::LeasedChunk& chunk = lease.leased[i];
    EXPECT_EQ(chunk.tier(), v1::TIER_DEVICE);
    EXPECT_EQ(chunk.bytes(), kChunk);
    EXPECT_EQ(chunk.gpu_uuid(), RawUuid(0)) << "the chunk names its GPU by UUID";
    ASSERT_TRUE(
        memory->Map(kernels::kLeaseDevice, i, std::move(lease.chunks[i]), chunk.bytes(), 0).ok());
    const std::vector<uint8_t> bytes = Read(*memory, i);
    EXPECT_EQ(std::count(bytes.begin(), bytes.end(), 0), static_cast<long>(kChunk))
        << "chunk " << i << " starts zero-filled";
    Fill(*memory, i, static_cast<uint8_t>(0xa0 + i));
  }

  // Daemon-copy fills what is left of the pool (two chunks) and no more: a 64-page stash fits,
  // another overflows, and the leased chunks keep this rank's bytes.
  std::unique_ptr<Client> copier = DaemonCopier();
  ASSERT_NE(copier, nullptr);
  auto src = Buffer(2 * kChunk, 7);
  auto first = copier->Wait(*copier->Stash(Args(*src, kPage, 2 * kChunkPages)));
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->tier, Tier::kDevice);
  auto second = copier->Wait(*copier->Stash(Args(*src, kPage, 1)));
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(second->tier, Tier::kOverflow) << "the leased chunks are out of daemon-copy's ring";
  for (uint64_t slot = 0; slot < 2; ++slot) {
    const std::vector<uint8_t> bytes = Read(*memory, slot);
    EXPECT_EQ(std::count(bytes.begin(), bytes.end(), 0xa0 + slot), static_cast<long>(kChunk))
        << "daemon-copy wrote into leased chunk " << slot;
  }
  auto dst = Buffer(2 * kChunk);
  ASSERT_TRUE(copier->Wait(*copier->Reload({first->ticket, dst.get(), 0, false, {}, {}})).ok());
  EXPECT_EQ(std::memcmp(dst->data(), src->data(), 2 * kChunk), 0);

  // Returned while this process lives, the chunks stay charged to it (it may still hold their
  // memory: renewing them would leave that VRAM alive and counted nowhere): daemon-copy does not
  // get them, and leasing again gives this rank the same chunks, with its own bytes.
  ASSERT_EQ(UnmapAndReap(*memory, 2), 2u);
  ASSERT_EQ(AskReturn(channel.get(), session.welcome().session_id(),
                      session.welcome().descriptor_secret(), lease.ids),
            0);
  EXPECT_EQ(Gpu(0).chunks_leased(), 0u);
  EXPECT_EQ(Gpu(0).chunks_kept(), 2u) << "kept for this rank until its process exits";
  EXPECT_EQ(Gpu(0).chunks_orphaned(), 0u);
  EXPECT_EQ(Gpu(0).pages_used(), 2 * kChunkPages);
  auto three = Buffer(3 * kChunk, 9);
  auto over = copier->Wait(*copier->Stash(Args(*three, kPage, 3 * kChunkPages)));
  ASSERT_TRUE(over.ok()) << over.status().ToString();
  EXPECT_EQ(over->tier, Tier::kOverflow) << "a kept chunk went back to daemon-copy";
  Lease again = AskLease(channel.get(), session.welcome().session_id(),
                         session.welcome().descriptor_secret(), 2 * kChunkPages);
  ASSERT_EQ(again.last.code(), 0) << again.last.message();
  ASSERT_EQ(again.chunks.size(), 2u);
  std::vector<uint64_t> before = lease.ids, after = again.ids;
  std::sort(before.begin(), before.end());
  std::sort(after.begin(), after.end());
  EXPECT_EQ(after, before) << "the kept chunks come back first";
  for (size_t i = 0; i < again.chunks.size(); ++i) {
    ASSERT_TRUE(memory->Map(kernels::kLeaseDevice, i, std::move(again.chunks[i]), kChunk, 0).ok());
    const size_t was = static_cast<size_t>(
        std::find(lease.ids.begin(), lease.ids.end(), again.ids[i]) - lease.ids.begin());
    const std::vector<uint8_t> bytes = Read(*memory, i);
    EXPECT_EQ(std::count(bytes.begin(), bytes.end(), 0xa0 + was), static_cast<long>(kChunk))
        << "the same allocation, not a new one";
  }
  EXPECT_EQ(Gpu(0).chunks_leased(), 2u);
  EXPECT_EQ(Gpu(0).chunks_kept(), 0u);
  EXPECT_EQ(Gpu(1).chunks_leased(), 0u) << "GPU 1's pool lends nothing to GPU 0's rank";
}

// A forked rank that leases `pages` device pages (and `host_pages` of its GPU's host tier share,
// each host chunk filled with 0x5a through a mapping of its memfd) in a mapped session this
// process opens for it (`*session`, which says Hello with the child's pid) and then exits, or
// waits to be killed when `hold`. Returns how many chunks it got (-100 - code when the lease
// failed); `*pid` is the child's. Syscalls and protobuf only in the child (a child of a gRPC
// process).
int LeaseInChild(const std::string& socket, uint64_t pages, bool hold, pid_t* pid,
                 std::unique_ptr<RawSession>* session, uint64_t host_pages = 0) {
  int to_child[2];
  int report[2];
  if (pipe2(to_child, O_CLOEXEC) != 0 || pipe2(report, O_CLOEXEC) != 0) return -1;
  *pid = fork();
  if (*pid == 0) {
    char ids[64];
    size_t got = 0;
    while (got < sizeof(ids)) {
      const ssize_t n = read(to_child[0], ids + got, sizeof(ids) - got);
      if (n <= 0) _exit(1);
      got += static_cast<size_t>(n);
    }
    UniqueFd c = ConnectUnix(socket + ".fd");
    Lease lease =
        AskLease(c.get(), std::string(ids, 32), std::string(ids + 32, 32), pages, host_pages);
    for (size_t i = 0; i < lease.chunks.size(); ++i) {
      if (lease.leased[i].tier() != v1::TIER_HOST) continue;
      void* p = mmap(nullptr, lease.leased[i].bytes(), PROT_READ | PROT_WRITE, MAP_SHARED,
                     lease.chunks[i].get(), 0);
      if (p == MAP_FAILED) _exit(1);
      std::memset(p, 0x5a, lease.leased[i].bytes());
      munmap(p, lease.leased[i].bytes());
    }
    const int n =
        lease.last.code() == 0 ? static_cast<int>(lease.chunks.size()) : -100 - lease.last.code();
    if (write(report[1], &n, sizeof(n)) != sizeof(n)) _exit(1);
    if (hold) pause();
    _exit(0);
  }
  close(to_child[0]);
  close(report[1]);
  *session = std::make_unique<RawSession>(socket, *pid, v1::MODE_MAPPED, v1::BACKEND_CUDA,
                                          /*allow_host_spill=*/host_pages > 0);
  const std::string hello =
      (*session)->welcome().session_id() + (*session)->welcome().descriptor_secret();
  int n = -1;
  if (write(to_child[1], hello.data(), hello.size()) != static_cast<ssize_t>(hello.size()) ||
      read(report[0], &n, sizeof(n)) != sizeof(n)) {
    n = -1;
  }
  close(to_child[1]);
  close(report[0]);
  return n;
}

// The host tier's share of a GPU lends its chunks to that GPU's mapped sessions: memfds the rank
// maps and registers for its GPU, zero-filled, with no GPU UUID. Daemon-copy spills stay out of
// them while they are held; a chunk a live rank returns stays charged to it until it exits (the
// daemon populated and locked it, and the rank may keep its descriptor) and is lent back to it
// first; once the rank exits, its chunks get fresh memory and take daemon-copy's spills again,
// and a chunk daemon-copy wrote is renewed before it is lent.
TEST_F(CudaLeases, HostTierChunksAreLentFromTheSessionsGpuShare) {
  // 16 MiB of host tier over 2 GPUs: 4 chunks each.
  StartDaemon({"--host-tier-bytes=16MiB"});
  EXPECT_EQ(Host(0).chunks_total(), 4u);
  EXPECT_EQ(Host(1).chunks_total(), 4u);
  std::unique_ptr<Client> copier = DaemonCopier(/*allow_host_spill=*/true);
  ASSERT_NE(copier, nullptr);
  auto pool = Buffer(4 * kChunk, 3);
  auto in_pool = copier->Wait(*copier->Stash(Args(*pool, kPage, 4 * kChunkPages)));
  ASSERT_TRUE(in_pool.ok()) << in_pool.status().ToString();
  EXPECT_EQ(in_pool->tier, Tier::kDevice) << "daemon-copy fills the pool; what follows spills";
  auto spill = Buffer(3 * kChunk, 5);

  // A rank leases two host chunks, writes them and exits: they come back renewed and take a
  // spill of three chunks, byte for byte.
  std::unique_ptr<RawSession> child;
  pid_t pid = 0;
  ASSERT_EQ(LeaseInChild(daemon_->socket(), 0, /*hold=*/false, &pid, &child, 2 * kChunkPages), 2);
  waitpid(pid, nullptr, 0);
  const Clock::time_point exited = Clock::now();
  while (Host(0).chunks_leased() + Host(0).chunks_kept() + Host(0).chunks_orphaned() +
             Host(0).chunks_waiting() !=
         0) {
    ASSERT_LT(Clock::now() - exited, std::chrono::seconds(10 * TimeScale()));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  auto spilled = copier->Wait(*copier->Stash(Args(*spill, kPage, 3 * kChunkPages)));
  ASSERT_TRUE(spilled.ok()) << spilled.status().ToString();
  ASSERT_EQ(spilled->tier, Tier::kHost);
  auto dst = Buffer(3 * kChunk);
  ASSERT_TRUE(copier->Wait(*copier->Reload({spilled->ticket, dst.get(), 0, false, {}, {}})).ok());
  EXPECT_EQ(std::memcmp(dst->data(), spill->data(), 3 * kChunk), 0);

  // This process's session: its GPU's share only, zero-filled (the child's bytes and the
  // spill's are gone), no GPU UUID.
  RawSession session(daemon_->socket(), getpid(), v1::MODE_MAPPED, v1::BACKEND_CUDA,
                     /*allow_host_spill=*/true);
  ASSERT_FALSE(session.welcome().session_id().empty());
  EXPECT_EQ(session.welcome().host_tier_pages(), 4 * kChunkPages) << "this GPU's share";
  UniqueFd channel = ConnectUnix(daemon_->socket() + ".fd");
  ASSERT_TRUE(channel.valid());
  Lease lease = AskLease(channel.get(), session.welcome().session_id(),
                         session.welcome().descriptor_secret(), 0, 2 * kChunkPages);
  ASSERT_EQ(lease.last.code(), 0) << lease.last.message();
  ASSERT_EQ(lease.chunks.size(), 2u);
  EXPECT_EQ(Host(0).chunks_leased(), 2u);
  EXPECT_EQ(Host(1).chunks_leased(), 0u) << "GPU 1's share lends nothing to GPU 0's rank";
  EXPECT_EQ(Gpu(0).chunks_leased(), 0u);
  auto memory = Memory();
  ASSERT_NE(memory, nullptr);
  for (size_t i = 0; i < lease.chunks.size(); ++i) {
    const v1::LeasedChunk& chunk = lease.leased[i];
    EXPECT_EQ(chunk.tier(), v1::TIER_HOST);
    EXPECT_EQ(chunk.bytes(), kChunk);
    EXPECT_TRUE(chunk.gpu_uuid().empty()) << "host memory names no GPU";
    ASSERT_TRUE(
        memory->Map(kernels::kLeaseHost, i, std::move(lease.chunks[i]), chunk.bytes(), -1).ok());
    const std::vector<uint8_t> bytes = Read(*memory, i, kernels::kLeaseHost);
    EXPECT_EQ(std::count(bytes.begin(), bytes.end(), 0), static_cast<long>(kChunk))
        << "host chunk " << lease.ids[i] << " was lent without fresh memory";
    Fill(*memory, i, static_cast<uint8_t>(0xb0 + i), kernels::kLeaseHost);
  }
  // Two chunks of the share are free: a three-chunk spill does not fit, and no spill touches
  // the leased ones.
  auto refused = copier->Wait(*copier->Stash(Args(*spill, kPage, 3 * kChunkPages)));
  ASSERT_TRUE(refused.ok()) << refused.status().ToString();
  EXPECT_EQ(refused->tier, Tier::kOverflow) << "a spill went into a leased host chunk";

  // Returned while this process lives: kept for it (not renewed, not spilled into), and lent
  // back to it first, with its own bytes.
  ASSERT_EQ(UnmapAndReap(*memory, 2, kernels::kLeaseHost), 2u);
  ASSERT_EQ(AskReturn(channel.get(), session.welcome().session_id(),
                      session.welcome().descriptor_secret(), lease.ids),
            0);
  EXPECT_EQ(Host(0).chunks_leased(), 0u);
  EXPECT_EQ(Host(0).chunks_kept(), 2u);
  auto still = copier->Wait(*copier->Stash(Args(*spill, kPage, 3 * kChunkPages)));
  ASSERT_TRUE(still.ok()) << still.status().ToString();
  EXPECT_EQ(still->tier, Tier::kOverflow) << "a kept host chunk went back to daemon-copy";
  Lease again = AskLease(channel.get(), session.welcome().session_id(),
                         session.welcome().descriptor_secret(), 0, 2 * kChunkPages);
  ASSERT_EQ(again.last.code(), 0) << again.last.message();
  ASSERT_EQ(again.chunks.size(), 2u);
  for (size_t i = 0; i < again.chunks.size(); ++i) {
    ASSERT_TRUE(memory->Map(kernels::kLeaseHost, i, std::move(again.chunks[i]), kChunk, -1).ok());
    const size_t was = static_cast<size_t>(
        std::find(lease.ids.begin(), lease.ids.end(), again.ids[i]) - lease.ids.begin());
    ASSERT_LT(was, lease.ids.size()) << "the kept chunks come back first";
    const std::vector<uint8_t> bytes = Read(*memory, i, kernels::kLeaseHost);
    EXPECT_EQ(std::count(bytes.begin(), bytes.end(), 0xb0 + was), static_cast<long>(kChunk));
  }
}

// Leases and returns race daemon-copy's stashes and reloads on the same copy stream: a chunk is
// taken out of the ring only between two whole operations (a stash is three kernels, a reload
// two, and the ring is consistent only between them), so every reload is byte-exact, no page is
// lost or doubled, and at the end a stash of the whole pool fits.
TEST_F(CudaLeases, LeasesRacingDaemonCopyTrafficNeverTearTheRing) {
  // The daemon's host thread is slow between launches: without its launch lock, a take or
  // return would land inside a stash or reload.
  setenv("STASH_STANDIN_LAUNCH_DELAY_US", "300", 1);
  StartDaemon();
  unsetenv("STASH_STANDIN_LAUNCH_DELAY_US");
  std::unique_ptr<Client> copier = DaemonCopier();
  ASSERT_NE(copier, nullptr);
  std::atomic<bool> stop{false};
  std::atomic<int> wrong{0}, rounds{0};
  std::thread traffic([&] {
    // Eight stashes in flight, then their reloads: the pool worker launches back to back.
    for (uint32_t i = 0; !stop.load(); i += 8) {
      std::vector<std::unique_ptr<HostBuffer>> sources;
      std::vector<uint64_t> ops;
      for (uint32_t k = 0; k < 8; ++k) {
        const uint64_t pages = 1 + (i + k) * 7 % 20;  // may straddle chunks, or not fit
        sources.push_back(Buffer(pages * kPage, 1000 + i + k));
        auto op = copier->Stash(Args(*sources.back(), kPage, pages));
        if (!op.ok()) {
          ++wrong;
          return;
        }
        ops.push_back(*op);
      }
      std::vector<std::unique_ptr<HostBuffer>> dests(8);
      std::vector<uint64_t> reloads(8, 0);
      for (uint32_t k = 0; k < 8; ++k) {
        auto stash = copier->Wait(ops[k]);
        if (!stash.ok()) {
          ++wrong;
          continue;
        }
        if (stash->tier != Tier::kDevice) continue;  // overflow: nothing stored
        dests[k] = Buffer(sources[k]->size());
        auto op = copier->Reload({stash->ticket, dests[k].get(), 0, false, {}, {}});
        if (op.ok()) reloads[k] = *op;
      }
      for (uint32_t k = 0; k < 8; ++k) {
        if (dests[k] == nullptr) continue;
        if (reloads[k] == 0 || !copier->Wait(reloads[k]).ok() ||
            std::memcmp(dests[k]->data(), sources[k]->data(), sources[k]->size()) != 0) {
          ++wrong;
        }
        ++rounds;
      }
    }
  });
  // Ranks that lease one to three chunks and exit: each lease takes chunks out of the ring, and
  // each exit renews them and puts them back, while the traffic runs.
  for (int i = 0; i < 120; ++i) {
    std::unique_ptr<RawSession> session;
    pid_t pid = 0;
    EXPECT_GE(
        LeaseInChild(daemon_->socket(), (1 + i % 3) * kChunkPages, /*hold=*/false, &pid, &session),
        0);
    waitpid(pid, nullptr, 0);
  }
  const Clock::time_point all_exited = Clock::now();
  while (Gpu(0).chunks_leased() + Gpu(0).chunks_kept() + Gpu(0).chunks_waiting() != 0 ||
         Gpu(0).pages_used() != 0) {
    ASSERT_LT(Clock::now() - all_exited, std::chrono::seconds(10 * TimeScale()));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  stop = true;
  traffic.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_GT(rounds.load(), 0);
  EXPECT_EQ(Gpu(0).chunks_leased(), 0u);
  EXPECT_EQ(Gpu(0).pages_used(), 0u);
  auto whole = Buffer(4 * kChunk, 77);
  auto all = copier->Wait(*copier->Stash(Args(*whole, kPage, 4 * kChunkPages)));
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  ASSERT_EQ(all->tier, Tier::kDevice) << "every page is back in the ring, once";
  auto dst = Buffer(4 * kChunk);
  ASSERT_TRUE(copier->Wait(*copier->Reload({all->ticket, dst.get(), 0, false, {}, {}})).ok());
  EXPECT_EQ(std::memcmp(dst->data(), whole->data(), 4 * kChunk), 0);
}

// A rank SIGKILLed while it holds GPU chunks: they are back in the pool within a second, renewed
// (the daemon's VRAM does not grow by them), daemon-copy can use the whole pool again, and a
// chunk daemon-copy wrote is renewed before it is lent (a new lease reads zeros only).
TEST_F(CudaLeases, ChunksOfASigkilledRankComeBackWithinASecond) {
  StartDaemon();
  std::unique_ptr<RawSession> child;
  pid_t pid = 0;
  EXPECT_EQ(LeaseInChild(daemon_->socket(), 3 * kChunkPages, /*hold=*/true, &pid, &child), 3);
  EXPECT_EQ(Gpu(0).chunks_leased(), 3u);

  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  const Clock::time_point killed = Clock::now();
  while (Gpu(0).chunks_leased() + Gpu(0).chunks_waiting() != 0 || Gpu(0).pages_used() != 0) {
    ASSERT_LT(Clock::now() - killed, std::chrono::seconds(10 * TimeScale()));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_LE(Clock::now() - killed, std::chrono::seconds(1 * TimeScale()));

  std::unique_ptr<Client> copier = DaemonCopier();
  ASSERT_NE(copier, nullptr);
  auto whole = Buffer(4 * kChunk, 3);
  auto all = copier->Wait(*copier->Stash(Args(*whole, kPage, 4 * kChunkPages)));
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_EQ(all->tier, Tier::kDevice) << "every chunk is back in daemon-copy's ring";
  auto released = copier->Release(all->ticket);
  ASSERT_TRUE(released.ok()) << released.status().ToString();
  ASSERT_TRUE(copier->Wait(*released).ok());

  // Every chunk leased now held daemon-copy's bytes: each is renewed before it is lent. (One of
  // the four stays for another user's first session: daemon/fair_share.h.)
  auto memory = Memory();
  ASSERT_NE(memory, nullptr);
  RawSession session(daemon_->socket(), getpid(), v1::MODE_MAPPED, v1::BACKEND_CUDA);
  UniqueFd channel = ConnectUnix(daemon_->socket() + ".fd");
  Lease lease = AskLease(channel.get(), session.welcome().session_id(),
                         session.welcome().descriptor_secret(), 4 * kChunkPages);
  ASSERT_EQ(lease.last.code(), 0) << lease.last.message();
  ASSERT_EQ(lease.chunks.size(), 3u);
  for (size_t i = 0; i < lease.chunks.size(); ++i) {
    ASSERT_TRUE(memory->Map(kernels::kLeaseDevice, i, std::move(lease.chunks[i]), kChunk, 0).ok());
    const std::vector<uint8_t> bytes = Read(*memory, i);
    EXPECT_EQ(std::count(bytes.begin(), bytes.end(), 0), static_cast<long>(kChunk))
        << "chunk " << lease.ids[i] << " was lent with daemon-copy's bytes";
  }
}

// The daemon SIGKILLed while this rank maps seven of its eight chunks: the mappings stay valid
// (the bytes are the rank's), and a stashd restarted on the same socket starts although the GPU
// now has less free memory than its pool: the killed one's lock file says its pool was there, and
// its chunks come back as the rank unmaps them. The new pool starts with the one chunk that fits
// (the others wait, out of the ring) and the waiting ones join within seconds of the unmap.
TEST_F(CudaLeases, ARestartedDaemonStartsWhileARankStillMapsTheOldChunks) {
#if defined(STASH_LEASES_ON_GPU)
  GTEST_SKIP() << "sizes the GPU with the driver stand-in's STASH_STANDIN_VRAM_BYTES";
#endif
  const std::vector<std::string> flags = {"--pool-bytes=16MiB",
                                          "--socket=" + registry_.path() + "/stashd.sock"};
  // What one daemon takes of a GPU (its pool and its buffers beside it, in the stand-in's 2 MiB
  // units), measured on a first daemon; then GPUs of exactly that.
  StartDaemon(flags);
  size_t free_bytes = 0, total_bytes = 0;
  {
    auto context = PrimaryContext::Retain(d_, 0);
    ASSERT_TRUE(context.ok());
    const PrimaryContext::Scope scope(*context);
    ASSERT_EQ(d_->MemGetInfo(&free_bytes, &total_bytes), CUDA_SUCCESS);
  }
  const uint64_t daemon_bytes = total_bytes - free_bytes;
  ASSERT_EQ(daemon_->process().StopWith(SIGTERM, std::chrono::seconds(10)), 0);
  setenv("STASH_STANDIN_VRAM_BYTES", std::to_string(daemon_bytes).c_str(), 1);
  StartDaemon(flags);
  auto memory = Memory();
  ASSERT_NE(memory, nullptr);
  {
    RawSession session(daemon_->socket(), getpid(), v1::MODE_MAPPED, v1::BACKEND_CUDA);
    UniqueFd channel = ConnectUnix(daemon_->socket() + ".fd");
    Lease lease = AskLease(channel.get(), session.welcome().session_id(),
                           session.welcome().descriptor_secret(), 7 * kChunkPages);
    ASSERT_EQ(lease.last.code(), 0) << lease.last.message();
    ASSERT_EQ(lease.chunks.size(), 7u);
    for (uint64_t i = 0; i < 7; ++i) {
      ASSERT_TRUE(
          memory->Map(kernels::kLeaseDevice, i, std::move(lease.chunks[i]), kChunk, 0).ok());
      Fill(*memory, i, static_cast<uint8_t>(0x70 + i));
    }
    daemon_->process().StopWith(SIGKILL, std::chrono::seconds(5));
  }
  for (uint64_t i = 0; i < 7; ++i) {
    const std::vector<uint8_t> bytes = Read(*memory, i);
    EXPECT_EQ(std::count(bytes.begin(), bytes.end(), 0x70 + i), static_cast<long>(kChunk))
        << "the rank's chunk " << i << " outlives the daemon";
  }

  // The GPU has the new daemon's buffers and one chunk free: 2 MiB of a 16 MiB pool.
  StartDaemon(flags);
  const std::string log = daemon_->process().Stderr();
  EXPECT_NE(log.find("did not stop cleanly"), std::string::npos) << log;
  EXPECT_NE(log.find("7 of 8 chunks of the pool have no room"), std::string::npos) << log;
  EXPECT_EQ(Gpu(0).pages_used(), 7 * kChunkPages) << "the waiting chunks are not in the pool";
  EXPECT_EQ(Gpu(0).chunks_waiting(), 7u);
  ASSERT_EQ(UnmapAndReap(*memory, 7), 7u);
  const Clock::time_point unmapped = Clock::now();
  while (Gpu(0).pages_used() != 0) {
    ASSERT_LT(Clock::now() - unmapped, std::chrono::seconds(10 * TimeScale()))
        << daemon_->process().Stderr();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::unique_ptr<Client> copier = DaemonCopier();
  ASSERT_NE(copier, nullptr);
  auto whole = Buffer(8 * kChunk, 5);
  auto all = copier->Wait(*copier->Stash(Args(*whole, kPage, 8 * kChunkPages)));
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_EQ(all->tier, Tier::kDevice) << "the waiting chunks joined the pool";

  // Stopped cleanly, it leaves no record: the next start counts nothing that is not free (a
  // GPU of 14 MiB: the free-memory check refuses the 16 MiB pool, naming the free memory).
  copier.reset();
  ASSERT_EQ(daemon_->process().StopWith(SIGTERM, std::chrono::seconds(10)), 0);
  setenv("STASH_STANDIN_VRAM_BYTES", std::to_string(7 * kChunk).c_str(), 1);
  DaemonProcess refused({"--backend=cuda", "--page-bytes=64KiB", "--chunk-bytes=2MiB",
                         "--host-tier-bytes=0", "--pool-bytes=16MiB",
                         "--socket=" + registry_.path() + "/stashd.sock"});
  EXPECT_FALSE(refused.Ready());
  EXPECT_NE(refused.process().Stderr().find("does not fit GPU 0"), std::string::npos)
      << refused.process().Stderr();
}

}  // namespace
}  // namespace stash::testing
