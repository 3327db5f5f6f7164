// Mapped mode's kernels on the trainer's stream (docs/design.md, "Mapped mode on GPUs"): the
// argument blocks the client library passes to cuLaunchKernel, the kernels' names in the fatbin
// it carries, and the body of each one-thread kernel as a STASH_HOST_DEVICE function, so the
// host tests (and the driver stand-in's host twins) run exactly what the GPU runs.
//
// Everything a rank's stream pages with lives in device-accessible memory and changes only by
// work ordered on that stream: the rings of its three lease tiers (own device, peer, host), a
// device copy of its control block with the copier's own state beside it, and per stash a plan
// and a page record. A stash is three kernels (plan, copy, publish), a reload or release two
// (pop, publish), a step boundary one, a lease change one: no host callback, no host sync and
// nothing to the daemon per operation, and each sequence can be captured in a CUDA graph (grids
// depend only on a stash's static max_rows * row_bytes; counts, heads and tails are read from
// device memory when the kernels run).
//
// The device control block is published to the shared one (the memfd the daemon reads) by
// kStepKernel, through the host mapping the rank registered for the device, and the daemon's
// cache line comes back the same way; so the daemon sees a GPU rank's counters as of its last
// step boundary. A stash's entry in the shared block's live-stash table (lease_live_table.h)
// is different: its publish writes the entry's ticket, bytes and pages there at once (the host
// wrote its tags when it enqueued the stash), and the reload's or release's publish clears them.
#ifndef STASH_KERNELS_MAPPED_PAGING_H_
#define STASH_KERNELS_MAPPED_PAGING_H_

#include <cstdint>

#include "stash/kernels/host_device.h"
#include "stash/kernels/lease_bookkeeping.h"
#include "stash/kernels/lease_control.h"
#include "stash/kernels/lease_live_table.h"
#include "stash/kernels/mapped_group.h"
#include "stash/kernels/paging.h"

