#include "daemon/pool.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <fstream>
#include <string>

#include "common/host_event.h"
#include "common/logging.h"
#include "common/macros.h"
#include "common/text.h"
#include "stash/kernels/paging.h"

namespace stash::daemon {
namespace {

namespace v1 = stash::v1;
using Clock = std::chrono::steady_clock;

// Copies of fewer bytes than this run on the pool worker alone.
constexpr uint64_t kSplitBytes = 4ULL << 20;

uint64_t MicrosSince(Clock::time_point t) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t).count());
}

v1::SessionResponse Reply(uint64_t request_id, const Status& status = Status::Ok()) {
  v1::SessionResponse r;
  r.set_request_id(request_id);
  r.set_code(static_cast<int>(status.code()));
  r.set_message(status.message());
  return r;
}

// The mapped bytes of `ref` in the session's memory, or why not. Ranges were checked against the
// registered size before queueing; this only fails when the registration itself failed.
StatusOr<uint8_t*> Resolve(Session& s, const v1::MemoryRef& ref) {
  auto it = s.memories().find(ref.memory_id());
  if (it == s.memories().end()) {
    return NotFoundError("memory " + std::to_string(ref.memory_id()) +
                         " is not registered in this session");
  }
  const ClientMemory& m = it->second;
  if (m.mapping == nullptr) {
    return FailedPreconditionError("memory " + std::to_string(ref.memory_id()) +
                                   " could not be opened: " + m.open_status.message());
  }
  return m.mapping->data() + ref.offset();
}

const v1::EventRef* ReadyOf(const v1::SessionRequest& req) {
  if (req.has_stash() && req.stash().has_ready()) return &req.stash().ready();
  if (req.has_reload() && req.reload().has_ready()) return &req.reload().ready();
  return nullptr;
}

void SignalDone(Session& s, const v1::EventRef& done) {
  if (!done.has_counter()) return;
  auto ptr = Resolve(s, done.counter());
  if (ptr.ok()) EventSignal(reinterpret_cast<uint64_t*>(*ptr), done.value());
}

// Whether process `pid` has exited: no such process, or a zombie its parent has not reaped yet.
bool ProcessGone(int64_t pid) {
  if (pid <= 0) return false;
  if (kill(static_cast<pid_t>(pid), 0) != 0) return errno == ESRCH;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const auto paren = line.rfind(')');  // the command name may contain spaces and parentheses
  if (paren == std::string::npos || paren + 2 >= line.size()) return false;
  const char state = line[paren + 2];
  return state == 'Z' || state == 'X';
}

}  // namespace

Pool::Pool(int index, Tier* device, Tier* host, CopyWorkers* workers, DaemonCounters* counters)
    : index_(index), device_(device), host_(host), workers_(workers), counters_(counters) {
  worker_ = std::thread([this] { Run(); });
}

Pool::~Pool() { Stop(); }

void Pool::Enqueue(std::shared_ptr<Session> session, v1::SessionRequest request,
                   Clock::time_point received) {
  session->counters().inflight.fetch_add(1, std::memory_order_relaxed);
  MutexLock lock(&mu_);
  queue_.push_back(Op{std::move(session), std::move(request), received, false});
  cv_.Signal();
}

void Pool::CloseSession(const std::shared_ptr<Session>& session) {
  session->MarkClosed();
  session->DetachSink();
  MutexLock lock(&mu_);
  const auto before = queue_.size();
  queue_.erase(std::remove_if(queue_.begin(), queue_.end(),
                              [&](const Op& op) { return op.session == session; }),
               queue_.end());
  session->counters().inflight.fetch_sub(before - queue_.size(), std::memory_order_relaxed);
  queue_.push_back(Op{session, {}, Clock::now(), true});
  cv_.Signal();
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
  auto ptr = Resolve(*op.session, ready->counter());
  if (!ptr.ok()) return true;  // Execute reports the error
  return EventReached(reinterpret_cast<const uint64_t*>(*ptr), ready->value());
}

void Pool::SweepOrphans() {
  const auto now = Clock::now();
  orphans_.erase(std::remove_if(orphans_.begin(), orphans_.end(),
                                [&](const Orphan& o) {
                                  if (ProcessGone(o.pid)) {
                                    for (const std::string& name : o.names) {
                                      shm_unlink(name.c_str());
                                    }
                                    return true;
                                  }
                                  return now >= o.until;
                                }),
                 orphans_.end());
}

