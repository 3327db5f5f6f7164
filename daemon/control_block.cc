#include "daemon/control_block.h"

#include <algorithm>

#include "common/macros.h"

namespace stash::daemon {

namespace k = stash::kernels;

StatusOr<std::unique_ptr<ControlBlock>> ControlBlock::Create() {
  STASH_ASSIGN_OR_RETURN(auto memory,
                         SharedMemory::CreateSealed("stashd-control", k::kControlBlockBytes));
  auto* block = reinterpret_cast<k::SessionControl*>(memory->data());
  k::ControlStore(block->version, k::kControlVersion);
  k::ControlStore(block->magic, k::kControlMagic);
  return std::unique_ptr<ControlBlock>(new ControlBlock(std::move(memory), block));
}

ControlBlock::~ControlBlock() = default;

ControlView ControlBlock::Read(const std::array<uint64_t, k::kLeaseTiers>& pages_leased,
                               uint64_t quota_pages, uint64_t page_bytes) const {
  ControlView v;
  if (k::ControlLoad(block_->magic) != k::kControlMagic ||
      k::ControlLoad(block_->version) != k::kControlVersion) {
    return v;  // the rank wrote over the header: show nothing rather than garbage
  }
  v.valid = true;
  v.step = k::ControlLoad(block_->step);
  v.steps = k::ControlLoad(block_->steps);
  v.stashes = k::ControlLoad(block_->stashes);
  v.reloads = k::ControlLoad(block_->reloads);
  v.releases = k::ControlLoad(block_->releases);
  v.bytes_stashed = k::ControlLoad(block_->bytes_stashed);
  v.bytes_reloaded = k::ControlLoad(block_->bytes_reloaded);
  v.spills = k::ControlLoad(block_->spills);
  v.overflows = k::ControlLoad(block_->overflows);
  v.rejected = k::ControlLoad(block_->rejected);
  {
    MutexLock lock(&mu_);
    uint64_t* totals[] = {&v.steps,    &v.stashes,       &v.reloads,
                          &v.releases, &v.bytes_stashed, &v.bytes_reloaded,
                          &v.spills,   &v.overflows,     &v.rejected};
    static_assert(sizeof(totals) / sizeof(totals[0]) == std::tuple_size_v<decltype(totals_)>);
    for (size_t i = 0; i < totals_.size(); ++i) {
      *totals[i] = std::max(*totals[i], totals_[i]);
      totals_[i] = *totals[i];
    }
  }
  v.last_step_demand_high_water =
      std::min(k::ControlLoad(block_->last_step_demand_high_water), quota_pages);
  v.last_step_largest_stash_pages =
      std::min(k::ControlLoad(block_->last_step_largest_stash_pages), quota_pages);
  v.last_step_stashes = k::ControlLoad(block_->last_step_stashes);
  v.attached = k::ControlLoad(block_->attached) == k::kControlMagic;
  v.return_done = k::ControlLoad(block_->return_done);
  const uint64_t flags = k::ControlLoad(block_->step_flags);
  v.step_overflow = (flags & k::kStepOverflow) != 0;
  v.step_spilled = (flags & k::kStepSpilled) != 0;
  for (uint32_t t = 0; t < k::kLeaseTiers; ++t) {
    const k::TierControl& in = block_->tiers[t];
    ControlTierView& out = v.tiers[t];
    const uint64_t leased = pages_leased[t];
    out.pages_used = std::min(k::ControlLoad(in.pages_used), leased);
    out.high_water = std::min(k::ControlLoad(in.high_water), leased);
    out.last_step_high_water = std::min(k::ControlLoad(in.last_step_high_water), leased);
    out.stashes_live = std::min(k::ControlLoad(in.stashes_live), out.pages_used);
    const uint64_t max_bytes = out.pages_used * page_bytes;  // leased pages: no overflow
    out.bytes_live = std::min(k::ControlLoad(in.bytes_live), max_bytes);
  }
  return v;
}

void ControlBlock::SetDraining(bool draining) {
  k::ControlStore(block_->daemon_flags, draining ? k::kDaemonDraining : 0);
}

uint64_t ControlBlock::daemon_flags() const { return k::ControlLoad(block_->daemon_flags); }

uint64_t ControlBlock::RequestReturn(const std::array<uint64_t, k::kLeaseTiers>& target_pages) {
  for (uint32_t t = 0; t < k::kLeaseTiers; ++t) {
    k::ControlStore(block_->return_target_pages[t], target_pages[t]);
  }
  // The targets first, then the number the rank watches (release: a rank that sees the new
  // number reads these targets).
  const uint64_t request = k::ControlLoad(block_->return_request) + 1;
  __atomic_store_n(&block_->return_request, request, __ATOMIC_RELEASE);
  return request;
}

uint64_t ControlBlock::return_requested() const { return k::ControlLoad(block_->return_request); }

}  // namespace stash::daemon
