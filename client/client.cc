#include "stash/client.h"

#include <unistd.h>

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "client/cuda_memory.h"
#include "client/descriptor_channel.h"
#include "client/tier_stats.h"
#include "common/grpc_status.h"
#include "common/host_event.h"
#include "common/macros.h"
#include "common/random.h"
#include "common/shm.h"
#include "common/socket_path.h"
#include "common/socket_probe.h"
#include "common/version.h"
#include "common/write_queue.h"
#include "stash/v1/stash.grpc.pb.h"

namespace stash {
namespace {

namespace v1 = stash::v1;

Tier FromProtoTier(v1::Tier tier) {
  switch (tier) {
    case v1::TIER_DEVICE:
      return Tier::kDevice;
    case v1::TIER_HOST:
      return Tier::kHost;
    case v1::TIER_OVERFLOW:
      return Tier::kOverflow;
    case v1::TIER_PEER:
      return Tier::kPeer;
    default:
      return Tier::kUnspecified;
  }
}

// How long closing a session waits for the daemon to drain its copies before cancelling.
constexpr std::chrono::seconds kCloseDrainTimeout(10);

std::string NoDaemon(const std::string& socket, const std::string& detail) {
  return "no stashd answers on " + socket + " (" + detail +
         "): start it with 'stashd --socket=" + socket +
         "' or point STASHD_SOCKET at a running one";
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// HostBuffer and events

struct HostBuffer::Rep {
  // Shared: an operation whose done event lives here keeps it mapped until it is answered, even
  // when the caller frees the HostBuffer first (the library raises done events itself).
  std::shared_ptr<SharedMemory> memory;
  uint64_t id = 0;
  // Cuda backend: the buffer mapped for the GPU on first EnqueueSignal / EnqueueWait.
  std::mutex map_mu;
  uint64_t device_address = 0;    // guarded by map_mu
  std::function<void()> release;  // guarded by map_mu
};

HostBuffer::HostBuffer(std::unique_ptr<Rep> rep) : rep_(std::move(rep)) {}
HostBuffer::~HostBuffer() {
  // Mapped for the GPU: streams may still wait on it, so it stays mapped until the process
  // exits (CudaSide::MapHost).
  if (rep_->release) rep_->release();
}

StatusOr<std::unique_ptr<HostBuffer>> HostBuffer::Allocate(uint64_t bytes) {
  auto memory = SharedMemory::CreateSealed("stashd-buffer", bytes);
  if (!memory.ok()) return memory.status();
  auto rep = std::make_unique<Rep>();
  rep->memory = std::move(memory).value();
  rep->id = RandomNonZeroU64();
  return std::unique_ptr<HostBuffer>(new HostBuffer(std::move(rep)));
}

uint8_t* HostBuffer::data() const { return rep_->memory->data(); }
uint64_t HostBuffer::size() const { return rep_->memory->size(); }
uint64_t HostBuffer::id() const { return rep_->id; }

namespace {
uint64_t* CounterOf(const EventPoint& point) {
  return reinterpret_cast<uint64_t*>(point.buffer->data() + point.offset);
}
}  // namespace

void SignalEvent(const EventPoint& point) {
  if (point.buffer == nullptr) return;
  EventSignal(CounterOf(point), point.value);
}

bool WaitEvent(const EventPoint& point, int64_t timeout_ms) {
  if (point.buffer == nullptr) return true;
  const auto timeout = timeout_ms < 0
                           ? std::chrono::nanoseconds(std::chrono::hours(24 * 365))
                           : std::chrono::nanoseconds(std::chrono::milliseconds(timeout_ms));
  return EventWait(CounterOf(point), point.value, timeout);
}

const char* TierName(Tier tier) {
  switch (tier) {
    case Tier::kDevice:
      return "device";
    case Tier::kHost:
      return "host";
    case Tier::kOverflow:
      return "overflow";
    case Tier::kPeer:
      return "peer";
    case Tier::kUnspecified:
      break;
  }
  return "unspecified";
}

// ------------------------------------------------------------------------------------------------
// The session stream

struct Client::Impl final
    : public grpc::ClientBidiReactor<v1::SessionRequest, v1::SessionResponse> {
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
    uint64_t epoch = 0;      // the step it was sent in
    uint64_t memory_id = 0;  // register ops
    bool internal = false;   // nobody waits: register / unregister bookkeeping
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

  static MemoryDesc HostMemory(const HostBuffer& buffer) {
    return MemoryDesc{buffer.id(), v1::MEMORY_KIND_HOST_FD, "", buffer.size(), buffer.rep().memory};
  }

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
    return DoneEvent{done.buffer->rep().memory, done.offset, done.value};
  }

  static void SetEvent(const EventPoint& e, v1::EventRef* out) {
    out->mutable_counter()->set_memory_id(e.buffer->id());
    out->mutable_counter()->set_offset(e.offset);
    out->set_value(e.value);
  }

  // Never change after Open().
  Backend backend = Backend::kHost;
  std::unique_ptr<CudaSide> cuda;  // cuda backend only
  std::string socket;
  std::unique_ptr<DescriptorChannel> descriptors;  // set once welcomed
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::StashService::Stub> stub;
  v1::Welcome welcome;

  grpc::ClientContext context;
  v1::SessionResponse incoming;  // read side only
  WriteQueue<v1::SessionRequest> writes{[this](const v1::SessionRequest* r) { StartWrite(r); }};

  mutable std::mutex mu;
  std::condition_variable cv;
  bool broken = false;                            // guarded by mu
  Status broken_status;                           // guarded by mu
  bool done = false;                              // guarded by mu: OnDone ran
  std::unordered_map<uint64_t, Pending> pending;  // guarded by mu
  std::unordered_set<uint64_t> registered;        // buffer ids; guarded by mu
  std::map<DoneKey, DoneQueue> done_queues;       // guarded by mu
  uint64_t epoch = 0;                             // guarded by mu
  StepFlags flags;                                // guarded by mu
  bool welcomed = false;                          // guarded by mu
  bool hold_removed = false;                      // guarded by mu

  // Queues requests in order (lock held, so batches of different threads stay apart). Returns
  // whether the caller must Kick the writer after unlocking; false with `accepted` false when
  // the stream is gone.
  bool QueueLocked(std::vector<v1::SessionRequest>& requests, bool* accepted) {
    return writes.Enqueue(requests, accepted);
  }

  // Adds an internal (nobody waits) request to `out` (lock held).
  void AddInternalLocked(v1::SessionRequest r, Completion::Kind kind, uint64_t memory_id,
                         std::vector<v1::SessionRequest>& out) {
    r.set_request_id(RandomNonZeroU64());
    Pending p;
    p.kind = kind;
    p.memory_id = memory_id;
    p.internal = true;
    pending.emplace(r.request_id(), p);
    out.push_back(std::move(r));
  }

  // Adds a RegisterMemory for `memory` unless it is registered (lock held).
  void RegisterLocked(const MemoryDesc& memory, std::vector<v1::SessionRequest>& out) {
    if (registered.count(memory.id) != 0) return;
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
  }

  // Adds an UnregisterMemory for `memory_id` if it is registered (lock held).
  void UnregisterLocked(uint64_t memory_id, std::vector<v1::SessionRequest>& out) {
    if (memory_id == 0 || registered.erase(memory_id) == 0) return;
    v1::SessionRequest r;
    r.mutable_unregister_memory()->set_memory_id(memory_id);
    AddInternalLocked(std::move(r), Completion::Kind::kUnregister, memory_id, out);
  }

  // Hands the memfds of host memory new to the session to the daemon, which keeps each for the
  // RegisterMemory that follows. A buffer two threads hand over at once is deposited twice:
  // the daemon keeps the later one, the same memory.
  Status DepositNew(const std::vector<MemoryDesc>& memories) {
    for (const MemoryDesc& m : memories) {
      if (m.memory == nullptr) continue;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (broken) return broken_status;
        if (registered.count(m.id) != 0) continue;
      }
      STASH_RETURN_IF_ERROR(descriptors->DepositMemory(m.id, m.bytes, m.memory->fd()));
    }
    return Status::Ok();
  }

