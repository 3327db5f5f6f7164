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
// A connection is handed over only once it sent the HTTP/2 connection preface (a gRPC client
// sends it at once); one that has not within Options.preface_timeout (10 s) is closed and its
// place freed, so idle raw connections cannot hold a user's share for ever. Those closes are
// logged once per 10 s with their count.
//
// A few places beyond every user's share are kept for root and the daemon's own user
// (Options.reserved, PostgreSQL's superuser_reserved_connections): when such a user's share is
// full, its connection waits without a place and takes a reserved one once it sent the preface,
// if its process holds no other connection of this gate (a fresh stashctl does; a process that
// leaks channels does not). Connections that never speak (a flood) hold only share places, never
// reserved ones, and a reserved connection serves no session (StashServiceImpl::Session), so
// `stashctl health`, `stats` and `drain` as root answer while root's share is taken.
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
#include <vector>

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

struct ConnectionGateOptions {
  // A connection that has not sent the whole HTTP/2 preface this long after it was accepted is
  // closed.
  std::chrono::milliseconds preface_timeout{10000};
  // Places beyond every user's share for root and `reserved_uid` (0 = none).
  uint64_t reserved = 0;
  uint32_t reserved_uid = 0;  // the daemon's own user, besides root
};

class ConnectionGate {
 public:
  static constexpr size_t kMaxRefusedHeld = 64;
  static constexpr std::chrono::milliseconds kRefusedLinger{2000};
  static constexpr std::chrono::milliseconds kSweep{100};

  // Connections of root and the daemon's user waiting for their preface without a place (their
  // share is full); past this, the oldest of them is closed for a new one.
  static constexpr size_t kMaxWaitingUnplaced = 64;

  using Options = ConnectionGateOptions;

  // What the gate knows of one connection.
  struct Connection {
    PeerCredentials peer;
    Status refused;         // OK for a connection within its budget
    bool reserved = false;  // holds one of the places kept for root and the daemon's user
  };

  // A gate for `listener` (listening, non-blocking) that counts connections in `budget` by the
  // peer's uid (a peer without credentials counts as kUnknownUid). `budget` outlives the gate.
  // Accepts nothing before Serve.
  static StatusOr<std::unique_ptr<ConnectionGate>> Create(UniqueFd listener, std::string name,
                                                          FairShare* budget,
                                                          Options options = Options());
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
  // A connection accepted and not handed over yet: it has not sent the whole preface.
  struct Waiting {
    UniqueFd fd;
    PeerCredentials peer;
    bool placed = false;   // holds a place of its user's share
    bool partial = false;  // sent part of the preface: looked at again at the next sweep only
    std::chrono::steady_clock::time_point accepted{};
  };
  enum class Preface { kComplete, kPartial, kNone, kClosed, kOther };

  ConnectionGate(UniqueFd listener, std::string name, FairShare* budget, Options options);
  void Run();
  void Admit(Acceptor::Accepted accepted);
  // What `fd` has sent so far (peeked: gRPC reads it all after the hand-over).
  static Preface Peek(int fd);
  // Looks at the waiting connection at `index` (`hung_up`: poll said so): hands it over, drops
  // it, or leaves it waiting. Gate thread only.
  void Look(size_t index, bool hung_up);
  // Hands `w` over to gRPC: with its place, a reserved one, or refused.
  void HandOver(Waiting w);
  // Closes `w` and frees its place (a connection that never spoke or hung up).
  void Drop(Waiting& w);
  bool Privileged(const PeerCredentials& peer) const;
  uint32_t UidOf(const PeerCredentials& peer) const;
  void Sweep();
  void Forget(int fd) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Never change after construction.
  const UniqueFd listener_;
  const std::string name_;
  FairShare* const budget_;  // non-owning
  const Options options_;
  UniqueFd wake_;                   // eventfd: stop
  grpc::Server* server_ = nullptr;  // non-owning; set by Serve before the thread starts

  // Gate thread only.
  std::vector<Waiting> waiting_;
  uint64_t silent_closed_ = 0;  // closed for want of a preface since the last report
  uint64_t evicted_ = 0;        // unplaced waiters closed for newer ones since the last report
  RateLimiter silent_log_{1, std::chrono::seconds(10)};

  mutable Mutex mu_;
  absl::flat_hash_map<int, Tracked> tracked_ ABSL_GUARDED_BY(mu_);  // by descriptor number
  size_t refused_held_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t reserved_used_ ABSL_GUARDED_BY(mu_) = 0;
  RateLimiter refused_log_ ABSL_GUARDED_BY(mu_){1, std::chrono::seconds(10)};
  std::thread thread_;
};

}  // namespace stash::daemon

#endif  // STASH_DAEMON_CONNECTION_GATE_H_
