#include "common/range_allocator.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace stash {
namespace {

TEST(RangeAllocator, AllocatesFirstFitAndRefusesWhatDoesNotFit) {
  RangeAllocator a(10);
  EXPECT_EQ(a.Allocate(4), 0u);
  EXPECT_EQ(a.Allocate(4), 4u);
  EXPECT_FALSE(a.Allocate(3).has_value());
  EXPECT_EQ(a.Allocate(2), 8u);
  EXPECT_EQ(a.free(), 0u);
  EXPECT_FALSE(a.Allocate(1).has_value());
  EXPECT_FALSE(a.Allocate(0).has_value());
}

TEST(RangeAllocator, FreedNeighboursCoalesceIntoOneRange) {
  RangeAllocator a(12);
  const uint64_t x = *a.Allocate(4), y = *a.Allocate(4), z = *a.Allocate(4);
  a.Free(x, 4);
  a.Free(z, 4);
  EXPECT_FALSE(a.Allocate(8).has_value());  // two holes of 4, not adjacent
  a.Free(y, 4);
  EXPECT_EQ(a.Allocate(12), 0u);  // all three merged
}

TEST(RangeAllocator, GivingBackTheUnusedTailOfAReservationKeepsTheHead) {
  RangeAllocator a(8);
  const uint64_t r = *a.Allocate(8);
  a.Free(r + 3, 5);  // the stash used 3 of its 8
  EXPECT_EQ(a.free(), 5u);
  EXPECT_EQ(a.Allocate(5), 3u);
}

TEST(RangeAllocator, RandomWorkloadNeverHandsOutOverlappingRanges) {
  constexpr uint64_t kCapacity = 1000;
  RangeAllocator a(kCapacity);
  std::vector<int> owner(kCapacity, -1);
  std::vector<std::pair<uint64_t, uint64_t>> live;
  std::mt19937_64 rng(7);
  for (int step = 0; step < 20000; ++step) {
    if (live.empty() || rng() % 2 == 0) {
      const uint64_t length = 1 + rng() % 40;
      auto got = a.Allocate(length);
      if (!got) continue;
      ASSERT_LE(*got + length, kCapacity);
      for (uint64_t i = *got; i < *got + length; ++i) {
        ASSERT_EQ(owner[i], -1) << "unit " << i << " handed out twice";
        owner[i] = step;
      }
      live.emplace_back(*got, length);
    } else {
      const size_t k = rng() % live.size();
      for (uint64_t i = live[k].first; i < live[k].first + live[k].second; ++i) owner[i] = -1;
      a.Free(live[k].first, live[k].second);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
    }
  }
  uint64_t used = 0;
  for (auto& [offset, length] : live) used += length;
  EXPECT_EQ(a.free(), kCapacity - used);
  for (auto& [offset, length] : live) a.Free(offset, length);
  EXPECT_EQ(a.Allocate(kCapacity), 0u);
}

}  // namespace
}  // namespace stash
