#include "bench/orchestrator.h"

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <sstream>
#include <vector>

#include "bench/gbench_json.h"
#include "bench/process.h"
#include "bench/report.h"
#include "bench/routing_model.h"
#include "bench/samples.h"
#include "common/bytes.h"
#include "common/macros.h"
#include "stash/kernels/paging.h"

namespace stash::bench {
namespace {

using Fields = std::map<std::string, double>;

constexpr uint64_t kMiB = 1ULL << 20;
constexpr uint64_t kKiB = 1ULL << 10;
constexpr int kWorkerTimeoutMs = 120000;

void Progress(const std::string& what) {
  std::fprintf(stderr, "stash-bench: %s\n", what.c_str());
  std::fflush(stderr);
}

// "256 KiB", "64 MiB".
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

// Where this run keeps sockets and logs.
struct Env {
  BenchOptions options;
  std::string dir;
  int daemons = 0;
};

// A stashd child on a socket of its own; SIGTERMed when destroyed.
class Daemon {
 public:
  static StatusOr<std::unique_ptr<Daemon>> Start(Env& env, const std::vector<std::string>& flags) {
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
  ~Daemon() { child_->Stop(SIGTERM, 10000); }
  const std::string& socket() const { return socket_; }
  pid_t pid() const { return child_->pid(); }

 private:
  Daemon(std::unique_ptr<Child> child, std::string socket)
      : child_(std::move(child)), socket_(std::move(socket)) {}
  std::unique_ptr<Child> child_;
  std::string socket_;
};

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

// The ping server child (this binary, --role=ping-server).
StatusOr<std::unique_ptr<Child>> StartPingServer(Env& env, const std::string& socket) {
  std::error_code ignored;
  std::filesystem::remove(socket, ignored);
  STASH_ASSIGN_OR_RETURN(
      auto child, Child::Spawn({env.options.self, "--role=ping-server", "--socket=" + socket},
                               env.dir + "/ping.log"));
  STASH_ASSIGN_OR_RETURN(const std::string line, child->ReadLine(15000));
  if (line != "ready") return InternalError("ping server said '" + line + "'");
  return child;
}

// ---- 1. stash / reload throughput against memcpy --------------------------------------------

Status PhaseCopy(Env& env, std::vector<Row>& rows) {
  const std::vector<uint64_t> sizes = {1 * kMiB, 16 * kMiB, 64 * kMiB, 256 * kMiB};
  const std::vector<int> reps =
      env.options.quick ? std::vector<int>{5, 4, 3, 2} : std::vector<int>{40, 15, 9, 7};
  for (int threads : {2, 1}) {
    for (size_t i = 0; i < sizes.size(); ++i) {
      const uint64_t bytes = sizes[i];
      Progress("copy " + SizeName(bytes) + ", copy-threads=" + std::to_string(threads));
      // The pool holds exactly two buffers: the warm-up touches every page once.
      STASH_ASSIGN_OR_RETURN(
          auto daemon,
          Daemon::Start(env, {"--pool-bytes=" + std::to_string(2 * bytes), "--host-tier-bytes=0",
                              "--copy-threads=" + std::to_string(threads)}));
      STASH_ASSIGN_OR_RETURN(Fields f,
                             RunWorker(env, {"--task=copy", "--socket=" + daemon->socket(),
                                             "--bytes=" + std::to_string(bytes),
                                             "--reps=" + std::to_string(reps[i])}));
      const std::string tag = SizeName(bytes) + ", copy-threads=" + std::to_string(threads) +
                              (threads == 2 ? " (default)" : "");
      const double base = f["memcpy_median_gbps"];
      const std::string baseline =
          "memcpy " + Fixed(base, 2) + " GB/s (best " + Fixed(f["memcpy_best_gbps"], 2) + ")";
      const bool targeted = bytes >= 64 * kMiB;
      const double stash_ratio = f["stash_median_gbps"] / base;
      rows.push_back(
          {"1", "stash " + tag + ": Stash+Wait, median of " + std::to_string(reps[i]),
           Fixed(f["stash_median_gbps"], 2) + " GB/s (best " + Fixed(f["stash_best_gbps"], 2) + ")",
           baseline, Ratio(stash_ratio), targeted ? ">= 0.80x" : "",
           targeted ? AtLeast(stash_ratio, 0.8) : Verdict::kNoTarget});
      rows.push_back({"1", "reload " + tag + ": Reload+Wait, median",
                      Fixed(f["reload_median_gbps"], 2) + " GB/s (best " +
                          Fixed(f["reload_best_gbps"], 2) + ")",
                      baseline, Ratio(f["reload_median_gbps"] / base), "", Verdict::kNoTarget});
      rows.push_back({"1", "  daemon copy only (GetStats stash_copy_gbps / reload_copy_gbps)",
                      Fixed(f["getstats_stash_copy_gbps"], 2) + " / " +
                          Fixed(f["getstats_reload_copy_gbps"], 2) + " GB/s",
                      baseline, Ratio(f["getstats_stash_copy_gbps"] / base), "",
                      Verdict::kNoTarget});
      if (bytes == 256 * kMiB) {
        rows.push_back({"1", "  first stash into a cold pool, " + tag,
                        Fixed(f["cold_stash_gbps"], 2) + " GB/s", baseline,
                        Ratio(f["cold_stash_gbps"] / base), "", Verdict::kNoTarget});
      }
    }
  }
  return Status::Ok();
}

// ---- 2. submit cost and 4 KiB latency against a raw gRPC ping -------------------------------

Status PhaseLatency(Env& env, std::vector<Row>& rows) {
  Progress("latency: 4 KiB stash round trips against gRPC pings");
  STASH_ASSIGN_OR_RETURN(auto daemon, Daemon::Start(env, {"--pool-bytes=64MiB"}));
  const std::string ping_socket = env.dir + "/ping-latency.sock";
  STASH_ASSIGN_OR_RETURN(auto ping, StartPingServer(env, ping_socket));
  const int iters = env.options.quick ? 400 : 4000;
  STASH_ASSIGN_OR_RETURN(Fields f, RunWorker(env, {"--task=latency", "--socket=" + daemon->socket(),
                                                   "--ping-socket=" + ping_socket,
                                                   "--iters=" + std::to_string(iters)}));
  ping->CloseStdin();
  ping->Stop(SIGTERM, 5000);
  const double ping_med = f["ping_median_us"];
  const double ping_p99 = f["ping_p99_us"];
  const std::string ping_base = "unary ping " + Fixed(ping_med, 1) + " us";
  const std::string n = std::to_string(static_cast<int>(f["samples"]));
  auto us = [](double v) { return Fixed(v, 1) + " us"; };
  rows.push_back({"2", "Stash() call return (caller's thread), 4 KiB, median of " + n,
                  us(f["submit_median_us"]), ping_base, Ratio(f["submit_median_us"] / ping_med),
                  "<= 5 us", AtMost(f["submit_median_us"], 5.0)});
  rows.push_back(
      {"2", "  Stash() call return, p99", us(f["submit_p99_us"]), "", "", "", Verdict::kNoTarget});
  rows.push_back({"2", "  Stash() call return inside bursts of 8 (a layer's buffers), median / p99",
                  us(f["burst_submit_median_us"]) + " / " + us(f["burst_submit_p99_us"]), "", "",
                  "", Verdict::kNoTarget});
  rows.push_back({"2", "  Reload() call return, median", us(f["reload_submit_median_us"]), "", "",
                  "", Verdict::kNoTarget});
  const double ratio = f["stash_median_us"] / ping_med;
  rows.push_back({"2", "4 KiB Stash+Wait round trip, median", us(f["stash_median_us"]), ping_base,
                  Ratio(ratio), "<= 1.50x", AtMost(ratio, 1.5)});
  rows.push_back({"2", "  4 KiB Stash+Wait round trip, p10 (the quiet path)", us(f["stash_p10_us"]),
                  "unary ping p10 " + us(f["ping_p10_us"]),
                  Ratio(f["stash_p10_us"] / f["ping_p10_us"]), "", Verdict::kNoTarget});
  rows.push_back({"2", "4 KiB Stash+Wait round trip, p99", us(f["stash_p99_us"]),
                  "unary ping p99 " + us(ping_p99), Ratio(f["stash_p99_us"] / ping_p99), "",
                  Verdict::kNoTarget});
  rows.push_back({"2", "4 KiB Reload+Wait round trip, median / p99",
                  us(f["reload_median_us"]) + " / " + us(f["reload_p99_us"]), ping_base,
                  Ratio(f["reload_median_us"] / ping_med), "", Verdict::kNoTarget});
  rows.push_back({"2", "  daemon-side stash time (StashDone.latency_us), median",
                  us(f["daemon_stash_median_us"]), ping_base,
                  Ratio(f["daemon_stash_median_us"] / ping_med), "", Verdict::kNoTarget});
  rows.push_back({"2", "  streaming ping-pong (Session's transport floor), median / p99",
                  us(f["stream_median_us"]) + " / " + us(f["stream_p99_us"]), ping_base,
                  Ratio(f["stream_median_us"] / ping_med), "", Verdict::kNoTarget});
  rows.push_back({"2", "  stash.v1 GetStats unary against stashd, median / p99",
                  us(f["getstats_median_us"]) + " / " + us(f["getstats_p99_us"]), ping_base,
                  Ratio(f["getstats_median_us"] / ping_med), "", Verdict::kNoTarget});
  return Status::Ok();
}

// ---- 3. requests per second at saturation ---------------------------------------------------

struct Saturation {
  double rps = 0;         // requests answered per second, summed over the processes
  double cpu_us_per = 0;  // the server's CPU time per request it answered
};

// Runs `procs` saturate workers against `socket` (served by `server`) at once.
StatusOr<Saturation> Saturate(Env& env, const std::string& mode, const std::string& socket,
                              pid_t server, int procs, int window, double seconds) {
  const double cpu_before = CpuSeconds(server);
  std::vector<std::unique_ptr<Child>> workers;
  for (int i = 0; i < procs; ++i) {
    STASH_ASSIGN_OR_RETURN(
        auto w, SpawnWorker(env, {"--task=saturate", "--mode=" + mode, "--socket=" + socket,
                                  "--window=" + std::to_string(window)}));
    workers.push_back(std::move(w));
  }
  const std::string log = env.dir + "/workers.log";
  for (auto& w : workers) {
    STASH_ASSIGN_OR_RETURN(const std::string line, w->ReadLine(kWorkerTimeoutMs));
    if (line != "ready") return InternalError(w->name() + " said '" + line + "'" + Tail(log, 5));
  }
  for (auto& w : workers) {
    STASH_RETURN_IF_ERROR(w->WriteLine("go " + std::to_string(static_cast<int>(seconds * 1000))));
  }
  Saturation out;
  double issued = 0;
  for (auto& w : workers) {
    STASH_ASSIGN_OR_RETURN(Fields f, AwaitResult(*w, log));
    out.rps += f["ops"] / f["seconds"];
    issued += f["issued"];
  }
  for (auto& w : workers) w->Wait(10000);
  out.cpu_us_per = (CpuSeconds(server) - cpu_before) * 1e6 / issued;
  return out;
}

Status PhaseSaturate(Env& env, std::vector<Row>& rows) {
  constexpr int kWindow = 32;
  const double seconds = env.options.quick ? 0.5 : 2.0;
  STASH_ASSIGN_OR_RETURN(auto daemon, Daemon::Start(env, {"--pool-bytes=256MiB"}));
  const std::string ping_socket = env.dir + "/ping-saturate.sock";
  STASH_ASSIGN_OR_RETURN(auto ping, StartPingServer(env, ping_socket));
  for (int procs : {1, 2, 4, 8}) {
    Progress("saturate: " + std::to_string(procs) + " client processes x " +
             std::to_string(kWindow) + " in flight");
    STASH_ASSIGN_OR_RETURN(
        const Saturation stash,
        Saturate(env, "stash", daemon->socket(), daemon->pid(), procs, kWindow, seconds));
    STASH_ASSIGN_OR_RETURN(const Saturation pings, Saturate(env, "ping", ping_socket, ping->pid(),
                                                            procs, kWindow, seconds));
    const std::string who = std::to_string(procs) + " client process" + (procs > 1 ? "es" : "") +
                            " x " + std::to_string(kWindow) + " in flight";
    rows.push_back({"3", "requests/s, " + who + " (4 KiB stash, then its reload)",
                    Fixed(stash.rps / 1000, 1) + " k/s",
                    "unary ping " + Fixed(pings.rps / 1000, 1) + " k/s, same procs x window",
                    Ratio(stash.rps / pings.rps), "", Verdict::kNoTarget});
    rows.push_back({"3", "  server CPU per request (stashd / ping server), " + who,
                    Fixed(stash.cpu_us_per, 1) + " us",
                    "ping server " + Fixed(pings.cpu_us_per, 1) + " us",
                    Ratio(stash.cpu_us_per / pings.cpu_us_per), "", Verdict::kNoTarget});
  }
  ping->CloseStdin();
  ping->Stop(SIGTERM, 5000);
  return Status::Ok();
}

// ---- 4. page ring operations (Google Benchmark, in process) ---------------------------------

Status PhaseRing(Env& env, std::vector<Row>& rows) {
  Progress("ring and copy kernels: " + env.options.paging_bench);
  const std::string out = env.dir + "/paging.json";
  const std::string min_time = env.options.quick ? "0.05" : "0.2";
  STASH_ASSIGN_OR_RETURN(
      auto child,
      Child::Spawn({env.options.paging_bench, "--benchmark_out=" + out,
                    "--benchmark_out_format=json", "--benchmark_min_time=" + min_time,
                    "--benchmark_repetitions=" + std::string(env.options.quick ? "1" : "3"),
                    "--benchmark_report_aggregates_only=true",
                    // Repetitions of all benchmarks interleave, so machine noise hits each alike.
                    "--benchmark_enable_random_interleaving=true"},
                   env.dir + "/paging.log"));
  // Its console table comes through the stdout pipe: drain it so the child never blocks.
  while (child->ReadLine(600000).ok()) {
  }
  const int status = child->Wait(10000);
  if (status != 0)
    return InternalError("stash-bench-paging failed" + Tail(env.dir + "/paging.log", 10));
  std::ifstream in(out);
  std::stringstream text;
  text << in.rdbuf();
  STASH_ASSIGN_OR_RETURN(GbenchResults results, ParseGbenchJson(text.str()));
  const std::string agg = env.options.quick ? "" : "_median";
  auto get = [&](const std::string& name, const std::string& field) -> StatusOr<double> {
    auto it = results.find(name + agg);
    if (it == results.end()) it = results.find(name + "/real_time" + agg);
    if (it == results.end()) return NotFoundError("no benchmark " + name + agg + " in " + out);
    auto f = it->second.numbers.find(field);
    if (f == it->second.numbers.end()) return NotFoundError("no " + field + " in " + name);
    return f->second;
  };
  auto mops = [](double v) { return Fixed(v / 1e6, 1) + " M/s"; };
  for (const std::string bench : {"BM_RingAllocFree", "BM_TierAllocFree"}) {
    STASH_ASSIGN_OR_RETURN(const double small, get(bench + "/1024", "items_per_second"));
    STASH_ASSIGN_OR_RETURN(const double large, get(bench + "/1048576", "items_per_second"));
    const double spread = std::max(small, large) / std::min(small, large);
    const bool ring = bench == "BM_RingAllocFree";
    rows.push_back({"4",
                    std::string(ring ? "page alloc+free (PlanStash, RingPageAt / ReturnPages, "
                                       "head/tail publish), 1M pages"
                                     : "  the daemon's Tier (mutex, PublishAlloc/Free), 1M pages"),
                    mops(large), "1k pages " + mops(small), Ratio(spread),
                    ring ? "within 1.20x" : "", ring ? AtMost(spread, 1.2) : Verdict::kNoTarget});
  }
  STASH_ASSIGN_OR_RETURN(const double memcpy_bps, get("BM_Memcpy/64", "bytes_per_second"));
  for (const uint64_t page : {64 * kKiB, 256 * kKiB, 1024 * kKiB}) {
    const std::string arg = "/64/" + std::to_string(page / kKiB);
    STASH_ASSIGN_OR_RETURN(const double stash_bps, get("BM_StashPages" + arg, "bytes_per_second"));
    STASH_ASSIGN_OR_RETURN(const double pop_bps, get("BM_PopPages" + arg, "bytes_per_second"));
    rows.push_back(
        {"4",
         "  in-process StashPages / PopPages, 64 MiB, page " + SizeName(page) + ", permuted ring",
         Fixed(stash_bps / 1e9, 2) + " / " + Fixed(pop_bps / 1e9, 2) + " GB/s",
         "memcpy " + Fixed(memcpy_bps / 1e9, 2) + " GB/s",
         Ratio(stash_bps / memcpy_bps) + " / " + Ratio(pop_bps / memcpy_bps), "",
         Verdict::kNoTarget});
  }
  STASH_ASSIGN_OR_RETURN(const double handoff_us, get("BM_ThreadHandoff", "real_time"));
  rows.push_back({"2",
                  "  one thread hop: condition-variable wake-up, in process (half a round trip)",
                  Fixed(handoff_us / 2, 1) + " us", "", "", "", Verdict::kNoTarget});
  STASH_ASSIGN_OR_RETURN(const double ticket_us, get("BM_TicketId", "real_time"));
  rows.push_back({"2", "  a ticket id (RandomNonZeroU64, one getrandom syscall), in process",
                  Fixed(ticket_us, 2) + " us", "", "", "", Verdict::kNoTarget});
  STASH_ASSIGN_OR_RETURN(const double touch_faults,
                         get("BM_PoolFirstTouch/64/0", "bytes_per_second"));
  STASH_ASSIGN_OR_RETURN(const double touch_populate,
                         get("BM_PoolFirstTouch/64/1", "bytes_per_second"));
  rows.push_back({"1",
                  "  first write into a fresh 64 MiB pool region (memfd): page faults / "
                  "MAP_POPULATE (in process)",
                  Fixed(touch_faults / 1e9, 2) + " / " + Fixed(touch_populate / 1e9, 2) + " GB/s",
                  "memcpy " + Fixed(memcpy_bps / 1e9, 2) + " GB/s",
                  Ratio(touch_faults / memcpy_bps) + " / " + Ratio(touch_populate / memcpy_bps), "",
                  Verdict::kNoTarget});
  STASH_ASSIGN_OR_RETURN(const double map_faults,
                         get("BM_MapClientBuffer/64/0", "bytes_per_second"));
  STASH_ASSIGN_OR_RETURN(const double map_populate,
                         get("BM_MapClientBuffer/64/1", "bytes_per_second"));
  rows.push_back({"1",
                  "  first copy out of a newly mapped 64 MiB client buffer: faults / "
                  "MAP_POPULATE (in process)",
                  Fixed(map_faults / 1e9, 2) + " / " + Fixed(map_populate / 1e9, 2) + " GB/s",
                  "memcpy " + Fixed(memcpy_bps / 1e9, 2) + " GB/s",
                  Ratio(map_faults / memcpy_bps) + " / " + Ratio(map_populate / memcpy_bps), "",
                  Verdict::kNoTarget});
  return Status::Ok();
}

// ---- 5. memory saved by paging --------------------------------------------------------------

Status PhaseMemory(Env& env, std::vector<Row>& rows) {
  RoutingConfig config;
  if (env.options.quick) config.steps = 1;
  Progress("memory: routing " + std::to_string(config.steps) + " steps x " +
           std::to_string(config.layers) + " layers");
  const Routing routing = SimulateRouting(config);
  const std::vector<uint64_t> pages = {64 * kKiB, 256 * kKiB, 1024 * kKiB};
  const uint64_t budget = config.BudgetTokens();
  for (const std::string recipe : {"bf16", "mxfp8"}) {
    const auto buffers = RecipeBuffers(recipe, config.hidden);
    for (const uint64_t page : pages) {
      const PagingResult r = ModelPaging(config, routing, buffers, page);
      const auto peak = static_cast<double>(r.peak_pages_hottest * page);
      const double frag = peak - static_cast<double>(r.payload_bytes_hottest);
      const auto stat = static_cast<double>(r.static_bytes);
      rows.push_back({"5",
                      std::string(recipe == "bf16" ? "BF16" : "MXFP8 data + scale_inv") +
                          ", page " + SizeName(page) + ": peak paged, hottest rank (frag)",
                      Gib(peak) + " (" + Fixed(frag / kMiB, 1) + " MiB = " +
                          Fixed(100 * frag / static_cast<double>(r.payload_bytes_hottest), 2) +
                          "%)",
                      "static " + Gib(stat), Ratio(peak / stat), "", Verdict::kNoTarget});
      if (page == 256 * kKiB) {
        const double mean = r.peak_pages_mean * static_cast<double>(page);
        rows.push_back({"5",
                        "  same, mean rank (load " + Fixed(r.mean_tokens_over_budget, 2) +
                            " of budget, max " + Fixed(r.max_tokens_over_budget, 2) + ")",
                        Gib(mean), "static " + Gib(stat), Ratio(mean / stat), "",
                        Verdict::kNoTarget});
      }
    }
  }

  // The real daemon on the hottest rank's tokens of step 0 (full-size stashes, fewer layers so
  // the pools stay a few GiB): its high water mark must equal the model's page count.
  const uint32_t layers = env.options.quick ? 1 : 2;
  uint32_t hot = 0;
  uint64_t hot_sum = 0;
  for (uint32_t rank = 0; rank < config.ep_ranks; ++rank) {
    uint64_t sum = 0;
    for (uint32_t l = 0; l < layers; ++l) sum += routing[0][l][rank];
    if (sum > hot_sum) {
      hot_sum = sum;
      hot = rank;
    }
  }
  std::string tokens;
  Routing one(1, std::vector<std::vector<uint64_t>>(layers));
  for (uint32_t l = 0; l < layers; ++l) {
    tokens += (l ? "," : "") + std::to_string(routing[0][l][hot]);
    one[0][l] = routing[0][l];
  }
  for (const uint64_t page : pages) {
    Progress("memory: stashd with page " + SizeName(page) + ", " + std::to_string(layers) +
             " layers of rank " + std::to_string(hot));
    const uint64_t pool = (layers * budget * 2 * config.hidden + page - 1) / page * page;
    STASH_ASSIGN_OR_RETURN(
        auto daemon,
        Daemon::Start(env, {"--devices=2", "--pool-bytes=" + std::to_string(pool),
                            "--page-bytes=" + std::to_string(page), "--host-tier-bytes=0"}));
    STASH_ASSIGN_OR_RETURN(
        Fields f,
        RunWorker(env, {"--task=memory", "--socket=" + daemon->socket(),
                        "--budget=" + std::to_string(budget),
                        "--hidden=" + std::to_string(config.hidden), "--tokens=" + tokens}));
    for (const std::string recipe : {"bf16", "mxfp8"}) {
      uint64_t model_pages = 0;
      for (uint32_t l = 0; l < layers; ++l) {
        for (const BufferShape& b : RecipeBuffers(recipe, config.hidden)) {
          model_pages += kernels::PagesFor(one[0][l][hot] / b.divisor * b.row_bytes, page);
        }
      }
      const double hw = f[recipe + "_high_water_pages"];
      rows.push_back({"5",
                      "  stashd pages_high_water, " + recipe + ", page " + SizeName(page) + ", " +
                          std::to_string(layers) + " layers fwd+bwd through the daemon",
                      Fixed(hw, 0) + " pages", "model " + std::to_string(model_pages) + " pages",
                      Ratio(hw / static_cast<double>(model_pages)), "= 1.00x",
                      hw == static_cast<double>(model_pages) ? Verdict::kMet : Verdict::kMissed});
    }
  }
  return Status::Ok();
}

// ---- 6. idle cost: requests waiting on ready events nobody signals ----------------------------

// 32 sessions each hold 4095 stashes whose ready event is never signalled (the per-session
// in-flight limit is 4096). The daemon's CPU over a quiet window, from /proc/<pid>/stat, and a
// well-behaved client's 4 KiB round trip with and without that load, in the same run.
Status PhaseIdle(Env& env, std::vector<Row>& rows) {
  constexpr int kSessions = 32;
  constexpr int kHeld = 4095;
  const int iters = env.options.quick ? 300 : 3000;
  const double window_s = env.options.quick ? 1.0 : 5.0;
  STASH_ASSIGN_OR_RETURN(auto daemon, Daemon::Start(env, {"--pool-bytes=64MiB"}));
  Progress("idle: 4 KiB round trips without load");
  STASH_ASSIGN_OR_RETURN(Fields quiet,
                         RunWorker(env, {"--task=roundtrip", "--socket=" + daemon->socket(),
                                         "--iters=" + std::to_string(iters)}));
  Progress("idle: " + std::to_string(kSessions) + " sessions x " + std::to_string(kHeld) +
           " requests waiting on ready events nobody signals");
  std::vector<std::unique_ptr<Child>> held;
  for (int i = 0; i < kSessions; ++i) {
    STASH_ASSIGN_OR_RETURN(auto w,
                           SpawnWorker(env, {"--task=blocked", "--socket=" + daemon->socket(),
                                             "--requests=" + std::to_string(kHeld)}));
    held.push_back(std::move(w));
  }
  const std::string log = env.dir + "/workers.log";
  for (auto& w : held) {
    STASH_ASSIGN_OR_RETURN(const std::string line, w->ReadLine(kWorkerTimeoutMs));
    if (line != "ready") return InternalError(w->name() + " said '" + line + "'" + Tail(log, 5));
  }
  const auto t0 = Clock::now();
  const double cpu0 = CpuSeconds(daemon->pid());
  usleep(static_cast<useconds_t>(window_s * 1e6));
  const double cpu = (CpuSeconds(daemon->pid()) - cpu0) / SecondsBetween(t0, Clock::now());
  Progress("idle: 4 KiB round trips with that load");
  STASH_ASSIGN_OR_RETURN(Fields loaded,
                         RunWorker(env, {"--task=roundtrip", "--socket=" + daemon->socket(),
                                         "--iters=" + std::to_string(iters)}));
  for (auto& w : held) {
    w->CloseStdin();
    w->Stop(SIGTERM, 5000);
  }
  held.clear();
  // The baseline brackets the loaded run in time (before and after), so a shared machine's
  // drifting load does not read as the daemon's.
  Progress("idle: 4 KiB round trips after the load is gone");
  STASH_ASSIGN_OR_RETURN(Fields after,
                         RunWorker(env, {"--task=roundtrip", "--socket=" + daemon->socket(),
                                         "--iters=" + std::to_string(iters)}));
  const double quiet_median = (quiet["stash_median_us"] + after["stash_median_us"]) / 2;
  const double quiet_p99 = (quiet["stash_p99_us"] + after["stash_p99_us"]) / 2;
  const std::string who = std::to_string(kSessions) + " sessions x " + std::to_string(kHeld) +
                          " requests waiting on unsignalled ready events";
  rows.push_back({"6",
                  "daemon CPU, " + who + " (/proc utime+stime over " + Fixed(window_s, 0) + " s)",
                  Fixed(100 * cpu, 1) + " % of a core", "", "", "<= 5 %", AtMost(100 * cpu, 5.0)});
  const double ratio = loaded["stash_median_us"] / quiet_median;
  auto us = [](double v) { return Fixed(v, 1) + " us"; };
  rows.push_back({"6", "4 KiB Stash+Wait round trip of another session with that load, median",
                  us(loaded["stash_median_us"]),
                  "without it: " + us(quiet_median) + " (before " + us(quiet["stash_median_us"]) +
                      ", after " + us(after["stash_median_us"]) + ")",
                  Ratio(ratio), "<= 1.20x", AtMost(ratio, 1.2)});
  rows.push_back({"6", "  the same, p99", us(loaded["stash_p99_us"]),
                  "without it: " + us(quiet_p99), Ratio(loaded["stash_p99_us"] / quiet_p99), "",
                  Verdict::kNoTarget});
  return Status::Ok();
}

}  // namespace

int RunOrchestrator(const BenchOptions& options) {
  for (const std::string& binary : {options.stashd, options.paging_bench}) {
    if (access(binary.c_str(), X_OK) != 0) {
      std::fprintf(stderr,
                   "stash-bench: %s is missing: build the stashd and stash-bench-paging targets "
                   "(or pass --stashd= / --paging-bench=)\n",
                   binary.c_str());
      return 1;
    }
  }
  Env env;
  env.options = options;
  if (!options.keep_dir.empty()) {
    std::filesystem::create_directories(options.keep_dir);
    env.dir = options.keep_dir;
  } else {
    char tmpl[] = "/tmp/stash-bench-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      std::perror("mkdtemp");
      return 1;
    }
    env.dir = tmpl;
  }
  const std::vector<std::pair<std::string, std::function<Status(Env&, std::vector<Row>&)>>> phases =
      {{"copy", PhaseCopy}, {"latency", PhaseLatency}, {"saturate", PhaseSaturate},
       {"ring", PhaseRing}, {"memory", PhaseMemory},   {"idle", PhaseIdle}};
  std::vector<Row> rows;
  bool failed = false;
  const auto t0 = Clock::now();
  const double load_start = LoadAverage();
  for (const auto& [name, run] : phases) {
    if (!options.phases.empty() && options.phases.count(name) == 0) continue;
    const Status status = run(env, rows);
    if (!status.ok()) {
      failed = true;
      std::fprintf(stderr, "stash-bench: phase %s failed: %s\n", name.c_str(),
                   status.ToString().c_str());
    }
  }
  const double seconds = SecondsBetween(t0, Clock::now());
  // Rows in the order, whichever phase measured them.
  std::stable_sort(rows.begin(), rows.end(),
                   [](const Row& a, const Row& b) { return a.section < b.section; });

  std::ostringstream report;
  report << "Machine: " << MachineSummary() << "\n";
  report << "Run: " << Fixed(seconds, 0) << " s" << (options.quick ? " (--quick: smoke run)" : "")
         << "; 1-min load average " << Fixed(load_start, 2) << " at start, "
         << Fixed(LoadAverage(), 2) << " at end, on " << sysconf(_SC_NPROCESSORS_ONLN)
         << " cores: other load inflates latencies\n";
  report << "GB/s = 1e9 bytes/s; ratio = value / baseline (ring rows: max/min); medians unless "
            "stated\n\n";
  report << MarkdownTable(rows);
  std::fputs(report.str().c_str(), stdout);
  std::fflush(stdout);
  if (!options.markdown_out.empty()) {
    std::ofstream(options.markdown_out) << report.str();
  }
  if (options.keep_dir.empty() && !failed) {
    std::error_code ec;
    std::filesystem::remove_all(env.dir, ec);
  } else {
    std::fprintf(stderr, "stash-bench: logs are in %s\n", env.dir.c_str());
  }
  return failed ? 1 : 0;
}

}  // namespace stash::bench
