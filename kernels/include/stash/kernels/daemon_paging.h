// Daemon-copy's kernels (paging_cuda.h's contract) as STASH_HOST_DEVICE bodies: the kernels of
// kernels/paging.cu (launched through the runtime by the GPU tests and benchmarks) and of
// kernels/daemon_paging.cu (the fatbin the daemon launches through the driver API,
// daemon/cuda/paging_kernels.h) call the same bodies, and the driver stand-in runs them as host
// twins, so the daemon's cuda backend runs on a machine without a GPU.
//
// The one-thread kernels (plan, publish) are these bodies as they are. The copy and pop kernels
// are a thread block per chunk (paging_blocks.cuh); their host twins, StashCopySerial and
// ReloadPopSerial, do the same work in one thread with paging.h's page functions.
#ifndef STASH_KERNELS_DAEMON_PAGING_H_
#define STASH_KERNELS_DAEMON_PAGING_H_

#include <cstdint>

#include "stash/kernels/paging.h"
#include "stash/kernels/paging_cuda.h"

namespace stash::kernels {

// Entry points of kernels/daemon_paging.cu (extern "C": cuModuleGetFunction finds them by name).
// Each takes one argument, the StashLaunch or ReloadLaunch by value.
inline constexpr const char* kDaemonStashPlanKernel = "stash_daemon_stash_plan";
inline constexpr const char* kDaemonStashCopyKernel = "stash_daemon_stash_copy";
inline constexpr const char* kDaemonStashPublishKernel = "stash_daemon_stash_publish";
inline constexpr const char* kDaemonReloadPopKernel = "stash_daemon_reload_pop";
inline constexpr const char* kDaemonReloadPublishKernel = "stash_daemon_reload_publish";
inline constexpr const char* kDaemonTakeChunksKernel = "stash_daemon_take_chunks";
inline constexpr const char* kDaemonReturnChunkKernel = "stash_daemon_return_chunk";

// Threads per block of the copy and pop kernels; the one-thread kernels run one.
inline constexpr unsigned kPagingThreadsPerBlock = 256;
// Grid-stride loops cover the rest; enough blocks to fill an H100/H200 several times over.
inline constexpr uint64_t kMaxPagingBlocks = 4096;

// Blocks for the chunks of a stash of at most `max_bytes` bytes (at least one). Grids depend
// only on the static maximum, so launches can be captured in a graph.
STASH_HOST_DEVICE unsigned PagingBlocksFor(uint64_t max_bytes, uint64_t page_bytes) {
  const uint64_t chunks = ChunksFor(PagesFor(max_bytes, page_bytes), ChunkShapeOf(page_bytes));
  if (chunks == 0) return 1;
  return static_cast<unsigned>(chunks < kMaxPagingBlocks ? chunks : kMaxPagingBlocks);
}

// The tier a plan placed its stash in; a tier with a null ring when it placed nothing.
template <typename Launch>
STASH_HOST_DEVICE CudaTier PlacedTier(const StashPlan& plan, const Launch& args) {
  switch (plan.placement) {
    case Placement::kDevice:
      return args.device;
    case Placement::kPeer:
      return args.peer;
    case Placement::kHost:
      return args.host;
    default:
      return CudaTier{};
  }
}

// (a) One thread: where the stash goes, into *d_plan. Nothing else changes.
STASH_HOST_DEVICE void PlanStashLaunch(const StashLaunch& args) {
  const int64_t count = args.d_count != nullptr ? *args.d_count : args.count;
  const TierChoice tiers[3] = {{args.device.d_ring, Placement::kDevice},
                               {args.peer.d_ring, Placement::kPeer},
                               {args.host.d_ring, Placement::kHost}};
  *args.d_plan = PlanStashInOrder(count, args.divisor, args.max_rows, args.row_bytes,
                                  args.page_bytes, tiers, 3);
}

// (c) One thread, after the copy: the new head of the tier the plan chose.
STASH_HOST_DEVICE void PublishStashLaunch(const StashLaunch& args) {
  const StashPlan plan = *args.d_plan;
  const CudaTier tier = PlacedTier(plan, args);
  if (tier.d_ring == nullptr) return;
  tier.d_ring->head = plan.head + plan.pages;
}

// (e) One thread, after the pop: the new tail.
STASH_HOST_DEVICE void PublishReloadLaunch(const ReloadLaunch& args) {
  const StashPlan plan = *args.d_plan;
  const CudaTier tier = PlacedTier(plan, args);
  if (tier.d_ring == nullptr) return;
  tier.d_ring->tail += plan.pages;
}

// (b) in one thread, the copy kernel's host twin: the plan's pages from the ring at its head,
// copied and recorded.
STASH_HOST_DEVICE void StashCopySerial(const StashLaunch& args) {
  const StashPlan plan = *args.d_plan;
  const CudaTier tier = PlacedTier(plan, args);
  if (tier.d_ring == nullptr) return;
  const PagedSpan span{tier.d_base, args.page_bytes, args.d_page_record, plan.bytes};
  StashPages(args.d_src, *tier.d_ring, plan.head, span, 0, plan.pages);
}

// (d) in one thread, the pop kernel's host twin: a placed stash's pages copied back (none for a
// release), the tail zeroed when asked and the pages returned at the ring's tail; for a stash
// that overflowed, the kept source's rows instead when given (and the tail zeroed).
STASH_HOST_DEVICE void ReloadPopSerial(const ReloadLaunch& args) {
  const StashPlan plan = *args.d_plan;
  const CudaTier tier = PlacedTier(plan, args);
  const uint64_t max_bytes = args.max_rows * args.row_bytes;
  if (tier.d_ring == nullptr) {
    if (plan.placement != Placement::kOverflow || args.d_kept_src == nullptr) return;
    const uint64_t kept = KeptBytes(plan, args.max_rows, args.row_bytes);
    if (args.d_kept_src != args.d_dst) {
      for (uint64_t v = 0; v < VectorsFor(kept); ++v)
        KeptVector(args.d_dst, args.d_kept_src, kept, v);
    }
    if (args.zero_tail) ZeroBytes(args.d_dst, kept, max_bytes);
    return;
  }
  if (args.d_dst != nullptr) {
    const PagedSpan span{tier.d_base, args.page_bytes, const_cast<uint64_t*>(args.d_page_record),
                         plan.bytes};
    PopPages(args.d_dst, span, 0, plan.pages);
    if (args.zero_tail) ZeroBytes(args.d_dst, plan.bytes, max_bytes);
  }
  ReturnPages(*tier.d_ring, tier.d_ring->tail, args.d_page_record, 0, plan.pages);
}

// Lending a GPU pool's chunks to mapped sessions (daemon/cuda/cuda_chunk_lender.h): the pool's page
// ids [0, pages) are cut into chunks of `chunk_pages` (the last may be shorter), and its ring
// lives in device memory, written only by kernels in the copy stream's order. Taking chunks out
// and putting one back are one-thread kernels on that stream; the daemon enqueues them between
// stashes and reloads, never inside one (daemon/cuda/paging_kernels.h holds one lock over each
// operation's launches: the ring is consistent only between them). Their answer goes to
// host-visible memory.
struct alignas(16) ChunkRingLaunch {
  PageRing* d_ring = nullptr;
  uint64_t pages = 0;        // the pool's pages
  uint64_t chunk_pages = 0;  // > 0
  uint64_t chunks = 0;       // (pages + chunk_pages - 1) / chunk_pages
  uint64_t chunk = 0;        // kDaemonReturnChunkKernel: the chunk whose ids go back
  // kDaemonTakeChunksKernel, `chunks` entries each. d_flags (host-visible): kTakeAsked where the
  // host asks for the chunk; the kernel leaves kTakeDone where it took it out, kTakeAsked where
  // a stash still holds one of its pages. d_counts: device scratch.
  uint32_t* d_flags = nullptr;
  uint64_t* d_counts = nullptr;
};
inline constexpr uint32_t kTakeAsked = 1;
inline constexpr uint32_t kTakeDone = 2;

STASH_HOST_DEVICE uint64_t PagesOfChunk(const ChunkRingLaunch& a, uint64_t chunk) {
  const uint64_t first = chunk * a.chunk_pages;
  return a.pages - first < a.chunk_pages ? a.pages - first : a.chunk_pages;
}

// Takes every asked chunk whose pages are all free (in [head, tail)) out of the ring in one pass,
// keeping the other free ids in order; the tail moves back by the pages taken.
STASH_HOST_DEVICE void TakeChunksLaunch(const ChunkRingLaunch& a) {
  PageRing& ring = *a.d_ring;
  const uint64_t free = RingFree(ring);
  for (uint64_t c = 0; c < a.chunks; ++c) a.d_counts[c] = 0;
  for (uint64_t i = 0; i < free; ++i) {
    const uint64_t c = RingPageAt(ring, ring.head, i) / a.chunk_pages;
    if (c < a.chunks) ++a.d_counts[c];
  }
  bool any = false;
  for (uint64_t c = 0; c < a.chunks; ++c) {
    if (a.d_flags[c] == kTakeAsked && a.d_counts[c] == PagesOfChunk(a, c)) {
      a.d_flags[c] = kTakeDone;
      any = true;
    }
  }
  if (!any) return;
  // The write slot never passes the read slot: one pass in place.
  uint64_t kept = 0;
  for (uint64_t i = 0; i < free; ++i) {
    const uint64_t id = RingPageAt(ring, ring.head, i);
    const uint64_t c = id / a.chunk_pages;
    if (c < a.chunks && a.d_flags[c] == kTakeDone) continue;
    RingReturnAt(ring, ring.head, kept++, id);
  }
  ring.tail = ring.head + kept;
}

// Appends the ids of chunk `a.chunk` (taken out before) at the ring's tail.
STASH_HOST_DEVICE void ReturnChunkLaunch(const ChunkRingLaunch& a) {
  PageRing& ring = *a.d_ring;
  const uint64_t n = PagesOfChunk(a, a.chunk);
  for (uint64_t p = 0; p < n; ++p) RingReturnAt(ring, ring.tail, p, a.chunk * a.chunk_pages + p);
  ring.tail += n;
}

}  // namespace stash::kernels

#endif  // STASH_KERNELS_DAEMON_PAGING_H_
