// One connected rank: its identity, its limits, its counters and its mode's state. The session's
// stream is the lease on everything it holds (docs/design.md).
#ifndef STASH_DAEMON_SESSION_H_
#define STASH_DAEMON_SESSION_H_

#include <absl/base/thread_annotations.h>
#include <absl/container/flat_hash_map.h>
#include "common/mutex.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/unique_fd.h"
#include "daemon/limits/fair_share.h"
#include "daemon/sessions/live_tags.h"
#include "daemon/sessions/mode_state.h"
#include "daemon/sessions/peer_credentials.h"
#include "daemon/sessions/response_sink.h"
#include "daemon/sessions/session_counters.h"
#include "daemon/sessions/session_info.h"
#include "daemon/sessions/shared_budgets.h"
#include "stash/status.h"
#include "stash/v1/stash.pb.h"

namespace stash::daemon {

// What the receive path knows of a live ticket, to validate Reload before it is queued.
struct TicketShape {
  uint64_t row_bytes = 0;
  uint64_t max_rows = 0;
  // A reload or release of it is queued. The ticket stays live until the pool worker took its
  // pages (then it is forgotten) or that request failed (then it is live again), so a failed
  // reload never costs the stash and the ticket cannot be reused while its pages may be held.
  bool claimed = false;
};

class Session {
 public:
  // `sink` receives responses until DetachSink(); `daemon_rejected` (may be null) counts this
  // session's non-OK responses daemon-wide too; `budgets` are what its requests take from.
  Session(SessionInfo info, ResponseSink* sink, std::atomic<uint64_t>* daemon_rejected,
          SharedBudgets budgets = {});
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  const SessionInfo& info() const { return info_; }
  const SharedBudgets& budgets() const { return budgets_; }
  SessionCounters& counters() { return counters_; }
  // What it holds now by (layer, microbatch, name); thread-safe.
  LiveTags& live_tags() { return live_tags_; }
  double AgeSeconds() const;

  // Sends a response if the stream is still there; drops it otherwise. Counts non-OK codes.
  void Send(stash::v1::SessionResponse response);
  // The stream is gone: later responses are dropped.
  void DetachSink();

  // Receive-path state (validation before queueing), guarded by the session's mutex because the
  // pool worker also forgets tickets whose stash did not take.
  Mutex& mu() const ABSL_LOCK_RETURNED(mu_) { return mu_; }
  absl::flat_hash_map<uint64_t, uint64_t>& declared_memories() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return declared_memories_;
  }
  absl::flat_hash_map<uint64_t, TicketShape>& live_tickets() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return live_tickets_;
  }
  // The request id of the RegisterMemory that declared each memory id.
  absl::flat_hash_map<uint64_t, uint64_t>& declared_by() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return declared_by_;
  }
  // The pool worker consumed the ticket (or its stash took nothing): it may be reused.
  void ForgetTicket(uint64_t ticket);
  // A queued reload or release of the ticket failed before taking its pages: it is live again.
  void UnclaimTicket(uint64_t ticket);

  // Descriptor channel: keeps a checked client memfd for `memory_id` until RegisterMemory maps
  // it (a second deposit under one id replaces the first). RESOURCE_EXHAUSTED past
  // `max_deposits` descriptors of this session, or past the user's share of budgets().deposits,
  // not yet registered; UNAVAILABLE once the session is closed.
  // Takes `fd` only on OK (a refused one stays with the caller).
  Status Deposit(uint64_t memory_id, uint64_t bytes, UniqueFd& fd, size_t max_deposits);
  // The session ended: closes every deposited descriptor and refuses later deposits.
  void ClearDeposits();
  // Takes the descriptor deposited for `memory_id`; FAILED_PRECONDITION when there is none or it
  // is smaller than `bytes`.
  StatusOr<UniqueFd> TakeDeposit(uint64_t memory_id, uint64_t bytes);
  // Checks that `peer` (a descriptor-channel connection's SO_PEERCRED, in the daemon's pid
  // namespace) is the process that said Hello, and binds the session to its uid on first use.
  // PERMISSION_DENIED otherwise. The pids are compared as numbers in one namespace: trainers and
  // stashd share the host's (hostPID), and a process in a pid namespace of its own could choose
  // its numbers there.
  Status CheckPeer(const PeerCredentials& peer);
  // The verified process of the session, once it used the descriptor channel.
  std::optional<PeerCredentials> peer() const;

  // The mode's state of this session (ModeState above): set and read only by that mode's code,
  // on the thread that code runs on (daemon-copy: the pool's run token holder); null until set.
  ModeState* mode_state() { return mode_state_.get(); }
  void set_mode_state(std::unique_ptr<ModeState> state) { mode_state_ = std::move(state); }

  // Set once the stream ended; the pool drops the session's queued work.
  bool closed() const { return closed_.load(std::memory_order_acquire); }
  void MarkClosed() { closed_.store(true, std::memory_order_release); }

 private:
  // Never change after construction.
  const SessionInfo info_;
  const std::chrono::steady_clock::time_point start_;
  std::atomic<uint64_t>* const daemon_rejected_;  // non-owning, may be null
  const SharedBudgets budgets_;

  SessionCounters counters_;
  LiveTags live_tags_;
  std::atomic<bool> closed_{false};

  Mutex sink_mu_;
  ResponseSink* sink_ ABSL_GUARDED_BY(sink_mu_);  // non-owning; null once the stream is gone

  mutable Mutex mu_;
  absl::flat_hash_map<uint64_t, uint64_t> declared_memories_ ABSL_GUARDED_BY(mu_);  // id -> bytes
  absl::flat_hash_map<uint64_t, TicketShape> live_tickets_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, uint64_t> declared_by_ ABSL_GUARDED_BY(mu_);
  struct Deposited {
    uint64_t bytes = 0;
    UniqueFd fd;
  };
  absl::flat_hash_map<uint64_t, Deposited> deposits_ ABSL_GUARDED_BY(mu_);
  bool deposits_closed_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<PeerCredentials> peer_ ABSL_GUARDED_BY(mu_);

  std::unique_ptr<ModeState> mode_state_;
};

}  // namespace stash::daemon

#endif  // STASH_DAEMON_SESSION_H_
