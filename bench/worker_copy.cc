// --task=copy: the copy phase's worker (bench/worker.h).
#include "bench/worker_session.h"

#include <grpcpp/grpcpp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <iostream>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "bench/ping.h"
#include "bench/samples.h"
#include "bench/warm_probe.h"
#include "common/macros.h"

namespace stash::bench {

namespace v1 = stash::v1;
namespace pb = stashbench::v1;

// ---- copy -----------------------------------------------------------------------------------

Status RunCopy(const Flags& flags) {
  const std::string socket = Flag(flags, "socket");
  const uint64_t bytes = FlagU64(flags, "bytes", 64ULL << 20);
  const uint64_t reps = FlagU64(flags, "reps", 5);
  const uint64_t memcpy_threads = FlagU64(flags, "memcpy-threads", 1);
  constexpr uint64_t kRowBytes = 4096;
  if (bytes % kRowBytes != 0) return InvalidArgumentError("--bytes must be a multiple of 4096");
  if (memcpy_threads == 0) return InvalidArgumentError("--memcpy-threads must be >= 1");
  STASH_ASSIGN_OR_RETURN(const ClientConfig config, ConfigFromFlags(flags, 2 * bytes));

  // stashd runs as a node service, started before the job: its tiers are warm by the first
  // stash. The machine's floor (bench/warm_probe.h) warms its memory now, while the daemon
  // warms its tiers, so both have aged alike when their first copies come.
  STASH_ASSIGN_OR_RETURN(auto probe_memory, WarmedMemory::Make(bytes));
  STASH_ASSIGN_OR_RETURN(auto stub, DaemonStub(socket));
  STASH_ASSIGN_OR_RETURN(const double warm_wait_s, WaitForTiers(*stub, /*warm_too=*/true));
  STASH_ASSIGN_OR_RETURN(auto client, OpenClient(socket, config));
  STASH_ASSIGN_OR_RETURN(auto src, HostBuffer::Allocate(bytes));
  STASH_ASSIGN_OR_RETURN(auto dst, HostBuffer::Allocate(bytes));
  STASH_ASSIGN_OR_RETURN(auto copy_dst, HostBuffer::Allocate(bytes));
  // Touch everything here first, so no page fault of ours is timed.
  for (uint64_t i = 0; i < bytes; i += 8) {
    const uint64_t v = i * 0x9E3779B97F4A7C15ULL;
    std::memcpy(src->data() + i, &v, 8);
  }
  std::memset(dst->data(), 0, bytes);
  std::memset(copy_dst->data(), 0, bytes);
  STASH_RETURN_IF_ERROR(CheckMode(*stub, *client, config.mode));
  CopyWorkers memcpy_workers(static_cast<uint32_t>(memcpy_threads));

  StashArgs args;
  args.source = src.get();
  args.row_bytes = kRowBytes;
  args.max_rows = bytes / kRowBytes;
  args.count.value = args.max_rows;

  // Daemon-copy: the daemon reads a buffer through a mapping of its own, made when the buffer
  // is registered, whose page tables fill in as the first copy reads it (the rank's memory, not
  // the pool's). That first stash is timed on its own and released, so the "first stash into
  // a new pool" below lands in pool pages no stash wrote yet with the source's cost paid.
  auto t0 = Clock::now();
  double new_buffer_stash_s = 0;
  if (config.mode == Mode::kDaemonCopy) {
    STASH_ASSIGN_OR_RETURN(const Completion first, StashAndWait(*client, args));
    new_buffer_stash_s = SecondsBetween(t0, Clock::now());
    STASH_RETURN_IF_ERROR(CheckPlaced(first, bytes));
    STASH_ASSIGN_OR_RETURN(const uint64_t op, client->Release(first.ticket));
    STASH_RETURN_IF_ERROR(client->Wait(op).status());
  }
  // Warm-up: two stashes fill the pool (or the mapped lease; the bench sizes both to two
  // buffers), so every pool page and the daemon's mappings of src and dst have been touched
  // once. The first one is the "first stash into a new pool (lease)".
  uint64_t faults = PageFaults();
  t0 = Clock::now();
  STASH_ASSIGN_OR_RETURN(const Completion a, StashAndWait(*client, args));
  const double cold_stash_s = SecondsBetween(t0, Clock::now());
  const uint64_t cold_stash_faults = PageFaults() - faults;
  STASH_RETURN_IF_ERROR(CheckPlaced(a, bytes));
  // What a plain memcpy gets from memory warmed the way the daemon warmed that pool, as long
  // ago: the machine's floor under the row above. Measured after it, so the daemon's first
  // stash follows its warming as closely as before.
  STASH_ASSIGN_OR_RETURN(const WarmProbe warm_probe, probe_memory->Copy(src->data()));
  STASH_ASSIGN_OR_RETURN(const Completion b, StashAndWait(*client, args));
  STASH_RETURN_IF_ERROR(CheckPlaced(b, bytes));
  STASH_ASSIGN_OR_RETURN(Completion unused, ReloadAndWait(*client, a.ticket, *dst));
  STASH_ASSIGN_OR_RETURN(unused, ReloadAndWait(*client, b.ticket, *dst));
  (void)unused;
  std::memcpy(copy_dst->data(), src->data(), bytes);
  ParallelMemcpy(memcpy_workers, copy_dst->data(), src->data(), bytes);
  STASH_ASSIGN_OR_RETURN(const v1::DaemonStats warm, GetDaemonStats(*stub));

  std::vector<double> memcpy_s, memcpy_n_s, stash_s, reload_s, stash_daemon_s, reload_daemon_s;
  for (uint64_t rep = 0; rep < reps; ++rep) {
    t0 = Clock::now();
    std::memcpy(copy_dst->data(), src->data(), bytes);
    memcpy_s.push_back(SecondsBetween(t0, Clock::now()));
    if (memcpy_threads > 1) {
      t0 = Clock::now();
      ParallelMemcpy(memcpy_workers, copy_dst->data(), src->data(), bytes);
      memcpy_n_s.push_back(SecondsBetween(t0, Clock::now()));
    }

    if (rep + 1 == reps) std::memset(dst->data(), 0, bytes);  // the last reload is checked
    t0 = Clock::now();
    STASH_ASSIGN_OR_RETURN(const Completion s, StashAndWait(*client, args));
    stash_s.push_back(SecondsBetween(t0, Clock::now()));
    STASH_RETURN_IF_ERROR(CheckPlaced(s, bytes));
    stash_daemon_s.push_back(static_cast<double>(s.latency_us) * 1e-6);

    t0 = Clock::now();
    STASH_ASSIGN_OR_RETURN(const Completion r, ReloadAndWait(*client, s.ticket, *dst));
    reload_s.push_back(SecondsBetween(t0, Clock::now()));
    reload_daemon_s.push_back(static_cast<double>(r.latency_us) * 1e-6);
  }
  if (memcpy_threads == 1) memcpy_n_s = memcpy_s;
  if (std::memcmp(dst->data(), src->data(), bytes) != 0) {
    return InternalError("reloaded bytes differ from the stashed ones");
  }
  if (std::memcmp(copy_dst->data(), src->data(), bytes) != 0) {
    return InternalError("memcpy baseline copied wrong bytes");
  }
  STASH_ASSIGN_OR_RETURN(const v1::DaemonStats end, GetDaemonStats(*stub));

  // Mapped: the lease goes back (its chunks get fresh memory) and a new session leases them,
  // allocating their pages on its lease thread: its first stash lands in renewed chunks.
  double renewed_stash_s = 0;
  uint64_t renewed_stash_faults = 0;
  if (config.mode == Mode::kMapped) {
    client.reset();
    STASH_RETURN_IF_ERROR(WaitForTiers(*stub, /*warm_too=*/false).status());
    STASH_ASSIGN_OR_RETURN(client, OpenClient(socket, config));
    faults = PageFaults();
    t0 = Clock::now();
    STASH_ASSIGN_OR_RETURN(const Completion again, StashAndWait(*client, args));
    renewed_stash_s = SecondsBetween(t0, Clock::now());
    renewed_stash_faults = PageFaults() - faults;
    STASH_RETURN_IF_ERROR(CheckPlaced(again, bytes));
  }

  const uint64_t warm_bytes = 2 * bytes;
  const uint64_t rep_bytes = reps * bytes;
  Result()
      .Add("memcpy_best_gbps", Gbps(bytes, Min(memcpy_s)))
      .Add("memcpy_median_gbps", Gbps(bytes, Median(memcpy_s)))
      .Add("memcpy_threads", static_cast<double>(memcpy_threads))
      .Add("memcpy_n_best_gbps", Gbps(bytes, Min(memcpy_n_s)))
      .Add("memcpy_n_median_gbps", Gbps(bytes, Median(memcpy_n_s)))
      .Add("stash_best_gbps", Gbps(bytes, Min(stash_s)))
      .Add("stash_median_gbps", Gbps(bytes, Median(stash_s)))
      .Add("reload_best_gbps", Gbps(bytes, Min(reload_s)))
      .Add("reload_median_gbps", Gbps(bytes, Median(reload_s)))
      .Add("stash_daemon_median_gbps", Gbps(bytes, Median(stash_daemon_s)))
      .Add("reload_daemon_median_gbps", Gbps(bytes, Median(reload_daemon_s)))
      .Add("cold_stash_gbps", Gbps(bytes, cold_stash_s))
      .Add("warm_probe_first_gbps", warm_probe.first_gbps)
      .Add("warm_probe_second_gbps", warm_probe.second_gbps)
      .Add("cold_stash_faults", static_cast<double>(cold_stash_faults))
      .Add("renewed_stash_faults", static_cast<double>(renewed_stash_faults))
      .Add("renewed_stash_gbps", renewed_stash_s > 0 ? Gbps(bytes, renewed_stash_s) : 0)
      .Add("new_buffer_stash_gbps", new_buffer_stash_s > 0 ? Gbps(bytes, new_buffer_stash_s) : 0)
      .Add("warm_wait_s", warm_wait_s)
      .Add("getstats_stash_copy_gbps",
           LaterCopyGbps(warm_bytes, warm.stash_copy_gbps(), rep_bytes, end.stash_copy_gbps()))
      .Add("getstats_reload_copy_gbps",
           LaterCopyGbps(warm_bytes, warm.reload_copy_gbps(), rep_bytes, end.reload_copy_gbps()))
      .Add("getstats_all_stash_copy_gbps", end.stash_copy_gbps())
      .Add("verified", 1)
      .Print();
  return Status::Ok();
}

}  // namespace stash::bench
