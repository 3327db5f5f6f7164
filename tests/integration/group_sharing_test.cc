// Groups (issue 41): one job's mapped sessions share their node's memory page by page through
// the group's depot: a page one member released is another's at its next stash, with no lease in
// between; a member that dies has exactly its pages back within a second; a stash past the own
// device goes to the host tier when that has room.
#include <signal.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "stash/client.h"
#include "tests/integration/daemon_stats.h"
#include "tests/integration/harness.h"
#include "tests/integration/host_buffers.h"

namespace stash {
namespace {

using std::chrono::seconds;
using testing::BinDir;
using testing::Buffer;
using testing::DaemonProcess;
using testing::DaemonStats;
using testing::Process;
using testing::TimeScale;

constexpr uint64_t kPage = 64 << 10;
const std::string kSecret(32, 's');
// The same secret as STASHD_GROUP_SECRET spells it: 64 hex characters.
const std::string kSecretHex = [] {
  std::string hex;
  for (char c : kSecret) {
    char two[3];
    std::snprintf(two, sizeof(two), "%02x", static_cast<unsigned char>(c));
    hex += two;
  }
  return hex;
}();

std::unique_ptr<Client> Member(const std::string& socket, const std::string& group,
                               bool host_spill = false, int device = 0) {
  Options o;
  o.socket = socket;
  o.device = device;
  o.mode = Mode::kMapped;
  o.group = group;
  o.group_secret = kSecret;
  o.allow_host_spill = host_spill;
  auto c = Client::Open(o);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(c).value() : nullptr;
}

// Stashes `pages` pages of `src`; the completion.
StatusOr<Completion> StashPages(Client& c, const HostBuffer& src, uint64_t pages) {
  StatusOr<uint64_t> op = c.Stash(testing::Args(src, kPage, pages));
  if (!op.ok()) return op.status();
  return c.Wait(*op, 10000);
}

void ReloadExact(Client& c, const Completion& stashed, const HostBuffer& src) {
  auto dst = Buffer(src.size());
  auto back = c.Wait(*c.Reload({stashed.ticket, dst.get(), 0, false, {}, {}}), 10000);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(std::memcmp(dst->data(), src.data(), stashed.bytes), 0);
}

class Groups : public ::testing::Test {
 protected:
  void Start(std::vector<std::string> flags) {
    flags.push_back("--page-bytes=64KiB");
    flags.push_back("--log-level=info");
    daemon_ = std::make_unique<DaemonProcess>(flags);
    ASSERT_TRUE(daemon_->Ready()) << daemon_->process().Stderr();
  }
  std::unique_ptr<DaemonProcess> daemon_;
};

// Two members on a pool of 32 pages (28 of them the group's: the daemon keeps a chunk for
// another user's first session) take turns holding 20: private leases would split the pool; the
// group's depot gives each the other's released pages at once, in the same step. Then both hold
// 14 at once: all the group has, no overflow, every byte back.
TEST_F(Groups, MembersUseEachOthersReleasedPagesWithinAStep) {
  Start({"--pool-bytes=2MiB", "--chunk-bytes=256KiB", "--host-tier-bytes=0"});
  auto a = Member(daemon_->socket(), "job-1");
  auto b = Member(daemon_->socket(), "job-1");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  auto big = Buffer(20 * kPage, 7);
  auto half_a = Buffer(14 * kPage, 8);
  auto half_b = Buffer(14 * kPage, 9);
  for (uint64_t step = 0; step < 3; ++step) {
    ASSERT_TRUE(a->Wait(*a->BeginStep(step), 10000).ok());
    ASSERT_TRUE(b->Wait(*b->BeginStep(step), 10000).ok());
    for (Client* c : {a.get(), b.get()}) {
      auto s = StashPages(*c, *big, 20);
      ASSERT_TRUE(s.ok()) << s.status().ToString();
      EXPECT_EQ(s->tier, Tier::kDevice) << "step " << step;
      if (s->tier != Tier::kOverflow) ReloadExact(*c, *s, *big);
    }
    auto sa = StashPages(*a, *half_a, 14);
    auto sb = StashPages(*b, *half_b, 14);
    ASSERT_TRUE(sa.ok() && sb.ok());
    EXPECT_EQ(sa->tier, Tier::kDevice);
    EXPECT_EQ(sb->tier, Tier::kDevice);
    if (sa->tier != Tier::kOverflow) ReloadExact(*a, *sa, *half_a);
    if (sb->tier != Tier::kOverflow) ReloadExact(*b, *sb, *half_b);
  }
}

// A new job's first step on an idle pool: one hot member stashes most of the pool, three others
// a little (26 of its 32 pages; the daemon keeps 2 for another user's first session); nothing
// overflows.
TEST_F(Groups, TheFirstStepOfANewJobOnAnIdlePoolNeverOverflows) {
  Start({"--pool-bytes=2MiB", "--host-tier-bytes=0"});
  std::vector<std::unique_ptr<Client>> members;
  for (int r = 0; r < 4; ++r) {
    members.push_back(Member(daemon_->socket(), "first-step"));
    ASSERT_NE(members.back(), nullptr);
  }
  auto hot = Buffer(20 * kPage, 3);
  auto cold = Buffer(2 * kPage, 4);
  std::vector<std::pair<Client*, Completion>> held;
  for (size_t r = 0; r < members.size(); ++r) {
    ASSERT_TRUE(members[r]->Wait(*members[r]->BeginStep(0), 10000).ok());
    const HostBuffer& src = r == 1 ? *hot : *cold;
    auto s = StashPages(*members[r], src, src.size() / kPage);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_EQ(s->tier, Tier::kDevice) << "member " << r;
    held.emplace_back(members[r].get(), *s);
  }
  for (size_t r = 0; r < held.size(); ++r) {
    if (held[r].second.tier != Tier::kOverflow) {
      ReloadExact(*held[r].first, held[r].second, r == 1 ? *hot : *cold);
    }
  }
}

// The group holds the whole device; a stash past it goes to the host tier, which the depot
// fills on demand (the daemon grows the group there when a member's device ran dry).
TEST_F(Groups, AStashPastTheDeviceGoesToTheHostTierWhenItHasRoom) {
  // The group holds 12 of the pool's 16 pages (a chunk stays for another user).
  Start({"--pool-bytes=1MiB", "--chunk-bytes=256KiB", "--host-tier-bytes=4MiB"});
  auto a = Member(daemon_->socket(), "spill", /*host_spill=*/true);
  ASSERT_NE(a, nullptr);
  auto fill = Buffer(12 * kPage, 5);
  auto more = Buffer(6 * kPage, 6);
  bool spilled = false;
  for (uint64_t step = 0; step < 4 && !spilled; ++step) {
    ASSERT_TRUE(a->Wait(*a->BeginStep(step), 10000).ok());
    auto s1 = StashPages(*a, *fill, 12);
    ASSERT_TRUE(s1.ok());
    EXPECT_EQ(s1->tier, Tier::kDevice);
    auto s2 = StashPages(*a, *more, 6);
    ASSERT_TRUE(s2.ok());
    // The first time the device runs dry the host tier may not be the group's yet (the daemon
    // grows it off the stash's path): the stash overflows once, the next step's spills.
    spilled = s2->tier == Tier::kHost;
    if (s2->tier != Tier::kOverflow) ReloadExact(*a, *s2, *more);
    if (s1->tier != Tier::kOverflow) ReloadExact(*a, *s1, *fill);
  }
  EXPECT_TRUE(spilled);
}

// The group sizes itself by what its members claim: after three steps well below what it holds,
// it gives back the chunks no member uses (another job may lease them), and when its demand comes
// back the depot runs dry once and the group grows again.
TEST_F(Groups, AGroupGivesBackWhatItsMembersStoppedUsingAndGrowsAgain) {
  Start({"--pool-bytes=4MiB", "--chunk-bytes=256KiB", "--host-tier-bytes=0"});
  auto a = Member(daemon_->socket(), "sizing");
  ASSERT_NE(a, nullptr);
  auto big = Buffer(40 * kPage, 21);
  auto small = Buffer(4 * kPage, 22);
  auto held_pages = [&] {
    uint64_t pages = 0;
    const v1::GetStatsResponse stats = DaemonStats(daemon_->socket());
    for (const v1::GroupStats& g : stats.groups()) {
      for (const v1::GroupTierStats& t : g.tiers()) pages += t.pages();
    }
    return pages;
  };
  uint64_t step = 0;
  auto one = [&](const HostBuffer& src) {
    EXPECT_TRUE(a->Wait(*a->BeginStep(step++), 10000).ok());
    auto s = StashPages(*a, src, src.size() / kPage);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (s.ok() && s->tier != Tier::kOverflow) ReloadExact(*a, *s, src);
    return s.ok() ? s->tier : Tier::kOverflow;
  };
  for (int i = 0; i < 3; ++i) EXPECT_EQ(one(*big), Tier::kDevice);
  const uint64_t before = held_pages();
  EXPECT_GE(before, 40u);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(one(*small), Tier::kDevice);
  const uint64_t after = held_pages();
  // Its last three steps claimed 4 pages: it keeps that plus a chunk (4 pages), whole chunks.
  EXPECT_LE(after, 12u) << "held " << before << " pages before";
  // Demand is back: one stash may miss while the group grows, then it fits again.
  Tier tier = one(*big);
  if (tier != Tier::kDevice) tier = one(*big);
  EXPECT_EQ(tier, Tier::kDevice);
  EXPECT_GE(held_pages(), 40u);
}

// A GPU-shaped node: two devices, a member on each. A stash past the own device's pages goes to
// free pages of the group's chunks on the other device (TIER_PEER), before the host tier, and
// the other device's own member still finds the rest.
TEST_F(Groups, AStashPastTheOwnDeviceGoesToAnotherDevicesFreePages) {
  Start({"--devices=2", "--pool-bytes=1MiB", "--chunk-bytes=256KiB", "--host-tier-bytes=0"});
  auto a = Member(daemon_->socket(), "two-devices", false, 0);
  auto b = Member(daemon_->socket(), "two-devices", false, 1);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  // Each device's pool: 16 pages, 12 of them the group's (a chunk stays for another user).
  auto own = Buffer(12 * kPage, 31);
  auto past = Buffer(8 * kPage, 32);
  auto other = Buffer(4 * kPage, 33);
  ASSERT_TRUE(b->Wait(*b->BeginStep(0), 10000).ok());
  ASSERT_TRUE(a->Wait(*a->BeginStep(0), 10000).ok());  // sent device 1's chunks too
  auto s1 = StashPages(*a, *own, 12);
  auto s2 = StashPages(*a, *past, 8);
  auto s3 = StashPages(*b, *other, 4);
  ASSERT_TRUE(s1.ok() && s2.ok() && s3.ok());
  EXPECT_EQ(s1->tier, Tier::kDevice);
  EXPECT_EQ(s2->tier, Tier::kPeer);
  EXPECT_EQ(s3->tier, Tier::kDevice);
  if (s1->tier != Tier::kOverflow) ReloadExact(*a, *s1, *own);
  if (s2->tier != Tier::kOverflow) ReloadExact(*a, *s2, *past);
  if (s3->tier != Tier::kOverflow) ReloadExact(*b, *s3, *other);
}

// --group-peer-tier=false: a member claims its own device's pages only (and the host tier's);
// past them its stash overflows with no host tier, while the other device's pages stay free.
TEST_F(Groups, WithTheGroupPeerTierOffAStashPastTheOwnDeviceDoesNotGoToAnother) {
  Start({"--devices=2", "--pool-bytes=1MiB", "--chunk-bytes=256KiB", "--host-tier-bytes=0",
         "--group-peer-tier=false"});
  auto a = Member(daemon_->socket(), "no-peers", false, 0);
  auto b = Member(daemon_->socket(), "no-peers", false, 1);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  auto own = Buffer(12 * kPage, 41);
  auto past = Buffer(8 * kPage, 42);
  ASSERT_TRUE(b->Wait(*b->BeginStep(0), 10000).ok());
  ASSERT_TRUE(a->Wait(*a->BeginStep(0), 10000).ok());
  auto s1 = StashPages(*a, *own, 12);
  auto s2 = StashPages(*a, *past, 8);
  auto s3 = StashPages(*b, *own, 12);
  ASSERT_TRUE(s1.ok() && s2.ok() && s3.ok());
  EXPECT_EQ(s1->tier, Tier::kDevice);
  EXPECT_EQ(s2->tier, Tier::kOverflow);
  EXPECT_EQ(s3->tier, Tier::kDevice);
}

// Members of the group churn (stashes, reloads, releases) in other processes and are SIGKILLed
// at random points, each one mid-claim or mid-release at some kill: after each kill, within a
// second, this member stashes the whole pool again (every page the dead one owned is back), and
// its own stash reloads byte-exact.
TEST_F(Groups, AMemberKilledAtRandomPointsHasEveryPageBackWithinASecond) {
  Start({"--pool-bytes=2MiB", "--chunk-bytes=256KiB", "--host-tier-bytes=0"});
  auto me = Member(daemon_->socket(), "kill");
  ASSERT_NE(me, nullptr);
  auto whole = Buffer(26 * kPage, 11);  // with its own 2: the group's 28 pages
  auto mine = Buffer(2 * kPage, 12);
  // Hold two pages through everything; the rest is the churners'.
  auto kept = StashPages(*me, *mine, 2);
  ASSERT_TRUE(kept.ok() && kept->tier == Tier::kDevice);
  std::mt19937_64 random(std::random_device{}());
  const uint64_t seed = random();
  random.seed(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  const std::vector<std::string> env = {"STASHD_GROUP=kill", "STASHD_GROUP_SECRET=" + kSecretHex};
  for (int kill = 0; kill < 20; ++kill) {
    Process churn;
    ASSERT_TRUE(churn.Start({BinDir() + "/tests/integration/stash-test-client", daemon_->socket(),
                             "churn", std::to_string(1 << 20)},
                            daemon_->dir() + "/churn", env));
    const auto opened = std::chrono::steady_clock::now() + seconds(10 * TimeScale());
    while (churn.Stdout().find("leased") == std::string::npos &&
           std::chrono::steady_clock::now() < opened && churn.running()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_NE(churn.Stdout().find("leased"), std::string::npos) << churn.Stderr();
    std::this_thread::sleep_for(std::chrono::microseconds(random() % 50000));
    churn.StopWith(SIGKILL, seconds(5));
    const auto killed = std::chrono::steady_clock::now();
    bool whole_back = false;
    while (std::chrono::steady_clock::now() - killed < seconds(5 * TimeScale())) {
      auto s = StashPages(*me, *whole, 26);
      ASSERT_TRUE(s.ok()) << s.status().ToString();
      if (s->tier == Tier::kDevice) {
        const auto took = std::chrono::steady_clock::now() - killed;
        EXPECT_LE(took, seconds(1 * TimeScale()))
            << std::chrono::duration<double>(took).count() << " s after kill " << kill;
        ReloadExact(*me, *s, *whole);
        whole_back = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_TRUE(whole_back) << "kill " << kill;
  }
  ReloadExact(*me, *kept, *mine);
}

}  // namespace
}  // namespace stash
