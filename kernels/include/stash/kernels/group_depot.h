// The depot of a group: the pages one job's mapped sessions on a node share, page by page
// (docs/design.md, "Groups").
//
// One memfd per group, created by the daemon and mapped read-write by the daemon and by every
// member. It holds a header (the group's address space, a few shared counters) and one 32-bit tag
// per page of the node's tiers:
//   - kTagDaemon (0): the daemon holds the page (its chunk is not the group's, or it is being
//     taken back). A fresh memfd reads all zero: nothing is the group's until the daemon says so.
//   - kTagFree (1): the group's and free: any member may claim it.
//   - anything else: the member whose tag it is owns the page (cached free, or under a stash).
// A member claims a page with compare-and-swap (free -> its tag) and releases it with
// compare-and-swap (its tag -> free), so the tag is the ownership record: when a member dies, the
// daemon frees exactly the pages whose tag is the dead member's (a claim it died in included),
// and nobody ever waits on it. Tags are never reused within a group.
//
// Addressing: every daemon tier (pools, then host tiers) starts at a chunk boundary of the
// group's address space: chunk c of tier t is depot chunk tier[t].first_chunk + c, and its pages
// are group pages chunk * chunk_pages + i (a short last chunk leaves a hole whose tags stay
// kTagDaemon). Every member maps every chunk it was sent at base + group page *
// page_bytes of one reserved range, so a page id names the same memory in every member.
//
// Trust: a member may write anything here (it owns the mapping). The daemon keeps the layout in
// its own memory and reads only the tags (compared, never used as an index) and the counters
// (clamped). Members of one group trust each other: it is the job's own memory.
#ifndef STASH_KERNELS_GROUP_DEPOT_H_
#define STASH_KERNELS_GROUP_DEPOT_H_

#include <cstdint>

#include "stash/kernels/host_device.h"

namespace stash::kernels {

// "groupdpt" in ASCII, then the layout version.
inline constexpr uint64_t kGroupMagic = 0x747064707572676full;
inline constexpr uint64_t kGroupVersion = 1;

inline constexpr uint32_t kTagDaemon = 0;
inline constexpr uint32_t kTagFree = 1;
inline constexpr uint32_t kFirstMemberTag = 2;

// Daemon tiers a depot can describe: every pool and every host tier of a node.
inline constexpr uint32_t kMaxGroupTiers = 64;

// kGroupChunkIn: the group's (its pages are free or owned by members). kGroupChunkLeaving: the
// daemon took all its pages back; members unmap it at their next step and say so.
inline constexpr uint32_t kGroupChunkOut = 0;
inline constexpr uint32_t kGroupChunkIn = 1;
inline constexpr uint32_t kGroupChunkLeaving = 2;

struct GroupTier {
  uint64_t first_chunk;  // its chunk 0 among the depot's chunks (page first_chunk * chunk_pages)
  uint64_t chunks;
  uint64_t pages;  // pages of the tier (its last chunk may be short)
  int64_t pool;    // the pool it is (its index among the pools), -1 for a host tier
};

struct alignas(64) GroupHeader {
  // Written once by the daemon before any member maps the block.
  uint64_t magic;
  uint64_t version;
  uint64_t page_bytes;
  uint64_t chunk_pages;         // pages per chunk (a tier's last chunk may be shorter)
  uint64_t tiers;               // <= kMaxGroupTiers
  uint64_t pages;               // pages of the whole address space: chunks * chunk_pages
  uint64_t chunks;              // chunks of the whole address space
  uint64_t chunk_free_offset;   // bytes from the block's start: uint32 free-page hint per chunk
  uint64_t chunk_state_offset;  // uint32 kGroupChunk* per chunk (daemon-written)
  uint64_t tags_offset;         // uint32 tag per page
  uint64_t block_bytes;
  uint64_t reserved[5];

  // Written by the daemon: bumped whenever a chunk joins or starts leaving the group.
  alignas(64) uint64_t generation;
  uint64_t daemon_reserved[7];

