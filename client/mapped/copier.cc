#include "client/mapped/copier.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "common/host_event.h"
#include "common/random.h"
#include "common/text.h"
#include "stash/kernels/lease_bookkeeping.h"

namespace stash::client {
namespace {

using kernels::Placement;

// How long the worker spins on an empty queue before it sleeps: long enough that a trainer
// stashing tensor after tensor never pays a wake-up, short enough not to burn a core idle.
constexpr std::chrono::microseconds kSpin(50);
// How long the worker waits on a ready event between looks at whether the session is closing, and
// how long a close waits for ready events before it gives their operations up.
constexpr std::chrono::milliseconds kReadySlice(100);
constexpr std::chrono::seconds kCloseDrainTimeout(10);
// Copies are split into parts of at least this many bytes.
constexpr uint64_t kMinPartBytes = 1 << 20;

Tier TierOf(uint32_t lease_tier) {
  switch (lease_tier) {
    case kernels::kLeaseDevice:
      return Tier::kDevice;
    case kernels::kLeasePeer:
      return Tier::kPeer;
    default:
      return Tier::kHost;
  }
}

uint64_t MicrosSince(std::chrono::steady_clock::time_point t) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t)
          .count());
}

Status NotLive(uint64_t ticket) {
  return NotFoundError("ticket " + Hex(ticket) +
                       " is not a live stash of this session (never stashed here, already "
                       "reloaded or released, or it overflowed)");
}

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

Copier::Copier(std::unique_ptr<LeaseTable> table, uint32_t copy_threads, bool allow_host,
               StepHook step_hook, OutgrownHook outgrown_hook)
    : allow_host_(allow_host),
      step_hook_(std::move(step_hook)),
      outgrown_hook_(std::move(outgrown_hook)),
      id_base_(RandomNonZeroU64()),
      workers_(std::max<uint32_t>(1, copy_threads)),
      table_(std::move(table)) {
  thread_ = std::thread([this] { Run(); });
}

Copier::~Copier() { Stop(); }

std::unique_ptr<LeaseTable> Copier::Stop() {
  stop_requested_.store(true, std::memory_order_release);
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  work_cv_.SignalAll();
  if (thread_.joinable()) thread_.join();
  return std::move(table_);
}

uint64_t Copier::Submit(CopyOp op) {
  bool wake = false;
  uint64_t id = 0;
  {
    MutexLock lock(&mu_);
    id = id_base_ + ++next_id_;
    if (id == 0) id = id_base_ + ++next_id_;  // 0 is no ticket
    op.id = id;
    op.epoch = epoch_;
    op.submitted = std::chrono::steady_clock::now();
    results_.emplace(id, Result{});
    queue_.push_back(std::move(op));
    queued_.fetch_add(1, std::memory_order_release);
    wake = sleeping_;
    sleeping_ = false;
  }
  if (wake) work_cv_.Signal();
  return id;
}

