// Readiness for systemd's Type=notify (sd_notify from libsystemd): the unit is "active" only once
// the daemon serves, and "deactivating" as soon as it stops. Outside systemd (no $NOTIFY_SOCKET)
// every call does nothing.
#ifndef STASH_DAEMON_SYSTEMD_H_
#define STASH_DAEMON_SYSTEMD_H_

#include <string>

namespace stash::daemon {

// READY=1 with a STATUS= line `status` (shown by `systemctl status`).
void NotifyReady(const std::string& status);

// STOPPING=1 with a STATUS= line.
void NotifyStopping(const std::string& status);

}  // namespace stash::daemon

#endif  // STASH_DAEMON_SYSTEMD_H_
