// The in-order "stream" of a mapped session on the host backend (docs/design.md, "Mapped
// mode"): one worker thread runs the session's operations in submission order over the rank's
// own rings (client/mapped/lease_table.h), with kernels/paging.h, splitting big copies over
// CopyWorkers. What a GPU's stream does with kernels; the control block's bookkeeping is one set
// of functions for both (stash/kernels/lease_bookkeeping.h).
//
// Submit() is a queue push: no syscall while the worker is busy or spinning (it spins briefly
// before it sleeps, and only a sleeping worker is woken). The worker answers every operation
// exactly as the daemon would (same codes, same words), through Wait.
//
// Thread-safe: Submit, Wait, Poll, Flags, NewEpoch and Drain from any thread. The lease table
// and the stash records belong to the worker thread (and to the step hook it calls).
#ifndef STASH_CLIENT_COPIER_H_
#define STASH_CLIENT_COPIER_H_

#include <absl/base/thread_annotations.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "client/mapped/lease_table.h"
#include "common/copy_workers.h"
#include "common/mutex.h"
#include "common/shm.h"
#include "stash/client.h"
#include "stash/kernels/lease_bookkeeping.h"

namespace stash::client {

// An 8-byte counter in a HostBuffer, kept mapped while the operation is queued.
struct CounterRef {
  std::shared_ptr<SharedMemory> memory;  // null = none
  uint64_t offset = 0;
  uint64_t value = 0;
  uint64_t* counter() const { return reinterpret_cast<uint64_t*>(memory->data() + offset); }
};

// One operation of the stream. The memories keep the caller's buffers mapped until it ran.
struct CopyOp {
  enum class Kind { kStash, kReload, kRelease, kBeginStep, kNoop };
  Kind kind = Kind::kNoop;
  uint64_t id = 0;     // set by Submit: the ticket of a stash, the operation id of the others
  uint64_t epoch = 0;  // set by Submit: the step it was submitted in
  std::chrono::steady_clock::time_point submitted;
  CounterRef ready, done;
  // kStash: rows from memory + offset; the count a value or (count.memory set) an int64.
  std::shared_ptr<SharedMemory> memory;  // kStash source, kReload destination
  uint64_t offset = 0;
  uint64_t memory_id = 0;  // the HostBuffer's id, for messages
  uint64_t row_bytes = 0, max_rows = 0;
  int64_t count_value = 0;
  CounterRef count;  // offset of the int64; value unused
  uint32_t divisor = 1;
  // kReload / kRelease: the stash; kReload: zero rows [rows, max_rows).
  uint64_t ticket = 0;
  bool zero_tail = false;
  uint64_t step = 0;  // kBeginStep
  // kStash: the tags, for the control block's live-stash table.
  uint32_t layer = 0, microbatch = 0;
  std::string name;
};

class Copier {
 public:
  // Runs on the worker thread at each BeginStep after the step's bookkeeping, with the table
  // (which it may replace, when no stash is live) and whether a stash is live.
  using StepHook =
      std::function<void(uint64_t step, std::unique_ptr<LeaseTable>& table, bool stashes_live)>;
  // A change to the table made on the worker thread between two operations (chunks that came,
  // a new session's table). Returns false to be tried again at the next boundary (it needs no
  // stash live, say).
  using TableChange = std::function<bool(std::unique_ptr<LeaseTable>& table, bool stashes_live)>;

  // Runs on the worker thread when the lease gets short mid-step: a stash spilled or
  // overflowed, or the own device's chunks are all but full. Must not block.
  using OutgrownHook = std::function<void()>;

  // `copy_threads` >= 1 (the worker counts); `allow_host`: stashes may go to the host tier.
  Copier(std::unique_ptr<LeaseTable> table, uint32_t copy_threads, bool allow_host,
         StepHook step_hook, OutgrownHook outgrown_hook = nullptr);
  Copier(const Copier&) = delete;
  Copier& operator=(const Copier&) = delete;
  // Drain()s and stops the worker.
  ~Copier();

