// Mapped mode end to end (issue 13): what only a mapped session does. The parity suite runs in
// both modes in datapath_test.cc; these are the rules of leased chunks held by the rank itself.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "stash/client.h"
#include "stash/v1/stash.grpc.pb.h"
#include "tests/integration/daemon_stats.h"
#include "tests/integration/harness.h"
#include "tests/integration/host_buffers.h"

namespace stash {
namespace {

namespace v1 = stash::v1;
using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::Args;
using testing::Buffer;
using testing::DaemonProcess;
using testing::DaemonStats;
using testing::PagesUsed;
using testing::TimeScale;

constexpr uint64_t kPage = 64 << 10;

// Memfd mappings of this process (/proc/self/maps lines naming a memfd).
int MemfdMappings() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  int n = 0;
  while (std::getline(maps, line)) n += line.find("/memfd:") != std::string::npos ? 1 : 0;
  return n;
}

class Mapped : public ::testing::Test {
 protected:
  void StartDaemon(std::vector<std::string> flags) {
    flags.push_back("--page-bytes=64KiB");
    flags.push_back("--log-level=warn");
    flags_ = flags;
    daemon_ = std::make_unique<DaemonProcess>(flags);
    ASSERT_TRUE(daemon_->Ready()) << daemon_->process().Stderr();
    socket_ = daemon_->socket();
  }
  // A fixed lease of `device` and `host` bytes (`peer` of other devices' chunks).
  std::unique_ptr<Client> Connect(uint64_t device, uint64_t host, uint64_t peer = 0) {
    Options o;
    o.socket = socket_;
    o.mode = Mode::kMapped;
    o.lease.automatic = false;
    o.lease.device_bytes = device;
    o.lease.host_bytes = host;
    o.lease.peer_bytes = peer;
    o.allow_host_spill = host > 0;
    auto c = Client::Open(o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(c).value() : nullptr;
  }
  // What `stashctl --socket=<the daemon's> ARGS...` printed (it must succeed).
  std::string Stashctl(const std::vector<std::string>& args) {
    testing::Process p;
    std::vector<std::string> argv = {testing::BinDir() + "/client/stashctl/stashctl",
                                     "--socket=" + socket_};
    argv.insert(argv.end(), args.begin(), args.end());
    EXPECT_TRUE(p.Start(argv, daemon_->dir() + "/stashctl"));
    EXPECT_EQ(p.Wait(seconds(10 * TimeScale())), 0) << p.Stderr();
    return p.Stdout();
  }
  void TearDown() override {
    for (auto* d : {daemon_.get(), restarted_.get()}) {
      if (d != nullptr && d->process().running()) {
        EXPECT_EQ(d->process().StopWith(SIGTERM, seconds(5 * TimeScale())), 0)
            << d->process().Stderr();
      }
    }
  }

  std::vector<std::string> flags_;
  std::string socket_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<DaemonProcess> restarted_;
};

// Mapped mode on the cuda backend is the GPU twin (tests/integration/cuda_mapped_test.cc); with
// no usable driver here it is refused at Open with what is missing.
TEST_F(Mapped, TheCudaBackendWithoutADriverIsRefusedSayingWhatIsMissing) {
  Options o;
  o.mode = Mode::kMapped;
  o.backend = Backend::kCuda;
  o.socket = "/nonexistent/stashd.sock";
  auto c = Client::Open(o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kFailedPrecondition) << c.status().ToString();
  EXPECT_NE(c.status().message().find("CUDA"), std::string::npos) << c.status().ToString();
}

// The daemon SIGKILLed mid-step: the rank's chunks stay mapped in the rank (a memfd lives while
// mapped), so stashes made before reload byte-exact, new ones that fit the chunks still go in,
// those that do not overflow, and the step finishes. The next BeginStep with no stash live
// reconnects to the daemon restarted on the same socket and leases afresh.
// Two ranks mid-step when stashd is SIGKILLed: each finishes its step byte-exact on the chunks
// it holds, and the next step (no stash live) runs against a restarted daemon.
TEST_F(Mapped, DaemonKilledMidStepLosesNothingAndTheNextStepReleases) {
  StartDaemon({"--pool-bytes=8MiB", "--host-tier-bytes=0", "--max-lease-bytes=64MiB"});
  struct Rank {
    std::unique_ptr<Client> client;
    std::string first_session;
    std::vector<std::unique_ptr<HostBuffer>> src;
    std::vector<uint64_t> tickets;
    std::unique_ptr<HostBuffer> big;
  };
  std::vector<Rank> ranks(2);
  for (size_t r = 0; r < ranks.size(); ++r) {
    Rank& rank = ranks[r];
    rank.client = Connect(2 << 20, 0);  // 32 pages each
    ASSERT_NE(rank.client, nullptr);
    rank.first_session = rank.client->session_id();
    ASSERT_TRUE(rank.client->Wait(*rank.client->BeginStep(1)).ok());
    for (int i = 0; i < 2; ++i) {
      rank.src.push_back(Buffer(8 * kPage, static_cast<uint32_t>(10 + 10 * r + i)));
      rank.tickets.push_back(*rank.client->Stash(Args(*rank.src.back(), kPage, 8)));
    }
    for (uint64_t t : rank.tickets) ASSERT_TRUE(rank.client->Wait(t).ok());
  }

  daemon_->process().StopWith(SIGKILL, seconds(5));

  for (size_t r = 0; r < ranks.size(); ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    Rank& rank = ranks[r];
    Client& client = *rank.client;
    // A stash that fits the chunks held still goes in; one that does not overflows.
    rank.src.push_back(Buffer(8 * kPage, static_cast<uint32_t>(12 + 10 * r)));
    auto fits = client.Wait(*client.Stash(Args(*rank.src.back(), kPage, 8)));
    ASSERT_TRUE(fits.ok()) << fits.status().ToString();
    EXPECT_EQ(fits->tier, Tier::kDevice);
    rank.tickets.push_back(fits->ticket);
    rank.big = Buffer(16 * kPage, static_cast<uint32_t>(13 + 10 * r));
    auto over = client.Wait(*client.Stash(Args(*rank.big, kPage, 16)));
    ASSERT_TRUE(over.ok()) << over.status().ToString();
    EXPECT_EQ(over->tier, Tier::kOverflow);
    EXPECT_TRUE(client.CurrentStepFlags().overflow);
    // A BeginStep while stashes are live goes on with the chunks held.
    auto step2 = client.Wait(*client.BeginStep(2));
    ASSERT_TRUE(step2.ok()) << step2.status().ToString();
    EXPECT_TRUE(step2->step_overflow);
    // Backward: everything reloads byte-exact.
    for (size_t i = 0; i < rank.tickets.size(); ++i) {
      auto dst = Buffer(8 * kPage);
      auto done = client.Wait(*client.Reload({rank.tickets[i], dst.get(), 0, false, {}, {}}));
      ASSERT_TRUE(done.ok()) << done.status().ToString();
      EXPECT_EQ(std::memcmp(dst->data(), rank.src[i]->data(), 8 * kPage), 0) << i;
    }
    EXPECT_EQ(client.Stats().status().code(), StatusCode::kUnavailable);
  }

  // stashd restarts on the same socket; the next step (no stash live) reconnects.
  std::vector<std::string> again = flags_;
  again.push_back("--socket=" + socket_);
  restarted_ = std::make_unique<DaemonProcess>(again);
  // (Ready() watches the harness's own socket path; this daemon serves the first one's.)
  const auto deadline = std::chrono::steady_clock::now() + seconds(10 * TimeScale());
  while (!testing::SocketAccepts(socket_)) {
    ASSERT_TRUE(restarted_->process().running()) << restarted_->process().Stderr();
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << restarted_->process().Stderr();
    std::this_thread::sleep_for(milliseconds(10));
  }
  // The new session is opened off the copier (a daemon that hangs must not stall stashes) and
  // takes over at the first moment no stash is live: a step or two.
  for (Rank& rank : ranks) {
    Client& client = *rank.client;
    uint64_t step = 3;
    const auto until = std::chrono::steady_clock::now() + seconds(10 * TimeScale());
    auto on_new_session = [&] {
      auto stats = client.Stats();
      return stats.ok() && stats->session_id != rank.first_session;
    };
    while (!on_new_session()) {
      ASSERT_TRUE(client.Wait(*client.BeginStep(step++)).ok());
      ASSERT_LT(std::chrono::steady_clock::now(), until) << "no new session";
      std::this_thread::sleep_for(milliseconds(5));
    }
  }
  std::vector<uint64_t> stashed;
  for (Rank& rank : ranks) {
    Client& client = *rank.client;
    ASSERT_TRUE(client.Wait(*client.BeginStep(100)).ok());
    auto t = client.Wait(*client.Stash(Args(*rank.big, kPage, 16)));
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    EXPECT_EQ(t->tier, Tier::kDevice);
    stashed.push_back(t->ticket);
    auto stats = client.Stats();
    ASSERT_TRUE(stats.ok()) << stats.status().ToString();
    EXPECT_NE(stats->session_id, rank.first_session);
    EXPECT_EQ(stats->stashes_live, 1u);
  }
  const auto daemon_view = DaemonStats(socket_);
  ASSERT_EQ(daemon_view.sessions_size(), 2);
  for (const auto& session : daemon_view.sessions()) {
    EXPECT_EQ(session.mode(), stash::v1::MODE_MAPPED);
    EXPECT_EQ(session.pages_live(), 16u);
  }
  for (size_t r = 0; r < ranks.size(); ++r) {
    auto dst = Buffer(16 * kPage);
    Client& client = *ranks[r].client;
    ASSERT_TRUE(client.Wait(*client.Reload({stashed[r], dst.get(), 0, false, {}, {}})).ok());
    EXPECT_EQ(std::memcmp(dst->data(), ranks[r].big->data(), ranks[r].big->size()), 0) << r;
  }
}

TEST_F(Mapped, AForkedChildDoesNotInheritTheChunks) {
  StartDaemon({"--pool-bytes=4MiB", "--max-lease-bytes=64MiB"});
  auto client = Connect(4 << 20, 0);
  ASSERT_NE(client, nullptr);
  auto src = Buffer(4 * kPage, 3);
  ASSERT_TRUE(client->Wait(*client->Stash(Args(*src, kPage, 4))).ok());
  const int parent = MemfdMappings();
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const int child = MemfdMappings();
    (void)!write(fds[1], &child, sizeof(child));
    _exit(0);
  }
  int child = -1;
  ASSERT_EQ(read(fds[0], &child, sizeof(child)), static_cast<ssize_t>(sizeof(child)));
  close(fds[0]);
  close(fds[1]);
  int status = 0;
  waitpid(pid, &status, 0);
  // Every chunk (and the control block) stays behind; the HostBuffers are inherited as usual.
  const auto stats = DaemonStats(socket_);
  ASSERT_EQ(stats.sessions_size(), 1);
  uint64_t chunks = 0;
  for (const auto& l : stats.sessions(0).leases()) chunks += l.chunks();
  ASSERT_GT(chunks, 0u);
  EXPECT_GE(parent - child, static_cast<int>(chunks))
      << parent << " in the rank, " << child << " in its child";
}

// A stash that does not fit the chunks leased overflows, even when the pool has room: the rank
// pages only into its lease. It fits again once the lease has room.
TEST_F(Mapped, AFullLeaseOverflowsThoughThePoolHasRoom) {
  StartDaemon({"--pool-bytes=8MiB", "--host-tier-bytes=0", "--max-lease-bytes=64MiB"});
  auto client = Connect(1 << 20, 0);  // 16 of the pool's 128 pages
  ASSERT_NE(client, nullptr);
  auto src = Buffer(12 * kPage, 5);
  auto a = client->Wait(*client->Stash(Args(*src, kPage, 12)));
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->tier, Tier::kDevice);
  auto b = client->Wait(*client->Stash(Args(*src, kPage, 12)));
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->tier, Tier::kOverflow);
  EXPECT_TRUE(client->CurrentStepFlags().overflow);
  ASSERT_TRUE(client->Wait(*client->Release(a->ticket)).ok());
  auto c = client->Wait(*client->Stash(Args(*src, kPage, 12)));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->tier, Tier::kDevice);
  const auto stats = DaemonStats(socket_);
  ASSERT_EQ(stats.sessions_size(), 1);
  EXPECT_EQ(stats.sessions(0).overflows(), 1u);
}

