// Device memory (cuMemAlloc) or pinned device-mapped host memory (cuMemHostAlloc) of one CUDA
// context, through the driver table, freed on destruction with that context current: the cuda
// backend's small allocations (rings, plan slots, page records, answers the GPU leaves the host).
// Built only with STASH_ENABLE_CUDA.
#ifndef STASH_DAEMON_CUDA_BUFFER_H_
#define STASH_DAEMON_CUDA_BUFFER_H_

#include <cuda.h>

#include <cstdint>
#include <string>

#include "common/bytes.h"
#include "common/cuda_driver.h"
#include "common/logging.h"
#include "stash/status.h"

namespace stash::daemon {

class CudaBuffer {
 public:
  enum class Kind { kDevice, kPinnedMapped };
  CudaBuffer() = default;
  CudaBuffer(const CudaBuffer&) = delete;
  CudaBuffer& operator=(const CudaBuffer&) = delete;
  ~CudaBuffer() {
    if (driver_ == nullptr) return;
    if (driver_->CtxPushCurrent(context_) != CUDA_SUCCESS) return;  // the context is gone
    if (host_ != nullptr) Warn(driver_->MemFreeHost(host_), "cuMemFreeHost");
    if (kind_ == Kind::kDevice && device_ != 0) Warn(driver_->MemFree(device_), "cuMemFree");
    CUcontext popped = nullptr;
    (void)driver_->CtxPopCurrent(&popped);
  }

  // With `context` current. `what` names the memory in the error.
  Status Allocate(const CudaDriver* driver, CUcontext context, Kind kind, uint64_t bytes,
                  const char* what) {
    driver_ = driver;
    context_ = context;
    kind_ = kind;
    Status st;
    if (kind == Kind::kDevice) {
      st = driver->Check(driver->MemAlloc(&device_, bytes), "cuMemAlloc");
    } else {
      st = driver->Check(
          driver->MemHostAlloc(&host_, bytes, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE),
          "cuMemHostAlloc");
      if (st.ok()) {
        st = driver->Check(driver->MemHostGetDevicePointer(&device_, host_, 0),
                           "cuMemHostGetDevicePointer");
      }
    }
    if (st.ok()) return st;
    return Status(st.code(), std::string("allocating ") + what + " (" + FormatBytes(bytes) +
                                 ") failed: " + st.message());
  }

  template <typename T>
  T* device() const {
    return reinterpret_cast<T*>(device_);  // NOLINT(performance-no-int-to-ptr): a device address
  }
  template <typename T>
  T* host() const {
    return static_cast<T*>(host_);
  }

 private:
  void Warn(CUresult result, const char* call) const {
    const Status st = driver_->Check(result, call);
    if (!st.ok()) Log("pool")->warn("{}", st.message());
  }

  const CudaDriver* driver_ = nullptr;
  CUcontext context_ = nullptr;
  Kind kind_ = Kind::kDevice;
  CUdeviceptr device_ = 0;
  void* host_ = nullptr;
};

}  // namespace stash::daemon

#endif  // STASH_DAEMON_CUDA_BUFFER_H_
