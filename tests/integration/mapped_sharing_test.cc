// Mapped sessions sharing a pool (issue 21): fair first leases, chunks given back when another
// session needs them, and lease round trips that never stall a rank's stashes.
#include <signal.h>

#include <gtest/gtest.h>

#include <algorithm>
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

using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::Buffer;
using testing::DaemonProcess;
using testing::TimeScale;

constexpr uint64_t kPage = 64 << 10;

StashArgs Args(const HostBuffer& src, uint64_t rows) { return testing::Args(src, kPage, rows); }

std::unique_ptr<Client> Open(const std::string& socket, bool automatic = true,
                             uint64_t device_bytes = 0) {
  Options o;
  o.socket = socket;
  o.mode = Mode::kMapped;
  o.lease.automatic = automatic;
  o.lease.device_bytes = device_bytes;
  auto c = Client::Open(o);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(c).value() : nullptr;
}

// One training step of a rank: stashes of `sources`, then their reloads, checked byte-exact.
// Returns the tiers the stashes went to.
std::vector<Tier> Step(Client& client, uint64_t step,
                       const std::vector<std::unique_ptr<HostBuffer>>& sources) {
  std::vector<Tier> tiers;
  EXPECT_TRUE(client.Wait(*client.BeginStep(step), 10000).ok());
  std::vector<uint64_t> tickets;
  for (const auto& src : sources) {
    auto done = client.Wait(*client.Stash(Args(*src, src->size() / kPage)), 10000);
    EXPECT_TRUE(done.ok()) << done.status().ToString();
    if (!done.ok()) return tiers;
    tiers.push_back(done->tier);
    tickets.push_back(done->tier == Tier::kOverflow ? 0 : done->ticket);
  }
  for (size_t i = 0; i < sources.size(); ++i) {
    if (tickets[i] == 0) continue;
    auto dst = Buffer(sources[i]->size());
    auto back = client.Wait(*client.Reload({tickets[i], dst.get(), 0, false, {}, {}}), 10000);
    EXPECT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(std::memcmp(dst->data(), sources[i]->data(), dst->size()), 0) << "stash " << i;
  }
  return tiers;
}

class MappedSharing : public ::testing::Test {
 protected:
  void StartDaemon(std::vector<std::string> flags) {
    flags.push_back("--page-bytes=64KiB");
    flags.push_back("--log-level=warn");
    daemon_ = std::make_unique<DaemonProcess>(flags);
    ASSERT_TRUE(daemon_->Ready()) << daemon_->process().Stderr();
  }
  void TearDown() override {
    if (daemon_ != nullptr && daemon_->process().running()) {
      kill(daemon_->process().pid(), SIGCONT);
      EXPECT_EQ(daemon_->process().StopWith(SIGTERM, seconds(5 * TimeScale())), 0)
          << daemon_->process().Stderr();
    }
  }
  std::unique_ptr<DaemonProcess> daemon_;
};

// Four ranks on one device whose pool holds all four comfortably (128 MiB, ~5 MiB each), with
// the daemon's default chunks and quota and automatic leases: no stash overflows on any step.
// (Before, the first rank's first lease took the whole pool and three of four overflowed.)
TEST_F(MappedSharing, FourRanksOnAPoolThatHoldsThemAllNeverOverflow) {
  StartDaemon({"--pool-bytes=128MiB", "--host-tier-bytes=0"});
  std::vector<std::unique_ptr<Client>> ranks;
  for (int r = 0; r < 4; ++r) {
    ranks.push_back(Open(daemon_->socket()));
    ASSERT_NE(ranks.back(), nullptr);
  }
  std::vector<std::vector<std::unique_ptr<HostBuffer>>> sources(ranks.size());
  for (size_t r = 0; r < ranks.size(); ++r) {
    for (uint32_t i = 0; i < 5; ++i) {
      sources[r].push_back(Buffer(16 * kPage, static_cast<uint32_t>(100 * r + i + 1)));  // 1 MiB
    }
  }
  for (uint64_t step = 0; step < 6; ++step) {
    for (size_t r = 0; r < ranks.size(); ++r) {
      for (Tier tier : Step(*ranks[r], step, sources[r])) {
        EXPECT_EQ(tier, Tier::kDevice) << "rank " << r << " step " << step;
      }
    }
  }
}

