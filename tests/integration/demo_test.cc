// The stash-demo binary against the real stashd: exact parity of outputs and gradients with
// roomy pools, when stashes spill to the host tier, and when some overflow and stay in the rank.
//
// Geometry (4 KiB pages, 256-byte rows): every stash holds 256..384 rows, i.e. 16..24 pages, and
// each rank has 3 stashes live at its peak. A 24-page pool therefore holds at most one of them
// and the rest must spill; a 24-page host tier on top holds at most one more, so every step of
// every rank overflows at least once. The demo's seed is fixed and printed in its output.
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "stash/client.h"

namespace {

std::string BinDir() {
  const char* dir = std::getenv("STASHD_BIN_DIR");
  return dir != nullptr ? dir : "";
}

// argv as the exec family wants it; `args` must outlive the result.
std::vector<char*> Argv(std::vector<std::string>& args) {
  std::vector<char*> out;
  for (std::string& a : args) out.push_back(a.data());
  out.push_back(nullptr);
  return out;
}

struct DemoRun {
  int exit_code = -1;  // 128 + signal when killed
  std::string output;  // stdout and stderr, interleaved
};

class Demo : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(BinDir().empty()) << "STASHD_BIN_DIR is unset: run the test through ctest";
    char tmpl[] = "/tmp/stash-demo-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr) << std::strerror(errno);
    dir_ = tmpl;
    socket_ = dir_ + "/stashd.sock";
  }

  void TearDown() override {
    if (daemon_pid_ > 0) {
      ::kill(daemon_pid_, SIGTERM);
      int status = 0;
      while (::waitpid(daemon_pid_, &status, 0) < 0 && errno == EINTR) {
      }
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
          << "stashd did not stop cleanly on SIGTERM (status " << status << ")\n"
          << DaemonLog();
    }
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  // Starts stashd with 2 simulated devices and 4 KiB pages and waits until a client can open a
  // session (up to 10 s).
  void StartDaemon(const std::string& pool_bytes, const std::string& host_tier_bytes,
                   const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {BinDir() + "/daemon/stashd",
                                     "--socket=" + socket_,
                                     "--devices=2",
                                     "--page-bytes=4KiB",
                                     "--pool-bytes=" + pool_bytes,
                                     "--host-tier-bytes=" + host_tier_bytes,
                                     "--log-level=warn"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv = Argv(args);
    const std::string log = dir_ + "/stashd.log";
    daemon_pid_ = ::fork();
    ASSERT_GE(daemon_pid_, 0) << std::strerror(errno);
    if (daemon_pid_ == 0) {
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      if (fd >= 0) {
        ::dup2(fd, STDOUT_FILENO);
        ::dup2(fd, STDERR_FILENO);
      }
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }

    stash::Options options;
    options.socket = socket_;
    options.label = "demo_test probe";
    options.connect_timeout_ms = 200;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (true) {
      int status = 0;
      if (::waitpid(daemon_pid_, &status, WNOHANG) == daemon_pid_) {
        daemon_pid_ = -1;  // reaped: nothing for TearDown to stop
        FAIL() << "stashd exited (wait status " << status << ") before it answered\n"
               << DaemonLog();
      }
      if (stash::Client::Open(options).ok()) return;
      ASSERT_LT(std::chrono::steady_clock::now(), deadline)
          << "stashd did not answer on " << socket_ << " within 10 s\n"
          << DaemonLog();
    }
  }

  // Runs stash-demo with 2 ranks on the 2 devices and small shapes, plus `extra` flags.
  DemoRun RunDemo(const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {BinDir() + "/examples/stash-demo",
                                     "--socket=" + socket_,
                                     "--ranks=2",
                                     "--devices=2",
                                     "--layers=3",
                                     "--experts=4",
                                     "--topk=2",
                                     "--hidden=64",
                                     "--tokens=128",
                                     "--steps=2",
                                     "--seed=1"};
    args.insert(args.end(), extra.begin(), extra.end());
    return Run(args);
  }

  static DemoRun Run(std::vector<std::string> args) {
    DemoRun run;
    std::vector<char*> argv = Argv(args);
    int fds[2];
    if (::pipe(fds) != 0) {
      run.output = std::string("pipe: ") + std::strerror(errno);
      return run;
    }
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::dup2(fds[1], STDOUT_FILENO);
      ::dup2(fds[1], STDERR_FILENO);
      ::close(fds[0]);
      ::close(fds[1]);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(fds[1]);
    char buf[4096];
    while (true) {
      const ssize_t n = ::read(fds[0], buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      run.output.append(buf, static_cast<size_t>(n));
    }
    ::close(fds[0]);
    if (pid < 0) {
      run.output = std::string("fork: ") + std::strerror(errno);
      return run;
    }
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return run;
  }

  std::string DaemonLog() const {
    std::ifstream in(dir_ + "/stashd.log");
    std::stringstream s;
    s << "--- stashd log ---\n" << in.rdbuf();
    return s.str();
  }

  std::string dir_;
  std::string socket_;
  pid_t daemon_pid_ = -1;
};

// The demo's summary counters: "spills=N overflows=M" on its total line.
struct Totals {
  bool found = false;
  long spills = -1;
  long overflows = -1;
};

Totals ParseTotals(const std::string& output) {
  Totals t;
  std::smatch m;
  static const std::regex kTotal(R"(total over .*spills=(\d+) overflows=(\d+))");
  if (std::regex_search(output, m, kTotal)) {
    t.found = true;
    t.spills = std::stol(m[1]);
    t.overflows = std::stol(m[2]);
  }
  return t;
}

// The parity runs, in each mode (stash-demo --mode).
class DemoModes : public Demo, public ::testing::WithParamInterface<std::string> {
 protected:
  bool mapped() const { return GetParam() == "mapped"; }
  DemoRun RunInMode(std::vector<std::string> extra = {}) {
    extra.push_back("--mode=" + GetParam());
    return RunDemo(extra);
  }
};

INSTANTIATE_TEST_SUITE_P(Modes, DemoModes, ::testing::Values("daemon-copy", "mapped"),
                         [](const ::testing::TestParamInfo<std::string>& param) {
                           return param.param == "mapped" ? std::string("Mapped")
                                                          : std::string("DaemonCopy");
                         });

TEST_P(DemoModes, ParityWithRoomyPools) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon("64MiB", "64MiB"));
  const DemoRun run = RunInMode();
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("parity: OK on all 2 ranks (2 steps, 3 layers)"), std::string::npos)
      << run.output;
  const Totals t = ParseTotals(run.output);
  ASSERT_TRUE(t.found) << run.output;
  EXPECT_EQ(t.spills, 0) << run.output;
  EXPECT_EQ(t.overflows, 0) << run.output;
}

