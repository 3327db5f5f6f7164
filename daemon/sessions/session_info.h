// A session's identity, fixed by its Hello.
#ifndef STASH_DAEMON_SESSION_INFO_H_
#define STASH_DAEMON_SESSION_INFO_H_

#include <cstdint>
#include <string>

namespace stash::daemon {

// Identity fixed by Hello.
struct SessionInfo {
  std::string id;      // 32 hex characters, unguessable
  std::string secret;  // 32 random bytes: authenticates the session on the descriptor channel
  int64_t rank = -1;
  int64_t pid = 0;
  int pool = 0;
  std::string label;
  std::string client_version;
  bool allow_host_spill = true;
  // Hello.mode = MODE_MAPPED: the session leases chunks and its stream carries no data path.
  bool mapped = false;
  // The Unix user of the connection that said Hello (SO_PEERCRED): whose share of the
  // daemon-wide budgets the session takes. 0 where the daemon cannot know (unit tests).
  uint32_t uid = 0;
  // The group the session joined (Hello.group; GroupRegistry): the sessions of one job on this
  // node. Empty, and group_id 0, for a session in no group.
  std::string group;
  uint64_t group_id = 0;  // 0 = no group; never reused for another group
};

}  // namespace stash::daemon

#endif  // STASH_DAEMON_SESSION_INFO_H_
