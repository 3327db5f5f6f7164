// One GPU's share of the cuda backend's host tier, cut into chunks it can lend to mapped
// sessions: the host memfd chunks of ChunkMemory (daemon/tiers/chunk_memory.h), each page-locked
// and mapped for the GPU on its own (cuMemHostRegister DEVICEMAP | PORTABLE), so the copy kernels
// reach it at its host address and a renewed chunk is registered anew without touching the
// others. The twin of VmmChunkMemory (the GPU pool's chunks) for host memory.
//
// Chunk states: present (mapped, registered: the GPU may read and write it) or absent (its
// registration is gone: only after a Renew whose registration failed; the lender keeps it out of
// the ring until a later Renew succeeds). A registration pins the pages that back the mapping
// at that moment, so a renew unregisters first, maps the fresh memfd, then registers that: the
// GPU never writes to a chunk's old pages after the renew.
//
// A rank registers a leased chunk once, at lease time, in its own process
// (client/mapped/cuda/cuda_lease_memory.h); the daemon's registration serves daemon-copy's stashes
// only.
//
// Thread-compatible per chunk, as ChunkMemory: calls for one chunk must not overlap (a chunk is
// renewed only while it is out of the daemon-copy ring and leased to nobody).
// Built only with STASH_ENABLE_CUDA.
#ifndef STASH_DAEMON_PINNED_CHUNK_MEMORY_H_
#define STASH_DAEMON_PINNED_CHUNK_MEMORY_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "common/cuda_driver.h"
#include "common/cuda_vmm.h"
#include "common/unique_fd.h"
#include "daemon/cuda/lendable_memory.h"
#include "daemon/tiers/chunk_memory.h"
#include "stash/status.h"

namespace stash::daemon {

class PinnedChunkMemory final : public LendableMemory {
 public:
  // Maps `bytes` of memfd chunks of `chunk_bytes` (ChunkMemory::Create's rules and `options`)
  // and registers each for GPU `device` (an ordinal of this process). FAILED_PRECONDITION when
  // the GPU reaches registered host memory at another address than the CPU (the paging kernels
  // address a tier by one base; every GPU with unified addressing on 64-bit Linux maps it at
  // the same address), RESOURCE_EXHAUSTED when the driver cannot page-lock that much.
  // `driver` is borrowed and must outlive the object.
  static StatusOr<std::unique_ptr<PinnedChunkMemory>> Create(const CudaDriver* driver, int device,
                                                             const std::string& label,
                                                             uint64_t bytes, uint64_t chunk_bytes,
                                                             const ChunkMemoryOptions& options);
  PinnedChunkMemory(const PinnedChunkMemory&) = delete;
  PinnedChunkMemory& operator=(const PinnedChunkMemory&) = delete;
  // Unregisters every present chunk, then unmaps them (ChunkMemory). Holders' mappings stay.
  ~PinnedChunkMemory() override;

  // The share's address, on the CPU and on the GPU alike; never moves.
  uint8_t* base() const { return memory_->base(); }
  uint64_t bytes() const { return memory_->bytes(); }
  uint64_t chunk_bytes() const { return memory_->chunk_bytes(); }
  uint64_t chunks() const { return memory_->chunks(); }
  PageKind page_kind() const { return memory_->page_kind(); }
  // The memfd chunks themselves (page kind, warm bytes: every present chunk is populated).
  const ChunkMemory* memory() const { return memory_.get(); }

  int device() const override { return device_; }
  bool present(uint64_t chunk) const override {
    return registered_[chunk].load(std::memory_order_acquire);
  }
  // Unregisters the chunk, gives it a fresh zero-filled memfd at the same address and registers
  // that. RESOURCE_EXHAUSTED when the driver cannot page-lock it now (the chunk is absent: a
  // later Renew tries again); any other error leaves it absent too.
  Status Renew(uint64_t chunk) override;
  // A duplicate of the chunk's memfd, owned by the caller.
  StatusOr<UniqueFd> ExportFd(uint64_t chunk) const override;
  uint64_t ChunkBytes(uint64_t chunk) const override { return memory_->ChunkBytes(chunk); }
  // A registered chunk is populated by the daemon (the driver locks every page), and a holder
  // that keeps the descriptor of a returned one keeps those pages alive: renewing it at once
  // would let a rank that leases and returns in a loop grow the daemon's memory without bound.
  // So a returned chunk stays charged to its holder until its process exits, as a GPU chunk.
  bool ChargeReturnsUntilExit() const override { return true; }

 private:
  PinnedChunkMemory(const CudaDriver* driver, int device, PrimaryContext context,
                    std::unique_ptr<ChunkMemory> memory);
  // Populates an absent chunk, registers it and checks the GPU reaches it at its host address.
  // Context current.
  Status Register(uint64_t chunk);
  // Unregisters a present chunk: absent after, or still present when the driver refused (a
  // later Renew tries again; the chunk's memory is never replaced under a registration).
  // Context current.
  Status Unregister(uint64_t chunk);
  uint8_t* ChunkBase(uint64_t chunk) const { return base() + chunk * chunk_bytes(); }
  std::string ChunkName(uint64_t chunk) const;

  const CudaDriver* const driver_;  // not owned
  const int device_;
  const PrimaryContext context_;
  const std::unique_ptr<ChunkMemory> memory_;
  std::unique_ptr<std::atomic<bool>[]> registered_;  // per chunk
};

}  // namespace stash::daemon

#endif  // STASH_DAEMON_PINNED_CHUNK_MEMORY_H_
