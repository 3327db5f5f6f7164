// StreamCopier as a group's member (docs/design.md, "Groups on GPUs"): the plan kernel claims a
// stash's pages from the group's depot, the reload gives them back, a graph captured before the
// group grew uses the chunks that came after, and chunks the daemon takes back leave the board.
//
// Built twice, like stream_copier_test.cc: on the driver stand-in here (the kernels' host twins
// on stream threads), and for a real GPU in tests/gpu. The test plays the daemon: it writes the
// depot (in device memory) with copies while no kernel runs, as the daemon's group kernels would.
#include "tests/client/stream_copier_fixture.h"

#include "stash/kernels/group_depot.h"

namespace stash::client {
namespace {

using kernels::GroupChunkRef;
using kernels::GroupLayout;
using kernels::GroupView;

// The node: a pool of kPoolChunks chunks (group pages from 0) and a host tier of kHostChunks
// (group pages after the pool's).
constexpr uint64_t kPoolChunks = 4;
constexpr uint64_t kHostChunks = 2;
constexpr uint64_t kChunks = kPoolChunks + kHostChunks;
constexpr uint64_t kPages = kChunks * kPagesPerChunk;
constexpr uint64_t kHostFirstPage = kPoolChunks * kPagesPerChunk;

class StreamCopierGroupTest : public StreamCopierTest {
 protected:
  void SetUp() override {
    StreamCopierTest::SetUp();
    if (driver_ == nullptr || IsSkipped()) return;
    layout_ = kernels::GroupLayoutFor(kPages, kChunks);
    depot_ = Alloc(layout_.block_bytes);
    Put(depot_, std::vector<uint8_t>(layout_.block_bytes, 0));  // every page the daemon's
    pool_ = Alloc(kPoolChunks * kChunkBytes);
    host_ = HostAlloc(kHostChunks * kChunkBytes);
  }

  GroupView View() const {
    GroupView v{};
    v.header = At<kernels::GroupHeader>(depot_);
    v.chunk_free = At<uint32_t>(depot_ + layout_.chunk_free_offset);
    v.chunk_state = At<uint32_t>(depot_ + layout_.chunk_state_offset);
    v.tags = At<uint32_t>(depot_ + layout_.tags_offset);
    v.pages = kPages;
    v.chunks = kChunks;
    return v;
  }
  template <typename T>
  static T* At(CUdeviceptr p) {
    return reinterpret_cast<T*>(p);  // NOLINT(performance-no-int-to-ptr): a device address
  }
  std::vector<uint32_t> Words(uint64_t offset, uint64_t n) {
    const std::vector<uint8_t> bytes = Get(depot_ + offset, n * sizeof(uint32_t));
    std::vector<uint32_t> words(n);
    std::memcpy(words.data(), bytes.data(), bytes.size());
    return words;
  }
  void PutWords(uint64_t offset, const std::vector<uint32_t>& words) {
    Put(depot_ + offset, words.data(), words.size() * sizeof(uint32_t));
  }
  std::vector<uint32_t> Tags() { return Words(layout_.tags_offset, kPages); }
  kernels::GroupHeader Header() {
    kernels::GroupHeader h{};
    const std::vector<uint8_t> bytes = Get(depot_, sizeof(h));
    std::memcpy(&h, bytes.data(), sizeof(h));
    return h;
  }
  // The daemon's JoinChunk: the chunk's pages free, its hint, then its state.
  void Join(uint64_t chunk) {
    PutWords(layout_.tags_offset + chunk * kPagesPerChunk * sizeof(uint32_t),
             std::vector<uint32_t>(kPagesPerChunk, kernels::kTagFree));
    PutWords(layout_.chunk_free_offset + chunk * sizeof(uint32_t),
             {static_cast<uint32_t>(kPagesPerChunk)});
    PutWords(layout_.chunk_state_offset + chunk * sizeof(uint32_t), {kernels::kGroupChunkIn});
  }
  // The daemon's TakeChunk, while no kernel runs: all the chunk's pages when all are free.
  bool Take(uint64_t chunk) {
    const std::vector<uint32_t> tags = Tags();
    for (uint64_t p = 0; p < kPagesPerChunk; ++p) {
      if (tags[chunk * kPagesPerChunk + p] != kernels::kTagFree) return false;
    }
    PutWords(layout_.tags_offset + chunk * kPagesPerChunk * sizeof(uint32_t),
             std::vector<uint32_t>(kPagesPerChunk, kernels::kTagDaemon));
    PutWords(layout_.chunk_free_offset + chunk * sizeof(uint32_t), {0});
    PutWords(layout_.chunk_state_offset + chunk * sizeof(uint32_t), {kernels::kGroupChunkLeaving});
    return true;
  }
  uint64_t Owned(uint32_t tag) {
    const std::vector<uint32_t> tags = Tags();
    return static_cast<uint64_t>(std::count(tags.begin(), tags.end(), tag));
  }

