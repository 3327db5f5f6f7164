#include "daemon/limits/rate_limiter.h"

namespace stash::daemon {

bool RateLimiter::Allow(Clock::time_point now, uint64_t* held_back) {
  MutexLock lock(&mu_);
  if (now - window_start_ >= period_) {
    window_start_ = now;
    in_window_ = 0;
  }
  if (in_window_ >= burst_) {
    ++held_back_;
    return false;
  }
  ++in_window_;
  *held_back = held_back_;
  held_back_ = 0;
  return true;
}

}  // namespace stash::daemon