TEST_P(DemoModes, ParityWhenSpillingToHostTier) {
  // 24 pages: one stash at a time. A mapped rank leases the whole own pool and host chunks
  // (a fixed lease: an automatic one holds no host chunks in its first step).
  ASSERT_NO_FATAL_FAILURE(StartDaemon(
      "96KiB", "64MiB",
      mapped() ? std::vector<std::string>{"--max-lease-bytes=4MiB"} : std::vector<std::string>{}));
  const DemoRun run =
      RunInMode(mapped() ? std::vector<std::string>{"--lease=device=96KiB,host=2MiB"}
                         : std::vector<std::string>{});
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("parity: OK on all 2 ranks"), std::string::npos) << run.output;
  const Totals t = ParseTotals(run.output);
  ASSERT_TRUE(t.found) << run.output;
  EXPECT_GT(t.spills, 0) << run.output;
  EXPECT_EQ(t.overflows, 0) << run.output;
}

TEST_P(DemoModes, ParityWhenOverflowing) {
  // One stash each: the third overflows. Each rank on its own device's pool: with the peer tier,
  // which rank's stash overflows (and in which step) would depend on which asked first.
  ASSERT_NO_FATAL_FAILURE(StartDaemon("96KiB", "96KiB", {"--copy-peer-tier=false"}));
  const DemoRun run = RunInMode();
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("parity: OK on all 2 ranks"), std::string::npos) << run.output;
  const Totals t = ParseTotals(run.output);
  ASSERT_TRUE(t.found) << run.output;
  EXPECT_GT(t.overflows, 0) << run.output;
  if (!mapped()) {
    // The daemon logged the overflows (rate-limited), naming the session's rank and the layer
    // (in mapped mode the rank's own copier decides; the daemon sees no stash).
    EXPECT_TRUE(
        std::regex_search(DaemonLog(), std::regex(R"(overflow: session [0-9a-f]{8} rank \d )"
                                                  R"(pool \d label 'stash-demo' layer \d)")))
        << DaemonLog();
  }
  // BeginStep of step 1 reports step 0's overflow.
  EXPECT_NE(run.output.find("step 1 rank 0 (device 0) | previous step overflow=yes"),
            std::string::npos)
      << run.output;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST_F(Demo, HoldCommandRunsWhileEveryRankHoldsPages) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon("64MiB", "64MiB"));
  const std::string held = dir_ + "/held.json";
  const std::string stashctl = BinDir() + "/client/stashctl/stashctl --socket=" + socket_;
  const DemoRun run = RunDemo({"--hold-command=" + stashctl + " sessions --json > " + held + "; " +
                               stashctl + " sessions --detail > " + held + ".txt"});
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("every rank holds step 1's stashes; running --hold-command"),
            std::string::npos)
      << run.output;
  // Both sessions hold pages while the command runs (3 layers' inputs each).
  const std::string json = ReadFile(held);
  static const std::regex kLive(R"re("pages_live":\s*"?(\d+))re");
  int holding = 0;
  for (auto it = std::sregex_iterator(json.begin(), json.end(), kLive);
       it != std::sregex_iterator(); ++it) {
    if (std::stol((*it)[1]) > 0) ++holding;
  }
  EXPECT_EQ(holding, 2) << json;
  // --detail: the table (3 lines), then per rank a blank line, its title, a header and one row
  // per layer (3 layers, microbatch 0).
  const std::string detail = ReadFile(held + ".txt");
  EXPECT_EQ(std::count(detail.begin(), detail.end(), '\n'), 3 + 2 * 6) << detail;
  EXPECT_TRUE(std::regex_search(detail, std::regex(R"(\n +2 +0 +expert_fc_input +1 )"))) << detail;
  EXPECT_NE(json.find("\"name\": \"expert_fc_input\""), std::string::npos) << json;
}

