// Lending a GPU pool's chunks (stash/kernels/daemon_paging.h: TakeChunksLaunch and
// ReturnChunkLaunch, the bodies of the one-thread kernels daemon/cuda/cuda_chunk_lender.cc
// launches) against an independent model: random ring states (free ids in a random order, the rest
// held by stashes or out of the ring), random asks. A chunk is taken exactly when it was asked and
// every one of its pages is free; the other free ids keep their order; a returned chunk's ids
// come back at the tail; the ring never holds an id twice.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "stash/kernels/daemon_paging.h"

namespace stash::kernels {
namespace {

struct Case {
  std::vector<uint64_t> ids;  // the ring's storage
  PageRing ring{};
  std::vector<uint32_t> flags;
  std::vector<uint64_t> counts;
  ChunkRingLaunch launch;
};

// A ring of `pages` ids in chunks of `chunk_pages`, whose free slots start at `head` (wrapping)
// and hold `free_ids` in that order.
Case MakeCase(uint64_t pages, uint64_t chunk_pages, uint64_t head,
              const std::vector<uint64_t>& free_ids) {
  Case c;
  c.ids.assign(pages, ~uint64_t{0});
  c.ring = PageRing{c.ids.data(), pages, head, head + free_ids.size()};
  for (uint64_t i = 0; i < free_ids.size(); ++i) RingReturnAt(c.ring, head, i, free_ids[i]);
  const uint64_t chunks = (pages + chunk_pages - 1) / chunk_pages;
  c.flags.assign(chunks, 0);
  c.counts.assign(chunks, 0);
  c.launch.d_ring = &c.ring;
  c.launch.pages = pages;
  c.launch.chunk_pages = chunk_pages;
  c.launch.chunks = chunks;
  c.launch.d_flags = c.flags.data();
  c.launch.d_counts = c.counts.data();
  return c;
}

std::vector<uint64_t> FreeIds(const PageRing& ring) {
  std::vector<uint64_t> out;
  for (uint64_t i = 0; i < RingFree(ring); ++i) out.push_back(RingPageAt(ring, ring.head, i));
  return out;
}

TEST(DaemonChunkRing, TakesExactlyTheAskedChunksWhoseEveryPageIsFreeAndKeepsTheOrder) {
  std::mt19937_64 random(20261205);
  for (int round = 0; round < 2000; ++round) {
    const uint64_t chunk_pages = 1 + random() % 8;
    const uint64_t pages = chunk_pages + random() % 64;  // the last chunk may be short
    std::vector<uint64_t> all(pages);
    for (uint64_t i = 0; i < pages; ++i) all[i] = i;
    std::shuffle(all.begin(), all.end(), random);
    // Free ids: a random subset in a random order; whole chunks are often free together.
    std::vector<uint64_t> free_ids;
    const uint64_t held_every = 1 + random() % 6;
    for (uint64_t id : all) {
      if (random() % held_every != 0 || held_every == 1) free_ids.push_back(id);
    }
    Case c = MakeCase(pages, chunk_pages, random() % (3 * pages), free_ids);
    const uint64_t chunks = c.launch.chunks;
    std::vector<bool> asked(chunks);
    for (uint64_t k = 0; k < chunks; ++k) {
      asked[k] = random() % 2 == 0;
      if (asked[k]) c.flags[k] = kTakeAsked;
    }
    const uint64_t head = c.ring.head;
    TakeChunksLaunch(c.launch);

    // The model: chunk k is taken iff asked and all PagesOfChunk(k) of its ids are free.
    std::vector<uint64_t> free_in(chunks, 0);
    for (uint64_t id : free_ids) ++free_in[id / chunk_pages];
    std::vector<uint64_t> expect_left;
    for (uint64_t id : free_ids) {
      const uint64_t k = id / chunk_pages;
      if (!(asked[k] && free_in[k] == PagesOfChunk(c.launch, k))) expect_left.push_back(id);
    }
    for (uint64_t k = 0; k < chunks; ++k) {
      const bool taken = asked[k] && free_in[k] == PagesOfChunk(c.launch, k);
      EXPECT_EQ(c.flags[k], taken      ? kTakeDone
                            : asked[k] ? kTakeAsked
                                       : 0u)
          << "round " << round << " chunk " << k;
    }
    EXPECT_EQ(c.ring.head, head);
    EXPECT_EQ(FreeIds(c.ring), expect_left) << "round " << round;

    // Every taken chunk goes back at the tail, its ids in order; no id is ever free twice.
    for (uint64_t k = 0; k < chunks; ++k) {
      if (c.flags[k] != kTakeDone) continue;
      ChunkRingLaunch back = c.launch;
      back.chunk = k;
      ReturnChunkLaunch(back);
      for (uint64_t p = 0; p < PagesOfChunk(c.launch, k); ++p) {
        expect_left.push_back(k * chunk_pages + p);
      }
    }
    const std::vector<uint64_t> after = FreeIds(c.ring);
    EXPECT_EQ(after, expect_left) << "round " << round;
    EXPECT_EQ(std::set<uint64_t>(after.begin(), after.end()).size(), after.size());
  }
}

TEST(DaemonChunkRing, NothingAskedOrNothingWhollyFreeLeavesTheRingAlone) {
  // 2 chunks of 4 pages; page 5 is held by a stash.
  Case c = MakeCase(8, 4, 6, {7, 0, 3, 1, 2, 4, 6});
  TakeChunksLaunch(c.launch);
  EXPECT_EQ(FreeIds(c.ring), (std::vector<uint64_t>{7, 0, 3, 1, 2, 4, 6}));
  c.flags[1] = kTakeAsked;
  TakeChunksLaunch(c.launch);
  EXPECT_EQ(c.flags[1], kTakeAsked) << "a stash holds page 5";
  EXPECT_EQ(FreeIds(c.ring), (std::vector<uint64_t>{7, 0, 3, 1, 2, 4, 6}));
  c.flags[0] = kTakeAsked;
  TakeChunksLaunch(c.launch);
  EXPECT_EQ(c.flags[0], kTakeDone);
  EXPECT_EQ(FreeIds(c.ring), (std::vector<uint64_t>{7, 4, 6}));
}

}  // namespace
}  // namespace stash::kernels
