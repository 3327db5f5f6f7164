#include "common/cuda_driver.h"

#include <dlfcn.h>

#include <mutex>

#include "common/macros.h"

namespace stash {
namespace {

// The exported name of an entry point after cuda.h's version macros (cuMemGetAddressRange is
// cuMemGetAddressRange_v2, and so on): the name the driver library exports.
#define STASH_CU_NAME2(name) #name
#define STASH_CU_NAME(name) STASH_CU_NAME2(name)

template <typename Fn>
Status Resolve(void* library, const char* name, const std::string& path, Fn* out) {
  void* symbol = dlsym(library, name);
  if (symbol == nullptr) {
    return FailedPreconditionError(std::string("the CUDA driver ") + path + " has no " + name +
                                   ": update the NVIDIA driver (CUDA 12 or newer)");
  }
  *out = reinterpret_cast<Fn>(symbol);
  return Status::Ok();
}

}  // namespace

StatusOr<std::unique_ptr<CudaDriver>> CudaDriver::Load(const std::string& path) {
  void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* why = dlerror();
    return FailedPreconditionError("cannot load the CUDA driver " + path + " (" +
                                   (why != nullptr ? why : "unknown error") +
                                   "): is the NVIDIA driver installed, and is this a GPU node?");
  }
  auto d = std::make_unique<CudaDriver>();
  d->library = library;
#define STASH_CU_RESOLVE(field, name) \
  STASH_RETURN_IF_ERROR(Resolve(library, STASH_CU_NAME(name), path, &d->field))
  STASH_CU_RESOLVE(Init, cuInit);
  STASH_CU_RESOLVE(GetErrorName, cuGetErrorName);
  STASH_CU_RESOLVE(GetErrorString, cuGetErrorString);
  STASH_CU_RESOLVE(DeviceGet, cuDeviceGet);
  STASH_CU_RESOLVE(DeviceGetCount, cuDeviceGetCount);
  STASH_CU_RESOLVE(DeviceGetAttribute, cuDeviceGetAttribute);
  STASH_CU_RESOLVE(DeviceGetUuid, cuDeviceGetUuid);
  STASH_CU_RESOLVE(CtxPushCurrent, cuCtxPushCurrent);
  STASH_CU_RESOLVE(CtxPopCurrent, cuCtxPopCurrent);
  STASH_CU_RESOLVE(DevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain);
  STASH_CU_RESOLVE(DevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease);
  STASH_CU_RESOLVE(PointerGetAttributes, cuPointerGetAttributes);
  STASH_CU_RESOLVE(MemGetAddressRange, cuMemGetAddressRange);
  STASH_CU_RESOLVE(IpcGetMemHandle, cuIpcGetMemHandle);
  STASH_CU_RESOLVE(IpcOpenMemHandle, cuIpcOpenMemHandle);
  STASH_CU_RESOLVE(IpcCloseMemHandle, cuIpcCloseMemHandle);
  STASH_CU_RESOLVE(MemHostRegister, cuMemHostRegister);
  STASH_CU_RESOLVE(MemHostUnregister, cuMemHostUnregister);
  STASH_CU_RESOLVE(MemHostGetDevicePointer, cuMemHostGetDevicePointer);
  STASH_CU_RESOLVE(StreamWaitValue64, cuStreamWaitValue64);
  STASH_CU_RESOLVE(StreamBatchMemOp, cuStreamBatchMemOp);
  STASH_CU_RESOLVE(MemGetAllocationGranularity, cuMemGetAllocationGranularity);
  STASH_CU_RESOLVE(MemCreate, cuMemCreate);
  STASH_CU_RESOLVE(MemRelease, cuMemRelease);
  STASH_CU_RESOLVE(MemExportToShareableHandle, cuMemExportToShareableHandle);
  STASH_CU_RESOLVE(MemImportFromShareableHandle, cuMemImportFromShareableHandle);
  STASH_CU_RESOLVE(MemAddressReserve, cuMemAddressReserve);
  STASH_CU_RESOLVE(MemAddressFree, cuMemAddressFree);
  STASH_CU_RESOLVE(MemMap, cuMemMap);
  STASH_CU_RESOLVE(MemUnmap, cuMemUnmap);
  STASH_CU_RESOLVE(MemSetAccess, cuMemSetAccess);
  STASH_CU_RESOLVE(MemsetD8Async, cuMemsetD8Async);
  STASH_CU_RESOLVE(MemGetInfo, cuMemGetInfo);
  STASH_CU_RESOLVE(DeviceCanAccessPeer, cuDeviceCanAccessPeer);
  STASH_CU_RESOLVE(CtxSetCurrent, cuCtxSetCurrent);
  STASH_CU_RESOLVE(CtxSynchronize, cuCtxSynchronize);
  STASH_CU_RESOLVE(StreamCreate, cuStreamCreate);
  STASH_CU_RESOLVE(StreamDestroy, cuStreamDestroy);
  STASH_CU_RESOLVE(StreamSynchronize, cuStreamSynchronize);
  STASH_CU_RESOLVE(StreamQuery, cuStreamQuery);
  STASH_CU_RESOLVE(LaunchHostFunc, cuLaunchHostFunc);
  STASH_CU_RESOLVE(StreamIsCapturing, cuStreamIsCapturing);
  STASH_CU_RESOLVE(ThreadExchangeStreamCaptureMode, cuThreadExchangeStreamCaptureMode);
  STASH_CU_RESOLVE(StreamBeginCapture, cuStreamBeginCapture);
  STASH_CU_RESOLVE(StreamEndCapture, cuStreamEndCapture);
  STASH_CU_RESOLVE(GraphInstantiate, cuGraphInstantiate);
  STASH_CU_RESOLVE(GraphLaunch, cuGraphLaunch);
  STASH_CU_RESOLVE(GraphExecDestroy, cuGraphExecDestroy);
  STASH_CU_RESOLVE(GraphDestroy, cuGraphDestroy);
  STASH_CU_RESOLVE(EventCreate, cuEventCreate);
  STASH_CU_RESOLVE(EventRecord, cuEventRecord);
  STASH_CU_RESOLVE(EventQuery, cuEventQuery);
  STASH_CU_RESOLVE(EventSynchronize, cuEventSynchronize);
  STASH_CU_RESOLVE(EventDestroy, cuEventDestroy);
  STASH_CU_RESOLVE(MemAlloc, cuMemAlloc);
  STASH_CU_RESOLVE(MemFree, cuMemFree);
  STASH_CU_RESOLVE(MemHostAlloc, cuMemHostAlloc);
  STASH_CU_RESOLVE(MemFreeHost, cuMemFreeHost);
  STASH_CU_RESOLVE(MemcpyHtoD, cuMemcpyHtoD);
  STASH_CU_RESOLVE(MemcpyDtoH, cuMemcpyDtoH);
  STASH_CU_RESOLVE(MemcpyDtoHAsync, cuMemcpyDtoHAsync);
  STASH_CU_RESOLVE(ModuleLoadData, cuModuleLoadData);
  STASH_CU_RESOLVE(ModuleUnload, cuModuleUnload);
  STASH_CU_RESOLVE(ModuleGetFunction, cuModuleGetFunction);
  STASH_CU_RESOLVE(LaunchKernel, cuLaunchKernel);
#undef STASH_CU_RESOLVE
  return d;
}

