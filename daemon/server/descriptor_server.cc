#include "daemon/server/descriptor_server.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <linux/sockios.h>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <memory>
#include <thread>

#include "common/descriptor_socket.h"
#include "common/logging.h"
#include "common/macros.h"
#include "common/mutex.h"
#include "common/sys.h"
#include "daemon/limits/fair_share.h"
#include "daemon/limits/rate_limiter.h"
#include "daemon/protocol/descriptor_message.h"
#include "daemon/server/acceptor.h"

namespace stash::daemon {

std::string DescriptorSocketPath(const std::string& socket_path) { return socket_path + ".fd"; }

namespace {

using Clock = std::chrono::steady_clock;

// A connection that has not sent a valid request by then is closed.
constexpr auto kIdleLimit = std::chrono::seconds(10);
// Descriptors waiting for the closer; past this the server closes them itself.
constexpr size_t kMaxClosing = 4096;

// Closes descriptors the daemon does not keep, on a thread of its own: the last close of a
// hostile descriptor can block for as long as its sender likes. The thread shares its state,
// so a thread stuck in a close can be left behind when the server stops.
class Closer {
 public:
  Closer() : state_(std::make_shared<State>()) {
    std::thread([state = state_] { state->Run(); }).detach();
  }
  Closer(const Closer&) = delete;
  Closer& operator=(const Closer&) = delete;
  ~Closer() {
    MutexLock lock(&state_->mu);
    state_->stopping = true;
    state_->cv.Signal();
  }

  void Close(std::vector<UniqueFd>& fds) {
    if (fds.empty()) return;
    State& s = *state_;
    MutexLock lock(&s.mu);
    if (s.queue.size() + fds.size() > kMaxClosing) {
      if (!s.warned) {
        Log("ipc")->error(
            "descriptor server: {} descriptors wait to be closed (a peer sent descriptors whose "
            "close blocks); closing on the server thread from now on",
            s.queue.size());
        s.warned = true;
      }
      fds.clear();  // closes them here
      return;
    }
    for (UniqueFd& fd : fds) s.queue.push_back(std::move(fd));
    fds.clear();
    s.cv.Signal();
  }

 private:
  struct State {
    Mutex mu;
    CondVar cv;
    std::deque<UniqueFd> queue ABSL_GUARDED_BY(mu);
    bool stopping ABSL_GUARDED_BY(mu) = false;
    bool warned ABSL_GUARDED_BY(mu) = false;

    void Run() {
      MutexLock lock(&mu);
      while (true) {
        while (queue.empty() && !stopping) cv.Wait(&mu);
        if (queue.empty()) return;
        UniqueFd fd = std::move(queue.front());
        queue.pop_front();
        mu.Unlock();
        fd.reset();
        mu.Lock();
      }
    }
  };
  std::shared_ptr<State> state_;
};

// How long a peer may leave an answer unsent (its socket buffer full) before it is disconnected.
constexpr auto kStuckLimit = std::chrono::seconds(1);
// How often the server looks whether peers read the descriptors it sent them.
constexpr int kInflightCheckMs = 20;

// Descriptors the daemon may have sent and its peers not yet read, over all peers: the kernel
// counts them against the daemon (a sender past RLIMIT_NOFILE of them in flight is refused
// with ETOOMANYREFS unless it runs as root), and queued ones are descriptors of its own.
uint64_t InflightCapacity() { return std::max<uint64_t>(64, OpenFileLimit() / 4); }

// Connections served at once: kMaxConnections, or fewer where the open-file limit is low (each is
// a descriptor of the daemon), but room for two users' worth.
uint64_t MaxConnections() {
  return std::clamp<uint64_t>(OpenFileLimit() / 8, 2 * DescriptorServer::kMaxConnectionsPerUser,
                              DescriptorServer::kMaxConnections);
}

// Bytes the peer has not read yet of what was sent on `socket` (SIOCOUTQ); 0 when unknown.
int Unread(int socket) {
  int pending = 0;
  if (ioctl(socket, SIOCOUTQ, &pending) != 0) return 0;
  return pending;
}

}  // namespace

struct DescriptorServer::Impl {
  std::string path;
  Handler handler;
  UniqueFd listener;
  UniqueFd wake;  // eventfd: Stop
  FairShare connection_share{{"descriptor-channel connections", MaxConnections(),
                              kMaxConnectionsPerUser, kMaxConnectionsPerUser,
                              "close some (one per session is enough)"}};
  FairShare inflight_share{{"descriptors sent to clients and not yet read", InflightCapacity(),
                            InflightCapacity() / 8, 0,
                            "read the answers of earlier lease requests first"}};
  struct Outgoing {
    std::string bytes;
    UniqueFd fd;  // -1: none
  };
  struct Connection {
    UniqueFd fd;
    PeerCredentials peer;
    Clock::time_point accepted;
    bool served = false;         // sent a valid request
    std::deque<Outgoing> queue;  // the answer's packets not sent yet
    Clock::time_point stuck_since{};
    uint64_t inflight = 0;  // descriptors queued or sent and not known read
    bool close_after_send = false;
  };
  std::vector<Connection> connections;                 // the thread's own
  RateLimiter stuck_log{1, std::chrono::seconds(10)};  // peers disconnected for not reading
  Closer closer;
  std::thread thread;

