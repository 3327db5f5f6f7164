// The daemon's side of one group's depot (stash/kernels/group_depot.h; docs/design.md,
// "Groups"): the layout the daemon chose (kept here, never read back from the depot), the
// daemon's joins and take-backs of chunks, and reclaiming the pages of members that are gone.
// What members write in a depot is untrusted: tags are only compared, counters are clamped.
//
// One interface, a twin per backend:
//   HostGroupBlock (daemon/leases/host_group_block.h)  one memfd every member maps; the daemon
//                                                      reads and swaps tags with host atomics.
//   CudaGroupBlock (daemon/cuda/cuda_group_block.h)    one depot per GPU, in that GPU's memory
//                                                      (the members' plan kernels claim there):
//                                                      a pool's tags live in its GPU's depot, a
//                                                      host chunk's in the depot of the GPU whose
//                                                      members it joined for; the daemon changes
//                                                      tags with kernels and copies.
//
// Thread-compatible: Leases calls it under its lock.
#ifndef STASH_DAEMON_GROUP_BLOCK_H_
#define STASH_DAEMON_GROUP_BLOCK_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/unique_fd.h"
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
  // Makes the depot of a new group (Leases' config: the host memfd when unset).
  using Factory = std::function<StatusOr<std::unique_ptr<GroupBlock>>(
      uint64_t page_bytes, uint64_t chunk_pages, const std::vector<TierShape>& tiers)>;

  GroupBlock(const GroupBlock&) = delete;
  GroupBlock& operator=(const GroupBlock&) = delete;
  virtual ~GroupBlock() = default;

  // The depot's size and address space (the same layout in every depot of a group).
  uint64_t bytes() const { return layout_.block_bytes; }
  uint64_t pages() const { return pages_; }
  uint64_t chunks() const { return chunks_; }
  const kernels::GroupLayout& layout() const { return layout_; }
  // Group page of page 0 of `chunk` of daemon tier `tier`.
  uint64_t FirstPage(size_t tier, uint64_t chunk) const {
    return (first_chunk_[tier] + chunk) * chunk_pages_;
  }

  // A new descriptor of the depot a member whose device is pool `pool` maps, for its lease
  // answer; `gpu_uuid` the 16 raw bytes of the GPU it lives on (empty: host memory).
  virtual StatusOr<UniqueFd> Export(int pool) = 0;
  virtual std::string gpu_uuid(int /*pool*/) const { return {}; }
  // Which depot the members of pool `pool` claim in (0 .. depots() - 1): one for all on the host
  // backend, their GPU's on the cuda backend.
  virtual size_t DepotOf(int /*pool*/) const { return 0; }
  // Chunk `chunk` of `tier` (`pages` pages) joins the group: free for members to claim. `pool`:
  // the device of the members it joins for (whose depot holds a host chunk's tags on GPUs).
  virtual void Join(size_t tier, uint64_t chunk, uint64_t pages, int pool) = 0;
  // Takes it back when every page is free (all or none): it is then leaving.
  virtual bool Take(size_t tier, uint64_t chunk, uint64_t pages) = 0;
  // No longer the group's (every member unmapped it or is gone): its tags are the daemon's.
  virtual void Out(size_t tier, uint64_t chunk) = 0;
  // Frees every page a member tag owns that is not in `live` (a member that is gone, or garbage
  // a member wrote); returns how many.
  virtual uint64_t Reclaim(const std::vector<uint32_t>& live) = 0;
  // Calls `owned(tag)` for every page of chunk `chunk` of `tier` a member owns now.
  virtual void ForEachOwned(size_t tier, uint64_t chunk,
                            const std::function<void(uint32_t)>& owned) const = 0;

  // The members' counters, each at most `max` (they are untrusted): of the depot of pool
  // `pool`'s members, or of all depots summed (pool -1).
  struct Counters {
    uint64_t claimed = 0, high_water = 0, dry = 0, dry_pages = 0;
  };
  virtual Counters Read(uint64_t max, int pool) const = 0;
  // Starts a new high-water window at what is claimed now.
  virtual void ResetHighWater() = 0;

 protected:
  // The layout of `tiers` in `chunk_pages`-page chunks: FAILED_PRECONDITION past
  // kernels::kMaxGroupTiers tiers.
  static Status CheckTiers(const std::vector<TierShape>& tiers);
  GroupBlock(uint64_t chunk_pages, const std::vector<TierShape>& tiers);
  // The header the daemon writes once, before any member maps the depot.
  kernels::GroupHeader HeaderFor(uint64_t page_bytes, const std::vector<TierShape>& tiers) const;
  // The depot chunk of `chunk` of `tier`.
  uint64_t DepotChunk(size_t tier, uint64_t chunk) const { return first_chunk_[tier] + chunk; }

  const uint64_t chunk_pages_;
  std::vector<uint64_t> first_chunk_;  // per daemon tier
  uint64_t chunks_ = 0;
  uint64_t pages_ = 0;
  kernels::GroupLayout layout_{};
};

}  // namespace stash::daemon

#endif  // STASH_DAEMON_GROUP_BLOCK_H_
