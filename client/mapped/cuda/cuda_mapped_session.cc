#include "client/mapped/cuda/cuda_mapped_session.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>

#include "client/mapped/cuda/cuda_lease_memory.h"
#include "client/mapped/cuda/stream_copier.h"
#include "client/mapped/lease_terms.h"
#include "common/cuda_driver.h"
#include "common/cuda_vmm.h"
#include "common/logging.h"
#include "common/macros.h"
#include "common/socket_path.h"
#include "stash/kernels/mapped_paging_fatbin.h"

namespace stash::client {
namespace {

using kernels::ControlLoad;
using kernels::ControlStore;

// Operation ids of reloads, releases and steps: apart from stash tickets (1, 2, ...).
constexpr uint64_t kOpBit = uint64_t{1} << 63;
// Answers kept for Wait / Poll (the oldest go first): nothing waits for most of them.
constexpr size_t kAnswersKept = 4096;
// Stashes live at once, and page-record entries per page the tiers can hold.
constexpr uint32_t kMaxStashes = 16384;
constexpr uint64_t kRecordsPerPage = 2;
// Lease answers a group's member asks for at once while chunks of its group were not sent.
constexpr int kMaxGroupLeaseRounds = 64;

Status Refuse(const std::string& what) {
  return InvalidArgumentError(what +
                              ": mapped mode on the cuda backend pages device memory in stream "
                              "order (StashArgs.device_source, device_count, stream)");
}

// The bytes of each lease tier's address range: the lease quota's; a group's member maps the
// group's chunks at their places of its pool and of its GPU's host tier share, so ranges as
// large as those (addresses only: the group decides what is mapped), and no peer tier.
std::array<uint64_t, kernels::kLeaseTiers> RangeBytes(const Options& options,
                                                      const v1::Welcome& w) {
  if (options.group.empty()) return LeaseTierBytes(w);
  return {w.pool_pages() * w.page_bytes(), w.chunk_bytes(), w.host_tier_pages() * w.page_bytes()};
}

bool Capturing(const CudaDriver* driver, CUstream stream) {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  // An error counts as capturing: the lease changes wait for a later boundary.
  if (driver->StreamIsCapturing(stream, &status) != CUDA_SUCCESS) return true;
  return status != CU_STREAM_CAPTURE_STATUS_NONE;
}

}  // namespace

CudaMappedSession::CudaMappedSession(Options options, std::shared_ptr<CudaSide> cuda)
    : options_(std::move(options)), cuda_(std::move(cuda)) {}

StatusOr<std::unique_ptr<ModeSession>> CudaMappedSession::Open(const Options& options) {
  STASH_ASSIGN_OR_RETURN(std::unique_ptr<CudaSide> side, CudaSide::Open(options.device));
  std::shared_ptr<CudaSide> cuda(std::move(side));
  std::unique_ptr<CudaMappedSession> s(new CudaMappedSession(options, cuda));
  STASH_ASSIGN_OR_RETURN(s->driver_, CudaDriver::Get());
  STASH_ASSIGN_OR_RETURN(PrimaryContext context,
                         PrimaryContext::Retain(s->driver_, options.device));
  s->context_ = std::make_shared<PrimaryContext>(std::move(context));
  STASH_ASSIGN_OR_RETURN(std::shared_ptr<SessionStream> stream,
                         SessionStream::Open(options, v1::MODE_MAPPED, cuda));
  {
    std::lock_guard<std::mutex> lock(s->stream_mu_);
    s->stream_ = stream;
  }
  s->socket_ = stream->socket;
  const v1::Welcome& w = stream->welcome;
  STASH_RETURN_IF_ERROR(CheckLeasesChunks(w, stream->socket));
  s->page_bytes_ = w.page_bytes();
  STASH_ASSIGN_OR_RETURN(
      s->memory_,
      CudaLeaseMemory::Create(s->driver_, options.device, w.chunk_bytes(), RangeBytes(options, w)));
  StreamCopier::Geometry g;
  g.page_bytes = w.page_bytes();
  g.chunk_bytes = w.chunk_bytes();
  uint64_t pages = 0;
  for (uint32_t t = 0; t < kernels::kLeaseTiers; ++t) {
    g.tier_base[t] = reinterpret_cast<uint64_t>(s->memory_->base(t));
    g.tier_slots[t] = s->memory_->slots(t);
    pages += g.tier_slots[t] * (g.chunk_bytes / g.page_bytes);
    s->slots_[t].resize(g.tier_slots[t]);
    s->targets_[t] = kNoTarget;
  }
  g.allow_host = options.allow_host_spill;
  g.group = !options.group.empty();
  g.max_stashes = kMaxStashes;
  g.record_pages = std::max<uint64_t>(pages * kRecordsPerPage, uint64_t{1} << 16);
  PrimaryContext::Scope scope(*s->context_);
  STASH_RETURN_IF_ERROR(scope.status());
  {
    STASH_ASSIGN_OR_RETURN(std::unique_ptr<StreamCopier> copier,
                           StreamCopier::Create(s->driver_, g, stash_mapped_paging_fatbin));
    MutexLock lock(&s->mu_);
    s->copier_ = std::move(copier);
  }
  // The first lease, in the rings before the first stash: on a stream of the session's own,
  // waited for here (later lease changes are ordered on the caller's stream at BeginStep).
  std::vector<std::pair<int, uint64_t>> want;
  if (!options.lease.automatic) want = FixedLeaseWant(options, w);
  // A group's member is sent the group's chunks a bounded number per answer: it asks again
  // while some are left and the last answer brought any.
  for (int round = 0;; ++round) {
    STASH_ASSIGN_OR_RETURN(LeaseAnswer answer,
                           stream->descriptors->Lease(options.lease.automatic, want));
    const bool brought = !answer.chunks.empty();
    Status first = Status::Ok();
    std::vector<uint64_t> unmapped = s->Apply(answer, stream.get(), &first);
    if (!unmapped.empty()) (void)stream->descriptors->Return(unmapped);
    STASH_RETURN_IF_ERROR(answer.status);
    STASH_RETURN_IF_ERROR(first);
    if (answer.chunks_not_sent == 0 || !brought || round >= kMaxGroupLeaseRounds) break;
  }
  CUstream own = nullptr;
  STASH_CU_RETURN_IF_ERROR(s->driver_, StreamCreate(&own, CU_STREAM_NON_BLOCKING));
  {
    MutexLock lock(&s->mu_);
    s->ChangeLease(own);
  }
  const Status synced =
      s->driver_->Check(s->driver_->StreamSynchronize(own), "cuStreamSynchronize");
  (void)s->driver_->StreamDestroy(own);
  STASH_RETURN_IF_ERROR(synced);
  CudaMappedSession* raw = s.get();
  s->lease_thread_ = std::thread([raw] { RunLeaseThread(raw->rounds_, *raw); });
  return std::unique_ptr<ModeSession>(std::move(s));
}

CudaMappedSession::~CudaMappedSession() {
  rounds_.Stop();
  if (lease_thread_.joinable()) lease_thread_.join();
  std::vector<uint64_t> ids;
  std::vector<uint64_t> old_ids;  // of the session before a reconnect
  std::string old_session;
  std::unique_ptr<Fresh> fresh;
  {
    MutexLock lock(&mu_);
    if (copier_ != nullptr) {
      PrimaryContext::Scope scope(*context_);
      copier_.reset();  // synchronizes the context: no kernel uses a chunk after this
    }
    for (const std::vector<SlotInfo>& tier : slots_) {
      for (const SlotInfo& slot : tier) {
        if (slot.state == Slot::kFree || slot.state == Slot::kMapping) continue;
        (slot.old ? old_ids : ids).push_back(slot.chunk_id);
      }
    }
    if (control_release_) control_release_();
    fresh = std::move(fresh_);
    old_session = old_session_;
  }
  LeaseWork left = rounds_.TakeLeft();
  ids.insert(ids.end(), left.give_back.begin(), left.give_back.end());
  if (!old_ids.empty()) {
    LeaseWork old;
    old.orphans = std::move(old_ids);
    old.orphans_of = std::move(old_session);
    left.Merge(std::move(old));
  }
  memory_.reset();         // unmapped before the daemon hears they are back
  if (fresh != nullptr) {  // a new session never used: its chunks were never mapped
    std::vector<uint64_t> unused;
    for (const LeaseAnswer::Chunk& c : fresh->answer.chunks) unused.push_back(c.id);
    if (!unused.empty() && !fresh->stream->broken_now()) {
      (void)fresh->stream->descriptors->Return(unused);
    }
    fresh->stream->Close();
  }
  const std::shared_ptr<SessionStream> s = stream();
  if (s == nullptr) return;
  if (!ids.empty() && !s->broken_now()) (void)s->descriptors->Return(ids);
  if (!left.orphans.empty() && !s->broken_now()) {
    (void)s->descriptors->Return(left.orphans, left.orphans_of);
  }
  s->Close();
}

uint64_t CudaMappedSession::Answered(Completion completion) {
  const uint64_t id =
      completion.kind == Completion::Kind::kStash ? completion.ticket : (kOpBit | ++next_op_);
  answers_[id] = completion;
  answer_order_.push_back(id);
  if (answer_order_.size() > kAnswersKept) {
    answers_.erase(answer_order_.front());
    answer_order_.pop_front();
  }
  return id;
}

void CudaMappedSession::AskIfShort() {
  const uint64_t reports = copier_->LeaseShortReports();
  if (reports == short_seen_) return;
  short_seen_ = reports;
  if (!options_.lease.automatic || growing_.exchange(true)) return;
  LeaseWork work;
  work.lease = true;
  rounds_.Ask(std::move(work));
}

StatusOr<uint64_t> CudaMappedSession::Stash(const StashArgs& args, bool /*then_wait*/) {
  if (args.source != nullptr) return Refuse("stash source is a HostBuffer");
  if (args.device_source == nullptr) return Refuse("stash device_source is not set");
  if (args.count.buffer != nullptr) return Refuse("count buffer is a HostBuffer");
  if (args.ready.buffer != nullptr || args.done.buffer != nullptr) {
    return Refuse("stash ready / done events are set (the stream orders the copy)");
  }
  if (reinterpret_cast<uintptr_t>(args.count.device_count) % 8 != 0) {
    return InvalidArgumentError("the row count must be an 8-byte aligned int64");
  }
  StreamCopier::StashRequest r;
  r.src = static_cast<const uint8_t*>(args.device_source) + args.offset;
  r.d_count = static_cast<const int64_t*>(args.count.device_count);
  r.count = static_cast<int64_t>(args.count.value);
  r.divisor = args.count.divisor == 0 ? 1 : args.count.divisor;
  r.max_rows = args.max_rows;
  r.row_bytes = args.row_bytes;
  r.keep_source = args.keep_source;
  r.layer = args.layer;
  r.microbatch = args.microbatch;
  r.name = args.name;
  MutexLock lock(&mu_);
  if (ended_drained_ || Draining()) {
    // The daemon drains (stashctl drain, or a stop): nothing is enqueued and the caller keeps
    // its buffer, without the step's overflow flag, as daemon-copy's library answers. (The
    // device sees the drain at the next step kernel; until then this answer comes first.)
    Completion kept;
    kept.kind = Completion::Kind::kStash;
    kept.tier = Tier::kOverflow;
    kept.ticket = kOpBit | ++next_op_;
    return Answered(kept);
  }
  PrimaryContext::Scope scope(*context_);
  STASH_RETURN_IF_ERROR(scope.status());
  STASH_ASSIGN_OR_RETURN(uint64_t ticket, copier_->Stash(static_cast<CUstream>(args.stream), r));
  AskIfShort();
  Completion enqueued;
  enqueued.kind = Completion::Kind::kStash;
  enqueued.ticket = ticket;
  return Answered(enqueued);
}

StatusOr<uint64_t> CudaMappedSession::Reload(const ReloadArgs& args, bool /*then_wait*/) {
  if (args.destination != nullptr) return Refuse("reload destination is a HostBuffer");
  if (args.device_destination == nullptr) return Refuse("reload device_destination is not set");
  if (args.ready.buffer != nullptr || args.done.buffer != nullptr) {
    return Refuse("reload ready / done events are set (the stream orders the copy)");
  }
  MutexLock lock(&mu_);
  PrimaryContext::Scope scope(*context_);
  STASH_RETURN_IF_ERROR(scope.status());
  STASH_RETURN_IF_ERROR(copier_->Reload(
      static_cast<CUstream>(args.stream), args.ticket,
      static_cast<uint8_t*>(args.device_destination) + args.offset, args.zero_tail));
  Completion enqueued;
  enqueued.kind = Completion::Kind::kReload;
  enqueued.ticket = args.ticket;
  return Answered(enqueued);
}

StatusOr<uint64_t> CudaMappedSession::Release(uint64_t ticket, void* stream) {
  MutexLock lock(&mu_);
  PrimaryContext::Scope scope(*context_);
  STASH_RETURN_IF_ERROR(scope.status());
  STASH_RETURN_IF_ERROR(copier_->Release(static_cast<CUstream>(stream), ticket));
  Completion enqueued;
  enqueued.kind = Completion::Kind::kRelease;
  enqueued.ticket = ticket;
  return Answered(enqueued);
}

StatusOr<uint64_t> CudaMappedSession::BeginStep(uint64_t step, void* stream) {
  const auto s = static_cast<CUstream>(stream);
  bool live = false;
  bool fresh = false;
  bool draining = false;
  {
    MutexLock lock(&mu_);
    PrimaryContext::Scope scope(*context_);
    STASH_RETURN_IF_ERROR(scope.status());
    if (!Capturing(driver_, s)) {
      // Releases made while the stream captured (StreamCopier::Release) run here, first.
      const StatusOr<uint64_t> ran = copier_->RunDeferredReleases(s);
      if (!ran.ok()) {
        Log("client")->warn("mapped session: releases made during a capture wait ({})",
                            ran.status().ToString());
      }
    }
    live = copier_->live() != 0;
    fresh = fresh_ != nullptr || switching_;
    draining = Draining();
  }
  if (this->stream()->broken_now() || ended_drained_) {
    // The chunks held carry the step; a new session once none is live (as MappedSession).
    if (!live && !fresh) {
      LeaseWork work;
      work.reconnect = true;
      rounds_.WaitFor(rounds_.Ask(std::move(work)), kStepReconnectWait);
      MutexLock lock(&mu_);
      fresh = fresh_ != nullptr || switching_;
    }
  } else if (draining && !live && !fresh) {
    // Drained and nothing is live: the chunks go back and the session ends, as MappedSession's.
    const Status ended = EndDrained(stream);
    if (!ended.ok()) {
      Log("client")->warn("mapped session: the drained session is not ended yet ({})",
                          ended.ToString());
    }
  } else if (options_.lease.automatic) {
    // As MappedSession: a daemon that answers in time sizes the lease before the step's first
    // stash; one that does not costs this step the wait once, and later steps nothing until it
    // answers again (its chunks then join at a later boundary).
    LeaseWork work;
    work.lease = true;
    rounds_.WaitFor(rounds_.Ask(std::move(work)), kStepLeaseWait);
  }
  if (fresh && !live) {
    const Status switched = SwitchSession(stream);
    if (!switched.ok()) {
      Log("client")->warn("mapped session: the new session is not in use yet ({})",
                          switched.ToString());
    }
  }
  MutexLock lock(&mu_);
  PrimaryContext::Scope scope(*context_);
  STASH_RETURN_IF_ERROR(scope.status());
  if (!Capturing(driver_, s)) ChangeLease(s);
  STASH_RETURN_IF_ERROR(copier_->BeginStep(s, step));
  last_step_ = step;
  Completion enqueued;
  enqueued.kind = Completion::Kind::kBeginStep;
  return Answered(enqueued);
}

StatusOr<Completion> CudaMappedSession::Wait(uint64_t op, int64_t timeout_ms) {
  (void)timeout_ms;  // answered at enqueue: nothing to wait for here
  return *Poll(op);
}

std::optional<StatusOr<Completion>> CudaMappedSession::Poll(uint64_t op) {
  MutexLock lock(&mu_);
  auto it = answers_.find(op);
  if (it == answers_.end()) {
    return StatusOr<Completion>(NotFoundError("no answer for operation " + std::to_string(op) +
                                              " (each is handed out once; the last " +
                                              std::to_string(kAnswersKept) + " are kept)"));
  }
  Completion c = it->second;
  answers_.erase(it);
  return StatusOr<Completion>(c);
}

Status CudaMappedSession::GraphsDestroyed() {
  MutexLock lock(&mu_);
  return copier_->ReleaseCapturedSlots();
}

StepFlags CudaMappedSession::CurrentStepFlags() const {
  MutexLock lock(&mu_);
  // Until the GPU reaches the last BeginStep enqueued, the word is the step before's: the new
  // step has no flags yet.
  const StreamCopier::StepFlagsReport current = copier_->CurrentStep();
  const uint64_t flags = current.step == last_step_ ? current.flags : 0;
  StepFlags out;
  out.overflow = (flags & kernels::kStepOverflow) != 0;
  out.spilled = (flags & kernels::kStepSpilled) != 0;
  return out;
}

StatusOr<SessionStats> CudaMappedSession::Stats() {
  const std::shared_ptr<SessionStream> s = stream();
  if (ended_drained_) {
    return UnavailableError("no session is open with stashd on " + socket_ +
                            ": it drained, and the session ended once every stash was back; "
                            "the next BeginStep opens one once it takes sessions again");
  }
  if (s->broken_now()) {
    std::lock_guard<std::mutex> lock(s->mu);
    return UnavailableError(s->broken_status.message() +
                            "; the chunks held carry on, and the first BeginStep with no stash "
                            "live reconnects once a daemon answers");
  }
  return s->Stats();
}

void CudaMappedSession::ResizeLease(const std::shared_ptr<SessionStream>& current) {
  Status st = Status::Ok();
  // A group's member asks again while its group's chunks were not all sent (as at Open).
  for (int round = 0; st.ok() && round <= kMaxGroupLeaseRounds; ++round) {
    StatusOr<LeaseAnswer> answer = current->descriptors->Lease(/*automatic=*/true, {});
    st = answer.ok() ? answer->status : answer.status();
    if (!answer.ok()) break;
    const bool brought = !answer->chunks.empty();
    Status first = Status::Ok();
    std::vector<uint64_t> unmapped = Apply(*answer, current.get(), &first);
    if (!unmapped.empty()) (void)current->descriptors->Return(unmapped);
    if (st.ok()) st = first;
    if (answer->chunks_not_sent == 0 || !brought) break;
  }
  if (!st.ok() && !unavailable_logged_.exchange(true)) {
    Log("client")->warn(
        "mapped session: the lease was not resized ({}); the step goes on with the chunks held",
        st.ToString());
  }
}

void CudaMappedSession::Reconnect() {
  {
    MutexLock lock(&mu_);
    if (fresh_ != nullptr || switching_) return;  // one new session at a time
  }
  const auto now = ReconnectBackoff::Clock::now();
  const PathIdentity at_path = PathIdentity::Of(ClientSocketPath(options_.socket));
  if (!backoff_.Due(now, at_path)) return;  // no daemon answered a moment ago
  auto fresh = std::make_unique<Fresh>();
  const Status st = OpenFresh(fresh.get());
  if (!st.ok()) {
    backoff_.Failed(now, at_path);
    if (!unavailable_logged_.exchange(true)) {
      Log("client")->warn(
          "mapped session: cannot reconnect to stashd yet ({}); the step goes on with the "
          "chunks held",
          st.ToString());
    }
    return;
  }
  backoff_.Succeeded();
  unavailable_logged_ = false;
  MutexLock lock(&mu_);
  fresh_ = std::move(fresh);
}

Status CudaMappedSession::OpenFresh(Fresh* fresh) {
  STASH_ASSIGN_OR_RETURN(fresh->stream, SessionStream::Open(options_, v1::MODE_MAPPED, cuda_));
  const v1::Welcome& w = fresh->stream->welcome;
  Status st = CheckLeasesChunks(w, fresh->stream->socket);
  const std::array<uint64_t, kernels::kLeaseTiers> tiers = RangeBytes(options_, w);
  for (uint32_t t = 0; st.ok() && t < kernels::kLeaseTiers; ++t) {
    if (w.page_bytes() != page_bytes_ || w.chunk_bytes() != memory_->chunk_bytes() ||
        tiers[t] > memory_->slots(t) * memory_->chunk_bytes()) {
      st = FailedPreconditionError(
          "the daemon now pages in " + std::to_string(w.page_bytes()) + "-byte pages and " +
          std::to_string(w.chunk_bytes()) + "-byte chunks, or leases more of a tier, than this " +
          "session's ranges were made for (" + std::to_string(page_bytes_) + ", " +
          std::to_string(memory_->chunk_bytes()) + "): open a new client");
    }
  }
  if (st.ok()) {
    std::vector<std::pair<int, uint64_t>> want;
    if (!options_.lease.automatic) want = FixedLeaseWant(options_, w);
    StatusOr<LeaseAnswer> answer =
        fresh->stream->descriptors->Lease(options_.lease.automatic, want);
    st = answer.ok() ? answer->status : answer.status();
    if (answer.ok()) fresh->answer = std::move(answer).value();
  }
  if (!st.ok()) fresh->stream->Close();
  return st;
}

Status CudaMappedSession::SwitchSession(void* gpu_stream) {
  const auto stream = static_cast<CUstream>(gpu_stream);
  std::unique_ptr<Fresh> fresh;
  {
    MutexLock lock(&mu_);
    PrimaryContext::Scope scope(*context_);
    STASH_RETURN_IF_ERROR(scope.status());
    if (fresh_ == nullptr || switching_ || copier_->live() != 0 || Capturing(driver_, stream)) {
      return Status::Ok();  // a later boundary (or another thread switches)
    }
    fresh = std::move(fresh_);
    switching_ = true;
    // Its control block is no longer read here (a drain flag the old daemon left must not
    // answer this session's stashes).
    old_session_ = this->stream()->welcome.session_id();
    shared_control_ = nullptr;
    pending_control_ = nullptr;
  }
  // Every chunk of the old session leaves, to go back to it as orphans. On an error the new
  // session waits for the next boundary, which goes on from here.
  StatusOr<std::vector<uint64_t>> retired = RetireChunks(gpu_stream);
  if (!retired.ok()) {
    MutexLock lock(&mu_);
    fresh_ = std::move(fresh);
    switching_ = false;
    return retired.status();
  }
  LeaseWork orphans;
  orphans.orphans = std::move(retired).value();
  {
    MutexLock lock(&mu_);
    orphans.orphans.insert(orphans.orphans.end(), ended_orphans_.begin(), ended_orphans_.end());
    ended_orphans_.clear();
  }
  std::shared_ptr<SessionStream> old;
  {
    std::lock_guard<std::mutex> lock(stream_mu_);
    old = std::move(stream_);
    stream_ = fresh->stream;
  }
  ended_drained_ = false;  // before Apply: the new session's chunks are mapped
  // What was still to be given back belonged to the old session: orphans of it now. An ended
  // session's orphans are taken back by a daemon that still lives.
  LeaseWork pending = rounds_.TakeLeft();
  orphans.orphans.insert(orphans.orphans.end(), pending.give_back.begin(), pending.give_back.end());
  pending.give_back.clear();
  orphans.orphans_of = old->welcome.session_id();
  old->Close();
  // The new chunks are mapped here and join the rings at this boundary's ChangeLease.
  Status first = Status::Ok();
  LeaseWork back;
  back.give_back = Apply(fresh->answer, fresh->stream.get(), &first);
  pending.Merge(std::move(orphans));
  pending.Merge(std::move(back));
  if (!pending.empty()) rounds_.Ask(std::move(pending));
  {
    MutexLock lock(&mu_);
    switching_ = false;
  }
  Log("client")->info("mapped session: reconnected to stashd (session {})",
                      fresh->stream->welcome.session_id());
  return first;
}

Status CudaMappedSession::EndDrained(void* gpu_stream) {
  const auto stream = static_cast<CUstream>(gpu_stream);
  {
    MutexLock lock(&mu_);
    PrimaryContext::Scope scope(*context_);
    STASH_RETURN_IF_ERROR(scope.status());
    if (fresh_ != nullptr || switching_ || copier_->live() != 0 || Capturing(driver_, stream) ||
        ended_drained_ || !Settled()) {
      return Status::Ok();  // a later boundary
    }
    switching_ = true;  // one change of session at a time
    // Chunks that fail to leave now go back later as orphans of this session (ChangeLease,
    // or the next SwitchSession).
    old_session_ = this->stream()->welcome.session_id();
  }
  StatusOr<std::vector<uint64_t>> retired = RetireChunks(gpu_stream);
  MutexLock lock(&mu_);
  switching_ = false;
  if (!retired.ok()) return retired.status();
  // Stashes are answered as kept (Stash) until a BeginStep reconnects. The lease thread gives
  // the chunks back and ends the session: `stashctl sessions` no longer lists it.
  ended_drained_ = true;
  shared_control_ = nullptr;
  pending_control_ = nullptr;
  LeaseWork work;
  work.give_back = std::move(retired).value();
  work.end_session = true;
  rounds_.Ask(std::move(work));
  return Status::Ok();
}

bool CudaMappedSession::Settled() const {
  for (const std::vector<SlotInfo>& slots : slots_) {
    for (const SlotInfo& s : slots) {
      const bool resting =
          s.state == Slot::kFree || s.state == Slot::kMapped || s.state == Slot::kInRing;
      if (!resting || (s.state != Slot::kFree && s.old)) return false;
    }
  }
  return true;
}

bool CudaMappedSession::Draining() const {
  return shared_control_ != nullptr &&
         (ControlLoad(shared_control_->daemon_flags) & kernels::kDaemonDraining) != 0;
}

}  // namespace stash::client
