// GroupRegistry (daemon/sessions/group_registry.h): who may join a group of sessions.
#include "daemon/sessions/group_registry.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

namespace stash::daemon {
namespace {

using ::testing::HasSubstr;

std::string Secret(char fill) { return std::string(kGroupSecretBytes, fill); }

TEST(GroupRegistry, TheFirstMemberCreatesTheGroupAndLaterOnesJoinIt) {
  GroupRegistry groups;
  auto first = groups.Join(1000, "torchrun:job", Secret('a'), "s1");
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_GT(*first, 0u);
  auto second = groups.Join(1000, "torchrun:job", Secret('a'), "s2");
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(*second, *first);
  EXPECT_EQ(groups.groups(), 1u);
  EXPECT_EQ(groups.members("torchrun:job"), 2u);
  // Another name is another group, with its own id.
  auto other = groups.Join(1000, "slurm:7.0", Secret('a'), "s3");
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  EXPECT_NE(*other, *first);
  EXPECT_EQ(groups.groups(), 2u);
}

TEST(GroupRegistry, AWrongSecretIsRefused) {
  GroupRegistry groups;
  ASSERT_TRUE(groups.Join(1000, "job", Secret('a'), "s1").ok());
  auto wrong = groups.Join(1000, "job", Secret('b'), "s2");
  EXPECT_EQ(wrong.status().code(), StatusCode::kPermissionDenied);
  EXPECT_THAT(wrong.status().message(), HasSubstr("wrong group secret for group job"));
  EXPECT_THAT(wrong.status().message(), HasSubstr("STASHD_GROUP_SECRET"));
  EXPECT_EQ(groups.members("job"), 1u);  // nothing changed
}

// Every byte counts: a secret that differs only in its last byte (or only in its first) is
// another secret.
TEST(GroupRegistry, EveryByteOfTheSecretIsCompared) {
  GroupRegistry groups;
  const std::string secret = Secret('k');
  ASSERT_TRUE(groups.Join(0, "job", secret, "s1").ok());
  std::string last = secret;
  last.back() = 'l';
  EXPECT_EQ(groups.Join(0, "job", last, "s2").status().code(), StatusCode::kPermissionDenied);
  std::string first = secret;
  first.front() = 'l';
  EXPECT_EQ(groups.Join(0, "job", first, "s3").status().code(), StatusCode::kPermissionDenied);
  EXPECT_TRUE(groups.Join(0, "job", secret, "s4").ok());
}

TEST(GroupRegistry, AnotherUserCannotJoinEvenWithTheSecret) {
  GroupRegistry groups;
  ASSERT_TRUE(groups.Join(1000, "job", Secret('a'), "s1").ok());
  auto other = groups.Join(1001, "job", Secret('a'), "s2");
  EXPECT_EQ(other.status().code(), StatusCode::kPermissionDenied);
  EXPECT_THAT(other.status().message(),
              HasSubstr("group job belongs to another user on this node: pick another group name"));
  EXPECT_EQ(groups.members("job"), 1u);
}

TEST(GroupRegistry, TheGroupIsForgottenWithItsLastMemberAndComesBackNew) {
  GroupRegistry groups;
  auto first = groups.Join(1000, "job", Secret('a'), "s1");
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(groups.Join(1000, "job", Secret('a'), "s2").ok());
  groups.Leave("s1");
  EXPECT_EQ(groups.members("job"), 1u);
  // A member is left: the group, its user and its secret stay.
  EXPECT_EQ(groups.Join(1000, "job", Secret('b'), "s3").status().code(),
            StatusCode::kPermissionDenied);
  groups.Leave("s2");
  EXPECT_EQ(groups.groups(), 0u);
  // Forgotten: the next session naming it creates a new group, with a new id, and may be another
  // user with another secret.
  auto again = groups.Join(1001, "job", Secret('b'), "s4");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_NE(*again, *first);
  EXPECT_GT(*again, *first);
  EXPECT_EQ(groups.Join(1000, "job", Secret('a'), "s5").status().code(),
            StatusCode::kPermissionDenied);
}

TEST(GroupRegistry, LeaveIgnoresSessionsInNoGroupAndLeavingTwice) {
  GroupRegistry groups;
  groups.Leave("never-joined");
  ASSERT_TRUE(groups.Join(1000, "job", Secret('a'), "s1").ok());
  ASSERT_TRUE(groups.Join(1000, "job", Secret('a'), "s2").ok());
  groups.Leave("s1");
  groups.Leave("s1");
  EXPECT_EQ(groups.members("job"), 1u);
}

TEST(GroupRegistry, ASessionJoinsOneGroupOnce) {
  GroupRegistry groups;
  ASSERT_TRUE(groups.Join(1000, "job", Secret('a'), "s1").ok());
  EXPECT_EQ(groups.Join(1000, "other", Secret('a'), "s1").status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(groups.groups(), 1u);
}

TEST(GroupRegistry, GroupsPerUserAndMembersPerGroupAreBounded) {
  GroupRegistry groups(GroupRegistry::Limits{/*groups_per_uid=*/2, /*members_per_group=*/3});
  ASSERT_TRUE(groups.Join(1000, "g1", Secret('a'), "s1").ok());
  ASSERT_TRUE(groups.Join(1000, "g2", Secret('a'), "s2").ok());
  auto third = groups.Join(1000, "g3", Secret('a'), "s3");
  EXPECT_EQ(third.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(third.status().message(), HasSubstr("this user has 2 groups on this node"));
  // Another user has a budget of its own.
  EXPECT_TRUE(groups.Join(1001, "g3", Secret('a'), "s3").ok());
  // Joining an existing group takes no group of the budget.
  ASSERT_TRUE(groups.Join(1000, "g1", Secret('a'), "s4").ok());
  ASSERT_TRUE(groups.Join(1000, "g1", Secret('a'), "s5").ok());
  auto full = groups.Join(1000, "g1", Secret('a'), "s6");
  EXPECT_EQ(full.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(full.status().message(), HasSubstr("group g1 has 3 sessions"));
  // A group forgotten gives its place back.
  groups.Leave("s2");
  EXPECT_TRUE(groups.Join(1000, "g4", Secret('a'), "s7").ok());
}

TEST(GroupRegistry, FieldsOfTheWrongShapeAreInvalid) {
  EXPECT_TRUE(CheckGroupFields("", "").ok());
  EXPECT_TRUE(CheckGroupFields("torchrun:abc@10.0.0.1:29500", Secret('a')).ok());
  EXPECT_TRUE(CheckGroupFields("A-z_0.9+x@y:z", Secret('a')).ok());
  EXPECT_TRUE(CheckGroupFields(std::string(kMaxGroupNameBytes, 'g'), Secret('a')).ok());

  const Status too_long = CheckGroupFields(std::string(kMaxGroupNameBytes + 1, 'g'), Secret('a'));
  EXPECT_EQ(too_long.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(too_long.message(), HasSubstr("A-Z a-z 0-9 . _ : @ + -"));
  for (const std::string& name :
       {std::string("has space"), std::string("slash/"), std::string("nul\0x", 5),
        std::string("quote'"), std::string("\xc3\xa9")}) {
    const Status s = CheckGroupFields(name, Secret('a'));
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << name;
    EXPECT_THAT(s.message(), HasSubstr("A-Z a-z 0-9 . _ : @ + -")) << name;
  }
  const Status short_secret = CheckGroupFields("job", std::string(31, 's'));
  EXPECT_EQ(short_secret.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(short_secret.message(), HasSubstr("exactly 32 bytes"));
  EXPECT_EQ(CheckGroupFields("job", std::string(33, 's')).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckGroupFields("job", "").code(), StatusCode::kInvalidArgument);
  const Status secret_alone = CheckGroupFields("", Secret('a'));
  EXPECT_EQ(secret_alone.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(secret_alone.message(), HasSubstr("Hello.group is empty"));
  // Join checks them too.
  GroupRegistry groups;
  EXPECT_EQ(groups.Join(0, "bad name", Secret('a'), "s1").status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(groups.Join(0, "", "", "s1").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(groups.groups(), 0u);
}

}  // namespace
}  // namespace stash::daemon
