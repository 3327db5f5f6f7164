// What stash-bench's phases share: the run's directory and options, a stashd child, worker
// children and their "result key=value ..." answers, progress lines on stderr.
#ifndef STASH_BENCH_HARNESS_H_
#define STASH_BENCH_HARNESS_H_

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench/orchestrator.h"
#include "bench/process.h"
#include "stash/status.h"

namespace stash::bench {

using Fields = std::map<std::string, double>;

constexpr uint64_t kMiB = 1ULL << 20;
constexpr uint64_t kKiB = 1ULL << 10;
constexpr int kWorkerTimeoutMs = 120000;

// "stash-bench: <what>" on stderr.
void Progress(const std::string& what);

// "256 KiB", "64 MiB".
std::string SizeName(uint64_t bytes);
// "1.23 GiB".
std::string Gib(double bytes);
// The last `lines` lines of the file at `path`, each on a new indented line.
std::string Tail(const std::string& path, size_t lines);

// Where this run keeps sockets and logs.
struct Env {
  BenchOptions options;
  std::string dir;
  int daemons = 0;
};

// A stashd child (--backend=host) on a socket of its own; SIGTERMed when destroyed.
class Daemon {
 public:
  static StatusOr<std::unique_ptr<Daemon>> Start(Env& env, const std::vector<std::string>& flags);
  ~Daemon();
  const std::string& socket() const { return socket_; }
  pid_t pid() const { return child_->pid(); }

 private:
  Daemon(std::unique_ptr<Child> child, std::string socket)
      : child_(std::move(child)), socket_(std::move(socket)) {}
  std::unique_ptr<Child> child_;
  std::string socket_;
};

// User + system CPU seconds `pid` has used so far (/proc/<pid>/stat), or -1.
double CpuSeconds(pid_t pid);

// The numbers of a "result key=value ..." line.
Fields ToFields(const std::string& line);

// Reads a worker's lines until its "result" (or "error").
StatusOr<Fields> AwaitResult(Child& worker, const std::string& log);

// This binary as --role=worker with `flags`; its stderr goes to <dir>/workers.log.
StatusOr<std::unique_ptr<Child>> SpawnWorker(Env& env, const std::vector<std::string>& flags);

// Spawns a worker and returns its result.
StatusOr<Fields> RunWorker(Env& env, const std::vector<std::string>& flags);

}  // namespace stash::bench

#endif  // STASH_BENCH_HARNESS_H_
