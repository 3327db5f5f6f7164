// The data path end to end: the real stashd, the real client library, real processes.
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "common/socket_probe.h"
#include "stash/client.h"
#include "stash/v1/stash.grpc.pb.h"
#include "tests/integration/daemon_stats.h"
#include "tests/integration/harness.h"

namespace stash {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::BinDir;
using testing::DaemonProcess;
using testing::PagesUsed;
using testing::Process;
using testing::TimeScale;

constexpr uint64_t kPage = 64 << 10;  // the tests' page size: small pools, many pages

// The mode the running test's clients open in: set by the fixtures (Datapath: daemon-copy;
// DatapathModes: each mode in turn).
Mode g_mode = Mode::kDaemonCopy;

// A mapped client leases more than any test pool holds, so that, like a daemon-copy session, it
// may use its whole pool and (when it may spill) the host tier the tests give: the daemon grants
// what is free. (Host: a bounded lease, so the parity suite's spill tests see the same host
// room in both modes.) The parity suite starts
// its daemons with a quota to match (Datapath::StartDaemon).
constexpr uint64_t kMappedLeaseBytes = 512ull << 20;
constexpr uint64_t kMappedHostLeaseBytes = 16ull << 20;

std::unique_ptr<Client> Connect(const DaemonProcess& d, bool allow_spill = true, int device = 0) {
  Options o;
  o.socket = d.socket();
  o.allow_host_spill = allow_spill;
  o.device = device;
  o.mode = g_mode;
  if (g_mode == Mode::kMapped) {
    o.lease.automatic = false;
    o.lease.device_bytes = kMappedLeaseBytes;
    o.lease.host_bytes = allow_spill ? kMappedHostLeaseBytes : 0;
  }
  auto c = Client::Open(o);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(c).value() : nullptr;
}

std::unique_ptr<HostBuffer> Buffer(uint64_t bytes) {
  auto b = HostBuffer::Allocate(bytes);
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  return std::move(b).value();
}

void FillRandom(HostBuffer& b, uint32_t seed) {
  std::mt19937 rng(seed);
  for (uint64_t i = 0; i < b.size(); ++i) b.data()[i] = static_cast<uint8_t>(rng());
}

stash::v1::GetStatsResponse DaemonStats(const DaemonProcess& d) {
  return testing::DaemonStats(d.socket());
}

// Pages the live stashes of every session hold (a mapped session's own count, from its control
// block: its leased chunks count as used in the tiers whether stashes fill them or not).
uint64_t LivePages(const stash::v1::GetStatsResponse& r) {
  uint64_t live = 0;
  for (const auto& s : r.sessions()) live += s.pages_live();
  return live;
}

// Polls until every tier is back to all-free, up to `limit`; returns whether it got there.
bool PagesReturnWithin(const DaemonProcess& d, milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  do {
    if (PagesUsed(DaemonStats(d)) == 0) return true;
    std::this_thread::sleep_for(milliseconds(5));
  } while (std::chrono::steady_clock::now() < deadline);
  return false;
}

StashArgs Args(const HostBuffer& src, uint64_t row_bytes, uint64_t max_rows, uint64_t rows) {
  StashArgs a;
  a.source = &src;
  a.row_bytes = row_bytes;
  a.max_rows = max_rows;
  a.count.value = rows;
  return a;
}

class Datapath : public ::testing::Test {
 protected:
  void SetUp() override { g_mode = Mode::kDaemonCopy; }
  void StartDaemon(std::vector<std::string> flags) {
    flags.push_back("--page-bytes=64KiB");
    flags.push_back("--log-level=warn");
    if (g_mode == Mode::kMapped) flags.push_back("--max-lease-bytes=1GiB");
    daemon_ = std::make_unique<DaemonProcess>(flags);
    ASSERT_TRUE(daemon_->Ready()) << daemon_->process().Stderr();
  }
  void TearDown() override {
    if (daemon_ != nullptr && daemon_->process().running()) {
      EXPECT_EQ(daemon_->process().StopWith(SIGTERM, seconds(5 * TimeScale())), 0)
          << daemon_->process().Stderr();
    }
  }
  std::unique_ptr<DaemonProcess> daemon_;
};

// The parity suite: every test below that is a TEST_P runs in both modes, with the same
// expectations; the few numbers only one mode can show are checked in that mode.
class DatapathModes : public Datapath, public ::testing::WithParamInterface<Mode> {
 protected:
  void SetUp() override { g_mode = GetParam(); }
  bool mapped() const { return GetParam() == Mode::kMapped; }
};

INSTANTIATE_TEST_SUITE_P(Modes, DatapathModes, ::testing::Values(Mode::kDaemonCopy, Mode::kMapped),
                         [](const ::testing::TestParamInfo<Mode>& param) {
                           return param.param == Mode::kMapped ? std::string("Mapped")
                                                               : std::string("DaemonCopy");
                         });

TEST_P(DatapathModes, StashThenReloadIsByteExactForEveryShape) {
  StartDaemon({"--pool-bytes=8MiB", "--host-tier-bytes=0"});
  auto client = Connect(*daemon_);
  ASSERT_NE(client, nullptr);
  struct Shape {
    uint64_t row_bytes, max_rows, rows;
  };
  // One page, a ragged tail (row bytes not a multiple of 16), many pages, zero rows, all rows.
  const Shape shapes[] = {{256, 64, 64},  {7, 1000, 999},     {4096, 300, 257}, {512, 128, 0},
                          {7168, 64, 33}, {2048, 1024, 1024}, {3, 5, 1},        {65536, 3, 2}};
  uint32_t seed = 1;
  for (const Shape& s : shapes) {
    SCOPED_TRACE("row_bytes " + std::to_string(s.row_bytes) + " rows " + std::to_string(s.rows));
    auto src = Buffer(s.row_bytes * s.max_rows);
    FillRandom(*src, seed++);
    std::vector<uint8_t> expect(src->data(), src->data() + src->size());
    auto ticket = client->Stash(Args(*src, s.row_bytes, s.max_rows, s.rows));
    ASSERT_TRUE(ticket.ok()) << ticket.status().ToString();
    auto stashed = client->Wait(*ticket);
    ASSERT_TRUE(stashed.ok()) << stashed.status().ToString();
    EXPECT_EQ(stashed->tier, Tier::kDevice);
    EXPECT_EQ(stashed->rows, s.rows);
    EXPECT_EQ(stashed->bytes, s.rows * s.row_bytes);
    EXPECT_EQ(stashed->pages, (s.rows * s.row_bytes + kPage - 1) / kPage);
    std::memset(src->data(), 0xee, src->size());  // the caller's copy is gone

    auto dst = Buffer(s.row_bytes * s.max_rows);
    std::memset(dst->data(), 0xcd, dst->size());
    auto op = client->Reload({*ticket, dst.get(), 0, /*zero_tail=*/true, {}, {}});
    ASSERT_TRUE(op.ok());
    auto reloaded = client->Wait(*op);
    ASSERT_TRUE(reloaded.ok()) << reloaded.status().ToString();
    EXPECT_EQ(reloaded->rows, s.rows);
    const uint64_t valid = s.rows * s.row_bytes;
    EXPECT_EQ(std::memcmp(dst->data(), expect.data(), valid), 0);
    for (uint64_t i = valid; i < dst->size(); ++i) ASSERT_EQ(dst->data()[i], 0) << "byte " << i;
  }
  EXPECT_EQ(LivePages(DaemonStats(*daemon_)), 0u);
}

TEST_P(DatapathModes, ReloadWithoutZeroTailLeavesTheTailAlone) {
  StartDaemon({"--pool-bytes=4MiB"});
  auto client = Connect(*daemon_);
  auto src = Buffer(100 * 64);
  FillRandom(*src, 7);
  auto ticket = client->Stash(Args(*src, 64, 100, 40));
  ASSERT_TRUE(client->Wait(*ticket).ok());
  auto dst = Buffer(100 * 64);
  std::memset(dst->data(), 0xab, dst->size());
  auto op = client->Reload({*ticket, dst.get(), 0, false, {}, {}});
  ASSERT_TRUE(client->Wait(*op).ok());
  EXPECT_EQ(std::memcmp(dst->data(), src->data(), 40 * 64), 0);
  for (uint64_t i = 40 * 64; i < dst->size(); ++i) ASSERT_EQ(dst->data()[i], 0xab);
}

TEST_P(DatapathModes, CountReferenceIsReadOnlyWhenTheCopyRuns) {
  StartDaemon({"--pool-bytes=4MiB"});
  auto client = Connect(*daemon_);
  auto src = Buffer(256 * 128);
  FillRandom(*src, 3);
  auto meta = Buffer(4096);  // [0]: the int64 count, [8]: the ready counter
  const int64_t garbage = 9999;
  std::memcpy(meta->data(), &garbage, 8);
  StashArgs a = Args(*src, 128, 256, 0);
  a.count.buffer = meta.get();
  a.count.offset = 0;
  a.ready = {meta.get(), 8, 1};
  auto ticket = client->Stash(a);
  ASSERT_TRUE(ticket.ok());
  // The producer finishes: it writes the count, then records ready.
  std::this_thread::sleep_for(milliseconds(20));
  EXPECT_FALSE(client->Poll(*ticket).has_value()) << "the daemon copied before ready";
  const int64_t count = 96;
  std::memcpy(meta->data(), &count, 8);
  SignalEvent({meta.get(), 8, 1});
  auto done = client->Wait(*ticket);
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  EXPECT_EQ(done->rows, 96u);
  EXPECT_EQ(done->bytes, 96u * 128);
}

TEST_P(DatapathModes, DivisorTurnsTokenCountIntoScaleRows) {
  StartDaemon({"--pool-bytes=4MiB"});
  auto client = Connect(*daemon_);
  auto scale = Buffer(2048 * 16);  // max_tokens 512 -> 16 scale rows of 2048 bytes
  FillRandom(*scale, 5);
  StashArgs a = Args(*scale, 2048, 16, 256);
  a.count.divisor = 32;
  auto ticket = client->Stash(a);
  auto done = client->Wait(*ticket);
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->rows, 8u);
  EXPECT_EQ(done->bytes, 8u * 2048);
}

