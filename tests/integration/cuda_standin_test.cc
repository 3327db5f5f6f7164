// stashd --backend=cuda end to end on the CUDA driver stand-in (tests/cuda_standin): ctest puts
// the stand-in first on LD_LIBRARY_PATH as libcuda.so.1 for this binary and the stashd it
// starts, so both processes load it where they would load the NVIDIA driver (one registry: the
// VRAM budget is counted across them). The daemon's whole cuda path runs: a pool and rings per
// GPU in stand-in device memory, daemon-copy's kernels from stashd's fatbin as host twins, done
// events as stream memory writes, continuations from host functions. The client is the real
// library with backend kCuda; its buffers are host memory (HostBuffer), which a cuda daemon
// takes up to --max-counter-memory: the stand-in does not model CUDA IPC, the way device buffers
// reach the daemon (tests/gpu covers those on a GPU).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
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
using testing::Args;
using testing::BinDir;
using testing::Buffer;
using testing::DaemonProcess;
using testing::PagesUsed;
using testing::Process;
using testing::TempDir;
using testing::TimeScale;

constexpr uint64_t kPage = 64 << 10;

class CudaStandin : public ::testing::Test {
 protected:
  // ctest runs each test case in a process of its own: the client's stand-in reads the
  // registry at its first cuInit, so one registry per process (this test's) is what it sees.
  void SetUp() override {
    // One registry for this test's daemon and its clients (this process): set before the
    // client's first cuInit, inherited by the daemon.
    setenv("STASH_STANDIN_REGISTRY", registry_.path().c_str(), 1);
    setenv("STASH_STANDIN_DEVICES", "2", 1);
    ASSERT_NE(std::getenv("LD_LIBRARY_PATH"), nullptr) << "run it through ctest";
  }
  void TearDown() override {
    daemon_.reset();
    unsetenv("STASH_STANDIN_VRAM_BYTES");  // a test that set it: the next one gets the default
  }
  void StartDaemon(std::vector<std::string> flags) {
    flags.push_back("--backend=cuda");
    flags.push_back("--page-bytes=64KiB");
    daemon_ = std::make_unique<DaemonProcess>(flags);
    ASSERT_TRUE(daemon_->Ready()) << daemon_->process().Stderr();
  }
  std::unique_ptr<Client> Connect(int device, bool allow_spill = true) {
    Options o;
    o.socket = daemon_->socket();
    o.backend = Backend::kCuda;
    o.device = device;
    o.allow_host_spill = allow_spill;
    auto c = Client::Open(o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(c).value() : nullptr;
  }

  TempDir registry_;
  std::unique_ptr<DaemonProcess> daemon_;
};

// A cuda daemon on two stand-in GPUs: its log names each pool by UUID, the client finds its
// GPU's pool by UUID, stashes fill that GPU's pool, spill to its host-tier share and overflow,
// and every stored stash reloads byte-exact; the other GPU's pool stays untouched, and every
// page is free again after.
TEST_F(CudaStandin, StashesFillTheGpuPoolSpillAndReloadByteExact) {
  // 32 pages a GPU (one chunk: the GPU's allocation granularity is 2 MiB), 16 on the host.
  StartDaemon({"--pool-bytes=2MiB", "--host-tier-bytes=2MiB"});
  auto client = Connect(/*device=*/1);
  ASSERT_NE(client, nullptr);

  std::vector<std::unique_ptr<HostBuffer>> sources;
  std::vector<Completion> done;
  for (uint32_t i = 0; i < 4; ++i) {
    sources.push_back(Buffer(12 * kPage, 40 + i));  // 768 KiB: 12 pages each
    auto c = client->Wait(*client->Stash(Args(*sources.back(), kPage, 12)));
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    done.push_back(*c);
  }
  EXPECT_EQ(done[0].tier, Tier::kDevice);
  EXPECT_EQ(done[1].tier, Tier::kDevice);
  EXPECT_EQ(done[2].tier, Tier::kHost);  // 24 of 32 pool pages taken; 12 of 16 host pages
  EXPECT_EQ(done[3].tier, Tier::kOverflow);

  const v1::GetStatsResponse stats = testing::DaemonStats(daemon_->socket());
  ASSERT_EQ(stats.tiers_size(), 4) << stats.DebugString();  // gpu0, host0, gpu1, host1
  uint64_t gpu0 = 0, gpu1 = 0;
  for (const auto& t : stats.tiers()) {
    if (t.name() == "gpu0") gpu0 = t.pages_used();
    if (t.name() == "gpu1") gpu1 = t.pages_used();
  }
  EXPECT_EQ(gpu0, 0u) << "device 1's client stays off GPU 0's pool";
  EXPECT_EQ(gpu1, 24u);
  EXPECT_NE(daemon_->process().Stderr().find("gpu1 (GPU-"), std::string::npos)
      << "the log names each pool's GPU by UUID";

  for (int i : {2, 0, 1}) {
    auto dst = Buffer(12 * kPage);
    ReloadArgs r{done[static_cast<size_t>(i)].ticket, dst.get(), 0, false, {}, {}};
    ASSERT_TRUE(client->Wait(*client->Reload(r)).ok()) << "stash " << i;
    EXPECT_EQ(std::memcmp(dst->data(), sources[static_cast<size_t>(i)]->data(), 12 * kPage), 0)
        << "stash " << i;
  }
  EXPECT_EQ(PagesUsed(testing::DaemonStats(daemon_->socket())), 0u);
  client.reset();
  EXPECT_EQ(daemon_->process().StopWith(SIGTERM, std::chrono::seconds(10)), 0)
      << daemon_->process().Stderr();
}

// Many operations in flight at once, each with its own done event, through the daemon's pool
// worker and the copy stream: every reload returns its own stash's bytes.
TEST_F(CudaStandin, ManyStashesInFlightCompleteInOrderWithTheirOwnBytes) {
  StartDaemon({"--pool-bytes=8MiB", "--host-tier-bytes=0"});
  auto client = Connect(0, /*allow_spill=*/false);
  ASSERT_NE(client, nullptr);
  constexpr int kStashes = 48;
  std::vector<std::unique_ptr<HostBuffer>> sources;
  std::vector<uint64_t> ops;
  for (uint32_t i = 0; i < kStashes; ++i) {
    sources.push_back(Buffer(kPage + 4096 * i % kPage, 100 + i));
    auto op = client->Stash(Args(*sources.back(), 4096, sources.back()->size() / 4096));
    ASSERT_TRUE(op.ok()) << op.status().ToString();
    ops.push_back(*op);
  }
  std::vector<uint64_t> tickets;
  for (uint64_t op : ops) {
    auto c = client->Wait(op);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_EQ(c->tier, Tier::kDevice);
    tickets.push_back(c->ticket);
  }
  std::vector<std::unique_ptr<HostBuffer>> back;
  ops.clear();
  for (int i = kStashes - 1; i >= 0; --i) {
    back.push_back(Buffer(sources[static_cast<size_t>(i)]->size()));
    ReloadArgs r{tickets[static_cast<size_t>(i)], back.back().get(), 0, false, {}, {}};
    auto op = client->Reload(r);
    ASSERT_TRUE(op.ok()) << op.status().ToString();
    ops.push_back(*op);
  }
  for (size_t j = 0; j < ops.size(); ++j) {
    ASSERT_TRUE(client->Wait(ops[j]).ok());
    const HostBuffer& src = *sources[static_cast<size_t>(kStashes - 1) - j];
    EXPECT_EQ(std::memcmp(back[j]->data(), src.data(), src.size()), 0) << "reload " << j;
  }
  EXPECT_EQ(PagesUsed(testing::DaemonStats(daemon_->socket())), 0u);
}

// A cuda client killed while its stash is held, or while its stash waits for a ready event the
// daemon's pool holds: its pages are back within a second (the pool's slots and page records
// too: the survivor stashes again), and another session goes on, its stash intact.
TEST_F(CudaStandin, PagesReturnWithinOneSecondWhenAClientIsKilled) {
  StartDaemon({"--pool-bytes=4MiB", "--host-tier-bytes=0"});  // 64 pages
  auto survivor = Connect(0);
  ASSERT_NE(survivor, nullptr);
  auto src = Buffer(kPage, 5);
  auto kept = survivor->Wait(*survivor->Stash(Args(*src, 4096, 16)));
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();

  for (const char* mode : {"hold", "midstash"}) {
    SCOPED_TRACE(mode);
    Process victim;
    ASSERT_TRUE(victim.Start({BinDir() + "/tests/integration/stash-test-client", daemon_->socket(),
                              mode, std::to_string(32 * kPage)},
                             daemon_->dir() + "/victim-" + mode,
                             {"STASH_TEST_CLIENT_BACKEND=cuda"}));
    const auto deadline = std::chrono::steady_clock::now() + seconds(10 * TimeScale());
    while (victim.Stdout().empty() && std::chrono::steady_clock::now() < deadline) {
      ASSERT_TRUE(victim.running()) << victim.Stderr();
      std::this_thread::sleep_for(milliseconds(5));
    }
    ASSERT_FALSE(victim.Stdout().empty()) << victim.Stderr();
    if (std::string(mode) == "hold") {
      EXPECT_EQ(PagesUsed(testing::DaemonStats(daemon_->socket())), 1u + 32u);
    }
    victim.StopWith(SIGKILL, seconds(5));
    const auto limit = std::chrono::steady_clock::now() + milliseconds(1000 * TimeScale());
    uint64_t used = 0;
    do {
      used = PagesUsed(testing::DaemonStats(daemon_->socket()));
      if (used == 1) break;
      std::this_thread::sleep_for(milliseconds(5));
    } while (std::chrono::steady_clock::now() < limit);
    EXPECT_EQ(used, 1u);
    auto t = survivor->Wait(*survivor->Stash(Args(*src, 4096, 16)));
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    EXPECT_EQ(t->tier, Tier::kDevice);
    ASSERT_TRUE(survivor->Wait(*survivor->Release(t->ticket)).ok());
  }
  auto dst = Buffer(kPage);
  ASSERT_TRUE(survivor->Wait(*survivor->Reload({kept->ticket, dst.get(), 0, false, {}, {}})).ok());
  EXPECT_EQ(std::memcmp(dst->data(), src->data(), kPage), 0);
}

// The daemon killed while a cuda client waits on a stash it holds: the wait fails fast with
// UNAVAILABLE, the client's buffer is untouched, and a restarted daemon serves a new session.
TEST_F(CudaStandin, ClientsFailFastWhenTheDaemonDiesAndANewDaemonServesThem) {
  // GPUs of 16 MiB: one daemon's pool, ring, plans and page records (10 MiB in 2 MiB units) fit,
  // two do not, so the new daemon starts only if the killed one's memory went with it.
  setenv("STASH_STANDIN_VRAM_BYTES", std::to_string(16 << 20).c_str(), 1);
  StartDaemon({"--pool-bytes=4MiB", "--host-tier-bytes=0"});
  const std::string socket = daemon_->socket();
  auto client = Connect(0);
  ASSERT_NE(client, nullptr);
  auto src = Buffer(kPage, 9);
  const std::vector<uint8_t> before(src->data(), src->data() + src->size());
  auto events = Buffer(4096);
  StashArgs a = Args(*src, 4096, 16);
  a.ready = {events.get(), 0, 1};  // never signalled: the daemon holds the stash
  auto t = client->Stash(a);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  std::thread killer([&] {
    std::this_thread::sleep_for(milliseconds(50));
    daemon_->process().StopWith(SIGKILL, seconds(5));
  });
  auto waited = client->Wait(*t, 30000);
  killer.join();
  EXPECT_EQ(waited.status().code(), StatusCode::kUnavailable) << waited.status().ToString();
  EXPECT_EQ(std::memcmp(src->data(), before.data(), before.size()), 0);
  client.reset();

  // A new daemon (a socket in a dir of its own), in the same registry.
  StartDaemon({"--pool-bytes=4MiB", "--host-tier-bytes=0"});
  auto again = Connect(0);
  ASSERT_NE(again, nullptr);
  auto c = again->Wait(*again->Stash(Args(*src, 4096, 16)));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->tier, Tier::kDevice);
}

