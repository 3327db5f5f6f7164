#include "bench/routing_model.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <utility>

#include "stash/kernels/paging.h"

namespace stash::bench {
namespace {

uint64_t RoundUp(uint64_t v, uint64_t m) { return (v + m - 1) / m * m; }

// Expert popularity ~ Dirichlet(alpha): normalised Gamma(alpha, 1) draws.
std::vector<double> Popularity(uint32_t experts, double alpha, std::mt19937_64& rng) {
  std::vector<double> p(experts, 1.0);
  if (alpha > 0) {
    std::gamma_distribution<double> gamma(alpha, 1.0);
    for (double& v : p) v = std::max(gamma(rng), 1e-12);
  }
  const double sum = std::accumulate(p.begin(), p.end(), 0.0);
  for (double& v : p) v /= sum;
  return p;
}

}  // namespace

uint64_t RoutingConfig::BudgetTokens() const {
  const double raw = static_cast<double>(tokens_per_rank) * topk * capacity_factor;
  return RoundUp(static_cast<uint64_t>(std::ceil(raw)), align);
}

Routing SimulateRouting(const RoutingConfig& config) {
  std::mt19937_64 rng(config.seed);
  const uint32_t local = config.experts / config.ep_ranks;
  const uint64_t budget = config.BudgetTokens();
  // Cumulative popularity per layer, for inverse-CDF draws.
  std::vector<std::vector<double>> cdf(config.layers);
  for (uint32_t l = 0; l < config.layers; ++l) {
    double acc = 0;
    for (double p : Popularity(config.experts, config.alpha, rng)) cdf[l].push_back(acc += p);
    cdf[l].back() = 1.0;
  }
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  Routing routing(config.steps, std::vector<std::vector<uint64_t>>(config.layers));
  std::vector<uint64_t> per_expert(config.experts);
  std::vector<uint32_t> chosen;
  for (uint32_t step = 0; step < config.steps; ++step) {
    for (uint32_t l = 0; l < config.layers; ++l) {
      std::fill(per_expert.begin(), per_expert.end(), 0);
      const uint64_t tokens = config.tokens_per_rank * config.ep_ranks;
      for (uint64_t t = 0; t < tokens; ++t) {
        // topk distinct experts, each drawn with probability proportional to p among those not
        // yet chosen (rejecting repeats is exactly that renormalised draw).
        chosen.clear();
        while (chosen.size() < config.topk) {
          const auto it = std::upper_bound(cdf[l].begin(), cdf[l].end(), uniform(rng));
          const auto e = static_cast<uint32_t>(
              std::min<std::ptrdiff_t>(it - cdf[l].begin(), config.experts - 1));
          if (std::find(chosen.begin(), chosen.end(), e) == chosen.end()) chosen.push_back(e);
        }
        for (uint32_t e : chosen) ++per_expert[e];
      }
      std::vector<uint64_t>& ranks = routing[step][l];
      ranks.assign(config.ep_ranks, 0);
      for (uint32_t e = 0; e < config.experts; ++e) {
        ranks[e / local] += RoundUp(per_expert[e], config.align);
      }
      for (uint64_t& r : ranks) r = std::min(r, budget);
    }
  }
  return routing;
}

std::vector<BufferShape> RecipeBuffers(const std::string& recipe, uint64_t hidden) {
  if (recipe == "bf16") return {{"input bf16", 2 * hidden, 1}};
  return {{"columnwise data e4m3", hidden, 1},
          {"columnwise scale_inv e8m0", RoundUp(hidden, 128), 32}};
}

PagingResult ModelPaging(const RoutingConfig& config, const Routing& routing,
                         const std::vector<BufferShape>& buffers, uint64_t page_bytes) {
  PagingResult out;
  const uint64_t budget = config.BudgetTokens();
  for (const BufferShape& b : buffers) {
    out.static_bytes += config.layers * (budget / b.divisor) * b.row_bytes;
  }
  double sum_load = 0;
  uint64_t loads = 0;
  double sum_peak_pages = 0;
  double sum_peak_payload = 0;
  uint64_t peaks = 0;
  for (const auto& step : routing) {
    for (uint32_t rank = 0; rank < config.ep_ranks; ++rank) {
      // Forward stashes every layer before backward reloads any: the peak is the sum.
      uint64_t pages = 0;
      uint64_t payload = 0;
      for (uint32_t l = 0; l < config.layers; ++l) {
        const uint64_t tokens = step[l][rank];
        sum_load += static_cast<double>(tokens) / static_cast<double>(budget);
        out.max_tokens_over_budget = std::max(
            out.max_tokens_over_budget, static_cast<double>(tokens) / static_cast<double>(budget));
        ++loads;
        for (const BufferShape& b : buffers) {
          const uint64_t bytes = tokens / b.divisor * b.row_bytes;
          pages += kernels::PagesFor(bytes, page_bytes);
          payload += bytes;
        }
      }
      sum_peak_pages += static_cast<double>(pages);
      sum_peak_payload += static_cast<double>(payload);
      ++peaks;
      if (pages > out.peak_pages_hottest) {
        out.peak_pages_hottest = pages;
        out.payload_bytes_hottest = payload;
      }
    }
  }
  out.peak_pages_mean = sum_peak_pages / static_cast<double>(peaks);
  out.payload_bytes_mean = sum_peak_payload / static_cast<double>(peaks);
  out.mean_tokens_over_budget = sum_load / static_cast<double>(loads);
  out.stashes_at_peak = config.layers * buffers.size();
  return out;
}

}  // namespace stash::bench