void Pool::Run() {
  auto backoff = std::chrono::microseconds(20);
  while (true) {
    Op op;
    {
      MutexLock lock(&mu_);
      bool found = false;
      while (!found) {
        if (!orphans_.empty()) SweepOrphans();
        if (queue_.empty()) {
          if (stopping_) return;
          if (orphans_.empty()) {
            cv_.Wait(&mu_);
          } else {
            cv_.WaitWithTimeout(&mu_, std::chrono::milliseconds(20));
          }
          continue;
        }
        // The first op whose session has no earlier op still waiting for its ready event.
        std::vector<const Session*> blocked;
        for (auto it = queue_.begin(); it != queue_.end(); ++it) {
          const Session* s = it->session.get();
          if (std::find(blocked.begin(), blocked.end(), s) != blocked.end()) continue;
          if (Ready(*it)) {
            op = std::move(*it);
            queue_.erase(it);
            found = true;
            break;
          }
          blocked.push_back(s);
        }
        if (!found) {
          // Everything waits on client events, which do not wake us: poll with backoff.
          if (stopping_) {
            // Shutting down: nobody will signal them now.
            for (Op& dropped : queue_) {
              dropped.session->counters().inflight.fetch_sub(1, std::memory_order_relaxed);
            }
            queue_.clear();
            continue;
          }
          cv_.WaitWithTimeout(&mu_, backoff);
          backoff = std::min(backoff * 2, std::chrono::microseconds(1000));
        }
      }
    }
    backoff = std::chrono::microseconds(20);
    Execute(op);
  }
}

void Pool::Execute(Op& op) {
  Session& s = *op.session;
  if (op.teardown) {
    DoTeardown(s);
    return;
  }
  const v1::SessionRequest& req = op.request;
  switch (req.kind_case()) {
    case v1::SessionRequest::kRegisterMemory:
      DoRegister(s, req);
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
      s.Send(Reply(req.request_id(), InternalError("request kind reached the pool unvalidated")));
      break;
  }
  s.counters().inflight.fetch_sub(1, std::memory_order_relaxed);
}

