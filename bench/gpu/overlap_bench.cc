// stash-bench-gpu overlap: does a copy launched by another process stall the trainer?
//
// Without MPS, kernels of two processes on one GPU time-slice. The trainer T (this binary
// re-exec'd as `overlap-trainer`, its own process and context) runs a compute-bound FMA kernel
// that fills every SM, about --launch-ms per launch, --iters launches per round, and reports the
// round's wall time. This process is the copier C (the daemon's role): while T runs a round, C
// stashes and reloads --copy-mib MiB over and over, in one of two modes:
//  - kernel: LaunchStash / LaunchReload of paging_cuda.h (SM copy kernels, count read on the
//    device) into a pool of 256 KiB pages with a permuted free ring;
//  - copy-engine: the count known on the host, the runs of consecutive page ids (a permuted ring
//    makes most runs one page) copied device-to-device into the same kind of pool: one
//    cudaMemcpyBatchAsync per stash and one per reload (CUDA 12.8 and later, with
//    cudaMemcpyFlagPreferOverlapWithCompute), else one cudaMemcpyAsync per run.
// The two modes offer different loads when each runs flat out, so a bare slowdown would compare
// unlike things. Two ways to compare them: the flat-out rounds report the trainer time lost per
// GB the copier moved, and the paced rounds hold both copiers to the same bytes per second (half
// the slower copier's speed alone), where the slowdowns compare directly.
// Rounds: T alone; T with each copier flat out; T with each copier paced; T alone again (drift).
// Also each copier alone, flat out (no trainer). Reported: T's round time in each, the slowdowns
// against T alone, the trainer ms lost per GB moved, and the copier's GB/s (stash plus reload
// payload per second).
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/gpu/bench_kernels.h"
#include "bench/gpu/common.h"
#include "stash/kernels/paging.h"
#include "stash/kernels/paging_cuda.h"

