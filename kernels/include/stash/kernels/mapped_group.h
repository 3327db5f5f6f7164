// A group member's depot as the kernels on its stream see it (docs/design.md, "Groups on
// GPUs"): the cuda twin of LeaseTable's group fields.
//
// The host learns of the group and of each chunk it maps on its lease thread, at any time, also
// while the stream captures or a graph replays; the kernels must see each chunk only once it is
// mapped, and a graph captured before the group grew must use the chunks that came after. So the
// host writes what the kernels need into a board in pinned, device-mapped memory (the depot's
// device addresses per lease tier, the member's tag, the chunks it mapped per tier) under a
// sequence count, and the plan kernel copies it into a cache in device memory when the count
// moved: one read of host memory per stash, and no kernel launch, capture or synchronisation per
// lease change. Chunks leave the other way: the daemon marks a chunk leaving in the depot; the
// step kernel writes each cached chunk's state beside the board, and the host, at its next step,
// takes the leaving ones off the board, unmaps them once the stream's work that may name them
// is done, and returns them.
#ifndef STASH_KERNELS_MAPPED_GROUP_H_
#define STASH_KERNELS_MAPPED_GROUP_H_

#include <cstdint>

#include "stash/kernels/group_cache.h"
#include "stash/kernels/group_depot.h"
#include "stash/kernels/host_device.h"
#include "stash/kernels/lease_control.h"
#include "stash/kernels/paging.h"

namespace stash::kernels {

// The board's (and the cache's) fixed part; `refs_capacity` GroupChunkRefs follow it.
struct alignas(16) MappedGroupHeader {
  // Board: 0 = no group; odd while the host rewrites it; +2 after each change. Cache: the
  // board's count it copied, 0 while it holds nothing whole.
  uint64_t generation;
  uint32_t tag;  // the member's tag in the depot
  uint32_t reserved;
  uint64_t chunk_pages;
  uint64_t refs_capacity;
  // Per lease tier: the depot its pages' tags are in (device addresses; tags null = the tier
  // takes nothing from a depot) and its chunks: refs[refs_first[t] .. + refs_count[t]).
  GroupView depot[kLeaseTiers];
  uint64_t refs_first[kLeaseTiers];
  uint64_t refs_count[kLeaseTiers];
  // The group page of ring id 0 of each tier: the tier's range starts there, so a graph
  // captured before the session joined its group addresses the group's pages.
  uint64_t first_page[kLeaseTiers];
  uint64_t cursor[kLeaseTiers];  // the cache's own: where each tier's next claim starts
};
static_assert(sizeof(MappedGroupHeader) % 16 == 0, "MappedGroupHeader is shared with devices");

STASH_HOST_DEVICE GroupChunkRef* GroupRefs(MappedGroupHeader* h) {
  return reinterpret_cast<GroupChunkRef*>(h + 1);
}
STASH_HOST_DEVICE const GroupChunkRef* GroupRefs(const MappedGroupHeader* h) {
  return reinterpret_cast<const GroupChunkRef*>(h + 1);
}
STASH_HOST_DEVICE uint64_t GroupBoardBytes(uint64_t refs_capacity) {
  return sizeof(MappedGroupHeader) + refs_capacity * sizeof(GroupChunkRef);
}

// Written by the step kernel beside the board: the state (kGroupChunk*) of each chunk of the
// cache it had, and the cache's generation, so the host reads states of the refs it wrote.
struct alignas(16) MappedGroupStates {
  uint64_t generation;
  uint64_t reserved;
  // uint32 state[refs_capacity] follows
};
STASH_HOST_DEVICE uint32_t* GroupStates(MappedGroupStates* s) {
  return reinterpret_cast<uint32_t*>(s + 1);
}
STASH_HOST_DEVICE uint64_t GroupStatesBytes(uint64_t refs_capacity) {
  return sizeof(MappedGroupStates) + (refs_capacity * sizeof(uint32_t) + 15) / 16 * 16;
}

// How many times SyncMappedGroup reads the board before it gives up (each try is a read of host
// memory, about a microsecond from a GPU).
inline constexpr uint64_t kBoardSyncTries = uint64_t{1} << 20;

// Word loads of host-written memory: volatile on the device, acquire on the host (the driver
// stand-in runs the kernels' host twins on threads of their own).
STASH_HOST_DEVICE uint64_t BoardLoad(const uint64_t& word) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const volatile uint64_t*>(&word);
#else
  return __atomic_load_n(&word, __ATOMIC_ACQUIRE);
#endif
}

