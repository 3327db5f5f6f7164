// The fixture of StreamCopier's tests (stream_copier_test.cc, stream_copier_group_test.cc):
// the driver stand-in, or with STASH_STREAM_COPIER_ON_GPU a real GPU through libcuda (see
// stream_copier_test.cc), a context, a stream, and helpers for memory and copies.
#ifndef STASH_TESTS_CLIENT_STREAM_COPIER_FIXTURE_H_
#define STASH_TESTS_CLIENT_STREAM_COPIER_FIXTURE_H_

#include "client/mapped/cuda/stream_copier.h"

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "common/cuda_driver.h"
#include "stash/kernels/mapped_paging.h"
#if defined(STASH_STREAM_COPIER_ON_GPU)
#include "stash/kernels/mapped_paging_fatbin.h"
#include "tests/cuda_device.h"
#endif

namespace stash::client {

using kernels::kLeaseDevice;
using kernels::kLeaseHost;
using kernels::kLeasePeer;

inline constexpr uint64_t kChunkBytes = 2 << 20;  // the stand-in's granularity
inline constexpr uint64_t kPageBytes = 64 << 10;
inline constexpr uint64_t kPagesPerChunk = kChunkBytes / kPageBytes;

// The driver loaded, a context current, a stream (the stand-in registers the kernels' twins
// itself when it loads).
class StreamCopierTest : public ::testing::Test {
 protected:
  void SetUp() override {
#if defined(STASH_STREAM_COPIER_ON_GPU)
    std::string why;
    driver_ = stash::testing::DriverWithADevice(&why);
    if (driver_ == nullptr) GTEST_SKIP() << why;
    fatbin_ = stash_mapped_paging_fatbin;
#else
    setenv("STASH_STANDIN_REGISTRY", dir_.c_str(), 1);
    auto loaded = CudaDriver::Load(STASH_CUDA_STANDIN_LIBRARY);
    ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
    owned_driver_ = std::move(*loaded);
    driver_ = owned_driver_.get();
    ASSERT_EQ(driver_->Init(0), CUDA_SUCCESS);
#endif
    CUdevice device = 0;
    ASSERT_EQ(driver_->DeviceGet(&device, 0), CUDA_SUCCESS);
    ASSERT_EQ(driver_->DevicePrimaryCtxRetain(&context_, device), CUDA_SUCCESS);
    ASSERT_EQ(driver_->CtxSetCurrent(context_), CUDA_SUCCESS);
    ASSERT_EQ(driver_->StreamCreate(&stream_, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  }
  void TearDown() override {
    if (driver_ == nullptr || stream_ == nullptr) return;
    copier_.reset();
    for (CUdeviceptr p : allocations_) (void)driver_->MemFree(p);
    for (void* p : host_allocations_) (void)driver_->MemFreeHost(p);
    if (stream_ != nullptr) (void)driver_->StreamDestroy(stream_);
    if (context_ != nullptr) {
      CUdevice device = 0;
      if (driver_->DeviceGet(&device, 0) == CUDA_SUCCESS) {
        (void)driver_->DevicePrimaryCtxRelease(device);
      }
    }
  }

  CUdeviceptr Alloc(uint64_t bytes) {
    CUdeviceptr p = 0;
    EXPECT_EQ(driver_->MemAlloc(&p, bytes), CUDA_SUCCESS);
    allocations_.push_back(p);
    return p;
  }
  // Pinned host memory mapped for the device: its device address.
  CUdeviceptr HostAlloc(uint64_t bytes) {
    void* p = nullptr;
    EXPECT_EQ(driver_->MemHostAlloc(&p, bytes, CU_MEMHOSTALLOC_DEVICEMAP), CUDA_SUCCESS);
    host_allocations_.push_back(p);
    CUdeviceptr d = 0;
    EXPECT_EQ(driver_->MemHostGetDevicePointer(&d, p, 0), CUDA_SUCCESS);
    return d;
  }
  // A copier over `slots` chunk slots per tier: device memory for the own device and the peer
  // tiers, pinned host memory for the host tier.
  void MakeCopier(uint64_t slots, bool allow_host = true) {
    StreamCopier::Geometry g;
    g.page_bytes = kPageBytes;
    g.chunk_bytes = kChunkBytes;
    for (uint32_t t = 0; t < kernels::kLeaseTiers; ++t) {
      g.tier_slots[t] = slots;
      g.tier_base[t] =
          t == kLeaseHost ? HostAlloc(slots * kChunkBytes) : Alloc(slots * kChunkBytes);
    }
    g.allow_host = allow_host;
    g.max_stashes = 64;
    g.record_pages = 1024;
    auto made = StreamCopier::Create(driver_, g, fatbin_);
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    copier_ = std::move(*made);
  }
  void Sync() { ASSERT_EQ(driver_->StreamSynchronize(stream_), CUDA_SUCCESS); }
  // Writes `n` bytes at `dst` before anything queued after the call runs. cuMemcpyHtoD from
  // pageable memory may return before its bytes land (Driver API, "API synchronization
  // behavior"), on the legacy stream, which stream_ (non-blocking) does not wait for.
  void Put(CUdeviceptr dst, const void* bytes, uint64_t n) {
    ASSERT_EQ(driver_->MemcpyHtoD(dst, bytes, n), CUDA_SUCCESS);
    ASSERT_EQ(driver_->StreamSynchronize(CU_STREAM_LEGACY), CUDA_SUCCESS);
  }
  void Put(CUdeviceptr dst, const std::vector<uint8_t>& bytes) {
    Put(dst, bytes.data(), bytes.size());
  }
  // "same bytes", or how many bytes differ and the first that does: a diff gtest's vector
  // printer (the first 32 bytes) does not show.
  static std::string Difference(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want) {
    if (got.size() != want.size()) {
      return "got " + std::to_string(got.size()) + " bytes, want " + std::to_string(want.size());
    }
    uint64_t differ = 0, first = 0;
    for (uint64_t i = got.size(); i-- > 0;) {
      if (got[i] != want[i]) {
        ++differ;
        first = i;
      }
    }
    if (differ == 0) return "same bytes";
    return std::to_string(differ) + " of " + std::to_string(got.size()) +
           " bytes differ, the first at offset " + std::to_string(first) + ": got " +
           std::to_string(got[first]) + ", want " + std::to_string(want[first]);
  }
  std::vector<uint8_t> Get(CUdeviceptr src, uint64_t n) {
    std::vector<uint8_t> out(n);
    EXPECT_EQ(driver_->MemcpyDtoH(out.data(), src, n), CUDA_SUCCESS);
    return out;
  }
  static std::vector<uint8_t> Random(std::mt19937_64& rng, uint64_t n) {
    std::vector<uint8_t> v(n);
    for (uint8_t& b : v) b = static_cast<uint8_t>(rng());
    return v;
  }
  StreamCopier::StashRequest Request(CUdeviceptr src, uint64_t rows, uint64_t max_rows,
                                     uint64_t row_bytes) {
    StreamCopier::StashRequest r;
    r.src = reinterpret_cast<const void*>(src);
    r.count = static_cast<int64_t>(rows);
    r.max_rows = max_rows;
    r.row_bytes = row_bytes;
    return r;
  }

  std::string dir_ = ::testing::TempDir();
  std::unique_ptr<CudaDriver> owned_driver_;  // the stand-in
  const CudaDriver* driver_ = nullptr;
  // The kernels' image: the library's fatbin on a GPU; the stand-in takes any (it runs twins).
  const void* fatbin_ = "no image: the stand-in runs host twins";
  std::vector<void*> host_allocations_;
  CUcontext context_ = nullptr;
  CUstream stream_ = nullptr;
  std::vector<CUdeviceptr> allocations_;
  std::unique_ptr<StreamCopier> copier_;
};

}  // namespace stash::client

#endif  // STASH_TESTS_CLIENT_STREAM_COPIER_FIXTURE_H_