  // A member over the node's memory: its device tier is the pool's range, its host tier the
  // host tier's, each starting at the tier's first group page; no peer tier.
  std::unique_ptr<StreamCopier> Member(uint32_t tag) {
    StreamCopier::Geometry g;
    g.page_bytes = kPageBytes;
    g.chunk_bytes = kChunkBytes;
    g.tier_slots[kLeaseDevice] = kPoolChunks;
    g.tier_base[kLeaseDevice] = pool_;
    g.tier_slots[kLeaseHost] = kHostChunks;
    g.tier_base[kLeaseHost] = host_;
    g.max_stashes = 64;
    g.record_pages = 1024;
    g.group = true;
    auto made = StreamCopier::Create(driver_, g, fatbin_);
    EXPECT_TRUE(made.ok()) << made.status().ToString();
    if (!made.ok()) return nullptr;
    std::array<StreamCopier::GroupTier, kernels::kLeaseTiers> tiers{};
    tiers[kLeaseDevice] = {View(), 0};
    tiers[kLeaseHost] = {View(), kHostFirstPage};
    const Status joined = (*made)->JoinGroup(tag, kPagesPerChunk, tiers);
    EXPECT_TRUE(joined.ok()) << joined.ToString();
    return std::move(*made);
  }
  static GroupChunkRef Ref(uint64_t chunk) {
    return GroupChunkRef{chunk, chunk * kPagesPerChunk, kPagesPerChunk};
  }
  void Add(StreamCopier& member, uint64_t chunk) {
    const uint32_t tier = chunk < kPoolChunks ? kLeaseDevice : kLeaseHost;
    const Status added = member.AddGroupChunk(tier, Ref(chunk));
    ASSERT_TRUE(added.ok()) << added.ToString();
  }