// Copies the board into the cache when its generation moved and the host is not rewriting it;
// tries again while a rewrite comes between. True when the cache then names a group.
// The refs are bounded by both sides' capacity, whatever the board says.
STASH_HOST_DEVICE bool SyncMappedGroup(const MappedGroupHeader* board, MappedGroupHeader* cache) {
  if (board == nullptr || cache == nullptr) return false;
  // The host rewrites the board in microseconds, on a thread of its own: a reader that finds it
  // mid-rewrite tries again rather than run a stash outside the group (which would overflow it,
  // and leave the pages of its reload in the ring). Only a host stuck for about a second mid-write
  // ends this with no group for this stash.
  for (uint64_t attempt = 0; attempt < kBoardSyncTries; ++attempt) {
    const uint64_t gen = BoardLoad(board->generation);
    if (gen == cache->generation) return gen != 0;
    if ((gen & 1) != 0) continue;  // the host is writing
#if defined(__CUDA_ARCH__)
    __threadfence_system();  // the words below are read after the even generation
#endif
    cache->generation = 0;
    // The header's words but the generation, refs_capacity (the cache keeps its own) and the
    // cursors (the cache's own).
    const auto* src = reinterpret_cast<const uint64_t*>(board);
    auto* dst = reinterpret_cast<uint64_t*>(cache);
    const auto word_of = [board](const void* field) {
      return static_cast<uint64_t>(reinterpret_cast<const uint8_t*>(field) -
                                   reinterpret_cast<const uint8_t*>(board)) /
             sizeof(uint64_t);
    };
    const uint64_t copied[2][2] = {{word_of(&board->tag), word_of(&board->refs_capacity)},
                                   {word_of(&board->depot[0]), word_of(&board->cursor[0])}};
    for (const auto& range : copied) {
      for (uint64_t i = range[0]; i < range[1]; ++i) dst[i] = BoardLoad(src[i]);
    }
    const uint64_t capacity = cache->refs_capacity;
    const auto* refs_src = reinterpret_cast<const uint64_t*>(GroupRefs(board));
    auto* refs_dst = reinterpret_cast<uint64_t*>(GroupRefs(cache));
    for (uint32_t t = 0; t < kLeaseTiers; ++t) {
      if (cache->refs_first[t] > capacity) cache->refs_first[t] = capacity;
      if (cache->refs_count[t] > capacity - cache->refs_first[t]) {
        cache->refs_count[t] = capacity - cache->refs_first[t];
      }
      const uint64_t words = sizeof(GroupChunkRef) / sizeof(uint64_t);
      const uint64_t begin = cache->refs_first[t] * words;
      const uint64_t end = begin + cache->refs_count[t] * words;
      for (uint64_t i = begin; i < end; ++i) refs_dst[i] = BoardLoad(refs_src[i]);
    }
#if defined(__CUDA_ARCH__)
    __threadfence_system();
#endif
    if (BoardLoad(board->generation) == gen) {
      cache->generation = gen;
      return gen != 0;
    }
  }
  return cache->generation != 0;
}

// Lease tier `t` of a synced cache, over the member's ring of that tier.
STASH_HOST_DEVICE GroupCacheTier GroupTierOf(MappedGroupHeader* cache, uint32_t t, PageRing* ring) {
  GroupCacheTier tier{};
  tier.ring = ring;
  if (cache->depot[t].tags == nullptr) return tier;
  tier.depot = &cache->depot[t];
  tier.refs = GroupRefs(cache) + cache->refs_first[t];
  tier.refs_count = cache->refs_count[t];
  tier.cursor = &cache->cursor[t];
  tier.first_page = cache->first_page[t];
  return tier;
}

// The step kernel's part: the state of each chunk the cache names, for the host (it takes the
// leaving ones off the board at its next step).
STASH_HOST_DEVICE void ReportGroupChunkStates(MappedGroupHeader* cache, MappedGroupStates* out) {
  if (cache == nullptr || out == nullptr || cache->generation == 0) return;
  uint32_t* states = GroupStates(out);
  for (uint32_t t = 0; t < kLeaseTiers; ++t) {
    const GroupView& g = cache->depot[t];
    const GroupChunkRef* refs = GroupRefs(cache) + cache->refs_first[t];
    for (uint64_t i = 0; i < cache->refs_count[t]; ++i) {
      uint32_t state = kGroupChunkOut;
      if (g.tags != nullptr && refs[i].chunk < g.chunks)
        state = TagLoad(g.chunk_state[refs[i].chunk]);
#if defined(__CUDA_ARCH__)
      *reinterpret_cast<volatile uint32_t*>(&states[cache->refs_first[t] + i]) = state;
#else
      __atomic_store_n(&states[cache->refs_first[t] + i], state, __ATOMIC_RELAXED);
#endif
    }
  }
#if defined(__CUDA_ARCH__)
  __threadfence_system();
  ControlStore(out->generation, cache->generation);
#else
  __atomic_store_n(&out->generation, cache->generation, __ATOMIC_RELEASE);
#endif
}

}  // namespace stash::kernels

#endif  // STASH_KERNELS_MAPPED_GROUP_H_
