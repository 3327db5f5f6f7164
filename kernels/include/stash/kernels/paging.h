// The paging rules of stashd, in one place for both machines (docs/design.md).
//
// Plain descriptors and STASH_HOST_DEVICE functions: g++ compiles them for the host backend and
// nvcc for the CUDA kernels, so the host tests pin exactly the semantics the GPU runs.
//
// The model (research/domain.md §2):
//  - A tier (a GPU pool or the host tier) is `capacity` pages of `page_bytes` bytes.
//  - Its free pages form a ring: `ids[capacity]` holds page ids; allocation reads ids at
//    (head + i) mod capacity and advances head; freeing writes ids at (tail + i) mod capacity and
//    advances tail. Free pages = tail - head. Head and tail are 64-bit and only grow.
//  - A stash of `bytes` bytes takes PagesFor(bytes) consecutive ring slots starting at the head
//    it saw; its page record remembers which page id holds each page slot of the stash.
//  - The copy reads the ring at a *snapshot* of the head. The new head is published only after
//    every worker of the copy has read the old one (upstream's in-place head race).
//  - Everything is 64-bit: production pools are 18-20 GiB per rank.
#ifndef STASH_KERNELS_PAGING_H_
#define STASH_KERNELS_PAGING_H_

#include <cstdint>
#include <cstring>

#include "stash/kernels/host_device.h"

#if defined(__x86_64__) && !defined(__CUDA_ARCH__)
#include <emmintrin.h>
#endif

namespace stash::kernels {

// A circular free list of page ids. Non-owning: `ids` points into memory the tier owns.
struct alignas(16) PageRing {
  uint64_t* ids;      // `capacity` page ids; a permutation of [0, capacity) at rest
  uint64_t capacity;  // pages in the tier; 0 = the tier does not exist
  uint64_t head;      // next slot to allocate from (monotonic)
  uint64_t tail;      // next slot to free into (monotonic); free pages = tail - head
};
static_assert(sizeof(PageRing) == 32, "PageRing is shared with device code");

// Where a stash goes. The numbers match stash.v1.Tier.
enum class Placement : uint32_t {
  kDevice = 1,        // the session's own pool
  kHost = 2,          // the host tier
  kOverflow = 3,      // nothing taken: no tier has the pages, or rows > max_rows
  kPeer = 4,          // mapped mode: chunks another device's pool lent to the session
  kInvalidCount = 5,  // the count read from memory was negative: a bad request, nothing taken
};

// The decision for one stash, made once (thread 0 on a GPU, the queue worker on the host).
struct alignas(16) StashPlan {
  Placement placement;
  uint32_t tier;   // PlanStashInOrder: the index of the chosen tier among those offered
  uint64_t rows;   // ceil(count / divisor) (also on overflow: what the count said); on
                   // kInvalidCount the count's own bits, so the answer can quote it
  uint64_t bytes;  // rows * row_bytes; 0 unless placed
  uint64_t pages;  // PagesFor(bytes); 0 unless placed
  uint64_t head;   // the chosen tier's head snapshot the copy reads page ids at
};
static_assert(sizeof(StashPlan) == 48, "StashPlan is shared with device code");

// One stash's bytes inside a tier.
struct alignas(16) PagedSpan {
  uint8_t* tier_base;     // first byte of page 0 of the tier
  uint64_t page_bytes;    // power of two
  uint64_t* page_record;  // PagesFor(bytes) entries: the page id holding each page slot
  uint64_t bytes;         // payload bytes of the stash
};
static_assert(sizeof(PagedSpan) == 32, "PagedSpan is shared with device code");

// Pages needed for `bytes` bytes (0 for 0 bytes).
STASH_HOST_DEVICE uint64_t PagesFor(uint64_t bytes, uint64_t page_bytes) {
  return (bytes + page_bytes - 1) / page_bytes;
}

// Free pages in a ring.
STASH_HOST_DEVICE uint64_t RingFree(const PageRing& ring) { return ring.tail - ring.head; }

// log2 of a power of two (page sizes are validated to be one): a shift replaces the 64-bit
// division, which a GPU runs as a long software sequence.
STASH_HOST_DEVICE uint32_t Log2(uint64_t power_of_two) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint32_t>(__ffsll(static_cast<long long>(power_of_two)) - 1);
#else
  return static_cast<uint32_t>(__builtin_ctzll(power_of_two));
#endif
}

