// Mapped mode's data path on the cuda backend (docs/design.md, "Mapped mode on GPUs"): the GPU
// twin of MappedSession (client/mapped/mapped_session.h). The daemon leases VMM chunks of its GPU
// pools over the descriptor channel; CudaLeaseMemory (client/mapped/cuda/cuda_lease_memory.h) maps
// them at fixed addresses of this rank's GPU, and StreamCopier (client/mapped/cuda/stream_copier.h)
// pages activations into them with the library's own kernels on the stream the caller names. The
// gRPC stream carries only the Hello: it is the session's identity and lifetime.
//
// Every operation is an enqueue on the caller's stream and returns: no host callback, no host
// synchronisation and nothing to the daemon per operation, and Stash / Reload / Release /
// BeginStep may be captured in a CUDA graph and replayed (each replay plans, spills and
// overflows on the device). What happened is known on the device, not here: Wait and Poll answer
// at once with what was enqueued (tier kUnspecified), and the step's flags reach the host as the
// stream runs the step's stashes (CurrentStepFlags; synchronize the stream to have them all).
//
// Lease changes happen at BeginStep, outside capture, on the stream it names: chunks the lease
// thread mapped join the rings; chunks the daemon asks back (or the lease's targets leave over)
// leave the rings when no stash holds a page of them, and are unmapped and given back once the
// stream's work before them completed. A stash that finds the lease short asks for more at once
// (LeaseShortReports), answered on the lease thread; the chunks join at the next BeginStep.
//
// The session's operations must run one after another on the GPU (StreamCopier's rule): one
// stream, or streams the caller orders with events.
//
// When the daemon dies, the chunks held stay mapped: stashes made reload and the step goes on.
// The first BeginStep with no stash live asks the lease thread for a new session (with
// MappedSession's backoff), and a BeginStep after it arrived swaps the old chunks for the new
// session's, on the same copier and at the same addresses.
//
// Thread-safe: every method may be called from any thread (the enqueues are serialised).
#ifndef STASH_CLIENT_CUDA_MAPPED_SESSION_H_
#define STASH_CLIENT_CUDA_MAPPED_SESSION_H_

#include <absl/base/thread_annotations.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "client/mapped/lease_rounds.h"
#include "client/memory/cuda_memory.h"
#include "client/session/descriptor_channel.h"
#include "client/session/mode_session.h"
#include "client/session/reconnect_backoff.h"
#include "client/session/session_stream.h"
#include "common/mutex.h"
#include "stash/client.h"
#include "stash/kernels/lease_control.h"

namespace stash {
struct CudaDriver;     // common/cuda_driver.h
class PrimaryContext;  // common/cuda_vmm.h
}  // namespace stash

namespace stash::client {

// No CUDA header here: client.cc includes this in libraries built without CUDA too, where
// cuda_mapped_session_none.cc says so at Open (so the CUDA parts are held by shared_ptr, whose
// deleter is fixed where they are made, not where the session is destroyed).
class CudaLeaseMemory;
class StreamCopier;

class CudaMappedSession final : public ModeSession, private LeaseThreadTwin {
 public:
  // Says Hello with MODE_MAPPED for Options.device, reserves the tiers' address ranges, loads the
  // kernels, takes the first lease (Options.lease) and puts its chunks in the rings.
  // FAILED_PRECONDITION from a daemon that leases no chunks or a GPU without VMM / POSIX-fd
  // handles (the message says to use daemon-copy); the daemon's refusal of the lease; else as
  // Client::Open.
  // Built without CUDA (cuda_mapped_session_none.cc), only this is defined, and says so.
  static StatusOr<std::unique_ptr<ModeSession>> Open(const Options& options);
  CudaMappedSession(const CudaMappedSession&) = delete;
  CudaMappedSession& operator=(const CudaMappedSession&) = delete;
  // Waits for the GPU work of this session's context (every queued stash, reload and step),
  // unmaps every chunk, gives them back and ends the stream.
  ~CudaMappedSession() override;

