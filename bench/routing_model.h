// A model of what an MoE layer stashes per rank, and of the pages a paged stash holds for it
// over one forward+backward step, against the static worst-case allocation
// (research/domain.md §1.3-§1.7, §2.1, §3.5).
//
// Routing. An expert-parallel group of `ep_ranks` ranks holds `experts` experts, experts/ep_ranks
// per rank. Each layer has an expert popularity p ~ Dirichlet(alpha, ..., alpha) (drawn once
// per layer: some experts are hot in some layers). Every token of every rank picks `topk`
// distinct experts, sampled without replacement with probability proportional to p (repeats
// rejected: the Plackett-Luce draw a noisy top-k router approximates). A rank receives the tokens
// routed to its local experts; each expert's count is padded up to `align` (router padding for
// MXFP8), and the rank's total is capped at the static budget
//   budget = round_up(tokens_per_rank * topk * capacity_factor, align)
// (HybridEP's num_permuted_tokens; tokens past it are dropped upstream).
//
// Stashes per layer, token-major, one per buffer (docs/design.md):
//   BF16:  the expert input [tokens, hidden] bf16             -> row_bytes = 2 * hidden
//   MXFP8: columnwise data  [tokens, hidden] e4m3             -> row_bytes = hidden
//          columnwise scale_inv [tokens/32, roundup(hidden,128)] e8m0 -> row_bytes = that, rows/32
// Forward stashes layers 0..L-1, backward reloads L-1..0, so the pages in use peak after the
// last forward layer. The static alternative keeps max_rows rows of every buffer of every layer.
#ifndef STASH_BENCH_ROUTING_MODEL_H_
#define STASH_BENCH_ROUTING_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

namespace stash::bench {

struct RoutingConfig {
  uint32_t experts = 64;
  uint32_t topk = 8;
  uint32_t ep_ranks = 8;  // one node of 8 GPUs: 8 local experts per rank
  uint64_t tokens_per_rank = 4096;
  double capacity_factor = 1.5;
  uint64_t align = 32;     // per-expert padding (MXFP8)
  double alpha = 4.0;      // Dirichlet concentration of expert popularity; 0 = uniform
  uint32_t layers = 8;     // MoE layers in the model
  uint32_t steps = 4;      // training steps simulated (new token routing each step)
  uint64_t hidden = 7168;  // DeepSeek-V3 hidden size
  uint64_t seed = 20240601;

  uint64_t BudgetTokens() const;
};

// Tokens (padded, capped) each rank receives: [step][layer][rank].
using Routing = std::vector<std::vector<std::vector<uint64_t>>>;
Routing SimulateRouting(const RoutingConfig& config);

// One buffer kind stashed per layer.
struct BufferShape {
  std::string name;
  uint64_t row_bytes;
  uint32_t divisor;  // rows = tokens / divisor
};
// The buffers of one recipe: "bf16" or "mxfp8".
std::vector<BufferShape> RecipeBuffers(const std::string& recipe, uint64_t hidden);

struct PagingResult {
  // For the rank whose peak is highest over all steps (what a per-GPU pool must hold) and for
  // the average rank.
  uint64_t peak_pages_hottest = 0;
  double peak_pages_mean = 0;
  uint64_t payload_bytes_hottest = 0;  // payload held at that rank's peak
  double payload_bytes_mean = 0;
  uint64_t static_bytes = 0;  // layers * sum over buffers of max_rows * row_bytes
  uint64_t stashes_at_peak = 0;
  double mean_tokens_over_budget = 0;  // average rank-layer load / budget
  double max_tokens_over_budget = 0;
};

// Pages a paged stash holds at the peak of a forward+backward step, with the daemon's rule
// PagesFor(rows * row_bytes, page_bytes) per stash.
PagingResult ModelPaging(const RoutingConfig& config, const Routing& routing,
                         const std::vector<BufferShape>& buffers, uint64_t page_bytes);

}  // namespace stash::bench

#endif  // STASH_BENCH_ROUTING_MODEL_H_
