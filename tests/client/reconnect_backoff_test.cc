#include "client/session/reconnect_backoff.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

namespace stash::client {
namespace {

using std::chrono::milliseconds;
using Clock = ReconnectBackoff::Clock;

const PathIdentity kSocketA{1, 10, 100};
const PathIdentity kSocketB{1, 10, 200};  // the same path and inode number, made later

TEST(ReconnectBackoff, WaitsDoubleFromTheFirstUpToTheMost) {
  ReconnectBackoff b;
  const Clock::time_point t0{};
  EXPECT_TRUE(b.Due(t0, kSocketA));
  milliseconds expected = ReconnectBackoff::kFirst;
  Clock::time_point now = t0;
  for (int i = 0; i < 8; ++i) {
    b.Failed(now, kSocketA);
    EXPECT_EQ(b.wait(), expected) << "failure " << i;
    EXPECT_FALSE(b.Due(now + expected - milliseconds(1), kSocketA));
    EXPECT_TRUE(b.Due(now + expected, kSocketA));
    now += expected;
    expected = std::min(2 * expected, ReconnectBackoff::kMost);
  }
  EXPECT_EQ(b.wait(), ReconnectBackoff::kMost);
}

TEST(ReconnectBackoff, ANewFileAtTheSocketsPathIsTriedAtOnce) {
  ReconnectBackoff b;
  const Clock::time_point t0{};
  for (int i = 0; i < 5; ++i) b.Failed(t0, kSocketA);
  EXPECT_FALSE(b.Due(t0 + milliseconds(1), kSocketA));
  EXPECT_TRUE(b.Due(t0 + milliseconds(1), kSocketB)) << "a daemon started since the failure";
  // The file went away since: one more attempt (refused at once) records that.
  EXPECT_TRUE(b.Due(t0 + milliseconds(1), PathIdentity{}));
  // Failing against the new file too waits again, for longer.
  b.Failed(t0 + milliseconds(1), kSocketB);
  EXPECT_FALSE(b.Due(t0 + milliseconds(2), kSocketB));
}

TEST(ReconnectBackoff, AFailureWithNothingAtThePathWaitsUntilAFileAppears) {
  ReconnectBackoff b;
  const Clock::time_point t0{};
  b.Failed(t0, PathIdentity{});
  EXPECT_FALSE(b.Due(t0 + milliseconds(1), PathIdentity{}));
  EXPECT_TRUE(b.Due(t0 + milliseconds(1), kSocketA));
}

TEST(ReconnectBackoff, ASuccessStartsOver) {
  ReconnectBackoff b;
  const Clock::time_point t0{};
  for (int i = 0; i < 5; ++i) b.Failed(t0, kSocketA);
  b.Succeeded();
  EXPECT_TRUE(b.Due(t0, kSocketA));
  b.Failed(t0, kSocketA);
  EXPECT_EQ(b.wait(), ReconnectBackoff::kFirst);
}

// A socket bound, removed and bound again at one path (what a restarted stashd does) is a new
// identity, even where the file system hands the removed inode's number to the new file;
// nothing there is all zero.
TEST(PathIdentity, ARebuiltSocketIsANewFile) {
  char dir[] = "/tmp/backoff-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/s.sock";
  EXPECT_EQ(PathIdentity::Of(path), PathIdentity{});
  auto bind_at = [&] {
    const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << strerror(errno);
    return fd;
  };
  const int first = bind_at();
  const PathIdentity a = PathIdentity::Of(path);
  EXPECT_NE(a, PathIdentity{});
  EXPECT_EQ(PathIdentity::Of(path), a);
  ASSERT_EQ(unlink(path.c_str()), 0);
  close(first);
  // A daemon's socket lives at least as long as its start-up: more than the file system's
  // clock tick (a few ms), so the new file's change time is its own.
  std::this_thread::sleep_for(milliseconds(20));
  const int second = bind_at();
  EXPECT_NE(PathIdentity::Of(path), a);
  close(second);
  unlink(path.c_str());
  rmdir(dir);
}

}  // namespace
}  // namespace stash::client
