#include "daemon/cuda/pinned_chunk_memory.h"

#include <fcntl.h>

#include <utility>

#include "common/bytes.h"
#include "common/macros.h"
#include "common/sys.h"

namespace stash::daemon {

StatusOr<std::unique_ptr<PinnedChunkMemory>> PinnedChunkMemory::Create(
    const CudaDriver* driver, int device, const std::string& label, uint64_t bytes,
    uint64_t chunk_bytes, const ChunkMemoryOptions& options) {
  if (driver == nullptr) {
    return InvalidArgumentError("pinned tier " + label + " needs a CUDA driver");
  }
  STASH_ASSIGN_OR_RETURN(auto memory, ChunkMemory::Create(label, bytes, chunk_bytes, options));
  STASH_ASSIGN_OR_RETURN(PrimaryContext context, PrimaryContext::Retain(driver, device));
  std::unique_ptr<PinnedChunkMemory> pinned(
      new PinnedChunkMemory(driver, device, std::move(context), std::move(memory)));
  const PrimaryContext::Scope scope(pinned->context_);
  STASH_RETURN_IF_ERROR(scope.status());
  for (uint64_t c = 0; c < pinned->chunks(); ++c) {
    if (const Status registered = pinned->Register(c); !registered.ok()) {
      return Status(registered.code(), registered.message() + " (" + FormatBytes(bytes) +
                                           " of host tier for GPU " + std::to_string(device) +
                                           "): lower --host-tier-bytes");
    }
  }
  return pinned;
}

PinnedChunkMemory::PinnedChunkMemory(const CudaDriver* driver, int device, PrimaryContext context,
                                     std::unique_ptr<ChunkMemory> memory)
    : driver_(driver),
      device_(device),
      context_(std::move(context)),
      memory_(std::move(memory)),
      registered_(std::make_unique<std::atomic<bool>[]>(memory_->chunks())) {}

PinnedChunkMemory::~PinnedChunkMemory() {
  // Errors here have nobody to go to; the pushes fail only without a usable driver, when
  // nothing of ours is registered anyway.
  const PrimaryContext::Scope scope(context_);
  for (uint64_t c = 0; c < chunks(); ++c) {
    if (present(c)) (void)Unregister(c);
  }
}

std::string PinnedChunkMemory::ChunkName(uint64_t chunk) const {
  return "chunk " + std::to_string(chunk) + " of the host tier for GPU " + std::to_string(device_);
}

Status PinnedChunkMemory::Register(uint64_t chunk) {
  void* host = ChunkBase(chunk);
  // The registration would fault every page in anyway; populating first counts them as warm
  // (stats). A short populate leaves the rest to the registration.
  (void)memory_->Populate(chunk);
  STASH_CU_RETURN_IF_ERROR(
      driver_, MemHostRegister(host, ChunkBytes(chunk),
                               CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE));
  CUdeviceptr device_address = 0;
  Status status = driver_->Check(driver_->MemHostGetDevicePointer(&device_address, host, 0),
                                 "cuMemHostGetDevicePointer");
  if (status.ok() && device_address != reinterpret_cast<CUdeviceptr>(host)) {
    status = FailedPreconditionError(
        "GPU " + std::to_string(device_) +
        " reaches registered host memory at another address than the CPU "
        "(CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM is 0): its host tier "
        "cannot be chunked; run without --host-tier-bytes");
  }
  if (!status.ok()) {
    (void)driver_->MemHostUnregister(host);
    return status;
  }
  registered_[chunk].store(true, std::memory_order_release);
  return Status::Ok();
}

Status PinnedChunkMemory::Unregister(uint64_t chunk) {
  STASH_RETURN_IF_ERROR(
      driver_->Check(driver_->MemHostUnregister(ChunkBase(chunk)), "cuMemHostUnregister"));
  registered_[chunk].store(false, std::memory_order_release);
  return Status::Ok();
}

Status PinnedChunkMemory::Renew(uint64_t chunk) {
  STASH_CHECK(chunk < chunks()) << "chunk " << chunk << " of " << chunks();
  const PrimaryContext::Scope scope(context_);
  STASH_RETURN_IF_ERROR(scope.status());
  // The registration pins the pages mapped now: drop it before the fresh memfd takes their
  // place, or the GPU would go on writing the old pages.
  if (present(chunk)) STASH_RETURN_IF_ERROR(Unregister(chunk));
  STASH_RETURN_IF_ERROR(memory_->Renew(chunk));
  if (const Status registered = Register(chunk); !registered.ok()) {
    return Status(registered.code(), "renewing " + ChunkName(chunk) + ": " + registered.message());
  }
  return Status::Ok();
}

StatusOr<UniqueFd> PinnedChunkMemory::ExportFd(uint64_t chunk) const {
  STASH_CHECK(chunk < chunks()) << "chunk " << chunk << " of " << chunks();
  UniqueFd fd(fcntl(memory_->fd(chunk), F_DUPFD_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoStatus("dup of " + ChunkName(chunk) + "'s memfd");
  return fd;
}

}  // namespace stash::daemon
