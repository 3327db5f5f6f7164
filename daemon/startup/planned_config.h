// What a daemon started with a configuration would serve, without starting it: the knobs with
// the socket resolved, the backend `auto` picks here, and the pools' geometry
// (`stashd --print-config`).
#ifndef STASH_DAEMON_PLANNED_CONFIG_H_
#define STASH_DAEMON_PLANNED_CONFIG_H_

#include "daemon/config/config.h"
#include "stash/v1/stash.pb.h"

namespace stash::daemon {

// The GetConfig reply a daemon started with `config` on this machine would give: socket resolved
// (flag > $STASHD_SOCKET > default > per-user fallback), backend after `auto`, pools, pages. No
// field is left at a placeholder; the knob entries show the resolved socket.
v1::GetConfigResponse PlannedConfig(const DaemonConfig& config);

}  // namespace stash::daemon

#endif  // STASH_DAEMON_PLANNED_CONFIG_H_
