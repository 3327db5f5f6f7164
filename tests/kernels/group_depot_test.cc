// The group depot's tags (stash/kernels/group_depot.h): claims and releases by compare-and-swap,
// the daemon's joins, take-backs and reclaims, and eight members claiming at once (run under
// TSan by the tsan preset); a member's cache over it (group_cache.h) and the GPU member's board
// (mapped_group.h), as the host twins run them.
#include "stash/kernels/group_depot.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "stash/kernels/group_cache.h"
#include "stash/kernels/mapped_group.h"

namespace stash::kernels {
namespace {

// A depot in private memory: the layout the daemon writes into its memfd.
class Depot {
 public:
  Depot(uint64_t chunks, uint64_t chunk_pages) : chunk_pages_(chunk_pages) {
    const GroupLayout l = GroupLayoutFor(chunks * chunk_pages, chunks);
    bytes_.assign(l.block_bytes / 8, 0);
    auto* base = reinterpret_cast<uint8_t*>(bytes_.data());
    view_.header = reinterpret_cast<GroupHeader*>(base);
    view_.chunk_free = reinterpret_cast<uint32_t*>(base + l.chunk_free_offset);
    view_.chunk_state = reinterpret_cast<uint32_t*>(base + l.chunk_state_offset);
    view_.tags = reinterpret_cast<uint32_t*>(base + l.tags_offset);
    view_.pages = chunks * chunk_pages;
    view_.chunks = chunks;
    for (uint64_t c = 0; c < chunks; ++c) {
      refs_.push_back(GroupChunkRef{c, c * chunk_pages, chunk_pages});
    }
  }
  GroupView& view() { return view_; }
  const std::vector<GroupChunkRef>& refs() const { return refs_; }
  uint64_t chunk_pages() const { return chunk_pages_; }
  uint64_t Owned(uint32_t tag) const {
    uint64_t n = 0;
    for (uint64_t p = 0; p < view_.pages; ++p) n += view_.tags[p] == tag ? 1 : 0;
    return n;
  }

