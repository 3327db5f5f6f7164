#include "daemon/descriptor_server.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/descriptor_socket.h"
#include "common/logging.h"
#include "common/sys.h"
#include "daemon/descriptor_message.h"

namespace stash::daemon {

std::string DescriptorSocketPath(const std::string& socket_path) { return socket_path + ".fd"; }

bool ProcessHasPid(int64_t pid, int64_t namespaced_pid) {
  if (pid <= 0 || namespaced_pid <= 0) return false;
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("NSpid:", 0) != 0) continue;
    std::istringstream fields(line.substr(6));
    int64_t last = 0;
    int64_t value = 0;
    while (fields >> value) last = value;
    return last == namespaced_pid;
  }
  return pid == namespaced_pid;  // a kernel without NSpid (< 4.1) has one pid namespace view
}

struct DescriptorServer::Impl {
  std::string path;
  Handler handler;
  UniqueFd listener;
  UniqueFd wake;  // eventfd: Stop
  struct Connection {
    UniqueFd fd;
    PeerCredentials peer;
  };
  std::vector<Connection> connections;  // the thread's own
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
  // Bind with a umask that keeps the file private until it has its final mode and group.
  const mode_t old_mask = umask(0177);
  const int bound = bind(impl->listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  umask(old_mask);
  if (bound != 0) return ErrnoStatus("bind(" + path + ")");
  if (group != static_cast<gid_t>(-1) && chown(path.c_str(), static_cast<uid_t>(-1), group) != 0) {
    Log("ipc")->warn("cannot give {} to group stashd: {}", path, std::strerror(errno));
  }
  if (chmod(path.c_str(), 0660) != 0) return ErrnoStatus("chmod(" + path + ", 0660)");
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
    int rc = 0;
    STASH_SYSCALL_RETRY(rc, poll(fds.data(), fds.size(), -1));
    if (rc < 0) {
      Log("ipc")->error("descriptor server: poll failed: {}", std::strerror(errno));
      return;
    }
    if (fds[0].revents != 0) return;
    // Connections first (indices shift as they close), then new ones.
    std::vector<Connection> kept;
    kept.reserve(connections.size());
    for (size_t i = 0; i < connections.size(); ++i) {
      const short events = fds[i + 2].revents;
      if (events == 0 || Serve(connections[i])) {
        if ((events & (POLLHUP | POLLERR | POLLNVAL)) != 0 && (events & POLLIN) == 0) continue;
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
    connections.push_back(Connection{std::move(fd), PeerCredentials{cred.pid, cred.uid, cred.gid}});
  }
}

bool DescriptorServer::Impl::Serve(Connection& c) {
  auto packet = ReceivePacket(c.fd.get(), /*nonblocking=*/true);
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
    (void)SendPacket(c.fd.get(), DescriptorAnswer(request.status()), {}, true);
    return false;
  }
  const Status status = handler(*request, c.peer, std::move(packet->fds));
  if (status.code() == StatusCode::kPermissionDenied) {
    Log("ipc")->warn("descriptor channel: refused pid {} uid {}: {}", c.peer.pid, c.peer.uid,
                     status.message());
  }
  const Status sent = SendPacket(
      c.fd.get(), DescriptorAnswer(status, request->deposit_memory().memory_id()), {}, true);
  return sent.ok() && status.code() != StatusCode::kPermissionDenied;
}

}  // namespace stash::daemon