// A full own lease spills whole stashes to the host chunks it leased, byte-exact.
TEST_F(Mapped, AFullDeviceLeaseSpillsToTheHostLease) {
  StartDaemon({"--pool-bytes=8MiB", "--host-tier-bytes=8MiB", "--max-lease-bytes=64MiB"});
  auto client = Connect(1 << 20, 4 << 20);
  ASSERT_NE(client, nullptr);
  auto a = Buffer(12 * kPage, 6);
  auto b = Buffer(12 * kPage, 7);
  auto da = client->Wait(*client->Stash(Args(*a, kPage, 12)));
  ASSERT_TRUE(da.ok());
  EXPECT_EQ(da->tier, Tier::kDevice);
  EXPECT_FALSE(client->CurrentStepFlags().spilled);
  auto db = client->Wait(*client->Stash(Args(*b, kPage, 12)));
  ASSERT_TRUE(db.ok());
  EXPECT_EQ(db->tier, Tier::kHost);
  EXPECT_TRUE(client->CurrentStepFlags().spilled);
  auto out = Buffer(12 * kPage);
  auto rb = client->Wait(*client->Reload({db->ticket, out.get(), 0, false, {}, {}}));
  ASSERT_TRUE(rb.ok());
  EXPECT_EQ(rb->tier, Tier::kHost);
  EXPECT_EQ(std::memcmp(out->data(), b->data(), b->size()), 0);
  ASSERT_TRUE(client->Wait(*client->Reload({da->ticket, out.get(), 0, false, {}, {}})).ok());
  EXPECT_EQ(std::memcmp(out->data(), a->data(), a->size()), 0);
  const auto stats = DaemonStats(socket_);
  ASSERT_EQ(stats.sessions_size(), 1);
  EXPECT_EQ(stats.sessions(0).spills(), 1u);
}

