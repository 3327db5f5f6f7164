// CheckMemoryFits: tiers beyond the free host or GPU memory are refused with the numbers.
#include "daemon/memory_fit.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace stash::daemon
