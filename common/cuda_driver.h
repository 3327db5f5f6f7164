// The CUDA driver API, loaded at run time (dlopen "libcuda.so.1"), for the parts of the CUDA
// backend the runtime API does not cover: pointer attributes and allocation ranges, IPC handles
// without a runtime context of our own, host registration, and the stream memory operations
// (cuStreamBatchMemOp / cuStreamWaitValue64) that order work across processes; and for mapped
// mode on GPUs, virtual memory management (VMM chunks exported as file descriptors), streams,
// capture and graphs, and the client library's own kernels (cuModuleLoadData + cuLaunchKernel).
//
// Loading at run time keeps libcuda out of every binary's link: stashd and libstash_client.so
// start on machines without a driver (the host backend, CI) and the client library never pins a
// second CUDA runtime into a PyTorch process. Only built with STASH_ENABLE_CUDA.
#ifndef STASH_COMMON_CUDA_DRIVER_H_
#define STASH_COMMON_CUDA_DRIVER_H_

#include <cuda.h>  // types and the versioned entry point names; no symbol is linked

#include <memory>
#include <string>

#include "stash/status.h"

namespace stash {

// Thread-safe after Get() returned (the table never changes).
struct CudaDriver {
  // The process-wide driver: loaded and cuInit(0)ed once. FAILED_PRECONDITION with the dlopen or
  // cuInit error when there is no usable driver (the message says what to install or check).
  static StatusOr<const CudaDriver*> Get();
  // Loads the library at `path` and resolves every entry point, without cuInit (tests load the
  // toolkit's stub library this way). The error names the missing symbol.
  static StatusOr<std::unique_ptr<CudaDriver>> Load(const std::string& path);

  // OK, or the call's text, the driver's error name and string.
  Status Check(CUresult result, const char* expression) const;

  // Enqueues on `stream`: a system-scope memory barrier, then the 64-bit write of `value` to
  // `address` (one cuStreamBatchMemOp), so whoever sees the value also sees every write of the
  // stream's earlier work. How both sides raise event counters.
  Status WriteValueAfterBarrier(CUstream stream, CUdeviceptr address, uint64_t value) const;

  void* library = nullptr;  // the dlopen handle; never closed (the driver is process-wide)
  decltype(&::cuInit) Init = nullptr;
  decltype(&::cuGetErrorName) GetErrorName = nullptr;
  decltype(&::cuGetErrorString) GetErrorString = nullptr;
  decltype(&::cuDeviceGet) DeviceGet = nullptr;
  decltype(&::cuDeviceGetCount) DeviceGetCount = nullptr;
  decltype(&::cuDeviceGetAttribute) DeviceGetAttribute = nullptr;
  decltype(&::cuDeviceGetUuid) DeviceGetUuid = nullptr;
  decltype(&::cuCtxPushCurrent) CtxPushCurrent = nullptr;
  decltype(&::cuCtxPopCurrent) CtxPopCurrent = nullptr;
  decltype(&::cuDevicePrimaryCtxRetain) DevicePrimaryCtxRetain = nullptr;
  decltype(&::cuDevicePrimaryCtxRelease) DevicePrimaryCtxRelease = nullptr;
  decltype(&::cuPointerGetAttributes) PointerGetAttributes = nullptr;
  decltype(&::cuMemGetAddressRange) MemGetAddressRange = nullptr;
  decltype(&::cuIpcGetMemHandle) IpcGetMemHandle = nullptr;
  decltype(&::cuIpcOpenMemHandle) IpcOpenMemHandle = nullptr;
  decltype(&::cuIpcCloseMemHandle) IpcCloseMemHandle = nullptr;
  decltype(&::cuMemHostRegister) MemHostRegister = nullptr;
  decltype(&::cuMemHostUnregister) MemHostUnregister = nullptr;
  decltype(&::cuMemHostGetDevicePointer) MemHostGetDevicePointer = nullptr;
  decltype(&::cuStreamWaitValue64) StreamWaitValue64 = nullptr;
  decltype(&::cuStreamBatchMemOp) StreamBatchMemOp = nullptr;

