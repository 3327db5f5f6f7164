// Daemon-copy's kernels (stash/kernels/paging_cuda.h's contract) as the cuda backend launches
// them: loaded from the fatbin stashd carries (kernels/daemon_paging.cu) and launched through
// the driver API (cuModuleLoadData, cuLaunchKernel), so stashd needs no CUDA runtime, and the
// driver stand-in (tests/cuda_standin) runs the same launches as host twins on a machine
// without a GPU. Built only with STASH_ENABLE_CUDA.
#ifndef STASH_DAEMON_PAGING_KERNELS_H_
#define STASH_DAEMON_PAGING_KERNELS_H_

#include <cuda.h>

#include <memory>

#include "common/cuda_driver.h"
#include "common/mutex.h"
#include "stash/kernels/daemon_paging.h"
#include "stash/kernels/group_kernels.h"
#include "stash/kernels/paging_cuda.h"
#include "stash/status.h"

namespace stash::daemon {

// The loaded module of one context. Create and destroy it with its context current.
//
// Thread-safe, and each call's launches are contiguous on the stream: a stash is three kernels
// (plan, copy, publish) and a reload two (pop, publish), and the ring is consistent only between
// them (the plan's pages are still in [head, tail) until the publish moves the head; a pop's
// returned ids sit past the tail until its publish). The pool worker launches stashes and
// reloads while Leases' thread launches TakeChunks and ReturnChunk on the same stream
// (daemon/cuda/cuda_chunk_lender.h), and the group depots' changes
// (daemon/cuda/cuda_group_block.h), so every call holds one lock while it enqueues.
class PagingKernels {
 public:
  // Loads the kernels from `fatbin` (stash_daemon_paging_fatbin, or a test's image) into the
  // current context. `driver` is borrowed and outlives the object.
  static StatusOr<std::unique_ptr<PagingKernels>> Load(const CudaDriver* driver,
                                                       const void* fatbin);
  PagingKernels(const PagingKernels&) = delete;
  PagingKernels& operator=(const PagingKernels&) = delete;
  ~PagingKernels();

  // As kernels::LaunchStash / LaunchReload: the same checks (kernels::CanImplementStash /
  // CanImplementReload), then the same kernels on `stream`. A driver failure is kCudaError with
  // the CUresult in cuda_error and the call named in the message.
  kernels::LaunchResult Stash(const kernels::StashLaunch& args, CUstream stream) const;
  kernels::LaunchResult Reload(const kernels::ReloadLaunch& args, CUstream stream) const;
  // Lending chunks (daemon_paging.h's ChunkRingLaunch): one thread each, on `stream`.
  kernels::LaunchResult TakeChunks(const kernels::ChunkRingLaunch& args, CUstream stream) const;
  kernels::LaunchResult ReturnChunk(const kernels::ChunkRingLaunch& args, CUstream stream) const;

  // A change to a group depot in this GPU's memory (group_kernels.h's GroupDepotLaunch), on
  // `stream`: one thread each, the reclaim a thread per page. kNullPointer when a depot part, the
  // answer (take, reclaim) or the live tags (reclaim, when any) is missing; kTooLarge when the
  // chunk is past the depot's or its pages past chunk_pages (nothing enqueued then).
  enum class GroupOp { kJoin, kTake, kOut, kReclaim, kResetHighWater };
  kernels::LaunchResult Group(GroupOp op, const kernels::GroupDepotLaunch& args,
                              CUstream stream) const;

 private:
  enum Function {
    kPlan,
    kCopy,
    kPublish,
    kPop,
    kReloadPublish,
    kTake,
    kReturn,
    kGroupJoin,
    kGroupTake,
    kGroupOut,
    kGroupReclaim,
    kGroupResetHighWater,
    kFunctions
  };
  explicit PagingKernels(const CudaDriver* driver) : driver_(driver) {}
  // One launch of `function` with `args` (a StashLaunch, ReloadLaunch, ChunkRingLaunch or
  // GroupDepotLaunch) as its one parameter.
  kernels::LaunchResult Launch(Function function, unsigned blocks, unsigned threads,
                               CUstream stream, const void* args, const char* what) const;

  const CudaDriver* const driver_;
  // Held while one call enqueues its launches, so no other call's kernels land between them.
  mutable Mutex launch_mu_;
  CUmodule module_ = nullptr;
  CUfunction functions_[kFunctions] = {};
};

}  // namespace stash::daemon

#endif  // STASH_DAEMON_PAGING_KERNELS_H_
