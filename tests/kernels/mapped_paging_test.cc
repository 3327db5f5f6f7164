// Mapped mode's stream kernels (kernels/include/stash/kernels/mapped_paging.h) on the host: the
// one-thread bodies and the copy/pop kernels' serial twins, which the driver stand-in runs for
// the client's stream copier and tests/gpu compares the fatbin's kernels against.
#include "stash/kernels/mapped_paging.h"

#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

namespace stash::kernels {
namespace {

constexpr uint64_t kPageBytes = 64;
constexpr uint64_t kPagesPerChunk = 4;

// A session's device state, in host memory: three tiers of `slots` chunk slots each, rings
// empty until chunks are added.
struct Session {
  struct Tier {
    std::vector<uint64_t> ids;
    std::vector<uint8_t> bytes;
    PageRing ring{};
  };
  std::array<Tier, kLeaseTiers> tiers;
  SessionControl control{};
  CopierState state{};
  uint64_t host_step_flags = 0;  // the host-visible word (MappedSessionView.d_step_flags)
  MappedSessionView view{};

  explicit Session(uint64_t slots, bool allow_host = true) {
    for (uint32_t t = 0; t < kLeaseTiers; ++t) {
      Tier& tier = tiers[t];
      tier.ids.assign(slots * kPagesPerChunk, 0);
      tier.bytes.assign(slots * kPagesPerChunk * kPageBytes, 0);
      tier.ring = PageRing{tier.ids.data(), slots * kPagesPerChunk, 0, 0};
      view.tiers[t] = LeaseTierView{&tier.ring, tier.bytes.data()};
    }
    view.d_control = &control;
    view.d_state = &state;
    view.d_step_flags = &host_step_flags;
    view.page_bytes = kPageBytes;
    view.allow_host = allow_host ? 1 : 0;
  }
  // Leases chunk slot `slot` of `tier`: its pages join the ring.
  void AddChunk(uint32_t tier, uint64_t slot) {
    MappedRingArgs a{view, tier, 0, slot * kPagesPerChunk, kPagesPerChunk, nullptr};
    AddMappedPages(a);
  }
  bool RemoveChunk(uint32_t tier, uint64_t slot) {
    uint64_t result = 7;
    MappedRingArgs a{view, tier, 0, slot * kPagesPerChunk, kPagesPerChunk, &result};
    RemoveMappedChunk(a);
    EXPECT_NE(result, 7u);
    return result == 1;
  }
};

// One stash: its plan and page record live as long as the test keeps it.
struct Stashed {
  StashPlan plan{};
  std::vector<uint64_t> record;
  std::vector<uint8_t> data;
  uint64_t max_rows = 0, row_bytes = 0;
};

Stashed Stash(Session& s, std::vector<uint8_t> data, uint64_t rows, uint64_t max_rows,
              uint64_t row_bytes, bool keep_source = true, uint32_t live_entry = kNoLiveEntry,
              uint64_t ticket = 1) {
  Stashed st;
  st.data = std::move(data);
  st.max_rows = max_rows;
  st.row_bytes = row_bytes;
  st.record.assign(PagesFor(max_rows * row_bytes, kPageBytes) + 1, ~uint64_t{0});
  MappedStashArgs a{};
  a.session = s.view;
  a.d_src = st.data.data();
  a.count = static_cast<int64_t>(rows);
  a.max_rows = max_rows;
  a.row_bytes = row_bytes;
  a.divisor = 1;
  a.keep_source = keep_source ? 1 : 0;
  a.d_plan = &st.plan;
  a.d_page_record = st.record.data();
  a.ticket = ticket;
  a.live_entry = live_entry;
  st.plan = ConsumedPlan();  // a fresh plan slot
  PlanMappedStashSlot(a);    // the plan kernel
  MappedStashCopySerial(a);  // the copy kernel
  PublishMappedStash(a);     // the publish kernel
  return st;
}

// Reloads (dst non-null) or releases `st`; `kept` is the source the rank kept.
void Reload(Session& s, Stashed& st, uint8_t* dst, bool zero_tail, const uint8_t* kept = nullptr,
            uint32_t live_entry = kNoLiveEntry) {
  MappedReloadArgs a{};
  a.session = s.view;
  a.d_dst = dst;
  a.d_kept_src = kept;
  a.d_plan = &st.plan;
  a.d_page_record = st.record.data();
  a.max_rows = st.max_rows;
  a.row_bytes = st.row_bytes;
  a.zero_tail = zero_tail ? 1 : 0;
  a.live_entry = live_entry;
  MappedReloadPopSerial(a);
  PublishMappedReload(a);
}

std::vector<uint8_t> Random(std::mt19937_64& rng, uint64_t n) {
  std::vector<uint8_t> v(n);
  for (uint8_t& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

TEST(MappedPaging, StashesFillTheDeviceThenThePeerThenTheHostThenOverflow) {
  std::mt19937_64 rng(1);
  Session s(2);
  s.AddChunk(kLeaseDevice, 0);
  s.AddChunk(kLeasePeer, 1);  // a peer chunk in slot 1: its ids are 4..7
  s.AddChunk(kLeaseHost, 0);
  EXPECT_EQ(s.control.tiers[kLeaseDevice].pages_leased, kPagesPerChunk);
  const uint64_t row_bytes = 32;  // two rows a page
  std::vector<Stashed> stashes;
  for (int i = 0; i < 4; ++i) stashes.push_back(Stash(s, Random(rng, 256), 8, 8, row_bytes));
  EXPECT_EQ(stashes[0].plan.placement, Placement::kDevice);
  EXPECT_EQ(stashes[1].plan.placement, Placement::kPeer);
  EXPECT_EQ(stashes[1].record[0], 4u);  // page ids of slot 1
  EXPECT_EQ(stashes[2].plan.placement, Placement::kHost);
  EXPECT_EQ(stashes[3].plan.placement, Placement::kOverflow);
  EXPECT_EQ(s.control.spills, 2u);
  EXPECT_EQ(s.control.overflows, 1u);
  EXPECT_EQ(s.control.step_flags, kStepOverflow | kStepSpilled);
  EXPECT_GE(s.state.outgrown, 1u);  // the lease is short: the host side asks for more
  for (int i = 0; i < 3; ++i) {
    std::vector<uint8_t> back(256, 0xEE);
    Reload(s, stashes[i], back.data(), false);
    EXPECT_EQ(back, stashes[i].data) << "stash " << i;
  }
  for (uint32_t t = 0; t < kLeaseTiers; ++t) {
    EXPECT_EQ(s.control.tiers[t].pages_used, 0u);
    EXPECT_EQ(RingFree(s.tiers[t].ring), kPagesPerChunk);
  }
  EXPECT_EQ(s.control.reloads, 3u);
}

TEST(MappedPaging, WithoutHostSpillAFullLeaseOverflows) {
  std::mt19937_64 rng(2);
  Session s(1, /*allow_host=*/false);
  s.AddChunk(kLeaseHost, 0);
  Stashed st = Stash(s, Random(rng, 64), 1, 1, 64);
  EXPECT_EQ(st.plan.placement, Placement::kOverflow);
}

TEST(MappedPaging, AReloadOfAnOverflowedStashCopiesTheKeptSourceAndZeroesTheTail) {
  std::mt19937_64 rng(3);
  Session s(1);  // nothing leased: every stash overflows
  const uint64_t row_bytes = 10, max_rows = 9;
  const std::vector<uint8_t> src = Random(rng, max_rows * row_bytes);
  Stashed st = Stash(s, src, 5, max_rows, row_bytes);
  ASSERT_EQ(st.plan.placement, Placement::kOverflow);
  std::vector<uint8_t> dst(max_rows * row_bytes, 0xEE);
  Reload(s, st, dst.data(), /*zero_tail=*/true, src.data());
  for (uint64_t i = 0; i < dst.size(); ++i) {
    EXPECT_EQ(dst[i], i < 50 ? src[i] : 0) << "byte " << i;
  }
  EXPECT_EQ(s.control.reloads, 0u);  // nothing came back from a tier
  // Without a kept source, the destination stays as it is (daemon-copy's behaviour).
  std::vector<uint8_t> untouched(max_rows * row_bytes, 0xEE);
  Reload(s, st, untouched.data(), true);
  EXPECT_EQ(untouched, std::vector<uint8_t>(max_rows * row_bytes, 0xEE));
}

TEST(MappedPaging, WhileTheDaemonDrainsAStashIsUntriedUnflaggedAndReloadsFromTheKeptSource) {
  std::mt19937_64 rng(4);
  Session s(1);
  s.AddChunk(kLeaseDevice, 0);
  s.control.daemon_flags = kDaemonDraining;
  const std::vector<uint8_t> src = Random(rng, 64);
  Stashed st = Stash(s, src, 2, 2, 32);
  EXPECT_EQ(st.plan.placement, Placement::kOverflow);
  EXPECT_EQ(st.plan.tier, kUntriedTier);
  EXPECT_EQ(s.control.overflows, 0u);
  EXPECT_EQ(s.control.step_flags, 0u);
  EXPECT_EQ(s.control.step_stashes, 0u);
  std::vector<uint8_t> dst(64, 0);
  Reload(s, st, dst.data(), false, src.data());
  EXPECT_EQ(dst, src);
  // A caller that freed its source is placed as usual: untried would lose the activation.
  Stashed freed = Stash(s, src, 2, 2, 32, /*keep_source=*/false);
  EXPECT_EQ(freed.plan.placement, Placement::kDevice);
  EXPECT_EQ(s.control.step_flags, 0u);
  std::vector<uint8_t> back(64, 0);
  Reload(s, freed, back.data(), false);
  EXPECT_EQ(back, src);
}

TEST(MappedPaging, ANegativeCountTakesNothingAndFlagsTheStep) {
  Session s(1);
  s.AddChunk(kLeaseDevice, 0);
  std::vector<uint8_t> src(64);
  Stashed st;
  st.record.assign(2, 0);
  MappedStashArgs a{};
  a.session = s.view;
  a.d_src = src.data();
  a.count = -3;
  a.max_rows = 2;
  a.row_bytes = 32;
  a.d_plan = &st.plan;
  a.d_page_record = st.record.data();
  st.plan = PlanMappedStash(a);
  MappedStashCopySerial(a);
  PublishMappedStash(a);
  EXPECT_EQ(st.plan.placement, Placement::kInvalidCount);
  EXPECT_EQ(s.control.rejected, 1u);
  EXPECT_EQ(s.control.step_flags, kStepOverflow);
  EXPECT_EQ(RingFree(s.tiers[kLeaseDevice].ring), kPagesPerChunk);
}

// A graph replays a stash and its reload as they were captured. A reload replayed twice (its
// stash not replayed in between) returns no page twice; a stash replayed before its reload
// ran returns the pages its slot held instead of leaking them. Both flag the step.
TEST(MappedPaging, APlanSlotIsConsumedOnceSoReplaysOutOfTurnNeitherLeakNorDuplicatePages) {
  std::mt19937_64 rng(8);
  Session s(1);
  s.AddChunk(kLeaseDevice, 0);
  Stashed st = Stash(s, Random(rng, 128), 2, 2, 64);  // 2 pages
  ASSERT_EQ(st.plan.placement, Placement::kDevice);
  std::vector<uint8_t> dst(128, 0);
  Reload(s, st, dst.data(), false);
  EXPECT_EQ(dst, st.data);
  EXPECT_EQ(RingFree(s.tiers[kLeaseDevice].ring), kPagesPerChunk);
  EXPECT_EQ(s.control.step_flags, 0u);
  EXPECT_EQ(ReportedFlags(s.host_step_flags), 0u);
  std::vector<uint8_t> again(128, 0xEE);
  Reload(s, st, again.data(), false);  // the reload replayed without its stash
  EXPECT_EQ(again, std::vector<uint8_t>(128, 0xEE));
  EXPECT_EQ(RingFree(s.tiers[kLeaseDevice].ring), kPagesPerChunk);  // no page twice
  EXPECT_EQ(s.control.step_flags, kStepOverflow);
  EXPECT_EQ(ReportedFlags(s.host_step_flags), kStepOverflow) << "the host sees it at once";
  EXPECT_EQ(s.control.rejected, 1u);

  // The stash replayed twice before its reload: the first replay's pages come back.
  MappedStashArgs a{};
  a.session = s.view;
  a.d_src = st.data.data();
  a.count = 2;
  a.max_rows = 2;
  a.row_bytes = 64;
  a.keep_source = 1;
  a.d_plan = &st.plan;
  a.d_page_record = st.record.data();
  for (int replay = 0; replay < 3; ++replay) {
    PlanMappedStashSlot(a);
    MappedStashCopySerial(a);
    PublishMappedStash(a);
    EXPECT_EQ(RingFree(s.tiers[kLeaseDevice].ring), kPagesPerChunk - 2) << "replay " << replay;
  }
  EXPECT_EQ(s.control.tiers[kLeaseDevice].pages_used, 2u);
  EXPECT_EQ(s.control.tiers[kLeaseDevice].stashes_live, 1u);
  Reload(s, st, dst.data(), false);
  EXPECT_EQ(dst, st.data);
  EXPECT_EQ(RingFree(s.tiers[kLeaseDevice].ring), kPagesPerChunk);
}

// The live-stash table's numbers (client/mapped/live_table.h has the tags): a stash's publish
// writes its ticket, bytes and pages into its entry, its reload's publish clears them; a stash
// placed nowhere writes ticket 0; a reload of a consumed slot (its entry may be another stash's by
// then) and an entry past the table write nothing, nor does a session without a table.
TEST(MappedPaging, ALiveEntryHoldsWhatItsStashHoldsUntilItsReload) {
  std::mt19937_64 rng(11);
  Session s(1, /*allow_host=*/false);
  s.AddChunk(kLeaseDevice, 0);
  struct Block {
    LiveTable table;
    uint64_t after[sizeof(LiveEntry) / sizeof(uint64_t)];  // where an entry past it would be
  };
  auto block = std::make_unique<Block>();
  std::memset(block->after, 0x5a, sizeof(block->after));
  LiveTable* const table = &block->table;
  LiveTable* attached = nullptr;  // the host-visible word: no block attached yet
  s.view.d_live = &attached;
  Stashed unseen = Stash(s, Random(rng, 64), 1, 1, 64, true, 0, 5);
  EXPECT_EQ(table->entries[0].ticket, 0u) << "no table attached: nothing written";
  Reload(s, unseen, nullptr, false, nullptr, 0);

  attached = table;
  Stashed st = Stash(s, Random(rng, 128), 2, 2, 64, true, 3, 11);
  ASSERT_EQ(st.plan.placement, Placement::kDevice);
  const LiveEntry& e = table->entries[3];
  EXPECT_EQ(e.ticket, 11u);
  EXPECT_EQ(e.bytes, 128u);
  EXPECT_EQ(e.pages, 2u);
  table->entries[4].ticket = 77;  // as a stash before it left it
  Stashed big = Stash(s, Random(rng, 64 * 64), 64, 64, 64, true, 4, 12);  // past the lease
  ASSERT_EQ(big.plan.placement, Placement::kOverflow);
  EXPECT_EQ(table->entries[4].ticket, 0u) << "a stash placed nowhere holds no entry";
  Stash(s, Random(rng, 64), 1, 1, 64, true, kLiveEntries, 13);  // past the table: ignored
  for (uint64_t word : block->after) ASSERT_EQ(word, 0x5a5a5a5a5a5a5a5aull);

  std::vector<uint8_t> dst(128, 0);
  Reload(s, st, dst.data(), false, nullptr, 3);
  EXPECT_EQ(dst, st.data);
  EXPECT_EQ(e.ticket, 0u);
  EXPECT_EQ(e.bytes, 0u);
  EXPECT_EQ(e.pages, 0u);
  table->entries[3].ticket = 99;                 // the entry's next stash
  Reload(s, st, dst.data(), false, nullptr, 3);  // the reload replayed: its slot is consumed
  EXPECT_EQ(table->entries[3].ticket, 99u);
  EXPECT_EQ(s.control.step_flags, kStepOverflow);
}

TEST(MappedPaging, AChunkLeavesItsRingOnlyWhenNoStashHoldsItsPages) {
  std::mt19937_64 rng(5);
  Session s(3);
  s.AddChunk(kLeaseDevice, 0);
  s.AddChunk(kLeaseDevice, 2);
  Stashed st = Stash(s, Random(rng, 64), 1, 1, 64);  // takes page 0 (chunk 0)
  EXPECT_FALSE(s.RemoveChunk(kLeaseDevice, 0));
  EXPECT_EQ(s.control.tiers[kLeaseDevice].pages_leased, 2 * kPagesPerChunk);
  EXPECT_TRUE(s.RemoveChunk(kLeaseDevice, 2));
  EXPECT_EQ(s.control.tiers[kLeaseDevice].pages_leased, kPagesPerChunk);
  EXPECT_EQ(RingFree(s.tiers[kLeaseDevice].ring), kPagesPerChunk - 1);
  for (uint64_t i = 0; i < RingFree(s.tiers[kLeaseDevice].ring); ++i) {
    EXPECT_LT(RingPageAt(s.tiers[kLeaseDevice].ring, s.tiers[kLeaseDevice].ring.head, i),
              kPagesPerChunk);
  }
  std::vector<uint8_t> back(64);
  Reload(s, st, back.data(), false);
  EXPECT_EQ(back, st.data);
  EXPECT_TRUE(s.RemoveChunk(kLeaseDevice, 0));
  EXPECT_EQ(RingFree(s.tiers[kLeaseDevice].ring), 0u);
  EXPECT_FALSE(s.RemoveChunk(kLeaseDevice, 1));  // never leased
  EXPECT_FALSE(s.RemoveChunk(9, 0));             // no such tier: nothing changes
}

TEST(MappedPaging, AStepPublishesTheRankFieldsAndTakesTheDaemonsLineBack) {
  std::mt19937_64 rng(6);
  Session s(1);
  s.AddChunk(kLeaseDevice, 0);
  Stashed st = Stash(s, Random(rng, 512), 8, 8, 64);  // 8 pages: overflows
  ASSERT_EQ(st.plan.placement, Placement::kOverflow);
  SessionControl shared{};
  shared.magic = kControlMagic;
  shared.version = kControlVersion;
  shared.daemon_flags = kDaemonDraining;
  shared.return_request = 3;
  shared.return_target_pages[kLeaseHost] = 12;
  StepReport report{};
  SessionControl* const shared_cell = &shared;
  MappedStepArgs a{s.view, 41, &shared_cell, &report};
  MappedStep(a);
  EXPECT_EQ(ReportedStep(report.step_and_flags), 41u);
  EXPECT_EQ(ReportedFlags(report.step_and_flags), kStepOverflow);
  EXPECT_EQ(shared.magic, kControlMagic);  // the daemon's fields stay
  EXPECT_EQ(shared.daemon_flags, kDaemonDraining);
  EXPECT_EQ(shared.step, 41u);  // the rank's come over
  EXPECT_EQ(shared.steps, 1u);
  EXPECT_EQ(shared.overflows, 1u);
  EXPECT_EQ(shared.last_step_demand_high_water, 8u);
  EXPECT_EQ(shared.tiers[kLeaseDevice].pages_leased, kPagesPerChunk);
  EXPECT_EQ(s.control.daemon_flags, kDaemonDraining);  // and the daemon's line comes back
  EXPECT_EQ(s.control.return_request, 3u);
  EXPECT_EQ(s.control.return_target_pages[kLeaseHost], 12u);
  EXPECT_EQ(s.control.step_flags, 0u);
}

TEST(MappedPaging, APublishedBlockKeepsTheHostSidesFieldsAndIsReadWholeOrNotAtAll) {
  Session s(1);
  SessionControl shared{};
  shared.attached = kControlMagic;
  shared.return_done = 5;
  s.control.stashes = 3;
  s.control.attached = 0;
  PublishControl(s.control, shared);
  EXPECT_EQ(shared.stashes, 3u);
  EXPECT_EQ(shared.attached, kControlMagic);  // the rank's host side set these
  EXPECT_EQ(shared.return_done, 5u);
  EXPECT_EQ(shared.publish_seq, 2u);  // even: stable
  SessionControl snapshot{};
  EXPECT_TRUE(ReadPublishedControl(shared, &snapshot));
  EXPECT_EQ(snapshot.stashes, 3u);
  shared.publish_seq = 3;  // mid-write
  EXPECT_FALSE(ReadPublishedControl(shared, &snapshot));
  PublishControl(s.control, shared);  // from an odd count (a writer that died mid-write)
  EXPECT_EQ(shared.publish_seq, 6u);

  // A writer publishing blocks whose fields agree with each other, a reader checking every
  // snapshot it takes: never a mix of two blocks.
  PublishControl(SessionControl{}, shared);  // k = 0: every field agrees
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    SessionControl c{};
    for (uint64_t k = 1; !stop.load(std::memory_order_relaxed); ++k) {
      c.stashes = k;
      c.reloads = k;
      c.bytes_stashed = 3 * k;
      c.tiers[kLeaseHost].pages_used = k;
      PublishControl(c, shared);
      if (k % 4 == 0) std::this_thread::yield();  // now and then a stable block
    }
  });
  uint64_t whole = 0, torn = 0;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (whole < 20000 && std::chrono::steady_clock::now() < give_up) {
    if (!ReadPublishedControl(shared, &snapshot)) continue;
    ++whole;
    torn += snapshot.reloads != snapshot.stashes ||
                    snapshot.bytes_stashed != 3 * snapshot.stashes ||
                    snapshot.tiers[kLeaseHost].pages_used != snapshot.stashes
                ? 1
                : 0;
  }
  stop = true;
  writer.join();
  EXPECT_EQ(torn, 0u) << "of " << whole << " snapshots";
  EXPECT_GT(whole, 0u);
}

// A random stream over three tiers with chunks coming and going: every reload is byte-exact,
// every page is in exactly one place (a ring's free window or one live stash), and the control
// block's live counts match the stashes held.
TEST(MappedPaging, ARandomStreamWithLeaseChangesIsByteExactAndLosesNoPage) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const uint64_t slots = 4;
  Session s(slots);
  std::array<std::vector<bool>, kLeaseTiers> leased;
  for (auto& l : leased) l.assign(slots, false);
  std::map<int, Stashed> live;
  int next = 0;
  int removals = 0;
  for (int op = 0; op < 3000; ++op) {
    SCOPED_TRACE("operation " + std::to_string(op));
    // Fewer stashes than reloads, so the lease empties now and then and chunks can leave.
    const int what = static_cast<int>(rng() % 12);
    if (what < 4) {
      const uint64_t max_rows = 1 + rng() % 12, row_bytes = 1 + rng() % 40;
      const uint64_t rows = rng() % (max_rows + 1);
      live.emplace(next++, Stash(s, Random(rng, max_rows * row_bytes), rows, max_rows, row_bytes));
    } else if (what < 9 && !live.empty()) {
      auto it = std::next(live.begin(), static_cast<std::ptrdiff_t>(rng() % live.size()));
      Stashed& st = it->second;
      const StashPlan plan = st.plan;  // the reload consumes it
      const uint64_t bytes = st.max_rows * st.row_bytes;
      std::vector<uint8_t> dst(bytes, 0xEE);
      const bool release = what == 8;
      Reload(s, st, release ? nullptr : dst.data(), !release, st.data.data());
      EXPECT_EQ(st.plan.tier, kConsumedTier);
      if (!release && plan.placement != Placement::kInvalidCount) {
        const uint64_t valid = plan.placement == Placement::kOverflow
                                   ? KeptBytes(plan, st.max_rows, st.row_bytes)
                                   : plan.bytes;
        for (uint64_t i = 0; i < bytes; ++i) {
          ASSERT_EQ(dst[i], i < valid ? st.data[i] : 0) << "byte " << i;
        }
      }
      live.erase(it);
    } else if (what == 9) {  // a chunk comes
      const uint32_t t = static_cast<uint32_t>(rng() % kLeaseTiers);
      const uint64_t slot = rng() % slots;
      if (!leased[t][slot]) {
        s.AddChunk(t, slot);
        leased[t][slot] = true;
      }
    } else if (what == 10) {  // a chunk goes, when free
      const uint32_t t = static_cast<uint32_t>(rng() % kLeaseTiers);
      const uint64_t slot = rng() % slots;
      bool held = false;
      for (const auto& [id, st] : live) {
        if (st.plan.tier != t || PlacedLeaseTier(s.view, st.plan).d_ring == nullptr) continue;
        for (uint64_t p = 0; p < st.plan.pages; ++p) {
          held |= st.record[p] / kPagesPerChunk == slot;
        }
      }
      const bool removed = s.RemoveChunk(t, slot);
      EXPECT_EQ(removed, leased[t][slot] && !held);
      if (removed) leased[t][slot] = false;
      removals += removed ? 1 : 0;
    } else {
      MappedStepArgs a{s.view, static_cast<uint64_t>(op), nullptr, nullptr};
      MappedStep(a);
    }
    // Conservation: each leased page once, free or held.
    for (uint32_t t = 0; t < kLeaseTiers; ++t) {
      std::vector<int> seen(slots * kPagesPerChunk, 0);
      const PageRing& ring = s.tiers[t].ring;
      for (uint64_t i = 0; i < RingFree(ring); ++i) ++seen[RingPageAt(ring, ring.head, i)];
      uint64_t held_pages = 0, held_stashes = 0;
      for (const auto& [id, st] : live) {
        if (PlacedLeaseTier(s.view, st.plan).d_ring != &s.tiers[t].ring) continue;
        ++held_stashes;
        held_pages += st.plan.pages;
        for (uint64_t p = 0; p < st.plan.pages; ++p) ++seen[st.record[p]];
      }
      for (uint64_t id = 0; id < seen.size(); ++id) {
        ASSERT_EQ(seen[id], leased[t][id / kPagesPerChunk] ? 1 : 0)
            << "tier " << t << " page " << id;
      }
      ASSERT_EQ(s.control.tiers[t].pages_used, held_pages);
      ASSERT_EQ(s.control.tiers[t].stashes_live, held_stashes);
    }
  }
  EXPECT_GT(removals, 20);  // the stream did take chunks out
}

}  // namespace
}  // namespace stash::kernels
