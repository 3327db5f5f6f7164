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

// What every HTTP/2 client sends first (RFC 9113, 3.4).
constexpr char kPreface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
constexpr size_t kPrefaceBytes = sizeof(kPreface) - 1;

}  // namespace

ConnectionGate::ConnectionGate(UniqueFd listener, std::string name, FairShare* budget,
                               Options options)
    : listener_(std::move(listener)),
      name_(std::move(name)),
      budget_(budget),
      options_(options),
      wake_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}

StatusOr<std::unique_ptr<ConnectionGate>> ConnectionGate::Create(UniqueFd listener,
                                                                 std::string name,
                                                                 FairShare* budget,
                                                                 Options options) {
  std::unique_ptr<ConnectionGate> gate(
      new ConnectionGate(std::move(listener), std::move(name), budget, options));
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
  std::vector<pollfd> fds;
  std::vector<size_t> polled;  // waiting_ index of each fds[2 + i]
  auto last_sweep = Clock::now();
  while (true) {
    const auto now = Clock::now();
    const bool resting = acceptor.backoff() > now;
    fds.assign(
        {{wake_.get(), POLLIN, 0}, {listener_.get(), static_cast<short>(resting ? 0 : POLLIN), 0}});
    polled.clear();
    // Waiting connections that sent nothing yet; one that sent part of the preface is looked at
    // again at the next sweep (its data would keep poll awake).
    for (size_t i = 0; i < waiting_.size(); ++i) {
      // Polled for hang-ups only (POLLHUP and POLLERR need no events).
      const short events = waiting_[i].partial ? 0 : POLLIN;
      fds.push_back({waiting_[i].fd.get(), events, 0});
      polled.push_back(i);
    }
    int timeout = static_cast<int>(kSweep.count());
    if (resting) {
      timeout = std::min<int>(
          timeout, static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                        acceptor.backoff() - now)
                                        .count()) +
                       1);
    }
    int rc = 0;
    STASH_SYSCALL_RETRY(rc, poll(fds.data(), fds.size(), timeout));
    if (rc < 0) {
      if (RestAfterFailedPoll(name_, wake_.get(), &poll_failed_log)) return;
      continue;
    }
    if (fds[0].revents != 0) return;
    // Waiting connections that spoke or hung up, latest index first so earlier ones keep theirs.
    for (size_t i = polled.size(); i-- > 0;) {
      if (fds[2 + i].revents != 0) {
        Look(polled[i], (fds[2 + i].revents & (POLLHUP | POLLERR)) != 0);
      }
    }
    if (Clock::now() - last_sweep >= kSweep) {
      Sweep();
      last_sweep = Clock::now();
    }
    if (!resting && fds[1].revents != 0) {
      for (int i = 0; i < kAcceptsPerWake; ++i) {
        auto accepted = acceptor.Accept();
        if (!accepted) break;
        Admit(std::move(*accepted));
      }
    }
  }
}

bool ConnectionGate::Privileged(const PeerCredentials& peer) const {
  return options_.reserved > 0 && peer.known &&
         (peer.uid == 0 || peer.uid == options_.reserved_uid);
}

uint32_t ConnectionGate::UidOf(const PeerCredentials& peer) const {
  return peer.known ? peer.uid : kUnknownUid;
}

ConnectionGate::Preface ConnectionGate::Peek(int fd) {
  char buf[kPrefaceBytes];
  ssize_t n = 0;
  STASH_SYSCALL_RETRY(n, recv(fd, buf, sizeof(buf), MSG_PEEK | MSG_DONTWAIT));
  if (n == 0) return Preface::kClosed;
  if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK ? Preface::kNone : Preface::kClosed;
  if (std::memcmp(buf, kPreface, static_cast<size_t>(n)) != 0) return Preface::kOther;
  return static_cast<size_t>(n) == kPrefaceBytes ? Preface::kComplete : Preface::kPartial;
}

void ConnectionGate::Look(size_t index, bool hung_up) {
  Preface preface = Peek(waiting_[index].fd.get());
  // A peer that hung up before its whole preface never sends the rest (what it sent stays
  // readable, so only the hang-up tells).
  if (hung_up && (preface == Preface::kNone || preface == Preface::kPartial)) {
    preface = Preface::kClosed;
  }
  switch (preface) {
    case Preface::kNone:
      return;
    case Preface::kPartial:
      waiting_[index].partial = true;
      return;
    case Preface::kClosed:
      Drop(waiting_[index]);
      break;
    case Preface::kComplete:
    case Preface::kOther:  // not HTTP/2: gRPC answers it and closes it
      HandOver(std::move(waiting_[index]));
      break;
  }
  waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(index));
}

void ConnectionGate::Drop(Waiting& w) {
  if (w.placed) budget_->Give(UidOf(w.peer), 1);
  w.placed = false;
  w.fd.reset();
}

