// The GPU twin of Copier (client/mapped/copier.h): a mapped session's paging as kernels on the
// trainer's own stream (docs/design.md, "Mapped mode on GPUs").
//
// Copier runs each operation on a worker thread of the client library; StreamCopier enqueues the
// same operation as kernels (kernels/mapped_paging.cu, from the fatbin the library carries,
// launched through the driver API: no CUDA runtime of ours in the trainer) on the caller's
// stream and returns: no host callback, no host synchronisation and nothing to the daemon per
// operation. Every piece of state those kernels change lives in device memory this object
// allocates and changes only by work ordered on that stream: the three lease tiers' rings and
// their page ids, a device copy of the control block with the copier's state, a plan and a page
// record per stash. So a stash, a reload or a release can be captured in a CUDA graph and
// replayed: each replay reads its count, plans, spills or overflows on the device.
//
// What the host knows is what it enqueued, not what happened: a Stash's ticket names its plan
// slot and page-record range, and placement, rows and the step's flags are known on the device.
// The step kernel (BeginStep) publishes the device control block to the shared one the daemon
// reads, takes the daemon's line (drain, return requests) back, and leaves the ended step's
// flags in host memory (LastStep) once the stream gets there; the lease being short reaches
// host memory at once (LeaseShortReports).
//
// Lease changes (AddChunk, RemoveChunk) are kernels too, refused while the stream captures:
// the chunk's memory must be mapped (CudaLeaseMemory) before AddChunk is enqueued and stay
// mapped until RemoveChunk's answer says it left the ring and the work before it completed.
//
// Order: the rings have one writer, so the session's operations (and the graphs that replay
// them) must run one after another on the GPU: on one stream, or on streams the caller orders
// with events (as PyTorch's side-stream capture does after its warm-up). Graphs that replay
// them must not run after the copier is destroyed (its module and state are gone).
//
// Plan slots: a ticket names a slot holding its plan and a page-record range. A reload or
// release frees them on the host at once (later operations run after it) and consumes the plan
// on the device; so a reload replayed twice, or a stash replayed again before its reload ran,
// flags the step instead of returning or leaking pages twice. Slots of stashes enqueued while
// the stream captures stay reserved, because the graph's replays use them, until the caller
// says its graphs are gone (ReleaseCapturedSlots).
//
// Thread-compatible: the caller serialises calls (the trainer's thread, like its stream). Every
// driver call runs with the thread's capture interaction mode relaxed, so none of them breaks a
// capture another thread runs.
#ifndef STASH_CLIENT_STREAM_COPIER_H_
#define STASH_CLIENT_STREAM_COPIER_H_

#include <cuda.h>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "client/mapped/live_table.h"
#include "common/cuda_driver.h"
#include "common/mutex.h"
#include "common/range_allocator.h"
#include "stash/kernels/lease_control.h"
#include "stash/kernels/mapped_paging.h"
#include "stash/status.h"

namespace stash::client {

class StreamCopier {
 public:
  struct Geometry {
    uint64_t page_bytes = 0;   // a power of two >= 16
    uint64_t chunk_bytes = 0;  // a whole number of pages
    // Per lease tier (kernels::LeaseTier): the device address of its reserved range (page 0 of
    // slot 0: CudaLeaseMemory::base) and how many chunk slots it has; 0 slots = no such tier.
    std::array<uint64_t, kernels::kLeaseTiers> tier_base{};
    std::array<uint64_t, kernels::kLeaseTiers> tier_slots{};
    bool allow_host = true;  // stashes may spill to the host tier
    // The session may join a group (JoinGroup): only then do its plan kernels read the group's
    // board (a read of host memory per stash); a session in no group pays nothing for groups.
    bool group = false;
    uint32_t max_stashes = 4096;       // stashes live at once (plan slots)
    uint64_t record_pages = 1u << 20;  // page-record entries for all live stashes together, each
                                       // reserving PagesFor(max_rows * row_bytes)
  };