  // Client::Stash / Reload checked the shape and the ticket. Device pointers only (any memory
  // this GPU reaches: expandable segments too, since nothing is exported); events are refused:
  // the stream orders the work. While the daemon drains, Stash enqueues nothing and answers
  // OVERFLOW (the caller keeps its buffer; no step flag).
  StatusOr<uint64_t> Stash(const StashArgs& args, bool then_wait) override;
  StatusOr<uint64_t> Reload(const ReloadArgs& args, bool then_wait) override;
  StatusOr<uint64_t> Release(uint64_t ticket, void* stream) override;
  // Lease changes (outside capture), then the step kernel: the ended step's flags, the device
  // control block to the daemon's, the daemon's line back.
  StatusOr<uint64_t> BeginStep(uint64_t step, void* stream) override;
  // Mapped mode never hands the caller's memory to the daemon: nothing to unregister.
  StatusOr<uint64_t> Unregister(const HostBuffer& /*buffer*/) override {
    return NotFoundError("this buffer was never used with this session");
  }
  StatusOr<uint64_t> UnregisterDevice(const void* /*pointer*/) override {
    return NotFoundError(
        "mapped mode never hands your allocations to the daemon: nothing to unregister");
  }
  Status ReleaseDeviceMappings(int64_t /*timeout_ms*/) override { return Status::Ok(); }
  StatusOr<Completion> Wait(uint64_t op, int64_t timeout_ms) override;
  std::optional<StatusOr<Completion>> Poll(uint64_t op) override;
  // The current step's flags as far as the GPU got (StreamCopier::CurrentStep); none while the
  // GPU has not reached the last BeginStep enqueued. Synchronize the stream (or wait for an
  // event after the step's last stash) first to have the whole step's.
  StepFlags CurrentStepFlags() const override;
  // Every graph captured so far is destroyed: the plan slots of their stashes come back
  // (StreamCopier::ReleaseCapturedSlots).
  Status GraphsDestroyed() override;
  // The daemon's view (it reads the control block as published at the last step boundary).
  StatusOr<SessionStats> Stats() override;

  v1::Welcome welcome() const override { return stream()->welcome; }
  // The device side EnqueueSignal / EnqueueWait use.
  CudaSide* cuda() const override { return cuda_.get(); }
  const std::string& socket() const override { return socket_; }
  Backend backend() const override { return Backend::kCuda; }
  Mode mode() const override { return Mode::kMapped; }

