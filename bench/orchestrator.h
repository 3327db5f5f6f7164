// stash-bench's orchestrating process: starts real daemons (stashd from the build tree), the
// ping server and client worker processes (this binary, exec'd with --role=...), runs the
// in-process Google Benchmark program, and prints one table.
//
// This process never creates a gRPC channel: it forks and execs children, and every gRPC client
// lives in a child.
#ifndef STASH_BENCH_ORCHESTRATOR_H_
#define STASH_BENCH_ORCHESTRATOR_H_

#include <set>
#include <string>
#include <vector>

namespace stash::bench {

struct BenchOptions {
  std::string self;          // this executable
  std::string stashd;        // the daemon binary
  std::string paging_bench;  // stash-bench-paging (Google Benchmark)
  bool quick = false;        // fewer repetitions: a smoke run, not figures to quote
  // Phases to run: copy, latency, saturate, ring, memory, idle, clients, sharing; empty = all.
  std::set<std::string> phases;
  // The client modes the copy, latency and clients phases measure, in this order:
  // "daemon-copy" and/or "mapped" (docs/benchmarks.md).
  std::vector<std::string> modes = {"daemon-copy", "mapped"};
  std::string markdown_out;  // also write the table here; empty = stdout only
  std::string keep_dir;      // keep logs and sockets here instead of a removed temp dir
};

// Returns the process exit code: 0 when every phase ran (targets may be missed), 1 otherwise.
int RunOrchestrator(const BenchOptions& options);

}  // namespace stash::bench

#endif  // STASH_BENCH_ORCHESTRATOR_H_
