#include "bench/harness.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include "bench/report.h"
#include "common/bytes.h"
#include "common/macros.h"

namespace stash::bench {

void Progress(const std::string& what) {
  std::fprintf(stderr, "stash-bench: %s\n", what.c_str());
  std::fflush(stderr);
}

std::string SizeName(uint64_t bytes) { return FormatBytes(bytes); }

std::string Gib(double bytes) { return Fixed(bytes / static_cast<double>(1ULL << 30), 2) + " GiB"; }

std::string Tail(const std::string& path, size_t lines) {
  std::ifstream in(path);
  std::vector<std::string> all;
  for (std::string l; std::getline(in, l);) all.push_back(l);
  std::string out;
  for (size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i) {
    out += "\n    " + all[i];
  }
  return out;
}

StatusOr<std::unique_ptr<Daemon>> Daemon::Start(Env& env, const std::vector<std::string>& flags) {
  const std::string name = "stashd-" + std::to_string(++env.daemons);
  const std::string socket = env.dir + "/" + name + ".sock";
  const std::string log = env.dir + "/" + name + ".log";
  std::vector<std::string> argv = {env.options.stashd, "--backend=host", "--socket=" + socket,
                                   "--log-level=warn"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  std::error_code ignored;
  std::filesystem::remove(socket, ignored);  // a stale one (--keep-dir) would look ready
  STASH_ASSIGN_OR_RETURN(auto child, Child::Spawn(argv, log));
  if (!WaitForPath(socket, 15000)) {
    return UnavailableError("stashd did not create " + socket + "; its log:" + Tail(log, 10));
  }
  return std::unique_ptr<Daemon>(new Daemon(std::move(child), socket));
}

Daemon::~Daemon() { child_->Stop(SIGTERM, 10000); }

// User + system CPU seconds `pid` has used so far (/proc/<pid>/stat), or -1.
double CpuSeconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = text.rfind(')');  // the command name may hold spaces
  if (close == std::string::npos) return -1;
  std::istringstream fields(text.substr(close + 2));
  std::string field;
  double utime = 0, stime = 0;
  // After ")": state is field 3; utime and stime are fields 14 and 15.
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i == 14) utime = std::stod(field);
    if (i == 15) stime = std::stod(field);
  }
  return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// The numbers of a "result key=value ..." line.
Fields ToFields(const std::string& line) {
  Fields out;
  for (const auto& [k, v] : ParseFields(line)) out[k] = std::strtod(v.c_str(), nullptr);
  return out;
}

// Reads a worker's lines until its "result" (or "error").
StatusOr<Fields> AwaitResult(Child& worker, const std::string& log) {
  while (true) {
    auto line = worker.ReadLine(kWorkerTimeoutMs);
    if (!line.ok()) {
      return Status(line.status().code(), line.status().message() + "; log:" + Tail(log, 10));
    }
    if (line->rfind("result", 0) == 0) return ToFields(*line);
    if (line->rfind("error", 0) == 0) {
      return InternalError(worker.name() + ": " + line->substr(6) + Tail(log, 5));
    }
  }
}

StatusOr<std::unique_ptr<Child>> SpawnWorker(Env& env, const std::vector<std::string>& flags) {
  std::vector<std::string> argv = {env.options.self, "--role=worker"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  return Child::Spawn(argv, env.dir + "/workers.log");
}

StatusOr<Fields> RunWorker(Env& env, const std::vector<std::string>& flags) {
  STASH_ASSIGN_OR_RETURN(auto worker, SpawnWorker(env, flags));
  STASH_ASSIGN_OR_RETURN(Fields fields, AwaitResult(*worker, env.dir + "/workers.log"));
  worker->Wait(10000);
  return fields;
}

}  // namespace stash::bench
