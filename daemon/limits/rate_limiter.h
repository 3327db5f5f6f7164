// A rate limit for log lines: so a flood of the same event (refused connections, overflows,
// peers that read nothing) writes a few lines, each counting the ones held back since the last.
#ifndef STASH_DAEMON_RATE_LIMITER_H_
#define STASH_DAEMON_RATE_LIMITER_H_

#include <absl/base/thread_annotations.h>

#include <chrono>
#include <cstdint>

#include "common/mutex.h"

namespace stash::daemon {

// At most `burst` events per `period`; thread-safe. Time is passed in, so tests need no clock.
class RateLimiter {
 public:
  using Clock = std::chrono::steady_clock;
  RateLimiter(uint64_t burst, Clock::duration period) : burst_(burst), period_(period) {}

  // True when an event at `now` may be logged; then `*held_back` is the number of events
  // refused since the last one allowed (and the count restarts).
  bool Allow(Clock::time_point now, uint64_t* held_back);

 private:
  const uint64_t burst_;
  const Clock::duration period_;
  Mutex mu_;
  Clock::time_point window_start_ ABSL_GUARDED_BY(mu_){};
  uint64_t in_window_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t held_back_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace stash::daemon

#endif  // STASH_DAEMON_RATE_LIMITER_H_
