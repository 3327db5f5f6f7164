// The pool's request handlers: what each request does once it holds the run token (pool.cc
// schedules them and holds the token).
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
namespace {

namespace v1 = stash::v1;
using Clock = std::chrono::steady_clock;

uint64_t MicrosSince(Clock::time_point t) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t).count());
}

// Event counters must be in host memory: the daemon's CPU polls ready counters (Pool::Ready),
// and a done counter in a client's GPU memory that the client freed would fault the daemon's
// CUDA context, and with it every session on that GPU. `which`: "ready" or "done".
Status CheckCounter(Session& s, const v1::EventRef* event, const char* which, const char* why) {
  if (event == nullptr || !event->has_counter()) return Status::Ok();
  STASH_RETURN_IF_ERROR(CopyState::Of(s).Resolve(event->counter()).status());
  if (CopyState::Of(s).HostCounter(event->counter()) == nullptr) {
    return InvalidArgumentError(std::string("the ") + which +
                                " event's counter is in device memory " +
                                std::to_string(event->counter().memory_id()) + ": put " + which +
                                " counters in host shared memory (a HostBuffer), " + why);
  }
  return Status::Ok();
}

// `status` of a reload that failed before it took the stash's pages, saying that they stay.
Status WithStashKept(const Status& status, uint64_t ticket) {
  return Status(status.code(), status.message() + "; the stash " + Hex(ticket) +
                                   " is kept: reload it again or release it");
}

// What a placed stash's answers say of where it is.
v1::Tier TierOf(kernels::Placement placement) {
  switch (placement) {
    case kernels::Placement::kPeer:
      return v1::TIER_PEER;
    case kernels::Placement::kHost:
      return v1::TIER_HOST;
    default:
      return v1::TIER_DEVICE;
  }
}

const v1::EventRef* DoneOfRequest(const v1::SessionRequest& req) {
  if (req.has_stash() && req.stash().has_done()) return &req.stash().done();
  if (req.has_reload() && req.reload().has_done()) return &req.reload().done();
  return nullptr;
}

// Both event counters of a stash or reload (CheckCounter).
Status CheckCounters(Session& s, const v1::SessionRequest& req) {
  STASH_RETURN_IF_ERROR(CheckCounter(s, Pool::ReadyOf(req), "ready", "which the daemon polls"));
  return CheckCounter(s, DoneOfRequest(req), "done",
                      "where streams wait on them (Client::EnqueueWait)");
}

}  // namespace

void Pool::DoRegister(Session& s, const v1::SessionRequest& req) {
  const v1::RegisterMemory& reg = req.register_memory();
  const auto start = Clock::now();
  ClientMemory memory;
  memory.bytes = reg.bytes();
  UniqueFd fd;
  StatusOr<std::unique_ptr<MappedMemory>> mapping = InternalError("not opened");
  if (reg.kind() == v1::MEMORY_KIND_HOST_FD) {
    auto taken = s.TakeDeposit(reg.memory_id(), reg.bytes());
    if (taken.ok()) {
      mapping = executor_->Open(reg, std::move(taken).value());
    } else {
      mapping = taken.status();
    }
  } else {
    mapping = executor_->Open(reg, UniqueFd());
  }
  if (mapping.ok()) {
    memory.mapping = std::move(mapping).value();
  } else {
    memory.open_status = mapping.status();
  }
  const Status status = memory.open_status;
  CopyState::Of(s).memories[reg.memory_id()] = std::move(memory);
  s.counters().inflight.fetch_sub(1, std::memory_order_relaxed);
  if (!status.ok()) {
    // Nothing was registered: the id is free again for a registration that works (requests
    // admitted behind this one find the failed entry and say why).
    {
      MutexLock lock(&s.mu());
      // Only if this request's declaration still stands: an Unregister and a new Register of
      // the same id may have been admitted meanwhile, and that one is not this one to undo.
      auto by = s.declared_by().find(reg.memory_id());
      auto declared = s.declared_memories().find(reg.memory_id());
      if (by != s.declared_by().end() && by->second == req.request_id() &&
          declared != s.declared_memories().end()) {
        GiveDeclared(s, declared->second);
        s.declared_memories().erase(declared);
        s.declared_by().erase(by);
      }
    }
    Log("ipc")->warn("session {}: cannot open memory {}: {}", s.info().id, reg.memory_id(),
                     status.ToString());
    s.Send(Reply(req.request_id(),
                 Status(status.code(), "cannot open memory " + std::to_string(reg.memory_id()) +
                                           ": " + status.message())));
    return;
  }
  s.counters().memories.fetch_add(1, std::memory_order_relaxed);
  v1::SessionResponse r = Reply(req.request_id());
  r.mutable_registered()->set_memory_id(reg.memory_id());
  r.mutable_registered()->set_open_us(MicrosSince(start));
  s.Send(std::move(r));
}

