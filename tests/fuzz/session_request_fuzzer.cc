// libFuzzer target: arbitrary bytes as a short sequence of SessionRequests
// (SessionRequest::ParseFromArray) through admission (daemon/copy/admit.h) against a session that
// already holds registered memories of known sizes and live tickets (session_input.h). Hellos
// also go through CheckHello.
//
// After every request it checks what must always hold, against a model it keeps of the session's
// receive-side state, and aborts on a violation:
//   - a rejected request changes nothing; an admitted one changes exactly its own effect;
//   - an admitted Stash's source, count reference and events lie inside a registered memory
//     (checked in 128-bit arithmetic), aligned, with nonzero ids and sizes; likewise Reload;
//   - an admitted registration is of a kind this backend takes, with the handle that kind has
//     (none for MEMORY_KIND_HOST_FD, 64 bytes for MEMORY_KIND_CUDA_IPC);
//   - a status is OK with an empty message, or one of admission's documented codes with a
//     message that is valid UTF-8, not empty and at most 4 KiB;
//   - the in-flight and registration limits hold (per session and daemon-wide), and the
//     daemon-wide count of registrations follows registrations and unregistrations;
//   - every ticket this input stashed can be reloaded into the range it came from while that
//     memory is still registered (the stash-then-reload path, run after the sequence).
//
// STASH_FUZZ_TRACE=1 prints each request and its status (to read what a crashing input does).
#include <google/protobuf/stubs/logging.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <string_view>

#include "common/mutex.h"
#include "daemon/copy/admit.h"
#include "daemon/sessions/group_registry.h"
#include "daemon/sessions/session.h"
#include "stash/v1/stash.pb.h"
#include "tests/fuzz/session_input.h"
#include "tests/fuzz/utf8.h"