  // Sends `request` (after unregistering `stale` allocations and registering the memory it
  // names that is new to the session) and tracks it as `kind`. Returns the request id.
  StatusOr<uint64_t> Submit(v1::SessionRequest request, Completion::Kind kind,
                            const std::vector<MemoryDesc>& memories,
                            const std::vector<uint64_t>& stale, DoneEvent done_event) {
    STASH_RETURN_IF_ERROR(DepositNew(memories));
    uint64_t id = 0;
    bool start = false;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (broken) return broken_status;
      std::vector<v1::SessionRequest> batch;
      for (uint64_t old : stale) UnregisterLocked(old, batch);
      for (const MemoryDesc& m : memories) RegisterLocked(m, batch);
      if (request.request_id() == 0) request.set_request_id(RandomNonZeroU64());
      while (pending.count(request.request_id()) != 0) request.set_request_id(RandomNonZeroU64());
      id = request.request_id();
      if (request.has_stash()) request.mutable_stash()->set_ticket(id);  // ticket == request id
      Pending p;
      p.kind = kind;
      p.epoch = epoch;
      TrackDoneLocked(id, std::move(done_event), p);
      pending.emplace(id, p);
      batch.push_back(std::move(request));
      bool accepted = true;
      start = QueueLocked(batch, &accepted);
      if (!accepted) {
        pending.erase(id);
        ReleaseDoneEventsLocked();  // the stream is gone
        return UnavailableError("stashd on " + socket + " went away");
      }
    }
    if (start) writes.Kick();
    return id;
  }

