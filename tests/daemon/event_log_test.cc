// EventLog's rate limit and how event lines name a stash.
#include "daemon/stats/event_log.h"

#include <gtest/gtest.h>

namespace stash::daemon {
namespace {

using Clock = RateLimiter::Clock;

TEST(RateLimiter, AllowsABurstPerPeriodAndCountsWhatItHeldBack) {
  RateLimiter limiter(2, std::chrono::seconds(1));
  const Clock::time_point t0 = Clock::time_point() + std::chrono::hours(1);
  uint64_t held = 99;
  EXPECT_TRUE(limiter.Allow(t0, &held));
  EXPECT_EQ(held, 0U);
  EXPECT_TRUE(limiter.Allow(t0, &held));
  EXPECT_FALSE(limiter.Allow(t0 + std::chrono::milliseconds(10), &held));
  EXPECT_FALSE(limiter.Allow(t0 + std::chrono::milliseconds(999), &held));
  // A new period: the two refused events are reported with the next line.
  EXPECT_TRUE(limiter.Allow(t0 + std::chrono::seconds(1), &held));
  EXPECT_EQ(held, 2U);
  EXPECT_TRUE(limiter.Allow(t0 + std::chrono::seconds(1), &held));
  EXPECT_EQ(held, 0U);
}

TEST(EventLog, DescribeNamesSessionRankLayerMicrobatchAndName) {
  SessionInfo info;
  info.id = "0123456789abcdef0123456789abcdef";
  info.rank = 3;
  info.pool = 1;
  info.label = "job-a";
  v1::Stash stash;
  stash.set_layer(7);
  stash.set_microbatch(2);
  stash.set_name("experts");
  EXPECT_EQ(EventLog::Describe(info, &stash),
            "session 01234567 rank 3 pool 1 label 'job-a' layer 7 microbatch 2 name 'experts'");
  info.rank = -1;
  info.label.clear();
  EXPECT_EQ(EventLog::Describe(info, nullptr), "session 01234567 pool 1");
}

}  // namespace
}  // namespace stash::daemon
