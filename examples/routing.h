// Token routing of the demo trainer: random top-k over E experts, router padding to 32 and the
// HybridEP static token budget (research/domain.md §1.5, §1.7).
//
// Everything is a pure function of its seed, so a rank can route the same step twice (once for
// the in-process reference, once for the stashed run) and get the same bits.
#ifndef STASH_EXAMPLES_ROUTING_H_
#define STASH_EXAMPLES_ROUTING_H_

#include <cstdint>
#include <vector>

namespace stash::demo {

// Per-expert token segments are padded to this many rows (MXFP8 router padding), so the valid
// row count, and the budget, are multiples of it.
constexpr int64_t kRouterPadding = 32;

// A small deterministic generator (SplitMix64): the same sequence on every platform and
// standard library, unlike std::uniform_*_distribution.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}

  uint64_t Next();
  // Uniform in [0, n); n > 0.
  uint64_t Below(uint64_t n);
  // Uniform in [-1, 1), a multiple of 2^-23.
  float Symmetric();

 private:
  uint64_t state_;
};

// A seed for (base, a, b), e.g. (--seed, rank, step): different streams for different tuples.
uint64_t MixSeed(uint64_t base, uint64_t a, uint64_t b);

// The static budget of rows per step (HybridEP `num_permuted_tokens`):
// round_up(ceil(tokens * topk * capacity_factor), 32). Returns -1 when it does not fit in int64.
int64_t TokenBudget(int64_t tokens, int64_t topk, double capacity_factor);

// One step's dispatch of one rank.
struct Routing {
  int64_t max_tokens = 0;  // the static budget: rows of every activation buffer
  // Rows of each expert's segment, padded to kRouterPadding: the grouped-linear counts.
  std::vector<int64_t> counts;
  // The token each valid row carries, -1 for a padding row; rows() entries.
  std::vector<int64_t> token_of_row;
  int64_t assignments = 0;  // (token, expert) pairs the router chose: tokens * topk
  int64_t dropped = 0;      // of those, the pairs beyond the budget (dropped like HybridEP)

  // Valid rows: the sum of counts, a multiple of kRouterPadding, <= max_tokens.
  int64_t rows() const { return static_cast<int64_t>(token_of_row.size()); }
};

// Routes every token to `topk` distinct experts drawn uniformly from `seed`. Segments are
// filled in expert order; an expert whose padded segment no longer fits the budget keeps only
// the rows that fit (a multiple of 32, since the budget and every earlier segment are), and the
// rest of its tokens are dropped. Requires 1 <= topk <= experts, max_tokens % 32 == 0.
Routing RouteTopK(int64_t tokens, int64_t experts, int64_t topk, int64_t max_tokens, uint64_t seed);

}  // namespace stash::demo

#endif  // STASH_EXAMPLES_ROUTING_H_