// What a cuda daemon refuses at start on the stand-in's GPUs, with the knob to change: a pool
// larger than the GPU's free memory (the stand-in's GPUs have 1 GiB), and a pool whose daemon
// memory does not fit beside another daemon's.
TEST_F(CudaStandin, APoolLargerThanTheGpuIsRefusedAtStartNamingTheGpuAndTheFlag) {
  DaemonProcess d({"--backend=cuda", "--pool-bytes=2GiB", "--host-tier-bytes=0"});
  EXPECT_FALSE(d.Ready());
  const std::string err = d.process().Stderr();
  EXPECT_NE(err.find("does not fit GPU 0, which has 1 GiB free"), std::string::npos) << err;
  EXPECT_NE(err.find("lower --pool-bytes"), std::string::npos) << err;

  // A pool that fits the free memory, but not with what the daemon adds to it (its ring, plan
  // slots and page records): another daemon holds most of the GPU. The message names the GPU,
  // what did not fit and the knobs.
  setenv("STASH_STANDIN_VRAM_BYTES", std::to_string(16 << 20).c_str(), 1);
  StartDaemon({"--pool-bytes=4MiB", "--host-tier-bytes=0"});
  DaemonProcess second(
      {"--backend=cuda", "--page-bytes=64KiB", "--pool-bytes=4MiB", "--host-tier-bytes=0"});
  EXPECT_FALSE(second.Ready());
  const std::string full = second.process().Stderr();
  EXPECT_NE(full.find("gpu0 (GPU-"), std::string::npos) << full;
  EXPECT_NE(full.find("failed: cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY"), std::string::npos)
      << full;
  EXPECT_NE(full.find("lower --pool-bytes or --host-tier-bytes, or free the GPU"),
            std::string::npos)
      << full;
}

}  // namespace
}  // namespace stash