TEST_P(DatapathModes, DoneEventIsSignalledAfterTheCopy) {
  StartDaemon({"--pool-bytes=4MiB"});
  auto client = Connect(*daemon_);
  auto src = Buffer(1 << 20);
  FillRandom(*src, 11);
  auto events = Buffer(4096);
  StashArgs a = Args(*src, 1024, 1024, 1024);
  a.done = {events.get(), 0, 1};
  auto ticket = client->Stash(a);
  ASSERT_TRUE(WaitEvent({events.get(), 0, 1}, 10000 * TimeScale()));
  auto dst = Buffer(1 << 20);
  ReloadArgs r{*ticket, dst.get(), 0, false, {}, {events.get(), 8, 1}};
  ASSERT_TRUE(client->Reload(r).ok());
  // A stream-ordered consumer waits on the event, not on the answer.
  ASSERT_TRUE(WaitEvent({events.get(), 8, 1}, 10000 * TimeScale()));
  EXPECT_EQ(std::memcmp(dst->data(), src->data(), src->size()), 0);
}

TEST_P(DatapathModes, FullPoolSpillsWholeStashToHostTier) {
  StartDaemon({"--pool-bytes=1MiB", "--host-tier-bytes=4MiB"});
  auto client = Connect(*daemon_);
  auto a = Buffer(768 << 10);
  auto b = Buffer(768 << 10);
  FillRandom(*a, 1);
  FillRandom(*b, 2);
  auto ta = client->Stash(Args(*a, 1024, 768, 768));
  auto da = client->Wait(*ta);
  ASSERT_TRUE(da.ok());
  EXPECT_EQ(da->tier, Tier::kDevice);
  EXPECT_FALSE(client->CurrentStepFlags().spilled);
  auto tb = client->Stash(Args(*b, 1024, 768, 768));  // 12 pages; only 4 left in the pool
  auto db = client->Wait(*tb);
  ASSERT_TRUE(db.ok());
  EXPECT_EQ(db->tier, Tier::kHost);
  EXPECT_TRUE(client->CurrentStepFlags().spilled);
  const auto stats = DaemonStats(*daemon_);
  ASSERT_EQ(stats.tiers_size(), 2);
  if (mapped()) {
    // The rank's control block says where its stashes are (the tiers count whole leases).
    ASSERT_EQ(stats.sessions_size(), 1);
    uint64_t device = 0, host = 0;
    for (const auto& l : stats.sessions(0).leases()) {
      if (l.tier() == stash::v1::TIER_DEVICE) device = l.pages_used();
      if (l.tier() == stash::v1::TIER_HOST) host = l.pages_used();
    }
    EXPECT_EQ(device, 12u);  // only stash a in the own chunks: whole-stash spill
    EXPECT_EQ(host, 12u);
  } else {
    EXPECT_EQ(stats.tiers(0).pages_used(), 12u);  // only stash a in the pool: whole-stash spill
    EXPECT_EQ(stats.tiers(1).pages_used(), 12u);
  }
  auto out = Buffer(768 << 10);
  ASSERT_TRUE(client->Wait(*client->Reload({*tb, out.get(), 0, false, {}, {}})).ok());
  EXPECT_EQ(std::memcmp(out->data(), b->data(), b->size()), 0);
  ASSERT_TRUE(client->Wait(*client->Reload({*ta, out.get(), 0, false, {}, {}})).ok());
  EXPECT_EQ(std::memcmp(out->data(), a->data(), a->size()), 0);
  EXPECT_EQ(LivePages(DaemonStats(*daemon_)), 0u);
}

