// A mapped session's control block (stash/kernels/lease_control.h): created by the daemon at the
// session's first lease, written by the rank's copier, read by the daemon for stats and auto
// sizing. Everything read from it is untrusted: each number is clamped to what the daemon knows
// (the pages it leased, the quota), and nothing is ever indexed with one.
#ifndef STASH_DAEMON_CONTROL_BLOCK_H_
#define STASH_DAEMON_CONTROL_BLOCK_H_

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/mutex.h"
#include "common/shm.h"
#include "common/unique_fd.h"
#include "stash/kernels/lease_control.h"
#include "stash/kernels/lease_live_table.h"
#include "stash/status.h"
#include "stash/v1/stash.pb.h"

namespace stash::daemon {

// One tier of a control block, clamped.
struct ControlTierView {
  uint64_t pages_used = 0;            // <= the pages the daemon leased in the tier
  uint64_t high_water = 0;            // <= the same
  uint64_t last_step_high_water = 0;  // <= the same
  uint64_t stashes_live = 0;          // <= pages_used (a stash holds at least one page)
  uint64_t bytes_live = 0;            // <= pages_used * page bytes
};

// What the daemon takes from a control block. `valid` is false when the magic or version is
// wrong: every number is then 0.
struct ControlView {
  bool valid = false;
  uint64_t step = 0;
  uint64_t steps = 0;
  uint64_t stashes = 0;
  uint64_t reloads = 0;
  uint64_t releases = 0;
  uint64_t bytes_stashed = 0;
  uint64_t bytes_reloaded = 0;
  uint64_t spills = 0;
  uint64_t overflows = 0;
  uint64_t rejected = 0;
  uint64_t last_step_demand_high_water = 0;    // <= the quota in pages
  uint64_t last_step_largest_stash_pages = 0;  // <= the quota in pages
  bool step_overflow = false;
  bool step_spilled = false;
  uint64_t last_step_stashes = 0;  // 0: the step before tried no stash (no demand sample)
  // The current step so far (a lease asked mid-step, when the rank outgrows its lease).
  uint64_t step_stashes = 0;
  uint64_t demand_high_water = 0;    // <= the quota in pages
  uint64_t largest_stash_pages = 0;  // <= the quota in pages
  std::array<ControlTierView, kernels::kLeaseTiers> tiers{};
};

// A mapped session's live stashes by tag, from its block's live-stash table
// (stash/kernels/lease_live_table.h): rows by (layer, microbatch, name), sorted by them, as
// daemon-copy sessions' LiveTags::Rows. Their stashes, bytes and pages together never exceed
// what the ControlView they were read against says the session holds; the live stashes in no
// row are `untagged` (a rank that keeps no table, a full table, an entry being rewritten).
struct LiveView {
  std::vector<stash::v1::LiveStashes> rows;
  uint64_t untagged = 0;
};

// Thread-safe: Read may run on any thread while the rank writes.
class ControlBlock {
 public:
  // A sealed memfd of kControlBlockBytes with magic and version written, mapped by the daemon.
  static StatusOr<std::unique_ptr<ControlBlock>> Create();
  ControlBlock(const ControlBlock&) = delete;
  ControlBlock& operator=(const ControlBlock&) = delete;
  ~ControlBlock();

  // The memfd to hand to the rank (borrowed).
  int fd() const { return memory_->fd(); }

  // Reads the block, clamping per tier to `pages_leased[t]` and demand to `quota_pages` (the quota
  // over all tiers). The totals (stashes, reloads, releases, bytes, spills, overflows, rejected)
  // never go down from one read to the next, so the counters the metrics export from them stay
  // counters.
  ControlView Read(const std::array<uint64_t, kernels::kLeaseTiers>& pages_leased,
                   uint64_t quota_pages, uint64_t page_bytes) const;

  // The live-stash table, clamped to what `view` (a Read of this block) says is held.
  LiveView ReadLive(const ControlView& view) const;

  // The daemon's own line, read by the rank at each BeginStep.
  // Sets or clears kDaemonDraining.
  void SetDraining(bool draining);
  // The daemon's own line as it stands (kDaemonDraining).
  uint64_t daemon_flags() const;
  // Asks the rank to give back chunks no stash uses until it holds at most `target_pages` per
  // tier; returns the request's number (the rank's return_done reaches it once acted on).
  uint64_t RequestReturn(const std::array<uint64_t, kernels::kLeaseTiers>& target_pages);
  // Whether the rank said it mapped the block (until then the daemon sends it again).
  bool attached() const;

 private:
  ControlBlock(std::unique_ptr<SharedMemory> memory, kernels::SessionControl* block)
      : memory_(std::move(memory)),
        block_(block),
        live_(reinterpret_cast<const kernels::LiveTable*>(memory_->data() +
                                                          kernels::kLiveTableOffset)) {}

  // Never change after construction.
  const std::unique_ptr<SharedMemory> memory_;  // the sealed memfd and the daemon's mapping
  kernels::SessionControl* const block_;        // in memory_; read with ControlLoad only
  const kernels::LiveTable* const live_;        // in memory_, after the block; the same

  mutable Mutex mu_;
  mutable std::array<uint64_t, 9> totals_ ABSL_GUARDED_BY(mu_){};  // the totals last shown
};

}  // namespace stash::daemon

#endif  // STASH_DAEMON_CONTROL_BLOCK_H_
