#include "daemon/sessions/session.h"

#include "common/macros.h"
#include "common/text.h"

namespace stash::daemon {

Session::Session(SessionInfo info, ResponseSink* sink, std::atomic<uint64_t>* daemon_rejected,
                 SharedBudgets budgets)
    : info_(std::move(info)),
      start_(std::chrono::steady_clock::now()),
      daemon_rejected_(daemon_rejected),
      budgets_(budgets),
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

Status Session::Deposit(uint64_t memory_id, uint64_t bytes, UniqueFd& fd, size_t max_deposits) {
  MutexLock lock(&mu_);
  if (deposits_closed_) return UnavailableError("the session has ended");
  auto it = deposits_.find(memory_id);
  if (it != deposits_.end()) {     // replaces: the counts stay
    std::swap(it->second.fd, fd);  // the caller closes the one replaced
    it->second.bytes = bytes;
    return Status::Ok();
  }
  if (deposits_.size() >= max_deposits) {
    return ResourceExhaustedError(
        "this session holds " + std::to_string(deposits_.size()) +
        " deposited descriptors not yet registered, the limit: send their RegisterMemory first");
  }
  if (budgets_.deposits != nullptr) {
    STASH_RETURN_IF_ERROR(budgets_.deposits->Take(info_.uid, 1));
  }
  deposits_[memory_id] = Deposited{bytes, std::move(fd)};
  return Status::Ok();
}

void Session::ClearDeposits() {
  MutexLock lock(&mu_);
  deposits_closed_ = true;
  if (budgets_.deposits != nullptr) budgets_.deposits->Give(info_.uid, deposits_.size());
  deposits_.clear();
}

StatusOr<UniqueFd> Session::TakeDeposit(uint64_t memory_id, uint64_t bytes) {
  MutexLock lock(&mu_);
  auto it = deposits_.find(memory_id);
  if (it == deposits_.end()) {
    return FailedPreconditionError(
        "no descriptor was deposited for memory " + std::to_string(memory_id) +
        ": hand the memfd over the descriptor channel (DepositMemory) before RegisterMemory");
  }
  UniqueFd fd = std::move(it->second.fd);
  const uint64_t deposited = it->second.bytes;
  deposits_.erase(it);
  if (budgets_.deposits != nullptr) budgets_.deposits->Give(info_.uid, 1);
  if (deposited < bytes) {
    return FailedPreconditionError("memory " + std::to_string(memory_id) + " was deposited as " +
                                   std::to_string(deposited) + " bytes but registered as " +
                                   std::to_string(bytes) + ": register the size you deposited");
  }
  return fd;
}

Status Session::CheckPeer(const PeerCredentials& peer) {
  if (peer.pid != info_.pid) {
    return PermissionDeniedError(
        "the process on the descriptor channel (pid " + std::to_string(peer.pid) +
        " as stashd sees it) is not the one that said Hello (pid " + std::to_string(info_.pid) +
        "): use the descriptor channel only from the process that opened the session, and run "
        "trainers in stashd's pid namespace (Kubernetes: hostPID: true; docker: --pid=host)");
  }
  MutexLock lock(&mu_);
  if (peer_.has_value() && peer_->uid != peer.uid) {
    return PermissionDeniedError("this session belongs to another user");
  }
  peer_ = peer;
  return Status::Ok();
}

std::optional<PeerCredentials> Session::peer() const {
  MutexLock lock(&mu_);
  return peer_;
}

void Session::UnclaimTicket(uint64_t ticket) {
  MutexLock lock(&mu_);
  auto it = live_tickets_.find(ticket);
  if (it != live_tickets_.end()) it->second.claimed = false;
}

}  // namespace stash::daemon
