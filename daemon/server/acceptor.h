// Listening sockets the daemon accepts on itself, for the gRPC socket, the descriptor socket and
// the TCP listener: running out of descriptors costs only the connection that hit the limit.
//
// An Acceptor keeps one spare descriptor. When accept fails for want of descriptors (EMFILE,
// ENFILE), it closes the spare, accepts the waiting connection with it, closes that connection
// at once and takes the spare back: the listener's queue keeps moving, nobody waits in it for
// ever, and nothing spins. When even that cannot be done, it asks its caller to stop polling the
// listener for a while. Either way it logs one line per 10 s with how many were turned away.
#ifndef STASH_DAEMON_ACCEPTOR_H_
#define STASH_DAEMON_ACCEPTOR_H_

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "common/unique_fd.h"
#include "daemon/limits/rate_limiter.h"
#include "daemon/sessions/peer_credentials.h"
#include "stash/status.h"

namespace stash::daemon {

// Binds and listens on a Unix socket of `type` (SOCK_STREAM, SOCK_SEQPACKET) at `path`, born
// with mode 0660 and given group `group` (-1 = keep); replaces a stale file (the caller holds
// the daemon's lock). Non-blocking, close-on-exec.
StatusOr<UniqueFd> ListenUnix(const std::string& path, int type, gid_t group);

// Binds and listens on TCP `address` ("host:port", port 0 = any free one); `*port` gets the port.
StatusOr<UniqueFd> ListenTcp(const std::string& address, int* port);

// After a poll of a server loop failed (out of memory, say): says so at most once per 10 s
// (`log_limit`), rests 100 ms, and returns true when a stop was signalled on `wake` (a
// non-blocking eventfd) meanwhile. A server loop never stops serving for good on a failed poll.
bool RestAfterFailedPoll(const std::string& who, int wake, RateLimiter* log_limit);

class Acceptor {
 public:
  // `listener` is non-owning and outlives this; `name` names the socket in log lines.
  Acceptor(int listener, std::string name);

  struct Accepted {
    UniqueFd fd;  // non-blocking, close-on-exec
    PeerCredentials peer;
  };
  // One waiting connection, or nullopt when none waits, when one was turned away for want of
  // descriptors (call again: at most one is turned away per call), or when the listener must
  // rest (see `backoff()`).
  std::optional<Accepted> Accept();
  // Set when the listener must not be polled before this time (descriptors ran out and the
  // spare could not be had either); otherwise time_point::min().
  std::chrono::steady_clock::time_point backoff() const { return backoff_until_; }
  // Connections turned away for want of descriptors since start.
  uint64_t dropped() const { return dropped_; }

 private:
  void NoteDropped(int err);

  const int listener_;
  const std::string name_;
  UniqueFd spare_;
  uint64_t dropped_ = 0;
  RateLimiter dropped_log_{1, std::chrono::seconds(10)};
  RateLimiter error_log_{1, std::chrono::seconds(10)};
  std::chrono::steady_clock::time_point backoff_until_ =
      std::chrono::steady_clock::time_point::min();
};

}  // namespace stash::daemon

#endif  // STASH_DAEMON_ACCEPTOR_H_
