// Mapped mode's kernels (stash/kernels/mapped_paging.h), compiled to a fatbin the client library
// carries and launches through the driver API on the trainer's stream: no CUDA runtime in the
// trainer from us, and no host code between a stash's kernels.
//
// The one-thread kernels call the STASH_HOST_DEVICE bodies of mapped_paging.h as they are. The
// copy and pop kernels run the same block-level bodies as the daemon-copy kernels
// (paging_blocks.cuh): a thread block per chunk of a stash's pages. Their host twins are
// MappedStashCopySerial / MappedReloadPopSerial; tests/kernels pins those, and tests/gpu compares
// the kernels with them byte for byte.
#include "stash/kernels/mapped_paging.h"
#include "stash/kernels/paging_blocks.cuh"

using stash::kernels::LeaseTierView;
using stash::kernels::MappedReloadArgs;
using stash::kernels::MappedRingArgs;
using stash::kernels::MappedStashArgs;
using stash::kernels::MappedStepArgs;
using stash::kernels::Placement;
using stash::kernels::StashPlan;

// One thread: where the stash goes.
extern "C" __global__ void stash_mapped_stash_plan(MappedStashArgs a) {
  stash::kernels::PlanMappedStashSlot(a);
}

// A block per chunk of the placed stash's page slots (StashChunks, paging_blocks.cuh).
extern "C" __global__ void stash_mapped_stash_copy(MappedStashArgs a) {
  const StashPlan plan = *a.d_plan;
  const LeaseTierView tier = stash::kernels::PlacedLeaseTier(a.session, plan);
  if (tier.d_ring == nullptr) return;
  stash::kernels::StashChunks(a.d_src, *tier.d_ring, tier.d_base, a.session.page_bytes, plan,
                              a.d_page_record);
}

// One thread, after the copy: the new head and the books.
extern "C" __global__ void stash_mapped_stash_publish(MappedStashArgs a) {
  stash::kernels::PublishMappedStash(a);
}

// A block per chunk: copy back, return the page ids at the old tail, zero the tail (PopChunks);
// for a stash placed nowhere that overflowed or was not tried, the kept source's rows instead
// (ReloadKeptSource); a consumed plan slot copies nothing.
extern "C" __global__ void stash_mapped_reload_pop(MappedReloadArgs a) {
  const StashPlan plan = *a.d_plan;
  const LeaseTierView tier = stash::kernels::PlacedLeaseTier(a.session, plan);
  if (tier.d_ring == nullptr) {
    if (plan.placement != Placement::kOverflow || plan.tier == stash::kernels::kConsumedTier ||
        a.d_kept_src == nullptr || a.d_dst == nullptr) {
      return;
    }
    stash::kernels::ReloadKeptSource(a.d_dst, a.d_kept_src, plan, a.max_rows, a.row_bytes,
                                     a.zero_tail != 0);
    return;
  }
  stash::kernels::PopChunks(a.d_dst, *tier.d_ring, tier.d_base, a.session.page_bytes, plan,
                            a.d_page_record, a.max_rows * a.row_bytes, a.zero_tail != 0);
}

// One thread, after the pop: the new tail and the books.
extern "C" __global__ void stash_mapped_reload_publish(MappedReloadArgs a) {
  stash::kernels::PublishMappedReload(a);
}

// One thread: a step boundary.
extern "C" __global__ void stash_mapped_step(MappedStepArgs a) { stash::kernels::MappedStep(a); }

// One thread: a chunk's pages join its tier's ring.
extern "C" __global__ void stash_mapped_add_pages(MappedRingArgs a) {
  stash::kernels::AddMappedPages(a);
}

// One thread: a chunk's pages leave its tier's ring, when all are free.
extern "C" __global__ void stash_mapped_remove_chunk(MappedRingArgs a) {
  stash::kernels::RemoveMappedChunk(a);
}
