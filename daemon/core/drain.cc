// Draining (DaemonCore::Drain and what is left to drain): the part of a stop that lets ranks
// reload what they stashed before the daemon goes. The refusals themselves sit where sessions
// and stashes come in (core.cc: OpenSession, HandleRequest).
#include "common/logging.h"
#include "daemon/core/core.h"

namespace stash::daemon {

void DaemonCore::Drain(const std::string& who) {
  MutexLock lock(&drain_mu_);
  if (draining_.exchange(true)) return;
  Log("main")->warn(
      "draining, asked by {}: new sessions and stashes are refused, health is NOT_SERVING; {} "
      "session(s) hold {} stash(es) or request(s) in flight",
      who, SessionsLive(), StashesLive());
  TellSessions(true);
  if (drain_listener_) drain_listener_(true);
}

void DaemonCore::Undrain(const std::string& who) {
  MutexLock lock(&drain_mu_);
  if (!draining_.exchange(false)) return;
  Log("main")->warn("draining ended, asked by {}: sessions and stashes are taken again", who);
  TellSessions(false);
  if (drain_listener_) drain_listener_(false);
}

void DaemonCore::TellSessions(bool draining) {
  std::vector<std::shared_ptr<Session>> live;
  {
    MutexLock lock(&mu_);
    for (auto& [id, s] : sessions_) live.push_back(s);
  }
  for (const auto& s : live) {
    v1::SessionResponse told;
    told.set_request_id(0);
    told.mutable_daemon_state()->set_draining(draining);
    s->Send(std::move(told));
  }
  // Mapped ranks read it in their control block (their stream carries nothing after Hello).
  if (leases_ != nullptr) leases_->SetDraining(draining);
}

uint64_t DaemonCore::SessionsLive() {
  MutexLock lock(&mu_);
  return sessions_.size();
}

uint64_t DaemonCore::StashesLive() {
  std::vector<std::shared_ptr<Session>> live;
  {
    MutexLock lock(&mu_);
    for (auto& [id, s] : sessions_) live.push_back(s);
  }
  uint64_t left = 0;
  for (const auto& s : live) {
    left += s->counters().stashes_live.load(std::memory_order_relaxed) +
            s->counters().inflight.load(std::memory_order_relaxed);
    if (s->info().mapped && leases_ != nullptr) left += leases_->StashesLive(s->info().id);
  }
  return left;
}

}  // namespace stash::daemon
