// The control block of a mapped session (docs/design.md, "Mapped mode").
//
// One small memfd per mapped session, created by the daemon at the session's first lease and
// mapped by both sides. The rank's copier writes it as it pages (one writer: the session's
// in-order copier); the daemon reads it for `stashctl sessions`, the metrics and auto sizing.
// To the daemon every field is untrusted input: it clamps each number to what it knows (the
// pages it leased) and never indexes anything with one, so garbage here changes only the
// numbers shown for this session.
//
// Plain 64-bit fields, so the GPU copier's bookkeeping kernel updates them from device code
// (lease_bookkeeping.h: one function per event, run by the host copier and by the kernel alike);
// every access goes through ControlLoad / ControlStore / ControlAdd: relaxed atomics on the host,
// volatile accesses (one writer: the session's stream) and atomicAdd on the device.
#ifndef STASH_KERNELS_LEASE_CONTROL_H_
#define STASH_KERNELS_LEASE_CONTROL_H_

#include <cstdint>

#include "stash/kernels/host_device.h"

namespace stash::kernels {

// "stashctl" in ASCII, then the layout version: a block that does not start with both is
// shown as empty.
inline constexpr uint64_t kControlMagic = 0x6c74636873617473ull;
inline constexpr uint64_t kControlVersion = 2;

// The tiers a mapped session leases, in the order a stash tries them.
enum LeaseTier : uint32_t { kLeaseDevice = 0, kLeasePeer = 1, kLeaseHost = 2 };
inline constexpr uint32_t kLeaseTiers = 3;

// One leased tier as the rank's copier sees it.
struct alignas(64) TierControl {
  uint64_t ring_head;  // the rank's ring of this tier (PageRing head/tail)
  uint64_t ring_tail;
  uint64_t pages_leased;          // pages of the chunks the rank has mapped in this tier
  uint64_t pages_used;            // pages its live stashes hold now
  uint64_t high_water;            // the most pages used at once in the current step
  uint64_t last_step_high_water;  // the same, of the step before
  uint64_t stashes_live;
  uint64_t bytes_live;
};
static_assert(sizeof(TierControl) == 64, "TierControl is shared across processes");

struct alignas(64) SessionControl {
  uint64_t magic;    // kControlMagic, written by the daemon
  uint64_t version;  // kControlVersion, written by the daemon
  uint64_t step;     // the step number of the rank's last BeginStep
  uint64_t steps;    // BeginSteps so far
  // Totals since the session began.
  uint64_t stashes;
  uint64_t reloads;
  uint64_t releases;
  uint64_t bytes_stashed;
  uint64_t bytes_reloaded;
  uint64_t spills;     // stashes placed outside the own device's chunks (peer or host)
  uint64_t overflows;  // stashes no leased chunk had room for (the rank kept them)
  uint64_t rejected;   // operations answered with an error
  // The pages the session's stashes would hold if every one had found room: pages in use plus
  // the pages of live overflowed stashes. Auto sizing grows the lease to the step's high water.
  uint64_t demand_pages;
  uint64_t demand_high_water;            // the current step's
  uint64_t last_step_demand_high_water;  // the step before's
  uint64_t step_flags;                   // kStepOverflow | kStepSpilled, of the current step
  // The pages of the largest stash of the current step and of the step before (placed or
  // overflowed): a stash goes whole into one tier, so a spill tier must hold at least this much.
  uint64_t largest_stash_pages;
  uint64_t last_step_largest_stash_pages;
  // Stashes tried (placed or overflowed) in the current step and in the step before. A step
  // that tried none (a rerun with the stash off) is no sample of demand: auto sizing skips it.
  uint64_t step_stashes;
  uint64_t last_step_stashes;
  // kControlMagic once the rank mapped this block: until then the daemon sends it again with
  // each lease answer.
  uint64_t attached;
  // The last return_request (below) the rank acted on.
  uint64_t return_done;
  // A GPU rank's publish count: its step kernel copies the device copy of this block in whole,
  // once per step, with publish_seq odd while it writes (PublishControl in mapped_paging.h), so
  // a reader can take a snapshot that is not torn (ReadPublishedControl). 0 for a host rank,
  // whose copier updates the fields in place as it goes.
  uint64_t publish_seq;
  uint64_t rank_reserved;

  // Written by the daemon, read by the rank at each BeginStep. Its own cache line: the rank's
  // counters above change at every stash.
  alignas(64) uint64_t daemon_flags;  // kDaemonDraining
  // Raised by the daemon when it asks the rank to give back chunks none of its stashes use,
  // down to return_target_pages per tier, at its next step (another session found the pool
  // leased out).
  uint64_t return_request;
  uint64_t return_target_pages[kLeaseTiers];
  uint64_t daemon_reserved[3];

  TierControl tiers[kLeaseTiers];
};
static_assert(sizeof(SessionControl) == 256 + 64 * kLeaseTiers,
              "SessionControl is shared across processes");

inline constexpr uint64_t kStepOverflow = 1;
inline constexpr uint64_t kStepSpilled = 2;

// daemon_flags: the daemon drains (stashctl drain): stash no more, reload what is stashed,
// then end the session; cleared again by stashctl undrain.
inline constexpr uint64_t kDaemonDraining = 1;

// The size of the memfd that holds a SessionControl, then the live-stash table
// (lease_live_table.h).
inline constexpr uint64_t kControlBlockBytes = 64 << 10;
static_assert(sizeof(SessionControl) <= kControlBlockBytes, "the control block fits its page");

STASH_HOST_DEVICE uint64_t ControlLoad(const uint64_t& field) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const volatile uint64_t*>(&field);
#else
  return __atomic_load_n(&field, __ATOMIC_RELAXED);
#endif
}
STASH_HOST_DEVICE void ControlStore(uint64_t& field, uint64_t value) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<volatile uint64_t*>(&field) = value;
#else
  __atomic_store_n(&field, value, __ATOMIC_RELAXED);
#endif
}
STASH_HOST_DEVICE void ControlAdd(uint64_t& field, uint64_t delta) {
#if defined(__CUDA_ARCH__)
  atomicAdd(reinterpret_cast<unsigned long long*>(&field),  // NOLINT(google-runtime-int)
            static_cast<unsigned long long>(delta));        // NOLINT(google-runtime-int)
#else
  __atomic_fetch_add(&field, delta, __ATOMIC_RELAXED);
#endif
}

}  // namespace stash::kernels

#endif  // STASH_KERNELS_LEASE_CONTROL_H_
