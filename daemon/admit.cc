#include "daemon/admit.h"

#include "common/text.h"

namespace stash::daemon {
namespace {

namespace v1 = stash::v1;

const char* BackendName(v1::Backend b) {
  switch (b) {
    case v1::BACKEND_HOST:
      return "host";
    case v1::BACKEND_CUDA:
      return "cuda";
    default:
      return "unspecified";
  }
}

// a * b, or false when it does not fit in 64 bits.
bool MulFits(uint64_t a, uint64_t b, uint64_t* out) {
  if (a != 0 && b > UINT64_MAX / a) return false;
  *out = a * b;
  return true;
}

// [ref.offset, ref.offset + len) must lie inside a declared memory. `what` names the field.
Status CheckRange(Session& s, const v1::MemoryRef& ref, uint64_t len, const char* what)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu()) {
  auto it = s.declared_memories().find(ref.memory_id());
  if (it == s.declared_memories().end()) {
    return NotFoundError(std::string(what) + " names memory " + std::to_string(ref.memory_id()) +
                         ", which is not registered in this session: send RegisterMemory first");
  }
  const uint64_t size = it->second;
  if (ref.offset() > size || len > size - ref.offset()) {
    return InvalidArgumentError(std::string(what) + " [" + std::to_string(ref.offset()) + ", " +
                                std::to_string(ref.offset()) + " + " + std::to_string(len) +
                                ") runs past the end of memory " + std::to_string(ref.memory_id()) +
                                " (" + std::to_string(size) + " bytes)");
  }
  return Status::Ok();
}

Status CheckEvent(Session& s, const v1::EventRef& ev, v1::Backend backend, const char* what)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu()) {
  (void)backend;
  if (ev.has_cuda_ipc_event()) {
    // Both backends order work with counters (docs/design.md, "Events"): an IPC event can be
    // waited on only after its record was issued, which the trainer cannot know without a round
    // trip; a counter wait (cuStreamWaitValue64) can be issued at once.
    return InvalidArgumentError(std::string(what) +
                                " is a CUDA IPC event; stashd orders work with 64-bit counters "
                                "in registered host memory on every backend: set EventRef.counter");
  }
  if (!ev.has_counter()) return InvalidArgumentError(std::string(what) + " names no event");
  if (ev.counter().offset() % 8 != 0) {
    return InvalidArgumentError(std::string(what) + " counter offset " +
                                std::to_string(ev.counter().offset()) + " is not 8-byte aligned");
  }
  return CheckRange(s, ev.counter(), 8, what);
}

Status AdmitRegister(const v1::RegisterMemory& reg, Session& s, const AdmitLimits& limits)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu()) {
  if (reg.memory_id() == 0) return InvalidArgumentError("memory_id must be nonzero");
  if (reg.bytes() == 0) return InvalidArgumentError("memory bytes must be > 0");
  // The cuda backend takes device memory (CUDA IPC) and host memfds (event counters).
  switch (reg.kind()) {
    case v1::MEMORY_KIND_HOST_FD:
      if (!reg.handle().empty()) {
        return InvalidArgumentError(
            "MEMORY_KIND_HOST_FD memory has no handle: leave RegisterMemory.handle empty (the "
            "descriptor travels over the descriptor channel)");
      }
      break;
    case v1::MEMORY_KIND_CUDA_IPC:
      if (limits.backend != v1::BACKEND_CUDA) {
        return FailedPreconditionError(
            "this daemon runs the host backend, which takes only MEMORY_KIND_HOST_FD memory, not "
            "MEMORY_KIND_CUDA_IPC: start stashd with --backend=cuda on a GPU node");
      }
      if (reg.handle().size() != 64) {
        return InvalidArgumentError(
            "a CUDA IPC memory handle is 64 bytes (cudaIpcMemHandle_t), not " +
            std::to_string(reg.handle().size()));
      }
      break;
    default:
      if (reg.kind() == 1) {
        return InvalidArgumentError(
            "memory kind 1 (MEMORY_KIND_HOST_SHM, a shared-memory name) was removed: host memory "
            "travels as a sealed memfd over the descriptor channel (MEMORY_KIND_HOST_FD); "
            "update the client library");
      }
      return InvalidArgumentError(
          "memory kind " + std::to_string(reg.kind()) +
          " is not a known MemoryKind: use MEMORY_KIND_HOST_FD (3)" +
          (limits.backend == v1::BACKEND_CUDA ? " or MEMORY_KIND_CUDA_IPC (2)" : std::string()));
  }
  if (s.declared_memories().contains(reg.memory_id())) {
    return AlreadyExistsError("memory " + std::to_string(reg.memory_id()) +
                              " is already registered in this session: pick a new memory_id");
  }
  if (s.declared_memories().size() >= limits.max_memories) {
    return ResourceExhaustedError("this session has " +
                                  std::to_string(s.declared_memories().size()) +
                                  " registered allocations, the limit per session: unregister "
                                  "some first, or reuse buffers");
  }
  if (limits.memories_total != nullptr) {
    uint64_t total = limits.memories_total->load(std::memory_order_relaxed);
    do {
      if (total >= limits.max_memories_total) {
        return ResourceExhaustedError(
            "stashd holds " + std::to_string(total) +
            " registered allocations over all sessions, the limit (half of vm.max_map_count): "
            "unregister some first, or reuse buffers");
      }
    } while (
        !limits.memories_total->compare_exchange_weak(total, total + 1, std::memory_order_relaxed));
  }
  s.declared_memories()[reg.memory_id()] = reg.bytes();
  return Status::Ok();
}

