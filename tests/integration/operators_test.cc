// Issue 25, the operators' part that lives in the daemon: who may drain, a way back (undrain),
// readiness that follows drain while liveness does not, and where the daemon serves besides its
// socket (stashctl config).
#include <sys/stat.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "tests/integration/harness.h"

namespace stash::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr uid_t kNobody = 65534;

std::vector<std::string> Flags(std::vector<std::string> extra = {}) {
  std::vector<std::string> flags = {"--pool-bytes=8MiB", "--page-bytes=64KiB",
                                    "--host-tier-bytes=0", "--backend=host"};
  flags.insert(flags.end(), extra.begin(), extra.end());
  return flags;
}

#define ASSERT_READY(daemon) \
  ASSERT_TRUE((daemon).Ready()) << "stashd did not start: " << (daemon).process().Stderr()

// stashctl against `daemon`, as `uid` (-1: the test's own user); its exit code.
int Stashctl(DaemonProcess& daemon, std::vector<std::string> args, std::string* out,
             std::string* err = nullptr, uid_t uid = static_cast<uid_t>(-1)) {
  std::vector<std::string> argv = {BinDir() + "/client/stashctl/stashctl",
                                   "--socket=" + daemon.socket()};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunCommand(argv, out, err, {}, uid);
}

// A round trip of a daemon-copy session: 0 when it worked.
int ClientRound(DaemonProcess& daemon, std::string* err) {
  return RunCommand(
      {BinDir() + "/tests/integration/stash-test-client", daemon.socket(), "once", "65536"},
      nullptr, err);
}

TEST(Operators, DrainTurnsReadinessNotServingAndUndrainTurnsItBack) {
  DaemonProcess daemon(Flags());
  ASSERT_READY(daemon);
  std::string out;
  std::string err;
  ASSERT_EQ(Stashctl(daemon, {"health"}, &out), 0);
  EXPECT_THAT(out, HasSubstr("SERVING"));

  ASSERT_EQ(Stashctl(daemon, {"drain"}, &out, &err), 0) << err;
  EXPECT_THAT(out, HasSubstr("stashctl undrain"));
  // Readiness (the daemon as a whole) is NOT_SERVING; liveness (the service) stays SERVING.
  EXPECT_EQ(Stashctl(daemon, {"health"}, &out), 1);
  EXPECT_THAT(out, HasSubstr("NOT_SERVING"));
  EXPECT_EQ(Stashctl(daemon, {"health", "--service=stash.v1.StashService"}, &out), 0);
  EXPECT_THAT(out, HasSubstr("SERVING"));
  EXPECT_NE(ClientRound(daemon, &err), 0) << "a new session while draining";
  EXPECT_THAT(err, HasSubstr("draining"));

  ASSERT_EQ(Stashctl(daemon, {"undrain"}, &out, &err), 0) << err;
  EXPECT_THAT(out, HasSubstr("takes sessions and stashes again"));
  EXPECT_EQ(Stashctl(daemon, {"health"}, &out), 0);
  EXPECT_EQ(ClientRound(daemon, &err), 0) << err;
  // The log says who drained and undrained: uid, pid and command.
  const std::string log = daemon.process().Stderr();
  EXPECT_THAT(log, HasSubstr("draining, asked by uid " + std::to_string(geteuid()) + " pid "));
  EXPECT_THAT(log, HasSubstr("(stashctl)"));
  EXPECT_THAT(log, HasSubstr("draining ended, asked by uid "));
}