  // Written by the members, read (clamped) by the daemon for the group's size.
  alignas(64) uint64_t claimed;  // pages the members own now
  uint64_t claimed_high_water;   // the most at once since the daemon last reset it
  uint64_t dry;                  // refills a member's own device's chunks could not fill
  uint64_t dry_pages;            // the pages those refills missed
  uint64_t claims;               // pages claimed, in total
  uint64_t releases;             // pages released, in total
  uint64_t members_reserved[2];

  GroupTier tier[kMaxGroupTiers];
};
static_assert(sizeof(GroupHeader) == 256 + 32 * kMaxGroupTiers, "GroupHeader is shared");

// The block's layout for `pages` pages in `chunks` chunks: offsets of the arrays and its size.
struct GroupLayout {
  uint64_t chunk_free_offset;
  uint64_t chunk_state_offset;
  uint64_t tags_offset;
  uint64_t block_bytes;
};
inline GroupLayout GroupLayoutFor(uint64_t pages, uint64_t chunks) {
  auto up = [](uint64_t n, uint64_t a) { return (n + a - 1) / a * a; };
  GroupLayout l{};
  l.chunk_free_offset = up(sizeof(GroupHeader), 4096);
  l.chunk_state_offset = up(l.chunk_free_offset + 4 * chunks, 64);
  l.tags_offset = up(l.chunk_state_offset + 4 * chunks, 64);
  l.block_bytes = up(l.tags_offset + 4 * pages, 4096);
  return l;
}

// A member's (or the daemon's) view of a mapped block: pointers into it, from the layout it was
// told (never from numbers read out of the block after mapping it).
struct GroupView {
  GroupHeader* header;
  uint32_t* chunk_free;
  uint32_t* chunk_state;
  uint32_t* tags;
  uint64_t pages;
  uint64_t chunks;
};

STASH_HOST_DEVICE uint32_t TagLoad(const uint32_t& tag) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const volatile uint32_t*>(&tag);
#else
  return __atomic_load_n(&tag, __ATOMIC_ACQUIRE);
#endif
}

// A release store of a word members read with TagLoad (a tag, a hint, a chunk's state): whoever
// sees it also sees every write made before it. The daemon's joins, take-backs and leavings.
STASH_HOST_DEVICE void TagStore(uint32_t& word, uint32_t value) {
#if defined(__CUDA_ARCH__)
  __threadfence_system();
  *reinterpret_cast<volatile uint32_t*>(&word) = value;
#else
  __atomic_store_n(&word, value, __ATOMIC_RELEASE);
#endif
}

