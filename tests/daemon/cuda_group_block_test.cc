// The cuda backend's group depots (daemon/cuda/cuda_group_block.cc) on the CUDA driver stand-in
// (tests/cuda_standin), with two GPUs: one depot in each GPU's memory, changed by the group
// kernels of stashd's fatbin run as their host twins on each GPU's copy stream. The test reads
// and writes the depots as a member does: through a descriptor Export gave, imported and mapped
// (stand-in device memory is host memory, so the test touches the tags with the members' own
// functions, stash/kernels/group_depot.h).
#include "daemon/cuda/cuda_group_block.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/cuda_vmm.h"
#include "daemon/config/config.h"
#include "daemon/cuda/cuda_executor.h"
#include "stash/kernels/daemon_paging_fatbin.h"
#include "stash/kernels/group_depot.h"
#include "stash/kernels/group_kernels.h"
#include "tests/vmm_standin.h"

namespace stash::daemon {
namespace {

namespace k = stash::kernels;
using stash::testing::Standin;

constexpr uint64_t kPage = 64 << 10;
constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kChunkPages = 32;

// Two pools (one per GPU) and two host tiers, 2 chunks each: 8 depot chunks, 256 pages. Host tier
// 2's last chunk is short (28 pages).
std::vector<GroupBlock::TierShape> Shapes() {
  return {{0, 64, 2}, {1, 64, 2}, {-1, 60, 2}, {-1, 64, 2}};
}

// A depot as a member maps it: a descriptor from Export, imported, mapped read-write.
class MappedDepot {
 public:
  MappedDepot(const CudaDriver* d, int device, UniqueFd fd, const GroupBlock& block) : d_(d) {
    CUdevice dev = 0;
    EXPECT_EQ(d->DeviceGet(&dev, device), CUDA_SUCCESS);
    const CUmemAllocationProp prop = ChunkAllocationProp(device);
    size_t granularity = 0;
    EXPECT_EQ(
        d->MemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
        CUDA_SUCCESS);
    bytes_ = (block.bytes() + granularity - 1) / granularity * granularity;
    // The driver takes a POSIX descriptor cast to a pointer.
    // NOLINTNEXTLINE(performance-no-int-to-ptr)
    void* const os_handle = reinterpret_cast<void*>(static_cast<intptr_t>(fd.get()));
    ok_ = d->MemImportFromShareableHandle(&handle_, os_handle,
                                          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == CUDA_SUCCESS;
    ok_ = ok_ && d->MemAddressReserve(&base_, bytes_, granularity, 0, 0) == CUDA_SUCCESS;
    ok_ = ok_ && d->MemMap(base_, bytes_, 0, handle_, 0) == CUDA_SUCCESS;
    mapped_ = ok_;
    const CUmemAccessDesc access = ReadWriteAccess(device);
    ok_ = ok_ && d->MemSetAccess(base_, bytes_, &access, 1) == CUDA_SUCCESS;
    auto* p = reinterpret_cast<uint8_t*>(base_);  // NOLINT(performance-no-int-to-ptr)
    const k::GroupLayout& l = block.layout();
    view_.header = reinterpret_cast<k::GroupHeader*>(p);
    view_.chunk_free = reinterpret_cast<uint32_t*>(p + l.chunk_free_offset);
    view_.chunk_state = reinterpret_cast<uint32_t*>(p + l.chunk_state_offset);
    view_.tags = reinterpret_cast<uint32_t*>(p + l.tags_offset);
    view_.pages = block.pages();
    view_.chunks = block.chunks();
  }
  MappedDepot(const MappedDepot&) = delete;
  MappedDepot& operator=(const MappedDepot&) = delete;
  ~MappedDepot() {
    if (mapped_) {
      EXPECT_EQ(d_->MemUnmap(base_, bytes_), CUDA_SUCCESS);
    }
    if (base_ != 0) {
      EXPECT_EQ(d_->MemAddressFree(base_, bytes_), CUDA_SUCCESS);
    }
    if (handle_ != 0) {
      EXPECT_EQ(d_->MemRelease(handle_), CUDA_SUCCESS);
    }
  }

  bool ok() const { return ok_; }
  uint64_t bytes() const { return bytes_; }
  k::GroupView& view() { return view_; }
  k::GroupHeader& header() { return *view_.header; }
  uint32_t tag(uint64_t page) const { return k::TagLoad(view_.tags[page]); }
  uint32_t hint(uint64_t chunk) const { return k::TagLoad(view_.chunk_free[chunk]); }
  uint32_t state(uint64_t chunk) const { return k::TagLoad(view_.chunk_state[chunk]); }
  // Pages of depot chunk `chunk` whose tag is `want`.
  uint64_t Count(uint64_t chunk, uint32_t want) const {
    uint64_t n = 0;
    for (uint64_t p = chunk * kChunkPages; p < (chunk + 1) * kChunkPages; ++p) {
      n += tag(p) == want ? 1 : 0;
    }
    return n;
  }
  // A member `me` claims up to `want` pages of depot chunk `chunk` (`pages` of it real).
  std::vector<uint64_t> Claim(uint32_t me, uint64_t chunk, uint64_t pages, uint64_t want) {
    const k::GroupChunkRef ref{chunk, chunk * kChunkPages, pages};
    std::vector<uint64_t> ids(want);
    uint64_t cursor = 0;
    ids.resize(k::ClaimPages(view_, &ref, 1, &cursor, me, want, ids.data()));
    return ids;
  }
  uint64_t Release(uint32_t me, const std::vector<uint64_t>& ids) {
    return k::ReleasePages(view_, ids.data(), ids.size(), me, kChunkPages);
  }

 private:
  const CudaDriver* d_;
  uint64_t bytes_ = 0;
  CUmemGenericAllocationHandle handle_ = 0;
  CUdeviceptr base_ = 0;
  bool mapped_ = false;
  bool ok_ = false;
  k::GroupView view_{};
};

class CudaGroupBlockTest : public ::testing::Test {
 protected:
  void SetUp() override { Start({}); }
  void TearDown() override {
    depots_.clear();
    block_.reset();
    executors_.clear();
  }

