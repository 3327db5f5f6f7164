// A cumulative histogram with fixed bucket bounds, for the Prometheus exposition (metrics.cc):
// unlike the recent-sample windows of stats.h it never forgets, so rates over it are exact.
#ifndef STASH_DAEMON_HISTOGRAM_H_
#define STASH_DAEMON_HISTOGRAM_H_

#include <absl/base/thread_annotations.h>

#include <cstdint>
#include <vector>

#include "common/mutex.h"

namespace stash::daemon {

// Thread-safe. Observing costs one lock and a binary search over the bounds.
class CumulativeHistogram {
 public:
  // `bounds`: the buckets' upper bounds, increasing; a last +Inf bucket is implied.
  explicit CumulativeHistogram(std::vector<double> bounds);

  void Observe(double value);

  struct Snapshot {
    std::vector<double> bounds;    // as given, without +Inf
    std::vector<uint64_t> counts;  // cumulative, one per bound, then +Inf (== count)
    uint64_t count = 0;
    double sum = 0;
  };
  Snapshot Read() const;

 private:
  const std::vector<double> bounds_;
  mutable Mutex mu_;
  std::vector<uint64_t> buckets_ ABSL_GUARDED_BY(mu_);  // per bucket, not cumulative; +Inf last
  double sum_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace stash::daemon

#endif  // STASH_DAEMON_HISTOGRAM_H_
