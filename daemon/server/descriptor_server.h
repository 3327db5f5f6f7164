// The descriptor channel's server: a Unix SOCK_SEQPACKET socket beside the gRPC socket
// (`<socket>.fd`) over which sessions hand the daemon file descriptors (SCM_RIGHTS), which gRPC
// cannot carry (stash/v1/descriptor.proto, docs/security.md).
//
// One thread serves every connection with poll(): a packet in, one answer out. A malformed
// packet is answered with INVALID_ARGUMENT and its connection closed; every descriptor the
// daemon does not keep is closed unread, on a closer thread of its own (closing a hostile
// descriptor can block: a socket lingering on unsent data, a file of a FUSE server that does
// not answer).
//
// The server never waits on one peer while another's packet is ready: an answer is queued on its
// connection and sent without blocking as the peer makes room; a peer that leaves it unsent for
// a second is disconnected, and a connection is not read again until the peer read every
// descriptor of its last answer. Descriptors in flight (queued, or sent and not yet read) are a
// budget shared fairly between users (daemon/limits/fair_share.h): a lease answer carries at most
// the asking user's share. Connections are accepted by an Acceptor (a spare descriptor: running out
// costs only the connection that hit the limit), at most 1024 at once, 64 per Unix user; one
// over either limit is answered with the reason before it is closed, and one that sent nothing
// valid within 10 s is closed.
#ifndef STASH_DAEMON_DESCRIPTOR_SERVER_H_
#define STASH_DAEMON_DESCRIPTOR_SERVER_H_

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/unique_fd.h"
#include "daemon/protocol/descriptor_message.h"
#include "daemon/sessions/peer_credentials.h"
#include "stash/status.h"
#include "stash/v1/descriptor.pb.h"

namespace stash::daemon {

// The descriptor socket of the gRPC socket at `socket_path`.
std::string DescriptorSocketPath(const std::string& socket_path);

class DescriptorServer {
 public:
  // Runs one checked request from `peer` with the descriptors that came with it: moves out of
  // `fds` what it keeps (the server closes the rest). The reply is the answer: its parts are
  // sent first, each with its descriptor, then the last packet. `peer.socket` is the
  // connection, valid during the call. Called on the server's thread only.
  using Handler =
      std::function<DescriptorReply(const stash::v1::DescriptorRequest& request,
                                    const PeerCredentials& peer, std::vector<UniqueFd>& fds)>;

  // The most connections served at once (fewer where the open-file limit is under 8 times
  // this), and per Unix user; more are answered RESOURCE_EXHAUSTED and closed.
  static constexpr size_t kMaxConnections = 1024;
  static constexpr size_t kMaxConnectionsPerUser = 64;

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