Status AdmitStash(const v1::Stash& st, Session& s, const AdmitLimits& limits)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu()) {
  if (st.ticket() == 0) return InvalidArgumentError("ticket must be nonzero");
  if (st.row_bytes() == 0) return InvalidArgumentError("row_bytes must be > 0");
  if (st.max_rows() == 0) return InvalidArgumentError("max_rows must be > 0");
  if (s.live_tickets().contains(st.ticket())) {
    return AlreadyExistsError("ticket " + Hex(st.ticket()) +
                              " is already a live stash of this session: use a fresh ticket");
  }
  uint64_t buffer_bytes = 0;
  if (!MulFits(st.max_rows(), st.row_bytes(), &buffer_bytes)) {
    return InvalidArgumentError("max_rows * row_bytes overflows 64 bits");
  }
  if (!st.has_source()) return InvalidArgumentError("stash needs a source");
  if (Status r = CheckRange(s, st.source(), buffer_bytes, "stash source"); !r.ok()) return r;
  switch (st.count().source_case()) {
    case v1::RowCount::kValue:
      break;
    case v1::RowCount::kReference:
      if (st.count().reference().offset() % 8 != 0) {
        return InvalidArgumentError("count reference offset " +
                                    std::to_string(st.count().reference().offset()) +
                                    " is not 8-byte aligned (it names an int64)");
      }
      if (Status r = CheckRange(s, st.count().reference(), 8, "count reference"); !r.ok()) {
        return r;
      }
      break;
    default:
      return InvalidArgumentError("stash count must be set: a value or a reference");
  }
  if (st.count().divisor() > (1u << 20)) {
    return InvalidArgumentError("count divisor " + std::to_string(st.count().divisor()) +
                                " is out of range: use 1 for data, 32 for MXFP8 scale_inv");
  }
  if (st.has_ready()) {
    if (Status r = CheckEvent(s, st.ready(), limits.backend, "ready event"); !r.ok()) return r;
  }
  if (st.has_done()) {
    if (Status r = CheckEvent(s, st.done(), limits.backend, "done event"); !r.ok()) return r;
  }
  s.live_tickets()[st.ticket()] = TicketShape{st.row_bytes(), st.max_rows()};
  return Status::Ok();
}

