// stash-bench-request: the daemon-side cost of one stash request and one reload request on the
// CUDA backend, timed on the host through the daemon's own code: CudaExecutor::Stash and
// ::Reload (daemon/cuda/cuda_executor.cc), made by CreateCudaExecutors as stashd makes them. One
// call sets the device, takes a plan slot and page-record space, launches the paging kernels,
// copies the plan back to pinned memory, raises the done counter (a barrier and a 64-bit write in
// one cuStreamBatchMemOp) and adds the host function that hands the continuation to the pool
// worker. The continuation (the plan read, the tier accounting) runs later on the pool worker:
// it is timed too, and the figure per request is the call plus its continuation.
//
// Each of --iters requests (default 200) is a stash of 1 MiB (8 KiB rows, count read from device
// memory, as a client sends it) and its reload; the copy stream drains between requests, so the
// call never waits behind the GPU. The first request is verified: the plan placed the stash on
// the device, the reload equals the source, and both done counters reached their values.
//
// Separate from stash-bench-gpu, which links the CUDA runtime only: this one links the daemon
// (gRPC, protobuf, abseil), as stashd does.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cinttypes>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "bench/gpu/common.h"
#include "common/shm.h"
#include "daemon/config/config.h"
#include "daemon/copy/executor.h"
#include "daemon/cuda/cuda_executor.h"
#include "stash/kernels/paging.h"

namespace stash::bench_gpu {
namespace {

constexpr int kDefaultRequests = 200;
constexpr uint64_t kRowBytes = 8 * kKiB;
constexpr uint64_t kStashBytes = kMiB;
constexpr double kTargetUs = 20.0;
constexpr int kContinuationTimeoutMs = 10'000;

const char kUsage[] =
    "stash-bench-request: the daemon-side cost of one stash and one reload request on the CUDA\n"
    "backend, through the daemon's own CudaExecutor::Stash/Reload: set the device, plan slot,\n"
    "kernel launches, plan copy, done counter, host function, and the continuation the pool\n"
    "worker runs. Host wall clock, median of --iters requests of 1 MiB (default 200).\n"
    "\n"
    "Usage: stash-bench-request request [--iters=N] [--json=FILE] [--help]\n"
    "\n"
    "Exit status: 0 done (a missed target is reported, not a failure); 1 the executor could not\n"
    "be made or a request did not verify; 2 bad flags or no CUDA device.\n";

// The pool worker's queue: continuations the executor's host functions post.
class Worker {
 public:
  void Post(std::function<void()> then) {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(then));
    cv_.notify_one();
  }
  // Waits for the next continuation; empty when none came in time.
  std::function<void()> Next() {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, std::chrono::milliseconds(kContinuationTimeoutMs),
                      [&] { return !queue_.empty(); })) {
      return {};
    }
    std::function<void()> then = std::move(queue_.front());
    queue_.pop_front();
    return then;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
};

// Runs the next continuation on this thread; its wall time in us. Dies when none comes.
double RunNext(Worker& worker, const char* what) {
  std::function<void()> then = worker.Next();
  if (!then) Die(1, std::string("request: the ") + what + " continuation never ran");
  const double t0 = NowSeconds();
  then();
  return (NowSeconds() - t0) * 1e6;
}

