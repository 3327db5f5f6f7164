#include "daemon/sessions/group_registry.h"

#include <utility>

namespace stash::daemon {
namespace {

bool GroupNameByte(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == ':' || c == '@' || c == '+' || c == '-';
}

// Whether `a` and `b` are equal, in time that depends on their sizes only: every byte of the
// shorter is compared, whatever differs first, so the time does not tell a guesser how many
// leading bytes were right.
bool SameSecret(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() != b.size() ? 1 : 0;
  const size_t n = a.size() < b.size() ? a.size() : b.size();
  for (size_t i = 0; i < n; ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  // Read once through a volatile so the compiler cannot stop the loop at the first difference.
  const volatile unsigned char result = diff;
  return result == 0;
}

}  // namespace

Status CheckGroupFields(const std::string& name, const std::string& secret) {
  if (name.empty()) {
    if (secret.empty()) return Status::Ok();
    return InvalidArgumentError(
        "Hello.group_secret is set but Hello.group is empty: name the group (1-" +
        std::to_string(kMaxGroupNameBytes) +
        " bytes of A-Z a-z 0-9 . _ : @ + -), or leave both empty for a session in no group");
  }
  if (name.size() > kMaxGroupNameBytes) {
    return InvalidArgumentError("Hello.group is " + std::to_string(name.size()) +
                                " bytes, over the limit of " + std::to_string(kMaxGroupNameBytes) +
                                ": a group name is 1-" + std::to_string(kMaxGroupNameBytes) +
                                " bytes of A-Z a-z 0-9 . _ : @ + -");
  }
  for (size_t i = 0; i < name.size(); ++i) {
    if (!GroupNameByte(name[i])) {
      return InvalidArgumentError(
          "Hello.group has a byte outside A-Z a-z 0-9 . _ : @ + - at offset " + std::to_string(i) +
          ": a group name is 1-" + std::to_string(kMaxGroupNameBytes) + " bytes of those");
    }
  }
  if (secret.size() != kGroupSecretBytes) {
    return InvalidArgumentError("Hello.group_secret is " + std::to_string(secret.size()) +
                                " bytes: a group's secret is exactly " +
                                std::to_string(kGroupSecretBytes) +
                                " bytes (STASHD_GROUP_SECRET: 64 hex characters)");
  }
  return Status::Ok();
}

StatusOr<uint64_t> GroupRegistry::Join(uint32_t uid, const std::string& name,
                                       const std::string& secret, const std::string& session_id) {
  if (name.empty()) {
    return InvalidArgumentError("a session joins a named group: Hello.group is empty");
  }
  if (Status s = CheckGroupFields(name, secret); !s.ok()) return s;
  MutexLock lock(&mu_);
  if (group_of_.contains(session_id)) {
    return FailedPreconditionError("session " + session_id + " is a member of group " +
                                   group_of_.at(session_id) + " already");
  }
  auto it = groups_.find(name);
  if (it == groups_.end()) {
    size_t& held = groups_of_uid_[uid];
    if (held >= limits_.groups_per_uid) {
      return ResourceExhaustedError(
          "this user has " + std::to_string(held) + " groups on this node, the limit (" +
          std::to_string(limits_.groups_per_uid) +
          "): end the sessions of jobs that finished, or let the sessions of one job share one "
          "group name");
    }
    ++held;
    Group group;
    group.id = next_id_++;
    group.uid = uid;
    group.secret = secret;
    group.members.insert(session_id);
    const uint64_t id = group.id;
    groups_.emplace(name, std::move(group));
    group_of_.emplace(session_id, name);
    return id;
  }
  Group& group = it->second;
  if (group.uid != uid) {
    return PermissionDeniedError("group " + name +
                                 " belongs to another user on this node: pick another group name");
  }
  if (!SameSecret(group.secret, secret)) {
    return PermissionDeniedError("wrong group secret for group " + name +
                                 ": every member of a job presents the secret its first member set "
                                 "(STASHD_GROUP_SECRET / Options.group_secret)");
  }
  if (group.members.size() >= limits_.members_per_group) {
    return ResourceExhaustedError("group " + name + " has " + std::to_string(group.members.size()) +
                                  " sessions, the limit per group (" +
                                  std::to_string(limits_.members_per_group) +
                                  "): give the sessions of another job another group name");
  }
  group.members.insert(session_id);
  group_of_.emplace(session_id, name);
  return group.id;
}

void GroupRegistry::Leave(const std::string& session_id) {
  MutexLock lock(&mu_);
  auto member = group_of_.find(session_id);
  if (member == group_of_.end()) return;
  auto it = groups_.find(member->second);
  group_of_.erase(member);
  if (it == groups_.end()) return;
  it->second.members.erase(session_id);
  if (!it->second.members.empty()) return;
  auto held = groups_of_uid_.find(it->second.uid);
  if (held != groups_of_uid_.end() && --held->second == 0) groups_of_uid_.erase(held);
  groups_.erase(it);
}

size_t GroupRegistry::groups() const {
  MutexLock lock(&mu_);
  return groups_.size();
}

size_t GroupRegistry::members(const std::string& name) const {
  MutexLock lock(&mu_);
  auto it = groups_.find(name);
  return it == groups_.end() ? 0 : it->second.members.size();
}

}  // namespace stash::daemon