// With --peer-tier, a full own lease spills to another device's spare chunks before the host.
TEST_F(Mapped, AFullDeviceLeaseSpillsToAPeerDevice) {
  StartDaemon({"--devices=2", "--pool-bytes=8MiB", "--host-tier-bytes=8MiB", "--peer-tier=true",
               "--max-lease-bytes=64MiB"});
  auto client = Connect(1 << 20, 1 << 20, 1 << 20);
  ASSERT_NE(client, nullptr);
  auto src = Buffer(12 * kPage, 8);
  EXPECT_EQ(client->Wait(*client->Stash(Args(*src, kPage, 12)))->tier, Tier::kDevice);
  auto peer = client->Wait(*client->Stash(Args(*src, kPage, 12)));
  ASSERT_TRUE(peer.ok());
  EXPECT_EQ(peer->tier, Tier::kPeer);
  EXPECT_EQ(client->Wait(*client->Stash(Args(*src, kPage, 12)))->tier, Tier::kHost);
  auto out = Buffer(12 * kPage);
  ASSERT_TRUE(client->Wait(*client->Reload({peer->ticket, out.get(), 0, false, {}, {}})).ok());
  EXPECT_EQ(std::memcmp(out->data(), src->data(), src->size()), 0);
}

// Closing gives every chunk back at once (the holder unmapped them and said so).
TEST_F(Mapped, ClosingReturnsTheLease) {
  StartDaemon({"--pool-bytes=8MiB", "--max-lease-bytes=64MiB"});
  auto client = Connect(2 << 20, 0);
  ASSERT_NE(client, nullptr);
  auto src = Buffer(4 * kPage, 9);
  ASSERT_TRUE(client->Wait(*client->Stash(Args(*src, kPage, 4))).ok());
  EXPECT_GE(PagesUsed(DaemonStats(socket_)), 32u);  // the lease counts as used
  client.reset();
  const auto limit = std::chrono::steady_clock::now() + milliseconds(1000 * TimeScale());
  uint64_t used = 0;
  do {
    used = PagesUsed(DaemonStats(socket_));
    if (used == 0) break;
    std::this_thread::sleep_for(milliseconds(5));
  } while (std::chrono::steady_clock::now() < limit);
  EXPECT_EQ(used, 0u);
}

