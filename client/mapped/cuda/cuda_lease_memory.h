// The memory of a mapped session's leased chunks as the rank's GPU sees it (docs/design.md,
// "Mapped mode"): the cuda backend's twin of LeaseTable's address ranges. LeaseTable keeps the
// rings and says which slot holds which chunk; this class only makes a slot's memory exist at a
// fixed address and go away again, safely for work queued on the trainer's streams.
//
// Each lease tier (kernels::LeaseTier: own device, peer devices, host) is one address range
// reserved once, sized for the session's quota in whole chunks, so a tier's base and every
// slot's address never move: CUDA graphs capture them.
//  - Device and peer tiers: a range of device addresses (cuMemAddressReserve). A chunk arrives
//    as the POSIX file descriptor of the daemon's VMM allocation; Map imports it
//    (cuMemImportFromShareableHandle), maps it at its slot (cuMemMap), gives this rank's GPU
//    read/write access (cuMemSetAccess) and releases the imported handle at once: the mapping
//    alone keeps the memory alive, even after the daemon died.
//  - Host tier: a range of CPU addresses (mmap PROT_NONE, MADV_DONTFORK, like LeaseTable). A
//    chunk is the daemon's sealed memfd, mapped MAP_SHARED at its slot and page-locked for the
//    GPU once, at lease time (cuMemHostRegister DEVICEMAP | PORTABLE), never per operation. A
//    memfd cannot be imported as VMM memory (cuMemImportFromShareableHandle takes only handles
//    cuMemExportToShareableHandle made), so registration it is; with unified addressing the
//    device reaches it at its host address (checked with cuMemHostGetDevicePointer), so the
//    tier is one range for kernels too.
//
// A slot is in one of four states:
//   free       reserved, nothing mapped (device tiers: no mapping; host: PROT_NONE).
//   mapping    Map is under way (on the lease thread); free again if it fails.
//   mapped     a chunk is mapped and accessible to this rank's GPU.
//   unmapping  Unmap was called; the chunk stays mapped until the GPU finished the work that
//              used it (an event recorded on the caller's stream completed) and no capture is
//              under way on that stream, then Reap (or the destructor) unmaps it and the slot
//              is free again. Map refuses the slot until then.
//
// The unmap contract: the caller passes Unmap the stream (or one ordered after every stream)
// on which it enqueued all work that uses the chunk, and enqueues no more such work after.
// Unmap never blocks and never unmaps on the spot: it records an event on that stream (unless
// the stream is capturing: an event recorded during capture becomes a graph node, not a point
// in the stream; then it records nothing and Reap records one once the capture ended), and
// Reap, called by the owner at step boundaries outside capture, unmaps the slots whose event
// completed. The stream must live until Reap (or the destructor) freed the slot: Reap may record
// on it again (after a capture, or when an event can no longer be queried). A graph captured
// with a chunk's address must not be replayed after that chunk's Unmap: lease changes happen
// between replays, which the owner keeps in order.
//
// Thread-safe: Map (the lease thread) may run while Unmap and Reap run on the copier; the lock
// is not held while a chunk is imported, mapped or page-locked.
#ifndef STASH_CLIENT_CUDA_LEASE_MEMORY_H_
#define STASH_CLIENT_CUDA_LEASE_MEMORY_H_

#include <absl/base/thread_annotations.h>
#include <cuda.h>

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/cuda_driver.h"
#include "common/cuda_vmm.h"
#include "common/mutex.h"
#include "common/unique_fd.h"
#include "stash/kernels/lease_control.h"
#include "stash/status.h"

namespace stash::client {

class CudaLeaseMemory {
 public:
  // A slot of a tier.
  struct SlotRef {
    uint32_t tier = 0;
    uint64_t slot = 0;
    bool operator==(const SlotRef& other) const { return tier == other.tier && slot == other.slot; }
  };

  // For ordinal `device` of this process (the rank's GPU; its primary context, the one PyTorch
  // uses, is retained for the object's life). `chunk_bytes` is the daemon's chunk size
  // (Welcome.chunk_bytes): a whole multiple of the GPU's allocation granularity, else
  // INVALID_ARGUMENT. Tier t gets room for `tier_bytes[t]` rounded up to whole chunks (at least
  // one). FAILED_PRECONDITION naming the GPU when it supports no VMM or POSIX-fd handles (the
  // caller uses daemon-copy mode). `driver` is borrowed and must outlive the object.
  static StatusOr<std::unique_ptr<CudaLeaseMemory>> Create(
      const CudaDriver* driver, int device, uint64_t chunk_bytes,
      const std::array<uint64_t, kernels::kLeaseTiers>& tier_bytes);
  CudaLeaseMemory(const CudaLeaseMemory&) = delete;
  CudaLeaseMemory& operator=(const CudaLeaseMemory&) = delete;
  // Waits for every pending unmap's event (it blocks until the GPU finished that work), unmaps
  // every slot and frees the ranges. Slots still mapped (never passed to Unmap) are unmapped
  // at once: the owner makes sure no queued work uses them (it synchronized its streams).
  ~CudaLeaseMemory();