  // Allocates and initialises the device state in the current context (the caller's: the
  // trainer's primary context) and loads the kernels from `fatbin` (the library's own, or a
  // test's). `driver` is borrowed and outlives the object. INVALID_ARGUMENT for a bad geometry;
  // the driver's error (RESOURCE_EXHAUSTED when out of memory) otherwise. The first state is in
  // device memory when it returns, whatever stream the kernels run on later: it waits once for
  // the GPU work queued before it on the legacy stream (and so on blocking streams).
  static StatusOr<std::unique_ptr<StreamCopier>> Create(const CudaDriver* driver,
                                                        const Geometry& geometry,
                                                        const void* fatbin);
  StreamCopier(const StreamCopier&) = delete;
  StreamCopier& operator=(const StreamCopier&) = delete;
  // Synchronizes the context (no kernel may still use the state), then frees it. Destroy it
  // with the context it was created in current on the thread.
  ~StreamCopier();

  struct StashRequest {
    const void* src = nullptr;         // device-accessible; max_rows * row_bytes bytes
    const int64_t* d_count = nullptr;  // read when the plan kernel runs; null = `count`
    int64_t count = 0;
    uint32_t divisor = 1;  // rows = ceil(count / divisor); 0 = 1
    uint64_t max_rows = 0;
    uint64_t row_bytes = 0;  // > 0
    // The caller keeps `src` valid and unchanged until the stash's reload or release ran: a
    // stash that overflows (only the device knows) is then reloaded from it, so every replay of
    // a graph reads the activation. false (the source is freed once the stash is enqueued, the
    // memory saving upstream's paged stash makes): an overflowed stash's reload leaves the
    // destination as it is, and the step's overflow flag (LastStep) says to rerun the step.
    bool keep_source = true;
    // Its tags in the control block's live-stash table (`stashctl sessions --detail`); `name`
    // is copied there before Stash returns.
    uint32_t layer = 0;
    uint32_t microbatch = 0;
    std::string_view name;
  };
  // Enqueues plan, copy and publish on `stream`; returns the ticket. RESOURCE_EXHAUSTED when
  // max_stashes stashes are live or the page-record arena is full (nothing enqueued);
  // INVALID_ARGUMENT for bad arguments (a stash larger than the whole arena included).
  StatusOr<uint64_t> Stash(CUstream stream, const StashRequest& request);
  // Enqueues pop and publish: the stash's rows into `dst` (device-accessible, max_rows *
  // row_bytes bytes), zeros past them when `zero_tail`, its pages back to its ring; a stash that
  // overflowed copies from its kept source instead. NOT_FOUND for a ticket that is not live;
  // INVALID_ARGUMENT when `dst` partly overlaps the kept source.
  Status Reload(CUstream stream, uint64_t ticket, void* dst, bool zero_tail);
  // Enqueues the pages' return without a copy. A stash made outside capture and released while
  // `stream` captures (a tensor freed during a capture, say) is not released in the graph: its
  // first replay would release it, a second one nothing, and a graph never replayed would keep
  // its pages forever. Its release waits for the next operation on a stream that does not
  // capture (or RunDeferredReleases); it counts as released at once: a reload or release of it
  // is NOT_FOUND.
  Status Release(CUstream stream, uint64_t ticket);
  // Enqueues the releases deferred by Release on `stream`, which must not capture (a step
  // boundary does it). How many ran.
  StatusOr<uint64_t> RunDeferredReleases(CUstream stream);

  // Points the step kernel at a new shared control block: `d_shared` is its device address (the
  // memfd the daemon created, registered for the device by the caller, who also marks it
  // attached from the host as LeaseTable::SetControlBlock does), `host` its mapping here, of
  // `bytes`. Later steps, graph replays included, publish into it, and the stashes' kernels
  // write their live-stash table entries there. A kernel already running may still write the
  // previous block: keep it mapped and registered until OldControlReleasable(). Not while
  // capturing.
  Status AttachControl(CUstream stream, kernels::SessionControl* d_shared, uint8_t* host,
                       uint64_t bytes);
  // Whether the work enqueued before the last AttachControl has completed.
  bool OldControlReleasable() const;