TEST_P(DatapathModes, OverflowTakesNothingAndTheClientKeepsItsBuffer) {
  StartDaemon({"--pool-bytes=512KiB", "--host-tier-bytes=0"});
  auto client = Connect(*daemon_);
  auto src = Buffer(1 << 20);
  FillRandom(*src, 9);
  std::vector<uint8_t> before(src->data(), src->data() + src->size());
  auto t = client->Stash(Args(*src, 1024, 1024, 1024));
  auto done = client->Wait(*t);
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->tier, Tier::kOverflow);
  EXPECT_EQ(done->pages, 0u);
  EXPECT_TRUE(client->CurrentStepFlags().overflow);
  EXPECT_EQ(std::memcmp(src->data(), before.data(), before.size()), 0);
  EXPECT_EQ(LivePages(DaemonStats(*daemon_)), 0u);
  // Nothing is stored under the ticket.
  auto dst = Buffer(1 << 20);
  auto r = client->Reload({*t, dst.get(), 0, false, {}, {}});
  ASSERT_TRUE(r.ok());
  auto reloaded = client->Wait(*r);
  EXPECT_EQ(reloaded.status().code(), StatusCode::kNotFound) << reloaded.status().ToString();
  // A later stash that fits still goes in.
  auto small = client->Stash(Args(*src, 1024, 1024, 100));
  auto sd = client->Wait(*small);
  ASSERT_TRUE(sd.ok());
  EXPECT_EQ(sd->tier, Tier::kDevice);
}

TEST_P(DatapathModes, RowsAboveMaxRowsOverflowEvenWhenPagesWouldFit) {
  StartDaemon({"--pool-bytes=4MiB"});
  auto client = Connect(*daemon_);
  auto src = Buffer(128 * 16);
  auto meta = Buffer(4096);
  const int64_t count = 66;  // max_rows 65: the same page would hold it
  std::memcpy(meta->data(), &count, 8);
  StashArgs a = Args(*src, 16, 65, 0);
  a.count.buffer = meta.get();
  auto done = client->Wait(*client->Stash(a));
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->tier, Tier::kOverflow);
  EXPECT_EQ(done->rows, 66u);
}

TEST_P(DatapathModes, NegativeCountIsRejectedAndNothingTaken) {
  StartDaemon({"--pool-bytes=4MiB"});
  auto client = Connect(*daemon_);
  auto src = Buffer(4096);
  auto meta = Buffer(4096);
  const int64_t count = -5;
  std::memcpy(meta->data(), &count, 8);
  StashArgs a = Args(*src, 16, 256, 0);
  a.count.buffer = meta.get();
  auto done = client->Wait(*client->Stash(a));
  EXPECT_EQ(done.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(done.status().message().find("-5"), std::string::npos) << done.status().message();
  EXPECT_EQ(LivePages(DaemonStats(*daemon_)), 0u);
}

TEST_P(DatapathModes, BeginStepReportsThePreviousStepAndClearsFlags) {
  // Tiers of 5 one-page chunks: a mapped lease may take 4 of each (one stays for another user).
  StartDaemon({"--pool-bytes=320KiB", "--host-tier-bytes=320KiB"});
  auto client = Connect(*daemon_);
  auto src = Buffer(1 << 20);
  auto a = client->Wait(*client->Stash(Args(*src, 1024, 1024, 200)));   // 4 pages: device
  auto b = client->Wait(*client->Stash(Args(*src, 1024, 1024, 200)));   // host
  auto c = client->Wait(*client->Stash(Args(*src, 1024, 1024, 1024)));  // overflow
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(b->tier, Tier::kHost);
  EXPECT_EQ(c->tier, Tier::kOverflow);
  auto begun = client->Wait(*client->BeginStep(2));
  ASSERT_TRUE(begun.ok());
  EXPECT_TRUE(begun->step_overflow);
  EXPECT_TRUE(begun->step_spilled);
  EXPECT_FALSE(client->CurrentStepFlags().overflow);
  EXPECT_FALSE(client->CurrentStepFlags().spilled);
  auto again = client->Wait(*client->BeginStep(3));
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->step_overflow);
  EXPECT_FALSE(again->step_spilled);
}

TEST_P(DatapathModes, ReleaseReturnsPagesWithoutCopying) {
  StartDaemon({"--pool-bytes=4MiB"});
  auto client = Connect(*daemon_);
  auto src = Buffer(1 << 20);
  auto t = client->Stash(Args(*src, 1024, 1024, 1024));
  ASSERT_TRUE(client->Wait(*t).ok());
  EXPECT_EQ(LivePages(DaemonStats(*daemon_)), 16u);
  auto released = client->Wait(*client->Release(*t));
  ASSERT_TRUE(released.ok());
  EXPECT_EQ(released->pages, 16u);
  EXPECT_EQ(LivePages(DaemonStats(*daemon_)), 0u);
  // The ticket is gone now.
  EXPECT_EQ(client->Wait(*client->Release(*t)).status().code(), StatusCode::kNotFound);
}

// Closing a session: the client half-closes and returns once the daemon ended the stream, which
// it does only after the pool finished everything submitted before the session's teardown and
// the teardown itself (pages returned). Session B closes while the pool copies session A's large
// stashes: when B's close returns, B's pages are back already, without polling. (A daemon that
// ended the stream at once would leave them held behind A's copies; and a done write of the
// daemon could then land after the client raised its counters.)
TEST_F(Datapath, ClosingASessionReturnsOnceItsTeardownBehindOtherWorkFinished) {
  StartDaemon({"--pool-bytes=96MiB"});
  constexpr uint64_t kLargePages = (16 << 20) / kPage;
  auto a = Connect(*daemon_);
  auto b = Connect(*daemon_);
  auto small = Buffer(1 << 20);
  auto large = Buffer(16 << 20);
  auto kept = b->Stash(Args(*small, 1024, 1024, 1024));
  ASSERT_TRUE(b->Wait(*kept).ok());
  auto first = a->Stash(Args(*large, 16 << 10, 1024, 1024));
  ASSERT_TRUE(a->Wait(*first).ok());  // A's requests reach the pool
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(a->Stash(Args(*large, 16 << 10, 1024, 1024)).ok());
  b.reset();
  const stash::v1::GetStatsResponse stats = DaemonStats(*daemon_);
  EXPECT_EQ(stats.daemon().sessions_live(), 1u);
  // What is in use is A's stashes alone, each whole (B held 16 pages).
  EXPECT_EQ(PagesUsed(stats) % kLargePages, 0u) << PagesUsed(stats) << " pages in use";
  EXPECT_GE(PagesUsed(stats), kLargePages);
}