// The index into ring.ids of ring slot `base + slot`, where `base_index` = base % capacity was
// computed once and slot < capacity: one conditional subtract instead of a modulo per page.
STASH_HOST_DEVICE uint64_t RingIndexAfter(uint64_t base_index, uint64_t slot, uint64_t capacity) {
  const uint64_t index = base_index + slot;
  return index >= capacity ? index - capacity : index;
}

// The page id at ring slot `head + slot` (any slot).
STASH_HOST_DEVICE uint64_t RingPageAt(const PageRing& ring, uint64_t head, uint64_t slot) {
  return ring.ids[(head + slot) % ring.capacity];
}

// Puts page id `id` back at ring slot `tail + slot` (any slot).
STASH_HOST_DEVICE void RingReturnAt(PageRing& ring, uint64_t tail, uint64_t slot, uint64_t id) {
  ring.ids[(tail + slot) % ring.capacity] = id;
}

// The page slot of byte `offset` of a stash, and the byte inside that page.
STASH_HOST_DEVICE uint64_t PageSlotOf(uint64_t offset, uint64_t page_bytes) {
  return offset >> Log2(page_bytes);
}
STASH_HOST_DEVICE uint64_t OffsetInPage(uint64_t offset, uint64_t page_bytes) {
  return offset & (page_bytes - 1);
}

// Address of byte `offset` of a stash whose page ids are in `span.page_record`.
STASH_HOST_DEVICE uint8_t* SpanByte(const PagedSpan& span, uint64_t offset) {
  const uint64_t id = span.page_record[PageSlotOf(offset, span.page_bytes)];
  return span.tier_base + id * span.page_bytes + OffsetInPage(offset, span.page_bytes);
}

// One tier a stash may go to, in the order PlanStashInOrder tries them.
struct TierChoice {
  const PageRing* ring;  // null: the tier is skipped
  Placement placement;   // what a stash placed there reports
};

// Decides where a stash goes, trying `tiers[0..n)` in order. `count` is the raw count (as read
// from memory), `divisor` 1 or 32 (0 means 1); rows = ceil(count / divisor). The first tier with
// the pages wins; else overflow. rows > max_rows is overflow: rows are compared, not pages, so an
// overrun inside the last page is caught too. Zero rows place a stash of 0 pages in the first
// tier offered (even one of capacity 0).
STASH_HOST_DEVICE StashPlan PlanStashInOrder(int64_t count, uint32_t divisor, uint64_t max_rows,
                                             uint64_t row_bytes, uint64_t page_bytes,
                                             const TierChoice* tiers, uint32_t n) {
  StashPlan plan{};
  if (count < 0) {
    plan.placement = Placement::kInvalidCount;
    plan.rows = static_cast<uint64_t>(count);
    return plan;
  }
  // ceil(count / divisor): a partial last block of a scale_inv (tokens 32..39 of 40) is a row.
  const uint64_t d = divisor == 0 ? 1u : divisor;
  plan.rows = (static_cast<uint64_t>(count) + d - 1) / d;
  plan.placement = Placement::kOverflow;
  if (plan.rows > max_rows) return plan;
  const uint64_t bytes = plan.rows * row_bytes;
  const uint64_t pages = PagesFor(bytes, page_bytes);
  for (uint32_t i = 0; i < n; ++i) {
    const PageRing* ring = tiers[i].ring;
    if (ring == nullptr || RingFree(*ring) < pages) continue;
    plan.placement = tiers[i].placement;
    plan.tier = i;
    plan.head = ring->head;
    plan.bytes = bytes;
    plan.pages = pages;
    return plan;
  }
  return plan;
}

