#include "daemon/descriptor_server.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <memory>
#include <thread>

#include "common/descriptor_socket.h"
#include "common/logging.h"
#include "common/mutex.h"
#include "common/sys.h"
#include "daemon/descriptor_message.h"

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

// How long one lease answer may wait for room in a peer's socket buffer, all its packets
// together: a client reads its chunk packets as they come, and the buffer holds dozens of them,
// so only a peer that does not read ever waits. The server's one thread is held that long at
// most, and only by an answer that grants chunks (docs/security.md).
constexpr std::chrono::milliseconds kLeaseSendLimit(200);

// Sends one packet without blocking, waiting for room until `deadline` when the peer's buffer
// is full (not at all for a deadline already past).
bool SendBy(int socket, const std::string& bytes, const std::vector<int>& fds,
            Clock::time_point deadline) {
  while (true) {
    const Status sent = SendPacket(socket, bytes, fds, /*nonblocking=*/true);
    if (sent.ok()) return true;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (sent.code() != StatusCode::kUnavailable || left.count() <= 0) return false;
    pollfd p{socket, POLLOUT, 0};
    int rc = 0;
    STASH_SYSCALL_RETRY(rc, poll(&p, 1, static_cast<int>(left.count())));
    if (rc < 0) return false;
  }
}

}  // namespace

struct DescriptorServer::Impl {
  std::string path;
  Handler handler;
  UniqueFd listener;
  UniqueFd wake;  // eventfd: Stop
  struct Connection {
    UniqueFd fd;
    PeerCredentials peer;
    Clock::time_point accepted;
    bool served = false;  // sent a valid request
  };
  std::vector<Connection> connections;  // the thread's own
  Closer closer;
  std::thread thread;

  void Run();
  void Accept();
  // Serves one packet of connection `c`; false when the connection must close.
  bool Serve(Connection& c);
};

DescriptorServer::DescriptorServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

StatusOr<std::unique_ptr<DescriptorServer>> DescriptorServer::Start(const std::string& path,
                                                                    gid_t group, Handler handler) {
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->handler = std::move(handler);
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    return InvalidArgumentError("descriptor socket path " + path + " is longer than " +
                                std::to_string(sizeof(addr.sun_path) - 1) +
                                " bytes, the Unix socket limit: pick a shorter --socket");
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  impl->listener.reset(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!impl->listener.valid()) return ErrnoStatus("socket(AF_UNIX, SOCK_SEQPACKET)");
  unlink(path.c_str());  // stale: the caller holds the daemon's lock
  // Born 0660 (the umask), never changed by path afterwards but for the group (lchown: a
  // symlink put in its place is not followed).
  const mode_t old_mask = umask(0117);
  const int bound = bind(impl->listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  umask(old_mask);
  if (bound != 0) return ErrnoStatus("bind(" + path + ")");
  if (group != static_cast<gid_t>(-1) && lchown(path.c_str(), static_cast<uid_t>(-1), group) != 0) {
    Log("ipc")->warn("cannot give {} to group stashd: {}", path, std::strerror(errno));
  }
  if (listen(impl->listener.get(), 128) != 0) return ErrnoStatus("listen(" + path + ")");
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
  unlink(impl_->path.c_str());
}

void DescriptorServer::Impl::Run() {
  std::vector<pollfd> fds;
  while (true) {
    fds.clear();
    fds.push_back({wake.get(), POLLIN, 0});
    fds.push_back({listener.get(), POLLIN, 0});
    for (const Connection& c : connections) fds.push_back({c.fd.get(), POLLIN, 0});
    bool unserved = false;
    for (const Connection& c : connections) unserved = unserved || !c.served;
    int rc = 0;
    STASH_SYSCALL_RETRY(rc, poll(fds.data(), fds.size(), unserved ? 1000 : -1));
    if (rc < 0) {
      Log("ipc")->error("descriptor server: poll failed: {}", std::strerror(errno));
      return;
    }
    if (fds[0].revents != 0) return;
    // Connections first (indices shift as they close), then new ones.
    std::vector<Connection> kept;
    kept.reserve(connections.size());
    const auto now = Clock::now();
    for (size_t i = 0; i < connections.size(); ++i) {
      const short events = fds[i + 2].revents;
      if (events == 0 || Serve(connections[i])) {
        if ((events & (POLLHUP | POLLERR | POLLNVAL)) != 0 && (events & POLLIN) == 0) continue;
        if (!connections[i].served && now - connections[i].accepted > kIdleLimit) continue;
        kept.push_back(std::move(connections[i]));
      }
    }
    connections = std::move(kept);
    if (fds[1].revents != 0) Accept();
  }
}

void DescriptorServer::Impl::Accept() {
  while (true) {
    UniqueFd fd(accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!fd.valid()) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        Log("ipc")->warn("descriptor server: accept failed: {}", std::strerror(errno));
      }
      return;
    }
    if (connections.size() >= kMaxConnections) {
      (void)SendPacket(fd.get(),
                       DescriptorAnswer(ResourceExhaustedError(
                           "stashd serves at most " + std::to_string(kMaxConnections) +
                           " descriptor-channel connections at once: try again later")),
                       {}, /*nonblocking=*/true);
      continue;  // closes it
    }
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
      Log("ipc")->warn("descriptor server: SO_PEERCRED failed: {}", std::strerror(errno));
      continue;
    }
    size_t same_user = 0;
    for (const Connection& c : connections) same_user += c.peer.uid == cred.uid ? 1 : 0;
    if (same_user >= kMaxConnectionsPerUser) {
      (void)SendPacket(fd.get(),
                       DescriptorAnswer(ResourceExhaustedError(
                           "uid " + std::to_string(cred.uid) + " has " + std::to_string(same_user) +
                           " descriptor-channel connections open, the limit per user: close "
                           "some (one per session is enough)")),
                       {}, /*nonblocking=*/true);
      continue;
    }
    connections.push_back(Connection{
        std::move(fd), PeerCredentials{cred.pid, cred.uid, cred.gid, -1}, Clock::now(), false});
  }
}

