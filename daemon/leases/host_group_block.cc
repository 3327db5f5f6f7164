#include "daemon/leases/host_group_block.h"

#include <fcntl.h>

#include <algorithm>
#include <cstring>

#include "common/macros.h"
#include "common/sys.h"

namespace stash::daemon {

namespace k = stash::kernels;

StatusOr<std::unique_ptr<GroupBlock>> HostGroupBlock::Create(uint64_t page_bytes,
                                                             uint64_t chunk_pages,
                                                             const std::vector<TierShape>& tiers) {
  STASH_RETURN_IF_ERROR(CheckTiers(tiers));
  std::unique_ptr<HostGroupBlock> b(new HostGroupBlock(chunk_pages, tiers));
  STASH_ASSIGN_OR_RETURN(b->memory_,
                         SharedMemory::CreateSealed("stashd-group", b->layout_.block_bytes));
  uint8_t* base = b->memory_->data();
  const k::GroupHeader header = b->HeaderFor(page_bytes, tiers);
  std::memcpy(base, &header, sizeof(header));
  b->view_.header = reinterpret_cast<k::GroupHeader*>(base);
  b->view_.chunk_free = reinterpret_cast<uint32_t*>(base + b->layout_.chunk_free_offset);
  b->view_.chunk_state = reinterpret_cast<uint32_t*>(base + b->layout_.chunk_state_offset);
  b->view_.tags = reinterpret_cast<uint32_t*>(base + b->layout_.tags_offset);
  b->view_.chunks = b->chunks_;
  b->view_.pages = b->pages_;
  return std::unique_ptr<GroupBlock>(std::move(b));
}

HostGroupBlock::HostGroupBlock(uint64_t chunk_pages, const std::vector<TierShape>& tiers)
    : GroupBlock(chunk_pages, tiers) {}

StatusOr<UniqueFd> HostGroupBlock::Export(int /*pool*/) {
  UniqueFd fd(fcntl(memory_->fd(), F_DUPFD_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoStatus("dup of the group depot");
  return fd;
}

void HostGroupBlock::Join(size_t tier, uint64_t chunk, uint64_t pages, int /*pool*/) {
  k::JoinChunk(view_, chunk_pages_, DepotChunk(tier, chunk), pages);
  __atomic_add_fetch(&view_.header->generation, 1, __ATOMIC_RELEASE);
}

bool HostGroupBlock::Take(size_t tier, uint64_t chunk, uint64_t pages) {
  const bool taken = k::TakeChunk(view_, chunk_pages_, DepotChunk(tier, chunk), pages);
  if (taken) __atomic_add_fetch(&view_.header->generation, 1, __ATOMIC_RELEASE);
  return taken;
}

void HostGroupBlock::Out(size_t tier, uint64_t chunk) {
  const uint64_t c = DepotChunk(tier, chunk);
  __atomic_store_n(&view_.chunk_state[c], k::kGroupChunkOut, __ATOMIC_RELEASE);
  __atomic_store_n(&view_.chunk_free[c], 0u, __ATOMIC_RELEASE);
  for (uint64_t p = c * chunk_pages_; p < (c + 1) * chunk_pages_ && p < view_.pages; ++p) {
    __atomic_store_n(&view_.tags[p], k::kTagDaemon, __ATOMIC_RELEASE);
  }
}

uint64_t HostGroupBlock::Reclaim(const std::vector<uint32_t>& live) {
  return k::ReclaimTags(view_, chunk_pages_, [&live](uint32_t tag) {
    return std::find(live.begin(), live.end(), tag) == live.end();
  });
}

void HostGroupBlock::ForEachOwned(size_t tier, uint64_t chunk,
                                  const std::function<void(uint32_t)>& owned) const {
  const uint64_t c = DepotChunk(tier, chunk);
  for (uint64_t p = c * chunk_pages_; p < (c + 1) * chunk_pages_ && p < view_.pages; ++p) {
    const uint32_t tag = k::TagLoad(view_.tags[p]);
    if (tag >= k::kFirstMemberTag) owned(tag);
  }
}

GroupBlock::Counters HostGroupBlock::Read(uint64_t max, int /*pool*/) const {
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

void HostGroupBlock::ResetHighWater() {
  k::GroupHeader& h = *view_.header;
  __atomic_store_n(&h.claimed_high_water, __atomic_load_n(&h.claimed, __ATOMIC_RELAXED),
                   __ATOMIC_RELAXED);
}

}  // namespace stash::daemon
