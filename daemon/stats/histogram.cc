#include "daemon/stats/histogram.h"

#include <algorithm>
#include <utility>

namespace stash::daemon {

CumulativeHistogram::CumulativeHistogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), buckets_(bounds_.size() + 1, 0) {}

void CumulativeHistogram::Observe(double value) {
  // The first bucket whose bound is >= value (Prometheus buckets are "less or equal").
  const auto at = static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), value) -
                                      bounds_.begin());
  MutexLock lock(&mu_);
  ++buckets_[at];
  sum_ += value;
}

CumulativeHistogram::Snapshot CumulativeHistogram::Read() const {
  Snapshot out;
  out.bounds = bounds_;
  MutexLock lock(&mu_);
  uint64_t running = 0;
  out.counts.reserve(buckets_.size());
  for (uint64_t n : buckets_) {
    running += n;
    out.counts.push_back(running);
  }
  out.count = running;
  out.sum = sum_;
  return out;
}

}  // namespace stash::daemon
