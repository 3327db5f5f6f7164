// The GPU check's mapped-mode steps (docs/gpu-check.md, issue 23), as gtests built twice from this
// file: mapped_check_gpu_test (label gpu: a real GPU through libcuda, skipped without one) and
// mapped_check_standin_test (every machine: the same steps on the driver stand-in,
// tests/cuda_standin, TEST AID, NEVER A BACKEND, so the steps themselves are known to run before
// a GPU ever sees them).
//   1. An imported chunk outlives its exporter's SIGKILL and its memory is freed on the last
//      unmap (MappedCheck.AnImportedChunkOutlivesItsExportersSigkill).
//   2. Renewing a chunk whose holder unmapped first does not double memory; create (renew) and
//      import (map) latency, p50 and p99 (MappedCheck.RenewingAfterTheHolderUnmappedTakesNoMore
//      Memory; the numbers are printed as "check: ..." lines).
//   3. Capture in global and thread-local modes while another thread maps and unmaps other
//      slots of the same reservation, then 1,000 replays during that churn, bytes checked
//      (MappedCheck/Churn.CaptureAndReplaysSurviveMappingChurn).
//   4. The control block a replayed graph publishes at each step is read whole by another
//      process the whole time (MappedCheck.AnotherProcessReadsThePublishedBlockWhole); paging
//      under capture with changing counts, spills and overflows is stream_copier_gpu_test's.
// Steps 5 and 6 are benchmarks (stash-bench-gpu mapped-overlap and peer, check.sh's
// bench_mapped_overlap and bench_peer).
//
// The exporter of step 1 is this binary run again (STASH_MAPPED_CHECK_EXPORTER): a process that
// forked after CUDA started cannot use CUDA, so it must exec. It dies with the test (its socket's
// hangup, PR_SET_PDEATHSIG, and the test's guard), so a failed step never leaves it holding the
// test's stdout for ctest to wait on.
//
// The test threads make the primary context current with cuCtxSetCurrent, never with a
// PrimaryContext::Scope: a Scope also sets the thread's capture interaction mode to relaxed, and
// step 3 must see that the library's own calls are relaxed, not the test's.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "client/mapped/cuda/cuda_lease_memory.h"
#include "client/mapped/cuda/stream_copier.h"
#include "common/cuda_driver.h"
#include "common/cuda_vmm.h"
#include "common/descriptor_socket.h"
#include "common/unique_fd.h"
#include "daemon/cuda/vmm_chunk_memory.h"
#include "stash/kernels/mapped_paging.h"
#if defined(STASH_MAPPED_CHECK_ON_GPU)
#include "stash/kernels/mapped_paging_fatbin.h"
#else
#endif

extern char** environ;

namespace stash::client {
namespace {

using daemon::VmmChunkMemory;
using kernels::kLeaseDevice;

constexpr const char* kExporterVariable = "STASH_MAPPED_CHECK_EXPORTER";
constexpr uint8_t kSeed = 0x3c;
constexpr uint64_t kPage = 64 << 10;  // the pools' page size (the copiers' page_bytes below)
// Step 1's chunk, at least this (whole granularity units): a chunk's return must stand out from
// what other users of a shared GPU do to its free memory meanwhile.
constexpr uint64_t kStep1ChunkBytes = uint64_t{64} << 20;

// The driver this build checks, initialised; null with `why` when there is none (no GPU).
const CudaDriver* Driver(std::string* why) {
#if defined(STASH_MAPPED_CHECK_ON_GPU)
  auto got = CudaDriver::Get();
  if (!got.ok()) {
    *why = got.status().ToString();
    return nullptr;
  }
  int count = 0;
  if ((*got)->DeviceGetCount(&count) != CUDA_SUCCESS || count == 0) {
    *why = "the driver lists no device";
    return nullptr;
  }
  return *got;
#else
  (void)why;
  static const CudaDriver* driver = [] {
    if (getenv("STASH_STANDIN_REGISTRY") == nullptr) {
      static char dir[] = "/tmp/stash-mapped-check-XXXXXX";
      if (mkdtemp(dir) == nullptr) std::abort();
      setenv("STASH_STANDIN_REGISTRY", dir, 1);  // the exporter inherits it
    }
    auto loaded = CudaDriver::Load(STASH_CUDA_STANDIN_LIBRARY);
    if (!loaded.ok() || (*loaded)->Init(0) != CUDA_SUCCESS) std::abort();
    return loaded->release();
  }();
  return driver;
#endif
}

const void* Fatbin() {
#if defined(STASH_MAPPED_CHECK_ON_GPU)
  return stash_mapped_paging_fatbin;
#else
  return "no image: the stand-in runs host twins";
#endif
}

// A device address as the pointer the copier's requests take: the one int-to-pointer cast.
template <typename T = void>
T* AsPointer(CUdeviceptr address) {
  return reinterpret_cast<T*>(address);  // NOLINT(performance-no-int-to-ptr)
}

std::vector<uint8_t> Pattern(uint64_t bytes, uint8_t seed) {
  std::vector<uint8_t> v(bytes);
  for (uint64_t i = 0; i < bytes; ++i) v[i] = static_cast<uint8_t>(seed + i * 131 + (i >> 12));
  return v;
}

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t at = std::min(values.size() - 1, static_cast<size_t>(p * (values.size() - 1)));
  return values[at];
}

double MicrosSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t).count();
}

