#include "bench/sharing_model.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <tuple>

#include "stash/kernels/paging.h"

namespace stash::bench {
namespace {

uint64_t RoundUp(uint64_t v, uint64_t m) { return (v + m - 1) / m * m; }

// One operation of a stage: forward or backward of (chunk, microbatch).
struct Op {
  bool backward = false;
  uint32_t chunk = 0;
  uint32_t microbatch = 0;
};

// Megatron's order of a stage's operations (pipeline_parallel/schedules.py): warmup forwards,
// then one forward and one backward in turn, then the cooldown backwards. Interleaved: virtual
// microbatch k runs chunk (k mod pp*vp) / pp of microbatch (k / (pp*vp)) * pp + k mod pp, and
// backwards take the chunks in reverse.
std::vector<Op> StageOrder(const ScheduleConfig& c, uint32_t stage) {
  const uint32_t total = c.microbatches * c.vp;
  uint32_t warmup = c.vp == 1 ? c.pp - stage - 1 : (c.pp - stage - 1) * 2 + (c.vp - 1) * c.pp;
  warmup = std::min(warmup, total);
  auto virtual_op = [&](uint32_t k, bool backward) {
    const uint32_t group = c.pp * c.vp;
    uint32_t chunk = (k % group) / c.pp;
    if (backward) chunk = c.vp - 1 - chunk;
    return Op{backward, chunk, (k / group) * c.pp + k % c.pp};
  };
  std::vector<Op> order;
  for (uint32_t k = 0; k < warmup; ++k) order.push_back(virtual_op(k, false));
  for (uint32_t i = 0; i + warmup < total; ++i) {
    order.push_back(virtual_op(warmup + i, false));
    order.push_back(virtual_op(i, true));
  }
  for (uint32_t k = total - warmup; k < total; ++k) order.push_back(virtual_op(k, true));
  return order;
}

// Inclusion probabilities: min(1, c * p) with c such that they sum to topk.
std::vector<double> Inclusion(const std::vector<double>& p, uint32_t topk) {
  std::vector<double> pi(p.size(), 0);
  std::vector<bool> capped(p.size(), false);
  for (size_t round = 0; round <= p.size(); ++round) {
    double rest = topk;
    double mass = 0;
    for (size_t e = 0; e < p.size(); ++e) {
      if (capped[e]) {
        rest -= 1;
      } else {
        mass += p[e];
      }
    }
    bool more = false;
    for (size_t e = 0; e < p.size(); ++e) {
      if (capped[e]) {
        pi[e] = 1;
        continue;
      }
      pi[e] = mass > 0 ? rest * p[e] / mass : 0;
      if (pi[e] > 1) {
        capped[e] = true;
        more = true;
      }
    }
    if (!more) break;
  }
  return pi;
}

// The drifting popularity of one MoE layer.
struct LayerState {
  std::vector<double> log_popularity;
  uint32_t hot = 0;
};

}  // namespace

uint64_t DriftConfig::BudgetTokens() const {
  const double raw = static_cast<double>(tokens_per_microbatch) * topk * capacity_factor;
  return RoundUp(static_cast<uint64_t>(std::ceil(raw)), align);
}

uint64_t DriftConfig::BalancedTokens() const {
  return static_cast<uint64_t>(std::floor(static_cast<double>(BudgetTokens()) / capacity_factor));
}

std::string CheckSchedule(const ScheduleConfig& c) {
  if (c.pp == 0 || c.vp == 0 || c.microbatches == 0 || c.layers_per_chunk == 0) {
    return "pp, vp, microbatches and layers per chunk must be at least 1";
  }
  if (c.vp > 1 && c.microbatches % c.pp != 0) {
    return "interleaved 1F1B (vp > 1) needs microbatches (" + std::to_string(c.microbatches) +
           ") to be a multiple of pp (" + std::to_string(c.pp) + "), as Megatron does";
  }
  if (c.node_stages == 0 || c.node_stages > c.pp) {
    return "node stages must be between 1 and pp (" + std::to_string(c.pp) + ")";
  }
  return "";
}

std::vector<ScheduleSlot> PipelineSlots(const ScheduleConfig& c) {
  const uint64_t layers = c.layers_per_chunk;
  const uint64_t forward = 2 * layers;   // time units of a chunk's forward
  const uint64_t backward = 4 * layers;  // and of its backward
  std::vector<std::vector<Op>> orders(c.pp);
  for (uint32_t s = 0; s < c.pp; ++s) orders[s] = StageOrder(c, s);
  // End times, -1 = not run yet: [stage][chunk][microbatch].
  auto index = [&](uint32_t s, uint32_t chunk, uint32_t mb) {
    return (static_cast<size_t>(s) * c.vp + chunk) * c.microbatches + mb;
  };
  const size_t cells = static_cast<size_t>(c.pp) * c.vp * c.microbatches;
  std::vector<int64_t> forward_end(cells, -1), backward_end(cells, -1);
  std::vector<size_t> next(c.pp, 0);
  std::vector<uint64_t> free_at(c.pp, 0);
  std::vector<ScheduleSlot> slots;
  // Runs every stage's next operation whose input is there, until none is left (CheckSchedule
  // admits only orders that finish: Megatron's, with whole rounds of pp microbatches when
  // interleaved).
  bool progress = true;
  while (progress) {
    progress = false;
    for (uint32_t s = 0; s < c.pp; ++s) {
      while (next[s] < orders[s].size()) {
        const Op op = orders[s][next[s]];
        int64_t ready = 0;
        if (!op.backward) {
          if (s > 0) {
            ready = forward_end[index(s - 1, op.chunk, op.microbatch)];
          } else if (op.chunk > 0) {
            ready = forward_end[index(c.pp - 1, op.chunk - 1, op.microbatch)];
          }
        } else if (s + 1 < c.pp) {
          ready = backward_end[index(s + 1, op.chunk, op.microbatch)];
        } else if (op.chunk + 1 < c.vp) {
          ready = backward_end[index(0, op.chunk + 1, op.microbatch)];
        } else {
          ready = forward_end[index(s, op.chunk, op.microbatch)];
        }
        if (ready < 0) break;  // its input has not arrived yet
        const uint64_t start = std::max<uint64_t>(free_at[s], static_cast<uint64_t>(ready));
        const uint64_t end = start + (op.backward ? backward : forward);
        free_at[s] = end;
        const size_t cell = index(s, op.chunk, op.microbatch);
        if (op.backward) {
          backward_end[cell] = static_cast<int64_t>(end);
          if (s < c.node_stages) {
            for (ScheduleSlot& slot : slots) {
              if (slot.stage == s && slot.chunk == op.chunk && slot.microbatch == op.microbatch) {
                // Backward takes the layers last to first, 4 units each; the reload frees the
                // pages half way through the layer.
                slot.reload_time = start + 4 * (layers - 1 - slot.layer) + 2;
              }
            }
          }
        } else {
          forward_end[cell] = static_cast<int64_t>(end);
          if (s < c.node_stages) {
            for (uint32_t l = 0; l < layers; ++l) {
              slots.push_back({s, op.chunk, l, op.microbatch, start + 2 * (l + 1), 0});
            }
          }
        }
        ++next[s];
        progress = true;
      }
    }
  }
  std::sort(slots.begin(), slots.end(), [](const ScheduleSlot& a, const ScheduleSlot& b) {
    return std::tie(a.stash_time, a.stage, a.layer) < std::tie(b.stash_time, b.stage, b.layer);
  });
  return slots;
}

uint32_t PeakStashesInFlight(const std::vector<ScheduleSlot>& slots, uint32_t stage) {
  std::vector<std::pair<uint64_t, int>> deltas;
  for (const ScheduleSlot& s : slots) {
    if (s.stage != stage) continue;
    deltas.emplace_back(s.stash_time, 1);
    deltas.emplace_back(s.reload_time, -1);
  }
  std::sort(deltas.begin(), deltas.end());  // at equal times the -1 (free) comes first
  int now = 0, peak = 0;
  for (const auto& [t, d] : deltas) {
    now += d;
    peak = std::max(peak, now);
  }
  return static_cast<uint32_t>(peak);
}

uint64_t NodeTrace::Pages(uint32_t step, size_t slot, uint32_t rank) const {
  const uint64_t count = tokens[step][slot * node.node_gpus + rank];
  return kernels::PagesFor(count * node.bytes_per_token, node.page_bytes);
}

std::string CheckNode(const ScheduleConfig& schedule, const DriftConfig& routing,
                      const NodeConfig& node) {
  std::string why = CheckSchedule(schedule);
  if (!why.empty()) return why;
  if (node.node_gpus == 0 || node.node_gpus % schedule.node_stages != 0) {
    return "node GPUs (" + std::to_string(node.node_gpus) + ") must split evenly over the node's " +
           std::to_string(schedule.node_stages) + " stages";
  }
  const uint32_t group = node.node_gpus / schedule.node_stages;
  if (routing.experts == 0 || routing.experts % group != 0) {
    return "experts (" + std::to_string(routing.experts) +
           ") must split evenly over an expert-parallel group of " + std::to_string(group);
  }
  if (routing.topk == 0 || routing.topk > routing.experts) return "topk must be in [1, experts]";
  if (routing.capacity_factor < 1.0) return "the capacity factor must be at least 1.0";
  if (routing.align == 0 || node.page_bytes == 0 || node.bytes_per_token == 0) {
    return "align, page bytes and bytes per token must be positive";
  }
  if (routing.drift_steps <= 0 || routing.hot_move_steps < 1) {
    return "drift steps must be > 0 and hot-expert move steps >= 1";
  }
  return "";
}

NodeTrace SimulateNode(const ScheduleConfig& schedule, const DriftConfig& routing,
                       const NodeConfig& node) {
  NodeTrace trace;
  trace.schedule = schedule;
  trace.routing = routing;
  trace.node = node;
  trace.slots = PipelineSlots(schedule);
  const uint32_t group = node.node_gpus / schedule.node_stages;
  for (uint32_t r = 0; r < node.node_gpus; ++r) trace.rank_stage.push_back(r / group);
  const uint32_t local = routing.experts / group;
  const uint64_t budget = routing.BudgetTokens();
  const uint64_t group_tokens = routing.tokens_per_microbatch * group;

  std::mt19937_64 rng(routing.seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::uniform_int_distribution<uint32_t> any_expert(0, routing.experts - 1);
  // One state per (stage, chunk, layer) of the node.
  auto layer_index = [&](const ScheduleSlot& s) {
    return (static_cast<size_t>(s.stage) * schedule.vp + s.chunk) * schedule.layers_per_chunk +
           s.layer;
  };
  std::vector<LayerState> layers(static_cast<size_t>(schedule.node_stages) * schedule.vp *
                                 schedule.layers_per_chunk);
  for (LayerState& l : layers) {
    for (uint32_t e = 0; e < routing.experts; ++e) {
      l.log_popularity.push_back(routing.skew_sigma * normal(rng));
    }
    l.hot = any_expert(rng);
  }
  const double rho = std::exp(-1.0 / routing.drift_steps);
  const double kick = routing.skew_sigma * std::sqrt(1.0 - rho * rho);
  std::vector<std::vector<double>> inclusion(layers.size());
  std::vector<uint64_t> per_rank(group);
  trace.tokens.assign(node.steps, std::vector<uint64_t>(trace.slots.size() * node.node_gpus, 0));
  for (uint32_t step = 0; step < node.steps; ++step) {
    for (size_t i = 0; i < layers.size(); ++i) {
      LayerState& l = layers[i];
      if (step > 0) {
        for (double& v : l.log_popularity) v = rho * v + kick * normal(rng);
        if (uniform(rng) < 1.0 / routing.hot_move_steps) l.hot = any_expert(rng);
      }
      std::vector<double> p(routing.experts);
      for (uint32_t e = 0; e < routing.experts; ++e) {
        p[e] = std::exp(l.log_popularity[e]) * (e == l.hot ? 1.0 + routing.hot_boost : 1.0);
      }
      inclusion[i] = Inclusion(p, routing.topk);
    }
    for (size_t s = 0; s < trace.slots.size(); ++s) {
      const ScheduleSlot& slot = trace.slots[s];
      const std::vector<double>& pi = inclusion[layer_index(slot)];
      std::fill(per_rank.begin(), per_rank.end(), 0);
      for (uint32_t e = 0; e < routing.experts; ++e) {
        const auto n = static_cast<double>(group_tokens);
        const double mean = n * pi[e];
        const double draw = std::round(mean + std::sqrt(mean * (1.0 - pi[e])) * normal(rng));
        const auto count = static_cast<uint64_t>(std::clamp(draw, 0.0, n));
        per_rank[e / local] += RoundUp(count, routing.align);
      }
      for (uint32_t r = 0; r < group; ++r) {
        const uint32_t rank = slot.stage * group + r;
        trace.tokens[step][s * node.node_gpus + rank] = std::min(per_rank[r], budget);
      }
    }
  }
  return trace;
}

std::vector<NodeEvent> StepEvents(const NodeTrace& trace) {
  std::vector<NodeEvent> events;
  for (size_t s = 0; s < trace.slots.size(); ++s) {
    for (uint32_t r = 0; r < trace.Ranks(); ++r) {
      if (trace.rank_stage[r] != trace.slots[s].stage) continue;
      events.push_back({trace.slots[s].stash_time, false, r, static_cast<uint32_t>(s)});
      events.push_back({trace.slots[s].reload_time, true, r, static_cast<uint32_t>(s)});
    }
  }
  std::sort(events.begin(), events.end(), [](const NodeEvent& a, const NodeEvent& b) {
    // Reloads first at equal times: pages freed at an instant are free for that instant.
    return std::make_tuple(a.time, !a.reload, a.rank, a.slot) <
           std::make_tuple(b.time, !b.reload, b.rank, b.slot);
  });
  return events;
}

Peaks MeasurePeaks(const NodeTrace& trace) {
  Peaks out;
  const uint32_t ranks = trace.Ranks();
  out.rank_peak_pages.assign(ranks, 0);
  const std::vector<NodeEvent> events = StepEvents(trace);
  double ratio_sum = 0;
  for (uint32_t step = 0; step < trace.tokens.size(); ++step) {
    std::vector<uint64_t> now(ranks, 0), step_peak(ranks, 0);
    uint64_t node = 0, node_peak = 0;
    for (const NodeEvent& e : events) {
      const uint64_t pages = trace.Pages(step, e.slot, e.rank);
      if (e.reload) {
        now[e.rank] -= pages;
        node -= pages;
      } else {
        now[e.rank] += pages;
        node += pages;
        step_peak[e.rank] = std::max(step_peak[e.rank], now[e.rank]);
        node_peak = std::max(node_peak, node);
      }
    }
    for (uint32_t r = 0; r < ranks; ++r) {
      out.rank_peak_pages[r] = std::max(out.rank_peak_pages[r], step_peak[r]);
    }
    out.step_rank_peaks.push_back(step_peak);
    out.node_peak_pages = std::max(out.node_peak_pages, node_peak);
    const uint64_t step_sum = std::accumulate(step_peak.begin(), step_peak.end(), uint64_t{0});
    ratio_sum += node_peak > 0 ? static_cast<double>(step_sum) / static_cast<double>(node_peak) : 1;
  }
  out.sum_of_rank_peaks =
      std::accumulate(out.rank_peak_pages.begin(), out.rank_peak_pages.end(), uint64_t{0});
  out.mean_step_ratio = trace.tokens.empty() ? 0 : ratio_sum / trace.tokens.size();
  return out;
}

std::vector<uint64_t> LeaseAims(const Peaks& peaks, uint64_t chunk_pages) {
  std::vector<uint64_t> out;
  for (size_t step = 1; step < peaks.step_rank_peaks.size(); ++step) {
    uint64_t sum = 0;
    for (const uint64_t demand : peaks.step_rank_peaks[step - 1]) {
      const uint64_t margin = std::max<uint64_t>(1, (demand + 7) / 8);
      sum += RoundUp(demand + margin, std::max<uint64_t>(1, chunk_pages));
    }
    out.push_back(sum);
  }
  return out;
}

uint64_t MegatronRankPages(const NodeTrace& trace, uint32_t rank, double factor) {
  const uint32_t in_flight = PeakStashesInFlight(trace.slots, trace.rank_stage[rank]);
  const auto tokens = static_cast<uint64_t>(
      factor * static_cast<double>(in_flight * trace.routing.BalancedTokens()));
  return kernels::PagesFor(tokens * trace.node.bytes_per_token, trace.node.page_bytes);
}

PoolOutcome SimulatePools(const NodeTrace& trace, const PoolSetup& setup, uint32_t warmup) {
  enum Where : uint8_t { kNone, kPool, kHost, kOverflowed };
  PoolOutcome out;
  const std::vector<NodeEvent> events = StepEvents(trace);
  const uint32_t ranks = trace.Ranks();
  std::vector<uint8_t> where(trace.slots.size() * ranks, kNone);
  for (uint32_t step = 0; step < trace.tokens.size(); ++step) {
    std::vector<uint64_t> used(setup.pool_pages.size(), 0);
    uint64_t host = 0, overflows = 0, spills = 0, stashes = 0;
    for (const NodeEvent& e : events) {
      const uint64_t pages = trace.Pages(step, e.slot, e.rank);
      const uint32_t pool = setup.rank_pool[e.rank];
      uint8_t& w = where[e.slot * ranks + e.rank];
      if (e.reload) {
        if (w == kPool) used[pool] -= pages;
        if (w == kHost) host -= pages;
        w = kNone;
        continue;
      }
      ++stashes;
      if (used[pool] + pages <= setup.pool_pages[pool]) {
        used[pool] += pages;
        w = kPool;
      } else if (host + pages <= setup.host_pages) {
        host += pages;
        w = kHost;
        ++spills;
      } else {
        w = kOverflowed;
        ++overflows;
      }
    }
    if (step < warmup) continue;
    ++out.steps;
    out.stashes += stashes;
    out.overflows += overflows;
    out.spills += spills;
    out.steps_with_overflow += overflows > 0 ? 1 : 0;
    out.steps_with_spill += spills > 0 ? 1 : 0;
  }
  return out;
}

uint64_t SharedPagesFor(const NodeTrace& trace, uint64_t steps_allowed) {
  PoolSetup setup;
  setup.rank_pool.assign(trace.Ranks(), 0);
  uint64_t lo = 1, hi = std::max<uint64_t>(1, MeasurePeaks(trace).node_peak_pages);
  while (lo < hi) {
    const uint64_t mid = lo + (hi - lo) / 2;
    setup.pool_pages = {mid};
    if (SimulatePools(trace, setup).steps_with_overflow <= steps_allowed) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

}  // namespace stash::bench
