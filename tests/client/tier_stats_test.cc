// A session's Stats pick their tiers by what each tier is: on the cuda backend a GPU's share of
// the host tier carries that GPU's pool index, and must not land in the pool fields.
#include "client/session/tier_stats.h"

#include <gtest/gtest.h>

namespace stash::client {
namespace {

namespace v1 = stash::v1;

v1::TierStats MakeTier(int pool, v1::Tier kind, uint64_t total, uint64_t used) {
  v1::TierStats t;
  t.set_pool(pool);
  t.set_tier(kind);
  t.set_pages_total(total);
  t.set_pages_used(used);
  t.set_pages_high_water(used + 1);
  return t;
}

TEST(TierStats, CudaHostShareGoesToTheHostFieldsNotThePool) {
  SessionStats out;
  out.pool = 1;
  // What a cuda daemon serving 2 GPUs reports: both pools, then each GPU's host share.
  for (const v1::TierStats& t :
       {MakeTier(0, v1::TIER_DEVICE, 100, 1), MakeTier(1, v1::TIER_DEVICE, 200, 2),
        MakeTier(0, v1::TIER_HOST, 300, 3), MakeTier(1, v1::TIER_HOST, 400, 4)}) {
    AddTierStats(t, &out);
  }
  EXPECT_EQ(out.pool_pages_total, 200u);
  EXPECT_EQ(out.pool_pages_used, 2u);
  EXPECT_EQ(out.pool_pages_high_water, 3u);
  EXPECT_EQ(out.host_pages_total, 400u);
  EXPECT_EQ(out.host_pages_used, 4u);
  EXPECT_EQ(out.host_pages_high_water, 5u);
}

TEST(TierStats, HostBackendSharedHostTierHasPoolMinusOne) {
  SessionStats out;
  out.pool = 0;
  for (const v1::TierStats& t :
       {MakeTier(0, v1::TIER_DEVICE, 100, 1), MakeTier(1, v1::TIER_DEVICE, 200, 2),
        MakeTier(-1, v1::TIER_HOST, 300, 3)}) {
    AddTierStats(t, &out);
  }
  EXPECT_EQ(out.pool_pages_total, 100u);
  EXPECT_EQ(out.host_pages_total, 300u);
}

TEST(TierStats, ADaemonThatDoesNotSayWhatTheTierIsFallsBackToThePoolIndex) {
  SessionStats out;
  out.pool = 0;
  AddTierStats(MakeTier(0, v1::TIER_UNSPECIFIED, 100, 1), &out);
  AddTierStats(MakeTier(-1, v1::TIER_UNSPECIFIED, 300, 3), &out);
  EXPECT_EQ(out.pool_pages_total, 100u);
  EXPECT_EQ(out.host_pages_total, 300u);
}

}  // namespace
}  // namespace stash::client