// Kills and reaps a child process when the scope ends (a failed ASSERT returns early), unless
// the test already reaped it (Release).
class KillOnExit {
 public:
  explicit KillOnExit(pid_t pid) : pid_(pid) {}
  KillOnExit(const KillOnExit&) = delete;
  KillOnExit& operator=(const KillOnExit&) = delete;
  ~KillOnExit() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  void Release() { pid_ = -1; }

 private:
  pid_t pid_;
};

// The exporter process of step 1: one chunk of ordinal 0 holding Pattern(kSeed), its fd sent on
// `socket`, then it waits to be killed. It exits when the test goes away: SIGKILL when the test
// process dies, and a return when its socket hangs up.
int RunExporter(int socket) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  std::string why;
  const CudaDriver* d = Driver(&why);
  if (d == nullptr) return 2;
  auto granularity = [&]() -> uint64_t {
    const CUmemAllocationProp prop = ChunkAllocationProp(0);
    size_t g = 0;
    return d->MemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) ==
                   CUDA_SUCCESS
               ? g
               : 0;
  }();
  if (granularity == 0) return 3;
  const uint64_t chunk = (kStep1ChunkBytes + granularity - 1) / granularity * granularity;
  auto pool = VmmChunkMemory::Create(d, 0, "check-exporter", chunk, chunk, kPage);
  if (!pool.ok() || !(*pool)->Ensure(0).ok()) return 4;
  auto context = PrimaryContext::Retain(d, 0);
  if (!context.ok()) return 5;
  {
    const PrimaryContext::Scope scope(*context);
    const std::vector<uint8_t> bytes = Pattern(chunk, kSeed);
    // From pageable memory the copy may land after the call returns: wait for it before the
    // chunk leaves this process.
    if (d->MemcpyHtoD(reinterpret_cast<CUdeviceptr>((*pool)->base()), bytes.data(), bytes.size()) !=
            CUDA_SUCCESS ||
        d->StreamSynchronize(CU_STREAM_LEGACY) != CUDA_SUCCESS) {
      return 6;
    }
  }
  auto fd = (*pool)->ExportFd(0);
  if (!fd.ok()) return 7;
  if (!SendPacket(socket, std::to_string(chunk), {fd->get()}).ok()) return 8;
  fd->reset();
  // The test sends nothing more: any event on the socket is its hangup (the test ended, or
  // failed before it killed this process).
  pollfd hangup{socket, POLLRDHUP, 0};
  while (poll(&hangup, 1, -1) < 0 && errno == EINTR) {
  }
  return 0;
}

