// TEST AID, NEVER A BACKEND (see standin.h): plain device memory (cuMemAlloc / cuMemFree), pinned
// host memory (cuMemHostAlloc / cuMemFreeHost) and the copies on the legacy stream (cuMemcpyHtoD /
// cuMemcpyDtoH), built on the stand-in's own VMM and host registration, so plain device memory
// counts against the same VRAM budget and faults the same way once freed.
#include <sys/mman.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "internal.h"

namespace standin {
namespace {

std::mutex g_plain_mu;
// cuMemAlloc'd ranges: base -> reserved (granularity-rounded) size.
std::map<uintptr_t, size_t>& Allocations() {
  static auto* allocations = new std::map<uintptr_t, size_t>();
  return *allocations;
}
// cuMemHostAlloc'd ranges: base -> mmap'ed size.
std::map<uintptr_t, size_t>& HostAllocations() {
  static auto* allocations = new std::map<uintptr_t, size_t>();
  return *allocations;
}

size_t RoundUp(size_t n) { return (n + kGranularity - 1) / kGranularity * kGranularity; }

}  // namespace
}  // namespace standin

using standin::Fail;

extern "C" {

// CUDA Driver API, Memory Management, cuMemAlloc: "Allocates bytesize bytes of linear memory on
// the device"; "If bytesize is 0, cuMemAlloc() returns CUDA_ERROR_INVALID_VALUE". The memory is
// not cleared. Here: a VMM allocation of the current device, mapped read/write.
CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  int device = 0;
  STANDIN_TRY(standin::RequireInit(__func__));
  STANDIN_TRY(standin::CurrentDevice(__func__, &device));
  if (dptr == nullptr || bytesize == 0) {
    return Fail(CUDA_ERROR_INVALID_VALUE, __func__, "dptr is NULL or bytesize is 0");
  }
  const size_t size = standin::RoundUp(bytesize);
  CUdeviceptr base = 0;
  STANDIN_TRY(cuMemAddressReserve(&base, size, 0, 0, 0));
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  CUmemGenericAllocationHandle handle = 0;
  CUresult r = cuMemCreate(&handle, size, &prop, 0);
  if (r == CUDA_SUCCESS) {
    r = cuMemMap(base, size, 0, handle, 0);
    (void)cuMemRelease(handle);  // the mapping keeps the memory
  }
  if (r == CUDA_SUCCESS) {
    CUmemAccessDesc access{};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    r = cuMemSetAccess(base, size, &access, 1);
    if (r != CUDA_SUCCESS) (void)cuMemUnmap(base, size);
  }
  if (r != CUDA_SUCCESS) {
    (void)cuMemAddressFree(base, size);
    return r;
  }
  std::lock_guard<std::mutex> lock(standin::g_plain_mu);
  standin::Allocations()[base] = size;
  *dptr = base;
  return CUDA_SUCCESS;
}

// cuMemFree: "Frees the memory space pointed to by dptr, which must have been returned by a
// previous call to cuMemAlloc"; others are CUDA_ERROR_INVALID_VALUE. Work still queued that uses
// it faults when it runs.
CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr) {
  STANDIN_TRY(standin::RequireInit(__func__));
  size_t size = 0;
  {
    std::lock_guard<std::mutex> lock(standin::g_plain_mu);
    auto it = standin::Allocations().find(dptr);
    if (it == standin::Allocations().end()) {
      return Fail(CUDA_ERROR_INVALID_VALUE, __func__, "not an address cuMemAlloc returned");
    }
    size = it->second;
    standin::Allocations().erase(it);
  }
  STANDIN_TRY(cuMemUnmap(dptr, size));
  return cuMemAddressFree(dptr, size);
}

