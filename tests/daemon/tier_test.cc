// daemon/tiers/tier.cc's chunk ring functions: taking a chunk out of the daemon-copy ring compacts
// the free slots without its page ids, returning it appends them, and at rest the free slots plus
// the taken chunks' pages are always a permutation of the tier's pages.
#include "daemon/tiers/tier.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <random>
#include <vector>

namespace stash::daemon {
namespace {

constexpr uint64_t kPage = 4096;

std::unique_ptr<Tier> MakeTier(uint64_t pages, uint64_t chunk_pages) {
  auto tier = Tier::Create("t", 0, kPage, pages, chunk_pages);
  EXPECT_TRUE(tier.ok()) << tier.status().message();
  return std::move(tier).value();
}

std::vector<uint64_t> FreeIds(Tier& tier) {
  MutexLock lock(&tier.mu());
  std::vector<uint64_t> out;
  for (uint64_t s = tier.ring().head; s < tier.ring().tail; ++s) {
    out.push_back(kernels::RingPageAt(tier.ring(), 0, s));
  }
  return out;
}

// A daemon-copy stash of `pages` pages, as the host executor makes one: ids at head, then head
// moves. Returns the ids.
std::vector<uint64_t> Stash(Tier& tier, uint64_t pages) {
  MutexLock lock(&tier.mu());
  std::vector<uint64_t> ids;
  for (uint64_t i = 0; i < pages; ++i)
    ids.push_back(kernels::RingPageAt(tier.ring(), tier.ring().head, i));
  tier.PublishAlloc(pages, pages * kPage);
  return ids;
}

void Release(Tier& tier, const std::vector<uint64_t>& ids) {
  MutexLock lock(&tier.mu());
  kernels::ReturnPages(tier.ring(), tier.ring().tail, ids.data(), 0, ids.size());
  tier.PublishFree(ids.size(), ids.size() * kPage);
}

TEST(TierChunks, TierIsCutIntoChunksWithAShorterLastOne) {
  auto tier = MakeTier(10, 4);
  EXPECT_EQ(tier->chunks(), 3u);
  EXPECT_EQ(tier->ChunkPages(0), 4u);
  EXPECT_EQ(tier->ChunkPages(2), 2u);
  EXPECT_EQ(tier->chunks_free(), 3u);
  EXPECT_EQ(tier->chunk_memory()->fd(0) >= 0, true);
}

TEST(TierChunks, TakeChunkRemovesExactlyItsPagesAndKeepsTheOrderOfTheRest) {
  auto tier = MakeTier(12, 4);
  {
    MutexLock lock(&tier->mu());
    tier->TakeChunks({1});
  }
  EXPECT_EQ(FreeIds(*tier), (std::vector<uint64_t>{0, 1, 2, 3, 8, 9, 10, 11}));
  EXPECT_EQ(tier->chunks_free(), 2u);
  EXPECT_EQ(tier->Snapshot().pages_used, 4u);
  EXPECT_TRUE(tier->RingIsPermutation());
  {
    MutexLock lock(&tier->mu());
    tier->ReturnChunk(1);
  }
  EXPECT_EQ(FreeIds(*tier), (std::vector<uint64_t>{0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7}));
  EXPECT_EQ(tier->chunks_free(), 3u);
  EXPECT_EQ(tier->Snapshot().pages_used, 0u);
  EXPECT_TRUE(tier->RingIsPermutation());
}

TEST(TierChunks, AChunkWithADaemonCopyStashInItIsNotWhollyFree) {
  auto tier = MakeTier(12, 4);
  const std::vector<uint64_t> ids = Stash(*tier, 2);  // pages 0 and 1: chunk 0
  {
    MutexLock lock(&tier->mu());
    EXPECT_EQ(tier->WhollyFreeChunks(), (std::vector<uint64_t>{1, 2}));
  }
  EXPECT_EQ(tier->chunks_free(), 2u);
  Release(*tier, ids);
  std::vector<bool> written;
  {
    MutexLock lock(&tier->mu());
    EXPECT_EQ(tier->WhollyFreeChunks(), (std::vector<uint64_t>{0, 1, 2}));
    tier->TakeChunks({0, 2}, &written);
  }
  // Chunk 0 held a stash since it entered the ring: whoever leases it must get fresh memory.
  EXPECT_EQ(written, (std::vector<bool>{true, false}));
  EXPECT_TRUE(tier->RingIsPermutation());
}

TEST(TierChunks, PermutedRingsStayPermutationsThroughTakesAndReturns) {
  const unsigned seed = std::random_device{}();
  std::printf("seed %u\n", seed);
  std::mt19937_64 rng(seed);
  auto tier = MakeTier(64, 8);
  std::vector<std::vector<uint64_t>> stashes;
  std::vector<uint64_t> taken;
  for (int round = 0; round < 2000; ++round) {
    const int op = static_cast<int>(rng() % 4);
    if (op == 0) {
      uint64_t free = 0;
      {
        MutexLock lock(&tier->mu());
        free = kernels::RingFree(tier->ring());
      }
      if (free > 0) stashes.push_back(Stash(*tier, 1 + rng() % std::min<uint64_t>(free, 5)));
    } else if (op == 1 && !stashes.empty()) {
      const size_t i = rng() % stashes.size();
      std::vector<uint64_t> ids = stashes[i];
      std::shuffle(ids.begin(), ids.end(), rng);  // pages come back in any order
      Release(*tier, ids);
      stashes.erase(stashes.begin() + static_cast<std::ptrdiff_t>(i));
    } else if (op == 2) {
      MutexLock lock(&tier->mu());
      const std::vector<uint64_t> free = tier->WhollyFreeChunks();
      if (!free.empty()) {
        const uint64_t c = free[rng() % free.size()];
        tier->TakeChunks({c});
        taken.push_back(c);
      }
    } else if (op == 3 && !taken.empty()) {
      const size_t i = rng() % taken.size();
      MutexLock lock(&tier->mu());
      tier->ReturnChunk(taken[i]);
      taken.erase(taken.begin() + static_cast<std::ptrdiff_t>(i));
    }
    // Free slots, live stashes' pages and taken chunks' pages: each page exactly once.
    std::vector<int> seen(64, 0);
    for (uint64_t id : FreeIds(*tier)) ++seen[id];
    for (const auto& ids : stashes) {
      for (uint64_t id : ids) ++seen[id];
    }
    for (uint64_t c : taken) {
      for (uint64_t p = 0; p < 8; ++p) ++seen[c * 8 + p];
    }
    ASSERT_EQ(std::count(seen.begin(), seen.end(), 1), 64) << "seed " << seed << " round " << round;
    // The per-chunk counts agree with a scan of the ring.
    std::vector<uint64_t> per_chunk(tier->chunks(), 0);
    for (uint64_t id : FreeIds(*tier)) ++per_chunk[id / 8];
    uint64_t wholly = 0;
    for (uint64_t c = 0; c < tier->chunks(); ++c) wholly += per_chunk[c] == 8 ? 1 : 0;
    ASSERT_EQ(tier->chunks_free(), wholly) << "seed " << seed << " round " << round;
  }
  // At rest (every stash released) the at-rest invariant holds with chunks still taken.
  for (const auto& ids : stashes) Release(*tier, ids);
  EXPECT_TRUE(tier->RingIsPermutation()) << "seed " << seed;
  EXPECT_EQ(tier->Snapshot().pages_used, taken.size() * 8);
}

}  // namespace
}  // namespace stash::daemon
