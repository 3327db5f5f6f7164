// The fixture of the mapped-mode cuda-backend integration tests (cuda_mapped_test.cc,
// cuda_group_test.cc): a stashd --backend=cuda on the driver stand-in (or, built with
// STASH_MAPPED_ON_GPU, a real GPU), a context, a stream, and helpers for device memory.
#ifndef STASH_TESTS_INTEGRATION_CUDA_MAPPED_FIXTURE_H_
#define STASH_TESTS_INTEGRATION_CUDA_MAPPED_FIXTURE_H_

#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/cuda_driver.h"
#include "common/cuda_vmm.h"
#include "stash/client.h"
#include "tests/cuda_device.h"
#include "tests/integration/daemon_stats.h"
#include "tests/integration/harness.h"

namespace stash::testing {

inline constexpr uint64_t kChunk = 2 << 20;  // the stand-in's allocation granularity
inline constexpr uint64_t kRow = 4096;

class CudaMapped : public ::testing::Test {
 protected:
  void SetUp() override {
#if defined(STASH_MAPPED_ON_GPU)
    std::string why;
    d_ = DriverWithADevice(&why);
    if (d_ == nullptr) GTEST_SKIP() << why;
#else
    setenv("STASH_STANDIN_REGISTRY", registry_.path().c_str(), 1);
    ASSERT_NE(std::getenv("LD_LIBRARY_PATH"), nullptr) << "run it through ctest";
    auto driver = CudaDriver::Get();
    ASSERT_TRUE(driver.ok()) << driver.status().ToString();
    d_ = *driver;
#endif
    auto context = PrimaryContext::Retain(d_, 0);
    ASSERT_TRUE(context.ok()) << context.status().ToString();
    context_ = std::make_unique<PrimaryContext>(std::move(context).value());
    ASSERT_EQ(d_->CtxSetCurrent(context_->get()), CUDA_SUCCESS);
    ASSERT_EQ(d_->StreamCreate(&stream_, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  }
  void TearDown() override {
    client_.reset();
    for (CUdeviceptr p : allocations_) (void)d_->MemFree(p);
    if (stream_ != nullptr) (void)d_->StreamDestroy(stream_);
  }
  // A pool of 8 MiB on the GPU: 4 chunks of 32 pages.
  void StartDaemon(const std::vector<std::string>& more = {}) {
    std::vector<std::string> flags = {"--backend=cuda", "--page-bytes=64KiB", "--pool-bytes=8MiB",
                                      "--chunk-bytes=2MiB", "--host-tier-bytes=0"};
    flags.insert(flags.end(), more.begin(), more.end());
    daemon_ = std::make_unique<DaemonProcess>(flags);
    ASSERT_TRUE(daemon_->Ready()) << daemon_->process().Stderr();
  }
  Options MappedOptions(uint64_t device_bytes) {
    Options o;
    o.socket = daemon_->socket();
    o.backend = Backend::kCuda;
    o.mode = Mode::kMapped;
    o.allow_host_spill = false;
    if (device_bytes > 0) {
      o.lease.automatic = false;
      o.lease.device_bytes = device_bytes;
    }
    return o;
  }
  void Open(const Options& o) {
    auto opened = Client::Open(o);
    ASSERT_TRUE(opened.ok()) << opened.status().ToString();
    client_ = std::move(opened).value();
  }
  v1::TierStats Gpu() { return TierNamed("gpu0"); }
  v1::TierStats HostShare() { return TierNamed("host0"); }  // the GPU's share of the host tier
  v1::TierStats TierNamed(const std::string& name) {
    const v1::GetStatsResponse stats = DaemonStats(daemon_->socket());
    for (const v1::TierStats& t : stats.tiers()) {
      if (t.name() == name) return t;
    }
    return {};
  }
  // Device memory holding `bytes` from the host before anything queued later runs (cuMemcpyHtoD
  // from pageable memory may return before its bytes land, on the legacy stream, which stream_
  // does not wait for: Driver API, "API synchronization behavior").
  CUdeviceptr Device(const std::vector<uint8_t>& bytes) {
    CUdeviceptr p = 0;
    EXPECT_EQ(d_->MemAlloc(&p, bytes.size()), CUDA_SUCCESS);
    EXPECT_EQ(d_->MemcpyHtoD(p, bytes.data(), bytes.size()), CUDA_SUCCESS);
    EXPECT_EQ(d_->StreamSynchronize(CU_STREAM_LEGACY), CUDA_SUCCESS);
    allocations_.push_back(p);
    return p;
  }
  std::vector<uint8_t> Host(CUdeviceptr p, uint64_t bytes) {
    std::vector<uint8_t> out(bytes);
    EXPECT_EQ(d_->StreamSynchronize(stream_), CUDA_SUCCESS);
    EXPECT_EQ(d_->MemcpyDtoH(out.data(), p, bytes), CUDA_SUCCESS);
    return out;
  }
  static std::vector<uint8_t> Pattern(uint64_t bytes, uint8_t seed) {
    std::vector<uint8_t> out(bytes);
    for (uint64_t i = 0; i < bytes; ++i) out[i] = static_cast<uint8_t>(seed + i * 7 + i / 4096);
    return out;
  }
  StashArgs Args(CUdeviceptr src, uint64_t rows, uint64_t max_rows) {
    StashArgs a;
    a.device_source = reinterpret_cast<const void*>(src);  // NOLINT(performance-no-int-to-ptr)
    a.row_bytes = kRow;
    a.max_rows = max_rows;
    a.count.value = rows;
    a.stream = stream_;
    return a;
  }
  ReloadArgs Into(uint64_t ticket, CUdeviceptr dst, bool zero_tail = true) {
    ReloadArgs r;
    r.ticket = ticket;
    r.device_destination = reinterpret_cast<void*>(dst);  // NOLINT(performance-no-int-to-ptr)
    r.zero_tail = zero_tail;
    r.stream = stream_;
    return r;
  }
  // The current step's flags once the stream ran everything enqueued (synchronized here), then
  // a step boundary at `step`.
  StepFlags FlagsThenStep(uint64_t step) {
    EXPECT_EQ(d_->StreamSynchronize(stream_), CUDA_SUCCESS);
    const StepFlags flags = client_->CurrentStepFlags();
    EXPECT_TRUE(client_->BeginStep(step, stream_).ok());
    return flags;
  }

  TempDir registry_;
  const CudaDriver* d_ = nullptr;
  std::unique_ptr<PrimaryContext> context_;
  CUstream stream_ = nullptr;
  std::vector<CUdeviceptr> allocations_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<Client> client_;
};

}  // namespace stash::testing

#endif  // STASH_TESTS_INTEGRATION_CUDA_MAPPED_FIXTURE_H_