class MappedCheck : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    driver_ = Driver(&why);
    if (driver_ == nullptr) GTEST_SKIP() << "no CUDA device: " << why;
    auto context = PrimaryContext::Retain(driver_, 0);
    ASSERT_TRUE(context.ok()) << context.status().ToString();
    context_ = std::make_unique<PrimaryContext>(std::move(*context));
    // Current, with the thread's capture interaction mode left as it is (not a Scope).
    ASSERT_EQ(driver_->CtxSetCurrent(context_->get()), CUDA_SUCCESS);
    ASSERT_EQ(driver_->StreamCreate(&stream_, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    const CUmemAllocationProp prop = ChunkAllocationProp(0);
    size_t g = 0;
    ASSERT_EQ(driver_->MemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
              CUDA_SUCCESS);
    chunk_ = g;
  }
  void TearDown() override {
    if (stream_ != nullptr) {
      (void)driver_->StreamSynchronize(stream_);
      (void)driver_->StreamDestroy(stream_);
    }
    for (CUdeviceptr p : allocations_) (void)driver_->MemFree(p);
    if (context_ != nullptr) (void)driver_->CtxSetCurrent(nullptr);
    context_.reset();
  }

  uint64_t FreeBytes() {
    size_t free = 0, total = 0;
    EXPECT_EQ(driver_->MemGetInfo(&free, &total), CUDA_SUCCESS);
    return free;
  }
  std::vector<uint8_t> Read(const void* at, uint64_t bytes) {
    std::vector<uint8_t> out(bytes);
    EXPECT_EQ(driver_->MemcpyDtoH(out.data(), reinterpret_cast<CUdeviceptr>(at), bytes),
              CUDA_SUCCESS);
    return out;
  }
  // From pageable memory the copy may land after the call returns, on the legacy stream, which
  // the test's non-blocking stream does not wait for: Write waits for it.
  void Write(void* at, const std::vector<uint8_t>& bytes) {
    ASSERT_EQ(driver_->MemcpyHtoD(reinterpret_cast<CUdeviceptr>(at), bytes.data(), bytes.size()),
              CUDA_SUCCESS);
    ASSERT_EQ(driver_->StreamSynchronize(CU_STREAM_LEGACY), CUDA_SUCCESS);
  }
  CUdeviceptr Alloc(uint64_t bytes) {
    CUdeviceptr p = 0;
    EXPECT_EQ(driver_->MemAlloc(&p, bytes), CUDA_SUCCESS);
    allocations_.push_back(p);
    return p;
  }
  // Unmaps `slot` of the device tier once the stream's work is done.
  void UnmapNow(CudaLeaseMemory& lease, uint64_t slot) {
    ASSERT_TRUE(lease.Unmap(kLeaseDevice, slot, stream_).ok());
    ASSERT_EQ(driver_->StreamSynchronize(stream_), CUDA_SUCCESS);
    const CudaLeaseMemory::Reaped reaped = lease.Reap();
    ASSERT_TRUE(reaped.status.ok()) << reaped.status.ToString();
  }

  const CudaDriver* driver_ = nullptr;
  std::unique_ptr<PrimaryContext> context_;
  CUstream stream_ = nullptr;
  uint64_t chunk_ = 0;
  std::vector<CUdeviceptr> allocations_;
};