  void Run();
  void Accept(Acceptor& acceptor);
  // Serves one packet of connection `c`; false when the connection must close.
  bool Serve(Connection& c);
  // Sends what `c` has queued without waiting; false when the connection must close.
  bool Flush(Connection& c, Clock::time_point now);
  // Whether `c` may be read: its earlier answer's descriptors were all read by the peer.
  bool Drained(Connection& c);
  void Close(Connection& c);
};

DescriptorServer::DescriptorServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

StatusOr<std::unique_ptr<DescriptorServer>> DescriptorServer::Start(const std::string& path,
                                                                    gid_t group, Handler handler) {
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->handler = std::move(handler);
  STASH_ASSIGN_OR_RETURN(impl->listener, ListenUnix(path, SOCK_SEQPACKET, group));
  impl->wake.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!impl->wake.valid()) return ErrnoStatus("eventfd");
  Impl* raw = impl.get();
  raw->thread = std::thread([raw] { raw->Run(); });
  return std::unique_ptr<DescriptorServer>(new DescriptorServer(std::move(impl)));
}

DescriptorServer::~DescriptorServer() {
  const uint64_t one = 1;
  if (write(impl_->wake.get(), &one, sizeof(one)) != sizeof(one)) {
    Log("ipc")->error("cannot wake the descriptor server: {}", std::strerror(errno));
  }
  if (impl_->thread.joinable()) impl_->thread.join();
  for (auto& c : impl_->connections) impl_->Close(c);
  unlink(impl_->path.c_str());
}

void DescriptorServer::Impl::Close(Connection& c) {
  std::vector<UniqueFd> fds;
  for (Outgoing& o : c.queue) {
    if (o.fd.valid()) fds.push_back(std::move(o.fd));
  }
  c.queue.clear();
  closer.Close(fds);
  inflight_share.Give(c.peer.uid, c.inflight);
  c.inflight = 0;
  connection_share.Give(c.peer.uid, 1);
  c.fd.reset();
}

bool DescriptorServer::Impl::Drained(Connection& c) {
  if (c.inflight == 0) return true;
  if (!c.queue.empty() || Unread(c.fd.get()) != 0) return false;
  inflight_share.Give(c.peer.uid, c.inflight);
  c.inflight = 0;
  return true;
}

void DescriptorServer::Impl::Run() {
  Acceptor acceptor(listener.get(), "descriptor socket " + path);
  std::vector<pollfd> fds;
  RateLimiter poll_failed_log(1, std::chrono::seconds(10));
  while (true) {
    const auto now = Clock::now();
    const bool resting = acceptor.backoff() > now;
    fds.clear();
    fds.push_back({wake.get(), POLLIN, 0});
    fds.push_back({listener.get(), static_cast<short>(resting ? 0 : POLLIN), 0});
    bool unserved = false;
    bool waiting = false;  // on a peer to read, or to make room
    for (Connection& c : connections) {
      short events = 0;
      if (!c.queue.empty()) {
        events = POLLOUT;
        waiting = true;
      } else if (Drained(c)) {
        events = POLLIN;
      } else {
        waiting = true;  // looked at again in kInflightCheckMs
      }
      fds.push_back({c.fd.get(), events, 0});
      unserved = unserved || !c.served;
    }
    int timeout = -1;
    if (unserved) timeout = 1000;
    if (waiting) timeout = kInflightCheckMs;
    if (resting) timeout = timeout < 0 ? 100 : std::min(timeout, 100);
    int rc = 0;
    STASH_SYSCALL_RETRY(rc, poll(fds.data(), fds.size(), timeout));
    if (rc < 0) {
      if (RestAfterFailedPoll("descriptor server", wake.get(), &poll_failed_log)) return;
      continue;
    }
    if (fds[0].revents != 0) return;
    // Connections first (indices shift as they close), then new ones.
    std::vector<Connection> kept;
    kept.reserve(connections.size());
    const auto after = Clock::now();
    for (size_t i = 0; i < connections.size(); ++i) {
      Connection& c = connections[i];
      const short events = fds[i + 2].revents;
      bool keep = true;
      if (!c.queue.empty()) {
        keep = Flush(c, after);
      } else if ((events & POLLIN) != 0) {
        keep = Serve(c) && Flush(c, after);
      } else if ((events & (POLLHUP | POLLERR | POLLNVAL)) != 0) {
        keep = false;
      }
      if (keep && c.queue.empty() && c.close_after_send) keep = false;
      if (keep && !c.served && after - c.accepted > kIdleLimit) keep = false;
      if (keep) {
        kept.push_back(std::move(c));
      } else {
        Close(c);
      }
    }
    connections = std::move(kept);
    if (fds[1].revents != 0) Accept(acceptor);
  }
}