bool DescriptorServer::Impl::Serve(Connection& c) {
  std::vector<UniqueFd> refused;
  auto packet = ReceivePacket(c.fd.get(), /*nonblocking=*/true, &refused);
  closer.Close(refused);
  if (!packet.ok()) {
    if (packet.status().code() == StatusCode::kUnavailable) return true;  // spurious wake-up
    if (packet.status().code() == StatusCode::kOutOfRange) return false;  // closed
    (void)SendPacket(c.fd.get(), DescriptorAnswer(packet.status()), {}, true);
    return false;
  }
  auto request = ParseDescriptorRequest(packet->bytes, packet->fds.size());
  if (!request.ok()) {
    Log("ipc")->warn("descriptor channel: pid {} uid {} sent a bad packet: {}", c.peer.pid,
                     c.peer.uid, request.status().message());
    closer.Close(packet->fds);
    (void)SendPacket(c.fd.get(), DescriptorAnswer(request.status()), {}, true);
    return false;
  }
  PeerCredentials peer = c.peer;
  peer.socket = c.fd.get();
  DescriptorReply reply = handler(*request, peer, packet->fds);
  closer.Close(packet->fds);  // what the handler did not keep
  const Status& status = reply.status;
  if (status.code() != StatusCode::kPermissionDenied) c.served = true;
  if (status.code() == StatusCode::kPermissionDenied) {
    Log("ipc")->warn("descriptor channel: refused pid {} uid {}: {}", c.peer.pid, c.peer.uid,
                     status.message());
  }
  // A lease's chunk packets, then the answer: a peer that leaves them unread past
  // kLeaseSendLimit is disconnected (its chunks stay leased to its session until it exits).
  // Other answers never wait: the protocol has one answer in flight.
  const auto deadline = reply.parts.empty() ? Clock::now() : Clock::now() + kLeaseSendLimit;
  bool sent_parts = true;
  for (DescriptorPart& part : reply.parts) {
    if (!sent_parts) break;
    sent_parts = SendBy(c.fd.get(), part.bytes, {part.fd.get()}, deadline);
  }
  if (!reply.parts.empty()) {
    std::vector<UniqueFd> sent_fds;
    for (DescriptorPart& part : reply.parts) sent_fds.push_back(std::move(part.fd));
    closer.Close(sent_fds);  // the peer has its own copies now
  }
  if (!sent_parts) return false;
  reply.last.set_memory_id(request->deposit_memory().memory_id());
  const bool sent =
      SendBy(c.fd.get(), DescriptorAnswer(status, std::move(reply.last)), {}, deadline);
  return sent && status.code() != StatusCode::kPermissionDenied;
}

}  // namespace stash::daemon
