// Daemon-copy's kernels (paging_cuda.h's contract; bodies in daemon_paging.h), compiled to a
// fatbin that stashd carries and launches through the driver API on each GPU's copy stream
// (daemon/cuda/paging_kernels.h): the daemon needs no CUDA runtime, and the driver stand-in runs
// the same launches on a machine without a GPU (as host twins). kernels/paging.cu launches the
// same bodies through the runtime for the GPU tests and benchmarks.
#include "stash/kernels/daemon_paging.h"
#include "stash/kernels/group_kernels.h"
#include "stash/kernels/paging_blocks.cuh"

using stash::kernels::CudaTier;
using stash::kernels::GroupDepotLaunch;
using stash::kernels::Placement;
using stash::kernels::ReloadLaunch;
using stash::kernels::StashLaunch;
using stash::kernels::StashPlan;

// One thread: where the stash goes.
extern "C" __global__ void stash_daemon_stash_plan(StashLaunch a) {
  stash::kernels::PlanStashLaunch(a);
}

// A block per chunk of the placed stash's page slots (StashChunks, paging_blocks.cuh).
extern "C" __global__ void stash_daemon_stash_copy(StashLaunch a) {
  const StashPlan plan = *a.d_plan;
  const CudaTier tier = stash::kernels::PlacedTier(plan, a);
  if (tier.d_ring == nullptr) return;
  stash::kernels::StashChunks(a.d_src, *tier.d_ring, tier.d_base, a.page_bytes, plan,
                              a.d_page_record);
}

// One thread, after the copy: the new head.
extern "C" __global__ void stash_daemon_stash_publish(StashLaunch a) {
  stash::kernels::PublishStashLaunch(a);
}

// A block per chunk: copy back, return the page ids at the old tail, zero the tail (PopChunks);
// for a stash that overflowed, the kept source instead when given (ReloadKeptSource).
extern "C" __global__ void stash_daemon_reload_pop(ReloadLaunch a) {
  const StashPlan plan = *a.d_plan;
  const CudaTier tier = stash::kernels::PlacedTier(plan, a);
  if (tier.d_ring == nullptr) {
    if (plan.placement != Placement::kOverflow || a.d_kept_src == nullptr) return;
    stash::kernels::ReloadKeptSource(a.d_dst, a.d_kept_src, plan, a.max_rows, a.row_bytes,
                                     a.zero_tail);
    return;
  }
  stash::kernels::PopChunks(a.d_dst, *tier.d_ring, tier.d_base, a.page_bytes, plan, a.d_page_record,
                            a.max_rows * a.row_bytes, a.zero_tail);
}

// One thread, after the pop: the new tail.
extern "C" __global__ void stash_daemon_reload_publish(ReloadLaunch a) {
  stash::kernels::PublishReloadLaunch(a);
}

// One thread: take the asked chunks that are wholly free out of the pool's ring (leasing).
extern "C" __global__ void stash_daemon_take_chunks(stash::kernels::ChunkRingLaunch a) {
  stash::kernels::TakeChunksLaunch(a);
}

// One thread: a chunk's ids back at the ring's tail (a lease returned).
extern "C" __global__ void stash_daemon_return_chunk(stash::kernels::ChunkRingLaunch a) {
  stash::kernels::ReturnChunkLaunch(a);
}

// A group's depot in this GPU's memory (stash/kernels/group_kernels.h), where members' plan kernels
// claim at the same time. One thread: a chunk joins the group.
extern "C" __global__ void stash_daemon_group_join(GroupDepotLaunch a) {
  stash::kernels::GroupJoinLaunch(a);
}

// One thread: a chunk taken back when every page is free, all or none; the answer to the host.
extern "C" __global__ void stash_daemon_group_take(GroupDepotLaunch a) {
  stash::kernels::GroupTakeLaunch(a);
}

// One thread: a chunk no longer the group's, its tags the daemon's.
extern "C" __global__ void stash_daemon_group_out(GroupDepotLaunch a) {
  stash::kernels::GroupOutLaunch(a);
}

// One thread: a new high-water window.
extern "C" __global__ void stash_daemon_group_reset_high_water(GroupDepotLaunch a) {
  stash::kernels::GroupResetHighWaterLaunch(a);
}

// A thread per page (grid-stride): pages whose member tag is not live go back to free. Each block
// copies the live tags to shared memory when they fit, and adds what it freed to the header's
// claimed count and to the host's answer once.
extern "C" __global__ void stash_daemon_group_reclaim(GroupDepotLaunch a) {
  namespace k = stash::kernels;
  __shared__ uint32_t live[k::kGroupLiveShared];
  __shared__ unsigned long long freed;  // NOLINT(google-runtime-int): atomicAdd's type
  const bool in_shared = a.live <= k::kGroupLiveShared;
  if (threadIdx.x == 0) freed = 0;
  if (in_shared) {
    for (uint64_t i = threadIdx.x; i < a.live; i += blockDim.x) live[i] = a.d_live[i];
  }
  __syncthreads();
  const uint32_t* sorted = in_shared ? live : a.d_live;
  unsigned long long mine = 0;  // NOLINT(google-runtime-int)
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t p = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < a.depot.pages;
       p += stride) {
    if (k::GroupReclaimPage(a, p, sorted)) ++mine;
  }
  if (mine > 0) atomicAdd(&freed, mine);
  __syncthreads();
  if (threadIdx.x != 0 || freed == 0) return;
  k::AccountClaimed(*a.depot.header, ~static_cast<uint64_t>(freed) + 1);
  k::CounterAdd(*a.d_answer, freed);
}
