// A group member's page cache over its group's depot (docs/design.md, "Groups (the data path)"):
// the rule both mapped copiers follow, the host's Copier on its thread and the GPU's plan and
// publish kernels on the trainer's stream, so there is one of it.
//
// A member keeps its private rings (paging.h's PageRing, one per lease tier) as a cache of pages
// its tag owns in the depot (group_depot.h). Before a stash is planned, each tier the plan would
// try is topped up from the depot, in the plan's order, until one holds the pages; a tier that
// could not gets back at once what it claimed (the others may need it). After a stash's pages
// come back (a reload, a release, an overflow) the ring's free pages go back to the depot: the
// cache mark is 0, which is daemon-copy's page-by-page sharing.
#ifndef STASH_KERNELS_GROUP_CACHE_H_
#define STASH_KERNELS_GROUP_CACHE_H_

#include <cstdint>

#include "stash/kernels/group_depot.h"
#include "stash/kernels/host_device.h"
#include "stash/kernels/lease_control.h"
#include "stash/kernels/paging.h"

namespace stash::kernels {

// The pages a stash of raw count `count` needs (paging.h's PlanStashInOrder's rule); UINT64_MAX
// for a count no tier can take (negative, or more rows than max_rows): nothing is claimed for it.
STASH_HOST_DEVICE uint64_t StashPagesNeeded(int64_t count, uint32_t divisor, uint64_t max_rows,
                                            uint64_t row_bytes, uint64_t page_bytes) {
  if (count < 0) return UINT64_MAX;
  const uint64_t d = divisor == 0 ? 1u : divisor;
  const uint64_t rows = (static_cast<uint64_t>(count) + d - 1) / d;
  if (rows > max_rows) return UINT64_MAX;
  return PagesFor(rows * row_bytes, page_bytes);
}

// One lease tier of a member as its cache sees it. depot null = the tier takes nothing from a
// depot (no group, or a tier this member skips).
struct GroupCacheTier {
  GroupView* depot;
  const GroupChunkRef* refs;  // the chunks of this tier the member has mapped
  uint64_t refs_count;
  uint64_t* cursor;     // where its next claim starts
  PageRing* ring;       // the member's ring of this tier (null: no such tier)
  uint64_t first_page;  // the group page of the ring's page id 0 (its range's first page)
};

// Claims up to `want` pages for `me` into `ring` at its tail (no more than it has room for).
// Returns how many.
STASH_HOST_DEVICE uint64_t RefillRing(const GroupCacheTier& t, uint32_t me, uint64_t want) {
  if (t.depot == nullptr || t.ring == nullptr || t.refs_count == 0 || want == 0) return 0;
  PageRing& ring = *t.ring;
  const uint64_t room = ring.capacity - RingFree(ring);
  if (want > room) want = room;
  struct ToRing {
    PageRing* ring;
    uint64_t tail;
    uint64_t first_page;
    STASH_HOST_DEVICE void operator()(uint64_t i, uint64_t page) const {
      RingReturnAt(*ring, tail, i, page - first_page);
    }
  };
  // The refs name only chunks inside the ring's range (their owner checked when it added them).
  const uint64_t got = ClaimPagesTo(*t.depot, t.refs, t.refs_count, t.cursor, me, want,
                                    ToRing{t.ring, ring.tail, t.first_page});
  ring.tail += got;
  return got;
}

// Gives every free page of the tier's ring (its cached pages) back to the depot: the ring is
// empty after. Returns how many left it (pages whose tag was not `me` leave the ring too: they
// were never ours).
STASH_HOST_DEVICE uint64_t FlushRing(const GroupCacheTier& t, uint32_t me, uint64_t chunk_pages) {
  if (t.depot == nullptr || t.ring == nullptr) return 0;
  PageRing& ring = *t.ring;
  const uint64_t n = RingFree(ring);
  if (n == 0) return 0;
  struct FromRing {
    const PageRing* ring;
    uint64_t head;
    uint64_t first_page;
    STASH_HOST_DEVICE uint64_t operator()(uint64_t i) const {
      return RingPageAt(*ring, head, i) + first_page;
    }
  };
  ReleasePagesFrom(*t.depot, n, me, chunk_pages, FromRing{t.ring, ring.head, t.first_page});
  ring.head = ring.tail;
  return n;
}

// What RefillForStash did, per lease tier: pages claimed into the ring and pages flushed out of
// it (the caller keeps its books: pages leased, the ring's published tail), and the pages the
// own device's depot could not give (0: not dry).
struct GroupRefill {
  uint64_t claimed[kLeaseTiers];
  uint64_t flushed[kLeaseTiers];
  uint64_t device_missed;
};

// Tops up the tiers a stash of `pages` pages would try, in order (the host tier only when
// `allow_host`), until one holds them; a tier that fell short gives back what it claimed. When
// the own device's tier fell short, the depot's dry counters count it, so the daemon grows the
// group. pages == UINT64_MAX (a count no tier takes) claims nothing.
STASH_HOST_DEVICE GroupRefill RefillForStash(const GroupCacheTier* tiers, uint32_t me,
                                             uint64_t pages, bool allow_host,
                                             uint64_t chunk_pages) {
  GroupRefill r{};
  if (pages == UINT64_MAX) return r;
  STASH_UNROLL
  for (uint32_t t = 0; t < kLeaseTiers; ++t) {
    if (t == kLeaseHost && !allow_host) break;
    const GroupCacheTier& tier = tiers[t];
    if (tier.ring == nullptr) continue;
    const uint64_t free = RingFree(*tier.ring);
    if (free >= pages) return r;
    r.claimed[t] = RefillRing(tier, me, pages - free);
    if (free + r.claimed[t] >= pages) return r;
    r.flushed[t] = FlushRing(tier, me, chunk_pages);
    if (t == kLeaseDevice && tier.depot != nullptr) {
      r.device_missed = pages - free - r.claimed[t];
      CounterAdd(tier.depot->header->dry, 1);
      CounterAdd(tier.depot->header->dry_pages, r.device_missed);
    }
  }
  return r;
}

}  // namespace stash::kernels

#endif  // STASH_KERNELS_GROUP_CACHE_H_
