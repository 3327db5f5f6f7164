// The copier's bookkeeping (kernels/include/stash/kernels/lease_bookkeeping.h), the functions the
// host copier and the GPU's bookkeeping kernel both run. A random stream of stashes, reloads,
// releases and step boundaries is paged with PlanStashInOrder / StashPages / PopPages over three
// lease tiers, byte-checked, and every control-block field is compared after each operation
// against an independent model that keeps its own plain counters (it calls no bookkeeping
// function).
#include "stash/kernels/lease_bookkeeping.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <numeric>
#include <random>
#include <vector>

namespace stash::kernels {
namespace {

constexpr uint64_t kPageBytes = 64;

struct Tier {
  std::vector<uint64_t> ids;
  std::vector<uint8_t> bytes;
  PageRing ring{};
  explicit Tier(uint64_t pages) : ids(pages), bytes(pages * kPageBytes) {
    std::iota(ids.begin(), ids.end(), 0);
    ring = PageRing{ids.data(), pages, 0, pages};
  }
};

// What the model expects of the control block: plain numbers, kept by the test itself.
struct Model {
  uint64_t stashes = 0, reloads = 0, releases = 0, bytes_stashed = 0, bytes_reloaded = 0;
  uint64_t spills = 0, overflows = 0, rejected = 0, steps = 0, step = 0;
  uint64_t step_flags = 0, step_stashes = 0, last_step_stashes = 0;
  uint64_t overflow_pages = 0;  // this step's
  uint64_t demand_hw = 0, last_demand_hw = 0, largest = 0, last_largest = 0;
  std::array<uint64_t, kLeaseTiers> used{}, hw{}, last_hw{}, live{}, live_bytes{};

  uint64_t Used() const { return used[0] + used[1] + used[2]; }
  uint64_t Demand() const { return Used() + overflow_pages; }
  void NoteDemand(uint64_t pages) {
    demand_hw = std::max(demand_hw, Demand());
    largest = std::max(largest, pages);
  }
};

struct Live {
  uint32_t tier;
  uint64_t pages, bytes;
  std::vector<uint64_t> record;
  std::vector<uint8_t> data;
};

void ExpectMatches(const SessionControl& c, const Model& m, const std::array<Tier*, 3>& tiers) {
  EXPECT_EQ(c.stashes, m.stashes);
  EXPECT_EQ(c.reloads, m.reloads);
  EXPECT_EQ(c.releases, m.releases);
  EXPECT_EQ(c.bytes_stashed, m.bytes_stashed);
  EXPECT_EQ(c.bytes_reloaded, m.bytes_reloaded);
  EXPECT_EQ(c.spills, m.spills);
  EXPECT_EQ(c.overflows, m.overflows);
  EXPECT_EQ(c.rejected, m.rejected);
  EXPECT_EQ(c.steps, m.steps);
  EXPECT_EQ(c.step, m.step);
  EXPECT_EQ(c.step_flags, m.step_flags);
  EXPECT_EQ(c.step_stashes, m.step_stashes);
  EXPECT_EQ(c.last_step_stashes, m.last_step_stashes);
  EXPECT_EQ(c.demand_pages, m.Demand());
  EXPECT_EQ(c.demand_high_water, m.demand_hw);
  EXPECT_EQ(c.last_step_demand_high_water, m.last_demand_hw);
  EXPECT_EQ(c.largest_stash_pages, m.largest);
  EXPECT_EQ(c.last_step_largest_stash_pages, m.last_largest);
  for (uint32_t t = 0; t < kLeaseTiers; ++t) {
    SCOPED_TRACE("tier " + std::to_string(t));
    EXPECT_EQ(c.tiers[t].pages_used, m.used[t]);
    EXPECT_EQ(c.tiers[t].high_water, m.hw[t]);
    EXPECT_EQ(c.tiers[t].last_step_high_water, m.last_hw[t]);
    EXPECT_EQ(c.tiers[t].stashes_live, m.live[t]);
    EXPECT_EQ(c.tiers[t].bytes_live, m.live_bytes[t]);
    // The ring's head and tail are published as the rank's ring has them (0 before any move).
    if (c.tiers[t].ring_head != 0) {
      EXPECT_EQ(c.tiers[t].ring_head, tiers[t]->ring.head);
    }
    if (c.tiers[t].ring_tail != 0) {
      EXPECT_EQ(c.tiers[t].ring_tail, tiers[t]->ring.tail);
    }
    EXPECT_EQ(tiers[t]->ring.tail - tiers[t]->ring.head, tiers[t]->ring.capacity - m.used[t]);
  }
}

TEST(LeaseBookkeeping, ARandomStreamKeepsTheControlBlockAsTheModelSays) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  Tier device(24), peer(8), host(16);
  const std::array<Tier*, 3> tiers{&device, &peer, &host};
  SessionControl c{};
  CopierState s{};
  Model m;
  std::map<uint64_t, Live> live;
  uint64_t next_ticket = 1;
  const uint64_t row_bytes = 24;
  const uint64_t max_rows = 40;  // up to 15 pages

