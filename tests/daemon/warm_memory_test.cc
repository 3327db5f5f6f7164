// Warm memory, the daemon's parts (daemon/tiers/chunk_memory.h, daemon/tiers/warmer.h; issue 24):
// chunks populated without a byte changed and counted warm; the warmer's start-up pass; huge pages;
// a hugetlb renewal that cannot get pages keeps the old memory.
#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/shm.h"
#include "daemon/tiers/chunk_memory.h"
#include "daemon/tiers/tier.h"
#include "daemon/tiers/warmer.h"
#include "tests/huge_page_pool.h"

namespace stash::daemon {
namespace {

constexpr uint64_t kMiB = 1 << 20;

// How many pages of [p, p + bytes) are resident (mincore).
uint64_t ResidentPages(const uint8_t* p, uint64_t bytes) {
  const auto page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> in((bytes + page - 1) / page);
  EXPECT_EQ(mincore(const_cast<uint8_t*>(p), bytes, in.data()), 0) << strerror(errno);
  uint64_t n = 0;
  for (unsigned char c : in) n += c & 1;
  return n;
}

TEST(ChunkMemory, PopulateMakesEveryPageResidentAndChangesNoByte) {
  auto m = ChunkMemory::Create("warm-test", 4 * kMiB, kMiB).value();
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  EXPECT_EQ(m->bytes_warm(), 0u);
  EXPECT_EQ(ResidentPages(m->base(), 4 * kMiB), 0u);
  // A copy already wrote some of chunk 1.
  uint8_t* chunk1 = m->base() + kMiB;
  for (uint64_t i = 0; i < 8 * page; ++i) chunk1[i] = static_cast<uint8_t>(i * 13 + 1);
  ASSERT_TRUE(m->Populate(1).ok());
  EXPECT_EQ(ResidentPages(chunk1, kMiB), kMiB / page);
  EXPECT_EQ(ResidentPages(m->base(), kMiB), 0u) << "only the chunk asked for";
  for (uint64_t i = 0; i < 8 * page; ++i) ASSERT_EQ(chunk1[i], static_cast<uint8_t>(i * 13 + 1));
  for (uint64_t i = 8 * page; i < kMiB; i += 511) ASSERT_EQ(chunk1[i], 0);
  EXPECT_EQ(m->bytes_warm(), kMiB);
  ASSERT_TRUE(m->Populate(1).ok());  // twice counts once
  EXPECT_EQ(m->bytes_warm(), kMiB);
  // Fresh memory is cold again (and zero).
  ASSERT_TRUE(m->Renew(1).ok());
  EXPECT_EQ(m->bytes_warm(), 0u);
  EXPECT_EQ(chunk1[0], 0);
}

TEST(ChunkMemory, HugePagesAskedForOnlyWhereAChunkCanHoldThem) {
  ChunkMemoryOptions huge;
  huge.transparent_huge = true;
  auto whole = ChunkMemory::Create("thp", 8 * kMiB, 4 * kMiB, huge).value();
  EXPECT_EQ(whole->page_kind(), PageKind::kTransparentHuge);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(whole->base()) % kHugePageBytes, 0u);
  auto odd = ChunkMemory::Create("thp-odd", 8 * kMiB, kMiB, huge).value();
  EXPECT_EQ(odd->page_kind(), PageKind::kSmall);
  auto plain = ChunkMemory::Create("plain", 8 * kMiB, 4 * kMiB).value();
  EXPECT_EQ(plain->page_kind(), PageKind::kSmall);
  EXPECT_STREQ(PageKindName(PageKind::kTransparentHuge), "transparent huge pages");
}

TEST(Warmer, TheStartUpPassWarmsEveryRegionOnce) {
  auto a = ChunkMemory::Create("warmer-a", 4 * kMiB, kMiB).value();
  auto b = ChunkMemory::Create("warmer-b", 2 * kMiB, kMiB).value();
  Warmer warmer({{"a", a.get()}, {"b", b.get()}});
  warmer.Wait();
  EXPECT_EQ(a->bytes_warm(), a->bytes());
  EXPECT_EQ(b->bytes_warm(), b->bytes());
  // A chunk that gets fresh memory later stays cold: its next user takes its pages.
  ASSERT_TRUE(a->Renew(2).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(a->bytes_warm(), 3 * kMiB);
  EXPECT_EQ(ResidentPages(a->base() + 2 * kMiB, kMiB), 0u);
}

// hugetlb: a renewal that cannot reserve huge pages fails with the reason and leaves the
// chunk's old memory in place (no hole where another mapping could land); with a page to spare
// it gets fresh zeroed memory.
TEST(ChunkMemory, AHugetlbRenewalShortOfPagesKeepsTheOldMemory) {
  if (!testing::HugePagePool::Changeable()) GTEST_SKIP() << "needs root to reserve huge pages";
  testing::HugePagePool pool;
  ASSERT_TRUE(pool.Grow(2));
  const long spare = testing::HugePagePool::Free();
  ASSERT_GE(spare, 2);
  ChunkMemoryOptions hugetlb;
  hugetlb.hugetlb = true;
  // Every free huge page but none: the renewal has nowhere to go.
  auto m = ChunkMemory::Create("hugetlb-renew", static_cast<uint64_t>(spare) * kHugePageBytes,
                               kHugePageBytes, hugetlb);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ((*m)->page_kind(), PageKind::kHugetlb);
  std::memset((*m)->base(), 0x6b, kHugePageBytes);
  const Status short_of_pages = (*m)->Renew(0);
  EXPECT_EQ(short_of_pages.code(), StatusCode::kResourceExhausted) << short_of_pages.ToString();
  EXPECT_NE(short_of_pages.message().find("vm.nr_hugepages"), std::string::npos);
  EXPECT_EQ((*m)->base()[0], 0x6b) << "the old memory is still mapped there";
  EXPECT_EQ((*m)->base()[kHugePageBytes - 1], 0x6b);
  ASSERT_TRUE(pool.Grow(3));
  ASSERT_TRUE((*m)->Renew(0).ok());
  EXPECT_EQ((*m)->base()[0], 0);
  m->reset();
}

}  // namespace
}  // namespace stash::daemon
