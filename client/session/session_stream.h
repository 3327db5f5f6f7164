// The gRPC session stream of one client session (stash/v1/stash.proto, StashService.Session):
// Hello and Welcome, then, in daemon-copy mode, every data-path request and its answer. Both
// modes open one: a mapped session's stream carries only the Hello and is the session's identity
// and lifetime (client/mapped/mapped_session.h).
//
// In daemon-copy mode a thread of the stream's own (the writer) takes submitted operations in
// order, hands the memfds they need to the daemon over the descriptor channel and writes them on
// the stream: Submit() only queues, so Stash() and Reload() never wait on a descriptor round
// trip or on gRPC's write path. A caller that waits for an operation the writer has not taken
// yet writes it itself (Wait): it would only sleep meanwhile, and the round trip is spared the
// writer's wake-up.
//
// Thread-safe: members marked "guarded by mu" are read and written under `mu`; the rest never
// change after Open().
#ifndef STASH_CLIENT_SESSION_STREAM_H_
#define STASH_CLIENT_SESSION_STREAM_H_

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "client/memory/cuda_memory.h"
#include "client/memory/host_buffer_rep.h"
#include "client/session/argument_checks.h"
#include "client/session/descriptor_channel.h"
#include "common/grpc_status.h"
#include "common/host_event.h"
#include "common/macros.h"
#include "common/random.h"
#include "common/shm.h"
#include "common/write_queue.h"
#include "stash/client.h"
#include "stash/v1/stash.grpc.pb.h"

