// Mapped mode's kernels (stash/kernels/mapped_paging.h), compiled to a fatbin the client library
// carries and launches through the driver API on the trainer's stream: no CUDA runtime in the
// trainer from us, and no host code between a stash's kernels.
//
// The one-thread kernels call the STASH_HOST_DEVICE bodies of mapped_paging.h as they are. The
// copy and pop kernels split a stash by chunks of its pages, a thread block per chunk, like the
// daemon-copy kernels (paging.cu): the block's first thread reads the chunk's page id once, its
// threads copy 16-byte vectors (StashChunkVector, PopChunkVector). Their host twins are
// MappedStashCopySerial / MappedReloadPopSerial; tests/kernels pins those, and tests/gpu compares
// the kernels with them byte for byte.
#include "stash/kernels/mapped_paging.h"

namespace stash::kernels {
namespace {

__device__ __forceinline__ uint64_t GlobalThread() {
  return static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ uint64_t GridThreads() {
  return static_cast<uint64_t>(gridDim.x) * blockDim.x;
}

}  // namespace
}  // namespace stash::kernels

using stash::kernels::ChunkBegin;
using stash::kernels::ChunksFor;
using stash::kernels::ChunkShape;
using stash::kernels::ChunkShapeOf;
using stash::kernels::GlobalThread;
using stash::kernels::GridThreads;
using stash::kernels::LeaseTierView;
using stash::kernels::MappedReloadArgs;
using stash::kernels::MappedRingArgs;
using stash::kernels::MappedStashArgs;
using stash::kernels::MappedStepArgs;
using stash::kernels::PagedSpan;
using stash::kernels::PageRing;
using stash::kernels::Placement;
using stash::kernels::RingIndexAfter;
using stash::kernels::StashPlan;

// One thread: where the stash goes.
extern "C" __global__ void stash_mapped_stash_plan(MappedStashArgs a) {
  stash::kernels::PlanMappedStashSlot(a);
}

// A block per chunk of the plan's pages (grid-stride over chunks).
extern "C" __global__ void stash_mapped_stash_copy(MappedStashArgs a) {
  __shared__ uint64_t id;
  const StashPlan plan = *a.d_plan;
  const LeaseTierView tier = stash::kernels::PlacedLeaseTier(a.session, plan);
  if (tier.d_ring == nullptr) return;
  const PageRing ring = *tier.d_ring;  // ids and capacity; the head is plan.head
  const uint64_t page_bytes = a.session.page_bytes;
  const PagedSpan span{tier.d_base, page_bytes, a.d_page_record, plan.bytes};
  const ChunkShape shape = ChunkShapeOf(page_bytes);
  const uint64_t chunks = ChunksFor(plan.pages, shape);
  const uint64_t chunk_vectors = uint64_t{1} << (shape.chunk_shift - 4);
  const uint64_t head_index = threadIdx.x == 0 && ring.capacity > 0 ? plan.head % ring.capacity : 0;
  for (uint64_t chunk = blockIdx.x; chunk < chunks; chunk += gridDim.x) {
    if (threadIdx.x == 0) {
      const uint64_t slot = chunk >> shape.chunks_shift;
      id = ring.ids[RingIndexAfter(head_index, slot, ring.capacity)];
      if ((chunk & ((uint64_t{1} << shape.chunks_shift) - 1)) == 0) a.d_page_record[slot] = id;
    }
    __syncthreads();
    const uint64_t begin = ChunkBegin(chunk, shape);
    for (uint64_t v = threadIdx.x; v < chunk_vectors; v += blockDim.x) {
      stash::kernels::StashChunkVector(a.d_src, span, shape, begin, id, v);
    }
    __syncthreads();  // nobody still reads `id` when thread 0 writes the next one
  }
}

// One thread, after the copy: the new head and the books.
extern "C" __global__ void stash_mapped_stash_publish(MappedStashArgs a) {
  stash::kernels::PublishMappedStash(a);
}

// A block per chunk: copy back and return the pages at the old tail; then the zero tail. For a
// stash placed nowhere, the kept source's rows instead (grid-stride over vectors).
extern "C" __global__ void stash_mapped_reload_pop(MappedReloadArgs a) {
  __shared__ uint64_t id;
  const StashPlan plan = *a.d_plan;
  const LeaseTierView tier = stash::kernels::PlacedLeaseTier(a.session, plan);
  const uint64_t max_bytes = a.max_rows * a.row_bytes;
  if (tier.d_ring == nullptr) {
    if (plan.placement != Placement::kOverflow || plan.tier == stash::kernels::kConsumedTier ||
        a.d_kept_src == nullptr || a.d_dst == nullptr) {
      return;
    }
    const uint64_t kept = stash::kernels::KeptBytes(plan, a.max_rows, a.row_bytes);
    if (a.d_kept_src != a.d_dst) {
      for (uint64_t v = GlobalThread(); v < stash::kernels::VectorsFor(kept); v += GridThreads()) {
        stash::kernels::KeptVector(a.d_dst, a.d_kept_src, kept, v);
      }
    }
    if (a.zero_tail != 0) {
      for (uint64_t v = (kept >> 4) + GlobalThread(); v < stash::kernels::VectorsFor(max_bytes);
           v += GridThreads()) {
        stash::kernels::ZeroTailVector(a.d_dst, kept, max_bytes, v);
      }
    }
    return;
  }
  const PageRing ring = *tier.d_ring;  // pages go back through ring.ids only
  const uint64_t page_bytes = a.session.page_bytes;
  const PagedSpan span{tier.d_base, page_bytes, const_cast<uint64_t*>(a.d_page_record), plan.bytes};
  const ChunkShape shape = ChunkShapeOf(page_bytes);
  const uint64_t chunks = ChunksFor(plan.pages, shape);
  const uint64_t chunk_vectors = uint64_t{1} << (shape.chunk_shift - 4);
  const uint64_t tail_index = threadIdx.x == 0 && ring.capacity > 0 ? ring.tail % ring.capacity : 0;
  for (uint64_t chunk = blockIdx.x; chunk < chunks; chunk += gridDim.x) {
    if (threadIdx.x == 0) {
      const uint64_t slot = chunk >> shape.chunks_shift;
      id = a.d_page_record[slot];
      if ((chunk & ((uint64_t{1} << shape.chunks_shift) - 1)) == 0) {
        ring.ids[RingIndexAfter(tail_index, slot, ring.capacity)] = id;
      }
    }
    __syncthreads();
    if (a.d_dst != nullptr) {
      const uint64_t begin = ChunkBegin(chunk, shape);
      for (uint64_t v = threadIdx.x; v < chunk_vectors; v += blockDim.x) {
        stash::kernels::PopChunkVector(a.d_dst, span, shape, begin, id, v);
      }
    }
    __syncthreads();
  }
  if (a.zero_tail != 0 && a.d_dst != nullptr) {
    for (uint64_t v = (plan.bytes >> 4) + GlobalThread(); v < stash::kernels::VectorsFor(max_bytes);
         v += GridThreads()) {
      stash::kernels::ZeroTailVector(a.d_dst, plan.bytes, max_bytes, v);
    }
  }
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
