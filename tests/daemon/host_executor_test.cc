// daemon/copy/host_executor.cc's placement, and the peer tier's rule in daemon/tiers/tier.h: a
// stash goes to its own pool, else to the peer pool with the most free pages that lends it
// (beyond the reserve that pool keeps for its own sessions), else to the host tier, else it
// overflows; its reload and release give the pages back to whichever pool holds it.
#include "daemon/copy/host_executor.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "common/copy_workers.h"
#include "daemon/tiers/tier.h"

namespace stash::daemon {
namespace {

using kernels::Placement;

constexpr uint64_t kPage = 4096;

TEST(PeerReserve, IsAThirtySecondOfThePoolAtLeastAPage) {
  EXPECT_EQ(PeerReservePages(64), 2u);
  EXPECT_EQ(PeerReservePages(65), 3u);  // rounded up
  EXPECT_EQ(PeerReservePages(1), 1u);
}

TEST(PeerReserve, LendsOnlyWhileFreePagesStayAtOrAboveTheReserve) {
  EXPECT_TRUE(PeerLends(20, 12, 8));
  EXPECT_FALSE(PeerLends(20, 13, 8));
  EXPECT_FALSE(PeerLends(5, 6, 0));  // not even the pages
  EXPECT_TRUE(PeerLends(8, 0, 8));   // an empty stash
}

std::unique_ptr<Tier> MakeTier(const std::string& name, int pool, uint64_t pages) {
  auto tier = Tier::Create(name, pool, kPage, pages);
  EXPECT_TRUE(tier.ok()) << tier.status().message();
  return std::move(tier).value();
}

TEST(PeerReserve, APoolLendsWhatItsOwnSessionsDoNotUseNow) {
  auto tier = MakeTier("gpu1", 1, 64);
  MutexLock lock(&tier->mu());
  tier->PublishAlloc(40, 40 * kPage);  // its own
  tier->PublishFree(40, 40 * kPage);
  EXPECT_EQ(tier->PeerReserve(), 2u);  // not what they once held: they borrow in turn
  tier->PublishAlloc(30, 30 * kPage, /*lent=*/true);
  EXPECT_EQ(tier->Snapshot().pages_lent, 30u);
  EXPECT_TRUE(tier->Lends(32));  // 34 free: 2 stay
  EXPECT_FALSE(tier->Lends(33));
}

// Two (or three) device pools and a host tier, an executor per pool that lends to the others.
class HostExecutorPeerTest : public ::testing::Test {
 protected:
  void Build(uint64_t pool_pages, uint64_t host_pages, int pools = 2, bool peers = true) {
    for (int p = 0; p < pools; ++p) {
      tiers_.push_back(MakeTier("gpu" + std::to_string(p), p, pool_pages));
    }
    if (host_pages > 0) host_ = MakeTier("host", -1, host_pages);
    for (int p = 0; p < pools; ++p) {
      auto e = std::make_unique<HostExecutor>(tiers_[p].get(), host_.get(), &workers_);
      if (peers) {
        std::vector<Tier*> others;
        for (int q = 0; q < pools; ++q) {
          if (q != p) others.push_back(tiers_[q].get());
        }
        e->SetPeers(others);
      }
      executors_.push_back(std::move(e));
    }
  }

  // A stash of `pages` whole pages (one row a page) on pool `pool`, its bytes a pattern of
  // `seed`. The record (and the source, kept for comparing) stay with the test.
  StashRecord& Stash(int pool, uint64_t pages, uint8_t seed, bool allow_host_spill = true) {
    auto source = std::make_unique<std::vector<uint8_t>>(pages * kPage);
    for (size_t i = 0; i < source->size(); ++i) {
      (*source)[i] = static_cast<uint8_t>(seed + i * 7);
    }
    auto record = std::make_unique<StashRecord>();
    record->row_bytes = kPage;
    record->max_rows = pages;
    StashWork work;
    work.source = source->data();
    work.count.value = static_cast<int64_t>(pages);
    work.allow_host_spill = allow_host_spill;
    work.record = record.get();
    bool ran = false;
    executors_[pool]->Stash(work, [&] { ran = true; });
    EXPECT_TRUE(ran);
    sources_.push_back(std::move(source));
    records_.push_back(std::move(record));
    return *records_.back();
  }