 private:
  // targets_[tier] when no shrink is pending.
  static constexpr uint64_t kNoTarget = UINT64_MAX;
  // Where a chunk slot stands, as this session sees it (CudaLeaseMemory keeps the mappings).
  enum class Slot : uint8_t {
    kFree,       // nothing mapped
    kMapping,    // the lease thread maps a chunk into it
    kMapped,     // mapped, not in the ring yet (AddChunk at the next boundary)
    kInRing,     // its pages are in the ring
    kRemoving,   // RemoveChunk enqueued, its answer not read yet
    kUnmapping,  // out of the ring, unmapped once the stream's work before it completed
  };
  struct SlotInfo {
    Slot state = Slot::kFree;
    uint64_t chunk_id = 0;
    uint64_t bytes = 0;
    bool old = false;  // a chunk of a session before a reconnect: never given back to this one
    // A chunk of the session's group: on the copier's board (StreamCopier::AddGroupChunk), not
    // in a ring; its slot is its place in the group's address space.
    bool group = false;
  };
  // A new session with the daemon and its first lease, waiting for a boundary with no stash
  // live (SwitchSession).
  struct Fresh {
    std::shared_ptr<SessionStream> stream;
    LeaseAnswer answer;
  };
  CudaMappedSession(Options options, std::shared_ptr<CudaSide> cuda);
  std::shared_ptr<SessionStream> stream() const {
    std::lock_guard<std::mutex> lock(stream_mu_);
    return stream_;
  }
  // The lease thread: a new session once the old one broke, at most one attempt per backoff
  // (ReconnectBackoff); the result waits in fresh_.
  void Reconnect();
  // Says Hello and takes the first lease; FAILED_PRECONDITION when the daemon's page or chunk
  // size or tier sizes do not fit the ranges this session reserved (open a new client).
  Status OpenFresh(Fresh* fresh);
  // At a boundary with no stash live and `stream` not capturing (mu_ not held): the old
  // session's chunks leave the rings and are unmapped (the stream is synchronized twice: a
  // reconnect is rare), the new session's chunks are mapped (added to the rings by the
  // ChangeLease that follows). The copier, its rings and the tiers' addresses stay: graphs
  // captured before still replay.
  Status SwitchSession(void* stream);
  // At a boundary with no stash live while the daemon drains (mu_ not held): every chunk leaves
  // as in a switch, goes back, and the session ends; stashes are answered as kept until a later
  // BeginStep opens a new session (as MappedSession::EndDrained).
  Status EndDrained(void* stream);
  // Every chunk leaves (mu_ not held; no stash live, `stream` not capturing): out of the rings,
  // then unmapped once that ran, the stream synchronized twice. Returns the ids freed. Each is
  // marked `old` first: one that cannot leave now goes back to old_session_ as an orphan, at a
  // later boundary.
  StatusOr<std::vector<uint64_t>> RetireChunks(void* stream);
  // Whether the daemon's control block says it drains.
  bool Draining() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether every slot is free, mapped or in the ring, and none holds an older session's chunk:
  // then every chunk held is this session's, and EndDrained may give them all back at once.
  bool Settled() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Maps a lease answer's control block and chunks (lease thread, or Open's) that came over
  // `from`; returns the ids that could not be mapped, to give back over `from` (all of them
  // when `from` is no longer the session's stream: a reconnect replaced it).
  std::vector<uint64_t> Apply(LeaseAnswer& answer, const SessionStream* from, Status* first);
  Status SetControlBlock(UniqueFd fd, uint64_t bytes);
  // Groups: maps the group's depot (its GPU must be this rank's) and joins the copier to it.
  Status JoinGroup(LeaseAnswer& answer);
  // The slot of `tier`'s range where the group chunk starting at group page `page` goes;
  // UINT64_MAX when no chunk starts there.
  uint64_t GroupSlotOf(uint32_t tier, uint64_t page) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A group chunk of an answer that came over `from` into its place of `tier`'s range and onto
  // the copier's board (lease thread or Open's, mu_ not held). False when it is not held: give
  // it back now; true when it is held, or will be given back once unmapped.
  bool MapGroupChunk(uint32_t tier, LeaseAnswer::Chunk& c, const SessionStream* from,
                     Status* first);
  // The boundary's lease changes on `stream` (not capturing), mu_ held: removal answers read,
  // unmaps reaped, chunks asked back taken out, mapped chunks added. Ids freed go to the lease
  // thread.
  void ChangeLease(void* stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts taking chunks of `tier` out until the ring holds at most `target_pages` (highest slot
  // first; mapped chunks not in the ring yet go first).
  void ShrinkTo(void* stream, uint32_t tier, uint64_t target_pages)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t Answered(Completion completion) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The lease thread (client/mapped/lease_rounds.h: RunLeaseThread).
  std::shared_ptr<SessionStream> LeaseStream() const override { return stream(); }
  bool ReconnectUnderway() override { return false; }
  bool ReconnectNeeded(const SessionStream& current) const override {
    return current.broken_now() || ended_drained_;
  }
  void ReconnectFrom(const std::shared_ptr<SessionStream>& /*current*/) override { Reconnect(); }
  bool EndedDrained() const override { return ended_drained_; }
  // One automatic lease over `current`, applied on the trainer's stream at the next boundary.
  void ResizeLease(const std::shared_ptr<SessionStream>& current) override;
  void RoundDone() override { growing_ = false; }
  // The lease short mid-step: one automatic lease until its answer is in.
  void AskIfShort() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  const std::shared_ptr<CudaSide> cuda_;
  const CudaDriver* driver_ = nullptr;  // set in Open; process-wide
  std::string socket_;                  // set in Open
  uint64_t page_bytes_ = 0;             // set in Open: the copier's pages
  mutable std::mutex stream_mu_;
  std::shared_ptr<SessionStream> stream_ ABSL_GUARDED_BY(stream_mu_);  // replaced by reconnects
  std::shared_ptr<CudaLeaseMemory> memory_;
  // The rank's GPU's primary context, current around every enqueue.
  std::shared_ptr<PrimaryContext> context_;

  mutable Mutex mu_;
  std::shared_ptr<StreamCopier> copier_ ABSL_GUARDED_BY(mu_);
  std::array<std::vector<SlotInfo>, kernels::kLeaseTiers> slots_ ABSL_GUARDED_BY(mu_);
  // Per tier, the pages the ring should hold at most (the daemon's targets); UINT64_MAX = none.
  std::array<uint64_t, kernels::kLeaseTiers> targets_ ABSL_GUARDED_BY(mu_);
  // The daemon's control block, mapped here and registered for the GPU (kept so until the
  // process exits: CudaSide::MapHost), and its device address for the step kernel, attached at
  // the next boundary when pending.
  kernels::SessionControl* shared_control_ ABSL_GUARDED_BY(mu_) = nullptr;
  uint64_t shared_control_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  kernels::SessionControl* pending_control_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::function<void()> control_release_ ABSL_GUARDED_BY(mu_);
  uint64_t next_op_ ABSL_GUARDED_BY(mu_) = 0;
  // What Wait / Poll hand out (once), the oldest dropped past kAnswersKept.
  std::unordered_map<uint64_t, Completion> answers_ ABSL_GUARDED_BY(mu_);
  std::deque<uint64_t> answer_order_ ABSL_GUARDED_BY(mu_);
  uint64_t short_seen_ ABSL_GUARDED_BY(mu_) = 0;  // LeaseShortReports() acted on
  uint64_t last_step_ ABSL_GUARDED_BY(mu_) = 0;   // the last BeginStep enqueued
  std::unique_ptr<Fresh> fresh_ ABSL_GUARDED_BY(mu_);
  bool switching_ ABSL_GUARDED_BY(mu_) = false;  // SwitchSession runs (fresh_ taken)
  // The session the `old` slots came from: they go back to it as orphans once unmapped.
  std::string old_session_ ABSL_GUARDED_BY(mu_);
  // Chunks unmapped after EndDrained ended their session: given back as its orphans through the
  // next session (SwitchSession).
  std::vector<uint64_t> ended_orphans_ ABSL_GUARDED_BY(mu_);
  // The group's address space as this session maps it (JoinGroup): each lease tier's first
  // group page; group chunks arrive only after.
  bool group_joined_ ABSL_GUARDED_BY(mu_) = false;
  std::array<uint64_t, kernels::kLeaseTiers> group_first_page_ ABSL_GUARDED_BY(mu_){};
  std::atomic<bool> growing_{false};  // a mid-step lease is asked, not answered
  // Drained: the chunks went back and the session ended (EndDrained); until a reconnect.
  std::atomic<bool> ended_drained_{false};
  std::atomic<bool> unavailable_logged_{false};

  // The lease thread.
  static constexpr std::chrono::milliseconds kStepLeaseWait{50};
  static constexpr std::chrono::milliseconds kStepReconnectWait{2000};
  LeaseRounds rounds_;
  ReconnectBackoff backoff_;  // the lease thread's
  std::thread lease_thread_;
};

}  // namespace stash::client

#endif  // STASH_CLIENT_CUDA_MAPPED_SESSION_H_
