#include "common/socket_probe.h"

#include <grp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/sys.h"

namespace stash {
namespace {

std::string DirOf(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string NoDaemon(const std::string& path, const std::string& detail) {
  return "no stashd answers on " + path + " (" + detail +
         "): start it with 'stashd --socket=" + path + "' or point STASHD_SOCKET at a running one";
}

}  // namespace

std::string GroupName(gid_t gid) {
  struct group entry {};
  struct group* found = nullptr;
  char buffer[4096];
  if (getgrgid_r(gid, &entry, buffer, sizeof(buffer), &found) == 0 && found != nullptr) {
    return found->gr_name;
  }
  return std::to_string(gid);
}

std::string PermissionDeniedMessage(const std::string& path) {
  // What denies: the socket itself, or the first directory on the way this user cannot search.
  std::string denier = path;
  for (std::string dir = DirOf(path); !dir.empty(); dir = DirOf(dir)) {
    if (access(dir.c_str(), X_OK) != 0) denier = dir;
    if (dir == "/" || dir == ".") break;
  }
  struct stat st {};
  const bool found = stat(denier.c_str(), &st) == 0;
  const std::string group = found ? GroupName(st.st_gid) : "stashd";
  const std::string what = denier == path ? "the socket" : "its directory " + denier;
  if (found && st.st_gid == 0) {
    return "permission denied on " + path + ": " + what +
           " belongs to group root, so only root may connect (stashd was started on a node "
           "without a 'stashd' group); have an administrator create it (sudo groupadd --system "
           "stashd), add you to it (sudo usermod -aG stashd $USER) and restart stashd";
  }
  return "permission denied on " + path + ": " + what + " lets in only its owner and group '" +
         group + "'; join the group with 'sudo usermod -aG " + group +
         " $USER' and log in again (or run as a member of it)";
}

Status ProbeSocket(const std::string& path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    return InvalidArgumentError("socket path " + path + " is longer than " +
                                std::to_string(sizeof(addr.sun_path) - 1) +
                                " bytes, the Unix socket limit: pick a shorter one");
  }
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return ErrnoStatus("socket(AF_UNIX)");
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  int rc = 0;
  STASH_SYSCALL_RETRY(rc, connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)));
  const int error = rc == 0 ? 0 : errno;
  close(fd);
  switch (error) {
    case 0:
      return Status::Ok();
    case ENOENT:
    case ENOTDIR:
      return UnavailableError(NoDaemon(path, "no such socket"));
    case ECONNREFUSED:
      return UnavailableError(
          NoDaemon(path, "the socket is there but nothing listens on it: its daemon is gone"));
    case EACCES:
    case EPERM:
      return PermissionDeniedError(PermissionDeniedMessage(path));
    default:
      return UnavailableError(NoDaemon(path, std::string("connect: ") + std::strerror(error)));
  }
}

}  // namespace stash
