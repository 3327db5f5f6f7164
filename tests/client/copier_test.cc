#include "client/mapped/copier.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <random>
#include <thread>

#include "common/host_event.h"
#include "tests/client/chunk_fakes.h"

namespace stash::client {
namespace {

using testing::Caps;
using testing::FakeChunk;
using testing::kChunk;
using testing::kPage;

std::shared_ptr<SharedMemory> Memory(uint64_t bytes, uint32_t seed = 0) {
  auto m = SharedMemory::CreateSealed("copier-test", bytes);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  std::shared_ptr<SharedMemory> out = std::move(m).value();
  if (seed != 0) {
    std::mt19937 rng(seed);
    for (uint64_t i = 0; i < bytes; ++i) out->data()[i] = static_cast<uint8_t>(rng());
  }
  return out;
}

// A copier over `device_chunks` chunks of the own device and `host_chunks` of the host tier.
class CopierTest : public ::testing::Test {
 protected:
  void Start(int device_chunks, int host_chunks, bool allow_host = true, uint32_t threads = 2) {
    auto table = LeaseTable::Create(kPage, kChunk, Caps(8 * kChunk));
    ASSERT_TRUE(table.ok());
    uint64_t id = 1;
    for (int i = 0; i < device_chunks; ++i) {
      ASSERT_TRUE((*table)->AddChunk(kernels::kLeaseDevice, id++, FakeChunk(kChunk), kChunk).ok());
    }
    for (int i = 0; i < host_chunks; ++i) {
      ASSERT_TRUE((*table)->AddChunk(kernels::kLeaseHost, id++, FakeChunk(kChunk), kChunk).ok());
    }
    control_ = &(*table)->control();
    copier_ =
        std::make_unique<Copier>(std::move(table).value(), threads, allow_host,
                                 [this](uint64_t step, std::unique_ptr<LeaseTable>&, bool live) {
                                   steps_.push_back(step);
                                   live_at_step_.push_back(live);
                                 });
  }

  uint64_t Stash(const std::shared_ptr<SharedMemory>& src, uint64_t row_bytes, uint64_t max_rows,
                 int64_t count) {
    CopyOp op;
    op.kind = CopyOp::Kind::kStash;
    op.memory = src;
    op.row_bytes = row_bytes;
    op.max_rows = max_rows;
    op.count_value = count;
    return copier_->Submit(std::move(op));
  }
  uint64_t Reload(uint64_t ticket, const std::shared_ptr<SharedMemory>& dst, bool zero_tail) {
    CopyOp op;
    op.kind = CopyOp::Kind::kReload;
    op.ticket = ticket;
    op.memory = dst;
    op.zero_tail = zero_tail;
    return copier_->Submit(std::move(op));
  }
  uint64_t Release(uint64_t ticket) {
    CopyOp op;
    op.kind = CopyOp::Kind::kRelease;
    op.ticket = ticket;
    return copier_->Submit(std::move(op));
  }
  uint64_t BeginStep(uint64_t step) {
    copier_->NewEpoch();
    CopyOp op;
    op.kind = CopyOp::Kind::kBeginStep;
    op.step = step;
    return copier_->Submit(std::move(op));
  }
  Completion WaitOk(uint64_t id) {
    auto c = copier_->Wait(id, 10000);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? *c : Completion{};
  }