  // Two stand-in GPUs (plus `knobs`), their executors, and the factory's block.
  void Start(std::vector<std::pair<const char*, std::string>> knobs) {
    depots_.clear();
    block_.reset();
    executors_.clear();
    uuids_.clear();
    knobs.emplace_back("STASH_STANDIN_DEVICES", "2");
    d_ = Standin::Reset(knobs);
    DaemonConfig config;
    config.page_bytes = kPage;
    config.pool_bytes = 4 * kMiB;
    config.chunk_bytes = 2 * kMiB;
    config.host_tier_bytes = 0;  // the block's host tiers need no memory behind them
    auto created = CreateCudaExecutors(config, d_, &uuids_);
    ASSERT_TRUE(created.ok()) << created.status().ToString();
    ASSERT_EQ(created->size(), 2u);
    executors_ = std::move(created).value();
    auto factory = CudaGroupBlockFactory(executors_);
    ASSERT_TRUE(factory.ok()) << factory.status().ToString();
    factory_ = std::move(factory).value();
  }

  // The block and both depots mapped as members of each GPU map them.
  void Make() {
    auto block = factory_(kPage, kChunkPages, Shapes());
    ASSERT_TRUE(block.ok()) << block.status().ToString();
    block_ = std::move(block).value();
    for (int pool = 0; pool < 2; ++pool) {
      auto fd = block_->Export(pool);
      ASSERT_TRUE(fd.ok()) << fd.status().ToString();
      depots_.push_back(std::make_unique<MappedDepot>(d_, pool, std::move(*fd), *block_));
      ASSERT_TRUE(depots_.back()->ok()) << "the exported depot of pool " << pool << " maps";
    }
  }
  MappedDepot& depot(int pool) { return *depots_[pool]; }

