// The daemon's side of one group's depot (stash/kernels/group_depot.h; docs/design.md,
// "Groups"): the memfd every member maps, the layout the daemon wrote in it (kept here, never
// read back from the block), the daemon's joins and take-backs of chunks, and reclaiming the
// pages of members that are gone. What members write here is untrusted: tags are only compared,
// counters are clamped.
//
// Thread-compatible: Leases calls it under its lock.
#ifndef STASH_DAEMON_GROUP_BLOCK_H_
#define STASH_DAEMON_GROUP_BLOCK_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "common/shm.h"
#include "stash/kernels/group_depot.h"
#include "stash/status.h"

namespace stash::daemon {

class GroupBlock {
 public:
  // One daemon tier (pools, then host tiers): its pool index (-1 for a host tier), pages and
  // chunks.
  struct TierShape {
    int64_t pool = -1;
    uint64_t pages = 0;
    uint64_t chunks = 0;
  };
  static StatusOr<std::unique_ptr<GroupBlock>> Create(uint64_t page_bytes, uint64_t chunk_pages,
                                                      const std::vector<TierShape>& tiers);
  GroupBlock(const GroupBlock&) = delete;
  GroupBlock& operator=(const GroupBlock&) = delete;

  int fd() const { return memory_->fd(); }
  uint64_t bytes() const { return layout_.block_bytes; }
  uint64_t pages() const { return view_.pages; }
  uint64_t chunks() const { return view_.chunks; }
  // Group page of page 0 of `chunk` of daemon tier `tier`.
  uint64_t FirstPage(size_t tier, uint64_t chunk) const {
    return (first_chunk_[tier] + chunk) * chunk_pages_;
  }
  // Chunk `chunk` of `tier` (`pages` pages) joins the group: free for members to claim.
  void Join(size_t tier, uint64_t chunk, uint64_t pages);
  // Takes it back when every page is free (all or none): it is then leaving.
  bool Take(size_t tier, uint64_t chunk, uint64_t pages);
  // No longer the group's (every member unmapped it or is gone): its tags are the daemon's.
  void Out(size_t tier, uint64_t chunk);
  // Frees every page whose tag `is_dead` says is no live member's; returns how many.
  uint64_t Reclaim(const std::function<bool(uint32_t)>& is_dead);
  // Calls `owned(tag)` for every page of chunk `chunk` of `tier` a member owns now.
  void ForEachOwned(size_t tier, uint64_t chunk, const std::function<void(uint32_t)>& owned) const;

  // The members' counters, each at most `max` (they are untrusted).
  struct Counters {
    uint64_t claimed = 0, high_water = 0, dry = 0, dry_pages = 0;
  };
  Counters Read(uint64_t max) const;
  // Starts a new high-water window at what is claimed now.
  void ResetHighWater();

 private:
  GroupBlock(std::unique_ptr<SharedMemory> memory, kernels::GroupLayout layout,
             uint64_t chunk_pages, uint64_t chunks, std::vector<uint64_t> first_chunk);

  const std::unique_ptr<SharedMemory> memory_;
  const kernels::GroupLayout layout_;
  const uint64_t chunk_pages_;
  const std::vector<uint64_t> first_chunk_;  // per daemon tier
  kernels::GroupView view_{};
};

}  // namespace stash::daemon

#endif  // STASH_DAEMON_GROUP_BLOCK_H_