void DescriptorServer::Impl::Accept(Acceptor& acceptor) {
  // At most a few per wake-up: a flood that keeps the backlog full cannot hold the one thread
  // every peer's requests wait on.
  for (int i = 0; i < 32; ++i) {
    auto accepted = acceptor.Accept();
    if (!accepted) break;
    UniqueFd fd = std::move(accepted->fd);
    const PeerCredentials& p = accepted->peer;
    if (Status took = connection_share.Take(p.uid, 1); !took.ok()) {
      // Said on the connection: the client reads it as the answer to its first request.
      (void)SendPacket(fd.get(), DescriptorAnswer(took), {}, /*nonblocking=*/true);
      continue;  // closes it
    }
    Connection c;
    c.fd = std::move(fd);
    c.peer = p;
    c.accepted = Clock::now();
    connections.push_back(std::move(c));
  }
}

bool DescriptorServer::Impl::Flush(Connection& c, Clock::time_point now) {
  while (!c.queue.empty()) {
    Outgoing& o = c.queue.front();
    std::vector<int> fds;
    if (o.fd.valid()) fds.push_back(o.fd.get());
    const Status sent = SendPacket(c.fd.get(), o.bytes, fds, /*nonblocking=*/true);
    if (!sent.ok()) {
      if (sent.code() != StatusCode::kUnavailable) return false;  // the peer is gone
      if (c.stuck_since == Clock::time_point{}) c.stuck_since = now;
      if (now - c.stuck_since > kStuckLimit) {
        uint64_t held = 0;
        if (stuck_log.Allow(now, &held)) {
          Log("ipc")->warn(
              "descriptor channel: disconnected {} peer(s) that left an answer unsent for a "
              "second since the last report, the latest pid {} uid {} (chunks a peer did not "
              "receive stay in its lease until its process exits)",
              held + 1, c.peer.pid, c.peer.uid);
        }
        return false;
      }
      return true;
    }
    c.stuck_since = Clock::time_point{};
    if (o.fd.valid()) {
      std::vector<UniqueFd> done;
      done.push_back(std::move(o.fd));
      closer.Close(done);  // the peer has its own copy now
    }
    c.queue.pop_front();
  }
  return true;
}

bool DescriptorServer::Impl::Serve(Connection& c) {
  std::vector<UniqueFd> refused;
  auto packet = ReceivePacket(c.fd.get(), /*nonblocking=*/true, &refused);
  closer.Close(refused);
  if (!packet.ok()) {
    if (packet.status().code() == StatusCode::kUnavailable) return true;  // spurious wake-up
    if (packet.status().code() == StatusCode::kOutOfRange) return false;  // closed
    c.queue.push_back(Outgoing{DescriptorAnswer(packet.status()), UniqueFd()});
    c.close_after_send = true;
    return true;
  }
  auto request = ParseDescriptorRequest(packet->bytes, packet->fds.size());
  if (!request.ok()) {
    Log("ipc")->warn("descriptor channel: pid {} uid {} sent a bad packet: {}", c.peer.pid,
                     c.peer.uid, request.status().message());
    closer.Close(packet->fds);
    c.queue.push_back(Outgoing{DescriptorAnswer(request.status()), UniqueFd()});
    c.close_after_send = true;
    return true;
  }
  PeerCredentials peer = c.peer;
  peer.socket = c.fd.get();
  // The answer may carry at most the user's fair share of descriptors in flight.
  peer.max_descriptors = inflight_share.Headroom(c.peer.uid);
  DescriptorReply reply = handler(*request, peer, packet->fds);
  closer.Close(packet->fds);  // what the handler did not keep
  const Status& status = reply.status;
  if (status.code() == StatusCode::kPermissionDenied) {
    Log("ipc")->warn("descriptor channel: refused pid {} uid {}: {}", c.peer.pid, c.peer.uid,
                     status.message());
    c.close_after_send = true;
  } else {
    c.served = true;
  }
  // A lease's chunk packets, then the answer, all queued and sent without waiting: a peer that
  // leaves them unread past kStuckLimit is disconnected (its chunks stay leased to its session
  // until it exits), and the connection is not read again before the peer read them all.
  uint64_t descriptors = 0;
  for (DescriptorPart& part : reply.parts) {
    descriptors += part.fd.valid() ? 1 : 0;
    c.queue.push_back(Outgoing{std::move(part.bytes), std::move(part.fd)});
  }
  if (descriptors > 0) {
    // Within the headroom given to the handler; a handler that sent more still counts it all.
    if (!inflight_share.Take(c.peer.uid, descriptors).ok()) {
      Log("ipc")->error(
          "descriptor channel: an answer carries {} descriptors, past the share "
          "of uid {}",
          descriptors, c.peer.uid);
    } else {
      c.inflight += descriptors;
    }
  }
  reply.last.set_memory_id(request->deposit_memory().memory_id());
  c.queue.push_back(Outgoing{DescriptorAnswer(status, std::move(reply.last)), UniqueFd()});
  return true;
}

}  // namespace stash::daemon