Status AdmitReload(const v1::Reload& rl, Session& s, const AdmitLimits& limits)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu()) {
  auto it = s.live_tickets().find(rl.ticket());
  if (it == s.live_tickets().end()) {
    return NotFoundError("ticket " + Hex(rl.ticket()) +
                         " is not a live stash of this session (never stashed here, already "
                         "reloaded or released, or it overflowed)");
  }
  if (!rl.has_destination()) return InvalidArgumentError("reload needs a destination");
  const TicketShape shape = it->second;
  if (Status r = CheckRange(s, rl.destination(), shape.max_rows * shape.row_bytes,
                            "reload destination (max_rows * row_bytes of the stash)");
      !r.ok()) {
    return r;
  }
  if (rl.has_ready()) {
    if (Status r = CheckEvent(s, rl.ready(), limits.backend, "ready event"); !r.ok()) return r;
  }
  if (rl.has_done()) {
    if (Status r = CheckEvent(s, rl.done(), limits.backend, "done event"); !r.ok()) return r;
  }
  s.live_tickets().erase(it);
  return Status::Ok();
}

}  // namespace

Status CheckHello(const v1::Hello& hello, v1::Backend backend, int pools) {
  if (hello.backend() == v1::BACKEND_UNSPECIFIED) {
    return FailedPreconditionError(std::string("Hello names no backend: set Hello.backend to ") +
                                   v1::Backend_Name(backend) + ", the backend this daemon runs");
  }
  if (hello.backend() != backend) {
    return FailedPreconditionError(std::string("this daemon runs the ") + BackendName(backend) +
                                   " backend but the client speaks " +
                                   BackendName(hello.backend()) +
                                   ": start stashd with --backend=" + BackendName(hello.backend()) +
                                   " or use a client built for " + BackendName(backend));
  }
  // A cuda client names its GPU by UUID too: the daemon picks the pool by UUID, and the index is
  // the client's own CUDA ordinal (device 5 of 8 may be pool 1 of a daemon serving 4).
  const bool by_uuid = backend == v1::BACKEND_CUDA && !hello.device_uuid().empty();
  if (hello.device() < 0 || (!by_uuid && hello.device() >= pools)) {
    return InvalidArgumentError("device " + std::to_string(hello.device()) +
                                " is out of range: this daemon has " + std::to_string(pools) +
                                " pool(s) (devices 0.." + std::to_string(pools - 1) + ")");
  }
  return Status::Ok();
}

Status AdmitRequest(const v1::SessionRequest& request, Session& session,
                    const AdmitLimits& limits) {
  if (request.request_id() == 0) return InvalidArgumentError("request_id must be nonzero");
  if (session.counters().inflight.load(std::memory_order_relaxed) >= limits.max_inflight) {
    return ResourceExhaustedError("this session has " + std::to_string(limits.max_inflight) +
                                  " requests in flight, the limit (--max-inflight): wait for "
                                  "completions before sending more");
  }
  MutexLock lock(&session.mu());
  switch (request.kind_case()) {
    case v1::SessionRequest::kHello:
      return FailedPreconditionError("this session already said Hello");
    case v1::SessionRequest::kRegisterMemory:
      return AdmitRegister(request.register_memory(), session, limits);
    case v1::SessionRequest::kUnregisterMemory: {
      const uint64_t id = request.unregister_memory().memory_id();
      if (session.declared_memories().erase(id) == 0) {
        return NotFoundError("memory " + std::to_string(id) + " is not registered in this session");
      }
      if (limits.memories_total != nullptr) {
        limits.memories_total->fetch_sub(1, std::memory_order_relaxed);
      }
      return Status::Ok();
    }
    case v1::SessionRequest::kStash:
      return AdmitStash(request.stash(), session, limits);
    case v1::SessionRequest::kReload:
      return AdmitReload(request.reload(), session, limits);
    case v1::SessionRequest::kRelease: {
      const uint64_t ticket = request.release().ticket();
      if (session.live_tickets().erase(ticket) == 0) {
        return NotFoundError("ticket " + Hex(ticket) +
                             " is not a live stash of this session (never stashed here, already "
                             "reloaded or released, or it overflowed)");
      }
      return Status::Ok();
    }
    case v1::SessionRequest::kBeginStep:
      return Status::Ok();
    case v1::SessionRequest::KIND_NOT_SET:
      break;
  }
  return InvalidArgumentError(
      "request has no kind: set one of register_memory, stash, "
      "reload, release, begin_step, unregister_memory");
}

}  // namespace stash::daemon
