// Warm memory, the daemon's parts (daemon/chunk_memory.h, daemon/warmer.h; issue 24): chunks
// populated without a byte changed, zeroed in place, counted warm; the warmer's start-up pass and
// renewed chunks; leases give chunks back to their ring only once they are warm.
#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "common/shm.h"
#include "daemon/chunk_memory.h"
#include "daemon/leases.h"
#include "daemon/tier.h"
#include "daemon/warmer.h"

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

TEST(ChunkMemory, ZeroClearsInPlaceAndStaysWarm) {
  auto m = ChunkMemory::Create("zero-test", 2 * kMiB, kMiB).value();
  ASSERT_TRUE(m->Populate(0).ok());
  const int fd_before = m->fd(0);
  std::memset(m->base(), 0xab, 2 * kMiB);
  m->Zero(0);
  for (uint64_t i = 0; i < kMiB; i += 97) ASSERT_EQ(m->base()[i], 0) << i;
  EXPECT_EQ(m->base()[kMiB], 0xab) << "the next chunk is untouched";
  EXPECT_EQ(m->fd(0), fd_before);
  EXPECT_EQ(m->bytes_warm(), kMiB);
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

TEST(Warmer, TheStartUpPassWarmsEveryRegionAndRenewedChunksCallBack) {
  auto a = ChunkMemory::Create("warmer-a", 4 * kMiB, kMiB).value();
  auto b = ChunkMemory::Create("warmer-b", 2 * kMiB, kMiB).value();
  Warmer warmer({{"a", a.get()}, {"b", b.get()}});
  warmer.Drain();
  EXPECT_TRUE(warmer.started_warm());
  EXPECT_EQ(a->bytes_warm(), a->bytes());
  EXPECT_EQ(b->bytes_warm(), b->bytes());
  ASSERT_TRUE(a->Renew(2).ok());
  EXPECT_EQ(a->bytes_warm(), 3 * kMiB);
  std::atomic<uint64_t> warm_when_called{0};
  warmer.Submit(a.get(), 2, [&] { warm_when_called = a->bytes_warm(); });
  warmer.Drain();
  EXPECT_EQ(warm_when_called.load(), 4 * kMiB) << "done runs after the chunk is populated";
}

// With a warmer, a chunk back from its holder rejoins the ring only once populated; a pooled
// chunk a daemon-copy stash wrote is leased zeroed and stays warm (same memfd: it never left).
TEST(Warmer, LeasesReturnRenewedChunksOnlyOnceWarm) {
  constexpr uint64_t kPage = 64 << 10;
  constexpr uint64_t kChunkPages = 4;
  auto pool = Tier::Create("gpu0", 0, kPage, 16, kChunkPages).value();
  LeaseConfig config;
  config.page_bytes = kPage;
  config.chunk_bytes = kChunkPages * kPage;
  config.max_lease_bytes = 16 * kPage;
  auto leases = std::make_unique<Leases>(std::vector<Tier*>{pool.get()}, nullptr, config);
  auto warmer =
      std::make_unique<Warmer>(std::vector<Warmer::Region>{{"gpu0", pool->chunk_memory()}});
  warmer->Drain();
  leases->SetWarmer(warmer.get());

  // A daemon-copy stash writes page 0 (chunk 0), then leaves.
  {
    MutexLock lock(&pool->mu());
    pool->PublishAlloc(1, kPage);
  }
  std::memset(pool->base(), 0x5c, kPage);
  {
    MutexLock lock(&pool->mu());
    pool->PublishFree(1, kPage);
  }
  LeaseHolder h;
  h.session_id = "m";
  h.uid = 1000;
  h.pid = getpid();
  v1::LeaseChunks want;
  v1::TierPages* w = want.add_want();
  w->set_tier(v1::TIER_DEVICE);
  w->set_pages(16);
  DescriptorReply reply = leases->Lease(h, want);
  ASSERT_TRUE(reply.status.ok()) << reply.status.message();
  EXPECT_EQ(pool->chunks_free(), 0u);
  EXPECT_EQ(pool->base()[0], 0) << "a written pooled chunk is zeroed before it is leased";
  EXPECT_EQ(pool->chunk_memory()->bytes_warm(), 16 * kPage) << "zeroed in place: still warm";

  // The holder gives everything back: fresh memory, populated, then free.
  v1::ReturnChunks back;
  for (uint64_t c = 0; c < 4; ++c) back.add_chunk_ids(Leases::ChunkId(0, c));
  ASSERT_TRUE(leases->Return(h, back).status.ok());
  warmer->Drain();
  EXPECT_EQ(pool->chunks_free(), 4u);
  EXPECT_EQ(pool->chunk_memory()->bytes_warm(), 16 * kPage);
  EXPECT_TRUE(pool->RingIsPermutation());

  leases->SetWarmer(nullptr);
  warmer.reset();
  leases.reset();
}

}  // namespace
}  // namespace stash::daemon