namespace stash::bench_gpu {
namespace {

using kernels::LaunchResult;
using kernels::PageRing;
using kernels::ReloadLaunch;
using kernels::StashLaunch;
using kernels::StashPlan;

constexpr uint64_t kPageBytes = 256 * kKiB;
constexpr uint64_t kRowBytes = 8 * kKiB;
constexpr int kDefaultLaunches = 1000;
constexpr int kChildTimeoutMs = 120'000;
constexpr double kCopierAloneSeconds = 1.0;
constexpr double kRoundLimitSeconds = 60.0;  // a copier round stops here even without T
constexpr int kInFlight = 2;                 // stash+reload iterations queued ahead

void CheckLaunch(const LaunchResult& result, const char* what) {
  if (!result.ok()) {
    Die(1, std::string(what) + " refused: " + kernels::LaunchStatusName(result.status) + ": " +
               result.message);
  }
}

// "key=value key=value" -> map.
std::map<std::string, std::string> Fields(const std::string& line) {
  std::map<std::string, std::string> out;
  std::istringstream in(line);
  std::string word;
  while (in >> word) {
    const size_t eq = word.find('=');
    if (eq != std::string::npos) out[word.substr(0, eq)] = word.substr(eq + 1);
  }
  return out;
}

double Field(const std::map<std::string, std::string>& fields, const std::string& key) {
  const auto it = fields.find(key);
  if (it == fields.end()) Die(1, "overlap: the trainer's line has no " + key);
  return std::strtod(it->second.c_str(), nullptr);
}

void* DeviceAlloc(uint64_t bytes, const char* what) {
  void* p = nullptr;
  const cudaError_t error = cudaMalloc(&p, bytes);
  if (error != cudaSuccess) {
    Die(1, std::string("cudaMalloc of ") + std::to_string(bytes) + " bytes for the " + what +
               " failed: " + cudaGetErrorString(error));
  }
  return p;
}

// The copier: a pool, a source and a destination, and both ways to move a stash.
class Copier {
 public:
  explicit Copier(uint64_t bytes) : bytes_(bytes) {
    pages_ = 2 * kernels::PagesFor(bytes, kPageBytes);
    pool_ = static_cast<uint8_t*>(DeviceAlloc(pages_ * kPageBytes, "page pool"));
    src_ = static_cast<uint8_t*>(DeviceAlloc(bytes, "source"));
    dst_ = static_cast<uint8_t*>(DeviceAlloc(bytes, "destination"));
    auto* ids = static_cast<uint64_t*>(DeviceAlloc(pages_ * sizeof(uint64_t), "ring ids"));
    ring_ = static_cast<PageRing*>(DeviceAlloc(sizeof(PageRing), "ring"));
    count_ = static_cast<int64_t*>(DeviceAlloc(sizeof(int64_t), "count"));
    record_ = static_cast<uint64_t*>(
        DeviceAlloc(kernels::PagesFor(bytes, kPageBytes) * sizeof(uint64_t), "page record"));
    plan_ = static_cast<StashPlan*>(DeviceAlloc(sizeof(StashPlan), "plan"));
    mismatches_ =
        static_cast<unsigned long long*>(DeviceAlloc(sizeof(unsigned long long), "mismatches"));
    BENCH_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    host_ids_.resize(pages_);
    std::iota(host_ids_.begin(), host_ids_.end(), uint64_t{0});
    std::mt19937_64 rng(1);
    std::shuffle(host_ids_.begin(), host_ids_.end(), rng);
    host_tail_ = pages_;
    const PageRing ring{ids, pages_, 0, pages_};
    const auto rows = static_cast<int64_t>(bytes / kRowBytes);
    BENCH_CUDA(
        cudaMemcpy(ids, host_ids_.data(), pages_ * sizeof(uint64_t), cudaMemcpyHostToDevice));
    BENCH_CUDA(cudaMemcpy(ring_, &ring, sizeof(ring), cudaMemcpyHostToDevice));
    BENCH_CUDA(cudaMemcpy(count_, &rows, sizeof(rows), cudaMemcpyHostToDevice));
    BENCH_CUDA(LaunchFill(reinterpret_cast<uint64_t*>(src_), bytes / 8, 2, stream_));
    BENCH_CUDA(cudaStreamSynchronize(stream_));
    BENCH_CUDA(cudaDeviceSynchronize());
    host_record_.resize(kernels::PagesFor(bytes, kPageBytes));
    for (cudaEvent_t& e : done_) BENCH_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }

  // Enqueues one stash and one reload of the whole buffer.
  void EnqueueRound(bool copy_engine) {
    if (!copy_engine) {
      StashLaunch stash;
      stash.d_src = src_;
      stash.d_count = count_;
      stash.max_rows = bytes_ / kRowBytes;
      stash.row_bytes = kRowBytes;
      stash.page_bytes = kPageBytes;
      stash.device = kernels::CudaTier{ring_, pool_};
      stash.d_page_record = record_;
      stash.d_plan = plan_;
      ReloadLaunch reload;
      reload.d_dst = dst_;
      reload.d_plan = plan_;
      reload.d_page_record = record_;
      reload.max_rows = stash.max_rows;
      reload.row_bytes = kRowBytes;
      reload.page_bytes = kPageBytes;
      reload.device = stash.device;
      CheckLaunch(kernels::LaunchStash(stash, stream_), "LaunchStash");
      CheckLaunch(kernels::LaunchReload(reload, stream_), "LaunchReload");
      return;
    }
    // The host owns this ring: take pages at the head, copy runs of consecutive ids, give the
    // pages back at the tail in page-slot order (what the paging kernels do, on the host).
    const uint64_t pages = host_record_.size();
    for (uint64_t slot = 0; slot < pages; ++slot) {
      host_record_[slot] = host_ids_[(host_head_ + slot) % pages_];
    }
    host_head_ += pages;
    stash_dst_.clear(), stash_src_.clear(), reload_dst_.clear(), reload_src_.clear();
    sizes_.clear();
    ForEachRun([&](uint64_t first_slot, uint64_t id, uint64_t run_pages) {
      stash_dst_.push_back(pool_ + id * kPageBytes);
      stash_src_.push_back(src_ + first_slot * kPageBytes);
      reload_dst_.push_back(dst_ + first_slot * kPageBytes);
      reload_src_.push_back(pool_ + id * kPageBytes);
      sizes_.push_back(RunBytes(first_slot, run_pages));
    });
    CopyRuns(stash_dst_, stash_src_);
    CopyRuns(reload_dst_, reload_src_);
    for (uint64_t slot = 0; slot < pages; ++slot) {
      host_ids_[(host_tail_ + slot) % pages_] = host_record_[slot];
    }
    host_tail_ += pages;
  }

