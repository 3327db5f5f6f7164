#include "daemon/cuda/vmm_chunk_memory.h"

#include <algorithm>
#include <utility>

#include "common/bytes.h"
#include "common/macros.h"

namespace stash::daemon {
namespace {

// Chunk sizes beyond this are a configuration error, and the rounding below cannot overflow.
constexpr uint64_t kMaxChunkBytes = uint64_t{1} << 48;

CUdeviceptr Address(const uint8_t* p) { return reinterpret_cast<CUdeviceptr>(p); }

// `status` with `context` in front of its message, its code kept.
Status Annotate(const Status& status, const std::string& context) {
  if (status.ok()) return status;
  return {status.code(), context + ": " + status.message()};
}

}  // namespace

StatusOr<std::unique_ptr<VmmChunkMemory>> VmmChunkMemory::Create(
    const CudaDriver* driver, int device, const std::string& label, uint64_t bytes,
    uint64_t chunk_bytes, uint64_t page_bytes) {
  if (driver == nullptr) return InvalidArgumentError("VMM pool " + label + " needs a CUDA driver");
  if (bytes == 0 || chunk_bytes == 0 || chunk_bytes > kMaxChunkBytes) {
    return InvalidArgumentError("VMM pool " + label + " needs bytes > 0 and chunk bytes in (0, " +
                                FormatBytes(kMaxChunkBytes) + "]");
  }
  if (page_bytes == 0 || (page_bytes & (page_bytes - 1)) != 0 || page_bytes > kMaxChunkBytes) {
    return InvalidArgumentError("VMM pool " + label + ": pages of " + std::to_string(page_bytes) +
                                " bytes are not a power of two up to " +
                                FormatBytes(kMaxChunkBytes));
  }
  if (chunk_bytes % page_bytes != 0) {
    return InvalidArgumentError("VMM pool " + label + ": chunks of " + FormatBytes(chunk_bytes) +
                                " are not a whole number of " + FormatBytes(page_bytes) + " pages");
  }
  STASH_ASSIGN_OR_RETURN(std::string uuid, GpuUuid(driver, device));
  const std::string gpu = "GPU " + std::to_string(device) + " (" + uuid + ")";
  // Mapped mode's chunks are VMM allocations handed to ranks as POSIX file descriptors: a GPU
  // (or a driver, or a virtualized setup) without either cannot lease chunks at all.
  STASH_ASSIGN_OR_RETURN(const std::string missing, MissingChunkSupport(driver, device));
  if (!missing.empty()) {
    return FailedPreconditionError(
        gpu + " supports no " + missing + ", which the chunks of pool " + label +
        " need (VMM allocations, handed to mapped ranks as file descriptors): mapped mode needs a "
        "driver and a GPU setup (not every vGPU or MIG configuration) that offer both");
  }

  STASH_ASSIGN_OR_RETURN(PrimaryContext context, PrimaryContext::Retain(driver, device));
  const PrimaryContext::Scope scope(context);
  STASH_RETURN_IF_ERROR(scope.status());
  const CUmemAllocationProp prop = ChunkAllocationProp(device);
  size_t granularity = 0;
  STASH_CU_RETURN_IF_ERROR(driver, MemGetAllocationGranularity(
                                       &granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  // A power of two (2 MiB on every GPU so far), like the page size: the larger of the two is a
  // whole number of both. Every chunk, the last one too, is whole granularity units (cuMemCreate
  // and cuMemMap take nothing else) and whole pages (the tier's page ids, chunk x pages per
  // chunk + page, stay valid and no page straddles the pool's end), so the daemon-copy ring is
  // unchanged.
  if (granularity == 0 || (granularity & (granularity - 1)) != 0) {
    return FailedPreconditionError(gpu + " reports an allocation granularity of " +
                                   std::to_string(granularity) +
                                   " bytes, not a power of two: chunks cannot be whole pages");
  }
  const uint64_t g = granularity;
  const uint64_t unit = std::max<uint64_t>(g, page_bytes);
  const uint64_t rounded_chunk = (chunk_bytes + unit - 1) / unit * unit;
  // Down, never up: the pool takes at most what it was given.
  const uint64_t rounded_bytes = bytes / unit * unit;
  if (rounded_bytes == 0) {
    return InvalidArgumentError("VMM pool " + label + " of " + FormatBytes(bytes) +
                                " is less than one allocation granularity of " + gpu + " (" +
                                FormatBytes(g) + ") or one page (" + FormatBytes(page_bytes) +
                                "): raise --pool-bytes to at least " + FormatBytes(unit));
  }
  // One range for the whole pool, reserved once and never moved: the daemon-copy ring and
  // every page id address it.
  CUdeviceptr base = 0;
  STASH_CU_RETURN_IF_ERROR(driver, MemAddressReserve(&base, rounded_bytes, g, 0, 0));
  // The pool's device address as the pointer Tier and the paging kernels take.
  // NOLINTNEXTLINE(performance-no-int-to-ptr)
  auto* const base_pointer = reinterpret_cast<uint8_t*>(base);
  std::unique_ptr<VmmChunkMemory> memory(new VmmChunkMemory(driver, device, std::move(context),
                                                            label, std::move(uuid), g, base_pointer,
                                                            rounded_bytes, rounded_chunk));
  // The driver promises no zeroed memory: every new allocation is zero-filled on this stream.
  STASH_CU_RETURN_IF_ERROR(driver, StreamCreate(&memory->stream_, CU_STREAM_NON_BLOCKING));
  return memory;
}

VmmChunkMemory::VmmChunkMemory(const CudaDriver* driver, int device, PrimaryContext context,
                               std::string label, std::string uuid, uint64_t granularity,
                               uint8_t* base, uint64_t bytes, uint64_t chunk_bytes)
    : driver_(driver),
      device_(device),
      context_(std::move(context)),
      label_(std::move(label)),
      uuid_(std::move(uuid)),
      granularity_(granularity),
      base_(base),
      bytes_(bytes),
      chunk_bytes_(chunk_bytes),
      chunks_((bytes + chunk_bytes - 1) / chunk_bytes),
      handles_(std::make_unique<CUmemGenericAllocationHandle[]>(chunks_)),
      present_(std::make_unique<std::atomic<bool>[]>(chunks_)) {}

VmmChunkMemory::~VmmChunkMemory() {
  // Errors here can only be logged by the caller's next call: nothing to return them to. The
  // pushes fail only without a usable driver, when nothing of ours is held anyway.
  const PrimaryContext::Scope scope(context_);
  for (uint64_t c = 0; c < chunks_; ++c) {
    if (present(c)) (void)Drop(c);
  }
  if (stream_ != nullptr) driver_->StreamDestroy(stream_);
  driver_->MemAddressFree(Address(base_), bytes_);
}

uint64_t VmmChunkMemory::ChunkBytes(uint64_t chunk) const {
  const uint64_t first = chunk * chunk_bytes_;
  return std::min(chunk_bytes_, bytes_ - first);
}

std::string VmmChunkMemory::ChunkName(uint64_t chunk) const {
  return "chunk " + std::to_string(chunk) + " (" + FormatBytes(ChunkBytes(chunk)) + ") of " +
         label_ + " on GPU " + std::to_string(device_) + " (" + uuid_ + ")";
}

Status VmmChunkMemory::Ensure(uint64_t chunk) {
  STASH_CHECK(chunk < chunks_) << "chunk " << chunk << " of " << chunks_;
  if (present(chunk)) return Status::Ok();
  const PrimaryContext::Scope scope(context_);
  STASH_RETURN_IF_ERROR(scope.status());
  const uint64_t size = ChunkBytes(chunk);
  const CUdeviceptr at = Address(base_ + chunk * chunk_bytes_);
  const CUmemAllocationProp prop = ChunkAllocationProp(device_);
  CUmemGenericAllocationHandle handle = 0;
  const Status created = driver_->Check(driver_->MemCreate(&handle, size, &prop, 0), "cuMemCreate");
  if (!created.ok()) {
    if (created.code() == StatusCode::kResourceExhausted) {
      return ResourceExhaustedError(
          "no room on the GPU for " + ChunkName(chunk) +
          " now (a holder that still maps a returned chunk's old memory keeps it until it "
          "unmaps it): try later: " +
          created.message());
    }
    return Annotate(created, "creating " + ChunkName(chunk));
  }
  // Undoes what the steps below did when a later one fails: the chunk stays absent, nothing
  // of it held.
  bool mapped = false;
  auto undo = [&](const Status& failed) {
    if (mapped) driver_->MemUnmap(at, size);
    driver_->MemRelease(handle);
    return Annotate(failed, "setting up " + ChunkName(chunk));
  };
  Status step = driver_->Check(driver_->MemMap(at, size, 0, handle, 0), "cuMemMap");
  if (!step.ok()) return undo(step);
  mapped = true;
  const CUmemAccessDesc access = ReadWriteAccess(device_);
  step = driver_->Check(driver_->MemSetAccess(at, size, &access, 1), "cuMemSetAccess");
  if (!step.ok()) return undo(step);
  // Every lease starts zero-filled, and no byte crosses from one holder to the next: the driver
  // promises nothing about a new allocation's contents.
  step = driver_->Check(driver_->MemsetD8Async(at, 0, size, stream_), "cuMemsetD8Async");
  if (step.ok()) step = driver_->Check(driver_->StreamSynchronize(stream_), "cuStreamSynchronize");
  if (!step.ok()) return undo(step);
  handles_[chunk] = handle;
  bytes_present_.fetch_add(size, std::memory_order_relaxed);
  present_[chunk].store(true, std::memory_order_release);
  return Status::Ok();
}

Status VmmChunkMemory::Drop(uint64_t chunk) {
  const uint64_t size = ChunkBytes(chunk);
  const CUdeviceptr at = Address(base_ + chunk * chunk_bytes_);
  STASH_RETURN_IF_ERROR(Annotate(driver_->Check(driver_->MemUnmap(at, size), "cuMemUnmap"),
                                 "unmapping " + ChunkName(chunk)));
  // Unmapped: the chunk is absent whatever the release says (a failed release leaks the handle,
  // never a mapping).
  present_[chunk].store(false, std::memory_order_release);
  bytes_present_.fetch_sub(size, std::memory_order_relaxed);
  const CUmemGenericAllocationHandle handle = std::exchange(handles_[chunk], 0);
  return Annotate(driver_->Check(driver_->MemRelease(handle), "cuMemRelease"),
                  "releasing " + ChunkName(chunk));
}

Status VmmChunkMemory::Renew(uint64_t chunk) {
  STASH_CHECK(chunk < chunks_) << "chunk " << chunk << " of " << chunks_;
  if (present(chunk)) {
    const PrimaryContext::Scope scope(context_);
    STASH_RETURN_IF_ERROR(scope.status());
    // Release first: creating the new allocation before would hold the chunk twice for a
    // moment, and fail for it on a full GPU, while a holder that still maps the old memory
    // keeps that alive (and counted) anyway.
    STASH_RETURN_IF_ERROR(Drop(chunk));
  }
  return Ensure(chunk);
}

StatusOr<UniqueFd> VmmChunkMemory::ExportFd(uint64_t chunk) const {
  STASH_CHECK(chunk < chunks_) << "chunk " << chunk << " of " << chunks_;
  if (!present(chunk)) {
    return FailedPreconditionError(ChunkName(chunk) + " is absent: Ensure it before leasing it");
  }
  const PrimaryContext::Scope scope(context_);
  STASH_RETURN_IF_ERROR(scope.status());
  int fd = -1;
  STASH_RETURN_IF_ERROR(Annotate(
      driver_->Check(driver_->MemExportToShareableHandle(
                         &fd, handles_[chunk], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                     "cuMemExportToShareableHandle"),
      "exporting " + ChunkName(chunk)));
  return UniqueFd(fd);
}

}  // namespace stash::daemon