  // Maps chunk memory into free slot `slot` of `tier`; `bytes` (> 0, at most chunk_bytes; the
  // size of the daemon's chunk) of it are usable after. Device and peer tiers: `fd` is a VMM
  // allocation's POSIX fd and `owner_device` the ordinal, in this process, of the GPU it lives
  // on (GpuOrdinalOfUuid of the chunk's UUID); the own-device tier takes only chunks of this
  // rank's GPU. A chunk of another GPU maps only where cuDeviceCanAccessPeer says this GPU can
  // reach it, else FAILED_PRECONDITION saying so (the caller skips the peer tier with one log
  // line). Host tier: `fd` is a memfd of at least `bytes`; `owner_device` is ignored.
  // INVALID_ARGUMENT for a bad tier, slot, size or owner; FAILED_PRECONDITION when the slot is
  // not free; a driver error otherwise (RESOURCE_EXHAUSTED when out of memory). `fd` is closed
  // in every case; on an error the slot stays free and nothing of the chunk is held.
  Status Map(uint32_t tier, uint64_t slot, UniqueFd fd, uint64_t bytes, int owner_device);

  // Starts unmapping mapped slot `slot` of `tier` (see the unmap contract above): every work
  // that uses it was enqueued on `stream` (nullptr: the legacy default stream) before this
  // call, and `stream` lives until the slot is free again. Returns at once; Reap unmaps it once
  // that work completed. INVALID_ARGUMENT for a bad
  // tier or slot, FAILED_PRECONDITION when the slot is not mapped; an error recording the event
  // leaves the slot mapped.
  Status Unmap(uint32_t tier, uint64_t slot, CUstream stream);

  // Unmaps every unmapping slot whose work completed and whose stream is not capturing. Never
  // blocks on the GPU. Call it at step boundaries, outside capture. `freed` lists the slots now
  // free (the owner tells the daemon); a slot whose unmap failed stays unmapping, retried at the
  // next Reap, and `status` is the first such error. An event whose query fails (one a capture
  // took: CUDA_ERROR_CAPTURED_EVENT) is reported once and replaced by a fresh record at the next
  // Reap, so no slot stays unmapping for it.
  struct Reaped {
    std::vector<SlotRef> freed;
    Status status;
  };
  Reaped Reap();

  // Groups: maps the group's depot on this GPU (`fd`, a VMM allocation of this GPU, `bytes`
  // long, rounded up to the allocation granularity) at an address of its own, read-write for
  // this GPU, until the object is destroyed (after every kernel that claims in it: the owner
  // synchronized its streams). One at a time: FAILED_PRECONDITION until UnmapDepot. Returns its
  // device address.
  StatusOr<CUdeviceptr> MapDepot(UniqueFd fd, uint64_t bytes);
  // Unmaps it (the session left its group: no queued work names it any more); MapDepot may map
  // another after.
  void UnmapDepot();

  enum class SlotState { kFree, kMapping, kMapped, kUnmapping };
  SlotState slot_state(uint32_t tier, uint64_t slot) const;
  // Slots waiting for their work (or a capture) to end.
  uint64_t pending_unmaps() const;

  // The tier's first address (a device address: host tier memory is reached at its host
  // address); slot s starts at base(tier) + s * chunk_bytes(). Never moves.
  uint8_t* base(uint32_t tier) const { return ranges_[tier].base; }
  uint64_t slots(uint32_t tier) const { return ranges_[tier].slots; }
  uint64_t chunk_bytes() const { return chunk_bytes_; }
  int device() const { return device_; }

 private:
  struct Slot {
    SlotState state = SlotState::kFree;
    uint64_t bytes = 0;         // mapped bytes (mapped or unmapping)
    CUstream stream = nullptr;  // unmapping: the stream its work was on
    CUevent event = nullptr;    // unmapping: recorded after that work; null until Reap records
                                // one (the stream captured, or a useless event was dropped)
  };
  struct Range {
    uint8_t* base = nullptr;  // device tiers: a device address
    uint64_t bytes = 0;
    uint64_t slots = 0;
  };

  CudaLeaseMemory(const CudaDriver* driver, int device, PrimaryContext context,
                  uint64_t chunk_bytes);
  Status MapDevice(uint32_t tier, uint64_t slot, int fd, uint64_t bytes, int owner_device);
  Status MapHost(uint64_t slot, int fd, uint64_t bytes);
  // Takes slot's memory away (its state unchanged). Context current.
  Status UnmapNow(uint32_t tier, uint64_t slot, uint64_t bytes);
  // Whether `stream` is being captured now (an error counts as capturing: try later).
  bool Capturing(CUstream stream) const;
  CUdeviceptr SlotAddress(uint32_t tier, uint64_t slot) const {
    return reinterpret_cast<CUdeviceptr>(ranges_[tier].base + slot * chunk_bytes_);
  }
  Status CheckSlot(uint32_t tier, uint64_t slot) const;
  void UnmapDepotLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);  // context current
  StatusOr<CUevent> TakeEvent() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void GiveEvent(CUevent event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // An event recorded on `stream` behind all its work so far; null when the stream captures,
  // before the record or right after it (a capture another thread began in between may have
  // taken the record). Context current.
  StatusOr<CUevent> RecordUnlessCapturing(CUstream stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Never change after Create returned.
  const CudaDriver* const driver_;  // not owned
  const int device_;
  const PrimaryContext context_;
  const uint64_t chunk_bytes_;
  uint64_t granularity_ = 0;  // this GPU's minimum granularity for chunk allocations
  std::array<Range, kernels::kLeaseTiers> ranges_{};  // reserved in Create, freed at the end
  Range depot_ ABSL_GUARDED_BY(mu_);                  // MapDepot's: mapped until the end

  mutable Mutex mu_;
  std::array<std::vector<Slot>, kernels::kLeaseTiers> slots_ ABSL_GUARDED_BY(mu_);
  std::vector<CUevent> spare_events_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stash::client

#endif  // STASH_CLIENT_CUDA_LEASE_MEMORY_H_
