// stash-bench: end-to-end benchmarks of stashd against baselines measured in the same run.
//
//   stash-bench                       every phase; prints one Markdown table
//   stash-bench --quick               a smoke run (few repetitions; not figures to quote)
//   stash-bench --phases=copy,latency
//
// The same binary is exec'd as its own children: --role=worker (a client process) and
// --role=ping-server (the raw gRPC baseline).
#include <cstdio>
#include <map>
#include <sstream>
#include <string>

#include "bench/orchestrator.h"
#include "bench/ping.h"
#include "bench/process.h"
#include "bench/worker.h"

namespace {

constexpr char kUsage[] =
    "Usage: stash-bench [--quick] "
    "[--phases=copy,latency,saturate,ring,memory,idle,clients,sharing,pages]\n"
    "                   [--modes=daemon-copy,mapped] [--stashd=PATH] [--paging-bench=PATH]\n"
    "                   [--markdown-out=FILE] [--keep-dir=DIR]\n"
    "\n"
    "Starts real stashd daemons (default: ../daemon/stashd next to this binary) on temporary\n"
    "Unix sockets and real client processes, runs stash-bench-paging (Google Benchmark) for the\n"
    "in-process figures, and prints one table: each figure, its baseline measured in the same\n"
    "run, the ratio and the target. --modes picks the client modes the copy, latency and\n"
    "clients phases measure (default both). Exit code 1 when a phase could not run.\n";

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> flags;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (arg.rfind("--", 0) != 0) {
      std::fprintf(stderr, "stash-bench: unexpected argument '%s'\n%s", arg.c_str(), kUsage);
      return 2;
    }
    arg = arg.substr(2);
    const size_t eq = arg.find('=');
    if (eq == std::string::npos) {
      flags[arg] = "1";
    } else {
      flags[arg.substr(0, eq)] = arg.substr(eq + 1);
    }
  }
  const std::string role = flags.count("role") ? flags["role"] : "";
  if (role == "worker") return stash::bench::RunWorker(flags);
  if (role == "ping-server") return stash::bench::RunPingServer(flags["socket"]);
  if (!role.empty()) {
    std::fprintf(stderr, "stash-bench: unknown --role=%s\n", role.c_str());
    return 2;
  }

  stash::bench::BenchOptions options;
  options.self = stash::bench::SelfPath();
  const std::string dir = stash::bench::SelfDir();
  options.stashd = flags.count("stashd") ? flags["stashd"] : dir + "/../daemon/stashd";
  options.paging_bench =
      flags.count("paging-bench") ? flags["paging-bench"] : dir + "/stash-bench-paging";
  options.quick = flags.count("quick") != 0;
  options.markdown_out = flags.count("markdown-out") ? flags["markdown-out"] : "";
  options.keep_dir = flags.count("keep-dir") ? flags["keep-dir"] : "";
  if (flags.count("phases")) {
    std::istringstream in(flags["phases"]);
    for (std::string p; std::getline(in, p, ',');) options.phases.insert(p);
  }
  if (flags.count("modes")) {
    options.modes.clear();
    std::istringstream in(flags["modes"]);
    for (std::string m; std::getline(in, m, ',');) {
      if (m != "daemon-copy" && m != "mapped") {
        std::fprintf(stderr, "stash-bench: --modes takes daemon-copy and/or mapped, not '%s'\n",
                     m.c_str());
        return 2;
      }
      options.modes.push_back(m);
    }
  }
  for (const char* known :
       {"quick", "phases", "modes", "stashd", "paging-bench", "markdown-out", "keep-dir"}) {
    flags.erase(known);
  }
  if (!flags.empty()) {
    std::fprintf(stderr, "stash-bench: unknown flag --%s\n%s", flags.begin()->first.c_str(),
                 kUsage);
    return 2;
  }
  return stash::bench::RunOrchestrator(options);
}
