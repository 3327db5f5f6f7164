// The cuda backend's GroupBlock (daemon/leases/group_block.h; the host twin is
// daemon/leases/host_group_block.h): a group's depot in GPU memory, where its members' plan kernels
// claim and release pages (stash/kernels/group_depot.h). Built only with STASH_ENABLE_CUDA.
//
// One depot per GPU, depot i on pool i's GPU (the executors in device order). Each is a whole
// depot of the group's layout (the header HeaderFor writes, every chunk's hint and state, a tag for
// every page of the address space): one VMM allocation (cuMemCreate with POSIX-fd handles, the
// layout's size rounded up to the allocation granularity) in that GPU's memory, mapped read-write
// into stashd's address space, zero-filled, its header written once before any member maps it.
// Export(pool) hands a member a new descriptor of its own GPU's depot (it maps and claims there
// only), gpu_uuid(pool) that GPU's UUID.
//
// Where a chunk's tags live: a pool's chunk in its own pool's depot; a host tier's chunk in the
// depot of the GPU whose members it joined for (Join's `pool`, remembered per chunk until Out, so
// Take, Out and ForEachOwned go to the same depot). A page no depot joined stays kTagDaemon in
// every depot: a member of another GPU never sees it free.
//
// How the daemon changes a depot: members' kernels may swap tags on the GPU at any moment, and
// stashd's host takes no part in device-memory atomics, so every change is a kernel
// (stash/kernels/group_kernels.h) launched through the GPU's PagingKernels (its lock keeps a
// stash's or reload's launches contiguous) on the GPU's copy stream, and waited for (an event
// recorded after it): Join (tags free, then the hint, then the state), Take (compare-and-swap of
// every page free -> daemon, all or none; the answer in pinned memory), Out, Reclaim (a thread
// per page; the live tags sorted, in pinned memory) and ResetHighWater. Reads (the counters, a
// chunk's tags) are copies on the same stream into pinned memory, waited for. Each call is
// therefore done when it returns, after whatever stashes were already queued on that stream.
//
// Errors: a driver failure in Create or Export is a Status naming the call and the GPU. The
// others cannot return one (GroupBlock's contract): they log to the "pool" logger and fail safe
// (Join and Out leave the depot as it was or half done, which frees nothing twice; Take answers
// false; Reclaim counts only the depots that answered; Read counts zero for a depot it could not
// read; ForEachOwned reports nothing).
//
// Thread-safe: one call at a time (Leases calls it under its lock anyway). Borrows each GPU's
// context, copy stream and kernels from its executor, which must outlive the block.
#ifndef STASH_DAEMON_CUDA_GROUP_BLOCK_H_
#define STASH_DAEMON_CUDA_GROUP_BLOCK_H_

#include <absl/base/thread_annotations.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "common/unique_fd.h"
#include "daemon/copy/executor.h"
#include "daemon/cuda/cuda_executor.h"
#include "daemon/cuda/paging_kernels.h"
#include "daemon/leases/group_block.h"
#include "stash/kernels/group_kernels.h"
#include "stash/status.h"

namespace stash::daemon {

class CudaGroupBlock final : public GroupBlock {
 public:
  // A group's depots, one on each of `gpus` (depot i on gpus[i], pool i's GPU), for `tiers` in
  // `chunk_pages`-page chunks of `page_bytes` bytes. FAILED_PRECONDITION past
  // kernels::kMaxGroupTiers tiers, for a pool tier with no GPU among `gpus`, and for a GPU without
  // VMM allocations or POSIX-fd handles; a driver failure names the call and the GPU
  // (RESOURCE_EXHAUSTED: no room on it). Nothing is left allocated on an error.
  static StatusOr<std::unique_ptr<GroupBlock>> Create(const std::vector<CudaGpu>& gpus,
                                                      uint64_t page_bytes, uint64_t chunk_pages,
                                                      const std::vector<TierShape>& tiers);
  ~CudaGroupBlock() override;

  // A new descriptor of pool `pool`'s depot (the caller owns it). INVALID_ARGUMENT for a pool
  // with no depot; a driver failure names cuMemExportToShareableHandle.
  StatusOr<UniqueFd> Export(int pool) override;
  // Pool `pool`'s GPU's 16 raw UUID bytes; empty for a pool with no depot.
  std::string gpu_uuid(int pool) const override;
  size_t DepotOf(int pool) const override { return pool < 0 ? 0 : static_cast<size_t>(pool); }
  void Join(size_t tier, uint64_t chunk, uint64_t pages, int pool) override;
  bool Take(size_t tier, uint64_t chunk, uint64_t pages) override;
  void Out(size_t tier, uint64_t chunk) override;
  uint64_t Reclaim(const std::vector<uint32_t>& live) override;
  void ForEachOwned(size_t tier, uint64_t chunk,
                    const std::function<void(uint32_t)>& owned) const override;
  // Pool `pool`'s depot's counters, or every depot's summed (pool -1), each at most `max` (dry,
  // a count of events, is not clamped, as on the host twin).
  Counters Read(uint64_t max, int pool) const override;
  // Every depot's high water := its claimed count now. A member's concurrent claim (its atomicMax
  // between the kernel's read and its exchange) may be lost: that only lowers one window's high
  // water by what the member claimed meanwhile.
  void ResetHighWater() override;

 private:
  struct Depot;
  CudaGroupBlock(uint64_t chunk_pages, const std::vector<TierShape>& tiers);

  // The depot that holds the tags of `chunk` of `tier`, or -1 (logged, naming `what`) when none
  // does: a bad tier or chunk, or a host chunk not joined.
  int DepotOf(size_t tier, uint64_t chunk, const char* what) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A launch on depot `d` (its parts and chunk_pages filled in).
  kernels::GroupDepotLaunch LaunchOn(const Depot& d) const;
  // Launches `op` on depot `d` and waits until it ran.
  Status Run(Depot& d, PagingKernels::GroupOp op, const kernels::GroupDepotLaunch& args) const;

  // Never change after Create.
  std::vector<int64_t> tier_pool_;              // per daemon tier: its pool, -1 for a host tier
  std::vector<uint64_t> tier_chunks_;           // per daemon tier: its chunks
  std::vector<std::unique_ptr<Depot>> depots_;  // per pool

  mutable Mutex mu_;  // one call at a time: the depots' pinned answers and staging are shared
  // Per depot chunk of a host tier: the depot its tags are in while it is joined (-1: none).
  std::vector<int> host_depot_ ABSL_GUARDED_BY(mu_);
};

// The Leases config's group_blocks (LeaseConfig.group_blocks) for the cuda backend: each new
// group's depots on the GPUs of `executors` (CreateCudaExecutors' executors, one per GPU in pool
// order). INVALID_ARGUMENT when one is not a cuda executor, FAILED_PRECONDITION when there are
// none. The executors must outlive every block the factory makes (it borrows their contexts,
// copy streams and kernels).
StatusOr<GroupBlock::Factory> CudaGroupBlockFactory(
    const std::vector<std::unique_ptr<CopyExecutor>>& executors);

}  // namespace stash::daemon

#endif  // STASH_DAEMON_CUDA_GROUP_BLOCK_H_