TEST_P(DatapathModes, PipelinedRequestsNeedNoWaitInBetween) {
  StartDaemon({"--pool-bytes=16MiB"});
  auto client = Connect(*daemon_);
  constexpr int kLayers = 12;
  std::vector<std::unique_ptr<HostBuffer>> src, dst;
  std::vector<uint64_t> tickets;
  for (int l = 0; l < kLayers; ++l) {
    src.push_back(Buffer(256 << 10));
    dst.push_back(Buffer(256 << 10));
    FillRandom(*src.back(), 100 + l);
    tickets.push_back(*client->Stash(Args(*src.back(), 512, 512, 100 + 30 * l)));
  }
  std::vector<uint64_t> ops;
  for (int l = kLayers - 1; l >= 0; --l) {
    ops.push_back(*client->Reload({tickets[l], dst[l].get(), 0, true, {}, {}}));
  }
  for (uint64_t op : ops) ASSERT_TRUE(client->Wait(op).ok());
  for (int l = 0; l < kLayers; ++l) {
    ASSERT_TRUE(client->Wait(tickets[l]).ok());
    EXPECT_EQ(std::memcmp(dst[l]->data(), src[l]->data(), (100 + 30 * l) * 512), 0) << l;
  }
  EXPECT_EQ(LivePages(DaemonStats(*daemon_)), 0u);
}

TEST_P(DatapathModes, TicketOfAnotherSessionIsNotFound) {
  StartDaemon({"--pool-bytes=4MiB"});
  auto alice = Connect(*daemon_);
  auto bob = Connect(*daemon_);
  auto src = Buffer(64 << 10);
  auto t = alice->Stash(Args(*src, 64, 1024, 1024));
  ASSERT_TRUE(alice->Wait(*t).ok());
  auto dst = Buffer(64 << 10);
  auto stolen = bob->Wait(*bob->Reload({*t, dst.get(), 0, false, {}, {}}));
  EXPECT_EQ(stolen.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(bob->Wait(*bob->Release(*t)).status().code(), StatusCode::kNotFound);
  // Alice's stash is intact.
  ASSERT_TRUE(alice->Wait(*alice->Reload({*t, dst.get(), 0, false, {}, {}})).ok());
  EXPECT_EQ(std::memcmp(dst->data(), src->data(), src->size()), 0);
}

TEST_P(DatapathModes, SessionsOnDifferentDevicesUseTheirOwnPools) {
  StartDaemon({"--devices=2", "--pool-bytes=1MiB"});
  auto c0 = Connect(*daemon_, true, 0);
  auto c1 = Connect(*daemon_, true, 1);
  auto src = Buffer(512 << 10);
  ASSERT_TRUE(c0->Wait(*c0->Stash(Args(*src, 1024, 512, 512))).ok());
  ASSERT_TRUE(c1->Wait(*c1->Stash(Args(*src, 1024, 256, 256))).ok());
  EXPECT_EQ(c0->Stats()->pages_live, 8u);
  EXPECT_EQ(c1->Stats()->pages_live, 4u);
  const auto stats = DaemonStats(*daemon_);
  if (!mapped()) {
    EXPECT_EQ(stats.tiers(0).pages_used(), 8u);
    EXPECT_EQ(stats.tiers(1).pages_used(), 4u);
  }
  Options bad;
  bad.socket = daemon_->socket();
  bad.device = 2;
  auto refused = Client::Open(bad);
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("out of range"), std::string::npos);
}

// Daemon-copy's peer tier (--copy-peer-tier, on by default): a stash its own device's pool cannot
// hold goes to another device's pool, which lends only beyond a reserve for its own sessions
// (1/32 of the pool, at least a page), before the host tier.
TEST_F(Datapath, AFullPoolStashesInAnotherDevicesPoolBeforeTheHostTier) {
  // 16 pages of 64 KiB per pool; gpu1 keeps 1 (1/32, at least a page) for its own sessions.
  StartDaemon({"--devices=2", "--pool-bytes=1MiB", "--host-tier-bytes=4MiB"});
  auto c0 = Connect(*daemon_, true, 0);
  auto c1 = Connect(*daemon_, true, 1);
  auto a = Buffer(1 << 20);
  auto b = Buffer(512 << 10);
  auto c = Buffer(448 << 10);
  auto d = Buffer(64 << 10);
  FillRandom(*a, 31);
  FillRandom(*b, 32);
  FillRandom(*c, 33);
  FillRandom(*d, 34);
  auto ta = c0->Stash(Args(*a, 1024, 1024, 1024));  // fills gpu0
  ASSERT_EQ(c0->Wait(*ta)->tier, Tier::kDevice);
  EXPECT_FALSE(c0->CurrentStepFlags().spilled);
  auto tb = c0->Stash(Args(*b, 1024, 512, 512));  // 8 pages: gpu1 lends them
  auto db = c0->Wait(*tb);
  ASSERT_TRUE(db.ok());
  EXPECT_EQ(db->tier, Tier::kPeer);
  EXPECT_EQ(db->pages, 8u);
  EXPECT_TRUE(c0->CurrentStepFlags().spilled);    // outside the own pool counts as a spill
  auto tc = c0->Stash(Args(*c, 1024, 448, 448));  // 7 more: gpu1 keeps its 1
  ASSERT_EQ(c0->Wait(*tc)->tier, Tier::kPeer);
  auto td = c0->Stash(Args(*d, 1024, 64, 64));  // one more page: past gpu1's reserve
  ASSERT_EQ(c0->Wait(*td)->tier, Tier::kHost);

  auto stats = DaemonStats(*daemon_);
  ASSERT_EQ(stats.tiers_size(), 3);
  EXPECT_EQ(stats.tiers(0).pages_used(), 16u);
  EXPECT_EQ(stats.tiers(0).pages_lent(), 0u);
  EXPECT_EQ(stats.tiers(1).name(), "gpu1");
  EXPECT_EQ(stats.tiers(1).pages_used(), 15u);
  EXPECT_EQ(stats.tiers(1).pages_lent(), 15u);
  EXPECT_EQ(stats.tiers(2).pages_used(), 1u);
  EXPECT_EQ(stats.daemon().spills(), 3u);
  ASSERT_EQ(stats.sessions_size(), 2);
  for (const auto& session : stats.sessions()) {
    if (session.pool() != 0) continue;
    EXPECT_EQ(session.spills(), 3u);
    EXPECT_EQ(session.pages_live(), 16u + 15u + 1u);
  }

  // gpu1's own session still gets its reserve: its stashes do not spill because of lending.
  auto own = Buffer(64 << 10);
  auto town = c1->Stash(Args(*own, 1024, 64, 64));
  ASSERT_EQ(c1->Wait(*town)->tier, Tier::kDevice);
  EXPECT_FALSE(c1->CurrentStepFlags().spilled);

  // Reloads find each stash where it is, byte for byte, and say so.
  auto out = Buffer(1 << 20);
  auto rb = c0->Wait(*c0->Reload({*tb, out.get(), 0, false, {}, {}}));
  ASSERT_TRUE(rb.ok()) << rb.status().ToString();
  EXPECT_EQ(rb->tier, Tier::kPeer);
  EXPECT_EQ(std::memcmp(out->data(), b->data(), b->size()), 0);
  ASSERT_EQ(c0->Wait(*c0->Reload({*td, out.get(), 0, false, {}, {}}))->tier, Tier::kHost);
  EXPECT_EQ(std::memcmp(out->data(), d->data(), d->size()), 0);
  ASSERT_EQ(c0->Wait(*c0->Reload({*ta, out.get(), 0, false, {}, {}}))->tier, Tier::kDevice);
  EXPECT_EQ(std::memcmp(out->data(), a->data(), a->size()), 0);
  // Release frees the peer's pages.
  ASSERT_TRUE(c0->Wait(*c0->Release(*tc)).ok());
  stats = DaemonStats(*daemon_);
  EXPECT_EQ(stats.tiers(1).pages_used(), 1u);  // c1's own
  EXPECT_EQ(stats.tiers(1).pages_lent(), 0u);
  EXPECT_EQ(stats.tiers(0).pages_used(), 0u);

  // The session's end frees what it holds in the peer pool too.
  ASSERT_TRUE(c0->Wait(*c0->Stash(Args(*a, 1024, 1024, 1024))).ok());
  auto te = c0->Stash(Args(*b, 1024, 512, 512));
  ASSERT_EQ(c0->Wait(*te)->tier, Tier::kPeer);
  c0.reset();
  c1.reset();
  EXPECT_TRUE(PagesReturnWithin(*daemon_, milliseconds(1000 * TimeScale())));
}

