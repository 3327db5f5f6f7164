// stash-bench-gpu mapped-overlap: overlap_bench.cc's experiment with mapped mode's copier inside
// the trainer (the GPU check's step 5), beside the same kernel copier rounds.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "bench/gpu/mapped_rig.h"
#include "bench/gpu/overlap_rig.h"

namespace stash::bench_gpu {

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
// Everything runs three times: a trainer child with CUDA_DEVICE_MAX_CONNECTIONS unset, one with
// it set to 1 (Megatron's setting; read when the child's context is created), and one with it
// unset whose side stream has the device's greatest priority (the block scheduler then gives
// the copier's blocks the SMs the trainer's blocks free first).
namespace {

constexpr int kTrainerAhead = 8;
constexpr const char* kConnectionsVariable = "CUDA_DEVICE_MAX_CONNECTIONS";
// Set (to anything) in the trainer child: its side stream gets the greatest priority.
constexpr const char* kPriorityVariable = "STASH_BENCH_SIDE_STREAM_PRIORITY_GREATEST";

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
  std::string connections;     // CUDA_DEVICE_MAX_CONNECTIONS in the trainer; "" = unset
  bool high_priority = false;  // the side stream has the device's greatest priority
  double launch_ms = 0;
  bool verified = false;  // the trainer's verify round, and no overflow in any mapped round
  int trainer_status = -1;
  double copier_alone_mapped_gbps = 0;
  Round alone, mapped, kernel, paced_mapped, paced_kernel, alone_again;
};

MappedVariant RunMappedVariant(const Options& options, const std::string& connections,
                               bool high_priority, Copier& copier, double alone_kernel_gbps,
                               double* paced_gbps) {
  MappedVariant v;
  v.connections = connections;
  v.high_priority = high_priority;
  const int launches = options.iters > 0 ? options.iters : kDefaultLaunches;
  std::unique_ptr<Child> trainer;
  {
    const ScopedEnv env(kConnectionsVariable, connections);
    const ScopedEnv priority(kPriorityVariable, high_priority ? "1" : "");
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

  v.alone = RunRound(*trainer, nullptr, false);
  v.mapped = RunMappedRound(*trainer, 0);
  v.kernel = RunRound(*trainer, &copier, false);
  // Every copier, in every variant, paced to the same offered load, fixed by the first variant:
  // half the slower one's flat-out rate beside the trainer. (Half its rate alone, as `overlap`
  // paces, is more than either reaches beside a compute-bound trainer on an H200: such "paced"
  // rounds only repeat the flat-out ones.) Without a rate (a copier that moved nothing), half
  // the slower one alone.
  if (*paced_gbps <= 0) {
    const double beside = std::min(v.mapped.copier_gbps, v.kernel.copier_gbps);
    *paced_gbps =
        0.5 * (beside > 0 ? beside : std::min(alone_kernel_gbps, v.copier_alone_mapped_gbps));
  }
  v.paced_mapped = RunMappedRound(*trainer, *paced_gbps);
  v.paced_kernel = RunRound(*trainer, &copier, false, *paced_gbps);
  v.alone_again = RunRound(*trainer, nullptr, false);
  v.verified = v.verified && !v.mapped.overflowed && !v.paced_mapped.overflowed;
  trainer->WriteLine("quit");
  v.trainer_status = trainer->Wait(30'000);
  return v;
}

void PrintVariant(const MappedVariant& v) {
  std::printf("\nCUDA_DEVICE_MAX_CONNECTIONS %s in the trainer%s; its kernel %.3f ms per launch\n",
              v.connections.empty() ? "unset (the driver's default)" : v.connections.c_str(),
              v.high_priority ? ", the copier's side stream at the greatest priority" : "",
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
      {"side_stream_greatest_priority", json::Bool(v.high_priority)},
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
  if (std::getenv(kPriorityVariable) != nullptr) {
    int least = 0, greatest = 0;
    BENCH_CUDA(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    BENCH_CUDA(cudaStreamCreateWithPriority(&side, cudaStreamNonBlocking, greatest));
  } else {
    BENCH_CUDA(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  }
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
  const DeviceInfo device = SelectOverlapDevice("mapped-overlap", options);
  const int launches = options.iters > 0 ? options.iters : kDefaultLaunches;
  const uint64_t bytes = static_cast<uint64_t>(options.copy_mib) * kMiB;
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
      RunMappedVariant(options, "", false, copier, alone_kernel_gbps, &paced_gbps);
  const MappedVariant one =
      RunMappedVariant(options, "1", false, copier, alone_kernel_gbps, &paced_gbps);
  const MappedVariant priority =
      RunMappedVariant(options, "", true, copier, alone_kernel_gbps, &paced_gbps);

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
  PrintVariant(priority);
  const bool verified = kernel_verified && standard.verified && one.verified && priority.verified;
  const bool ok = verified && standard.trainer_status == 0 && one.trainer_status == 0 &&
                  priority.trainer_status == 0;
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
      {"greatest_priority", VariantJson(priority)},
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
           {"slowdown_mapped_greatest_priority",
            json::Num(Slowdown(priority.paced_mapped, priority.alone))},
           {"mapped_gbps_greatest_priority", json::Num(priority.mapped.copier_gbps)},
           {"trainer_ms_per_gb_mapped_greatest_priority",
            json::Num(MsPerGb(priority.mapped, priority.alone))},
           {"verified", json::Bool(verified)},
       })},
      {"ok", json::Bool(ok)},
  });
  WriteJsonFile(options.json_path, report);
  return ok ? 0 : 1;
}

}  // namespace stash::bench_gpu
