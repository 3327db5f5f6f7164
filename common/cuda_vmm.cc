#include "common/cuda_vmm.h"

#include <cstdio>
#include <utility>

#include "common/macros.h"

namespace stash {

std::string FormatGpuUuid(const CUuuid& uuid) {
  std::string text = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) text += '-';
    char hex[3];
    std::snprintf(hex, sizeof(hex), "%02x", static_cast<unsigned char>(uuid.bytes[i]));
    text += hex;
  }
  return text;
}

StatusOr<std::string> GpuUuid(const CudaDriver* driver, int device) {
  CUdevice dev = 0;
  STASH_CU_RETURN_IF_ERROR(driver, DeviceGet(&dev, device));
  CUuuid uuid{};
  STASH_CU_RETURN_IF_ERROR(driver, DeviceGetUuid(&uuid, dev));
  return FormatGpuUuid(uuid);
}

StatusOr<int> GpuOrdinalOfUuid(const CudaDriver* driver, const std::string& uuid) {
  int count = 0;
  STASH_CU_RETURN_IF_ERROR(driver, DeviceGetCount(&count));
  for (int device = 0; device < count; ++device) {
    STASH_ASSIGN_OR_RETURN(const std::string seen, GpuUuid(driver, device));
    if (seen == uuid) return device;
  }
  return NotFoundError("this process sees no GPU " + uuid + " (among " + std::to_string(count) +
                       "; CUDA_VISIBLE_DEVICES narrows the list)");
}

StatusOr<std::string> GpuName(const CudaDriver* driver, int device) {
  STASH_ASSIGN_OR_RETURN(const std::string uuid, GpuUuid(driver, device));
  return "GPU " + std::to_string(device) + " (" + uuid + ")";
}

StatusOr<std::string> MissingChunkSupport(const CudaDriver* driver, int device) {
  CUdevice dev = 0;
  STASH_CU_RETURN_IF_ERROR(driver, DeviceGet(&dev, device));
  int vmm = 0;
  int posix_fd = 0;
  STASH_CU_RETURN_IF_ERROR(
      driver,
      DeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev));
  STASH_CU_RETURN_IF_ERROR(
      driver, DeviceGetAttribute(
                  &posix_fd, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, dev));
  std::string missing;
  if (vmm == 0) {
    missing =
        "virtual memory management (CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 0)";
  }
  if (posix_fd == 0) {
    if (!missing.empty()) missing += " nor ";
    missing +=
        "exporting memory as POSIX file descriptors "
        "(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED is 0)";
  }
  return missing;
}

CUmemAllocationProp ChunkAllocationProp(int device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

CUmemAccessDesc ReadWriteAccess(int device) {
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return access;
}

StatusOr<PrimaryContext> PrimaryContext::Retain(const CudaDriver* driver, int device) {
  PrimaryContext context;
  STASH_CU_RETURN_IF_ERROR(driver, DeviceGet(&context.device_, device));
  STASH_CU_RETURN_IF_ERROR(driver, DevicePrimaryCtxRetain(&context.context_, context.device_));
  context.driver_ = driver;
  return context;
}

PrimaryContext::PrimaryContext(PrimaryContext&& other) noexcept
    : driver_(std::exchange(other.driver_, nullptr)),
      device_(other.device_),
      context_(std::exchange(other.context_, nullptr)) {}

PrimaryContext& PrimaryContext::operator=(PrimaryContext&& other) noexcept {
  if (this != &other) {
    if (context_ != nullptr) driver_->DevicePrimaryCtxRelease(device_);
    driver_ = std::exchange(other.driver_, nullptr);
    device_ = other.device_;
    context_ = std::exchange(other.context_, nullptr);
  }
  return *this;
}

PrimaryContext::~PrimaryContext() {
  if (context_ != nullptr) driver_->DevicePrimaryCtxRelease(device_);
}

RelaxedCaptureMode::RelaxedCaptureMode(const CudaDriver* driver) : driver_(driver) {
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  if (driver_->ThreadExchangeStreamCaptureMode(&mode) == CUDA_SUCCESS) {
    previous_ = mode;
    exchanged_ = true;
  }
}

RelaxedCaptureMode::~RelaxedCaptureMode() {
  if (!exchanged_) return;
  CUstreamCaptureMode mode = previous_;
  driver_->ThreadExchangeStreamCaptureMode(&mode);
}

PrimaryContext::Scope::Scope(const PrimaryContext& context)
    : driver_(context.driver_), relaxed_(context.driver_) {
  status_ = driver_->Check(driver_->CtxPushCurrent(context.context_), "cuCtxPushCurrent");
}

PrimaryContext::Scope::~Scope() {
  if (!status_.ok()) return;
  CUcontext popped = nullptr;
  driver_->CtxPopCurrent(&popped);
}

}  // namespace stash