// Compare-and-swap of one tag: true when it was `from` and is now `to`. Acquire-release: a
// claim sees every write the previous owner made before its release.
STASH_HOST_DEVICE bool TagSwap(uint32_t& tag, uint32_t from, uint32_t to) {
#if defined(__CUDA_ARCH__)
  __threadfence_system();
  // System scope: other processes' kernels (other programs) claim in the same depot.
  const bool ok = atomicCAS_system(&tag, from, to) == from;
  __threadfence_system();
  return ok;
#else
  return __atomic_compare_exchange_n(&tag, &from, to, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
#endif
}

STASH_HOST_DEVICE void HintAdd(uint32_t& hint, int32_t delta) {
#if defined(__CUDA_ARCH__)
  atomicAdd_system(&hint, static_cast<uint32_t>(delta));
#else
  __atomic_fetch_add(&hint, static_cast<uint32_t>(delta), __ATOMIC_RELAXED);
#endif
}

STASH_HOST_DEVICE void CounterAdd(uint64_t& counter, uint64_t delta) {
#if defined(__CUDA_ARCH__)
  atomicAdd_system(reinterpret_cast<unsigned long long*>(&counter),  // NOLINT(google-runtime-int)
                   static_cast<unsigned long long>(delta));          // NOLINT(google-runtime-int)
#else
  __atomic_fetch_add(&counter, delta, __ATOMIC_RELAXED);
#endif
}

// claimed += delta (delta may be "negative" in two's complement), and the high water follows.
STASH_HOST_DEVICE void AccountClaimed(GroupHeader& h, uint64_t delta) {
#if defined(__CUDA_ARCH__)
  const uint64_t now =
      atomicAdd_system(reinterpret_cast<unsigned long long*>(&h.claimed),  // NOLINT
                       static_cast<unsigned long long>(delta)) +           // NOLINT
      delta;
  // A count gone below zero (a member killed between its swap and this) is no high water.
  if (now < (uint64_t{1} << 62)) {
    atomicMax_system(reinterpret_cast<unsigned long long*>(&h.claimed_high_water),  // NOLINT
                     static_cast<unsigned long long>(now));                         // NOLINT
  }
#else
  const uint64_t now = __atomic_add_fetch(&h.claimed, delta, __ATOMIC_RELAXED);
  uint64_t seen = __atomic_load_n(&h.claimed_high_water, __ATOMIC_RELAXED);
  while (now > seen && now < (uint64_t{1} << 62) &&
         !__atomic_compare_exchange_n(&h.claimed_high_water, &seen, now, true, __ATOMIC_RELAXED,
                                      __ATOMIC_RELAXED)) {
  }
#endif
}

// One chunk a member has mapped: where its pages are in the group's address space.
struct GroupChunkRef {
  uint64_t chunk;       // index among the depot's chunks
  uint64_t first_page;  // group page of its page 0
  uint64_t pages;
};

// Claims up to `want` free pages of the chunks `refs[0..n)` for `me`, starting at chunk
// `*cursor` (moved on to where it stopped, so members spread out and a member does not rescan
// full chunks), handing each one's group page id to `out(i, page)` for i = 0, 1, ... Returns how
// many it claimed. Chunks the hint says are full are skipped; the tags decide.
template <typename Out>
STASH_HOST_DEVICE uint64_t ClaimPagesTo(GroupView& g, const GroupChunkRef* refs, uint64_t n,
                                        uint64_t* cursor, uint32_t me, uint64_t want, Out out) {
  uint64_t got = 0;
  if (n == 0 || want == 0) return 0;
  uint64_t start = *cursor % n;
  for (uint64_t k = 0; k < n && got < want; ++k) {
    const uint64_t r = (start + k) % n;
    const GroupChunkRef& ref = refs[r];
    if (ref.chunk >= g.chunks || ref.first_page + ref.pages > g.pages) continue;
    uint32_t& hint = g.chunk_free[ref.chunk];
    if (TagLoad(hint) == 0) continue;
    if (TagLoad(g.chunk_state[ref.chunk]) != kGroupChunkIn) continue;
    for (uint64_t p = 0; p < ref.pages && got < want; ++p) {
      const uint64_t page = ref.first_page + p;
      if (TagLoad(g.tags[page]) != kTagFree) continue;
      if (!TagSwap(g.tags[page], kTagFree, me)) continue;
      HintAdd(hint, -1);
      out(got++, page);
    }
    *cursor = r;  // where the next claim starts: this chunk may have more
  }
  if (got > 0) {
    AccountClaimed(*g.header, got);
    CounterAdd(g.header->claims, got);
  }
  return got;
}

// ClaimPagesTo into `out[0..)`.
struct PageIdsOut {
  uint64_t* ids;
  STASH_HOST_DEVICE void operator()(uint64_t i, uint64_t page) const { ids[i] = page; }
};
STASH_HOST_DEVICE uint64_t ClaimPages(GroupView& g, const GroupChunkRef* refs, uint64_t n,
                                      uint64_t* cursor, uint32_t me, uint64_t want, uint64_t* out) {
  return ClaimPagesTo(g, refs, n, cursor, me, want, PageIdsOut{out});
}

// Releases the pages `id(0) .. id(n - 1)` that `me` owns back to the group. A page whose tag is
// not `me` (never ours, or garbage a member wrote) is left alone: the return value is the pages
// released.
template <typename Id>
STASH_HOST_DEVICE uint64_t ReleasePagesFrom(GroupView& g, uint64_t n, uint32_t me,
                                            uint64_t chunk_pages, Id id) {
  uint64_t released = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t page = id(i);
    if (page >= g.pages || !TagSwap(g.tags[page], me, kTagFree)) continue;
    // The hint after the tag: a claimer that sees the hint grow finds the page free.
    HintAdd(g.chunk_free[page / chunk_pages], 1);
    ++released;
  }
  if (released > 0) {
    AccountClaimed(*g.header, ~released + 1);
    CounterAdd(g.header->releases, released);
  }
  return released;
}