void Pool::DoUnregister(const std::shared_ptr<Session>& session, const v1::SessionRequest& req) {
  Session& s = *session;
  auto& memories = CopyState::Of(s).memories;
  auto it = memories.find(req.unregister_memory().memory_id());
  if (it != memories.end()) {
    if (it->second.mapping != nullptr) {
      s.counters().memories.fetch_sub(1, std::memory_order_relaxed);
    }
    // Work in flight may still use the mapping: it closes when the last of it finished, and
    // only then is the client told, so it may free the memory once the answer is in (CUDA
    // forbids freeing an exported allocation that an importer still has open).
    std::shared_ptr<MappedMemory> mapping = std::move(it->second.mapping);
    memories.erase(it);
    if (mapping != nullptr) {
      executor_->Fence(
          Track([session, id = req.request_id(), mapping = std::move(mapping)]() mutable {
            mapping.reset();
            session->counters().inflight.fetch_sub(1, std::memory_order_relaxed);
            session->Send(Reply(id));
          }));
      return;
    }
  }
  s.counters().inflight.fetch_sub(1, std::memory_order_relaxed);
  s.Send(Reply(req.request_id()));
}

void Pool::FailAfterDone(const std::shared_ptr<Session>& s, uint64_t request_id,
                         const Status& status, const DoneSignal& done) {
  if (done.memory == nullptr) {
    s->counters().inflight.fetch_sub(1, std::memory_order_relaxed);
    s->Send(Reply(request_id, status));
    return;
  }
  // The answer goes out only after the done write ran (stream order on the cuda backend): the
  // client raises done counters itself in answer order, so an earlier write landing after it
  // could move a counter back.
  executor_->Raise(done);
  executor_->Fence(Track([s, request_id, status] {
    s->counters().inflight.fetch_sub(1, std::memory_order_relaxed);
    s->Send(Reply(request_id, status));
  }));
}

DoneSignal Pool::DoneOf(Session& s, const v1::EventRef* done) {
  if (done == nullptr || !done->has_counter()) return {};
  auto& memories = CopyState::Of(s).memories;
  auto it = memories.find(done->counter().memory_id());
  if (it == memories.end() || it->second.mapping == nullptr) return {};
  if (it->second.mapping->host() == nullptr) return {};  // refused by CheckDone
  return DoneSignal{it->second.mapping.get(), done->counter().offset(), done->value()};
}

void Pool::DoStash(const std::shared_ptr<Session>& s, const v1::SessionRequest& req,
                   Clock::time_point received) {
  const v1::Stash& st = req.stash();
  const DoneSignal done = DoneOf(*s, DoneOfRequest(req));
  auto fail = [&](const Status& status) {
    s->ForgetTicket(st.ticket());
    FailAfterDone(s, req.request_id(), status, done);
  };
  if (Status counters = CheckCounters(*s, req); !counters.ok()) return fail(counters);
  auto src = CopyState::Of(*s).Resolve(st.source());
  if (!src.ok()) return fail(src.status());

  StashWork work;
  work.source = *src;
  work.count.divisor = st.count().divisor();
  if (st.count().has_reference()) {
    auto ptr = CopyState::Of(*s).Resolve(st.count().reference());
    if (!ptr.ok()) return fail(ptr.status());
    work.count.data = *ptr;
  } else {
    work.count.value = static_cast<int64_t>(st.count().value());
  }
  work.allow_host_spill = s->info().allow_host_spill;
  work.done = done;
  auto record = std::make_shared<StashRecord>();
  record->row_bytes = st.row_bytes();
  record->max_rows = st.max_rows();
  work.record = record.get();
  // Live from now: a Reload queued behind this stash finds it even before the copy finished.
  // Admission refuses a ticket while it is live or claimed, so no record is overwritten here.
  auto [slot, inserted] = CopyState::Of(*s).stashes.try_emplace(st.ticket(), record);
  STASH_CHECK(inserted) << "ticket " << Hex(st.ticket()) << " admitted while still held";
  (void)slot;
  const auto submitted = Clock::now();
  executor_->Stash(work, Track([this, s, req, record, received, submitted] {
                     FinishStash(*s, req, *record, received, submitted);
                   }));
}

