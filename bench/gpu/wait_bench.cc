// stash-bench-gpu wait: how long another trainer stream is held while one trainer stream waits
// on a daemon copy's done counter, with CUDA_DEVICE_MAX_CONNECTIONS=1 (Megatron's setting: every
// stream of the process shares one hardware queue) against the driver's default.
//
// The trainer's side of EnqueueWait is cuStreamWaitValue64 on a counter in mapped host memory,
// raised when the daemon's copy is done. Here this process measures how long an SM copy of
// --copy-mib MiB takes on this GPU (events, median of 10): the wait's length. A child process
// (this binary as `wait-child`, started once with CUDA_DEVICE_MAX_CONNECTIONS=1 and once without
// it, since the variable is read when the context is created) then, --iters times (default 20):
// queues the wait and a small kernel on stream W, queues a small kernel and an event on stream O,
// raises the counter from the host once the wait's length passed, and takes the time from O's
// enqueue until O's event completes. The same without the wait on W is the baseline. Reported:
// held = median(with the wait) - median(baseline), in us, for each setting.
#include <cuda.h>  // types and constants only: the function comes from the runtime's entry points

#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/gpu/bench_kernels.h"
#include "bench/gpu/common.h"

namespace stash::bench_gpu {
namespace {

constexpr int kDefaultTrials = 20;
constexpr int kChildTimeoutMs = 60'000;
constexpr int64_t kSmallIterations = 64;  // the small kernels: one block, a few microseconds
constexpr double kPollLimitS = 5.0;       // a stream held longer than this is reported as such

using WaitValue64 = CUresult (*)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);

// What a child reports: "done held_us=.. baseline_us=.. with_wait_us=.. timeouts=..".
std::map<std::string, double> ParseDone(const std::string& line) {
  std::map<std::string, double> out;
  std::istringstream in(line);
  std::string word;
  while (in >> word) {
    const size_t eq = word.find('=');
    if (eq != std::string::npos) out[word.substr(0, eq)] = std::atof(word.c_str() + eq + 1);
  }
  return out;
}

// Runs one child with CUDA_DEVICE_MAX_CONNECTIONS set to `connections` ("" = unset).
std::map<std::string, double> RunChild(const Options& options, const std::string& connections,
                                       double wait_us, int trials) {
  const char* saved = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  const std::string restore = saved != nullptr ? saved : "";
  if (connections.empty()) {
    unsetenv("CUDA_DEVICE_MAX_CONNECTIONS");
  } else {
    setenv("CUDA_DEVICE_MAX_CONNECTIONS", connections.c_str(), 1);
  }
  Child child({"wait-child", "--device", std::to_string(options.device), "--iters",
               std::to_string(trials)});
  if (saved != nullptr) {
    setenv("CUDA_DEVICE_MAX_CONNECTIONS", restore.c_str(), 1);
  } else {
    unsetenv("CUDA_DEVICE_MAX_CONNECTIONS");
  }
  char go[64];
  std::snprintf(go, sizeof(go), "go %.3f", wait_us);
  std::string line;
  if (!child.ReadLine(&line, kChildTimeoutMs) || line != "ready") {
    Die(1, "wait: the child did not start (see its error above)");
  }
  if (!child.WriteLine(go) || !child.ReadLine(&line, kChildTimeoutMs)) {
    Die(1, "wait: the child did not finish (CUDA_DEVICE_MAX_CONNECTIONS=" +
               (connections.empty() ? std::string("unset") : connections) + ")");
  }
  child.WriteLine("quit");
  if (child.Wait(10'000) != 0) Die(1, "wait: the child failed: " + line);
  return ParseDone(line);
}

}  // namespace

int RunWaitChild(const Options& options) {
  BecomeChild();
  const int trials = options.iters > 0 ? options.iters : kDefaultTrials;
  BENCH_CUDA(cudaSetDevice(options.device));
  void* entry = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  BENCH_CUDA(cudaGetDriverEntryPointByVersion("cuStreamWaitValue64", &entry, 12000,
                                              cudaEnableDefault, &found));
  if (found != cudaDriverEntryPointSuccess || entry == nullptr) {
    Die(1, "wait: this driver has no cuStreamWaitValue64");
  }
  const auto wait_value = reinterpret_cast<WaitValue64>(entry);
  // The counter, in mapped pinned host memory (as a client's event page is).
  uint64_t* counter = nullptr;
  BENCH_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&counter), sizeof(uint64_t),
                           cudaHostAllocMapped | cudaHostAllocPortable));
  *counter = 0;
  void* counter_device = nullptr;
  BENCH_CUDA(cudaHostGetDevicePointer(&counter_device, counter, 0));
  float* out = nullptr;
  BENCH_CUDA(cudaMalloc(reinterpret_cast<void**>(&out), 2 * 256 * sizeof(float)));
  cudaStream_t waiting = nullptr;
  cudaStream_t other = nullptr;
  BENCH_CUDA(cudaStreamCreateWithFlags(&waiting, cudaStreamNonBlocking));
  BENCH_CUDA(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  cudaEvent_t other_done = nullptr;
  BENCH_CUDA(cudaEventCreateWithFlags(&other_done, cudaEventDisableTiming));
  // Warm-up: the kernel loaded (lazy loading) and both streams used once.
  BENCH_CUDA(LaunchBurn(out, 1, kSmallIterations, waiting));
  BENCH_CUDA(LaunchBurn(out + 256, 1, kSmallIterations, other));
  BENCH_CUDA(cudaDeviceSynchronize());
  std::printf("ready\n");
  std::fflush(stdout);

  std::string command;
  int c = 0;
  uint64_t value = 0;
  for (;;) {
    command.clear();
    while ((c = std::getchar()) != EOF && c != '\n') command += static_cast<char>(c);
    if (c == EOF || command.rfind("go ", 0) != 0) break;
    const double wait_s = std::atof(command.c_str() + 3) / 1e6;
    std::vector<double> baseline_us, with_wait_us;
    int timeouts = 0;
    for (int t = 0; t < 2 * trials; ++t) {
      const bool with_wait = t % 2 == 1;  // interleaved, so drift hits both alike
      if (with_wait) {
        ++value;
        const CUresult r = wait_value(reinterpret_cast<CUstream>(waiting),
                                      reinterpret_cast<CUdeviceptr>(counter_device), value,
                                      CU_STREAM_WAIT_VALUE_GEQ);
        if (r != CUDA_SUCCESS) Die(1, "wait: cuStreamWaitValue64 failed: " + std::to_string(r));
        BENCH_CUDA(LaunchBurn(out, 1, kSmallIterations, waiting));
      }
      const double t0 = NowSeconds();
      BENCH_CUDA(LaunchBurn(out + 256, 1, kSmallIterations, other));
      BENCH_CUDA(cudaEventRecord(other_done, other));
      bool raised = !with_wait;
      double done_s = -1;
      for (;;) {
        const double now = NowSeconds();
        // The "daemon": raises the counter once the copy's length passed.
        if (!raised && now - t0 >= wait_s) {
          __atomic_store_n(counter, value, __ATOMIC_RELEASE);
          raised = true;
        }
        const cudaError_t q = cudaEventQuery(other_done);
        if (q == cudaSuccess) {
          done_s = now;
          break;
        }
        if (q != cudaErrorNotReady) BENCH_CUDA(q);
        if (now - t0 > kPollLimitS) break;
      }
      if (!raised) __atomic_store_n(counter, value, __ATOMIC_RELEASE);
      BENCH_CUDA(cudaStreamSynchronize(waiting));
      BENCH_CUDA(cudaStreamSynchronize(other));
      if (done_s < 0) {
        ++timeouts;
        done_s = t0 + kPollLimitS;
      }
      (with_wait ? with_wait_us : baseline_us).push_back((done_s - t0) * 1e6);
    }
    const double base = Median(baseline_us);
    const double waited = Median(with_wait_us);
    std::printf("done held_us=%.3f baseline_us=%.3f with_wait_us=%.3f timeouts=%d\n", waited - base,
                base, waited, timeouts);
    std::fflush(stdout);
  }
  BENCH_CUDA(cudaFree(out));
  BENCH_CUDA(cudaFreeHost(counter));
  return 0;
}

