// The daemon-wide budgets a session's requests take from.
#ifndef STASH_DAEMON_SHARED_BUDGETS_H_
#define STASH_DAEMON_SHARED_BUDGETS_H_

#include "daemon/limits/fair_share.h"

namespace stash::daemon {

// The daemon-wide budgets a session's requests take from, shared fairly between Unix users
// (daemon/limits/fair_share.h). Owned by DaemonCore, which outlives its sessions; a null member
// (unit tests) is not counted.
struct SharedBudgets {
  FairShare* memories = nullptr;  // registered allocations (each one mapping of the daemon)
  FairShare* bytes = nullptr;     // bytes of registered client memory
  FairShare* deposits = nullptr;  // descriptors deposited and not yet registered
};

}  // namespace stash::daemon

#endif  // STASH_DAEMON_SHARED_BUDGETS_H_