TEST_F(Datapath, WithTheCopyPeerTierOffAFullPoolSpillsToTheHostTier) {
  StartDaemon(
      {"--devices=2", "--pool-bytes=1MiB", "--host-tier-bytes=4MiB", "--copy-peer-tier=false"});
  auto c0 = Connect(*daemon_, true, 0);
  auto a = Buffer(1 << 20);
  auto b = Buffer(512 << 10);
  FillRandom(*b, 35);
  ASSERT_EQ(c0->Wait(*c0->Stash(Args(*a, 1024, 1024, 1024)))->tier, Tier::kDevice);
  auto tb = c0->Stash(Args(*b, 1024, 512, 512));
  ASSERT_EQ(c0->Wait(*tb)->tier, Tier::kHost);
  const auto stats = DaemonStats(*daemon_);
  EXPECT_EQ(stats.tiers(1).pages_used(), 0u);
  EXPECT_EQ(stats.tiers(2).pages_used(), 8u);
  auto out = Buffer(512 << 10);
  ASSERT_EQ(c0->Wait(*c0->Reload({*tb, out.get(), 0, false, {}, {}}))->tier, Tier::kHost);
  EXPECT_EQ(std::memcmp(out->data(), b->data(), b->size()), 0);
}

// A client SIGKILLed while it holds stashes in another device's pool: that pool has its pages back
// within a second, as its own pool does.
TEST_F(Datapath, PeerPagesReturnWithinOneSecondWhenAClientIsKilled) {
  StartDaemon({"--devices=2", "--pool-bytes=1MiB", "--host-tier-bytes=0"});
  auto survivor = Connect(*daemon_, true, 0);
  auto src = Buffer(1 << 20);
  FillRandom(*src, 36);
  auto kept = survivor->Stash(Args(*src, 1024, 1024, 1024));  // fills gpu0
  ASSERT_EQ(survivor->Wait(*kept)->tier, Tier::kDevice);
  Process victim;  // on device 0: its stash goes to gpu1
  ASSERT_TRUE(victim.Start({BinDir() + "/tests/integration/stash-test-client", daemon_->socket(),
                            "hold", std::to_string(512 << 10)},
                           daemon_->dir() + "/victim-peer"));
  const auto deadline = std::chrono::steady_clock::now() + seconds(10 * TimeScale());
  while (victim.Stdout().empty() && std::chrono::steady_clock::now() < deadline) {
    ASSERT_TRUE(victim.running()) << victim.Stderr();
    std::this_thread::sleep_for(milliseconds(5));
  }
  ASSERT_NE(victim.Stdout().find("stashed 8"), std::string::npos) << victim.Stdout();
  auto stats = DaemonStats(*daemon_);
  EXPECT_EQ(stats.tiers(1).pages_used(), 8u);
  EXPECT_EQ(stats.tiers(1).pages_lent(), 8u);
  victim.StopWith(SIGKILL, seconds(5));
  const auto limit = std::chrono::steady_clock::now() + milliseconds(1000 * TimeScale());
  do {
    stats = DaemonStats(*daemon_);
    if (stats.tiers(1).pages_used() == 0) break;
    std::this_thread::sleep_for(milliseconds(5));
  } while (std::chrono::steady_clock::now() < limit);
  EXPECT_EQ(stats.tiers(1).pages_used(), 0u);
  EXPECT_EQ(stats.tiers(1).pages_lent(), 0u);
  EXPECT_EQ(stats.tiers(0).pages_used(), 16u);  // the survivor's own
  auto dst = Buffer(1 << 20);
  ASSERT_TRUE(survivor->Wait(*survivor->Reload({*kept, dst.get(), 0, false, {}, {}})).ok());
  EXPECT_EQ(std::memcmp(dst->data(), src->data(), src->size()), 0);
}

