// The memory of one GPU's pool cut into chunks for mapped mode (docs/design.md, "Mapped mode"):
// the cuda backend's twin of ChunkMemory (daemon/tiers/chunk_memory.h). Each chunk is one VMM
// allocation (cuMemCreate) exportable as a POSIX file descriptor, mapped once into one address
// range reserved for the whole pool (cuMemAddressReserve), so the pool's base address and its
// page ids never move while chunks are leased, handed back and renewed, and the daemon-copy
// ring's addresses stay valid. Only the CUDA driver API is used, through the injected
// CudaDriver table.
//
// Chunk states (one of two, per chunk):
//   absent   no allocation of ours: the chunk's part of the range is reserved and mapped to
//            nothing, so no device can touch it. Every chunk starts absent (chunks are created
//            lazily, so a restarted daemon starts while ranks still map the old daemon's chunks,
//            whose memory counts against the GPU until they unmap it), and a chunk is absent
//            again when Renew released its memory but could not get new memory (the GPU is
//            full: out of memory, try later).
//   present  one allocation of exactly ChunkBytes(chunk), mapped at the chunk's address with
//            read/write access for this GPU, zero-filled when it was created.
// Ensure: absent -> present (RESOURCE_EXHAUSTED when the GPU is full: stays absent).
// Renew:  present -> (unmap, release) -> absent -> present, or stays absent on
//         RESOURCE_EXHAUSTED. A later Renew or Ensure retries; a chunk is never retired for it.
// ExportFd needs a present chunk. Whoever imported an older allocation of the chunk keeps it
// alive (and counted against the GPU) until it unmaps it: that memory is theirs, never the
// chunk's again.
//
// Thread-compatible per chunk: calls for different chunks may run at once on different threads;
// calls for one chunk must not overlap (the caller guarantees it, as for ChunkMemory: a chunk is
// renewed only while it is out of the daemon-copy ring and leased to nobody).
#ifndef STASH_DAEMON_VMM_CHUNK_MEMORY_H_
#define STASH_DAEMON_VMM_CHUNK_MEMORY_H_

#include <cuda.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "common/cuda_driver.h"
#include "common/cuda_vmm.h"
#include "common/unique_fd.h"
#include "daemon/cuda/lendable_memory.h"
#include "stash/status.h"

namespace stash::daemon {

class VmmChunkMemory final : public LendableMemory {
 public:
  // Checks that GPU `device` (an ordinal of this process) supports VMM and POSIX-fd handles
  // (FAILED_PRECONDITION naming the GPU, what is missing and what to do otherwise), rounds
  // `chunk_bytes` (> 0, a whole number of `page_bytes`, a power of two: the pool's --page-bytes)
  // up, and `bytes` (> 0) down, to whole units of max(the GPU's recommended allocation
  // granularity, page_bytes), so every chunk, the last one too, is whole granularity units and
  // whole pages (INVALID_ARGUMENT for a bad page size, a chunk that is not whole pages, or a
  // pool that rounds to nothing), and reserves the pool's address range. Creates no chunk (all
  // absent). `driver` is borrowed and must outlive the object. `label` names the pool in
  // messages.
  static StatusOr<std::unique_ptr<VmmChunkMemory>> Create(const CudaDriver* driver, int device,
                                                          const std::string& label, uint64_t bytes,
                                                          uint64_t chunk_bytes,
                                                          uint64_t page_bytes);
  VmmChunkMemory(const VmmChunkMemory&) = delete;
  VmmChunkMemory& operator=(const VmmChunkMemory&) = delete;
  // Unmaps and releases every present chunk and frees the range. Holders' mappings stay valid.
  ~VmmChunkMemory() override;

  // The pool's device address; never moves.
  uint8_t* base() const { return base_; }
  // The pool's size: the bytes asked for, rounded down to whole units of max(granularity,
  // page size).
  uint64_t bytes() const { return bytes_; }
  // The chunk size: the size asked for, rounded up to whole units of max(granularity, page
  // size).
  uint64_t chunk_bytes() const { return chunk_bytes_; }
  uint64_t chunks() const { return chunks_; }
  // The size of chunk `chunk` (< chunks()): chunk_bytes(), or less (still whole granularity
  // units and whole pages) for the last one.
  uint64_t ChunkBytes(uint64_t chunk) const override;
  // cuMemGetAllocationGranularity(RECOMMENDED) for this pool's allocations.
  uint64_t granularity() const { return granularity_; }
  int device() const override { return device_; }
  // The GPU's UUID as nvidia-smi spells it: "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx". A leased
  // chunk names its GPU by this (a pool index means nothing under a rank's
  // CUDA_VISIBLE_DEVICES).
  const std::string& uuid() const { return uuid_; }
  // Whether chunk `chunk` is present (may change right after on the thread that owns it).
  bool present(uint64_t chunk) const override {
    return present_[chunk].load(std::memory_order_acquire);
  }
  // Bytes of present chunks: the GPU memory this pool holds now (holders' old allocations not
  // counted).
  uint64_t bytes_present() const { return bytes_present_.load(std::memory_order_relaxed); }

  // Makes chunk `chunk` present: a no-op when it is; otherwise creates its allocation, maps it,
  // sets access and zero-fills it. RESOURCE_EXHAUSTED when the GPU has no room now (the chunk
  // stays absent: try later); another driver error is FAILED_PRECONDITION. On every error the
  // chunk is absent and nothing of it is held.
  Status Ensure(uint64_t chunk);
  // Gives chunk `chunk` fresh zero-filled memory at the same address. Unmaps and releases the
  // old allocation first, so a renew never holds two allocations of one chunk at once (a holder
  // that still maps the old one keeps that alive: it is the holder's), then does what Ensure
  // does. RESOURCE_EXHAUSTED leaves the chunk absent until a later Renew or Ensure succeeds.
  Status Renew(uint64_t chunk) override;
  // A new POSIX file descriptor for chunk `chunk`'s allocation (cuMemExportToShareableHandle),
  // owned by the caller, for leasing. FAILED_PRECONDITION when the chunk is absent (Ensure
  // first). The descriptor keeps this allocation alive after a Renew, as a mapping does.
  StatusOr<UniqueFd> ExportFd(uint64_t chunk) const override;
  // A holder that returns a chunk may still map it (its VRAM stays alive): charged until exit.
  bool ChargeReturnsUntilExit() const override { return true; }

 private:
  VmmChunkMemory(const CudaDriver* driver, int device, PrimaryContext context, std::string label,
                 std::string uuid, uint64_t granularity, uint8_t* base, uint64_t bytes,
                 uint64_t chunk_bytes);
  // Unmaps and releases a present chunk (it is absent after). Context current.
  Status Drop(uint64_t chunk);
  std::string ChunkName(uint64_t chunk) const;

  // Never change after construction.
  const CudaDriver* const driver_;  // not owned
  const int device_;
  const PrimaryContext context_;
  const std::string label_;
  const std::string uuid_;
  const uint64_t granularity_;
  uint8_t* const base_;
  const uint64_t bytes_;
  const uint64_t chunk_bytes_;
  const uint64_t chunks_;
  CUstream stream_ = nullptr;  // zero-fills run here; set once in Create

  // Per chunk; entry `c` is touched only by calls for chunk `c` (present_ also read anywhere).
  std::unique_ptr<CUmemGenericAllocationHandle[]> handles_;
  std::unique_ptr<std::atomic<bool>[]> present_;
  std::atomic<uint64_t> bytes_present_{0};
};

}  // namespace stash::daemon

#endif  // STASH_DAEMON_VMM_CHUNK_MEMORY_H_