  void OnWriteDone(bool ok) override { writes.OnWriteDone(ok); }

  void OnReadDone(bool ok) override {
    if (!ok) {
      std::lock_guard<std::mutex> lock(mu);
      if (!broken) {
        broken = true;
        broken_status = UnavailableError("stashd on " + socket + " ended the session");
      }
      ReleaseDoneEventsLocked();
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
    cv.notify_all();
  }

  void Dispatch(const v1::SessionResponse& r) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = pending.find(r.request_id());
    if (it == pending.end()) return;  // an answer nobody tracks (cannot happen with our ids)
    Pending& p = it->second;
    if (r.has_welcome()) {
      welcome = r.welcome();
      welcomed = true;
    }
    p.status = Status(static_cast<StatusCode>(r.code()), r.message());
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
          if (c.tier == Tier::kHost) flags.spilled = true;
        }
        break;
      case v1::SessionResponse::kReload:
        c.ticket = r.reload().ticket();
        c.tier = FromProtoTier(r.reload().tier());
        c.rows = r.reload().rows();
        c.bytes = r.reload().bytes();
        c.latency_us = r.reload().latency_us();
        break;
      case v1::SessionResponse::kRelease:
        c.ticket = r.release().ticket();
        c.pages = r.release().pages();
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
      if (p.kind == Completion::Kind::kRegister && !p.status.ok()) registered.erase(p.memory_id);
      pending.erase(it);
      return;
    }
    p.answered = true;
    cv.notify_all();
  }
};

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