// Auto sizing, seen from the rank: the first lease is half the own pool's free chunks; stashes
// that overflowed make a later BeginStep lease what the own pool cannot hold from the host
// tier, where the same stash then goes. (Three stashes of half the pool: the daemon sizes by
// pages, while a stash goes whole into one tier, so the host share must hold a whole one.) The
// lease's round trip runs off the copier, so the growth lands within a step or two.
TEST_F(Mapped, AnAutoLeaseGrowsToTheHostAfterAnOverflow) {
  // 17 one-page chunks: one stays for another user's first session, 16 can be leased.
  StartDaemon({"--pool-bytes=1088KiB", "--host-tier-bytes=8MiB", "--max-lease-bytes=4MiB"});
  Options o;
  o.socket = socket_;
  o.mode = Mode::kMapped;  // lease automatic by default
  auto opened = Client::Open(o);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  std::unique_ptr<Client> client = std::move(opened).value();
  auto src = Buffer(8 * kPage, 14);
  auto step_of_three = [&](uint64_t step) {
    std::vector<Completion> out;
    auto begun = client->Wait(*client->BeginStep(step));
    EXPECT_TRUE(begun.ok()) << begun.status().ToString();
    for (int i = 0; i < 3; ++i) {
      auto c = client->Wait(*client->Stash(Args(*src, kPage, 8)));
      EXPECT_TRUE(c.ok()) << c.status().ToString();
      if (c.ok()) out.push_back(*c);
    }
    return out;
  };
  std::vector<Completion> first = step_of_three(0);
  ASSERT_EQ(first.size(), 3u);
  EXPECT_EQ(first[0].tier, Tier::kDevice);  // 8 of the 17 pages: one stash
  EXPECT_EQ(first[1].tier, Tier::kOverflow);
  // The second stash's overflow asks for more; when the answer comes before the third stash
  // (a fast daemon), the third already lands in the grown lease.
  EXPECT_NE(first[2].tier, Tier::kPeer);  // this daemon lends no peer chunks
  for (const Completion& c : first) {
    if (c.tier != Tier::kOverflow) {
      ASSERT_TRUE(client->Wait(*client->Release(c.ticket)).ok());
    }
  }
  std::vector<Completion> grown;
  for (uint64_t step = 1; step < 20 && grown.empty(); ++step) {
    std::vector<Completion> got = step_of_three(step);
    ASSERT_EQ(got.size(), 3u);
    bool overflowed = false;
    for (const Completion& c : got) overflowed = overflowed || c.tier == Tier::kOverflow;
    if (!overflowed) {
      grown = got;
      break;
    }
    for (const Completion& c : got) {
      if (c.tier != Tier::kOverflow) {
        ASSERT_TRUE(client->Wait(*client->Release(c.ticket)).ok());
      }
    }
    std::this_thread::sleep_for(milliseconds(20));
  }
  ASSERT_EQ(grown.size(), 3u) << "the lease never grew to hold the step";
  EXPECT_EQ(grown[0].tier, Tier::kDevice);
  EXPECT_EQ(grown[1].tier, Tier::kDevice);
  EXPECT_EQ(grown[2].tier, Tier::kHost);
  auto dst = Buffer(8 * kPage);
  ASSERT_TRUE(client->Wait(*client->Reload({grown[2].ticket, dst.get(), 0, false, {}, {}})).ok());
  EXPECT_EQ(std::memcmp(dst->data(), src->data(), src->size()), 0);
}

