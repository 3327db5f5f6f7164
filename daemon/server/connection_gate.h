// The doorman of the gRPC sockets: stashd accepts every connection itself (Acceptor: a spare
// descriptor, so running out of them costs only the connection that hit the limit), reads who
// is calling (SO_PEERCRED), takes the connection's place in the connection budget (FairShare per
// Unix user; the TCP listener, whose peers have no credentials, under one cap), and hands it to
// the gRPC server (grpc::AddInsecureChannelFromFd). gRPC names such a connection "fd:N" in
// ServerContext::peer(), which is how a handler finds who is calling (Lookup).
//
// A connection over its budget is handed over too, marked refused: every call on it is answered
// with the refusal (RESOURCE_EXHAUSTED, which budget and what to do), so a client reads the
// reason instead of a reset. At most kMaxRefusedHeld of them are held at once, each ended after
// kRefusedLinger; past that a refused connection is closed at once.
//
// The gate learns that gRPC closed a connection by looking at its descriptor number every
// kSweep (gone, or now another socket: SO_COOKIE, which never touches a file system): its place
// in the budget is then free again.
#ifndef STASH_DAEMON_CONNECTION_GATE_H_
#define STASH_DAEMON_CONNECTION_GATE_H_

#include <absl/base/thread_annotations.h>
#include <absl/container/flat_hash_map.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "common/mutex.h"
#include "common/unique_fd.h"
#include "daemon/limits/fair_share.h"
#include "daemon/limits/rate_limiter.h"
#include "daemon/server/acceptor.h"
#include "stash/status.h"

namespace grpc {
class Server;
}

namespace stash::daemon {

class ConnectionGate {
 public:
  static constexpr size_t kMaxRefusedHeld = 64;
  static constexpr std::chrono::milliseconds kRefusedLinger{2000};
  static constexpr std::chrono::milliseconds kSweep{100};

  // What the gate knows of one connection.
  struct Connection {
    PeerCredentials peer;
    Status refused;  // OK for a connection within its budget
  };

  // A gate for `listener` (listening, non-blocking) that counts connections in `budget` by the
  // peer's uid (a peer without credentials counts as kUnknownUid). `budget` outlives the gate.
  // Accepts nothing before Serve.
  static StatusOr<std::unique_ptr<ConnectionGate>> Create(UniqueFd listener, std::string name,
                                                          FairShare* budget);
  // Starts accepting into `server` (built without listening ports; outlives the gate).
  void Serve(grpc::Server* server);
  static constexpr uint32_t kUnknownUid = 0xffffffffu;

  ConnectionGate(const ConnectionGate&) = delete;
  ConnectionGate& operator=(const ConnectionGate&) = delete;
  // Stops accepting (joins the thread); connections already handed over stay with the server,
  // and Lookup keeps answering: stop the gate before the server shuts down, destroy it after.
  void Stop();
  ~ConnectionGate();  // Stop()s

  // The connection an RPC came on, by ServerContext::peer(); nullopt when the gate does not know
  // it (not one of its connections).
  std::optional<Connection> Lookup(const std::string& grpc_peer) const;
  // Connections handed over and not closed yet (refused ones included).
  size_t connections() const;

 private:
  struct Tracked {
    Connection connection;
    uint64_t cookie = 0;  // SO_COOKIE of the connection's socket
    UniqueFd held;        // refused: a duplicate to end it by, until `deadline`
    std::chrono::steady_clock::time_point deadline{};
  };
  ConnectionGate(UniqueFd listener, std::string name, FairShare* budget);
  void Run();
  void Admit(Acceptor::Accepted accepted);
  void Sweep();
  void Forget(int fd) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Never change after construction.
  const UniqueFd listener_;
  const std::string name_;
  FairShare* const budget_;         // non-owning
  UniqueFd wake_;                   // eventfd: stop
  grpc::Server* server_ = nullptr;  // non-owning; set by Serve before the thread starts

  mutable Mutex mu_;
  absl::flat_hash_map<int, Tracked> tracked_ ABSL_GUARDED_BY(mu_);  // by descriptor number
  size_t refused_held_ ABSL_GUARDED_BY(mu_) = 0;
  RateLimiter refused_log_{1, std::chrono::seconds(10)};
  std::thread thread_;
};

}  // namespace stash::daemon

#endif  // STASH_DAEMON_CONNECTION_GATE_H_
