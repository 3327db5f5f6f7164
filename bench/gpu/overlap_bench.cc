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
#include "bench/gpu/overlap_rig.h"

namespace stash::bench_gpu {

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
  const DeviceInfo device = SelectOverlapDevice("overlap", options);
  const int launches = options.iters > 0 ? options.iters : kDefaultLaunches;
  const uint64_t bytes = static_cast<uint64_t>(options.copy_mib) * kMiB;

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