  // Reloads the record on pool `pool` and checks the bytes against its stash's source.
  void ReloadAndCheck(int pool, StashRecord& record, size_t index) {
    std::vector<uint8_t> out(record.plan.bytes, 0);
    ReloadWork work;
    work.destination = out.data();
    work.record = &record;
    bool ran = false;
    executors_[pool]->Reload(work, [&] { ran = true; });
    EXPECT_TRUE(ran);
    EXPECT_EQ(out, *sources_[index]);
  }

  void Release(int pool, StashRecord& record) {
    ReloadWork work;
    work.record = &record;
    executors_[pool]->Reload(work, [] {});
  }

  uint64_t Used(const Tier& tier) { return tier.Snapshot().pages_used; }

  CopyWorkers workers_{1};
  std::vector<std::unique_ptr<Tier>> tiers_;
  std::unique_ptr<Tier> host_;
  std::vector<std::unique_ptr<HostExecutor>> executors_;
  std::vector<std::unique_ptr<std::vector<uint8_t>>> sources_;
  std::vector<std::unique_ptr<StashRecord>> records_;
};

TEST_F(HostExecutorPeerTest, AFullPoolStashesInAPeerPoolAndReloadsItByteExact) {
  Build(16, 16);
  StashRecord& own = Stash(0, 16, 1);
  EXPECT_EQ(own.plan.placement, Placement::kDevice);
  StashRecord& lent = Stash(0, 6, 2);
  EXPECT_EQ(lent.plan.placement, Placement::kPeer);
  EXPECT_EQ(lent.tier, tiers_[1].get());
  EXPECT_EQ(Used(*tiers_[1]), 6u);
  EXPECT_EQ(tiers_[1]->Snapshot().pages_lent, 6u);
  EXPECT_EQ(Used(*host_), 0u);
  ReloadAndCheck(0, lent, 1);
  EXPECT_EQ(Used(*tiers_[1]), 0u);
  EXPECT_EQ(tiers_[1]->Snapshot().pages_lent, 0u);
  EXPECT_TRUE(tiers_[1]->RingIsPermutation());
  ReloadAndCheck(0, own, 0);
  EXPECT_TRUE(tiers_[0]->RingIsPermutation());
}

TEST_F(HostExecutorPeerTest, APeerLendsOnlyBeyondItsReserveThenTheHostTierTakesTheStash) {
  Build(64, 16);
  Stash(0, 64, 1);
  // gpu1 keeps 2 of its 64 pages (1/32): 62 lent, a 63rd page goes to the host tier.
  EXPECT_EQ(Stash(0, 62, 2).plan.placement, Placement::kPeer);
  EXPECT_EQ(Stash(0, 1, 3).plan.placement, Placement::kHost);
  // gpu1's own session still has its reserve.
  EXPECT_EQ(Stash(1, 2, 4).plan.placement, Placement::kDevice);
}

TEST_F(HostExecutorPeerTest, APeerLendsWhatItsOwnSessionsReleased) {
  Build(64, 16);
  StashRecord& peer_own = Stash(1, 40, 1);  // gpu1's sessions once held 40 pages
  Release(1, peer_own);
  Stash(0, 64, 2);
  EXPECT_EQ(Stash(0, 62, 3).plan.placement, Placement::kPeer);
  // gpu1's own session, its pool lent out, still has the reserve.
  EXPECT_EQ(Stash(1, 2, 4).plan.placement, Placement::kDevice);
}

TEST_F(HostExecutorPeerTest, ThePeerWithTheMostFreePagesIsTriedFirst) {
  Build(16, 16, 3);
  Stash(1, 8, 1);  // gpu1 has 8 free, gpu2 16
  Stash(0, 16, 2);
  StashRecord& lent = Stash(0, 4, 3);
  EXPECT_EQ(lent.plan.placement, Placement::kPeer);
  EXPECT_EQ(lent.tier, tiers_[2].get());
}

TEST_F(HostExecutorPeerTest, WithoutPeersAFullPoolSpillsToTheHostTier) {
  Build(16, 16, 2, /*peers=*/false);
  Stash(0, 16, 1);
  EXPECT_EQ(Stash(0, 4, 2).plan.placement, Placement::kHost);
  EXPECT_EQ(Used(*tiers_[1]), 0u);
}

TEST_F(HostExecutorPeerTest, PeerStashesDoNotNeedHostSpillAndOverflowWhenNoneHasRoom) {
  Build(16, 16);
  Stash(0, 16, 1);
  EXPECT_EQ(Stash(0, 4, 2, /*allow_host_spill=*/false).plan.placement, Placement::kPeer);
  StashRecord& over = Stash(0, 12, 3, /*allow_host_spill=*/false);
  EXPECT_EQ(over.plan.placement, Placement::kOverflow);
  EXPECT_EQ(over.tier, nullptr);
}

TEST_F(HostExecutorPeerTest, ReleaseOnThePoolThatStashedFreesThePeersPages) {
  Build(16, 0);
  Stash(0, 16, 1);
  StashRecord& lent = Stash(0, 5, 2);
  ASSERT_EQ(lent.plan.placement, Placement::kPeer);
  Release(0, lent);
  EXPECT_EQ(Used(*tiers_[1]), 0u);
  EXPECT_EQ(tiers_[1]->Snapshot().stashes_live, 0u);
  EXPECT_TRUE(tiers_[1]->RingIsPermutation());
}

// Two pools' workers stash at once, gpu0's filling its pool and going to gpu1 (whose own stashes
// stay small, so it keeps lending), gpu1's into its own pool and, when that is busy or full, into
// gpu0: a worker never holds its own tier while it waits for a peer's, so neither waits for ever,
// and every page comes back.
TEST(HostExecutorPeerLocks, TwoPoolsLendingToEachOtherAtOnceDoNotDeadlock) {
  CopyWorkers workers(1);
  auto gpu0 = MakeTier("gpu0", 0, 64);
  auto gpu1 = MakeTier("gpu1", 1, 64);
  HostExecutor e0(gpu0.get(), nullptr, &workers);
  HostExecutor e1(gpu1.get(), nullptr, &workers);
  e0.SetPeers({gpu1.get()});
  e1.SetPeers({gpu0.get()});
  std::vector<uint8_t> source(4 * kPage, 0x5a);
  auto run = [&](HostExecutor& e, int seed, size_t most_held, int* lent) {
    unsigned state = static_cast<unsigned>(seed);
    std::vector<std::unique_ptr<StashRecord>> held;
    for (int i = 0; i < 4000; ++i) {
      state = state * 1103515245u + 12345u;
      if (held.size() < most_held && (state >> 16) % 3 != 0) {
        auto record = std::make_unique<StashRecord>();
        record->row_bytes = kPage;
        record->max_rows = 4;
        StashWork work;
        work.source = source.data();
        work.count.value = 1 + static_cast<int64_t>((state >> 8) % 4);
        work.record = record.get();
        e.Stash(work, [] {});
        *lent += record->plan.placement == Placement::kPeer;
        if (record->tier != nullptr) held.push_back(std::move(record));
      } else if (!held.empty()) {
        ReloadWork work;
        work.record = held.back().get();
        e.Reload(work, [] {});
        held.pop_back();
      }
    }
    for (auto& record : held) {
      ReloadWork work;
      work.record = record.get();
      e.Reload(work, [] {});
    }
  };
  int lent0 = 0;
  int lent1 = 0;
  std::thread t0([&] { run(e0, 1, 40, &lent0); });
  std::thread t1([&] { run(e1, 2, 8, &lent1); });
  t0.join();
  t1.join();
  EXPECT_GT(lent0, 100);  // gpu1 lent to gpu0's worker all along
  for (Tier* tier : {gpu0.get(), gpu1.get()}) {
    EXPECT_EQ(tier->Snapshot().pages_used, 0u) << tier->name();
    EXPECT_EQ(tier->Snapshot().pages_lent, 0u) << tier->name();
    EXPECT_TRUE(tier->RingIsPermutation()) << tier->name();
  }
}

}  // namespace
}  // namespace stash::daemon
