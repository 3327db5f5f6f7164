#include "daemon/server/connection_gate.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <grpcpp/server.h>
#include <grpcpp/server_posix.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "common/logging.h"
#include "common/macros.h"
#include "common/sys.h"

namespace stash::daemon {
namespace {

using Clock = std::chrono::steady_clock;

// The socket's cookie: unique for the kernel's uptime, never reused, and asked without touching
// any file system (a descriptor number gRPC closed may now name a client's FUSE file, whose
// fstat could block for ever); 0 for a closed number or one that is no socket now.
uint64_t CookieOf(int fd) {
  uint64_t cookie = 0;
  socklen_t len = sizeof(cookie);
  if (getsockopt(fd, SOL_SOCKET, SO_COOKIE, &cookie, &len) != 0) return 0;
  return cookie;
}

// Connections taken from the listener before the gate serves its other duties again (sweeping,
// stopping): a flood that keeps the backlog full cannot hold the gate.
constexpr int kAcceptsPerWake = 32;

}  // namespace

ConnectionGate::ConnectionGate(UniqueFd listener, std::string name, FairShare* budget)
    : listener_(std::move(listener)),
      name_(std::move(name)),
      budget_(budget),
      wake_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}

StatusOr<std::unique_ptr<ConnectionGate>> ConnectionGate::Create(UniqueFd listener,
                                                                 std::string name,
                                                                 FairShare* budget) {
  std::unique_ptr<ConnectionGate> gate(
      new ConnectionGate(std::move(listener), std::move(name), budget));
  if (!gate->wake_.valid()) return ErrnoStatus("eventfd");
  return gate;
}

void ConnectionGate::Serve(grpc::Server* server) {
  server_ = server;
  thread_ = std::thread([this] { Run(); });
}

ConnectionGate::~ConnectionGate() { Stop(); }

void ConnectionGate::Run() {
  Acceptor acceptor(listener_.get(), name_);
  RateLimiter poll_failed_log(1, std::chrono::seconds(10));
  while (true) {
    const auto now = Clock::now();
    const bool resting = acceptor.backoff() > now;
    pollfd fds[2] = {{wake_.get(), POLLIN, 0}, {listener_.get(), POLLIN, 0}};
    int timeout = static_cast<int>(kSweep.count());
    if (resting) {
      timeout = std::min<int>(
          timeout, static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                        acceptor.backoff() - now)
                                        .count()) +
                       1);
    }
    int rc = 0;
    STASH_SYSCALL_RETRY(rc, poll(fds, resting ? 1 : 2, timeout));
    if (rc < 0) {
      if (RestAfterFailedPoll(name_, wake_.get(), &poll_failed_log)) return;
      continue;
    }
    if (fds[0].revents != 0) return;
    Sweep();
    if (!resting && fds[1].revents != 0) {
      for (int i = 0; i < kAcceptsPerWake; ++i) {
        auto accepted = acceptor.Accept();
        if (!accepted) break;
        Admit(std::move(*accepted));
      }
    }
  }
}

void ConnectionGate::Forget(int fd) {
  auto it = tracked_.find(fd);
  if (it == tracked_.end()) return;
  Tracked& t = it->second;
  if (t.connection.refused.ok()) {
    budget_->Give(t.connection.peer.known ? t.connection.peer.uid : kUnknownUid, 1);
  } else if (t.held.valid()) {
    --refused_held_;
  }
  tracked_.erase(it);
}

void ConnectionGate::Admit(Acceptor::Accepted accepted) {
  const int fd = accepted.fd.get();
  const uint32_t uid = accepted.peer.known ? accepted.peer.uid : kUnknownUid;
  Tracked t;
  t.connection.peer = accepted.peer;
  t.cookie = CookieOf(fd);
  {
    MutexLock lock(&mu_);
    // That number was closed and reused: the old connection is gone, and its place in the
    // budget free before this one takes one.
    Forget(fd);
    t.connection.refused = budget_->Take(uid, 1);
    if (!t.connection.refused.ok()) {
      const auto now = Clock::now();
      uint64_t held = 0;
      if (refused_log_.Allow(now, &held)) {
        Log("rpc")->warn(
            "{}: refused {} connection(s) since the last report; the latest, pid {} "
            "uid {}: {}",
            name_, held + 1, accepted.peer.pid, accepted.peer.uid, t.connection.refused.message());
      }
      if (refused_held_ >= kMaxRefusedHeld) return;  // closes it: no room to say why
      t.held.reset(fcntl(fd, F_DUPFD_CLOEXEC, 0));
      if (!t.held.valid()) return;
      t.deadline = now + kRefusedLinger;
      ++refused_held_;
    }
    tracked_[fd] = std::move(t);
  }
  // gRPC owns the descriptor from here on.
  grpc::AddInsecureChannelFromFd(server_, accepted.fd.release());
}

void ConnectionGate::Sweep() {
  const auto now = Clock::now();
  // Which numbers to look at, under the lock; the looks themselves without it.
  std::vector<std::pair<int, uint64_t>> tracked;
  {
    MutexLock lock(&mu_);
    for (auto& [fd, t] : tracked_) {
      if (t.held.valid() && now >= t.deadline) {
        // The refusal had its time to be read: end the connection (gRPC then closes its side).
        shutdown(t.held.get(), SHUT_RDWR);
        t.held.reset();
        --refused_held_;
      }
      tracked.emplace_back(fd, t.cookie);
    }
  }
  std::vector<int> gone;
  for (const auto& [fd, cookie] : tracked) {
    if (CookieOf(fd) != cookie) gone.push_back(fd);
  }
  MutexLock lock(&mu_);
  for (int fd : gone) {
    // Only if it is still the connection looked at (Admit may have put a new one there).
    auto it = tracked_.find(fd);
    if (it != tracked_.end() && CookieOf(fd) != it->second.cookie) Forget(fd);
  }
}

void ConnectionGate::Stop() {
  const uint64_t one = 1;
  if (thread_.joinable()) {
    if (write(wake_.get(), &one, sizeof(one)) != sizeof(one)) {
      Log("rpc")->error("cannot wake the {} gate: {}", name_, std::strerror(errno));
    }
    thread_.join();
  }
}

std::optional<ConnectionGate::Connection> ConnectionGate::Lookup(
    const std::string& grpc_peer) const {
  constexpr const char kPrefix[] = "fd:";
  if (grpc_peer.compare(0, sizeof(kPrefix) - 1, kPrefix) != 0) return std::nullopt;
  int fd = 0;
  for (size_t i = sizeof(kPrefix) - 1; i < grpc_peer.size(); ++i) {
    const char c = grpc_peer[i];
    if (c < '0' || c > '9' || fd > 1 << 24) return std::nullopt;
    fd = fd * 10 + (c - '0');
  }
  MutexLock lock(&mu_);
  auto it = tracked_.find(fd);
  if (it == tracked_.end()) return std::nullopt;
  return it->second.connection;
}

size_t ConnectionGate::connections() const {
  MutexLock lock(&mu_);
  return tracked_.size();
}

}  // namespace stash::daemon
