// Socket path resolution (common/socket_path.h): explicit path > $STASHD_SOCKET > default, and
// the per-user fallback.
#include "common/socket_path.h"

#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>

#include "tests/integration/harness.h"

namespace stash {
namespace {

// Sets (or, with nullopt, unsets) one environment variable for the scope; restores it after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value.has_value()) {
      setenv(name, value->c_str(), 1);
    } else {
      unsetenv(name);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  ~ScopedEnv() {
    if (old_.has_value()) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

bool Exists(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0;
}

std::string TmpFallback() { return "/tmp/stashd-" + std::to_string(getuid()) + "/stashd.sock"; }

TEST(SocketPath, ExplicitPathWinsOverEnv) {
  ScopedEnv env("STASHD_SOCKET", "/from/env.sock");
  EXPECT_EQ(DaemonSocketPath("/explicit/stashd.sock"), "/explicit/stashd.sock");
  EXPECT_EQ(ClientSocketPath("/explicit/stashd.sock"), "/explicit/stashd.sock");
}

TEST(SocketPath, EnvWinsOverDefault) {
  ScopedEnv env("STASHD_SOCKET", "/from/env.sock");
  EXPECT_EQ(DaemonSocketPath(""), "/from/env.sock");
  EXPECT_EQ(ClientSocketPath(""), "/from/env.sock");
}

TEST(SocketPath, EmptyEnvMeansUnset) {
  ScopedEnv env("STASHD_SOCKET", "");
  const std::string daemon = DaemonSocketPath("");
  EXPECT_TRUE(daemon == kSystemSocketPath || daemon == UserSocketPath()) << daemon;
  const std::string client = ClientSocketPath("");
  EXPECT_TRUE(client == kSystemSocketPath || client == UserSocketPath()) << client;
}

TEST(SocketPath, DaemonDefaultsToSystemPathWhenItsDirectoryIsUsable) {
  ScopedEnv env("STASHD_SOCKET", std::nullopt);
  const bool usable =
      Exists("/run/stashd") ? access("/run/stashd", W_OK) == 0 : access("/run", W_OK) == 0;
  if (usable) {
    EXPECT_EQ(DaemonSocketPath(""), kSystemSocketPath);
  } else {
    EXPECT_EQ(DaemonSocketPath(""), UserSocketPath());
  }
}

TEST(SocketPath, UserPathLivesInXdgRuntimeDir) {
  testing::TempDir dir;
  ScopedEnv xdg("XDG_RUNTIME_DIR", dir.path());
  EXPECT_EQ(UserSocketPath(), dir.path() + "/stashd/stashd.sock");
}

TEST(SocketPath, UserPathFallsBackToTmpWithoutXdgRuntimeDir) {
  {
    ScopedEnv xdg("XDG_RUNTIME_DIR", std::nullopt);
    EXPECT_EQ(UserSocketPath(), TmpFallback());
  }
  {
    ScopedEnv xdg("XDG_RUNTIME_DIR", "");
    EXPECT_EQ(UserSocketPath(), TmpFallback());
  }
}

TEST(SocketPath, UserPathIgnoresAnXdgRuntimeDirThatIsNotWritable) {
  testing::TempDir dir;
  ScopedEnv xdg("XDG_RUNTIME_DIR", dir.path() + "/missing");
  EXPECT_EQ(UserSocketPath(), TmpFallback());
}

TEST(SocketPath, DaemonFallsBackToUserPathOnlyWhenSystemPathIsUnusable) {
  testing::TempDir dir;
  ScopedEnv env("STASHD_SOCKET", std::nullopt);
  ScopedEnv xdg("XDG_RUNTIME_DIR", dir.path());
  const std::string path = DaemonSocketPath("");
  EXPECT_TRUE(path == kSystemSocketPath || path == dir.path() + "/stashd/stashd.sock") << path;
}

TEST(SocketPath, ClientFindsTheUserSocketWhenNoSystemSocketExists) {
  if (Exists(std::string(kSystemSocketPath))) GTEST_SKIP() << kSystemSocketPath << " exists here";
  testing::TempDir dir;
  ScopedEnv env("STASHD_SOCKET", std::nullopt);
  ScopedEnv xdg("XDG_RUNTIME_DIR", dir.path());
  ASSERT_EQ(mkdir((dir.path() + "/stashd").c_str(), 0700), 0);
  const std::string user = dir.path() + "/stashd/stashd.sock";
  std::ofstream(user).put('\n');  // Exists() is all the client checks
  EXPECT_EQ(ClientSocketPath(""), user);
}

TEST(SocketPath, ClientNamesTheSystemPathWhenNoSocketExists) {
  if (Exists(std::string(kSystemSocketPath))) GTEST_SKIP() << kSystemSocketPath << " exists here";
  testing::TempDir dir;
  ScopedEnv env("STASHD_SOCKET", std::nullopt);
  ScopedEnv xdg("XDG_RUNTIME_DIR", dir.path());
  EXPECT_EQ(ClientSocketPath(""), kSystemSocketPath);
}

TEST(SocketPath, GrpcTargetIsUnixScheme) {
  EXPECT_EQ(GrpcUnixTarget("/run/stashd/stashd.sock"), "unix:/run/stashd/stashd.sock");
}

}  // namespace
}  // namespace stash