StatusOr<std::unique_ptr<Client>> Client::Open(const Options& options) {
  auto impl = std::make_unique<Impl>();
  impl->backend = options.backend;
  if (options.backend == Backend::kCuda) {
    STASH_ASSIGN_OR_RETURN(impl->cuda, CudaSide::Open(options.device));
  }
  impl->socket = ClientSocketPath(options.socket);
  // A missing, refused or forbidden socket is known at once; gRPC would only say "unavailable"
  // once the connect timeout passed.
  STASH_RETURN_IF_ERROR(ProbeSocket(impl->socket));
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(16 << 20);
  impl->channel = grpc::CreateCustomChannel(GrpcUnixTarget(impl->socket),
                                            grpc::InsecureChannelCredentials(), args);
  const auto deadline =
      std::chrono::system_clock::now() + std::chrono::milliseconds(options.connect_timeout_ms);
  if (!impl->channel->WaitForConnected(deadline)) {
    return UnavailableError(NoDaemon(impl->socket, "connect timed out"));
  }
  impl->stub = v1::StashService::NewStub(impl->channel);

  Impl* raw = impl.get();
  raw->stub->async()->Session(&raw->context, raw);
  raw->StartRead(&raw->incoming);
  raw->AddHold();
  raw->StartCall();

  v1::SessionRequest hello;
  hello.set_request_id(RandomNonZeroU64());
  v1::Hello* h = hello.mutable_hello();
  h->set_rank(options.rank);
  h->set_device(options.device);
  h->set_backend(options.backend == Backend::kCuda ? v1::BACKEND_CUDA : v1::BACKEND_HOST);
  if (raw->cuda != nullptr) h->set_device_uuid(raw->cuda->uuid());
  h->set_pid(getpid());
  h->set_client_version(kVersion);
  h->set_label(options.label);
  h->set_allow_host_spill(options.allow_host_spill);
  const uint64_t hello_id = hello.request_id();

  bool start = false;
  {
    std::lock_guard<std::mutex> lock(raw->mu);
    Impl::Pending p;
    p.kind = Completion::Kind::kRegister;  // Hello: only `answered` and the Welcome matter
    raw->pending.emplace(hello_id, p);
    std::vector<v1::SessionRequest> batch;
    batch.push_back(std::move(hello));
    bool accepted = true;
    start = raw->QueueLocked(batch, &accepted);
  }
  if (start) raw->writes.Kick();

  // From here the destructor cleans up the stream whatever happens.
  auto client = std::unique_ptr<Client>(new Client(std::move(impl)));
  std::unique_lock<std::mutex> lock(raw->mu);
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(options.connect_timeout_ms);
  const bool settled =
      raw->cv.wait_until(lock, until, [&] { return raw->welcomed || raw->broken; });
  if (!settled) return UnavailableError(NoDaemon(raw->socket, "no answer to Hello"));
  if (!raw->welcomed) {
    // Refused: the stream's final status (delivered once our hold is gone) says why.
    raw->hold_removed = true;
    lock.unlock();
    raw->RemoveHold();
    lock.lock();
    raw->cv.wait(lock, [&] { return raw->done; });
    return raw->broken_status;
  }
  if (!raw->pending[hello_id].status.ok()) return raw->pending[hello_id].status;
  raw->pending.erase(hello_id);
  raw->descriptors = std::make_unique<DescriptorChannel>(raw->socket, raw->welcome.session_id(),
                                                         raw->welcome.descriptor_secret());
  lock.unlock();
  return client;
}

Client::~Client() {
  // A healthy session ends by a half-close: the daemon ends the stream only once every copy and
  // done write of the session finished, and only then does OnReadDone raise the pending done
  // counters. A cancel would raise them at once while the daemon's copies still run, and a done
  // write landing after that raise could lower a counter a stream waits on. Cancelled anyway
  // after kCloseDrainTimeout (a daemon that does not answer).
  bool healthy = false;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    healthy = !impl_->broken && impl_->welcomed;
  }
  Impl* raw = impl_.get();
  const bool half_closed =
      healthy && impl_->writes.CloseAfterWrites([raw] { raw->StartWritesDone(); });
  if (half_closed) {
    std::unique_lock<std::mutex> lock(impl_->mu);
    impl_->cv.wait_for(lock, kCloseDrainTimeout, [&] { return impl_->broken; });
  }
  impl_->context.TryCancel();
  std::unique_lock<std::mutex> lock(impl_->mu);
  if (!impl_->hold_removed) {
    impl_->hold_removed = true;
    lock.unlock();
    impl_->RemoveHold();
    lock.lock();
  }
  impl_->cv.wait(lock, [&] { return impl_->done; });
}

namespace {

Status CheckEvent(const EventPoint& e, const char* what) {
  if (e.buffer == nullptr) return Status::Ok();
  if (e.offset % 8 != 0 || e.offset + 8 > e.buffer->size()) {
    return InvalidArgumentError(std::string(what) + " offset " + std::to_string(e.offset) +
                                " must be 8-byte aligned and inside its buffer (" +
                                std::to_string(e.buffer->size()) + " bytes)");
  }
  return Status::Ok();
}

}  // namespace

// One side of a copy: where it is in the session's terms, and the memory to register for it.
struct Region {
  uint64_t memory_id = 0;
  uint64_t offset = 0;
  Client::Impl::MemoryDesc memory;
  std::vector<uint64_t> stale;  // allocations freed since, at this one's addresses: unregister
};

