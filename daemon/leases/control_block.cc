#include "daemon/leases/control_block.h"

#include <algorithm>
#include <map>
#include <string>
#include <tuple>

#include "common/macros.h"
#include "common/text.h"

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
  v.step_stashes = k::ControlLoad(block_->step_stashes);
  v.demand_high_water = std::min(k::ControlLoad(block_->demand_high_water), quota_pages);
  v.largest_stash_pages = std::min(k::ControlLoad(block_->largest_stash_pages), quota_pages);
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

LiveView ControlBlock::ReadLive(const ControlView& view) const {
  LiveView out;
  uint64_t stashes = 0;
  uint64_t pages = 0;
  uint64_t bytes = 0;
  for (const ControlTierView& t : view.tiers) {
    stashes += t.stashes_live;
    pages += t.pages_used;
    bytes += t.bytes_live;
  }
  out.untagged = stashes;
  if (!view.valid || k::ControlLoad(live_->magic) != k::kLiveTableMagic) return out;
  std::map<std::tuple<uint32_t, uint32_t, std::string>, stash::v1::LiveStashes> rows;
  for (uint32_t i = 0; i < k::kLiveEntries && out.untagged > 0; ++i) {
    const k::LiveEntry& e = live_->entries[i];
    // Acquire loads: the seq read last is read after every field (the rank's release stores
    // make a field of a newer write come with its odd seq).
    auto get = [](const uint64_t& field) { return __atomic_load_n(&field, __ATOMIC_ACQUIRE); };
    const uint64_t seq = get(e.seq);
    if (seq % 2 != 0) continue;  // being rewritten: its stash counts as untagged
    const uint64_t ticket = get(e.ticket);
    const uint64_t tags = get(e.tags);
    const uint64_t entry_bytes = get(e.bytes);
    const uint64_t entry_pages = get(e.pages);
    const uint64_t name_bytes = std::min(get(e.name_bytes), k::kLiveNameBytes);
    uint64_t words[k::kLiveNameBytes / 8];
    for (size_t w = 0; w < k::kLiveNameBytes / 8; ++w) words[w] = get(e.name[w]);
    if (k::ControlLoad(e.seq) != seq || ticket == 0) continue;
    // Within what the session holds: the rows never add up to more than the block's counts.
    const uint64_t p = std::min(entry_pages, pages);
    const uint64_t b = std::min(entry_bytes, bytes);
    pages -= p;
    bytes -= b;
    --out.untagged;
    const auto layer = static_cast<uint32_t>(tags);
    const auto microbatch = static_cast<uint32_t>(tags >> 32);
    // Printable UTF-8 kept; control characters, backslashes and broken UTF-8 as \xNN.
    std::string name = Escaped(std::string_view(reinterpret_cast<const char*>(words), name_bytes),
                               k::kLiveNameBytes);
    stash::v1::LiveStashes& row = rows[{layer, microbatch, name}];
    row.set_layer(layer);
    row.set_microbatch(microbatch);
    row.set_name(std::move(name));
    row.set_stashes(row.stashes() + 1);
    row.set_bytes(row.bytes() + b);
    row.set_pages(row.pages() + p);
  }
  out.rows.reserve(rows.size());
  for (auto& [key, row] : rows) out.rows.push_back(std::move(row));
  return out;
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

bool ControlBlock::attached() const { return k::ControlLoad(block_->attached) == k::kControlMagic; }

}  // namespace stash::daemon
