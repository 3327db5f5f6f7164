// client/mapped/live_table.h: the rank's list of its live stashes' tags in the control block.
#include "client/mapped/live_table.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>

namespace stash::client {
namespace {

namespace k = stash::kernels;

struct Block {
  Block() : bytes(new uint64_t[k::kControlBlockBytes / 8]()) {}
  uint8_t* data() { return reinterpret_cast<uint8_t*>(bytes.get()); }
  const k::LiveTable& table() {
    return *reinterpret_cast<const k::LiveTable*>(data() + k::kLiveTableOffset);
  }
  std::unique_ptr<uint64_t[]> bytes;
};

std::string Name(const k::LiveEntry& e) {
  return std::string(reinterpret_cast<const char*>(e.name), e.name_bytes);
}

TEST(LiveTableWriter, EntriesBeforeTheBlockArriveAreWrittenWhenItDoes) {
  LiveTableWriter writer;
  const int32_t a = writer.Add(7, 3, 1, "fc1", 1000, 1);
  ASSERT_GE(a, 0);
  Block block;
  writer.Attach(block.data(), k::kControlBlockBytes);
  EXPECT_EQ(block.table().magic, k::kLiveTableMagic);
  const k::LiveEntry& e = block.table().entries[a];
  EXPECT_EQ(e.ticket, 7u);
  EXPECT_EQ(e.tags, 3u | uint64_t{1} << 32);
  EXPECT_EQ(e.bytes, 1000u);
  EXPECT_EQ(e.pages, 1u);
  EXPECT_EQ(Name(e), "fc1");
  EXPECT_EQ(e.seq % 2, 0u);
  const int32_t b = writer.Add(8, 4, 0, "experts", 5000, 2);
  ASSERT_GE(b, 0);
  EXPECT_NE(a, b);
  EXPECT_EQ(block.table().entries[b].ticket, 8u);
  writer.Remove(a);
  EXPECT_EQ(block.table().entries[a].ticket, 0u);
  EXPECT_EQ(block.table().entries[a].seq % 2, 0u);
  // Mapped again (another mapping): the live entry is there, the removed one is not.
  Block again;
  writer.Attach(again.data(), k::kControlBlockBytes);
  EXPECT_EQ(again.table().entries[b].ticket, 8u);
  EXPECT_EQ(Name(again.table().entries[b]), "experts");
  EXPECT_EQ(again.table().entries[a].ticket, 0u);
}

TEST(LiveTableWriter, AFullTableTagsNoMoreAndNamesAreCutAtACharacter) {
  LiveTableWriter writer;
  Block block;
  writer.Attach(block.data(), k::kControlBlockBytes);
  // 79 ASCII bytes then a 2-byte character: it does not fit whole, so the name stops before it.
  const std::string name = std::string(79, 'x') + "\xc3\xa9";
  const int32_t first = writer.Add(1, 0, 0, name, 1, 1);
  ASSERT_GE(first, 0);
  EXPECT_EQ(block.table().entries[first].name_bytes, 79u);
  for (uint64_t t = 2; t <= k::kLiveEntries; ++t) ASSERT_GE(writer.Add(t, 0, 0, "", 1, 1), 0);
  EXPECT_EQ(writer.Add(9999, 0, 0, "", 1, 1), -1);
  writer.Remove(first);
  EXPECT_EQ(writer.Add(10000, 0, 0, "", 1, 1), first);
}

TEST(LiveTableWriter, ABlockTooSmallForATableGetsNoneWritten) {
  LiveTableWriter writer;
  Block block;
  writer.Attach(block.data(), 4096);
  EXPECT_GE(writer.Add(1, 0, 0, "a", 1, 1), 0);
  EXPECT_EQ(block.table().magic, 0u);
  EXPECT_EQ(block.table().entries[0].ticket, 0u);
}

}  // namespace
}  // namespace stash::client
