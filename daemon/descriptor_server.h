// The descriptor channel's server: a Unix SOCK_SEQPACKET socket beside the gRPC socket
// (`<socket>.fd`) over which sessions hand the daemon file descriptors (SCM_RIGHTS), which gRPC
// cannot carry (stash/v1/descriptor.proto, docs/security.md).
//
// One thread serves every connection with poll(): a packet in, one answer out. A malformed
// packet is answered with INVALID_ARGUMENT and its connection closed; every descriptor that
// arrived with a refused packet is closed unread. Nothing a peer sends can block the thread: reads
// and writes never wait, and a peer that does not read its answers is disconnected.
#ifndef STASH_DAEMON_DESCRIPTOR_SERVER_H_
#define STASH_DAEMON_DESCRIPTOR_SERVER_H_

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/unique_fd.h"
#include "daemon/session.h"
#include "stash/status.h"
#include "stash/v1/descriptor.pb.h"

namespace stash::daemon {

// The descriptor socket of the gRPC socket at `socket_path`.
std::string DescriptorSocketPath(const std::string& socket_path);

// Whether process `pid` (in this process's pid namespace) is `namespaced_pid` in its own
// innermost pid namespace (/proc/<pid>/status NSpid), i.e. what it would call getpid().
bool ProcessHasPid(int64_t pid, int64_t namespaced_pid);

class DescriptorServer {
 public:
  // Runs one checked request from `peer` with the descriptors that came with it; the returned
  // status is the answer. Called on the server's thread only.
  using Handler = std::function<Status(const stash::v1::DescriptorRequest& request,
                                       const PeerCredentials& peer, std::vector<UniqueFd> fds)>;

  // The most connections served at once; more are accepted and closed at once.
  static constexpr size_t kMaxConnections = 1024;

  // Listens on `path` with mode 0660 and group `group` (-1 = keep), replacing a stale file, and
  // starts the thread.
  static StatusOr<std::unique_ptr<DescriptorServer>> Start(const std::string& path, gid_t group,
                                                           Handler handler);
  DescriptorServer(const DescriptorServer&) = delete;
  DescriptorServer& operator=(const DescriptorServer&) = delete;
  // Stops the thread, closes every connection and removes the socket file.
  ~DescriptorServer();

 private:
  struct Impl;
  explicit DescriptorServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace stash::daemon

#endif  // STASH_DAEMON_DESCRIPTOR_SERVER_H_
