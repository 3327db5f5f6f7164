// Daemon-copy's operations: each stash, reload, release, step and unregistration as a request
// on the session stream (CopySession's half that used to be client.cc's inline branch). The
// session's life across restarts and drains is copy_session.cc.
#include <algorithm>
#include <chrono>
#include <mutex>
#include <vector>

#include "client/copy/copy_session.h"
#include "client/memory/cuda_memory.h"
#include "client/session/argument_checks.h"
#include "client/session/session_stream.h"
#include "common/macros.h"

namespace stash::client {

namespace {

// One side of a copy: where it is in the session's terms, and the memory to register for it.
struct Region {
  uint64_t memory_id = 0;
  uint64_t offset = 0;
  SessionStream::MemoryDesc memory;
  std::vector<uint64_t> stale;  // allocations freed since, at this one's addresses: unregister
};

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

void SetRef(const Region& region, v1::MemoryRef* out) {
  out->set_memory_id(region.memory_id);
  out->set_offset(region.offset);
}

}  // namespace

StatusOr<uint64_t> CopySession::Stash(const StashArgs& args, bool then_wait) {
  STASH_RETURN_IF_ERROR(CheckNoStream(args.stream, "stash stream"));
  STASH_ASSIGN_OR_RETURN(Region source, ResolveRegion(cuda(), args.source, args.device_source,
                                                      args.offset, args.max_rows * args.row_bytes,
                                                      "stash source", "stash device_source"));
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
        Region count, ResolveRegion(cuda(), args.count.buffer, args.count.device_count,
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
  std::shared_ptr<SessionStream> stream = Current();
  if (stream == nullptr || stream->keeps_stashes()) {
    // The daemon drains: nothing is sent, the caller keeps its buffer (OVERFLOW), and the step
    // is not flagged (nothing was lost).
    EndIfDrained();
    SignalEvent(args.done);
    Completion kept;
    kept.kind = Completion::Kind::kStash;
    kept.tier = Tier::kOverflow;
    return Local(kept);
  }
  return stream->Submit(std::move(r), Completion::Kind::kStash, memories, stale, std::move(done),
                        WriterOf(then_wait));
}

StatusOr<uint64_t> CopySession::Reload(const ReloadArgs& args, bool then_wait) {
  STASH_RETURN_IF_ERROR(CheckNoStream(args.stream, "reload stream"));
  // The daemon checks that the destination holds the stash's max_rows * row_bytes.
  STASH_ASSIGN_OR_RETURN(
      Region destination,
      ResolveRegion(cuda(), args.destination, args.device_destination, args.offset, 0,
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
  STASH_ASSIGN_OR_RETURN(std::shared_ptr<SessionStream> stream, ForTicket(args.ticket));
  return stream->Submit(std::move(r), Completion::Kind::kReload, memories, destination.stale,
                        std::move(done), WriterOf(then_wait));
}

StatusOr<uint64_t> CopySession::Release(uint64_t ticket, void* gpu_stream) {
  STASH_RETURN_IF_ERROR(CheckNoStream(gpu_stream, "release stream"));
  STASH_ASSIGN_OR_RETURN(std::shared_ptr<SessionStream> stream, ForTicket(ticket));
  v1::SessionRequest r;
  r.mutable_release()->set_ticket(ticket);
  return stream->Submit(std::move(r), Completion::Kind::kRelease, {}, {}, {});
}

StatusOr<uint64_t> CopySession::BeginStep(uint64_t step, void* gpu_stream) {
  STASH_RETURN_IF_ERROR(CheckNoStream(gpu_stream, "begin_step stream"));
  // A session that broke or drained is replaced here, once a daemon takes one.
  STASH_ASSIGN_OR_RETURN(std::shared_ptr<SessionStream> stream, ForStep());
  if (stream == nullptr) {
    // Drained, and no daemon takes a session yet: the step runs here, stashes kept in-process.
    Completion begun;
    begun.kind = Completion::Kind::kBeginStep;
    return Local(begun);
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

StatusOr<uint64_t> CopySession::Unregister(const HostBuffer& buffer) {
  std::shared_ptr<SessionStream> stream = Current();
  Completion unregistered;
  unregistered.kind = Completion::Kind::kUnregister;
  // No session, or a broken one: no daemon maps the buffer any more.
  if (stream == nullptr || stream->broken_now()) return Local(unregistered);
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

StatusOr<uint64_t> CopySession::UnregisterDevice(const void* pointer) {
  if (cuda() == nullptr) {
    return FailedPreconditionError("device memory exists only on the cuda backend");
  }
  const uint64_t id = cuda()->Forget(pointer);
  std::shared_ptr<SessionStream> stream = Current();
  if (stream == nullptr || stream->broken_now()) {
    Completion unregistered;
    unregistered.kind = Completion::Kind::kUnregister;
    return Local(unregistered);
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

Status CopySession::ReleaseDeviceMappings(int64_t timeout_ms) {
  if (cuda() == nullptr) return Status::Ok();
  std::shared_ptr<SessionStream> stream = Current();
  std::vector<uint64_t> ops;
  for (uint64_t id : cuda()->ForgetAll()) {
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

}  // namespace stash::client
