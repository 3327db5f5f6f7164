#include "daemon/copy/admit.h"

#include "common/macros.h"
#include "common/text.h"
#include "daemon/protocol/enum_choices.h"
#include "daemon/sessions/group_registry.h"

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

// Names, labels and tags are at most kMaxTextBytes; the message gives the size, not the text.
Status CheckTextSize(const std::string& text, const char* field) {
  if (text.size() <= kMaxTextBytes) return Status::Ok();
  return InvalidArgumentError(std::string(field) + " is " + std::to_string(text.size()) +
                              " bytes, over the limit of " + std::to_string(kMaxTextBytes) +
                              " bytes: shorten it");
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

// A Reload or Release may name only a live ticket that no earlier queued Reload or Release
// claimed. `it` is the ticket's entry in live_tickets (or end()).
Status CheckUnclaimed(Session& s, absl::flat_hash_map<uint64_t, TicketShape>::iterator it,
                      uint64_t ticket) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu()) {
  if (it == s.live_tickets().end()) {
    return NotFoundError("ticket " + Hex(ticket) +
                         " is not a live stash of this session (never stashed here, already "
                         "reloaded or released, or it overflowed)");
  }
  if (it->second.claimed) {
    return NotFoundError("ticket " + Hex(ticket) +
                         " is not a live stash of this session any more: an earlier reload or "
                         "release of it is queued (already reloaded or released once that one "
                         "succeeds; if it fails, the stash stays and may be reloaded again)");
  }
  return Status::Ok();
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
      return InvalidArgumentError(UnknownEnumValue<v1::MemoryKind>("memory kind", reg.kind()));
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
  const uint64_t max_bytes =
      limits.backend == v1::BACKEND_CUDA && reg.kind() == v1::MEMORY_KIND_HOST_FD
          ? limits.max_counter_memory_bytes
          : limits.max_memory_bytes;
  if (reg.bytes() > max_bytes) {
    return InvalidArgumentError(
        "memory of " + std::to_string(reg.bytes()) + " bytes is more than the " +
        std::to_string(max_bytes) + " one registration may hold" +
        (max_bytes == limits.max_counter_memory_bytes
             ? std::string(" on the cuda backend (host memory holds only counters there)")
             : std::string()) +
        ": register smaller buffers");
  }
  // The daemon-wide budgets, shared fairly between users (daemon/limits/fair_share.h).
  const SharedBudgets& shared = s.budgets();
  const uint32_t uid = s.info().uid;
  if (shared.bytes != nullptr) STASH_RETURN_IF_ERROR(shared.bytes->Take(uid, reg.bytes()));
  if (shared.memories != nullptr) {
    if (Status taken = shared.memories->Take(uid, 1); !taken.ok()) {
      if (shared.bytes != nullptr) shared.bytes->Give(uid, reg.bytes());
      return taken;
    }
  }
  s.declared_memories()[reg.memory_id()] = reg.bytes();
  return Status::Ok();
}

Status AdmitStash(const v1::Stash& st, Session& s, const AdmitLimits& limits)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu()) {
  if (st.ticket() == 0) return InvalidArgumentError("ticket must be nonzero");
  if (Status r = CheckTextSize(st.name(), "Stash.name"); !r.ok()) return r;
  if (st.row_bytes() == 0) return InvalidArgumentError("row_bytes must be > 0");
  if (st.max_rows() == 0) return InvalidArgumentError("max_rows must be > 0");
  if (auto live = s.live_tickets().find(st.ticket()); live != s.live_tickets().end()) {
    return AlreadyExistsError(
        "ticket " + Hex(st.ticket()) + " is already a live stash of this session" +
        (live->second.claimed ? " (a reload or release of it is still queued; it is free "
                                "again once that one succeeded)"
                              : "") +
        ": use a fresh ticket");
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
  if (Status r = CheckUnclaimed(s, it, rl.ticket()); !r.ok()) return r;
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
  // Claimed, not erased: the ticket stays live until the pool worker took its pages, so a
  // reload that fails there (memory that did not open, ...) leaves the stash for a later one.
  it->second.claimed = true;
  return Status::Ok();
}

Status AdmitRelease(const v1::Release& rl, Session& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu()) {
  auto it = s.live_tickets().find(rl.ticket());
  if (Status r = CheckUnclaimed(s, it, rl.ticket()); !r.ok()) return r;
  it->second.claimed = true;
  return Status::Ok();
}

}  // namespace

Status CheckHello(const v1::Hello& hello, v1::Backend backend, int pools) {
  if (!v1::Backend_IsValid(hello.backend())) {
    return InvalidArgumentError(UnknownEnumValue<v1::Backend>("Hello.backend", hello.backend()));
  }
  if (!v1::Mode_IsValid(hello.mode())) {
    return InvalidArgumentError(UnknownEnumValue<v1::Mode>("Hello.mode", hello.mode()));
  }
  STASH_RETURN_IF_ERROR(CheckTextSize(hello.label(), "Hello.label"));
  STASH_RETURN_IF_ERROR(CheckTextSize(hello.client_version(), "Hello.client_version"));
  STASH_RETURN_IF_ERROR(CheckGroupFields(hello.group(), hello.group_secret()));
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

void GiveDeclared(Session& session, uint64_t bytes, uint64_t count) {
  const SharedBudgets& shared = session.budgets();
  if (shared.bytes != nullptr) shared.bytes->Give(session.info().uid, bytes);
  if (shared.memories != nullptr) shared.memories->Give(session.info().uid, count);
}

Status AdmitRequest(const v1::SessionRequest& request, Session& session,
                    const AdmitLimits& limits) {
  if (request.request_id() == 0) return InvalidArgumentError("request_id must be nonzero");
  if (session.info().mapped && request.kind_case() != v1::SessionRequest::kHello) {
    return FailedPreconditionError(
        "this session is in mapped mode (Hello.mode = MODE_MAPPED): the rank pages its "
        "activations itself in the chunks it leased over the descriptor channel, so its stream "
        "carries no RegisterMemory, UnregisterMemory, Stash, Reload, Release or BeginStep; open a "
        "session in mode daemon-copy for those");
  }
  if (session.counters().inflight.load(std::memory_order_relaxed) >= limits.max_inflight) {
    return ResourceExhaustedError("this session has " + std::to_string(limits.max_inflight) +
                                  " requests in flight, the limit (--max-inflight): wait for "
                                  "completions before sending more");
  }
  MutexLock lock(&session.mu());
  switch (request.kind_case()) {
    case v1::SessionRequest::kHello:
      return FailedPreconditionError("this session already said Hello");
    case v1::SessionRequest::kRegisterMemory: {
      Status status = AdmitRegister(request.register_memory(), session, limits);
      // Which request declared it: only that request's failure may undeclare it (Pool).
      if (status.ok()) {
        session.declared_by()[request.register_memory().memory_id()] = request.request_id();
      }
      return status;
    }
    case v1::SessionRequest::kUnregisterMemory: {
      const uint64_t id = request.unregister_memory().memory_id();
      auto it = session.declared_memories().find(id);
      if (it == session.declared_memories().end()) {
        return NotFoundError("memory " + std::to_string(id) + " is not registered in this session");
      }
      GiveDeclared(session, it->second);
      session.declared_memories().erase(it);
      session.declared_by().erase(id);
      return Status::Ok();
    }
    case v1::SessionRequest::kStash:
      return AdmitStash(request.stash(), session, limits);
    case v1::SessionRequest::kReload:
      return AdmitReload(request.reload(), session, limits);
    case v1::SessionRequest::kRelease:
      return AdmitRelease(request.release(), session);
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