void Pool::FinishStash(Session& s, const v1::SessionRequest& req, StashRecord& record,
                       Clock::time_point received, Clock::time_point submitted) {
  const v1::Stash& st = req.stash();
  const kernels::StashPlan& plan = record.plan;
  const double copy_seconds = std::chrono::duration<double>(Clock::now() - submitted).count();
  SessionCounters& c = s.counters();
  c.inflight.fetch_sub(1, std::memory_order_relaxed);
  if (record.tier == nullptr) {
    // Nothing taken: the ticket holds no data (a Reload already queued behind it is answered so).
    // A Reload that took the record already forgot the ticket, which may be live again by now.
    auto& stashes = CopyState::Of(s).stashes;
    auto it = stashes.find(st.ticket());
    if (it != stashes.end() && it->second.get() == &record) {
      stashes.erase(it);
      s.ForgetTicket(st.ticket());
    }
  }
  if (!record.error.ok()) {
    s.Send(Reply(req.request_id(), record.error));
    return;
  }
  if (plan.placement == kernels::Placement::kInvalidCount) {
    const std::string where = st.count().has_reference()
                                  ? "read from memory " +
                                        std::to_string(st.count().reference().memory_id()) +
                                        " offset " + std::to_string(st.count().reference().offset())
                                  : "given";
    s.Send(Reply(req.request_id(),
                 InvalidArgumentError("the row count " + where + " is " +
                                      std::to_string(static_cast<int64_t>(plan.rows)) +
                                      ": counts must be >= 0; nothing was taken")));
    return;
  }
  v1::SessionResponse r = Reply(req.request_id());
  v1::StashDone* done = r.mutable_stash();
  done->set_ticket(st.ticket());
  done->set_rows(plan.rows);
  if (plan.placement == kernels::Placement::kOverflow) {
    done->set_tier(v1::TIER_OVERFLOW);
    c.overflows.fetch_add(1, std::memory_order_relaxed);
    c.step_overflow.store(true, std::memory_order_relaxed);
    counters_->overflows.fetch_add(1, std::memory_order_relaxed);
    EventLog::Get().Overflow(s.info(), st, plan.rows);
  } else {
    // A stash outside the own pool (a peer pool's or the host tier) counts as a spill.
    const bool spilled = plan.placement != kernels::Placement::kDevice;
    done->set_tier(TierOf(plan.placement));
    done->set_bytes(plan.bytes);
    done->set_pages(plan.pages);
    c.stashes.fetch_add(1, std::memory_order_relaxed);
    c.bytes_stashed.fetch_add(plan.bytes, std::memory_order_relaxed);
    c.stashes_live.fetch_add(1, std::memory_order_relaxed);
    c.pages_live.fetch_add(plan.pages, std::memory_order_relaxed);
    c.bytes_live.fetch_add(plan.bytes, std::memory_order_relaxed);
    s.live_tags().Add(st.ticket(), st.layer(), st.microbatch(), st.name(), plan.bytes, plan.pages);
    counters_->stashes.fetch_add(1, std::memory_order_relaxed);
    counters_->bytes_stashed.fetch_add(plan.bytes, std::memory_order_relaxed);
    if (spilled) {
      c.spills.fetch_add(1, std::memory_order_relaxed);
      c.step_spilled.store(true, std::memory_order_relaxed);
      counters_->spills.fetch_add(1, std::memory_order_relaxed);
      EventLog::Get().Spill(s.info(), st, plan.bytes,
                            plan.placement == kernels::Placement::kPeer
                                ? record.tier->name() + "'s pool (the peer tier)"
                                : std::string("the host tier"));
    }
    if (plan.bytes > 0) counters_->stash_copy.Add(plan.bytes, copy_seconds);
  }
  const uint64_t latency = MicrosSince(received);
  done->set_latency_us(latency);
  counters_->stash_latency_us.Add(static_cast<double>(latency));
  if (counters_->warming.load(std::memory_order_relaxed)) {
    counters_->stashes_while_warming.fetch_add(1, std::memory_order_relaxed);
  }
  s.Send(std::move(r));
}