namespace {

// Resolves `host` + offset or `device` + offset (exactly one of them set), `bytes` long.
StatusOr<Region> ResolveRegion(Client::Impl& impl, const HostBuffer* host, const void* device,
                               uint64_t offset, uint64_t bytes, const std::string& what,
                               const std::string& device_what) {
  if ((host == nullptr) == (device == nullptr)) {
    return InvalidArgumentError("set exactly one of " + what + " (a HostBuffer) and " +
                                device_what + " (a device pointer)");
  }
  Region region;
  if (host != nullptr) {
    if (offset > host->size() || bytes > host->size() - offset) {
      return InvalidArgumentError(what + " [offset, offset + " + std::to_string(bytes) +
                                  ") runs past the end of its buffer (" +
                                  std::to_string(host->size()) + " bytes)");
    }
    region.memory = Client::Impl::HostMemory(*host);
    region.memory_id = host->id();
    region.offset = offset;
    return region;
  }
  if (impl.cuda == nullptr) {
    return InvalidArgumentError(device_what +
                                " is a device pointer, which needs the cuda backend: open the "
                                "client with Options.backend = Backend::kCuda");
  }
  STASH_ASSIGN_OR_RETURN(
      DeviceLocation where,
      impl.cuda->Locate(static_cast<const uint8_t*>(device) + offset, bytes, device_what.c_str()));
  region.memory = Client::Impl::MemoryDesc{where.memory_id, v1::MEMORY_KIND_CUDA_IPC,
                                           std::move(where.handle), where.bytes, nullptr};
  region.memory_id = where.memory_id;
  region.offset = where.offset;
  region.stale = std::move(where.stale_memory_ids);
  return region;
}

void SetRef(const Region& region, v1::MemoryRef* out) {
  out->set_memory_id(region.memory_id);
  out->set_offset(region.offset);
}

}  // namespace

StatusOr<uint64_t> Client::Stash(const StashArgs& args) {
  if (args.row_bytes == 0 || args.max_rows == 0) {
    return InvalidArgumentError("stash needs row_bytes > 0 and max_rows > 0");
  }
  if (args.max_rows > UINT64_MAX / args.row_bytes) {
    return InvalidArgumentError("stash max_rows * row_bytes overflows 64 bits");
  }
  STASH_ASSIGN_OR_RETURN(Region source, ResolveRegion(*impl_, args.source, args.device_source,
                                                      args.offset, args.max_rows * args.row_bytes,
                                                      "stash source", "stash device_source"));
  std::vector<Impl::MemoryDesc> memories{source.memory};
  std::vector<uint64_t> stale = source.stale;
  if (Status st = CheckEvent(args.ready, "ready event"); !st.ok()) return st;
  if (Status st = CheckEvent(args.done, "done event"); !st.ok()) return st;
  v1::SessionRequest r;
  r.set_request_id(RandomNonZeroU64());
  v1::Stash* s = r.mutable_stash();
  s->set_ticket(r.request_id());  // the ticket is the stash's request id: one name to Wait on
  SetRef(source, s->mutable_source());
  s->set_row_bytes(args.row_bytes);
  s->set_max_rows(args.max_rows);
  if (args.count.buffer != nullptr || args.count.device_count != nullptr) {
    if (args.count.offset % 8 != 0 ||
        reinterpret_cast<uintptr_t>(args.count.device_count) % 8 != 0) {
      return InvalidArgumentError("the row count must be an 8-byte aligned int64");
    }
    STASH_ASSIGN_OR_RETURN(
        Region count, ResolveRegion(*impl_, args.count.buffer, args.count.device_count,
                                    args.count.offset, 8, "count buffer", "count device_count"));
    SetRef(count, s->mutable_count()->mutable_reference());
    memories.push_back(count.memory);
    stale.insert(stale.end(), count.stale.begin(), count.stale.end());
  } else {
    s->mutable_count()->set_value(args.count.value);
  }
  s->mutable_count()->set_divisor(args.count.divisor == 0 ? 1 : args.count.divisor);
  Impl::DoneEvent done = Impl::SetEvents(args.ready, args.done, s, memories);
  s->set_layer(args.layer);
  s->set_microbatch(args.microbatch);
  s->set_name(args.name);
  // The ticket must not change inside Submit: a collision with a pending id is astronomically
  // unlikely, and Submit keeps the id when it is free.
  return impl_->Submit(std::move(r), Completion::Kind::kStash, memories, stale, std::move(done));
}