// The daemon-copy decision: the own pool when it has the pages; else the host tier when `host`
// is non-null and has them; else overflow (PlanStashInOrder over those two). Zero rows place a
// stash of 0 pages in the own pool.
STASH_HOST_DEVICE StashPlan PlanStash(int64_t count, uint32_t divisor, uint64_t max_rows,
                                      uint64_t row_bytes, uint64_t page_bytes,
                                      const PageRing& device, const PageRing* host) {
  const TierChoice tiers[2] = {{&device, Placement::kDevice}, {host, Placement::kHost}};
  return PlanStashInOrder(count, divisor, max_rows, row_bytes, page_bytes, tiers, 2);
}

// Copies `n` bytes. On a GPU: 16-byte vectors while both sides are 16-byte aligned, then a byte
// loop for the ragged tail (and for everything when either side is unaligned). On the host: one
// memcpy, which handles any alignment with the C library's widest loop; or, with `streaming`
// (x86-64), non-temporal 16-byte stores that bypass the caches, for large copies whose
// destination nobody reads soon (StreamingCopy). The caller fences once after its copies.
STASH_HOST_DEVICE void CopyBytes(uint8_t* dst, const uint8_t* src, uint64_t n,
                                 bool streaming = false) {
#if defined(__CUDA_ARCH__)
  (void)streaming;
  const bool aligned =
      ((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & 15u) == 0;
  uint64_t done = 0;
  if (aligned) {
    const uint64_t vec_bytes = n & ~uint64_t{15};
    for (uint64_t i = 0; i < vec_bytes; i += 16) {
      *reinterpret_cast<uint4*>(dst + i) = *reinterpret_cast<const uint4*>(src + i);
    }
    done = vec_bytes;
  }
  for (uint64_t i = done; i < n; ++i) dst[i] = src[i];
#elif defined(__x86_64__)
  if (!streaming || n < 256) {
    if (n > 0) std::memcpy(dst, src, n);
    return;
  }
  // Up to the first 16-byte boundary of dst with memcpy, then 64 bytes per round.
  const uint64_t head = (16 - (reinterpret_cast<uintptr_t>(dst) & 15u)) & 15u;
  std::memcpy(dst, src, head);
  uint64_t i = head;
  for (; i + 64 <= n; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
  std::memcpy(dst + i, src + i, n - i);
#else
  (void)streaming;
  if (n > 0) std::memcpy(dst, src, n);
#endif
}

// Host copies of stashes this large stream (non-temporal stores): a page-sized memcpy never
// reaches the C library's own non-temporal path, which it takes only for one huge call, and a
// stash's pages are read again only at its reload (docs/benchmarks.md, section 1).
inline constexpr uint64_t kStreamingCopyBytes = 4ull << 20;
STASH_HOST_DEVICE bool StreamingCopy(uint64_t stash_bytes) {
  return stash_bytes >= kStreamingCopyBytes;
}

// Orders the non-temporal stores of streaming copies before what the caller publishes next
// (they are weakly ordered): each copying thread calls it once after its last CopyBytes.
STASH_HOST_DEVICE void FenceStreamingCopies() {
#if !defined(__CUDA_ARCH__) && defined(__x86_64__)
  _mm_sfence();
#endif
}

// Stash copy of page slots [first_slot, end_slot) of a stash planned at ring head `head`:
// records each slot's page id and copies that page's bytes from `src` (the stash's byte 0).
// Workers may split a stash by page slots; none of them moves the ring's head. Slots at or past
// PagesFor(span.bytes) are ignored, so a worker may be handed a range sized for the static max.
STASH_HOST_DEVICE void StashPages(const uint8_t* src, const PageRing& ring, uint64_t head,
                                  const PagedSpan& span, uint64_t first_slot, uint64_t end_slot) {
  const uint64_t head_index = ring.capacity > 0 ? head % ring.capacity : 0;
  for (uint64_t slot = first_slot; slot < end_slot && slot * span.page_bytes < span.bytes; ++slot) {
    const uint64_t id = ring.ids[RingIndexAfter(head_index, slot, ring.capacity)];
    span.page_record[slot] = id;
    const uint64_t begin = slot * span.page_bytes;
    const uint64_t end =
        begin + span.page_bytes < span.bytes ? begin + span.page_bytes : span.bytes;
    CopyBytes(span.tier_base + id * span.page_bytes, src + begin, end - begin,
              StreamingCopy(span.bytes));
  }
  FenceStreamingCopies();
}

// Reload copy of page slots [first_slot, end_slot) of a stash into `dst` (the stash's byte 0).
// Slots at or past PagesFor(span.bytes) are ignored.
STASH_HOST_DEVICE void PopPages(uint8_t* dst, const PagedSpan& span, uint64_t first_slot,
                                uint64_t end_slot) {
  for (uint64_t slot = first_slot; slot < end_slot && slot * span.page_bytes < span.bytes; ++slot) {
    const uint64_t begin = slot * span.page_bytes;
    const uint64_t end =
        begin + span.page_bytes < span.bytes ? begin + span.page_bytes : span.bytes;
    CopyBytes(dst + begin, span.tier_base + span.page_record[slot] * span.page_bytes, end - begin,
              StreamingCopy(span.bytes));
  }
  FenceStreamingCopies();
}

// Writes zeros to bytes [begin, end) of `dst` (the zero_tail of a reload).
STASH_HOST_DEVICE void ZeroBytes(uint8_t* dst, uint64_t begin, uint64_t end) {
#if defined(__CUDA_ARCH__)
  uint64_t i = begin;
  if ((reinterpret_cast<uintptr_t>(dst + i) & 15u) == 0) {
    for (; i + 16 <= end; i += 16) *reinterpret_cast<uint4*>(dst + i) = make_uint4(0, 0, 0, 0);
  }
  for (; i < end; ++i) dst[i] = 0;
#else
  if (end > begin) std::memset(dst + begin, 0, end - begin);
#endif
}

// The GPU's unit of copy: one 16-byte vector of a stash, bytes [offset, min(offset + 16, bytes)).
// page_bytes is a power of two >= 16, so a vector never straddles two pages.
inline constexpr uint64_t kVectorBytes = 16;

// Vectors covering `bytes` bytes (the last one ragged when bytes % 16 != 0).
STASH_HOST_DEVICE uint64_t VectorsFor(uint64_t bytes) {
  return (bytes + kVectorBytes - 1) / kVectorBytes;
}

// The GPU's unit of work: a chunk of one page slot of a stash. The kernels give each chunk to one
// thread block, whose first thread reads the slot's page id once (from the ring for a stash, from
// the page record for a reload) and whose threads then copy the chunk's vectors. A chunk is
// min(page_bytes, kChunkBytes) bytes; both are powers of two, so every index is a shift.
inline constexpr uint64_t kChunkBytes = 16384;

// The chunk geometry of a page size (a power of two >= 16).
struct ChunkShape {
  uint32_t page_shift;    // log2(page_bytes)
  uint32_t chunk_shift;   // log2(chunk bytes)
  uint32_t chunks_shift;  // log2(chunks per page) = page_shift - chunk_shift
};

STASH_HOST_DEVICE ChunkShape ChunkShapeOf(uint64_t page_bytes) {
  ChunkShape shape{};
  shape.page_shift = Log2(page_bytes);
  shape.chunk_shift = page_bytes < kChunkBytes ? shape.page_shift : Log2(kChunkBytes);
  shape.chunks_shift = shape.page_shift - shape.chunk_shift;
  return shape;
}

// Chunks covering `pages` page slots.
STASH_HOST_DEVICE uint64_t ChunksFor(uint64_t pages, const ChunkShape& shape) {
  return pages << shape.chunks_shift;
}

// The first stash byte of chunk `chunk` (of all the stash's chunks, in page-slot order).
STASH_HOST_DEVICE uint64_t ChunkBegin(uint64_t chunk, const ChunkShape& shape) {
  return chunk << shape.chunk_shift;
}

// Stash copy of vector `v` of the chunk starting at stash byte `chunk_begin`, into page `id`
// (the chunk's page slot's id; the kernel writes it to the page record once per slot). Vectors at
// or past span.bytes do nothing.
STASH_HOST_DEVICE void StashChunkVector(const uint8_t* src, const PagedSpan& span,
                                        const ChunkShape& shape, uint64_t chunk_begin, uint64_t id,
                                        uint64_t v) {
  const uint64_t begin = chunk_begin + (v << 4);
  if (begin >= span.bytes) return;
  const uint64_t n = span.bytes - begin < kVectorBytes ? span.bytes - begin : kVectorBytes;
  const uint64_t in_page = begin & (span.page_bytes - 1);
  CopyBytes(span.tier_base + (id << shape.page_shift) + in_page, src + begin, n);
}

// Reload copy of vector `v` of the chunk starting at stash byte `chunk_begin` from page `id` (the
// chunk's page slot's id in the page record). Vectors at or past span.bytes do nothing.
STASH_HOST_DEVICE void PopChunkVector(uint8_t* dst, const PagedSpan& span, const ChunkShape& shape,
                                      uint64_t chunk_begin, uint64_t id, uint64_t v) {
  const uint64_t begin = chunk_begin + (v << 4);
  if (begin >= span.bytes) return;
  const uint64_t n = span.bytes - begin < kVectorBytes ? span.bytes - begin : kVectorBytes;
  const uint64_t in_page = begin & (span.page_bytes - 1);
  CopyBytes(dst + begin, span.tier_base + (id << shape.page_shift) + in_page, n);
}

// Vector `v` of the zero tail of a reload: the part of bytes [16 v, 16 v + 16) that lies in
// [bytes, max_bytes). The GPU hands out v from bytes / 16 on; a ragged first vector zeroes only
// its part past the stash, which PopChunkVector never writes.
STASH_HOST_DEVICE void ZeroTailVector(uint8_t* dst, uint64_t bytes, uint64_t max_bytes,
                                      uint64_t v) {
  const uint64_t begin = v << 4;
  const uint64_t zero_begin = begin > bytes ? begin : bytes;
  const uint64_t zero_end = begin + kVectorBytes < max_bytes ? begin + kVectorBytes : max_bytes;
  if (zero_begin < zero_end) ZeroBytes(dst, zero_begin, zero_end);
}

// A reload of a stash that overflowed, whose source the rank kept (mapped mode on a GPU): a
// reload captured in a CUDA graph runs at every replay whatever that replay's plan said, so it
// copies the kept source's valid prefix instead of pages: min(rows, max_rows) rows (a count past
// the buffer names no more rows than it holds). 0 unless the plan is kOverflow.
STASH_HOST_DEVICE uint64_t KeptBytes(const StashPlan& plan, uint64_t max_rows, uint64_t row_bytes) {
  if (plan.placement != Placement::kOverflow) return 0;
  return (plan.rows < max_rows ? plan.rows : max_rows) * row_bytes;
}

// Vector `v` of a kept-source copy: bytes [16 v, min(16 v + 16, bytes)) from `src` to `dst`.
// Vectors at or past `bytes` do nothing.
STASH_HOST_DEVICE void KeptVector(uint8_t* dst, const uint8_t* src, uint64_t bytes, uint64_t v) {
  const uint64_t begin = v << 4;
  if (begin >= bytes) return;
  const uint64_t n = bytes - begin < kVectorBytes ? bytes - begin : kVectorBytes;
  CopyBytes(dst + begin, src + begin, n);
}

// Returns a stash's pages to the ring at slots [tail, tail + pages), in page-slot order. The
// caller publishes tail += pages afterwards.
STASH_HOST_DEVICE void ReturnPages(PageRing& ring, uint64_t tail, const uint64_t* page_record,
                                   uint64_t first_slot, uint64_t end_slot) {
  for (uint64_t slot = first_slot; slot < end_slot; ++slot) {
    RingReturnAt(ring, tail, slot, page_record[slot]);
  }
}

}  // namespace stash::kernels

#endif  // STASH_KERNELS_PAGING_H_