// cuMemHostAlloc: page-locked host memory, with CU_MEMHOSTALLOC_DEVICEMAP mapped for the device
// (cuMemHostGetDevicePointer); bytesize 0 is CUDA_ERROR_INVALID_VALUE. Here: anonymous memory,
// registered.
CUresult CUDAAPI cuMemHostAlloc(void** pp, size_t bytesize, unsigned int Flags) {
  STANDIN_TRY(standin::RequireInit(__func__));
  (void)Flags;
  if (pp == nullptr || bytesize == 0) {
    return Fail(CUDA_ERROR_INVALID_VALUE, __func__, "pp is NULL or bytesize is 0");
  }
  void* p = mmap(nullptr, bytesize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return Fail(CUDA_ERROR_OUT_OF_MEMORY, __func__, "mmap failed");
  if (const CUresult r = cuMemHostRegister(p, bytesize, 0); r != CUDA_SUCCESS) {
    munmap(p, bytesize);
    return r;
  }
  std::lock_guard<std::mutex> lock(standin::g_plain_mu);
  standin::HostAllocations()[reinterpret_cast<uintptr_t>(p)] = bytesize;
  *pp = p;
  return CUDA_SUCCESS;
}

// cuMemFreeHost: p must come from cuMemHostAlloc (else CUDA_ERROR_INVALID_VALUE). The range stays
// reserved and inaccessible, so late work that touches it faults.
CUresult CUDAAPI cuMemFreeHost(void* p) {
  STANDIN_TRY(standin::RequireInit(__func__));
  size_t size = 0;
  {
    std::lock_guard<std::mutex> lock(standin::g_plain_mu);
    auto it = standin::HostAllocations().find(reinterpret_cast<uintptr_t>(p));
    if (it == standin::HostAllocations().end()) {
      return Fail(CUDA_ERROR_INVALID_VALUE, __func__, "not an address cuMemHostAlloc returned");
    }
    size = it->second;
    standin::HostAllocations().erase(it);
  }
  (void)cuMemHostUnregister(p);
  mprotect(p, size, PROT_NONE);
  return CUDA_SUCCESS;
}

// cuMemcpyHtoD / cuMemcpyDtoH, by the Driver API's "API synchronization behavior", Memcpy,
// "Synchronous": both run on the legacy stream, so they come after its earlier work (and so
// after every blocking stream's: see Enqueue), and their device side must be addressable, else
// CUDA_ERROR_INVALID_VALUE. Both are calls a capture may prohibit, and legacy-stream work while a
// blocking stream captures.
//  - "For transfers from pageable host memory to device memory, a stream sync is performed before
//    the copy is initiated. The function will return once the pageable buffer has been copied to
//    the staging memory for DMA transfer to device memory, but the DMA to final destination may
//    not have completed." Here the bytes land kLateFactor stream delays later: work on a
//    non-blocking stream queued after the call can read the old bytes, as on a GPU.
//  - "For transfers from pinned host memory to device memory, the function is synchronous with
//    respect to the host."
//  - "For transfers from device to either pageable or pinned host memory, the function returns
//    only once the copy has completed."
CUresult CUDAAPI cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void* srcHost, size_t ByteCount) {
  STANDIN_TRY(standin::RequireInit(__func__));
  if (ByteCount == 0) return CUDA_SUCCESS;
  if (srcHost == nullptr || !standin::DeviceAddressable(dstDevice, ByteCount)) {
    return Fail(CUDA_ERROR_INVALID_VALUE, __func__,
                "the destination is not device memory (or the source is NULL)");
  }
  STANDIN_TRY(standin::CheckSynchronousCall(__func__));
  auto* dst = standin::HostPointer(dstDevice);
  if (standin::PinnedHost(reinterpret_cast<uintptr_t>(srcHost), ByteCount)) {
    STANDIN_TRY(standin::Enqueue(__func__, CU_STREAM_LEGACY, [dst, srcHost, ByteCount] {
      std::memcpy(dst, srcHost, ByteCount);
    }));
    return cuStreamSynchronize(CU_STREAM_LEGACY);
  }
  STANDIN_TRY(cuStreamSynchronize(CU_STREAM_LEGACY));
  const auto* src = static_cast<const uint8_t*>(srcHost);
  auto staged = std::make_shared<std::vector<uint8_t>>(src, src + ByteCount);
  return standin::EnqueueLate(__func__, CU_STREAM_LEGACY,
                              [dst, staged] { std::memcpy(dst, staged->data(), staged->size()); });
}

CUresult CUDAAPI cuMemcpyDtoH_v2(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount) {
  STANDIN_TRY(standin::RequireInit(__func__));
  if (ByteCount == 0) return CUDA_SUCCESS;
  if (dstHost == nullptr || !standin::DeviceAddressable(srcDevice, ByteCount)) {
    return Fail(CUDA_ERROR_INVALID_VALUE, __func__,
                "the source is not device memory (or the destination is NULL)");
  }
  STANDIN_TRY(standin::CheckSynchronousCall(__func__));
  const auto* src = standin::HostPointer<const void>(srcDevice);
  STANDIN_TRY(standin::Enqueue(__func__, CU_STREAM_LEGACY, [dstHost, src, ByteCount] {
    std::memcpy(dstHost, src, ByteCount);
  }));
  return cuStreamSynchronize(CU_STREAM_LEGACY);
}

// cuMemcpyDtoHAsync ("API synchronization behavior", Asynchronous): "For transfers from device
// memory to pageable host memory, the function will return only once the copy has completed";
// to page-locked memory it returns at once and the copy runs in stream order. Here: the copy is
// the stream's work when it runs; a pageable destination waits for it (a synchronous call, so
// potentially unsafe during capture, like cuMemcpyDtoH).
CUresult CUDAAPI cuMemcpyDtoHAsync_v2(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount,
                                      CUstream hStream) {
  STANDIN_TRY(standin::RequireInit(__func__));
  if (ByteCount == 0) return standin::Enqueue(__func__, hStream, [] {});
  if (dstHost == nullptr || !standin::DeviceAddressable(srcDevice, ByteCount)) {
    return Fail(CUDA_ERROR_INVALID_VALUE, __func__,
                "the source is not device memory (or the destination is NULL)");
  }
  const bool pinned = standin::PinnedHost(reinterpret_cast<uintptr_t>(dstHost), ByteCount);
  if (!pinned) STANDIN_TRY(standin::CheckSynchronousCall(__func__));
  const auto* src = standin::HostPointer<const void>(srcDevice);
  STANDIN_TRY(standin::Enqueue(
      __func__, hStream, [dstHost, src, ByteCount] { std::memcpy(dstHost, src, ByteCount); }));
  return pinned ? CUDA_SUCCESS : cuStreamSynchronize(hStream);
}

}  // extern "C"
