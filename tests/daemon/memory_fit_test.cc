// CheckMemoryFits: tiers beyond the free host or GPU memory are refused with the numbers.
#include "daemon/startup/memory_fit.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace stash::daemon {
namespace {

using ::testing::HasSubstr;

DaemonConfig Config(uint64_t pool, uint32_t devices, uint64_t host_tier) {
  DaemonConfig config;
  config.pool_bytes = pool;
  config.devices = devices;
  config.host_tier_bytes = host_tier;
  config.page_bytes = 256 << 10;
  return config;
}

constexpr uint64_t kGiB = 1ULL << 30;

TEST(MemoryFit, HostPoolsAndTierThatFitPass) {
  FreeMemory free;
  free.host_bytes = 10 * kGiB;
  EXPECT_TRUE(CheckMemoryFits(Config(2 * kGiB, 4, 2 * kGiB), v1::BACKEND_HOST, free).ok());
}

TEST(MemoryFit, HostPoolsBeyondFreeMemoryAreRefusedWithTheNumbers) {
  FreeMemory free;
  free.host_bytes = 8 * kGiB;
  const Status s = CheckMemoryFits(Config(2 * kGiB, 4, 1 * kGiB), v1::BACKEND_HOST, free);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("need 9 GiB of host memory"));
  EXPECT_THAT(s.message(), HasSubstr("--pool-bytes=2 GiB x --devices=4 + --host-tier-bytes=1 GiB"));
  EXPECT_THAT(s.message(), HasSubstr("only 8 GiB is available"));
}

TEST(MemoryFit, CudaPoolsCountAgainstEachGpuAndOnlyTheHostTierAgainstHostMemory) {
  FreeMemory free;
  free.host_bytes = 4 * kGiB;
  free.gpu_free_bytes = {80 * kGiB, 10 * kGiB};
  EXPECT_TRUE(CheckMemoryFits(Config(8 * kGiB, 1, 2 * kGiB), v1::BACKEND_CUDA, free).ok());
  const Status s = CheckMemoryFits(Config(20 * kGiB, 1, 2 * kGiB), v1::BACKEND_CUDA, free);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("--pool-bytes=20 GiB does not fit GPU 1, which has 10 GiB"));
}

TEST(MemoryFit, UnknownFreeMemorySkipsTheCheck) {
  EXPECT_TRUE(CheckMemoryFits(Config(64 * kGiB, 64, 64 * kGiB), v1::BACKEND_HOST, {}).ok());
}

// --huge-pages=hugetlb: the tiers count against the kernel's free huge pages, not MemAvailable,
// and every size is a whole number of 2 MiB pages.
FreeMemory HugePool(uint64_t total, uint64_t free_pages) {
  FreeMemory free;
  free.host_bytes = 1 * kGiB;  // less than the tiers: hugetlb tiers do not count here
  free.huge_pages_total = total;
  free.huge_pages_free = free_pages;
  free.huge_page_bytes = 2 << 20;
  return free;
}

DaemonConfig Hugetlb(uint64_t pool, uint32_t devices, uint64_t host_tier, uint64_t chunk) {
  DaemonConfig config = Config(pool, devices, host_tier);
  config.huge_pages = HugePages::kHugetlb;
  config.chunk_bytes = chunk;
  return config;
}

TEST(MemoryFit, HugetlbTiersThatFitTheFreeHugePagesPass) {
  // 2 x 2 GiB + 1 GiB = 2560 huge pages, and a 64 MiB chunk (32) to renew one.
  EXPECT_TRUE(
      CheckMemoryFits(Hugetlb(2 * kGiB, 2, kGiB, 64 << 20), v1::BACKEND_HOST, HugePool(4096, 2592))
          .ok());
  EXPECT_FALSE(
      CheckMemoryFits(Hugetlb(2 * kGiB, 2, kGiB, 64 << 20), v1::BACKEND_HOST, HugePool(4096, 2591))
          .ok());
}

TEST(MemoryFit, HugetlbTiersBeyondTheFreeHugePagesAreRefusedWithTheNumbers) {
  const Status s =
      CheckMemoryFits(Hugetlb(2 * kGiB, 2, kGiB, 64 << 20), v1::BACKEND_HOST, HugePool(3000, 2000));
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("need 2592 huge pages of 2 MiB (5 GiB"));
  EXPECT_THAT(s.message(), HasSubstr("one --chunk-bytes=64 MiB more to renew a chunk"));
  EXPECT_THAT(s.message(), HasSubstr("has 2000 free of 3000 reserved"));
  EXPECT_THAT(s.message(), HasSubstr("sysctl vm.nr_hugepages=3592"));
}

