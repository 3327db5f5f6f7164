#include "client/memory/cuda_memory.h"

#include <cuda.h>

#include <cstdio>

#include "common/cuda_driver.h"
#include "common/macros.h"
#include "common/random.h"

namespace stash::client {
namespace {

// Makes `context` current on this thread for the scope (the trainer's own current context, if
// any, is restored after).
class ContextScope {
 public:
  ContextScope(const CudaDriver* driver, void* context) : driver_(driver) {
    status_ = driver_->Check(driver_->CtxPushCurrent(static_cast<CUcontext>(context)),
                             "cuCtxPushCurrent");
  }
  ~ContextScope() {
    if (!status_.ok()) return;
    CUcontext popped = nullptr;
    driver_->CtxPopCurrent(&popped);
  }
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;
  const Status& status() const { return status_; }

 private:
  const CudaDriver* driver_;
  Status status_;
};

std::string Hex(uint64_t v) {
  char text[24];
  std::snprintf(text, sizeof(text), "0x%llx", static_cast<unsigned long long>(v));
  return text;
}

}  // namespace

StatusOr<std::unique_ptr<CudaSide>> CudaSide::Open(int device) {
  auto driver = CudaDriver::Get();
  if (!driver.ok()) {
    return FailedPreconditionError("the cuda backend needs the NVIDIA driver: " +
                                   driver.status().message());
  }
  const CudaDriver* d = *driver;
  int count = 0;
  STASH_CU_RETURN_IF_ERROR(d, DeviceGetCount(&count));
  if (device < 0 || device >= count) {
    return InvalidArgumentError("Options.device " + std::to_string(device) + " is not a GPU of " +
                                "this process (it sees " + std::to_string(count) +
                                "; CUDA_VISIBLE_DEVICES narrows the list)");
  }
  std::unique_ptr<CudaSide> side(new CudaSide());
  side->driver_ = d;
  side->device_ = device;
  CUdevice dev = 0;
  STASH_CU_RETURN_IF_ERROR(d, DeviceGet(&dev, device));
  // Checked here, at Open, not at the first EnqueueWait in the middle of a training step.
  int mem_ops = 0;
  STASH_CU_RETURN_IF_ERROR(
      d, DeviceGetAttribute(&mem_ops, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, dev));
  if (mem_ops == 0) {
    return FailedPreconditionError(
        "GPU " + std::to_string(device) +
        " does not support 64-bit stream memory operations (cuStreamBatchMemOp, "
        "cuStreamWaitValue64), which the cuda backend orders streams with: drivers for CUDA 12 "
        "and newer (R525+) offer them by default; an older driver needs the nvidia kernel "
        "module loaded with NVreg_EnableStreamMemOPs=1");
  }
  CUuuid uuid{};
  STASH_CU_RETURN_IF_ERROR(d, DeviceGetUuid(&uuid, dev));
  side->uuid_.assign(uuid.bytes, sizeof(uuid.bytes));
  CUcontext context = nullptr;
  STASH_CU_RETURN_IF_ERROR(d, DevicePrimaryCtxRetain(&context, dev));
  side->context_ = context;
  return side;
}

CudaSide::~CudaSide() {
  if (context_ == nullptr) return;
  CUdevice dev = 0;
  if (driver_->DeviceGet(&dev, device_) == CUDA_SUCCESS) driver_->DevicePrimaryCtxRelease(dev);
}

StatusOr<DeviceLocation> CudaSide::Locate(const void* pointer, uint64_t bytes, const char* what) {
  ContextScope scope(driver_, context_);
  if (!scope.status().ok()) return scope.status();
  const auto address = reinterpret_cast<CUdeviceptr>(pointer);
  // Booleans are written as 1 or 4 bytes depending on the driver: zeroed 8-byte slots read
  // right either way.
  unsigned int memory_type = 0;
  unsigned long long managed = 0;
  int ordinal = -1;
  unsigned long long buffer_id = 0;
  unsigned long long ipc_capable = 0;
  CUpointer_attribute attributes[] = {
      CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_IS_MANAGED,
      CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, CU_POINTER_ATTRIBUTE_BUFFER_ID,
      CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE};
  void* values[] = {&memory_type, &managed, &ordinal, &buffer_id, &ipc_capable};
  STASH_CU_RETURN_IF_ERROR(driver_, PointerGetAttributes(sizeof(attributes) / sizeof(attributes[0]),
                                                         attributes, values, address));
  const std::string name = std::string(what) + " " + Hex(address);
  if (managed != 0) {
    return InvalidArgumentError(name +
                                " is managed memory (cudaMallocManaged), which CUDA IPC "
                                "cannot share: allocate it with cudaMalloc or torch.empty "
                                "on the GPU");
  }
  if (memory_type == 0) {
    return InvalidArgumentError(name +
                                " is not CUDA memory: pass a device pointer from "
                                "cudaMalloc (or a tensor's data_ptr()), or a HostBuffer");
  }
  if (memory_type == CU_MEMORYTYPE_HOST) {
    return InvalidArgumentError(name +
                                " is host memory: use a HostBuffer for host memory, and "
                                "device pointers for GPU tensors");
  }
  if (ordinal != device_) {
    return InvalidArgumentError(name + " is on GPU " + std::to_string(ordinal) +
                                " but this session is on GPU " + std::to_string(device_) +
                                ": open one Client per GPU (Options.device)");
  }
  if (ipc_capable == 0) {
    return InvalidArgumentError(
        name +
        " is virtual-memory-management memory (cuMemCreate; PyTorch's expandable "
        "segments), which legacy CUDA IPC cannot export: run the trainer with "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False");
  }
  // The cudaMalloc allocation itself (what cuIpcGetMemHandle exports and the daemon checks):
  // from the table when we know it, else from the driver.
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t start = 0;
  uint64_t size = 0;
  const AllocationTable::Entry* known = allocations_.FindContaining(address, buffer_id, &start);
  if (known != nullptr) {
    size = known->bytes;
  } else {
    CUdeviceptr range_start = 0;
    size_t range_size = 0;
    STASH_CU_RETURN_IF_ERROR(driver_, MemGetAddressRange(&range_start, &range_size, address));
    start = range_start;
    size = range_size;
  }
  const uint64_t offset = address - start;
  if (bytes > size - offset) {
    return InvalidArgumentError(name + " + " + std::to_string(bytes) +
                                " bytes runs past the end of its CUDA allocation (" +
                                std::to_string(size - offset) + " bytes left after it)");
  }

  DeviceLocation location;
  location.offset = offset;
  location.bytes = size;
  if (known != nullptr) {
    location.memory_id = known->memory_id;
    location.handle = known->handle;
    return location;
  }
  CUipcMemHandle handle{};
  const CUresult exported = driver_->IpcGetMemHandle(&handle, start);
  if (exported != CUDA_SUCCESS) {
    return FailedPreconditionError(driver_->Check(exported, "cuIpcGetMemHandle").message() +
                                   ": the allocation holding " + name +
                                   " cannot be exported; allocate it with cudaMalloc");
  }
  AllocationTable::Entry entry;
  entry.memory_id = RandomNonZeroU64();
  entry.buffer_id = buffer_id;
  entry.bytes = size;
  entry.handle.assign(handle.reserved, sizeof(handle.reserved));
  location.memory_id = entry.memory_id;
  location.handle = entry.handle;
  location.stale_memory_ids = allocations_.Insert(start, std::move(entry));
  return location;
}

uint64_t CudaSide::Forget(const void* pointer) {
  std::lock_guard<std::mutex> lock(mu_);
  return allocations_.Remove(reinterpret_cast<uint64_t>(pointer));
}

std::vector<uint64_t> CudaSide::ForgetAll() {
  std::lock_guard<std::mutex> lock(mu_);
  return allocations_.Clear();
}

namespace {

// Host memory a stream may still use after its owner freed it (see MapHost): kept mapped and
// registered until the process exits. Never destroyed (no exit-time ordering with the driver).
void KeepForProcessLifetime(std::shared_ptr<void> owner) {
  static auto* mu = new std::mutex;
  static auto* kept = new std::vector<std::shared_ptr<void>>;
  std::lock_guard<std::mutex> lock(*mu);
  kept->push_back(std::move(owner));
}

}  // namespace

StatusOr<uint64_t> CudaSide::MapHost(void* data, uint64_t bytes, std::shared_ptr<void> owner,
                                     std::function<void()>* release) {
  ContextScope scope(driver_, context_);
  if (!scope.status().ok()) return scope.status();
  STASH_CU_RETURN_IF_ERROR(
      driver_,
      MemHostRegister(data, bytes, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP));
  CUdeviceptr device_address = 0;
  const CUresult mapped = driver_->MemHostGetDevicePointer(&device_address, data, 0);
  if (mapped != CUDA_SUCCESS) {
    driver_->MemHostUnregister(data);
    return driver_->Check(mapped, "cuMemHostGetDevicePointer");
  }
  // The registration outlives this session when the buffer does: hold the context for good.
  CUdevice dev = 0;
  CUcontext held = nullptr;
  STASH_CU_RETURN_IF_ERROR(driver_, DeviceGet(&dev, device_));
  STASH_CU_RETURN_IF_ERROR(driver_, DevicePrimaryCtxRetain(&held, dev));
  // A stream may have a wait on (or a write to) a counter here queued when the owner frees the
  // memory: an exception path, a close before synchronize. Unregistering it then faults the
  // trainer's context, and knowing when every stream passed it would mean synchronizing them
  // (NCCL's too: a deadlock when a peer waits at a barrier). So the memory stays mapped and
  // registered, with the context held, until the process exits.
  *release = [owner = std::move(owner)]() mutable { KeepForProcessLifetime(std::move(owner)); };
  return static_cast<uint64_t>(device_address);
}

Status CudaSide::WriteValue(void* stream, uint64_t address, uint64_t value) {
  ContextScope scope(driver_, context_);
  if (!scope.status().ok()) return scope.status();
  return driver_->WriteValueAfterBarrier(static_cast<CUstream>(stream), address, value);
}

Status CudaSide::WaitValue(void* stream, uint64_t address, uint64_t value) {
  ContextScope scope(driver_, context_);
  if (!scope.status().ok()) return scope.status();
  return driver_->Check(driver_->StreamWaitValue64(static_cast<CUstream>(stream), address, value,
                                                   CU_STREAM_WAIT_VALUE_GEQ),
                        "cuStreamWaitValue64");
}

}  // namespace stash::client
