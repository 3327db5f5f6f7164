// Whether a daemon listens on a Unix socket, found with one plain connect() before gRPC is
// involved: gRPC reports a refused or forbidden socket only as "unavailable" after its connect
// timeout, while the kernel says at once what is wrong.
#ifndef STASH_COMMON_SOCKET_PROBE_H_
#define STASH_COMMON_SOCKET_PROBE_H_

#include <sys/types.h>

#include <string>

#include "stash/status.h"

namespace stash {

// OK when something accepts connections on `path`. Otherwise, at once:
//   UNAVAILABLE        no such socket, or nothing listens on it (its daemon is gone); the message
//                      names the socket and how to start a daemon there;
//   PERMISSION_DENIED  this user may not connect (EACCES): the message names the group that owns
//                      the socket (or the directory that denies the way) and how to join it;
//   INVALID_ARGUMENT   the path is longer than a Unix socket address holds.
Status ProbeSocket(const std::string& path);

// "permission denied on <path>: ...": what to do when this user may not connect to `path`
// (names the owning group of the socket, or of the directory that denies access to it, and the
// usermod line that joins it).
// When that group is root's (a daemon started as root on a node without a `stashd` group), joining
// it is not the answer: the message says to have the group made and stashd restarted.
std::string PermissionDeniedMessage(const std::string& path);

// The name of group `gid`, or its number when it has none.
std::string GroupName(gid_t gid);

}  // namespace stash

#endif  // STASH_COMMON_SOCKET_PROBE_H_
