// The group a session joins (client/session/group_options.cc): Options first, else
// $STASHD_GROUP and $STASHD_GROUP_SECRET; malformed input is INVALID_ARGUMENT at Open, before
// any daemon is asked.
#include "client/session/group_options.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>

#include "stash/client.h"

namespace stash::client {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const char kHex[] = "000102030405060708090a0b0c0d0e0f101112131415161718191A1B1C1D1E1F";

// Sets (or, with nullptr, unsets) both variables for one test.
class GroupEnv : public ::testing::Test {
 protected:
  void TearDown() override { Set(nullptr, nullptr); }
  static void Set(const char* group, const char* secret) {
    if (group != nullptr) {
      setenv("STASHD_GROUP", group, 1);
    } else {
      unsetenv("STASHD_GROUP");
    }
    if (secret != nullptr) {
      setenv("STASHD_GROUP_SECRET", secret, 1);
    } else {
      unsetenv("STASHD_GROUP_SECRET");
    }
  }
};

TEST_F(GroupEnv, NoGroupAnywhereIsNoGroup) {
  Set(nullptr, nullptr);
  auto resolved = ResolveGroup(Options());
  ASSERT_TRUE(resolved.ok()) << resolved.status().ToString();
  EXPECT_TRUE(resolved->group.empty());
  EXPECT_TRUE(resolved->group_secret.empty());
}

TEST_F(GroupEnv, TheEnvironmentNamesTheGroupWhenOptionsDoNot) {
  Set("slurm:42.0", kHex);
  auto resolved = ResolveGroup(Options());
  ASSERT_TRUE(resolved.ok()) << resolved.status().ToString();
  EXPECT_EQ(resolved->group, "slurm:42.0");
  ASSERT_EQ(resolved->group_secret.size(), kGroupSecretBytes);
  for (size_t i = 0; i < kGroupSecretBytes; ++i) {
    EXPECT_EQ(static_cast<unsigned char>(resolved->group_secret[i]), i) << i;
  }
}

TEST_F(GroupEnv, OptionsWinOverTheEnvironment) {
  Set("from-env", kHex);
  Options options;
  options.group = "from-options";
  options.group_secret = std::string(32, 'o');
  auto resolved = ResolveGroup(options);
  ASSERT_TRUE(resolved.ok()) << resolved.status().ToString();
  EXPECT_EQ(resolved->group, "from-options");
  EXPECT_EQ(resolved->group_secret, std::string(32, 'o'));
}

TEST_F(GroupEnv, ASecretThatIsNot64HexCharactersIsRefusedNamingTheVariable) {
  for (const std::string& bad :
       {std::string(63, 'a'), std::string(65, 'a'), std::string(64, 'g'),
        std::string(62, 'a') + " a", std::string("0x") + std::string(62, '0')}) {
    Set("job", bad.c_str());
    auto resolved = ResolveGroup(Options());
    EXPECT_EQ(resolved.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(resolved.status().message(), HasSubstr("$STASHD_GROUP_SECRET must be 64 hex"))
        << bad;
    EXPECT_THAT(resolved.status().message(), Not(HasSubstr(bad))) << "the secret is not quoted";
  }
}

TEST_F(GroupEnv, OneVariableWithoutTheOtherIsRefused) {
  Set("job", nullptr);
  EXPECT_THAT(ResolveGroup(Options()).status().message(),
              HasSubstr("$STASHD_GROUP is set but $STASHD_GROUP_SECRET is not"));
  Set(nullptr, kHex);
  EXPECT_THAT(ResolveGroup(Options()).status().message(),
              HasSubstr("$STASHD_GROUP_SECRET is set but $STASHD_GROUP is not"));
}

TEST_F(GroupEnv, OptionsWithAGroupWithoutASecretOrTheReverseAreRefused) {
  Set(nullptr, nullptr);
  Options group_alone;
  group_alone.group = "job";
  EXPECT_EQ(ResolveGroup(group_alone).status().code(), StatusCode::kInvalidArgument);
  Options secret_alone;
  secret_alone.group_secret = std::string(32, 's');
  EXPECT_THAT(ResolveGroup(secret_alone).status().message(),
              HasSubstr("Options.group_secret is set but Options.group is empty"));
  Options short_secret;
  short_secret.group = "job";
  short_secret.group_secret = std::string(16, 's');
  EXPECT_THAT(ResolveGroup(short_secret).status().message(),
              HasSubstr("Options.group_secret is 16 bytes"));
  // The environment does not complete half of the options.
  Set("job", kHex);
  EXPECT_EQ(ResolveGroup(group_alone).status().code(), StatusCode::kInvalidArgument);
}

// Client::Open says so at once: no daemon is needed to hear it.
TEST_F(GroupEnv, ClientOpenRefusesABadSecretBeforeConnecting) {
  Set("job", "not-hex");
  Options options;
  options.socket = "/nonexistent/stashd.sock";
  auto client = Client::Open(options);
  EXPECT_EQ(client.status().code(), StatusCode::kInvalidArgument) << client.status().ToString();
  EXPECT_THAT(client.status().message(), HasSubstr("STASHD_GROUP_SECRET"));
}

}  // namespace
}  // namespace stash::client
