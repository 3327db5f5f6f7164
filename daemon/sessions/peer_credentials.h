// Who is at the other end of a connection: SO_PEERCRED on a Unix socket, in the daemon's pid
// namespace. One struct for every socket the daemon accepts on (gRPC, descriptor channel, TCP)
// and for the process a session is bound to.
#ifndef STASH_DAEMON_PEER_CREDENTIALS_H_
#define STASH_DAEMON_PEER_CREDENTIALS_H_

#include <cstdint>

namespace stash::daemon {

struct PeerCredentials {
  int64_t pid = 0;
  uint32_t uid = 0;
  uint32_t gid = 0;
  // Descriptor channel only, while a request of the connection is served: the connection, and
  // the most descriptors its answer may carry. -1 and no limit otherwise.
  int socket = -1;
  uint64_t max_descriptors = UINT64_MAX;
  bool known = false;  // read from the socket (SO_PEERCRED); false for a TCP peer
};

}  // namespace stash::daemon

#endif  // STASH_DAEMON_PEER_CREDENTIALS_H_
