#include "client/mapped/lease_table.h"

#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>

#include "client/mapped/lease_terms.h"
#include "common/macros.h"
#include "common/shm.h"
#include "common/sys.h"

namespace stash::client {

using kernels::ControlLoad;
using kernels::ControlStore;

namespace {

// Copies the fields the rank writes from `from` into the live block `to`, one store each.
void CarryRankFields(const kernels::SessionControl& from, kernels::SessionControl& to) {
  uint64_t kernels::SessionControl::*const fields[] = {
      &kernels::SessionControl::step,
      &kernels::SessionControl::steps,
      &kernels::SessionControl::stashes,
      &kernels::SessionControl::reloads,
      &kernels::SessionControl::releases,
      &kernels::SessionControl::bytes_stashed,
      &kernels::SessionControl::bytes_reloaded,
      &kernels::SessionControl::spills,
      &kernels::SessionControl::overflows,
      &kernels::SessionControl::rejected,
      &kernels::SessionControl::demand_pages,
      &kernels::SessionControl::demand_high_water,
      &kernels::SessionControl::last_step_demand_high_water,
      &kernels::SessionControl::step_flags,
      &kernels::SessionControl::largest_stash_pages,
      &kernels::SessionControl::last_step_largest_stash_pages,
      &kernels::SessionControl::step_stashes,
      &kernels::SessionControl::last_step_stashes,
      &kernels::SessionControl::return_done};
  for (auto field : fields) ControlStore(to.*field, ControlLoad(from.*field));
  uint64_t kernels::TierControl::*const tier_fields[] = {
      &kernels::TierControl::pages_used, &kernels::TierControl::high_water,
      &kernels::TierControl::last_step_high_water, &kernels::TierControl::stashes_live,
      &kernels::TierControl::bytes_live};
  for (uint32_t t = 0; t < kernels::kLeaseTiers; ++t) {
    for (auto field : tier_fields)
      ControlStore(to.tiers[t].*field, ControlLoad(from.tiers[t].*field));
  }
}

}  // namespace

StatusOr<std::unique_ptr<LeaseTable>> LeaseTable::Create(
    uint64_t page_bytes, uint64_t chunk_bytes,
    const std::array<uint64_t, kernels::kLeaseTiers>& tier_bytes) {
  if (page_bytes == 0 || (page_bytes & (page_bytes - 1)) != 0 || chunk_bytes == 0 ||
      chunk_bytes % page_bytes != 0) {
    return InvalidArgumentError("stashd's chunk geometry is unusable: chunk_bytes " +
                                std::to_string(chunk_bytes) + ", page_bytes " +
                                std::to_string(page_bytes));
  }
  std::unique_ptr<LeaseTable> table(new LeaseTable(page_bytes, chunk_bytes));
  const uint64_t pages_per_chunk = chunk_bytes / page_bytes;
  for (uint32_t tier = 0; tier < kernels::kLeaseTiers; ++tier) {
    TierRange& t = table->tiers_[tier];
    const uint64_t slots = std::max<uint64_t>(
        1,
        (std::min<uint64_t>(tier_bytes[tier], uint64_t{1} << 46) + chunk_bytes - 1) / chunk_bytes);
    t.bytes = slots * chunk_bytes;
    // On a 2 MiB boundary where chunks are whole huge pages, so the daemon's huge pages map
    // as such here too (docs/design.md, "Warm memory").
    const uint64_t align = chunk_bytes % kHugePageBytes == 0 ? kHugePageBytes : 0;
    void* base = mmap(nullptr, t.bytes + align, PROT_NONE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) return ErrnoStatus("reserving a lease range (mmap PROT_NONE)");
    t.base = TrimToAlignment(static_cast<uint8_t*>(base), t.bytes, align);
    // A forked child (a data loader) never inherits a rank's chunks.
    if (madvise(t.base, t.bytes, MADV_DONTFORK) != 0) {
      return ErrnoStatus("madvise(MADV_DONTFORK)");
    }
    t.slots.resize(slots);
    t.ids.resize(slots * pages_per_chunk);
    t.ring.ids = t.ids.data();
    t.ring.capacity = t.ids.size();
  }
  return table;
}

LeaseTable::~LeaseTable() {
  for (TierRange& t : tiers_) {
    if (t.base != nullptr && !grouped()) munmap(t.base, t.bytes);
  }
  if (group_base_ != nullptr) munmap(group_base_, group_range_bytes_);
  if (group_map_ != nullptr) munmap(group_map_, group_map_bytes_);
  if (control_map_ != nullptr) munmap(control_map_, control_map_bytes_);
}

Status LeaseTable::SetControlBlock(UniqueFd fd, uint64_t bytes) {
  STASH_ASSIGN_OR_RETURN(kernels::SessionControl * block, MapControlBlock(fd.get(), bytes));
  void* p = block;
  // The daemon reads this block while we carry our counters over, and it owns magic, version
  // and its own line (daemon_flags, return_request, ...): the rank's fields only, each a
  // store of its own, never a plain copy over the live block.
  CarryRankFields(*control_, *block);
  live_.Attach(static_cast<uint8_t*>(p), bytes);  // the live stashes' tags, carried over too
  ControlStore(block->attached, kernels::kControlMagic);
  if (control_map_ != nullptr) munmap(control_map_, control_map_bytes_);
  control_map_ = static_cast<uint8_t*>(p);
  control_map_bytes_ = bytes;
  control_ = block;
  for (uint32_t tier = 0; tier < kernels::kLeaseTiers; ++tier) PublishTier(tier);
  return Status::Ok();
}

void LeaseTable::PublishTier(uint32_t tier) {
  kernels::TierControl& c = control_->tiers[tier];
  const TierRange& t = tiers_[tier];
  ControlStore(c.ring_head, t.ring.head);
  ControlStore(c.ring_tail, t.ring.tail);
  ControlStore(c.pages_leased, t.pages_leased);
}

Status LeaseTable::SetGroupBlock(UniqueFd fd, uint64_t bytes, uint32_t tag, uint64_t pages,
                                 uint64_t chunks) {
  if (grouped()) return Status::Ok();  // sent again: the first one stays
  const uint64_t chunk_pages = chunk_bytes_ / page_bytes_;
  const kernels::GroupLayout layout = kernels::GroupLayoutFor(pages, chunks);
  struct stat st {};
  if (fstat(fd.get(), &st) != 0) return ErrnoStatus("fstat of the group depot");
  if (tag < kernels::kFirstMemberTag || pages != chunks * chunk_pages ||
      pages > (uint64_t{1} << 40) || bytes < layout.block_bytes ||
      static_cast<uint64_t>(st.st_size) < layout.block_bytes) {
    return InvalidArgumentError("stashd's group depot does not fit its layout (" +
                                std::to_string(st.st_size) + " bytes for " + std::to_string(pages) +
                                " pages in " + std::to_string(chunks) + " chunks, tag " +
                                std::to_string(tag) + ")");
  }
  for (const TierRange& t : tiers_) {
    if (t.pages_leased != 0) return FailedPreconditionError("the group's depot came after chunks");
  }
  void* map = mmap(nullptr, layout.block_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (map == MAP_FAILED) return ErrnoStatus("mapping the group depot");
  madvise(map, layout.block_bytes, MADV_DONTFORK);
  auto* header = static_cast<kernels::GroupHeader*>(map);
  if (__atomic_load_n(&header->magic, __ATOMIC_ACQUIRE) != kernels::kGroupMagic ||
      header->version != kernels::kGroupVersion) {
    munmap(map, layout.block_bytes);
    return FailedPreconditionError(
        "stashd's group depot is another layout version: use a client library and a stashd of "
        "the same release");
  }
  // One range for the whole address space: a page id is the same memory in every member.
  const uint64_t range = pages * page_bytes_;
  const uint64_t align = chunk_bytes_ % kHugePageBytes == 0 ? kHugePageBytes : 0;
  void* base =
      mmap(nullptr, range + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) {
    munmap(map, layout.block_bytes);
    return ErrnoStatus("reserving the group's range (mmap PROT_NONE)");
  }
  group_base_ = TrimToAlignment(static_cast<uint8_t*>(base), range, align);
  group_range_bytes_ = range;
  madvise(group_base_, range, MADV_DONTFORK);
  group_map_ = static_cast<uint8_t*>(map);
  group_map_bytes_ = layout.block_bytes;
  tag_ = tag;
  depot_.header = header;
  depot_.chunk_free = reinterpret_cast<uint32_t*>(group_map_ + layout.chunk_free_offset);
  depot_.chunk_state = reinterpret_cast<uint32_t*>(group_map_ + layout.chunk_state_offset);
  depot_.tags = reinterpret_cast<uint32_t*>(group_map_ + layout.tags_offset);
  depot_.pages = pages;
  depot_.chunks = chunks;
  for (uint32_t tier = 0; tier < kernels::kLeaseTiers; ++tier) {
    TierRange& t = tiers_[tier];
    munmap(t.base, t.bytes);
    t.base = group_base_;
    t.bytes = range;
    t.slots.clear();
    t.ids.assign(pages, 0);
    t.ring = kernels::PageRing{t.ids.data(), pages, 0, 0};
    // Members start at different chunks, so they do not all claim the same pages first.
    cursor_[tier] = tag;
    PublishTier(tier);
  }
  return Status::Ok();
}

kernels::GroupCacheTier LeaseTable::CacheTier(uint32_t tier) {
  const std::vector<kernels::GroupChunkRef>& refs = group_refs_[tier];
  // One range over the whole address space: ring ids are group pages.
  return kernels::GroupCacheTier{grouped() ? &depot_ : nullptr,
                                 refs.data(),
                                 refs.size(),
                                 &cursor_[tier],
                                 &tiers_[tier].ring,
                                 0};
}

bool LeaseTable::RefillForStash(uint64_t pages, bool allow_host) {
  if (!grouped()) return false;
  kernels::GroupCacheTier tiers[kernels::kLeaseTiers];
  for (uint32_t t = 0; t < kernels::kLeaseTiers; ++t) tiers[t] = CacheTier(t);
  const kernels::GroupRefill r =
      kernels::RefillForStash(tiers, tag_, pages, allow_host, chunk_bytes_ / page_bytes_);
  for (uint32_t t = 0; t < kernels::kLeaseTiers; ++t) {
    if (r.claimed[t] == 0 && r.flushed[t] == 0) continue;
    uint64_t& leased = tiers_[t].pages_leased;
    leased += r.claimed[t];
    leased -= std::min(leased, r.flushed[t]);
    PublishTier(t);
  }
  return r.device_missed > 0;
}

void LeaseTable::Flush(uint32_t tier) {
  if (!grouped()) return;
  const uint64_t n = kernels::FlushRing(CacheTier(tier), tag_, chunk_bytes_ / page_bytes_);
  if (n == 0) return;
  TierRange& t = tiers_[tier];
  t.pages_leased -= std::min(t.pages_leased, n);
  PublishTier(tier);
}

std::vector<uint64_t> LeaseTable::DropLeaving() {
  std::vector<uint64_t> gone;
  if (!grouped()) return gone;
  for (uint32_t tier = 0; tier < kernels::kLeaseTiers; ++tier) {
    std::vector<kernels::GroupChunkRef>& refs = group_refs_[tier];
    std::vector<uint64_t>& ids = group_ref_ids_[tier];
    for (size_t i = refs.size(); i-- > 0;) {
      const kernels::GroupChunkRef ref = refs[i];
      if (kernels::TagLoad(depot_.chunk_state[ref.chunk]) != kernels::kGroupChunkLeaving) continue;
      // Back to the reservation: the range stays ours, the chunk's memory is gone from here.
      void* p = mmap(group_base_ + ref.first_page * page_bytes_, ref.pages * page_bytes_, PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
      if (p != MAP_FAILED) madvise(p, ref.pages * page_bytes_, MADV_DONTFORK);
      gone.push_back(ids[i]);
      group_chunk_ids_.erase(std::find(group_chunk_ids_.begin(), group_chunk_ids_.end(), ids[i]));
      refs.erase(refs.begin() + static_cast<std::ptrdiff_t>(i));
      ids.erase(ids.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }
  return gone;
}

Status LeaseTable::AddChunk(uint32_t tier, uint64_t chunk_id, UniqueFd fd, uint64_t bytes,
                            std::optional<uint64_t> group_page) {
  if (tier >= kernels::kLeaseTiers)
    return InvalidArgumentError("no lease tier " + std::to_string(tier));
  if (bytes == 0 || bytes > chunk_bytes_ || bytes % page_bytes_ != 0) {
    return InvalidArgumentError("chunk " + std::to_string(chunk_id) + " of " +
                                std::to_string(bytes) + " bytes is not a whole number of " +
                                std::to_string(page_bytes_) + "-byte pages up to " +
                                std::to_string(chunk_bytes_));
  }
  struct stat st {};
  if (fstat(fd.get(), &st) != 0) return ErrnoStatus("fstat of a leased chunk");
  if (static_cast<uint64_t>(st.st_size) < bytes) {
    return InvalidArgumentError("chunk " + std::to_string(chunk_id) + " is " +
                                std::to_string(st.st_size) + " bytes, less than the " +
                                std::to_string(bytes) + " it says");
  }
  if (group_page.has_value() != grouped()) {
    return InvalidArgumentError(std::string("chunk ") + std::to_string(chunk_id) +
                                (grouped() ? " is not a chunk of this session's group"
                                           : " is a group's chunk, but no group depot came"));
  }
  if (grouped()) return AddGroupChunk(tier, chunk_id, std::move(fd), bytes, *group_page);
  TierRange& t = tiers_[tier];
  auto free_slot =
      std::find_if(t.slots.begin(), t.slots.end(), [](const Slot& s) { return s.pages == 0; });
  if (free_slot == t.slots.end()) {
    return ResourceExhaustedError("the lease range of tier " + std::to_string(tier) + " is full (" +
                                  std::to_string(t.slots.size()) + " chunks)");
  }
  const uint64_t slot = static_cast<uint64_t>(free_slot - t.slots.begin());
  uint8_t* at = t.base + slot * chunk_bytes_;
  // Populated: the daemon warmed the chunk's pages (and the lease thread allocated any it had
  // not yet), so this only fills page tables, and the first stash into it takes no page fault.
  void* p =
      mmap(at, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED | MAP_POPULATE, fd.get(), 0);
  if (p == MAP_FAILED) return ErrnoStatus("mapping leased chunk " + std::to_string(chunk_id));
  madvise(at, bytes, MADV_DONTFORK);
  // Each page written once through this mapping (a virtual machine may trap its first write).
  WriteEachPage(at, bytes);
  const uint64_t pages = bytes / page_bytes_;
  const uint64_t first = slot * (chunk_bytes_ / page_bytes_);
  for (uint64_t i = 0; i < pages; ++i) kernels::RingReturnAt(t.ring, t.ring.tail, i, first + i);
  t.ring.tail += pages;
  *free_slot = Slot{chunk_id, pages};
  t.pages_leased += pages;
  PublishTier(tier);
  return Status::Ok();
}

void LeaseTable::UnmapSlot(TierRange& t, uint64_t slot) {
  // Back to a PROT_NONE reservation: the memfd's mapping is gone, the range stays ours.
  void* p = mmap(t.base + slot * chunk_bytes_, chunk_bytes_, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  if (p != MAP_FAILED) madvise(p, chunk_bytes_, MADV_DONTFORK);
  t.slots[slot] = Slot{};
}

Status LeaseTable::AddGroupChunk(uint32_t tier, uint64_t chunk_id, UniqueFd fd, uint64_t bytes,
                                 uint64_t group_page) {
  const uint64_t chunk_pages = chunk_bytes_ / page_bytes_;
  const uint64_t pages = bytes / page_bytes_;
  if (group_page % chunk_pages != 0 || group_page / chunk_pages >= depot_.chunks) {
    return InvalidArgumentError("chunk " + std::to_string(chunk_id) +
                                " is said to start at group page " + std::to_string(group_page) +
                                ", outside the group's " + std::to_string(depot_.chunks) +
                                " chunks");
  }
  if (std::find(group_chunk_ids_.begin(), group_chunk_ids_.end(), chunk_id) !=
      group_chunk_ids_.end()) {
    return Status::Ok();  // mapped already
  }
  uint8_t* at = group_base_ + group_page * page_bytes_;
  void* p =
      mmap(at, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED | MAP_POPULATE, fd.get(), 0);
  if (p == MAP_FAILED) return ErrnoStatus("mapping group chunk " + std::to_string(chunk_id));
  madvise(at, bytes, MADV_DONTFORK);
  // Each page written once through this mapping, as for a private chunk: an atomic no-op, so
  // other members' stashes in it stay as they are.
  WriteEachPage(at, bytes);
  group_refs_[tier].push_back(kernels::GroupChunkRef{group_page / chunk_pages, group_page, pages});
  group_ref_ids_[tier].push_back(chunk_id);
  group_chunk_ids_.push_back(chunk_id);
  return Status::Ok();
}

std::vector<uint64_t> LeaseTable::ShrinkTo(uint32_t tier, uint64_t target_pages) {
  std::vector<uint64_t> gone;
  if (grouped()) return gone;  // a group's chunks leave through its depot, not a member's ring
  TierRange& t = tiers_[tier];
  if (t.pages_leased <= target_pages) return gone;
  const uint64_t per_chunk = chunk_bytes_ / page_bytes_;
  std::vector<uint64_t> free_pages(t.slots.size(), 0);
  for (uint64_t s = t.ring.head; s < t.ring.tail; ++s) {
    ++free_pages[kernels::RingPageAt(t.ring, 0, s) / per_chunk];
  }
  std::vector<bool> leaving(t.slots.size(), false);
  for (uint64_t slot = t.slots.size(); slot-- > 0 && t.pages_leased > target_pages;) {
    const Slot& s = t.slots[slot];
    if (s.pages == 0 || free_pages[slot] != s.pages) continue;
    leaving[slot] = true;
    t.pages_leased -= s.pages;
    gone.push_back(s.chunk_id);
  }
  if (gone.empty()) return gone;
  // Compact the ring: the free ids of the chunks that stay, in ring order, from head on.
  uint64_t out = t.ring.head;
  for (uint64_t s = t.ring.head; s < t.ring.tail; ++s) {
    const uint64_t id = kernels::RingPageAt(t.ring, 0, s);
    if (leaving[id / per_chunk]) continue;
    kernels::RingReturnAt(t.ring, 0, out++, id);
  }
  t.ring.tail = out;
  for (uint64_t slot = 0; slot < t.slots.size(); ++slot) {
    if (leaving[slot]) UnmapSlot(t, slot);
  }
  PublishTier(tier);
  return gone;
}

std::vector<uint64_t> LeaseTable::ChunkIds() const {
  std::vector<uint64_t> ids = group_chunk_ids_;
  for (const TierRange& t : tiers_) {
    for (const Slot& s : t.slots) {
      if (s.pages != 0) ids.push_back(s.chunk_id);
    }
  }
  return ids;
}

uint64_t LeaseTable::chunks(uint32_t tier) const {
  if (grouped()) return group_refs_[tier].size();
  uint64_t n = 0;
  for (const Slot& s : tiers_[tier].slots) n += s.pages != 0 ? 1 : 0;
  return n;
}

}  // namespace stash::client
