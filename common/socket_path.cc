#include "common/socket_path.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

namespace stash {
namespace {

std::string EnvSocket() {
  const char* env = std::getenv("STASHD_SOCKET");
  return env != nullptr ? std::string(env) : std::string();
}

bool Exists(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0;
}

std::string DirOf(std::string_view path) {
  const auto slash = path.rfind('/');
  return slash == std::string_view::npos ? std::string(".") : std::string(path.substr(0, slash));
}

}  // namespace

std::string UserSocketPath() {
  const char* xdg = std::getenv("XDG_RUNTIME_DIR");
  if (xdg != nullptr && *xdg != '\0' && access(xdg, W_OK) == 0) {
    return std::string(xdg) + "/stashd/stashd.sock";
  }
  return "/tmp/stashd-" + std::to_string(getuid()) + "/stashd.sock";
}

std::string DaemonSocketPath(std::string_view explicit_path) {
  if (!explicit_path.empty()) return std::string(explicit_path);
  if (std::string env = EnvSocket(); !env.empty()) return env;
  const std::string dir = DirOf(kSystemSocketPath);
  if (Exists(dir)) {
    if (access(dir.c_str(), W_OK) == 0) return std::string(kSystemSocketPath);
  } else if (access(DirOf(dir).c_str(), W_OK) == 0) {
    return std::string(kSystemSocketPath);  // the daemon can create /run/stashd
  }
  return UserSocketPath();
}

std::string ClientSocketPath(std::string_view explicit_path) {
  if (!explicit_path.empty()) return std::string(explicit_path);
  if (std::string env = EnvSocket(); !env.empty()) return env;
  if (Exists(std::string(kSystemSocketPath))) return std::string(kSystemSocketPath);
  if (std::string user = UserSocketPath(); Exists(user)) return user;
  return std::string(kSystemSocketPath);
}

}  // namespace stash