namespace stash::kernels {

// The kernels' names in the client library's fatbin (extern "C", so unmangled).
inline constexpr const char* kStashPlanKernel = "stash_mapped_stash_plan";
inline constexpr const char* kStashCopyKernel = "stash_mapped_stash_copy";
inline constexpr const char* kStashPublishKernel = "stash_mapped_stash_publish";
inline constexpr const char* kReloadPopKernel = "stash_mapped_reload_pop";
inline constexpr const char* kReloadPublishKernel = "stash_mapped_reload_publish";
inline constexpr const char* kStepKernel = "stash_mapped_step";
inline constexpr const char* kAddPagesKernel = "stash_mapped_add_pages";
inline constexpr const char* kRemoveChunkKernel = "stash_mapped_remove_chunk";

// StashPlan.tier of a stash the session did not try because the daemon drains: placed nowhere
// (kOverflow, so a reload copies the kept source), counted nowhere, no step flag unless the
// caller did not keep the source.
inline constexpr uint32_t kUntriedTier = 0xffffffffu;
// StashPlan.tier of a plan slot whose stash was reloaded or released (or never ran): its
// pages are back, and another reload of it copies nothing and flags the step. Plan slots start
// so (ConsumedPlan), and the reload's publish kernel leaves them so.
inline constexpr uint32_t kConsumedTier = 0xfffffffeu;
// MappedStashArgs/MappedReloadArgs.live_entry of a stash without an entry in the live-stash
// table (it counts as untagged).
inline constexpr uint32_t kNoLiveEntry = 0xffffffffu;

STASH_HOST_DEVICE StashPlan ConsumedPlan() {
  StashPlan plan{};
  plan.placement = Placement::kOverflow;
  plan.tier = kConsumedTier;
  return plan;
}

// One lease tier as the kernels see it. Non-owning; d_ring null = the session holds no chunk of
// this tier (it is skipped).
struct LeaseTierView {
  PageRing* d_ring;
  uint8_t* d_base;  // page 0 of the tier's reserved range
};

// The session's device state. Non-owning; all device-accessible.
struct alignas(16) MappedSessionView {
  SessionControl* d_control;  // the device copy of the control block
  CopierState* d_state;
  LeaseTierView tiers[kLeaseTiers];  // kLeaseDevice, kLeasePeer, kLeaseHost
  uint64_t page_bytes;               // a power of two >= 16
  uint32_t allow_host;               // 0: stashes never go to the host tier
  uint32_t reserved;
  // Host-visible: CopierState.outgrown each time the lease was found short, so the host asks
  // the daemon for more chunks without reading device memory. Null = none.
  uint64_t* d_lease_short;
  // Host-visible: the current step's flags as the stream got to them, one word
  // (ReportedStep / ReportedFlags: step << 2 | flags), rewritten by each stash's publish and by
  // the step kernel, so the host reads them without reading device memory. Null = none.
  uint64_t* d_step_flags;
  // Host-visible: the device address of the shared control block's live-stash table, rewritten
  // by the host when a new session's block arrives (so graphs captured before it write into the
  // new one); null, or *d_live null = no table.
  LiveTable* const* d_live;
  // Groups (mapped_group.h), all null for a session in no group: the kernels' cache (device
  // memory), the board the host rewrites (host-visible) and the chunk states the step kernel
  // reports there (host-visible).
  MappedGroupHeader* d_group;
  const MappedGroupHeader* d_group_board;
  MappedGroupStates* d_group_states;
};

struct alignas(16) MappedStashArgs {
  MappedSessionView session;
  const uint8_t* d_src;    // byte 0 of the marked buffer (max_rows * row_bytes bytes)
  const int64_t* d_count;  // read when the plan kernel runs; null = `count`
  int64_t count;
  uint64_t max_rows;
  uint64_t row_bytes;       // > 0
  uint32_t divisor;         // 0 = 1
  uint32_t keep_source;     // 1: d_src stays valid until the reload (an overflowed stash reloads
                            // from it); 0: an overflowed or untried stash flags the step
  StashPlan* d_plan;        // this stash's plan slot (16-byte aligned)
  uint64_t* d_page_record;  // PagesFor(max_rows * row_bytes) entries
  uint64_t ticket;          // the host's ticket, written to the live entry (nonzero)
  uint32_t live_entry;      // its entry in the live-stash table; kNoLiveEntry = none
  uint32_t reserved;
};

struct alignas(16) MappedReloadArgs {
  MappedSessionView session;
  uint8_t* d_dst;             // null = a release: the pages go back, nothing is copied
  const uint8_t* d_kept_src;  // the stash's source, for a reload of a stash that overflowed
  StashPlan* d_plan;          // the stash's plan slot: consumed (ConsumedPlan) by the publish
  const uint64_t* d_page_record;
  uint64_t max_rows;
  uint64_t row_bytes;
  uint32_t zero_tail;   // 1: zeros over [bytes, max_rows * row_bytes) of d_dst
  uint32_t live_entry;  // the stash's entry in the live-stash table; kNoLiveEntry = none
};

// What kStepKernel leaves for the host, in host-visible memory: one word, so a reader never pairs
// a step with another step's flags: step << 2 | the flags of the step that ended before it.
struct alignas(16) StepReport {
  uint64_t step_and_flags;
  uint64_t reserved;
};
STASH_HOST_DEVICE uint64_t ReportedStep(uint64_t word) { return word >> 2; }
STASH_HOST_DEVICE uint64_t ReportedFlags(uint64_t word) {
  return word & (kStepOverflow | kStepSpilled);
}

struct alignas(16) MappedStepArgs {
  MappedSessionView session;
  uint64_t step;
  // Where the device address of the shared control block is kept (host-visible memory the
  // host rewrites when a new session's block arrives, so graphs captured before it reach the
  // new block); null, or *d_shared null = no block yet.
  SessionControl* const* d_shared;
  StepReport* d_report;  // host-visible
};

// Appends page ids [first_id, first_id + pages) to a tier's ring (a chunk leased into slot
// first_id / pages_per_chunk), or takes a whole chunk's pages out of it.
struct alignas(16) MappedRingArgs {
  MappedSessionView session;
  uint32_t tier;
  uint32_t reserved;
  uint64_t first_id;
  uint64_t pages;
  uint64_t* d_result;  // kRemoveChunkKernel: 1 when the chunk was taken out, 0 when a stash
                       // still holds one of its pages (host-visible)
};

// Lease tier `tier` of the session (null ring past the last). Branches instead of an index: the
// view is a kernel parameter, and indexing it at run time would copy it to local memory.
STASH_HOST_DEVICE LeaseTierView TierAt(const MappedSessionView& s, uint32_t tier) {
  if (tier == kLeaseDevice) return s.tiers[kLeaseDevice];
  if (tier == kLeasePeer) return s.tiers[kLeasePeer];
  if (tier == kLeaseHost) return s.tiers[kLeaseHost];
  return LeaseTierView{nullptr, nullptr};
}

// The plan of a stash: PlanStashInOrder over the tiers the session holds (the host tier only
// when allowed), or untried while the daemon drains and the caller kept its source (it reloads
// from there). A caller that freed its source is placed as usual: the chunks are the session's
// until it gives them back, and untried would lose the activation.
STASH_HOST_DEVICE StashPlan PlanMappedStash(const MappedStashArgs& a) {
  const MappedSessionView& s = a.session;
  const TierChoice tiers[kLeaseTiers] = {
      {s.tiers[kLeaseDevice].d_ring, Placement::kDevice},
      {s.tiers[kLeasePeer].d_ring, Placement::kPeer},
      {s.allow_host != 0 ? s.tiers[kLeaseHost].d_ring : nullptr, Placement::kHost}};
  const int64_t count = a.d_count != nullptr ? *a.d_count : a.count;
  StashPlan plan =
      PlanStashInOrder(count, a.divisor, a.max_rows, a.row_bytes, s.page_bytes, tiers, kLeaseTiers);
  if (Draining(*s.d_control) && a.keep_source != 0 && plan.placement != Placement::kInvalidCount) {
    plan.placement = Placement::kOverflow;
    plan.tier = kUntriedTier;
    plan.bytes = 0;
    plan.pages = 0;
  }
  return plan;
}

// The tier a plan placed its stash in; d_ring null when it placed nothing.
STASH_HOST_DEVICE LeaseTierView PlacedLeaseTier(const MappedSessionView& s, const StashPlan& p) {
  const bool placed = p.placement == Placement::kDevice || p.placement == Placement::kPeer ||
                      p.placement == Placement::kHost;
  if (!placed) return LeaseTierView{nullptr, nullptr};
  return TierAt(s, p.tier);
}

// The session's group as its cache has it (the plan kernel synced it): true when it is in one.
STASH_HOST_DEVICE bool InMappedGroup(const MappedSessionView& s) {
  if (s.d_group == nullptr || s.d_group->generation == 0) return false;
  // A session that left its group (LeaveGroup) has a board with no depot.
  for (const GroupView& depot : s.d_group->depot) {
    if (depot.tags != nullptr) return true;
  }
  return false;
}

// Keeps a tier's books after the group cache moved its ring: pages claimed into it, pages
// flushed out, and the ring's ends as published.
STASH_HOST_DEVICE void AccountGroupPages(const MappedSessionView& s, uint32_t tier,
                                         uint64_t claimed, uint64_t flushed) {
  const PageRing* ring = TierAt(s, tier).d_ring;
  if (ring == nullptr || (claimed == 0 && flushed == 0)) return;
  TierControl& t = s.d_control->tiers[tier];
  uint64_t leased = ControlLoad(t.pages_leased) + claimed;
  leased -= MinU64(leased, flushed);
  ControlStore(t.pages_leased, leased);
  ControlStore(t.ring_head, ring->head);
  ControlStore(t.ring_tail, ring->tail);
}

// A group member gives its ring's free pages of `tier` back to the depot (cache mark 0).
STASH_HOST_DEVICE void FlushMappedTier(const MappedSessionView& s, uint32_t tier) {
  if (!InMappedGroup(s)) return;
  PageRing* ring = TierAt(s, tier).d_ring;
  if (ring == nullptr) return;
  const uint64_t n =
      FlushRing(GroupTierOf(s.d_group, tier, ring), s.d_group->tag, s.d_group->chunk_pages);
  AccountGroupPages(s, tier, 0, n);
}

// Before a member's stash is planned: the board's news into the cache, then the tiers the plan
// would try topped up from the depot (group_cache.h's rule). The own device's depot running dry
// is left in the state for the publish kernel (the host asks the daemon to grow the group).
STASH_HOST_DEVICE void RefillMappedGroup(const MappedStashArgs& a) {
  const MappedSessionView& s = a.session;
  s.d_state->group_dry = 0;
  if (!SyncMappedGroup(s.d_group_board, s.d_group)) return;
  if (Draining(*s.d_control) && a.keep_source != 0) return;  // nothing is tried
  const int64_t count = a.d_count != nullptr ? *a.d_count : a.count;
  const uint64_t pages = StashPagesNeeded(count, a.divisor, a.max_rows, a.row_bytes, s.page_bytes);
  GroupCacheTier tiers[kLeaseTiers];
  STASH_UNROLL
  for (uint32_t t = 0; t < kLeaseTiers; ++t) {
    tiers[t] = GroupTierOf(s.d_group, t, TierAt(s, t).d_ring);
  }
  const GroupRefill r =
      RefillForStash(tiers, s.d_group->tag, pages, s.allow_host != 0, s.d_group->chunk_pages);
  STASH_UNROLL
  for (uint32_t t = 0; t < kLeaseTiers; ++t) AccountGroupPages(s, t, r.claimed[t], r.flushed[t]);
  s.d_state->group_dry = r.device_missed > 0 ? 1 : 0;
}

// The plan kernel: the slot's previous stash, if it still holds pages (a stash replayed again
// before its reload ran: its activation is gone, so the step is flagged and the pages come
// back instead of leaking), then the new plan.
STASH_HOST_DEVICE void PlanMappedStashSlot(const MappedStashArgs& a) {
  const StashPlan old = *a.d_plan;
  const LeaseTierView held = PlacedLeaseTier(a.session, old);
  if (held.d_ring != nullptr) {
    ReturnPages(*held.d_ring, held.d_ring->tail, a.d_page_record, 0, old.pages);
    held.d_ring->tail += old.pages;
    SessionControl& c = *a.session.d_control;
    RecordReturned(c, old.tier, held.d_ring->tail, old.pages, old.bytes);
    RecordRejected(c);
    RaiseStepFlags(c, *a.session.d_state, kStepOverflow);
    FlushMappedTier(a.session, old.tier);
  }
  RefillMappedGroup(a);
  const StashPlan plan = PlanMappedStash(a);
  *a.d_plan = plan;
  if (PlacedLeaseTier(a.session, plan).d_ring == nullptr) {
    // Placed nowhere: what the refill claimed goes back for the others.
    for (uint32_t t = 0; t < kLeaseTiers; ++t) FlushMappedTier(a.session, t);
  }
}

// The numbers of live-stash table entry `entry` (MappedSessionView.d_live): the stash's ticket,
// bytes and pages, or all 0 (ticket 0: no live stash there). The ticket goes last when set and
// first when cleared, so a reader that sees it sees the numbers that go with it; the daemon
// clamps them anyway. The host wrote the entry's tags and name (client/mapped/live_table.h).
STASH_HOST_DEVICE void WriteLiveEntry(const MappedSessionView& s, uint32_t entry, uint64_t ticket,
                                      uint64_t bytes, uint64_t pages) {
  if (s.d_live == nullptr || entry >= kLiveEntries) return;
  LiveTable* table = *const_cast<LiveTable* const volatile*>(s.d_live);
  if (table == nullptr) return;
  LiveEntry& e = table->entries[entry];
#if defined(__CUDA_ARCH__)
  if (ticket == 0) {
    ControlStore(e.ticket, 0);
    __threadfence_system();
  }
  ControlStore(e.bytes, bytes);
  ControlStore(e.pages, pages);
  if (ticket != 0) {
    __threadfence_system();
    ControlStore(e.ticket, ticket);
  }
#else
  // Release stores: none passes an earlier one (no fences: ThreadSanitizer models none).
  if (ticket == 0) __atomic_store_n(&e.ticket, uint64_t{0}, __ATOMIC_RELEASE);
  __atomic_store_n(&e.bytes, bytes, __ATOMIC_RELEASE);
  __atomic_store_n(&e.pages, pages, __ATOMIC_RELEASE);
  if (ticket != 0) __atomic_store_n(&e.ticket, ticket, __ATOMIC_RELEASE);
#endif
}

// The current step's flags to the host (MappedSessionView.d_step_flags).
STASH_HOST_DEVICE void ReportStepFlags(const MappedSessionView& s) {
  if (s.d_step_flags == nullptr) return;
  ControlStore(*s.d_step_flags, ControlLoad(s.d_control->step) << 2 | s.d_state->step_flags);
}

// PublishMappedStash's books.
STASH_HOST_DEVICE void PublishMappedStashBooks(const MappedStashArgs& a) {
  const MappedSessionView& s = a.session;
  const StashPlan plan = *a.d_plan;
  SessionControl& c = *s.d_control;
  CopierState& state = *s.d_state;
  if (plan.placement == Placement::kInvalidCount) {
    RecordRejected(c);
    RaiseStepFlags(c, state, kStepOverflow);
    return;
  }
  if (plan.tier == kUntriedTier) {
    // Nothing was tried (the daemon drains): only a caller that freed its source lost anything.
    if (a.keep_source == 0) RaiseStepFlags(c, state, kStepOverflow);
    return;
  }
  if (plan.placement == Placement::kOverflow) {
    const uint64_t demand =
        RecordOverflow(c, state, OverflowPages(plan, a.max_rows, a.row_bytes, s.page_bytes));
    if (ReportOutgrown(state, demand) && s.d_lease_short != nullptr) {
      ControlStore(*s.d_lease_short, state.outgrown);
    }
    return;
  }
  const LeaseTierView tier = PlacedLeaseTier(s, plan);
  if (tier.d_ring == nullptr) return;
  tier.d_ring->head = plan.head + plan.pages;
  const uint64_t demand =
      RecordPlaced(c, state, plan.tier, tier.d_ring->head, plan.pages, plan.bytes);
  const PageRing* device = s.tiers[kLeaseDevice].d_ring;
  const uint64_t device_free = device != nullptr ? RingFree(*device) : 0;
  const uint64_t device_leased = ControlLoad(c.tiers[kLeaseDevice].pages_leased);
  // A group member's lease is short when its own device's depot ran dry (the daemon grows the
  // group); a private lease's, by LeaseShort's rule.
  const bool short_now = InMappedGroup(s)
                             ? state.group_dry != 0
                             : LeaseShort(plan.tier != kLeaseDevice, device_free, device_leased);
  if (short_now && ReportOutgrown(state, demand) && s.d_lease_short != nullptr) {
    ControlStore(*s.d_lease_short, state.outgrown);
  }
}

// After the copy: publishes the new head and keeps the books, the stash's live entry (its
// numbers when it holds pages, else cleared) and the step's flags to the host. A bad count is
// counted as rejected and flags the step as an overflow (nothing was taken, and no host is there to
// answer the operation with an error: a guarded trainer reruns the step with the stash off).
STASH_HOST_DEVICE void PublishMappedStash(const MappedStashArgs& a) {
  PublishMappedStashBooks(a);
  const StashPlan plan = *a.d_plan;
  if (PlacedLeaseTier(a.session, plan).d_ring != nullptr) {
    WriteLiveEntry(a.session, a.live_entry, a.ticket, plan.bytes, plan.pages);
  } else {
    WriteLiveEntry(a.session, a.live_entry, 0, 0, 0);
  }
  ReportStepFlags(a.session);
}

// PublishMappedReload's books.
STASH_HOST_DEVICE void PublishMappedReloadBooks(const MappedReloadArgs& a) {
  const MappedSessionView& s = a.session;
  const StashPlan plan = *a.d_plan;
  SessionControl& c = *s.d_control;
  *a.d_plan = ConsumedPlan();
  if (plan.tier == kConsumedTier) {
    // Its entry may be another stash's by now: left alone.
    RecordRejected(c);
    if (a.d_dst != nullptr) RaiseStepFlags(c, *s.d_state, kStepOverflow);
    return;
  }
  WriteLiveEntry(s, a.live_entry, 0, 0, 0);
  const LeaseTierView tier = PlacedLeaseTier(s, plan);
  if (tier.d_ring == nullptr) return;
  tier.d_ring->tail += plan.pages;
  RecordReturned(c, plan.tier, tier.d_ring->tail, plan.pages, plan.bytes);
  FlushMappedTier(s, plan.tier);  // a group's member keeps no free page: the others may need it
  if (a.d_dst != nullptr) {
    RecordReloaded(c, plan.bytes);
  } else {
    RecordReleased(c);
  }
}

// After the pop: publishes the new tail and keeps the books (a reload or a release of a placed
// stash; nothing for one that overflowed or was not tried), clears its live entry, then consumes
// the plan slot, and the step's flags to the host. A slot already consumed (reloaded twice, say
// by a graph replayed twice without its stash) returns nothing and leaves the entry alone: the
// destination was left as it was, so the step is flagged.
STASH_HOST_DEVICE void PublishMappedReload(const MappedReloadArgs& a) {
  PublishMappedReloadBooks(a);
  ReportStepFlags(a.session);
}

// The counters of a control block the rank keeps on the device, copied from `from` to `to` (the
// daemon's cache line, magic and version stay, and so do the fields the rank's host side
// writes: attached, return_done, publish_seq): how the device copy reaches the shared block.
STASH_HOST_DEVICE void CopyRankFields(const SessionControl& from, SessionControl& to) {
  // The counters [step, attached): attached, return_done and publish_seq are the host side's.
  const uint64_t* src = &from.step;
  uint64_t* dst = &to.step;
  const uint64_t n = (reinterpret_cast<const uint8_t*>(&from.attached) -
                      reinterpret_cast<const uint8_t*>(&from.step)) /
                     sizeof(uint64_t);
  for (uint64_t i = 0; i < n; ++i) ControlStore(dst[i], ControlLoad(src[i]));
  for (uint32_t t = 0; t < kLeaseTiers; ++t) {
    const uint64_t* ts = &from.tiers[t].ring_head;
    uint64_t* td = &to.tiers[t].ring_head;
    for (uint64_t i = 0; i < sizeof(TierControl) / sizeof(uint64_t); ++i) {
      ControlStore(td[i], ControlLoad(ts[i]));
    }
  }
}

// Copies the rank's fields of the device block into the shared one under publish_seq: odd while
// it writes, two more once done, so a reader never takes a half-written block for a whole one.
STASH_HOST_DEVICE void PublishControl(const SessionControl& from, SessionControl& to) {
  const uint64_t seq = ControlLoad(to.publish_seq);
  const uint64_t odd = (seq | 1) == seq ? seq + 2 : seq + 1;
#if defined(__CUDA_ARCH__)
  ControlStore(to.publish_seq, odd);
  __threadfence_system();  // every observer sees the odd count before any field change
  CopyRankFields(from, to);
  __threadfence_system();  // and every field change before the even count
  ControlStore(to.publish_seq, odd + 1);
#else
  // No fences on the host (TSan models none): the odd count is an acquire exchange, which no
  // later store moves before, and the even count a release store, which no earlier one passes.
  __atomic_exchange_n(&to.publish_seq, odd, __ATOMIC_ACQ_REL);
  CopyRankFields(from, to);
  __atomic_store_n(&to.publish_seq, odd + 1, __ATOMIC_RELEASE);
#endif
}

#if !defined(__CUDA_ARCH__)
// A snapshot of a GPU rank's published control block (PublishControl), for a reader in another
// process (the daemon): false when the rank was writing it meanwhile (try again). Fields the
// rank does not publish are copied as they are.
inline bool ReadPublishedControl(const SessionControl& shared, SessionControl* out) {
  const uint64_t before = __atomic_load_n(&shared.publish_seq, __ATOMIC_ACQUIRE);
  if ((before & 1) != 0) return false;
  const auto* src = reinterpret_cast<const uint64_t*>(&shared);
  auto* dst = reinterpret_cast<uint64_t*>(out);
  // Acquire loads: the count read last cannot be read before any of them.
  for (uint64_t i = 0; i < sizeof(SessionControl) / sizeof(uint64_t); ++i) {
    dst[i] = __atomic_load_n(&src[i], __ATOMIC_ACQUIRE);
  }
  return __atomic_load_n(&shared.publish_seq, __ATOMIC_RELAXED) == before;
}
#endif

// A step boundary on the stream: the step's books (RecordBeginStep), the ended step's flags to
// the host, the device block to the shared one (PublishControl), and the daemon's line back.
STASH_HOST_DEVICE void MappedStep(const MappedStepArgs& a) {
  SessionControl& c = *a.session.d_control;
  SessionControl* shared =
      a.d_shared != nullptr ? *const_cast<SessionControl* const volatile*>(a.d_shared) : nullptr;
  if (shared != nullptr) {
    ControlStore(c.daemon_flags, ControlLoad(shared->daemon_flags));
    ControlStore(c.return_request, ControlLoad(shared->return_request));
    for (uint32_t t = 0; t < kLeaseTiers; ++t) {
      ControlStore(c.return_target_pages[t], ControlLoad(shared->return_target_pages[t]));
    }
  }
  const uint64_t ended = RecordBeginStep(c, *a.session.d_state, a.step);
  ReportStepFlags(a.session);
  if (SyncMappedGroup(a.session.d_group_board, a.session.d_group)) {
    ReportGroupChunkStates(a.session.d_group, a.session.d_group_states);
  }
  if (shared != nullptr) PublishControl(c, *shared);
  if (a.d_report != nullptr) ControlStore(a.d_report->step_and_flags, a.step << 2 | ended);
}

// Appends a chunk's page ids to its tier's ring and counts them as leased.
STASH_HOST_DEVICE void AddMappedPages(const MappedRingArgs& a) {
  PageRing* ring = TierAt(a.session, a.tier).d_ring;
  if (ring == nullptr) return;
  TierControl& t = a.session.d_control->tiers[a.tier];
  // Pages already leased (free or held by stashes) plus these must fit the ring: a chunk added
  // twice would put its ids in the ring twice.
  if (ControlLoad(t.pages_leased) + a.pages > ring->capacity) return;
  for (uint64_t i = 0; i < a.pages; ++i) RingReturnAt(*ring, ring->tail, i, a.first_id + i);
  ring->tail += a.pages;
  ControlStore(t.pages_leased, ControlLoad(t.pages_leased) + a.pages);
  ControlStore(t.ring_tail, ring->tail);
}

// Takes the pages [first_id, first_id + pages) of one chunk out of its tier's ring when every
// one of them is free (in [head, tail)), keeping the others in order: *d_result = 1; else
// changes nothing: *d_result = 0.
STASH_HOST_DEVICE void RemoveMappedChunk(const MappedRingArgs& a) {
  uint64_t removed = 0;
  PageRing* ring = TierAt(a.session, a.tier).d_ring;
  if (ring != nullptr && ring->capacity > 0) {
    const uint64_t free = RingFree(*ring);
    uint64_t in_chunk = 0;
    for (uint64_t i = 0; i < free; ++i) {
      const uint64_t id = RingPageAt(*ring, ring->head, i);
      if (id >= a.first_id && id < a.first_id + a.pages) ++in_chunk;
    }
    if (in_chunk == a.pages) {
      uint64_t kept = 0;
      for (uint64_t i = 0; i < free; ++i) {
        const uint64_t id = RingPageAt(*ring, ring->head, i);
        if (id >= a.first_id && id < a.first_id + a.pages) continue;
        RingReturnAt(*ring, ring->head, kept++, id);
      }
      ring->tail = ring->head + kept;
      TierControl& t = a.session.d_control->tiers[a.tier];
      ControlStore(t.pages_leased, ControlLoad(t.pages_leased) - a.pages);
      ControlStore(t.ring_tail, ring->tail);
      removed = 1;
    }
  }
  if (a.d_result != nullptr) ControlStore(*a.d_result, removed);
}

// The copy kernel's work in one thread (the host twin the driver stand-in runs, and the tests'
// reference): the plan's pages from the ring at its head, copied and recorded.
STASH_HOST_DEVICE void MappedStashCopySerial(const MappedStashArgs& a) {
  const StashPlan plan = *a.d_plan;
  const LeaseTierView tier = PlacedLeaseTier(a.session, plan);
  if (tier.d_ring == nullptr) return;
  const PagedSpan span{tier.d_base, a.session.page_bytes, a.d_page_record, plan.bytes};
  StashPages(a.d_src, *tier.d_ring, plan.head, span, 0, plan.pages);
}

// The pop kernel's work in one thread: a placed stash's pages copied back (a reload), the tail
// zeroed when asked and the pages returned at the ring's tail; for a stash that overflowed or
// was not tried, the kept source's rows copied instead (when given) and the tail zeroed.
STASH_HOST_DEVICE void MappedReloadPopSerial(const MappedReloadArgs& a) {
  const StashPlan plan = *a.d_plan;
  const LeaseTierView tier = PlacedLeaseTier(a.session, plan);
  const uint64_t max_bytes = a.max_rows * a.row_bytes;
  if (tier.d_ring == nullptr) {
    if (plan.placement != Placement::kOverflow || plan.tier == kConsumedTier ||
        a.d_kept_src == nullptr || a.d_dst == nullptr) {
      return;
    }
    const uint64_t kept = KeptBytes(plan, a.max_rows, a.row_bytes);
    if (a.d_kept_src != a.d_dst) {
      for (uint64_t v = 0; v < VectorsFor(kept); ++v) KeptVector(a.d_dst, a.d_kept_src, kept, v);
    }
    if (a.zero_tail != 0) ZeroBytes(a.d_dst, kept, max_bytes);
    return;
  }
  if (a.d_dst != nullptr) {
    const PagedSpan span{tier.d_base, a.session.page_bytes, const_cast<uint64_t*>(a.d_page_record),
                         plan.bytes};
    PopPages(a.d_dst, span, 0, plan.pages);
    if (a.zero_tail != 0) ZeroBytes(a.d_dst, plan.bytes, max_bytes);
  }
  ReturnPages(*tier.d_ring, tier.d_ring->tail, a.d_page_record, 0, plan.pages);
}

}  // namespace stash::kernels

#endif  // STASH_KERNELS_MAPPED_PAGING_H_
