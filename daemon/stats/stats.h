// Daemon-wide counters and the recent latency and throughput windows.
#ifndef STASH_DAEMON_STATS_H_
#define STASH_DAEMON_STATS_H_

#include <absl/base/thread_annotations.h>
#include "common/mutex.h"

#include <atomic>
#include <cstdint>
#include <utility>
#include <vector>

#include "daemon/stats/histogram.h"

namespace stash::daemon {

// A fixed window of the most recent samples, and a histogram of every sample ever added (for
// Prometheus). Thread-safe.
class SampleWindow {
 public:
  explicit SampleWindow(std::vector<double> histogram_bounds, size_t capacity = 4096)
      : capacity_(capacity), histogram_(std::move(histogram_bounds)) {}
  void Add(double value);
  // The q-quantile (0..1) of the window; 0 when empty.
  double Quantile(double q) const;
  const CumulativeHistogram& histogram() const { return histogram_; }

 private:
  const size_t capacity_;
  CumulativeHistogram histogram_;
  mutable Mutex mu_;
  std::vector<double> samples_ ABSL_GUARDED_BY(mu_);
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;
};

// Bytes over copy time for the most recent copies, and a histogram of every copy's rate in
// bytes per second (for Prometheus). Thread-safe.
class ThroughputWindow {
 public:
  explicit ThroughputWindow(size_t capacity = 4096);
  void Add(uint64_t bytes, double seconds);
  // GB/s (1e9 bytes per second) over the window; 0 when empty.
  double Gbps() const;
  const CumulativeHistogram& histogram() const { return histogram_; }

 private:
  const size_t capacity_;
  CumulativeHistogram histogram_;
  mutable Mutex mu_;
  std::vector<std::pair<uint64_t, double>> samples_ ABSL_GUARDED_BY(mu_);
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;
};

struct DaemonCounters {
  std::atomic<uint64_t> sessions_total{0};
  std::atomic<uint64_t> stashes{0};
  std::atomic<uint64_t> reloads{0};
  std::atomic<uint64_t> releases{0};
  std::atomic<uint64_t> bytes_stashed{0};
  std::atomic<uint64_t> bytes_reloaded{0};
  std::atomic<uint64_t> spills{0};
  std::atomic<uint64_t> overflows{0};
  std::atomic<uint64_t> rejected{0};
  // Host backend with --warm-memory: the start-up pass is populating the tiers.
  std::atomic<bool> warming{false};
  std::atomic<uint64_t> stashes_while_warming{0};
  std::atomic<double> warm_after_s{0};
  // Stash latency in microseconds; the histogram's bounds run from 10 us to 10 s.
  SampleWindow stash_latency_us{
      {10, 25, 50, 100, 250, 500, 1e3, 2.5e3, 5e3, 1e4, 2.5e4, 5e4, 1e5, 2.5e5, 5e5, 1e6, 1e7}};
  ThroughputWindow stash_copy;
  ThroughputWindow reload_copy;
};

}  // namespace stash::daemon

#endif  // STASH_DAEMON_STATS_H_