  kernels::SessionControl* control_ = nullptr;
  std::unique_ptr<Copier> copier_;
  std::vector<uint64_t> steps_;  // written on the copier thread, read after Drain
  std::vector<bool> live_at_step_;
};

TEST_F(CopierTest, StashThenReloadIsByteExactAndZeroesTheTail) {
  Start(4, 0);
  const uint64_t row = 1000;  // rows straddle pages
  auto src = Memory(40 * row, 7);
  const uint64_t ticket = Stash(src, row, 40, 33);
  const Completion stashed = WaitOk(ticket);
  EXPECT_EQ(stashed.ticket, ticket);
  EXPECT_EQ(stashed.tier, Tier::kDevice);
  EXPECT_EQ(stashed.rows, 33u);
  EXPECT_EQ(stashed.bytes, 33 * row);
  EXPECT_EQ(stashed.pages, 9u);
  auto dst = Memory(40 * row, 9);
  const Completion reloaded = WaitOk(Reload(ticket, dst, true));
  EXPECT_EQ(reloaded.rows, 33u);
  EXPECT_EQ(reloaded.tier, Tier::kDevice);
  EXPECT_EQ(std::memcmp(dst->data(), src->data(), 33 * row), 0);
  for (uint64_t i = 33 * row; i < 40 * row; ++i) ASSERT_EQ(dst->data()[i], 0) << i;
  EXPECT_EQ(kernels::ControlLoad(control_->tiers[0].pages_used), 0u);
  EXPECT_EQ(kernels::ControlLoad(control_->tiers[0].high_water), 9u);
}

TEST_F(CopierTest, FullDeviceSpillsToHostThenOverflows) {
  Start(1, 1);
  auto src = Memory(3 * kPage, 3);
  const Completion a = WaitOk(Stash(src, kPage, 3, 3));
  EXPECT_EQ(a.tier, Tier::kDevice);
  const Completion b = WaitOk(Stash(src, kPage, 3, 3));
  EXPECT_EQ(b.tier, Tier::kHost);
  EXPECT_TRUE(copier_->Flags().spilled);
  EXPECT_FALSE(copier_->Flags().overflow);
  const Completion c = WaitOk(Stash(src, kPage, 3, 3));
  EXPECT_EQ(c.tier, Tier::kOverflow);
  EXPECT_EQ(c.rows, 3u);
  EXPECT_EQ(c.pages, 0u);
  EXPECT_TRUE(copier_->Flags().overflow);
  // An overflowed stash took nothing: its ticket is not live.
  auto reload = copier_->Wait(Reload(c.ticket, Memory(3 * kPage), false), 10000);
  EXPECT_EQ(reload.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(kernels::ControlLoad(control_->stashes), 2u);
  EXPECT_EQ(kernels::ControlLoad(control_->spills), 1u);
  EXPECT_EQ(kernels::ControlLoad(control_->overflows), 1u);
  EXPECT_EQ(kernels::ControlLoad(control_->tiers[kernels::kLeaseDevice].pages_used), 3u);
  EXPECT_EQ(kernels::ControlLoad(control_->tiers[kernels::kLeaseHost].pages_used), 3u);
}

TEST_F(CopierTest, WithoutHostSpillAFullDeviceOverflows) {
  Start(1, 1, /*allow_host=*/false);
  auto src = Memory(3 * kPage, 3);
  EXPECT_EQ(WaitOk(Stash(src, kPage, 3, 3)).tier, Tier::kDevice);
  EXPECT_EQ(WaitOk(Stash(src, kPage, 3, 3)).tier, Tier::kOverflow);
}

TEST_F(CopierTest, ErrorsReadLikeTheDaemons) {
  Start(2, 0);
  auto src = Memory(4 * kPage, 5);
  auto negative = copier_->Wait(Stash(src, kPage, 4, -3), 10000);
  EXPECT_EQ(negative.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(negative.status().message().find("counts must be >= 0"), std::string::npos);
  auto unknown = copier_->Wait(Reload(12345, Memory(kPage), false), 10000);
  EXPECT_EQ(unknown.status().code(), StatusCode::kNotFound);
  EXPECT_NE(unknown.status().message().find("is not a live stash of this session"),
            std::string::npos);
  EXPECT_EQ(copier_->Wait(Release(12345), 10000).status().code(), StatusCode::kNotFound);
  // A destination smaller than max_rows * row_bytes: refused, and the stash stays.
  const uint64_t ticket = Stash(src, kPage, 4, 2);
  WaitOk(ticket);
  auto small = copier_->Wait(Reload(ticket, Memory(3 * kPage), false), 10000);
  EXPECT_EQ(small.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(small.status().message().find("runs past the end"), std::string::npos);
  auto dst = Memory(4 * kPage);
  EXPECT_EQ(WaitOk(Reload(ticket, dst, false)).rows, 2u);
  EXPECT_EQ(std::memcmp(dst->data(), src->data(), 2 * kPage), 0);
  EXPECT_EQ(kernels::ControlLoad(control_->rejected), 4u);
  // Each answer is handed out once.
  EXPECT_EQ(copier_->Wait(ticket, 0).status().code(), StatusCode::kNotFound);
}

TEST_F(CopierTest, ReleaseReturnsThePagesWithoutCopying) {
  Start(1, 0);
  auto src = Memory(4 * kPage, 1);
  const uint64_t ticket = Stash(src, kPage, 4, 4);
  WaitOk(ticket);
  EXPECT_EQ(WaitOk(Stash(src, kPage, 1, 1)).tier, Tier::kOverflow);
  EXPECT_EQ(WaitOk(Release(ticket)).pages, 4u);
  EXPECT_EQ(WaitOk(Stash(src, kPage, 4, 4)).tier, Tier::kDevice);
  EXPECT_EQ(kernels::ControlLoad(control_->releases), 1u);
}

TEST_F(CopierTest, ACountInMemoryIsReadOnlyAfterTheReadyEvent) {
  Start(4, 0);
  auto src = Memory(8 * kPage, 2);
  auto events = Memory(64);
  int64_t* count = reinterpret_cast<int64_t*>(events->data() + 8);
  *count = 1;
  CopyOp op;
  op.kind = CopyOp::Kind::kStash;
  op.memory = src;
  op.row_bytes = kPage;
  op.max_rows = 8;
  op.count = CounterRef{events, 8, 0};
  op.ready = CounterRef{events, 0, 1};
  op.done = CounterRef{events, 16, 5};
  const uint64_t ticket = copier_->Submit(std::move(op));
  // Operations behind it wait their turn.
  const uint64_t behind = Stash(src, kPage, 1, 1);
  EXPECT_FALSE(copier_->Poll(ticket).has_value());
  EXPECT_FALSE(copier_->Poll(behind).has_value());
  __atomic_store_n(count, 6, __ATOMIC_RELEASE);
  EventSignal(reinterpret_cast<uint64_t*>(events->data()), 1);
  EXPECT_EQ(WaitOk(ticket).rows, 6u);
  EXPECT_TRUE(EventReached(reinterpret_cast<uint64_t*>(events->data() + 16), 5));
  EXPECT_EQ(WaitOk(behind).rows, 1u);
}

TEST_F(CopierTest, BeginStepAnswersThePreviousStepsFlagsAndRollsTheControlBlock) {
  Start(1, 0);
  auto src = Memory(8 * kPage, 2);
  const uint64_t live = Stash(src, kPage, 3, 3);
  WaitOk(Stash(src, kPage, 8, 8));  // overflows
  EXPECT_TRUE(copier_->Flags().overflow);
  const uint64_t step = BeginStep(7);
  EXPECT_FALSE(copier_->Flags().overflow);  // cleared at once
  const Completion c = WaitOk(step);
  EXPECT_TRUE(c.step_overflow);
  EXPECT_FALSE(c.step_spilled);
  EXPECT_EQ(kernels::ControlLoad(control_->step), 7u);
  EXPECT_EQ(kernels::ControlLoad(control_->steps), 1u);
  EXPECT_EQ(kernels::ControlLoad(control_->tiers[0].last_step_high_water), 3u);
  // The overflowed stash's 8 pages count as demand.
  EXPECT_EQ(kernels::ControlLoad(control_->last_step_demand_high_water), 11u);
  EXPECT_EQ(kernels::ControlLoad(control_->step_flags), 0u);
  WaitOk(live);
  copier_->Drain();
  EXPECT_EQ(steps_, std::vector<uint64_t>{7});
  EXPECT_EQ(live_at_step_, std::vector<bool>{true});
  EXPECT_FALSE(WaitOk(BeginStep(8)).step_overflow);
}

// Every overflowed stash of a step counts as demand until the step ends (the rank holds it
// meanwhile): three overflows of 5 pages are 15 pages of demand, not 5. The stashes tried are
// counted per step: a step with none is no sample of demand for the daemon.
TEST_F(CopierTest, OverflowsOfAStepAddUpInDemandAndStashesAreCountedPerStep) {
  Start(1, 0);  // 4 pages
  auto src = Memory(5 * kPage, 3);
  const uint64_t placed = Stash(src, kPage, 2, 2);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(WaitOk(Stash(src, kPage, 5, 5)).tier, Tier::kOverflow);
  WaitOk(placed);
  EXPECT_EQ(kernels::ControlLoad(control_->demand_high_water), 17u);
  EXPECT_EQ(kernels::ControlLoad(control_->step_stashes), 4u);
  WaitOk(BeginStep(1));
  EXPECT_EQ(kernels::ControlLoad(control_->last_step_demand_high_water), 17u);
  EXPECT_EQ(kernels::ControlLoad(control_->last_step_stashes), 4u);
  // The overflows are gone with their step; the placed stash is still live.
  EXPECT_EQ(kernels::ControlLoad(control_->demand_pages), 2u);
  WaitOk(BeginStep(2));  // a step with no stash at all
  EXPECT_EQ(kernels::ControlLoad(control_->last_step_stashes), 0u);
  EXPECT_EQ(kernels::ControlLoad(control_->last_step_demand_high_water), 2u);
}

// A table change posted from another thread runs on the worker between operations; one that
// needs no stash live waits until none is.
TEST_F(CopierTest, PostedTableChangesRunBetweenOperations) {
  Start(1, 0);
  auto src = Memory(kPage, 5);
  const uint64_t live = WaitOk(Stash(src, kPage, 1, 1)).ticket;
  std::atomic<int> ran{0};
  std::atomic<int> tried{0};
  copier_->Post([&](std::unique_ptr<LeaseTable>& table, bool) {
    EXPECT_TRUE(table->AddChunk(kernels::kLeaseDevice, 9, FakeChunk(kChunk), kChunk).ok());
    ++ran;
    return true;
  });
  copier_->Post([&](std::unique_ptr<LeaseTable>&, bool stashes_live) {
    ++tried;
    return !stashes_live;
  });
  // 1 + 4 pages: fits only once the posted chunk is in.
  auto big = Memory(4 * kPage, 6);
  const Completion placed = WaitOk(Stash(big, kPage, 4, 4));
  EXPECT_EQ(placed.tier, Tier::kDevice);
  EXPECT_EQ(ran.load(), 1);
  const int tries_while_live = tried.load();
  EXPECT_GE(tries_while_live, 1);
  // Once no stash is live, the deferred change runs at the next boundary, though nothing new
  // was posted meanwhile.
  std::atomic<bool> done{false};
  copier_->Post([&](std::unique_ptr<LeaseTable>&, bool stashes_live) {
    if (stashes_live) return false;
    done = true;
    return true;
  });
  WaitOk(Release(live));
  WaitOk(Release(placed.ticket));
  EXPECT_FALSE(done.load()) << "a stash was live at every boundary so far";
  WaitOk(BeginStep(1));  // the first boundary with none live
  EXPECT_TRUE(done.load());
  std::unique_ptr<LeaseTable> table = copier_->Stop();
  ASSERT_NE(table, nullptr);
  EXPECT_EQ(table->chunks(kernels::kLeaseDevice), 2u);
}

// The copier tells its session when the lease runs short mid-step (a spill, an overflow, or
// the own device's chunks less than an eighth free), so the lease grows within the step.
TEST(CopierOutgrown, ShortLeasesAreReportedAtOnce) {
  auto table = LeaseTable::Create(kPage, kChunk, Caps(8 * kChunk));
  ASSERT_TRUE(table.ok());
  for (uint64_t id = 1; id <= 2; ++id) {
    ASSERT_TRUE((*table)->AddChunk(kernels::kLeaseDevice, id, FakeChunk(kChunk), kChunk).ok());
  }
  ASSERT_TRUE((*table)->AddChunk(kernels::kLeaseHost, 3, FakeChunk(kChunk), kChunk).ok());
  std::atomic<int> outgrown{0};
  Copier copier(std::move(table).value(), 1, /*allow_host=*/true, nullptr, [&] { ++outgrown; });
  auto src = Memory(8 * kPage, 1);
  auto stash = [&](uint64_t pages) {
    CopyOp op;
    op.kind = CopyOp::Kind::kStash;
    op.memory = src;
    op.row_bytes = kPage;
    op.max_rows = pages;
    op.count_value = static_cast<int64_t>(pages);
    auto c = copier.Wait(copier.Submit(std::move(op)), 10000);
    EXPECT_TRUE(c.ok());
    return c.ok() ? c->tier : Tier::kUnspecified;
  };
  EXPECT_EQ(stash(4), Tier::kDevice);  // 4 of 8 pages free: room enough
  EXPECT_EQ(outgrown.load(), 0);
  EXPECT_EQ(stash(4), Tier::kDevice);  // none free now
  EXPECT_EQ(outgrown.load(), 1);
  EXPECT_EQ(stash(4), Tier::kHost);  // a spill
  EXPECT_EQ(outgrown.load(), 2);
  EXPECT_EQ(stash(4), Tier::kOverflow);
  EXPECT_EQ(outgrown.load(), 3);
}

TEST_F(CopierTest, BigCopiesSplitOverThreadsStayByteExact) {
  auto table = LeaseTable::Create(kPage, 256 * kPage, Caps(256 * kPage));
  ASSERT_TRUE(table.ok());
  ASSERT_TRUE((*table)->AddChunk(0, 1, FakeChunk(256 * kPage), 256 * kPage).ok());
  copier_ = std::make_unique<Copier>(std::move(table).value(), 4, true, nullptr);
  const uint64_t bytes = 250 * kPage + 123;
  auto src = Memory(bytes, 11);
  const uint64_t ticket = Stash(src, 1, bytes, static_cast<int64_t>(bytes));
  EXPECT_EQ(WaitOk(ticket).pages, 251u);
  auto dst = Memory(bytes);
  WaitOk(Reload(ticket, dst, false));
  EXPECT_EQ(std::memcmp(dst->data(), src->data(), bytes), 0);
}

TEST_F(CopierTest, ManyThreadsSubmitAtOnce) {
  Start(8, 0);
  auto src = Memory(kPage, 4);
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        auto c = copier_->Wait(Stash(src, kPage, 1, 1), 10000);
        if (!c.ok()) continue;
        auto dst = Memory(kPage);
        CopyOp op;
        op.kind = CopyOp::Kind::kReload;
        op.ticket = c->ticket;
        op.memory = dst;
        if (copier_->Wait(copier_->Submit(std::move(op)), 10000).ok() &&
            std::memcmp(dst->data(), src->data(), kPage) == 0) {
          ++ok;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 800);
}

TEST_F(CopierTest, StopRunsWhatIsQueuedAndHandsTheTableBack) {
  Start(2, 0);
  auto src = Memory(kPage, 4);
  for (int i = 0; i < 5; ++i) Stash(src, kPage, 1, 1);
  std::unique_ptr<LeaseTable> table = copier_->Stop();
  ASSERT_NE(table, nullptr);
  EXPECT_EQ(kernels::RingFree(*table->ring(0)), 3u);
  EXPECT_EQ(table->ChunkIds(), (std::vector<uint64_t>{1, 2}));
}

}  // namespace
}  // namespace stash::client
