// Where stashd's Unix socket lives (docs/design.md): one variable, the MPS convention.
#ifndef STASH_COMMON_SOCKET_PATH_H_
#define STASH_COMMON_SOCKET_PATH_H_

#include <string>
#include <string_view>

namespace stash {

// The system default, "/run/stashd/stashd.sock".
inline constexpr std::string_view kSystemSocketPath = "/run/stashd/stashd.sock";

// The per-user fallback used when /run/stashd is not writable:
// "$XDG_RUNTIME_DIR/stashd/stashd.sock", or "/tmp/stashd-<uid>/stashd.sock" without it.
std::string UserSocketPath();

// The socket a daemon should serve on: `explicit_path` if not empty, else $STASHD_SOCKET, else
// the system default when its directory exists and is writable or can be created, else
// UserSocketPath().
std::string DaemonSocketPath(std::string_view explicit_path);

// The socket a client should connect to: `explicit_path` if not empty, else $STASHD_SOCKET,
// else the system default when it exists, else UserSocketPath() when that exists, else the
// system default (so the error names it).
std::string ClientSocketPath(std::string_view explicit_path);

// "unix:<path>" for gRPC.
inline std::string GrpcUnixTarget(const std::string& path) { return "unix:" + path; }

}  // namespace stash

#endif  // STASH_COMMON_SOCKET_PATH_H_