namespace stash::client {

// The daemon's tier enum as the client's.
Tier FromProtoTier(v1::Tier tier);

struct SessionStream final
    : public grpc::ClientBidiReactor<v1::SessionRequest, v1::SessionResponse> {
  // Connects to the daemon of `options` and says Hello with `mode`; `cuda` (cuda backend only,
  // else null) names the device. UNAVAILABLE / PERMISSION_DENIED / the daemon's refusal as
  // Client::Open documents them.
  static StatusOr<std::unique_ptr<SessionStream>> Open(const Options& options, v1::Mode mode,
                                                       std::shared_ptr<CudaSide> cuda);
  // Ends the session (Close()).
  ~SessionStream() override;
  // Ends the stream: the writer hands over what was submitted, then a half-close that waits
  // (bounded) until the daemon finished the session's work, then a cancel; returns once gRPC is
  // done with this object. Idempotent.
  void Close();
  // Asks the daemon for this session's counters and its pool usage (GetStats).
  StatusOr<SessionStats> Stats();
  // Whether the stream is gone (the daemon ended it or died).
  bool broken_now() const {
    std::lock_guard<std::mutex> lock(mu);
    return broken;
  }
  // Whether the daemon said it drains (a DaemonState message; stashctl drain, undrain).
  bool draining_now() const {
    std::lock_guard<std::mutex> lock(mu);
    return draining;
  }
  // Whether a stash is answered by the library (kept by the caller, no flag): the daemon drains,
  // and the stream lives or broke with nothing of ours lost. A stream that broke holding stashes
  // lost them: stashes fail UNAVAILABLE there, so the step is flagged.
  bool keeps_stashes() const {
    std::lock_guard<std::mutex> lock(mu);
    return draining && (!broken || live.empty());
  }
  // Draining, and nothing is left to wait for: no stash live, no operation pending. Such a
  // session may end: the rank lost nothing.
  bool drained_now() const {
    std::lock_guard<std::mutex> lock(mu);
    return draining && !broken && live.empty() && pending.empty();
  }
  // Whether `op` is an operation of this stream not yet handed out.
  bool holds(uint64_t op) const {
    std::lock_guard<std::mutex> lock(mu);
    return pending.count(op) != 0;
  }
  // Whether any operation of this stream is not yet handed out.
  bool holds_any() const {
    std::lock_guard<std::mutex> lock(mu);
    return !pending.empty();
  }
  // Whether Wait(op) would return at once: `op` is answered, unknown, or the stream broke.
  bool answered_now(uint64_t op) const {
    std::lock_guard<std::mutex> lock(mu);
    auto it = pending.find(op);
    return it == pending.end() || it->second.answered || broken;
  }
  // Whether `ticket` is a stash this session holds (answered, not yet reloaded or released).
  bool holds_stash(uint64_t ticket) const {
    std::lock_guard<std::mutex> lock(mu);
    return live.count(ticket) != 0;
  }
  // As Client::Wait, for an operation of this stream. A reload the broken session never
  // answered fails UNAVAILABLE with LostStash's words.
  StatusOr<Completion> Wait(uint64_t op, int64_t timeout_ms);
  // The error text of a reload or release of `ticket`, a stash of this session, once the
  // session is gone: names the ticket, the session, that the daemon went away after the stash,
  // and `why` (the stream's own status).
  std::string LostStash(uint64_t ticket, const std::string& why) const;

  // An operation's done event, which the library also raises itself: once the operation is
  // answered, or when the session breaks. So a stream waiting on it goes on even when the daemon
  // could not raise it (a rejected request, done memory it failed to open, a daemon that died).
  struct DoneEvent {
    std::shared_ptr<SharedMemory> memory;  // null = none; kept mapped until raised
    uint64_t offset = 0;
    uint64_t value = 0;
  };
  // The operations waiting on one counter, in submission order. The library raises the counter
  // only to the value of the last operation of the answered prefix: an answer means that
  // operation's copy (and its own write of the counter) is over, but an earlier operation's
  // copy may still run, and a waiter must not pass it. (Counters only grow, values go up in
  // submission order.)
  struct DoneQueue {
    std::shared_ptr<SharedMemory> memory;
    uint64_t offset = 0;
    struct Slot {
      uint64_t op = 0;
      uint64_t value = 0;
      bool answered = false;
    };
    std::deque<Slot> slots;

    void Raise(uint64_t value) const {
      EventSignal(reinterpret_cast<uint64_t*>(memory->data() + offset), value);
    }
  };
  using DoneKey = std::pair<const SharedMemory*, uint64_t>;

  struct Pending {
    Completion::Kind kind = Completion::Kind::kStash;
    uint64_t epoch = 0;                // the step it was sent in
    uint64_t ticket = 0;               // reload, release: the stash it names
    uint64_t memory_id = 0;            // register ops
    std::vector<uint64_t> memory_ids;  // the memory the op names (registered just before it)
    bool internal = false;             // nobody waits: register / unregister bookkeeping
    bool answered = false;
    Status status;
    Completion completion;
    bool has_done = false;  // the op is in done_queues[done_key]
    DoneKey done_key;
  };

  // Queues `op`'s done event (lock held).
  void TrackDoneLocked(uint64_t op, DoneEvent event, Pending& p) {
    if (event.memory == nullptr) return;
    p.has_done = true;
    p.done_key = {event.memory.get(), event.offset};
    DoneQueue& q = done_queues[p.done_key];
    if (q.memory == nullptr) {
      q.memory = std::move(event.memory);
      q.offset = event.offset;
    }
    q.slots.push_back({op, event.value, false});
  }

  // `op` was answered: raises its counter as far as the answered prefix reaches (lock held).
  void DoneAnsweredLocked(uint64_t op, const Pending& p) {
    if (!p.has_done) return;
    auto it = done_queues.find(p.done_key);
    if (it == done_queues.end()) return;
    DoneQueue& q = it->second;
    for (DoneQueue::Slot& slot : q.slots) {
      if (slot.op == op) slot.answered = true;
    }
    uint64_t raise = 0;
    while (!q.slots.empty() && q.slots.front().answered) {
      raise = std::max(raise, q.slots.front().value);
      q.slots.pop_front();
    }
    if (raise != 0) q.Raise(raise);
    if (q.slots.empty()) done_queues.erase(it);
  }

  // The session is over: nothing will copy any more, every done event goes up (lock held).
  void ReleaseDoneEventsLocked() {
    for (auto& [key, q] : done_queues) {
      uint64_t raise = 0;
      for (const DoneQueue::Slot& slot : q.slots) raise = std::max(raise, slot.value);
      if (raise != 0) q.Raise(raise);
    }
    done_queues.clear();
  }

  // One region the daemon opens: a HostBuffer (its memfd goes over the descriptor channel) or a
  // cudaMalloc allocation (its IPC handle goes in the RegisterMemory).
  struct MemoryDesc {
    uint64_t id = 0;
    v1::MemoryKind kind = v1::MEMORY_KIND_HOST_FD;
    std::string handle;
    uint64_t bytes = 0;
    // MEMORY_KIND_HOST_FD: the HostBuffer's memfd, kept open while it is handed over even if
    // the caller frees the buffer meanwhile.
    std::shared_ptr<SharedMemory> memory;
  };

  static MemoryDesc HostMemory(const HostBuffer& buffer);

  // One submitted operation on its way to the wire, queued for the writer thread.
  struct Outgoing {
    uint64_t op = 0;  // the request id of the operation (the last request of `batch`)
    // Unregisters of stale allocations, registers of the memory new to the session, then the
    // operation itself: written in this order, with nothing of another operation between.
    std::vector<v1::SessionRequest> batch;
    // The host memory `batch` registers: its memfds go to the daemon before the batch is
    // written. Keeps each memfd open even if the caller frees its buffer meanwhile.
    std::vector<MemoryDesc> deposits;
    std::vector<uint64_t> memory_ids;  // every memory the operation names
    // Not OK once a memory the operation names could not be handed to the daemon: the operation
    // is answered with this status instead of being sent.
    Status failed;
  };

  // Sets the ready and done events of `op` (a Stash or Reload; only those given: an empty
  // EventRef would be a bad request), adds their memory to `memories`, and returns the done
  // event as the library keeps it.
  template <typename Op>
  static DoneEvent SetEvents(const EventPoint& ready, const EventPoint& done, Op* op,
                             std::vector<MemoryDesc>& memories) {
    if (ready.buffer != nullptr) {
      SetEvent(ready, op->mutable_ready());
      memories.push_back(HostMemory(*ready.buffer));
    }
    if (done.buffer == nullptr) return {};
    SetEvent(done, op->mutable_done());
    memories.push_back(HostMemory(*done.buffer));
    return DoneEvent{HostMemory(*done.buffer).memory, done.offset, done.value};
  }

  static void SetEvent(const EventPoint& e, v1::EventRef* out) {
    out->mutable_counter()->set_memory_id(e.buffer->id());
    out->mutable_counter()->set_offset(e.offset);
    out->set_value(e.value);
  }

  bool started = false;  // StartCall ran: Close() must wait for OnDone; owner thread only
  bool closed = false;   // Close() ran; owner thread only

  // Never change after Open().
  Backend backend = Backend::kHost;
  // Cuda backend only; shared by the sessions of one Client (a reconnect keeps it).
  std::shared_ptr<CudaSide> cuda;
  std::string socket;
  std::unique_ptr<DescriptorChannel> descriptors;  // set once welcomed
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::StashService::Stub> stub;
  v1::Welcome welcome;
  bool has_writer = false;  // daemon-copy: the writer thread runs from the end of Open()

  grpc::ClientContext context;
  v1::SessionResponse incoming;  // read side only
  WriteQueue<v1::SessionRequest> writes{[this](const v1::SessionRequest* r) { StartWrite(r); }};
  // The writer (daemon-copy sessions only): started at the end of Open(), joined by Close().
  std::thread writer;

  mutable std::mutex mu;
  std::condition_variable cv;
  bool broken = false;                            // guarded by mu
  Status broken_status;                           // guarded by mu
  bool done = false;                              // guarded by mu: OnDone ran
  std::unordered_map<uint64_t, Pending> pending;  // guarded by mu
  std::unordered_set<uint64_t> registered;        // buffer ids; guarded by mu
  // Why the last registration of a buffer id was refused, until one succeeds: an op that named
  // it fails with that reason, not the daemon's later "not registered". Guarded by mu.
  std::unordered_map<uint64_t, Status> register_refused;
  std::map<DoneKey, DoneQueue> done_queues;  // guarded by mu
  // Tickets of the stashes this session holds (answered in a tier, not yet reloaded or
  // released): what is lost when the session breaks. Guarded by mu.
  std::unordered_set<uint64_t> live;
  bool draining = false;      // guarded by mu: the daemon's last DaemonState said it drains
  uint64_t epoch = 0;         // guarded by mu
  StepFlags flags;            // guarded by mu
  bool welcomed = false;      // guarded by mu
  bool hold_removed = false;  // guarded by mu
  IdSequence ids;             // guarded by mu: request ids, tickets
  // Submitted operations the writer (or a waiter: Wait) has not taken yet, in submission order.
  // Each operation is here or in `writes`, never both: it moves on as soon as its memfds are
  // handed over, so this adds no bound and no buffering of its own. Guarded by mu.
  std::deque<Outgoing> outgoing;
  // The writer waits here for `outgoing`, `writer_stop`, or `writing` to clear.
  std::condition_variable writer_cv;
  bool writer_sleeping = false;  // guarded by mu: the writer waits on writer_cv
  // Guarded by mu: a thread is in WriteOne (the writer, or a caller waiting for an operation it
  // queued: Wait), so operations go out one at a time, in order.
  bool writing = false;
  bool writer_stop = false;  // guarded by mu: Close() ran; Submit refuses
  // Guarded by mu: after Close() ran, memory not handed over by then is not tried any more (its
  // operations fail), so a daemon that stopped answering holds up Close() by kCloseDrainTimeout
  // plus one descriptor round trip at most.
  std::chrono::steady_clock::time_point writer_give_up =
      std::chrono::steady_clock::time_point::max();

  // Queues requests in order (lock held, so batches of different threads stay apart). Returns
  // whether the caller must Kick the writer after unlocking; false with `accepted` false when
  // the stream is gone.
  bool QueueLocked(std::vector<v1::SessionRequest>& requests, bool* accepted) {
    return writes.Enqueue(requests, accepted);
  }

  // A request id (a stash's ticket) no pending operation of this stream has (lock held).
  uint64_t NextIdLocked() {
    uint64_t id = ids.Next();
    while (pending.count(id) != 0) id = ids.Next();  // the Hello's, drawn elsewhere
    return id;
  }

  // Adds an internal (nobody waits) request to `out` (lock held).
  void AddInternalLocked(v1::SessionRequest r, Completion::Kind kind, uint64_t memory_id,
                         std::vector<v1::SessionRequest>& out) {
    r.set_request_id(NextIdLocked());
    Pending p;
    p.kind = kind;
    p.memory_id = memory_id;
    p.internal = true;
    pending.emplace(r.request_id(), p);
    out.push_back(std::move(r));
  }

  // Adds a RegisterMemory for `memory` unless it is registered (lock held). Returns whether it
  // added one.
  bool RegisterLocked(const MemoryDesc& memory, std::vector<v1::SessionRequest>& out) {
    if (registered.count(memory.id) != 0) return false;
    registered.insert(memory.id);
    v1::SessionRequest r;
    v1::RegisterMemory* reg = r.mutable_register_memory();
    reg->set_memory_id(memory.id);
    reg->set_kind(memory.kind);
    reg->set_handle(memory.handle);
    reg->set_bytes(memory.bytes);
    if (memory.kind == v1::MEMORY_KIND_CUDA_IPC) {
      reg->set_device(cuda->device());
      reg->set_device_uuid(cuda->uuid());
    }
    AddInternalLocked(std::move(r), Completion::Kind::kRegister, memory.id, out);
    return true;
  }

  // Adds an UnregisterMemory for `memory_id` if it is registered (lock held).
  void UnregisterLocked(uint64_t memory_id, std::vector<v1::SessionRequest>& out) {
    if (memory_id == 0 || registered.erase(memory_id) == 0) return;
    v1::SessionRequest r;
    r.mutable_unregister_memory()->set_memory_id(memory_id);
    AddInternalLocked(std::move(r), Completion::Kind::kUnregister, memory_id, out);
  }

  // Who writes a submitted operation when the writer sleeps.
  enum class Writer {
    kSessionThread,  // the writer is woken: the caller goes on (Stash, Reload)
    // The caller Waits for it next (StashAndWait, ReloadAndWait): the writer sleeps on, and the
    // caller's Wait writes it, or wakes the writer for it when it must not (a memfd to hand
    // over first, a write running).
    kCallerWaits,
  };
  // Queues `request` for the writer (after unregistering `stale` allocations and registering the
  // memory it names that is new to the session) and tracks it as `kind`. Sets the request id (and
  // a stash's ticket, the same) and returns it at once: what the writer finds later (a memfd the
  // daemon would not take, a stream that broke meanwhile) is that operation's answer, through Wait.
  StatusOr<uint64_t> Submit(v1::SessionRequest request, Completion::Kind kind,
                            const std::vector<MemoryDesc>& memories,
                            const std::vector<uint64_t>& stale, DoneEvent done_event,
                            Writer writer_of = Writer::kSessionThread) {
    uint64_t id = 0;
    bool wake = false;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (broken) return broken_status;
      if (writer_stop) return UnavailableError("stashd on " + socket + " went away");
      STASH_CHECK(has_writer) << "Submit on a session stream without a writer (mapped mode)";
      Outgoing job;
      for (uint64_t old : stale) UnregisterLocked(old, job.batch);
      for (const MemoryDesc& m : memories) {
        if (RegisterLocked(m, job.batch) && m.memory != nullptr) job.deposits.push_back(m);
      }
      id = NextIdLocked();
      request.set_request_id(id);
      if (request.has_stash()) request.mutable_stash()->set_ticket(id);  // ticket == request id
      Pending p;
      p.kind = kind;
      p.epoch = epoch;
      for (const MemoryDesc& m : memories) p.memory_ids.push_back(m.id);
      if (request.has_reload()) p.ticket = request.reload().ticket();
      if (request.has_release()) p.ticket = request.release().ticket();
      TrackDoneLocked(id, std::move(done_event), p);
      job.op = id;
      job.memory_ids = p.memory_ids;
      pending.emplace(id, std::move(p));
      job.batch.push_back(std::move(request));
      outgoing.push_back(std::move(job));
      wake = writer_sleeping && writer_of == Writer::kSessionThread;
      if (wake) writer_sleeping = false;
    }
    if (wake) writer_cv.notify_one();
    return id;
  }

