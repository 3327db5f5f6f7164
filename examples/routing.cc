#include "examples/routing.h"

#include <cmath>
#include <limits>
#include <numeric>
#include <utility>

namespace stash::demo {

uint64_t SplitMix64::Next() {
  state_ += 0x9e3779b97f4a7c15ULL;
  uint64_t z = state_;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t SplitMix64::Below(uint64_t n) {
  // The modulo bias is below n / 2^64: invisible for the expert counts the demo uses.
  return Next() % n;
}

float SplitMix64::Symmetric() {
  // 24 random bits -> an integer in [-2^23, 2^23), scaled exactly by 2^-23.
  const int32_t bits = static_cast<int32_t>(Next() >> 40) - (1 << 23);
  return static_cast<float>(bits) * (1.0f / static_cast<float>(1 << 23));
}

uint64_t MixSeed(uint64_t base, uint64_t a, uint64_t b) {
  SplitMix64 g(base);
  uint64_t s = g.Next() ^ (a * 0xd1b54a32d192ed03ULL);
  SplitMix64 h(s);
  return h.Next() ^ (b * 0x8cb92ba72f3d8dd7ULL);
}

int64_t TokenBudget(int64_t tokens, int64_t topk, double capacity_factor) {
  const double exact =
      std::ceil(static_cast<double>(tokens) * static_cast<double>(topk) * capacity_factor);
  // Keep well inside int64 so the rounding below cannot overflow.
  if (!(exact >= 0.0) || exact > 9.0e18) return -1;
  const auto budget = static_cast<int64_t>(exact);
  return (budget + kRouterPadding - 1) / kRouterPadding * kRouterPadding;
}

Routing RouteTopK(int64_t tokens, int64_t experts, int64_t topk, int64_t max_tokens,
                  uint64_t seed) {
  SplitMix64 rng(seed);
  // tokens_of[e]: the tokens routed to expert e, ascending (tokens are visited in order).
  std::vector<std::vector<int64_t>> tokens_of(static_cast<size_t>(experts));
  std::vector<int64_t> order(static_cast<size_t>(experts));
  for (int64_t t = 0; t < tokens; ++t) {
    // topk distinct experts: the first topk slots of a partial Fisher-Yates shuffle.
    std::iota(order.begin(), order.end(), int64_t{0});
    for (int64_t i = 0; i < topk; ++i) {
      const auto j = i + static_cast<int64_t>(rng.Below(static_cast<uint64_t>(experts - i)));
      std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
      tokens_of[static_cast<size_t>(order[static_cast<size_t>(i)])].push_back(t);
    }
  }

  Routing r;
  r.max_tokens = max_tokens;
  r.assignments = tokens * topk;
  r.counts.assign(static_cast<size_t>(experts), 0);
  int64_t left = max_tokens;
  for (int64_t e = 0; e < experts; ++e) {
    const std::vector<int64_t>& routed = tokens_of[static_cast<size_t>(e)];
    const auto want = static_cast<int64_t>(routed.size());
    const int64_t padded = (want + kRouterPadding - 1) / kRouterPadding * kRouterPadding;
    // `left` is a multiple of 32, so a padded segment that does not fit means want > left:
    // keep `left` tokens, no padding needed, drop the rest.
    const int64_t rows = padded <= left ? padded : left;
    const int64_t kept = want < rows ? want : rows;
    for (int64_t i = 0; i < kept; ++i) r.token_of_row.push_back(routed[static_cast<size_t>(i)]);
    for (int64_t i = kept; i < rows; ++i) r.token_of_row.push_back(-1);
    r.dropped += want - kept;
    r.counts[static_cast<size_t>(e)] = rows;
    left -= rows;
  }
  return r;
}

}  // namespace stash::demo