  GroupLayout layout_{};
  CUdeviceptr depot_ = 0, pool_ = 0, host_ = 0;
};

TEST_F(StreamCopierGroupTest, MembersStashIntoPagesTheOthersReleasedWithinAStep) {
  std::mt19937_64 rng(41);
  Join(0);
  Join(1);
  Join(kPoolChunks);  // one chunk of the host tier
  std::unique_ptr<StreamCopier> a = Member(2), b = Member(3);
  ASSERT_TRUE(a && b);
  for (StreamCopier* m : {a.get(), b.get()}) {
    Add(*m, 0);
    Add(*m, 1);
  }
  const uint64_t row_bytes = kPageBytes, rows = 2 * kPagesPerChunk, bytes = rows * row_bytes;
  const CUdeviceptr src_a = Alloc(bytes), src_b = Alloc(bytes), dst = Alloc(bytes);
  const std::vector<uint8_t> data_a = Random(rng, bytes), data_b = Random(rng, bytes);
  Put(src_a, data_a);
  Put(src_b, data_b);

  // A takes the whole device depot; B finds it dry and has no host chunk mapped: overflow.
  auto ta = a->Stash(stream_, Request(src_a, rows, rows, row_bytes));
  ASSERT_TRUE(ta.ok()) << ta.status().ToString();
  Sync();
  EXPECT_EQ(Owned(2), 2 * kPagesPerChunk);
  EXPECT_EQ(a->CurrentStep().flags, 0u);
  const uint64_t short_before = b->LeaseShortReports();
  auto tb = b->Stash(stream_, Request(src_b, rows, rows, row_bytes));
  ASSERT_TRUE(tb.ok());
  Sync();
  EXPECT_EQ(b->CurrentStep().flags, kernels::kStepOverflow);
  EXPECT_GT(b->LeaseShortReports(), short_before) << "a dry depot asks the daemon to grow";
  EXPECT_EQ(Owned(3), 0u) << "what B claimed short of its stash went back";
  EXPECT_GE(Header().dry, 1u);
  ASSERT_TRUE(b->Reload(stream_, *tb, reinterpret_cast<void*>(dst), false).ok());

  // A's reload gives the pages back at once: B's next stash takes them, within the step.
  ASSERT_TRUE(a->Reload(stream_, *ta, reinterpret_cast<void*>(dst), false).ok());
  Sync();
  EXPECT_EQ(Difference(Get(dst, bytes), data_a), "same bytes");
  EXPECT_EQ(Owned(2), 0u) << "a member keeps no free page";
  tb = b->Stash(stream_, Request(src_b, rows, rows, row_bytes));
  ASSERT_TRUE(tb.ok());
  Sync();
  EXPECT_EQ(Owned(3), 2 * kPagesPerChunk);

  // A stash past the device depot goes to the host chunks A has mapped.
  Add(*a, kPoolChunks);
  const uint64_t small = kPagesPerChunk / 2;
  const uint64_t a_short = a->LeaseShortReports();
  auto th = a->Stash(stream_, Request(src_a, small, rows, row_bytes));
  ASSERT_TRUE(th.ok());
  Sync();
  EXPECT_EQ(a->CurrentStep().flags, kernels::kStepSpilled);
  EXPECT_GT(a->LeaseShortReports(), a_short) << "a placed stash that found the device dry asks";
  EXPECT_EQ(Owned(2), small);
  for (uint64_t p = kHostFirstPage; p < kHostFirstPage + kPagesPerChunk; ++p) {
    const uint32_t tag = Tags()[p];
    EXPECT_TRUE(tag == kernels::kTagFree || tag == 2u) << "host page " << p;
  }
  const CUdeviceptr dst_h = Alloc(small * row_bytes);
  ASSERT_TRUE(a->Reload(stream_, *th, reinterpret_cast<void*>(dst_h), false).ok());
  ASSERT_TRUE(b->Reload(stream_, *tb, reinterpret_cast<void*>(dst), false).ok());
  Sync();
  EXPECT_EQ(Difference(Get(dst_h, small * row_bytes),
                       std::vector<uint8_t>(data_a.begin(), data_a.begin() + small * row_bytes)),
            "same bytes");
  EXPECT_EQ(Difference(Get(dst, bytes), data_b), "same bytes");
  EXPECT_EQ(Owned(2) + Owned(3), 0u);
  EXPECT_EQ(Header().claimed, 0u);
  EXPECT_GE(Header().claimed_high_water, 2 * kPagesPerChunk);
}

TEST_F(StreamCopierGroupTest, AGraphCapturedBeforeTheGroupGrewUsesTheChunkThatCameAfter) {
  std::mt19937_64 rng(43);
  Join(0);
  std::unique_ptr<StreamCopier> a = Member(2);
  ASSERT_TRUE(a);
  Add(*a, 0);
  const uint64_t row_bytes = kPageBytes, max_rows = 2 * kPagesPerChunk;
  const uint64_t bytes = row_bytes * max_rows;
  const CUdeviceptr src = Alloc(bytes), dst = Alloc(bytes), count = Alloc(sizeof(int64_t));
  StreamCopier::StashRequest request = Request(src, 0, max_rows, row_bytes);
  request.d_count = reinterpret_cast<const int64_t*>(count);
  request.keep_source = false;  // an overflow leaves the destination: visible below
  ASSERT_EQ(driver_->StreamBeginCapture(stream_, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  auto ticket = a->Stash(stream_, request);
  ASSERT_TRUE(ticket.ok());
  ASSERT_TRUE(a->Reload(stream_, *ticket, reinterpret_cast<void*>(dst), false).ok());
  ASSERT_TRUE(a->BeginStep(stream_, 1).ok());
  CUgraph graph = nullptr;
  ASSERT_EQ(driver_->StreamEndCapture(stream_, &graph), CUDA_SUCCESS);
  CUgraphExec exec = nullptr;
  ASSERT_EQ(driver_->GraphInstantiate(&exec, graph, 0), CUDA_SUCCESS);
  const int64_t rows = static_cast<int64_t>(kPagesPerChunk + 3);  // more than one chunk
  Put(count, &rows, sizeof(rows));
  auto replay = [&](uint8_t fill) {
    const std::vector<uint8_t> data = Random(rng, bytes);
    Put(src, data);
    Put(dst, std::vector<uint8_t>(bytes, fill));
    EXPECT_EQ(driver_->GraphLaunch(exec, stream_), CUDA_SUCCESS);
    Sync();
    return std::make_pair(data, Get(dst, bytes));
  };
  // One chunk in the group: the stash overflows, the destination is left.
  auto [data1, back1] = replay(0x11);
  EXPECT_EQ(back1, std::vector<uint8_t>(bytes, 0x11));
  EXPECT_EQ(a->LastStep().flags, kernels::kStepOverflow);
  EXPECT_EQ(Owned(2), 0u);
  // The group grows between replays (mapped, then on the board): no capture, no launch.
  Join(1);
  Add(*a, 1);
  auto [data2, back2] = replay(0x22);
  const uint64_t valid = static_cast<uint64_t>(rows) * row_bytes;
  EXPECT_TRUE(std::equal(back2.begin(), back2.begin() + valid, data2.begin()));
  EXPECT_EQ(a->LastStep().flags, 0u);
  EXPECT_EQ(Owned(2), 0u) << "the replay's reload gave every page back";
  EXPECT_EQ(driver_->GraphExecDestroy(exec), CUDA_SUCCESS);
  EXPECT_EQ(driver_->GraphDestroy(graph), CUDA_SUCCESS);
}

TEST_F(StreamCopierGroupTest, AChunkTheDaemonTookBackLeavesTheBoardAtTheNextStep) {
  Join(0);
  Join(1);
  std::unique_ptr<StreamCopier> a = Member(2);
  ASSERT_TRUE(a);
  Add(*a, 0);
  Add(*a, 1);
  ASSERT_TRUE(a->BeginStep(stream_, 1).ok());
  Sync();
  EXPECT_TRUE(a->TakeLeavingGroupChunks().empty());
  ASSERT_TRUE(Take(1));
  // Not known until a step kernel ran over the board as it is.
  EXPECT_TRUE(a->TakeLeavingGroupChunks().empty());
  ASSERT_TRUE(a->BeginStep(stream_, 2).ok());
  Sync();
  const auto leaving = a->TakeLeavingGroupChunks();
  ASSERT_EQ(leaving.size(), 1u);
  EXPECT_EQ(leaving[0].first, kLeaseDevice);
  EXPECT_EQ(leaving[0].second.chunk, 1u);
  EXPECT_TRUE(a->TakeLeavingGroupChunks().empty()) << "off the board: named once";
  // The daemon renews the chunk and it joins again (another member's now): not A's to claim.
  Join(1);
  // What is left is one chunk: a stash of two overflows, one of one is placed.
  const uint64_t row_bytes = kPageBytes, rows = 2 * kPagesPerChunk;
  const CUdeviceptr src = Alloc(rows * row_bytes);
  auto two = a->Stash(stream_, Request(src, rows, rows, row_bytes));
  ASSERT_TRUE(two.ok());
  Sync();
  EXPECT_EQ(a->CurrentStep().flags, kernels::kStepOverflow);
  auto one = a->Stash(stream_, Request(src, kPagesPerChunk, rows, row_bytes));
  ASSERT_TRUE(one.ok());
  Sync();
  EXPECT_EQ(Owned(2), kPagesPerChunk);
  for (uint64_t p = kPagesPerChunk; p < 2 * kPagesPerChunk; ++p) {
    EXPECT_EQ(Tags()[p], kernels::kTagFree) << "page " << p << " of the chunk that left A";
  }
  ASSERT_TRUE(a->Release(stream_, *one).ok());
  ASSERT_TRUE(a->Release(stream_, *two).ok());
  Sync();
  EXPECT_EQ(Owned(2), 0u);
}

TEST_F(StreamCopierGroupTest, BadGroupCallsAreRefusedWithWhatToChange) {
  Join(0);
  std::unique_ptr<StreamCopier> a = Member(2);
  ASSERT_TRUE(a);
  EXPECT_TRUE(a->grouped());
  std::array<StreamCopier::GroupTier, kernels::kLeaseTiers> tiers{};
  tiers[kLeaseDevice] = {View(), 0};
  EXPECT_EQ(a->JoinGroup(3, kPagesPerChunk, tiers).code(), StatusCode::kFailedPrecondition);
  Add(*a, 0);
  EXPECT_EQ(a->AddGroupChunk(kLeaseDevice, Ref(0)).code(), StatusCode::kAlreadyExists);
  // A host-tier chunk is outside the device range; a chunk at a page that is not its own; no
  // peer range at all.
  EXPECT_EQ(a->AddGroupChunk(kLeaseDevice, Ref(kPoolChunks)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a->AddGroupChunk(kLeaseDevice, GroupChunkRef{1, 3, kPagesPerChunk}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(a->AddGroupChunk(kLeasePeer, Ref(1)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a->AddGroupChunk(7, Ref(1)).code(), StatusCode::kInvalidArgument);

  // A copier with a chunk of its own, or a tag that is not a member's.
  MakeCopier(1);
  ASSERT_TRUE(copier_->AddChunk(stream_, kLeaseDevice, 0, kChunkBytes).ok());
  EXPECT_EQ(copier_->JoinGroup(3, kPagesPerChunk, tiers).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(copier_->AddGroupChunk(kLeaseDevice, Ref(0)).code(), StatusCode::kFailedPrecondition);
  MakeCopier(1);
  EXPECT_EQ(copier_->JoinGroup(kernels::kTagFree, kPagesPerChunk, tiers).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(copier_->JoinGroup(3, kPagesPerChunk + 1, tiers).code(), StatusCode::kInvalidArgument);
  Sync();
}

}  // namespace
}  // namespace stash::client
