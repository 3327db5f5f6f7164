// The cuda backend's ChunkLender (daemon/tiers/chunk_lender.h): the chunks of one tier of one GPU
// (its pool, or its share of the host tier), lent to mapped sessions out of the same memory
// daemon-copy's ring pages. The twin of the host backend's lender
// (daemon/tiers/host_chunk_lender.h):
//   memory  LendableMemory (daemon/cuda/lendable_memory.h): the pool's VMM allocations
//           (daemon/cuda/vmm_chunk_memory.h), or the host share's memfds page-locked for the GPU
//           (daemon/cuda/pinned_chunk_memory.h); exported as POSIX fds for a lease, renewed when
//           they come back and before they are lent.
//   ring    in device memory, written only by kernels in the copy stream's order (daemon-copy's
//           plan and publish kernels, and these): Take snapshots the ring (one copy on the
//           stream, waited for), chooses among the chunks wholly free in the snapshot, and launches
//           one kernel that takes out those still wholly free when it runs (daemon_paging.h's
//           TakeChunksLaunch), answering in pinned memory; Return launches one that appends a
//           chunk's ids at the tail. A chunk a stash took a page of between the snapshot and the
//           kernel stays in the ring; none is ever taken that was not chosen.
// The daemon cannot know which pages daemon-copy stashes wrote (plans are made on the device),
// so every chunk taken is renewed before it is lent (Taken.written is always true).
//
// Pool chunks the GPU had no memory for at start (created lazily: a restarted daemon's GPU may
// still hold the old daemon's chunks for ranks that map them) are out of the ring from the start
// (Waiting) until Leases renews them.
//
// Calls come from Leases on several threads (daemon/tiers/chunk_lender.h): Take and Return one at a
// time under the lender's lock, Renew and Export for different chunks at once; the pool worker
// enqueues stashes on the same stream meanwhile. The ring is changed only in stream order, and
// consistent only between whole operations (a stash is three kernels, a reload two): PagingKernels
// holds one lock over each call's launches, so a take or return never lands inside a stash or
// reload. Built only with STASH_ENABLE_CUDA.
#ifndef STASH_DAEMON_CUDA_CHUNK_LENDER_H_
#define STASH_DAEMON_CUDA_CHUNK_LENDER_H_

#include <absl/base/thread_annotations.h>
#include <cuda.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/cuda_driver.h"
#include "common/cuda_vmm.h"
#include "common/mutex.h"
#include "daemon/cuda/cuda_buffer.h"
#include "daemon/cuda/lendable_memory.h"
#include "daemon/cuda/paging_kernels.h"
#include "daemon/tiers/chunk_lender.h"
#include "daemon/tiers/tier.h"
#include "stash/kernels/paging.h"

namespace stash::daemon {

class CudaChunkLender final : public ChunkLender {
 public:
  // What the lender works with, all borrowed from the executor, which outlives it: the GPU's
  // context, its copy stream and loaded kernels, the tier's ring in device memory, its memory
  // and its accounting tier (whose pages are the ring's page ids and whose chunk_pages() cut
  // them into chunks).
  struct Pool {
    const CudaDriver* driver = nullptr;
    const PrimaryContext* context = nullptr;
    CUstream stream = nullptr;
    const PagingKernels* kernels = nullptr;
    kernels::PageRing* d_ring = nullptr;  // its ids follow it in the same allocation
    LendableMemory* memory = nullptr;     // its chunks are the tier's chunks
    Tier* tier = nullptr;
    std::string gpu_uuid;  // 16 raw bytes; empty for host memory
  };
  // Allocates the answer and scratch buffers (before the pool's chunks, so a full GPU leaves
  // chunks waiting, never the lender without its buffers); the context need not be current.
  static StatusOr<std::unique_ptr<CudaChunkLender>> Create(const Pool& pool);
  CudaChunkLender(const CudaChunkLender&) = delete;
  CudaChunkLender& operator=(const CudaChunkLender&) = delete;
  ~CudaChunkLender() override;

  StatusOr<std::vector<Taken>> Take(const Want& want) override;
  void Return(uint64_t chunk) override;
  Status Renew(uint64_t chunk) override;
  StatusOr<UniqueFd> Export(uint64_t chunk) override;
  uint64_t ChunkBytes(uint64_t chunk) const override;
  std::string gpu_uuid() const override { return pool_.gpu_uuid; }
  bool ChargeReturnsUntilExit() const override { return pool_.memory->ChargeReturnsUntilExit(); }
  std::vector<uint64_t> Waiting() override;
  // Once, before Leases starts: the chunks with no memory, out of the ring (counted as used).
  void SetWaiting(std::vector<uint64_t> waiting);

 private:
  explicit CudaChunkLender(const Pool& pool);
  // Waits until the stream reached the point just enqueued (an event recorded and waited for).
  // Context current.
  Status Reach();
  kernels::ChunkRingLaunch Launch() const;

  // Never change after Create.
  const Pool pool_;
  const uint64_t pages_;
  const uint64_t chunk_pages_;
  const uint64_t chunks_;
  CudaBuffer snapshot_;  // pinned: the ring's header, then its ids
  CudaBuffer flags_;     // pinned: per chunk, TakeChunksLaunch's asks and answers
  CudaBuffer counts_;    // device: TakeChunksLaunch's scratch
  CUevent reached_ = nullptr;

  Mutex mu_;
  std::vector<bool> in_ring_ ABSL_GUARDED_BY(mu_);  // per chunk: not taken, not waiting
  std::vector<uint64_t> waiting_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stash::daemon

#endif  // STASH_DAEMON_CUDA_CHUNK_LENDER_H_
