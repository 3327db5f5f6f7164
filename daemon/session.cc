#include "daemon/session.h"

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

Status Session::Deposit(uint64_t memory_id, uint64_t bytes, UniqueFd fd, size_t max_deposits) {
  MutexLock lock(&mu_);
  auto it = deposits_.find(memory_id);
  if (it == deposits_.end() && deposits_.size() >= max_deposits) {
    return ResourceExhaustedError(
        "this session holds " + std::to_string(deposits_.size()) +
        " deposited descriptors not yet registered, the limit: send their RegisterMemory first");
  }
  deposits_[memory_id] = Deposited{bytes, std::move(fd)};
  return Status::Ok();
}

StatusOr<UniqueFd> Session::TakeDeposit(uint64_t memory_id, uint64_t bytes) {
  MutexLock lock(&mu_);
  auto it = deposits_.find(memory_id);
  if (it == deposits_.end()) {
    return FailedPreconditionError(
        "no descriptor was deposited for memory " + std::to_string(memory_id) +
        ": hand the memfd over the descriptor channel (DepositMemory) before RegisterMemory");
  }
  if (it->second.bytes < bytes) {
    const uint64_t deposited = it->second.bytes;
    deposits_.erase(it);
    return FailedPreconditionError("memory " + std::to_string(memory_id) + " was deposited as " +
                                   std::to_string(deposited) + " bytes but registered as " +
                                   std::to_string(bytes) + ": register the size you deposited");
  }
  UniqueFd fd = std::move(it->second.fd);
  deposits_.erase(it);
  return fd;
}

Status Session::CheckPeer(const PeerCredentials& peer, bool hello_pid_matches) {
  MutexLock lock(&mu_);
  if (peer_.has_value()) {
    if (peer_->pid == peer.pid && peer_->uid == peer.uid) return Status::Ok();
    return PermissionDeniedError(
        "this session belongs to another process: use the descriptor channel only from the "
        "process that opened the session");
  }
  if (!hello_pid_matches) {
    return PermissionDeniedError(
        "the process on the descriptor channel is not the one that said Hello (pid " +
        std::to_string(info_.pid) +
        "): use the descriptor channel only from the process that opened the session");
  }
  peer_ = peer;
  return Status::Ok();
}

std::optional<PeerCredentials> Session::peer() const {
  MutexLock lock(&mu_);
  return peer_;
}

}  // namespace stash::daemon
