// bench/sharing_model: the pipeline schedule, the drifting routing, the peaks and the pool
// simulation the sharing phase reports (docs/benchmarks.md §8).
#include "bench/sharing_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>
#include <tuple>

namespace stash::bench {
namespace {

ScheduleConfig OneF1B(uint32_t node_stages = 1) { return {4, 1, 8, 4, node_stages}; }

TEST(SharingSchedule, EverySlotOnceAndReloadedAfterItsStash) {
  for (const ScheduleConfig c : {OneF1B(2), ScheduleConfig{4, 2, 8, 2, 4}}) {
    ASSERT_EQ(CheckSchedule(c), "");
    const std::vector<ScheduleSlot> slots = PipelineSlots(c);
    ASSERT_EQ(slots.size(), size_t{c.node_stages} * c.vp * c.layers_per_chunk * c.microbatches);
    std::set<std::tuple<uint32_t, uint32_t, uint32_t, uint32_t>> seen;
    for (const ScheduleSlot& s : slots) {
      EXPECT_TRUE(seen.insert({s.stage, s.chunk, s.layer, s.microbatch}).second);
      EXPECT_GT(s.reload_time, s.stash_time);
    }
  }
}

TEST(SharingSchedule, BackwardReloadsTheLayersOfAChunkLastToFirst) {
  const std::vector<ScheduleSlot> slots = PipelineSlots(OneF1B());
  std::map<uint32_t, std::vector<ScheduleSlot>> by_microbatch;
  for (const ScheduleSlot& s : slots) by_microbatch[s.microbatch].push_back(s);
  for (auto& [mb, layers] : by_microbatch) {
    std::sort(layers.begin(), layers.end(),
              [](const ScheduleSlot& a, const ScheduleSlot& b) { return a.layer < b.layer; });
    for (size_t l = 1; l < layers.size(); ++l) {
      EXPECT_GT(layers[l].stash_time, layers[l - 1].stash_time) << "microbatch " << mb;
      EXPECT_LT(layers[l].reload_time, layers[l - 1].reload_time) << "microbatch " << mb;
    }
  }
}

// 1F1B: stage s runs pp - s - 1 warmup forwards, then one more forward before its first
// backward, so it holds (pp - s) microbatches of layers at its peak.
TEST(SharingSchedule, OneF1BHoldsPpMinusStageMicrobatches) {
  const ScheduleConfig c = {4, 1, 8, 4, 4};
  const std::vector<ScheduleSlot> slots = PipelineSlots(c);
  for (uint32_t s = 0; s < c.pp; ++s) {
    EXPECT_EQ(PeakStashesInFlight(slots, s), (c.pp - s) * c.layers_per_chunk) << "stage " << s;
  }
}

// Interleaved: Megatron's warmup is (pp - s - 1) * 2 + (vp - 1) * pp virtual microbatches, and
// one more forward runs before the first backward.
TEST(SharingSchedule, InterleavedHoldsWarmupPlusOneChunks) {
  const ScheduleConfig c = {4, 2, 8, 2, 4};
  const std::vector<ScheduleSlot> slots = PipelineSlots(c);
  for (uint32_t s = 0; s < c.pp; ++s) {
    const uint32_t warmup = (c.pp - s - 1) * 2 + (c.vp - 1) * c.pp;
    EXPECT_EQ(PeakStashesInFlight(slots, s), (warmup + 1) * c.layers_per_chunk) << "stage " << s;
  }
}

TEST(SharingSchedule, RefusesWhatMegatronRefuses) {
  EXPECT_NE(CheckSchedule({4, 2, 6, 2, 1}).find("multiple of pp"), std::string::npos);
  EXPECT_NE(CheckSchedule({4, 1, 8, 4, 5}), "");
  EXPECT_NE(CheckNode(OneF1B(3), DriftConfig{}, NodeConfig{}).find("split evenly"),
            std::string::npos);
}

NodeConfig SmallNode(uint32_t steps) {
  NodeConfig node;
  node.steps = steps;
  node.bytes_per_token = 4;
  node.page_bytes = 4096;
  return node;
}

TEST(SharingRouting, LoadsArePaddedCappedAndSumToTheGroupsTokens) {
  DriftConfig routing;
  routing.capacity_factor = 8.0;  // no cap: every routed token arrives
  const NodeTrace trace = SimulateNode(OneF1B(), routing, SmallNode(20));
  const double routed =
      static_cast<double>(routing.tokens_per_microbatch * 8 * routing.topk);  // 8 ranks
  for (const auto& step : trace.tokens) {
    for (size_t s = 0; s < trace.slots.size(); ++s) {
      uint64_t sum = 0;
      for (uint32_t r = 0; r < 8; ++r) {
        const uint64_t t = step[s * 8 + r];
        EXPECT_EQ(t % routing.align, 0u);
        sum += t;
      }
      // Padding adds at most align - 1 per expert; the binomial draws wander a little.
      EXPECT_NEAR(static_cast<double>(sum), routed, 0.02 * routed);
    }
  }
  routing.capacity_factor = 1.0;  // now the budget cuts the hot ranks
  const NodeTrace capped = SimulateNode(OneF1B(), routing, SmallNode(20));
  uint64_t at_budget = 0;
  for (const auto& step : capped.tokens) {
    for (const uint64_t t : step) {
      EXPECT_LE(t, routing.BudgetTokens());
      at_budget += t == routing.BudgetTokens() ? 1 : 0;
    }
  }
  EXPECT_GT(at_budget, 0u);
}

TEST(SharingRouting, SameSeedSameTraceOtherSeedOther) {
  DriftConfig routing;
  const NodeTrace a = SimulateNode(OneF1B(), routing, SmallNode(5));
  const NodeTrace b = SimulateNode(OneF1B(), routing, SmallNode(5));
  EXPECT_EQ(a.tokens, b.tokens);
  routing.seed += 1;
  const NodeTrace c = SimulateNode(OneF1B(), routing, SmallNode(5));
  EXPECT_NE(a.tokens, c.tokens);
}

// Balanced routing leaves nothing to share between steps; a hot expert that jumps between
// ranks makes the sum of per-rank peaks grow past the node's peak.
TEST(SharingPeaks, MovingImbalanceIsWhatSharingSaves) {
  DriftConfig flat;
  flat.skew_sigma = 0;
  flat.hot_boost = 0;
  const Peaks even = MeasurePeaks(SimulateNode(OneF1B(), flat, SmallNode(200)));
  EXPECT_LT(static_cast<double>(even.sum_of_rank_peaks) / even.node_peak_pages, 1.03);

  DriftConfig moving = flat;
  moving.hot_boost = 3.0;
  moving.hot_move_steps = 2;
  const Peaks skewed = MeasurePeaks(SimulateNode(OneF1B(), moving, SmallNode(200)));
  EXPECT_GT(static_cast<double>(skewed.sum_of_rank_peaks) / skewed.node_peak_pages, 1.10);
  EXPECT_GE(skewed.sum_of_rank_peaks, skewed.node_peak_pages);
  EXPECT_EQ(skewed.step_rank_peaks.size(), 200u);
}

TEST(SharingPeaks, MegatronSizesOnTheBalancedCount) {
  DriftConfig routing;
  const NodeConfig node = SmallNode(1);
  const NodeTrace trace = SimulateNode(OneF1B(), routing, node);
  EXPECT_EQ(routing.BalancedTokens(), 32768u);                       // budget 49152 / 1.5
  const uint64_t tokens = static_cast<uint64_t>(1.10 * 16 * 32768);  // 4 microbatches x 4 layers
  EXPECT_EQ(MegatronRankPages(trace, 0, 1.10), (tokens * 4 + 4095) / 4096);
}

// A hand-made node: 2 ranks of one stage, one slot per "layer", pages = tokens.
NodeTrace Handmade(const std::vector<std::vector<uint64_t>>& tokens_per_rank) {
  NodeTrace trace;
  trace.node.node_gpus = 2;
  trace.node.bytes_per_token = 1;
  trace.node.page_bytes = 1;
  trace.rank_stage = {0, 0};
  const size_t slots = tokens_per_rank[0].size();
  for (uint32_t l = 0; l < slots; ++l) {
    // Forward stashes 0..n-1, backward reloads n-1..0.
    trace.slots.push_back({0, 0, l, 0, 1 + l, 100 + (slots - l)});
  }
  trace.tokens.assign(1, std::vector<uint64_t>(slots * 2));
  for (size_t s = 0; s < slots; ++s) {
    for (uint32_t r = 0; r < 2; ++r) trace.tokens[0][s * 2 + r] = tokens_per_rank[r][s];
  }
  return trace;
}

TEST(SharingPools, PerRankOverflowsWhereOneSharedPoolHolds) {
  // Rank 0 needs 12 pages at its peak, rank 1 needs 4: 16 in all.
  const NodeTrace trace = Handmade({{6, 6}, {2, 2}});
  const Peaks peaks = MeasurePeaks(trace);
  EXPECT_EQ(peaks.rank_peak_pages, (std::vector<uint64_t>{12, 4}));
  EXPECT_EQ(peaks.node_peak_pages, 16u);

  PoolSetup per_rank{{8, 8}, {0, 1}, 0};
  PoolOutcome o = SimulatePools(trace, per_rank);
  EXPECT_EQ(o.stashes, 4u);
  EXPECT_EQ(o.overflows, 1u);  // rank 0's second stash
  EXPECT_EQ(o.steps_with_overflow, 1u);

  per_rank.host_pages = 6;  // the host tier takes it instead
  o = SimulatePools(trace, per_rank);
  EXPECT_EQ(o.overflows, 0u);
  EXPECT_EQ(o.spills, 1u);

  const PoolOutcome shared = SimulatePools(trace, PoolSetup{{16}, {0, 0}, 0});
  EXPECT_EQ(shared.overflows, 0u);
  EXPECT_EQ(shared.spills, 0u);
  EXPECT_EQ(SharedPagesFor(trace, 0), 16u);
  EXPECT_EQ(SimulatePools(trace, PoolSetup{{15}, {0, 0}, 0}).steps_with_overflow, 1u);
}

TEST(SharingPools, WarmupStepsAreNotCounted) {
  NodeTrace trace = Handmade({{6, 6}, {2, 2}});
  trace.tokens.push_back(trace.tokens[0]);
  const PoolSetup small{{8, 8}, {0, 1}, 0};
  EXPECT_EQ(SimulatePools(trace, small).overflows, 2u);
  const PoolOutcome o = SimulatePools(trace, small, 1);
  EXPECT_EQ(o.steps, 1u);
  EXPECT_EQ(o.overflows, 1u);
}

TEST(SharingPools, FreesBeforeTakingAtTheSameInstant) {
  NodeTrace trace = Handmade({{6}, {6}});
  // Rank 1 stashes at the instant rank 0 reloads.
  trace.slots.push_back(trace.slots[0]);
  trace.slots[1].stash_time = trace.slots[0].reload_time;
  trace.slots[1].reload_time = trace.slots[0].reload_time + 10;
  trace.tokens[0] = {6, 0, 0, 6};
  const PoolOutcome o = SimulatePools(trace, PoolSetup{{6}, {0, 0}, 0});
  EXPECT_EQ(o.overflows, 0u);
}

TEST(SharingLeases, AimIsLastStepsPeakPlusAnEighthInWholeChunks) {
  Peaks peaks;
  peaks.step_rank_peaks = {{16, 1}, {0, 0}};
  // Step 1: rank 0 wants 16 + 2 = 18 -> 20 in chunks of 5; rank 1 wants 1 + 1 = 2 -> 5.
  EXPECT_EQ(LeaseAims(peaks, 5), (std::vector<uint64_t>{25}));
  EXPECT_EQ(LeaseAims(peaks, 1), (std::vector<uint64_t>{20}));
}

}  // namespace
}  // namespace stash::bench
