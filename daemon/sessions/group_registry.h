// Groups of sessions: the mapped-mode sessions of one job on this node, which will share memory
// page by page (issue 41). A group is named by its sessions (Hello.group) and belongs to the Unix
// user (SO_PEERCRED) and the 32-byte secret (Hello.group_secret) of the session that created it:
// a uid alone is too coarse (many jobs run as root in containers), so a later session joins only
// with the same uid and the same secret (docs/security.md, "Groups").
#ifndef STASH_DAEMON_GROUP_REGISTRY_H_
#define STASH_DAEMON_GROUP_REGISTRY_H_

#include <absl/base/thread_annotations.h>
#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/mutex.h"
#include "stash/status.h"

namespace stash::daemon {

// The bytes of a group secret (Hello.group_secret).
inline constexpr size_t kGroupSecretBytes = 32;
// The most bytes of a group name (Hello.group).
inline constexpr size_t kMaxGroupNameBytes = 128;

// Checks the shape of a Hello's group fields: both empty (no group), or a name of 1 to
// kMaxGroupNameBytes bytes of [A-Za-z0-9._:@+-] and a secret of exactly kGroupSecretBytes bytes.
// INVALID_ARGUMENT otherwise, saying what is allowed; the message never quotes the secret.
Status CheckGroupFields(const std::string& name, const std::string& secret);

// Thread-safe.
class GroupRegistry {
 public:
  struct Limits {
    // Groups one Unix user may have at once. Each group has at least one session, so the
    // daemon-wide bound on sessions bounds the groups of all users together.
    size_t groups_per_uid = 256;
    // Sessions in one group at once (a node's ranks of one job are a few dozen).
    size_t members_per_group = 1024;
  };

  GroupRegistry() : GroupRegistry(Limits{}) {}
  explicit GroupRegistry(Limits limits) : limits_(limits) {}
  GroupRegistry(const GroupRegistry&) = delete;
  GroupRegistry& operator=(const GroupRegistry&) = delete;

  // Makes session `session_id` of Unix user `uid` a member of group `name` and returns the
  // group's id (> 0, never reused, so two groups that had the same name at different times are
  // told apart). The first member creates the group with `secret`; a later one must have the same
  // uid and the same secret (compared in constant time over all its bytes). Errors, and nothing
  // changes then: INVALID_ARGUMENT for fields CheckGroupFields refuses (an empty name among
  // them: a session in no group does not call Join); PERMISSION_DENIED for another uid or a wrong
  // secret (the message names the group and what to do); RESOURCE_EXHAUSTED past the limits;
  // FAILED_PRECONDITION when `session_id` is a member of a group already.
  StatusOr<uint64_t> Join(uint32_t uid, const std::string& name, const std::string& secret,
                          const std::string& session_id);

  // Session `session_id` ended. The group is forgotten with its last member: a later Join with
  // its name creates a new group (a new id, the new member's uid and secret). A session that is
  // in no group is ignored, so Leave may be called for every session that ends.
  void Leave(const std::string& session_id);

  // Groups now, and the members of group `name` now (0 when there is no such group). For tests
  // and stats.
  size_t groups() const;
  size_t members(const std::string& name) const;

 private:
  struct Group {
    uint64_t id = 0;
    uint32_t uid = 0;
    std::string secret;
    absl::flat_hash_set<std::string> members;  // session ids
  };

  // Never changes after construction.
  const Limits limits_;

  mutable Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<std::string, Group> groups_ ABSL_GUARDED_BY(mu_);          // by name
  absl::flat_hash_map<std::string, std::string> group_of_ ABSL_GUARDED_BY(mu_);  // session: name
  absl::flat_hash_map<uint32_t, size_t> groups_of_uid_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stash::daemon

#endif  // STASH_DAEMON_GROUP_REGISTRY_H_