  for (int op = 0; op < 4000; ++op) {
    SCOPED_TRACE("operation " + std::to_string(op));
    const int what = static_cast<int>(rng() % 10);
    if (what < 5) {  // a stash; now and then a count past max_rows or a negative one
      int64_t count = static_cast<int64_t>(rng() % (max_rows + 1));
      if (rng() % 20 == 0) count = static_cast<int64_t>(max_rows + 1 + rng() % 5);
      const TierChoice choices[3] = {{&device.ring, Placement::kDevice},
                                     {&peer.ring, Placement::kPeer},
                                     {&host.ring, Placement::kHost}};
      const StashPlan plan =
          PlanStashInOrder(count, 1, max_rows, row_bytes, kPageBytes, choices, kLeaseTiers);
      if (plan.placement == Placement::kOverflow) {
        const uint64_t pages = OverflowPages(plan, max_rows, row_bytes, kPageBytes);
        EXPECT_EQ(pages, PagesFor(std::min<uint64_t>(count, max_rows) * row_bytes, kPageBytes));
        const uint64_t demand = RecordOverflow(c, s, pages);
        ++m.overflows;
        ++m.step_stashes;
        m.overflow_pages += pages;
        m.step_flags |= kStepOverflow;
        m.NoteDemand(pages);
        EXPECT_EQ(demand, m.Demand());
      } else {
        Tier& tier = *tiers[plan.tier];
        Live l{plan.tier, plan.pages, plan.bytes, std::vector<uint64_t>(plan.pages),
               std::vector<uint8_t>(plan.bytes)};
        for (uint8_t& b : l.data) b = static_cast<uint8_t>(rng());
        const PagedSpan span{tier.bytes.data(), kPageBytes, l.record.data(), plan.bytes};
        StashPages(l.data.data(), tier.ring, plan.head, span, 0, plan.pages);
        tier.ring.head = plan.head + plan.pages;
        const uint64_t demand =
            RecordPlaced(c, s, plan.tier, tier.ring.head, plan.pages, plan.bytes);
        ++m.stashes;
        ++m.step_stashes;
        m.bytes_stashed += plan.bytes;
        m.used[plan.tier] += plan.pages;
        m.hw[plan.tier] = std::max(m.hw[plan.tier], m.used[plan.tier]);
        ++m.live[plan.tier];
        m.live_bytes[plan.tier] += plan.bytes;
        if (plan.tier != kLeaseDevice) {
          ++m.spills;
          m.step_flags |= kStepSpilled;
        }
        m.NoteDemand(plan.pages);
        EXPECT_EQ(demand, m.Demand());
        live.emplace(next_ticket++, std::move(l));
      }
    } else if (what < 8 && !live.empty()) {  // a reload (byte-checked) or a release
      auto it = std::next(live.begin(), static_cast<std::ptrdiff_t>(rng() % live.size()));
      Live& l = it->second;
      Tier& tier = *tiers[l.tier];
      const bool reload = what < 7;
      if (reload) {
        std::vector<uint8_t> back(l.bytes);
        const PagedSpan span{tier.bytes.data(), kPageBytes, l.record.data(), l.bytes};
        PopPages(back.data(), span, 0, l.pages);
        ASSERT_EQ(back, l.data);
      }
      ReturnPages(tier.ring, tier.ring.tail, l.record.data(), 0, l.pages);
      tier.ring.tail += l.pages;
      RecordReturned(c, l.tier, tier.ring.tail, l.pages, l.bytes);
      m.used[l.tier] -= l.pages;
      --m.live[l.tier];
      m.live_bytes[l.tier] -= l.bytes;
      if (reload) {
        RecordReloaded(c, l.bytes);
        ++m.reloads;
        m.bytes_reloaded += l.bytes;
      } else {
        RecordReleased(c);
        ++m.releases;
      }
      live.erase(it);
    } else if (what == 8) {
      RecordRejected(c);
      ++m.rejected;
    } else {  // a step boundary
      const uint64_t step = m.step + 1 + rng() % 3;
      EXPECT_EQ(RecordBeginStep(c, s, step), m.step_flags);
      m.step = step;
      ++m.steps;
      m.step_flags = 0;
      m.last_hw = m.hw;
      m.hw = m.used;
      m.last_demand_hw = m.demand_hw;
      m.overflow_pages = 0;
      m.demand_hw = m.Demand();
      m.last_step_stashes = m.step_stashes;
      m.step_stashes = 0;
      m.last_largest = m.largest;
      m.largest = 0;
      EXPECT_EQ(s.step_flags, 0u);
      EXPECT_EQ(s.step_overflow_pages, 0u);
    }
    ExpectMatches(c, m, tiers);
    if (HasFailure()) return;
  }
}

TEST(LeaseBookkeeping, ALeaseIsShortWhenAStashSpilledOrTheDeviceIsUnderAnEighthFree) {
  EXPECT_TRUE(LeaseShort(/*spilled=*/true, 100, 100));
  EXPECT_FALSE(LeaseShort(false, 13, 100));  // 13 * 8 = 104 >= 100
  EXPECT_TRUE(LeaseShort(false, 12, 100));
  EXPECT_FALSE(LeaseShort(false, 0, 0));  // nothing leased: nothing to be short of
}

TEST(LeaseBookkeeping, OutgrownIsReportedOncePerEighthOfGrowthAndAgainAfterAStep) {
  SessionControl c{};
  CopierState s{};
  EXPECT_TRUE(ReportOutgrown(s, 80));
  EXPECT_FALSE(ReportOutgrown(s, 80));
  EXPECT_FALSE(ReportOutgrown(s, 90));  // 80 + 10 is not more than an eighth
  EXPECT_TRUE(ReportOutgrown(s, 91));
  EXPECT_EQ(s.outgrown, 2u);
  RecordBeginStep(c, s, 1);
  EXPECT_TRUE(ReportOutgrown(s, 10));  // a new step starts over
  EXPECT_EQ(s.outgrown, 3u);
}

TEST(LeaseBookkeeping, DrainingIsTheDaemonsFlag) {
  SessionControl c{};
  EXPECT_FALSE(Draining(c));
  c.daemon_flags = kDaemonDraining;
  EXPECT_TRUE(Draining(c));
}

TEST(LeaseBookkeeping, ATierIndexPastTheLastCountsAsTheHostTier) {
  // The GPU kernel takes the tier from a plan in device memory; an index out of range never
  // writes past the block.
  SessionControl c{};
  CopierState s{};
  RecordPlaced(c, s, 7, 3, 3, 100);
  EXPECT_EQ(c.tiers[kLeaseHost].pages_used, 3u);
  RecordReturned(c, 7, 3, 3, 100);
  EXPECT_EQ(c.tiers[kLeaseHost].pages_used, 0u);
}

}  // namespace
}  // namespace stash::kernels
