#include "daemon/server/acceptor.h"

#include <fcntl.h>
#include <netdb.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/logging.h"
#include "common/sys.h"

namespace stash::daemon {
namespace {

using Clock = std::chrono::steady_clock;

// How long the listener rests when not even the spare descriptor can be had.
constexpr auto kBackoff = std::chrono::milliseconds(100);

UniqueFd OpenSpare() { return UniqueFd(open("/dev/null", O_RDONLY | O_CLOEXEC)); }

}  // namespace

StatusOr<UniqueFd> ListenUnix(const std::string& path, int type, gid_t group) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    return InvalidArgumentError("socket path " + path + " is longer than " +
                                std::to_string(sizeof(addr.sun_path) - 1) +
                                " bytes, the Unix socket limit: pick a shorter --socket");
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  UniqueFd fd(socket(AF_UNIX, type | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return ErrnoStatus("socket(AF_UNIX)");
  unlink(path.c_str());  // stale: the caller holds the daemon's lock
  // Born 0660 (the umask): a chmod after bind would leave a window with the umask's mode.
  const mode_t old_mask = umask(0117);
  const int bound = bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  umask(old_mask);
  if (bound != 0) return ErrnoStatus("bind(" + path + ")");
  // lchown: a symlink put in the socket's place is not followed.
  if (group != static_cast<gid_t>(-1) && lchown(path.c_str(), static_cast<uid_t>(-1), group) != 0) {
    Log("rpc")->warn("cannot give {} to group stashd: {}", path, std::strerror(errno));
  }
  if (listen(fd.get(), SOMAXCONN) != 0) return ErrnoStatus("listen(" + path + ")");
  return fd;
}

StatusOr<UniqueFd> ListenTcp(const std::string& address, int* port) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos) {
    return InvalidArgumentError("--listen=" + address + " is not HOST:PORT");
  }
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  const std::string service = address.substr(colon + 1);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0) {
    return InvalidArgumentError("--listen=" + address + ": " + gai_strerror(rc));
  }
  Status last = UnavailableError("--listen=" + address + " resolves to no address");
  UniqueFd fd;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    UniqueFd s(socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!s.valid()) {
      last = ErrnoStatus("socket()");
      continue;
    }
    // No SO_REUSEPORT: a second daemon must not share the port. SO_REUSEADDR only lets a
    // restart bind past connections in TIME_WAIT.
    const int one = 1;
    setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(s.get(), a->ai_addr, a->ai_addrlen) != 0 || listen(s.get(), SOMAXCONN) != 0) {
      last = ErrnoStatus("cannot listen on --listen=" + address);
      continue;
    }
    fd = std::move(s);
    break;
  }
  freeaddrinfo(found);
  if (!fd.valid()) return last;
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  if (getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &len) == 0) {
    *port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                              : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  }
  return fd;
}

bool RestAfterFailedPoll(const std::string& who, int wake, RateLimiter* log_limit) {
  const int err = errno;
  uint64_t held = 0;
  if (log_limit->Allow(Clock::now(), &held)) {
    Log("rpc")->error("{}: poll failed: {}; trying again every 100 ms", who, std::strerror(err));
  }
  usleep(100 * 1000);
  uint64_t stop = 0;
  return read(wake, &stop, sizeof(stop)) == sizeof(stop);
}

Acceptor::Acceptor(int listener, std::string name)
    : listener_(listener), name_(std::move(name)), spare_(OpenSpare()) {}

void Acceptor::NoteDropped(int err) {
  ++dropped_;
  uint64_t held = 0;
  if (!dropped_log_.Allow(Clock::now(), &held)) return;
  Log("rpc")->warn(
      "{}: out of descriptors ({}): turned away {} connection(s) since the last report; raise "
      "the open-file limit (LimitNOFILE= in the systemd unit) if this is not a flood",
      name_, std::strerror(err), held + 1);
}

std::optional<Acceptor::Accepted> Acceptor::Accept() {
  backoff_until_ = Clock::time_point::min();
  while (true) {
    UniqueFd fd(accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (fd.valid()) {
      Accepted accepted{std::move(fd), {}};
      ucred cred{};
      socklen_t len = sizeof(cred);
      if (getsockopt(accepted.fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 &&
          len == sizeof(cred)) {
        sockaddr_storage addr{};
        socklen_t addr_len = sizeof(addr);
        const bool unix_socket =
            getsockname(accepted.fd.get(), reinterpret_cast<sockaddr*>(&addr), &addr_len) == 0 &&
            addr.ss_family == AF_UNIX;
        if (unix_socket) {
          accepted.peer.pid = cred.pid;
          accepted.peer.uid = cred.uid;
          accepted.peer.gid = cred.gid;
          accepted.peer.known = true;
        }
      }
      if (!spare_.valid()) spare_ = OpenSpare();
      return accepted;
    }
    const int err = errno;
    if (err == EINTR || err == ECONNABORTED) continue;
    if (err == EAGAIN || err == EWOULDBLOCK) return std::nullopt;
    if (err == EMFILE || err == ENFILE) {
      // The kernel reports the shortage before it looks at the queue: there may be nobody.
      if (spare_.valid()) {
        // Free one descriptor, take the waiting connection with it and end it: it is the one
        // that hit the limit. Then hold the spare again for the next time.
        spare_.reset();
        UniqueFd victim(accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC));
        const bool took = victim.valid();
        victim.reset();
        spare_ = OpenSpare();
        if (!took) return std::nullopt;  // the queue is empty
        NoteDropped(err);
        // One turned away per call: the caller gets back to its other duties in between.
        if (spare_.valid()) return std::nullopt;
      } else {
        NoteDropped(err);
      }
      backoff_until_ = Clock::now() + kBackoff;
      return std::nullopt;
    }
    // ENOMEM, ENOBUFS, a protocol error of one connection: rest briefly, never spin. Nothing was
    // turned away: the connection waits in the backlog.
    const auto now = Clock::now();
    uint64_t held = 0;
    if (error_log_.Allow(now, &held)) {
      Log("rpc")->warn("{}: accept failed: {}; resting {} ms", name_, std::strerror(err),
                       std::chrono::duration_cast<std::chrono::milliseconds>(kBackoff).count());
    }
    backoff_until_ = now + kBackoff;
    return std::nullopt;
  }
}

}  // namespace stash::daemon