TEST_F(Demo, HoldCommandFailureFailsTheRun) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon("64MiB", "64MiB"));
  const DemoRun run = RunDemo({"--hold-command=exit 3"});
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_NE(run.output.find("stash-demo: --hold-command 'exit 3' failed"), std::string::npos)
      << run.output;
  // The ranks were let go all the same and finished their steps.
  EXPECT_NE(run.output.find("total over 2 ranks"), std::string::npos) << run.output;
}

TEST_F(Demo, RanksDieWithTheLauncher) {
  // Orphaned ranks are reparented to this process, so it can reap them and see how they ended.
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0) << std::strerror(errno);
  ASSERT_NO_FATAL_FAILURE(StartDaemon("64MiB", "64MiB"));
  const std::string pids_file = dir_ + "/pids";
  // While the ranks hold their stashes, the command kills the launcher (its parent).
  const DemoRun run =
      RunDemo({"--hold-command=echo $STASH_DEMO_RANK_PIDS > " + pids_file + "; kill -TERM $PPID"});
  ::prctl(PR_SET_CHILD_SUBREAPER, 0);
  EXPECT_EQ(run.exit_code, 128 + SIGTERM) << run.output;
  std::istringstream pids(ReadFile(pids_file));
  std::vector<pid_t> ranks;
  for (pid_t pid = 0; pids >> pid;) ranks.push_back(pid);
  ASSERT_EQ(ranks.size(), 2U) << "pids: " << ReadFile(pids_file) << "\n" << run.output;
  for (const pid_t pid : ranks) {
    int status = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (::waitpid(pid, &status, WNOHANG) != pid) {
      ASSERT_LT(std::chrono::steady_clock::now(), deadline)
          << "rank " << pid << " outlived its launcher by 10 s";
    }
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM)
        << "rank " << pid << " ended with wait status " << status;
  }
}

TEST_F(Demo, SigtermDrainsTheRanksStashesRefusesNewSessionsThenStops) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon("64MiB", "64MiB"));
  const std::string second = dir_ + "/second";
  // While the ranks hold their last step's stashes: SIGTERM the daemon, then try a new job.
  const DemoRun run =
      RunDemo({"--hold-command=kill -TERM " + std::to_string(daemon_pid_) + "; " + BinDir() +
               "/examples/stash-demo --socket=" + socket_ + " --ranks=1 --steps=1 --layers=1 > " +
               second + ".out 2>&1; echo $? > " + second + ".rc"});
  // The holding ranks reloaded everything and kept parity.
  EXPECT_EQ(run.exit_code, 0) << run.output << DaemonLog();
  EXPECT_NE(run.output.find("parity: OK on all 2 ranks"), std::string::npos) << run.output;
  EXPECT_EQ(ReadFile(second + ".rc"), "1\n") << ReadFile(second + ".out");
  EXPECT_NE(ReadFile(second + ".out").find("is draining"), std::string::npos)
      << ReadFile(second + ".out");
  // Drained, the daemon stops by itself, cleanly.
  int status = 0;
  ASSERT_EQ(::waitpid(daemon_pid_, &status, 0), daemon_pid_);
  daemon_pid_ = -1;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << "\n" << DaemonLog();
  // By draining, not by the 5 s timeout (which logs a warning).
  EXPECT_EQ(DaemonLog().find("drain timeout"), std::string::npos) << DaemonLog();
}

TEST_F(Demo, BadFlagExitsTwoWithOneLine) {
  const DemoRun run = Run({BinDir() + "/examples/stash-demo", "--topk=5", "--experts=4"});
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_EQ(run.output, "stash-demo: --topk 5 must be at most --experts 4\n");
}

}  // namespace