void ConnectionGate::Forget(int fd) {
  auto it = tracked_.find(fd);
  if (it == tracked_.end()) return;
  Tracked& t = it->second;
  if (t.connection.reserved) {
    --reserved_used_;
  } else if (t.connection.refused.ok()) {
    budget_->Give(UidOf(t.connection.peer), 1);
  } else if (t.held.valid()) {
    --refused_held_;
  }
  tracked_.erase(it);
}

void ConnectionGate::Admit(Acceptor::Accepted accepted) {
  const int fd = accepted.fd.get();
  Waiting w;
  w.peer = accepted.peer;
  w.fd = std::move(accepted.fd);
  w.accepted = Clock::now();
  const Status took = budget_->Take(UidOf(w.peer), 1);
  w.placed = took.ok();
  if (!w.placed && !Privileged(w.peer)) {
    HandOver(std::move(w));  // refused at once: gRPC says why once it speaks
    return;
  }
  waiting_.push_back(std::move(w));
  // A client that connects and speaks at once is handed over without waiting for a poll.
  Look(waiting_.size() - 1, false);
  if (!waiting_.empty() && waiting_.back().fd.get() == fd && !waiting_.back().placed) {
    // Root's or the daemon's user's share is full: it waits for the preface without a place, for
    // a reserved one. A flood of them cannot crowd out a later one that speaks: the oldest goes.
    size_t unplaced = 0;
    size_t oldest = waiting_.size();
    for (size_t i = 0; i < waiting_.size(); ++i) {
      if (waiting_[i].placed) continue;
      ++unplaced;
      if (oldest == waiting_.size()) oldest = i;
    }
    if (unplaced > kMaxWaitingUnplaced && oldest < waiting_.size()) {
      Drop(waiting_[oldest]);
      waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(oldest));
      ++evicted_;
    }
  }
}

void ConnectionGate::HandOver(Waiting w) {
  const int fd = w.fd.get();
  const uint32_t uid = UidOf(w.peer);
  Tracked t;
  t.connection.peer = w.peer;
  t.cookie = CookieOf(fd);
  {
    MutexLock lock(&mu_);
    // That number was closed and reused: the old connection is gone, and its place in the
    // budget free before this one takes one.
    Forget(fd);
    if (!w.placed) {
      t.connection.refused = budget_->Take(uid, 1);
      if (t.connection.refused.ok()) {
        w.placed = true;  // a place came free meanwhile
      } else if (Privileged(w.peer)) {
        bool holds_another = false;
        for (const auto& [other_fd, other] : tracked_) {
          holds_another =
              holds_another || (other.connection.refused.ok() && other.connection.peer.known &&
                                other.connection.peer.pid == w.peer.pid);
        }
        if (!holds_another && reserved_used_ < options_.reserved) {
          ++reserved_used_;
          t.connection.reserved = true;
          t.connection.refused = Status::Ok();
        } else {
          t.connection.refused =
              Status(t.connection.refused.code(),
                     t.connection.refused.message() + "; the " + std::to_string(options_.reserved) +
                         " connections kept for root and stashd's user " +
                         (holds_another ? "go only to a process that holds no other connection (as "
                                          "stashctl does)"
                                        : "are in use too"));
        }
      }
    }
    if (!t.connection.refused.ok()) {
      const auto now = Clock::now();
      uint64_t held = 0;
      if (refused_log_.Allow(now, &held)) {
        Log("rpc")->warn(
            "{}: refused {} connection(s) since the last report; the latest, pid {} "
            "uid {}: {}",
            name_, held + 1, w.peer.pid, w.peer.uid, t.connection.refused.message());
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
  grpc::AddInsecureChannelFromFd(server_, w.fd.release());
}

void ConnectionGate::Sweep() {
  const auto now = Clock::now();
  // Waiting connections: a partial preface looked at again; past the timeout, closed.
  for (size_t i = waiting_.size(); i-- > 0;) {
    if (now - waiting_[i].accepted >= options_.preface_timeout) {
      Drop(waiting_[i]);
      waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(i));
      ++silent_closed_;
    } else if (waiting_[i].partial) {
      waiting_[i].partial = false;
      Look(i, false);
    }
  }
  uint64_t suppressed = 0;
  if ((silent_closed_ > 0 || evicted_ > 0) && silent_log_.Allow(now, &suppressed)) {
    Log("rpc")->warn(
        "{}: since the last report, closed {} connection(s) that sent no HTTP/2 preface within "
        "{} ms (their places are free again) and {} of root's or stashd's user's that waited "
        "without a place, for newer ones; {} still wait",
        name_, silent_closed_, options_.preface_timeout.count(), evicted_, waiting_.size());
    silent_closed_ = 0;
    evicted_ = 0;
  }
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