// Auto sizing shrinks a lease whose pages sit unused for several steps: the rank gives back
// chunks that hold no stash (ReturnChunks) and keeps the one its live stash is in, byte-exact.
TEST_F(Mapped, AnAutoLeaseShrinksWhenPagesSitUnusedAndKeepsLiveStashes) {
  // 34 chunks of 2 pages: the first automatic lease takes half, 34 pages.
  StartDaemon({"--pool-bytes=4352KiB", "--host-tier-bytes=0"});
  Options o;
  o.socket = socket_;
  o.mode = Mode::kMapped;
  auto opened = Client::Open(o);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  std::unique_ptr<Client> client = std::move(opened).value();
  auto leased = [&] {
    const auto stats = DaemonStats(socket_);
    uint64_t pages = 0;
    for (const auto& s : stats.sessions()) {
      for (const auto& l : s.leases()) pages += l.pages_leased();
    }
    return pages;
  };
  const uint64_t at_start = leased();
  EXPECT_EQ(at_start, 34u);
  auto src = Buffer(kPage, 15);
  auto kept = client->Wait(*client->Stash(Args(*src, kPage, 1)));
  ASSERT_TRUE(kept.ok());
  // Steps of one small stash each (a step with none would be no sample of demand).
  const auto until = std::chrono::steady_clock::now() + seconds(10 * TimeScale());
  for (uint64_t step = 1; leased() >= at_start; ++step) {
    ASSERT_LT(std::chrono::steady_clock::now(), until) << "the lease never shrank";
    ASSERT_TRUE(client->Wait(*client->BeginStep(step)).ok());
    auto small = client->Wait(*client->Stash(Args(*src, kPage, 1)));
    ASSERT_TRUE(small.ok());
    ASSERT_TRUE(client->Wait(*client->Release(small->ticket)).ok());
    std::this_thread::sleep_for(milliseconds(10));
  }
  EXPECT_GE(leased(), 1u);
  auto dst = Buffer(kPage);
  ASSERT_TRUE(client->Wait(*client->Reload({kept->ticket, dst.get(), 0, false, {}, {}})).ok());
  EXPECT_EQ(std::memcmp(dst->data(), src->data(), kPage), 0);
}