int Run(int requests, const std::string& json_path) {
  int devices = 0;
  const cudaError_t status = cudaGetDeviceCount(&devices);
  if (status != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "stash-bench-request: no CUDA device (cudaGetDeviceCount: %s)\n",
                 status != cudaSuccess ? cudaGetErrorString(status) : "0 devices");
    return 2;
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const DeviceInfo device = SelectDevice(0);
  std::printf("stash-bench-request: %s\n", DeviceLine(device).c_str());

  // The executor of GPU 0, as stashd makes it (the check shows the process one GPU).
  daemon::DaemonConfig config;
  config.pool_bytes = 256 * kMiB;
  config.host_tier_bytes = 64 * kMiB * static_cast<uint64_t>(devices);
  std::vector<std::string> uuids;
  auto executors = daemon::CreateCudaExecutors(config, nullptr, &uuids);
  if (!executors.ok()) Die(1, "request: CreateCudaExecutors: " + executors.status().ToString());
  daemon::CopyExecutor& executor = *(*executors)[0];
  Worker worker;
  executor.Attach([&worker](std::function<void()> then) { worker.Post(std::move(then)); });

  // The client's memory: a source, a destination, the row count in device memory, and a page
  // of event counters in host shared memory (as a client registers it).
  void* source = nullptr;
  void* destination = nullptr;
  void* count = nullptr;
  BENCH_CUDA(cudaMalloc(&source, kStashBytes));
  BENCH_CUDA(cudaMalloc(&destination, kStashBytes));
  BENCH_CUDA(cudaMalloc(&count, sizeof(int64_t)));
  const auto rows = static_cast<int64_t>(kStashBytes / kRowBytes);
  BENCH_CUDA(cudaMemcpy(count, &rows, sizeof(rows), cudaMemcpyHostToDevice));
  std::vector<uint8_t> pattern(kStashBytes);
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<uint8_t>(i * 7 + i / 4096);
  BENCH_CUDA(cudaMemcpy(source, pattern.data(), kStashBytes, cudaMemcpyHostToDevice));
  // From pageable memory these copies may land after the calls return, on the legacy stream,
  // which the executor's non-blocking stream does not wait for.
  BENCH_CUDA(cudaDeviceSynchronize());
  auto fd = CreateSealedMemfd("stash-bench-request-events", 4096);
  if (!fd.ok()) Die(1, "request: memfd: " + fd.status().ToString());
  v1::RegisterMemory reg;
  reg.set_kind(v1::MEMORY_KIND_HOST_FD);
  reg.set_bytes(4096);
  auto events = executor.Open(reg, std::move(*fd));
  if (!events.ok()) Die(1, "request: opening the event page: " + events.status().ToString());
  const daemon::MappedMemory* page = events->get();

  std::vector<double> stash_call_us, stash_then_us, reload_call_us, reload_then_us;
  std::vector<double> stash_total_us, reload_total_us;
  std::string verify_error;
  uint64_t value = 0;
  for (int i = -1; i < requests; ++i) {  // i = -1: warm-up (module loading, first launches)
    daemon::StashRecord record;
    record.row_bytes = kRowBytes;
    record.max_rows = static_cast<uint64_t>(rows);
    daemon::StashWork stash;
    stash.source = static_cast<const uint8_t*>(source);
    stash.count.data = static_cast<const uint8_t*>(count);
    stash.done = daemon::DoneSignal{page, 0, ++value};
    stash.record = &record;
    const double t0 = NowSeconds();
    executor.Stash(stash, [] {});
    const double t1 = NowSeconds();
    const double stash_then = RunNext(worker, "stash");
    if (i == 0) {
      // On the legacy stream: it may not have landed when the call returns, and the executor's
      // non-blocking stream does not wait for it before the reload writes the destination.
      BENCH_CUDA(cudaMemset(destination, 0, kStashBytes));
      BENCH_CUDA(cudaDeviceSynchronize());
      if (!record.error.ok())
        verify_error = "the stash failed: " + record.error.ToString();
      else if (record.plan.placement != kernels::Placement::kDevice) {
        verify_error = "the plan placed the stash off the device (placement " +
                       std::to_string(static_cast<int>(record.plan.placement)) + ")";
      }
    }
    daemon::ReloadWork reload;
    reload.destination = static_cast<uint8_t*>(destination);
    reload.done = daemon::DoneSignal{page, 8, value};
    reload.record = &record;
    const double t2 = NowSeconds();
    executor.Reload(reload, [] {});
    const double t3 = NowSeconds();
    const double reload_then = RunNext(worker, "reload");
    if (i == 0 && verify_error.empty()) {
      std::vector<uint8_t> back(kStashBytes);
      BENCH_CUDA(cudaMemcpy(back.data(), destination, kStashBytes, cudaMemcpyDeviceToHost));
      const auto* counters = reinterpret_cast<const volatile uint64_t*>(page->host());
      if (back != pattern) {
        verify_error = "the reloaded bytes differ from the source";
      } else if (counters[0] != value || counters[1] != value) {
        verify_error = "the done counters read " + std::to_string(counters[0]) + " and " +
                       std::to_string(counters[1]) + ", want " + std::to_string(value);
      }
    }
    if (i < 0) continue;
    stash_call_us.push_back((t1 - t0) * 1e6);
    stash_then_us.push_back(stash_then);
    stash_total_us.push_back((t1 - t0) * 1e6 + stash_then);
    reload_call_us.push_back((t3 - t2) * 1e6);
    reload_then_us.push_back(reload_then);
    reload_total_us.push_back((t3 - t2) * 1e6 + reload_then);
  }
  if (!verify_error.empty()) {
    std::fprintf(stderr, "stash-bench-request: VERIFY FAILED: %s\n", verify_error.c_str());
  }
  const double stash_median = Median(stash_total_us);
  const bool met = stash_median <= kTargetUs;
  std::printf(
      "per request, host wall clock, median (p90) over %d requests of %" PRIu64
      " KiB:\n"
      "  stash:  call %.2f us (%.2f) + continuation %.2f us (%.2f) = %.2f us (%.2f); target <= "
      "%.0f us: %s\n"
      "  reload: call %.2f us (%.2f) + continuation %.2f us (%.2f) = %.2f us (%.2f)\n",
      requests, kStashBytes / kKiB, Median(stash_call_us), Percentile(stash_call_us, 0.9),
      Median(stash_then_us), Percentile(stash_then_us, 0.9), stash_median,
      Percentile(stash_total_us, 0.9), kTargetUs, met ? "met" : "MISSED", Median(reload_call_us),
      Percentile(reload_call_us, 0.9), Median(reload_then_us), Percentile(reload_then_us, 0.9),
      Median(reload_total_us), Percentile(reload_total_us, 0.9));
  std::printf("verified: %s\n", verify_error.empty() ? "yes" : "NO");

  const std::string report = json::PrettyObject({
      {"bench", json::Str("request")},
      {"device", DeviceJson(device)},
      {"config", json::Object({{"requests", json::Int(requests)},
                               {"stash_bytes", json::Int(kStashBytes)},
                               {"row_bytes", json::Int(kRowBytes)},
                               {"target_us", json::Num(kTargetUs)}})},
      {"stash_call_us", json::Summary(stash_call_us)},
      {"stash_continuation_us", json::Summary(stash_then_us)},
      {"stash_request_us", json::Summary(stash_total_us)},
      {"reload_call_us", json::Summary(reload_call_us)},
      {"reload_continuation_us", json::Summary(reload_then_us)},
      {"reload_request_us", json::Summary(reload_total_us)},
      {"verify_error", json::Str(verify_error)},
      {"summary",
       json::Object({{"stash_request_us_median", json::Num(stash_median)},
                     {"stash_request_us_p90", json::Num(Percentile(stash_total_us, 0.9))},
                     {"reload_request_us_median", json::Num(Median(reload_total_us))},
                     {"target_met", json::Bool(met)},
                     {"verified", json::Bool(verify_error.empty())}})},
      {"ok", json::Bool(verify_error.empty())},
  });
  WriteJsonFile(json_path, report);
  BENCH_CUDA(cudaFree(source));
  BENCH_CUDA(cudaFree(destination));
  BENCH_CUDA(cudaFree(count));
  return verify_error.empty() ? 0 : 1;
}

}  // namespace
}  // namespace stash::bench_gpu

