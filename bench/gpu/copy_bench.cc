// stash-bench-gpu copy: the paging kernels (LaunchStash / LaunchReload of paging_cuda.h) into a
// device pool of 256 KiB pages whose free ring holds a permuted page list, against two baselines
// of the same bytes in the same run: one cudaMemcpyAsync device-to-device (which a driver may
// run on a copy engine, far below what the SMs reach) and a plain SM vector-copy kernel. The
// ratio the target applies to is against the faster of the two. Every copy figure is also given
// as a share of the GPU's memory peak (2 x memory clock x bus width; a copy reads and writes
// each byte, so its DRAM traffic is twice the payload). Plus the host-side cost of LaunchStash's
// kernel launches alone (the daemon's whole per-request cost is stash-bench-request's), and the
// operations per second of small stashes submitted the way the daemon's executor does.
//
// Timing: every batch of iterations sits behind a Gate, so the events measure the GPU running
// the work back to back. Each figure is the median over --iters iterations after a warm-up.
// GB/s = payload bytes / time. Each size is verified once: the reloaded buffer must equal the
// source, byte for byte. Up to the L2 size (50 MiB on an H100: the rows below 64 MiB) a
// baseline's destination stays in L2 from one iteration to the next, while stashes rotate
// through a pool twice the largest size: those rows flatter the baselines, and the table says so
// beside them.
#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench/gpu/bench_kernels.h"
#include "bench/gpu/common.h"
#include "stash/kernels/paging.h"
#include "stash/kernels/paging_cuda.h"