// Issue 21: the node's totals (stashctl stats, stashd_*_total) and the event log count a mapped
// session's stashes, reloads, bytes, spills and overflows from its control block, each once,
// and keep them after the session ends.
TEST_F(Mapped, NodeTotalsAndTheEventLogCountMappedStashesSpillsAndOverflows) {
  StartDaemon({"--pool-bytes=8MiB", "--host-tier-bytes=8MiB", "--max-lease-bytes=64MiB"});
  auto client = Connect(1 << 20, 1 << 20);  // 16 pages on the device, 16 on the host
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Wait(*client->BeginStep(4)).ok());
  auto src = Buffer(12 * kPage, 21);
  auto a = client->Wait(*client->Stash(Args(*src, kPage, 12)));
  auto b = client->Wait(*client->Stash(Args(*src, kPage, 12)));
  auto c = client->Wait(*client->Stash(Args(*src, kPage, 12)));
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  ASSERT_EQ(a->tier, Tier::kDevice);
  ASSERT_EQ(b->tier, Tier::kHost);
  ASSERT_EQ(c->tier, Tier::kOverflow);
  auto out = Buffer(12 * kPage);
  ASSERT_TRUE(client->Wait(*client->Reload({a->ticket, out.get(), 0, false, {}, {}})).ok());
  auto expect_totals = [&](const char* when) {
    const v1::DaemonStats d = DaemonStats(socket_).daemon();
    EXPECT_EQ(d.stashes(), 2u) << when;
    EXPECT_EQ(d.reloads(), 1u) << when;
    EXPECT_EQ(d.bytes_stashed(), 24 * kPage) << when;
    EXPECT_EQ(d.bytes_reloaded(), 12 * kPage) << when;
    EXPECT_EQ(d.spills(), 1u) << when;
    EXPECT_EQ(d.overflows(), 1u) << when;
  };
  expect_totals("during the step");
  expect_totals("read again: nothing counted twice");
  const std::string stats = Stashctl({"stats"});
  EXPECT_NE(stats.find("stashes 2  reloads 1  releases 0  stashed 1.5 MiB  reloaded 768 KiB"),
            std::string::npos)
      << stats;
  EXPECT_NE(stats.find("spills 1  overflows 1"), std::string::npos) << stats;
  client.reset();  // the session ends; the node's counters keep what it did
  expect_totals("after the session ended");
  // The event lines say so, naming the session's rank and step as daemon-copy lines do.
  const auto limit = std::chrono::steady_clock::now() + seconds(5 * TimeScale());
  while (daemon_->process().Stderr().find("(mapped): 1 stashes found no room") ==
             std::string::npos &&
         std::chrono::steady_clock::now() < limit) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  const std::string log = daemon_->process().Stderr();
  EXPECT_NE(log.find("(mapped): 1 stashes found no room in the chunks leased to the session by "
                     "step 4"),
            std::string::npos)
      << log;
}

// A rank SIGKILLed right after its last stashes: nothing asked for stats while it lived, yet
// the node's totals count its last step (the daemon reads its control block once more when the
// session ends and when its process is gone).
TEST_F(Mapped, NodeTotalsCountAKilledRanksLastStep) {
  StartDaemon({"--pool-bytes=8MiB", "--host-tier-bytes=0", "--max-lease-bytes=1MiB"});
  testing::Process rank;
  // Two stashes of 10 pages into an automatic lease of 16: one placed, one overflows.
  ASSERT_TRUE(rank.Start({testing::BinDir() + "/tests/integration/stash-test-client", socket_,
                          "hold-mapped", std::to_string(10 * kPage)},
                         daemon_->dir() + "/rank"));
  const auto limit = std::chrono::steady_clock::now() + seconds(10 * TimeScale());
  while (rank.Stdout().find("held") == std::string::npos && rank.running() &&
         std::chrono::steady_clock::now() < limit) {
    std::this_thread::sleep_for(milliseconds(1));
  }
  ASSERT_NE(rank.Stdout().find("held placed overflow"), std::string::npos)
      << rank.Stdout() << rank.Stderr();
  ASSERT_EQ(rank.StopWith(SIGKILL, seconds(10)), 128 + SIGKILL);
  v1::DaemonStats d;
  while (std::chrono::steady_clock::now() < limit) {
    const v1::GetStatsResponse stats = DaemonStats(socket_);
    d = stats.daemon();
    if (stats.sessions_size() == 0 && PagesUsed(stats) == 0) break;
    std::this_thread::sleep_for(milliseconds(5));
  }
  EXPECT_EQ(d.sessions_live(), 0u);
  EXPECT_EQ(d.stashes(), 1u);
  EXPECT_EQ(d.overflows(), 1u);
  EXPECT_EQ(d.bytes_stashed(), 10 * kPage);
}

