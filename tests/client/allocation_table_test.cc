// The cuda backend's allocation table (client/memory/allocation_table.h): what the client library
// registers once, finds again, and unregisters when the memory was freed and reused.
#include "client/memory/allocation_table.h"

#include <gtest/gtest.h>

namespace stash::client {
namespace {

AllocationTable::Entry Entry(uint64_t memory_id, uint64_t buffer_id, uint64_t bytes) {
  return AllocationTable::Entry{memory_id, buffer_id, bytes, "handle"};
}

const AllocationTable::Entry* FindOrNull(const AllocationTable& table, uint64_t address,
                                         uint64_t buffer_id) {
  uint64_t base = 0;
  return table.FindContaining(address, buffer_id, &base);
}

TEST(AllocationTable, AKnownAllocationIsFoundFromAnyAddressInItWithItsBufferId) {
  AllocationTable table;
  uint64_t base = 0;
  EXPECT_EQ(table.FindContaining(0x1000, 7, &base), nullptr);
  EXPECT_TRUE(table.Insert(0x1000, Entry(11, 7, 0x100)).empty());
  const AllocationTable::Entry* found = table.FindContaining(0x1080, 7, &base);
  ASSERT_NE(found, nullptr);
  EXPECT_EQ(found->memory_id, 11u);
  EXPECT_EQ(base, 0x1000u);
  EXPECT_NE(table.FindContaining(0x1000, 7, &base), nullptr);
  // Another buffer id at the same addresses is another allocation (the first was freed).
  EXPECT_EQ(table.FindContaining(0x1080, 8, &base), nullptr);
  // Outside the range: not this allocation.
  EXPECT_EQ(table.FindContaining(0x0fff, 7, &base), nullptr);
  EXPECT_EQ(table.FindContaining(0x1100, 7, &base), nullptr);
}

TEST(AllocationTable, AnAllocationAtAFreedOnesBaseReplacesIt) {
  AllocationTable table;
  table.Insert(0x1000, Entry(11, 7, 0x100));
  EXPECT_EQ(table.Insert(0x1000, Entry(12, 8, 0x100)), std::vector<uint64_t>{11});
  EXPECT_EQ(table.size(), 1u);
  EXPECT_EQ(FindOrNull(table, 0x1000, 8)->memory_id, 12u);
}

TEST(AllocationTable, AnAllocationOverlappingFreedOnesUnregistersEachOfThem) {
  AllocationTable table;
  table.Insert(0x1000, Entry(1, 1, 0x100));  // [0x1000, 0x1100)
  table.Insert(0x1100, Entry(2, 2, 0x100));  // [0x1100, 0x1200)
  table.Insert(0x1200, Entry(3, 3, 0x100));  // [0x1200, 0x1300)
  table.Insert(0x2000, Entry(4, 4, 0x100));  // far away: untouched
  // Starts inside the first one and ends inside the third.
  EXPECT_EQ(table.Insert(0x1080, Entry(5, 5, 0x200)), (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_EQ(table.size(), 2u);
  EXPECT_NE(FindOrNull(table, 0x2000, 4), nullptr);
  // Ranges that only touch do not overlap.
  EXPECT_TRUE(table.Insert(0x1280, Entry(6, 6, 0x80)).empty());
  EXPECT_TRUE(table.Insert(0x1000, Entry(7, 7, 0x80)).empty());
}

TEST(AllocationTable, RemoveFindsTheAllocationHoldingAnInteriorPointer) {
  AllocationTable table;
  table.Insert(0x1000, Entry(11, 7, 0x100));
  EXPECT_EQ(table.Remove(0x0fff), 0u);
  EXPECT_EQ(table.Remove(0x1100), 0u);  // one past the end
  EXPECT_EQ(table.Remove(0x10ff), 11u);
  EXPECT_EQ(table.Remove(0x1000), 0u);  // already gone
  EXPECT_EQ(table.size(), 0u);
}

TEST(AllocationTable, ClearHandsBackEveryId) {
  AllocationTable table;
  table.Insert(0x1000, Entry(1, 1, 0x100));
  table.Insert(0x3000, Entry(3, 3, 0x100));
  EXPECT_EQ(table.Clear(), (std::vector<uint64_t>{1, 3}));
  EXPECT_EQ(table.size(), 0u);
  EXPECT_EQ(FindOrNull(table, 0x1000, 1), nullptr);
}

}  // namespace
}  // namespace stash::client
