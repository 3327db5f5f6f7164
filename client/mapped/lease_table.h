// The chunks a mapped session holds and the rank's page rings over them (docs/design.md,
// "Mapped mode").
//
// Each lease tier (own device, peer devices, host: kernels::LeaseTier) is one reserved address
// range, PROT_NONE, big enough for the session's whole quota. A granted chunk (a sealed memfd)
// is mapped MAP_SHARED|MAP_FIXED at a chunk-size slot of its tier's range, and the whole range
// is MADV_DONTFORK: a forked child never holds a rank's chunks. Page id = slot *
// pages_per_chunk + page within the chunk, so a tier's pages are addressed from one base
// exactly like a daemon tier, and kernels/paging.h works unchanged. Each tier has one PageRing
// (the ids live in this process's private memory); its capacity is the range's page count, so
// chunks coming and going never resize it: a new chunk's pages are appended at tail, a chunk
// leaving (only when all its pages are free) is compacted out of [head, tail).
//
// Thread-compatible: owned by the copier thread (client/mapped/copier.h); nothing here locks.
#ifndef STASH_CLIENT_LEASE_TABLE_H_
#define STASH_CLIENT_LEASE_TABLE_H_

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "client/mapped/live_table.h"
#include "common/unique_fd.h"
#include "stash/kernels/group_cache.h"
#include "stash/kernels/lease_control.h"
#include "stash/kernels/paging.h"
#include "stash/status.h"

namespace stash::client {

class LeaseTable {
 public:
  // `page_bytes` a power of two; `chunk_bytes` a whole number of pages; tier t can hold up to
  // `tier_bytes[t]` (kernels::LeaseTier order; rounded up to whole chunks, at least one).
  // Reserves the address ranges.
  static StatusOr<std::unique_ptr<LeaseTable>> Create(
      uint64_t page_bytes, uint64_t chunk_bytes,
      const std::array<uint64_t, kernels::kLeaseTiers>& tier_bytes);
  LeaseTable(const LeaseTable&) = delete;
  LeaseTable& operator=(const LeaseTable&) = delete;
  // Unmaps every chunk and the control block, and frees the ranges.
  ~LeaseTable();

  // Maps the daemon's control block (a memfd of at least sizeof(SessionControl) bytes) and
  // carries this table's counters over into it. Until then control() is a private block.
  Status SetControlBlock(UniqueFd fd, uint64_t bytes);
  kernels::SessionControl& control() { return *control_; }
  // The block's live-stash table (tableless until the daemon's block is mapped).
  LiveTableWriter& live() { return live_; }

  // Maps chunk `chunk_id` (`fd`, `bytes`: a whole number of pages, at most chunk_bytes) into a
  // free slot of `tier` and appends its pages to the tier's ring. INVALID_ARGUMENT for a chunk
  // of a bad size or a memfd smaller than it says; RESOURCE_EXHAUSTED when the tier's range is
  // full. The fd is closed once mapped.
  // A group's chunk (`group_page` set; after SetGroupBlock) is mapped at its group page of the
  // group's one range instead, and its pages stay in the depot until a refill claims them.
  Status AddChunk(uint32_t tier, uint64_t chunk_id, UniqueFd fd, uint64_t bytes,
                  std::optional<uint64_t> group_page = std::nullopt);

  // Groups (docs/design.md, "Groups"): maps the group's depot (`fd`, `bytes`; `pages` and
  // `chunks` its address space) and claims with `tag` from now on. Every tier's ring then names
  // group pages of one range, which replaces the tiers' own (they must hold no chunk yet).
  Status SetGroupBlock(UniqueFd fd, uint64_t bytes, uint32_t tag, uint64_t pages, uint64_t chunks);
  bool grouped() const { return group_map_ != nullptr; }
  // A stash of `pages` pages is about to be planned: tops up the tiers it would try from the
  // depot (kernels::RefillForStash; the host tier only when `allow_host`). True when the own
  // device's depot ran dry.
  bool RefillForStash(uint64_t pages, bool allow_host);
  // Releases every free page of `tier`'s ring back to the group (the cache mark is 0).
  void Flush(uint32_t tier);
  // Unmaps the group chunks the daemon took back (kGroupChunkLeaving: none of their pages is
  // anyone's) and returns their ids, for ReturnChunks.
  std::vector<uint64_t> DropLeaving();

  // Takes chunks of `tier` none of whose pages a stash holds out of the ring and unmaps them,
  // highest slot first, until the tier holds at most `target_pages`. Returns their ids.
  std::vector<uint64_t> ShrinkTo(uint32_t tier, uint64_t target_pages);

  // Every chunk id held (the caller unmaps them by destroying the table).
  std::vector<uint64_t> ChunkIds() const;

  kernels::PageRing* ring(uint32_t tier) { return &tiers_[tier].ring; }
  uint8_t* base(uint32_t tier) const { return tiers_[tier].base; }
  uint64_t pages_leased(uint32_t tier) const { return tiers_[tier].pages_leased; }
  uint64_t chunks(uint32_t tier) const;
  uint64_t page_bytes() const { return page_bytes_; }

 private:
  struct Slot {
    uint64_t chunk_id = 0;
    uint64_t pages = 0;  // 0 = free slot
  };
  struct TierRange {
    uint8_t* base = nullptr;
    uint64_t bytes = 0;
    std::vector<Slot> slots;
    std::vector<uint64_t> ids;  // the ring's storage: slots.size() * pages_per_chunk entries
    kernels::PageRing ring{};
    uint64_t pages_leased = 0;
  };
  LeaseTable(uint64_t page_bytes, uint64_t chunk_bytes)
      : page_bytes_(page_bytes), chunk_bytes_(chunk_bytes) {}
  Status AddGroupChunk(uint32_t tier, uint64_t chunk_id, UniqueFd fd, uint64_t bytes,
                       uint64_t group_page);
  // Unmaps slot `slot` of `t` (its range goes back to PROT_NONE).
  void UnmapSlot(TierRange& t, uint64_t slot);
  void PublishTier(uint32_t tier);
  // `tier` as the group cache rule sees it (kernels::GroupCacheTier).
  kernels::GroupCacheTier CacheTier(uint32_t tier);

  const uint64_t page_bytes_;
  const uint64_t chunk_bytes_;
  TierRange tiers_[kernels::kLeaseTiers];
  // The group's depot and its one range (grouped() only), the chunks mapped there per tier, a
  // claim cursor per tier, and the group chunk ids mapped (for ChunkIds).
  uint8_t* group_map_ = nullptr;
  uint64_t group_map_bytes_ = 0;
  uint8_t* group_base_ = nullptr;
  uint64_t group_range_bytes_ = 0;
  uint32_t tag_ = 0;
  kernels::GroupView depot_{};
  std::vector<kernels::GroupChunkRef> group_refs_[kernels::kLeaseTiers];
  std::vector<uint64_t> group_ref_ids_[kernels::kLeaseTiers];  // the chunk id of each ref
  uint64_t cursor_[kernels::kLeaseTiers] = {};
  std::vector<uint64_t> group_chunk_ids_;
  kernels::SessionControl own_control_{};  // before the daemon's block arrives
  kernels::SessionControl* control_ = &own_control_;
  uint8_t* control_map_ = nullptr;
  uint64_t control_map_bytes_ = 0;
  LiveTableWriter live_;
};

}  // namespace stash::client

#endif  // STASH_CLIENT_LEASE_TABLE_H_