namespace stash::bench_gpu {
namespace {

using kernels::LaunchResult;
using kernels::PageRing;
using kernels::Placement;
using kernels::ReloadLaunch;
using kernels::StashLaunch;
using kernels::StashPlan;

constexpr uint64_t kPageBytes = 256 * kKiB;
constexpr uint64_t kRowBytes = 8 * kKiB;  // a 4096-feature bf16 activation row
constexpr uint64_t kSeed = 1;             // the ring's permutation and the source pattern
constexpr int kDefaultIters = 20;
constexpr int kChunk = 16;         // iterations behind one gate
constexpr int kLaunchCalls = 200;  // LaunchStash calls timed on the host
constexpr double kTargetRatio = 0.9;
constexpr int64_t kTargetFromMiB = 64;
constexpr int kSmallPairs = 1000;  // stash + reload pairs per small-op run
constexpr int kSmallRuns = 5;
constexpr int kSmallWarmupPairs = 100;

void CheckLaunch(const LaunchResult& result, const char* what) {
  if (!result.ok()) {
    Die(1, std::string(what) + " refused: " + kernels::LaunchStatusName(result.status) + ": " +
               result.message);
  }
}

// Device memory owned for the whole run (freed at exit).
template <typename T>
T* DeviceAlloc(uint64_t bytes, const char* what) {
  void* p = nullptr;
  const cudaError_t error = cudaMalloc(&p, bytes);
  if (error != cudaSuccess) {
    Die(1, std::string("cudaMalloc of ") + std::to_string(bytes) + " bytes for the " + what +
               " failed: " + cudaGetErrorString(error));
  }
  return static_cast<T*>(p);
}

// Everything the stash and reload of one size need.
struct Rig {
  uint8_t* pool = nullptr;
  PageRing* ring = nullptr;
  uint64_t pages = 0;
  uint8_t* src = nullptr;
  uint8_t* dst = nullptr;
  int64_t* count = nullptr;
  uint64_t* record = nullptr;
  StashPlan* plan = nullptr;
  unsigned long long* mismatches = nullptr;
  cudaStream_t stream = nullptr;
};

StashLaunch StashArgs(const Rig& rig, uint64_t bytes) {
  StashLaunch args;
  args.d_src = rig.src;
  args.d_count = rig.count;
  args.max_rows = bytes / kRowBytes;
  args.row_bytes = kRowBytes;
  args.page_bytes = kPageBytes;
  args.device = kernels::CudaTier{rig.ring, rig.pool};
  args.d_page_record = rig.record;
  args.d_plan = rig.plan;
  return args;
}

ReloadLaunch ReloadArgs(const Rig& rig, uint64_t bytes) {
  ReloadLaunch args;
  args.d_dst = rig.dst;
  args.d_plan = rig.plan;
  args.d_page_record = rig.record;
  args.max_rows = bytes / kRowBytes;
  args.row_bytes = kRowBytes;
  args.page_bytes = kPageBytes;
  args.device = kernels::CudaTier{rig.ring, rig.pool};
  return args;
}

// Small stashes per second, the way the daemon's cuda executor submits each operation: its
// kernels, the plan copied back to pinned memory (stash) and host functions on the copy stream.
// `host_functions` per operation: 1 is the executor's form (the continuation also wakes CPU
// waiters), 2 the earlier form (a separate wake). A host function blocks the work behind it
// until it returns, so each one costs stream time. Each operation pair is a stash and its
// reload; wall time from the first enqueue until the last host function ran.
double SmallOpsPerSecond(const Rig& rig, uint64_t bytes, StashPlan* pinned_plan, int host_functions,
                         int pairs) {
  static std::atomic<uint64_t> ran{0};
  const auto bump = [](void*) { ran.fetch_add(1, std::memory_order_relaxed); };
  const StashLaunch stash = StashArgs(rig, bytes);
  const ReloadLaunch reload = ReloadArgs(rig, bytes);
  BENCH_CUDA(cudaStreamSynchronize(rig.stream));
  ran.store(0);
  const double t0 = NowSeconds();
  for (int i = 0; i < pairs; ++i) {
    CheckLaunch(kernels::LaunchStash(stash, rig.stream), "LaunchStash");
    BENCH_CUDA(cudaMemcpyAsync(pinned_plan, rig.plan, sizeof(StashPlan), cudaMemcpyDeviceToHost,
                               rig.stream));
    for (int f = 0; f < host_functions; ++f) {
      BENCH_CUDA(cudaLaunchHostFunc(rig.stream, bump, nullptr));
    }
    CheckLaunch(kernels::LaunchReload(reload, rig.stream), "LaunchReload");
    for (int f = 0; f < host_functions; ++f) {
      BENCH_CUDA(cudaLaunchHostFunc(rig.stream, bump, nullptr));
    }
  }
  BENCH_CUDA(cudaStreamSynchronize(rig.stream));
  const double seconds = NowSeconds() - t0;
  if (ran.load() !=
      uint64_t{2} * static_cast<uint64_t>(pairs) * static_cast<uint64_t>(host_functions)) {
    Die(1, "small-op run: host functions ran " + std::to_string(ran.load()) + " times");
  }
  return 2.0 * pairs / seconds;
}

// One stash and reload of `bytes` into a cleared destination; returns "" when the plan placed
// it in the pool, the destination equals the source and the ring has every page free again,
// else what went wrong.
std::string Verify(const Rig& rig, uint64_t bytes) {
  BENCH_CUDA(cudaMemsetAsync(rig.dst, 0, bytes, rig.stream));
  BENCH_CUDA(cudaMemsetAsync(rig.mismatches, 0, sizeof(unsigned long long), rig.stream));
  CheckLaunch(kernels::LaunchStash(StashArgs(rig, bytes), rig.stream), "LaunchStash");
  CheckLaunch(kernels::LaunchReload(ReloadArgs(rig, bytes), rig.stream), "LaunchReload");
  BENCH_CUDA(LaunchCountMismatches(reinterpret_cast<const uint64_t*>(rig.src),
                                   reinterpret_cast<const uint64_t*>(rig.dst), bytes / 8,
                                   rig.mismatches, rig.stream));
  BENCH_CUDA(cudaStreamSynchronize(rig.stream));
  StashPlan plan{};
  PageRing ring{};
  unsigned long long mismatches = 0;
  BENCH_CUDA(cudaMemcpy(&plan, rig.plan, sizeof(plan), cudaMemcpyDeviceToHost));
  BENCH_CUDA(cudaMemcpy(&ring, rig.ring, sizeof(ring), cudaMemcpyDeviceToHost));
  BENCH_CUDA(cudaMemcpy(&mismatches, rig.mismatches, sizeof(mismatches), cudaMemcpyDeviceToHost));
  char why[256];
  if (plan.placement != Placement::kDevice || plan.bytes != bytes) {
    std::snprintf(why, sizeof(why),
                  "plan placement %u bytes %" PRIu64 " (want 1 = device, %" PRIu64 ")",
                  static_cast<unsigned>(plan.placement), plan.bytes, bytes);
    return why;
  }
  if (mismatches != 0) {
    std::snprintf(why, sizeof(why), "%llu of %" PRIu64 " 8-byte words of the reload differ",
                  mismatches, bytes / 8);
    return why;
  }
  if (ring.tail - ring.head != rig.pages) {
    std::snprintf(why, sizeof(why),
                  "ring has %" PRIu64 " free pages after the reload, want %" PRIu64,
                  ring.tail - ring.head, rig.pages);
    return why;
  }
  return "";
}

double GBps(uint64_t bytes, double ms) { return static_cast<double>(bytes) / (ms * 1e6); }

struct SizeResult {
  int64_t mib = 0;
  uint64_t bytes = 0;
  double memcpy_ms = 0, sm_copy_ms = 0, stash_ms = 0, reload_ms = 0;
  std::string verify_error;  // "" = verified
  bool target_applies() const { return mib >= kTargetFromMiB; }
  // The faster baseline: the SM copy kernel, unless the driver's memcpy beats it.
  double baseline_ms() const { return std::min(memcpy_ms, sm_copy_ms); }
  double stash_ratio() const { return baseline_ms() / stash_ms; }
  double reload_ratio() const { return baseline_ms() / reload_ms; }
  double stash_ratio_memcpy() const { return memcpy_ms / stash_ms; }
};

// A copy's DRAM traffic (read and write: twice the payload) as a share of the memory peak;
// NaN when the peak is unknown.
double PeakShare(uint64_t bytes, double ms, double peak_gbps) {
  if (!(peak_gbps > 0)) return std::nan("");
  return 2.0 * static_cast<double>(bytes) / (ms * 1e6) / peak_gbps;
}

std::string Verdict(const SizeResult& r, double ratio) {
  if (!r.target_applies()) return "-";
  return ratio >= kTargetRatio ? "met" : "MISSED";
}

}  // namespace

int RunCopy(const Options& options) {
  const DeviceInfo device = SelectDevice(options.device);
  const int iters = options.iters > 0 ? options.iters : kDefaultIters;
  std::vector<int64_t> sizes = options.sizes_mib;
  const int64_t max_mib = *std::max_element(sizes.begin(), sizes.end());
  const uint64_t max_bytes = static_cast<uint64_t>(max_mib) * kMiB;

  Rig rig;
  const uint64_t pool_bytes = 2 * max_bytes;
  rig.pages = pool_bytes / kPageBytes;
  rig.pool = DeviceAlloc<uint8_t>(pool_bytes, "page pool");
  rig.src = DeviceAlloc<uint8_t>(max_bytes, "source");
  rig.dst = DeviceAlloc<uint8_t>(max_bytes, "destination");
  auto* ids = DeviceAlloc<uint64_t>(rig.pages * sizeof(uint64_t), "ring ids");
  rig.ring = DeviceAlloc<PageRing>(sizeof(PageRing), "ring");
  rig.count = DeviceAlloc<int64_t>(sizeof(int64_t), "count");
  rig.record = DeviceAlloc<uint64_t>(kernels::PagesFor(max_bytes, kPageBytes) * sizeof(uint64_t),
                                     "page record");
  rig.plan = DeviceAlloc<StashPlan>(sizeof(StashPlan), "plan");
  rig.mismatches = DeviceAlloc<unsigned long long>(sizeof(unsigned long long), "mismatch count");
  BENCH_CUDA(cudaStreamCreateWithFlags(&rig.stream, cudaStreamNonBlocking));

  // The free ring: every page, in a permuted order (a pool after some traffic).
  std::vector<uint64_t> host_ids(rig.pages);
  std::iota(host_ids.begin(), host_ids.end(), uint64_t{0});
  std::mt19937_64 rng(kSeed);
  std::shuffle(host_ids.begin(), host_ids.end(), rng);
  const PageRing host_ring{ids, rig.pages, 0, rig.pages};
  BENCH_CUDA(
      cudaMemcpy(ids, host_ids.data(), rig.pages * sizeof(uint64_t), cudaMemcpyHostToDevice));
  BENCH_CUDA(cudaMemcpy(rig.ring, &host_ring, sizeof(host_ring), cudaMemcpyHostToDevice));
  BENCH_CUDA(LaunchFill(reinterpret_cast<uint64_t*>(rig.src), max_bytes / 8, kSeed, rig.stream));
  BENCH_CUDA(cudaStreamSynchronize(rig.stream));
  BENCH_CUDA(cudaDeviceSynchronize());  // the legacy-stream copies above are done too

  std::printf("stash-bench-gpu copy: %s\n", DeviceLine(device).c_str());
  std::printf(
      "pool %" PRIu64 " MiB in %" PRIu64 " KiB pages (ring permuted, seed %" PRIu64
      "), rows of %" PRIu64
      " bytes, count read "
      "from device memory;\nmedian of %d iterations after warm-up, GPU time (events behind a "
      "gate)\n\n",
      pool_bytes / kMiB, kPageBytes / kKiB, kSeed, kRowBytes, iters);

  Gate gate;
  std::vector<SizeResult> results;
  bool all_verified = true;
  for (const int64_t mib : sizes) {
    SizeResult r;
    r.mib = mib;
    r.bytes = static_cast<uint64_t>(mib) * kMiB;
    const auto rows = static_cast<int64_t>(r.bytes / kRowBytes);
    BENCH_CUDA(cudaMemcpyAsync(rig.count, &rows, sizeof(rows), cudaMemcpyHostToDevice, rig.stream));
    BENCH_CUDA(cudaStreamSynchronize(rig.stream));
    r.verify_error = Verify(rig, r.bytes);
    if (!r.verify_error.empty()) {
      all_verified = false;
      std::fprintf(stderr, "stash-bench-gpu: copy: VERIFY FAILED at %" PRId64 " MiB: %s\n", mib,
                   r.verify_error.c_str());
    }
    const StashLaunch stash = StashArgs(rig, r.bytes);
    const ReloadLaunch reload = ReloadArgs(rig, r.bytes);
    // Warm-up: two of each, untimed.
    for (int i = 0; i < 2; ++i) {
      BENCH_CUDA(cudaMemcpyAsync(rig.dst, rig.src, r.bytes, cudaMemcpyDeviceToDevice, rig.stream));
      BENCH_CUDA(LaunchVectorCopy(rig.dst, rig.src, r.bytes, device.sm_count, rig.stream));
      CheckLaunch(kernels::LaunchStash(stash, rig.stream), "LaunchStash");
      CheckLaunch(kernels::LaunchReload(reload, rig.stream), "LaunchReload");
    }
    BENCH_CUDA(cudaStreamSynchronize(rig.stream));
    const auto baseline_ms = TimeGated(gate, rig.stream, iters, 2, [&](int phase) {
      if (phase == 0) {
        BENCH_CUDA(
            cudaMemcpyAsync(rig.dst, rig.src, r.bytes, cudaMemcpyDeviceToDevice, rig.stream));
      } else {
        BENCH_CUDA(LaunchVectorCopy(rig.dst, rig.src, r.bytes, device.sm_count, rig.stream));
      }
    });
    const auto paging_ms = TimeGated(gate, rig.stream, iters, 2, [&](int phase) {
      if (phase == 0) {
        CheckLaunch(kernels::LaunchStash(stash, rig.stream), "LaunchStash");
      } else {
        CheckLaunch(kernels::LaunchReload(reload, rig.stream), "LaunchReload");
      }
    });
    r.memcpy_ms = Median(baseline_ms[0]);
    r.sm_copy_ms = Median(baseline_ms[1]);
    r.stash_ms = Median(paging_ms[0]);
    r.reload_ms = Median(paging_ms[1]);
    results.push_back(r);
  }

  // The host cost of one LaunchStash call, on the smallest size (it does not depend on the
  // size: three kernel launches and the argument checks). Not the daemon's cost per request,
  // which also sets the device, copies the plan back, raises the done counter and adds a host
  // function: stash-bench-request times that, through the daemon's own code.
  const uint64_t launch_bytes =
      static_cast<uint64_t>(*std::min_element(sizes.begin(), sizes.end())) * kMiB;
  const auto launch_rows = static_cast<int64_t>(launch_bytes / kRowBytes);
  BENCH_CUDA(cudaMemcpyAsync(rig.count, &launch_rows, sizeof(launch_rows), cudaMemcpyHostToDevice,
                             rig.stream));
  BENCH_CUDA(cudaStreamSynchronize(rig.stream));
  std::vector<double> stash_launch_us;
  std::vector<double> reload_launch_us;
  const StashLaunch launch_stash = StashArgs(rig, launch_bytes);
  const ReloadLaunch launch_reload = ReloadArgs(rig, launch_bytes);
  for (int i = 0; i < kLaunchCalls; ++i) {
    const double t0 = NowSeconds();
    const LaunchResult stashed = kernels::LaunchStash(launch_stash, rig.stream);
    const double t1 = NowSeconds();
    const LaunchResult reloaded = kernels::LaunchReload(launch_reload, rig.stream);
    const double t2 = NowSeconds();
    CheckLaunch(stashed, "LaunchStash");
    CheckLaunch(reloaded, "LaunchReload");
    stash_launch_us.push_back((t1 - t0) * 1e6);
    reload_launch_us.push_back((t2 - t1) * 1e6);
    if (i % kChunk == kChunk - 1) BENCH_CUDA(cudaStreamSynchronize(rig.stream));
  }
  BENCH_CUDA(cudaStreamSynchronize(rig.stream));
  const double launch_median = Median(stash_launch_us);

  // Small stashes (one row) per second, with one and with two host functions per operation.
  StashPlan* pinned_plan = nullptr;
  BENCH_CUDA(cudaMallocHost(reinterpret_cast<void**>(&pinned_plan), sizeof(StashPlan)));
  const int64_t one_row = 1;
  BENCH_CUDA(
      cudaMemcpyAsync(rig.count, &one_row, sizeof(one_row), cudaMemcpyHostToDevice, rig.stream));
  SmallOpsPerSecond(rig, kRowBytes, pinned_plan, 1, kSmallWarmupPairs);  // warm-up
  std::vector<double> small_one, small_two;
  for (int i = 0; i < kSmallRuns; ++i) {
    small_one.push_back(SmallOpsPerSecond(rig, kRowBytes, pinned_plan, 1, kSmallPairs));
    small_two.push_back(SmallOpsPerSecond(rig, kRowBytes, pinned_plan, 2, kSmallPairs));
  }
  BENCH_CUDA(cudaFreeHost(pinned_plan));
  const double small_one_median = Median(small_one);
  const double small_two_median = Median(small_two);

  // The table: GB/s of payload, and in brackets the share of the memory peak.
  const double peak = device.memory_peak_gbps;
  const int l2_bytes = [&] {
    int v = 0;
    BENCH_CUDA(cudaDeviceGetAttribute(&v, cudaDevAttrL2CacheSize, device.index));
    return v;
  }();
  std::printf(
      "GB/s of payload [share of the %.0f GB/s memory peak, counting read and write]; "
      "ratio = the faster baseline's time / the stash's (or reload's)\n",
      peak);
  std::printf("%8s | %15s | %15s | %15s | %6s | %15s | %6s | %-16s | %s\n", "size MiB",
              "memcpy GB/s", "SM copy GB/s", "stash GB/s", "ratio", "reload GB/s", "ratio",
              "target (>=0.90x)", "verified");
  std::printf(
      "---------+-----------------+-----------------+-----------------+--------+---------------"
      "--+--------+------------------+---------\n");
  double min_stash_ratio = 1e300;
  double min_reload_ratio = 1e300;
  double min_stash_ratio_memcpy = 1e300;
  bool targets_met = true;
  bool any_l2_row = false;
  std::vector<std::string> size_json;
  const auto cell = [&](uint64_t bytes, double ms) {
    char text[64];
    std::snprintf(text, sizeof(text), "%7.1f [%4.0f%%]", GBps(bytes, ms),
                  100.0 * PeakShare(bytes, ms, peak));
    return std::string(text);
  };
  for (const SizeResult& r : results) {
    const std::string verdict = r.target_applies() ? "stash " + Verdict(r, r.stash_ratio()) +
                                                         ", reload " + Verdict(r, r.reload_ratio())
                                                   : "-";
    // A baseline's destination fits in L2 and stays there between iterations (with the 50 MiB
    // L2 of an H100: the rows below 64 MiB, where no target applies).
    const bool l2 = r.bytes <= static_cast<uint64_t>(l2_bytes);
    any_l2_row = any_l2_row || l2;
    std::printf(
        "%8" PRId64 " | %15s | %15s | %15s | %5.2fx | %15s | %5.2fx | %-16s | %s%s\n", r.mib,
        cell(r.bytes, r.memcpy_ms).c_str(), cell(r.bytes, r.sm_copy_ms).c_str(),
        cell(r.bytes, r.stash_ms).c_str(), r.stash_ratio(), cell(r.bytes, r.reload_ms).c_str(),
        r.reload_ratio(), verdict.c_str(), r.verify_error.empty() ? "yes" : "NO",
        l2 ? "  (L2: the baselines' destination stays cached, the stash's pages do not)" : "");
    if (r.target_applies()) {
      min_stash_ratio = std::min(min_stash_ratio, r.stash_ratio());
      min_reload_ratio = std::min(min_reload_ratio, r.reload_ratio());
      min_stash_ratio_memcpy = std::min(min_stash_ratio_memcpy, r.stash_ratio_memcpy());
      targets_met =
          targets_met && r.stash_ratio() >= kTargetRatio && r.reload_ratio() >= kTargetRatio;
    }
    size_json.push_back(json::Object({
        {"size_mib", json::Int(r.mib)},
        {"bytes", json::Int(static_cast<int64_t>(r.bytes))},
        {"memcpy_us", json::Num(r.memcpy_ms * 1e3)},
        {"memcpy_gbps", json::Num(GBps(r.bytes, r.memcpy_ms))},
        {"memcpy_peak_share", json::Num(PeakShare(r.bytes, r.memcpy_ms, peak))},
        {"sm_copy_us", json::Num(r.sm_copy_ms * 1e3)},
        {"sm_copy_gbps", json::Num(GBps(r.bytes, r.sm_copy_ms))},
        {"sm_copy_peak_share", json::Num(PeakShare(r.bytes, r.sm_copy_ms, peak))},
        {"baseline", json::Str(r.sm_copy_ms <= r.memcpy_ms ? "sm_copy" : "memcpy")},
        {"stash_us", json::Num(r.stash_ms * 1e3)},
        {"stash_gbps", json::Num(GBps(r.bytes, r.stash_ms))},
        {"stash_peak_share", json::Num(PeakShare(r.bytes, r.stash_ms, peak))},
        {"stash_ratio", json::Num(r.stash_ratio())},
        {"stash_ratio_memcpy", json::Num(r.stash_ratio_memcpy())},
        {"reload_us", json::Num(r.reload_ms * 1e3)},
        {"reload_gbps", json::Num(GBps(r.bytes, r.reload_ms))},
        {"reload_peak_share", json::Num(PeakShare(r.bytes, r.reload_ms, peak))},
        {"reload_ratio", json::Num(r.reload_ratio())},
        {"baselines_in_l2", json::Bool(l2)},
        {"target_ratio", r.target_applies() ? json::Num(kTargetRatio) : json::Null()},
        {"stash_target_met",
         r.target_applies() ? json::Bool(r.stash_ratio() >= kTargetRatio) : json::Null()},
        {"reload_target_met",
         r.target_applies() ? json::Bool(r.reload_ratio() >= kTargetRatio) : json::Null()},
        {"verified", json::Bool(r.verify_error.empty())},
        {"verify_error", json::Str(r.verify_error)},
    }));
  }
  if (any_l2_row) {
    std::printf(
        "(L2) the baselines copy to the same destination each iteration, and up to %d MiB "
        "it stays in L2, while each stash takes other pool pages: those rows flatter the "
        "baselines.\n",
        l2_bytes / static_cast<int>(kMiB));
  }
  const bool have_target_sizes = min_stash_ratio < 1e300;
  const SizeResult& largest =
      *std::max_element(results.begin(), results.end(),
                        [](const SizeResult& a, const SizeResult& b) { return a.mib < b.mib; });
  std::printf(
      "\nLaunchStash host cost, its kernel launches only (the daemon's whole cost per request is "
      "stash-bench-request's): median %.2f us, p90 %.2f us over %d calls\nLaunchReload host "
      "cost: median %.2f us\n",
      launch_median, Percentile(stash_launch_us, 0.9), kLaunchCalls, Median(reload_launch_us));
  std::printf(
      "small stashes (%" PRIu64
      " bytes; stash + reload as the daemon submits them): %.0f ops/s "
      "with one host function per operation, %.0f ops/s with two (median of %d runs of %d)\n",
      kRowBytes, small_one_median, small_two_median, kSmallRuns, 2 * kSmallPairs);
  if (gate.timeouts() > 0) {
    std::printf("warning: %d timing batches ran without their gate (they include launch gaps)\n",
                gate.timeouts());
  }
  if (!all_verified) std::printf("\nVERIFY FAILED: see the messages above\n");

  const std::string report = json::PrettyObject({
      {"bench", json::Str("copy")},
      {"device", DeviceJson(device)},
      {"config", json::Object({{"page_bytes", json::Int(kPageBytes)},
                               {"pool_bytes", json::Int(static_cast<int64_t>(pool_bytes))},
                               {"row_bytes", json::Int(kRowBytes)},
                               {"iters", json::Int(iters)},
                               {"seed", json::Int(kSeed)},
                               {"target_ratio", json::Num(kTargetRatio)},
                               {"target_from_mib", json::Int(kTargetFromMiB)},
                               {"l2_bytes", json::Int(l2_bytes)}})},
      {"sizes", json::Array(size_json)},
      {"launch", json::Object({{"stash_us", json::Summary(stash_launch_us)},
                               {"reload_us", json::Summary(reload_launch_us)},
                               {"calls", json::Int(kLaunchCalls)}})},
      {"small_ops", json::Object({{"bytes", json::Int(kRowBytes)},
                                  {"ops_per_run", json::Int(2 * kSmallPairs)},
                                  {"one_host_function_ops_per_s", json::Summary(small_one)},
                                  {"two_host_functions_ops_per_s", json::Summary(small_two)}})},
      {"gate_timeouts", json::Int(gate.timeouts())},
      {"summary",
       json::Object(
           {{"stash_ratio_min_from_64mib",
             have_target_sizes ? json::Num(min_stash_ratio) : json::Null()},
            {"reload_ratio_min_from_64mib",
             have_target_sizes ? json::Num(min_reload_ratio) : json::Null()},
            {"ratio_target_met", have_target_sizes ? json::Bool(targets_met) : json::Null()},
            {"stash_ratio_memcpy_min_from_64mib",
             have_target_sizes ? json::Num(min_stash_ratio_memcpy) : json::Null()},
            {"hbm_peak_gbps", peak > 0 ? json::Num(peak) : json::Null()},
            {"largest_mib", json::Int(largest.mib)},
            {"stash_hbm_share_largest",
             json::Num(PeakShare(largest.bytes, largest.stash_ms, peak))},
            {"reload_hbm_share_largest",
             json::Num(PeakShare(largest.bytes, largest.reload_ms, peak))},
            {"sm_copy_hbm_share_largest",
             json::Num(PeakShare(largest.bytes, largest.sm_copy_ms, peak))},
            {"memcpy_hbm_share_largest",
             json::Num(PeakShare(largest.bytes, largest.memcpy_ms, peak))},
            {"launch_stash_us_median", json::Num(launch_median)},
            {"small_ops_per_s_median", json::Num(small_one_median)},
            {"small_ops_per_s_two_host_functions_median", json::Num(small_two_median)},
            {"verified", json::Bool(all_verified)}})},
      {"ok", json::Bool(all_verified)},
  });
  WriteJsonFile(options.json_path, report);
  return all_verified ? 0 : 1;
}

}  // namespace stash::bench_gpu
