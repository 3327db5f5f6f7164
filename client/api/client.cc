#include "stash/client.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "client/copy/copy_session.h"
#include "client/mapped/cuda/cuda_mapped_session.h"
#include "client/mapped/mapped_session.h"
#include "client/memory/cuda_memory.h"
#include "client/memory/host_buffer_rep.h"
#include "client/session/argument_checks.h"
#include "client/session/group_options.h"
#include "client/session/mode_session.h"
#include "client/session/session_stream.h"
#include "common/host_event.h"
#include "common/macros.h"
#include "common/random.h"
#include "common/shm.h"

namespace stash {

using client::CheckEventPoint;
using client::CheckReloadTicket;
using client::CheckStashShape;
using client::CopySession;
using client::CudaMappedSession;
using client::CudaSide;
using client::MappedSession;

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
  // The group, from the environment when Options names none: resolved once, so every
  // reconnect says the same Hello.
  STASH_ASSIGN_OR_RETURN(const Options resolved, client::ResolveGroup(options));
  std::unique_ptr<Client> client(new Client());
  if (resolved.mode == Mode::kMapped && resolved.backend == Backend::kCuda) {
    STASH_ASSIGN_OR_RETURN(client->session_, CudaMappedSession::Open(resolved));
  } else if (resolved.mode == Mode::kMapped) {
    STASH_ASSIGN_OR_RETURN(client->session_, MappedSession::Open(resolved));
  } else {
    STASH_ASSIGN_OR_RETURN(client->session_, CopySession::Open(resolved));
  }
  return client;
}

StatusOr<uint64_t> Client::Stash(const StashArgs& args) { return Queue(args, false); }

StatusOr<uint64_t> Client::Reload(const ReloadArgs& args) { return Queue(args, false); }

StatusOr<uint64_t> Client::Queue(const StashArgs& args, bool then_wait) {
  STASH_RETURN_IF_ERROR(CheckStashShape(args));
  return session_->Stash(args, then_wait);
}

StatusOr<uint64_t> Client::Queue(const ReloadArgs& args, bool then_wait) {
  STASH_RETURN_IF_ERROR(CheckReloadTicket(args));
  return session_->Reload(args, then_wait);
}

StatusOr<uint64_t> Client::Release(uint64_t ticket, void* gpu_stream) {
  return session_->Release(ticket, gpu_stream);
}

StatusOr<uint64_t> Client::BeginStep(uint64_t step, void* gpu_stream) {
  return session_->BeginStep(step, gpu_stream);
}

StatusOr<uint64_t> Client::Unregister(const HostBuffer& buffer) {
  return session_->Unregister(buffer);
}

StatusOr<uint64_t> Client::UnregisterDevice(const void* pointer) {
  return session_->UnregisterDevice(pointer);
}

Status Client::ReleaseDeviceMappings(int64_t timeout_ms) {
  return session_->ReleaseDeviceMappings(timeout_ms);
}

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
  CudaSide* cuda = session_->cuda();
  HostBuffer::Rep* buffer = point.buffer != nullptr ? &point.buffer->rep() : nullptr;
  STASH_ASSIGN_OR_RETURN(uint64_t address, DeviceCounter(cuda, point, buffer, "EnqueueSignal"));
  return cuda->WriteValue(stream, address, point.value);
}

Status Client::EnqueueWait(const EventPoint& point, void* stream) {
  CudaSide* cuda = session_->cuda();
  HostBuffer::Rep* buffer = point.buffer != nullptr ? &point.buffer->rep() : nullptr;
  STASH_ASSIGN_OR_RETURN(uint64_t address, DeviceCounter(cuda, point, buffer, "EnqueueWait"));
  return cuda->WaitValue(stream, address, point.value);
}

StatusOr<Completion> Client::Wait(uint64_t op, int64_t timeout_ms) {
  return session_->Wait(op, timeout_ms);
}

std::optional<StatusOr<Completion>> Client::Poll(uint64_t op) { return session_->Poll(op); }

Status Client::GraphsDestroyed() { return session_->GraphsDestroyed(); }

StepFlags Client::CurrentStepFlags() const { return session_->CurrentStepFlags(); }

StatusOr<SessionStats> Client::Stats() { return session_->Stats(); }

v1::Welcome Client::welcome() const { return session_->welcome(); }
std::string Client::session_id() const { return welcome().session_id(); }
uint64_t Client::page_bytes() const { return welcome().page_bytes(); }
uint64_t Client::pool_pages() const { return welcome().pool_pages(); }
uint64_t Client::host_tier_pages() const { return welcome().host_tier_pages(); }
const std::string& Client::socket() const { return session_->socket(); }
Backend Client::backend() const { return session_->backend(); }
Mode Client::mode() const { return session_->mode(); }

}  // namespace stash
