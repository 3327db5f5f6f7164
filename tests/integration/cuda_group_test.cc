// Groups on the cuda backend (docs/design.md, "Groups on GPUs"): the mapped sessions of one job on
// one GPU share its pool, and its share of the host tier, page by page through the group's depot
// in that GPU's memory; the plan kernels on the trainers' streams claim a stash's pages and the
// reloads give them back. Runs on the CUDA driver stand-in (tests/cuda_standin, through ctest);
// built again as cuda_group_gpu_test (label gpu) for tests/gpu/check.sh.
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/integration/cuda_mapped_fixture.h"

namespace stash::testing {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kPages = kChunk / (64 << 10);  // pages of a chunk (--page-bytes=64KiB)
constexpr uint64_t kRowsPerChunk = kChunk / kRow;

class CudaGroups : public CudaMapped {
 protected:
  void TearDown() override {
    b_.reset();
    CudaMapped::TearDown();
  }
  Options Member(bool host = false) {
    Options o = MappedOptions(0);  // automatic: the group sizes itself
    o.group = "cuda-job";
    o.group_secret = std::string(32, 'g');
    o.allow_host_spill = host;
    return o;
  }
  std::unique_ptr<Client> OpenOther(const Options& o) {
    auto opened = Client::Open(o);
    EXPECT_TRUE(opened.ok()) << opened.status().ToString();
    return opened.ok() ? std::move(opened).value() : nullptr;
  }
  // The current step's flags of `c` once the stream ran everything enqueued.
  StepFlags Flags(Client& c) {
    EXPECT_EQ(d_->StreamSynchronize(stream_), CUDA_SUCCESS);
    return c.CurrentStepFlags();
  }
  v1::GroupStats Group() {
    const v1::GetStatsResponse stats = DaemonStats(daemon_->socket());
    return stats.groups_size() > 0 ? stats.groups(0) : v1::GroupStats{};
  }

