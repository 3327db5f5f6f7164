// The group depot's tags (stash/kernels/group_depot.h): claims and releases by compare-and-swap,
// the daemon's joins, take-backs and reclaims, and eight members claiming at once (run under
// TSan by the tsan preset).
#include "stash/kernels/group_depot.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <random>
#include <set>
#include <thread>
#include <vector>

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

}  // namespace
}  // namespace stash::kernels