 private:
  uint64_t chunk_pages_;
  std::vector<uint64_t> bytes_;
  GroupView view_{};
  std::vector<GroupChunkRef> refs_;
};

TEST(GroupDepot, NothingIsClaimableBeforeTheDaemonJoinsAChunk) {
  Depot d(4, 8);
  uint64_t cursor = 0;
  std::vector<uint64_t> ids(32);
  EXPECT_EQ(ClaimPages(d.view(), d.refs().data(), 4, &cursor, 2, 32, ids.data()), 0u);
  JoinChunk(d.view(), d.chunk_pages(), 1, 8);
  EXPECT_EQ(ClaimPages(d.view(), d.refs().data(), 4, &cursor, 2, 32, ids.data()), 8u);
  for (uint64_t i = 0; i < 8; ++i) EXPECT_EQ(ids[i], 8 + i);
  EXPECT_EQ(d.Owned(2), 8u);
  EXPECT_EQ(d.view().header->claimed, 8u);
}

TEST(GroupDepot, ReleaseFreesOnlyTheOwnersPages) {
  Depot d(2, 4);
  JoinChunk(d.view(), 4, 0, 4);
  JoinChunk(d.view(), 4, 1, 3);  // a short last chunk: page 7 stays the daemon's
  uint64_t cursor = 0;
  std::vector<uint64_t> a(8), b(8);
  ASSERT_EQ(ClaimPages(d.view(), d.refs().data(), 2, &cursor, 2, 4, a.data()), 4u);
  uint64_t cursor_b = 0;
  ASSERT_EQ(ClaimPages(d.view(), d.refs().data(), 2, &cursor_b, 3, 8, b.data()), 3u);
  EXPECT_EQ(d.view().tags[7], kTagDaemon);
  // Member 3 names member 2's pages, and a page past the end: nothing moves.
  EXPECT_EQ(ReleasePages(d.view(), a.data(), 4, 3, 4), 0u);
  const uint64_t bad = 1000;
  EXPECT_EQ(ReleasePages(d.view(), &bad, 1, 3, 4), 0u);
  EXPECT_EQ(d.Owned(2), 4u);
  EXPECT_EQ(ReleasePages(d.view(), a.data(), 4, 2, 4), 4u);
  EXPECT_EQ(d.Owned(2), 0u);
  EXPECT_EQ(d.view().chunk_free[0], 4u);
  EXPECT_EQ(d.view().header->claimed, 3u);
  EXPECT_EQ(d.view().header->claimed_high_water, 7u);
}

TEST(GroupDepot, TakeChunkIsAllOrNothing) {
  Depot d(2, 4);
  JoinChunk(d.view(), 4, 0, 4);
  JoinChunk(d.view(), 4, 1, 4);
  uint64_t cursor = 0;
  uint64_t one = 0;
  ASSERT_EQ(ClaimPages(d.view(), d.refs().data(), 1, &cursor, 5, 1, &one), 1u);
  EXPECT_FALSE(TakeChunk(d.view(), 4, 0, 4));  // a page is owned: nothing taken
  for (uint64_t p = 0; p < 4; ++p) EXPECT_NE(d.view().tags[p], kTagDaemon);
  EXPECT_EQ(d.view().chunk_state[0], kGroupChunkIn);
  EXPECT_TRUE(TakeChunk(d.view(), 4, 1, 4));
  EXPECT_EQ(d.view().chunk_state[1], kGroupChunkLeaving);
  // A leaving chunk is never claimed again.
  std::vector<uint64_t> ids(8);
  cursor = 0;
  EXPECT_EQ(ClaimPages(d.view(), d.refs().data(), 2, &cursor, 6, 8, ids.data()), 3u);
  for (uint64_t i = 0; i < 3; ++i) EXPECT_LT(ids[i], 4u);
}

TEST(GroupDepot, ReclaimFreesExactlyTheDeadMembersPagesAndGarbage) {
  Depot d(3, 4);
  for (uint64_t c = 0; c < 3; ++c) JoinChunk(d.view(), 4, c, 4);
  uint64_t ca = 0, cb = 0;
  std::vector<uint64_t> ids(12);
  ASSERT_EQ(ClaimPages(d.view(), d.refs().data(), 3, &ca, 2, 5, ids.data()), 5u);
  ASSERT_EQ(ClaimPages(d.view(), d.refs().data(), 3, &cb, 3, 4, ids.data()), 4u);
  d.view().tags[11] = 0xdeadbeef;  // garbage a member wrote
  const uint64_t freed =
      ReclaimTags(d.view(), 4, [](uint32_t tag) { return tag == 2 || tag == 0xdeadbeef; });
  EXPECT_EQ(freed, 6u);
  EXPECT_EQ(d.Owned(2), 0u);
  EXPECT_EQ(d.Owned(3), 4u);
  EXPECT_EQ(d.view().tags[11], kTagFree);
}

// Eight members claim and release random amounts at once: no page is ever owned by two, every
// page comes back, and the counters add up. TSan checks the atomics.
TEST(GroupDepot, EightMembersNeverShareAPage) {
  constexpr uint64_t kChunks = 16, kChunkPages = 32, kMembers = 8;
  Depot d(kChunks, kChunkPages);
  for (uint64_t c = 0; c < kChunks; ++c) JoinChunk(d.view(), kChunkPages, c, kChunkPages);
  std::vector<std::atomic<uint32_t>> owner(kChunks * kChunkPages);
  for (auto& o : owner) o.store(0);
  std::atomic<uint64_t> conflicts{0};
  const uint32_t seed = std::random_device{}();
  std::printf("seed %u\n", seed);
  std::vector<std::thread> threads;
  for (uint32_t m = 0; m < kMembers; ++m) {
    threads.emplace_back([&, m] {
      const uint32_t me = kFirstMemberTag + m;
      std::mt19937 rng(seed + m);
      uint64_t cursor = m * kChunks / kMembers;
      std::vector<uint64_t> held;
      std::vector<uint64_t> ids(kChunkPages * 4);
      for (int round = 0; round < 2000; ++round) {
        const uint64_t want = 1 + rng() % (kChunkPages * 2);
        const uint64_t got =
            ClaimPages(d.view(), d.refs().data(), kChunks, &cursor, me, want, ids.data());
        for (uint64_t i = 0; i < got; ++i) {
          uint32_t none = 0;
          if (!owner[ids[i]].compare_exchange_strong(none, me)) conflicts.fetch_add(1);
          held.push_back(ids[i]);
        }
        if (held.size() > kChunkPages * 2 || rng() % 2 == 0) {
          std::shuffle(held.begin(), held.end(), rng);
          const uint64_t n = held.size() / 2 + 1;
          const uint64_t first = held.size() - std::min<uint64_t>(n, held.size());
          for (uint64_t i = first; i < held.size(); ++i) owner[held[i]].store(0);
          EXPECT_EQ(
              ReleasePages(d.view(), held.data() + first, held.size() - first, me, kChunkPages),
              held.size() - first);
          held.resize(first);
        }
      }
      for (uint64_t id : held) owner[id].store(0);
      EXPECT_EQ(ReleasePages(d.view(), held.data(), held.size(), me, kChunkPages), held.size());
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(conflicts.load(), 0u);
  for (uint32_t m = 0; m < kMembers; ++m) EXPECT_EQ(d.Owned(kFirstMemberTag + m), 0u);
  EXPECT_EQ(d.view().header->claimed, 0u);
  EXPECT_EQ(d.view().header->claims, d.view().header->releases);
  for (uint64_t c = 0; c < kChunks; ++c) EXPECT_EQ(d.view().chunk_free[c], kChunkPages);
}

// A member's rings over the depot: a device tier over chunks 0-1 and a host tier over chunk 2,
// whose range starts at group page 2 * chunk_pages (ring id 0 there).
class Member {
 public:
  Member(Depot& d, uint32_t tag) : d_(d), tag_(tag) {
    for (uint32_t t = 0; t < kLeaseTiers; ++t) {
      ids_[t].assign(2 * d.chunk_pages(), ~uint64_t{0});
      rings_[t] = PageRing{ids_[t].data(), ids_[t].size(), 0, 0};
    }
  }
  GroupCacheTier Tier(uint32_t t) {
    GroupCacheTier tier{};
    tier.ring = &rings_[t];
    if (t == kLeasePeer) return tier;
    tier.depot = &d_.view();
    tier.refs = d_.refs().data() + (t == kLeaseDevice ? 0 : 2);
    tier.refs_count = t == kLeaseDevice ? 2 : 1;
    tier.cursor = &cursor_[t];
    tier.first_page = t == kLeaseDevice ? 0 : 2 * d_.chunk_pages();
    return tier;
  }
  GroupRefill Refill(uint64_t pages, bool allow_host = true) {
    GroupCacheTier tiers[kLeaseTiers] = {Tier(0), Tier(1), Tier(2)};
    return RefillForStash(tiers, tag_, pages, allow_host, d_.chunk_pages());
  }
  uint64_t Flush(uint32_t t) { return FlushRing(Tier(t), tag_, d_.chunk_pages()); }
  PageRing& ring(uint32_t t) { return rings_[t]; }

 private:
  Depot& d_;
  uint32_t tag_;
  std::vector<uint64_t> ids_[kLeaseTiers];
  PageRing rings_[kLeaseTiers];
  uint64_t cursor_[kLeaseTiers] = {};
};

TEST(GroupCache, AStashTakesItsPagesFromTheFirstTierThatHasThemAndTheRestGoesBack) {
  Depot d(3, 8);
  for (uint64_t c = 0; c < 3; ++c) JoinChunk(d.view(), d.chunk_pages(), c, 8);
  Member a(d, 2), b(d, 3);
  // 5 pages: the device tier has them.
  GroupRefill r = a.Refill(5);
  EXPECT_EQ(r.claimed[kLeaseDevice], 5u);
  EXPECT_EQ(r.device_missed, 0u);
  EXPECT_EQ(RingFree(a.ring(kLeaseDevice)), 5u);
  EXPECT_EQ(d.Owned(2), 5u);
  // B wants 12: the device depot has 11 left, so B claims them, gives them back, counts the
  // depot dry, and takes 8 of the host tier's... not enough either: all back.
  r = b.Refill(12);
  EXPECT_EQ(r.claimed[kLeaseDevice], 11u);
  EXPECT_EQ(r.flushed[kLeaseDevice], 11u);
  EXPECT_EQ(r.device_missed, 1u);
  EXPECT_EQ(r.claimed[kLeaseHost], 8u);
  EXPECT_EQ(r.flushed[kLeaseHost], 8u);
  EXPECT_EQ(d.Owned(3), 0u);
  EXPECT_EQ(d.view().header->dry, 1u);
  EXPECT_EQ(d.view().header->dry_pages, 1u);
  // 6 pages: the device has 11 free, it takes them there.
  r = b.Refill(6);
  EXPECT_EQ(r.claimed[kLeaseDevice], 6u);
  // A flushes its cache: its pages are free again, B can take the rest of the device depot.
  EXPECT_EQ(a.Flush(kLeaseDevice), 5u);
  EXPECT_EQ(d.Owned(2), 0u);
  EXPECT_EQ(RingFree(a.ring(kLeaseDevice)), 0u);
  r = b.Refill(16);
  EXPECT_EQ(r.claimed[kLeaseDevice], 10u);
  EXPECT_EQ(d.Owned(3), 16u);
}

TEST(GroupCache, AHostTierRingHoldsIdsFromItsRangesFirstPage) {
  Depot d(3, 8);
  for (uint64_t c = 0; c < 3; ++c) JoinChunk(d.view(), d.chunk_pages(), c, 8);
  Member a(d, 2), b(d, 3);
  ASSERT_EQ(a.Refill(16).claimed[kLeaseDevice], 16u);  // the device depot is A's
  const GroupRefill r = b.Refill(4);
  EXPECT_EQ(r.device_missed, 4u);
  EXPECT_EQ(r.claimed[kLeaseHost], 4u);
  for (uint64_t i = 0; i < 4; ++i) {
    const uint64_t id = RingPageAt(b.ring(kLeaseHost), b.ring(kLeaseHost).head, i);
    EXPECT_LT(id, 8u) << "ring ids are relative to the host range";
    EXPECT_EQ(d.view().tags[16 + id], 3u);
  }
  EXPECT_EQ(b.Flush(kLeaseHost), 4u);
  EXPECT_EQ(d.Owned(3), 0u);
  // No host tier allowed: nothing is claimed there.
  EXPECT_EQ(b.Refill(4, /*allow_host=*/false).claimed[kLeaseHost], 0u);
  EXPECT_EQ(d.Owned(3), 0u);
}

TEST(GroupCache, ACountNoTierTakesClaimsNothing) {
  EXPECT_EQ(StashPagesNeeded(-1, 1, 10, 4096, 4096), UINT64_MAX);
  EXPECT_EQ(StashPagesNeeded(11, 1, 10, 4096, 4096), UINT64_MAX);
  EXPECT_EQ(StashPagesNeeded(40, 32, 10, 4096, 4096), 2u) << "ceil(40 / 32) rows";
  EXPECT_EQ(StashPagesNeeded(0, 1, 10, 4096, 4096), 0u);
  Depot d(3, 8);
  JoinChunk(d.view(), d.chunk_pages(), 0, 8);
  Member a(d, 2);
  const GroupRefill r = a.Refill(UINT64_MAX);
  EXPECT_EQ(r.claimed[kLeaseDevice] + r.claimed[kLeaseHost] + r.device_missed, 0u);
  EXPECT_EQ(d.Owned(2), 0u);
}

// A GPU member's board (host-written) and cache (the kernels'), in host memory here.
struct Board {
  explicit Board(uint64_t capacity)
      : words(GroupBoardBytes(capacity) / 8, 0),
        header(reinterpret_cast<MappedGroupHeader*>(words.data())) {
    header->refs_capacity = capacity;
  }
  std::vector<uint64_t> words;
  MappedGroupHeader* header;
};

TEST(MappedGroup, TheCacheCopiesAWholeBoardOnlyAndClampsItsRefs) {
  Board board(4), cache(2);
  EXPECT_FALSE(SyncMappedGroup(board.header, cache.header)) << "generation 0: no group";
  board.header->tag = 7;
  board.header->chunk_pages = 8;
  board.header->refs_first[kLeaseHost] = 1;
  board.header->refs_count[kLeaseDevice] = 1;
  board.header->refs_count[kLeaseHost] = 3;  // past the cache's room: clamped
  board.header->first_page[kLeaseHost] = 64;
  GroupRefs(board.header)[0] = GroupChunkRef{0, 0, 8};
  GroupRefs(board.header)[1] = GroupChunkRef{8, 64, 8};
  board.header->generation = 3;  // odd: the host is writing
  EXPECT_FALSE(SyncMappedGroup(board.header, cache.header));
  EXPECT_EQ(cache.header->tag, 0u);
  board.header->generation = 4;
  ASSERT_TRUE(SyncMappedGroup(board.header, cache.header));
  EXPECT_EQ(cache.header->generation, 4u);
  EXPECT_EQ(cache.header->tag, 7u);
  EXPECT_EQ(cache.header->refs_capacity, 2u) << "the cache keeps its own room";
  EXPECT_EQ(cache.header->refs_count[kLeaseDevice], 1u);
  EXPECT_EQ(cache.header->refs_count[kLeaseHost], 1u);
  EXPECT_EQ(GroupRefs(cache.header)[1].first_page, 64u);
  EXPECT_EQ(cache.header->first_page[kLeaseHost], 64u);
  // The cursors are the cache's: a new board leaves them.
  cache.header->cursor[kLeaseDevice] = 5;
  board.header->tag = 9;
  board.header->generation = 6;
  ASSERT_TRUE(SyncMappedGroup(board.header, cache.header));
  EXPECT_EQ(cache.header->tag, 9u);
  EXPECT_EQ(cache.header->cursor[kLeaseDevice], 5u);
}

}  // namespace
}  // namespace stash::kernels
