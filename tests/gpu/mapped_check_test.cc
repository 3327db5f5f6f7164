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
// Step 4 (in-stream paging under capture with changing counts, spills and overflows) is
// stream_copier_gpu_test; steps 5 and 6 are benchmarks (stash-bench-gpu mapped-overlap and peer,
// check.sh's bench_mapped_overlap and bench_peer).
//
// The exporter of step 1 is this binary run again (STASH_MAPPED_CHECK_EXPORTER): a process that
// forked after CUDA started cannot use CUDA, so it must exec.
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "client/cuda_lease_memory.h"
#include "client/stream_copier.h"
#include "common/cuda_driver.h"
#include "common/cuda_vmm.h"
#include "common/descriptor_socket.h"
#include "common/unique_fd.h"
#include "daemon/vmm_chunk_memory.h"
#include "stash/kernels/mapped_paging.h"
#if defined(STASH_MAPPED_CHECK_ON_GPU)
#include "stash/kernels/mapped_paging_fatbin.h"
#else
#include <dlfcn.h>

#include "standin.h"
#endif

extern char** environ;

namespace stash {
namespace {

using daemon::VmmChunkMemory;
using kernels::kLeaseDevice;

constexpr const char* kExporterVariable = "STASH_MAPPED_CHECK_EXPORTER";
constexpr uint8_t kSeed = 0x3c;

#if !defined(STASH_MAPPED_CHECK_ON_GPU)
template <typename Args, void (*Body)(const Args&)>
void Twin(void** params, unsigned, unsigned) {
  Body(*static_cast<const Args*>(params[0]));
}
void PlanTwin(void** params, unsigned, unsigned) {
  const auto& a = *static_cast<const kernels::MappedStashArgs*>(params[0]);
  *a.d_plan = kernels::PlanMappedStash(a);
}
#endif

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
    auto reg = reinterpret_cast<decltype(&stash_standin_register_kernel)>(
        dlsym((*loaded)->library, "stash_standin_register_kernel"));
    const size_t stash = sizeof(kernels::MappedStashArgs);
    const size_t reload = sizeof(kernels::MappedReloadArgs);
    const size_t step = sizeof(kernels::MappedStepArgs);
    const size_t ring = sizeof(kernels::MappedRingArgs);
    if (reg == nullptr || reg(kernels::kStashPlanKernel, PlanTwin, 1, &stash) != 0 ||
        reg(kernels::kStashCopyKernel,
            Twin<kernels::MappedStashArgs, kernels::MappedStashCopySerial>, 1, &stash) != 0 ||
        reg(kernels::kStashPublishKernel,
            Twin<kernels::MappedStashArgs, kernels::PublishMappedStash>, 1, &stash) != 0 ||
        reg(kernels::kReloadPopKernel,
            Twin<kernels::MappedReloadArgs, kernels::MappedReloadPopSerial>, 1, &reload) != 0 ||
        reg(kernels::kReloadPublishKernel,
            Twin<kernels::MappedReloadArgs, kernels::PublishMappedReload>, 1, &reload) != 0 ||
        reg(kernels::kStepKernel, Twin<kernels::MappedStepArgs, kernels::MappedStep>, 1, &step) !=
            0 ||
        reg(kernels::kAddPagesKernel, Twin<kernels::MappedRingArgs, kernels::AddMappedPages>, 1,
            &ring) != 0 ||
        reg(kernels::kRemoveChunkKernel, Twin<kernels::MappedRingArgs, kernels::RemoveMappedChunk>,
            1, &ring) != 0) {
      std::abort();
    }
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

// The exporter process of step 1: one chunk of ordinal 0 holding Pattern(kSeed), its fd sent on
// `socket`, then it waits to be killed.
int RunExporter(int socket) {
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
  auto pool = VmmChunkMemory::Create(d, 0, "check-exporter", granularity, granularity);
  if (!pool.ok() || !(*pool)->Ensure(0).ok()) return 4;
  auto context = PrimaryContext::Retain(d, 0);
  if (!context.ok()) return 5;
  {
    const PrimaryContext::Scope scope(*context);
    const std::vector<uint8_t> bytes = Pattern(granularity, kSeed);
    if (d->MemcpyHtoD(reinterpret_cast<CUdeviceptr>((*pool)->base()), bytes.data(), bytes.size()) !=
        CUDA_SUCCESS) {
      return 6;
    }
  }
  auto fd = (*pool)->ExportFd(0);
  if (!fd.ok()) return 7;
  if (!SendPacket(socket, std::to_string(granularity), {fd->get()}).ok()) return 8;
  for (;;) pause();
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
    scope_ = std::make_unique<PrimaryContext::Scope>(*context_);
    ASSERT_TRUE(scope_->status().ok());
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
    scope_.reset();
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
  void Write(void* at, const std::vector<uint8_t>& bytes) {
    ASSERT_EQ(driver_->MemcpyHtoD(reinterpret_cast<CUdeviceptr>(at), bytes.data(), bytes.size()),
              CUDA_SUCCESS);
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
  std::unique_ptr<PrimaryContext::Scope> scope_;
  CUstream stream_ = nullptr;
  uint64_t chunk_ = 0;
  std::vector<CUdeviceptr> allocations_;
};

// Step 1.
TEST_F(MappedCheck, AnImportedChunkOutlivesItsExportersSigkill) {
  int sockets[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sockets), 0);
  const std::string variable = std::string(kExporterVariable) + "=" + std::to_string(sockets[1]);
  std::vector<char*> env;
  for (char** e = environ; *e != nullptr; ++e) env.push_back(*e);
  env.push_back(const_cast<char*>(variable.c_str()));
  env.push_back(nullptr);
  char self[] = "/proc/self/exe";
  char* argv[] = {self, nullptr};
  pid_t pid = 0;
  ASSERT_EQ(posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, env.data()), 0);
  close(sockets[1]);
  UniqueFd socket(sockets[0]);
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
  EXPECT_TRUE(WIFSIGNALED(status));
  // The exporter's handle died with it; the mapping alone keeps the memory.
  EXPECT_EQ(Read((*lease)->base(kLeaseDevice), bytes), pattern);
  const std::vector<uint8_t> again = Pattern(bytes, kSeed + 1);
  Write((*lease)->base(kLeaseDevice), again);
  EXPECT_EQ(Read((*lease)->base(kLeaseDevice), bytes), again);
  const uint64_t free_mapped = FreeBytes();