namespace stash::fuzz {
namespace {

namespace v1 = stash::v1;
using daemon::AdmitLimits;
using daemon::FairShare;
using daemon::Session;
using daemon::SessionInfo;
using daemon::TicketShape;

constexpr size_t kMaxMessageBytes = 4096;

[[noreturn]] void Violated(const char* invariant, const v1::SessionRequest& request,
                           const Status& status) {
  std::fprintf(stderr,
               "session_request_fuzzer: invariant violated: %s\n  request: %s\n  status: %s\n",
               invariant, request.ShortDebugString().c_str(), status.ToString().c_str());
  std::abort();
}

#define FUZZ_CHECK(cond, request, status)              \
  do {                                                 \
    if (!(cond)) Violated(#cond, (request), (status)); \
  } while (0)

// The receive-side state of a session, as a value that can be compared.
struct Model {
  std::map<uint64_t, uint64_t> memories;                      // id -> bytes
  std::map<uint64_t, std::pair<uint64_t, uint64_t>> tickets;  // ticket -> (row_bytes, max_rows)

  friend bool operator==(const Model& a, const Model& b) {
    return a.memories == b.memories && a.tickets == b.tickets;
  }
};

Model Snapshot(Session& s) {
  MutexLock lock(&s.mu());
  Model m;
  for (const auto& [id, bytes] : s.declared_memories()) m.memories[id] = bytes;
  // A ticket claimed by a queued Reload or Release is no longer live for new requests (it stays
  // in the map until the worker took its pages, so that a failed reload can give it back).
  for (const auto& [t, shape] : s.live_tickets()) {
    if (!shape.claimed) m.tickets[t] = {shape.row_bytes, shape.max_rows};
  }
  return m;
}

using u128 = unsigned __int128;

// [ref.offset, ref.offset + len) lies inside a memory of `m`.
bool Inside(const Model& m, const v1::MemoryRef& ref, u128 len) {
  auto it = m.memories.find(ref.memory_id());
  return it != m.memories.end() && u128{ref.offset()} + len <= u128{it->second};
}

bool EventOk(const Model& m, const v1::EventRef& ev) {
  return ev.has_counter() && ev.counter().offset() % 8 == 0 && Inside(m, ev.counter(), 8);
}

// Where an admitted stash came from, to reload it there at the end.
struct Stashed {
  v1::MemoryRef source;
  uint64_t memory_bytes = 0;
};

class Harness {
 public:
  explicit Harness(uint8_t setup)
      : setup_(setup),
        max_memories_total_((setup & kSetupTightTotal) != 0 ? kTightMemoriesTotal : 32768),
        memories_total_({"registered allocations", max_memories_total_, 0, 0, "unregister"}),
        session_(SessionInfo{}, nullptr, nullptr, {&memories_total_, nullptr, nullptr}) {
    limits_.backend = (setup & kSetupCuda) != 0 ? v1::BACKEND_CUDA : v1::BACKEND_HOST;
    if ((setup & kSetupTight) != 0) {
      limits_.max_inflight = kTightInflight;
      limits_.max_memories = kTightMemories;
    }
    // Memories up to 2^62 bytes exercise the 64-bit range arithmetic; the byte caps of a
    // registration have their unit tests (Admit.RegistrationsAreBoundedInBytes).
    limits_.max_memory_bytes = UINT64_MAX;
    limits_.max_counter_memory_bytes = UINT64_MAX;
    MustAdmit(Register(kSmallMemory, kSmallMemoryBytes, v1::MEMORY_KIND_HOST_FD));
    MustAdmit(Register(kBigMemory, kBigMemoryBytes, v1::MEMORY_KIND_HOST_FD));
    MustAdmit(Register(kHugeMemory, kHugeMemoryBytes, v1::MEMORY_KIND_HOST_FD));
    if (limits_.backend == v1::BACKEND_CUDA) {
      MustAdmit(Register(kCudaMemory, kCudaMemoryBytes, v1::MEMORY_KIND_CUDA_IPC));
    }
    MustAdmit(StashOf(kTicketBig, kBigMemory, 64, 16));
    MustAdmit(StashOf(kTicketSmall, kSmallMemory, 8, 512));
    session_.counters().inflight = 0;  // the setup's requests completed
  }

  void Run(const v1::SessionRequest& request) {
    if (request.has_hello()) CheckHelloOf(request.hello());
    const Model before = Snapshot(session_);
    const uint64_t inflight = session_.counters().inflight.load();
    const uint64_t total = memories_total_.used();
    const Status status = daemon::AdmitRequest(request, session_, limits_);
    if (trace_) {
      std::fprintf(stderr, "%s -> %s\n", request.ShortDebugString().c_str(),
                   status.ToString().c_str());
    }
    const Model after = Snapshot(session_);
    CheckMessage(request, status);
    if (!status.ok()) {
      FUZZ_CHECK(status.code() == StatusCode::kInvalidArgument ||
                     status.code() == StatusCode::kNotFound ||
                     status.code() == StatusCode::kAlreadyExists ||
                     status.code() == StatusCode::kResourceExhausted ||
                     status.code() == StatusCode::kFailedPrecondition,
                 request, status);
      FUZZ_CHECK(after == before, request, status);
      FUZZ_CHECK(memories_total_.used() == total, request, status);
      return;
    }
    FUZZ_CHECK(request.request_id() != 0, request, status);
    FUZZ_CHECK(inflight < limits_.max_inflight, request, status);
    Model expected = before;
    switch (request.kind_case()) {
      case v1::SessionRequest::kRegisterMemory: {
        const v1::RegisterMemory& reg = request.register_memory();
        FUZZ_CHECK(reg.memory_id() != 0 && reg.bytes() != 0, request, status);
        FUZZ_CHECK(!before.memories.count(reg.memory_id()), request, status);
        FUZZ_CHECK(before.memories.size() < limits_.max_memories, request, status);
        FUZZ_CHECK(total < max_memories_total_, request, status);
        if (reg.kind() == v1::MEMORY_KIND_HOST_FD) {
          FUZZ_CHECK(reg.handle().empty(), request, status);
        } else {
          FUZZ_CHECK(limits_.backend == v1::BACKEND_CUDA &&
                         reg.kind() == v1::MEMORY_KIND_CUDA_IPC && reg.handle().size() == 64,
                     request, status);
        }
        expected.memories[reg.memory_id()] = reg.bytes();
        break;
      }
      case v1::SessionRequest::kUnregisterMemory:
        FUZZ_CHECK(expected.memories.erase(request.unregister_memory().memory_id()) == 1, request,
                   status);
        break;
      case v1::SessionRequest::kStash: {
        const v1::Stash& st = request.stash();
        FUZZ_CHECK(st.ticket() != 0 && st.row_bytes() != 0 && st.max_rows() != 0, request, status);
        FUZZ_CHECK(!before.tickets.count(st.ticket()), request, status);
        const u128 bytes = u128{st.max_rows()} * st.row_bytes();
        FUZZ_CHECK(bytes <= UINT64_MAX, request, status);
        FUZZ_CHECK(st.has_source() && Inside(before, st.source(), bytes), request, status);
        FUZZ_CHECK(st.count().has_value() ||
                       (st.count().has_reference() && st.count().reference().offset() % 8 == 0 &&
                        Inside(before, st.count().reference(), 8)),
                   request, status);
        FUZZ_CHECK(!st.has_ready() || EventOk(before, st.ready()), request, status);
        FUZZ_CHECK(!st.has_done() || EventOk(before, st.done()), request, status);
        expected.tickets[st.ticket()] = {st.row_bytes(), st.max_rows()};
        stashed_[st.ticket()] = Stashed{st.source(), before.memories.at(st.source().memory_id())};
        break;
      }
      case v1::SessionRequest::kReload: {
        const v1::Reload& rl = request.reload();
        auto it = before.tickets.find(rl.ticket());
        FUZZ_CHECK(it != before.tickets.end(), request, status);
        const u128 bytes = u128{it->second.first} * it->second.second;
        FUZZ_CHECK(rl.has_destination() && Inside(before, rl.destination(), bytes), request,
                   status);
        FUZZ_CHECK(!rl.has_ready() || EventOk(before, rl.ready()), request, status);
        FUZZ_CHECK(!rl.has_done() || EventOk(before, rl.done()), request, status);
        expected.tickets.erase(rl.ticket());
        stashed_.erase(rl.ticket());
        break;
      }
      case v1::SessionRequest::kRelease:
        FUZZ_CHECK(expected.tickets.erase(request.release().ticket()) == 1, request, status);
        stashed_.erase(request.release().ticket());
        break;
      case v1::SessionRequest::kBeginStep:
        break;
      case v1::SessionRequest::kHello:
      case v1::SessionRequest::KIND_NOT_SET:
        FUZZ_CHECK(!"admitted a Hello or a request without a kind", request, status);
    }
    FUZZ_CHECK(after == expected, request, status);
    FUZZ_CHECK(memories_total_.used() == after.memories.size(), request, status);
    session_.counters().inflight.fetch_add(1);  // queued, as the pool does
  }

  // Reloads every ticket this input stashed, and that is still live, into the range it came
  // from: admitted whenever that memory is still registered with the same size.
  void ReloadWhatWasStashed() {
    session_.counters().inflight = 0;  // the sequence completed
    const auto stashed = stashed_;
    for (const auto& [ticket, where] : stashed) {
      v1::SessionRequest r;
      r.set_request_id(next_id_++);
      r.mutable_reload()->set_ticket(ticket);
      *r.mutable_reload()->mutable_destination() = where.source;
      const Model before = Snapshot(session_);
      auto mem = before.memories.find(where.source.memory_id());
      const bool same_memory = mem != before.memories.end() && mem->second == where.memory_bytes;
      const Status status = daemon::AdmitRequest(r, session_, limits_);
      session_.counters().inflight = 0;
      CheckMessage(r, status);
      FUZZ_CHECK(status.ok() || !same_memory, r, status);
      if (status.ok()) FUZZ_CHECK(!Snapshot(session_).tickets.count(ticket), r, status);
    }
  }

 private:
  void CheckMessage(const v1::SessionRequest& request, const Status& status) {
    if (status.ok()) {
      FUZZ_CHECK(status.message().empty(), request, status);
      return;
    }
    FUZZ_CHECK(!status.message().empty(), request, status);
    FUZZ_CHECK(status.message().size() <= kMaxMessageBytes, request, status);
    FUZZ_CHECK(IsUtf8(status.message()), request, status);
  }

  void CheckHelloOf(const v1::Hello& hello) {
    v1::SessionRequest as_request;  // for the report only
    *as_request.mutable_hello() = hello;
    const int pools = PoolsOf(setup_);
    const Status status = daemon::CheckHello(hello, limits_.backend, pools);
    CheckMessage(as_request, status);
    if (status.ok()) {
      FUZZ_CHECK(hello.backend() == limits_.backend, as_request, status);
      // A cuda Hello that names its GPU by UUID may carry an ordinal past the pool count
      // (admit.h): the pool is picked by UUID.
      const bool by_uuid = limits_.backend == v1::BACKEND_CUDA && !hello.device_uuid().empty();
      FUZZ_CHECK(hello.device() >= 0 && (hello.device() < pools || by_uuid), as_request, status);
      // Groups: none (both empty), or a name of the allowed shape with a 32-byte secret.
      FUZZ_CHECK(daemon::CheckGroupFields(hello.group(), hello.group_secret()).ok(), as_request,
                 status);
      FUZZ_CHECK(hello.group().empty() ? hello.group_secret().empty()
                                       : hello.group_secret().size() == daemon::kGroupSecretBytes &&
                                             hello.group().size() <= daemon::kMaxGroupNameBytes,
                 as_request, status);
    } else {
      FUZZ_CHECK(status.code() == StatusCode::kInvalidArgument ||
                     status.code() == StatusCode::kFailedPrecondition,
                 as_request, status);
    }
  }

  v1::SessionRequest Register(uint64_t id, uint64_t bytes, v1::MemoryKind kind) {
    v1::SessionRequest r;
    r.set_request_id(next_id_++);
    v1::RegisterMemory* m = r.mutable_register_memory();
    m->set_memory_id(id);
    m->set_kind(kind);
    m->set_bytes(bytes);
    if (kind == v1::MEMORY_KIND_CUDA_IPC) m->set_handle(std::string(64, 'h'));
    return r;
  }

  v1::SessionRequest StashOf(uint64_t ticket, uint64_t memory_id, uint64_t row_bytes,
                             uint64_t max_rows) {
    v1::SessionRequest r;
    r.set_request_id(next_id_++);
    v1::Stash* s = r.mutable_stash();
    s->set_ticket(ticket);
    s->mutable_source()->set_memory_id(memory_id);
    s->set_row_bytes(row_bytes);
    s->set_max_rows(max_rows);
    s->mutable_count()->set_value(max_rows);
    return r;
  }

  void MustAdmit(const v1::SessionRequest& r) {
    const Status status = daemon::AdmitRequest(r, session_, limits_);
    FUZZ_CHECK(status.ok(), r, status);
  }

  const uint8_t setup_;
  const bool trace_ = std::getenv("STASH_FUZZ_TRACE") != nullptr;
  AdmitLimits limits_;
  const uint64_t max_memories_total_;
  FairShare memories_total_;  // this is the daemon's only session: its one user
  Session session_;
  std::map<uint64_t, Stashed> stashed_;   // admitted by this input and still live
  uint64_t next_id_ = uint64_t{1} << 63;  // setup and follow-up ids, apart from the input's
};

}  // namespace
}  // namespace stash::fuzz

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  // Parsing arbitrary bytes makes protobuf log (invalid UTF-8 in string fields); that output
  // would drown libFuzzer's and slow it down.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const stash::fuzz::SessionInput input = stash::fuzz::SplitInput(data, size);
  stash::fuzz::Harness harness(input.setup);
  for (std::string_view record : input.records) {
    stash::v1::SessionRequest request;
    if (!request.ParseFromArray(record.data(), static_cast<int>(record.size()))) continue;
    harness.Run(request);
  }
  harness.ReloadWhatWasStashed();
  return 0;
}
