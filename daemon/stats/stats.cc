#include "daemon/stats/stats.h"

#include <algorithm>

namespace stash::daemon {

void SampleWindow::Add(double value) {
  histogram_.Observe(value);
  MutexLock lock(&mu_);
  if (samples_.size() < capacity_) {
    samples_.push_back(value);
  } else {
    samples_[next_] = value;
    next_ = (next_ + 1) % capacity_;
  }
}

double SampleWindow::Quantile(double q) const {
  std::vector<double> copy;
  {
    MutexLock lock(&mu_);
    copy = samples_;
  }
  if (copy.empty()) return 0;
  const size_t k =
      std::min(copy.size() - 1, static_cast<size_t>(q * static_cast<double>(copy.size())));
  std::nth_element(copy.begin(), copy.begin() + static_cast<std::ptrdiff_t>(k), copy.end());
  return copy[k];
}

// Copy rates from 100 MB/s to 1 TB/s, in bytes per second.
ThroughputWindow::ThroughputWindow(size_t capacity)
    : capacity_(capacity),
      histogram_({1e8, 2.5e8, 5e8, 1e9, 2.5e9, 5e9, 1e10, 2.5e10, 5e10, 1e11, 2.5e11, 1e12}) {}

void ThroughputWindow::Add(uint64_t bytes, double seconds) {
  if (seconds > 0) histogram_.Observe(static_cast<double>(bytes) / seconds);
  MutexLock lock(&mu_);
  if (samples_.size() < capacity_) {
    samples_.emplace_back(bytes, seconds);
  } else {
    samples_[next_] = {bytes, seconds};
    next_ = (next_ + 1) % capacity_;
  }
}

double ThroughputWindow::Gbps() const {
  MutexLock lock(&mu_);
  double bytes = 0;
  double seconds = 0;
  for (const auto& [b, s] : samples_) {
    bytes += static_cast<double>(b);
    seconds += s;
  }
  return seconds > 0 ? bytes / seconds / 1e9 : 0;
}

}  // namespace stash::daemon
