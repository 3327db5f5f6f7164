// A model of what the ranks of one node stash over many training steps, to measure what one
// pool for all of them saves over a pool per rank (docs/benchmarks.md, "Sharing"). It adds
// three things to routing_model.h's single-step model:
//
// Schedule. A pipeline of `pp` stages runs `microbatches` microbatches per step with Megatron's
// 1F1B order, or its interleaved 1F1B with `vp` model chunks per stage (research/domain.md §3.4).
// Every chunk holds `layers_per_chunk` MoE layers. Operations take unit time per layer, a
// backward twice a forward, and start when their stage is free and their input has arrived
// (list scheduling). A layer's forward stashes when it ends; its backward reloads (and frees the
// pages) half way through the layer's backward time. The node holds stages [0, node_stages),
// node_gpus / node_stages GPUs each, and each stage's GPUs form one expert-parallel group.
//
// Routing that moves. Every MoE layer has its own expert popularity, which drifts: the log
// popularity of each expert is an Ornstein-Uhlenbeck process over steps (stationary standard
// deviation `skew_sigma`, correlation time `drift_steps`), and one hot expert per layer gets
// (1 + hot_boost) times its share and jumps to a random expert every `hot_move_steps` steps on
// average. Each microbatch, an expert is picked by a token with probability min(1, topk * p)
// (renormalised so every token picks topk experts) and the counts are binomial draws (normal
// approximation). A rank's load is the sum of its local experts' counts, each padded up to
// `align`, capped at the static budget round_up(tokens * topk * capacity_factor, align).
//
// Pools. A stash of `tokens` takes PagesFor(tokens * bytes_per_token, page_bytes) pages (the
// daemon's rule). SimulatePools runs the stashes of every step in time order through a set of
// pools (a stash that does not fit its pool spills to the host tier when that has room, else
// overflows and takes nothing), freeing before taking at the same instant.
#ifndef STASH_BENCH_SHARING_MODEL_H_
#define STASH_BENCH_SHARING_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

namespace stash::bench {

struct ScheduleConfig {
  uint32_t pp = 4;                // pipeline stages of the job
  uint32_t vp = 1;                // model chunks per stage; > 1 = interleaved 1F1B
  uint32_t microbatches = 8;      // per step; a multiple of pp when vp > 1
  uint32_t layers_per_chunk = 4;  // MoE layers per model chunk
  uint32_t node_stages = 1;       // stages [0, node_stages) run on this node
};

// One stash of one layer of one microbatch on one stage (every GPU of the stage makes it).
struct ScheduleSlot {
  uint32_t stage = 0;
  uint32_t chunk = 0;
  uint32_t layer = 0;  // within the chunk
  uint32_t microbatch = 0;
  uint64_t stash_time = 0;   // when its forward ends
  uint64_t reload_time = 0;  // when its backward frees it
};

// The stashes of the node's stages in one step. INVALID_ARGUMENT-like problems (a microbatch
// count the interleaved order cannot take) come back as an error text; empty = fine.
std::string CheckSchedule(const ScheduleConfig& config);
std::vector<ScheduleSlot> PipelineSlots(const ScheduleConfig& config);
// The most stashes one GPU of `stage` holds at once (what Megatron's avg-based sizing counts).
uint32_t PeakStashesInFlight(const std::vector<ScheduleSlot>& slots, uint32_t stage);

struct DriftConfig {
  uint32_t experts = 64;
  uint32_t topk = 8;
  uint64_t tokens_per_microbatch = 4096;  // per rank: sequence length x micro batch size
  double capacity_factor = 1.5;
  uint64_t align = 32;         // per-expert padding (MXFP8 router padding)
  double skew_sigma = 0.47;    // stationary std of log popularity (~ Dirichlet(4), CV 0.5)
  double drift_steps = 50;     // correlation time of log popularity, in steps
  double hot_boost = 1.0;      // the hot expert's popularity is (1 + hot_boost) x its share
  double hot_move_steps = 20;  // mean steps between jumps of a layer's hot expert
  uint64_t seed = 20261203;

