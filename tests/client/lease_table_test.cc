#include "client/mapped/lease_table.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "tests/client/chunk_fakes.h"

namespace stash::client {
namespace {

using testing::Caps;
using testing::FakeChunk;
using testing::kChunk;
using testing::kPage;

std::unique_ptr<LeaseTable> Table(uint64_t max_lease = 4 * kChunk) {
  auto t = LeaseTable::Create(kPage, kChunk, Caps(max_lease));
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(t).value() : nullptr;
}

TEST(LeaseTable, ChunksMapSharedAtTheirSlotAndTheirPagesJoinTheRing) {
  auto table = Table();
  UniqueFd a = FakeChunk(kChunk);
  UniqueFd b = FakeChunk(kChunk);
  const int b_fd = dup(b.get());
  ASSERT_TRUE(table->AddChunk(kernels::kLeaseDevice, 11, std::move(a), kChunk).ok());
  ASSERT_TRUE(table->AddChunk(kernels::kLeaseDevice, 12, std::move(b), kChunk).ok());
  kernels::PageRing& ring = *table->ring(kernels::kLeaseDevice);
  EXPECT_EQ(kernels::RingFree(ring), 8u);
  for (uint64_t i = 0; i < 8; ++i) EXPECT_EQ(kernels::RingPageAt(ring, ring.head, i), i);
  EXPECT_EQ(table->pages_leased(kernels::kLeaseDevice), 8u);
  EXPECT_EQ(table->chunks(kernels::kLeaseDevice), 2u);
  EXPECT_EQ(kernels::ControlLoad(table->control().tiers[0].pages_leased), 8u);

  // Page 5 is page 1 of chunk 12: the daemon's memory, seen through its own descriptor.
  std::memset(table->base(kernels::kLeaseDevice) + 5 * kPage, 0xab, kPage);
  void* other = mmap(nullptr, kChunk, PROT_READ, MAP_SHARED, b_fd, 0);
  ASSERT_NE(other, MAP_FAILED);
  EXPECT_EQ(static_cast<uint8_t*>(other)[kPage], 0xab);
  EXPECT_EQ(static_cast<uint8_t*>(other)[kPage + kPage - 1], 0xab);
  munmap(other, kChunk);
  close(b_fd);
}

TEST(LeaseTable, ShrinkTakesOnlyChunksWithoutStashesAndCompactsTheRing) {
  auto table = Table();
  for (uint64_t id = 1; id <= 3; ++id) {
    ASSERT_TRUE(table->AddChunk(kernels::kLeaseHost, id, FakeChunk(kChunk), kChunk).ok());
  }
  kernels::PageRing& ring = *table->ring(kernels::kLeaseHost);
  // A "stash" holds pages 0 and 1 (chunk 1, slot 0), and one holds page 9 (chunk 3, slot 2):
  // take 2 from head, then put back everything but page 9 in a scrambled order.
  ring.head += 2;  // pages 0, 1 taken
  std::vector<uint64_t> taken;
  for (uint64_t i = 0; i < 10; ++i) taken.push_back(kernels::RingPageAt(ring, ring.head, i));
  ring.head += 10;  // every other page taken too
  for (uint64_t id : taken) {
    if (id == 9) continue;
    kernels::RingReturnAt(ring, ring.tail, 0, id);
    ++ring.tail;
  }
  EXPECT_EQ(kernels::RingFree(ring), 9u);
  const std::vector<uint64_t> gone = table->ShrinkTo(kernels::kLeaseHost, 0);
  ASSERT_EQ(gone, std::vector<uint64_t>{2});  // only chunk 2 (slot 1) is wholly free
  EXPECT_EQ(table->pages_leased(kernels::kLeaseHost), 8u);
  EXPECT_EQ(kernels::RingFree(ring), 5u);  // 2, 3 of chunk 1 and 8, 10, 11 of chunk 3
  std::vector<uint64_t> left;
  for (uint64_t i = 0; i < kernels::RingFree(ring); ++i) {
    left.push_back(kernels::RingPageAt(ring, ring.head, i));
  }
  EXPECT_EQ(left, (std::vector<uint64_t>{2, 3, 8, 10, 11}));
  EXPECT_EQ(kernels::ControlLoad(table->control().tiers[kernels::kLeaseHost].ring_tail), ring.tail);
  // Its slot is free again: a new chunk lands there, its pages appended at tail.
  ASSERT_TRUE(table->AddChunk(kernels::kLeaseHost, 4, FakeChunk(kChunk), kChunk).ok());
  EXPECT_EQ(kernels::RingPageAt(ring, ring.head, 5), 4u);
  EXPECT_EQ(table->ChunkIds(), (std::vector<uint64_t>{1, 4, 3}));
}

TEST(LeaseTable, ShrinkStopsAtTheTarget) {
  auto table = Table();
  for (uint64_t id = 1; id <= 3; ++id) {
    ASSERT_TRUE(table->AddChunk(kernels::kLeaseDevice, id, FakeChunk(kChunk), kChunk).ok());
  }
  EXPECT_EQ(table->ShrinkTo(kernels::kLeaseDevice, 8), std::vector<uint64_t>{3});
  EXPECT_TRUE(table->ShrinkTo(kernels::kLeaseDevice, 8).empty());
  EXPECT_EQ(kernels::RingFree(*table->ring(kernels::kLeaseDevice)), 8u);
  // At most 5 pages: whole chunks go until it fits.
  EXPECT_EQ(table->ShrinkTo(kernels::kLeaseDevice, 5), std::vector<uint64_t>{2});
  EXPECT_EQ(table->pages_leased(kernels::kLeaseDevice), 4u);
}

TEST(LeaseTable, BadChunksAreRefused) {
  auto table = Table(kChunk);
  EXPECT_EQ(table->AddChunk(0, 1, FakeChunk(kChunk), kChunk + kPage).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(table->AddChunk(0, 1, FakeChunk(kChunk), kPage + 1).code(),
            StatusCode::kInvalidArgument);
  // A memfd smaller than it says would SIGBUS on touch.
  EXPECT_EQ(table->AddChunk(0, 1, FakeChunk(kPage), kChunk).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(table->AddChunk(0, 1, FakeChunk(kChunk), kChunk).ok());
  EXPECT_EQ(table->AddChunk(0, 2, FakeChunk(kChunk), kChunk).code(),
            StatusCode::kResourceExhausted);
}

TEST(LeaseTable, AShortLastChunkHoldsOnlyItsPages) {
  auto table = Table();
  ASSERT_TRUE(table->AddChunk(0, 1, FakeChunk(kChunk), 2 * kPage).ok());
  EXPECT_EQ(kernels::RingFree(*table->ring(0)), 2u);
  EXPECT_EQ(table->pages_leased(0), 2u);
}

TEST(LeaseTable, AForkedChildDoesNotInheritTheChunks) {
  auto table = Table();
  ASSERT_TRUE(table->AddChunk(0, 1, FakeChunk(kChunk), kChunk).ok());
  uint8_t* base = table->base(0);
  base[0] = 1;
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // msync on an unmapped range fails with ENOMEM: the range is not in the child at all.
    const int rc = msync(base, kChunk, MS_ASYNC);
    _exit(rc != 0 && errno == ENOMEM ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_EQ(msync(base, kChunk, MS_ASYNC), 0);  // still mapped here
}

TEST(LeaseTable, TheControlBlockTakesOverTheCountersAndKeepsTheDaemonsLine) {
  auto table = Table();
  ASSERT_TRUE(table->AddChunk(0, 1, FakeChunk(kChunk), kChunk).ok());
  kernels::ControlStore(table->control().stashes, 3);
  UniqueFd block = FakeChunk(kernels::kControlBlockBytes);
  auto* written = static_cast<kernels::SessionControl*>(mmap(
      nullptr, kernels::kControlBlockBytes, PROT_READ | PROT_WRITE, MAP_SHARED, block.get(), 0));
  ASSERT_NE(written, MAP_FAILED);
  written->magic = kernels::kControlMagic;
  written->version = kernels::kControlVersion;
  // The daemon's own line is live: it may have written it before the rank maps the block.
  written->daemon_flags = kernels::kDaemonDraining;
  written->return_request = 5;
  written->return_target_pages[0] = 8;
  EXPECT_EQ(written->attached, 0u);
  ASSERT_TRUE(table->SetControlBlock(std::move(block), kernels::kControlBlockBytes).ok());
  EXPECT_EQ(kernels::ControlLoad(written->magic), kernels::kControlMagic);
  EXPECT_EQ(kernels::ControlLoad(written->version), kernels::kControlVersion);
  EXPECT_EQ(kernels::ControlLoad(written->daemon_flags), kernels::kDaemonDraining);
  EXPECT_EQ(kernels::ControlLoad(written->return_request), 5u);
  EXPECT_EQ(kernels::ControlLoad(written->return_target_pages[0]), 8u);
  EXPECT_EQ(kernels::ControlLoad(written->attached), kernels::kControlMagic);
  EXPECT_EQ(kernels::ControlLoad(written->stashes), 3u);
  EXPECT_EQ(kernels::ControlLoad(written->tiers[0].pages_leased), 4u);
  EXPECT_EQ(kernels::ControlLoad(written->tiers[0].ring_tail), 4u);
  munmap(written, kernels::kControlBlockBytes);
}

}  // namespace
}  // namespace stash::client

namespace stash::client {
namespace {

// Chunks of whole 2 MiB pages get 2 MiB-aligned lease ranges (so the daemon's huge pages map as
// such), and a chunk is mapped populated (AForkedChildDoesNotInheritTheChunks covers fork).
TEST(LeaseTable, HugePageChunksGetAlignedRangesAndMapPopulated) {
  constexpr uint64_t kBig = 2ULL << 20;
  auto t = LeaseTable::Create(kPage, kBig, Caps(4 * kBig));
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  auto& table = *t;
  for (uint32_t tier = 0; tier < kernels::kLeaseTiers; ++tier) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(table->base(tier)) % kBig, 0u) << tier;
  }
  ASSERT_TRUE(table->AddChunk(kernels::kLeaseDevice, 7, FakeChunk(kBig), kBig).ok());
  uint8_t* chunk = table->base(kernels::kLeaseDevice);
  const auto page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> resident(kBig / page);
  ASSERT_EQ(mincore(chunk, kBig, resident.data()), 0) << strerror(errno);
  for (size_t i = 0; i < resident.size(); ++i) ASSERT_EQ(resident[i] & 1, 1) << "page " << i;
}

}  // namespace
}  // namespace stash::client