  // Queues `op`; returns its id (a stash's ticket). Never blocks on the worker.
  uint64_t Submit(CopyOp op);
  // As Client::Wait / Client::Poll.
  StatusOr<Completion> Wait(uint64_t id, int64_t timeout_ms);
  std::optional<StatusOr<Completion>> Poll(uint64_t id);
  // The step flags as far as operations of the current step have run.
  StepFlags Flags() const;
  // Starts a new step here at once: flags cleared; later stashes count for it.
  void NewEpoch();
  // Queues `change` for the worker, which runs it before its next operation (or at once when
  // idle). Never blocks on the worker.
  void Post(TableChange change);
  // Waits until every operation submitted so far ran.
  void Drain();
  // Drains (an operation still waiting for its ready event 10 s after this is answered
  // UNAVAILABLE), stops the worker and hands the table back (for Close: unmap and return).
  std::unique_ptr<LeaseTable> Stop();

 private:
  struct Result {
    bool answered = false;
    Status status;
    Completion completion;
  };
  struct StashRecord {
    uint32_t tier = 0;
    uint64_t rows = 0, bytes = 0, pages = 0, row_bytes = 0, max_rows = 0;
    std::vector<uint64_t> page_record;
    int32_t live_entry = -1;  // in the live-stash table (LiveTableWriter::Add)
  };

  void Run();
  // Runs one operation on the worker thread; fills its answer.
  void Execute(const CopyOp& op, Result& result);
  // Waits for `ready` (when set); false with result's status set when the session closed and
  // the event never came.
  bool AwaitReady(const CounterRef& ready, Result& result);
  void DoStash(const CopyOp& op, Result& result);
  void DoReload(const CopyOp& op, Result& result);
  void DoRelease(const CopyOp& op, Result& result);
  void DoBeginStep(const CopyOp& op, Result& result);
  // Returns `record`'s pages to its ring and updates the control block's live counts.
  void ReturnStashPages(const StashRecord& record);
  void SetFlag(uint64_t epoch, bool overflow, bool spilled);
  // The lease is short with the step's demand at `demand` pages: tells outgrown_hook_, once
  // per eighth of growth in demand within a step (kernels::ReportOutgrown).
  void Outgrown(uint64_t demand);
  // Runs the posted table changes (worker thread); those that say "not yet" stay queued.
  void ApplyChanges();

  const bool allow_host_;
  const StepHook step_hook_;
  const OutgrownHook outgrown_hook_;
  // Random: tickets of other sessions (and processes) are not found here. Ids run on over all
  // 64 bits from it, so they never wrap onto a live ticket.
  const uint64_t id_base_;
  CopyWorkers workers_;

  // Worker thread only.
  std::unique_ptr<LeaseTable> table_;
  std::unordered_map<uint64_t, StashRecord> stashes_;
  // The step's flags in stream order, its overflowed pages, when the lease was last found short.
  kernels::CopierState state_{};
  std::vector<TableChange> changes_;  // taken from posted_, not applied yet

  mutable Mutex mu_;
  CondVar work_cv_;  // the worker sleeps on it
  CondVar done_cv_;  // Wait and Drain sleep on it
  std::deque<CopyOp> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<TableChange> posted_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> has_posted_{false};  // posted_ is not empty: the worker looks between ops
  std::unordered_map<uint64_t, Result> results_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  StepFlags flags_ ABSL_GUARDED_BY(mu_);
  bool sleeping_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t running_ ABSL_GUARDED_BY(mu_) = 0;  // operations taken off the queue, not answered
  int waiters_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<uint64_t> queued_{0};  // submissions so far: the worker spins on it
  std::atomic<bool> stop_requested_{false};
  std::atomic<uint64_t> answers_{0};  // answers recorded so far: Wait spins on it
  std::thread thread_;
};

}  // namespace stash::client

#endif  // STASH_CLIENT_COPIER_H_