  // Runs stash+reload rounds, kInFlight ahead, until `stop()` says so or kRoundLimitSeconds;
  // with `pace_gbps` > 0, round r is not enqueued before r x (its payload / pace_gbps) seconds
  // passed, so the copier offers that load and no more. Returns the payload GB/s (stash and
  // reload bytes per second).
  template <typename Stop>
  double Run(bool copy_engine, Stop stop, int64_t* rounds_out, int64_t* memcpy_calls,
             double pace_gbps = 0) {
    calls_ = 0;
    int64_t rounds = 0;
    const double start = NowSeconds();
    const double round_s =
        pace_gbps > 0 ? 2.0 * static_cast<double>(bytes_) / (pace_gbps * 1e9) : 0;
    for (;;) {
      if (rounds >= kInFlight) {
        BENCH_CUDA(cudaEventSynchronize(done_[(rounds - kInFlight) % kEvents]));
      }
      // stop() may consume what it looks for (the trainer's line): ask it once per answer.
      bool stopped = false;
      while (round_s > 0 && NowSeconds() - start < static_cast<double>(rounds) * round_s) {
        if (stop()) {
          stopped = true;
          break;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
      if (stopped) break;
      EnqueueRound(copy_engine);
      BENCH_CUDA(cudaEventRecord(done_[rounds % kEvents], stream_));
      ++rounds;
      if (stop() || NowSeconds() - start > kRoundLimitSeconds) break;
    }
    BENCH_CUDA(cudaStreamSynchronize(stream_));
    const double seconds = NowSeconds() - start;
    *rounds_out = rounds;
    if (memcpy_calls != nullptr) *memcpy_calls = rounds > 0 ? calls_ / rounds : 0;
    return 2.0 * static_cast<double>(bytes_) * static_cast<double>(rounds) / seconds / 1e9;
  }

  // How the copy-engine mode copies: "cudaMemcpyBatchAsync" or "cudaMemcpyAsync".
  const char* copy_engine_call() const {
    return batch_ ? "cudaMemcpyBatchAsync" : "cudaMemcpyAsync";
  }

  // One round into a cleared destination; true when it equals the source.
  bool Verify(bool copy_engine) {
    BENCH_CUDA(cudaMemsetAsync(dst_, 0, bytes_, stream_));
    BENCH_CUDA(cudaMemsetAsync(mismatches_, 0, sizeof(unsigned long long), stream_));
    EnqueueRound(copy_engine);
    BENCH_CUDA(LaunchCountMismatches(reinterpret_cast<const uint64_t*>(src_),
                                     reinterpret_cast<const uint64_t*>(dst_), bytes_ / 8,
                                     mismatches_, stream_));
    BENCH_CUDA(cudaStreamSynchronize(stream_));
    unsigned long long mismatches = 0;
    BENCH_CUDA(cudaMemcpy(&mismatches, mismatches_, sizeof(mismatches), cudaMemcpyDeviceToHost));
    return mismatches == 0;
  }

 private:
  static constexpr int kEvents = 4;

  // Copies sizes_[i] bytes from srcs[i] to dsts[i] for every run: one batch call while the
  // runtime and driver take it, else (and from then on) one cudaMemcpyAsync per run.
  void CopyRuns(std::vector<void*>& dsts, std::vector<const void*>& srcs) {
#if CUDART_VERSION >= 12080
    if (batch_) {
      cudaMemcpyAttributes attributes{};
      attributes.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      attributes.flags = cudaMemcpyFlagPreferOverlapWithCompute;
      size_t first = 0;
#if CUDART_VERSION >= 13000
      const cudaError_t e = cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes_.data(),
                                                 dsts.size(), &attributes, &first, 1, stream_);
#else
      size_t failed = 0;
      const cudaError_t e =
          cudaMemcpyBatchAsync(dsts.data(), const_cast<void**>(srcs.data()), sizes_.data(),
                               dsts.size(), &attributes, &first, 1, &failed, stream_);
#endif
      if (e == cudaSuccess) {
        ++calls_;
        return;
      }
      // Not offered here (an older driver): say so once and copy run by run from now on.
      (void)cudaGetLastError();
      std::printf(
          "note: cudaMemcpyBatchAsync failed (%s); the copy-engine mode uses one "
          "cudaMemcpyAsync per run\n",
          cudaGetErrorString(e));
      batch_ = false;
    }
#endif
    for (size_t i = 0; i < dsts.size(); ++i) {
      BENCH_CUDA(cudaMemcpyAsync(dsts[i], srcs[i], sizes_[i], cudaMemcpyDeviceToDevice, stream_));
      ++calls_;
    }
  }

  uint64_t RunBytes(uint64_t first_slot, uint64_t run_pages) const {
    const uint64_t begin = first_slot * kPageBytes;
    const uint64_t end = std::min(bytes_, begin + run_pages * kPageBytes);
    return end - begin;
  }

  // Calls f(first_slot, first_id, pages) for each run of consecutive page ids in host_record_.
  template <typename F>
  void ForEachRun(F f) {
    const uint64_t pages = host_record_.size();
    uint64_t slot = 0;
    while (slot < pages) {
      uint64_t run = 1;
      while (slot + run < pages && host_record_[slot + run] == host_record_[slot] + run) ++run;
      f(slot, host_record_[slot], run);
      slot += run;
    }
  }

  uint64_t bytes_;
  uint64_t pages_ = 0;
  uint8_t* pool_ = nullptr;
  uint8_t* src_ = nullptr;
  uint8_t* dst_ = nullptr;
  PageRing* ring_ = nullptr;
  int64_t* count_ = nullptr;
  uint64_t* record_ = nullptr;
  StashPlan* plan_ = nullptr;
  unsigned long long* mismatches_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t done_[kEvents] = {};
  // The copy-engine mode's ring, on the host.
  std::vector<uint64_t> host_ids_;
  uint64_t host_head_ = 0;
  uint64_t host_tail_ = 0;
  std::vector<uint64_t> host_record_;
  std::vector<void*> stash_dst_, reload_dst_;
  std::vector<const void*> stash_src_, reload_src_;
  std::vector<size_t> sizes_;
  bool batch_ = CUDART_VERSION >= 12080;
  int64_t calls_ = 0;
};

// One trainer round: "go", then the trainer's "done ..." line. With `copier` (kernel or
// copy-engine), the copier runs until that line arrives. Returns the trainer's loop_ms.
struct Round {
  double trainer_ms = 0;
  double copier_gbps = 0;
  int64_t copier_rounds = 0;
};

Round RunRound(Child& trainer, Copier* copier, bool copy_engine, double pace_gbps = 0) {
  Round round;
  if (!trainer.WriteLine("go")) Die(1, "overlap: the trainer is gone");
  std::string line;
  if (copier != nullptr) {
    bool got = false;
    round.copier_gbps = copier->Run(
        copy_engine,
        [&] {
          got = trainer.ReadLine(&line, 0);
          return got;
        },
        &round.copier_rounds, nullptr, pace_gbps);
    if (!got && !trainer.ReadLine(&line, kChildTimeoutMs)) {
      Die(1, "overlap: the trainer did not finish its round");
    }
  } else if (!trainer.ReadLine(&line, kChildTimeoutMs)) {
    Die(1, "overlap: the trainer did not finish its round");
  }
  round.trainer_ms = Field(Fields(line), "loop_ms");
  return round;
}

}  // namespace

int RunOverlapTrainer(const Options& options) {
  BecomeChild();
  const int launches = options.iters > 0 ? options.iters : kDefaultLaunches;
  BENCH_CUDA(cudaSetDevice(options.device));
  int sm_count = 0;
  BENCH_CUDA(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, options.device));
  int blocks = 0;
  BENCH_CUDA(BurnBlocks(sm_count, &blocks));
  void* out_memory = nullptr;
  BENCH_CUDA(cudaMalloc(&out_memory, static_cast<size_t>(blocks) * 256 * sizeof(float)));
  auto* out = static_cast<float*>(out_memory);
  cudaStream_t stream = nullptr;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t start = nullptr;
  cudaEvent_t end = nullptr;
  BENCH_CUDA(cudaEventCreate(&start));
  BENCH_CUDA(cudaEventCreate(&end));

