#include "examples/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "examples/rank.h"
#include "examples/report.h"
#include "examples/routing.h"

namespace stash::demo {
namespace {

// What the launcher knows about one rank process.
struct Child {
  pid_t pid = -1;
  int fd = -1;              // read end of its report pipe; -1 once closed
  std::string partial;      // bytes after the last newline
  bool eof = false;         // the pipe is closed: no more lines
  bool has_totals = false;  // it reported its totals: it finished every step
  bool parity_failed = false;
  bool reported_error = false;
  bool holding = false;  // it holds its last step's stashes and waits for the hold byte
  RankTotals totals;
  int wait_status = 0;
};

// "1 step", "3 steps".
std::string Count(int64_t n, const char* noun) {
  return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
}

std::string Percent(double fraction) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f%%", 100.0 * fraction);
  return buf;
}

class Launcher {
 public:
  explicit Launcher(const DemoFlags& flags) : flags_(flags), children_(flags.ranks) {}

  int Run() {
    // Nothing buffered may be inherited and printed twice.
    std::fflush(stdout);
    std::fflush(stderr);
    if (!flags_.hold_command.empty() && ::pipe2(hold_, O_CLOEXEC) != 0) {
      std::fprintf(stderr, "stash-demo: cannot create the hold pipe: %s\n", std::strerror(errno));
      return 1;
    }
    int started = 0;
    for (; started < flags_.ranks; ++started) {
      if (!Start(started)) break;
    }
    if (hold_[0] >= 0) ::close(hold_[0]);
    hold_[0] = -1;
    Collect(started);
    Release();
    for (int r = 0; r < started; ++r) Reap(children_[static_cast<size_t>(r)]);
    return Verdict(started);
  }

 private:
  bool Start(int rank) {
    int fds[2];
    if (::pipe(fds) != 0) {
      AddError(rank, std::string("cannot create a pipe: ") + std::strerror(errno));
      return false;
    }
    const pid_t pid = ::fork();
    if (pid < 0) {
      AddError(rank, std::string("cannot fork: ") + std::strerror(errno));
      ::close(fds[0]);
      ::close(fds[1]);
      return false;
    }
    if (pid == 0) {
      // The rank ends with the launcher: SIGTERM when it dies (also when it was killed), so no
      // rank trains on for nobody. A launcher that died before prctl leaves us with another
      // parent already.
      if (::prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || ::getppid() != launcher_) ::_exit(1);
      // The rank: keep only its own write end. _exit skips the launcher's atexit work.
      for (int r = 0; r < rank; ++r) ::close(children_[static_cast<size_t>(r)].fd);
      ::close(fds[0]);
      if (hold_[1] >= 0) ::close(hold_[1]);
      const int code = RunRank(flags_, rank, fds[1], hold_[0]);
      ::_exit(code);
    }
    ::close(fds[1]);  // so the pipe reads EOF when the rank is gone
    Child& c = children_[static_cast<size_t>(rank)];
    c.pid = pid;
    c.fd = fds[0];
    return true;
  }

  // Reads every rank's lines until all pipes are closed, printing step lines in order.
  void Collect(int started) {
    while (true) {
      std::vector<pollfd> fds;
      std::vector<int> ranks;
      for (int r = 0; r < started; ++r) {
        const Child& c = children_[static_cast<size_t>(r)];
        if (c.fd < 0) continue;
        fds.push_back(pollfd{c.fd, POLLIN, 0});
        ranks.push_back(r);
      }
      if (fds.empty()) break;
      if (::poll(fds.data(), fds.size(), -1) < 0) {
        if (errno == EINTR) continue;
        std::fprintf(stderr, "stash-demo: poll: %s\n", std::strerror(errno));
        break;
      }
      for (size_t i = 0; i < fds.size(); ++i) {
        if (fds[i].revents != 0) Read(ranks[i]);
      }
      PrintReadySteps(started);
      MaybeRunHoldCommand(started);
    }
    finished_ = true;
    PrintReadySteps(started);
  }

  void Read(int rank) {
    Child& c = children_[static_cast<size_t>(rank)];
    char buf[4096];
    const ssize_t n = ::read(c.fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) return;
    if (n <= 0) {
      ::close(c.fd);
      c.fd = -1;
      c.eof = true;
      return;
    }
    c.partial.append(buf, static_cast<size_t>(n));
    size_t newline;
    while ((newline = c.partial.find('\n')) != std::string::npos) {
      const std::string line = c.partial.substr(0, newline);
      c.partial.erase(0, newline + 1);
      Handle(rank, SplitFields(line));
    }
  }