void Pool::DoReload(const std::shared_ptr<Session>& s, const v1::SessionRequest& req,
                    Clock::time_point received) {
  const v1::Reload& rl = req.reload();
  const DoneSignal done = DoneOf(*s, DoneOfRequest(req));
  // A reload that fails before it took the pages costs nothing: the stash stays, its ticket is
  // live again (before the answer goes out), and a later reload or release finds it.
  auto fail = [&](const Status& status) {
    s->UnclaimTicket(rl.ticket());
    FailAfterDone(s, req.request_id(), status, done);
  };
  auto& stashes = CopyState::Of(*s).stashes;
  auto it = stashes.find(rl.ticket());
  if (it == stashes.end()) {
    // Its stash took nothing and forgot the ticket (which may be live again for a new stash).
    return FailAfterDone(s, req.request_id(),
                         FailedPreconditionError("ticket " + Hex(rl.ticket()) +
                                                 " holds no data: its stash overflowed or "
                                                 "failed, so the data is still in your source "
                                                 "buffer"),
                         done);
  }
  if (Status counters = CheckCounters(*s, req); !counters.ok()) {
    return fail(WithStashKept(counters, rl.ticket()));
  }
  auto dst = CopyState::Of(*s).Resolve(rl.destination());
  if (!dst.ok()) return fail(WithStashKept(dst.status(), rl.ticket()));
  std::shared_ptr<StashRecord> record = std::move(it->second);
  stashes.erase(it);
  s->ForgetTicket(rl.ticket());
  ReloadWork work;
  work.destination = *dst;
  work.zero_tail = rl.zero_tail();
  work.done = done;
  work.record = record.get();
  const auto submitted = Clock::now();
  executor_->Reload(
      work, Track([this, s, req, record, received, submitted] {
        Session& session = *s;
        const v1::Reload& reload = req.reload();
        SessionCounters& c = session.counters();
        c.inflight.fetch_sub(1, std::memory_order_relaxed);
        if (record->tier == nullptr) {
          // Its stash (still in flight when this was submitted) placed nothing.
          session.Send(
              Reply(req.request_id(),
                    FailedPreconditionError("ticket " + Hex(reload.ticket()) +
                                            " holds no data: its stash overflowed or failed, "
                                            "so the data is still in your source buffer")));
          return;
        }
        const kernels::StashPlan& plan = record->plan;
        c.stashes_live.fetch_sub(1, std::memory_order_relaxed);
        c.pages_live.fetch_sub(plan.pages, std::memory_order_relaxed);
        c.bytes_live.fetch_sub(plan.bytes, std::memory_order_relaxed);
        session.live_tags().Remove(reload.ticket());
        c.reloads.fetch_add(1, std::memory_order_relaxed);
        c.bytes_reloaded.fetch_add(plan.bytes, std::memory_order_relaxed);
        counters_->reloads.fetch_add(1, std::memory_order_relaxed);
        counters_->bytes_reloaded.fetch_add(plan.bytes, std::memory_order_relaxed);
        if (plan.bytes > 0) {
          counters_->reload_copy.Add(
              plan.bytes, std::chrono::duration<double>(Clock::now() - submitted).count());
        }
        v1::SessionResponse r = Reply(req.request_id());
        v1::ReloadDone* answer = r.mutable_reload();
        answer->set_ticket(reload.ticket());
        answer->set_rows(plan.rows);
        answer->set_bytes(plan.bytes);
        answer->set_tier(TierOf(plan.placement));
        answer->set_latency_us(MicrosSince(received));
        session.Send(std::move(r));
      }));
}