TEST(Operators, OnlyRootOrTheDaemonsUserMayDrain) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a second Unix user";
  DaemonProcess daemon(Flags());
  ASSERT_READY(daemon);
  // Let uid 65534's group onto the socket, as the stashd group would be.
  ASSERT_EQ(chown(daemon.dir().c_str(), static_cast<uid_t>(-1), kNobody), 0);
  ASSERT_EQ(chmod(daemon.dir().c_str(), 0750), 0);
  ASSERT_EQ(chown(daemon.socket().c_str(), static_cast<uid_t>(-1), kNobody), 0);
  std::string out;
  std::string err;
  // A member of the group may use the daemon...
  ASSERT_EQ(Stashctl(daemon, {"stats"}, &out, &err, kNobody), 0) << err;
  // ...but not drain it, nor undrain it.
  EXPECT_NE(Stashctl(daemon, {"drain"}, &out, &err, kNobody), 0);
  EXPECT_THAT(err, HasSubstr("only root or stashd's own user"));
  EXPECT_THAT(err, HasSubstr("sudo stashctl drain"));
  EXPECT_EQ(Stashctl(daemon, {"health"}, &out), 0) << "the refused drain changed nothing";
  EXPECT_NE(Stashctl(daemon, {"undrain"}, &out, &err, kNobody), 0);
  EXPECT_THAT(daemon.process().Stderr(),
              HasSubstr("refused to drain or undrain for uid 65534 pid "));
}

TEST(Operators, ConfigShowsWhereMetricsAndTheTcpListenerServe) {
  DaemonProcess daemon(Flags({"--metrics-listen=127.0.0.1:0", "--listen=127.0.0.1:0"}));
  ASSERT_READY(daemon);
  std::string out;
  std::string err;
  ASSERT_EQ(Stashctl(daemon, {"config"}, &out, &err), 0) << err;
  EXPECT_THAT(out, HasSubstr("metrics http://127.0.0.1:"));
  EXPECT_THAT(out, Not(HasSubstr("127.0.0.1:0/")));  // the port chosen, not the one asked
  EXPECT_THAT(out, HasSubstr("tcp listener 127.0.0.1:"));
  ASSERT_EQ(Stashctl(daemon, {"config", "--json"}, &out, &err), 0) << err;
  EXPECT_THAT(out, HasSubstr("\"metrics_url\""));
  EXPECT_THAT(out, HasSubstr("\"tcp_listener\""));
}

// Issue 21: a quota smaller than one chunk could never grant a lease: stashd refuses to start,
// with the numbers.
TEST(Operators, AQuotaSmallerThanOneChunkIsRefusedAtStart) {
  TempDir dir;
  std::string err;
  const int code =
      RunCommand({BinDir() + "/daemon/stashd", "--socket=" + dir.path() + "/s.sock",
                  "--backend=host", "--pool-bytes=8MiB", "--page-bytes=64KiB",
                  "--host-tier-bytes=0", "--chunk-bytes=1MiB", "--max-lease-bytes=512KiB"},
                 nullptr, &err);
  EXPECT_NE(code, 0);
  EXPECT_THAT(err, HasSubstr("--max-lease-bytes=524288 is less than one chunk (1048576 bytes"));
}

// The kB of memory process `pid` holds locked (VmLck in /proc/<pid>/status); -1 when unknown.
long LockedKiB(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmLck:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

// Whether process `pid` has a library named like `name` mapped.
bool MapsLibrary(pid_t pid, const std::string& name) {
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find(name) != std::string::npos) return true;
  }
  return false;
}

// --lock-memory populates and locks the tiers at start; without it nothing is locked.
TEST(Operators, LockMemoryLocksEveryTierAtStart) {
  DaemonProcess plain(Flags({"--host-tier-bytes=4MiB"}));
  ASSERT_READY(plain);
  EXPECT_EQ(LockedKiB(plain.process().pid()), 0);
  DaemonProcess locked(Flags({"--host-tier-bytes=4MiB", "--lock-memory"}));
  ASSERT_READY(locked);
  if (MapsLibrary(locked.process().pid(), "libasan") ||
      MapsLibrary(locked.process().pid(), "libtsan")) {
    GTEST_SKIP() << "this stashd is built with a sanitizer that makes mlock a no-op";
  }
  EXPECT_GE(LockedKiB(locked.process().pid()), (8 + 4) * 1024);  // the pool and the host tier
}

}  // namespace
}  // namespace stash::testing
