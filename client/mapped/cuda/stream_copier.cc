#include "client/mapped/cuda/stream_copier.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>
#include <utility>

#include "common/cuda_vmm.h"
#include "common/macros.h"

namespace stash::client {
namespace {

using kernels::MappedReloadArgs;
using kernels::MappedRingArgs;
using kernels::MappedStashArgs;
using kernels::MappedStepArgs;
using kernels::PageRing;
using kernels::SessionControl;
using kernels::StashPlan;
using kernels::StepReport;

// The live-stash table's entry of the stash in plan slot `plan_slot`: entry i is slot i, and the
// slots past the table's size have none.
uint32_t LiveEntryOf(uint32_t plan_slot) {
  return plan_slot < kernels::kLiveEntries ? plan_slot : kernels::kNoLiveEntry;
}

// The kernels, in the order of functions_.
enum Kernel : uint32_t {
  kPlan,
  kCopy,
  kPublish,
  kPop,
  kReloadPublish,
  kStep,
  kAddPages,
  kRemoveChunk,
};
constexpr const char* kKernelNames[] = {kernels::kStashPlanKernel,     kernels::kStashCopyKernel,
                                        kernels::kStashPublishKernel,  kernels::kReloadPopKernel,
                                        kernels::kReloadPublishKernel, kernels::kStepKernel,
                                        kernels::kAddPagesKernel,      kernels::kRemoveChunkKernel};

// As paging.cu: 256 threads a block, a block per chunk of the largest stash, at most 4096.
constexpr unsigned kThreadsPerBlock = 256;
constexpr uint64_t kMaxBlocks = 4096;

// Answers of chunk removals pending at once (the pinned block's answer words).
constexpr uint32_t kMaxRemovals = 256;
// An answer word before its kernel ran.
constexpr uint64_t kPending = 2;

uint64_t AlignUp(uint64_t n, uint64_t to) { return (n + to - 1) / to * to; }

uint64_t CopyBlocks(uint64_t max_bytes, uint64_t page_bytes) {
  const uint64_t chunks = kernels::ChunksFor(kernels::PagesFor(max_bytes, page_bytes),
                                             kernels::ChunkShapeOf(page_bytes));
  if (chunks == 0) return 1;
  return chunks < kMaxBlocks ? chunks : kMaxBlocks;
}

// The pinned host block: the shared block's device address, the step report, the lease-short
// count, the current step's flags, removal answers.
struct HostBlock {
  SessionControl* shared;    // read by the step kernel
  kernels::LiveTable* live;  // read by the stashes' publish kernels
  uint64_t lease_short;      // written by the stash publish kernel
  StepReport report;
  uint64_t current_step;  // written by the stash publish and step kernels
  uint64_t answers[kMaxRemovals];
};

uint64_t Load(const uint64_t& word) { return __atomic_load_n(&word, __ATOMIC_ACQUIRE); }

// A device address as the pointer type the kernels' arguments hold: device memory, never
// dereferenced on the host.
template <typename T>
T* At(CUdeviceptr address) {
  return reinterpret_cast<T*>(address);  // NOLINT(performance-no-int-to-ptr): a device address
}

}  // namespace

StreamCopier::StreamCopier(const CudaDriver* driver, const Geometry& geometry)
    : driver_(driver), geometry_(geometry), records_(geometry.record_pages) {}

StatusOr<std::unique_ptr<StreamCopier>> StreamCopier::Create(const CudaDriver* driver,
                                                             const Geometry& g,
                                                             const void* fatbin) {
  if (g.page_bytes < kernels::kVectorBytes || (g.page_bytes & (g.page_bytes - 1)) != 0) {
    return InvalidArgumentError("page_bytes " + std::to_string(g.page_bytes) +
                                " is not a power of two >= 16");
  }
  if (g.chunk_bytes == 0 || g.chunk_bytes % g.page_bytes != 0) {
    return InvalidArgumentError("chunk_bytes " + std::to_string(g.chunk_bytes) +
                                " is not a whole number of " + std::to_string(g.page_bytes) +
                                "-byte pages");
  }
  if (g.max_stashes == 0 || g.record_pages == 0) {
    return InvalidArgumentError("max_stashes and record_pages must be > 0");
  }
  for (uint32_t t = 0; t < kernels::kLeaseTiers; ++t) {
    if (g.tier_slots[t] > 0 && g.tier_base[t] == 0) {
      return InvalidArgumentError("lease tier " + std::to_string(t) +
                                  " has slots but no base address");
    }
  }
  const RelaxedCaptureMode relaxed(driver);
  std::unique_ptr<StreamCopier> c(new StreamCopier(driver, g));
  const CUresult loaded = driver->ModuleLoadData(&c->module_, fatbin);
  if (loaded == CUDA_ERROR_NO_BINARY_FOR_GPU) {
    return FailedPreconditionError(
        "this GPU cannot run the client library's paging kernels (built for sm_90, H100/H200, "
        "with PTX for newer GPUs): use mode daemon-copy (Options.mode, "
        "stashd.connect(mode=\"daemon-copy\"))");
  }
  STASH_RETURN_IF_ERROR(driver->Check(loaded, "cuModuleLoadData(the paging kernels' fatbin)"));
  for (uint32_t k = 0; k < c->functions_.size(); ++k) {
    STASH_CU_RETURN_IF_ERROR(driver,
                             ModuleGetFunction(&c->functions_[k], c->module_, kKernelNames[k]));
  }

  // One device block: control, state, rings, each tier's page ids, plans, page records.
  const uint64_t pages_per_chunk = g.chunk_bytes / g.page_bytes;
  uint64_t offset = 0;
  const uint64_t control_at = offset;
  offset = AlignUp(offset + sizeof(SessionControl), 64);
  const uint64_t state_at = offset;
  offset = AlignUp(offset + sizeof(kernels::CopierState), 64);
  const uint64_t rings_at = offset;
  offset = AlignUp(offset + kernels::kLeaseTiers * sizeof(PageRing), 64);
  std::array<uint64_t, kernels::kLeaseTiers> ids_at{};
  for (uint32_t t = 0; t < kernels::kLeaseTiers; ++t) {
    ids_at[t] = offset;
    offset = AlignUp(offset + g.tier_slots[t] * pages_per_chunk * sizeof(uint64_t), 64);
  }
  const uint64_t refs_capacity = g.tier_slots[0] + g.tier_slots[1] + g.tier_slots[2];
  const uint64_t group_at = offset;
  offset = AlignUp(offset + kernels::GroupBoardBytes(refs_capacity), 64);
  const uint64_t plans_at = offset;
  offset = AlignUp(offset + uint64_t{g.max_stashes} * sizeof(StashPlan), 64);
  const uint64_t records_at = offset;
  offset += g.record_pages * sizeof(uint64_t);
  c->block_bytes_ = offset;
  STASH_CU_RETURN_IF_ERROR(driver, MemAlloc(&c->block_, c->block_bytes_));
  c->d_plans_ = c->block_ + plans_at;
  c->d_records_ = c->block_ + records_at;

  // Control, state and rings start as zeros and empty rings over each tier's ids; every plan
  // slot as consumed (device memory starts as anything). The image is written in page-locked
  // memory: cuMemcpyHtoD from pageable memory "will return once the pageable buffer has been
  // copied to the staging memory ..., but the DMA to final destination may not have completed"
  // (Driver API, "API synchronization behavior"), and the kernels run on the trainer's streams,
  // which need not wait for the legacy stream that copy runs on. From page-locked memory the
  // copy is complete when the call returns. (Both calls come after the GPU work queued before
  // them on the legacy stream: Create waits for that once, at session start.)
  void* image = nullptr;
  STASH_CU_RETURN_IF_ERROR(driver, MemHostAlloc(&image, records_at, 0));
  auto* bytes = static_cast<uint8_t*>(image);
  std::memset(bytes, 0, records_at);
  for (uint32_t t = 0; t < kernels::kLeaseTiers; ++t) {
    PageRing ring{};
    if (g.tier_slots[t] > 0) {
      ring.ids = At<uint64_t>(c->block_ + ids_at[t]);
      ring.capacity = g.tier_slots[t] * pages_per_chunk;
    }
    std::memcpy(bytes + rings_at + t * sizeof(PageRing), &ring, sizeof(ring));
  }
  // The group cache: no group yet, room for a ref per chunk slot.
  kernels::MappedGroupHeader cache{};
  cache.refs_capacity = refs_capacity;
  std::memcpy(bytes + group_at, &cache, sizeof(cache));
  const StashPlan consumed = kernels::ConsumedPlan();
  for (uint32_t i = 0; i < g.max_stashes; ++i) {
    std::memcpy(bytes + plans_at + i * sizeof(StashPlan), &consumed, sizeof(consumed));
  }
  const CUresult copied = driver->MemcpyHtoD(c->block_, image, records_at);
  const CUresult freed = driver->MemFreeHost(image);
  STASH_RETURN_IF_ERROR(driver->Check(copied, "cuMemcpyHtoD(the copier's first block image)"));
  STASH_RETURN_IF_ERROR(driver->Check(freed, "cuMemFreeHost(the copier's first block image)"));
  STASH_CU_RETURN_IF_ERROR(driver, EventCreate(&c->attach_event_, CU_EVENT_DISABLE_TIMING));
  for (uint32_t t = 0; t < kernels::kLeaseTiers; ++t) {
    c->slots_[t].assign(g.tier_slots[t], SlotState::kAbsent);
  }

  STASH_CU_RETURN_IF_ERROR(driver,
                           MemHostAlloc(&c->host_block_, sizeof(HostBlock),
                                        CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
  std::memset(c->host_block_, 0, sizeof(HostBlock));
  STASH_CU_RETURN_IF_ERROR(driver,
                           MemHostGetDevicePointer(&c->host_block_device_, c->host_block_, 0));
  // The group board (no group: generation 0) and the states the step kernel reports.
  const uint64_t board_bytes = kernels::GroupBoardBytes(refs_capacity);
  const uint64_t group_host_bytes = board_bytes + kernels::GroupStatesBytes(refs_capacity);
  STASH_CU_RETURN_IF_ERROR(driver,
                           MemHostAlloc(&c->group_host_, group_host_bytes,
                                        CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
  std::memset(c->group_host_, 0, group_host_bytes);
  c->board_shadow_.assign(board_bytes, 0);
  auto* board = reinterpret_cast<kernels::MappedGroupHeader*>(c->board_shadow_.data());
  board->refs_capacity = refs_capacity;
  for (uint32_t t = 1; t < kernels::kLeaseTiers; ++t) {
    board->refs_first[t] = board->refs_first[t - 1] + g.tier_slots[t - 1];
  }
  std::memcpy(c->group_host_, board, sizeof(*board));
  STASH_CU_RETURN_IF_ERROR(driver,
                           MemHostGetDevicePointer(&c->group_host_device_, c->group_host_, 0));

  // What every kernel's arguments carry: fixed for the copier's life.
  kernels::MappedSessionView& v = c->view_;
  v.d_control = At<SessionControl>(c->block_ + control_at);
  v.d_state = At<kernels::CopierState>(c->block_ + state_at);
  for (uint32_t t = 0; t < kernels::kLeaseTiers; ++t) {
    if (g.tier_slots[t] == 0) continue;
    v.tiers[t].d_ring = At<PageRing>(c->block_ + rings_at + t * sizeof(PageRing));
    v.tiers[t].d_base = At<uint8_t>(g.tier_base[t]);
  }
  v.page_bytes = g.page_bytes;
  v.allow_host = g.allow_host ? 1 : 0;
  v.d_lease_short = At<uint64_t>(c->host_block_device_ + offsetof(HostBlock, lease_short));
  v.d_step_flags = At<uint64_t>(c->host_block_device_ + offsetof(HostBlock, current_step));
  v.d_live = At<kernels::LiveTable* const>(c->host_block_device_ + offsetof(HostBlock, live));
  if (g.group) {
    v.d_group = At<kernels::MappedGroupHeader>(c->block_ + group_at);
    v.d_group_board = At<const kernels::MappedGroupHeader>(c->group_host_device_);
    v.d_group_states = At<kernels::MappedGroupStates>(c->group_host_device_ + board_bytes);
  }

  for (uint32_t i = 0; i < g.max_stashes; ++i) c->free_plans_.insert(c->free_plans_.end(), i);
  for (uint32_t i = kMaxRemovals; i > 0; --i) c->free_answers_.push_back(i - 1);
  return c;
}

StreamCopier::~StreamCopier() {
  const RelaxedCaptureMode relaxed(driver_);
  // Kernels (on whichever streams the caller used) may still use the state: let them finish.
  if (block_ != 0) (void)driver_->CtxSynchronize();
  if (attach_event_ != nullptr) (void)driver_->EventDestroy(attach_event_);
  if (block_ != 0) (void)driver_->MemFree(block_);
  if (host_block_ != nullptr) (void)driver_->MemFreeHost(host_block_);
  if (group_host_ != nullptr) (void)driver_->MemFreeHost(group_host_);
  if (module_ != nullptr) (void)driver_->ModuleUnload(module_);
}

bool StreamCopier::Capturing(CUstream stream) const {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  if (driver_->StreamIsCapturing(stream, &status) != CUDA_SUCCESS) return true;  // be careful
  return status != CU_STREAM_CAPTURE_STATUS_NONE;
}

Status StreamCopier::Launch(CUfunction function, uint64_t blocks, bool one_thread, CUstream stream,
                            void* args, const char* what) {
  void* params[] = {args};
  const unsigned threads = one_thread ? 1 : kThreadsPerBlock;
  const CUresult r = driver_->LaunchKernel(function, static_cast<unsigned>(blocks), 1, 1, threads,
                                           1, 1, 0, stream, params, nullptr);
  return driver_->Check(r, what);
}

StatusOr<uint64_t> StreamCopier::Stash(CUstream stream, const StashRequest& r) {
  if (r.src == nullptr) return InvalidArgumentError("the stash's source is null");
  if (r.row_bytes == 0) return InvalidArgumentError("row_bytes is 0");
  RunDeferredOutsideCapture(stream);
  if (r.max_rows > UINT64_MAX / r.row_bytes) {
    return InvalidArgumentError("max_rows " + std::to_string(r.max_rows) + " * row_bytes " +
                                std::to_string(r.row_bytes) + " overflows 64 bits");
  }
  if ((reinterpret_cast<uintptr_t>(r.d_count) & 7u) != 0) {
    return InvalidArgumentError("the device count is not 8-byte aligned");
  }
  const RelaxedCaptureMode relaxed(driver_);
  const uint64_t max_bytes = r.max_rows * r.row_bytes;
  const uint64_t record_pages =
      std::max<uint64_t>(1, kernels::PagesFor(max_bytes, geometry_.page_bytes));
  if (record_pages > records_.capacity()) {
    return InvalidArgumentError(
        "a stash of up to " + std::to_string(max_bytes) + " bytes needs a page record of " +
        std::to_string(record_pages) + " pages, more than the session's whole arena (" +
        std::to_string(records_.capacity()) + "): raise Geometry.record_pages or the page size");
  }
  if (free_plans_.empty()) {
    return ResourceExhaustedError("this session has " + std::to_string(geometry_.max_stashes) +
                                  " stashes live on its stream: reload or release some first");
  }
  const std::optional<uint64_t> record = records_.Allocate(record_pages);
  if (!record) {
    return ResourceExhaustedError("no room for a page record of " + std::to_string(record_pages) +
                                  " pages (" + std::to_string(records_.free()) + " of " +
                                  std::to_string(records_.capacity()) +
                                  " free): reload or release stashes first");
  }
  const uint32_t plan_slot = *free_plans_.begin();
  const uint64_t ticket = next_ticket_ + 1;
  const uint32_t live_entry = LiveEntryOf(plan_slot);
  MappedStashArgs a{};
  a.session = view_;
  a.d_src = static_cast<const uint8_t*>(r.src);
  a.d_count = r.d_count;
  a.count = r.count;
  a.max_rows = r.max_rows;
  a.row_bytes = r.row_bytes;
  a.divisor = r.divisor;
  a.keep_source = r.keep_source ? 1 : 0;
  a.d_plan = At<StashPlan>(d_plans_ + plan_slot * sizeof(StashPlan));
  a.d_page_record = At<uint64_t>(d_records_ + *record * sizeof(uint64_t));
  a.ticket = ticket;
  a.live_entry = live_entry;
  Status s = Launch(functions_[kPlan], 1, true, stream, &a, "cuLaunchKernel(stash plan)");
  if (!s.ok()) {
    records_.Free(*record, record_pages);
    return s;
  }
  free_plans_.erase(free_plans_.begin());
  // The tags before the publish kernel writes the numbers beside them (the plan kernel does not
  // touch the entry; a plan that failed to launch left it to the slot's previous stash).
  live_tags_.Tag(live_entry, r.layer, r.microbatch, r.name);
  s = Launch(functions_[kCopy], CopyBlocks(max_bytes, geometry_.page_bytes), false, stream, &a,
             "cuLaunchKernel(stash copy)");
  if (s.ok()) {
    s = Launch(functions_[kPublish], 1, true, stream, &a, "cuLaunchKernel(stash publish)");
  }
  if (!s.ok()) {
    // The plan ran without its publish: it took no page (heads move only there), but its slot
    // may now hold a plan that looks placed, which a later stash in the slot would give back.
    // The slot is never used again; the page-record range may be.
    records_.Free(*record, record_pages);
    return s;
  }
  Ticket t;
  t.plan_slot = plan_slot;
  t.record_offset = *record;
  t.record_pages = record_pages;
  t.src = r.keep_source ? a.d_src : nullptr;
  t.max_rows = r.max_rows;
  t.row_bytes = r.row_bytes;
  t.captured = Capturing(stream);
  next_ticket_ = ticket;
  tickets_.emplace(ticket, t);
  return ticket;
}

Status StreamCopier::Reload(CUstream stream, uint64_t ticket, void* dst, bool zero_tail) {
  if (dst == nullptr) return InvalidArgumentError("the reload's destination is null");
  RunDeferredOutsideCapture(stream);
  return EndTicket(stream, ticket, dst, zero_tail);
}

Status StreamCopier::Release(CUstream stream, uint64_t ticket) {
  RunDeferredOutsideCapture(stream);
  auto it = tickets_.find(ticket);
  if (it != tickets_.end() && !it->second.captured && !it->second.release_deferred) {
    const RelaxedCaptureMode relaxed(driver_);
    if (Capturing(stream)) {
      it->second.release_deferred = true;
      deferred_releases_.push_back(ticket);
      return Status::Ok();
    }
  }
  return EndTicket(stream, ticket, nullptr, false);
}

void StreamCopier::RunDeferredOutsideCapture(CUstream stream) {
  if (deferred_releases_.empty()) return;
  {
    const RelaxedCaptureMode relaxed(driver_);
    if (Capturing(stream)) return;
  }
  (void)RunDeferredReleases(stream);  // an error leaves them for the next call
}

StatusOr<uint64_t> StreamCopier::RunDeferredReleases(CUstream stream) {
  {
    const RelaxedCaptureMode relaxed(driver_);
    if (Capturing(stream)) {
      return FailedPreconditionError("deferred releases cannot run while the stream captures");
    }
  }
  uint64_t ran = 0;
  while (!deferred_releases_.empty()) {
    const uint64_t ticket = deferred_releases_.back();
    auto it = tickets_.find(ticket);
    if (it != tickets_.end()) {
      it->second.release_deferred = false;  // EndTicket refuses released tickets
      const Status ended = EndTicket(stream, ticket, nullptr, false);
      if (!ended.ok()) {
        it = tickets_.find(ticket);
        if (it != tickets_.end()) it->second.release_deferred = true;
        return ended;
      }
      ++ran;
    }
    deferred_releases_.pop_back();
  }
  return ran;
}

Status StreamCopier::EndTicket(CUstream stream, uint64_t ticket, void* dst, bool zero_tail) {
  auto it = tickets_.find(ticket);
  if (it == tickets_.end() || it->second.release_deferred) {
    return NotFoundError("ticket " + std::to_string(ticket) +
                         " is not a live stash of this session (never stashed here, or already "
                         "reloaded or released)");
  }
  const Ticket& t = it->second;
  const uint64_t len = t.max_rows * t.row_bytes;
  if (dst != nullptr && t.src != nullptr && dst != t.src) {
    const auto d = reinterpret_cast<uintptr_t>(dst);
    const auto k = reinterpret_cast<uintptr_t>(t.src);
    if (d < k + len && k < d + len) {
      return InvalidArgumentError(
          "the reload destination overlaps the stash's kept source without being it: reload into "
          "the source itself or into a buffer apart from it; the stash is kept");
    }
  }
  const RelaxedCaptureMode relaxed(driver_);
  MappedReloadArgs a{};
  a.session = view_;
  a.d_dst = static_cast<uint8_t*>(dst);
  a.d_kept_src = t.src;
  a.d_plan = At<StashPlan>(d_plans_ + t.plan_slot * sizeof(StashPlan));
  a.d_page_record = At<const uint64_t>(d_records_ + t.record_offset * sizeof(uint64_t));
  a.max_rows = t.max_rows;
  a.row_bytes = t.row_bytes;
  a.zero_tail = zero_tail ? 1 : 0;
  a.live_entry = LiveEntryOf(t.plan_slot);
  const uint64_t blocks =
      dst != nullptr ? CopyBlocks(len, geometry_.page_bytes)
                     : CopyBlocks(t.record_pages * geometry_.page_bytes, geometry_.page_bytes);
  STASH_RETURN_IF_ERROR(
      Launch(functions_[kPop], blocks, false, stream, &a, "cuLaunchKernel(reload pop)"));
  STASH_RETURN_IF_ERROR(
      Launch(functions_[kReloadPublish], 1, true, stream, &a, "cuLaunchKernel(reload publish)"));
  // Later operations run after these, so the slots may serve them; a captured stash's slots
  // stay with the graph that replays it until ReleaseCapturedSlots.
  if (t.captured || Capturing(stream)) {
    captured_ended_.push_back(t);
  } else {
    free_plans_.insert(t.plan_slot);
    records_.Free(t.record_offset, t.record_pages);
  }
  tickets_.erase(it);
  return Status::Ok();
}

Status StreamCopier::ReleaseCapturedSlots() {
  for (const auto& [id, t] : tickets_) {
    if (t.captured) {
      return FailedPreconditionError(
          "ticket " + std::to_string(id) +
          " was stashed in a capture and is not reloaded or released yet, so a graph may still "
          "replay it: reload or release it, destroy the graphs, then call this again");
    }
  }
  for (const Ticket& t : captured_ended_) {
    free_plans_.insert(t.plan_slot);
    records_.Free(t.record_offset, t.record_pages);
  }
  captured_ended_.clear();
  return Status::Ok();
}

Status StreamCopier::AttachControl(CUstream stream, SessionControl* d_shared, uint8_t* host,
                                   uint64_t bytes) {
  const RelaxedCaptureMode relaxed(driver_);
  if (Capturing(stream)) {
    return FailedPreconditionError("a control block cannot be attached while the stream captures");
  }
  auto* block = static_cast<HostBlock*>(host_block_);
  // The tags there before a kernel writes numbers next to them.
  const bool has_table = live_tags_.Attach(host, bytes);
  kernels::LiveTable* d_live = nullptr;
  if (d_shared != nullptr && has_table) {
    // NOLINTNEXTLINE(performance-no-int-to-ptr): a device address
    d_live = reinterpret_cast<kernels::LiveTable*>(reinterpret_cast<uintptr_t>(d_shared) +
                                                   kernels::kLiveTableOffset);
  }
  __atomic_store_n(&block->live, d_live, __ATOMIC_RELEASE);
  __atomic_store_n(&block->shared, d_shared, __ATOMIC_RELEASE);
  // A step kernel already enqueued may have read the old address: the old block stays in use
  // until the work enqueued so far is done.
  STASH_CU_RETURN_IF_ERROR(driver_, EventRecord(attach_event_, stream));
  attach_recorded_ = true;
  return Status::Ok();
}

bool StreamCopier::OldControlReleasable() const {
  if (!attach_recorded_) return true;
  const RelaxedCaptureMode relaxed(driver_);
  return driver_->EventQuery(attach_event_) == CUDA_SUCCESS;
}

Status StreamCopier::BeginStep(CUstream stream, uint64_t step) {
  if (step >= (uint64_t{1} << 62)) {
    return InvalidArgumentError("step " + std::to_string(step) + " is not below 2^62");
  }
  const RelaxedCaptureMode relaxed(driver_);
  MappedStepArgs a{};
  a.session = view_;
  a.step = step;
  a.d_shared = At<SessionControl* const>(host_block_device_ + offsetof(HostBlock, shared));
  a.d_report = At<StepReport>(host_block_device_ + offsetof(HostBlock, report));
  return Launch(functions_[kStep], 1, true, stream, &a, "cuLaunchKernel(step)");
}

StreamCopier::StepFlagsReport StreamCopier::LastStep() const {
  const uint64_t word = Load(static_cast<const HostBlock*>(host_block_)->report.step_and_flags);
  StepFlagsReport r;
  r.step = kernels::ReportedStep(word);
  r.flags = kernels::ReportedFlags(word);
  return r;
}

StreamCopier::StepFlagsReport StreamCopier::CurrentStep() const {
  const uint64_t word = Load(static_cast<const HostBlock*>(host_block_)->current_step);
  StepFlagsReport r;
  r.step = kernels::ReportedStep(word);
  r.flags = kernels::ReportedFlags(word);
  return r;
}

uint64_t StreamCopier::LeaseShortReports() const {
  return Load(static_cast<const HostBlock*>(host_block_)->lease_short);
}

Status StreamCopier::CheckChunk(uint32_t tier, uint64_t slot, uint64_t bytes) const {
  if (tier >= kernels::kLeaseTiers || slot >= geometry_.tier_slots[tier]) {
    return InvalidArgumentError("no chunk slot " + std::to_string(slot) + " in lease tier " +
                                std::to_string(tier));
  }
  if (bytes == 0 || bytes > geometry_.chunk_bytes || bytes % geometry_.page_bytes != 0) {
    return InvalidArgumentError("a chunk of " + std::to_string(bytes) +
                                " bytes is not a whole number of pages up to chunk_bytes");
  }
  return Status::Ok();
}

Status StreamCopier::AddChunk(CUstream stream, uint32_t tier, uint64_t slot, uint64_t bytes) {
  STASH_RETURN_IF_ERROR(CheckChunk(tier, slot, bytes));
  if (slots_[tier][slot] != SlotState::kAbsent) {
    return FailedPreconditionError("chunk slot " + std::to_string(slot) + " of lease tier " +
                                   std::to_string(tier) +
                                   " is in the ring already (or its removal is pending)");
  }
  const RelaxedCaptureMode relaxed(driver_);
  if (Capturing(stream)) {
    return FailedPreconditionError(
        "lease changes happen between steps, outside capture: the stream captures");
  }
  MappedRingArgs a{};
  a.session = view_;
  a.tier = tier;
  a.first_id = slot * (geometry_.chunk_bytes / geometry_.page_bytes);
  a.pages = bytes / geometry_.page_bytes;
  STASH_RETURN_IF_ERROR(
      Launch(functions_[kAddPages], 1, true, stream, &a, "cuLaunchKernel(add pages)"));
  slots_[tier][slot] = SlotState::kInRing;
  return Status::Ok();
}

Status StreamCopier::RemoveChunk(CUstream stream, uint32_t tier, uint64_t slot, uint64_t bytes) {
  STASH_RETURN_IF_ERROR(CheckChunk(tier, slot, bytes));
  const uint64_t key = (uint64_t{tier} << 48) | slot;
  if (slots_[tier][slot] != SlotState::kInRing) {
    return FailedPreconditionError(
        "chunk slot " + std::to_string(slot) + " of lease tier " + std::to_string(tier) +
        (slots_[tier][slot] == SlotState::kRemoving ? " already has a removal pending"
                                                    : " is not in the ring"));
  }
  if (free_answers_.empty()) {
    return ResourceExhaustedError(std::to_string(kMaxRemovals) +
                                  " chunk removals are pending: collect their answers first");
  }
  const RelaxedCaptureMode relaxed(driver_);
  if (Capturing(stream)) {
    return FailedPreconditionError(
        "lease changes happen between steps, outside capture: the stream captures");
  }
  const uint32_t answer = free_answers_.back();
  auto* host = static_cast<HostBlock*>(host_block_);
  __atomic_store_n(&host->answers[answer], kPending, __ATOMIC_RELEASE);
  MappedRingArgs a{};
  a.session = view_;
  a.tier = tier;
  a.first_id = slot * (geometry_.chunk_bytes / geometry_.page_bytes);
  a.pages = bytes / geometry_.page_bytes;
  a.d_result =
      At<uint64_t>(host_block_device_ + offsetof(HostBlock, answers) + answer * sizeof(uint64_t));
  STASH_RETURN_IF_ERROR(
      Launch(functions_[kRemoveChunk], 1, true, stream, &a, "cuLaunchKernel(remove chunk)"));
  free_answers_.pop_back();
  removals_.emplace(key, answer);
  slots_[tier][slot] = SlotState::kRemoving;
  return Status::Ok();
}

std::optional<bool> StreamCopier::RemovalDone(uint32_t tier, uint64_t slot) {
  auto it = removals_.find((uint64_t{tier} << 48) | slot);
  if (it == removals_.end()) return std::nullopt;
  const uint64_t value = Load(static_cast<HostBlock*>(host_block_)->answers[it->second]);
  if (value == kPending) return std::nullopt;
  free_answers_.push_back(static_cast<uint32_t>(it->second));
  removals_.erase(it);
  slots_[tier][slot] = value == 1 ? SlotState::kAbsent : SlotState::kInRing;
  return value == 1;
}

template <typename Change>
void StreamCopier::RewriteBoard(Change change) {
  auto* shadow = reinterpret_cast<kernels::MappedGroupHeader*>(board_shadow_.data());
  change(*shadow);
  // The board under its generation: odd while written (an acquire exchange, which no later store
  // passes), every word (release stores: a reader that acquires a word of this rewrite then sees
  // the odd generation, or a later one), then even again (a release store, which no earlier
  // store passes).
  auto* board = static_cast<uint64_t*>(group_host_);
  const uint64_t gen = shadow->generation;
  __atomic_exchange_n(&board[0], gen + 1, __ATOMIC_ACQ_REL);
  const auto* words = reinterpret_cast<const uint64_t*>(board_shadow_.data());
  for (size_t i = 1; i < board_shadow_.size() / sizeof(uint64_t); ++i) {
    __atomic_store_n(&board[i], words[i], __ATOMIC_RELEASE);
  }
  shadow->generation = gen + 2;
  __atomic_store_n(&board[0], gen + 2, __ATOMIC_RELEASE);
}

bool StreamCopier::InGroup() const {
  const auto& b = *reinterpret_cast<const kernels::MappedGroupHeader*>(board_shadow_.data());
  if (b.generation == 0) return false;
  for (const kernels::GroupView& depot : b.depot) {
    if (depot.tags != nullptr) return true;
  }
  return false;
}

bool StreamCopier::grouped() const {
  MutexLock lock(&group_mu_);
  return InGroup();
}

std::vector<std::pair<uint32_t, kernels::GroupChunkRef>> StreamCopier::LeaveGroup() {
  std::vector<std::pair<uint32_t, kernels::GroupChunkRef>> left;
  MutexLock lock(&group_mu_);
  if (!InGroup()) return left;
  RewriteBoard([&](kernels::MappedGroupHeader& h) {
    for (uint32_t t = 0; t < kernels::kLeaseTiers; ++t) {
      const kernels::GroupChunkRef* refs = kernels::GroupRefs(&h) + h.refs_first[t];
      for (uint64_t i = 0; i < h.refs_count[t]; ++i) left.emplace_back(t, refs[i]);
      h.refs_count[t] = 0;
      h.depot[t] = kernels::GroupView{};
    }
  });
  return left;
}

Status StreamCopier::JoinGroup(uint32_t tag, uint64_t chunk_pages,
                               const std::array<GroupTier, kernels::kLeaseTiers>& tiers) {
  if (tag < kernels::kFirstMemberTag) {
    return InvalidArgumentError("member tag " + std::to_string(tag) + " is not a member's");
  }
  if (chunk_pages != geometry_.chunk_bytes / geometry_.page_bytes) {
    return InvalidArgumentError("the group's chunks are " + std::to_string(chunk_pages) +
                                " pages, this session's " +
                                std::to_string(geometry_.chunk_bytes / geometry_.page_bytes));
  }
  if (!geometry_.group) {
    return FailedPreconditionError(
        "this copier was made for a session in no group (Geometry.group is false)");
  }
  MutexLock lock(&group_mu_);
  if (InGroup()) return FailedPreconditionError("this session joined its group already");
  for (uint32_t t = 0; t < kernels::kLeaseTiers; ++t) {
    for (SlotState slot : slots_[t]) {
      if (slot != SlotState::kAbsent) {
        return FailedPreconditionError(
            "lease tier " + std::to_string(t) +
            " holds a chunk of its own: a session joins its group before it leases alone");
      }
    }
  }
  RewriteBoard([&](kernels::MappedGroupHeader& b) {
    b.tag = tag;
    b.chunk_pages = chunk_pages;
    for (uint32_t t = 0; t < kernels::kLeaseTiers; ++t) {
      if (geometry_.tier_slots[t] == 0) continue;  // no range: the tier takes nothing
      b.depot[t] = tiers[t].depot;
      b.first_page[t] = tiers[t].first_page;
    }
  });
  return Status::Ok();
}

Status StreamCopier::AddGroupChunk(uint32_t tier, const kernels::GroupChunkRef& ref) {
  if (tier >= kernels::kLeaseTiers)
    return InvalidArgumentError("no lease tier " + std::to_string(tier));
  const uint64_t chunk_pages = geometry_.chunk_bytes / geometry_.page_bytes;
  MutexLock lock(&group_mu_);
  auto& b = *reinterpret_cast<kernels::MappedGroupHeader*>(board_shadow_.data());
  if (!InGroup()) return FailedPreconditionError("this session is in no group");
  const uint64_t range_pages = geometry_.tier_slots[tier] * chunk_pages;
  if (b.depot[tier].tags == nullptr || ref.pages == 0 || ref.pages > chunk_pages ||
      ref.first_page < b.first_page[tier] ||
      ref.first_page - b.first_page[tier] > range_pages - std::min(range_pages, ref.pages) ||
      ref.first_page != ref.chunk * chunk_pages) {
    return InvalidArgumentError(
        "group chunk " + std::to_string(ref.chunk) + " (pages " + std::to_string(ref.first_page) +
        ".." + std::to_string(ref.first_page + ref.pages) +
        ") is not a whole chunk inside lease tier " + std::to_string(tier) + "'s range");
  }
  kernels::GroupChunkRef* refs = kernels::GroupRefs(&b) + b.refs_first[tier];
  for (uint64_t i = 0; i < b.refs_count[tier]; ++i) {
    if (refs[i].chunk == ref.chunk) {
      return AlreadyExistsError("group chunk " + std::to_string(ref.chunk) + " is on the board");
    }
  }
  if (b.refs_count[tier] >= geometry_.tier_slots[tier]) {
    return ResourceExhaustedError("lease tier " + std::to_string(tier) + "'s board is full");
  }
  RewriteBoard([&](kernels::MappedGroupHeader& h) {
    kernels::GroupRefs(&h)[h.refs_first[tier] + h.refs_count[tier]] = ref;
    ++h.refs_count[tier];
  });
  return Status::Ok();
}

std::vector<std::pair<uint32_t, kernels::GroupChunkRef>> StreamCopier::TakeLeavingGroupChunks() {
  std::vector<std::pair<uint32_t, kernels::GroupChunkRef>> leaving;
  MutexLock lock(&group_mu_);
  auto& b = *reinterpret_cast<kernels::MappedGroupHeader*>(board_shadow_.data());
  auto* states = reinterpret_cast<kernels::MappedGroupStates*>(static_cast<uint8_t*>(group_host_) +
                                                               board_shadow_.size());
  if (b.generation == 0 || __atomic_load_n(&states->generation, __ATOMIC_ACQUIRE) != b.generation) {
    return leaving;
  }
  const uint32_t* state = kernels::GroupStates(states);
  for (uint32_t t = 0; t < kernels::kLeaseTiers; ++t) {
    const kernels::GroupChunkRef* refs = kernels::GroupRefs(&b) + b.refs_first[t];
    for (uint64_t i = 0; i < b.refs_count[t]; ++i) {
      if (__atomic_load_n(&state[b.refs_first[t] + i], __ATOMIC_RELAXED) ==
          kernels::kGroupChunkLeaving) {
        leaving.emplace_back(t, refs[i]);
      }
    }
  }
  if (leaving.empty()) return leaving;
  RewriteBoard([&](kernels::MappedGroupHeader& h) {
    for (uint32_t t = 0; t < kernels::kLeaseTiers; ++t) {
      kernels::GroupChunkRef* refs = kernels::GroupRefs(&h) + h.refs_first[t];
      uint64_t kept = 0;
      for (uint64_t i = 0; i < h.refs_count[t]; ++i) {
        const bool gone = std::any_of(leaving.begin(), leaving.end(), [&](const auto& l) {
          return l.first == t && l.second.chunk == refs[i].chunk;
        });
        if (!gone) refs[kept++] = refs[i];
      }
      h.refs_count[t] = kept;
    }
  });
  return leaving;
}

}  // namespace stash::client