  // Virtual memory management (mapped mode's chunks: docs/design.md, "Mapped mode on GPUs").
  decltype(&::cuMemGetAllocationGranularity) MemGetAllocationGranularity = nullptr;
  decltype(&::cuMemCreate) MemCreate = nullptr;
  decltype(&::cuMemRelease) MemRelease = nullptr;
  decltype(&::cuMemExportToShareableHandle) MemExportToShareableHandle = nullptr;
  decltype(&::cuMemImportFromShareableHandle) MemImportFromShareableHandle = nullptr;
  decltype(&::cuMemAddressReserve) MemAddressReserve = nullptr;
  decltype(&::cuMemAddressFree) MemAddressFree = nullptr;
  decltype(&::cuMemMap) MemMap = nullptr;
  decltype(&::cuMemUnmap) MemUnmap = nullptr;
  decltype(&::cuMemSetAccess) MemSetAccess = nullptr;
  decltype(&::cuMemsetD8Async) MemsetD8Async = nullptr;
  decltype(&::cuMemGetInfo) MemGetInfo = nullptr;
  decltype(&::cuDeviceCanAccessPeer) DeviceCanAccessPeer = nullptr;
  decltype(&::cuCtxSetCurrent) CtxSetCurrent = nullptr;
  decltype(&::cuCtxSynchronize) CtxSynchronize = nullptr;

  // Streams, events, capture and graphs: the rank's paging runs on the trainer's stream.
  decltype(&::cuStreamCreate) StreamCreate = nullptr;
  decltype(&::cuStreamDestroy) StreamDestroy = nullptr;
  decltype(&::cuStreamSynchronize) StreamSynchronize = nullptr;
  decltype(&::cuStreamQuery) StreamQuery = nullptr;
  decltype(&::cuLaunchHostFunc) LaunchHostFunc = nullptr;
  decltype(&::cuStreamIsCapturing) StreamIsCapturing = nullptr;
  decltype(&::cuThreadExchangeStreamCaptureMode) ThreadExchangeStreamCaptureMode = nullptr;
  decltype(&::cuStreamBeginCapture) StreamBeginCapture = nullptr;
  decltype(&::cuStreamEndCapture) StreamEndCapture = nullptr;
  decltype(&::cuGraphInstantiate) GraphInstantiate = nullptr;
  decltype(&::cuGraphLaunch) GraphLaunch = nullptr;
  decltype(&::cuGraphExecDestroy) GraphExecDestroy = nullptr;
  decltype(&::cuGraphDestroy) GraphDestroy = nullptr;
  decltype(&::cuEventCreate) EventCreate = nullptr;
  decltype(&::cuEventRecord) EventRecord = nullptr;
  decltype(&::cuEventQuery) EventQuery = nullptr;
  decltype(&::cuEventSynchronize) EventSynchronize = nullptr;
  decltype(&::cuEventDestroy) EventDestroy = nullptr;

  // Plain device and pinned host memory: the rank's rings, plans, page records and control
  // block copy live on the device; the step report is host memory the device writes.
  decltype(&::cuMemAlloc) MemAlloc = nullptr;
  decltype(&::cuMemFree) MemFree = nullptr;
  decltype(&::cuMemHostAlloc) MemHostAlloc = nullptr;
  decltype(&::cuMemFreeHost) MemFreeHost = nullptr;
  decltype(&::cuMemcpyHtoD) MemcpyHtoD = nullptr;
  decltype(&::cuMemcpyDtoH) MemcpyDtoH = nullptr;
  decltype(&::cuMemcpyDtoHAsync) MemcpyDtoHAsync = nullptr;

  // Modules: the client library's paging kernels, from the fatbin it carries.
  decltype(&::cuModuleLoadData) ModuleLoadData = nullptr;
  decltype(&::cuModuleUnload) ModuleUnload = nullptr;
  decltype(&::cuModuleGetFunction) ModuleGetFunction = nullptr;
  decltype(&::cuLaunchKernel) LaunchKernel = nullptr;
};

// Returns the driver call's Status from the enclosing function when it failed. `driver` is a
// `const CudaDriver*`.
#define STASH_CU_RETURN_IF_ERROR(driver, expr)                                 \
  do {                                                                         \
    ::stash::Status stash_cu_status_ = (driver)->Check((driver)->expr, #expr); \
    if (!stash_cu_status_.ok()) return stash_cu_status_;                       \
  } while (0)

}  // namespace stash

#endif  // STASH_COMMON_CUDA_DRIVER_H_
