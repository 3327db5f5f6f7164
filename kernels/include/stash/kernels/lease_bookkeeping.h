// The bookkeeping of a mapped session's copier (docs/design.md, "Mapped mode"): one function per
// event of the session's stream (a stash placed or overflowed, pages returned, a reload, a
// release, a rejected operation, a step begun). The host copier (client/mapped/copier.cc) calls
// them after its copies; on a GPU the same functions run in the bookkeeping kernel on the trainer's
// stream, against a device copy of the control block. So both copiers keep the control block
// the daemon reads, and the state auto sizing runs on, in exactly one way.
//
// One writer per session (the stream), so plain read-modify-write through ControlLoad /
// ControlStore is enough; ControlAdd is atomic for the counters the daemon may read mid-update.
#ifndef STASH_KERNELS_LEASE_BOOKKEEPING_H_
#define STASH_KERNELS_LEASE_BOOKKEEPING_H_

#include <cstdint>

#include "stash/kernels/host_device.h"
#include "stash/kernels/lease_control.h"
#include "stash/kernels/paging.h"

namespace stash::kernels {

// The copier's own state beside the control block. Never shared with the daemon: host memory
// for the host copier, device memory for a GPU copier. Zero-initialised at the session's start.
struct alignas(16) CopierState {
  // Pages of the current step's overflowed stashes: they count as demand until the step ends
  // (the rank holds those activations itself meanwhile).
  uint64_t step_overflow_pages;
  // kStepOverflow | kStepSpilled of the current step, in stream order (BeginStep answers them).
  uint64_t step_flags;
  // The step's demand when the lease was last found short (0: not this step).
  uint64_t outgrown_at;
  // How many times the lease was found short so far: whoever asks the daemon for more chunks
  // acts when it moves (the host copier calls its hook; on a GPU the publish kernel writes it
  // to host memory, MappedSessionView.d_lease_short).
  uint64_t outgrown;
  // A group member's stash being planned found its own device's depot dry (the plan kernel sets
  // it, the publish kernel reads it).
  uint64_t group_dry;
  uint64_t reserved;
};
static_assert(sizeof(CopierState) == 48, "CopierState is shared with device code");

STASH_HOST_DEVICE uint64_t MaxU64(uint64_t a, uint64_t b) { return a > b ? a : b; }
STASH_HOST_DEVICE uint64_t MinU64(uint64_t a, uint64_t b) { return a < b ? a : b; }

// The daemon drains: the session stashes nothing (each stash is answered as an overflow that
// took nothing, without the step's overflow flag).
STASH_HOST_DEVICE bool Draining(const SessionControl& c) {
  return (ControlLoad(c.daemon_flags) & kDaemonDraining) != 0;
}

// Sets `flags` (kStepOverflow, kStepSpilled) for the current step, in the block and the state.
STASH_HOST_DEVICE void RaiseStepFlags(SessionControl& c, CopierState& s, uint64_t flags) {
  ControlStore(c.step_flags, ControlLoad(c.step_flags) | flags);
  s.step_flags |= flags;
}

// Adds `pages` to the step's demand (pages in use plus those of overflowed stashes) and to the
// step's largest stash; returns the demand.
STASH_HOST_DEVICE uint64_t AddDemand(SessionControl& c, uint64_t pages) {
  const uint64_t demand = ControlLoad(c.demand_pages) + pages;
  ControlStore(c.demand_pages, demand);
  ControlStore(c.demand_high_water, MaxU64(ControlLoad(c.demand_high_water), demand));
  ControlStore(c.largest_stash_pages, MaxU64(ControlLoad(c.largest_stash_pages), pages));
  return demand;
}

// The pages an overflowed stash would have taken: its rows, clamped to max_rows (a count past
// the buffer asks for no more than the buffer holds).
STASH_HOST_DEVICE uint64_t OverflowPages(const StashPlan& plan, uint64_t max_rows,
                                         uint64_t row_bytes, uint64_t page_bytes) {
  return PagesFor(MinU64(plan.rows, max_rows) * row_bytes, page_bytes);
}

// A stash no tier had room for (kOverflow): nothing was taken. Returns the step's demand.
STASH_HOST_DEVICE uint64_t RecordOverflow(SessionControl& c, CopierState& s, uint64_t pages) {
  ControlAdd(c.overflows, 1);
  ControlAdd(c.step_stashes, 1);
  s.step_overflow_pages += pages;
  RaiseStepFlags(c, s, kStepOverflow);
  return AddDemand(c, pages);
}

// A stash placed in lease tier `tier` (kLeaseDevice, kLeasePeer, kLeaseHost), whose ring head
// is now `head`: `pages` pages holding `bytes` bytes. Returns the step's demand.
STASH_HOST_DEVICE uint64_t RecordPlaced(SessionControl& c, CopierState& s, uint32_t tier,
                                        uint64_t head, uint64_t pages, uint64_t bytes) {
  TierControl& t = c.tiers[tier < kLeaseTiers ? tier : kLeaseHost];
  ControlStore(t.ring_head, head);
  const uint64_t used = ControlLoad(t.pages_used) + pages;
  ControlStore(t.pages_used, used);
  ControlStore(t.high_water, MaxU64(ControlLoad(t.high_water), used));
  ControlAdd(t.stashes_live, 1);
  ControlAdd(t.bytes_live, bytes);
  ControlAdd(c.stashes, 1);
  ControlAdd(c.step_stashes, 1);
  ControlAdd(c.bytes_stashed, bytes);
  if (tier != kLeaseDevice) {
    ControlAdd(c.spills, 1);
    RaiseStepFlags(c, s, kStepSpilled);
  }
  return AddDemand(c, pages);
}

// A placed stash's `pages` pages (`bytes` bytes) went back to tier `tier`'s ring, whose tail is
// now `tail` (its reload or release).
STASH_HOST_DEVICE void RecordReturned(SessionControl& c, uint32_t tier, uint64_t tail,
                                      uint64_t pages, uint64_t bytes) {
  TierControl& t = c.tiers[tier < kLeaseTiers ? tier : kLeaseHost];
  ControlStore(t.ring_tail, tail);
  ControlStore(t.pages_used, ControlLoad(t.pages_used) - pages);
  ControlStore(t.stashes_live, ControlLoad(t.stashes_live) - 1);
  ControlStore(t.bytes_live, ControlLoad(t.bytes_live) - bytes);
  ControlStore(c.demand_pages, ControlLoad(c.demand_pages) - pages);
}

STASH_HOST_DEVICE void RecordReloaded(SessionControl& c, uint64_t bytes) {
  ControlAdd(c.reloads, 1);
  ControlAdd(c.bytes_reloaded, bytes);
}

STASH_HOST_DEVICE void RecordReleased(SessionControl& c) { ControlAdd(c.releases, 1); }

// An operation answered with an error (a bad count, an unknown ticket, a short destination).
STASH_HOST_DEVICE void RecordRejected(SessionControl& c) { ControlAdd(c.rejected, 1); }

// Whether the lease is short after a stash: it spilled, or the own device's chunks are less
// than an eighth free (the margin auto sizing keeps).
STASH_HOST_DEVICE bool LeaseShort(bool spilled, uint64_t device_pages_free,
                                  uint64_t device_pages_leased) {
  return spilled || device_pages_free * 8 < device_pages_leased;
}

// The lease is short with the step's demand at `demand` pages: true (and `outgrown` raised)
// the first time in a step, then again only once the demand grew by another eighth, so a lease
// that cannot grow (the pool leased out, the quota reached) is not asked at every stash.
STASH_HOST_DEVICE bool ReportOutgrown(CopierState& s, uint64_t demand) {
  if (demand <= s.outgrown_at + s.outgrown_at / 8) return false;
  s.outgrown_at = demand;
  ++s.outgrown;
  return true;
}

// BeginStep(step), in stream order: the step before's high waters become last_step_*, the new
// step's start from what is in use now, the step's overflowed stashes stop counting as demand,
// and the flags clear. Returns the flags of the step that ended.
STASH_HOST_DEVICE uint64_t RecordBeginStep(SessionControl& c, CopierState& s, uint64_t step) {
  const uint64_t ended_flags = s.step_flags;
  s.step_flags = 0;
  ControlStore(c.step, step);
  ControlAdd(c.steps, 1);
  for (TierControl& t : c.tiers) {
    ControlStore(t.last_step_high_water, ControlLoad(t.high_water));
    ControlStore(t.high_water, ControlLoad(t.pages_used));
  }
  ControlStore(c.last_step_demand_high_water, ControlLoad(c.demand_high_water));
  const uint64_t demand = ControlLoad(c.demand_pages);
  ControlStore(c.demand_pages, demand - MinU64(demand, s.step_overflow_pages));
  s.step_overflow_pages = 0;
  ControlStore(c.demand_high_water, ControlLoad(c.demand_pages));
  ControlStore(c.last_step_stashes, ControlLoad(c.step_stashes));
  ControlStore(c.step_stashes, 0);
  s.outgrown_at = 0;
  ControlStore(c.last_step_largest_stash_pages, ControlLoad(c.largest_stash_pages));
  ControlStore(c.largest_stash_pages, 0);
  ControlStore(c.step_flags, 0);
  return ended_flags;
}

}  // namespace stash::kernels

#endif  // STASH_KERNELS_LEASE_BOOKKEEPING_H_