  // The writer thread: runs WriteOne for each queued operation in order until StopWriter.
  void WriterLoop();
  // Takes the oldest queued operation and writes it (`lock` holds mu, released meanwhile).
  void WriteFront(std::unique_lock<std::mutex>& lock);
  // Hands `job`'s memfds to the daemon and writes its batch (the writer, or a waiter: Wait;
  // one at a time, `writing` set).
  void WriteOne(Outgoing job);
  // Lets the writer hand over everything queued, then ends it (owner thread; Close).
  void StopWriter();

  void OnWriteDone(bool ok) override { writes.OnWriteDone(ok); }

  void OnReadDone(bool ok) override {
    if (!ok) {
      std::lock_guard<std::mutex> lock(mu);
      if (!broken) {
        broken = true;
        broken_status = UnavailableError("stashd on " + socket + " ended the session");
      }
      ReleaseDoneEventsLocked();
      WakeWriterToDropLocked();
      cv.notify_all();
      return;
    }
    Dispatch(incoming);
    incoming.Clear();
    StartRead(&incoming);
  }

  void OnDone(const grpc::Status& status) override {
    std::lock_guard<std::mutex> lock(mu);
    if (!welcomed && !status.ok()) {
      // The daemon refused the Hello: its status says why.
      broken = true;
      broken_status = FromGrpcStatus(status);
    } else if (!broken || !status.ok()) {
      broken = true;
      broken_status =
          UnavailableError("stashd on " + socket + " went away" +
                           (status.ok() ? std::string() : ": " + status.error_message()) +
                           "; your buffers are untouched, reconnect when it is back");
    }
    done = true;
    ReleaseDoneEventsLocked();
    WakeWriterToDropLocked();
    cv.notify_all();
  }