  // Enqueues a step boundary (kernels::MappedStep). May be captured.
  Status BeginStep(CUstream stream, uint64_t step);
  // What the last step kernel that ran left.
  struct StepFlagsReport {
    uint64_t step = 0;   // its step
    uint64_t flags = 0;  // kStepOverflow | kStepSpilled of the step that ended there
  };
  StepFlagsReport LastStep() const;
  // The current step (the last step kernel that ran) and its flags as far as the stream got:
  // each stash's publish raises them. Synchronize the stream to have the whole step's.
  StepFlagsReport CurrentStep() const;
  // How many times a stash found the lease short so far (a spill, an overflow, the own device
  // under an eighth free; once per eighth of growth in a step): ask the daemon for more chunks
  // when it moves.
  uint64_t LeaseShortReports() const;

  // Enqueues the pages of chunk slot `slot` of `tier` (its memory mapped already) into the
  // tier's ring. FAILED_PRECONDITION while the stream captures or when the slot is in the ring
  // already (or its removal is pending).
  Status AddChunk(CUstream stream, uint32_t tier, uint64_t slot, uint64_t bytes);
  // Enqueues taking slot `slot`'s pages (`bytes`, as added) out of the ring when no stash holds
  // one. The answer arrives in host memory: RemovalDone says whether it ran and whether the
  // chunk left. FAILED_PRECONDITION while the stream captures, or when the slot is not in the
  // ring (never added, or its removal is pending).
  Status RemoveChunk(CUstream stream, uint32_t tier, uint64_t slot, uint64_t bytes);
  // nullopt while slot's removal has not run yet; else whether the chunk left the ring (the
  // slot may then be unmapped after the stream's work; false: a stash holds its pages).
  std::optional<bool> RemovalDone(uint32_t tier, uint64_t slot);

  // Groups (docs/design.md, "Groups on GPUs"). The session joins its group's depot: from then
  // on each stash's plan kernel claims the pages it needs from the depots, tier by tier, and each
  // reload or release gives them back (kernels/group_cache.h), graphs captured before included.
  // `tiers[t].depot` holds device addresses this GPU reaches with native atomics (tags null: the
  // tier takes nothing from a depot); `tiers[t].first_page` is the group page of the tier's range
  // start (Geometry.tier_base: group page P of the tier is at tier_base + (P - first_page) *
  // page_bytes). Once per group (FAILED_PRECONDITION until LeaveGroup), before any chunk is added
  // to a tier's ring the old way; at any time else, also while a stream captures. AddGroupChunk may
  // be called from any thread (the lease thread maps chunks mid-step); the others as the rest.
  struct GroupTier {
    kernels::GroupView depot{};
    uint64_t first_page = 0;
  };
  Status JoinGroup(uint32_t tag, uint64_t chunk_pages,
                   const std::array<GroupTier, kernels::kLeaseTiers>& tiers);
  bool grouped() const;
  // A chunk of the group is mapped at its place of `tier`'s range (its memory stays mapped until
  // TakeLeavingGroupChunks named it and the stream's work before that completed): the kernels
  // may claim its pages from their next stash on. INVALID_ARGUMENT when it lies outside the range
  // or is not whole pages of a chunk; ALREADY_EXISTS when it is on the board; RESOURCE_EXHAUSTED
  // when the tier's board is full.
  Status AddGroupChunk(uint32_t tier, const kernels::GroupChunkRef& ref);
  // The session leaves its group (its daemon drained or died, no stash live): every chunk comes
  // off the board and the depot with them, so no kernel enqueued from now on claims or names
  // them; returns them, to unmap behind the work enqueued so far. JoinGroup may then join a new
  // group (a new daemon's).
  std::vector<std::pair<uint32_t, kernels::GroupChunkRef>> LeaveGroup();
  // The chunks the last step kernel found leaving the group (the daemon took all their pages
  // back), taken off the board: no kernel enqueued from now on names them. Unmap each behind the
  // work enqueued so far, then give it back. Empty when the step kernel has not reported the
  // board as it is now.
  std::vector<std::pair<uint32_t, kernels::GroupChunkRef>> TakeLeavingGroupChunks();

