// stashd as a library: main.cc only parses flags and calls RunDaemon, so tests start the same
// daemon.
#ifndef STASH_DAEMON_DAEMON_H_
#define STASH_DAEMON_DAEMON_H_

#include <memory>
#include <string>

#include "daemon/config/config.h"
#include "stash/status.h"

namespace stash::daemon {

class DaemonCore;

// A running daemon: tiers allocated, gRPC serving on the socket (and the optional read-only TCP
// listener), health SERVING. Thread-safe.
class Daemon {
 public:
  // Resolves the backend and the socket, refuses to start when a live daemon holds the socket
  // (FAILED_PRECONDITION), replaces a stale socket file, allocates the tiers, starts serving.
  static StatusOr<std::unique_ptr<Daemon>> Start(const DaemonConfig& config);

  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;
  ~Daemon();  // Shutdown()s

  const std::string& socket_path() const;

  // Starts draining: new sessions and stashes are refused, the rest goes on (DaemonCore::Drain).
  void Drain();
  // Sessions connected (0 = drained), and stashes held plus requests in flight over all of them.
  uint64_t SessionsLive();
  uint64_t StashesLive();

  // Stops accepting, ends every session (their pages return), removes the socket. Idempotent.
  void Shutdown();

 private:
  struct Impl;
  explicit Daemon(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Runs a daemon in the foreground until SIGTERM or SIGINT, then drains (new sessions and stashes
// refused) until every session ended, for up to config.drain_timeout_s (a second signal cuts it
// short), and shuts it down cleanly.
// Returns the process exit code: 0 after a clean stop, 1 when it could not start.
int RunDaemon(const DaemonConfig& config);

}  // namespace stash::daemon

#endif  // STASH_DAEMON_DAEMON_H_
