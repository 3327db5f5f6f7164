// CudaMappedSession's lease changes: applying the daemon's lease answers on the trainer's stream
// (new chunks mapped, shrinks and retirements ordered behind the stream's pages), the control
// block, and the chunks taken back. The per-operation path and the lease thread are in
// cuda_mapped_session.cc.
#include <sys/mman.h>

#include <algorithm>
#include <cstring>

#include "client/mapped/cuda/cuda_lease_memory.h"
#include "client/mapped/cuda/cuda_mapped_session.h"
#include "client/mapped/cuda/stream_copier.h"
#include "client/mapped/lease_terms.h"
#include "common/cuda_driver.h"
#include "common/cuda_vmm.h"
#include "common/logging.h"
#include "common/macros.h"

namespace stash::client {

using kernels::ControlLoad;
using kernels::ControlStore;

std::vector<uint64_t> CudaMappedSession::Apply(LeaseAnswer& answer, const SessionStream* from,
                                               Status* first) {
  auto fail = [first](const Status& st) {
    if (first->ok()) *first = st;
  };
  std::vector<uint64_t> give_back;
  if (from != stream().get()) {  // a reconnect came between: these belong to the old session
    for (const LeaseAnswer::Chunk& c : answer.chunks) give_back.push_back(c.id);
    answer.chunks.clear();
    return give_back;
  }
  if (answer.control_block.valid()) {
    Status st = SetControlBlock(std::move(answer.control_block), answer.control_block_bytes);
    if (!st.ok()) fail(st);
  }
  if (answer.group_block.valid()) {
    Status st = JoinGroup(answer);
    if (!st.ok()) fail(st);
  }
  for (LeaseAnswer::Chunk& c : answer.chunks) {
    const uint32_t tier = LeaseTierOf(c.tier);
    if (c.group_page.has_value()) {
      if (!MapGroupChunk(tier, c, from, first)) give_back.push_back(c.id);
      continue;
    }
    int owner = -1;
    if (tier != kernels::kLeaseHost) {
      CUuuid uuid{};
      if (c.gpu_uuid.size() != sizeof(uuid.bytes)) {
        fail(InvalidArgumentError("stashd leased a GPU chunk without its GPU's UUID"));
        give_back.push_back(c.id);
        continue;
      }
      std::memcpy(uuid.bytes, c.gpu_uuid.data(), sizeof(uuid.bytes));
      StatusOr<int> ordinal = GpuOrdinalOfUuid(driver_, FormatGpuUuid(uuid));
      if (!ordinal.ok()) {
        fail(ordinal.status());
        give_back.push_back(c.id);
        continue;
      }
      owner = *ordinal;
    }
    uint64_t slot = 0;
    {
      MutexLock lock(&mu_);
      if (from != stream().get() || ended_drained_) {  // the session ended meanwhile: back
        give_back.push_back(c.id);
        continue;
      }
      std::vector<SlotInfo>& slots = slots_[tier];
      while (slot < slots.size() && slots[slot].state != Slot::kFree) ++slot;
      if (slot == slots.size()) {
        fail(ResourceExhaustedError("stashd leased more chunks than the tier's range holds"));
        give_back.push_back(c.id);
        continue;
      }
      slots[slot] = SlotInfo{Slot::kMapping, c.id, c.bytes};
    }
    // The import and map run unlocked: enqueues go on meanwhile.
    const Status mapped = memory_->Map(tier, slot, std::move(c.fd), c.bytes, owner);
    MutexLock lock(&mu_);
    if (mapped.ok()) {
      slots_[tier][slot].state = Slot::kMapped;
    } else {
      slots_[tier][slot] = SlotInfo{};
      give_back.push_back(c.id);
      if (tier == kernels::kLeasePeer && mapped.code() == StatusCode::kFailedPrecondition) {
        Log("client")->warn("mapped session: the peer tier is skipped ({})", mapped.ToString());
      } else {
        fail(mapped);
      }
    }
  }
  answer.chunks.clear();
  MutexLock lock(&mu_);
  if (from != stream().get()) return give_back;
  for (const LeaseAnswer::Held& held : answer.lease) {
    targets_[LeaseTierOf(held.tier)] =
        held.pages_target < held.pages ? held.pages_target : kNoTarget;
  }
  return give_back;
}

Status CudaMappedSession::JoinGroup(LeaseAnswer& answer) {
  {
    MutexLock lock(&mu_);
    if (group_joined_) return Status::Ok();  // sent again: the first one stays
  }
  CUuuid uuid{};
  if (answer.group_gpu_uuid.size() != sizeof(uuid.bytes) ||
      answer.group_tier_first_page.size() != kernels::kLeaseTiers) {
    return FailedPreconditionError(
        "stashd sent this GPU session a group depot in host memory (or without its tiers' "
        "first pages): use a stashd of the same release as this client library");
  }
  std::memcpy(uuid.bytes, answer.group_gpu_uuid.data(), sizeof(uuid.bytes));
  STASH_ASSIGN_OR_RETURN(int ordinal, GpuOrdinalOfUuid(driver_, FormatGpuUuid(uuid)));
  if (ordinal != memory_->device()) {
    return FailedPreconditionError("stashd sent the group depot of GPU " + std::to_string(ordinal) +
                                   " to a session on GPU " + std::to_string(memory_->device()));
  }
  const kernels::GroupLayout layout =
      kernels::GroupLayoutFor(answer.group_pages, answer.group_chunks);
  if (layout.block_bytes > answer.group_block_bytes) {
    return InvalidArgumentError("the group depot is " + std::to_string(answer.group_block_bytes) +
                                " bytes, its layout needs " + std::to_string(layout.block_bytes));
  }
  STASH_ASSIGN_OR_RETURN(
      CUdeviceptr at, memory_->MapDepot(std::move(answer.group_block), answer.group_block_bytes));
  kernels::GroupView view{};
  // NOLINTBEGIN(performance-no-int-to-ptr): device addresses, read only by the kernels
  view.header = reinterpret_cast<kernels::GroupHeader*>(at);
  view.chunk_free = reinterpret_cast<uint32_t*>(at + layout.chunk_free_offset);
  view.chunk_state = reinterpret_cast<uint32_t*>(at + layout.chunk_state_offset);
  view.tags = reinterpret_cast<uint32_t*>(at + layout.tags_offset);
  // NOLINTEND(performance-no-int-to-ptr)
  view.pages = answer.group_pages;
  view.chunks = answer.group_chunks;
  // The own device's pages and this GPU's host chunks: both are in this GPU's depot. Other
  // GPUs' pools are not claimed here (each GPU's plan kernels claim in its own depot).
  std::array<StreamCopier::GroupTier, kernels::kLeaseTiers> tiers{};
  tiers[kernels::kLeaseDevice] = {view, answer.group_tier_first_page[kernels::kLeaseDevice]};
  if (options_.allow_host_spill) {
    tiers[kernels::kLeaseHost] = {view, answer.group_tier_first_page[kernels::kLeaseHost]};
  }
  MutexLock lock(&mu_);
  PrimaryContext::Scope scope(*context_);
  STASH_RETURN_IF_ERROR(scope.status());
  Status joined =
      copier_->JoinGroup(answer.member_tag, memory_->chunk_bytes() / page_bytes_, tiers);
  if (!joined.ok()) {
    memory_->UnmapDepot();  // named by no board
    return joined;
  }
  for (uint32_t t = 0; t < kernels::kLeaseTiers; ++t) {
    group_first_page_[t] = answer.group_tier_first_page[t];
  }
  group_joined_ = true;
  return Status::Ok();
}

uint64_t CudaMappedSession::GroupSlotOf(uint32_t tier, uint64_t page) const {
  const uint64_t chunk_pages = memory_->chunk_bytes() / page_bytes_;
  const uint64_t first_page = group_first_page_[tier];
  if (page < first_page || (page - first_page) % chunk_pages != 0) return UINT64_MAX;
  return (page - first_page) / chunk_pages;
}

bool CudaMappedSession::MapGroupChunk(uint32_t tier, LeaseAnswer::Chunk& c,
                                      const SessionStream* from, Status* first) {
  auto fail = [first](const Status& st) {
    if (first->ok()) *first = st;
    return false;
  };
  const uint64_t chunk_pages = memory_->chunk_bytes() / page_bytes_;
  const uint64_t page = *c.group_page;
  uint64_t slot = 0;
  {
    MutexLock lock(&mu_);
    // A reconnect came between (this answer is the old session's), or the session ended: back.
    if (from != stream().get() || ended_drained_) return false;
    if (!group_joined_) {
      return fail(FailedPreconditionError("stashd sent a group chunk before the group's depot"));
    }
    slot = GroupSlotOf(tier, page);
    if (slot >= slots_[tier].size() || slots_[tier][slot].state != Slot::kFree) {
      return fail(InvalidArgumentError("group chunk " + std::to_string(c.id) + " at group page " +
                                       std::to_string(page) +
                                       " has no free place in this session's range of its tier"));
    }
    slots_[tier][slot] = SlotInfo{Slot::kMapping, c.id, c.bytes, false, true};
  }
  const Status mapped = memory_->Map(tier, slot, std::move(c.fd), c.bytes, memory_->device());
  MutexLock lock(&mu_);
  if (!mapped.ok()) {
    slots_[tier][slot] = SlotInfo{};
    return fail(mapped);
  }
  // The session changed while the chunk was mapped: it is the old session's.
  const bool moved = from != stream().get() || ended_drained_ || !group_joined_;
  const Status added =
      moved ? Status::Ok()
            : copier_->AddGroupChunk(
                  tier, kernels::GroupChunkRef{page / chunk_pages, page, c.bytes / page_bytes_});
  if (moved || !added.ok()) {
    // Mapped but on no board: nothing names it. It goes back once it is unmapped (Reap at the
    // next boundary; an old session's as its orphan), not now.
    if (!added.ok() && first->ok()) *first = added;
    slots_[tier][slot].old = moved;
    slots_[tier][slot].state =
        memory_->Unmap(tier, slot, nullptr).ok() ? Slot::kUnmapping : Slot::kMapped;
    if (slots_[tier][slot].state == Slot::kMapped) slots_[tier][slot].old = true;  // retried
    return true;
  }
  slots_[tier][slot].state = Slot::kInRing;  // on the board: the kernels claim its pages
  return true;
}

Status CudaMappedSession::SetControlBlock(UniqueFd fd, uint64_t bytes) {
  STASH_ASSIGN_OR_RETURN(kernels::SessionControl * block, MapControlBlock(fd.get(), bytes));
  std::shared_ptr<void> owner(block, [bytes](void* p) { munmap(p, bytes); });
  std::function<void()> release;
  STASH_ASSIGN_OR_RETURN(uint64_t device, cuda_->MapHost(block, bytes, owner, &release));
  ControlStore(block->attached, kernels::kControlMagic);
  MutexLock lock(&mu_);
  if (control_release_) control_release_();
  control_release_ = std::move(release);
  shared_control_ = block;
  shared_control_bytes_ = bytes;
  // NOLINTNEXTLINE(performance-no-int-to-ptr): a device address
  pending_control_ = reinterpret_cast<kernels::SessionControl*>(device);
  return Status::Ok();
}

void CudaMappedSession::ChangeLease(void* gpu_stream) {
  const auto stream = static_cast<CUstream>(gpu_stream);
  if (pending_control_ != nullptr) {
    Status st =
        copier_->AttachControl(stream, pending_control_,
                               reinterpret_cast<uint8_t*>(shared_control_), shared_control_bytes_);
    if (st.ok()) {
      pending_control_ = nullptr;
    } else {
      Log("client")->warn("mapped session: the control block is not attached yet ({})",
                          st.ToString());
    }
  }
  // The daemon asked for chunks back (another session found the pool leased out): down to its
  // targets, as far as no stash holds them. Targets first, then the number (RequestReturn's
  // order).
  if (shared_control_ != nullptr) {
    kernels::SessionControl& c = *shared_control_;
    const uint64_t asked = __atomic_load_n(&c.return_request, __ATOMIC_ACQUIRE);
    if (asked != ControlLoad(c.return_done)) {
      for (uint32_t t = 0; t < kernels::kLeaseTiers; ++t) {
        targets_[t] = std::min(targets_[t], ControlLoad(c.return_target_pages[t]));
      }
      ControlStore(c.return_done, asked);
    }
  }
  std::vector<uint64_t> freed;
  for (uint32_t t = 0; t < kernels::kLeaseTiers; ++t) {
    std::vector<SlotInfo>& slots = slots_[t];
    for (uint64_t s = 0; s < slots.size(); ++s) {
      if (slots[s].state != Slot::kRemoving) continue;
      const std::optional<bool> left = copier_->RemovalDone(t, s);
      if (!left.has_value()) continue;
      if (!*left) {
        slots[s].state = Slot::kInRing;  // a stash holds a page: tried again while over target
        continue;
      }
      // Out of the ring after every operation before the removal: unmapped once that ran.
      const Status unmapping = memory_->Unmap(t, s, stream);
      slots[s].state = unmapping.ok() ? Slot::kUnmapping : Slot::kMapped;
    }
  }
  // Group chunks the daemon took back: off the board now, unmapped once the work enqueued so
  // far (which may still name them) completed, then given back.
  for (const auto& [t, ref] : copier_->TakeLeavingGroupChunks()) {
    const uint64_t s = GroupSlotOf(t, ref.first_page);
    if (s >= slots_[t].size() || !slots_[t][s].group || slots_[t][s].state != Slot::kInRing) {
      continue;
    }
    if (memory_->Unmap(t, s, stream).ok()) slots_[t][s].state = Slot::kUnmapping;
  }
  CudaLeaseMemory::Reaped reaped = memory_->Reap();
  LeaseWork orphans;
  for (const CudaLeaseMemory::SlotRef& r : reaped.freed) {
    // A chunk of a session before a reconnect goes back to that session, as an orphan.
    const SlotInfo& slot = slots_[r.tier][r.slot];
    (slot.old ? orphans.orphans : freed).push_back(slot.chunk_id);
    slots_[r.tier][r.slot] = SlotInfo{};
  }
  if (ended_drained_) {
    // The session they belong to ended: they go back with the next session (SwitchSession).
    ended_orphans_.insert(ended_orphans_.end(), orphans.orphans.begin(), orphans.orphans.end());
    ended_orphans_.insert(ended_orphans_.end(), freed.begin(), freed.end());
    orphans.orphans.clear();
    freed.clear();
  }
  if (!orphans.orphans.empty()) {
    orphans.orphans_of = old_session_;
    rounds_.Ask(std::move(orphans));
  }
  if (!reaped.status.ok()) {
    Log("client")->warn("mapped session: a chunk is not unmapped yet ({})",
                        reaped.status.ToString());
  }
  for (uint32_t t = 0; t < kernels::kLeaseTiers; ++t) {
    if (targets_[t] != kNoTarget) ShrinkTo(gpu_stream, t, targets_[t]);
  }
  for (uint32_t t = 0; t < kernels::kLeaseTiers; ++t) {
    std::vector<SlotInfo>& slots = slots_[t];
    for (uint64_t s = 0; s < slots.size(); ++s) {
      if (slots[s].state != Slot::kMapped) continue;
      if (slots[s].old) {  // mapped for a session a reconnect replaced: out again
        if (memory_->Unmap(t, s, stream).ok()) slots[s].state = Slot::kUnmapping;
        continue;
      }
      const Status added = copier_->AddChunk(stream, t, s, slots[s].bytes);
      if (added.ok()) {
        slots[s].state = Slot::kInRing;
      } else {
        Log("client")->warn("mapped session: a leased chunk is not in use yet ({})",
                            added.ToString());
      }
    }
  }
  if (!freed.empty()) {
    LeaseWork work;
    work.give_back = std::move(freed);
    rounds_.Ask(std::move(work));
  }
}

void CudaMappedSession::ShrinkTo(void* gpu_stream, uint32_t tier, uint64_t target_pages) {
  const auto stream = static_cast<CUstream>(gpu_stream);
  const uint64_t page = page_bytes_;
  std::vector<SlotInfo>& slots = slots_[tier];
  uint64_t held = 0;
  bool removing = false;
  for (const SlotInfo& s : slots) {
    if (s.state == Slot::kMapped || s.state == Slot::kInRing) held += s.bytes / page;
    removing = removing || s.state == Slot::kRemoving;
  }
  // Chunks not in the ring yet go first (nothing used them), then the highest slots.
  for (Slot state : {Slot::kMapped, Slot::kInRing}) {
    for (uint64_t s = slots.size(); s-- > 0 && held > target_pages;) {
      if (slots[s].state != state) continue;
      const Status st = state == Slot::kMapped
                            ? memory_->Unmap(tier, s, stream)
                            : copier_->RemoveChunk(stream, tier, s, slots[s].bytes);
      if (!st.ok()) continue;
      slots[s].state = state == Slot::kMapped ? Slot::kUnmapping : Slot::kRemoving;
      removing = removing || state == Slot::kInRing;
      held -= slots[s].bytes / page;
    }
  }
  // Reached once nothing is on its way out that may come back (a stash held a page).
  if (held <= target_pages && !removing) targets_[tier] = kNoTarget;
}

StatusOr<std::vector<uint64_t>> CudaMappedSession::RetireChunks(void* gpu_stream) {
  const auto stream = static_cast<CUstream>(gpu_stream);
  {
    MutexLock lock(&mu_);
    PrimaryContext::Scope scope(*context_);
    STASH_RETURN_IF_ERROR(scope.status());
    // A group's chunks come off the board first (with its depot: the next session joins its own
    // daemon's group), then are unmapped behind the work that may name them, as the others.
    (void)copier_->LeaveGroup();
    group_joined_ = false;
    for (uint32_t t = 0; t < kernels::kLeaseTiers; ++t) {
      targets_[t] = kNoTarget;
      std::vector<SlotInfo>& slots = slots_[t];
      for (uint64_t s = 0; s < slots.size(); ++s) {
        if (slots[s].state == Slot::kFree) continue;
        slots[s].old = true;
        if (slots[s].group && slots[s].state == Slot::kInRing) {
          if (memory_->Unmap(t, s, stream).ok()) slots[s].state = Slot::kUnmapping;
          continue;
        }
        if (slots[s].state == Slot::kInRing &&
            copier_->RemoveChunk(stream, t, s, slots[s].bytes).ok()) {
          slots[s].state = Slot::kRemoving;
        } else if (slots[s].state == Slot::kMapped && memory_->Unmap(t, s, stream).ok()) {
          slots[s].state = Slot::kUnmapping;
        }
      }
    }
  }
  // A change of session is rare: the stream is waited for here, twice (the removals' answers,
  // then the unmaps' work), so that the slots are free when this returns.
  STASH_RETURN_IF_ERROR(driver_->Check(driver_->StreamSynchronize(stream), "cuStreamSynchronize"));
  {
    MutexLock lock(&mu_);
    PrimaryContext::Scope scope(*context_);
    STASH_RETURN_IF_ERROR(scope.status());
    for (uint32_t t = 0; t < kernels::kLeaseTiers; ++t) {
      std::vector<SlotInfo>& slots = slots_[t];
      for (uint64_t s = 0; s < slots.size(); ++s) {
        if (slots[s].state != Slot::kRemoving || copier_->RemovalDone(t, s) != true) continue;
        if (memory_->Unmap(t, s, stream).ok()) slots[s].state = Slot::kUnmapping;
      }
    }
  }
  STASH_RETURN_IF_ERROR(driver_->Check(driver_->StreamSynchronize(stream), "cuStreamSynchronize"));
  std::vector<uint64_t> ids;
  MutexLock lock(&mu_);
  PrimaryContext::Scope scope(*context_);
  STASH_RETURN_IF_ERROR(scope.status());
  memory_->UnmapDepot();  // no kernel claims there any more: the stream ran past LeaveGroup
  CudaLeaseMemory::Reaped reaped = memory_->Reap();
  for (const CudaLeaseMemory::SlotRef& r : reaped.freed) {
    ids.push_back(slots_[r.tier][r.slot].chunk_id);
    slots_[r.tier][r.slot] = SlotInfo{};
  }
  if (!reaped.status.ok()) {
    Log("client")->warn("mapped session: a chunk of the old session is not unmapped yet ({})",
                        reaped.status.ToString());
  }
  return ids;
}

}  // namespace stash::client