void Pool::DoRegister(Session& s, const v1::SessionRequest& req) {
  const v1::RegisterMemory& reg = req.register_memory();
  const auto start = Clock::now();
  ClientMemory memory;
  memory.bytes = reg.bytes();
  auto mapping = SharedMemory::Open(reg.handle(), reg.bytes());
  if (mapping.ok()) {
    memory.mapping = std::move(mapping).value();
  } else {
    memory.open_status = mapping.status();
  }
  const Status status = memory.open_status;
  s.memories()[reg.memory_id()] = std::move(memory);
  if (!status.ok()) {
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

void Pool::DoUnregister(Session& s, const v1::SessionRequest& req) {
  auto it = s.memories().find(req.unregister_memory().memory_id());
  if (it != s.memories().end()) {
    if (it->second.mapping != nullptr) {
      s.counters().memories.fetch_sub(1, std::memory_order_relaxed);
    }
    s.memories().erase(it);
  }
  s.Send(Reply(req.request_id()));
}

void Pool::DoStash(Session& s, const v1::SessionRequest& req, Clock::time_point received) {
  const v1::Stash& st = req.stash();
  auto fail = [&](const Status& status) {
    s.ForgetTicket(st.ticket());
    s.Send(Reply(req.request_id(), status));
  };
  auto src = Resolve(s, st.source());
  if (!src.ok()) return fail(src.status());

  // The count is read only now, after the ready event: the sync-free case.
  int64_t count = 0;
  if (st.count().has_reference()) {
    auto ptr = Resolve(s, st.count().reference());
    if (!ptr.ok()) return fail(ptr.status());
    std::memcpy(&count, *ptr, sizeof(count));
  } else {
    count = static_cast<int64_t>(st.count().value());
  }

  Tier* host = (s.info().allow_host_spill && host_ != nullptr) ? host_ : nullptr;
  StashRecord record;
  record.row_bytes = st.row_bytes();
  record.max_rows = st.max_rows();
  kernels::StashPlan plan{};
  const auto copy_start = Clock::now();
  {
    // Lock order: the pool's own tier, then the shared host tier.
    device_->mu().Lock();
    if (host != nullptr) host->mu().Lock();
    plan = kernels::PlanStash(count, st.count().divisor(), st.max_rows(), st.row_bytes(),
                              device_->page_bytes(), device_->ring(),
                              host != nullptr ? &host->ring() : nullptr);
    Tier* chosen = nullptr;
    if (plan.placement == kernels::Placement::kDevice) {
      chosen = device_;
      if (host != nullptr) host->mu().Unlock();
    } else if (plan.placement == kernels::Placement::kHost) {
      chosen = host;
      device_->mu().Unlock();
    } else {
      if (host != nullptr) host->mu().Unlock();
      device_->mu().Unlock();
    }
    if (chosen != nullptr) {
      record.tier = chosen;
      record.rows = plan.rows;
      record.bytes = plan.bytes;
      record.page_record.resize(plan.pages);
      const kernels::PagedSpan span{chosen->base(), chosen->page_bytes(), record.page_record.data(),
                                    plan.bytes};
      const kernels::PageRing& ring = chosen->ring();
      const uint8_t* source = *src;
      const uint64_t min_slots = std::max<uint64_t>(1, kSplitBytes / chosen->page_bytes());
      workers_->ParallelFor(plan.pages, min_slots, [&](uint64_t first, uint64_t end) {
        kernels::StashPages(source, ring, plan.head, span, first, end);
      });
      // Every worker has read the old head: publish the new one.
      chosen->PublishAlloc(plan.pages, plan.bytes);
      chosen->mu().Unlock();
    }
  }
  const double copy_seconds = std::chrono::duration<double>(Clock::now() - copy_start).count();

  SessionCounters& c = s.counters();
  if (plan.placement == kernels::Placement::kInvalidCount) {
    return fail(InvalidArgumentError(
        "the row count read from memory " + std::to_string(st.count().reference().memory_id()) +
        " offset " + std::to_string(st.count().reference().offset()) + " is " +
        std::to_string(count) + ": counts must be >= 0; nothing was taken"));
  }
  v1::SessionResponse r = Reply(req.request_id());
  v1::StashDone* done = r.mutable_stash();
  done->set_ticket(st.ticket());
  done->set_rows(plan.rows);
  if (plan.placement == kernels::Placement::kOverflow) {
    s.ForgetTicket(st.ticket());
    done->set_tier(v1::TIER_OVERFLOW);
    c.overflows.fetch_add(1, std::memory_order_relaxed);
    c.step_overflow.store(true, std::memory_order_relaxed);
    counters_->overflows.fetch_add(1, std::memory_order_relaxed);
  } else {
    const bool spilled = plan.placement == kernels::Placement::kHost;
    done->set_tier(spilled ? v1::TIER_HOST : v1::TIER_DEVICE);
    done->set_bytes(plan.bytes);
    done->set_pages(plan.pages);
    c.stashes.fetch_add(1, std::memory_order_relaxed);
    c.bytes_stashed.fetch_add(plan.bytes, std::memory_order_relaxed);
    c.stashes_live.fetch_add(1, std::memory_order_relaxed);
    c.pages_live.fetch_add(plan.pages, std::memory_order_relaxed);
    counters_->stashes.fetch_add(1, std::memory_order_relaxed);
    counters_->bytes_stashed.fetch_add(plan.bytes, std::memory_order_relaxed);
    if (spilled) {
      c.spills.fetch_add(1, std::memory_order_relaxed);
      c.step_spilled.store(true, std::memory_order_relaxed);
      counters_->spills.fetch_add(1, std::memory_order_relaxed);
    }
    if (plan.bytes > 0) counters_->stash_copy.Add(plan.bytes, copy_seconds);
    s.stashes()[st.ticket()] = std::move(record);
  }
  if (st.has_done()) SignalDone(s, st.done());
  const uint64_t latency = MicrosSince(received);
  done->set_latency_us(latency);
  counters_->stash_latency_us.Add(static_cast<double>(latency));
  s.Send(std::move(r));
}

void Pool::FreeStash(Session& s, StashRecord& record) {
  Tier* tier = record.tier;
  {
    MutexLock lock(&tier->mu());
    kernels::ReturnPages(tier->ring(), tier->ring().tail, record.page_record.data(), 0,
                         record.page_record.size());
    tier->PublishFree(record.page_record.size(), record.bytes);
  }
  s.counters().stashes_live.fetch_sub(1, std::memory_order_relaxed);
  s.counters().pages_live.fetch_sub(record.page_record.size(), std::memory_order_relaxed);
}

void Pool::DoReload(Session& s, const v1::SessionRequest& req, Clock::time_point received) {
  const v1::Reload& rl = req.reload();
  auto it = s.stashes().find(rl.ticket());
  if (it == s.stashes().end()) {
    s.Send(Reply(req.request_id(),
                 FailedPreconditionError("ticket " + Hex(rl.ticket()) +
                                         " holds no data: its stash overflowed or failed, so "
                                         "the data is still in your source buffer")));
    return;
  }
  auto dst = Resolve(s, rl.destination());
  if (!dst.ok()) {
    // The stash stays: the client may reload it into another buffer.
    s.Send(Reply(req.request_id(), dst.status()));
    return;
  }
  StashRecord& record = it->second;
  Tier* tier = record.tier;
  const auto copy_start = Clock::now();
  {
    MutexLock lock(&tier->mu());
    const kernels::PagedSpan span{tier->base(), tier->page_bytes(), record.page_record.data(),
                                  record.bytes};
    uint8_t* destination = *dst;
    const uint64_t min_slots = std::max<uint64_t>(1, kSplitBytes / tier->page_bytes());
    workers_->ParallelFor(record.page_record.size(), min_slots, [&](uint64_t first, uint64_t end) {
      kernels::PopPages(destination, span, first, end);
    });
    if (rl.zero_tail()) {
      kernels::ZeroBytes(destination, record.bytes, record.max_rows * record.row_bytes);
    }
  }
  const double copy_seconds = std::chrono::duration<double>(Clock::now() - copy_start).count();
  FreeStash(s, record);  // the copy is done: the pages go back

  v1::SessionResponse r = Reply(req.request_id());
  v1::ReloadDone* done = r.mutable_reload();
  done->set_ticket(rl.ticket());
  done->set_rows(record.rows);
  done->set_bytes(record.bytes);
  done->set_tier(tier == device_ ? v1::TIER_DEVICE : v1::TIER_HOST);
  SessionCounters& c = s.counters();
  c.reloads.fetch_add(1, std::memory_order_relaxed);
  c.bytes_reloaded.fetch_add(record.bytes, std::memory_order_relaxed);
  counters_->reloads.fetch_add(1, std::memory_order_relaxed);
  counters_->bytes_reloaded.fetch_add(record.bytes, std::memory_order_relaxed);
  if (record.bytes > 0) counters_->reload_copy.Add(record.bytes, copy_seconds);
  s.stashes().erase(it);
  if (rl.has_done()) SignalDone(s, rl.done());
  done->set_latency_us(MicrosSince(received));
  s.Send(std::move(r));
}

void Pool::DoRelease(Session& s, const v1::SessionRequest& req) {
  const uint64_t ticket = req.release().ticket();
  auto it = s.stashes().find(ticket);
  if (it == s.stashes().end()) {
    s.Send(Reply(req.request_id(),
                 FailedPreconditionError("ticket " + Hex(ticket) +
                                         " holds no data: its stash overflowed or failed")));
    return;
  }
  const uint64_t pages = it->second.page_record.size();
  FreeStash(s, it->second);
  s.stashes().erase(it);
  s.counters().releases.fetch_add(1, std::memory_order_relaxed);
  counters_->releases.fetch_add(1, std::memory_order_relaxed);
  v1::SessionResponse r = Reply(req.request_id());
  r.mutable_release()->set_ticket(ticket);
  r.mutable_release()->set_pages(pages);
  s.Send(std::move(r));
}

void Pool::DoBeginStep(Session& s, const v1::SessionRequest& req) {
  SessionCounters& c = s.counters();
  v1::SessionResponse r = Reply(req.request_id());
  v1::StepBegun* begun = r.mutable_begin_step();
  begun->set_overflow(c.step_overflow.exchange(false, std::memory_order_relaxed));
  begun->set_spilled(c.step_spilled.exchange(false, std::memory_order_relaxed));
  begun->set_live_stashes(s.stashes().size());
  s.Send(std::move(r));
}

void Pool::DoTeardown(Session& s) {
  uint64_t pages = 0;
  for (auto& [ticket, record] : s.stashes()) {
    pages += record.page_record.size();
    FreeStash(s, record);
  }
  const size_t stashes = s.stashes().size();
  s.stashes().clear();
  // A client that died cannot unlink the shared memory it created: do it for it, or the names
  // would stay in /dev/shm until reboot. A live client (it merely closed the session) keeps them.
  // Only names the client created itself ("/stashd-<its pid>-..."): a session cannot make the
  // daemon unlink another process's memory.
  const std::string own_prefix = "/stashd-" + std::to_string(s.info().pid) + "-";
  std::vector<std::string> names;
  {
    MutexLock lock(&s.mu());
    for (const std::string& name : s.registered_names()) {
      if (name.rfind(own_prefix, 0) == 0 && name.find('/', 1) == std::string::npos) {
        names.push_back(name);
      }
    }
  }
  if (!names.empty()) {
    MutexLock lock(&mu_);
    orphans_.push_back(
        Orphan{s.info().pid, std::move(names), Clock::now() + std::chrono::seconds(5)});
    SweepOrphans();
  }
  s.memories().clear();  // unmaps
  s.counters().memories.store(0, std::memory_order_relaxed);
  Log("pool")->info("session {} (rank {}, pid {}) ended: returned {} stashes, {} pages",
                    s.info().id, s.info().rank, s.info().pid, stashes, pages);
}

}  // namespace stash::daemon