TEST_P(DatapathModes, StatsAddUp) {
  StartDaemon({"--pool-bytes=4MiB", "--host-tier-bytes=0"});
  auto client = Connect(*daemon_);
  auto src = Buffer(1 << 20);
  auto dst = Buffer(1 << 20);
  uint64_t bytes = 0;
  std::vector<uint64_t> tickets;
  for (int i = 1; i <= 5; ++i) {
    auto t = client->Stash(Args(*src, 1000, 1000, 100 * i));
    ASSERT_TRUE(client->Wait(*t).ok());
    bytes += 100 * i * 1000;
    tickets.push_back(*t);
  }
  ASSERT_TRUE(client->Wait(*client->Reload({tickets[0], dst.get(), 0, false, {}, {}})).ok());
  ASSERT_TRUE(client->Wait(*client->Release(tickets[1])).ok());
  auto over = client->Wait(*client->Stash(Args(*src, 1000, 1000, 100000)));  // rows > max
  ASSERT_TRUE(over.ok());
  auto stats = DaemonStats(*daemon_);
  ASSERT_EQ(stats.sessions_size(), 1);
  const auto& s = stats.sessions(0);
  EXPECT_EQ(s.stashes(), 5u);
  EXPECT_EQ(s.reloads(), 1u);
  EXPECT_EQ(s.releases(), 1u);
  EXPECT_EQ(s.bytes_stashed(), bytes);
  EXPECT_EQ(s.bytes_reloaded(), 100u * 1000);
  EXPECT_EQ(s.overflows(), 1u);
  EXPECT_EQ(s.stashes_live(), 3u);
  auto pages = [](uint64_t n) { return (n + kPage - 1) / kPage; };
  EXPECT_EQ(s.pages_live(), pages(300u * 1000) + pages(400u * 1000) + pages(500u * 1000));
  EXPECT_EQ(stats.tiers(0).pages_used() + stats.tiers(0).pages_free(),
            stats.tiers(0).pages_total());
  if (!mapped()) {
    // The daemon's own totals: in mapped mode it copies nothing and sees the control block.
    EXPECT_EQ(stats.daemon().stashes(), 5u);
    EXPECT_EQ(stats.daemon().bytes_stashed(), bytes);
    EXPECT_EQ(stats.daemon().reloads(), 1u);
    EXPECT_EQ(stats.daemon().bytes_reloaded(), 100u * 1000);
    EXPECT_EQ(stats.daemon().releases(), 1u);
    EXPECT_EQ(stats.daemon().overflows(), 1u);
    EXPECT_EQ(s.pages_live(), stats.tiers(0).pages_used());
    EXPECT_EQ(stats.tiers(0).bytes_stashed(), 300u * 1000 + 400u * 1000 + 500u * 1000);
    EXPECT_GE(stats.tiers(0).pages_high_water(), stats.tiers(0).pages_used());
  }
  // Client::Stats sees the same.
  auto mine = client->Stats();
  ASSERT_TRUE(mine.ok());
  EXPECT_EQ(mine->stashes, 5u);
  EXPECT_EQ(mine->pages_live, s.pages_live());
  EXPECT_EQ(mine->pool_pages_used, stats.tiers(0).pages_used());
  client.reset();  // the session ends: everything returns
  EXPECT_TRUE(PagesReturnWithin(*daemon_, milliseconds(1000 * TimeScale())));
}

// The lease: a client killed with SIGKILL in the middle of a stash loses its pages within 1 s,
// and another client goes on.
TEST_F(Datapath, PagesReturnWithinOneSecondWhenAClientIsKilled) {
  StartDaemon({"--pool-bytes=64MiB"});
  auto survivor = Connect(*daemon_);
  auto src = Buffer(1 << 20);
  FillRandom(*src, 21);
  auto kept = survivor->Stash(Args(*src, 1024, 1024, 1024));
  ASSERT_TRUE(survivor->Wait(*kept).ok());

  for (const char* mode : {"hold", "midstash"}) {
    SCOPED_TRACE(mode);
    Process victim;
    ASSERT_TRUE(victim.Start({BinDir() + "/tests/integration/stash-test-client", daemon_->socket(),
                              mode, std::to_string(32 << 20)},
                             daemon_->dir() + "/victim-" + mode));
    // Wait for it to say it stashed (or queued).
    const auto deadline = std::chrono::steady_clock::now() + seconds(10 * TimeScale());
    while (victim.Stdout().empty() && std::chrono::steady_clock::now() < deadline) {
      ASSERT_TRUE(victim.running()) << victim.Stderr();
      std::this_thread::sleep_for(milliseconds(5));
    }
    ASSERT_FALSE(victim.Stdout().empty());
    if (std::string(mode) == "hold") {
      EXPECT_EQ(PagesUsed(DaemonStats(*daemon_)), 16u + 512u);
    }
    victim.StopWith(SIGKILL, seconds(5));
    // Back to only the survivor's 16 pages within 1 s.
    const auto limit = std::chrono::steady_clock::now() + milliseconds(1000 * TimeScale());
    uint64_t used = 0;
    do {
      used = PagesUsed(DaemonStats(*daemon_));
      if (used == 16) break;
      std::this_thread::sleep_for(milliseconds(5));
    } while (std::chrono::steady_clock::now() < limit);
    EXPECT_EQ(used, 16u);
    // The survivor goes on.
    auto t = survivor->Stash(Args(*src, 1024, 1024, 512));
    ASSERT_TRUE(survivor->Wait(*t).ok());
    ASSERT_TRUE(survivor->Wait(*survivor->Release(*t)).ok());
  }
  auto dst = Buffer(1 << 20);
  ASSERT_TRUE(survivor->Wait(*survivor->Reload({*kept, dst.get(), 0, false, {}, {}})).ok());
  EXPECT_EQ(std::memcmp(dst->data(), src->data(), src->size()), 0);
  EXPECT_EQ(DaemonStats(*daemon_).daemon().sessions_live(), 1u);
}

