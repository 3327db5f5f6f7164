// stashctl as a library: main.cc hands it argv, tests call the same entry point with their own
// streams. Commands: stats, sessions, config, health (docs/design.md).
#ifndef STASH_CLIENT_STASHCTL_STASHCTL_H_
#define STASH_CLIENT_STASHCTL_STASHCTL_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "client/stashctl/select.h"
#include "stash/status.h"

namespace stash::stashctl {

// Exit codes: 0 = done (health: SERVING); 1 = no daemon answers, an RPC failed or health is not
// SERVING; 2 = bad usage (unknown command or flag, bad value).
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

enum class Command { kStats, kSessions, kConfig, kHealth, kDrain, kUndrain };

// The effective command line.
struct Options {
  Command command = Command::kStats;
  // The daemon's Unix socket, already resolved (--socket > $STASHD_SOCKET > default); unused when
  // `target` is set.
  std::string socket;
  // HOST:PORT of a daemon's read-only TCP listener (`stashd --listen`); "" = the Unix socket.
  std::string target;
  // Print the reply as JSON (proto field names, every field) instead of a table.
  bool json = false;
  // sessions: also what each session holds by layer, microbatch and name.
  bool detail = false;
  // Refresh period in seconds; 0 = print once.
  double watch_s = 0;
  // With watch_s > 0: frames to print before exiting; 0 = until SIGINT.
  int64_t count = 0;
  // Deadline of each request, in seconds.
  double timeout_s = 2;
  // health: the gRPC health service name asked; "" = the daemon as a whole (NOT_SERVING while
  // it drains: readiness), "stash.v1.StashService" (SERVING while it lives: liveness).
  std::string service;
  // --format=csv: the rows (stats: tiers; sessions: sessions; config: knobs) as CSV with the
  // `query` fields (proto field names; resolved by ParseCommandLine: never empty with csv).
  bool csv = false;
  bool csv_header = true;  // --format=csv,noheader: false
  std::vector<std::string> query;
  // --label, --rank, --pid, --sort: which sessions stats and sessions show, in what order.
  SessionSelection selection;
  // The terminal's width in cells that tables fit into (RunStashctl: $COLUMNS, else the tty's);
  // 0 = no limit (a pipe).
  size_t width = 0;
};

// What ParseCommandLine decided.
struct CommandLine {
  enum class Action { kRun, kHelp, kVersion };
  Action action = Action::kRun;
  Options options;
};

// Parses argv: one command and flags in any order, `--name=value` or `--name value`, dashes or
// underscores in names. INVALID_ARGUMENT with one line that says what to change on a bad command
// line. Reads $STASHD_SOCKET. Leaves the process's abseil flags as they were, so it may be called
// any number of times.
StatusOr<CommandLine> ParseCommandLine(int argc, char** argv);

// The --help text: every command and flag, with examples.
std::string UsageText();

// The width tables fit into: $COLUMNS when it is a number > 0, else the terminal's when
// `out_is_tty` (standard output's), else 0 (no limit).
size_t TerminalWidth(bool out_is_tty);

// Runs one parsed command against the daemon: the reply (or frames, with --watch) on `out`; on
// failure exactly one line on `err`. `out_is_tty` clears the screen between --watch frames.
// With --watch, SIGINT ends the loop (the previous SIGINT handler is restored on return).
// Returns an exit code (kExitOk, kExitFailure).
int Run(const Options& options, std::ostream& out, std::ostream& err, bool out_is_tty);

// ParseCommandLine, then --help / --version (stashctl's and the daemon's, if one answers) / Run.
// Usage errors print one line on `err` and return kExitUsage.
int RunStashctl(int argc, char** argv, std::ostream& out, std::ostream& err,
                bool out_is_tty = false);

}  // namespace stash::stashctl

#endif  // STASH_CLIENT_STASHCTL_STASHCTL_H_