  // The stream broke: a writer left asleep with operations queued (their callers' Waits returned
  // at once) takes them now, sending nothing, so the memfds they hold close (lock held).
  void WakeWriterToDropLocked() {
    if (writer_sleeping && !outgoing.empty()) writer_cv.notify_one();
  }

  void Dispatch(const v1::SessionResponse& r) {
    std::lock_guard<std::mutex> lock(mu);
    if (r.request_id() == 0) {
      // Told by the daemon, not an answer: its drain state.
      if (r.has_daemon_state()) draining = r.daemon_state().draining();
      return;
    }
    auto it = pending.find(r.request_id());
    if (it == pending.end()) return;  // an answer nobody tracks (cannot happen with our ids)
    Pending& p = it->second;
    if (r.has_welcome()) {
      welcome = r.welcome();
      welcomed = true;
    }
    p.status = Status(static_cast<StatusCode>(r.code()), r.message());
    if (p.status.code() == StatusCode::kNotFound) {
      // The daemon answers an op whose memory it refused to register with NOT_FOUND: say why
      // the registration was refused instead.
      for (uint64_t memory_id : p.memory_ids) {
        auto refused = register_refused.find(memory_id);
        if (refused == register_refused.end()) continue;
        p.status = Status(refused->second.code(),
                          "stashd refused to register the memory this operation names: " +
                              refused->second.message());
        break;
      }
    }
    Completion& c = p.completion;
    c.kind = p.kind;
    switch (r.kind_case()) {
      case v1::SessionResponse::kStash:
        c.ticket = r.stash().ticket();
        c.tier = FromProtoTier(r.stash().tier());
        c.rows = r.stash().rows();
        c.bytes = r.stash().bytes();
        c.pages = r.stash().pages();
        c.latency_us = r.stash().latency_us();
        if (p.epoch == epoch) {
          if (c.tier == Tier::kOverflow) flags.overflow = true;
          // Outside the own pool, as mapped mode counts it: the host tier or a peer's pool.
          if (c.tier == Tier::kHost || c.tier == Tier::kPeer) flags.spilled = true;
        }
        if (p.status.ok() && c.tier != Tier::kOverflow) live.insert(r.request_id());
        break;
      case v1::SessionResponse::kReload:
        if (p.status.ok()) live.erase(p.ticket);
        c.ticket = r.reload().ticket();
        c.tier = FromProtoTier(r.reload().tier());
        c.rows = r.reload().rows();
        c.bytes = r.reload().bytes();
        c.latency_us = r.reload().latency_us();
        break;
      case v1::SessionResponse::kRelease:
        if (p.status.ok()) live.erase(p.ticket);
        c.ticket = r.release().ticket();
        c.pages = r.release().pages();
        break;
      case v1::SessionResponse::kDaemonState:
        // A stash the daemon refused because it drains: kept by the caller, as the library
        // answers stashes itself while draining; not an overflow (nothing was lost).
        draining = r.daemon_state().draining();
        if (p.kind == Completion::Kind::kStash && draining) {
          p.status = Status::Ok();
          c.ticket = r.request_id();
          c.tier = Tier::kOverflow;
        }
        break;
      case v1::SessionResponse::kBeginStep:
        c.step_overflow = r.begin_step().overflow();
        c.step_spilled = r.begin_step().spilled();
        break;
      default:
        break;
    }
    DoneAnsweredLocked(r.request_id(), p);
    if (p.internal) {
      if (p.kind == Completion::Kind::kRegister && p.memory_id != 0) {
        if (p.status.ok()) {
          register_refused.erase(p.memory_id);
        } else {
          registered.erase(p.memory_id);
          register_refused[p.memory_id] = p.status;
        }
      }
      pending.erase(it);
      return;
    }
    p.answered = true;
    cv.notify_all();
  }
};

}  // namespace stash::client

#endif  // STASH_CLIENT_SESSION_STREAM_H_