// The daemon killed while clients wait: they fail fast, nothing hangs, buffers untouched.
TEST_F(Datapath, ClientsFailFastWhenTheDaemonDies) {
  StartDaemon({"--pool-bytes=4MiB"});
  auto client = Connect(*daemon_);
  auto src = Buffer(64 << 10);
  FillRandom(*src, 4);
  std::vector<uint8_t> before(src->data(), src->data() + src->size());
  auto events = Buffer(4096);
  StashArgs a = Args(*src, 64, 1024, 1024);
  a.ready = {events.get(), 0, 1};  // never signalled: the daemon holds it
  a.done = {events.get(), 8, 1};
  auto t = client->Stash(a);
  ASSERT_TRUE(t.ok());
  std::thread killer([&] {
    std::this_thread::sleep_for(milliseconds(50));
    daemon_->process().StopWith(SIGKILL, seconds(5));
  });
  auto waited = client->Wait(*t, 30000);
  killer.join();
  EXPECT_EQ(waited.status().code(), StatusCode::kUnavailable) << waited.status().ToString();
  EXPECT_NE(waited.status().message().find(daemon_->socket()), std::string::npos);
  auto later = client->Stash(Args(*src, 64, 1024, 1));
  EXPECT_EQ(later.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(std::memcmp(src->data(), before.data(), before.size()), 0);
  // A stream waiting on the dead daemon's done event goes on (the library raised it).
  EXPECT_TRUE(WaitEvent({events.get(), 8, 1}, 0));
}

// A request the daemon rejects never reaches a copy, so the daemon never raises its done event:
// the library raises it with the answer, so a stream waiting on it cannot hang.
TEST_P(DatapathModes, DoneEventOfARejectedRequestIsRaisedWithTheAnswer) {
  StartDaemon({"--pool-bytes=4MiB"});
  auto client = Connect(*daemon_);
  auto dst = Buffer(64 << 10);
  auto events = Buffer(4096);
  ReloadArgs r{0x5eed, dst.get(), 0, false, {}, {events.get(), 8, 3}};
  auto op = client->Reload(r);
  ASSERT_TRUE(op.ok()) << op.status().ToString();
  auto answer = client->Wait(*op, 10000 * TimeScale());
  EXPECT_EQ(answer.status().code(), StatusCode::kNotFound) << answer.status().ToString();
  EXPECT_TRUE(WaitEvent({events.get(), 8, 3}, 0));
}

// A reload the daemon refuses costs nothing: the stash stays, a later reload gets the rows back,
// a release returns the pages, and a session that ends with such a stash returns every page.
// (Client memory is a sealed memfd checked before it is registered, so the daemon's own failures
// to open memory, which take the same path in the pool, are made with a fake executor in
// tests/daemon/pool_reload_test.cc.)
TEST_P(DatapathModes, FailedReloadKeepsTheStash) {
  StartDaemon({"--pool-bytes=4MiB", "--host-tier-bytes=0"});
  auto client = Connect(*daemon_);
  ASSERT_NE(client, nullptr);
  auto src = Buffer(64 << 10);
  FillRandom(*src, 31);
  auto dst = Buffer(64 << 10);
  auto broken = Buffer(4096);  // too small for the stash's 64 KiB
  auto ticket = client->Stash(Args(*src, 1024, 64, 64));
  ASSERT_TRUE(client->Wait(*ticket).ok());

  for (int i = 0; i < 3; ++i) {
    auto op = client->Reload({*ticket, broken.get(), 0, false, {}, {}});
    ASSERT_TRUE(op.ok()) << op.status().ToString();
    auto failed = client->Wait(*op, 10000 * TimeScale());
    EXPECT_EQ(failed.status().code(), StatusCode::kInvalidArgument) << failed.status().ToString();
    EXPECT_EQ(LivePages(DaemonStats(*daemon_)), 1u);
  }
  auto reloaded = client->Wait(*client->Reload({*ticket, dst.get(), 0, false, {}, {}}));
  ASSERT_TRUE(reloaded.ok()) << reloaded.status().ToString();
  EXPECT_EQ(std::memcmp(dst->data(), src->data(), src->size()), 0);
  EXPECT_EQ(LivePages(DaemonStats(*daemon_)), 0u);

  // A release after a failed reload returns the pages.
  auto second = client->Stash(Args(*src, 1024, 64, 64));
  ASSERT_TRUE(client->Wait(*second).ok());
  EXPECT_FALSE(client->Wait(*client->Reload({*second, broken.get(), 0, false, {}, {}})).ok());
  auto released = client->Wait(*client->Release(*second));
  ASSERT_TRUE(released.ok()) << released.status().ToString();
  EXPECT_EQ(released->pages, 1u);

  // The session ends holding a stash whose reload failed: every page returns.
  auto third = client->Stash(Args(*src, 1024, 64, 64));
  ASSERT_TRUE(client->Wait(*third).ok());
  EXPECT_FALSE(client->Wait(*client->Reload({*third, broken.get(), 0, false, {}, {}})).ok());
  client.reset();
  EXPECT_TRUE(PagesReturnWithin(*daemon_, milliseconds(1000 * TimeScale())));
}

TEST_F(Datapath, OpenFailsWithAClearMessageWhenNoDaemonAnswers) {
  testing::TempDir dir;
  Options o;
  o.socket = dir.path() + "/nobody.sock";
  o.connect_timeout_ms = 300;
  auto c = Client::Open(o);
  EXPECT_EQ(c.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(c.status().message().find(o.socket), std::string::npos);
  EXPECT_NE(c.status().message().find("stashd --socket="), std::string::npos);
}

// A socket file nobody listens on (its daemon died) is refused at once: UNAVAILABLE without
// waiting out the connect timeout, an hour here (the ctest timeout fails a test that waits).
TEST_F(Datapath, OpenOfASocketNobodyListensOnIsUnavailableAtOnce) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/dead.sock";
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  close(fd);  // the file stays; nothing listens
  Options o;
  o.socket = path;
  o.connect_timeout_ms = 3600 * 1000;
  auto c = Client::Open(o);
  EXPECT_EQ(c.status().code(), StatusCode::kUnavailable) << c.status().ToString();
  EXPECT_NE(c.status().message().find("nothing listens on it"), std::string::npos)
      << c.status().message();
  EXPECT_NE(c.status().message().find("stashd --socket=" + path), std::string::npos);
}

// A user the socket's mode leaves out gets PERMISSION_DENIED at once, naming the socket's group
// and how to join it (not "no stashd answers" after the connect timeout).
TEST_F(Datapath, OpenOfASocketThisUserMayNotUseIsPermissionDeniedNamingTheGroup) {
  if (geteuid() != 0) {
    GTEST_SKIP() << "needs root: the test drops to user nobody in a child process, since root "
                    "passes every permission check";
  }
  const struct passwd* nobody = getpwnam("nobody");
  if (nobody == nullptr) GTEST_SKIP() << "no user 'nobody' on this machine";
  const uid_t uid = nobody->pw_uid;
  const gid_t gid = nobody->pw_gid;
  testing::TempDir dir;
  ASSERT_EQ(chmod(dir.path().c_str(), 0755), 0);
  const std::string path = dir.path() + "/stashd.sock";
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 4), 0);                                   // a live daemon's socket...
  ASSERT_EQ(chmod(path.c_str(), 0), 0);                          // ...that lets nobody in
  ASSERT_EQ(chown(path.c_str(), static_cast<uid_t>(-1), 1), 0);  // of a group not root's
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  const struct group* owner = getgrgid(st.st_gid);
  ASSERT_NE(owner, nullptr);
  const std::string group = owner->gr_name;

  int out[2];
  ASSERT_EQ(pipe(out), 0);
  const pid_t child = fork();  // this test process has started no threads
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(out[0]);
    if (setgroups(0, nullptr) != 0 || setgid(gid) != 0 || setuid(uid) != 0) _exit(3);
    Options o;
    o.socket = path;
    o.connect_timeout_ms = 3600 * 1000;
    auto c = Client::Open(o);
    const std::string report =
        std::to_string(static_cast<int>(c.status().code())) + "\n" + c.status().message();
    const ssize_t n = write(out[1], report.data(), report.size());
    _exit(n == static_cast<ssize_t>(report.size()) ? 0 : 4);
  }
  close(out[1]);
  std::string report;
  char buf[512];
  ssize_t n = 0;
  while ((n = read(out[0], buf, sizeof(buf))) > 0) report.append(buf, static_cast<size_t>(n));
  close(out[0]);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  close(fd);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  const auto newline = report.find('\n');
  ASSERT_NE(newline, std::string::npos) << report;
  EXPECT_EQ(report.substr(0, newline),
            std::to_string(static_cast<int>(StatusCode::kPermissionDenied)))
      << report;
  EXPECT_NE(report.find("permission denied on " + path), std::string::npos) << report;
  EXPECT_NE(report.find("group '" + group + "'"), std::string::npos) << report;
  EXPECT_NE(report.find("usermod -aG " + group), std::string::npos) << report;
  // A socket of group root (stashd started as root with no stashd group): joining root is not
  // the advice; making the group and restarting stashd is.
  ASSERT_EQ(chown(path.c_str(), static_cast<uid_t>(-1), 0), 0);
  const std::string root_advice = PermissionDeniedMessage(path);
  EXPECT_NE(root_advice.find("groupadd --system stashd"), std::string::npos) << root_advice;
  EXPECT_EQ(root_advice.find("usermod -aG root"), std::string::npos) << root_advice;
}

