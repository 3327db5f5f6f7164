#include "bench/phase_sharing.h"

#include <algorithm>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <utility>

#include <grpcpp/grpcpp.h>

#include "bench/sharing_model.h"
#include "common/macros.h"
#include "stash/v1/stash.grpc.pb.h"

namespace stash::bench {
namespace {

constexpr char kSection[] = "8";
constexpr double kMegatronFactor = 1.10;  // moe_paged_stash_buffer_size_factor_cuda default
constexpr uint32_t kNodeGpus = 8;

struct Scenario {
  std::string name;
  ScheduleConfig schedule;
};

std::vector<Scenario> Scenarios() {
  std::vector<Scenario> out(3);
  out[0].name = "1F1B PP4, 8 microbatches, 4 MoE layers/stage; node = stage 0, EP8";
  out[0].schedule = {4, 1, 8, 4, 1};
  out[1].name = "interleaved 1F1B PP4 x VP2, 8 microbatches, 2+2 MoE layers; node = stage 0, EP8";
  out[1].schedule = {4, 2, 8, 2, 1};
  out[2].name = "1F1B PP4, 8 microbatches, 4 MoE layers/stage; node = stages 0+1, EP4 each";
  out[2].schedule = {4, 1, 8, 4, 2};
  return out;
}

std::string Str(uint64_t v) { return std::to_string(v); }

// `count` per 1,000 steps: whole numbers from 100 on.
std::string PerThousand(uint64_t count, uint64_t steps) {
  const double v =
      steps == 0 ? 0 : 1000.0 * static_cast<double>(count) / static_cast<double>(steps);
  return Fixed(v, v >= 100 ? 0 : 1);
}

PoolSetup PerRankPools(const NodeTrace& trace, double factor, uint64_t host_pages) {
  PoolSetup setup;
  for (uint32_t r = 0; r < trace.Ranks(); ++r) {
    setup.pool_pages.push_back(MegatronRankPages(trace, r, factor));
    setup.rank_pool.push_back(r);
  }
  setup.host_pages = host_pages;
  return setup;
}

PoolSetup SharedPool(const NodeTrace& trace, uint64_t pages, uint64_t host_pages) {
  PoolSetup setup;
  setup.pool_pages = {pages};
  setup.rank_pool.assign(trace.Ranks(), 0);
  setup.host_pages = host_pages;
  return setup;
}

// The factor Megatron's avg-based sizing needs for no rank to overflow: the hottest rank's peak
// over its avg-based peak.
double ZeroOverflowFactor(const NodeTrace& trace, const Peaks& peaks, const PoolSetup& megatron) {
  double factor = 0;
  for (uint32_t r = 0; r < trace.Ranks(); ++r) {
    factor = std::max(factor, kMegatronFactor * static_cast<double>(peaks.rank_peak_pages[r]) /
                                  static_cast<double>(megatron.pool_pages[r]));
  }
  return factor;
}

// ---- the model ------------------------------------------------------------------------------

void ModelRows(const Scenario& scenario, const DriftConfig& routing, uint32_t steps,
               std::vector<Row>& rows) {
  NodeConfig node;
  node.node_gpus = kNodeGpus;
  node.steps = steps;
  const NodeTrace trace = SimulateNode(scenario.schedule, routing, node);
  const Peaks peaks = MeasurePeaks(trace);
  const auto bytes = [&](uint64_t pages) {
    return static_cast<double>(pages) * static_cast<double>(node.page_bytes);
  };
  rows.push_back({kSection,
                  scenario.name + ", " + Str(steps) +
                      " steps: sum of per-rank peaks (pools per rank, zero overflows); one step's "
                      "mean " +
                      Ratio(peaks.mean_step_ratio),
                  Gib(bytes(peaks.sum_of_rank_peaks)),
                  "peak of the node's sum " + Gib(bytes(peaks.node_peak_pages)),
                  Ratio(static_cast<double>(peaks.sum_of_rank_peaks) /
                        static_cast<double>(peaks.node_peak_pages)),
                  "", Verdict::kNoTarget});

  const PoolSetup megatron = PerRankPools(trace, kMegatronFactor, 0);
  const uint64_t megatron_total =
      std::accumulate(megatron.pool_pages.begin(), megatron.pool_pages.end(), uint64_t{0});
  const PoolOutcome per_rank = SimulatePools(trace, megatron);
  const uint64_t shared = SharedPagesFor(trace, per_rank.steps_with_overflow);
  const PoolOutcome same = SimulatePools(trace, SharedPool(trace, shared, 0));
  const std::string megatron_text =
      "8 pools of 1.10x avg-based peak " + Gib(bytes(megatron_total)) + ", overflow in " +
      PerThousand(per_rank.steps_with_overflow, per_rank.steps) + " steps/1000 (" +
      PerThousand(per_rank.overflows, per_rank.steps) + " stashes)";
  rows.push_back({kSection,
                  "  one shared pool with no more overflowing steps (" +
                      PerThousand(same.steps_with_overflow, same.steps) + "/1000, " +
                      PerThousand(same.overflows, same.steps) + " stashes)",
                  Gib(bytes(shared)), megatron_text,
                  Ratio(static_cast<double>(shared) / static_cast<double>(megatron_total)), "",
                  Verdict::kNoTarget});
  // Megatron sizes every rank of a stage alike: for zero overflows its factor must cover the
  // hottest rank's peak, and every rank then holds that much.
  const double factor = ZeroOverflowFactor(trace, peaks, megatron);
  const double uniform = static_cast<double>(megatron_total) * factor / kMegatronFactor;
  rows.push_back(
      {kSection,
       "  one shared pool with zero overflows (the node's peak; it is " +
           Ratio(static_cast<double>(peaks.node_peak_pages) / static_cast<double>(megatron_total)) +
           " of Megatron's default 8 pools)",
       Gib(bytes(peaks.node_peak_pages)),
       "8 pools of factor " + Fixed(factor, 2) + " (zero overflows) " +
           Gib(uniform * static_cast<double>(node.page_bytes)),
       Ratio(static_cast<double>(peaks.node_peak_pages) / uniform), "", Verdict::kNoTarget});
}

// One row: how the saving moves with the routing assumption, on `scenario`.
void SensitivityRow(const Scenario& scenario, const std::string& what, const DriftConfig& routing,
                    uint32_t steps, std::vector<Row>& rows) {
  NodeConfig node;
  node.node_gpus = kNodeGpus;
  node.steps = steps;
  const NodeTrace trace = SimulateNode(scenario.schedule, routing, node);
  const Peaks peaks = MeasurePeaks(trace);
  const PoolSetup megatron = PerRankPools(trace, kMegatronFactor, 0);
  const PoolOutcome per_rank = SimulatePools(trace, megatron);
  const double factor = ZeroOverflowFactor(trace, peaks, megatron);
  const auto bytes = [&](uint64_t pages) {
    return static_cast<double>(pages) * static_cast<double>(node.page_bytes);
  };
  rows.push_back(
      {kSection,
       "  first scenario, " + what + ": sum of per-rank peaks (Megatron 1.10x overflows " +
           PerThousand(per_rank.steps_with_overflow, per_rank.steps) +
           " steps/1000; zero needs factor " + Fixed(factor, 2) + ", " +
           Ratio(factor / kMegatronFactor *
                 static_cast<double>(std::accumulate(megatron.pool_pages.begin(),
                                                     megatron.pool_pages.end(), uint64_t{0})) /
                 static_cast<double>(peaks.node_peak_pages)) +
           " of the node's peak)",
       Gib(bytes(peaks.sum_of_rank_peaks)),
       "peak of the node's sum " + Gib(bytes(peaks.node_peak_pages)),
       Ratio(static_cast<double>(peaks.sum_of_rank_peaks) /
             static_cast<double>(peaks.node_peak_pages)),
       "", Verdict::kNoTarget});
}

// ---- the real daemon ------------------------------------------------------------------------

struct RankRun {
  uint64_t stashes = 0, overflows = 0, spills = 0;
  uint64_t peers = 0;            // placed in another device's pool (shared, not spilled)
  uint64_t pool_high_water = 0;  // shared pool: its high water; own pools: their sum
  uint64_t leftover = 0;         // pages still live at the end (must be 0)
  uint64_t used_at_step = 0;     // most pool pages in use right after a counted BeginStep
  // --mode=mapped-group: the group's most pages claimed at once, and the most chunks' pages it
  // held (the daemon's GetStats, read before the ranks end).
  uint64_t group_high_water = 0;
  uint64_t group_pages_held = 0;
  uint64_t group_pages_held_last = 0;  // at the last step
};

// The group's row of GetStats (mapped-group runs): its claimed high water and pages held.
Status ReadGroup(const std::string& socket, RankRun* out) {
  auto stub = v1::StashService::NewStub(
      grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  v1::GetStatsResponse stats;
  const grpc::Status s = stub->GetStats(&context, v1::GetStatsRequest(), &stats);
  if (!s.ok()) return UnavailableError("GetStats: " + s.error_message());
  for (const v1::GroupStats& g : stats.groups()) {
    out->group_high_water = std::max(out->group_high_water, g.pages_claimed_high_water());
    uint64_t held = 0;
    for (const v1::GroupTierStats& t : g.tiers()) held += t.pages();
    out->group_pages_held = std::max(out->group_pages_held, held);
    out->group_pages_held_last = held;
  }
  return Status::Ok();
}

// Runs 8 rank processes against `socket` through every step of `trace`, in lock step: all
// ranks begin each step together, and each instant of the schedule is one round (the reloads
// of that instant first, then its stashes), every rank's operations of a round answered before
// the next round starts.
StatusOr<RankRun> DriveRanks(Env& env, const NodeTrace& trace, const std::string& socket,
                             const std::string& mode, bool own_devices, uint32_t warmup) {
  const uint32_t ranks = trace.Ranks();
  const std::string log = env.dir + "/workers.log";
  std::vector<std::unique_ptr<Child>> workers;
  for (uint32_t r = 0; r < ranks; ++r) {
    STASH_ASSIGN_OR_RETURN(
        auto w, SpawnWorker(env, {"--task=rank", "--socket=" + socket, "--mode=" + mode,
                                  "--device=" + Str(own_devices ? r : 0), "--rank=" + Str(r),
                                  "--row-bytes=" + Str(trace.node.bytes_per_token),
                                  "--max-rows=" + Str(trace.routing.BudgetTokens()),
                                  "--warmup=" + Str(warmup)}));
    workers.push_back(std::move(w));
  }
  auto expect = [&](Child& w, const std::string& want) -> Status {
    STASH_ASSIGN_OR_RETURN(const std::string line, w.ReadLine(kWorkerTimeoutMs));
    if (line != want) return InternalError(w.name() + " said '" + line + "'" + Tail(log, 5));
    return Status::Ok();
  };
  for (auto& w : workers) STASH_RETURN_IF_ERROR(expect(*w, "ready"));

  const std::vector<NodeEvent> events = StepEvents(trace);
  RankRun group;  // the group's figures (mapped-group)
  for (uint32_t step = 0; step < trace.tokens.size(); ++step) {
    for (auto& w : workers) STASH_RETURN_IF_ERROR(w->WriteLine("b " + Str(step)));
    for (auto& w : workers) STASH_RETURN_IF_ERROR(expect(*w, "ok"));
    for (size_t i = 0; i < events.size();) {
      size_t j = i;
      std::map<uint32_t, std::string> ops;
      while (j < events.size() && events[j].time == events[i].time &&
             events[j].reload == events[i].reload) {
        const NodeEvent& e = events[j];
        std::string& line = ops[e.rank];
        if (line.empty()) line = "o";
        line += e.reload
                    ? " r" + Str(e.slot)
                    : " s" + Str(e.slot) + ":" + Str(trace.tokens[step][e.slot * ranks + e.rank]);
        ++j;
      }
      for (const auto& [rank, line] : ops) STASH_RETURN_IF_ERROR(workers[rank]->WriteLine(line));
      for (const auto& [rank, line] : ops) STASH_RETURN_IF_ERROR(expect(*workers[rank], "ok"));
      i = j;
    }
    if (mode == "mapped-group" && step >= warmup) STASH_RETURN_IF_ERROR(ReadGroup(socket, &group));
  }
  RankRun out = group;
  for (auto& w : workers) STASH_RETURN_IF_ERROR(w->WriteLine("end"));
  for (auto& w : workers) {
    STASH_ASSIGN_OR_RETURN(Fields f, AwaitResult(*w, log));
    out.stashes += static_cast<uint64_t>(f["stashes"]);
    out.overflows += static_cast<uint64_t>(f["overflows"]);
    out.spills += static_cast<uint64_t>(f["spills"]);
    out.peers += static_cast<uint64_t>(f["peers"]);
    out.leftover += static_cast<uint64_t>(f["pages_leftover"]);
    out.used_at_step =
        std::max(out.used_at_step, static_cast<uint64_t>(f["pool_used_at_step_max"]));
    const auto high = static_cast<uint64_t>(f["pool_high_water"]);
    out.pool_high_water =
        own_devices ? out.pool_high_water + high : std::max(out.pool_high_water, high);
  }
  for (auto& w : workers) w->Wait(10000);
  if (out.leftover != 0) {
    return InternalError(Str(out.leftover) + " pages still live after the last step");
  }
  return out;
}

std::string Counts(const RankRun& r, uint64_t steps) {
  return PerThousand(r.overflows, steps) + " overflows, " + PerThousand(r.spills, steps) +
         " spills";
}
std::string Counts(const PoolOutcome& o) {
  return PerThousand(o.overflows, o.steps) + " overflows, " + PerThousand(o.spills, o.steps) +
         " spills";
}

// Stashes that did not stay in device memory, a over b ("-" when b had none).
std::string MissRatio(const RankRun& a, const RankRun& b) {
  const uint64_t bottom = b.overflows + b.spills;
  if (bottom == 0) return a.overflows + a.spills == 0 ? "1.00x" : "-";
  return Ratio(static_cast<double>(a.overflows + a.spills) / static_cast<double>(bottom));
}

Status DaemonRows(Env& env, const Scenario& scenario, const DriftConfig& routing, uint32_t steps,
                  uint32_t warmup, std::vector<Row>& rows) {
  // A token is 4 bytes and a page 4 KiB (1,024 tokens): the pools stay a few MiB, so 8 ranks'
  // copies cost little next to the lock-step rounds. The model runs at the same scale.
  NodeConfig node;
  node.node_gpus = kNodeGpus;
  node.bytes_per_token = 4;
  node.page_bytes = 4 * kKiB;
  node.steps = warmup + steps;
  const NodeTrace trace = SimulateNode(scenario.schedule, routing, node);
  const Peaks peaks = MeasurePeaks(trace);
  const uint64_t page = node.page_bytes;
  const uint64_t rank_pages = MegatronRankPages(trace, 0, kMegatronFactor);
  for (uint32_t r = 1; r < trace.Ranks(); ++r) {
    if (MegatronRankPages(trace, r, kMegatronFactor) != rank_pages) {
      return InternalError("the daemon runs need one stage on the node (one pool size)");
    }
  }
  const uint64_t total = kNodeGpus * rank_pages;
  const uint64_t host = total / 8;
  const std::vector<std::string> common = {"--page-bytes=" + Str(page),
                                           "--host-tier-bytes=" + Str(host * page)};
  const std::string where = Str(steps) + " steps after " + Str(warmup) + " warm-up";
  const PoolOutcome model_rank =
      SimulatePools(trace, PerRankPools(trace, kMegatronFactor, host), warmup);
  const PoolOutcome model_shared = SimulatePools(trace, SharedPool(trace, total, host), warmup);

  auto run = [&](const std::vector<std::string>& flags, const std::string& mode,
                 bool own) -> StatusOr<RankRun> {
    STASH_ASSIGN_OR_RETURN(auto daemon, Daemon::Start(env, flags));
    return DriveRanks(env, trace, daemon->socket(), mode, own, warmup);
  };
  std::vector<std::string> flags = common;
  flags.emplace_back("--devices=8");
  flags.push_back("--pool-bytes=" + Str(rank_pages * page));
  const std::vector<std::string> gpu_shaped = flags;  // peer placement on: the defaults
  // Pools per rank: no pool lends to another.
  flags.emplace_back("--copy-peer-tier=false");
  Progress("sharing: stashd, 8 pools of Megatron's size, 8 rank processes, " + where);
  STASH_ASSIGN_OR_RETURN(const RankRun own, run(flags, "daemon-copy", true));
  rows.push_back({kSection,
                  "stashd, 8 rank processes, " + where +
                      ", per 1,000 steps: 8 pools of 1.10x "
                      "avg-based peak (" +
                      SizeName(rank_pages * page) + " each), host tier " + SizeName(host * page),
                  Counts(own, steps), "model " + Counts(model_rank), "", "", Verdict::kNoTarget});

  // GPU-shaped: the same 8 pools, one per device, with the daemon's defaults: a daemon-copy
  // stash its own pool cannot hold goes to another device's spare pages (the peer tier), and
  // mapped ranks in one group claim free pages of the group's chunks on any device.
  auto peer_counts = [&](const RankRun& r) {
    return Counts(r, steps) + " (" + PerThousand(r.peers, steps) + " on another device)";
  };
  Progress("sharing: stashd, GPU-shaped, 8 devices, daemon-copy with the peer tier, " + where);
  STASH_ASSIGN_OR_RETURN(const RankRun gpu_copy, run(gpu_shaped, "daemon-copy", true));
  rows.push_back({kSection,
                  "  GPU-shaped, 8 devices (the same 8 pools, each rank on its own): daemon-copy, "
                  "peer tier on (the default)",
                  peer_counts(gpu_copy), "per-rank pools " + Counts(own, steps),
                  MissRatio(gpu_copy, own), "", Verdict::kNoTarget});
  Progress("sharing: stashd, GPU-shaped, 8 devices, mapped ranks in one group, " + where);
  STASH_ASSIGN_OR_RETURN(const RankRun gpu_group, run(gpu_shaped, "mapped-group", true));
  rows.push_back({kSection,
                  "  GPU-shaped, 8 devices: mapped, the 8 ranks in one group (default chunks)",
                  peer_counts(gpu_group), "per-rank pools " + Counts(own, steps),
                  MissRatio(gpu_group, own), "", Verdict::kNoTarget});

  flags = common;
  flags.push_back("--pool-bytes=" + Str(total * page));
  Progress("sharing: stashd, one shared pool, daemon-copy, " + where);
  STASH_ASSIGN_OR_RETURN(const RankRun shared, run(flags, "daemon-copy", false));
  rows.push_back({kSection,
                  "  (a) daemon-copy, one shared pool of the same total " + SizeName(total * page) +
                      " (ratio: overflows + spills)",
                  Counts(shared, steps),
                  "per-rank pools " + Counts(own, steps) + "; model " + Counts(model_shared),
                  MissRatio(shared, own), "", Verdict::kNoTarget});

  Progress("sharing: stashd, one shared pool, mapped with automatic leases, " + where);
  STASH_ASSIGN_OR_RETURN(const RankRun mapped, run(flags, "mapped", false));
  rows.push_back({kSection,
                  "  (b) mapped, automatic leases from the same pool (default chunks: pool/32)",
                  Counts(mapped, steps), "per-rank pools " + Counts(own, steps),
                  MissRatio(mapped, own), "", Verdict::kNoTarget});
  Progress("sharing: stashd, one shared pool, mapped ranks in one group, " + where);
  STASH_ASSIGN_OR_RETURN(const RankRun grouped, run(flags, "mapped-group", false));
  rows.push_back({kSection,
                  "  (b) mapped, the 8 ranks in one group (page by page through its depot; "
                  "default chunks: pool/32)",
                  Counts(grouped, steps), "per-rank pools " + Counts(own, steps),
                  MissRatio(grouped, own), "", Verdict::kNoTarget});
  // Why: what the leases ask for at each step against the pool (the model's demand).
  auto aims = [&](uint64_t chunk_pages) {
    const std::vector<uint64_t> a = LeaseAims(peaks, chunk_pages);
    uint64_t over = 0;
    double sum = 0;
    for (size_t i = warmup > 0 ? warmup - 1 : 0; i < a.size(); ++i) {
      sum += static_cast<double>(a[i]);
      over += a[i] > total ? 1 : 0;
    }
    const auto n = static_cast<double>(a.size() - (warmup > 0 ? warmup - 1 : 0));
    return std::make_pair(sum / n, static_cast<double>(over) / n);
  };
  const uint64_t coarse_chunk = std::max<uint64_t>(1, total / 32);
  const auto [coarse_mean, coarse_over] = aims(coarse_chunk);
  rows.push_back({kSection,
                  "  (b) why: the 8 leases' aims (last step's peak + 1/8, whole chunks of pool/32) "
                  "exceed the pool in " +
                      Fixed(100 * coarse_over, 0) + "% of steps",
                  "mean " + SizeName(static_cast<uint64_t>(coarse_mean) * page),
                  "pool " + SizeName(total * page), Ratio(coarse_mean / static_cast<double>(total)),
                  "", Verdict::kNoTarget});
  // The same with chunks 8 times finer: how much of (b) is the rounding of leases to chunks.
  const uint64_t fine = std::max<uint64_t>(1, total / 256) * page;
  std::vector<std::string> fine_flags = flags;
  fine_flags.push_back("--chunk-bytes=" + Str(fine));
  Progress("sharing: stashd, one shared pool, mapped, chunks of " + SizeName(fine) + ", " + where);
  STASH_ASSIGN_OR_RETURN(const RankRun mapped_fine, run(fine_flags, "mapped", false));
  rows.push_back({kSection,
                  "  (b) mapped, automatic leases, chunks of pool/256 (" + SizeName(fine) + ")",
                  Counts(mapped_fine, steps), "per-rank pools " + Counts(own, steps),
                  MissRatio(mapped_fine, own), "", Verdict::kNoTarget});
  Progress("sharing: stashd, one shared pool, mapped ranks in one group, chunks of " +
           SizeName(fine) + ", " + where);
  STASH_ASSIGN_OR_RETURN(const RankRun grouped_fine, run(fine_flags, "mapped-group", false));
  rows.push_back(
      {kSection,
       "  (b) mapped, the 8 ranks in one group, chunks of pool/256 (" + SizeName(fine) + ")",
       Counts(grouped_fine, steps), "per-rank pools " + Counts(own, steps),
       MissRatio(grouped_fine, own), "", Verdict::kNoTarget});
  const auto [fine_mean, fine_over] = aims(std::max<uint64_t>(1, total / 256));
  rows.push_back({kSection,
                  "  (b) why: the leases' aims with chunks of pool/256 exceed the pool in " +
                      Fixed(100 * fine_over, 0) + "% of steps",
                  "mean " + SizeName(static_cast<uint64_t>(fine_mean) * page),
                  "pool " + SizeName(total * page), Ratio(fine_mean / static_cast<double>(total)),
                  "", Verdict::kNoTarget});
  // The lag: a lease is sized from the step before, and a mapped rank grows it only at
  // BeginStep, so a rank whose load rose this step spills even when its whole aim was granted.
  uint64_t rank_steps = 0, above_aim = 0, above_last = 0;
  double last_sum = 0;
  for (size_t n = std::max<size_t>(1, warmup); n < peaks.step_rank_peaks.size(); ++n) {
    uint64_t sum = 0;
    for (uint32_t r = 0; r < trace.Ranks(); ++r) {
      const uint64_t before = peaks.step_rank_peaks[n - 1][r];
      const uint64_t now = peaks.step_rank_peaks[n][r];
      ++rank_steps;
      above_last += now > before ? 1 : 0;
      above_aim += now > before + std::max<uint64_t>(1, (before + 7) / 8) ? 1 : 0;
      sum += before;
    }
    last_sum += static_cast<double>(sum);
  }
  const double lag_steps = static_cast<double>(std::max<uint64_t>(1, rank_steps));
  rows.push_back(
      {kSection,
       "  (b) why: a rank's peak passes its aim (last step's + 1/8) in " +
           Fixed(100.0 * static_cast<double>(above_aim) / lag_steps, 1) +
           "% of rank-steps, its last step's peak in " +
           Fixed(100.0 * static_cast<double>(above_last) / lag_steps, 0) +
           "%; the 8 last-step peaks summed (no margins, page-sized chunks)",
       "mean " + SizeName(static_cast<uint64_t>(last_sum / lag_steps * trace.Ranks()) * page),
       "pool " + SizeName(total * page),
       Ratio(last_sum / lag_steps * trace.Ranks() / static_cast<double>(total)), "",
       Verdict::kNoTarget});

  // Zero overflows: pools big enough for anything, then their high water marks.
  const uint64_t big = kNodeGpus * (routing.BudgetTokens() * node.bytes_per_token / page + 1) *
                       scenario.schedule.microbatches * scenario.schedule.layers_per_chunk *
                       scenario.schedule.vp;
  flags = {"--page-bytes=" + Str(page), "--host-tier-bytes=0", "--pool-bytes=" + Str(big * page)};
  Progress("sharing: stashd, one unbounded shared pool (high water), " + where);
  STASH_ASSIGN_OR_RETURN(const RankRun shared_big, run(flags, "daemon-copy", false));
  flags = {"--page-bytes=" + Str(page), "--host-tier-bytes=0", "--devices=8",
           "--pool-bytes=" + Str(big / kNodeGpus * page), "--copy-peer-tier=false"};
  Progress("sharing: stashd, 8 unbounded pools (high water), " + where);
  STASH_ASSIGN_OR_RETURN(const RankRun own_big, run(flags, "daemon-copy", true));
  rows.push_back({kSection,
                  "  (c) memory for zero overflows: one shared pool's high water (model " +
                      SizeName(peaks.node_peak_pages * page) + ")",
                  SizeName(shared_big.pool_high_water * page),
                  "8 pools' high waters summed " + SizeName(own_big.pool_high_water * page) +
                      " (model " + SizeName(peaks.sum_of_rank_peaks * page) + ")",
                  Ratio(static_cast<double>(shared_big.pool_high_water) /
                        static_cast<double>(own_big.pool_high_water)),
                  "", Verdict::kNoTarget});
  rows.push_back(
      {kSection, "  (c) same against Megatron's 8 pools of 1.10x avg-based peak",
       SizeName(shared_big.pool_high_water * page), "Megatron " + SizeName(total * page),
       Ratio(static_cast<double>(shared_big.pool_high_water) / static_cast<double>(total)), "",
       Verdict::kNoTarget});
  // Mapped mode's memory for zero overflows: leases from a pool too big to fill, each rank's
  // quota twice Megatron's pool (the first lease takes the whole quota: warm-up), no host tier;
  // what the 8 leases hold once sized for a step.
  for (const uint64_t chunk_pages :
       {std::max<uint64_t>(1, total / 32), std::max<uint64_t>(1, total / 256)}) {
    flags = {"--page-bytes=" + Str(page), "--host-tier-bytes=0", "--pool-bytes=" + Str(big * page),
             "--chunk-bytes=" + Str(chunk_pages * page),
             "--max-lease-bytes=" + Str(2 * rank_pages * page)};
    Progress("sharing: stashd, mapped leases from an unbounded pool, chunks of " +
             SizeName(chunk_pages * page) + ", " + where);
    STASH_ASSIGN_OR_RETURN(const RankRun leased, run(flags, "mapped", false));
    rows.push_back(
        {kSection,
         "  (c) mapped: the 8 leases at their largest after BeginStep, chunks of " +
             SizeName(chunk_pages * page) + " (" + Counts(leased, steps) + ")",
         SizeName(leased.used_at_step * page),
         "daemon-copy shared pool's high water " + SizeName(shared_big.pool_high_water * page),
         Ratio(static_cast<double>(leased.used_at_step) /
               static_cast<double>(shared_big.pool_high_water)),
         "", Verdict::kNoTarget});
    // The same ranks as one group: what its members claim at most (its memory for zero
    // overflows), and what it holds once it sized itself.
    Progress("sharing: stashd, mapped ranks in one group from an unbounded pool, chunks of " +
             SizeName(chunk_pages * page) + ", " + where);
    STASH_ASSIGN_OR_RETURN(const RankRun group, run(flags, "mapped-group", false));
    rows.push_back(
        {kSection,
         "  (c) mapped, one group: its claimed pages' high water, chunks of " +
             SizeName(chunk_pages * page) + " (" + Counts(group, steps) + ")",
         SizeName(group.group_high_water * page),
         "daemon-copy shared pool's high water " + SizeName(shared_big.pool_high_water * page),
         Ratio(static_cast<double>(group.group_high_water) /
               static_cast<double>(shared_big.pool_high_water)),
         "", Verdict::kNoTarget});
    rows.push_back(
        {kSection,
         "  (c) mapped, one group: the chunks it holds at the last step (at most after warm-up " +
             SizeName(group.group_pages_held * page) + ")",
         SizeName(group.group_pages_held_last * page),
         "its claimed high water " + SizeName(group.group_high_water * page),
         Ratio(static_cast<double>(group.group_pages_held_last) /
               static_cast<double>(std::max<uint64_t>(1, group.group_high_water))),
         "", Verdict::kNoTarget});
  }
  return Status::Ok();
}

}  // namespace

Status PhaseSharing(Env& env, std::vector<Row>& rows) {
  const std::vector<Scenario> scenarios = Scenarios();
  DriftConfig routing;
  const uint32_t model_steps = env.options.quick ? 100 : 1000;
  for (const Scenario& s : scenarios) {
    NodeConfig node;
    node.node_gpus = kNodeGpus;
    const std::string why = CheckNode(s.schedule, routing, node);
    if (!why.empty()) return InvalidArgumentError("sharing: " + s.name + ": " + why);
    Progress("sharing: model, " + s.name + ", " + Str(model_steps) + " steps");
    ModelRows(s, routing, model_steps, rows);
  }
  // How the first scenario's saving depends on the routing assumption.
  DriftConfig fixed = routing;  // skewed, but nothing moves
  fixed.drift_steps = 1e12;
  fixed.hot_move_steps = 1e12;
  SensitivityRow(scenarios[0], "skew that never moves", fixed, model_steps, rows);
  DriftConfig flat = routing;  // no skew and no hot expert: only sampling noise
  flat.skew_sigma = 0;
  flat.hot_boost = 0;
  SensitivityRow(scenarios[0], "balanced router (sampling noise only)", flat, model_steps, rows);
  DriftConfig hot = routing;  // a hotter expert that moves faster
  hot.hot_boost = 3.0;
  hot.hot_move_steps = 5;
  SensitivityRow(scenarios[0], "hot expert 4x share, moving every 5 steps", hot, model_steps, rows);

  const uint32_t warmup = 6;  // mapped leases settle (the first lease takes the whole quota)
  return DaemonRows(env, scenarios[0], routing, env.options.quick ? 10 : 100, warmup, rows);
}

}  // namespace stash::bench
