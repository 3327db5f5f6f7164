#include "client/mapped/mapped_session.h"

#include "client/mapped/lease_terms.h"
#include "common/logging.h"
#include "common/macros.h"
#include "common/shm.h"
#include "common/socket_path.h"

namespace stash::client {
namespace {

CounterRef CounterOf(const EventPoint& e) {
  if (e.buffer == nullptr) return {};
  return CounterRef{SessionStream::HostMemory(*e.buffer).memory, e.offset, e.value};
}

// Every page of each chunk leased, allocated here (the lease thread, or Open's), never on the
// copier: the daemon warms its chunks, but one leased before the daemon got to it (just after
// its start) would otherwise fault page by page in the first stashes. LeaseTable::AddChunk then
// maps it populated.
void AllocateChunkPages(const LeaseAnswer& answer) {
  for (const LeaseAnswer::Chunk& c : answer.chunks) (void)AllocatePages(c.fd.get(), c.bytes);
}

Status HostOnly(const char* what) {
  return InvalidArgumentError(std::string(what) +
                              " is a device pointer, which needs the cuda backend: open the "
                              "client with Options.backend = Backend::kCuda");
}

}  // namespace

StatusOr<std::unique_ptr<MappedSession>> MappedSession::Open(const Options& options) {
  if (options.backend == Backend::kCuda) {
    // Client::Open opens CudaMappedSession, the GPU twin, for the cuda backend.
    return InternalError("MappedSession is the host backend's twin; open CudaMappedSession");
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
      [raw](uint64_t, std::unique_ptr<LeaseTable>& t, bool live) { raw->OnStep(t, live); },
      [raw] { raw->OnOutgrown(); });
  session->lease_thread_ = std::thread([raw] { RunLeaseThread(raw->rounds_, *raw); });
  return session;
}

Status MappedSession::Connect(std::shared_ptr<SessionStream>* stream_out,
                              std::unique_ptr<LeaseTable>* table_out) {
  STASH_ASSIGN_OR_RETURN(std::unique_ptr<SessionStream> stream,
                         SessionStream::Open(options_, v1::MODE_MAPPED, nullptr));
  const v1::Welcome& w = stream->welcome;
  STASH_RETURN_IF_ERROR(CheckLeasesChunks(w, stream->socket));
  STASH_ASSIGN_OR_RETURN(std::unique_ptr<LeaseTable> table,
                         LeaseTable::Create(w.page_bytes(), w.chunk_bytes(), LeaseTierBytes(w)));
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
  if (fixed) want = FixedLeaseWant(options_, welcome);
  // A group's member is sent the group's chunks a bounded number per answer: it asks again
  // while some are left and the last answer brought any.
  for (int round = 0;; ++round) {
    STASH_ASSIGN_OR_RETURN(LeaseAnswer answer, channel.Lease(!fixed, want));
    AllocateChunkPages(answer);
    const bool brought = !answer.chunks.empty();
    Status first = Status::Ok();
    std::vector<uint64_t> give_back = Apply(table, answer, &first);
    if (!give_back.empty()) {
      StatusOr<uint64_t> returned = channel.Return(give_back);
      if (!returned.ok() && first.ok()) first = returned.status();
    }
    if (!answer.status.ok()) return answer.status;
    if (!first.ok() || answer.chunks_not_sent == 0 || !brought || round >= kMaxLeaseRounds) {
      return first;
    }
  }
}

std::vector<uint64_t> MappedSession::Apply(LeaseTable& table, LeaseAnswer& answer, Status* first) {
  if (answer.control_block.valid()) {
    Status st = table.SetControlBlock(std::move(answer.control_block), answer.control_block_bytes);
    if (!st.ok() && first->ok()) *first = st;
  }
  if (answer.group_block.valid()) {
    Status st = table.SetGroupBlock(std::move(answer.group_block), answer.group_block_bytes,
                                    answer.member_tag, answer.group_pages, answer.group_chunks);
    if (!st.ok() && first->ok()) *first = st;
  }
  std::vector<uint64_t> give_back;
  for (LeaseAnswer::Chunk& c : answer.chunks) {
    Status mapped =
        table.AddChunk(LeaseTierOf(c.tier), c.id, std::move(c.fd), c.bytes, c.group_page);
    if (!mapped.ok()) {
      give_back.push_back(c.id);
      if (first->ok()) *first = mapped;
    }
  }
  answer.chunks.clear();
  for (const LeaseAnswer::Held& held : answer.lease) {
    if (held.pages_target >= held.pages) continue;
    std::vector<uint64_t> ids = table.ShrinkTo(LeaseTierOf(held.tier), held.pages_target);
    give_back.insert(give_back.end(), ids.begin(), ids.end());
  }
  return give_back;
}

void MappedSession::OnStep(std::unique_ptr<LeaseTable>& table, bool stashes_live) {
  LeaseWork work;
  // The daemon asked (another session found the pool leased out): give back down to its
  // targets what no stash holds. Targets first, then the number (RequestReturn's order).
  kernels::SessionControl& control = table->control();
  const uint64_t asked = __atomic_load_n(&control.return_request, __ATOMIC_ACQUIRE);
  if (asked != kernels::ControlLoad(control.return_done)) {
    for (uint32_t t = 0; t < kernels::kLeaseTiers; ++t) {
      std::vector<uint64_t> ids =
          table->ShrinkTo(t, kernels::ControlLoad(control.return_target_pages[t]));
      work.give_back.insert(work.give_back.end(), ids.begin(), ids.end());
    }
    kernels::ControlStore(control.return_done, asked);
  }
  // Group chunks the daemon took back: unmapped here, returned by the lease thread.
  std::vector<uint64_t> leaving = table->DropLeaving();
  work.give_back.insert(work.give_back.end(), leaving.begin(), leaving.end());
  std::shared_ptr<SessionStream> current = stream();
  if (current->broken_now() || ended_drained_) {
    // The chunks held carry the step; a new session once none is live. (What was taken out
    // above goes back through the new session with the rest of the old table.)
    if (stashes_live) return;
    work.give_back.clear();
    work.reconnect = true;
  } else if (!stashes_live &&
             (kernels::ControlLoad(control.daemon_flags) & kernels::kDaemonDraining) != 0) {
    EndDrained(table, current, std::move(work.give_back));
    return;
  } else {
    work.lease = options_.lease.automatic;
  }
  const std::chrono::milliseconds wait_for = work.reconnect ? kStepReconnectWait : kStepLeaseWait;
  if (work.empty()) return;
  // A daemon that answers in time sizes the lease (or opens the new session) before the step's
  // first stash, as if in stream order; one that does not costs this step the wait once, and
  // later steps nothing until it answers again (the answer then lands between two operations).
  rounds_.WaitFor(rounds_.Ask(std::move(work)), wait_for);
}

void MappedSession::EndDrained(std::unique_ptr<LeaseTable>& table,
                               const std::shared_ptr<SessionStream>& old,
                               std::vector<uint64_t> give_back) {
  // A table with no chunk whose own control block says "draining": stashes are answered by
  // the copier (the caller keeps its buffer) until a reconnect replaces it.
  const std::array<uint64_t, kernels::kLeaseTiers> none{};
  auto empty = LeaseTable::Create(table->page_bytes(), old->welcome.chunk_bytes(), none);
  if (!empty.ok()) return;  // keep the session and its chunks
  std::vector<uint64_t> ids = table->ChunkIds();
  ids.insert(ids.end(), give_back.begin(), give_back.end());
  table = std::move(empty).value();  // unmapped before the daemon hears they are back
  kernels::ControlStore(table->control().daemon_flags, kernels::kDaemonDraining);
  ended_drained_ = true;
  // The lease thread gives them back and ends the session: `stashctl sessions` no longer lists
  // it. A later BeginStep tries a new one.
  LeaseWork work;
  work.give_back = std::move(ids);
  work.end_session = true;
  rounds_.Ask(std::move(work));
}

void MappedSession::OnOutgrown() {
  // One request until its answer is in: the copier calls this at every stash that finds the
  // lease short.
  if (!options_.lease.automatic || ended_drained_ || growing_.exchange(true)) return;
  LeaseWork work;
  work.lease = true;
  rounds_.Ask(std::move(work));
}

void MappedSession::ResizeLease(const std::shared_ptr<SessionStream>& current) {
  for (int round = 0; round <= kMaxLeaseRounds; ++round) {
    if (!ResizeLeaseOnce(current)) return;
  }
}

bool MappedSession::ResizeLeaseOnce(const std::shared_ptr<SessionStream>& current) {
  StatusOr<LeaseAnswer> answer = current->descriptors->Lease(/*automatic=*/true, {});
  if (answer.ok()) AllocateChunkPages(*answer);
  if (!answer.ok() || !answer->status.ok()) {
    const Status st = answer.ok() ? answer->status : answer.status();
    if (!unavailable_logged_.exchange(true)) {
      Log("client")->warn(
          "mapped session: the lease was not resized ({}); the step goes on with the chunks "
          "held",
          st.ToString());
    }
    if (!answer.ok()) return false;
  }
  // A group's member asks again while chunks of its group were not sent and this answer brought
  // some (each answer carries a bounded number).
  const bool again = answer->status.ok() && answer->chunks_not_sent > 0 && !answer->chunks.empty();
  // Applied by the copier between two operations, to the table of the session it came from.
  auto came = std::make_shared<LeaseAnswer>(std::move(answer).value());
  copier_->Post([this, came, current](std::unique_ptr<LeaseTable>& table, bool) {
    if (stream() != current || ended_drained_) return true;  // these chunks were the old one's
    Status first = Status::Ok();
    std::vector<uint64_t> give_back = Apply(*table, *came, &first);
    if (!first.ok()) Log("client")->warn("mapped session: lease: {}", first.ToString());
    if (!give_back.empty()) {
      LeaseWork work;
      work.give_back = std::move(give_back);
      rounds_.Ask(std::move(work));
    }
    return true;
  });
  return again;
}

void MappedSession::ReconnectFrom(const std::shared_ptr<SessionStream>& current) {
  const auto now = ReconnectBackoff::Clock::now();
  const PathIdentity at_path = PathIdentity::Of(ClientSocketPath(options_.socket));
  auto not_now = [this] { reconnecting_ = false; };
  if (!backoff_.Due(now, at_path)) return not_now();  // no daemon answered a moment ago
  auto fresh = std::make_shared<std::shared_ptr<SessionStream>>();
  auto fresh_table = std::make_shared<std::unique_ptr<LeaseTable>>();
  Status st = Connect(fresh.get(), fresh_table.get());
  if (!st.ok()) {
    backoff_.Failed(now, at_path);
    if (!ended_drained_ && !unavailable_logged_.exchange(true)) {
      Log("client")->warn(
          "mapped session: cannot reconnect to stashd yet ({}); the step goes on with the "
          "chunks held",
          st.ToString());
    }
    return not_now();
  }
  backoff_.Succeeded();
  unavailable_logged_ = false;
  // The new session replaces the old at the first boundary with no stash live: the old chunks
  // are unmapped then, and go back through the new session (see RunLeaseThread).
  copier_->Post([this, fresh, fresh_table, current](std::unique_ptr<LeaseTable>& table, bool live) {
    if (live) return false;
    LeaseWork work;
    work.orphans = table->ChunkIds();
    work.orphans_of = current->welcome.session_id();
    table = std::move(*fresh_table);
    {
      MutexLock lock(&mu_);
      stream_ = std::move(*fresh);
    }
    ended_drained_ = false;
    reconnecting_ = false;
    if (!work.orphans.empty()) rounds_.Ask(std::move(work));
    return true;
  });
}

MappedSession::~MappedSession() {
  if (copier_ == nullptr) return;
  // The lease thread first: what it would still give back, this gives back below.
  rounds_.Stop();
  if (lease_thread_.joinable()) lease_thread_.join();
  std::unique_ptr<LeaseTable> table = copier_->Stop();
  copier_.reset();
  std::shared_ptr<SessionStream> s = stream();
  std::vector<uint64_t> ids = table != nullptr ? table->ChunkIds() : std::vector<uint64_t>{};
  LeaseWork left = rounds_.TakeLeft();
  ids.insert(ids.end(), left.give_back.begin(), left.give_back.end());
  table.reset();  // unmapped before the daemon hears they are back
  if (!ids.empty() && !s->broken_now()) (void)s->descriptors->Return(ids);
  if (!left.orphans.empty() && !s->broken_now()) {
    (void)s->descriptors->Return(left.orphans, left.orphans_of);
  }
  s->Close();
}

StatusOr<uint64_t> MappedSession::Stash(const StashArgs& args, bool /*then_wait*/) {
  STASH_RETURN_IF_ERROR(CheckNoStream(args.stream, "stash stream"));
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
  op.layer = args.layer;
  op.microbatch = args.microbatch;
  op.name = args.name;
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

StatusOr<uint64_t> MappedSession::Reload(const ReloadArgs& args, bool /*then_wait*/) {
  STASH_RETURN_IF_ERROR(CheckNoStream(args.stream, "reload stream"));
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

StatusOr<uint64_t> MappedSession::Release(uint64_t ticket, void* gpu_stream) {
  STASH_RETURN_IF_ERROR(CheckNoStream(gpu_stream, "release stream"));
  CopyOp op;
  op.kind = CopyOp::Kind::kRelease;
  op.ticket = ticket;
  return copier_->Submit(std::move(op));
}

StatusOr<uint64_t> MappedSession::BeginStep(uint64_t step, void* gpu_stream) {
  STASH_RETURN_IF_ERROR(CheckNoStream(gpu_stream, "begin_step stream"));
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

}  // namespace stash::client