StatusOr<uint64_t> Client::Reload(const ReloadArgs& args) {
  if (args.ticket == 0) return InvalidArgumentError("reload needs the ticket Stash returned");
  // The daemon checks that the destination holds the stash's max_rows * row_bytes.
  STASH_ASSIGN_OR_RETURN(
      Region destination,
      ResolveRegion(*impl_, args.destination, args.device_destination, args.offset, 0,
                    "reload destination", "reload device_destination"));
  if (Status st = CheckEvent(args.ready, "ready event"); !st.ok()) return st;
  if (Status st = CheckEvent(args.done, "done event"); !st.ok()) return st;
  std::vector<Impl::MemoryDesc> memories{destination.memory};
  v1::SessionRequest r;
  v1::Reload* rl = r.mutable_reload();
  rl->set_ticket(args.ticket);
  SetRef(destination, rl->mutable_destination());
  rl->set_zero_tail(args.zero_tail);
  Impl::DoneEvent done = Impl::SetEvents(args.ready, args.done, rl, memories);
  return impl_->Submit(std::move(r), Completion::Kind::kReload, memories, destination.stale,
                       std::move(done));
}

StatusOr<uint64_t> Client::Release(uint64_t ticket) {
  v1::SessionRequest r;
  r.mutable_release()->set_ticket(ticket);
  return impl_->Submit(std::move(r), Completion::Kind::kRelease, {}, {}, {});
}

StatusOr<uint64_t> Client::BeginStep(uint64_t step) {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    ++impl_->epoch;
    impl_->flags = StepFlags{};
  }
  v1::SessionRequest r;
  r.mutable_begin_step()->set_step(step);
  return impl_->Submit(std::move(r), Completion::Kind::kBeginStep, {}, {}, {});
}

StatusOr<uint64_t> Client::Unregister(const HostBuffer& buffer) {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->registered.erase(buffer.id()) == 0) {
      return NotFoundError("this buffer was never used with this session");
    }
  }
  v1::SessionRequest r;
  r.mutable_unregister_memory()->set_memory_id(buffer.id());
  return impl_->Submit(std::move(r), Completion::Kind::kUnregister, {}, {}, {});
}

StatusOr<uint64_t> Client::UnregisterDevice(const void* pointer) {
  if (impl_->cuda == nullptr) {
    return FailedPreconditionError("device memory exists only on the cuda backend");
  }
  const uint64_t id = impl_->cuda->Forget(pointer);
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (id == 0 || impl_->registered.erase(id) == 0) {
      return NotFoundError("no allocation holding this pointer was used with this session");
    }
  }
  v1::SessionRequest r;
  r.mutable_unregister_memory()->set_memory_id(id);
  return impl_->Submit(std::move(r), Completion::Kind::kUnregister, {}, {}, {});
}

Status Client::ReleaseDeviceMappings(int64_t timeout_ms) {
  if (impl_->cuda == nullptr) return Status::Ok();
  std::vector<uint64_t> ops;
  for (uint64_t id : impl_->cuda->ForgetAll()) {
    {
      std::lock_guard<std::mutex> lock(impl_->mu);
      if (impl_->registered.erase(id) == 0) continue;
    }
    v1::SessionRequest r;
    r.mutable_unregister_memory()->set_memory_id(id);
    STASH_ASSIGN_OR_RETURN(uint64_t op,
                           impl_->Submit(std::move(r), Completion::Kind::kUnregister, {}, {}, {}));
    ops.push_back(op);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (uint64_t op : ops) {
    int64_t left = -1;
    if (timeout_ms >= 0) {
      left = std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::milliseconds>(
                                      deadline - std::chrono::steady_clock::now())
                                      .count());
    }
    STASH_RETURN_IF_ERROR(Wait(op, left).status());
  }
  return Status::Ok();
}

namespace {

// The device address of `point`'s counter, mapping its buffer for the GPU on first use.
StatusOr<uint64_t> DeviceCounter(CudaSide* cuda, const EventPoint& point, HostBuffer::Rep* buffer,
                                 const char* what) {
  if (cuda == nullptr) {
    return FailedPreconditionError(std::string(what) +
                                   " orders GPU streams, which needs the cuda backend; on the "
                                   "host backend use SignalEvent / WaitEvent");
  }
  if (buffer == nullptr) return InvalidArgumentError(std::string(what) + " needs an event point");
  STASH_RETURN_IF_ERROR(CheckEvent(point, what));
  HostBuffer::Rep& rep = *buffer;
  std::lock_guard<std::mutex> lock(rep.map_mu);
  if (rep.device_address == 0) {
    STASH_ASSIGN_OR_RETURN(rep.device_address, cuda->MapHost(rep.memory->data(), rep.memory->size(),
                                                             rep.memory, &rep.release));
  }
  return rep.device_address + point.offset;
}

}  // namespace