// Issue 21: `stashctl sessions --detail` / --json show a mapped session's live stashes by
// (layer, microbatch, name), from the list of tags its rank keeps in the control block, as for
// daemon-copy sessions; the JSON never has "live": [] beside live stashes.
TEST_F(Mapped, SessionsShowLiveStashesByLayerMicrobatchAndName) {
  StartDaemon({"--pool-bytes=8MiB", "--host-tier-bytes=0", "--max-lease-bytes=64MiB"});
  auto client = Connect(4 << 20, 0);
  ASSERT_NE(client, nullptr);
  auto src = Buffer(4 * kPage, 22);
  auto tagged = [&](uint32_t layer, uint32_t microbatch, const std::string& name, uint64_t rows) {
    StashArgs a = Args(*src, kPage, rows);
    a.layer = layer;
    a.microbatch = microbatch;
    a.name = name;
    auto done = client->Wait(*client->Stash(a));
    EXPECT_TRUE(done.ok() && done->tier == Tier::kDevice);
    return done.ok() ? done->ticket : 0;
  };
  const uint64_t fc1_a = tagged(1, 0, "fc1", 2);
  tagged(1, 0, "fc1", 3);
  const uint64_t experts = tagged(2, 1, "experts", 4);
  ASSERT_TRUE(client->Wait(*client->Release(fc1_a)).ok());
  tagged(1, 0, "fc1", 1);
  v1::GetStatsResponse stats = DaemonStats(socket_);
  ASSERT_EQ(stats.sessions_size(), 1);
  v1::SessionStats s = stats.sessions(0);
  EXPECT_EQ(s.stashes_live(), 3u);
  EXPECT_EQ(s.live_untagged(), 0u);
  ASSERT_EQ(s.live_size(), 2) << s.DebugString();
  EXPECT_EQ(s.live(0).layer(), 1u);
  EXPECT_EQ(s.live(0).microbatch(), 0u);
  EXPECT_EQ(s.live(0).name(), "fc1");
  EXPECT_EQ(s.live(0).stashes(), 2u);
  EXPECT_EQ(s.live(0).bytes(), 4 * kPage);
  EXPECT_EQ(s.live(0).pages(), 4u);
  EXPECT_EQ(s.live(1).layer(), 2u);
  EXPECT_EQ(s.live(1).microbatch(), 1u);
  EXPECT_EQ(s.live(1).name(), "experts");
  EXPECT_EQ(s.live(1).stashes(), 1u);
  EXPECT_EQ(s.live(1).bytes(), 4 * kPage);

  const std::string detail = Stashctl({"sessions", "--detail"});
  EXPECT_NE(detail.find("live stashes by layer, microbatch and name"), std::string::npos) << detail;
  EXPECT_NE(detail.find("experts"), std::string::npos) << detail;
  const std::string json = Stashctl({"sessions", "--json"});
  EXPECT_NE(json.find("\"name\": \"fc1\""), std::string::npos) << json;
  EXPECT_EQ(json.find("\"live\": []"), std::string::npos) << json;

  // Reloaded and released, the rows go.
  auto out = Buffer(4 * kPage);
  ASSERT_TRUE(client->Wait(*client->Reload({experts, out.get(), 0, false, {}, {}})).ok());
  s = DaemonStats(socket_).sessions(0);
  ASSERT_EQ(s.live_size(), 1);
  EXPECT_EQ(s.live(0).name(), "fc1");
}

}  // namespace
}  // namespace stash