  UnmapNow(**lease, 0);
  const uint64_t free_after = FreeBytes();
  std::printf(
      "check: step 1 chunk %llu B; free bytes with the exporter alive %llu, after its "
      "SIGKILL while mapped %llu, after the last unmap %llu\n",
      static_cast<unsigned long long>(bytes), static_cast<unsigned long long>(free_unmapped),
      static_cast<unsigned long long>(free_mapped), static_cast<unsigned long long>(free_after));
  // The last unmap frees the chunk (at least half of it, for other users of a shared GPU).
  EXPECT_GE(free_after, free_mapped + bytes / 2);
}

// Step 2.
TEST_F(MappedCheck, RenewingAfterTheHolderUnmappedTakesNoMoreMemory) {
  constexpr uint64_t kChunks = 4;
  constexpr int kRounds = 40;
  auto pool = VmmChunkMemory::Create(driver_, 0, "check-renew", kChunks * chunk_, chunk_);
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
    UnmapNow(**lease, c);  // the holder unmaps first
    const uint64_t before = FreeBytes();
    t = std::chrono::steady_clock::now();
    ASSERT_TRUE((*pool)->Renew(c).ok());
    create_us.push_back(MicrosSince(t));
    const uint64_t after = FreeBytes();
    if (before > after) worst_growth = std::max(worst_growth, before - after);
    const std::vector<uint8_t> zeros(chunk_, 0);
    if (round < static_cast<int>(kChunks)) {
      EXPECT_EQ(Read((*pool)->base() + c * chunk_, chunk_), zeros) << "renewed chunk " << c;
    }
  }
  std::printf(
      "check: step 2 renew (unmap, release, create, map, zero) p50 %.1f us p99 %.1f us; "
      "import (import, map, set access) p50 %.1f us p99 %.1f us; most free memory lost "
      "by one renew %llu B (chunk %llu B)\n",
      Percentile(create_us, 0.5), Percentile(create_us, 0.99), Percentile(import_us, 0.5),
      Percentile(import_us, 0.99), static_cast<unsigned long long>(worst_growth),
      static_cast<unsigned long long>(chunk_));
  // A renew releases before it creates: it never holds a second chunk's memory.
  EXPECT_LT(worst_growth, chunk_);
}

// Step 3.
class MappedCheckChurn : public MappedCheck,
                         public ::testing::WithParamInterface<CUstreamCaptureMode> {};

