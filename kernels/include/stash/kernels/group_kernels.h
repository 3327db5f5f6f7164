// The daemon's side of a group depot on a GPU (daemon/cuda/cuda_group_block.h): the kernels
// stashd launches on a depot in that GPU's memory, where the members' plan kernels claim and
// release pages with compare-and-swap at the same time (stash/kernels/group_depot.h). The daemon's
// host cannot take part in those atomics (the depot is device memory), so every change it makes
// to a depot is one of these kernels, on the GPU's copy stream, waited for.
//
// Bodies as STASH_HOST_DEVICE functions: kernels/daemon_paging.cu's kernels call them, and the
// driver stand-in (tests/cuda_standin/project_twins.cc) runs them as host twins. Every one but the
// reclaim is one thread; the reclaim kernel is a thread per page (GroupReclaimSerial is its
// one-thread twin).
#ifndef STASH_KERNELS_GROUP_KERNELS_H_
#define STASH_KERNELS_GROUP_KERNELS_H_

#include <cstdint>

#include "stash/kernels/group_depot.h"
#include "stash/kernels/host_device.h"

namespace stash::kernels {

// Entry points of kernels/daemon_paging.cu (extern "C"), each taking a GroupDepotLaunch by value.
inline constexpr const char* kDaemonGroupJoinKernel = "stash_daemon_group_join";
inline constexpr const char* kDaemonGroupTakeKernel = "stash_daemon_group_take";
inline constexpr const char* kDaemonGroupOutKernel = "stash_daemon_group_out";
inline constexpr const char* kDaemonGroupReclaimKernel = "stash_daemon_group_reclaim";
inline constexpr const char* kDaemonGroupResetHighWaterKernel =
    "stash_daemon_group_reset_high_water";

// The reclaim kernel's shape: threads per block, at most this many blocks (a grid-stride loop
// covers the rest), and the live tags a block copies to shared memory (more are searched where
// they are).
inline constexpr unsigned kGroupReclaimThreads = 256;
inline constexpr uint64_t kMaxGroupReclaimBlocks = 1024;
inline constexpr uint64_t kGroupLiveShared = 1024;

// One change to one depot. Non-owning; every pointer is a device address (the depot's parts, in
// the layout the daemon chose and keeps: never read back from the depot).
struct alignas(16) GroupDepotLaunch {
  GroupView depot{};
  uint64_t chunk_pages = 0;  // > 0
  uint64_t chunk = 0;        // join, take, out: the depot chunk (< depot.chunks)
  uint64_t pages = 0;        // join, take: its real pages (<= chunk_pages; a tier's last is short)
  // Reclaim: the live members' tags, sorted ascending (`live` of them; device-readable).
  const uint32_t* d_live = nullptr;
  uint64_t live = 0;
  // Host-visible answer: take writes 1 (taken) or 0; reclaim adds the pages it freed.
  uint64_t* d_answer = nullptr;
};

// Blocks of the reclaim kernel for a depot of `pages` pages (at least one).
STASH_HOST_DEVICE unsigned GroupReclaimBlocks(uint64_t pages) {
  const uint64_t blocks = (pages + kGroupReclaimThreads - 1) / kGroupReclaimThreads;
  if (blocks == 0) return 1;
  return static_cast<unsigned>(blocks < kMaxGroupReclaimBlocks ? blocks : kMaxGroupReclaimBlocks);
}

// Whether `tag` is among `sorted[0..n)` (ascending): a binary search.
STASH_HOST_DEVICE bool SortedContains(const uint32_t* sorted, uint64_t n, uint32_t tag) {
  uint64_t lo = 0, hi = n;
  while (lo < hi) {
    const uint64_t mid = lo + (hi - lo) / 2;
    if (sorted[mid] < tag) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo < n && sorted[lo] == tag;
}

// ReclaimPage's `is_dead`: a tag no live member has.
struct NotLive {
  const uint32_t* sorted;
  uint64_t n;
  STASH_HOST_DEVICE bool operator()(uint32_t tag) const { return !SortedContains(sorted, n, tag); }
};

// Join: the chunk's tags free, then its hint, then its state (JoinChunk); a new generation.
STASH_HOST_DEVICE void GroupJoinLaunch(const GroupDepotLaunch& a) {
  GroupView g = a.depot;
  if (a.chunk >= g.chunks) return;
  JoinChunk(g, a.chunk_pages, a.chunk, a.pages);
  CounterAdd(g.header->generation, 1);
}

// Take: every page free -> the daemon's, all or none (TakeChunk); the answer 1 when taken.
STASH_HOST_DEVICE void GroupTakeLaunch(const GroupDepotLaunch& a) {
  GroupView g = a.depot;
  const bool taken = a.chunk < g.chunks && TakeChunk(g, a.chunk_pages, a.chunk, a.pages);
  if (taken) CounterAdd(g.header->generation, 1);
  *a.d_answer = taken ? 1 : 0;
}

// Out: the chunk is no longer the group's: its state, its hint, then every tag the daemon's
// (whatever a member left there: no member maps it any more).
STASH_HOST_DEVICE void GroupOutLaunch(const GroupDepotLaunch& a) {
  GroupView g = a.depot;
  if (a.chunk >= g.chunks) return;
  TagStore(g.chunk_state[a.chunk], kGroupChunkOut);
  TagStore(g.chunk_free[a.chunk], 0u);
  const uint64_t first = ChunkFirstPage(a.chunk, a.chunk_pages);
  for (uint64_t p = first; p < first + a.chunk_pages && p < g.pages; ++p) {
    TagStore(g.tags[p], kTagDaemon);
  }
}

// A new high-water window at what is claimed now. A member's atomicMax between the read and the
// exchange is lost: that window's high water reads lower by what the member claimed since.
STASH_HOST_DEVICE void GroupResetHighWaterLaunch(const GroupDepotLaunch& a) {
  GroupHeader& h = *a.depot.header;
#if defined(__CUDA_ARCH__)
  const uint64_t now = *reinterpret_cast<const volatile uint64_t*>(&h.claimed);
  atomicExch(reinterpret_cast<unsigned long long*>(&h.claimed_high_water),  // NOLINT
             static_cast<unsigned long long>(now));                         // NOLINT
#else
  __atomic_store_n(&h.claimed_high_water, __atomic_load_n(&h.claimed, __ATOMIC_RELAXED),
                   __ATOMIC_RELAXED);
#endif
}

// Reclaim, page `p` of the depot: freed when its chunk is the group's and its tag a member's that
// is not live (ReclaimPage). The caller accounts the pages freed.
STASH_HOST_DEVICE bool GroupReclaimPage(const GroupDepotLaunch& a, uint64_t p,
                                        const uint32_t* live) {
  GroupView g = a.depot;
  const uint64_t c = p / a.chunk_pages;
  if (p >= g.pages || c >= g.chunks || TagLoad(g.chunk_state[c]) != kGroupChunkIn) return false;
  return ReclaimPage(g, c, p, NotLive{live, a.live});
}

// The reclaim kernel's one-thread twin: every page, then the header's claimed count and the
// answer (as ReclaimTags).
STASH_HOST_DEVICE void GroupReclaimSerial(const GroupDepotLaunch& a) {
  uint64_t freed = 0;
  for (uint64_t p = 0; p < a.depot.pages; ++p) freed += GroupReclaimPage(a, p, a.d_live) ? 1 : 0;
  if (freed == 0) return;
  AccountClaimed(*a.depot.header, ~freed + 1);
  CounterAdd(*a.d_answer, freed);
}

}  // namespace stash::kernels

#endif  // STASH_KERNELS_GROUP_KERNELS_H_
