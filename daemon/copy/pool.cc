#include "daemon/copy/pool.h"

#include "daemon/copy/admit.h"
#include "daemon/copy/copy_state.h"
#include "daemon/stats/event_log.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "common/host_event.h"
#include "common/logging.h"
#include "common/macros.h"
#include "common/text.h"
#include "daemon/tiers/tier.h"
#include "stash/kernels/paging.h"

namespace stash::daemon {

namespace v1 = stash::v1;
using Clock = std::chrono::steady_clock;

v1::SessionResponse Pool::Reply(uint64_t request_id, const Status& status) {
  v1::SessionResponse r;
  r.set_request_id(request_id);
  r.set_code(static_cast<int>(status.code()));
  r.set_message(status.message());
  return r;
}

const v1::EventRef* Pool::ReadyOf(const v1::SessionRequest& req) {
  if (req.has_stash() && req.stash().has_ready()) return &req.stash().ready();
  if (req.has_reload() && req.reload().has_ready()) return &req.reload().ready();
  return nullptr;
}

Pool::Pool(int index, std::unique_ptr<CopyExecutor> executor, DaemonCounters* counters)
    : index_(index), executor_(std::move(executor)), counters_(counters) {
  executor_->Attach([this](CopyExecutor::Then then) { Post(std::move(then)); });
  worker_ = std::thread([this] { Run(); });
}

Pool::~Pool() { Stop(); }

void Pool::Enqueue(std::shared_ptr<Session> session, v1::SessionRequest request,
                   Clock::time_point received) {
  Op op;
  op.session = std::move(session);
  op.request = std::move(request);
  op.received = received;
  bool stopping = false;
  {
    MutexLock lock(&mu_);
    stopping = stopping_;
    if (!stopping) {
      op.session->counters().inflight.fetch_add(1, std::memory_order_relaxed);
      op.seq = next_seq_++;
      // Inline only when nothing could be owed a turn before it: no op runs, no teardown or
      // completion waits, and nothing of this session is queued (its order). Other sessions'
      // lane heads wait on their ready events, or the worker has not woken for them yet; a
      // small op going first costs them microseconds.
      // The worker waiting for the token goes first: inline ops never starve queued ones.
      const bool run_here = executor_->Synchronous() && InlineKind(op.request) && !running_ &&
                            !worker_waiting_ && teardowns_.empty() && completions_.empty() &&
                            !lanes_.contains(op.session.get());
      if (!run_here) {
        Queue(std::move(op));
        return;
      }
      running_ = true;
    }
  }
  if (stopping) {
    // Nothing is submitted for it: its done event (if any) may go up with this answer.
    op.session->Send(Reply(op.request.request_id(),
                           UnavailableError("stashd is shutting down: nothing was taken; "
                                            "reconnect when it is back")));
    return;
  }
  RunInline(std::move(op));
}

void Pool::Queue(Op op) {
  Lane& lane = lanes_[op.session.get()];
  if (lane.session == nullptr) lane.session = op.session;
  lane.ops.push_back(std::move(op));
  cv_.Signal();
}

void Pool::RunInline(Op op) {
  const bool run = Ready(op) && Light(op);
  if (run) Execute(op);
  MutexLock lock(&mu_);
  running_ = false;
  if (!run) {
    if (op.session->closed()) {
      // Its teardown is queued already: nothing of the session may run after it.
      op.session->counters().inflight.fetch_sub(1, std::memory_order_relaxed);
      return;
    }
    Queue(std::move(op));
  } else if (worker_waiting_ || !teardowns_.empty() || !completions_.empty() || stopping_) {
    cv_.Signal();
  }
}

bool Pool::InlineKind(const v1::SessionRequest& req) {
  switch (req.kind_case()) {
    case v1::SessionRequest::kStash:
      // Admission refused row_bytes 0 and products that overflow.
      return req.stash().row_bytes() != 0 &&
             req.stash().max_rows() <= kInlineBytes / req.stash().row_bytes();
    case v1::SessionRequest::kReload:
    case v1::SessionRequest::kRelease:
    case v1::SessionRequest::kBeginStep:
      return true;
    default:  // registrations map and unmap client memory: the worker's
      return false;
  }
}

bool Pool::Light(const Op& op) {
  const v1::SessionRequest& req = op.request;
  Tier* device = executor_->device_tier();
  switch (req.kind_case()) {
    case v1::SessionRequest::kStash: {
      // Only when the pool's own tier has room for every row it may take: a spill would lock
      // the host tier or a peer pool, which another pool's worker may hold for a large copy.
      // And only when nobody holds the own tier now: another pool's worker may be copying a
      // stash into it (the peer tier), and a gRPC thread must not wait behind that.
      const uint64_t pages =
          kernels::PagesFor(req.stash().max_rows() * req.stash().row_bytes(), device->page_bytes());
      if (!device->mu().TryLock()) return false;
      const bool room = kernels::RingFree(device->ring()) >= pages;
      device->mu().Unlock();
      return room;
    }
    case v1::SessionRequest::kReload:
    case v1::SessionRequest::kRelease: {
      const uint64_t ticket = req.has_reload() ? req.reload().ticket() : req.release().ticket();
      auto& stashes = CopyState::Of(*op.session).stashes;
      auto it = stashes.find(ticket);
      if (it == stashes.end()) return true;  // answered at once
      const StashRecord& record = *it->second;
      // The bytes a reload writes: its rows, and with zero_tail every byte up to max_rows.
      const uint64_t written = req.has_reload() && req.reload().zero_tail()
                                   ? record.max_rows * record.row_bytes
                                   : record.plan.bytes;
      if (record.tier != device || (!req.has_release() && written > kInlineBytes)) return false;
      // Not while another pool's worker holds the own tier (a peer stash's copy or reload).
      if (!device->mu().TryLock()) return false;
      device->mu().Unlock();
      return true;
    }
    default:
      return true;
  }
}

void Pool::Post(CopyExecutor::Then then) {
  MutexLock lock(&mu_);
  completions_.push_back(std::move(then));
  cv_.Signal();
}

CopyExecutor::Then Pool::Track(CopyExecutor::Then then) {
  {
    MutexLock lock(&mu_);
    ++outstanding_;
  }
  return [this, then = std::move(then)] {
    then();
    MutexLock lock(&mu_);
    --outstanding_;
  };
}

void Pool::CloseSession(const std::shared_ptr<Session>& session, CopyExecutor::Then closed) {
  session->MarkClosed();
  session->DetachSink();
  {
    MutexLock lock(&mu_);
    if (auto lane = lanes_.find(session.get()); lane != lanes_.end()) {
      session->counters().inflight.fetch_sub(lane->second.ops.size(), std::memory_order_relaxed);
      lanes_.erase(lane);
    }
    if (!stopped_) {
      teardowns_.push_back(Op{session, {}, Clock::now(), true, std::move(closed), next_seq_++});
      cv_.Signal();
      return;
    }
  }
  // The worker drained everything before it returned: no work of the session is in flight.
  if (closed) closed();
}

void Pool::Stop() {
  {
    MutexLock lock(&mu_);
    if (stopping_ && !worker_.joinable()) return;
    stopping_ = true;
    cv_.Signal();
  }
  if (worker_.joinable()) worker_.join();
}

bool Pool::Ready(const Op& op) {
  if (op.teardown) return true;
  const v1::EventRef* ready = ReadyOf(op.request);
  if (ready == nullptr || !ready->has_counter()) return true;
  const uint64_t* counter = CopyState::Of(*op.session).HostCounter(ready->counter());
  if (counter == nullptr) return true;  // Execute reports the error
  return EventReached(counter, ready->value());
}

bool Pool::TakeNext(Op* op, Clock::time_point* wake) {
  if (!teardowns_.empty()) {
    *op = std::move(teardowns_.front());
    teardowns_.pop_front();
    return true;
  }
  // Each session's head only: a session whose head waits does not hold up the others, and the
  // requests queued behind that head are not looked at. A waiting head is checked again on its
  // own backoff (20 us doubling to 1 ms), not whenever another session moves, so sessions that
  // wait do not tax the ones that do not. Heads at the longest backoff are checked together on
  // a 1 ms grid: one wake-up for all of them.
  const Clock::time_point now = Clock::now();
  Lane* best = nullptr;
  *wake = Clock::time_point::max();
  for (auto& [key, lane] : lanes_) {
    if (lane.next_check > now) {
      *wake = std::min(*wake, lane.next_check);
      continue;
    }
    if (best != nullptr && lane.ops.front().seq > best->ops.front().seq) continue;
    if (Ready(lane.ops.front())) {
      best = &lane;
      continue;
    }
    lane.backoff = std::clamp(lane.backoff * 2, kMinBackoff, kMaxBackoff);
    lane.next_check = now + lane.backoff;
    if (lane.backoff == kMaxBackoff) {
      const auto grid = lane.next_check.time_since_epoch() / kMaxBackoff + 1;
      lane.next_check = Clock::time_point(grid * kMaxBackoff);
    }
    *wake = std::min(*wake, lane.next_check);
  }
  if (best == nullptr) return false;
  *op = std::move(best->ops.front());
  best->ops.pop_front();
  if (best->ops.empty()) {
    lanes_.erase(op->session.get());
  } else {
    best->next_check = {};  // a new head: check it at once
    best->backoff = {};
  }
  return true;
}

void Pool::Run() {
  bool held = false;  // this thread holds the run token
  while (true) {
    Op op;
    std::deque<CopyExecutor::Then> completions;
    {
      MutexLock lock(&mu_);
      if (held) running_ = false;  // the op before finished
      held = false;
      bool found = false;
      while (running_ || (!found && completions_.empty())) {
        if (running_) {
          // A small request runs inline (RunInline): it signals when it gives the token back,
          // and no other takes it before this thread (Enqueue).
          worker_waiting_ = true;
          cv_.Wait(&mu_);
          continue;
        }
        worker_waiting_ = false;
        if (outstanding_ > 0 && Clock::now() - health_checked_ > std::chrono::milliseconds(20)) {
          health_checked_ = Clock::now();
          // Not under mu_: the check calls into the driver, and the executor's host callbacks
          // need mu_ (Post) to hand over completions meanwhile.
          mu_.Unlock();
          executor_->CheckHealth();
          mu_.Lock();
          continue;  // completions may have arrived meanwhile
        }
        if (lanes_.empty() && teardowns_.empty()) {
          if (stopping_ && outstanding_ == 0) {
            stopped_ = true;
            return;
          }
          if (outstanding_ == 0) {
            cv_.Wait(&mu_);
          } else {
            cv_.WaitWithTimeout(&mu_, std::chrono::milliseconds(20));
          }
          continue;
        }
        Clock::time_point wake;
        found = TakeNext(&op, &wake);
        if (!found) {
          // Everything waits on client events, which do not wake us: poll with backoff.
          if (stopping_) {
            // Shutting down: nobody will signal them now.
            for (auto& [key, lane] : lanes_) {
              lane.session->counters().inflight.fetch_sub(lane.ops.size(),
                                                          std::memory_order_relaxed);
            }
            lanes_.clear();
            continue;
          }
          // Client events do not wake this thread: sleep until the next head is due for a
          // check. An Enqueue or a completion signals cv_ and ends the wait early.
          if (wake == Clock::time_point::max()) {
            cv_.Wait(&mu_);
          } else {
            cv_.WaitWithTimeout(&mu_, std::max(wake - Clock::now(), Clock::duration::zero()));
          }
        }
      }
      completions.swap(completions_);
      running_ = held = true;
    }
    for (CopyExecutor::Then& then : completions) then();
    if (op.session != nullptr) {
      Execute(op);
    }
  }
}

void Pool::Execute(Op& op) {
  const std::shared_ptr<Session>& s = op.session;
  if (op.teardown) {
    DoTeardown(s, std::move(op.closed));
    return;
  }
  const v1::SessionRequest& req = op.request;
  switch (req.kind_case()) {
    case v1::SessionRequest::kRegisterMemory:
      DoRegister(*s, req);
      break;
    case v1::SessionRequest::kUnregisterMemory:
      DoUnregister(s, req);
      break;
    case v1::SessionRequest::kStash:
      DoStash(s, req, op.received);
      break;
    case v1::SessionRequest::kReload:
      DoReload(s, req, op.received);
      break;
    case v1::SessionRequest::kRelease:
      DoRelease(s, req);
      break;
    case v1::SessionRequest::kBeginStep:
      DoBeginStep(s, req);
      break;
    default:
      s->Send(Reply(req.request_id(), InternalError("request kind reached the pool unvalidated")));
      s->counters().inflight.fetch_sub(1, std::memory_order_relaxed);
      break;
  }
}

}  // namespace stash::daemon