int RunWait(const Options& options) {
  const DeviceInfo device = SelectDevice(options.device);
  const int trials = options.iters > 0 ? options.iters : kDefaultTrials;
  const uint64_t bytes = static_cast<uint64_t>(options.copy_mib) * kMiB;
  std::printf("stash-bench-gpu wait: %s\n", DeviceLine(device).c_str());

  // The wait's length: an SM copy of --copy-mib MiB on this GPU (GPU time, median of 10).
  void* src = nullptr;
  void* dst = nullptr;
  BENCH_CUDA(cudaMalloc(&src, bytes));
  BENCH_CUDA(cudaMalloc(&dst, bytes));
  cudaStream_t stream = nullptr;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t start = nullptr;
  cudaEvent_t end = nullptr;
  BENCH_CUDA(cudaEventCreate(&start));
  BENCH_CUDA(cudaEventCreate(&end));
  BENCH_CUDA(LaunchVectorCopy(dst, src, bytes, device.sm_count, stream));  // warm-up
  std::vector<double> copy_ms;
  for (int i = 0; i < 10; ++i) {
    BENCH_CUDA(cudaEventRecord(start, stream));
    BENCH_CUDA(LaunchVectorCopy(dst, src, bytes, device.sm_count, stream));
    BENCH_CUDA(cudaEventRecord(end, stream));
    BENCH_CUDA(cudaEventSynchronize(end));
    copy_ms.push_back(ElapsedMs(start, end));
  }
  BENCH_CUDA(cudaFree(src));
  BENCH_CUDA(cudaFree(dst));
  const double wait_us = Median(copy_ms) * 1e3;

  const auto one = RunChild(options, "1", wait_us, trials);
  const auto plain = RunChild(options, "", wait_us, trials);
  const auto get = [](const std::map<std::string, double>& m, const char* key) {
    const auto it = m.find(key);
    return it == m.end() ? std::nan("") : it->second;
  };
  std::printf(
      "stream W waits (cuStreamWaitValue64) for a counter the host raises %.1f us later (an SM "
      "copy of %" PRId64 " MiB here); stream O runs a small kernel meanwhile; median of %d\n\n",
      wait_us, options.copy_mib, trials);
  std::printf("%-36s | %14s | %14s | %11s\n", "CUDA_DEVICE_MAX_CONNECTIONS", "O alone us",
              "O + W's wait us", "O held us");
  std::printf(
      "-------------------------------------+----------------+----------------+-----------"
      "--\n");
  std::printf("%-36s | %14.1f | %14.1f | %11.1f\n", "1", get(one, "baseline_us"),
              get(one, "with_wait_us"), get(one, "held_us"));
  std::printf("%-36s | %14.1f | %14.1f | %11.1f\n", "unset (the driver's default)",
              get(plain, "baseline_us"), get(plain, "with_wait_us"), get(plain, "held_us"));
  const int timeouts = static_cast<int>(get(one, "timeouts") + get(plain, "timeouts"));
  if (timeouts > 0) {
    std::printf("note: %d trials held O past %.0f s (counted as %.0f s)\n", timeouts, kPollLimitS,
                kPollLimitS);
  }

  const std::string report = json::PrettyObject({
      {"bench", json::Str("wait")},
      {"device", DeviceJson(device)},
      {"config",
       json::Object({{"copy_mib", json::Int(options.copy_mib)}, {"trials", json::Int(trials)}})},
      {"one_connection", json::Object({{"held_us", json::Num(get(one, "held_us"))},
                                       {"baseline_us", json::Num(get(one, "baseline_us"))},
                                       {"with_wait_us", json::Num(get(one, "with_wait_us"))}})},
      {"default_connections",
       json::Object({{"held_us", json::Num(get(plain, "held_us"))},
                     {"baseline_us", json::Num(get(plain, "baseline_us"))},
                     {"with_wait_us", json::Num(get(plain, "with_wait_us"))}})},
      {"summary", json::Object({{"copy_wait_us", json::Num(wait_us)},
                                {"held_us_one_connection", json::Num(get(one, "held_us"))},
                                {"held_us_default_connections", json::Num(get(plain, "held_us"))},
                                {"timeouts", json::Int(timeouts)}})},
      {"ok", json::Bool(true)},
  });
  WriteJsonFile(options.json_path, report);
  return 0;
}

}  // namespace stash::bench_gpu
