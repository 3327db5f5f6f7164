#include "stash/client.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "client/copy/copy_session.h"
#include "client/mapped/cuda/cuda_mapped_session.h"
#include "client/mapped/mapped_session.h"
#include "client/memory/cuda_memory.h"
#include "client/memory/host_buffer_rep.h"
#include "client/session/session_stream.h"
#include "common/host_event.h"
#include "common/macros.h"
#include "common/random.h"
#include "common/shm.h"

namespace stash {

// ------------------------------------------------------------------------------------------------
// HostBuffer and events

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

Client::~Client() = default;

StatusOr<std::unique_ptr<Client>> Client::Open(const Options& options) {
  std::unique_ptr<Client> client(new Client());
  if (options.mode == Mode::kMapped && options.backend == Backend::kCuda) {
    STASH_ASSIGN_OR_RETURN(client->gpu_mapped_, CudaMappedSession::Open(options));
    return client;
  }
  if (options.mode == Mode::kMapped) {
    STASH_ASSIGN_OR_RETURN(client->mapped_, MappedSession::Open(options));
    return client;
  }
  STASH_ASSIGN_OR_RETURN(client->copy_, CopySession::Open(options));
  return client;
}

// One side of a copy: where it is in the session's terms, and the memory to register for it.
struct Region {
  uint64_t memory_id = 0;
  uint64_t offset = 0;
  SessionStream::MemoryDesc memory;
  std::vector<uint64_t> stale;  // allocations freed since, at this one's addresses: unregister
};

namespace {

SessionStream::Writer WriterOf(bool then_wait) {
  return then_wait ? SessionStream::Writer::kCallerWaits : SessionStream::Writer::kSessionThread;
}

// Resolves `host` + offset or `device` + offset (exactly one of them set), `bytes` long.
StatusOr<Region> ResolveRegion(CudaSide* cuda, const HostBuffer* host, const void* device,
                               uint64_t offset, uint64_t bytes, const std::string& what,
                               const std::string& device_what) {
  if ((host == nullptr) == (device == nullptr)) {
    return InvalidArgumentError("set exactly one of " + what + " (a HostBuffer) and " +
                                device_what + " (a device pointer)");
  }
  Region region;
  if (host != nullptr) {
    STASH_RETURN_IF_ERROR(CheckHostRange(*host, offset, bytes, what));
    region.memory = SessionStream::HostMemory(*host);
    region.memory_id = host->id();
    region.offset = offset;
    return region;
  }
  if (cuda == nullptr) {
    return InvalidArgumentError(device_what +
                                " is a device pointer, which needs the cuda backend: open the "
                                "client with Options.backend = Backend::kCuda");
  }
  STASH_ASSIGN_OR_RETURN(
      DeviceLocation where,
      cuda->Locate(static_cast<const uint8_t*>(device) + offset, bytes, device_what.c_str()));
  region.memory = SessionStream::MemoryDesc{where.memory_id, v1::MEMORY_KIND_CUDA_IPC,
                                            std::move(where.handle), where.bytes, nullptr};
  region.memory_id = where.memory_id;
  region.offset = where.offset;
  region.stale = std::move(where.stale_memory_ids);
  return region;
}

// A stream is named only where operations are enqueued on it.
Status NoStream(const void* stream, const char* what) {
  if (stream == nullptr) return Status::Ok();
  return InvalidArgumentError(std::string(what) +
                              " is set, which only mapped mode on the cuda backend enqueues on; "
                              "this session orders its copies with ready / done events");
}

void SetRef(const Region& region, v1::MemoryRef* out) {
  out->set_memory_id(region.memory_id);
  out->set_offset(region.offset);
}

}  // namespace

StatusOr<uint64_t> Client::Stash(const StashArgs& args) { return Queue(args, false); }

StatusOr<uint64_t> Client::Reload(const ReloadArgs& args) { return Queue(args, false); }

StatusOr<Completion> Client::StashAndWait(const StashArgs& args, int64_t timeout_ms,
                                          uint64_t* ticket) {
  STASH_ASSIGN_OR_RETURN(const uint64_t queued, Queue(args, true));
  if (ticket != nullptr) *ticket = queued;
  return Wait(queued, timeout_ms);
}

StatusOr<Completion> Client::ReloadAndWait(const ReloadArgs& args, int64_t timeout_ms,
                                           uint64_t* op) {
  STASH_ASSIGN_OR_RETURN(const uint64_t queued, Queue(args, true));
  if (op != nullptr) *op = queued;
  return Wait(queued, timeout_ms);
}

StatusOr<uint64_t> Client::Queue(const StashArgs& args, bool then_wait) {
  // The shape, the same in both modes.
  if (args.row_bytes == 0 || args.max_rows == 0) {
    return InvalidArgumentError("stash needs row_bytes > 0 and max_rows > 0");
  }
  if (args.max_rows > UINT64_MAX / args.row_bytes) {
    return InvalidArgumentError("stash max_rows * row_bytes overflows 64 bits");
  }
  if (gpu_mapped_) return gpu_mapped_->Stash(args);
  STASH_RETURN_IF_ERROR(NoStream(args.stream, "stash stream"));
  if (mapped_) return mapped_->Stash(args);
  STASH_ASSIGN_OR_RETURN(
      Region source,
      ResolveRegion(copy_->cuda(), args.source, args.device_source, args.offset,
                    args.max_rows * args.row_bytes, "stash source", "stash device_source"));
  std::vector<SessionStream::MemoryDesc> memories{source.memory};
  std::vector<uint64_t> stale = source.stale;
  if (Status st = CheckEventPoint(args.ready, "ready event"); !st.ok()) return st;
  if (Status st = CheckEventPoint(args.done, "done event"); !st.ok()) return st;
  v1::SessionRequest r;
  // The ticket is the stash's request id, one name to Wait on: Submit sets both.
  v1::Stash* s = r.mutable_stash();
  SetRef(source, s->mutable_source());
  s->set_row_bytes(args.row_bytes);
  s->set_max_rows(args.max_rows);
  if (args.count.buffer != nullptr || args.count.device_count != nullptr) {
    if (args.count.offset % 8 != 0 ||
        reinterpret_cast<uintptr_t>(args.count.device_count) % 8 != 0) {
      return InvalidArgumentError("the row count must be an 8-byte aligned int64");
    }
    STASH_ASSIGN_OR_RETURN(
        Region count, ResolveRegion(copy_->cuda(), args.count.buffer, args.count.device_count,
                                    args.count.offset, 8, "count buffer", "count device_count"));
    SetRef(count, s->mutable_count()->mutable_reference());
    memories.push_back(count.memory);
    stale.insert(stale.end(), count.stale.begin(), count.stale.end());
  } else {
    s->mutable_count()->set_value(args.count.value);
  }
  s->mutable_count()->set_divisor(args.count.divisor == 0 ? 1 : args.count.divisor);
  SessionStream::DoneEvent done = SessionStream::SetEvents(args.ready, args.done, s, memories);
  s->set_layer(args.layer);
  s->set_microbatch(args.microbatch);
  s->set_name(args.name);
  std::shared_ptr<SessionStream> stream = copy_->Current();
  if (stream == nullptr || stream->keeps_stashes()) {
    // The daemon drains: nothing is sent, the caller keeps its buffer (OVERFLOW), and the step
    // is not flagged (nothing was lost).
    copy_->EndIfDrained();
    SignalEvent(args.done);
    Completion kept;
    kept.kind = Completion::Kind::kStash;
    kept.tier = Tier::kOverflow;
    return copy_->Local(kept);
  }
  return stream->Submit(std::move(r), Completion::Kind::kStash, memories, stale, std::move(done),
                        WriterOf(then_wait));
}

StatusOr<uint64_t> Client::Queue(const ReloadArgs& args, bool then_wait) {
  if (args.ticket == 0) return InvalidArgumentError("reload needs the ticket Stash returned");
  if (gpu_mapped_) return gpu_mapped_->Reload(args);
  STASH_RETURN_IF_ERROR(NoStream(args.stream, "reload stream"));
  if (mapped_) return mapped_->Reload(args);
  // The daemon checks that the destination holds the stash's max_rows * row_bytes.
  STASH_ASSIGN_OR_RETURN(
      Region destination,
      ResolveRegion(copy_->cuda(), args.destination, args.device_destination, args.offset, 0,
                    "reload destination", "reload device_destination"));
  if (Status st = CheckEventPoint(args.ready, "ready event"); !st.ok()) return st;
  if (Status st = CheckEventPoint(args.done, "done event"); !st.ok()) return st;
  std::vector<SessionStream::MemoryDesc> memories{destination.memory};
  v1::SessionRequest r;
  v1::Reload* rl = r.mutable_reload();
  rl->set_ticket(args.ticket);
  SetRef(destination, rl->mutable_destination());
  rl->set_zero_tail(args.zero_tail);
  SessionStream::DoneEvent done = SessionStream::SetEvents(args.ready, args.done, rl, memories);
  STASH_ASSIGN_OR_RETURN(std::shared_ptr<SessionStream> stream, copy_->ForTicket(args.ticket));
  return stream->Submit(std::move(r), Completion::Kind::kReload, memories, destination.stale,
                        std::move(done), WriterOf(then_wait));
}

StatusOr<uint64_t> Client::Release(uint64_t ticket, void* gpu_stream) {
  if (gpu_mapped_) return gpu_mapped_->Release(ticket, gpu_stream);
  STASH_RETURN_IF_ERROR(NoStream(gpu_stream, "release stream"));
  if (mapped_) return mapped_->Release(ticket);
  STASH_ASSIGN_OR_RETURN(std::shared_ptr<SessionStream> stream, copy_->ForTicket(ticket));
  v1::SessionRequest r;
  r.mutable_release()->set_ticket(ticket);
  return stream->Submit(std::move(r), Completion::Kind::kRelease, {}, {}, {});
}

StatusOr<uint64_t> Client::BeginStep(uint64_t step, void* gpu_stream) {
  if (gpu_mapped_) return gpu_mapped_->BeginStep(step, gpu_stream);
  STASH_RETURN_IF_ERROR(NoStream(gpu_stream, "begin_step stream"));
  if (mapped_) return mapped_->BeginStep(step);
  // A session that broke or drained is replaced here, once a daemon takes one.
  STASH_ASSIGN_OR_RETURN(std::shared_ptr<SessionStream> stream, copy_->ForStep());
  if (stream == nullptr) {
    // Drained, and no daemon takes a session yet: the step runs here, stashes kept in-process.
    Completion begun;
    begun.kind = Completion::Kind::kBeginStep;
    return copy_->Local(begun);
  }
  {
    std::lock_guard<std::mutex> lock(stream->mu);
    ++stream->epoch;
    stream->flags = StepFlags{};
  }
  v1::SessionRequest r;
  r.mutable_begin_step()->set_step(step);
  return stream->Submit(std::move(r), Completion::Kind::kBeginStep, {}, {}, {});
}

StatusOr<uint64_t> Client::Unregister(const HostBuffer& buffer) {
  if (gpu_mapped_) return NotFoundError("this buffer was never used with this session");
  if (mapped_) return mapped_->Unregister(buffer);
  std::shared_ptr<SessionStream> stream = copy_->Current();
  Completion unregistered;
  unregistered.kind = Completion::Kind::kUnregister;
  // No session, or a broken one: no daemon maps the buffer any more.
  if (stream == nullptr || stream->broken_now()) return copy_->Local(unregistered);
  {
    std::lock_guard<std::mutex> lock(stream->mu);
    if (stream->registered.erase(buffer.id()) == 0) {
      return NotFoundError("this buffer was never used with this session");
    }
  }
  v1::SessionRequest r;
  r.mutable_unregister_memory()->set_memory_id(buffer.id());
  return stream->Submit(std::move(r), Completion::Kind::kUnregister, {}, {}, {});
}

StatusOr<uint64_t> Client::UnregisterDevice(const void* pointer) {
  if (gpu_mapped_) {
    return NotFoundError(
        "mapped mode never hands your allocations to the daemon: nothing to unregister");
  }
  if (mapped_) return FailedPreconditionError("device memory exists only on the cuda backend");
  if (copy_->cuda() == nullptr) {
    return FailedPreconditionError("device memory exists only on the cuda backend");
  }
  const uint64_t id = copy_->cuda()->Forget(pointer);
  std::shared_ptr<SessionStream> stream = copy_->Current();
  if (stream == nullptr || stream->broken_now()) {
    Completion unregistered;
    unregistered.kind = Completion::Kind::kUnregister;
    return copy_->Local(unregistered);
  }
  {
    std::lock_guard<std::mutex> lock(stream->mu);
    if (id == 0 || stream->registered.erase(id) == 0) {
      return NotFoundError("no allocation holding this pointer was used with this session");
    }
  }
  v1::SessionRequest r;
  r.mutable_unregister_memory()->set_memory_id(id);
  return stream->Submit(std::move(r), Completion::Kind::kUnregister, {}, {}, {});
}

Status Client::ReleaseDeviceMappings(int64_t timeout_ms) {
  if (mapped_ || gpu_mapped_) return Status::Ok();
  if (copy_->cuda() == nullptr) return Status::Ok();
  std::shared_ptr<SessionStream> stream = copy_->Current();
  std::vector<uint64_t> ops;
  for (uint64_t id : copy_->cuda()->ForgetAll()) {
    if (stream == nullptr || stream->broken_now()) continue;  // no daemon maps it any more
    {
      std::lock_guard<std::mutex> lock(stream->mu);
      if (stream->registered.erase(id) == 0) continue;
    }
    v1::SessionRequest r;
    r.mutable_unregister_memory()->set_memory_id(id);
    STASH_ASSIGN_OR_RETURN(uint64_t op,
                           stream->Submit(std::move(r), Completion::Kind::kUnregister, {}, {}, {}));
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
  STASH_RETURN_IF_ERROR(CheckEventPoint(point, what));
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
  CudaSide* cuda = copy_ != nullptr ? copy_->cuda() : gpu_mapped_ ? gpu_mapped_->cuda() : nullptr;
  HostBuffer::Rep* buffer = point.buffer != nullptr ? &point.buffer->rep() : nullptr;
  STASH_ASSIGN_OR_RETURN(uint64_t address, DeviceCounter(cuda, point, buffer, "EnqueueSignal"));
  return cuda->WriteValue(stream, address, point.value);
}

Status Client::EnqueueWait(const EventPoint& point, void* stream) {
  CudaSide* cuda = copy_ != nullptr ? copy_->cuda() : gpu_mapped_ ? gpu_mapped_->cuda() : nullptr;
  HostBuffer::Rep* buffer = point.buffer != nullptr ? &point.buffer->rep() : nullptr;
  STASH_ASSIGN_OR_RETURN(uint64_t address, DeviceCounter(cuda, point, buffer, "EnqueueWait"));
  return cuda->WaitValue(stream, address, point.value);
}

StatusOr<Completion> Client::Wait(uint64_t op, int64_t timeout_ms) {
  if (gpu_mapped_) return gpu_mapped_->Wait(op, timeout_ms);
  if (mapped_) return mapped_->Wait(op, timeout_ms);
  return copy_->Wait(op, timeout_ms);
}

std::optional<StatusOr<Completion>> Client::Poll(uint64_t op) {
  if (gpu_mapped_) return gpu_mapped_->Poll(op);
  if (mapped_) return mapped_->Poll(op);
  return copy_->Poll(op);
}

Status Client::GraphsDestroyed() {
  if (!gpu_mapped_) {
    return FailedPreconditionError(
        "GraphsDestroyed: only mapped mode on the cuda backend pages inside CUDA graphs; this "
        "session keeps nothing for graphs");
  }
  return gpu_mapped_->GraphsDestroyed();
}

StepFlags Client::CurrentStepFlags() const {
  if (gpu_mapped_) return gpu_mapped_->CurrentStepFlags();
  if (mapped_) return mapped_->CurrentStepFlags();
  return copy_->Flags();
}

StatusOr<SessionStats> Client::Stats() {
  if (gpu_mapped_) return gpu_mapped_->Stats();
  if (mapped_) return mapped_->Stats();
  return copy_->Stats();
}

v1::Welcome Client::welcome() const {
  if (gpu_mapped_) return gpu_mapped_->welcome();
  return mapped_ ? mapped_->welcome() : copy_->welcome();
}
std::string Client::session_id() const { return welcome().session_id(); }
uint64_t Client::page_bytes() const { return welcome().page_bytes(); }
uint64_t Client::pool_pages() const { return welcome().pool_pages(); }
uint64_t Client::host_tier_pages() const { return welcome().host_tier_pages(); }
const std::string& Client::socket() const {
  if (gpu_mapped_) return gpu_mapped_->socket();
  return mapped_ ? mapped_->socket() : copy_->socket();
}
Backend Client::backend() const {
  if (gpu_mapped_) return Backend::kCuda;
  return mapped_ ? Backend::kHost : copy_->backend();
}
Mode Client::mode() const { return gpu_mapped_ || mapped_ ? Mode::kMapped : Mode::kDaemonCopy; }

}  // namespace stash