  uint64_t BudgetTokens() const;
  // Tokens a rank receives when routing is perfectly balanced: Megatron's avg_num_tokens,
  // int(budget // capacity_factor).
  uint64_t BalancedTokens() const;
};

struct NodeConfig {
  uint32_t node_gpus = 8;
  uint64_t bytes_per_token = 14336;  // one stash per layer: the BF16 expert input, hidden 7168
  uint64_t page_bytes = 256 << 10;
  uint32_t steps = 1000;
};

// What the node stashes: the schedule's slots, the rank layout and tokens per stash.
struct NodeTrace {
  ScheduleConfig schedule;
  DriftConfig routing;
  NodeConfig node;
  std::vector<ScheduleSlot> slots;
  std::vector<uint32_t> rank_stage;  // [rank]: the stage GPU `rank` runs
  // [step][slot * node_gpus + rank]: tokens stashed (0 where rank is not on the slot's stage).
  std::vector<std::vector<uint64_t>> tokens;

  uint32_t Ranks() const { return node.node_gpus; }
  uint64_t Pages(uint32_t step, size_t slot, uint32_t rank) const;
};

// Errors (bad configuration) as text; empty = fine.
std::string CheckNode(const ScheduleConfig& schedule, const DriftConfig& routing,
                      const NodeConfig& node);
NodeTrace SimulateNode(const ScheduleConfig& schedule, const DriftConfig& routing,
                       const NodeConfig& node);

// One stash or reload of the node, in the order SimulatePools runs them.
struct NodeEvent {
  uint64_t time = 0;
  bool reload = false;
  uint32_t rank = 0;
  uint32_t slot = 0;
};
// The events of one step (the same every step), reloads before stashes at equal times.
std::vector<NodeEvent> StepEvents(const NodeTrace& trace);

struct Peaks {
  std::vector<uint64_t> rank_peak_pages;  // [rank]: its most pages at once over all steps
  uint64_t sum_of_rank_peaks = 0;         // pages a pool per rank needs for zero overflows
  uint64_t node_peak_pages = 0;           // pages one node pool needs: the peak of the sum
  double mean_step_ratio = 0;             // per step: sum of that step's rank peaks / its node peak
  std::vector<std::vector<uint64_t>> step_rank_peaks;  // [step][rank]
};
Peaks MeasurePeaks(const NodeTrace& trace);

// Megatron's per-rank sizing (moe_paged_stash_buffer_size_factor_cuda > 0): factor x the
// avg-based peak, the most stashes in flight x BalancedTokens(), in pages.
uint64_t MegatronRankPages(const NodeTrace& trace, uint32_t rank, double factor);

// What mapped mode's automatic leases ask for (docs/design.md, "Leases"): at each step after the
// first, every rank wants its previous step's peak plus 1/8 (at least one page), rounded up to
// whole chunks of `chunk_pages`. Returns the sum over ranks, per step from step 1 on.
std::vector<uint64_t> LeaseAims(const Peaks& peaks, uint64_t chunk_pages);

struct PoolSetup {
  std::vector<uint64_t> pool_pages;  // [pool]
  std::vector<uint32_t> rank_pool;   // [rank]: the pool its stashes go to
  uint64_t host_pages = 0;           // one host tier for all (0 = none)
};
struct PoolOutcome {
  uint64_t steps = 0;
  uint64_t stashes = 0;
  uint64_t overflows = 0;  // stashes that took nothing
  uint64_t spills = 0;     // stashes that went to the host tier
  uint64_t steps_with_overflow = 0;
  uint64_t steps_with_spill = 0;
};
// `warmup` first steps run but are not counted.
PoolOutcome SimulatePools(const NodeTrace& trace, const PoolSetup& setup, uint32_t warmup = 0);

// The smallest single node pool (pages) whose steps_with_overflow is at most `steps_allowed`
// (no host tier); between 1 and node_peak_pages.
uint64_t SharedPagesFor(const NodeTrace& trace, uint64_t steps_allowed);

}  // namespace stash::bench

#endif  // STASH_BENCH_SHARING_MODEL_H_
