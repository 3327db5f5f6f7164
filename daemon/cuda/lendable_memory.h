// The memory behind the cuda backend's lender (daemon/cuda/cuda_chunk_lender.h): what it needs of a
// tier's chunks to lend them. Two kinds, each a file of its own:
//   VmmChunkMemory     (daemon/cuda/vmm_chunk_memory.h): a GPU pool, one VMM allocation per chunk.
//   PinnedChunkMemory  (daemon/cuda/pinned_chunk_memory.h): a GPU's share of the host tier, memfd
//                      chunks page-locked and mapped for the GPU.
// Calls for one chunk never overlap (the lender runs them under its lock or for a chunk out of
// every ring); present() may be read from any thread.
// Built only with STASH_ENABLE_CUDA.
#ifndef STASH_DAEMON_LENDABLE_MEMORY_H_
#define STASH_DAEMON_LENDABLE_MEMORY_H_

#include <cstdint>

#include "common/unique_fd.h"
#include "stash/status.h"

namespace stash::daemon {

class LendableMemory {
 public:
  virtual ~LendableMemory() = default;
  // The ordinal of the GPU the memory serves (messages, and the device-lost exit).
  virtual int device() const = 0;
  // Whether chunk `chunk` has memory the GPU can reach now.
  virtual bool present(uint64_t chunk) const = 0;
  // Fresh zero-filled memory at the chunk's address; RESOURCE_EXHAUSTED leaves it absent (try
  // again later), the lender keeps it out of the ring until then.
  virtual Status Renew(uint64_t chunk) = 0;
  // A new descriptor of the chunk's memory for a lease, owned by the caller.
  virtual StatusOr<UniqueFd> ExportFd(uint64_t chunk) const = 0;
  virtual uint64_t ChunkBytes(uint64_t chunk) const = 0;
  // ChunkLender::ChargeReturnsUntilExit of a lender over this memory.
  virtual bool ChargeReturnsUntilExit() const = 0;
};

}  // namespace stash::daemon

#endif  // STASH_DAEMON_LENDABLE_MEMORY_H_