  void Handle(int rank, std::vector<std::string> fields) {
    Child& c = children_[static_cast<size_t>(rank)];
    const std::string kind = fields.front();
    fields.erase(fields.begin());
    if (kind == kOpenLine && fields.size() == 4) {
      if (!header_printed_) PrintHeader(fields);
    } else if (kind == kStepLine && fields.size() == 2) {
      steps_[{std::atoi(fields[0].c_str()), rank}] = fields[1];
    } else if (kind == kErrorLine && fields.size() == 1) {
      c.reported_error = true;
      AddError(rank, fields[0]);
    } else if (kind == kParityLine && fields.size() == 1) {
      c.parity_failed = true;
      parity_lines_.push_back(fields[0]);
    } else if (kind == kHoldLine) {
      c.holding = true;
    } else if (kind == kTotalsLine) {
      if (std::optional<RankTotals> t = DecodeTotals(fields)) {
        c.totals = *t;
        c.has_totals = true;
      }
    }
  }

  void PrintHeader(const std::vector<std::string>& open) {
    header_printed_ = true;
    const int64_t max_tokens = TokenBudget(flags_.tokens, flags_.topk, flags_.capacity_factor);
    std::printf(
        "stash-demo: %s on %s, stashd at %s: pages of %s, pool %s pages per "
        "device, host tier %s pages\n",
        Count(flags_.ranks, "rank").c_str(), Count(flags_.devices, "device").c_str(),
        open[0].c_str(), FormatBytes(std::strtoull(open[1].c_str(), nullptr, 10)).c_str(),
        open[2].c_str(), open[3].c_str());
    std::printf(
        "stash-demo: %s x %s (top-%d), hidden %d (%d-byte rows); %d tokens per "
        "rank, budget max_tokens %lld (capacity factor %g); %s; seed %llu (rank r, step s "
        "draws from seed (%llu, r, s))\n",
        Count(flags_.layers, "layer").c_str(), Count(flags_.experts, "expert").c_str(), flags_.topk,
        flags_.hidden, 4 * flags_.hidden, flags_.tokens, static_cast<long long>(max_tokens),
        flags_.capacity_factor, Count(flags_.steps, "step").c_str(),
        static_cast<unsigned long long>(flags_.seed), static_cast<unsigned long long>(flags_.seed));
    std::fflush(stdout);
  }

  // Prints step lines in (step, rank) order as far as they have arrived. A rank that ended
  // stops holding the order up; once every pipe is closed, whatever is left is printed.
  void PrintReadySteps(int started) {
    while (next_step_ < flags_.steps) {
      auto it = steps_.find({next_step_, next_rank_});
      if (it != steps_.end()) {
        std::printf("%s\n", it->second.c_str());
        steps_.erase(it);
      } else if (!finished_ && next_rank_ < started &&
                 !children_[static_cast<size_t>(next_rank_)].eof) {
        break;  // that rank has not reported this step yet
      }
      if (++next_rank_ == flags_.ranks) {
        next_rank_ = 0;
        ++next_step_;
      }
    }
    std::fflush(stdout);
  }

  // Once every rank holds its last step's stashes (or ended), runs --hold-command, then lets
  // the ranks go on.
  void MaybeRunHoldCommand(int started) {
    if (hold_[1] < 0) return;
    std::string pids;
    for (int r = 0; r < started; ++r) {
      const Child& c = children_[static_cast<size_t>(r)];
      if (!c.holding && !c.eof) return;
      if (c.holding) pids += (pids.empty() ? "" : " ") + std::to_string(c.pid);
    }
    if (!pids.empty()) {
      std::printf("stash-demo: every rank holds step %d's stashes; running --hold-command\n",
                  flags_.steps - 1);
      std::fflush(stdout);
      ::setenv("STASH_DEMO_RANK_PIDS", pids.c_str(), 1);
      const int status = std::system(flags_.hold_command.c_str());
      std::fflush(stdout);
      if (status != 0) {
        hold_error_ = "--hold-command '" + flags_.hold_command + "' failed (wait status " +
                      std::to_string(status) + ")";
      }
    }
    Release();
  }

  // One byte per rank through the hold pipe, then closing it: every holding rank goes on.
  void Release() {
    if (hold_[1] < 0) return;
    const std::string bytes(static_cast<size_t>(flags_.ranks), 'g');
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::write(hold_[1], bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;  // no rank reads any more
      done += static_cast<size_t>(n);
    }
    ::close(hold_[1]);
    hold_[1] = -1;
  }

  void Reap(Child& c) {
    while (::waitpid(c.pid, &c.wait_status, 0) < 0 && errno == EINTR) {
    }
  }

  void AddError(int rank, const std::string& text) {
    for (auto& [message, ranks] : errors_) {
      if (message == text) {
        ranks.push_back(rank);
        return;
      }
    }
    errors_.emplace_back(text, std::vector<int>{rank});
  }