// Step 1.
TEST_F(MappedCheck, AnImportedChunkOutlivesItsExportersSigkill) {
  int sockets[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sockets), 0);
  UniqueFd socket(sockets[0]);
  UniqueFd theirs(sockets[1]);
  // Ours stays out of the exporter, so that the test's end hangs its socket up.
  ASSERT_EQ(fcntl(socket.get(), F_SETFD, FD_CLOEXEC), 0);
  const std::string variable = std::string(kExporterVariable) + "=" + std::to_string(theirs.get());
  std::vector<char*> env;
  for (char** e = environ; *e != nullptr; ++e) env.push_back(*e);
  env.push_back(const_cast<char*>(variable.c_str()));
  env.push_back(nullptr);
  char self[] = "/proc/self/exe";
  char* argv[] = {self, nullptr};
  pid_t pid = 0;
  ASSERT_EQ(posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, env.data()), 0);
  KillOnExit exporter(pid);
  theirs.reset();
  ASSERT_TRUE(WaitReadable(socket.get(), 60000).ok()) << "the exporter sent nothing in 60 s";
  auto packet = ReceivePacket(socket.get());
  ASSERT_TRUE(packet.ok()) << packet.status().ToString();
  ASSERT_EQ(packet->fds.size(), 1u) << "exporter: " << packet->bytes;
  const uint64_t bytes = std::stoull(packet->bytes);

  auto lease = CudaLeaseMemory::Create(driver_, 0, bytes, {bytes, bytes, bytes});
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  const uint64_t free_unmapped = FreeBytes();
  ASSERT_TRUE((*lease)->Map(kLeaseDevice, 0, std::move(packet->fds[0]), bytes, 0).ok());
  const std::vector<uint8_t> pattern = Pattern(bytes, kSeed);
  EXPECT_EQ(Read((*lease)->base(kLeaseDevice), bytes), pattern);

  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  exporter.Release();
  EXPECT_TRUE(WIFSIGNALED(status));
  // The exporter's handle died with it; the mapping alone keeps the memory.
  EXPECT_EQ(Read((*lease)->base(kLeaseDevice), bytes), pattern);
  const std::vector<uint8_t> again = Pattern(bytes, kSeed + 1);
  Write((*lease)->base(kLeaseDevice), again);
  EXPECT_EQ(Read((*lease)->base(kLeaseDevice), bytes), again);
  // The dead exporter's own context may be freed a while after its death: its memory must not
  // count as the chunk's below. Free memory that stays put for 200 ms (at most 2 s of waiting).
  uint64_t free_mapped = FreeBytes();
  for (int settle = 0; settle < 10; ++settle) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const uint64_t now = FreeBytes();
    if (now == free_mapped) break;
    free_mapped = now;
  }

  UnmapNow(**lease, 0);
  // The driver may return the memory a little after the unmap: up to 2 s for half a chunk (not
  // all of it: other users of a shared GPU allocate meanwhile).
  uint64_t free_after = FreeBytes();
  for (int waited_ms = 0; free_after < free_mapped + bytes / 2 && waited_ms < 2000;
       waited_ms += 10) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    free_after = FreeBytes();
  }
  std::printf(
      "check: step 1 chunk %llu B; free bytes with the exporter alive %llu, after its "
      "SIGKILL while mapped %llu, after the last unmap %llu\n",
      static_cast<unsigned long long>(bytes), static_cast<unsigned long long>(free_unmapped),
      static_cast<unsigned long long>(free_mapped), static_cast<unsigned long long>(free_after));
  // The last unmap frees the chunk (at least half of it, for other users of a shared GPU).
  EXPECT_GE(free_after, free_mapped + bytes / 2);
  EXPECT_GE(bytes, kStep1ChunkBytes);
}

// Step 2.
TEST_F(MappedCheck, RenewingAfterTheHolderUnmappedTakesNoMoreMemory) {
  constexpr uint64_t kChunks = 4;
  constexpr int kRounds = 40;
  auto pool = VmmChunkMemory::Create(driver_, 0, "check-renew", kChunks * chunk_, chunk_, kPage);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  for (uint64_t c = 0; c < kChunks; ++c) ASSERT_TRUE((*pool)->Ensure(c).ok());
  auto lease = CudaLeaseMemory::Create(driver_, 0, chunk_, {kChunks * chunk_, chunk_, chunk_});
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  std::vector<double> create_us, import_us;
  uint64_t worst_growth = 0;
  for (int round = 0; round < kRounds; ++round) {
    const uint64_t c = static_cast<uint64_t>(round) % kChunks;
    auto fd = (*pool)->ExportFd(c);
    ASSERT_TRUE(fd.ok()) << fd.status().ToString();
    auto t = std::chrono::steady_clock::now();
    ASSERT_TRUE((*lease)->Map(kLeaseDevice, c, std::move(*fd), chunk_, 0).ok());
    import_us.push_back(MicrosSince(t));
    // The holder leaves bytes behind, so a renew that skipped its zero-fill shows even on a
    // GPU that happens to hand back zeroed memory.
    const std::vector<uint8_t> written = Pattern(chunk_, static_cast<uint8_t>(0x40 + round));
    Write((*lease)->base(kLeaseDevice) + c * chunk_, written);
    ASSERT_EQ(Read((*pool)->base() + c * chunk_, chunk_), written) << "chunk " << c;
    UnmapNow(**lease, c);  // the holder unmaps first
    const uint64_t before = FreeBytes();
    t = std::chrono::steady_clock::now();
    ASSERT_TRUE((*pool)->Renew(c).ok());
    create_us.push_back(MicrosSince(t));
    const uint64_t after = FreeBytes();
    if (before > after) worst_growth = std::max(worst_growth, before - after);
    ASSERT_EQ(Read((*pool)->base() + c * chunk_, chunk_), std::vector<uint8_t>(chunk_, 0))
        << "renewed chunk " << c << " in round " << round;
  }
  std::printf(
      "check: step 2 renew (unmap, release, create, map, zero) p50 %.1f us p99 %.1f us; "
      "import (import, map, set access) p50 %.1f us p99 %.1f us; most free memory lost "
      "by one renew %llu B (chunk %llu B)\n",
      Percentile(create_us, 0.5), Percentile(create_us, 0.99), Percentile(import_us, 0.5),
      Percentile(import_us, 0.99), static_cast<unsigned long long>(worst_growth),
      static_cast<unsigned long long>(chunk_));
  // A renew releases before it creates: it never holds a second chunk's memory. The readings
  // are taken before and after a renew, so on a GPU with room to spare a renew that created
  // before it released would pass too; the order only shows under memory pressure, where
  // creating first fails. vmm_chunk_memory_test checks the order against a tight budget on the
  // stand-in (VmmChunkMemory.RenewReleasesTheOldMemoryBeforeCreatingTheNew).
  EXPECT_LT(worst_growth, chunk_);
}

