// A daemon-wide budget that Unix users share fairly: descriptors, registrations, bytes,
// sessions, connections, descriptors in flight, pool chunks (docs/security.md, "Limits").
//
// The rule, one for every budget: a user may always take up to `first` (what its first session
// needs) while the budget has it; past that, only while `first` stays free for somebody else
// after the take. So no user can take what another user's first session needs, and since every
// session of a user is also bounded on its own (the per-session limits, each well under the
// capacity less `first`), one session cannot take what the user's next session needs either.
// An optional per-user cap bounds a user whatever is free (connections).
//
// Users are Unix uids, as the kernel reports them on the sockets (SO_PEERCRED): every job that
// runs as one uid (root in many containers) is one user here.
#ifndef STASH_DAEMON_FAIR_SHARE_H_
#define STASH_DAEMON_FAIR_SHARE_H_

#include <absl/base/thread_annotations.h>
#include <absl/container/flat_hash_map.h>

#include <cstdint>
#include <string>

#include "common/mutex.h"
#include "stash/status.h"

namespace stash::daemon {

class FairShare {
 public:
  struct Spec {
    std::string what;       // plural noun for messages: "registered allocations"
    uint64_t capacity = 0;  // daemon-wide
    uint64_t first = 0;     // kept free for another user's first session
    uint64_t per_user = 0;  // the most one user may hold; 0 = no cap of its own
    std::string advice;     // what a refused caller can do: "unregister some first"
  };

  explicit FairShare(Spec spec);
  FairShare(const FairShare&) = delete;
  FairShare& operator=(const FairShare&) = delete;

  // Takes `n` for `uid`. RESOURCE_EXHAUSTED otherwise, naming the budget, how much of it is in
  // use and by this user, whose share the rest is, and what to do; nothing is taken then.
  Status Take(uint32_t uid, uint64_t n);
  // Gives back `n` that `uid` took (clamped to what it holds: never below zero).
  void Give(uint32_t uid, uint64_t n);
  // How much `uid` could take now.
  uint64_t Headroom(uint32_t uid) const;

  uint64_t used() const;
  uint64_t Held(uint32_t uid) const;
  const Spec& spec() const { return spec_; }

 private:
  uint64_t HeadroomLocked(uint32_t uid) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Spec spec_;
  mutable Mutex mu_;
  uint64_t used_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<uint32_t, uint64_t> held_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stash::daemon

#endif  // STASH_DAEMON_FAIR_SHARE_H_
