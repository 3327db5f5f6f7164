// The block-level bodies of the paging kernels, shared by daemon-copy's kernels (paging.cu) and
// mapped mode's (mapped_paging.cu): only where a kernel finds its tier and plan differs. CUDA
// only (nvcc); the host runs the same rules through paging.h's StashPages / PopPages.
//
// A stash or reload is split by chunks of its page slots (kChunkBytes, or the page when
// smaller), a thread block per chunk, grid-stride: the block's first thread reads the chunk's
// page id once (from the ring at slot plan.head + slot for a stash, and the first chunk of a
// page writes the page record; from the page record for a reload, and the first chunk of a page
// returns the id at ring slot tail + slot), then the block's threads copy the chunk's 16-byte
// vectors. Heads and tails are published by a later one-thread kernel, so every block works
// from the same old head or tail.
#ifndef STASH_KERNELS_PAGING_BLOCKS_CUH_
#define STASH_KERNELS_PAGING_BLOCKS_CUH_

#include <cstdint>

#include "stash/kernels/paging.h"

namespace stash::kernels {

__device__ __forceinline__ uint64_t GlobalThread() {
  return static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ uint64_t GridThreads() {
  return static_cast<uint64_t>(gridDim.x) * blockDim.x;
}

// How many 16-byte loads a thread issues before its stores in a whole chunk (CopyChunk).
constexpr int kVectorsInFlight = 4;

// The block's threads copy `vectors` 16-byte vectors from `from` to `to`, both 16-byte aligned
// and not overlapping: each thread loads up to kVectorsInFlight vectors before it stores them, so
// that many loads are in flight per thread (a load followed by its store, vector by vector,
// keeps one: the compiler may not hoist a load above a store that might alias it). Plain loads
// and stores: on an H200, streaming cache hints (ld/st.global.cs) made 1 GiB stashes 4% slower
// and this batching made them 3% faster (docs/gpu-results.md).
__device__ __forceinline__ void CopyChunk(uint4* to, const uint4* from, uint64_t vectors) {
  for (uint64_t first = threadIdx.x; first < vectors;
       first += uint64_t{kVectorsInFlight} * blockDim.x) {
    uint4 held[kVectorsInFlight];
#pragma unroll
    for (int k = 0; k < kVectorsInFlight; ++k) {
      const uint64_t v = first + static_cast<uint64_t>(k) * blockDim.x;
      if (v < vectors) held[k] = from[v];
    }
#pragma unroll
    for (int k = 0; k < kVectorsInFlight; ++k) {
      const uint64_t v = first + static_cast<uint64_t>(k) * blockDim.x;
      if (v < vectors) to[v] = held[k];
    }
  }
}

__device__ __forceinline__ bool Aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

// The copy kernel: `plan`'s page slots of `ring` (a copy: ids and capacity; the head is
// plan.head) filled from `src`, page ids recorded in `page_record`. A whole chunk of an aligned
// source goes through CopyChunk; the stash's last, partial chunk and unaligned sources vector by
// vector (StashChunkVector, the host's rule).
__device__ __forceinline__ void StashChunks(const uint8_t* src, const PageRing ring,
                                            uint8_t* tier_base, uint64_t page_bytes,
                                            const StashPlan& plan, uint64_t* page_record) {
  __shared__ uint64_t id;
  const PagedSpan span{tier_base, page_bytes, page_record, plan.bytes};
  const ChunkShape shape = ChunkShapeOf(page_bytes);
  const uint64_t chunks = ChunksFor(plan.pages, shape);
  const uint64_t chunk_vectors = uint64_t{1} << (shape.chunk_shift - 4);
  const uint64_t chunk_bytes = uint64_t{1} << shape.chunk_shift;
  const bool src_aligned = Aligned16(src) && Aligned16(tier_base);
  const uint64_t head_index =
      threadIdx.x == 0 && ring.capacity > 0 ? plan.head % ring.capacity : 0;  // thread 0's
  for (uint64_t chunk = blockIdx.x; chunk < chunks; chunk += gridDim.x) {
    if (threadIdx.x == 0) {
      const uint64_t slot = chunk >> shape.chunks_shift;
      id = ring.ids[RingIndexAfter(head_index, slot, ring.capacity)];
      if ((chunk & ((uint64_t{1} << shape.chunks_shift) - 1)) == 0) page_record[slot] = id;
    }
    __syncthreads();
    const uint64_t begin = ChunkBegin(chunk, shape);
    if (src_aligned && begin + chunk_bytes <= plan.bytes) {
      const uint64_t in_page = begin & (page_bytes - 1);
      CopyChunk(reinterpret_cast<uint4*>(tier_base + (id << shape.page_shift) + in_page),
                reinterpret_cast<const uint4*>(src + begin), chunk_vectors);
    } else {
      for (uint64_t v = threadIdx.x; v < chunk_vectors; v += blockDim.x) {
        StashChunkVector(src, span, shape, begin, id, v);
      }
    }
    __syncthreads();  // nobody still reads `id` when thread 0 writes the next one
  }
}

// The pop kernel for a placed stash: its pages copied back into `dst` (null: a release, nothing
// copied), their ids returned at `ring`'s tail (a copy: ids go back through ring.ids only),
// and zeros over [plan.bytes, max_bytes) of dst when `zero_tail`.
__device__ __forceinline__ void PopChunks(uint8_t* dst, const PageRing ring, uint8_t* tier_base,
                                          uint64_t page_bytes, const StashPlan& plan,
                                          const uint64_t* page_record, uint64_t max_bytes,
                                          bool zero_tail) {
  __shared__ uint64_t id;
  const PagedSpan span{tier_base, page_bytes, const_cast<uint64_t*>(page_record), plan.bytes};
  const ChunkShape shape = ChunkShapeOf(page_bytes);
  const uint64_t chunks = ChunksFor(plan.pages, shape);
  const uint64_t chunk_vectors = uint64_t{1} << (shape.chunk_shift - 4);
  const uint64_t chunk_bytes = uint64_t{1} << shape.chunk_shift;
  const bool dst_aligned = Aligned16(dst) && Aligned16(tier_base);
  const uint64_t tail_index =
      threadIdx.x == 0 && ring.capacity > 0 ? ring.tail % ring.capacity : 0;  // thread 0's
  for (uint64_t chunk = blockIdx.x; chunk < chunks; chunk += gridDim.x) {
    if (threadIdx.x == 0) {
      const uint64_t slot = chunk >> shape.chunks_shift;
      id = page_record[slot];
      if ((chunk & ((uint64_t{1} << shape.chunks_shift) - 1)) == 0) {
        ring.ids[RingIndexAfter(tail_index, slot, ring.capacity)] = id;
      }
    }
    __syncthreads();
    if (dst != nullptr) {
      const uint64_t begin = ChunkBegin(chunk, shape);
      if (dst_aligned && begin + chunk_bytes <= plan.bytes) {
        const uint64_t in_page = begin & (page_bytes - 1);
        CopyChunk(reinterpret_cast<uint4*>(dst + begin),
                  reinterpret_cast<const uint4*>(tier_base + (id << shape.page_shift) + in_page),
                  chunk_vectors);
      } else {
        for (uint64_t v = threadIdx.x; v < chunk_vectors; v += blockDim.x) {
          PopChunkVector(dst, span, shape, begin, id, v);
        }
      }
    }
    __syncthreads();
  }
  if (zero_tail && dst != nullptr) {
    for (uint64_t v = (plan.bytes >> 4) + GlobalThread(); v < VectorsFor(max_bytes);
         v += GridThreads()) {
      ZeroTailVector(dst, plan.bytes, max_bytes, v);
    }
  }
}

// The pop kernel for a stash placed nowhere that overflowed while the caller kept its source:
// the kept rows (KeptBytes) copied to `dst` (nothing when it is the source), then zeros past
// them when `zero_tail`.
__device__ __forceinline__ void ReloadKeptSource(uint8_t* dst, const uint8_t* kept_src,
                                                 const StashPlan& plan, uint64_t max_rows,
                                                 uint64_t row_bytes, bool zero_tail) {
  const uint64_t kept = KeptBytes(plan, max_rows, row_bytes);
  if (kept_src != dst) {
    for (uint64_t v = GlobalThread(); v < VectorsFor(kept); v += GridThreads()) {
      KeptVector(dst, kept_src, kept, v);
    }
  }
  if (zero_tail) {
    const uint64_t max_bytes = max_rows * row_bytes;
    for (uint64_t v = (kept >> 4) + GlobalThread(); v < VectorsFor(max_bytes); v += GridThreads()) {
      ZeroTailVector(dst, kept, max_bytes, v);
    }
  }
}

}  // namespace stash::kernels

#endif  // STASH_KERNELS_PAGING_BLOCKS_CUH_
