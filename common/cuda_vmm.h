// What both sides of mapped mode on GPUs share (docs/design.md, "Mapped mode"): how a GPU is
// named across processes (its UUID: a pool index or an ordinal means nothing under another
// process's CUDA_VISIBLE_DEVICES), the allocation properties of a chunk, and a scope that makes
// a device's primary context current. Only built with STASH_ENABLE_CUDA.
#ifndef STASH_COMMON_CUDA_VMM_H_
#define STASH_COMMON_CUDA_VMM_H_

#include <cuda.h>

#include <cstdint>
#include <string>

#include "common/cuda_driver.h"
#include "stash/status.h"

namespace stash {

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (lower-case hex), the way nvidia-smi -L and
// CUDA_VISIBLE_DEVICES spell a GPU's UUID.
std::string FormatGpuUuid(const CUuuid& uuid);

// The UUID of ordinal `device` of this process, formatted by FormatGpuUuid.
StatusOr<std::string> GpuUuid(const CudaDriver* driver, int device);

// The ordinal, in this process, of the GPU whose UUID (FormatGpuUuid's spelling) is `uuid`.
// NOT_FOUND when this process does not see it (CUDA_VISIBLE_DEVICES leaves it out).
StatusOr<int> GpuOrdinalOfUuid(const CudaDriver* driver, const std::string& uuid);

// "GPU <ordinal> (<UUID>)": how messages name ordinal `device` of this process.
StatusOr<std::string> GpuName(const CudaDriver* driver, int device);

// What mapped mode's chunks need that ordinal `device` lacks, in words for a message: virtual
// memory management, and exporting memory as POSIX file descriptors ("" when it has both).
StatusOr<std::string> MissingChunkSupport(const CudaDriver* driver, int device);

// The properties of a mapped-mode chunk on ordinal `device`: pinned device memory that can be
// exported as a POSIX file descriptor (CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR).
CUmemAllocationProp ChunkAllocationProp(int device);

// Read and write access for ordinal `device`, for cuMemSetAccess.
CUmemAccessDesc ReadWriteAccess(int device);

// Sets the calling thread's capture interaction mode to relaxed (cuThreadExchangeStreamCapture
// Mode) for the guard's life and restores the previous mode after, so the library's driver calls
// (an event query at a step boundary, a map on the lease thread, an allocation when a session
// starts) are never prohibited by, and never invalidate, a capture the trainer runs on another
// thread in global mode (PyTorch's default); PyTorch's allocator does the same around its own
// calls. Guards nest (each restores what it found).
class RelaxedCaptureMode {
 public:
  explicit RelaxedCaptureMode(const CudaDriver* driver);
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;
  ~RelaxedCaptureMode();

 private:
  const CudaDriver* driver_;
  bool exchanged_ = false;
  CUstreamCaptureMode previous_ = CU_STREAM_CAPTURE_MODE_GLOBAL;
};

// The primary context of one device, retained for the object's life and made current on the
// calling thread by each Scope (the thread's own current context, e.g. the trainer's, is
// restored after). A Scope is also a RelaxedCaptureMode.
class PrimaryContext {
 public:
  // Retains ordinal `device`'s primary context.
  static StatusOr<PrimaryContext> Retain(const CudaDriver* driver, int device);
  PrimaryContext() = default;
  PrimaryContext(PrimaryContext&& other) noexcept;
  PrimaryContext& operator=(PrimaryContext&& other) noexcept;
  PrimaryContext(const PrimaryContext&) = delete;
  PrimaryContext& operator=(const PrimaryContext&) = delete;
  ~PrimaryContext();

  CUcontext get() const { return context_; }

  class Scope {
   public:
    explicit Scope(const PrimaryContext& context);
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    ~Scope();
    // Not OK when the context could not be made current (nothing else then runs in it).
    const Status& status() const { return status_; }

   private:
    const CudaDriver* driver_;
    RelaxedCaptureMode relaxed_;
    Status status_;
  };

 private:
  const CudaDriver* driver_ = nullptr;
  CUdevice device_ = 0;
  CUcontext context_ = nullptr;
};

}  // namespace stash

#endif  // STASH_COMMON_CUDA_VMM_H_
