// The paging rules of kernels/include/stash/kernels/paging.h on the host, byte for byte
// (docs/design.md). Every stash is checked against an independent model of where its bytes must
// go (TierHolds), which does not call paging.h.
#include "stash/kernels/paging.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "paging_harness.h"

namespace stash::kernels::test {
namespace {

// What RunCase saw, for a test's own checks after the shared ones.
struct CaseResult {
  std::unique_ptr<PreparedCase> p;
  StashPlan plan{};
  std::vector<uint64_t> device_ids_before;
  std::vector<uint64_t> device_free_ids_before;  // sorted
  PageRing device_before{};
  PageRing host_before{};
};

const HostTier* TierOf(const CaseResult& r, Placement placement) {
  if (placement == Placement::kDevice) return r.p->device.get();
  if (placement == Placement::kHost) return r.p->host.get();
  return nullptr;
}

// Stash (in `slices` workers) and reload one case, checking every invariant of docs/design.md
// against the independent reference: placement and plan fields; the chosen tier holds the stash
// in the pages at its head slots and every other byte of both tiers is unchanged (the unused
// tail of the last page too); heads move by the pages only in the chosen tier; the page record
// names the ring's ids in slot order and nothing past them; the reload restores the prefix
// exactly, zeroes exactly the tail when asked and touches nothing else; the pages come back at
// the tail in slot order, so the free window holds the same set of ids as before the stash (a
// permutation of all ids when every page was free).
void RunCase(const PagingCase& c, int slices, std::mt19937_64& rng, CaseResult* r) {
  SCOPED_TRACE("case " + c.name);
  r->p = Prepare(c, rng);
  PreparedCase& p = *r->p;
  if (!Mapped(p)) GTEST_SKIP() << "cannot map the tiers of case " << c.name;
  HostTier& device = *p.device;
  HostTier* host = p.host_or_null();
  const std::vector<uint64_t> host_ids_before = host ? host->ids() : std::vector<uint64_t>{};
  const std::vector<uint64_t> host_free_ids_before =
      host ? FreeIds(*host) : std::vector<uint64_t>{};
  r->device_ids_before = device.ids();
  r->device_free_ids_before = FreeIds(device);
  r->device_before = device.ring();
  r->host_before = host ? host->ring() : PageRing{};

  const StashPlan plan =
      HostStash(p.src, c.geometry, c.page_bytes, device, host, p.record.data(), slices);
  r->plan = plan;
  ASSERT_EQ(plan.placement, c.expected);
  const uint32_t divisor = c.geometry.divisor == 0 ? 1 : c.geometry.divisor;
  const bool placed = plan.placement == Placement::kDevice || plan.placement == Placement::kHost;
  // A negative count keeps its own bits in rows, so the daemon's answer can quote it.
  const uint64_t rows = c.geometry.count < 0
                            ? static_cast<uint64_t>(c.geometry.count)
                            : (static_cast<uint64_t>(c.geometry.count) + divisor - 1) / divisor;
  EXPECT_EQ(plan.rows, rows);
  EXPECT_EQ(plan.bytes, placed ? rows * c.geometry.row_bytes : 0);
  EXPECT_EQ(plan.pages, placed ? NeededPages(c) : 0);
  const bool on_device = plan.placement == Placement::kDevice;
  const bool on_host = plan.placement == Placement::kHost;
  if (placed) {
    EXPECT_EQ(plan.head, on_device ? r->device_before.head : r->host_before.head);
  }

  // The tiers: the stash in its pages, the pattern everywhere else.
  EXPECT_TRUE(TierHolds(device, r->device_ids_before, r->device_before.head,
                        on_device ? p.src : nullptr, on_device ? plan.bytes : 0));
  if (host) {
    EXPECT_TRUE(TierHolds(*host, host_ids_before, r->host_before.head, on_host ? p.src : nullptr,
                          on_host ? plan.bytes : 0));
    EXPECT_EQ(host->ids(), host_ids_before);
    EXPECT_EQ(host->ring().head, r->host_before.head + (on_host ? plan.pages : 0));
    EXPECT_EQ(host->ring().tail, r->host_before.tail);
  }
  EXPECT_EQ(device.ids(), r->device_ids_before);
  EXPECT_EQ(device.ring().head, r->device_before.head + (on_device ? plan.pages : 0));
  EXPECT_EQ(device.ring().tail, r->device_before.tail);

  // The page record: slot s holds the id at ring slot head + s; nothing past the stash.
  const std::vector<uint64_t>& ids_before = on_host ? host_ids_before : r->device_ids_before;
  for (uint64_t s = 0; s < p.record.size(); ++s) {
    if (s < plan.pages) {
      EXPECT_EQ(p.record[s], ids_before[(plan.head + s) % ids_before.size()]) << "slot " << s;
    } else {
      EXPECT_EQ(p.record[s], kUnwrittenRecord) << "slot " << s;
    }
  }

  HostReload(p.dst, plan, c.geometry, c.page_bytes, device, host, p.record.data(), c.zero_tail);

  // The destination: the prefix, then zeros or the old bytes, and nothing outside it touched.
  const uint64_t max_bytes = c.geometry.max_bytes();
  for (uint8_t* b = p.dst_buffer.data(); b < p.dst; ++b) ASSERT_EQ(*b, kUntouchedDst);
  for (uint64_t i = 0; i < max_bytes; ++i) {
    uint8_t want = kUntouchedDst;
    if (placed && i < plan.bytes) {
      want = p.src[i];
    } else if (placed && c.zero_tail) {
      want = 0;
    }
    ASSERT_EQ(p.dst[i], want) << "destination byte " << i;
  }
  for (uint8_t* b = p.dst + max_bytes; b < p.dst_buffer.data() + p.dst_buffer.size(); ++b) {
    ASSERT_EQ(*b, kUntouchedDst);
  }

  // The rings after the reload: pages back at the tail, in slot order; heads where the stash
  // left them; free counts as before the stash; still permutations.
  HostTier* tier = PlacedTier(plan, device, host);
  if (tier != nullptr) {
    const PageRing& before = on_device ? r->device_before : r->host_before;
    EXPECT_EQ(tier->ring().tail, before.tail + plan.pages);
    EXPECT_EQ(tier->ring().head, before.head + plan.pages);
    for (uint64_t s = 0; s < plan.pages; ++s) {
      EXPECT_EQ(tier->ids()[(before.tail + s) % tier->capacity()], p.record[s]) << "slot " << s;
    }
  }
  EXPECT_EQ(RingFree(device.ring()), c.device_free);
  EXPECT_EQ(FreeIds(device), r->device_free_ids_before);
  if (c.device_free == c.device_pages) {
    EXPECT_TRUE(RingIsPermutation(device));
  }
  if (host) {
    EXPECT_EQ(RingFree(host->ring()), c.host_free);
    EXPECT_EQ(FreeIds(*host), host_free_ids_before);
    if (c.host_free == c.host_pages) {
      EXPECT_TRUE(RingIsPermutation(*host));
    }
  }
  // A reload reads the pages; it never writes a tier.
  EXPECT_TRUE(TierHolds(device, r->device_ids_before, r->device_before.head,
                        on_device ? p.src : nullptr, on_device ? plan.bytes : 0));
}

// Runs the named case of the matrix; the caller returns when it skipped.
#define STASH_RUN_CASE(name, slices, rng, result)                              \
  ASSERT_NO_FATAL_FAILURE(RunCase(FindPagingCase(name), slices, rng, result)); \
  if (IsSkipped()) return

TEST(Paging, PagesForRoundsUpToWholePages) {
  EXPECT_EQ(PagesFor(0, 256), 0u);
  EXPECT_EQ(PagesFor(1, 256), 1u);
  EXPECT_EQ(PagesFor(256, 256), 1u);
  EXPECT_EQ(PagesFor(257, 256), 2u);
  EXPECT_EQ(PagesFor(uint64_t{5} << 32, 1 << 16), uint64_t{5} << 16);
}

TEST(Paging, SinglePageStashTakesThePageAtTheHead) {
  STASH_SEEDED_RNG(rng);
  CaseResult r;
  STASH_RUN_CASE("single_page", 1, rng, &r);
  EXPECT_EQ(r.plan.pages, 1u);
  EXPECT_EQ(r.plan.bytes, 256u);
  EXPECT_EQ(r.p->record[0], r.device_ids_before[r.device_before.head % 8]);
}

TEST(Paging, RaggedTailCopiesOnlyTheStashBytes) {
  STASH_SEEDED_RNG(rng);
  CaseResult r;
  STASH_RUN_CASE("ragged_tail", 1, rng, &r);
  EXPECT_EQ(r.plan.bytes, 700u);  // not a multiple of 16 nor of the 256-byte page
  EXPECT_EQ(r.plan.pages, 3u);
}

TEST(Paging, RingWrapAroundTakesSlotsModuloCapacity) {
  STASH_SEEDED_RNG(rng);
  CaseResult r;
  STASH_RUN_CASE("ring_wrap_around", 1, rng, &r);
  ASSERT_EQ(r.plan.pages, 5u);
  const uint64_t slots[] = {14, 15, 0, 1, 2};
  for (uint64_t s = 0; s < 5; ++s) EXPECT_EQ(r.p->record[s], r.device_ids_before[slots[s]]);
}

TEST(Paging, PermutedFreeListMapsEachSlotToItsRingId) {
  STASH_SEEDED_RNG(rng);
  CaseResult r;
  STASH_RUN_CASE("permuted_free_list", 1, rng, &r);
  std::vector<uint64_t> identity(r.device_ids_before.size());
  std::iota(identity.begin(), identity.end(), uint64_t{0});
  EXPECT_NE(r.device_ids_before, identity) << "the free list must be shuffled to find mapping bugs";
  EXPECT_EQ(r.plan.pages, 57u);
}

TEST(Paging, SpillsWholeStashToHostTierWhenDeviceHasOnePageTooFew) {
  STASH_SEEDED_RNG(rng);
  CaseResult r;
  STASH_RUN_CASE("host_spill", 1, rng, &r);
  EXPECT_EQ(r.plan.pages, 4u);
  EXPECT_EQ(r.plan.head, r.host_before.head);
  EXPECT_EQ(TierOf(r, r.plan.placement), r.p->host.get());
}

TEST(Paging, DeviceWinsWhenItHasExactlyThePages) {
  STASH_SEEDED_RNG(rng);
  CaseResult r;
  STASH_RUN_CASE("device_exact_fit", 1, rng, &r);
  EXPECT_EQ(r.plan.pages, 4u);
  EXPECT_EQ(r.plan.pages, RingFree(r.device_before));  // took every free device page
}

TEST(Paging, OverflowWhenNeitherTierFitsTakesNothing) {
  STASH_SEEDED_RNG(rng);
  CaseResult r;
  STASH_RUN_CASE("overflow", 1, rng, &r);
  EXPECT_EQ(r.plan.rows, 60u);  // what the count said
  EXPECT_EQ(r.plan.pages, 0u);
}

TEST(Paging, OverflowWithoutHostTierOrWithAnEmptyOne) {
  STASH_SEEDED_RNG(rng);
  CaseResult none;
  STASH_RUN_CASE("overflow_without_host_tier", 1, rng, &none);
  CaseResult empty;
  STASH_RUN_CASE("overflow_with_empty_host_tier", 1, rng, &empty);
}

TEST(Paging, ZeroCountPlacesAnEmptyStashEvenWithNoFreePage) {
  STASH_SEEDED_RNG(rng);
  CaseResult r;
  STASH_RUN_CASE("zero_count", 1, rng, &r);
  EXPECT_EQ(r.plan.pages, 0u);
  EXPECT_EQ(r.plan.bytes, 0u);
  EXPECT_EQ(r.plan.head, r.device_before.head);
}

TEST(Paging, OverflowWhenRowsExceedMaxRowsEvenIfPagesFit) {
  // Upstream: a 128-token buffer of 64-token pages (2 pages free), max 65 tokens, runtime 66
  // tokens. 66 rows need 2 pages, which are free; the rows, not the pages, must decide.
  const uint64_t page_bytes = 64 * 32;
  std::vector<uint64_t> ids = {1, 0};
  const PageRing device{ids.data(), 2, 0, 2};
  const PageRing host{ids.data(), 2, 0, 2};
  const StashPlan plan = PlanStash(66, 1, 65, 32, page_bytes, device, &host);
  EXPECT_EQ(plan.placement, Placement::kOverflow);
  EXPECT_EQ(plan.rows, 66u);
  EXPECT_EQ(plan.pages, 0u);
  EXPECT_EQ(plan.bytes, 0u);

  STASH_SEEDED_RNG(rng);
  CaseResult r;
  STASH_RUN_CASE("count_over_max_rows", 1, rng, &r);
  EXPECT_EQ(r.p->device->ring().head, 0u);
  EXPECT_EQ(r.p->device->ring().tail, 2u);
}

TEST(Paging, CountEqualToMaxRowsFits) {
  STASH_SEEDED_RNG(rng);
  CaseResult r;
  STASH_RUN_CASE("count_at_max_rows", 1, rng, &r);
  EXPECT_EQ(r.plan.pages, 2u);
}

TEST(Paging, DivisorThirtyTwoRoundsTheCountUpBeforePlanning) {
  STASH_SEEDED_RNG(rng);
  CaseResult r;
  STASH_RUN_CASE("divisor_32", 1, rng, &r);
  EXPECT_EQ(r.plan.rows, 11u);  // ceil(351 / 32): the partial last block keeps its row
  EXPECT_EQ(r.plan.bytes, 11u * 96);

  // 12 * 32 tokens are exactly max_rows; one more token starts a 13th block, past it.
  std::vector<uint64_t> ids(64);
  std::iota(ids.begin(), ids.end(), uint64_t{0});
  const PageRing device{ids.data(), 64, 0, 64};
  EXPECT_EQ(PlanStash(12 * 32, 32, 12, 96, 256, device, nullptr).placement, Placement::kDevice);
  EXPECT_EQ(PlanStash(12 * 32 + 1, 32, 12, 96, 256, device, nullptr).placement,
            Placement::kOverflow);
}

TEST(Paging, DivisorZeroMeansOne) {
  std::vector<uint64_t> ids(64);
  std::iota(ids.begin(), ids.end(), uint64_t{0});
  const PageRing device{ids.data(), 64, 0, 64};
  const StashPlan zero = PlanStash(40, 0, 64, 16, 256, device, nullptr);
  const StashPlan one = PlanStash(40, 1, 64, 16, 256, device, nullptr);
  EXPECT_EQ(zero.rows, 40u);
  EXPECT_EQ(zero.bytes, one.bytes);
  EXPECT_EQ(zero.pages, one.pages);
}

TEST(Paging, NegativeCountIsInvalidAndTakesNothing) {
  STASH_SEEDED_RNG(rng);
  CaseResult r;
  STASH_RUN_CASE("negative_count", 1, rng, &r);
  EXPECT_EQ(static_cast<int64_t>(r.plan.rows), -5);  // the count, for the error message
  EXPECT_EQ(r.plan.bytes, 0u);
  EXPECT_EQ(r.plan.pages, 0u);

  std::vector<uint64_t> ids(4, 0);
  const PageRing device{ids.data(), 4, 0, 4};
  EXPECT_EQ(
      PlanStash(std::numeric_limits<int64_t>::min(), 1, 8, 16, 256, device, nullptr).placement,
      Placement::kInvalidCount);
}

TEST(Paging, OffsetsPastFourGiBCopyExactly) {
  STASH_SEEDED_RNG(rng);
  CaseResult r;
  STASH_RUN_CASE("offsets_past_4gib", 1, rng, &r);
  ASSERT_EQ(r.plan.pages, 5u);
  EXPECT_GT(r.plan.head, uint64_t{1} << 32);
  for (uint64_t s = 0; s < r.plan.pages; ++s) {
    EXPECT_GT(r.p->record[s] * r.p->c.page_bytes, uint64_t{1} << 32) << "slot " << s;
  }
}

TEST(Paging, ZeroTailZerosFromTheStashEndToMaxRowsOnly) {
  STASH_SEEDED_RNG(rng);
  CaseResult r;
  STASH_RUN_CASE("zero_tail", 1, rng, &r);
  // RunCase checked [0, 1200) = source, [1200, 1524) = 0 and the guards; spell out the edges.
  EXPECT_EQ(r.plan.bytes, 1200u);
  EXPECT_EQ(r.p->dst[1200], 0);
  EXPECT_EQ(r.p->dst[1523], 0);
  EXPECT_EQ(r.p->dst[1524], kUntouchedDst);
}

TEST(Paging, ReloadWithoutZeroTailLeavesTheDestinationTail) {
  STASH_SEEDED_RNG(rng);
  CaseResult r;
  STASH_RUN_CASE("ragged_tail", 1, rng, &r);
  EXPECT_EQ(r.p->dst[700], kUntouchedDst);
  EXPECT_EQ(r.p->dst[895], kUntouchedDst);
}

TEST(Paging, UnalignedSourceAndDestinationCopyExactly) {
  STASH_SEEDED_RNG(rng);
  for (uint64_t misalign = 1; misalign < 16; ++misalign) {
    PagingCase c = FindPagingCase("unaligned_source_and_destination");
    c.src_misalign = misalign;
    c.dst_misalign = 16 - misalign;
    SCOPED_TRACE(::testing::Message() << "source misaligned by " << misalign);
    CaseResult r;
    ASSERT_NO_FATAL_FAILURE(RunCase(c, 1, rng, &r));
    ASSERT_EQ(reinterpret_cast<uintptr_t>(r.p->src) % 16, misalign);
  }
}

TEST(Paging, SlicedStashWritesTheSameBytesAsOneSlice) {
  STASH_SEEDED_RNG(rng);
  const PagingCase c = FindPagingCase("permuted_free_list");
  std::mt19937_64 same = rng;
  std::unique_ptr<PreparedCase> one = Prepare(c, rng);
  const StashPlan one_plan =
      HostStash(one->src, c.geometry, c.page_bytes, *one->device, nullptr, one->record.data(), 1);
  ASSERT_EQ(one_plan.pages, 57u);
  for (int slices : {2, 3, 7, 57, 64}) {
    SCOPED_TRACE(::testing::Message() << slices << " slices");
    std::mt19937_64 replay = same;
    std::unique_ptr<PreparedCase> many = Prepare(c, replay);
    const StashPlan plan = HostStash(many->src, c.geometry, c.page_bytes, *many->device, nullptr,
                                     many->record.data(), slices);
    EXPECT_EQ(plan.pages, one_plan.pages);
    EXPECT_EQ(many->record, one->record);
    EXPECT_EQ(many->device->ring().head, one->device->ring().head);
    EXPECT_EQ(std::memcmp(many->device->base(), one->device->base(), one->device->bytes()), 0);
  }
}

TEST(Paging, SlotsPastTheStashAreIgnored) {
  STASH_SEEDED_RNG(rng);
  const PagingCase c = FindPagingCase("ragged_tail");
  std::unique_ptr<PreparedCase> p = Prepare(c, rng);
  HostTier& device = *p->device;
  const std::vector<uint64_t> ids = device.ids();
  // A worker handed slots sized for the static maximum (6 pages) while the stash has 3.
  const PagedSpan span{device.base(), c.page_bytes, p->record.data(), 700};
  StashPages(p->src, device.ring(), device.ring().head, span, 3, 6);
  for (uint64_t entry : p->record) EXPECT_EQ(entry, kUnwrittenRecord);
  EXPECT_TRUE(TierHolds(device, ids, device.ring().head, nullptr, 0));
  StashPages(p->src, device.ring(), device.ring().head, span, 0, 6);
  EXPECT_EQ(p->record[3], kUnwrittenRecord);
  EXPECT_TRUE(TierHolds(device, ids, device.ring().head, p->src, 700));
  PopPages(p->dst, span, 0, 6);
  EXPECT_EQ(std::memcmp(p->dst, p->src, 700), 0);
  EXPECT_EQ(p->dst[700], kUntouchedDst);
}

TEST(Paging, StashPagesDoesNotMoveTheHead) {
  STASH_SEEDED_RNG(rng);
  const PagingCase c = FindPagingCase("permuted_free_list");
  std::unique_ptr<PreparedCase> p = Prepare(c, rng);
  const PageRing before = p->device->ring();
  const PagedSpan span{p->device->base(), c.page_bytes, p->record.data(), 300 * 48};
  StashPages(p->src, p->device->ring(), before.head, span, 0, 57);
  EXPECT_EQ(p->device->ring().head, before.head);
  EXPECT_EQ(p->device->ring().tail, before.tail);
}

// The GPU copy kernel gives each chunk of a page to a thread block in no particular order: the
// block's first thread reads the page id once (from the ring at slot head + slot, wrapped by a
// subtract) and its threads copy the chunk's vectors in no particular order. The same bytes and
// page record as the per-page host loops, for pages smaller and larger than a chunk.
TEST(Paging, PerChunkCopyMatchesPerPageCopy) {
  STASH_SEEDED_RNG(rng);
  for (const char* name : {"ragged_tail", "permuted_free_list", "unaligned_source_and_destination",
                           "ring_wrap_around", "tiny_last_page", "large_pages"}) {
    SCOPED_TRACE(name);
    const PagingCase c = FindPagingCase(name);
    std::mt19937_64 replay = rng;
    std::unique_ptr<PreparedCase> pages = Prepare(c, rng);
    std::unique_ptr<PreparedCase> chunks = Prepare(c, replay);
    const uint64_t bytes = static_cast<uint64_t>(c.geometry.count) * c.geometry.row_bytes;
    const uint64_t n_pages = PagesFor(bytes, c.page_bytes);
    const uint64_t head = pages->device->ring().head;
    const PagedSpan page_span{pages->device->base(), c.page_bytes, pages->record.data(), bytes};
    const PagedSpan chunk_span{chunks->device->base(), c.page_bytes, chunks->record.data(), bytes};
    StashPages(pages->src, pages->device->ring(), head, page_span, 0, n_pages);

    const ChunkShape shape = ChunkShapeOf(c.page_bytes);
    const uint64_t chunk_vectors = (uint64_t{1} << shape.chunk_shift) / kVectorBytes;
    std::vector<uint64_t> chunk_order(ChunksFor(n_pages, shape));
    std::iota(chunk_order.begin(), chunk_order.end(), uint64_t{0});
    std::vector<uint64_t> vector_order(chunk_vectors);
    std::iota(vector_order.begin(), vector_order.end(), uint64_t{0});
    const PageRing& ring = chunks->device->ring();
    const uint64_t head_index = head % ring.capacity;
    std::shuffle(chunk_order.begin(), chunk_order.end(), rng);
    for (uint64_t chunk : chunk_order) {
      const uint64_t slot = chunk >> shape.chunks_shift;
      const uint64_t id = ring.ids[RingIndexAfter(head_index, slot, ring.capacity)];
      if ((chunk & ((uint64_t{1} << shape.chunks_shift) - 1)) == 0)
        chunk_span.page_record[slot] = id;
      std::shuffle(vector_order.begin(), vector_order.end(), rng);
      for (uint64_t v : vector_order) {
        StashChunkVector(chunks->src, chunk_span, shape, ChunkBegin(chunk, shape), id, v);
      }
    }
    EXPECT_EQ(chunks->record, pages->record);
    EXPECT_EQ(std::memcmp(chunks->device->base(), pages->device->base(), pages->device->bytes()),
              0);

    PopPages(pages->dst, page_span, 0, n_pages);
    std::shuffle(chunk_order.begin(), chunk_order.end(), rng);
    for (uint64_t chunk : chunk_order) {
      const uint64_t id = chunk_span.page_record[chunk >> shape.chunks_shift];
      std::shuffle(vector_order.begin(), vector_order.end(), rng);
      for (uint64_t v : vector_order) {
        PopChunkVector(chunks->dst, chunk_span, shape, ChunkBegin(chunk, shape), id, v);
      }
    }
    // The whole destination window, the 64 guard bytes past max_bytes included.
    EXPECT_EQ(std::memcmp(chunks->dst, pages->dst, c.geometry.max_bytes() + 64), 0);
    EXPECT_EQ(std::memcmp(chunks->dst, chunks->src, bytes), 0);
  }
}

// The GPU reload kernel: per chunk in no particular order, the first thread reads the page id
// from the page record and the first chunk of a page returns it at ring slot tail + slot; then
// the zero tail per vector from bytes / 16 on. The same destination bytes (zero tail included),
// the same ring ids and tail as the per-page host loops, and for a release (no destination) the
// same returned pages.
TEST(Paging, PerChunkReloadMatchesPerPageReload) {
  STASH_SEEDED_RNG(rng);
  for (const char* name :
       {"ragged_tail", "zero_tail", "unaligned_source_and_destination", "ring_wrap_around",
        "zero_count", "host_spill", "overflow", "tiny_last_page", "large_pages"}) {
    for (bool release : {false, true}) {
      SCOPED_TRACE(::testing::Message() << name << (release ? " release" : " reload"));
      const PagingCase c = FindPagingCase(name);
      std::mt19937_64 replay = rng;
      std::unique_ptr<PreparedCase> pages = Prepare(c, rng);
      std::unique_ptr<PreparedCase> chunks = Prepare(c, replay);
      const StashPlan plan = HostStash(pages->src, c.geometry, c.page_bytes, *pages->device,
                                       pages->host_or_null(), pages->record.data());
      const StashPlan same = HostStash(chunks->src, c.geometry, c.page_bytes, *chunks->device,
                                       chunks->host_or_null(), chunks->record.data());
      ASSERT_EQ(same.pages, plan.pages);
      HostReload(release ? nullptr : pages->dst, plan, c.geometry, c.page_bytes, *pages->device,
                 pages->host_or_null(), pages->record.data(), c.zero_tail);

      HostTier* tier = PlacedTier(plan, *chunks->device, chunks->host_or_null());
      if (tier != nullptr) {
        uint8_t* dst = release ? nullptr : chunks->dst;
        const PagedSpan span{tier->base(), c.page_bytes, chunks->record.data(), plan.bytes};
        const uint64_t max_bytes = c.geometry.max_bytes();
        PageRing& ring = tier->ring();
        const uint64_t tail_index = ring.tail % ring.capacity;
        const ChunkShape shape = ChunkShapeOf(c.page_bytes);
        std::vector<uint64_t> chunk_order(ChunksFor(plan.pages, shape));
        std::iota(chunk_order.begin(), chunk_order.end(), uint64_t{0});
        std::shuffle(chunk_order.begin(), chunk_order.end(), rng);
        std::vector<uint64_t> vector_order((uint64_t{1} << shape.chunk_shift) / kVectorBytes);
        std::iota(vector_order.begin(), vector_order.end(), uint64_t{0});
        for (uint64_t chunk : chunk_order) {
          const uint64_t slot = chunk >> shape.chunks_shift;
          const uint64_t id = span.page_record[slot];
          if ((chunk & ((uint64_t{1} << shape.chunks_shift) - 1)) == 0) {
            ring.ids[RingIndexAfter(tail_index, slot, ring.capacity)] = id;
          }
          if (dst == nullptr) continue;
          std::shuffle(vector_order.begin(), vector_order.end(), rng);
          for (uint64_t v : vector_order) {
            PopChunkVector(dst, span, shape, ChunkBegin(chunk, shape), id, v);
          }
        }
        if (c.zero_tail && dst != nullptr) {
          std::vector<uint64_t> tail_order;
          for (uint64_t v = plan.bytes / kVectorBytes; v < VectorsFor(max_bytes); ++v) {
            tail_order.push_back(v);
          }
          std::shuffle(tail_order.begin(), tail_order.end(), rng);
          for (uint64_t v : tail_order) ZeroTailVector(dst, plan.bytes, max_bytes, v);
        }
        ring.tail += plan.pages;
      }
      EXPECT_EQ(std::memcmp(chunks->dst - c.dst_misalign, pages->dst - c.dst_misalign,
                            c.dst_misalign + c.geometry.max_bytes() + 64),
                0);
      EXPECT_EQ(chunks->device->ids(), pages->device->ids());
      EXPECT_EQ(chunks->device->ring().tail, pages->device->ring().tail);
      if (pages->host) {
        EXPECT_EQ(chunks->host->ids(), pages->host->ids());
        EXPECT_EQ(chunks->host->ring().tail, pages->host->ring().tail);
      }
    }
  }
}

// log2, ring wrap and page slot by shifts: the same answers as division and modulo.
TEST(Paging, ShiftsAndConditionalWrapMatchDivisionAndModulo) {
  for (uint32_t shift = 4; shift < 40; ++shift) {
    const uint64_t page = uint64_t{1} << shift;
    EXPECT_EQ(Log2(page), shift);
    for (uint64_t offset : {uint64_t{0}, page - 1, page, 3 * page + 5, (uint64_t{1} << 45) + 17}) {
      EXPECT_EQ(PageSlotOf(offset, page), offset / page) << offset << " / " << page;
    }
  }
  for (uint64_t capacity : {uint64_t{1}, uint64_t{7}, uint64_t{4096}}) {
    for (uint64_t head : {uint64_t{0}, capacity - 1, 5 * capacity + 3, (uint64_t{1} << 62) + 3}) {
      for (uint64_t slot = 0; slot < capacity; ++slot) {
        ASSERT_EQ(RingIndexAfter(head % capacity, slot, capacity), (head + slot) % capacity)
            << "capacity " << capacity << " head " << head << " slot " << slot;
      }
    }
  }
}

// Stashes and reloads interleaved in random order (as pipeline schedules do), some spilling,
// some overflowing: every reload returns the stash's bytes, and at rest every page is free
// again and each ring is still a permutation of all ids.
TEST(Paging, StashPopRoundTripReturnsEveryPage) {
  STASH_SEEDED_RNG(rng);
  const uint64_t page_bytes = 128;
  HostTier device(48, page_bytes);
  HostTier host(32, page_bytes);
  device.Permute(rng);
  host.Permute(rng);
  struct Live {
    std::vector<uint8_t> src;
    StashGeometry geometry;
    StashPlan plan;
    std::vector<uint64_t> record;
  };
  std::vector<Live> live;
  int placed_on_host = 0;
  int overflowed = 0;
  for (int step = 0; step < 400; ++step) {
    const bool stash = live.empty() || (live.size() < 12 && rng() % 3 != 0);
    if (stash) {
      Live s;
      s.geometry.row_bytes = 1 + rng() % 64;
      s.geometry.max_rows = 1 + rng() % 128;
      s.geometry.count = static_cast<int64_t>(rng() % (s.geometry.max_rows + 1));
      s.src = RandomBytes(s.geometry.max_bytes(), rng);
      s.record.assign(PagesFor(s.geometry.max_bytes(), page_bytes), kUnwrittenRecord);
      s.plan = HostStash(s.src.data(), s.geometry, page_bytes, device, &host, s.record.data(),
                         1 + static_cast<int>(rng() % 3));
      if (s.plan.placement == Placement::kHost) ++placed_on_host;
      if (s.plan.placement == Placement::kOverflow) {
        ++overflowed;
        continue;
      }
      ASSERT_TRUE(s.plan.placement == Placement::kDevice || s.plan.placement == Placement::kHost);
      live.push_back(std::move(s));
    } else {
      const size_t pick = rng() % live.size();
      Live s = std::move(live[pick]);
      live.erase(live.begin() + static_cast<int64_t>(pick));
      std::vector<uint8_t> dst(s.geometry.max_bytes(), kUntouchedDst);
      HostReload(dst.data(), s.plan, s.geometry, page_bytes, device, &host, s.record.data(), true);
      ASSERT_EQ(std::memcmp(dst.data(), s.src.data(), s.plan.bytes), 0) << "step " << step;
      for (uint64_t i = s.plan.bytes; i < dst.size(); ++i) ASSERT_EQ(dst[i], 0);
    }
    ASSERT_LE(RingFree(device.ring()), device.capacity());
    ASSERT_LE(RingFree(host.ring()), host.capacity());
  }
  for (Live& s : live) {  // release the rest without reloading
    HostReload(nullptr, s.plan, s.geometry, page_bytes, device, &host, s.record.data(), false);
  }
  EXPECT_EQ(RingFree(device.ring()), device.capacity());
  EXPECT_EQ(RingFree(host.ring()), host.capacity());
  EXPECT_TRUE(RingIsPermutation(device));
  EXPECT_TRUE(RingIsPermutation(host));
  EXPECT_GT(placed_on_host, 0) << "the schedule never spilled; make the device tier smaller";
  EXPECT_GT(overflowed, 0) << "the schedule never overflowed; make the tiers smaller";
}

// A second stash writes only its own pages: every byte of every other page, including the
// first stash's pages and the unused tail of its own last page, keeps what it held.
TEST(Paging, NothingOutsideOwnedPagesChanges) {
  STASH_SEEDED_RNG(rng);
  const uint64_t page_bytes = 256;
  HostTier device(40, page_bytes);
  device.Permute(rng);
  device.Park(rng() % 1000, 40);
  device.FillPattern();
  const StashGeometry first{77, 1, 80, 13};
  const std::vector<uint8_t> first_src = RandomBytes(first.max_bytes(), rng);
  std::vector<uint64_t> first_record(PagesFor(first.max_bytes(), page_bytes));
  const StashPlan first_plan =
      HostStash(first_src.data(), first, page_bytes, device, nullptr, first_record.data());
  ASSERT_EQ(first_plan.placement, Placement::kDevice);

  const std::vector<uint8_t> before(device.base(), device.base() + device.bytes());
  const StashGeometry second{201, 1, 240, 19};  // 3819 bytes: 15 pages, 235 in the last
  const std::vector<uint8_t> second_src = RandomBytes(second.max_bytes(), rng);
  std::vector<uint64_t> record(PagesFor(second.max_bytes(), page_bytes));
  const StashPlan plan =
      HostStash(second_src.data(), second, page_bytes, device, nullptr, record.data());
  ASSERT_EQ(plan.placement, Placement::kDevice);
  std::vector<int64_t> slot_of_page(device.capacity(), -1);
  for (uint64_t s = 0; s < plan.pages; ++s) slot_of_page[record[s]] = static_cast<int64_t>(s);
  for (uint64_t page = 0; page < device.capacity(); ++page) {
    for (uint64_t i = 0; i < page_bytes; ++i) {
      const uint64_t offset = page * page_bytes + i;
      const int64_t slot = slot_of_page[page];
      const uint64_t stash_offset = static_cast<uint64_t>(slot) * page_bytes + i;
      const uint8_t want =
          slot >= 0 && stash_offset < plan.bytes ? second_src[stash_offset] : before[offset];
      ASSERT_EQ(device.base()[offset], want) << "page " << page << " byte " << i;
    }
  }
}

TEST(Paging, CopyBytesCopiesEveryLengthAtEveryAlignment) {
  STASH_SEEDED_RNG(rng);
  const std::vector<uint8_t> src = RandomBytes(160, rng);
  std::vector<uint8_t> dst(160);
  const uint64_t src_fix = AlignUp16(src.data());
  const uint64_t dst_fix = AlignUp16(dst.data());
  for (uint64_t src_off = 0; src_off < 16; ++src_off) {
    for (uint64_t dst_off = 0; dst_off < 16; ++dst_off) {
      for (uint64_t n = 0; n <= 70; ++n) {
        std::fill(dst.begin(), dst.end(), kUntouchedDst);
        uint8_t* d = dst.data() + dst_fix + dst_off;
        CopyBytes(d, src.data() + src_fix + src_off, n);
        for (uint8_t* b = dst.data(); b < dst.data() + dst.size(); ++b) {
          const auto i = static_cast<uint64_t>(b - d);
          const bool inside = b >= d && i < n;
          ASSERT_EQ(*b, inside ? src[src_fix + src_off + i] : kUntouchedDst)
              << "src+" << src_off << " dst+" << dst_off << " n=" << n;
        }
      }
    }
  }
}

TEST(Paging, ZeroBytesWritesOnlyTheRange) {
  std::vector<uint8_t> dst(96, kUntouchedDst);
  ZeroBytes(dst.data(), 5, 77);
  for (uint64_t i = 0; i < dst.size(); ++i) {
    EXPECT_EQ(dst[i], i >= 5 && i < 77 ? 0 : kUntouchedDst) << "byte " << i;
  }
  ZeroBytes(dst.data(), 90, 90);  // empty
  ZeroBytes(dst.data(), 91, 90);  // inverted: nothing
  EXPECT_EQ(dst[90], kUntouchedDst);
}

// A reload of an overflowed stash whose source the rank kept copies min(rows, max_rows) rows of
// that source, vector by vector, whatever the alignment; placed stashes and bad counts keep none.
TEST(KeptSource, AnOverflowedStashesReloadCopiesTheKeptRowsVectorByVector) {
  const uint64_t row_bytes = 7;  // ragged vectors
  const uint64_t max_rows = 11;
  StashPlan plan{};
  plan.placement = Placement::kOverflow;
  plan.rows = 5;
  EXPECT_EQ(KeptBytes(plan, max_rows, row_bytes), 35u);
  plan.rows = 40;  // a count past the buffer: no more rows than it holds
  EXPECT_EQ(KeptBytes(plan, max_rows, row_bytes), 77u);
  plan.placement = Placement::kDevice;
  EXPECT_EQ(KeptBytes(plan, max_rows, row_bytes), 0u);
  plan.placement = Placement::kInvalidCount;
  EXPECT_EQ(KeptBytes(plan, max_rows, row_bytes), 0u);

  std::vector<uint8_t> src(100);
  std::iota(src.begin(), src.end(), 1);
  for (uint64_t shift : {0, 1, 9}) {  // unaligned sources and destinations
    std::vector<uint8_t> dst(100, kUntouchedDst);
    const uint64_t bytes = 35;
    for (uint64_t v = 0; v < VectorsFor(bytes) + 2; ++v) {  // extra vectors do nothing
      KeptVector(dst.data() + shift, src.data() + shift, bytes, v);
    }
    for (uint64_t i = 0; i < dst.size(); ++i) {
      const bool kept = i >= shift && i < shift + bytes;
      EXPECT_EQ(dst[i], kept ? src[i] : kUntouchedDst) << "byte " << i << " shift " << shift;
    }
  }
}

// Every case of the matrix, also run by tests/gpu against the CUDA kernels.
class PagingMatrix : public ::testing::TestWithParam<PagingCase> {};

TEST_P(PagingMatrix, StashThenReloadMatchesTheReference) {
  STASH_SEEDED_RNG(rng);
  CaseResult r;
  ASSERT_NO_FATAL_FAILURE(RunCase(GetParam(), 1, rng, &r));
}

TEST_P(PagingMatrix, StashInThreeSlicesThenReloadMatchesTheReference) {
  STASH_SEEDED_RNG(rng);
  CaseResult r;
  ASSERT_NO_FATAL_FAILURE(RunCase(GetParam(), 3, rng, &r));
}

INSTANTIATE_TEST_SUITE_P(AllCases, PagingMatrix, ::testing::ValuesIn(PagingCases()),
                         [](const ::testing::TestParamInfo<PagingCase>& param_info) {
                           return param_info.param.name;
                         });

}  // namespace
}  // namespace stash::kernels::test
