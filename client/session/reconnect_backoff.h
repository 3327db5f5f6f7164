// When a rank whose daemon went away tries a new session again, the same in both modes
// (docs/design.md, "Recovery and draining"): attempts back off from 100 ms, doubling up to 1 s,
// while no daemon answers, so a rank stepping fast does not hammer a missing or draining
// daemon; but a new file at the socket's path (a daemon that started since the last failure)
// is tried at once, so the first step after a restart reconnects whatever the wait says.
//
// Not thread-safe: each session calls it under its own lock (or from one thread).
#ifndef STASH_CLIENT_RECONNECT_BACKOFF_H_
#define STASH_CLIENT_RECONNECT_BACKOFF_H_

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>

namespace stash::client {

// What stands at a path: its device, inode and change time (a file system may give a new file
// the inode number of one removed a moment ago; its change time is its own); all zero when
// nothing does.
struct PathIdentity {
  uint64_t device = 0;
  uint64_t inode = 0;
  int64_t changed_ns = 0;
  static PathIdentity Of(const std::string& path);  // stat(2); nothing at all on any error
  bool operator==(const PathIdentity& o) const {
    return device == o.device && inode == o.inode && changed_ns == o.changed_ns;
  }
  bool operator!=(const PathIdentity& o) const { return !(*this == o); }
};

class ReconnectBackoff {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::milliseconds kFirst{100};
  static constexpr std::chrono::milliseconds kMost{1000};

  // Whether an attempt may run at `now`, `at_path` standing at the socket's path: none failed
  // since the last success, the wait after the last failure is over, or the file there is not
  // the one that stood there when it failed.
  bool Due(Clock::time_point now, const PathIdentity& at_path) const {
    return now >= next_attempt_ || at_path != failed_at_path_;
  }
  // An attempt begun at `now`, with `at_path` at the socket's path then, failed: the next waits
  // twice as long as the last (kFirst, then up to kMost).
  void Failed(Clock::time_point now, const PathIdentity& at_path) {
    wait_ = wait_.count() == 0 ? kFirst : std::min(2 * wait_, kMost);
    next_attempt_ = now + wait_;
    failed_at_path_ = at_path;
  }
  void Succeeded() { *this = ReconnectBackoff(); }

  std::chrono::milliseconds wait() const { return wait_; }  // after the last failure

 private:
  Clock::time_point next_attempt_{};
  std::chrono::milliseconds wait_{0};
  PathIdentity failed_at_path_{};
};

}  // namespace stash::client

#endif  // STASH_CLIENT_RECONNECT_BACKOFF_H_
