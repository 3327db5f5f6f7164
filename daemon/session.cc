#include "daemon/session.h"

#include "common/text.h"

namespace stash::daemon {

Session::Session(SessionInfo info, ResponseSink* sink, std::atomic<uint64_t>* daemon_rejected)
    : info_(std::move(info)),
      start_(std::chrono::steady_clock::now()),
      daemon_rejected_(daemon_rejected),
      sink_(sink) {}

double Session::AgeSeconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void Session::Send(stash::v1::SessionResponse response) {
  // The last guard: a message may quote what a client sent, and `message` is a proto3 string,
  // which a generated client refuses to parse (dropping the whole stream) unless it is UTF-8.
  if (!IsUtf8(response.message())) response.set_message(ValidUtf8(response.message()));
  if (response.code() != 0) {
    counters_.rejected.fetch_add(1, std::memory_order_relaxed);
    if (daemon_rejected_ != nullptr) daemon_rejected_->fetch_add(1, std::memory_order_relaxed);
  }
  MutexLock lock(&sink_mu_);
  if (sink_ != nullptr) sink_->Send(std::move(response));
}

void Session::DetachSink() {
  MutexLock lock(&sink_mu_);
  sink_ = nullptr;
}

void Session::ForgetTicket(uint64_t ticket) {
  MutexLock lock(&mu_);
  live_tickets_.erase(ticket);
}

void Session::UnclaimTicket(uint64_t ticket) {
  MutexLock lock(&mu_);
  auto it = live_tickets_.find(ticket);
  if (it != live_tickets_.end()) it->second.claimed = false;
}

}  // namespace stash::daemon
