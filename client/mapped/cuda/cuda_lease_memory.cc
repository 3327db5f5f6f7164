#include "client/mapped/cuda/cuda_lease_memory.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "common/macros.h"
#include "common/shm.h"
#include "common/sys.h"

namespace stash::client {
namespace {

constexpr uint64_t kMaxTierBytes = uint64_t{1} << 46;

const char* TierName(uint32_t tier) {
  switch (tier) {
    case kernels::kLeaseDevice:
      return "own-device";
    case kernels::kLeasePeer:
      return "peer";
    default:
      return "host";
  }
}

Status Annotate(const Status& status, const std::string& context) {
  if (status.ok()) return status;
  return {status.code(), context + ": " + status.message()};
}

// Where a free host slot goes back to: an inaccessible reservation, never a hole another
// mapping could take, and never inherited by a forked child. Also after a failed mmap(MAP_FIXED)
// over the slot: Linux may have removed the old mapping (the reservation) before it failed.
void ReserveHostRange(uint8_t* at, uint64_t bytes) {
  void* p =
      mmap(at, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  if (p != MAP_FAILED) madvise(p, bytes, MADV_DONTFORK);
}

}  // namespace

StatusOr<std::unique_ptr<CudaLeaseMemory>> CudaLeaseMemory::Create(
    const CudaDriver* driver, int device, uint64_t chunk_bytes,
    const std::array<uint64_t, kernels::kLeaseTiers>& tier_bytes) {
  if (driver == nullptr) return InvalidArgumentError("CudaLeaseMemory needs a CUDA driver");
  STASH_ASSIGN_OR_RETURN(const std::string gpu, GpuName(driver, device));
  STASH_ASSIGN_OR_RETURN(const std::string missing, MissingChunkSupport(driver, device));
  if (!missing.empty()) {
    return FailedPreconditionError(
        gpu + " cannot map stashd's chunks (it supports no " + missing +
        "): use mode daemon-copy (Options.mode, stashd.connect(mode=\"daemon-copy\"))");
  }
  STASH_ASSIGN_OR_RETURN(PrimaryContext context, PrimaryContext::Retain(driver, device));
  std::unique_ptr<CudaLeaseMemory> memory(
      new CudaLeaseMemory(driver, device, std::move(context), chunk_bytes));
  const PrimaryContext::Scope scope(memory->context_);
  STASH_RETURN_IF_ERROR(scope.status());
  const CUmemAllocationProp prop = ChunkAllocationProp(device);
  size_t granularity = 0;
  STASH_CU_RETURN_IF_ERROR(
      driver, MemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  memory->granularity_ = granularity;
  if (granularity == 0 || chunk_bytes == 0 || chunk_bytes % granularity != 0 ||
      chunk_bytes > kMaxTierBytes) {
    return InvalidArgumentError("stashd's chunks of " + std::to_string(chunk_bytes) +
                                " bytes are not a whole number of " + gpu +
                                "'s allocation granularity (" + std::to_string(granularity) +
                                " bytes): use a stashd of the same release on this node");
  }
  const auto page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  MutexLock lock(&memory->mu_);
  for (uint32_t tier = 0; tier < kernels::kLeaseTiers; ++tier) {
    Range& r = memory->ranges_[tier];
    const uint64_t slots = std::max<uint64_t>(
        1, (std::min(tier_bytes[tier], kMaxTierBytes) + chunk_bytes - 1) / chunk_bytes);
    const uint64_t bytes = slots * chunk_bytes;
    if (tier == kernels::kLeaseHost) {
      // CPU addresses, like LeaseTable's; on a 2 MiB boundary where chunks are whole huge pages,
      // so the daemon's huge pages map as such here too.
      const uint64_t align = chunk_bytes % kHugePageBytes == 0 ? kHugePageBytes : 0;
      if (chunk_bytes % page != 0) {
        return InvalidArgumentError("stashd's chunks of " + std::to_string(chunk_bytes) +
                                    " bytes are not whole pages");
      }
      void* p = mmap(nullptr, bytes + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                     -1, 0);
      if (p == MAP_FAILED) return ErrnoStatus("reserving the host lease range (mmap PROT_NONE)");
      uint8_t* base = TrimToAlignment(static_cast<uint8_t*>(p), bytes, align);
      // A forked child (a data loader) never inherits a rank's chunks.
      if (madvise(base, bytes, MADV_DONTFORK) != 0) {
        const Status failed = ErrnoStatus("madvise(MADV_DONTFORK) of the host lease range");
        munmap(base, bytes);
        return failed;
      }
      r.base = base;
    } else {
      CUdeviceptr base = 0;
      STASH_RETURN_IF_ERROR(
          Annotate(driver->Check(driver->MemAddressReserve(&base, bytes, granularity, 0, 0),
                                 "cuMemAddressReserve"),
                   std::string("reserving the ") + TierName(tier) + " lease range on " + gpu));
      // The range's device address as the pointer the paging kernels take.
      r.base = reinterpret_cast<uint8_t*>(base);  // NOLINT(performance-no-int-to-ptr)
    }
    r.bytes = bytes;
    r.slots = slots;
    memory->slots_[tier].resize(slots);
  }
  return memory;
}

CudaLeaseMemory::CudaLeaseMemory(const CudaDriver* driver, int device, PrimaryContext context,
                                 uint64_t chunk_bytes)
    : driver_(driver), device_(device), context_(std::move(context)), chunk_bytes_(chunk_bytes) {}

CudaLeaseMemory::~CudaLeaseMemory() {
  const PrimaryContext::Scope scope(context_);
  MutexLock lock(&mu_);
  for (uint32_t tier = 0; tier < kernels::kLeaseTiers; ++tier) {
    for (uint64_t s = 0; s < slots_[tier].size(); ++s) {
      Slot& slot = slots_[tier][s];
      if (slot.state == SlotState::kFree) continue;
      if (slot.state == SlotState::kUnmapping) {
        bool waited = false;
        if (slot.event != nullptr) {
          waited = driver_->EventSynchronize(slot.event) == CUDA_SUCCESS;
          GiveEvent(slot.event);  // destroyed below with the spares
          slot.event = nullptr;
        }
        // No event, or one that cannot be waited for (captured): a fresh one, unless the stream
        // captures. A capture that never ended leaves no point in the stream to wait for: its
        // graph may not be replayed after this anyway (the owner's contract).
        if (!waited) {
          auto event = RecordUnlessCapturing(slot.stream);
          if (event.ok() && *event != nullptr) {
            driver_->EventSynchronize(*event);
            GiveEvent(*event);
          }
        }
      }
      (void)UnmapNow(tier, s, slot.bytes);
      slot = Slot{};
    }
  }
  for (CUevent event : spare_events_) driver_->EventDestroy(event);
  UnmapDepotLocked();
  for (uint32_t tier = 0; tier < kernels::kLeaseTiers; ++tier) {
    const Range& r = ranges_[tier];
    if (r.base == nullptr) continue;
    if (tier == kernels::kLeaseHost) {
      munmap(r.base, r.bytes);
    } else {
      driver_->MemAddressFree(reinterpret_cast<CUdeviceptr>(r.base), r.bytes);
    }
  }
}

Status CudaLeaseMemory::CheckSlot(uint32_t tier, uint64_t slot) const {
  if (tier >= kernels::kLeaseTiers)
    return InvalidArgumentError("no lease tier " + std::to_string(tier));
  if (slot >= ranges_[tier].slots) {
    return InvalidArgumentError(std::string("the ") + TierName(tier) + " lease range has " +
                                std::to_string(ranges_[tier].slots) + " slots, not slot " +
                                std::to_string(slot));
  }
  return Status::Ok();
}

Status CudaLeaseMemory::Map(uint32_t tier, uint64_t slot, UniqueFd fd, uint64_t bytes,
                            int owner_device) {
  STASH_RETURN_IF_ERROR(CheckSlot(tier, slot));
  if (bytes == 0 || bytes > chunk_bytes_) {
    return InvalidArgumentError("a chunk of " + std::to_string(bytes) + " bytes does not fit a " +
                                std::to_string(chunk_bytes_) + "-byte slot");
  }
  const PrimaryContext::Scope scope(context_);
  STASH_RETURN_IF_ERROR(scope.status());
  {
    MutexLock lock(&mu_);
    Slot& s = slots_[tier][slot];
    if (s.state != SlotState::kFree) {
      static constexpr const char* kStates[] = {"free", "being mapped", "mapped",
                                                "still unmapping"};
      return FailedPreconditionError(std::string("slot ") + std::to_string(slot) + " of the " +
                                     TierName(tier) + " lease range is " +
                                     kStates[static_cast<int>(s.state)]);
    }
    s.state = SlotState::kMapping;
  }
  // Unlocked: importing and mapping (and a host chunk's populating and page-locking) take a
  // while, and the copier's Unmap and Reap of other slots need not wait for it.
  Status mapped = tier == kernels::kLeaseHost
                      ? MapHost(slot, fd.get(), bytes)
                      : MapDevice(tier, slot, fd.get(), bytes, owner_device);
  MutexLock lock(&mu_);
  Slot& s = slots_[tier][slot];
  s.state = mapped.ok() ? SlotState::kMapped : SlotState::kFree;
  s.bytes = mapped.ok() ? bytes : 0;
  return mapped;
}

Status CudaLeaseMemory::MapDevice(uint32_t tier, uint64_t slot, int fd, uint64_t bytes,
                                  int owner_device) {
  if (owner_device < 0 || (tier == kernels::kLeaseDevice && owner_device != device_)) {
    return InvalidArgumentError("a chunk of GPU " + std::to_string(owner_device) +
                                " cannot go into the " + TierName(tier) + " lease range of GPU " +
                                std::to_string(device_));
  }
  uint64_t granularity = granularity_;
  if (owner_device != device_) {
    CUdevice own = 0;
    CUdevice owner = 0;
    // Status-returning: STASH_CU_RETURN_IF_ERROR's const copy would not move.
    STASH_RETURN_IF_ERROR(driver_->Check(driver_->DeviceGet(&own, device_), "cuDeviceGet"));
    STASH_RETURN_IF_ERROR(driver_->Check(driver_->DeviceGet(&owner, owner_device), "cuDeviceGet"));
    int can = 0;
    STASH_RETURN_IF_ERROR(
        driver_->Check(driver_->DeviceCanAccessPeer(&can, own, owner), "cuDeviceCanAccessPeer"));
    if (can == 0) {
      return FailedPreconditionError(
          "GPU " + std::to_string(device_) + " cannot access memory of GPU " +
          std::to_string(owner_device) +
          " (cuDeviceCanAccessPeer says no: no NVLink or PCIe peer path between them, or peer "
          "access is disabled): its chunks cannot be mapped here; the peer tier is skipped");
    }
    const CUmemAllocationProp prop = ChunkAllocationProp(owner_device);
    size_t owner_granularity = 0;
    STASH_RETURN_IF_ERROR(
        driver_->Check(driver_->MemGetAllocationGranularity(&owner_granularity, &prop,
                                                            CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                       "cuMemGetAllocationGranularity"));
    granularity = std::max<uint64_t>(granularity, owner_granularity);
  }
  if (granularity == 0 || bytes % granularity != 0) {
    return InvalidArgumentError("a chunk of " + std::to_string(bytes) +
                                " bytes is not a whole number of the allocation granularity (" +
                                std::to_string(granularity) + " bytes)");
  }
  const std::string what = std::string("chunk of GPU ") + std::to_string(owner_device) +
                           " into slot " + std::to_string(slot) + " of the " + TierName(tier) +
                           " lease range";
  CUmemGenericAllocationHandle handle = 0;
  // For POSIX file descriptors the "OS handle" is the descriptor's value itself, passed as a
  // pointer. The import does not take the descriptor: the caller's UniqueFd closes it.
  // NOLINTNEXTLINE(performance-no-int-to-ptr): the driver's calling convention for fds
  void* const os_handle = reinterpret_cast<void*>(static_cast<uintptr_t>(fd));
  STASH_RETURN_IF_ERROR(
      Annotate(driver_->Check(driver_->MemImportFromShareableHandle(
                                  &handle, os_handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                              "cuMemImportFromShareableHandle"),
               "importing a " + what));
  const CUdeviceptr at = SlotAddress(tier, slot);
  Status step = driver_->Check(driver_->MemMap(at, bytes, 0, handle, 0), "cuMemMap");
  if (!step.ok()) {
    driver_->MemRelease(handle);
    return Annotate(step, "mapping a " + what);
  }
  const CUmemAccessDesc access = ReadWriteAccess(device_);
  step = driver_->Check(driver_->MemSetAccess(at, bytes, &access, 1), "cuMemSetAccess");
  if (!step.ok()) {
    driver_->MemUnmap(at, bytes);
    driver_->MemRelease(handle);
    return Annotate(step, "giving GPU " + std::to_string(device_) + " access to a " + what);
  }
  // The mapping keeps the memory alive from here on (also past the daemon's death); a handle
  // kept would only pin it past the unmap.
  step = driver_->Check(driver_->MemRelease(handle), "cuMemRelease");
  if (!step.ok()) {
    driver_->MemUnmap(at, bytes);
    return Annotate(step, "releasing the imported handle of a " + what);
  }
  return Status::Ok();
}

void CudaLeaseMemory::UnmapDepotLocked() {
  if (depot_.base == nullptr) return;
  const auto at = reinterpret_cast<CUdeviceptr>(depot_.base);
  driver_->MemUnmap(at, depot_.bytes);
  driver_->MemAddressFree(at, depot_.bytes);
  depot_ = Range{};
}

void CudaLeaseMemory::UnmapDepot() {
  const PrimaryContext::Scope scope(context_);
  MutexLock lock(&mu_);
  UnmapDepotLocked();
}

StatusOr<CUdeviceptr> CudaLeaseMemory::MapDepot(UniqueFd fd, uint64_t bytes) {
  const PrimaryContext::Scope scope(context_);
  STASH_RETURN_IF_ERROR(scope.status());
  MutexLock lock(&mu_);
  if (depot_.base != nullptr) {
    return FailedPreconditionError("this session mapped its group's depot already");
  }
  if (bytes == 0 || granularity_ == 0) {
    return InvalidArgumentError("a group depot of " + std::to_string(bytes) + " bytes");
  }
  const uint64_t size = (bytes + granularity_ - 1) / granularity_ * granularity_;
  CUmemGenericAllocationHandle handle = 0;
  // NOLINTNEXTLINE(performance-no-int-to-ptr): the driver's calling convention for fds
  void* const os_handle = reinterpret_cast<void*>(static_cast<uintptr_t>(fd.get()));
  STASH_RETURN_IF_ERROR(
      Annotate(driver_->Check(driver_->MemImportFromShareableHandle(
                                  &handle, os_handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                              "cuMemImportFromShareableHandle"),
               "importing the group's depot"));
  CUdeviceptr at = 0;
  Status step = driver_->Check(driver_->MemAddressReserve(&at, size, granularity_, 0, 0),
                               "cuMemAddressReserve");
  if (step.ok()) {
    step = driver_->Check(driver_->MemMap(at, size, 0, handle, 0), "cuMemMap");
    if (step.ok()) {
      const CUmemAccessDesc access = ReadWriteAccess(device_);
      step = driver_->Check(driver_->MemSetAccess(at, size, &access, 1), "cuMemSetAccess");
      if (!step.ok()) driver_->MemUnmap(at, size);
    }
    if (!step.ok()) driver_->MemAddressFree(at, size);
  }
  // The mapping keeps the memory alive (also past the daemon's death).
  driver_->MemRelease(handle);
  if (!step.ok())
    return Annotate(step, "mapping the group's depot on GPU " + std::to_string(device_));
  depot_.base = reinterpret_cast<uint8_t*>(at);  // NOLINT(performance-no-int-to-ptr)
  depot_.bytes = size;
  return at;
}

Status CudaLeaseMemory::MapHost(uint64_t slot, int fd, uint64_t bytes) {
  const auto page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  if (bytes % page != 0) {
    return InvalidArgumentError("a host chunk of " + std::to_string(bytes) +
                                " bytes is not whole pages");
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) return ErrnoStatus("fstat of a leased host chunk");
  if (static_cast<uint64_t>(st.st_size) < bytes) {
    return InvalidArgumentError("a host chunk is " + std::to_string(st.st_size) +
                                " bytes, less than the " + std::to_string(bytes) + " it says");
  }
  uint8_t* const at = ranges_[kernels::kLeaseHost].base + slot * chunk_bytes_;
  // Populated: registration pins every page anyway (a chunk of the cuda backend's host tier
  // comes populated by the daemon, which registered it for its own copies).
  void* p = mmap(at, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) {
    Status failed = ErrnoStatus("mapping a leased host chunk");
    // The kernel may have unmapped the reservation before the new mapping failed: a hole that an
    // unrelated mmap could take, which the next Map of this slot would then overwrite.
    ReserveHostRange(at, bytes);
    return failed;
  }
  madvise(p, bytes, MADV_DONTFORK);
  // Once per lease, never per operation: page-locks the chunk and maps it for every context
  // (PORTABLE) of every GPU (DEVICEMAP).
  Status step =
      driver_->Check(driver_->MemHostRegister(
                         p, bytes, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP),
                     "cuMemHostRegister");
  if (!step.ok()) {
    ReserveHostRange(at, bytes);
    return Annotate(step, "registering a leased host chunk of " + std::to_string(bytes) +
                              " bytes for GPU " + std::to_string(device_) +
                              " (page-locked memory is limited by ulimit -l)");
  }
  // Kernels address the host tier from one base: the GPU must reach the chunk at its host
  // address (unified addressing: CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM).
  CUdeviceptr device_address = 0;
  step = driver_->Check(driver_->MemHostGetDevicePointer(&device_address, p, 0),
                        "cuMemHostGetDevicePointer");
  if (step.ok() && device_address != reinterpret_cast<CUdeviceptr>(at)) {
    step = FailedPreconditionError("GPU " + std::to_string(device_) +
                                   " reaches registered host memory at another address than the "
                                   "host's (no unified addressing): the host tier cannot be used");
  }
  if (!step.ok()) {
    driver_->MemHostUnregister(p);
    ReserveHostRange(at, bytes);
    return step;
  }
  return Status::Ok();
}

Status CudaLeaseMemory::UnmapNow(uint32_t tier, uint64_t slot, uint64_t bytes) {
  if (tier == kernels::kLeaseHost) {
    uint8_t* const at = ranges_[kernels::kLeaseHost].base + slot * chunk_bytes_;
    STASH_RETURN_IF_ERROR(driver_->Check(driver_->MemHostUnregister(at), "cuMemHostUnregister"));
    ReserveHostRange(at, bytes);
    return Status::Ok();
  }
  return driver_->Check(driver_->MemUnmap(SlotAddress(tier, slot), bytes), "cuMemUnmap");
}

bool CudaLeaseMemory::Capturing(CUstream stream) const {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  if (driver_->StreamIsCapturing(stream, &status) != CUDA_SUCCESS) return true;
  return status != CU_STREAM_CAPTURE_STATUS_NONE;
}

StatusOr<CUevent> CudaLeaseMemory::TakeEvent() {
  if (!spare_events_.empty()) {
    CUevent event = spare_events_.back();
    spare_events_.pop_back();
    return event;
  }
  CUevent event = nullptr;
  STASH_CU_RETURN_IF_ERROR(driver_, EventCreate(&event, CU_EVENT_DISABLE_TIMING));
  return event;
}

void CudaLeaseMemory::GiveEvent(CUevent event) { spare_events_.push_back(event); }

StatusOr<CUevent> CudaLeaseMemory::RecordUnlessCapturing(CUstream stream) {
  if (Capturing(stream)) return CUevent{};
  STASH_ASSIGN_OR_RETURN(CUevent event, TakeEvent());
  const Status recorded = driver_->Check(driver_->EventRecord(event, stream), "cuEventRecord");
  if (!recorded.ok()) {
    GiveEvent(event);
    return recorded;
  }
  // Another thread (the trainer's) may have begun a capture on the stream between the check and
  // the record: then the record may be part of the capture, marking no point in the stream (and
  // an event last recorded in a capture answers every query with CUDA_ERROR_CAPTURED_EVENT).
  // Dropped: a spare is recorded again outside capture before any use.
  if (Capturing(stream)) {
    GiveEvent(event);
    return CUevent{};
  }
  return event;
}

Status CudaLeaseMemory::Unmap(uint32_t tier, uint64_t slot, CUstream stream) {
  STASH_RETURN_IF_ERROR(CheckSlot(tier, slot));
  const PrimaryContext::Scope scope(context_);
  STASH_RETURN_IF_ERROR(scope.status());
  MutexLock lock(&mu_);
  Slot& s = slots_[tier][slot];
  if (s.state != SlotState::kMapped) {
    return FailedPreconditionError(std::string("slot ") + std::to_string(slot) + " of the " +
                                   TierName(tier) + " lease range is not mapped");
  }
  // During capture an event record would become a node of the graph, not a point in the
  // stream; Reap records one once the capture ended.
  STASH_ASSIGN_OR_RETURN(CUevent event, RecordUnlessCapturing(stream));
  s.state = SlotState::kUnmapping;
  s.stream = stream;
  s.event = event;
  return Status::Ok();
}

CudaLeaseMemory::Reaped CudaLeaseMemory::Reap() {
  Reaped reaped;
  const PrimaryContext::Scope scope(context_);
  if (!scope.status().ok()) {
    reaped.status = scope.status();
    return reaped;
  }
  MutexLock lock(&mu_);
  auto fail = [&reaped](const Status& status) {
    if (reaped.status.ok()) reaped.status = status;
  };
  for (uint32_t tier = 0; tier < kernels::kLeaseTiers; ++tier) {
    for (uint64_t slot = 0; slot < slots_[tier].size(); ++slot) {
      Slot& s = slots_[tier][slot];
      if (s.state != SlotState::kUnmapping || Capturing(s.stream)) continue;
      if (s.event == nullptr) {
        // Unmapped during a capture that has ended (or its event was dropped): the stream's work
        // from now on is ordered after every use of the chunk that was enqueued.
        auto event = RecordUnlessCapturing(s.stream);
        if (!event.ok()) {
          fail(Annotate(event.status(), std::string("recording the unmap of slot ") +
                                            std::to_string(slot) + " of the " + TierName(tier) +
                                            " lease range"));
          continue;
        }
        if (*event == nullptr) continue;  // a capture began: after it ends
        s.event = *event;
      }
      const CUresult done = driver_->EventQuery(s.event);
      if (done == CUDA_ERROR_NOT_READY) continue;
      if (done != CUDA_SUCCESS) {
        // This event can never say that the work completed: recorded in a capture that began and
        // ended around Unmap's record (CUDA_ERROR_CAPTURED_EVENT until it is recorded again), or
        // broken. Kept, it would fail every Reap and the slot would stay unmapping forever: it is
        // dropped, and the next Reap records a fresh one while the stream is not capturing
        // (behind the old record in the stream, so behind every use of the chunk too).
        fail(Annotate(driver_->Check(done, "cuEventQuery"),
                      std::string("the unmap of slot ") + std::to_string(slot) + " of the " +
                          TierName(tier) + " lease range (a fresh event is recorded next time)"));
        if (done == CUDA_ERROR_CAPTURED_EVENT) {
          GiveEvent(s.event);  // sound: recorded again outside capture before any use
        } else {
          driver_->EventDestroy(s.event);
        }
        s.event = nullptr;
        continue;
      }
      const Status unmapped = UnmapNow(tier, slot, s.bytes);
      if (!unmapped.ok()) {
        fail(Annotate(unmapped, std::string("unmapping slot ") + std::to_string(slot) + " of the " +
                                    TierName(tier) + " lease range"));
        continue;
      }
      GiveEvent(s.event);
      s = Slot{};
      reaped.freed.push_back(SlotRef{tier, slot});
    }
  }
  return reaped;
}

CudaLeaseMemory::SlotState CudaLeaseMemory::slot_state(uint32_t tier, uint64_t slot) const {
  MutexLock lock(&mu_);
  return slots_[tier][slot].state;
}

uint64_t CudaLeaseMemory::pending_unmaps() const {
  MutexLock lock(&mu_);
  uint64_t n = 0;
  for (const auto& tier : slots_) {
    n += std::count_if(tier.begin(), tier.end(),
                       [](const Slot& s) { return s.state == SlotState::kUnmapping; });
  }
  return n;
}

}  // namespace stash::client