// ReleasePagesFrom `ids[0..n)`.
struct PageIdsIn {
  const uint64_t* ids;
  STASH_HOST_DEVICE uint64_t operator()(uint64_t i) const { return ids[i]; }
};
STASH_HOST_DEVICE uint64_t ReleasePages(GroupView& g, const uint64_t* ids, uint64_t n, uint32_t me,
                                        uint64_t chunk_pages) {
  return ReleasePagesFrom(g, n, me, chunk_pages, PageIdsIn{ids});
}

// The daemon's side. The pages of depot chunk `c` in the group's address space.
STASH_HOST_DEVICE uint64_t ChunkFirstPage(uint64_t c, uint64_t chunk_pages) {
  return c * chunk_pages;
}

// Chunk `c` (its first `pages` pages real) joins the group: its tags go from the daemon's to
// free, then its hint, then its state (a member claims only chunks it mapped, which it was sent
// after this). Host and device (the cuda backend's depots: stash/kernels/group_kernels.h).
STASH_HOST_DEVICE void JoinChunk(GroupView& g, uint64_t chunk_pages, uint64_t c, uint64_t pages) {
  const uint64_t first = ChunkFirstPage(c, chunk_pages);
  for (uint64_t p = first; p < first + pages && p < g.pages; ++p) TagStore(g.tags[p], kTagFree);
  TagStore(g.chunk_free[c], static_cast<uint32_t>(pages));
  TagStore(g.chunk_state[c], kGroupChunkIn);
}

// Takes chunk `c` back from the group when every one of its pages is free: each tag free ->
// daemon, all or none (the pages already taken go back to free when one is owned). True when
// the daemon now holds every page; the chunk is then kGroupChunkLeaving. Host and device.
STASH_HOST_DEVICE bool TakeChunk(GroupView& g, uint64_t chunk_pages, uint64_t c, uint64_t pages) {
  const uint64_t first = ChunkFirstPage(c, chunk_pages);
  uint64_t taken = 0;
  for (; taken < pages && first + taken < g.pages; ++taken) {
    if (!TagSwap(g.tags[first + taken], kTagFree, kTagDaemon)) break;
  }
  if (taken < pages) {
    for (uint64_t p = 0; p < taken; ++p) TagSwap(g.tags[first + p], kTagDaemon, kTagFree);
    return false;
  }
  TagStore(g.chunk_free[c], 0u);
  TagStore(g.chunk_state[c], kGroupChunkLeaving);
  return true;
}

// Page `p` of chunk `c` (a chunk of the group's) back to free when its tag is a member's and
// `is_dead(tag)` says no live member has it; true when this call freed it. The hint after the
// tag, as a release does. Host and device (the cuda backend's reclaim kernel runs a thread per
// page); the caller accounts the pages freed in the header.
template <typename IsDead>
STASH_HOST_DEVICE bool ReclaimPage(GroupView& g, uint64_t c, uint64_t p, IsDead is_dead) {
  const uint32_t tag = TagLoad(g.tags[p]);
  if (tag < kFirstMemberTag || !is_dead(tag)) return false;
  if (!TagSwap(g.tags[p], tag, kTagFree)) return false;
  HintAdd(g.chunk_free[c], 1);
  return true;
}

// Frees every page of the group's chunks whose tag `is_dead(tag)` says belongs to no live member
// (an exited member's, or garbage no member ever had): compared, never used as an index. Returns
// the pages freed.
template <typename IsDead>
uint64_t ReclaimTags(GroupView& g, uint64_t chunk_pages, IsDead is_dead) {
  uint64_t freed = 0;
  for (uint64_t c = 0; c < g.chunks; ++c) {
    if (TagLoad(g.chunk_state[c]) != kGroupChunkIn) continue;
    const uint64_t first = ChunkFirstPage(c, chunk_pages);
    for (uint64_t p = first; p < first + chunk_pages && p < g.pages; ++p) {
      if (ReclaimPage(g, c, p, is_dead)) ++freed;
    }
  }
  if (freed > 0) AccountClaimed(*g.header, ~freed + 1);
  return freed;
}

}  // namespace stash::kernels

#endif  // STASH_KERNELS_GROUP_DEPOT_H_
