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
//
// stash-bench-gpu mapped-overlap (the second half of this file) runs the same experiment with
// mapped mode's copier inside the trainer, beside these kernel copier rounds.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/gpu/bench_kernels.h"
#include "bench/gpu/common.h"
#include "bench/gpu/mapped_rig.h"
#include "common/cuda_driver.h"
#include "stash/kernels/lease_control.h"
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

// Runs stash+reload rounds of `bytes` each on `stream` (`enqueue()` enqueues one), kInFlight
// ahead, until `stop()` says so or kRoundLimitSeconds; with `pace_gbps` > 0, round r is not
// enqueued before r x (its payload / pace_gbps) seconds passed, so the copier offers that load
// and no more. Returns the payload GB/s (stash and reload bytes per second, until the last round
// completed) and the rounds in *rounds_out.
template <typename Enqueue, typename Stop>
double PacedRounds(cudaStream_t stream, uint64_t bytes, Enqueue enqueue, Stop stop,
                   double pace_gbps, int64_t* rounds_out) {
  constexpr int kEvents = 4;
  cudaEvent_t done[kEvents] = {};
  for (cudaEvent_t& e : done) BENCH_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  int64_t rounds = 0;
  const double start = NowSeconds();
  const double round_s = pace_gbps > 0 ? 2.0 * static_cast<double>(bytes) / (pace_gbps * 1e9) : 0;
  for (;;) {
    if (rounds >= kInFlight) BENCH_CUDA(cudaEventSynchronize(done[(rounds - kInFlight) % kEvents]));
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
    enqueue();
    BENCH_CUDA(cudaEventRecord(done[rounds % kEvents], stream));
    ++rounds;
    if (stop() || NowSeconds() - start > kRoundLimitSeconds) break;
  }
  BENCH_CUDA(cudaStreamSynchronize(stream));
  const double seconds = NowSeconds() - start;
  for (cudaEvent_t e : done) BENCH_CUDA(cudaEventDestroy(e));
  *rounds_out = rounds;
  return 2.0 * static_cast<double>(bytes) * static_cast<double>(rounds) / seconds / 1e9;
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

  // Runs stash+reload rounds flat out or paced (PacedRounds). Returns the payload GB/s.
  template <typename Stop>
  double Run(bool copy_engine, Stop stop, int64_t* rounds_out, int64_t* memcpy_calls,
             double pace_gbps = 0) {
    calls_ = 0;
    const double gbps = PacedRounds(
        stream_, bytes_, [&] { EnqueueRound(copy_engine); }, stop, pace_gbps, rounds_out);
    if (memcpy_calls != nullptr) *memcpy_calls = *rounds_out > 0 ? calls_ / *rounds_out : 0;
    return gbps;
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
  bool overflowed = false;  // mapped rounds: a stash found no room (its copy did not run)
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

// The trainer's compute: an FMA kernel on every SM of `device`, on its own stream, calibrated to
// about `launch_ms` per launch.
class Burner {
 public:
  Burner(int device, double launch_ms) {
    BENCH_CUDA(cudaSetDevice(device));
    int sm_count = 0;
    BENCH_CUDA(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device));
    BENCH_CUDA(BurnBlocks(sm_count, &blocks_));
    void* out_memory = nullptr;
    BENCH_CUDA(cudaMalloc(&out_memory, static_cast<size_t>(blocks_) * 256 * sizeof(float)));
    out_ = static_cast<float*>(out_memory);
    BENCH_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    BENCH_CUDA(cudaEventCreate(&start_));
    BENCH_CUDA(cudaEventCreate(&end_));
    for (cudaEvent_t& e : ahead_) BENCH_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));

    // Calibrate: iterations for one launch of about launch_ms.
    BENCH_CUDA(LaunchBurn(out_, blocks_, iterations_, stream_));  // warm-up
    auto time_launch = [&] {
      BENCH_CUDA(cudaEventRecord(start_, stream_));
      for (int i = 0; i < 3; ++i) BENCH_CUDA(LaunchBurn(out_, blocks_, iterations_, stream_));
      BENCH_CUDA(cudaEventRecord(end_, stream_));
      BENCH_CUDA(cudaEventSynchronize(end_));
      return std::max(ElapsedMs(start_, end_) / 3.0, 1e-3);
    };
    launch_ms_ = time_launch();
    for (int attempt = 0; attempt < 4; ++attempt) {
      const double scale = launch_ms / launch_ms_;
      if (scale > 0.9 && scale < 1.1) break;
      iterations_ = std::max<int64_t>(
          1, static_cast<int64_t>(static_cast<double>(iterations_) * std::min(scale, 64.0)));
      launch_ms_ = time_launch();
    }
  }
  Burner(const Burner&) = delete;
  Burner& operator=(const Burner&) = delete;
  ~Burner() { (void)cudaFree(out_); }

  // "launch_ms=.. iterations=.. blocks=..", for the ready line.
  std::string ReadyFields() const {
    char text[128];
    std::snprintf(text, sizeof(text), "launch_ms=%.4f iterations=%" PRId64 " blocks=%d", launch_ms_,
                  iterations_, blocks_);
    return text;
  }

  // One round of `launches` launches: the host wall time until the last completed (loop_ms)
  // and the GPU time between events around them (gpu_ms). `ahead` > 0: the host keeps at most
  // that many launches queued (it waits for launch i - ahead before enqueueing launch i), as a
  // trainer whose host runs a few kernels ahead of its GPU; 0: all launches queued at once.
  void Round(int launches, int ahead, double* loop_ms, double* gpu_ms) {
    ahead = std::min(ahead, kMaxAhead);
    const double t0 = NowSeconds();
    BENCH_CUDA(cudaEventRecord(start_, stream_));
    for (int i = 0; i < launches; ++i) {
      if (ahead > 0 && i >= ahead) BENCH_CUDA(cudaEventSynchronize(ahead_[i % ahead]));
      BENCH_CUDA(LaunchBurn(out_, blocks_, iterations_, stream_));
      if (ahead > 0) BENCH_CUDA(cudaEventRecord(ahead_[i % ahead], stream_));
    }
    BENCH_CUDA(cudaEventRecord(end_, stream_));
    BENCH_CUDA(cudaStreamSynchronize(stream_));
    *loop_ms = (NowSeconds() - t0) * 1e3;
    *gpu_ms = ElapsedMs(start_, end_);
  }

 private:
  static constexpr int kMaxAhead = 16;
  int blocks_ = 0;
  int64_t iterations_ = 4096;
  double launch_ms_ = 0;
  float* out_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr;
  cudaEvent_t end_ = nullptr;
  cudaEvent_t ahead_[kMaxAhead] = {};
};