  const CudaDriver* d_ = nullptr;
  std::vector<std::string> uuids_;
  std::vector<std::unique_ptr<CopyExecutor>> executors_;
  GroupBlock::Factory factory_;
  std::unique_ptr<GroupBlock> block_;
  std::vector<std::unique_ptr<MappedDepot>> depots_;
};

TEST_F(CudaGroupBlockTest, EachGpuHoldsAWholeDepotWithItsHeaderAndNothingJoined) {
  const long long before0 = Standin::DeviceBytesInUse(0);
  const long long before1 = Standin::DeviceBytesInUse(1);
  ASSERT_GE(before0, 0);
  Make();
  EXPECT_EQ(block_->chunks(), 8u);
  EXPECT_EQ(block_->pages(), 256u);
  const auto rounded = static_cast<long long>(depot(0).bytes());
  EXPECT_EQ(Standin::DeviceBytesInUse(0), before0 + rounded) << "one depot in gpu0's memory";
  EXPECT_EQ(Standin::DeviceBytesInUse(1), before1 + rounded) << "one depot in gpu1's memory";
  for (int pool = 0; pool < 2; ++pool) {
    const k::GroupHeader& h = depot(pool).header();
    EXPECT_EQ(h.magic, k::kGroupMagic);
    EXPECT_EQ(h.version, k::kGroupVersion);
    EXPECT_EQ(h.page_bytes, kPage);
    EXPECT_EQ(h.chunk_pages, kChunkPages);
    EXPECT_EQ(h.tiers, 4u);
    EXPECT_EQ(h.pages, 256u);
    EXPECT_EQ(h.chunks, 8u);
    EXPECT_EQ(h.tags_offset, block_->layout().tags_offset);
    EXPECT_EQ(h.block_bytes, block_->bytes());
    EXPECT_EQ(h.tier[1].first_chunk, 2u);
    EXPECT_EQ(h.tier[1].pool, 1);
    EXPECT_EQ(h.tier[2].pages, 60u);
    EXPECT_EQ(h.tier[2].pool, -1);
    EXPECT_EQ(h.generation, 0u);
    EXPECT_EQ(h.claimed, 0u);
    for (uint64_t c = 0; c < 8; ++c) {
      EXPECT_EQ(depot(pool).state(c), k::kGroupChunkOut);
      EXPECT_EQ(depot(pool).hint(c), 0u);
      EXPECT_EQ(depot(pool).Count(c, k::kTagDaemon), kChunkPages);
    }
  }
  // Each depot is its own memory: a write in one is not in the other.
  depot(0).header().dry = 77;
  EXPECT_EQ(depot(1).header().dry, 0u);

  EXPECT_EQ(block_->gpu_uuid(0), uuids_[0]);
  EXPECT_EQ(block_->gpu_uuid(1), uuids_[1]);
  EXPECT_EQ(block_->gpu_uuid(0).size(), 16u);
  EXPECT_NE(block_->gpu_uuid(0), block_->gpu_uuid(1));
  EXPECT_EQ(block_->gpu_uuid(2), "");
  EXPECT_EQ(block_->gpu_uuid(-1), "");
  EXPECT_EQ(block_->Export(2).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(block_->Export(-1).status().code(), StatusCode::kInvalidArgument);

  // Gone with the block (and the members' mappings): nothing stays allocated.
  depots_.clear();
  block_.reset();
  EXPECT_EQ(Standin::DeviceBytesInUse(0), before0);
  EXPECT_EQ(Standin::DeviceBytesInUse(1), before1);
}

TEST_F(CudaGroupBlockTest, JoinMakesAPoolChunkClaimableInItsOwnPoolsDepotOnly) {
  Make();
  // Chunk 1 of pool 1 (depot chunk 3, pages 96..127), joined for a member of pool 0: a pool's
  // chunk's tags live in its own GPU's depot whoever it joins for.
  block_->Join(1, 1, kChunkPages, 0);
  EXPECT_EQ(depot(1).state(3), k::kGroupChunkIn);
  EXPECT_EQ(depot(1).hint(3), kChunkPages);
  EXPECT_EQ(depot(1).Count(3, k::kTagFree), kChunkPages);
  EXPECT_EQ(depot(1).header().generation, 1u);
  for (uint64_t c = 0; c < 8; ++c) {
    if (c != 3) {
      EXPECT_EQ(depot(1).state(c), k::kGroupChunkOut) << c;
    }
    EXPECT_EQ(depot(0).state(c), k::kGroupChunkOut) << c;
    EXPECT_EQ(depot(0).Count(c, k::kTagDaemon), kChunkPages) << c;
  }
  EXPECT_EQ(depot(0).header().generation, 0u);
  // A member on gpu0 finds nothing to claim there; one on gpu1 claims every page.
  EXPECT_TRUE(depot(0).Claim(2, 3, kChunkPages, kChunkPages).empty());
  const std::vector<uint64_t> ids = depot(1).Claim(2, 3, kChunkPages, kChunkPages);
  ASSERT_EQ(ids.size(), kChunkPages);
  EXPECT_EQ(ids.front(), 96u);
  EXPECT_EQ(depot(1).header().claimed, kChunkPages);
}

TEST_F(CudaGroupBlockTest, AHostChunkLivesInTheDepotOfThePoolItJoinedFor) {
  Make();
  // Host tier 2's short last chunk (depot chunk 5, pages 160..187 real), for pool 1's members.
  block_->Join(2, 1, 28, 1);
  EXPECT_EQ(depot(1).state(5), k::kGroupChunkIn);
  EXPECT_EQ(depot(1).hint(5), 28u);
  EXPECT_EQ(depot(1).Count(5, k::kTagFree), 28u);
  for (uint64_t p = 188; p < 192; ++p) EXPECT_EQ(depot(1).tag(p), k::kTagDaemon) << p;
  EXPECT_EQ(depot(0).state(5), k::kGroupChunkOut);
  EXPECT_EQ(depot(0).Count(5, k::kTagDaemon), kChunkPages);

  // Take, ForEachOwned and Out go to the same depot.
  const std::vector<uint64_t> ids = depot(1).Claim(7, 5, 28, 3);
  ASSERT_EQ(ids.size(), 3u);
  std::vector<uint32_t> owners;
  block_->ForEachOwned(2, 1, [&](uint32_t tag) { owners.push_back(tag); });
  EXPECT_EQ(owners, std::vector<uint32_t>({7, 7, 7}));
  EXPECT_FALSE(block_->Take(2, 1, 28));
  EXPECT_EQ(depot(1).Release(7, ids), 3u);
  EXPECT_TRUE(block_->Take(2, 1, 28));
  EXPECT_EQ(depot(1).state(5), k::kGroupChunkLeaving);
  EXPECT_EQ(depot(1).Count(5, k::kTagDaemon), kChunkPages);
  EXPECT_EQ(depot(0).state(5), k::kGroupChunkOut);
  block_->Out(2, 1);
  EXPECT_EQ(depot(1).state(5), k::kGroupChunkOut);

  // Joined again, for pool 0's members this time: depot 0 holds it, depot 1 stays out.
  block_->Join(2, 1, 28, 0);
  EXPECT_EQ(depot(0).state(5), k::kGroupChunkIn);
  EXPECT_EQ(depot(0).Count(5, k::kTagFree), 28u);
  EXPECT_EQ(depot(1).state(5), k::kGroupChunkOut);
  EXPECT_EQ(depot(1).Count(5, k::kTagDaemon), kChunkPages);
  EXPECT_EQ(depot(0).Claim(9, 5, 28, 2).size(), 2u);
  owners.clear();
  block_->ForEachOwned(2, 1, [&](uint32_t tag) { owners.push_back(tag); });
  EXPECT_EQ(owners, std::vector<uint32_t>({9, 9}));
}

TEST_F(CudaGroupBlockTest, TakeSucceedsOnlyWhenEveryPageIsFreeAndIsAllOrNone) {
  Make();
  block_->Join(0, 0, kChunkPages, 0);  // depot chunk 0, pages 0..31
  // A member owns the chunk's last page only: the take swaps 31 pages before it finds it.
  std::vector<uint64_t> ids = depot(0).Claim(5, 0, kChunkPages, kChunkPages);
  ASSERT_EQ(ids.size(), kChunkPages);
  EXPECT_EQ(depot(0).Release(5, std::vector<uint64_t>(ids.begin(), ids.end() - 1)), 31u);
  ASSERT_EQ(depot(0).tag(31), 5u);

  EXPECT_FALSE(block_->Take(0, 0, kChunkPages));
  EXPECT_EQ(depot(0).Count(0, k::kTagFree), 31u) << "the pages taken before went back";
  EXPECT_EQ(depot(0).tag(31), 5u);
  EXPECT_EQ(depot(0).hint(0), 31u);
  EXPECT_EQ(depot(0).state(0), k::kGroupChunkIn);
  EXPECT_EQ(depot(0).header().generation, 1u) << "a failed take is no new generation";

  EXPECT_EQ(depot(0).Release(5, {31}), 1u);
  EXPECT_TRUE(block_->Take(0, 0, kChunkPages));
  EXPECT_EQ(depot(0).Count(0, k::kTagDaemon), kChunkPages);
  EXPECT_EQ(depot(0).hint(0), 0u);
  EXPECT_EQ(depot(0).state(0), k::kGroupChunkLeaving);
  EXPECT_EQ(depot(0).header().generation, 2u);
  EXPECT_TRUE(depot(0).Claim(6, 0, kChunkPages, 1).empty()) << "nothing of it is claimable";
}

TEST_F(CudaGroupBlockTest, OutGivesEveryTagBackToTheDaemon) {
  Make();
  block_->Join(0, 0, kChunkPages, 0);
  block_->Join(0, 1, kChunkPages, 0);
  ASSERT_EQ(depot(0).Claim(9, 1, kChunkPages, 10).size(), 10u);
  ASSERT_EQ(depot(0).Claim(4, 0, kChunkPages, 2).size(), 2u);
  block_->Out(0, 1);  // every member unmapped it (or is gone): whatever it left is the daemon's
  EXPECT_EQ(depot(0).Count(1, k::kTagDaemon), kChunkPages);
  EXPECT_EQ(depot(0).hint(1), 0u);
  EXPECT_EQ(depot(0).state(1), k::kGroupChunkOut);
  bool any = false;
  block_->ForEachOwned(0, 1, [&](uint32_t) { any = true; });
  EXPECT_FALSE(any);
  // The other chunk is untouched.
  EXPECT_EQ(depot(0).state(0), k::kGroupChunkIn);
  EXPECT_EQ(depot(0).Count(0, 4), 2u);
  EXPECT_EQ(depot(0).hint(0), kChunkPages - 2);
}

TEST_F(CudaGroupBlockTest, ReclaimFreesExactlyTheMemberTagsNotLiveInEveryDepot) {
  Make();
  block_->Join(0, 0, kChunkPages, 0);  // depot 0, chunk 0
  block_->Join(0, 1, kChunkPages, 0);  // depot 0, chunk 1: taken back below
  block_->Join(1, 0, kChunkPages, 1);  // depot 1, chunk 2
  block_->Join(3, 1, kChunkPages, 1);  // host tier 3's chunk 1 for pool 1: depot 1, chunk 7
  ASSERT_EQ(depot(0).Claim(2, 0, kChunkPages, 5).size(), 5u);
  ASSERT_EQ(depot(0).Claim(3, 0, kChunkPages, 4).size(), 4u);
  k::TagStore(depot(0).view().tags[20], 0xdeadbeef);  // garbage a member wrote on a free page
  ASSERT_EQ(depot(1).Claim(4, 2, kChunkPages, 6).size(), 6u);
  ASSERT_EQ(depot(1).Claim(3, 2, kChunkPages, 2).size(), 2u);
  ASSERT_EQ(depot(1).Claim(2, 7, kChunkPages, 3).size(), 3u);
  // Member tags where the group has no chunk in: never freed by a reclaim.
  ASSERT_TRUE(block_->Take(0, 1, kChunkPages));
  k::TagStore(depot(0).view().tags[40], 2);   // a leaving chunk
  k::TagStore(depot(0).view().tags[200], 2);  // a chunk not the group's
  const uint32_t hint0 = depot(0).hint(0), hint2 = depot(1).hint(2), hint7 = depot(1).hint(7);
  const uint64_t claimed0 = depot(0).header().claimed, claimed1 = depot(1).header().claimed;
  ASSERT_EQ(claimed0, 9u);
  ASSERT_EQ(claimed1, 11u);

  // Member 3 lives, among more live tags than a reclaim block keeps in shared memory.
  std::vector<uint32_t> live;
  for (uint32_t t = 100000; t < 101500; ++t) live.push_back(t);
  live.push_back(3);
  EXPECT_EQ(block_->Reclaim(live), 15u);  // 5 + 1 garbage in depot 0, 6 + 3 in depot 1
  EXPECT_EQ(depot(0).Count(0, 2), 0u);
  EXPECT_EQ(depot(0).Count(0, 0xdeadbeef), 0u);
  EXPECT_EQ(depot(0).Count(0, 3), 4u);
  EXPECT_EQ(depot(0).Count(0, k::kTagFree), 28u);
  EXPECT_EQ(depot(0).hint(0), hint0 + 6);
  EXPECT_EQ(depot(0).tag(40), 2u);
  EXPECT_EQ(depot(0).tag(200), 2u);
  EXPECT_EQ(depot(0).header().claimed, claimed0 - 6);
  EXPECT_EQ(depot(1).Count(2, 4), 0u);
  EXPECT_EQ(depot(1).Count(2, 3), 2u);
  EXPECT_EQ(depot(1).Count(7, 2), 0u);
  EXPECT_EQ(depot(1).hint(2), hint2 + 6);
  EXPECT_EQ(depot(1).hint(7), hint7 + 3);
  EXPECT_EQ(depot(1).header().claimed, claimed1 - 9);

  EXPECT_EQ(block_->Reclaim(live), 0u) << "nothing left to free";
  EXPECT_EQ(block_->Reclaim({}), 6u) << "member 3's pages in both depots";
  EXPECT_EQ(depot(0).Count(0, 3), 0u);
  EXPECT_EQ(depot(1).Count(2, 3), 0u);
}

TEST_F(CudaGroupBlockTest, ReadClampsEachCounterAndSumsTheDepots) {
  Make();
  k::GroupHeader& h0 = depot(0).header();
  k::GroupHeader& h1 = depot(1).header();
  h0.claimed = 5;
  h0.claimed_high_water = 7;
  h0.dry = 3;
  h0.dry_pages = 100;
  h1.claimed = 4;
  h1.claimed_high_water = 9;
  h1.dry = 2;
  h1.dry_pages = 1;
  auto expect = [](const GroupBlock::Counters& c, uint64_t claimed, uint64_t high_water,
                   uint64_t dry, uint64_t dry_pages) {
    EXPECT_EQ(c.claimed, claimed);
    EXPECT_EQ(c.high_water, high_water);
    EXPECT_EQ(c.dry, dry);
    EXPECT_EQ(c.dry_pages, dry_pages);
  };
  expect(block_->Read(6, 0), 5, 6, 3, 6);
  expect(block_->Read(6, 1), 4, 6, 2, 1);
  expect(block_->Read(200, -1), 9, 16, 5, 101);
  expect(block_->Read(100, -1), 9, 16, 5, 100);  // each depot's, then the sum, at most `max`
  expect(block_->Read(8, -1), 8, 8, 5, 8);
  expect(block_->Read(6, 2), 0, 0, 0, 0);  // no such pool
  // Garbage a member wrote: clamped, never wrapped around.
  h1.claimed = UINT64_MAX;
  h1.dry = UINT64_MAX;
  expect(block_->Read(50, -1), 50, 16, UINT64_MAX, 50);
}

TEST_F(CudaGroupBlockTest, ResetHighWaterStartsANewWindowInEveryDepot) {
  Make();
  depot(0).header().claimed = 3;
  depot(0).header().claimed_high_water = 10;
  depot(1).header().claimed = 1;
  depot(1).header().claimed_high_water = 4;
  block_->ResetHighWater();
  EXPECT_EQ(depot(0).header().claimed_high_water, 3u);
  EXPECT_EQ(depot(1).header().claimed_high_water, 1u);
  EXPECT_EQ(depot(0).header().claimed, 3u);
  EXPECT_EQ(depot(1).header().claimed, 1u);
}

TEST_F(CudaGroupBlockTest, ForEachOwnedReportsTheMembersOfTheChunksDepot) {
  Make();
  block_->Join(1, 1, kChunkPages, 1);  // depot 1, chunk 3
  ASSERT_EQ(depot(1).Claim(4, 3, kChunkPages, 2).size(), 2u);
  ASSERT_EQ(depot(1).Claim(11, 3, kChunkPages, 1).size(), 1u);
  // The same page range in depot 0 carries a tag the daemon must not report for pool 1's chunk.
  k::TagStore(depot(0).view().tags[100], 12);
  std::map<uint32_t, int> owners;
  block_->ForEachOwned(1, 1, [&](uint32_t tag) { ++owners[tag]; });
  EXPECT_EQ(owners, (std::map<uint32_t, int>{{4, 2}, {11, 1}}));
  // A host chunk that never joined reports nothing; a chunk past its tier is refused.
  bool any = false;
  block_->ForEachOwned(3, 0, [&](uint32_t) { any = true; });
  block_->ForEachOwned(1, 2, [&](uint32_t) { any = true; });
  block_->ForEachOwned(9, 0, [&](uint32_t) { any = true; });
  EXPECT_FALSE(any);
  EXPECT_FALSE(block_->Take(3, 0, kChunkPages)) << "a host chunk no depot holds";
}

TEST_F(CudaGroupBlockTest, AJoinForAPoolWithNoGpuChangesNothing) {
  Make();
  block_->Join(2, 0, kChunkPages, 5);
  block_->Join(2, 0, kChunkPages, -1);
  block_->Join(0, 7, kChunkPages, 0);  // past the tier's chunks
  for (int pool = 0; pool < 2; ++pool) {
    for (uint64_t c = 0; c < 8; ++c) EXPECT_EQ(depot(pool).state(c), k::kGroupChunkOut);
    EXPECT_EQ(depot(pool).header().generation, 0u);
  }
}

TEST_F(CudaGroupBlockTest, CreateRefusesTiersItCannotPlace) {
  std::vector<GroupBlock::TierShape> shapes = Shapes();
  shapes.push_back({2, 64, 2});  // a third pool: no GPU for it
  auto third = factory_(kPage, kChunkPages, shapes);
  EXPECT_EQ(third.status().code(), StatusCode::kFailedPrecondition) << third.status().ToString();
  std::vector<GroupBlock::TierShape> many(k::kMaxGroupTiers + 1, GroupBlock::TierShape{-1, 1, 1});
  auto past = factory_(kPage, kChunkPages, many);
  EXPECT_EQ(past.status().code(), StatusCode::kFailedPrecondition) << past.status().ToString();
  const std::vector<std::unique_ptr<CopyExecutor>> none;
  EXPECT_EQ(CudaGroupBlockFactory(none).status().code(), StatusCode::kFailedPrecondition);
}

TEST_F(CudaGroupBlockTest, CreateFailsOnAGpuWithoutPosixFdHandles) {
  Start({{"STASH_STANDIN_NO_POSIX_FD", "1"}});  // the pools fall back to one cuMemAlloc
  auto block = factory_(kPage, kChunkPages, Shapes());
  ASSERT_FALSE(block.ok());
  EXPECT_EQ(block.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(block.status().message().find("POSIX"), std::string::npos) << block.status().message();
  EXPECT_NE(block.status().message().find("gpu0"), std::string::npos) << block.status().message();
}

// The stand-in finds kernels by name whatever the image: this checks stashd's fatbin itself
// holds every group kernel CudaGroupBlock launches.
TEST(DaemonPagingFatbin, HoldsTheGroupKernels) {
  const auto* begin = reinterpret_cast<const char*>(stash_daemon_paging_fatbin);
  const std::string image(begin, begin + stash_daemon_paging_fatbin_size);
  for (const char* name :
       {k::kDaemonGroupJoinKernel, k::kDaemonGroupTakeKernel, k::kDaemonGroupOutKernel,
        k::kDaemonGroupReclaimKernel, k::kDaemonGroupResetHighWaterKernel}) {
    EXPECT_NE(image.find(std::string(name) + '\0'), std::string::npos) << name;
  }
}

}  // namespace
}  // namespace stash::daemon