// Step 4.
TEST_F(MappedCheck, AnotherProcessReadsThePublishedBlockWhole) {
  constexpr int kReplays = 1000;
  auto pool = VmmChunkMemory::Create(driver_, 0, "check-publish", chunk_, chunk_, kPage);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  ASSERT_TRUE((*pool)->Ensure(0).ok());
  auto lease = CudaLeaseMemory::Create(driver_, 0, chunk_, {chunk_, chunk_, chunk_});
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  auto fd = (*pool)->ExportFd(0);
  ASSERT_TRUE(fd.ok());
  ASSERT_TRUE((*lease)->Map(kLeaseDevice, 0, std::move(*fd), chunk_, 0).ok());

  // The shared block: shared memory this process and the reader map, registered for the GPU.
  const size_t block_bytes = kernels::kControlBlockBytes;
  void* block =
      mmap(nullptr, block_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(block, MAP_FAILED);
  auto* shared = new (block) kernels::SessionControl{};
  shared->magic = kernels::kControlMagic;
  shared->version = kernels::kControlVersion;

  const uint64_t row_bytes = 4096, rows = 64;
  const uint64_t bytes = row_bytes * rows;
  // The reader: takes snapshots until told to stop; every whole one must agree with itself
  // (one stash, one reload and one step a replay, all placed). Forked before the block is
  // registered: a driver may mark registered pages MADV_DONTFORK, and the child would fault on
  // them. It reads plain shared memory only (no CUDA in a forked child), and dies with the test.
  int to_reader[2], from_reader[2];
  ASSERT_EQ(pipe(to_reader), 0);
  ASSERT_EQ(pipe(from_reader), 0);
  const pid_t reader = fork();
  ASSERT_GE(reader, 0);
  if (reader == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    close(to_reader[1]);
    close(from_reader[0]);
    fcntl(to_reader[0], F_SETFL, O_NONBLOCK);
    uint64_t whole = 0, torn = 0, seen_steps = 0;
    char byte = 0;
    kernels::SessionControl snapshot{};
    while (read(to_reader[0], &byte, 1) < 0) {
      if (!kernels::ReadPublishedControl(*shared, &snapshot)) continue;
      ++whole;
      seen_steps = std::max(seen_steps, snapshot.steps);
      torn += snapshot.stashes != snapshot.steps || snapshot.reloads != snapshot.steps ||
                      snapshot.bytes_stashed != snapshot.steps * bytes
                  ? 1
                  : 0;
    }
    const uint64_t out[3] = {whole, torn, seen_steps};
    _exit(write(from_reader[1], out, sizeof(out)) == sizeof(out) ? 0 : 1);
  }
  KillOnExit reader_guard(reader);
  close(to_reader[0]);
  close(from_reader[1]);
  const UniqueFd to_reader_fd(to_reader[1]);
  const UniqueFd from_reader_fd(from_reader[0]);
  ASSERT_EQ(driver_->MemHostRegister(block, block_bytes, CU_MEMHOSTREGISTER_DEVICEMAP),
            CUDA_SUCCESS);
  CUdeviceptr d_shared = 0;
  ASSERT_EQ(driver_->MemHostGetDevicePointer(&d_shared, block, 0), CUDA_SUCCESS);

  StreamCopier::Geometry g;
  g.page_bytes = 64 << 10;
  g.chunk_bytes = chunk_;
  g.tier_base[kLeaseDevice] = reinterpret_cast<CUdeviceptr>((*lease)->base(kLeaseDevice));
  g.tier_slots[kLeaseDevice] = 1;
  g.allow_host = false;
  g.max_stashes = 4;
  g.record_pages = 64;
  auto copier = StreamCopier::Create(driver_, g, Fatbin());
  ASSERT_TRUE(copier.ok()) << copier.status().ToString();
  ASSERT_TRUE((*copier)->AddChunk(stream_, kLeaseDevice, 0, chunk_).ok());
  ASSERT_TRUE((*copier)
                  ->AttachControl(stream_, AsPointer<kernels::SessionControl>(d_shared),
                                  static_cast<uint8_t*>(block), block_bytes)
                  .ok());
  const CUdeviceptr src = Alloc(bytes), dst = Alloc(bytes);
  Write(AsPointer(src), Pattern(bytes, 9));
  StreamCopier::StashRequest request;
  request.src = AsPointer<const void>(src);
  request.count = static_cast<int64_t>(rows);
  request.max_rows = rows;
  request.row_bytes = row_bytes;
  ASSERT_EQ(driver_->StreamBeginCapture(stream_, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
            CUDA_SUCCESS);
  auto ticket = (*copier)->Stash(stream_, request);
  ASSERT_TRUE(ticket.ok());
  ASSERT_TRUE((*copier)->Reload(stream_, *ticket, AsPointer(dst), false).ok());
  ASSERT_TRUE((*copier)->BeginStep(stream_, 1).ok());
  CUgraph graph = nullptr;
  ASSERT_EQ(driver_->StreamEndCapture(stream_, &graph), CUDA_SUCCESS);
  CUgraphExec exec = nullptr;
  ASSERT_EQ(driver_->GraphInstantiate(&exec, graph, 0), CUDA_SUCCESS);
  for (int i = 0; i < kReplays; ++i) ASSERT_EQ(driver_->GraphLaunch(exec, stream_), CUDA_SUCCESS);
  ASSERT_EQ(driver_->StreamSynchronize(stream_), CUDA_SUCCESS);

  ASSERT_EQ(write(to_reader_fd.get(), "x", 1), 1);
  uint64_t result[3] = {};
  EXPECT_EQ(read(from_reader_fd.get(), result, sizeof(result)),
            static_cast<ssize_t>(sizeof(result)));
  int status = 0;
  waitpid(reader, &status, 0);
  reader_guard.Release();
  std::printf(
      "check: step 4 %d replays each publishing the control block; the reader process "
      "took %llu whole snapshots (up to step %llu), %llu of them inconsistent\n",
      kReplays, static_cast<unsigned long long>(result[0]),
      static_cast<unsigned long long>(result[2]), static_cast<unsigned long long>(result[1]));
  EXPECT_EQ(result[1], 0u) << "torn snapshots";
  EXPECT_GT(result[0], 0u);
  EXPECT_EQ(shared->steps, static_cast<uint64_t>(kReplays));
  EXPECT_EQ(shared->stashes, static_cast<uint64_t>(kReplays));
  EXPECT_EQ(shared->publish_seq, 2u * kReplays);
  EXPECT_EQ(driver_->GraphExecDestroy(exec), CUDA_SUCCESS);
  EXPECT_EQ(driver_->GraphDestroy(graph), CUDA_SUCCESS);
  copier->reset();
  EXPECT_EQ(driver_->MemHostUnregister(block), CUDA_SUCCESS);
  munmap(block, block_bytes);
}

// Step 3.
class MappedCheckChurn : public MappedCheck,
                         public ::testing::WithParamInterface<CUstreamCaptureMode> {};

TEST_P(MappedCheckChurn, CaptureAndReplaysSurviveMappingChurn) {
  constexpr uint64_t kSlots = 6;
  constexpr int kReplays = 1000;
  auto pool = VmmChunkMemory::Create(driver_, 0, "check-churn", kSlots * chunk_, chunk_, kPage);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  for (uint64_t c = 0; c < kSlots; ++c) ASSERT_TRUE((*pool)->Ensure(c).ok());
  auto lease = CudaLeaseMemory::Create(driver_, 0, chunk_, {kSlots * chunk_, chunk_, chunk_});
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  CudaLeaseMemory& memory = **lease;
  auto fd = (*pool)->ExportFd(0);
  ASSERT_TRUE(fd.ok());
  ASSERT_TRUE(memory.Map(kLeaseDevice, 0, std::move(*fd), chunk_, 0).ok());

  StreamCopier::Geometry g;
  g.page_bytes = 64 << 10;
  g.chunk_bytes = chunk_;
  g.tier_base[kLeaseDevice] = reinterpret_cast<CUdeviceptr>(memory.base(kLeaseDevice));
  g.tier_slots[kLeaseDevice] = kSlots;
  g.allow_host = false;
  g.max_stashes = 16;
  g.record_pages = 1024;
  auto copier = StreamCopier::Create(driver_, g, Fatbin());
  ASSERT_TRUE(copier.ok()) << copier.status().ToString();
  ASSERT_TRUE((*copier)->AddChunk(stream_, kLeaseDevice, 0, chunk_).ok());

  const uint64_t row_bytes = 4096, max_rows = chunk_ / row_bytes / 2;
  const uint64_t bytes = row_bytes * max_rows;
  const CUdeviceptr src = Alloc(bytes), dst = Alloc(bytes);
  const std::vector<uint8_t> data = Pattern(bytes, 7);
  Write(AsPointer(src), data);
  ASSERT_EQ(driver_->StreamSynchronize(stream_), CUDA_SUCCESS);

  // Another thread maps and unmaps slots 1.. of the same reservation, on its own stream, the
  // whole time: capture and replays must not notice. It makes the context current with
  // cuCtxSetCurrent, keeping the default (global) capture interaction mode: in global mode, the
  // only calls of it that are relaxed are the library's own (Map, Unmap, Reap, ExportFd), so a
  // library call that is not relaxed invalidates the capture.
  std::atomic<bool> stop{false};
  std::atomic<int> churned{0};
  std::mutex churn_mu;
  std::string churn_error;  // guarded by churn_mu
  auto set_churn_error = [&](const std::string& error) {
    const std::lock_guard<std::mutex> lock(churn_mu);
    if (churn_error.empty()) churn_error = error;
  };
  auto churn_failed = [&] {
    const std::lock_guard<std::mutex> lock(churn_mu);
    return !churn_error.empty();
  };
  std::thread churn([&] {
    if (driver_->CtxSetCurrent(context_->get()) != CUDA_SUCCESS) {
      set_churn_error("cuCtxSetCurrent failed");
      return;
    }
    CUstream own = nullptr;
    if (driver_->StreamCreate(&own, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
      set_churn_error("cuStreamCreate failed");
      return;
    }
    while (!stop.load()) {
      for (uint64_t slot = 1; slot < kSlots && !stop.load(); ++slot) {
        if (memory.slot_state(kLeaseDevice, slot) != CudaLeaseMemory::SlotState::kFree) continue;
        auto chunk_fd = (*pool)->ExportFd(slot);
        Status s = chunk_fd.ok() ? memory.Map(kLeaseDevice, slot, std::move(*chunk_fd), chunk_, 0)
                                 : chunk_fd.status();
        if (s.ok()) s = memory.Unmap(kLeaseDevice, slot, own);
        if (!s.ok()) {
          set_churn_error(s.ToString());
          stop = true;
          break;
        }
        churned.fetch_add(1);
      }
      // Slots whose unmap completed. A failure here is the library's (an event query refused
      // during the global capture, say): the churn stops, and the capture ends at once.
      const CudaLeaseMemory::Reaped reaped = memory.Reap();
      if (!reaped.status.ok()) {
        set_churn_error("Reap: " + reaped.status.ToString());
        stop = true;
      }
    }
    (void)driver_->StreamSynchronize(own);
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (memory.pending_unmaps() > 0) {
      if (std::chrono::steady_clock::now() > give_up) {
        set_churn_error("unmaps still pending 10 s after the churn ended");
        break;
      }
      (void)memory.Reap();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    (void)driver_->StreamDestroy(own);
  });
  // The main thread waits for the churn with a deadline: a churn that stalls fails the step,
  // never hangs it.
  auto wait_for_churn = [&](int target) {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (churned.load() < target && !churn_failed()) {
      if (std::chrono::steady_clock::now() > give_up) {
        set_churn_error("the churn made no progress for 30 s");
        stop = true;
        return;
      }
      std::this_thread::yield();
    }
  };
  wait_for_churn(3);

  StreamCopier::StashRequest request;
  request.src = AsPointer<const void>(src);
  request.count = static_cast<int64_t>(max_rows);
  request.max_rows = max_rows;
  request.row_bytes = row_bytes;
  ASSERT_EQ(driver_->StreamBeginCapture(stream_, GetParam()), CUDA_SUCCESS);
  auto ticket = (*copier)->Stash(stream_, request);
  const bool stashed = ticket.ok();
  if (stashed) {
    EXPECT_TRUE((*copier)->Reload(stream_, *ticket, AsPointer(dst), true).ok());
  }
  EXPECT_TRUE((*copier)->BeginStep(stream_, 1).ok());
  // The churn goes on while the capture is open: a few more maps, unmaps and reaps.
  wait_for_churn(churned.load() + 10);
  CUgraph graph = nullptr;
  const CUresult ended = driver_->StreamEndCapture(stream_, &graph);
  CUgraphExec exec = nullptr;
  const CUresult instantiated =
      ended == CUDA_SUCCESS ? driver_->GraphInstantiate(&exec, graph, 0) : ended;
  int replays = 0;
  bool bytes_ok = true;
  if (instantiated == CUDA_SUCCESS) {
    for (; replays < kReplays && !churn_failed(); ++replays) {
      if (driver_->GraphLaunch(exec, stream_) != CUDA_SUCCESS) break;
      if (replays % 100 == 99) {
        if (driver_->StreamSynchronize(stream_) != CUDA_SUCCESS) break;
        bytes_ok = bytes_ok && Read(AsPointer(dst), bytes) == data;
        Write(AsPointer(dst), std::vector<uint8_t>(bytes, 0));
      }
    }
    (void)driver_->StreamSynchronize(stream_);
  }
  stop = true;
  churn.join();
  const std::string churn_result = [&] {
    const std::lock_guard<std::mutex> lock(churn_mu);
    return churn_error;
  }();
  std::printf(
      "check: step 3 capture mode %s: capture %s, instantiate %s, %d replays, %d maps "
      "and unmaps on another thread meanwhile, bytes %s%s%s\n",
      GetParam() == CU_STREAM_CAPTURE_MODE_GLOBAL ? "global" : "thread-local",
      ended == CUDA_SUCCESS ? "ok" : "FAILED", instantiated == CUDA_SUCCESS ? "ok" : "FAILED",
      replays, churned.load(), bytes_ok ? "ok" : "WRONG",
      churn_result.empty() ? "" : "; churn error: ", churn_result.c_str());
  EXPECT_TRUE(stashed) << ticket.status().ToString();
  EXPECT_EQ(ended, CUDA_SUCCESS);
  EXPECT_EQ(instantiated, CUDA_SUCCESS);
  EXPECT_EQ(replays, kReplays);
  EXPECT_TRUE(bytes_ok);
  EXPECT_EQ(churn_result, "");
  if (exec != nullptr) (void)driver_->GraphExecDestroy(exec);
  if (graph != nullptr) (void)driver_->GraphDestroy(graph);
}

INSTANTIATE_TEST_SUITE_P(Modes, MappedCheckChurn,
                         ::testing::Values(CU_STREAM_CAPTURE_MODE_GLOBAL,
                                           CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
                         [](const ::testing::TestParamInfo<CUstreamCaptureMode>& mode) {
                           return mode.param == CU_STREAM_CAPTURE_MODE_GLOBAL ? "Global"
                                                                              : "ThreadLocal";
                         });

}  // namespace
}  // namespace stash::client

int main(int argc, char** argv) {
  if (const char* socket = getenv(stash::client::kExporterVariable); socket != nullptr) {
    return stash::client::RunExporter(atoi(socket));
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