  // Calibrate: iterations for one launch of about --launch-ms.
  int64_t iterations = 4096;
  BENCH_CUDA(LaunchBurn(out, blocks, iterations, stream));  // warm-up
  auto time_launch = [&] {
    BENCH_CUDA(cudaEventRecord(start, stream));
    for (int i = 0; i < 3; ++i) BENCH_CUDA(LaunchBurn(out, blocks, iterations, stream));
    BENCH_CUDA(cudaEventRecord(end, stream));
    BENCH_CUDA(cudaEventSynchronize(end));
    return std::max(ElapsedMs(start, end) / 3.0, 1e-3);
  };
  double ms = time_launch();
  for (int attempt = 0; attempt < 4; ++attempt) {
    const double scale = options.launch_ms / ms;
    if (scale > 0.9 && scale < 1.1) break;
    iterations = std::max<int64_t>(
        1, static_cast<int64_t>(static_cast<double>(iterations) * std::min(scale, 64.0)));
    ms = time_launch();
  }
  std::printf("ready launch_ms=%.4f iterations=%" PRId64 " blocks=%d\n", ms, iterations, blocks);
  std::fflush(stdout);

  std::string command;
  int c = 0;
  for (;;) {
    command.clear();
    while ((c = std::getchar()) != EOF && c != '\n') command += static_cast<char>(c);
    if (c == EOF || command != "go") break;
    const double t0 = NowSeconds();
    BENCH_CUDA(cudaEventRecord(start, stream));
    for (int i = 0; i < launches; ++i) BENCH_CUDA(LaunchBurn(out, blocks, iterations, stream));
    BENCH_CUDA(cudaEventRecord(end, stream));
    BENCH_CUDA(cudaStreamSynchronize(stream));
    const double loop_ms = (NowSeconds() - t0) * 1e3;
    std::printf("done loop_ms=%.3f gpu_ms=%.3f launches=%d\n", loop_ms, ElapsedMs(start, end),
                launches);
    std::fflush(stdout);
  }
  BENCH_CUDA(cudaFree(out));
  return 0;
}

int RunOverlap(const Options& options) {
  const DeviceInfo device = SelectDevice(options.device);
  const int launches = options.iters > 0 ? options.iters : kDefaultLaunches;
  const uint64_t bytes = static_cast<uint64_t>(options.copy_mib) * kMiB;
  std::printf("stash-bench-gpu overlap: %s\n", DeviceLine(device).c_str());
  if (device.compute_mode != cudaComputeModeDefault) {
    std::printf(
        "note: compute mode %d is not the default; a second process may not get a "
        "context on this device\n",
        device.compute_mode);
  }

  Copier copier(bytes);
  const bool kernel_verified = copier.Verify(false);
  const bool copy_engine_verified = copier.Verify(true);
  if (!kernel_verified || !copy_engine_verified) {
    std::fprintf(stderr, "stash-bench-gpu: overlap: VERIFY FAILED (kernel %s, copy-engine %s)\n",
                 kernel_verified ? "ok" : "MISMATCH", copy_engine_verified ? "ok" : "MISMATCH");
  }
  // The copier alone, no trainer yet.
  int64_t rounds = 0;
  int64_t memcpy_calls = 0;
  auto after = [](double seconds) {
    const double end = NowSeconds() + seconds;
    return [end] { return NowSeconds() >= end; };
  };
  const double alone_kernel_gbps = copier.Run(false, after(kCopierAloneSeconds), &rounds, nullptr);
  const double alone_ce_gbps = copier.Run(true, after(kCopierAloneSeconds), &rounds, &memcpy_calls);

  Child trainer({"overlap-trainer", "--device", std::to_string(options.device), "--iters",
                 std::to_string(launches), "--launch-ms", std::to_string(options.launch_ms)});
  std::string ready;
  if (!trainer.ReadLine(&ready, kChildTimeoutMs)) {
    Die(1,
        "overlap: the trainer did not start (see its error above; a compute mode other than "
        "default can refuse a second process)");
  }
  const auto ready_fields = Fields(ready);
  const double launch_ms = Field(ready_fields, "launch_ms");

  // Both copiers paced to the same offered load: half the slower one's speed alone.
  const double paced_gbps = 0.5 * std::min(alone_kernel_gbps, alone_ce_gbps);
  const Round alone = RunRound(trainer, nullptr, false);
  const Round with_kernel = RunRound(trainer, &copier, false);
  const Round with_ce = RunRound(trainer, &copier, true);
  const Round paced_kernel = RunRound(trainer, &copier, false, paced_gbps);
  const Round paced_ce = RunRound(trainer, &copier, true, paced_gbps);
  const Round alone_after = RunRound(trainer, nullptr, false);
  trainer.WriteLine("quit");
  const int trainer_status = trainer.Wait(30'000);

  const auto slowdown = [&](const Round& r) { return r.trainer_ms / alone.trainer_ms; };
  // Trainer milliseconds lost per GB the copier moved during the round (GB/s x the round's
  // seconds): comparable across copiers that moved different amounts.
  const auto ms_per_gb = [&](const Round& r) {
    const double gb = r.copier_gbps * r.trainer_ms / 1e3;
    return gb > 0 ? (r.trainer_ms - alone.trainer_ms) / gb : std::nan("");
  };
  std::printf(
      "trainer: %d launches of an FMA kernel on every SM, %.3f ms each (%s blocks of 256);\n"
      "copier: stash + reload of %" PRIu64
      " MiB in 256 KiB pages (permuted ring); copy-engine "
      "mode: %s, %" PRId64 " calls per round; paced rounds offer %.1f GB/s each\n\n",
      launches, launch_ms, ready_fields.count("blocks") ? ready_fields.at("blocks").c_str() : "?",
      bytes / kMiB, copier.copy_engine_call(), memcpy_calls, paced_gbps);
  std::printf("%-36s | %10s | %9s | %11s | %14s\n", "round", "trainer ms", "slowdown",
              "copier GB/s", "trainer ms/GB");
  std::printf(
      "-------------------------------------+------------+-----------+-------------+-------------"
      "---\n");
  std::printf("%-36s | %10.1f | %8.2fx | %11s | %14s\n", "trainer alone", alone.trainer_ms, 1.0,
              "-", "-");
  const auto row = [&](const char* name, const Round& r) {
    std::printf("%-36s | %10.1f | %8.2fx | %11.1f | %14.2f\n", name, r.trainer_ms, slowdown(r),
                r.copier_gbps, ms_per_gb(r));
  };
  row("trainer + kernel copier, flat out", with_kernel);
  row("trainer + copy-engine copier, flat out", with_ce);
  row("trainer + kernel copier, paced", paced_kernel);
  row("trainer + copy-engine copier, paced", paced_ce);
  std::printf("%-36s | %10.1f | %8.2fx | %11s | %14s\n", "trainer alone, again",
              alone_after.trainer_ms, slowdown(alone_after), "-", "-");
  std::printf("%-36s | %10s | %9s | %11.1f | %14s\n", "kernel copier alone", "-", "-",
              alone_kernel_gbps, "-");
  std::printf("%-36s | %10s | %9s | %11.1f | %14s\n", "copy-engine copier alone", "-", "-",
              alone_ce_gbps, "-");
  const bool ok = kernel_verified && copy_engine_verified && trainer_status == 0;
  if (trainer_status != 0) std::printf("\nthe trainer exited with status %d\n", trainer_status);

  const std::string report = json::PrettyObject({
      {"bench", json::Str("overlap")},
      {"device", DeviceJson(device)},
      {"config", json::Object({{"trainer_launches", json::Int(launches)},
                               {"trainer_launch_ms", json::Num(launch_ms)},
                               {"copy_bytes", json::Int(static_cast<int64_t>(bytes))},
                               {"page_bytes", json::Int(kPageBytes)},
                               {"copy_engine_call", json::Str(copier.copy_engine_call())},
                               {"copy_engine_calls_per_round", json::Int(memcpy_calls)},
                               {"paced_gbps", json::Num(paced_gbps)}})},
      {"trainer_alone_ms", json::Num(alone.trainer_ms)},
      {"trainer_with_kernel_copier_ms", json::Num(with_kernel.trainer_ms)},
      {"trainer_with_copy_engine_copier_ms", json::Num(with_ce.trainer_ms)},
      {"trainer_with_paced_kernel_copier_ms", json::Num(paced_kernel.trainer_ms)},
      {"trainer_with_paced_copy_engine_copier_ms", json::Num(paced_ce.trainer_ms)},
      {"trainer_alone_again_ms", json::Num(alone_after.trainer_ms)},
      {"slowdown_flat_out_kernel_copier", json::Num(slowdown(with_kernel))},
      {"slowdown_flat_out_copy_engine_copier", json::Num(slowdown(with_ce))},
      {"slowdown_kernel_copier", json::Num(slowdown(paced_kernel))},
      {"slowdown_copy_engine_copier", json::Num(slowdown(paced_ce))},
      {"trainer_ms_per_gb_kernel_copier", json::Num(ms_per_gb(with_kernel))},
      {"trainer_ms_per_gb_copy_engine_copier", json::Num(ms_per_gb(with_ce))},
      {"copier_kernel_gbps", json::Num(with_kernel.copier_gbps)},
      {"copier_copy_engine_gbps", json::Num(with_ce.copier_gbps)},
      {"copier_paced_kernel_gbps", json::Num(paced_kernel.copier_gbps)},
      {"copier_paced_copy_engine_gbps", json::Num(paced_ce.copier_gbps)},
      {"copier_alone_kernel_gbps", json::Num(alone_kernel_gbps)},
      {"copier_alone_copy_engine_gbps", json::Num(alone_ce_gbps)},
      {"verified", json::Bool(kernel_verified && copy_engine_verified)},
      {"summary",
       json::Object({{"copy_engine_call", json::Str(copier.copy_engine_call())},
                     {"paced_gbps", json::Num(paced_gbps)},
                     {"slowdown_kernel_copier", json::Num(slowdown(paced_kernel))},
                     {"slowdown_copy_engine_copier", json::Num(slowdown(paced_ce))},
                     {"trainer_ms_per_gb_kernel_copier", json::Num(ms_per_gb(with_kernel))},
                     {"trainer_ms_per_gb_copy_engine_copier", json::Num(ms_per_gb(with_ce))},
                     {"copier_kernel_gbps", json::Num(with_kernel.copier_gbps)},
                     {"copier_copy_engine_gbps", json::Num(with_ce.copier_gbps)}})},
      {"ok", json::Bool(ok)},
  });
  WriteJsonFile(options.json_path, report);
  return ok ? 0 : 1;
}

}  // namespace stash::bench_gpu
