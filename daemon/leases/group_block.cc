#include "daemon/leases/group_block.h"

#include <algorithm>

#include "common/macros.h"

namespace stash::daemon {

namespace k = stash::kernels;

StatusOr<std::unique_ptr<GroupBlock>> GroupBlock::Create(uint64_t page_bytes, uint64_t chunk_pages,
                                                         const std::vector<TierShape>& tiers) {
  if (tiers.size() > k::kMaxGroupTiers) {
    return FailedPreconditionError("a group depot describes at most " +
                                   std::to_string(k::kMaxGroupTiers) + " tiers; this daemon has " +
                                   std::to_string(tiers.size()));
  }
  std::vector<uint64_t> first_chunk;
  uint64_t chunks = 0;
  for (const TierShape& t : tiers) {
    first_chunk.push_back(chunks);
    chunks += t.chunks;
  }
  const uint64_t pages = chunks * chunk_pages;
  const k::GroupLayout layout = k::GroupLayoutFor(pages, chunks);
  STASH_ASSIGN_OR_RETURN(auto memory,
                         SharedMemory::CreateSealed("stashd-group", layout.block_bytes));
  auto* h = reinterpret_cast<k::GroupHeader*>(memory->data());
  h->version = k::kGroupVersion;
  h->page_bytes = page_bytes;
  h->chunk_pages = chunk_pages;
  h->tiers = tiers.size();
  h->pages = pages;
  h->chunks = chunks;
  h->chunk_free_offset = layout.chunk_free_offset;
  h->chunk_state_offset = layout.chunk_state_offset;
  h->tags_offset = layout.tags_offset;
  h->block_bytes = layout.block_bytes;
  for (size_t t = 0; t < tiers.size(); ++t) {
    h->tier[t] = k::GroupTier{first_chunk[t], tiers[t].chunks, tiers[t].pages, tiers[t].pool};
  }
  __atomic_store_n(&h->magic, k::kGroupMagic, __ATOMIC_RELEASE);
  return std::unique_ptr<GroupBlock>(
      new GroupBlock(std::move(memory), layout, chunk_pages, chunks, std::move(first_chunk)));
}

GroupBlock::GroupBlock(std::unique_ptr<SharedMemory> memory, k::GroupLayout layout,
                       uint64_t chunk_pages, uint64_t chunks, std::vector<uint64_t> first_chunk)
    : memory_(std::move(memory)),
      layout_(layout),
      chunk_pages_(chunk_pages),
      first_chunk_(std::move(first_chunk)) {
  uint8_t* base = memory_->data();
  view_.header = reinterpret_cast<k::GroupHeader*>(base);
  view_.chunk_free = reinterpret_cast<uint32_t*>(base + layout_.chunk_free_offset);
  view_.chunk_state = reinterpret_cast<uint32_t*>(base + layout_.chunk_state_offset);
  view_.tags = reinterpret_cast<uint32_t*>(base + layout_.tags_offset);
  view_.chunks = chunks;
  view_.pages = chunks * chunk_pages_;
}

void GroupBlock::Join(size_t tier, uint64_t chunk, uint64_t pages) {
  k::JoinChunk(view_, chunk_pages_, first_chunk_[tier] + chunk, pages);
  __atomic_add_fetch(&view_.header->generation, 1, __ATOMIC_RELEASE);
}

bool GroupBlock::Take(size_t tier, uint64_t chunk, uint64_t pages) {
  const bool taken = k::TakeChunk(view_, chunk_pages_, first_chunk_[tier] + chunk, pages);
  if (taken) __atomic_add_fetch(&view_.header->generation, 1, __ATOMIC_RELEASE);
  return taken;
}

void GroupBlock::Out(size_t tier, uint64_t chunk) {
  const uint64_t c = first_chunk_[tier] + chunk;
  __atomic_store_n(&view_.chunk_state[c], k::kGroupChunkOut, __ATOMIC_RELEASE);
  __atomic_store_n(&view_.chunk_free[c], 0u, __ATOMIC_RELEASE);
  for (uint64_t p = c * chunk_pages_; p < (c + 1) * chunk_pages_ && p < view_.pages; ++p) {
    __atomic_store_n(&view_.tags[p], k::kTagDaemon, __ATOMIC_RELEASE);
  }
}

uint64_t GroupBlock::Reclaim(const std::function<bool(uint32_t)>& is_dead) {
  return k::ReclaimTags(view_, chunk_pages_, is_dead);
}

void GroupBlock::ForEachOwned(size_t tier, uint64_t chunk,
                              const std::function<void(uint32_t)>& owned) const {
  const uint64_t c = first_chunk_[tier] + chunk;
  for (uint64_t p = c * chunk_pages_; p < (c + 1) * chunk_pages_ && p < view_.pages; ++p) {
    const uint32_t tag = k::TagLoad(view_.tags[p]);
    if (tag >= k::kFirstMemberTag) owned(tag);
  }
}

GroupBlock::Counters GroupBlock::Read(uint64_t max) const {
  const k::GroupHeader& h = *view_.header;
  Counters c;
  auto load = [max](const uint64_t& f) {
    return std::min(__atomic_load_n(&f, __ATOMIC_RELAXED), max);
  };
  c.claimed = load(h.claimed);
  c.high_water = load(h.claimed_high_water);
  c.dry = __atomic_load_n(&h.dry, __ATOMIC_RELAXED);
  c.dry_pages = load(h.dry_pages);
  return c;
}

void GroupBlock::ResetHighWater() {
  k::GroupHeader& h = *view_.header;
  __atomic_store_n(&h.claimed_high_water, __atomic_load_n(&h.claimed, __ATOMIC_RELAXED),
                   __ATOMIC_RELAXED);
}

}  // namespace stash::daemon