int main(int argc, char** argv) {
  using stash::bench_gpu::kUsage;
  int requests = stash::bench_gpu::kDefaultRequests;
  std::string json_path;
  std::string command;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    std::string value;
    if (arg.rfind("--", 0) == 0) {
      const size_t eq = arg.find('=');
      if (eq != std::string::npos) {
        value = arg.substr(eq + 1);
        arg = arg.substr(0, eq);
      } else if (i + 1 < argc) {
        value = argv[++i];
      }
      if (arg == "--iters") {
        char* end = nullptr;
        const long v = std::strtol(value.c_str(), &end, 10);
        if (value.empty() || *end != '\0' || v < 1 || v > 100000) {
          std::fprintf(stderr, "stash-bench-request: --iters must be 1 to 100000 (see --help)\n");
          return 2;
        }
        requests = static_cast<int>(v);
      } else if (arg == "--json") {
        if (value.empty()) {
          std::fprintf(stderr, "stash-bench-request: --json needs a file name (see --help)\n");
          return 2;
        }
        json_path = value;
      } else {
        std::fprintf(stderr, "stash-bench-request: unknown flag %s (see --help)\n", arg.c_str());
        return 2;
      }
    } else if (command.empty()) {
      command = arg;
    } else {
      std::fprintf(stderr, "stash-bench-request: one subcommand only, got '%s' (see --help)\n",
                   arg.c_str());
      return 2;
    }
  }
  if (command != "request") {
    std::fprintf(stderr, "stash-bench-request: say `request` (see --help)\n");
    return 2;
  }
  return stash::bench_gpu::Run(requests, json_path);
}