// The next command line on stdin (without '\n'); false at EOF.
bool ReadCommand(std::string* command) {
  command->clear();
  int c = 0;
  while ((c = std::getchar()) != EOF && c != '\n') *command += static_cast<char>(c);
  return c != EOF;
}

}  // namespace

int RunOverlapTrainer(const Options& options) {
  BecomeChild();
  const int launches = options.iters > 0 ? options.iters : kDefaultLaunches;
  Burner burner(options.device, options.launch_ms);
  std::printf("ready %s\n", burner.ReadyFields().c_str());
  std::fflush(stdout);
  std::string command;
  while (ReadCommand(&command) && command == "go") {
    double loop_ms = 0;
    double gpu_ms = 0;
    burner.Round(launches, 0, &loop_ms, &gpu_ms);
    std::printf("done loop_ms=%.3f gpu_ms=%.3f launches=%d\n", loop_ms, gpu_ms, launches);
    std::fflush(stdout);
  }
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

// ---- mapped-overlap: the same experiment with mapped mode (the GPU check's step 5) -------------
//
// Mapped mode runs the paging kernels in the trainer's own process, on a side stream, into VMM
// chunks leased to it (MappedRig: the product's VmmChunkMemory, CudaLeaseMemory and
// StreamCopier). So the trainer child (`mapped-trainer`) holds that copier itself and runs it on
// a thread of its own while its main thread launches the FMA kernels; its host keeps at most
// kTrainerAhead launches queued, as a trainer's host runs a few kernels ahead of its GPU (with
// every launch queued at once, a side stream's work under CUDA_DEVICE_MAX_CONNECTIONS=1 would
// sit behind the whole round). The daemon-copy rounds are this process's kernel copier
// (LaunchStash / LaunchReload, what the daemon's CudaExecutor launches), as in `overlap`.
// Everything runs twice: a trainer child with CUDA_DEVICE_MAX_CONNECTIONS unset, and one with
// it set to 1 (Megatron's setting; read when the child's context is created).
namespace {

constexpr int kTrainerAhead = 8;
constexpr const char* kConnectionsVariable = "CUDA_DEVICE_MAX_CONNECTIONS";

// Sets `name` to `value` ("" = unsets it) for the object's life, then restores it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    if (value.empty()) {
      unsetenv(name);
    } else {
      setenv(name, value.c_str(), 1);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  ~ScopedEnv() {
    if (had_) {
      setenv(name_, old_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

auto StopAfter(double seconds) {
  const double end = NowSeconds() + seconds;
  return [end] { return NowSeconds() >= end; };
}

double Slowdown(const Round& r, const Round& alone) { return r.trainer_ms / alone.trainer_ms; }

// Trainer milliseconds lost per GB the copier moved during the round.
double MsPerGb(const Round& r, const Round& alone) {
  const double gb = r.copier_gbps * r.trainer_ms / 1e3;
  return gb > 0 ? (r.trainer_ms - alone.trainer_ms) / gb : std::nan("");
}

// One mapped round: the trainer runs its copier (paced to `pace_gbps`, 0 = flat out) while it
// computes, and reports both.
Round RunMappedRound(Child& trainer, double pace_gbps) {
  char command[64];
  std::snprintf(command, sizeof(command), "go-mapped %.6f", pace_gbps);
  std::string line;
  if (!trainer.WriteLine(command) || !trainer.ReadLine(&line, kChildTimeoutMs)) {
    Die(1, "mapped-overlap: the trainer did not finish its mapped round (see its error above)");
  }
  const auto fields = Fields(line);
  Round round;
  round.trainer_ms = Field(fields, "loop_ms");
  round.copier_gbps = Field(fields, "copier_gbps");
  round.copier_rounds = static_cast<int64_t>(Field(fields, "copier_rounds"));
  round.overflowed = Field(fields, "overflowed") != 0;
  return round;
}

struct MappedVariant {
  std::string connections;  // CUDA_DEVICE_MAX_CONNECTIONS in the trainer; "" = unset
  double launch_ms = 0;
  bool verified = false;  // the trainer's verify round, and no overflow in any mapped round
  int trainer_status = -1;
  double copier_alone_mapped_gbps = 0;
  Round alone, mapped, kernel, paced_mapped, paced_kernel, alone_again;
};

MappedVariant RunMappedVariant(const Options& options, const std::string& connections,
                               Copier& copier, double alone_kernel_gbps, double* paced_gbps) {
  MappedVariant v;
  v.connections = connections;
  const int launches = options.iters > 0 ? options.iters : kDefaultLaunches;
  std::unique_ptr<Child> trainer;
  {
    const ScopedEnv env(kConnectionsVariable, connections);
    trainer = std::make_unique<Child>(std::vector<std::string>{
        "mapped-trainer", "--device", std::to_string(options.device), "--iters",
        std::to_string(launches), "--launch-ms", std::to_string(options.launch_ms), "--copy-mib",
        std::to_string(options.copy_mib)});
  }
  const std::string setting = connections.empty() ? "unset" : connections;
  std::string line;
  if (!trainer->ReadLine(&line, kChildTimeoutMs)) {
    Die(1, "mapped-overlap: the trainer (CUDA_DEVICE_MAX_CONNECTIONS " + setting +
               ") did not start (see its error above)");
  }
  const auto ready = Fields(line);
  v.launch_ms = Field(ready, "launch_ms");
  v.verified = Field(ready, "mapped_verified") != 0;

  if (!trainer->WriteLine("copier-alone " + std::to_string(kCopierAloneSeconds)) ||
      !trainer->ReadLine(&line, kChildTimeoutMs)) {
    Die(1, "mapped-overlap: the trainer's copier did not run alone (see its error above)");
  }
  const auto alone_fields = Fields(line);
  v.copier_alone_mapped_gbps = Field(alone_fields, "copier_gbps");
  v.verified = v.verified && Field(alone_fields, "overflowed") == 0;
  // Every copier, in both variants, paced to the same offered load: half the slower one's speed
  // alone (as `overlap` does), fixed by the first variant.
  if (*paced_gbps <= 0) *paced_gbps = 0.5 * std::min(alone_kernel_gbps, v.copier_alone_mapped_gbps);

  v.alone = RunRound(*trainer, nullptr, false);
  v.mapped = RunMappedRound(*trainer, 0);
  v.kernel = RunRound(*trainer, &copier, false);
  v.paced_mapped = RunMappedRound(*trainer, *paced_gbps);
  v.paced_kernel = RunRound(*trainer, &copier, false, *paced_gbps);
  v.alone_again = RunRound(*trainer, nullptr, false);
  v.verified = v.verified && !v.mapped.overflowed && !v.paced_mapped.overflowed;
  trainer->WriteLine("quit");
  v.trainer_status = trainer->Wait(30'000);
  return v;
}

void PrintVariant(const MappedVariant& v) {
  std::printf("\nCUDA_DEVICE_MAX_CONNECTIONS %s in the trainer; its kernel %.3f ms per launch\n",
              v.connections.empty() ? "unset (the driver's default)" : v.connections.c_str(),
              v.launch_ms);
  std::printf("%-48s | %10s | %9s | %11s | %14s\n", "round", "trainer ms", "slowdown",
              "copier GB/s", "trainer ms/GB");
  std::printf(
      "-------------------------------------------------+------------+-----------+-------------+-"
      "---------------\n");
  const auto row = [&](const char* name, const Round& r, bool copier) {
    if (!copier) {
      std::printf("%-48s | %10.1f | %8.2fx | %11s | %14s\n", name, r.trainer_ms,
                  Slowdown(r, v.alone), "-", "-");
      return;
    }
    std::printf("%-48s | %10.1f | %8.2fx | %11.1f | %14.2f%s\n", name, r.trainer_ms,
                Slowdown(r, v.alone), r.copier_gbps, MsPerGb(r, v.alone),
                r.overflowed ? "  OVERFLOWED" : "");
  };
  row("trainer alone", v.alone, false);
  row("+ mapped copier (in-process side stream), flat", v.mapped, true);
  row("+ daemon-copy kernels (another process), flat", v.kernel, true);
  row("+ mapped copier, paced", v.paced_mapped, true);
  row("+ daemon-copy kernels, paced", v.paced_kernel, true);
  row("trainer alone, again", v.alone_again, false);
  std::printf("%-48s | %10s | %9s | %11.1f | %14s\n", "mapped copier alone", "-", "-",
              v.copier_alone_mapped_gbps, "-");
  if (v.trainer_status != 0) std::printf("the trainer exited with status %d\n", v.trainer_status);
}

std::string VariantJson(const MappedVariant& v) {
  return json::Object({
      {"cuda_device_max_connections",
       v.connections.empty() ? json::Null() : json::Str(v.connections)},
      {"trainer_launch_ms", json::Num(v.launch_ms)},
      {"trainer_alone_ms", json::Num(v.alone.trainer_ms)},
      {"trainer_with_mapped_copier_ms", json::Num(v.mapped.trainer_ms)},
      {"trainer_with_kernel_copier_ms", json::Num(v.kernel.trainer_ms)},
      {"trainer_with_paced_mapped_copier_ms", json::Num(v.paced_mapped.trainer_ms)},
      {"trainer_with_paced_kernel_copier_ms", json::Num(v.paced_kernel.trainer_ms)},
      {"trainer_alone_again_ms", json::Num(v.alone_again.trainer_ms)},
      {"slowdown_flat_out_mapped_copier", json::Num(Slowdown(v.mapped, v.alone))},
      {"slowdown_flat_out_kernel_copier", json::Num(Slowdown(v.kernel, v.alone))},
      {"slowdown_mapped_copier", json::Num(Slowdown(v.paced_mapped, v.alone))},
      {"slowdown_kernel_copier", json::Num(Slowdown(v.paced_kernel, v.alone))},
      {"slowdown_alone_again", json::Num(Slowdown(v.alone_again, v.alone))},
      {"trainer_ms_per_gb_mapped_copier", json::Num(MsPerGb(v.mapped, v.alone))},
      {"trainer_ms_per_gb_kernel_copier", json::Num(MsPerGb(v.kernel, v.alone))},
      {"copier_mapped_gbps", json::Num(v.mapped.copier_gbps)},
      {"copier_kernel_gbps", json::Num(v.kernel.copier_gbps)},
      {"copier_paced_mapped_gbps", json::Num(v.paced_mapped.copier_gbps)},
      {"copier_paced_kernel_gbps", json::Num(v.paced_kernel.copier_gbps)},
      {"copier_alone_mapped_gbps", json::Num(v.copier_alone_mapped_gbps)},
      {"verified", json::Bool(v.verified)},
      {"trainer_status", json::Int(v.trainer_status)},
  });
}

}  // namespace

int RunMappedTrainer(const Options& options) {
  BecomeChild();
  const int launches = options.iters > 0 ? options.iters : kDefaultLaunches;
  const uint64_t bytes = static_cast<uint64_t>(options.copy_mib) * kMiB;
  Burner burner(options.device, options.launch_ms);
  auto loaded = CudaDriver::Get();
  if (!loaded.ok()) Die(1, "mapped trainer: the CUDA driver API: " + loaded.status().ToString());
  cudaStream_t side = nullptr;
  BENCH_CUDA(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  MappedRigConfig config;
  config.device = options.device;
  config.pool_device = options.device;
  config.pool_bytes = 2 * bytes;  // like the kernel copier's pool: twice one stash
  config.max_stash_bytes = bytes;
  auto made = MappedRig::Create(*loaded, config, side);
  if (!made.ok()) {
    Die(1, "mapped trainer: setting up mapped mode's device tier: " + made.status().ToString());
  }
  MappedRig& rig = **made;
  void* src = nullptr;
  void* dst = nullptr;
  void* mismatches_memory = nullptr;
  BENCH_CUDA(cudaMalloc(&src, bytes));
  BENCH_CUDA(cudaMalloc(&dst, bytes));
  BENCH_CUDA(cudaMalloc(&mismatches_memory, sizeof(unsigned long long)));
  auto* mismatches = static_cast<unsigned long long*>(mismatches_memory);
  BENCH_CUDA(LaunchFill(static_cast<uint64_t*>(src), bytes / 8, 3, side));

  // One verified round: the stash lands in the device tier (no step flag), the reload brings
  // the source back.
  (void)rig.EndStep();
  BENCH_CUDA(cudaMemsetAsync(dst, 0, bytes, side));
  BENCH_CUDA(cudaMemsetAsync(mismatches, 0, sizeof(unsigned long long), side));
  rig.EnqueueRound(src, dst, bytes);
  const uint64_t flags = rig.EndStep();
  BENCH_CUDA(LaunchCountMismatches(static_cast<const uint64_t*>(src),
                                   static_cast<const uint64_t*>(dst), bytes / 8, mismatches, side));
  unsigned long long wrong = 0;
  BENCH_CUDA(cudaMemcpyAsync(&wrong, mismatches, sizeof(wrong), cudaMemcpyDeviceToHost, side));
  BENCH_CUDA(cudaStreamSynchronize(side));
  const bool verified = flags == 0 && wrong == 0;
  if (!verified) {
    std::fprintf(stderr,
                 "stash-bench-gpu: mapped trainer: VERIFY FAILED: step flags %llu (0 expected), "
                 "%llu words of the reloaded buffer differ\n",
                 static_cast<unsigned long long>(flags), wrong);
  }
  std::printf("ready %s mapped_verified=%d chunk_bytes=%" PRIu64 " chunks=%" PRIu64 "\n",
              burner.ReadyFields().c_str(), verified ? 1 : 0, rig.chunk_bytes(), rig.chunks());
  std::fflush(stdout);

  const auto rounds_of_copier = [&](auto stop, double pace_gbps, int64_t* rounds) {
    return PacedRounds(
        side, bytes, [&] { rig.EnqueueRound(src, dst, bytes); }, stop, pace_gbps, rounds);
  };
  std::string command;
  while (ReadCommand(&command)) {
    std::istringstream in(command);
    std::string verb;
    double argument = 0;
    in >> verb >> argument;
    double loop_ms = 0;
    double gpu_ms = 0;
    int64_t rounds = 0;
    double gbps = 0;
    if (verb == "go") {
      burner.Round(launches, kTrainerAhead, &loop_ms, &gpu_ms);
      std::printf("done loop_ms=%.3f gpu_ms=%.3f launches=%d\n", loop_ms, gpu_ms, launches);
    } else if (verb == "go-mapped") {
      std::atomic<bool> stop{false};
      std::thread copier([&] {
        BENCH_CUDA(cudaSetDevice(options.device));
        gbps = rounds_of_copier([&] { return stop.load(); }, argument, &rounds);
      });
      burner.Round(launches, kTrainerAhead, &loop_ms, &gpu_ms);
      stop = true;
      copier.join();
      const bool overflowed = (rig.EndStep() & kernels::kStepOverflow) != 0;
      std::printf(
          "done loop_ms=%.3f gpu_ms=%.3f launches=%d copier_gbps=%.3f copier_rounds=%" PRId64
          " overflowed=%d\n",
          loop_ms, gpu_ms, launches, gbps, rounds, overflowed ? 1 : 0);
    } else if (verb == "copier-alone") {
      gbps = rounds_of_copier(StopAfter(argument), 0, &rounds);
      const bool overflowed = (rig.EndStep() & kernels::kStepOverflow) != 0;
      std::printf("done copier_gbps=%.3f copier_rounds=%" PRId64 " overflowed=%d\n", gbps, rounds,
                  overflowed ? 1 : 0);
    } else {
      break;  // "quit"
    }
    std::fflush(stdout);
  }
  BENCH_CUDA(cudaStreamSynchronize(side));
  BENCH_CUDA(cudaFree(src));
  BENCH_CUDA(cudaFree(dst));
  BENCH_CUDA(cudaFree(mismatches));
  return 0;
}

int RunMappedOverlap(const Options& options) {
  const DeviceInfo device = SelectDevice(options.device);
  const int launches = options.iters > 0 ? options.iters : kDefaultLaunches;
  const uint64_t bytes = static_cast<uint64_t>(options.copy_mib) * kMiB;
  std::printf("stash-bench-gpu mapped-overlap: %s\n", DeviceLine(device).c_str());
  if (device.compute_mode != cudaComputeModeDefault) {
    std::printf(
        "note: compute mode %d is not the default; a second process may not get a "
        "context on this device\n",
        device.compute_mode);
  }
  Copier copier(bytes);
  const bool kernel_verified = copier.Verify(false);
  if (!kernel_verified) {
    std::fprintf(stderr, "stash-bench-gpu: mapped-overlap: VERIFY FAILED (kernel copier)\n");
  }
  int64_t rounds = 0;
  const double alone_kernel_gbps =
      copier.Run(false, StopAfter(kCopierAloneSeconds), &rounds, nullptr);
  double paced_gbps = 0;
  const MappedVariant standard =
      RunMappedVariant(options, "", copier, alone_kernel_gbps, &paced_gbps);
  const MappedVariant one = RunMappedVariant(options, "1", copier, alone_kernel_gbps, &paced_gbps);

  std::printf(
      "trainer: %d launches of an FMA kernel on every SM per round, at most %d queued;\n"
      "copiers: stash + reload of %" PRIu64
      " MiB, 8 KiB rows, 256 KiB pages: mapped = StreamCopier on a side stream of the trainer "
      "into VMM chunks mapped by CudaLeaseMemory; daemon-copy = LaunchStash/LaunchReload from "
      "this process (permuted ring); paced rounds offer %.1f GB/s each; daemon-copy kernels "
      "alone %.1f GB/s\n",
      launches, kTrainerAhead, bytes / kMiB, paced_gbps, alone_kernel_gbps);
  PrintVariant(standard);
  PrintVariant(one);
  const bool verified = kernel_verified && standard.verified && one.verified;
  const bool ok = verified && standard.trainer_status == 0 && one.trainer_status == 0;
  if (!verified) std::printf("\nVERIFY FAILED (see above)\n");

  const std::string report = json::PrettyObject({
      {"bench", json::Str("mapped-overlap")},
      {"device", DeviceJson(device)},
      {"config", json::Object({{"trainer_launches", json::Int(launches)},
                               {"trainer_launches_ahead", json::Int(kTrainerAhead)},
                               {"copy_bytes", json::Int(static_cast<int64_t>(bytes))},
                               {"page_bytes", json::Int(kPageBytes)},
                               {"row_bytes", json::Int(kRowBytes)},
                               {"paced_gbps", json::Num(paced_gbps)}})},
      {"copier_alone_kernel_gbps", json::Num(alone_kernel_gbps)},
      {"default_connections", VariantJson(standard)},
      {"one_connection", VariantJson(one)},
      {"verified", json::Bool(verified)},
      {"summary",
       json::Object({
           {"paced_gbps", json::Num(paced_gbps)},
           {"slowdown_mapped", json::Num(Slowdown(standard.paced_mapped, standard.alone))},
           {"slowdown_daemon_copy", json::Num(Slowdown(standard.paced_kernel, standard.alone))},
           {"slowdown_mapped_one_connection", json::Num(Slowdown(one.paced_mapped, one.alone))},
           {"slowdown_daemon_copy_one_connection",
            json::Num(Slowdown(one.paced_kernel, one.alone))},
           {"mapped_gbps", json::Num(standard.mapped.copier_gbps)},
           {"daemon_copy_gbps", json::Num(standard.kernel.copier_gbps)},
           {"mapped_gbps_one_connection", json::Num(one.mapped.copier_gbps)},
           {"daemon_copy_gbps_one_connection", json::Num(one.kernel.copier_gbps)},
           {"trainer_ms_per_gb_mapped", json::Num(MsPerGb(standard.mapped, standard.alone))},
           {"trainer_ms_per_gb_daemon_copy", json::Num(MsPerGb(standard.kernel, standard.alone))},
           {"trainer_ms_per_gb_mapped_one_connection", json::Num(MsPerGb(one.mapped, one.alone))},
           {"trainer_ms_per_gb_daemon_copy_one_connection",
            json::Num(MsPerGb(one.kernel, one.alone))},
           {"verified", json::Bool(verified)},
       })},
      {"ok", json::Bool(ok)},
  });
  WriteJsonFile(options.json_path, report);
  return ok ? 0 : 1;
}

}  // namespace stash::bench_gpu
