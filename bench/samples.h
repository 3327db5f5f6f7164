// Timing samples and their summaries (median, percentiles, best).
#ifndef STASH_BENCH_SAMPLES_H_
#define STASH_BENCH_SAMPLES_H_

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <vector>

namespace stash::bench {

using Clock = std::chrono::steady_clock;

inline double SecondsBetween(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}
inline double MicrosBetween(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

// The q-quantile (0..1) by the nearest-rank rule; 0 for no samples.
inline double Quantile(std::vector<double> samples, double q) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  const double pos = q * static_cast<double>(samples.size() - 1);
  return samples[static_cast<size_t>(std::llround(pos))];
}
inline double Median(const std::vector<double>& samples) { return Quantile(samples, 0.5); }
inline double Min(const std::vector<double>& samples) {
  return samples.empty() ? 0 : *std::min_element(samples.begin(), samples.end());
}
inline double Max(const std::vector<double>& samples) {
  return samples.empty() ? 0 : *std::max_element(samples.begin(), samples.end());
}

}  // namespace stash::bench

#endif  // STASH_BENCH_SAMPLES_H_
