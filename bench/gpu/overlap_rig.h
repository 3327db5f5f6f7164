// What stash-bench-gpu's overlap experiments share (overlap_bench.cc: `overlap`, the daemon's
// kernel and copy-engine copiers against a trainer in another process;
// mapped_overlap_bench.cc: `mapped-overlap`, mapped mode's copier inside the trainer): the
// constants, the kernel copier, the trainer's compute, a trainer round, and the child protocol.
#ifndef STASH_BENCH_GPU_OVERLAP_RIG_H_
#define STASH_BENCH_GPU_OVERLAP_RIG_H_

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

using kernels::LaunchResult;
using kernels::PageRing;
using kernels::ReloadLaunch;
using kernels::StashLaunch;
using kernels::StashPlan;

inline constexpr uint64_t kPageBytes = 256 * kKiB;
inline constexpr uint64_t kRowBytes = 8 * kKiB;
inline constexpr int kDefaultLaunches = 1000;
inline constexpr int kChildTimeoutMs = 120'000;
inline constexpr double kCopierAloneSeconds = 1.0;
inline constexpr double kRoundLimitSeconds = 60.0;  // a copier round stops here even without T
inline constexpr int kInFlight = 2;                 // stash+reload iterations queued ahead

inline void CheckLaunch(const LaunchResult& result, const char* what) {
  if (!result.ok()) {
    Die(1, std::string(what) + " refused: " + kernels::LaunchStatusName(result.status) + ": " +
               result.message);
  }
}

// "key=value key=value" -> map.
inline std::map<std::string, std::string> Fields(const std::string& line) {
  std::map<std::string, std::string> out;
  std::istringstream in(line);
  std::string word;
  while (in >> word) {
    const size_t eq = word.find('=');
    if (eq != std::string::npos) out[word.substr(0, eq)] = word.substr(eq + 1);
  }
  return out;
}

inline double Field(const std::map<std::string, std::string>& fields, const std::string& key) {
  const auto it = fields.find(key);
  if (it == fields.end()) Die(1, "overlap: the trainer's line has no " + key);
  return std::strtod(it->second.c_str(), nullptr);
}

inline void* DeviceAlloc(uint64_t bytes, const char* what) {
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
inline double PacedRounds(cudaStream_t stream, uint64_t bytes, Enqueue enqueue, Stop stop,
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

inline Round RunRound(Child& trainer, Copier* copier, bool copy_engine, double pace_gbps = 0) {
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

// The device of an overlap experiment, announced ("stash-bench-gpu <name>: <device>"), with a
// note when its compute mode may refuse the trainer's second process a context.
inline DeviceInfo SelectOverlapDevice(const char* name, const Options& options) {
  DeviceInfo device = SelectDevice(options.device);
  std::printf("stash-bench-gpu %s: %s\n", name, DeviceLine(device).c_str());
  if (device.compute_mode != cudaComputeModeDefault) {
    std::printf(
        "note: compute mode %d is not the default; a second process may not get a "
        "context on this device\n",
        device.compute_mode);
  }
  return device;
}

// The next command line on stdin (without '\n'); false at EOF.
inline bool ReadCommand(std::string* command) {
  command->clear();
  int c = 0;
  while ((c = std::getchar()) != EOF && c != '\n') *command += static_cast<char>(c);
  return c != EOF;
}

}  // namespace stash::bench_gpu

#endif  // STASH_BENCH_GPU_OVERLAP_RIG_H_