  int Verdict(int started) {
    // A rank's end that its report does not explain.
    for (int r = 0; r < started; ++r) {
      const Child& c = children_[static_cast<size_t>(r)];
      const int st = c.wait_status;
      if (WIFSIGNALED(st)) {
        AddError(r, "killed by signal " + std::to_string(WTERMSIG(st)) + " (" +
                        strsignal(WTERMSIG(st)) + ")");
      } else if (WIFEXITED(st) && WEXITSTATUS(st) != 0 && !c.reported_error && !c.parity_failed) {
        AddError(r,
                 "exited with status " + std::to_string(WEXITSTATUS(st)) + " without saying why");
      } else if (WIFEXITED(st) && WEXITSTATUS(st) == 0 && !c.has_totals) {
        AddError(r, "ended without reporting its totals");
      }
    }

    RankTotals sum;
    int complete = 0;
    int parity_failures = 0;
    for (int r = 0; r < started; ++r) {
      const Child& c = children_[static_cast<size_t>(r)];
      if (c.parity_failed) ++parity_failures;
      if (!c.has_totals) continue;
      ++complete;
      const RankTotals& t = c.totals;
      sum.device += t.device;
      sum.host += t.host;
      sum.overflow += t.overflow;
      sum.spills += t.spills;
      sum.overflows += t.overflows;
      sum.bytes += t.bytes;
      sum.kept_bytes += t.kept_bytes;
      sum.worst_bytes += t.worst_bytes;
      sum.dropped += t.dropped;
      sum.assignments += t.assignments;
    }
    if (complete > 0) {
      const uint64_t stashes = sum.device + sum.host + sum.overflow;
      const uint64_t held = sum.bytes + sum.kept_bytes;
      std::printf(
          "total over %s: %llu stashes: device %llu, host %llu, overflow %llu | "
          "spills=%llu overflows=%llu | dropped %llu of %llu routed pairs | held %s in stashd + "
          "%s kept in ranks vs worst case %s: %s memory saved\n",
          Count(complete, "rank").c_str(), static_cast<unsigned long long>(stashes),
          static_cast<unsigned long long>(sum.device), static_cast<unsigned long long>(sum.host),
          static_cast<unsigned long long>(sum.overflow),
          static_cast<unsigned long long>(sum.spills),
          static_cast<unsigned long long>(sum.overflows),
          static_cast<unsigned long long>(sum.dropped),
          static_cast<unsigned long long>(sum.assignments), FormatBytes(sum.bytes).c_str(),
          FormatBytes(sum.kept_bytes).c_str(), FormatBytes(sum.worst_bytes).c_str(),
          Percent(1.0 - static_cast<double>(held) / static_cast<double>(sum.worst_bytes)).c_str());
    }
    for (const std::string& line : parity_lines_) std::printf("%s\n", line.c_str());
    std::fflush(stdout);

    if (!hold_error_.empty()) errors_.emplace_back(hold_error_, std::vector<int>{});
    // Errors once per distinct message: "no daemon" on every rank is one line.
    for (const auto& [message, ranks] : errors_) {
      std::string who;
      if (!ranks.empty() && (static_cast<int>(ranks.size()) < flags_.ranks || flags_.ranks == 1)) {
        who = ranks.size() == 1 ? "rank " : "ranks ";
        for (size_t i = 0; i < ranks.size(); ++i) {
          who += (i == 0 ? "" : ", ") + std::to_string(ranks[i]);
        }
        who += ": ";
      }
      std::fprintf(stderr, "stash-demo: %s%s\n", who.c_str(), message.c_str());
    }

    const std::string run =
        "(" + Count(flags_.steps, "step") + ", " + Count(flags_.layers, "layer") + ")";
    if (complete == flags_.ranks && parity_failures == 0 && errors_.empty()) {
      std::printf("parity: OK on all %s %s\n", Count(flags_.ranks, "rank").c_str(), run.c_str());
      return 0;
    }
    if (parity_failures > 0) {
      std::printf("parity: FAILED on %d of %s %s\n", parity_failures,
                  Count(flags_.ranks, "rank").c_str(), run.c_str());
    } else if (complete > 0) {
      std::printf("parity: not confirmed: %d of %s failed before finishing %s\n",
                  flags_.ranks - complete, Count(flags_.ranks, "rank").c_str(), run.c_str());
    }
    return 1;
  }

  const DemoFlags flags_;
  const pid_t launcher_ = ::getpid();
  int hold_[2] = {-1, -1};  // the hold pipe (--hold-command): ranks read, the launcher writes
  std::string hold_error_;  // why --hold-command failed; empty = it did not
  std::vector<Child> children_;
  std::map<std::pair<int, int>, std::string> steps_;  // (step, rank) -> line, not printed yet
  std::vector<std::string> parity_lines_;
  std::vector<std::pair<std::string, std::vector<int>>> errors_;  // message -> ranks, in order
  int next_step_ = 0, next_rank_ = 0;
  bool header_printed_ = false;
  bool finished_ = false;
};

}  // namespace

int RunDemo(const DemoFlags& flags) {
  Launcher launcher(flags);
  return launcher.Run();
}

}  // namespace stash::demo