Status Client::EnqueueSignal(const EventPoint& point, void* stream) {
  HostBuffer::Rep* buffer = point.buffer != nullptr ? &point.buffer->rep() : nullptr;
  STASH_ASSIGN_OR_RETURN(uint64_t address,
                         DeviceCounter(impl_->cuda.get(), point, buffer, "EnqueueSignal"));
  return impl_->cuda->WriteValue(stream, address, point.value);
}

Status Client::EnqueueWait(const EventPoint& point, void* stream) {
  HostBuffer::Rep* buffer = point.buffer != nullptr ? &point.buffer->rep() : nullptr;
  STASH_ASSIGN_OR_RETURN(uint64_t address,
                         DeviceCounter(impl_->cuda.get(), point, buffer, "EnqueueWait"));
  return impl_->cuda->WaitValue(stream, address, point.value);
}

StatusOr<Completion> Client::Wait(uint64_t op, int64_t timeout_ms) {
  std::unique_lock<std::mutex> lock(impl_->mu);
  auto it = impl_->pending.find(op);
  if (it == impl_->pending.end()) {
    return NotFoundError("operation " + std::to_string(op) +
                         " is not pending: unknown here, or its answer was already handed out");
  }
  auto ready = [&] { return impl_->pending[op].answered || impl_->broken; };
  if (timeout_ms < 0) {
    impl_->cv.wait(lock, ready);
  } else if (!impl_->cv.wait_for(lock, std::chrono::milliseconds(timeout_ms), ready)) {
    return DeadlineExceededError("operation " + std::to_string(op) + " not answered within " +
                                 std::to_string(timeout_ms) + " ms");
  }
  Impl::Pending p = std::move(impl_->pending[op]);
  impl_->pending.erase(op);
  if (!p.answered) return impl_->broken_status;
  if (!p.status.ok()) return p.status;
  return p.completion;
}

std::optional<StatusOr<Completion>> Client::Poll(uint64_t op) {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    auto it = impl_->pending.find(op);
    if (it != impl_->pending.end() && !it->second.answered && !impl_->broken) return std::nullopt;
  }
  return Wait(op, 0);
}

StepFlags Client::CurrentStepFlags() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->flags;
}

StatusOr<SessionStats> Client::Stats() {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::GetStatsResponse response;
  grpc::Status status = impl_->stub->GetStats(&ctx, v1::GetStatsRequest(), &response);
  if (!status.ok()) {
    return UnavailableError("stats from stashd on " + impl_->socket + ": " +
                            status.error_message());
  }
  SessionStats out;
  out.session_id = impl_->welcome.session_id();
  out.pool = impl_->welcome.pool();
  out.page_bytes = impl_->welcome.page_bytes();
  for (const v1::TierStats& t : response.tiers()) AddTierStats(t, &out);
  for (const v1::SessionStats& s : response.sessions()) {
    if (s.session_id() != out.session_id) continue;
    out.stashes = s.stashes();
    out.reloads = s.reloads();
    out.releases = s.releases();
    out.bytes_stashed = s.bytes_stashed();
    out.bytes_reloaded = s.bytes_reloaded();
    out.spills = s.spills();
    out.overflows = s.overflows();
    out.rejected = s.rejected();
    out.stashes_live = s.stashes_live();
    out.pages_live = s.pages_live();
  }
  return out;
}

const std::string& Client::session_id() const { return impl_->welcome.session_id(); }
uint64_t Client::page_bytes() const { return impl_->welcome.page_bytes(); }
uint64_t Client::pool_pages() const { return impl_->welcome.pool_pages(); }
uint64_t Client::host_tier_pages() const { return impl_->welcome.host_tier_pages(); }
const std::string& Client::socket() const { return impl_->socket; }
Backend Client::backend() const { return impl_->backend; }

}  // namespace stash
