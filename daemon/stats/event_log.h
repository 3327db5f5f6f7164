// Events an operator wants in the log: overflows, spills and rejected requests, each with the
// session, rank and the stash's layer, microbatch and name. Rate-limited per kind, so a pool
// that overflows every stash of every rank writes a few lines a second, not thousands; the
// lines that were held back are counted in the next line that gets through.
#ifndef STASH_DAEMON_EVENT_LOG_H_
#define STASH_DAEMON_EVENT_LOG_H_

#include <absl/base/thread_annotations.h>

#include <chrono>
#include <cstdint>
#include <string>

#include "common/mutex.h"
#include "daemon/limits/rate_limiter.h"
#include "daemon/sessions/session_info.h"
#include "stash/status.h"
#include "stash/v1/stash.pb.h"

namespace stash::daemon {

// The daemon's event lines (logger "events"): 10 lines a second per kind.
class EventLog {
 public:
  // A stash that no tier had room for (the rank keeps its buffer).
  void Overflow(const SessionInfo& session, const stash::v1::Stash& stash, uint64_t rows);
  // A stash that went outside its own pool because that was full: to `where` ("the host tier",
  // or another device's pool: the peer tier).
  void Spill(const SessionInfo& session, const stash::v1::Stash& stash, uint64_t bytes,
             const std::string& where = "the host tier");
  // A request answered with an error (admission or later).
  void Reject(const SessionInfo& session, const stash::v1::SessionRequest& request,
              const Status& status);
  // What a mapped session's control block showed grown since its previous sample (the daemon
  // samples each block once a second, at each stats read and when the session ends): one line
  // per kind that grew, through the same rate limits as the daemon-copy lines. The rank's
  // copier made these stashes itself, so the lines carry counts by step, not each stash's tags.
  void Mapped(const SessionInfo& session, uint64_t step, uint64_t overflows, uint64_t spills,
              uint64_t rejected);

  // The one instance the daemon logs through.
  static EventLog& Get();

  // "session 0123abcd rank 3 layer 7 microbatch 1 name 'experts'": how every event line names
  // the stash (the tags a client did not set are left out).
  static std::string Describe(const SessionInfo& session, const stash::v1::Stash* stash);

 private:
  RateLimiter overflows_{10, std::chrono::seconds(1)};
  RateLimiter spills_{10, std::chrono::seconds(1)};
  RateLimiter rejects_{10, std::chrono::seconds(1)};
};

}  // namespace stash::daemon

#endif  // STASH_DAEMON_EVENT_LOG_H_
