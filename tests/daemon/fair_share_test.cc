#include "daemon/limits/fair_share.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <random>

namespace stash::daemon {
namespace {

using ::testing::HasSubstr;

FairShare::Spec Spec(uint64_t capacity, uint64_t first, uint64_t per_user = 0) {
  return {"widgets", capacity, first, per_user, "give some back"};
}

TEST(FairShare, AUserAloneTakesAllButAnotherUsersFirstShare) {
  FairShare share(Spec(100, 10));
  EXPECT_TRUE(share.Take(1, 90).ok());
  const Status refused = share.Take(1, 1);
  EXPECT_EQ(refused.code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(), HasSubstr("90 of its 100 widgets in use, 90 by uid 1"));
  EXPECT_THAT(refused.message(), HasSubstr("another user's first session"));
  EXPECT_THAT(refused.message(), HasSubstr("give some back"));
  EXPECT_EQ(share.used(), 90u);  // a refusal takes nothing
  // Another user's first session gets its share.
  EXPECT_EQ(share.Headroom(2), 10u);
  EXPECT_TRUE(share.Take(2, 10).ok());
  EXPECT_EQ(share.Headroom(2), 0u);
  EXPECT_EQ(share.Headroom(1), 0u);
}

TEST(FairShare, GivingBackMakesRoomAndNeverGoesBelowZero) {
  FairShare share(Spec(10, 2));
  EXPECT_TRUE(share.Take(7, 8).ok());
  EXPECT_FALSE(share.Take(7, 1).ok());
  share.Give(7, 3);
  EXPECT_EQ(share.Held(7), 5u);
  EXPECT_TRUE(share.Take(7, 3).ok());
  share.Give(7, 1000);  // more than it holds: clamped
  EXPECT_EQ(share.Held(7), 0u);
  EXPECT_EQ(share.used(), 0u);
  share.Give(8, 5);  // a user that holds nothing
  EXPECT_EQ(share.used(), 0u);
}

TEST(FairShare, APerUserCapHoldsWhateverIsFree) {
  FairShare share(Spec(1000, 10, 64));
  EXPECT_TRUE(share.Take(1, 64).ok());
  const Status refused = share.Take(1, 1);
  EXPECT_EQ(refused.code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(), HasSubstr("the limit of 64 per user"));
  EXPECT_TRUE(share.Take(2, 64).ok());
}

TEST(FairShare, WithoutAFirstShareItIsAPlainLimit) {
  FairShare share(Spec(5, 0));
  EXPECT_TRUE(share.Take(1, 5).ok());
  EXPECT_FALSE(share.Take(2, 1).ok());
}

// Random takes and gives of several users against a model of the rule: the total never passes
// the capacity, a refusal changes nothing, and a take is granted exactly when it stays within the
// user's first share or leaves `first` free.
TEST(FairShare, RandomTakesKeepTheInvariants) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  constexpr uint64_t kCapacity = 200;
  constexpr uint64_t kFirst = 16;
  FairShare share(Spec(kCapacity, kFirst));
  uint64_t held[5] = {};
  for (int i = 0; i < 20000; ++i) {
    const uint32_t uid = rng() % 5;
    const uint64_t n = rng() % 20;
    if (rng() % 3 == 0) {
      share.Give(uid, n);
      held[uid] -= std::min(n, held[uid]);
    } else {
      uint64_t used = 0;
      for (uint64_t h : held) used += h;
      const uint64_t free = kCapacity - used;
      const bool fits = n == 0 || (n <= free && (held[uid] + n <= kFirst || free - n >= kFirst));
      EXPECT_EQ(share.Take(uid, n).ok(), fits) << "uid " << uid << " n " << n;
      if (fits) held[uid] += n;
    }
    uint64_t used = 0;
    for (uint64_t h : held) used += h;
    ASSERT_EQ(share.used(), used);
    ASSERT_LE(used, kCapacity);
    ASSERT_EQ(share.Held(uid), held[uid]);
  }
}

}  // namespace
}  // namespace stash::daemon
