// Mapped mode's data path (docs/design.md, "Mapped mode"; host backend): the daemon leases pool
// chunks to this process over the descriptor channel, and the session's copier
// (client/copier.h) pages activations into them itself. The gRPC stream carries only the
// Hello: it is the session's identity and lifetime.
//
// Thread-safe: every method may be called from any thread at the same time, like Client's.
#ifndef STASH_CLIENT_MAPPED_SESSION_H_
#define STASH_CLIENT_MAPPED_SESSION_H_

#include <absl/base/thread_annotations.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "client/copier.h"
#include "client/lease_table.h"
#include "client/session_stream.h"
#include "common/mutex.h"
#include "stash/client.h"

namespace stash {

class MappedSession {
 public:
  // Says Hello with MODE_MAPPED and takes the first lease (Options.lease). FAILED_PRECONDITION
  // on the cuda backend and from a daemon that leases no chunks; the daemon's refusal of the
  // lease (RESOURCE_EXHAUSTED over the quota); else as Client::Open.
  static StatusOr<std::unique_ptr<MappedSession>> Open(const Options& options);
  MappedSession(const MappedSession&) = delete;
  MappedSession& operator=(const MappedSession&) = delete;
  // Close: runs what is queued, unmaps every chunk, gives them back, ends the stream.
  ~MappedSession();

  // Client::Stash / Reload checked the shape (row_bytes, max_rows) and the ticket first.
  StatusOr<uint64_t> Stash(const StashArgs& args);
  StatusOr<uint64_t> Reload(const ReloadArgs& args);
  StatusOr<uint64_t> Release(uint64_t ticket);
  // Local: the flags reset at once; in stream order the control block's step rolls over and
  // (automatic lease) the lease is resized; with the daemon gone and no stash live, the session
  // reconnects and leases afresh (and returns the old chunks when the same daemon still lives);
  // while the daemon drains (kDaemonDraining) and no stash is live, the session gives its chunks
  // back and ends, and stashes stay with the caller until a later step reconnects.
  StatusOr<uint64_t> BeginStep(uint64_t step);
  // Nothing to tell the daemon (it never maps the rank's buffers): answered OK in order.
  StatusOr<uint64_t> Unregister(const HostBuffer& buffer);
  StatusOr<Completion> Wait(uint64_t op, int64_t timeout_ms) {
    return copier_->Wait(op, timeout_ms);
  }
  std::optional<StatusOr<Completion>> Poll(uint64_t op) { return copier_->Poll(op); }
  StepFlags CurrentStepFlags() const { return copier_->Flags(); }
  // The daemon's view (it reads the control block), as Client::Stats.
  StatusOr<SessionStats> Stats();

  // The Welcome of the live session (a reconnect replaces it).
  v1::Welcome welcome() const { return stream()->welcome; }
  const std::string& socket() const { return socket_; }

 private:
  explicit MappedSession(Options options) : options_(std::move(options)) {}
  std::shared_ptr<SessionStream> stream() const {
    MutexLock lock(&mu_);
    return stream_;
  }
  // LeaseChunks (automatic, or Options.lease when `fixed`) into `table`: maps what comes,
  // returns what the daemon wants back and holds no stash. The first error.
  Status Lease(LeaseTable& table, DescriptorChannel& channel, const v1::Welcome& welcome,
               bool fixed);
  // The copier's BeginStep hook (copier thread).
  void OnStep(std::unique_ptr<LeaseTable>& table, bool stashes_live);
  // A new session with the daemon and its first lease: the stream and the table.
  Status Connect(std::shared_ptr<SessionStream>* stream, std::unique_ptr<LeaseTable>* table);
  // OnStep with the session broken or ended after a drain: a new session once a daemon takes
  // one (attempts back off while none does); the old table's chunks go back through it.
  void Reconnect(std::unique_ptr<LeaseTable>& table, const std::shared_ptr<SessionStream>& old);
  // OnStep while the daemon drains and no stash is live: gives the chunks back and ends the
  // session; the table left has no chunk and says "draining", so stashes stay with the caller.
  void EndDrained(std::unique_ptr<LeaseTable>& table, const std::shared_ptr<SessionStream>& old);

  const Options options_;
  std::string socket_;  // never changes after Open
  mutable Mutex mu_;
  std::shared_ptr<SessionStream> stream_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> unavailable_logged_{false};
  // Copier thread only: the session ended after a drain (no daemon session until a reconnect),
  // and when the next reconnect may be tried, and the wait after that one.
  std::atomic<bool> ended_drained_{false};
  std::chrono::steady_clock::time_point next_attempt_{};
  std::chrono::milliseconds backoff_{0};
  std::unique_ptr<Copier> copier_;  // set in Open
};

}  // namespace stash

#endif  // STASH_CLIENT_MAPPED_SESSION_H_