StatusOr<Completion> Copier::Wait(uint64_t id, int64_t timeout_ms) {
  // A small operation is answered within microseconds, sooner than a futex sleep and wake-up
  // take: spin briefly on the answer count before blocking.
  if (timeout_ms != 0) {
    const auto spin_until = std::chrono::steady_clock::now() + kSpin;
    uint64_t seen = answers_.load(std::memory_order_acquire);
    for (;;) {
      {
        MutexLock lock(&mu_);
        auto it = results_.find(id);
        if (it == results_.end() || it->second.answered) break;
      }
      while (answers_.load(std::memory_order_acquire) == seen &&
             std::chrono::steady_clock::now() < spin_until) {
        CpuRelax();
      }
      if (std::chrono::steady_clock::now() >= spin_until) break;
      seen = answers_.load(std::memory_order_acquire);
    }
  }
  MutexLock lock(&mu_);
  auto it = results_.find(id);
  if (it == results_.end()) {
    return NotFoundError("operation " + std::to_string(id) +
                         " is not pending: unknown here, or its answer was already handed out");
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  ++waiters_;
  // Re-found after every wake-up: another thread waiting on the same id may have taken it.
  while ((it = results_.find(id)) != results_.end() && !it->second.answered) {
    if (timeout_ms < 0) {
      done_cv_.Wait(&mu_);
      continue;
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) break;
    done_cv_.WaitWithTimeout(&mu_, deadline - now);
  }
  --waiters_;
  if (it == results_.end()) {
    return NotFoundError("operation " + std::to_string(id) +
                         " is not pending: its answer was handed to another waiter");
  }
  if (!it->second.answered) {
    return DeadlineExceededError("operation " + std::to_string(id) + " not answered within " +
                                 std::to_string(timeout_ms) + " ms");
  }
  Result r = std::move(it->second);
  results_.erase(it);
  if (!r.status.ok()) return r.status;
  return r.completion;
}

std::optional<StatusOr<Completion>> Copier::Poll(uint64_t id) {
  {
    MutexLock lock(&mu_);
    auto it = results_.find(id);
    if (it != results_.end() && !it->second.answered) return std::nullopt;
  }
  return Wait(id, 0);
}

StepFlags Copier::Flags() const {
  MutexLock lock(&mu_);
  return flags_;
}

void Copier::NewEpoch() {
  MutexLock lock(&mu_);
  ++epoch_;
  flags_ = StepFlags{};
}

void Copier::Post(TableChange change) {
  bool wake = false;
  {
    MutexLock lock(&mu_);
    posted_.push_back(std::move(change));
    has_posted_.store(true, std::memory_order_release);
    wake = sleeping_;
    sleeping_ = false;
  }
  if (wake) work_cv_.Signal();
}

void Copier::ApplyChanges() {
  {
    MutexLock lock(&mu_);
    for (TableChange& c : posted_) changes_.push_back(std::move(c));
    posted_.clear();
    has_posted_.store(false, std::memory_order_relaxed);
  }
  std::vector<TableChange> later;
  for (TableChange& change : changes_) {
    if (!change(table_, !stashes_.empty())) later.push_back(std::move(change));
  }
  changes_ = std::move(later);
}

void Copier::Drain() {
  MutexLock lock(&mu_);
  ++waiters_;
  while (!queue_.empty() || running_ != 0) done_cv_.Wait(&mu_);
  --waiters_;
}

void Copier::Run() {
  uint64_t seen = 0;
  for (;;) {
    const auto spin_until = std::chrono::steady_clock::now() + kSpin;
    while (queued_.load(std::memory_order_acquire) == seen &&
           std::chrono::steady_clock::now() < spin_until) {
      CpuRelax();
    }
    std::deque<CopyOp> batch;
    {
      MutexLock lock(&mu_);
      while (queue_.empty() && posted_.empty() && !stopping_) {
        sleeping_ = true;
        work_cv_.Wait(&mu_);
      }
      sleeping_ = false;
      batch.swap(queue_);
      running_ = batch.size();
      seen = queued_.load(std::memory_order_relaxed);
    }
    if (batch.empty()) {
      ApplyChanges();
      MutexLock lock(&mu_);
      if (stopping_ && queue_.empty()) return;  // stopping, and everything ran
      continue;
    }
    for (CopyOp& op : batch) {
      // Deferred changes (a new session waiting for no stash to be live) are tried again at
      // every boundary, not only when something new is posted.
      if (!changes_.empty() || has_posted_.load(std::memory_order_acquire)) ApplyChanges();
      Result result;
      Execute(op, result);
      // The library raises the done event itself, also after an error: a stream waiting on it
      // goes on (the answer says what went wrong).
      if (op.done.memory != nullptr) EventSignal(op.done.counter(), op.done.value);
      const uint64_t id = op.id;
      op = CopyOp{};  // drop the buffers' references before the answer is visible
      MutexLock lock(&mu_);
      result.answered = true;
      results_[id] = std::move(result);
      answers_.fetch_add(1, std::memory_order_release);
      --running_;
      if (waiters_ > 0) done_cv_.SignalAll();
    }
  }
}

void Copier::Execute(const CopyOp& op, Result& result) {
  result.completion.ticket = op.ticket;
  switch (op.kind) {
    case CopyOp::Kind::kStash:
      result.completion.kind = Completion::Kind::kStash;
      return DoStash(op, result);
    case CopyOp::Kind::kReload:
      result.completion.kind = Completion::Kind::kReload;
      return DoReload(op, result);
    case CopyOp::Kind::kRelease:
      result.completion.kind = Completion::Kind::kRelease;
      return DoRelease(op, result);
    case CopyOp::Kind::kBeginStep:
      result.completion.kind = Completion::Kind::kBeginStep;
      return DoBeginStep(op, result);
    case CopyOp::Kind::kNoop:
      result.completion.kind = Completion::Kind::kUnregister;
      return;
  }
}

void Copier::SetFlag(uint64_t epoch, bool overflow, bool spilled) {
  if (!overflow && !spilled) return;
  MutexLock lock(&mu_);
  if (epoch != epoch_) return;
  flags_.overflow |= overflow;
  flags_.spilled |= spilled;
}

bool Copier::AwaitReady(const CounterRef& ready, Result& result) {
  if (ready.memory == nullptr) return true;
  std::chrono::steady_clock::time_point give_up = std::chrono::steady_clock::time_point::max();
  while (!EventWait(ready.counter(), ready.value, kReadySlice)) {
    // Closing drains the queue, but not forever: a ready event nobody will signal (the producer
    // failed) must not hang the close. Like daemon-copy's close, it gives up after a while.
    if (!stop_requested_.load(std::memory_order_acquire)) continue;
    const auto now = std::chrono::steady_clock::now();
    if (give_up == std::chrono::steady_clock::time_point::max()) give_up = now + kCloseDrainTimeout;
    if (now >= give_up) {
      result.status = UnavailableError(
          "the session closed while this operation still waited for its ready event; nothing "
          "was copied");
      return false;
    }
  }
  return true;
}

void Copier::DoStash(const CopyOp& op, Result& result) {
  kernels::SessionControl& c = table_->control();
  if (kernels::Draining(c)) {
    // The daemon drains (or this rank's session ended after a drain): nothing is taken, the
    // caller keeps its buffer, and the step is not flagged: nothing was lost.
    result.completion.ticket = op.id;
    result.completion.tier = Tier::kOverflow;
    result.completion.latency_us = MicrosSince(op.submitted);
    return;
  }
  if (!AwaitReady(op.ready, result)) return;
  int64_t count = op.count_value;
  if (op.count.memory != nullptr) {
    // Read when the copy runs (after `ready`): the sync-free case.
    count = __atomic_load_n(reinterpret_cast<const int64_t*>(op.count.counter()), __ATOMIC_ACQUIRE);
  }
  const uint64_t page_bytes = table_->page_bytes();
  // A group's member claims the pages a stash needs from the depot, tier by tier in the order the
  // plan tries them, and gives back at once what fell short (its cache mark is 0).
  const bool dry = table_->grouped() &&
                   table_->RefillForStash(kernels::StashPagesNeeded(count, op.divisor, op.max_rows,
                                                                    op.row_bytes, page_bytes),
                                          allow_host_);
  const kernels::TierChoice tiers[kernels::kLeaseTiers] = {
      {table_->ring(kernels::kLeaseDevice), Placement::kDevice},
      {table_->ring(kernels::kLeasePeer), Placement::kPeer},
      {allow_host_ ? table_->ring(kernels::kLeaseHost) : nullptr, Placement::kHost}};
  const kernels::StashPlan plan = kernels::PlanStashInOrder(
      count, op.divisor, op.max_rows, op.row_bytes, page_bytes, tiers, kernels::kLeaseTiers);
  Completion& done = result.completion;
  done.ticket = op.id;
  if (plan.placement == Placement::kInvalidCount) {
    const std::string where = op.count.memory != nullptr
                                  ? "read from memory " + std::to_string(op.memory_id) +
                                        " offset " + std::to_string(op.count.offset)
                                  : "given";
    kernels::RecordRejected(c);
    result.status = InvalidArgumentError("the row count " + where + " is " +
                                         std::to_string(static_cast<int64_t>(plan.rows)) +
                                         ": counts must be >= 0; nothing was taken");
    return;
  }
  done.rows = plan.rows;
  if (plan.placement == Placement::kOverflow) {
    if (table_->grouped()) {
      for (uint32_t t = 0; t < kernels::kLeaseTiers; ++t) table_->Flush(t);
    }
    done.tier = Tier::kOverflow;
    // The pages it would have needed count as demand for auto sizing, for the rest of the step
    // (the rank holds the activation itself until backward).
    const uint64_t demand = kernels::RecordOverflow(
        c, state_, kernels::OverflowPages(plan, op.max_rows, op.row_bytes, page_bytes));
    SetFlag(op.epoch, /*overflow=*/true, /*spilled=*/false);
    Outgrown(demand);
    done.latency_us = MicrosSince(op.submitted);
    return;
  }
  kernels::PageRing& ring = *table_->ring(plan.tier);
  StashRecord record;
  record.tier = plan.tier;
  record.rows = plan.rows;
  record.bytes = plan.bytes;
  record.pages = plan.pages;
  record.row_bytes = op.row_bytes;
  record.max_rows = op.max_rows;
  record.page_record.resize(plan.pages);
  const kernels::PagedSpan span{table_->base(plan.tier), page_bytes, record.page_record.data(),
                                plan.bytes};
  const uint8_t* src = op.memory->data() + op.offset;
  workers_.ParallelFor(plan.pages, std::max<uint64_t>(1, kMinPartBytes / page_bytes),
                       [&](uint64_t begin, uint64_t end) {
                         kernels::StashPages(src, ring, plan.head, span, begin, end);
                       });
  // Every part read the old head: publish the new one.
  ring.head = plan.head + plan.pages;
  const uint64_t demand =
      kernels::RecordPlaced(c, state_, plan.tier, ring.head, plan.pages, plan.bytes);
  const bool spilled = plan.tier != kernels::kLeaseDevice;
  SetFlag(op.epoch, false, spilled);
  // Short of room: the lease grows off this thread, landing between later operations (a
  // group's: the depot of the own device ran dry).
  if (table_->grouped()
          ? dry
          : kernels::LeaseShort(spilled, kernels::RingFree(*table_->ring(kernels::kLeaseDevice)),
                                table_->pages_leased(kernels::kLeaseDevice))) {
    Outgrown(demand);
  }
  done.tier = TierOf(plan.tier);
  done.bytes = plan.bytes;
  done.pages = plan.pages;
  record.live_entry =
      table_->live().Add(op.id, op.layer, op.microbatch, op.name, plan.bytes, plan.pages);
  stashes_.emplace(op.id, std::move(record));
  done.latency_us = MicrosSince(op.submitted);
}

void Copier::Outgrown(uint64_t demand) {
  if (kernels::ReportOutgrown(state_, demand) && outgrown_hook_) outgrown_hook_();
}

void Copier::ReturnStashPages(const StashRecord& record) {
  kernels::PageRing& ring = *table_->ring(record.tier);
  kernels::ReturnPages(ring, ring.tail, record.page_record.data(), 0, record.pages);
  ring.tail += record.pages;
  kernels::RecordReturned(table_->control(), record.tier, ring.tail, record.pages, record.bytes);
  table_->Flush(record.tier);  // a group's member keeps no free page: the others may need it
  table_->live().Remove(record.live_entry);
}

void Copier::DoReload(const CopyOp& op, Result& result) {
  if (!AwaitReady(op.ready, result)) return;
  kernels::SessionControl& c = table_->control();
  auto it = stashes_.find(op.ticket);
  if (it == stashes_.end()) {
    kernels::RecordRejected(c);
    result.status = NotLive(op.ticket);
    return;
  }
  const StashRecord& record = it->second;
  const uint64_t size = op.memory->size();
  const uint64_t len = record.max_rows * record.row_bytes;
  if (op.offset > size || len > size - op.offset) {
    kernels::RecordRejected(c);
    result.status = InvalidArgumentError(
        "reload destination (max_rows * row_bytes of the stash) [" + std::to_string(op.offset) +
        ", " + std::to_string(op.offset) + " + " + std::to_string(len) +
        ") runs past the end of memory " + std::to_string(op.memory_id) + " (" +
        std::to_string(size) + " bytes); the stash is kept");
    return;
  }
  const uint64_t page_bytes = table_->page_bytes();
  uint8_t* dst = op.memory->data() + op.offset;
  const kernels::PagedSpan span{table_->base(record.tier), page_bytes,
                                const_cast<uint64_t*>(record.page_record.data()), record.bytes};
  workers_.ParallelFor(
      record.pages, std::max<uint64_t>(1, kMinPartBytes / page_bytes),
      [&](uint64_t begin, uint64_t end) { kernels::PopPages(dst, span, begin, end); });
  if (op.zero_tail) kernels::ZeroBytes(dst, record.bytes, len);
  ReturnStashPages(record);
  kernels::RecordReloaded(c, record.bytes);
  Completion& done = result.completion;
  done.ticket = op.ticket;
  done.tier = TierOf(record.tier);
  done.rows = record.rows;
  done.bytes = record.bytes;
  done.latency_us = MicrosSince(op.submitted);
  stashes_.erase(it);
}

void Copier::DoRelease(const CopyOp& op, Result& result) {
  kernels::SessionControl& c = table_->control();
  auto it = stashes_.find(op.ticket);
  if (it == stashes_.end()) {
    kernels::RecordRejected(c);
    result.status = NotLive(op.ticket);
    return;
  }
  ReturnStashPages(it->second);
  kernels::RecordReleased(c);
  result.completion.ticket = op.ticket;
  result.completion.pages = it->second.pages;
  stashes_.erase(it);
}

void Copier::DoBeginStep(const CopyOp& op, Result& result) {
  const uint64_t ended = kernels::RecordBeginStep(table_->control(), state_, op.step);
  result.completion.step_overflow = (ended & kernels::kStepOverflow) != 0;
  result.completion.step_spilled = (ended & kernels::kStepSpilled) != 0;
  if (step_hook_) step_hook_(op.step, table_, !stashes_.empty());
  // What the hook had come back (a lease answered in time) applies before the step's stashes.
  if (!changes_.empty() || has_posted_.load(std::memory_order_acquire)) ApplyChanges();
}

}  // namespace stash::client