// A session that finds the pool leased out: the automatic session holding more than its demand
// gives the rest back at its next step (asked through its control block, not after three steps
// below its aim), and the newcomer's next lease takes it.
TEST_F(MappedSharing, ANewcomerGetsChunksAnIdleSessionGivesBackAtItsNextStep) {
  // 32 chunks of 8 pages (512 KiB); a user keeps 2 free for another user's first session.
  StartDaemon({"--pool-bytes=16MiB", "--host-tier-bytes=0"});
  auto idle = Open(daemon_->socket());  // half the pool: 16 chunks
  ASSERT_NE(idle, nullptr);
  std::vector<std::unique_ptr<HostBuffer>> busy, small;
  for (uint32_t i = 0; i < 15; ++i) busy.push_back(Buffer(8 * kPage, 20 + i));
  small.push_back(Buffer(kPage, 7));
  for (Tier tier : Step(*idle, 0, busy)) EXPECT_EQ(tier, Tier::kDevice);
  Step(*idle, 1, small);  // its lease is sized to step 0's demand: all 16 chunks
  // A fixed lease takes all this user may still take (14 chunks); the newcomer gets none.
  auto fixed = Open(daemon_->socket(), /*automatic=*/false, 14 * 8 * kPage);
  ASSERT_NE(fixed, nullptr);
  auto newcomer = Open(daemon_->socket());
  ASSERT_NE(newcomer, nullptr);
  std::vector<std::unique_ptr<HostBuffer>> work;
  work.push_back(Buffer(40 * kPage, 9));  // 2.5 MiB: five chunks
  EXPECT_EQ(Step(*newcomer, 0, work), std::vector<Tier>{Tier::kOverflow});
  // The idle session's next step: step 1's demand was one page, and a session waits.
  Step(*idle, 2, small);
  const auto settle = milliseconds(300 * TimeScale());
  std::this_thread::sleep_for(settle);  // its chunks go back off its copier
  ASSERT_TRUE(newcomer->Wait(*newcomer->BeginStep(1), 10000).ok());
  std::this_thread::sleep_for(settle);  // the newcomer's lease lands off its copier
  auto placed = newcomer->Wait(*newcomer->Stash(Args(*work[0], 40)), 10000);
  ASSERT_TRUE(placed.ok()) << placed.status().ToString();
  EXPECT_EQ(placed->tier, Tier::kDevice) << "the idle session did not give back at its next step";
}

// The lease quota holds for each tier: with the default (one pool), a rank whose steps need
// more than its pool leases the pool and spills the rest to the host tier instead of
// overflowing. (Before, one quota over all tiers went to the device lease, and the host tier
// the README's mapped example configures stayed unused.)
TEST_F(MappedSharing, WithTheDefaultQuotaARankBeyondItsPoolSpillsToTheHostTier) {
  StartDaemon({"--pool-bytes=8MiB", "--host-tier-bytes=16MiB"});
  auto rank = Open(daemon_->socket());
  ASSERT_NE(rank, nullptr);
  std::vector<std::unique_ptr<HostBuffer>> sources;
  for (uint32_t i = 0; i < 12; ++i) sources.push_back(Buffer(16 * kPage, 40 + i));  // 12 MiB
  std::vector<Tier> tiers;
  bool fits = false;
  for (uint64_t step = 0; step < 6 && !fits; ++step) {
    tiers = Step(*rank, step, sources);
    fits = std::find(tiers.begin(), tiers.end(), Tier::kOverflow) == tiers.end();
    std::this_thread::sleep_for(milliseconds(50 * TimeScale()));  // the lease lands
  }
  EXPECT_TRUE(fits) << "a step of 12 MiB on an 8 MiB pool with a 16 MiB host tier still overflows";
  EXPECT_NE(std::find(tiers.begin(), tiers.end(), Tier::kHost), tiers.end());
}

// The daemon stops answering (SIGSTOP) mid-job: a mapped rank's steps go on, stashes and
// reloads answered at once from the chunks it holds; the lease round trip waits on its own
// thread. (Before, each BeginStep's lease blocked the rank's copier for the channel's timeout.)
TEST_F(MappedSharing, AHungDaemonNeverStallsAMappedRanksStashes) {
  StartDaemon({"--pool-bytes=16MiB", "--host-tier-bytes=0"});
  auto rank = Open(daemon_->socket());
  ASSERT_NE(rank, nullptr);
  std::vector<std::unique_ptr<HostBuffer>> sources;
  sources.push_back(Buffer(4 * kPage, 3));
  sources.push_back(Buffer(8 * kPage, 4));
  Step(*rank, 0, sources);
  ASSERT_EQ(kill(daemon_->process().pid(), SIGSTOP), 0);
  for (uint64_t step = 1; step <= 3; ++step) {
    auto begun = rank->Wait(*rank->BeginStep(step), 2000);
    ASSERT_TRUE(begun.ok()) << begun.status().ToString();
    std::vector<uint64_t> tickets;
    for (const auto& src : sources) {
      auto done = rank->Wait(*rank->Stash(Args(*src, src->size() / kPage)), 2000);
      ASSERT_TRUE(done.ok()) << "step " << step << ": " << done.status().ToString();
      EXPECT_EQ(done->tier, Tier::kDevice);
      tickets.push_back(done->ticket);
    }
    for (size_t i = 0; i < sources.size(); ++i) {
      auto dst = Buffer(sources[i]->size());
      auto back = rank->Wait(*rank->Reload({tickets[i], dst.get(), 0, false, {}, {}}), 2000);
      ASSERT_TRUE(back.ok()) << back.status().ToString();
      EXPECT_EQ(std::memcmp(dst->data(), sources[i]->data(), dst->size()), 0);
    }
  }
  ASSERT_EQ(kill(daemon_->process().pid(), SIGCONT), 0);
}

}  // namespace
}  // namespace stash