  // The caller destroyed every graph captured so far: the plan slots and page-record ranges of
  // their stashes that were reloaded or released go back to the free lists.
  // FAILED_PRECONDITION while a stash taken during a capture is still live (a graph may replay
  // it): nothing changes then.
  Status ReleaseCapturedSlots();

  // Live stashes the host knows of (enqueued, not yet reloaded or released).
  uint64_t live() const { return tickets_.size(); }

 private:
  struct Ticket {
    uint32_t plan_slot = 0;
    uint64_t record_offset = 0;
    uint64_t record_pages = 0;
    const uint8_t* src = nullptr;
    uint64_t max_rows = 0, row_bytes = 0;
    bool captured = false;          // taken while capturing: its slots stay reserved
    bool release_deferred = false;  // released during a capture (RunDeferredReleases)
  };
  // Where a chunk slot stands, as far as the host enqueued.
  enum class SlotState : uint8_t { kAbsent, kInRing, kRemoving };

  StreamCopier(const CudaDriver* driver, const Geometry& geometry);
  Status CheckChunk(uint32_t tier, uint64_t slot, uint64_t bytes) const;
  bool Capturing(CUstream stream) const;
  // One thread for the one-thread kernels, else kThreadsPerBlock threads a block.
  Status Launch(CUfunction function, uint64_t blocks, bool one_thread, CUstream stream, void* args,
                const char* what);
  Status EndTicket(CUstream stream, uint64_t ticket, void* dst, bool zero_tail);
  // RunDeferredReleases when some wait and `stream` does not capture: a job whose step
  // boundaries are all captured still gets them back at its next operation outside capture.
  void RunDeferredOutsideCapture(CUstream stream);

  const CudaDriver* const driver_;
  const Geometry geometry_;
  CUmodule module_ = nullptr;
  std::array<CUfunction, 8> functions_{};  // in the order of kernels::k*Kernel in Create
  CUdeviceptr block_ = 0;                  // the device state, one allocation
  uint64_t block_bytes_ = 0;
  void* host_block_ = nullptr;  // pinned, device-mapped: the step report and removal answers
  CUdeviceptr host_block_device_ = 0;
  // Device addresses of the plan slots and page records in block_.
  CUdeviceptr d_plans_ = 0, d_records_ = 0;
  kernels::MappedSessionView view_{};  // every kernel's view of the session (set in Create)
  CUevent attach_event_ = nullptr;     // recorded by AttachControl
  bool attach_recorded_ = false;
  uint64_t next_ticket_ = 0;
  // The lowest free slot serves next, so the live-stash table (an entry per slot below
  // kernels::kLiveEntries) covers the stashes of any order of reloads up to its size.
  std::set<uint32_t> free_plans_;
  RangeAllocator records_;
  std::unordered_map<uint64_t, Ticket> tickets_;
  std::vector<Ticket> captured_ended_;       // slots kept for graphs (ReleaseCapturedSlots)
  std::vector<uint64_t> deferred_releases_;  // released while capturing (RunDeferredReleases)
  std::array<std::vector<SlotState>, kernels::kLeaseTiers> slots_;
  std::unordered_map<uint64_t, uint64_t> removals_;  // (tier << 48 | slot) -> answer index
  std::vector<uint32_t> free_answers_;
  LiveTagWriter live_tags_;  // entry i: the stash in plan slot i
  // Groups: the board the host writes and the states the step kernel reports, pinned and
  // device-mapped (one allocation), and the kernels' cache in block_. The board is written under
  // group_mu_ (the lease thread adds chunks while the trainer's thread enqueues).
  void* group_host_ = nullptr;
  CUdeviceptr group_host_device_ = 0;
  mutable Mutex group_mu_;
  std::vector<uint8_t> board_shadow_;  // what the board says (its generation: the last whole one)
  // Whether the board names a depot (group_mu_ held).
  bool InGroup() const;
  // Rewrites the board: `change` runs between the odd and the even generation.
  template <typename Change>
  void RewriteBoard(Change change);
};

}  // namespace stash::client

#endif  // STASH_CLIENT_STREAM_COPIER_H_
