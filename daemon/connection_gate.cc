#include "daemon/connection_gate.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
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

ino_t InodeOf(int fd) {
  struct stat st {};
  return fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode) ? st.st_ino : 0;
}

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

ConnectionGate::~ConnectionGate() {
  const uint64_t one = 1;
  if (write(wake_.get(), &one, sizeof(one)) != sizeof(one)) {
    Log("rpc")->error("cannot wake the {} gate: {}", name_, std::strerror(errno));
  }
  if (thread_.joinable()) thread_.join();
}

void ConnectionGate::Run() {
  Acceptor acceptor(listener_.get(), name_);
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
      Log("rpc")->error("{}: poll failed: {}", name_, std::strerror(errno));
      return;
    }
    if (fds[0].revents != 0) return;
    Sweep();
    if (!resting && fds[1].revents != 0) {
      while (auto accepted = acceptor.Accept()) Admit(std::move(*accepted));
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
  t.inode = InodeOf(fd);
  t.connection.refused = budget_->Take(uid, 1);
  {
    MutexLock lock(&mu_);
    Forget(fd);  // that number was closed and reused: the old connection is gone
    if (!t.connection.refused.ok()) {
      const auto now = Clock::now();
      ++refused_;
      if (now - refused_logged_ >= std::chrono::seconds(10)) {
        Log("rpc")->warn(
            "{}: refused {} connection(s) in the last 10 s; the latest, pid {} uid {}: {}", name_,
            refused_, accepted.peer.pid, accepted.peer.uid, t.connection.refused.message());
        refused_ = 0;
        refused_logged_ = now;
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
  MutexLock lock(&mu_);
  std::vector<int> gone;
  for (auto& [fd, t] : tracked_) {
    if (t.held.valid() && now >= t.deadline) {
      // The refusal had its time to be read: end the connection (gRPC then closes its side).
      shutdown(t.held.get(), SHUT_RDWR);
      t.held.reset();
      --refused_held_;
    }
    if (InodeOf(fd) != t.inode) gone.push_back(fd);
  }
  for (int fd : gone) Forget(fd);
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
