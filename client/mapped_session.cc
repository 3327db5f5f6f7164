#include "client/mapped_session.h"

#include "common/logging.h"
#include "common/macros.h"

namespace stash {
namespace {

uint32_t LeaseTierOf(int tier) {
  switch (tier) {
    case v1::TIER_PEER:
      return kernels::kLeasePeer;
    case v1::TIER_HOST:
      return kernels::kLeaseHost;
    default:
      return kernels::kLeaseDevice;
  }
}

// Reconnect attempts while no daemon answers: the wait doubles from the first up to the most.
constexpr std::chrono::milliseconds kFirstReconnectBackoff(100);
constexpr std::chrono::milliseconds kMaxReconnectBackoff(1000);

uint64_t PagesOf(uint64_t bytes, uint64_t page_bytes) {
  return (bytes + page_bytes - 1) / page_bytes;
}

CounterRef CounterOf(const EventPoint& e) {
  if (e.buffer == nullptr) return {};
  return CounterRef{SessionStream::HostMemory(*e.buffer).memory, e.offset, e.value};
}

Status HostOnly(const char* what) {
  return InvalidArgumentError(std::string(what) +
                              " is a device pointer, which needs the cuda backend: open the "
                              "client with Options.backend = Backend::kCuda");
}

}  // namespace

StatusOr<std::unique_ptr<MappedSession>> MappedSession::Open(const Options& options) {
  if (options.backend == Backend::kCuda) {
    return FailedPreconditionError(
        "mapped mode is built for the host backend only so far; use the daemon-copy mode with "
        "the cuda backend (Python: stashd.connect(backend=\"cuda\", mode=\"daemon-copy\"); "
        "C++: Options.mode = Mode::kDaemonCopy)");
  }
  std::unique_ptr<MappedSession> session(new MappedSession(options));
  std::shared_ptr<SessionStream> stream;
  std::unique_ptr<LeaseTable> table;
  STASH_RETURN_IF_ERROR(session->Connect(&stream, &table));
  session->socket_ = stream->socket;
  {
    MutexLock lock(&session->mu_);
    session->stream_ = std::move(stream);
  }
  MappedSession* raw = session.get();
  session->copier_ = std::make_unique<Copier>(
      std::move(table), options.copy_threads, options.allow_host_spill,
      [raw](uint64_t, std::unique_ptr<LeaseTable>& t, bool live) { raw->OnStep(t, live); });
  return session;
}

Status MappedSession::Connect(std::shared_ptr<SessionStream>* stream_out,
                              std::unique_ptr<LeaseTable>* table_out) {
  STASH_ASSIGN_OR_RETURN(std::unique_ptr<SessionStream> stream,
                         SessionStream::Open(options_, v1::MODE_MAPPED, nullptr));
  const v1::Welcome& w = stream->welcome;
  if (w.chunk_bytes() == 0) {
    return FailedPreconditionError("stashd on " + stream->socket +
                                   " leases no chunks (its Welcome has no chunk_bytes): "
                                   "update it, or use mode daemon-copy");
  }
  const uint64_t max_lease = w.max_lease_bytes() != 0
                                 ? w.max_lease_bytes()
                                 : std::max(w.pool_pages(), w.host_tier_pages()) * w.page_bytes();
  // Each tier's range fits the quota and the tier itself (peer: the other pools, the quota).
  const std::array<uint64_t, kernels::kLeaseTiers> tier_bytes = {
      std::min(max_lease, w.pool_pages() * w.page_bytes()), max_lease,
      std::min(max_lease, w.host_tier_pages() * w.page_bytes())};
  STASH_ASSIGN_OR_RETURN(std::unique_ptr<LeaseTable> table,
                         LeaseTable::Create(w.page_bytes(), w.chunk_bytes(), tier_bytes));
  Status leased = Lease(*table, *stream->descriptors, w, !options_.lease.automatic);
  if (!leased.ok()) {
    // Give back whatever came before the refusal.
    std::vector<uint64_t> ids = table->ChunkIds();
    table.reset();
    if (!ids.empty()) (void)stream->descriptors->Return(ids);
    return leased;
  }
  *stream_out = std::move(stream);
  *table_out = std::move(table);
  return Status::Ok();
}

Status MappedSession::Lease(LeaseTable& table, DescriptorChannel& channel,
                            const v1::Welcome& welcome, bool fixed) {
  std::vector<std::pair<int, uint64_t>> want;
  if (fixed) {
    // Only the tiers this session may lease: peer chunks only from a daemon that lends them,
    // host chunks only with allow_host_spill and a host tier (as in daemon-copy mode, where a
    // session without them simply never spills).
    const uint64_t page = table.page_bytes();
    want.emplace_back(v1::TIER_DEVICE, PagesOf(options_.lease.device_bytes, page));
    if (options_.lease.peer_bytes > 0 && welcome.peer_tier()) {
      want.emplace_back(v1::TIER_PEER, PagesOf(options_.lease.peer_bytes, page));
    }
    if (options_.lease.host_bytes > 0 && options_.allow_host_spill &&
        welcome.host_tier_pages() > 0) {
      want.emplace_back(v1::TIER_HOST, PagesOf(options_.lease.host_bytes, page));
    }
  }
  STASH_ASSIGN_OR_RETURN(LeaseAnswer answer, channel.Lease(!fixed, want));
  Status first = Status::Ok();
  if (answer.control_block.valid()) {
    first = table.SetControlBlock(std::move(answer.control_block), answer.control_block_bytes);
  }
  std::vector<uint64_t> give_back;
  for (LeaseAnswer::Chunk& c : answer.chunks) {
    Status mapped = table.AddChunk(LeaseTierOf(c.tier), c.id, std::move(c.fd), c.bytes);
    if (!mapped.ok()) {
      give_back.push_back(c.id);
      if (first.ok()) first = mapped;
    }
  }
  for (const LeaseAnswer::Held& held : answer.lease) {
    if (held.pages_target >= held.pages) continue;
    std::vector<uint64_t> ids = table.ShrinkTo(LeaseTierOf(held.tier), held.pages_target);
    give_back.insert(give_back.end(), ids.begin(), ids.end());
  }
  if (!give_back.empty()) {
    StatusOr<uint64_t> returned = channel.Return(give_back);
    if (!returned.ok() && first.ok()) first = returned.status();
  }
  if (!answer.status.ok()) return answer.status;
  return first;
}

void MappedSession::OnStep(std::unique_ptr<LeaseTable>& table, bool stashes_live) {
  std::shared_ptr<SessionStream> current = stream();
  if (current->broken_now() || ended_drained_) {
    if (stashes_live) return;  // the chunks held carry the step; reconnect once none is live
    Reconnect(table, current);
    return;
  }
  if (!stashes_live &&
      (kernels::ControlLoad(table->control().daemon_flags) & kernels::kDaemonDraining) != 0) {
    EndDrained(table, current);
    return;
  }
  if (!options_.lease.automatic) return;
  Status st = Lease(*table, *current->descriptors, current->welcome, /*fixed=*/false);
  if (!st.ok() && !unavailable_logged_.exchange(true)) {
    Log("client")->warn(
        "mapped session: the lease was not resized ({}); the step goes on with "
        "the chunks held",
        st.ToString());
  }
}

void MappedSession::Reconnect(std::unique_ptr<LeaseTable>& table,
                              const std::shared_ptr<SessionStream>& old) {
  const auto now = std::chrono::steady_clock::now();
  if (now < next_attempt_) return;  // no daemon answered a moment ago: do not hammer
  std::shared_ptr<SessionStream> fresh;
  std::unique_ptr<LeaseTable> fresh_table;
  Status st = Connect(&fresh, &fresh_table);
  if (!st.ok()) {
    backoff_ = backoff_.count() == 0 ? kFirstReconnectBackoff
                                     : std::min(2 * backoff_, kMaxReconnectBackoff);
    next_attempt_ = now + backoff_;
    if (!ended_drained_ && !unavailable_logged_.exchange(true)) {
      Log("client")->warn(
          "mapped session: cannot reconnect to stashd yet ({}); the step goes "
          "on with the chunks held",
          st.ToString());
    }
    return;
  }
  backoff_ = std::chrono::milliseconds(0);
  next_attempt_ = {};
  unavailable_logged_ = false;
  ended_drained_ = false;
  // The old chunks are unmapped here. A daemon that still lives (the stream ended, the daemon
  // did not) takes them back through the new session at once instead of at this process's
  // exit; a restarted daemon does not know them and answers NOT_FOUND, which is fine.
  std::vector<uint64_t> old_ids = table->ChunkIds();
  table = std::move(fresh_table);
  if (!old_ids.empty()) (void)fresh->descriptors->Return(old_ids, old->welcome.session_id());
  {
    MutexLock lock(&mu_);
    stream_ = std::move(fresh);
  }
}

void MappedSession::EndDrained(std::unique_ptr<LeaseTable>& table,
                               const std::shared_ptr<SessionStream>& old) {
  // A table with no chunk whose own control block says "draining": stashes are answered by
  // the copier (the caller keeps its buffer) until a reconnect replaces it.
  const std::array<uint64_t, kernels::kLeaseTiers> none{};
  auto empty = LeaseTable::Create(table->page_bytes(), old->welcome.chunk_bytes(), none);
  if (!empty.ok()) return;  // keep the session and its chunks
  std::vector<uint64_t> ids = table->ChunkIds();
  table = std::move(empty).value();
  kernels::ControlStore(table->control().daemon_flags, kernels::kDaemonDraining);
  if (!ids.empty()) (void)old->descriptors->Return(ids);
  ended_drained_ = true;
  // The session ends: `stashctl sessions` no longer lists it. The next BeginStep tries a new one.
  old->Close();
}

MappedSession::~MappedSession() {
  if (copier_ == nullptr) return;
  std::unique_ptr<LeaseTable> table = copier_->Stop();
  copier_.reset();
  std::shared_ptr<SessionStream> s = stream();
  std::vector<uint64_t> ids = table != nullptr ? table->ChunkIds() : std::vector<uint64_t>{};
  table.reset();  // unmapped before the daemon hears they are back
  if (!ids.empty() && !s->broken_now()) (void)s->descriptors->Return(ids);
  s->Close();
}

StatusOr<uint64_t> MappedSession::Stash(const StashArgs& args) {
  if (args.source != nullptr && args.device_source != nullptr) {
    return InvalidArgumentError(
        "set exactly one of stash source (a HostBuffer) and stash device_source (a device "
        "pointer)");
  }
  if (args.device_source != nullptr || args.count.device_count != nullptr) {
    return HostOnly(args.device_source != nullptr ? "stash device_source" : "count device_count");
  }
  if (args.source == nullptr) {
    return InvalidArgumentError(
        "set exactly one of stash source (a HostBuffer) and stash device_source (a device "
        "pointer)");
  }
  STASH_RETURN_IF_ERROR(
      CheckHostRange(*args.source, args.offset, args.max_rows * args.row_bytes, "stash source"));
  STASH_RETURN_IF_ERROR(CheckEventPoint(args.ready, "ready event"));
  STASH_RETURN_IF_ERROR(CheckEventPoint(args.done, "done event"));
  CopyOp op;
  op.kind = CopyOp::Kind::kStash;
  op.memory = SessionStream::HostMemory(*args.source).memory;
  op.memory_id = args.source->id();
  op.offset = args.offset;
  op.row_bytes = args.row_bytes;
  op.max_rows = args.max_rows;
  if (args.count.buffer != nullptr) {
    if (args.count.offset % 8 != 0 || args.count.offset + 8 > args.count.buffer->size()) {
      return InvalidArgumentError("the row count must be an 8-byte aligned int64");
    }
    op.count = CounterOf(EventPoint{args.count.buffer, args.count.offset, 0});
    op.memory_id = args.count.buffer->id();
  } else {
    op.count_value = static_cast<int64_t>(args.count.value);
  }
  op.divisor = args.count.divisor == 0 ? 1 : args.count.divisor;
  op.ready = CounterOf(args.ready);
  op.done = CounterOf(args.done);
  return copier_->Submit(std::move(op));
}

StatusOr<uint64_t> MappedSession::Reload(const ReloadArgs& args) {
  if (args.device_destination != nullptr) return HostOnly("reload device_destination");
  if (args.destination == nullptr) {
    return InvalidArgumentError(
        "set exactly one of reload destination (a HostBuffer) and reload device_destination (a "
        "device pointer)");
  }
  STASH_RETURN_IF_ERROR(CheckHostRange(*args.destination, args.offset, 0, "reload destination"));
  STASH_RETURN_IF_ERROR(CheckEventPoint(args.ready, "ready event"));
  STASH_RETURN_IF_ERROR(CheckEventPoint(args.done, "done event"));
  CopyOp op;
  op.kind = CopyOp::Kind::kReload;
  op.ticket = args.ticket;
  op.memory = SessionStream::HostMemory(*args.destination).memory;
  op.memory_id = args.destination->id();
  op.offset = args.offset;
  op.zero_tail = args.zero_tail;
  op.ready = CounterOf(args.ready);
  op.done = CounterOf(args.done);
  return copier_->Submit(std::move(op));
}

StatusOr<uint64_t> MappedSession::Release(uint64_t ticket) {
  CopyOp op;
  op.kind = CopyOp::Kind::kRelease;
  op.ticket = ticket;
  return copier_->Submit(std::move(op));
}

StatusOr<uint64_t> MappedSession::BeginStep(uint64_t step) {
  copier_->NewEpoch();
  CopyOp op;
  op.kind = CopyOp::Kind::kBeginStep;
  op.step = step;
  return copier_->Submit(std::move(op));
}

StatusOr<uint64_t> MappedSession::Unregister(const HostBuffer& buffer) {
  (void)buffer;
  return copier_->Submit(CopyOp{});
}

StatusOr<SessionStats> MappedSession::Stats() {
  std::shared_ptr<SessionStream> s = stream();
  if (ended_drained_) {
    return UnavailableError("no session is open with stashd on " + socket_ +
                            ": it drained, and the session ended once every stash was back; "
                            "the next BeginStep opens one once it takes sessions again");
  }
  if (s->broken_now()) {
    std::lock_guard<std::mutex> lock(s->mu);
    return UnavailableError(s->broken_status.message() +
                            "; the next BeginStep with no stash live opens a new session once a "
                            "daemon answers");
  }
  return s->Stats();
}

}  // namespace stash
