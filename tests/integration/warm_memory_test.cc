// Warm memory (issue 24, docs/design.md "Warm memory"): stashd populates its tiers in the
// background from the start (a chunk back from a mapped session gets fresh memory it leaves to
// the next holder), and the tiers ask for transparent huge pages where the kernel offers them to
// memfds, or take reserved huge pages.
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "stash/client.h"
#include "tests/huge_page_pool.h"
#include "tests/integration/daemon_stats.h"
#include "tests/integration/harness.h"
#include "tests/integration/host_buffers.h"

namespace stash::testing {
namespace {

namespace v1 = stash::v1;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr uint64_t kMiB = 1 << 20;

std::vector<std::string> Flags(std::vector<std::string> extra) {
  std::vector<std::string> flags = {"--page-bytes=64KiB", "--backend=host", "--log-level=info"};
  flags.insert(flags.end(), extra.begin(), extra.end());
  return flags;
}

#define ASSERT_READY(daemon) \
  ASSERT_TRUE((daemon).Ready()) << "stashd did not start: " << (daemon).process().Stderr()

// A field of /proc/<pid>/status or smaps_rollup, in kB; -1 when absent.
long ProcKiB(pid_t pid, const std::string& file, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/" + file);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stol(line.substr(field.size() + 1));
  }
  return -1;
}

uint64_t TierBytes(const v1::TierStats& t) { return t.pages_total() * t.page_bytes(); }

// What `stashctl stats` prints for `d`.
std::string StatsText(DaemonProcess& d) {
  std::string out, err;
  EXPECT_EQ(RunCommand({BinDir() + "/client/stashctl/stashctl", "--socket=" + d.socket(), "stats"},
                       &out, &err),
            0)
      << err;
  return out;
}

// Whether every tier's bytes are warm, polling for up to 20 s (scaled).
bool EveryTierWarmsWithin(const DaemonProcess& d) {
  const auto deadline = std::chrono::steady_clock::now() + seconds(20 * TimeScale());
  while (std::chrono::steady_clock::now() < deadline) {
    const v1::GetStatsResponse r = DaemonStats(d.socket());
    bool warm = r.tiers_size() > 0;
    for (const auto& t : r.tiers()) warm = warm && t.bytes_warm() == TierBytes(t);
    if (warm) return true;
    std::this_thread::sleep_for(milliseconds(20));
  }
  return false;
}

// The daemon's socket is up before its tiers are warm; once they are, the kernel holds their
// pages (RssShmem), and the log said so.
TEST(WarmMemory, EveryTierIsPopulatedInTheBackgroundFromTheStart) {
  DaemonProcess d(Flags({"--pool-bytes=48MiB", "--devices=2", "--host-tier-bytes=32MiB"}));
  ASSERT_READY(d);
  ASSERT_TRUE(EveryTierWarmsWithin(d)) << d.process().Stderr();
  const v1::GetStatsResponse r = DaemonStats(d.socket());
  ASSERT_EQ(r.tiers_size(), 3);
  for (const auto& t : r.tiers()) EXPECT_FALSE(t.page_kind().empty()) << t.name();
  EXPECT_GE(ProcKiB(d.process().pid(), "status", "RssShmem"), long{(48 * 2 + 32) * 1024});
  EXPECT_NE(d.process().Stderr().find("every pool is warm"), std::string::npos)
      << d.process().Stderr();
  EXPECT_NE(StatsText(d).find("memory: 4 KiB pages, every tier warm"), std::string::npos)
      << StatsText(d);
}

// --warm-memory=false: pages come as they are first written, as before.
TEST(WarmMemory, OffLeavesEveryPageToItsFirstWrite) {
  DaemonProcess d(Flags({"--pool-bytes=48MiB", "--host-tier-bytes=32MiB", "--warm-memory=false"}));
  ASSERT_READY(d);
  std::this_thread::sleep_for(milliseconds(300));
  const v1::GetStatsResponse r = DaemonStats(d.socket());
  for (const auto& t : r.tiers()) EXPECT_EQ(t.bytes_warm(), 0u) << t.name();
  EXPECT_LT(ProcKiB(d.process().pid(), "status", "RssShmem"), long{16 * 1024});
}

// A mapped session's chunks come back with fresh memory (nobody may read what it left), which
// the daemon does not populate: a holder that kept the old memory mapped could otherwise make it
// pay for chunk after chunk. The next holder allocates the pages itself (its lease thread), and
// its first stash into them is byte-exact.
TEST(WarmMemory, ChunksBackFromAMappedSessionGetFreshMemoryItsNextHolderAllocates) {
  DaemonProcess d(Flags({"--pool-bytes=32MiB", "--host-tier-bytes=0", "--chunk-bytes=4MiB"}));
  ASSERT_READY(d);
  ASSERT_TRUE(EveryTierWarmsWithin(d));
  Options o;
  o.socket = d.socket();
  o.mode = Mode::kMapped;
  o.lease.automatic = false;
  o.lease.device_bytes = 16 * kMiB;
  auto src = Buffer(4 * 65536, 3);
  for (int round = 0; round < 2; ++round) {
    auto client = Client::Open(o);
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    auto stashed = (*client)->Wait(*(*client)->Stash(Args(*src, 65536, 4)));
    ASSERT_TRUE(stashed.ok()) << stashed.status().ToString();
    EXPECT_EQ(stashed->tier, Tier::kDevice);
    auto dst = Buffer(4 * 65536);
    ReloadArgs back;
    back.ticket = stashed->ticket;
    back.destination = dst.get();
    ASSERT_TRUE((*client)->Wait(*(*client)->Reload(back)).ok());
    EXPECT_EQ(std::memcmp(src->data(), dst->data(), src->size()), 0);
  }  // each close returns 4 chunks, renewed
  const auto deadline = std::chrono::steady_clock::now() + seconds(10 * TimeScale());
  v1::TierStats t;
  do {
    t = DaemonStats(d.socket()).tiers(0);
    if (t.chunks_free() == t.chunks_total()) break;
    std::this_thread::sleep_for(milliseconds(5));
  } while (std::chrono::steady_clock::now() < deadline);
  ASSERT_EQ(t.chunks_free(), t.chunks_total());
  // The chunks leased in either round hold fresh memory the daemon left cold.
  EXPECT_LE(t.bytes_warm(), TierBytes(t) - 16 * kMiB);
  EXPECT_GE(t.bytes_warm(), TierBytes(t) - 32 * kMiB);
}

// Where the kernel offers memfds transparent huge pages, the tiers ask for them (stats and the
// log say so) and get them (ShmemPmdMapped); --huge-pages=off keeps 4 KiB pages.
TEST(WarmMemory, TiersTakeTransparentHugePagesWhereTheKernelOffersThem) {
  if (!ShmemHugePages::Changeable()) GTEST_SKIP() << "needs root to offer shmem huge pages";
  ShmemHugePages shmem;
  if (!shmem.Set("advise")) GTEST_SKIP() << "this kernel refuses to change shmem_enabled";

  DaemonProcess huge(
      Flags({"--pool-bytes=32MiB", "--host-tier-bytes=16MiB", "--chunk-bytes=4MiB"}));
  ASSERT_READY(huge);
  ASSERT_TRUE(EveryTierWarmsWithin(huge));
  const v1::GetStatsResponse huge_stats = DaemonStats(huge.socket());
  for (const auto& t : huge_stats.tiers()) {
    EXPECT_EQ(t.page_kind(), "transparent huge pages") << t.name();
  }
  EXPECT_NE(huge.process().Stderr().find("ask for transparent huge pages"), std::string::npos);
  EXPECT_NE(StatsText(huge).find("memory: transparent huge pages, every tier warm"),
            std::string::npos);
  // The kernel may leave a few out (fragmented memory); most of 48 MiB is huge.
  EXPECT_GE(ProcKiB(huge.process().pid(), "smaps_rollup", "ShmemPmdMapped"), long{24 * 1024})
      << huge.process().Stderr();

  DaemonProcess small(Flags(
      {"--pool-bytes=32MiB", "--host-tier-bytes=16MiB", "--chunk-bytes=4MiB", "--huge-pages=off"}));
  ASSERT_READY(small);
  ASSERT_TRUE(EveryTierWarmsWithin(small));
  const v1::GetStatsResponse small_stats = DaemonStats(small.socket());
  for (const auto& t : small_stats.tiers()) {
    EXPECT_EQ(t.page_kind(), "4 KiB pages") << t.name();
  }
  EXPECT_EQ(ProcKiB(small.process().pid(), "smaps_rollup", "ShmemPmdMapped"), 0);
}

// --huge-pages=hugetlb: the tiers take pages of the kernel's huge page pool, reserved at start
// (a pool short of them is refused with the numbers), and both modes stash and reload on them.
TEST(WarmMemory, HugetlbTiersAreReservedAtStartAndServeBothModes) {
  if (!HugePagePool::Changeable()) GTEST_SKIP() << "needs root to reserve huge pages";
  HugePagePool pool;
  // 8 MiB of pool + 4 MiB of host tier = 6 pages, one chunk (1) to renew one, 3 to spare.
  ASSERT_TRUE(pool.Grow(10));
  const std::vector<std::string> sizes = {"--pool-bytes=8MiB", "--host-tier-bytes=4MiB",
                                          "--chunk-bytes=2MiB", "--huge-pages=hugetlb"};
  DaemonProcess d(Flags(sizes));
  ASSERT_READY(d);
  ASSERT_TRUE(EveryTierWarmsWithin(d));
  const v1::GetStatsResponse r = DaemonStats(d.socket());
  for (const auto& t : r.tiers()) EXPECT_EQ(t.page_kind(), "hugetlb 2 MiB pages") << t.name();
  EXPECT_GE(ProcKiB(d.process().pid(), "smaps_rollup", "Shared_Hugetlb") +
                ProcKiB(d.process().pid(), "smaps_rollup", "Private_Hugetlb"),
            long{12 * 1024});
  for (Mode mode : {Mode::kDaemonCopy, Mode::kMapped}) {
    Options o;
    o.socket = d.socket();
    o.mode = mode;
    if (mode == Mode::kMapped) {
      o.lease.automatic = false;
      o.lease.device_bytes = 4 * kMiB;
    }
    auto client = Client::Open(o);
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    auto src = Buffer(16 * 65536, 7);
    auto dst = Buffer(16 * 65536);
    auto stashed = (*client)->Wait(*(*client)->Stash(Args(*src, 65536, 16)));
    ASSERT_TRUE(stashed.ok()) << stashed.status().ToString();
    EXPECT_EQ(stashed->tier, Tier::kDevice);
    ReloadArgs back;
    back.ticket = stashed->ticket;
    back.destination = dst.get();
    ASSERT_TRUE((*client)->Wait(*(*client)->Reload(back)).ok());
    EXPECT_EQ(std::memcmp(src->data(), dst->data(), src->size()), 0);
  }
  // A second daemon finds 4 huge pages free where it needs 7: refused, naming the numbers.
  std::vector<std::string> again = Flags(sizes);
  DaemonProcess refused(again);
  EXPECT_FALSE(refused.Ready());
  EXPECT_NE(refused.process().Stderr().find("need 7 huge pages of 2 MiB"), std::string::npos)
      << refused.process().Stderr();
  EXPECT_NE(refused.process().Stderr().find("sysctl vm.nr_hugepages="), std::string::npos);
}

}  // namespace
}  // namespace stash::testing