TEST_P(MappedCheckChurn, CaptureAndReplaysSurviveMappingChurn) {
  constexpr uint64_t kSlots = 6;
  constexpr int kReplays = 1000;
  auto pool = VmmChunkMemory::Create(driver_, 0, "check-churn", kSlots * chunk_, chunk_);
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
  Write(reinterpret_cast<void*>(src), data);
  ASSERT_EQ(driver_->StreamSynchronize(stream_), CUDA_SUCCESS);

  // Another thread maps and unmaps slots 1.. of the same reservation, on its own stream, the
  // whole time: capture and replays must not notice.
  std::atomic<bool> stop{false};
  std::atomic<int> churned{0};
  std::string churn_error;
  std::thread churn([&] {
    const PrimaryContext::Scope scope(*context_);
    CUstream own = nullptr;
    if (driver_->StreamCreate(&own, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
      churn_error = "cuStreamCreate failed";
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
          churn_error = s.ToString();
          stop = true;
          break;
        }
        churned.fetch_add(1);
      }
      (void)memory.Reap();  // slots whose unmap completed
    }
    (void)driver_->StreamSynchronize(own);
    while (memory.pending_unmaps() > 0) {
      (void)memory.Reap();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    (void)driver_->StreamDestroy(own);
  });
  while (churned.load() < 3 && churn_error.empty()) std::this_thread::yield();

  StreamCopier::StashRequest request;
  request.src = reinterpret_cast<const void*>(src);
  request.count = static_cast<int64_t>(max_rows);
  request.max_rows = max_rows;
  request.row_bytes = row_bytes;
  ASSERT_EQ(driver_->StreamBeginCapture(stream_, GetParam()), CUDA_SUCCESS);
  auto ticket = (*copier)->Stash(stream_, request);
  const bool stashed = ticket.ok();
  if (stashed) {
    EXPECT_TRUE((*copier)->Reload(stream_, *ticket, reinterpret_cast<void*>(dst), true).ok());
  }
  EXPECT_TRUE((*copier)->BeginStep(stream_, 1).ok());
  // The churn goes on while the capture is open: a few more maps, unmaps and reaps.
  const int churned_at_capture = churned.load();
  while (churned.load() < churned_at_capture + 10 && churn_error.empty()) {
    std::this_thread::yield();
  }
  CUgraph graph = nullptr;
  const CUresult ended = driver_->StreamEndCapture(stream_, &graph);
  CUgraphExec exec = nullptr;
  const CUresult instantiated =
      ended == CUDA_SUCCESS ? driver_->GraphInstantiate(&exec, graph, 0) : ended;
  int replays = 0;
  bool bytes_ok = true;
  if (instantiated == CUDA_SUCCESS) {
    for (; replays < kReplays && churn_error.empty(); ++replays) {
      if (driver_->GraphLaunch(exec, stream_) != CUDA_SUCCESS) break;
      if (replays % 100 == 99) {
        if (driver_->StreamSynchronize(stream_) != CUDA_SUCCESS) break;
        bytes_ok = bytes_ok && Read(reinterpret_cast<void*>(dst), bytes) == data;
        Write(reinterpret_cast<void*>(dst), std::vector<uint8_t>(bytes, 0));
      }
    }
    (void)driver_->StreamSynchronize(stream_);
  }
  stop = true;
  churn.join();
  std::printf(
      "check: step 3 capture mode %s: capture %s, instantiate %s, %d replays, %d maps "
      "and unmaps on another thread meanwhile, bytes %s%s%s\n",
      GetParam() == CU_STREAM_CAPTURE_MODE_GLOBAL ? "global" : "thread-local",
      ended == CUDA_SUCCESS ? "ok" : "FAILED", instantiated == CUDA_SUCCESS ? "ok" : "FAILED",
      replays, churned.load(), bytes_ok ? "ok" : "WRONG",
      churn_error.empty() ? "" : "; churn error: ", churn_error.c_str());
  EXPECT_TRUE(stashed) << ticket.status().ToString();
  EXPECT_EQ(ended, CUDA_SUCCESS);
  EXPECT_EQ(instantiated, CUDA_SUCCESS);
  EXPECT_EQ(replays, kReplays);
  EXPECT_TRUE(bytes_ok);
  EXPECT_EQ(churn_error, "");
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
}  // namespace stash

int main(int argc, char** argv) {
  if (const char* socket = getenv(stash::kExporterVariable); socket != nullptr) {
    return stash::RunExporter(atoi(socket));
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