TEST_P(DatapathModes, DevicePointersOnTheHostBackendAreRefusedWithTheFix) {
  StartDaemon({"--pool-bytes=4MiB"});
  auto client = Connect(*daemon_);
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(client->backend(), Backend::kHost);
  auto src = Buffer(64 * 16);
  FillRandom(*src, 5);
  std::vector<uint8_t> device_stand_in(64 * 16);

  StashArgs on_device = Args(*src, 64, 16, 16);
  on_device.source = nullptr;
  on_device.device_source = device_stand_in.data();
  auto refused = client->Stash(on_device);
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("Backend::kCuda"), std::string::npos)
      << refused.status().message();

  StashArgs both = Args(*src, 64, 16, 16);
  both.device_source = device_stand_in.data();
  auto ambiguous = client->Stash(both);
  EXPECT_EQ(ambiguous.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(ambiguous.status().message().find("exactly one"), std::string::npos)
      << ambiguous.status().message();

  StashArgs device_count = Args(*src, 64, 16, 16);
  device_count.count.device_count = device_stand_in.data();
  EXPECT_EQ(client->Stash(device_count).status().code(), StatusCode::kInvalidArgument);

  EventPoint point{src.get(), 0, 1};
  const Status signal = client->EnqueueSignal(point, nullptr);
  EXPECT_EQ(signal.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(signal.message().find("SignalEvent"), std::string::npos) << signal.message();
  EXPECT_EQ(client->EnqueueWait(point, nullptr).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(client->UnregisterDevice(device_stand_in.data()).status().code(),
            StatusCode::kFailedPrecondition);
  // Portable trainer code: nothing to release on the host backend, and no error.
  EXPECT_TRUE(client->ReleaseDeviceMappings(1000).ok());

  // Nothing was sent for the refused calls: the session goes on, byte-exact.
  auto ticket = client->Stash(Args(*src, 64, 16, 16));
  ASSERT_TRUE(ticket.ok()) << ticket.status().ToString();
  ASSERT_TRUE(client->Wait(*ticket).ok());
  auto dst = Buffer(64 * 16);
  ReloadArgs to_device{*ticket, nullptr, 0, false, {}, {}, device_stand_in.data()};
  EXPECT_EQ(client->Reload(to_device).status().code(), StatusCode::kInvalidArgument);
  auto reload = client->Reload({*ticket, dst.get(), 0, false, {}, {}});
  ASSERT_TRUE(reload.ok()) << reload.status().ToString();
  ASSERT_TRUE(client->Wait(*reload).ok());
  EXPECT_EQ(std::memcmp(src->data(), dst->data(), src->size()), 0);
}

TEST_F(Datapath, CudaBackendWithoutADriverSaysWhatIsMissing) {
  testing::TempDir dir;
  Options o;
  o.backend = Backend::kCuda;
  o.socket = dir.path() + "/nobody.sock";
  o.connect_timeout_ms = 300;
  auto c = Client::Open(o);
  ASSERT_FALSE(c.ok());
  if (access("/dev/nvidiactl", F_OK) == 0) {
    // A GPU node: the CUDA side opens, and the missing daemon is what fails.
    EXPECT_EQ(c.status().code(), StatusCode::kUnavailable) << c.status().ToString();
    return;
  }
  EXPECT_EQ(c.status().code(), StatusCode::kFailedPrecondition) << c.status().ToString();
  const std::string& m = c.status().message();
  EXPECT_TRUE(m.find("NVIDIA driver") != std::string::npos ||
              m.find("STASH_ENABLE_CUDA=OFF") != std::string::npos)
      << m;
}

// One counter, two operations: the second is rejected at once while the first still waits for
// its ready event. The library must not raise the counter past the first (its copy has not run):
// a stream waiting for the second value would otherwise read before the first copy.
TEST_F(Datapath, DoneEventsOfOneCounterGoUpInSubmissionOrder) {
  StartDaemon({"--pool-bytes=4MiB"});
  auto client = Connect(*daemon_);
  auto src = Buffer(64 << 10);
  FillRandom(*src, 8);
  auto events = Buffer(4096);
  StashArgs a = Args(*src, 64, 1024, 1024);
  a.ready = {events.get(), 0, 1};  // held back until the test signals it
  a.done = {events.get(), 8, 1};
  auto first = client->Stash(a);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  auto dst = Buffer(64 << 10);
  auto second = client->Reload({0x5eed, dst.get(), 0, false, {}, {events.get(), 8, 2}});
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(client->Wait(*second, 10000 * TimeScale()).status().code(), StatusCode::kNotFound);
  EXPECT_FALSE(WaitEvent({events.get(), 8, 1}, 0)) << "raised before the first copy ran";

  SignalEvent({events.get(), 0, 1});
  auto done = client->Wait(*first, 10000 * TimeScale());
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  EXPECT_TRUE(WaitEvent({events.get(), 8, 2}, 0));  // both answered: up to the second's value
}

TEST_P(DatapathModes, ManyThreadsShareOneClient) {
  StartDaemon({"--pool-bytes=32MiB", "--copy-threads=2"});
  auto client = Connect(*daemon_);
  constexpr int kThreads = 4;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int th = 0; th < kThreads; ++th) {
    threads.emplace_back([&, th] {
      auto src = Buffer(128 << 10);
      auto dst = Buffer(128 << 10);
      for (int i = 0; i < 20; ++i) {
        FillRandom(*src, th * 1000 + i);
        auto t = client->Stash(Args(*src, 128, 1024, 1000 - i));
        if (!t.ok() || !client->Wait(*t).ok()) ++failures;
        auto r = client->Reload({*t, dst.get(), 0, true, {}, {}});
        if (!r.ok() || !client->Wait(*r).ok()) ++failures;
        if (std::memcmp(dst->data(), src->data(), (1000 - i) * 128) != 0) ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(LivePages(DaemonStats(*daemon_)), 0u);
}

}  // namespace
}  // namespace stash