void Pool::DoRelease(const std::shared_ptr<Session>& s, const v1::SessionRequest& req) {
  const uint64_t ticket = req.release().ticket();
  auto& stashes = CopyState::Of(*s).stashes;
  auto it = stashes.find(ticket);
  if (it == stashes.end()) {
    s->counters().inflight.fetch_sub(1, std::memory_order_relaxed);
    s->Send(Reply(req.request_id(),
                  FailedPreconditionError("ticket " + Hex(ticket) +
                                          " holds no data: its stash overflowed or failed")));
    return;
  }
  std::shared_ptr<StashRecord> record = std::move(it->second);
  stashes.erase(it);
  s->ForgetTicket(ticket);
  ReloadWork work;  // no destination: return the pages only
  work.record = record.get();
  executor_->Reload(
      work, Track([this, s, req, record, ticket] {
        SessionCounters& c = s->counters();
        c.inflight.fetch_sub(1, std::memory_order_relaxed);
        if (record->tier == nullptr) {
          s->Send(Reply(req.request_id(),
                        FailedPreconditionError("ticket " + Hex(ticket) +
                                                " holds no data: its stash overflowed or failed")));
          return;
        }
        c.stashes_live.fetch_sub(1, std::memory_order_relaxed);
        c.pages_live.fetch_sub(record->plan.pages, std::memory_order_relaxed);
        c.bytes_live.fetch_sub(record->plan.bytes, std::memory_order_relaxed);
        s->live_tags().Remove(ticket);
        c.releases.fetch_add(1, std::memory_order_relaxed);
        counters_->releases.fetch_add(1, std::memory_order_relaxed);
        v1::SessionResponse r = Reply(req.request_id());
        r.mutable_release()->set_ticket(ticket);
        r.mutable_release()->set_pages(record->plan.pages);
        s->Send(std::move(r));
      }));
}

void Pool::DoBeginStep(const std::shared_ptr<Session>& s, const v1::SessionRequest& req) {
  // Answered after the session's earlier work finished, so the flags include it.
  executor_->Fence(Track([s, req] {
    SessionCounters& c = s->counters();
    c.inflight.fetch_sub(1, std::memory_order_relaxed);
    v1::SessionResponse r = Reply(req.request_id());
    v1::StepBegun* begun = r.mutable_begin_step();
    begun->set_overflow(c.step_overflow.exchange(false, std::memory_order_relaxed));
    begun->set_spilled(c.step_spilled.exchange(false, std::memory_order_relaxed));
    begun->set_live_stashes(CopyState::Of(*s).stashes.size());
    c.step.store(req.begin_step().step(), std::memory_order_relaxed);
    c.step_begun.store(true, std::memory_order_relaxed);
    s->Send(std::move(r));
  }));
}

void Pool::DoTeardown(const std::shared_ptr<Session>& s, CopyExecutor::Then closed) {
  auto& live = CopyState::Of(*s).stashes;
  const size_t stashes = live.size();
  for (auto& [ticket, record] : live) {
    ReloadWork work;  // release
    work.record = record.get();
    executor_->Reload(
        work, Track([s, record = record] {
          if (record->tier == nullptr) return;
          s->counters().stashes_live.fetch_sub(1, std::memory_order_relaxed);
          s->counters().pages_live.fetch_sub(record->plan.pages, std::memory_order_relaxed);
          s->counters().bytes_live.fetch_sub(record->plan.bytes, std::memory_order_relaxed);
        }));
  }
  live.clear();
  s->live_tags().Clear();
  // The mappings close once the work in flight (and the releases above) finished.
  // Everything submitted before (the session's copies and done writes included) has finished
  // then: only now may its stream end (CloseSession).
  executor_->Fence(Track([s, stashes, closed = std::move(closed)] {
    CopyState::Of(*s).memories.clear();  // unmaps
    s->counters().memories.store(0, std::memory_order_relaxed);
    LogFields fields;
    fields.Add("session", s->info().id.substr(0, 8)).Add("pid", s->info().pid);
    if (s->info().rank >= 0) fields.Add("rank", s->info().rank);
    Log("pool")->info("session {} (rank {}, pid {}) ended: returned {} stashes", s->info().id,
                      s->info().rank, s->info().pid, stashes);
    if (closed) closed();
  }));
}

}  // namespace stash::daemon
