// Mapped mode's data path (docs/design.md, "Mapped mode"; host backend): the daemon leases pool
// chunks to this process over the descriptor channel, and the session's copier
// (client/mapped/copier.h) pages activations into them itself. The gRPC stream carries only the
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
#include <thread>
#include <utility>
#include <vector>

#include "client/mapped/copier.h"
#include "client/mapped/lease_rounds.h"
#include "client/mapped/lease_table.h"
#include "client/session/argument_checks.h"
#include "client/session/mode_session.h"
#include "client/session/reconnect_backoff.h"
#include "client/session/session_stream.h"
#include "common/mutex.h"
#include "stash/client.h"

namespace stash::client {

class MappedSession final : public ModeSession, private LeaseThreadTwin {
 public:
  // Says Hello with MODE_MAPPED and takes the first lease (Options.lease). FAILED_PRECONDITION
  // on the cuda backend and from a daemon that leases no chunks; the daemon's refusal of the
  // lease (RESOURCE_EXHAUSTED over the quota); else as Client::Open.
  static StatusOr<std::unique_ptr<MappedSession>> Open(const Options& options);
  MappedSession(const MappedSession&) = delete;
  MappedSession& operator=(const MappedSession&) = delete;
  // Close: runs what is queued, unmaps every chunk, gives them back, ends the stream.
  ~MappedSession() override;

  // Client::Stash / Reload checked the shape (row_bytes, max_rows) and the ticket first.
  // Events order the copies; a stream is refused (only the cuda twin enqueues on one).
  StatusOr<uint64_t> Stash(const StashArgs& args, bool then_wait) override;
  StatusOr<uint64_t> Reload(const ReloadArgs& args, bool then_wait) override;
  StatusOr<uint64_t> Release(uint64_t ticket, void* gpu_stream) override;
  // Local: the flags reset at once; in stream order the control block's step rolls over and
  // (automatic lease) the lease is resized; with the daemon gone and no stash live, the session
  // reconnects and leases afresh (and returns the old chunks when the same daemon still lives);
  // while the daemon drains (kDaemonDraining) and no stash is live, the session gives its chunks
  // back and ends, and stashes stay with the caller until a later step reconnects.
  StatusOr<uint64_t> BeginStep(uint64_t step, void* gpu_stream) override;
  // Nothing to tell the daemon (it never maps the rank's buffers): answered OK in order.
  StatusOr<uint64_t> Unregister(const HostBuffer& buffer) override;
  StatusOr<uint64_t> UnregisterDevice(const void* /*pointer*/) override {
    return FailedPreconditionError("device memory exists only on the cuda backend");
  }
  Status ReleaseDeviceMappings(int64_t /*timeout_ms*/) override { return Status::Ok(); }
  StatusOr<Completion> Wait(uint64_t op, int64_t timeout_ms) override {
    return copier_->Wait(op, timeout_ms);
  }
  std::optional<StatusOr<Completion>> Poll(uint64_t op) override { return copier_->Poll(op); }
  Status GraphsDestroyed() override { return NoGraphsKept(); }
  StepFlags CurrentStepFlags() const override { return copier_->Flags(); }
  // The daemon's view (it reads the control block), as Client::Stats.
  StatusOr<SessionStats> Stats() override;

  // The Welcome of the live session (a reconnect replaces it).
  v1::Welcome welcome() const override { return stream()->welcome; }
  const std::string& socket() const override { return socket_; }
  Backend backend() const override { return Backend::kHost; }
  Mode mode() const override { return Mode::kMapped; }
  CudaSide* cuda() const override { return nullptr; }

 private:
  explicit MappedSession(Options options) : options_(std::move(options)) {}
  std::shared_ptr<SessionStream> stream() const {
    MutexLock lock(&mu_);
    return stream_;
  }
  // LeaseChunks (automatic, or Options.lease when `fixed`) into `table` (not the copier's yet):
  // maps what comes, returns what the daemon wants back and holds no stash. The first error.
  Status Lease(LeaseTable& table, DescriptorChannel& channel, const v1::Welcome& welcome,
               bool fixed);
  // Maps an answer's control block and chunks into `table` and takes out what the daemon's
  // targets say and no stash holds; returns the ids to give back. `first`: the first error.
  static std::vector<uint64_t> Apply(LeaseTable& table, LeaseAnswer& answer, Status* first);
  // The copier's BeginStep hook (copier thread): acts on the daemon's return request in the
  // control block and hands the round trips to the lease thread.
  void OnStep(std::unique_ptr<LeaseTable>& table, bool stashes_live);
  // A new session with the daemon and its first lease: the stream and the table.
  Status Connect(std::shared_ptr<SessionStream>* stream, std::unique_ptr<LeaseTable>* table);
  // The copier's hook when the lease is short mid-step (copier thread): one automatic lease,
  // sized by the daemon from the step so far.
  void OnOutgrown();
  // OnStep while the daemon drains and no stash is live (copier thread): swaps in a table with
  // no chunk that says "draining" (stashes stay with the caller), and hands the chunks and the
  // session's end to the lease thread.
  void EndDrained(std::unique_ptr<LeaseTable>& table, const std::shared_ptr<SessionStream>& old,
                  std::vector<uint64_t> give_back);
  // The lease thread (client/mapped/lease_rounds.h: RunLeaseThread): every round trip after Open
  // runs there, never on the copier; the copier applies what comes back between two operations
  // (Copier::Post).
  std::shared_ptr<SessionStream> LeaseStream() const override { return stream(); }
  bool ReconnectUnderway() override { return reconnecting_.exchange(true); }
  bool ReconnectNeeded(const SessionStream& /*current*/) const override { return true; }
  bool EndedDrained() const override { return ended_drained_; }
  void RoundDone() override { growing_ = false; }
  // One automatic lease, then its answer posted to the copier (a group's member: again while its
  // group's chunks were not all sent, at most kMaxLeaseRounds more).
  void ResizeLease(const std::shared_ptr<SessionStream>& current) override;
  // One round of it; true when another should follow.
  bool ResizeLeaseOnce(const std::shared_ptr<SessionStream>& current);
  static constexpr int kMaxLeaseRounds = 256;
  // A new session (attempts back off while no daemon takes one), posted to the copier to
  // replace the old once no stash is live; the old table's chunks go back through it.
  void ReconnectFrom(const std::shared_ptr<SessionStream>& current) override;

  const Options options_;
  std::string socket_;  // never changes after Open
  mutable Mutex mu_;
  std::shared_ptr<SessionStream> stream_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> unavailable_logged_{false};
  std::atomic<bool> growing_{false};  // a mid-step lease is asked and not answered yet
  // The session ended after a drain (no daemon session until a reconnect).
  std::atomic<bool> ended_drained_{false};
  std::unique_ptr<Copier> copier_;  // set in Open

  // How long a BeginStep waits for its automatic lease (or a new session) before the step goes
  // on without it.
  static constexpr std::chrono::milliseconds kStepLeaseWait{50};
  // The same for a new session after the daemon went away (a Hello and a first lease).
  static constexpr std::chrono::milliseconds kStepReconnectWait{2000};

  LeaseRounds rounds_;
  std::atomic<bool> reconnecting_{false};  // a new session is on its way
  ReconnectBackoff backoff_;  // lease thread only: when the next reconnect may be tried
  std::thread lease_thread_;  // started in Open, after copier_
};

}  // namespace stash::client

#endif  // STASH_CLIENT_MAPPED_SESSION_H_