// The cuda backend's host tier takes transparent huge pages or none: hugetlb is refused with
// what to use instead, whatever the pool of huge pages holds.
TEST(MemoryFit, HugetlbIsRefusedOnTheCudaBackendWithTheChoicesItHas) {
  const Status s =
      CheckMemoryFits(Hugetlb(2 * kGiB, 1, kGiB, 64 << 20), v1::BACKEND_CUDA, HugePool(8192, 8192));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--huge-pages=auto"));
  EXPECT_THAT(s.message(), HasSubstr("--huge-pages=off"));
}

TEST(MemoryFit, HugetlbSizesMustBeWholeHugePages) {
  const FreeMemory pool = HugePool(8192, 8192);
  Status s = CheckMemoryFits(Hugetlb(kGiB + (256 << 10), 1, 0, 64 << 20), v1::BACKEND_HOST, pool);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--pool-bytes="));
  s = CheckMemoryFits(Hugetlb(kGiB, 1, 0, 0), v1::BACKEND_HOST, pool);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("needs --chunk-bytes set to a multiple of 2 MiB"));
  s = CheckMemoryFits(Hugetlb(kGiB, 1, 0, 3 << 20), v1::BACKEND_HOST, pool);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  FreeMemory gigantic = pool;
  gigantic.huge_page_bytes = kGiB;
  s = CheckMemoryFits(Hugetlb(kGiB, 1, 0, 64 << 20), v1::BACKEND_HOST, gigantic);
  EXPECT_THAT(s.message(), HasSubstr("default_hugepagesz=2M"));
  FreeMemory none = pool;
  none.huge_page_bytes = 0;
  s = CheckMemoryFits(Hugetlb(kGiB, 1, 0, 64 << 20), v1::BACKEND_HOST, none);
  EXPECT_THAT(s.message(), HasSubstr("no huge page pool"));
}

// A killed cuda stashd's pools (its lock file's record) count as free for the next one on the
// socket, per GPU by UUID and at most the new pool, so it starts while its ranks still map the
// old chunks; a GPU it did not name, an unknown free size and lines it cannot read count nothing.
TEST(MemoryFit, AKilledPredecessorsPoolsCountAsFreeForTheNextStashd) {
  const std::string a = "GPU-aaaaaaaa-0000-0000-0000-000000000000";
  const std::string b = "GPU-bbbbbbbb-0000-0000-0000-000000000000";
  const std::string c = "GPU-cccccccc-0000-0000-0000-000000000000";
  EXPECT_EQ(PoolRecord({a, b}, 40 * kGiB), a + " 42949672960\n" + b + " 42949672960\n");

  FreeMemory free;
  free.gpu_free_bytes = {30 * kGiB, 0, 40 * kGiB};
  free.gpu_uuids = {b, a, c};  // this stashd's ordinals differ from the killed one's
  const std::string record =
      PoolRecord({a, b}, 40 * kGiB) + "junk\n" + c + " lots\n" + "NOT-A-GPU 99\n" + b + " 40\n";
  const std::vector<uint64_t> credited = CreditPreviousPools(record, 32 * kGiB, &free);
  EXPECT_EQ(credited, (std::vector<uint64_t>{32 * kGiB, 0, 0}))
      << "b: capped at the new pool, even named twice; a: its free memory is unknown; c: junk";
  EXPECT_EQ(free.gpu_free_bytes, (std::vector<uint64_t>{62 * kGiB, 0, 40 * kGiB}));
  EXPECT_TRUE(CheckMemoryFits(Config(32 * kGiB, 1, 0), v1::BACKEND_CUDA, free).ok());

  FreeMemory none;
  none.gpu_free_bytes = {30 * kGiB};
  none.gpu_uuids = {a};
  EXPECT_EQ(CreditPreviousPools("", 32 * kGiB, &none), (std::vector<uint64_t>{0}));
  EXPECT_EQ(CheckMemoryFits(Config(32 * kGiB, 1, 0), v1::BACKEND_CUDA, none).code(),
            StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace stash::daemon