  std::unique_ptr<Client> b_;
};

// Two ranks on one GPU: the first takes the whole group's memory, the second overflows; once the
// first reloads, the second's next stash takes the same pages, within the step, with no daemon
// message. Bytes come back exact, and the daemon shows one group of two.
TEST_F(CudaGroups, RanksOnOneGpuStashIntoPagesTheOtherReleasedWithinAStep) {
  StartDaemon();  // 4 chunks: the group takes 3 (a chunk stays for another user's first session)
  Open(Member());
  b_ = OpenOther(Member());
  ASSERT_NE(b_, nullptr);
  EXPECT_EQ(Gpu().chunks_leased(), 3u) << "the group's chunks, counted once";
  v1::GroupStats g = Group();
  EXPECT_EQ(g.members(), 2u);
  EXPECT_EQ(g.name(), "cuda-job");

  const uint64_t rows = 3 * kRowsPerChunk;
  const std::vector<uint8_t> a_data = Pattern(rows * kRow, 3), b_data = Pattern(rows * kRow, 5);
  const CUdeviceptr a_src = Device(a_data), b_src = Device(b_data);
  auto a = client_->Stash(Args(a_src, rows, rows));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_FALSE(Flags(*client_).overflow) << "the whole group's memory holds it";
  auto b = b_->Stash(Args(b_src, kRowsPerChunk, rows));
  ASSERT_TRUE(b.ok());
  EXPECT_TRUE(Flags(*b_).overflow) << "nothing is left for the second rank";
  ASSERT_TRUE(b_->Reload(Into(*b, Device(std::vector<uint8_t>(rows * kRow, 0)))).ok());
  g = Group();
  EXPECT_EQ(g.pages_claimed(), 3 * kPages) << "the first rank owns every page";

  // The first rank's reload gives its pages back at once: the second rank takes them.
  const CUdeviceptr a_dst = Device(std::vector<uint8_t>(rows * kRow, 0x55));
  ASSERT_TRUE(client_->Reload(Into(*a, a_dst)).ok());
  EXPECT_EQ(Host(a_dst, rows * kRow), a_data);
  ASSERT_TRUE(b_->BeginStep(1, stream_).ok());
  b = b_->Stash(Args(b_src, rows, rows));
  ASSERT_TRUE(b.ok());
  EXPECT_FALSE(Flags(*b_).overflow) << "the pages the first rank released";
  ASSERT_EQ(d_->MemsetD8Async(b_src, 0xee, rows * kRow, stream_), CUDA_SUCCESS);
  const CUdeviceptr b_dst = Device(std::vector<uint8_t>(rows * kRow, 0x55));
  ASSERT_TRUE(b_->Reload(Into(*b, b_dst)).ok());
  EXPECT_EQ(Host(b_dst, rows * kRow), b_data);
  g = Group();
  EXPECT_EQ(g.pages_claimed(), 0u) << "a member keeps no free page";

  client_.reset();
  b_.reset();
  EXPECT_EQ(Gpu().chunks_leased(), 0u) << "the last member's exit gives the group's chunks back";
  EXPECT_EQ(DaemonStats(daemon_->socket()).groups_size(), 0);
}

// A stash past what is left of the GPU's pool finds the depot dry: the daemon grows the group with
// chunks of the GPU's share of the host tier, and a graph captured before replays into them. Once
// the steps stash little, the group gives them back: off the board, unmapped, home.
TEST_F(CudaGroups, ADryDepotGrowsIntoTheHostTierAGraphCapturedBeforeUsesItAndItShrinksBack) {
  StartDaemon({"--host-tier-bytes=16MiB"});  // 4 host chunks for each of the stand-in's 2 GPUs
  Open(Member(/*host=*/true));
  EXPECT_EQ(Gpu().chunks_leased(), 3u);
  EXPECT_EQ(HostShare().chunks_leased(), 0u) << "nothing spilled yet";

  // A stash of two chunks stays on the GPU: one chunk is left there, so the captured stash of
  // two more finds the depot dry (a stash goes whole into one tier).
  const uint64_t rows = 2 * kRowsPerChunk;
  const std::vector<uint8_t> kept_data = Pattern(rows * kRow, 8);
  auto kept = client_->Stash(Args(Device(kept_data), rows, rows));
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  ASSERT_FALSE(Flags(*client_).overflow);
  const std::vector<uint8_t> data = Pattern(rows * kRow, 7);
  const CUdeviceptr src = Device(data);
  const CUdeviceptr dst = Device(std::vector<uint8_t>(rows * kRow, 0));
  CUgraph graph = nullptr;
  ASSERT_EQ(d_->StreamBeginCapture(stream_, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  auto ticket = client_->Stash(Args(src, rows, rows));
  ASSERT_TRUE(ticket.ok()) << ticket.status().ToString();
  ASSERT_TRUE(client_->Reload(Into(*ticket, dst)).ok());
  ASSERT_EQ(d_->StreamEndCapture(stream_, &graph), CUDA_SUCCESS);
  CUgraphExec exec = nullptr;
  ASSERT_EQ(d_->GraphInstantiate(&exec, graph, 0), CUDA_SUCCESS);

  // Replays until the group grew (the first finds the depot dry and asks); each reloads the
  // kept source when it overflowed, so the bytes are right every time.
  bool placed = false;
  for (int replay = 0; replay < 100 * TimeScale() && !placed; ++replay) {
    ASSERT_EQ(d_->MemsetD8Async(dst, 0, rows * kRow, stream_), CUDA_SUCCESS);
    ASSERT_EQ(d_->GraphLaunch(exec, stream_), CUDA_SUCCESS);
    const StepFlags flags = Flags(*client_);
    EXPECT_EQ(Host(dst, rows * kRow), data) << "replay " << replay;
    placed = !flags.overflow;
    if (placed) {
      EXPECT_TRUE(flags.spilled) << "past the GPU's chunks: the host chunks";
    }
    ASSERT_TRUE(client_->BeginStep(replay + 1, stream_).ok());
    if (!placed) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(placed) << "the group never grew into the host tier";
  EXPECT_GE(HostShare().chunks_leased(), 2u);
  EXPECT_GE(Group().depot_misses(), 1u);
  const CUdeviceptr kept_dst = Device(std::vector<uint8_t>(rows * kRow, 0));
  ASSERT_TRUE(client_->Reload(Into(*kept, kept_dst)).ok());
  EXPECT_EQ(Host(kept_dst, rows * kRow), kept_data);
  EXPECT_EQ(d_->GraphExecDestroy(exec), CUDA_SUCCESS);
  EXPECT_EQ(d_->GraphDestroy(graph), CUDA_SUCCESS);
  ASSERT_TRUE(client_->GraphsDestroyed().ok());

  // Steps that stash a page: after three of them the group gives back what it does not use,
  // the host tier's chunks first; the rank unmaps them at a step boundary and they go home.
  const CUdeviceptr one = Device(Pattern(16 * kRow, 1));
  uint64_t step = 1000;
  for (int i = 0; i < 60 && (HostShare().chunks_leased() > 0 || Gpu().chunks_leased() > 2); ++i) {
    ASSERT_TRUE(client_->BeginStep(++step, stream_).ok());
    auto t = client_->Stash(Args(one, 16, 16));
    ASSERT_TRUE(t.ok());
    ASSERT_TRUE(client_->Reload(Into(*t, dst)).ok());
    ASSERT_EQ(d_->StreamSynchronize(stream_), CUDA_SUCCESS);
  }
  EXPECT_EQ(HostShare().chunks_leased(), 0u) << "the group kept host chunks it stopped using";
  EXPECT_EQ(Gpu().chunks_leased(), 2u)
      << "and GPU chunks past its need (a page + a chunk's margin)";
  EXPECT_EQ(Group().chunks_leaving(), 0u) << "every chunk taken back was unmapped and returned";
  // Stashes still come back exact from what is left.
  const std::vector<uint8_t> again = Pattern(kRowsPerChunk * kRow, 9);
  auto t = client_->Stash(Args(Device(again), kRowsPerChunk, kRowsPerChunk));
  ASSERT_TRUE(t.ok());
  const CUdeviceptr again_dst = Device(std::vector<uint8_t>(again.size(), 0));
  ASSERT_TRUE(client_->Reload(Into(*t, again_dst)).ok());
  EXPECT_EQ(Host(again_dst, again.size()), again);
}

// Eight ranks of one job on one GPU, their forward stashes and backward reloads captured as
// graphs (one each) and replayed step after step, with the hot rank (10x the others' rows)
// moving every step: the sum of a step's stashes fits the group's memory, no rank's peak fits a
// private eighth of it. No replay overflows, every reload is byte-exact, and the daemon shows
// the one group of eight.
TEST_F(CudaGroups, EightRanksReplayGraphsWithAHotRankThatMovesAndNeverOverflow) {
  StartDaemon({"--pool-bytes=16MiB"});  // 8 chunks: the group takes 7 (224 pages)
  constexpr int kRanks = 8;
  // Rows (16 a page): 12 pages a cold rank, 120 the hot one; 204 of the group's 224 in all, where
  // a private eighth would be 28.
  constexpr uint64_t kCold = 12 * 16, kHot = 10 * kCold;
  struct Rank {
    std::unique_ptr<Client> client;
    CUdeviceptr src = 0, dst = 0, count = 0;
    CUgraphExec stash = nullptr, reload = nullptr;
    std::vector<CUgraph> graphs;
  };
  std::vector<Rank> ranks(kRanks);
  auto capture = [&](const std::function<void()>& enqueue, Rank& r) {
    CUgraph graph = nullptr;
    EXPECT_EQ(d_->StreamBeginCapture(stream_, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    enqueue();
    EXPECT_EQ(d_->StreamEndCapture(stream_, &graph), CUDA_SUCCESS);
    CUgraphExec exec = nullptr;
    EXPECT_EQ(d_->GraphInstantiate(&exec, graph, 0), CUDA_SUCCESS);
    r.graphs.push_back(graph);
    return exec;
  };
  for (int i = 0; i < kRanks; ++i) {
    Rank& r = ranks[i];
    r.client = OpenOther(Member());
    ASSERT_NE(r.client, nullptr);
    r.src = Device(std::vector<uint8_t>(kHot * kRow, 0));
    r.dst = Device(std::vector<uint8_t>(kHot * kRow, 0));
    r.count = Device(std::vector<uint8_t>(sizeof(int64_t), 0));
    uint64_t ticket = 0;
    r.stash = capture(
        [&] {
          StashArgs a = Args(r.src, 0, kHot);
          a.count.device_count = reinterpret_cast<const void*>(r.count);  // NOLINT
          auto t = r.client->Stash(a);
          ASSERT_TRUE(t.ok()) << t.status().ToString();
          ticket = *t;
        },
        r);
    r.reload = capture([&] { ASSERT_TRUE(r.client->Reload(Into(ticket, r.dst)).ok()); }, r);
  }
  EXPECT_EQ(Group().members(), static_cast<uint32_t>(kRanks));
  EXPECT_EQ(Gpu().chunks_leased(), 7u);
  for (int step = 0; step < 16; ++step) {
    const int hot = step % kRanks;
    std::vector<std::vector<uint8_t>> data(kRanks);
    for (int i = 0; i < kRanks; ++i) {
      const int64_t rows = static_cast<int64_t>(i == hot ? kHot : kCold);
      data[i] = Pattern(static_cast<uint64_t>(rows) * kRow, static_cast<uint8_t>(step * 8 + i));
      ASSERT_EQ(d_->MemcpyHtoD(ranks[i].src, data[i].data(), data[i].size()), CUDA_SUCCESS);
      ASSERT_EQ(d_->MemcpyHtoD(ranks[i].count, &rows, sizeof(rows)), CUDA_SUCCESS);
    }
    ASSERT_EQ(d_->StreamSynchronize(CU_STREAM_LEGACY), CUDA_SUCCESS);
    for (Rank& r : ranks) ASSERT_EQ(d_->GraphLaunch(r.stash, stream_), CUDA_SUCCESS);
    // Every rank's activation is in the group's pages now: the sources change.
    ASSERT_EQ(d_->StreamSynchronize(stream_), CUDA_SUCCESS);
    for (Rank& r : ranks) ASSERT_EQ(d_->MemsetD8Async(r.src, 0xee, kHot * kRow, stream_), 0);
    for (int i = kRanks; i-- > 0;) ASSERT_EQ(d_->GraphLaunch(ranks[i].reload, stream_), 0);
    for (int i = 0; i < kRanks; ++i) {
      EXPECT_FALSE(Flags(*ranks[i].client).overflow) << "rank " << i << ", step " << step;
      const std::vector<uint8_t> got = Host(ranks[i].dst, data[i].size());
      EXPECT_EQ(got, data[i]) << "rank " << i << ", step " << step;
      ASSERT_TRUE(ranks[i].client->BeginStep(step + 1, stream_).ok());
    }
  }
  EXPECT_GE(Group().pages_claimed_high_water(), kHot / 16 + 7 * kCold / 16);
  for (Rank& r : ranks) {
    EXPECT_EQ(d_->GraphExecDestroy(r.stash), CUDA_SUCCESS);
    EXPECT_EQ(d_->GraphExecDestroy(r.reload), CUDA_SUCCESS);
    for (CUgraph g : r.graphs) EXPECT_EQ(d_->GraphDestroy(g), CUDA_SUCCESS);
  }
}

// The daemon dies mid-step: the ranks go on with the group's chunks and depot they map (a stash
// made before reloads); at the first boundary with nothing live each moves to the restarted
// daemon's group (the old chunks off the board, unmapped, the new depot joined), and the two
// share again there.
TEST_F(CudaGroups, AfterADaemonRestartTheRanksShareTheNewDaemonsGroup) {
  const std::string socket = "--socket=" + registry_.path() + "/stashd.sock";
  StartDaemon({socket});
  Open(Member());
  b_ = OpenOther(Member());
  ASSERT_NE(b_, nullptr);
  const std::string a_first = client_->session_id(), b_first = b_->session_id();
  const uint64_t rows = 3 * kRowsPerChunk;
  const std::vector<uint8_t> data = Pattern(rows * kRow, 21);
  const CUdeviceptr src = Device(data);
  const CUdeviceptr dst = Device(std::vector<uint8_t>(rows * kRow, 0));
  auto held = client_->Stash(Args(src, rows, rows));
  ASSERT_TRUE(held.ok());
  ASSERT_FALSE(Flags(*client_).overflow);
  ASSERT_EQ(kill(daemon_->process().pid(), SIGKILL), 0);
  daemon_->process().Wait(std::chrono::seconds(10));
  daemon_.reset();
  StartDaemon({socket});
  ASSERT_TRUE(client_->BeginStep(1, stream_).ok());
  ASSERT_TRUE(client_->Reload(Into(*held, dst)).ok());
  EXPECT_EQ(Host(dst, rows * kRow), data) << "a stash made before the restart";
  const auto deadline = Clock::now() + std::chrono::seconds(10 * TimeScale());
  for (uint64_t step = 2;
       (client_->session_id() == a_first || b_->session_id() == b_first) && Clock::now() < deadline;
       ++step) {
    ASSERT_TRUE(client_->BeginStep(step, stream_).ok());
    ASSERT_TRUE(b_->BeginStep(step, stream_).ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_NE(client_->session_id(), a_first) << "no new session within 10 s";
  ASSERT_NE(b_->session_id(), b_first) << "no new session within 10 s";
  ASSERT_TRUE(client_->BeginStep(100, stream_).ok());
  ASSERT_TRUE(b_->BeginStep(100, stream_).ok());
  EXPECT_EQ(Group().members(), 2u);
  EXPECT_EQ(Gpu().chunks_leased(), 3u);
  // The whole new group's memory to one rank, then to the other once it reloaded.
  for (Client* c : {client_.get(), b_.get()}) {
    ASSERT_EQ(d_->MemcpyHtoD(src, data.data(), data.size()), CUDA_SUCCESS);
    ASSERT_EQ(d_->StreamSynchronize(CU_STREAM_LEGACY), CUDA_SUCCESS);
    auto t = c->Stash(Args(src, rows, rows));
    ASSERT_TRUE(t.ok());
    EXPECT_FALSE(Flags(*c).overflow) << "the new group's pages";
    ASSERT_EQ(d_->MemsetD8Async(src, 0xee, rows * kRow, stream_), CUDA_SUCCESS);
    ASSERT_TRUE(c->Reload(Into(*t, dst)).ok());
    EXPECT_EQ(Host(dst, rows * kRow), data);
  }
}

// A rank in another process churns (stashes, reloads, a release each step) and is SIGKILLed at
// random points, mid-claim or mid-release in its kernels at some kill: within a second of each
// kill this rank stashes the whole group's memory (every page the dead rank's tag owned is back,
// freed by the daemon's reclaim kernel), and its own held stash reloads byte-exact.
TEST_F(CudaGroups, ARankKilledAtRandomPointsHasEveryPageBackWithinASecond) {
  StartDaemon();
  Open(Member());
  std::string churner = BinDir() + "/tests/integration/stash-test-cuda-client";
  if (access(churner.c_str(), X_OK) != 0) churner = BinDir() + "/stash-test-cuda-client";
  ASSERT_EQ(access(churner.c_str(), X_OK), 0) << churner;
  const std::vector<uint8_t> mine = Pattern(kRowsPerChunk * kRow / 8, 13);  // 4 pages
  const CUdeviceptr mine_src = Device(mine);
  auto held = client_->Stash(Args(mine_src, mine.size() / kRow, mine.size() / kRow));
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  ASSERT_FALSE(Flags(*client_).overflow);
  const uint64_t rest = 3 * kRowsPerChunk - mine.size() / kRow;  // the group's pages but mine
  const CUdeviceptr whole_src = Device(Pattern(rest * kRow, 17));
  const CUdeviceptr whole_dst = Device(std::vector<uint8_t>(rest * kRow, 0));
  std::mt19937_64 random(std::random_device{}());
  const uint64_t seed = random();
  random.seed(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::string secret_hex;  // Member()'s secret, 32 'g' (0x67), as STASHD_GROUP_SECRET spells it
  for (int i = 0; i < 32; ++i) secret_hex += "67";
  const std::vector<std::string> env = {"STASHD_GROUP=cuda-job",
                                        "STASHD_GROUP_SECRET=" + secret_hex};
  uint64_t step = 1;
  for (int kill = 0; kill < 10; ++kill) {
    Process churn;
    ASSERT_TRUE(churn.Start({churner, daemon_->socket(), "churn", std::to_string(kChunk)},
                            daemon_->dir() + "/churn", env));
    const auto opened = Clock::now() + std::chrono::seconds(10 * TimeScale());
    while (churn.Stdout().find("stepped") == std::string::npos && Clock::now() < opened &&
           churn.running()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_NE(churn.Stdout().find("stepped"), std::string::npos) << churn.Stderr();
    std::this_thread::sleep_for(std::chrono::microseconds(random() % 50000));
    churn.StopWith(SIGKILL, std::chrono::seconds(5));
    const auto killed = Clock::now();
    bool whole_back = false;
    while (Clock::now() - killed < std::chrono::seconds(5 * TimeScale())) {
      ASSERT_TRUE(client_->BeginStep(++step, stream_).ok());
      auto whole = client_->Stash(Args(whole_src, rest, rest));
      ASSERT_TRUE(whole.ok()) << whole.status().ToString();
      const bool placed = !Flags(*client_).overflow;
      ASSERT_TRUE(client_->Reload(Into(*whole, whole_dst)).ok());
      if (placed) {
        const auto took = Clock::now() - killed;
        EXPECT_LE(took, std::chrono::seconds(1 * TimeScale()))
            << std::chrono::duration<double>(took).count() << " s after kill " << kill;
        whole_back = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_TRUE(whole_back) << "kill " << kill;
  }
  const CUdeviceptr mine_dst = Device(std::vector<uint8_t>(mine.size(), 0));
  ASSERT_TRUE(client_->Reload(Into(*held, mine_dst)).ok());
  EXPECT_EQ(Host(mine_dst, mine.size()), mine);
  // At least one kill found the churner owning pages (mid-step), which the daemon freed.
  const std::string log = daemon_->process().Stderr();
  uint64_t freed_kills = 0;
  for (size_t at = log.find(" left; "); at != std::string::npos; at = log.find(" left; ", at + 1)) {
    freed_kills += std::strtoull(log.c_str() + at + 7, nullptr, 10) > 0 ? 1 : 0;
  }
  EXPECT_GE(freed_kills, 1u) << "no kill left pages to reclaim: the test did not test it";
}

}  // namespace
}  // namespace stash::testing