StatusOr<const CudaDriver*> CudaDriver::Get() {
  static std::once_flag once;
  static StatusOr<std::unique_ptr<CudaDriver>>* loaded = nullptr;
  std::call_once(once, [] {
    auto d = Load("libcuda.so.1");
    if (d.ok()) {
      const Status init = (*d)->Check((*d)->Init(0), "cuInit(0)");
      if (!init.ok()) d = init;
    }
    loaded = new StatusOr<std::unique_ptr<CudaDriver>>(std::move(d));  // never freed: global
  });
  if (!loaded->ok()) return loaded->status();
  return loaded->value().get();
}

Status CudaDriver::WriteValueAfterBarrier(CUstream stream, CUdeviceptr address,
                                          uint64_t value) const {
  CUstreamBatchMemOpParams ops[2] = {};
  ops[0].memoryBarrier.operation = CU_STREAM_MEM_OP_BARRIER;
  ops[0].memoryBarrier.flags = CU_STREAM_MEMORY_BARRIER_TYPE_SYS;
  ops[1].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_64;
  ops[1].writeValue.address = address;
  ops[1].writeValue.value64 = value;
  ops[1].writeValue.flags = CU_STREAM_WRITE_VALUE_DEFAULT;
  return Check(StreamBatchMemOp(stream, 2, ops, 0), "cuStreamBatchMemOp(barrier, write value)");
}

Status CudaDriver::Check(CUresult result, const char* expression) const {
  if (result == CUDA_SUCCESS) return Status::Ok();
  const char* name = nullptr;
  const char* text = nullptr;
  if (GetErrorName == nullptr || GetErrorName(result, &name) != CUDA_SUCCESS) name = nullptr;
  if (GetErrorString == nullptr || GetErrorString(result, &text) != CUDA_SUCCESS) text = nullptr;
  return Status(result == CUDA_ERROR_OUT_OF_MEMORY ? StatusCode::kResourceExhausted
                                                   : StatusCode::kFailedPrecondition,
                std::string(expression) + " failed: " + (name != nullptr ? name : "CUDA error") +
                    " (" + (text != nullptr ? text : std::to_string(result)) + ")");
}

}  // namespace stash
