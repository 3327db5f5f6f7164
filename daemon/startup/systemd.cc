#include "daemon/startup/systemd.h"

#include <systemd/sd-daemon.h>

#include <cstring>

#include "common/logging.h"

namespace stash::daemon {
namespace {

void Notify(const std::string& state) {
  // unset_environment = 0: children (none today) would see the same socket.
  const int rc = sd_notify(0, state.c_str());
  if (rc < 0) Log("main")->warn("sd_notify failed: {}", std::strerror(-rc));
}

std::string OneLine(std::string text) {
  for (char& ch : text) {
    if (ch == '\n') ch = ' ';
  }
  return text;
}

}  // namespace

void NotifyReady(const std::string& status) { Notify("READY=1\nSTATUS=" + OneLine(status)); }

void NotifyStopping(const std::string& status) { Notify("STOPPING=1\nSTATUS=" + OneLine(status)); }

}  // namespace stash::daemon
