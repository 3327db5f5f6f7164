// The counters of one session, read by stats and stashctl.
#ifndef STASH_DAEMON_SESSION_COUNTERS_H_
#define STASH_DAEMON_SESSION_COUNTERS_H_

#include <atomic>
#include <cstdint>

namespace stash::daemon {

// Counters of one session; all monotonic except the *_live and *_inflight gauges.
struct SessionCounters {
  std::atomic<uint64_t> stashes{0};
  std::atomic<uint64_t> reloads{0};
  std::atomic<uint64_t> releases{0};
  std::atomic<uint64_t> bytes_stashed{0};
  std::atomic<uint64_t> bytes_reloaded{0};
  std::atomic<uint64_t> spills{0};
  std::atomic<uint64_t> overflows{0};
  std::atomic<uint64_t> rejected{0};
  std::atomic<uint64_t> stashes_live{0};
  std::atomic<uint64_t> pages_live{0};
  std::atomic<uint64_t> bytes_live{0};
  std::atomic<uint64_t> inflight{0};
  std::atomic<uint64_t> memories{0};
  std::atomic<bool> step_overflow{false};
  std::atomic<bool> step_spilled{false};
  std::atomic<uint64_t> step{0};  // of the last BeginStep
  std::atomic<bool> step_begun{false};
};

}  // namespace stash::daemon

#endif  // STASH_DAEMON_SESSION_COUNTERS_H_
