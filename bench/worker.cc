#include "bench/worker.h"

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
#include "bench/sharing_worker.h"
#include "bench/warm_probe.h"
#include "common/copy_workers.h"
#include "common/macros.h"
#include "stash/client.h"
#include "stash/v1/stash.grpc.pb.h"

namespace stash::bench {
namespace {

namespace v1 = stash::v1;
namespace pb = stashbench::v1;

using Flags = std::map<std::string, std::string>;

constexpr int kConnectMs = 10000;

std::string Flag(const Flags& flags, const std::string& name, const std::string& fallback = "") {
  auto it = flags.find(name);
  return it == flags.end() ? fallback : it->second;
}
uint64_t FlagU64(const Flags& flags, const std::string& name, uint64_t fallback) {
  const std::string v = Flag(flags, name);
  return v.empty() ? fallback : std::stoull(v);
}

// "result key=value ..." on stdout.
class Result {
 public:
  Result& Add(const std::string& key, double value) {
    out_ << ' ' << key << '=' << value;
    return *this;
  }
  void Print() {
    std::printf("result%s\n", out_.str().c_str());
    std::fflush(stdout);
  }

 private:
  std::ostringstream out_;
};

int Fail(const Status& status) {
  std::printf("error %s\n", status.ToString().c_str());
  std::fflush(stdout);
  return 1;
}

// The client session a task opens: --mode=daemon-copy|mapped, and for mapped mode
// --copy-threads (Options.copy_threads) and --lease-bytes (an explicit device lease).
struct ClientConfig {
  Mode mode = Mode::kDaemonCopy;
  uint64_t lease_bytes = 0;   // mapped: Options.lease.device_bytes
  uint32_t copy_threads = 2;  // mapped: Options.copy_threads
};

// `default_lease` is what the task's buffers need (at least twice the largest one).
StatusOr<ClientConfig> ConfigFromFlags(const Flags& flags, uint64_t default_lease) {
  ClientConfig config;
  const std::string mode = Flag(flags, "mode", "daemon-copy");
  if (mode == "mapped") {
    config.mode = Mode::kMapped;
  } else if (mode != "daemon-copy") {
    return InvalidArgumentError("--mode=" + mode + ": use daemon-copy or mapped");
  }
  config.lease_bytes = FlagU64(flags, "lease-bytes", default_lease);
  config.copy_threads = static_cast<uint32_t>(FlagU64(flags, "copy-threads", 2));
  if (config.copy_threads == 0) return InvalidArgumentError("--copy-threads must be >= 1");
  return config;
}

StatusOr<std::unique_ptr<Client>> OpenClient(const std::string& socket,
                                             const ClientConfig& config = {}, int device = 0) {
  Options options;
  options.socket = socket;
  options.device = device;
  options.allow_host_spill = false;  // a full pool must show, not hide in the host tier
  options.connect_timeout_ms = kConnectMs;
  options.label = "stash-bench";
  options.mode = config.mode;
  if (config.mode == Mode::kMapped) {
    options.copy_threads = config.copy_threads;
    options.lease.automatic = false;  // sized for the task's buffers, not by the daemon
    options.lease.device_bytes = config.lease_bytes;
    options.lease.peer_bytes = 0;
    options.lease.host_bytes = 0;
  }
  return Client::Open(options);
}

StatusOr<Completion> StashAndWait(Client& client, const StashArgs& args) {
  STASH_ASSIGN_OR_RETURN(const uint64_t ticket, client.Stash(args));
  return client.Wait(ticket);
}

StatusOr<Completion> ReloadAndWait(Client& client, uint64_t ticket, const HostBuffer& dst) {
  ReloadArgs args;
  args.ticket = ticket;
  args.destination = &dst;
  STASH_ASSIGN_OR_RETURN(const uint64_t op, client.Reload(args));
  return client.Wait(op);
}

Status CheckPlaced(const Completion& done, uint64_t want_bytes) {
  if (done.tier != Tier::kDevice || done.bytes != want_bytes) {
    return InternalError(std::string("stash went to ") + TierName(done.tier) + " with " +
                         std::to_string(done.bytes) + " bytes, not the device pool with " +
                         std::to_string(want_bytes) + ": is --pool-bytes too small?");
  }
  return Status::Ok();
}

StatusOr<v1::DaemonStats> GetDaemonStats(v1::StashService::Stub& stub) {
  grpc::ClientContext context;
  v1::GetStatsRequest request;
  v1::GetStatsResponse response;
  const grpc::Status s = stub.GetStats(&context, request, &response);
  if (!s.ok()) return UnavailableError("GetStats: " + s.error_message());
  return response.daemon();
}

// Waits (up to 120 s) until the daemon shows every chunk back in its ring and, with `warm`,
// every tier warm (stashd --warm-memory populates its tiers after start; chunks back from a
// mapped session get fresh memory that their next holder allocates); the seconds it waited.
StatusOr<double> WaitForTiers(v1::StashService::Stub& stub, bool warm_too) {
  const auto t0 = Clock::now();
  for (;;) {
    grpc::ClientContext context;
    v1::GetStatsResponse response;
    const grpc::Status s = stub.GetStats(&context, v1::GetStatsRequest(), &response);
    if (!s.ok()) return UnavailableError("GetStats: " + s.error_message());
    bool warm = true;
    for (const v1::TierStats& t : response.tiers()) {
      warm = warm && (!warm_too || t.bytes_warm() == t.pages_total() * t.page_bytes()) &&
             t.chunks_free() == t.chunks_total();
    }
    if (warm) return SecondsBetween(t0, Clock::now());
    if (SecondsBetween(t0, Clock::now()) > 120) {
      return DeadlineExceededError("the daemon's tiers were not warm and free within 120 s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// Fails unless the daemon shows this session in the mode asked for (so a mapped row can never
// quietly measure daemon-copy mode), and for mapped mode with a device lease.
Status CheckMode(v1::StashService::Stub& stub, const Client& client, Mode mode) {
  grpc::ClientContext context;
  v1::GetStatsResponse response;
  const grpc::Status s = stub.GetStats(&context, v1::GetStatsRequest(), &response);
  if (!s.ok()) return UnavailableError("GetStats: " + s.error_message());
  for (const v1::SessionStats& row : response.sessions()) {
    if (row.session_id() != client.session_id()) continue;
    if (mode == Mode::kDaemonCopy) {
      if (row.mode() == v1::MODE_MAPPED) {
        return InternalError("asked for daemon-copy mode, the daemon shows a mapped session");
      }
      return Status::Ok();
    }
    if (row.mode() != v1::MODE_MAPPED) {
      return InternalError("asked for mapped mode, but the daemon shows this session in mode " +
                           v1::Mode_Name(row.mode()) +
                           ": this build's client or stashd has no mapped mode yet");
    }
    for (const v1::LeaseStats& lease : row.leases()) {
      if (lease.tier() == v1::TIER_DEVICE && lease.chunks() > 0) return Status::Ok();
    }
    return InternalError(
        "the mapped session holds no device chunks: is --max-lease-bytes or "
        "--pool-bytes smaller than --lease-bytes?");
  }
  return InternalError("GetStats does not list this session");
}

StatusOr<std::unique_ptr<v1::StashService::Stub>> DaemonStub(const std::string& socket) {
  STASH_ASSIGN_OR_RETURN(auto channel, ConnectUnix(socket, kConnectMs));
  return v1::StashService::NewStub(channel);
}

// One memcpy split over `workers` the way the daemon's and the mapped copier's copies are
// (CopyWorkers::ParallelFor, parts of at least 4 MiB): the baseline with as many threads as the
// copier has.
void ParallelMemcpy(CopyWorkers& workers, uint8_t* dst, const uint8_t* src, uint64_t bytes) {
  constexpr uint64_t kUnit = 64 << 10;
  constexpr uint64_t kMinPartUnits = (4ULL << 20) / kUnit;
  workers.ParallelFor((bytes + kUnit - 1) / kUnit, kMinPartUnits, [&](uint64_t b, uint64_t e) {
    const uint64_t begin = b * kUnit;
    const uint64_t end = std::min(e * kUnit, bytes);
    std::memcpy(dst + begin, src + begin, end - begin);
  });
}

// Page faults this process has taken so far (minor and major). A mapped rank copies in its own
// threads, so a fault of the leased memory during a stash shows here; 0 means the lease came
// mapped populated.
uint64_t PageFaults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<uint64_t>(usage.ru_minflt + usage.ru_majflt);
}

// Bytes copied in `seconds`, in GB/s (1e9 bytes per second).
double Gbps(uint64_t bytes, double seconds) {
  return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0;
}

// The daemon's copy rate of the copies after a first batch: its window reports bytes/seconds over
// every copy so far, so the seconds of the first batch (bytes_a at rate_a) are taken out.
double LaterCopyGbps(uint64_t bytes_a, double gbps_a, uint64_t bytes_b, double gbps_ab) {
  if (gbps_a <= 0 || gbps_ab <= 0) return 0;
  const double seconds_a = static_cast<double>(bytes_a) / (gbps_a * 1e9);
  const double seconds_ab = static_cast<double>(bytes_a + bytes_b) / (gbps_ab * 1e9);
  return Gbps(bytes_b, seconds_ab - seconds_a);
}

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

// ---- latency --------------------------------------------------------------------------------

Status RunLatency(const Flags& flags) {
  const std::string socket = Flag(flags, "socket");
  const std::string ping_socket = Flag(flags, "ping-socket");
  const uint64_t iters = FlagU64(flags, "iters", 2000);
  const uint64_t rounds = FlagU64(flags, "rounds", 40);
  const uint64_t warmup = FlagU64(flags, "warmup", 300);
  constexpr uint64_t kBytes = 4096;
  // Mapped mode: 16 MiB leased holds a burst of 8 stashes at any page size up to 1 MiB.
  STASH_ASSIGN_OR_RETURN(const ClientConfig config, ConfigFromFlags(flags, 16ULL << 20));

  STASH_ASSIGN_OR_RETURN(auto client, OpenClient(socket, config));
  STASH_ASSIGN_OR_RETURN(auto src, HostBuffer::Allocate(kBytes));
  STASH_ASSIGN_OR_RETURN(auto dst, HostBuffer::Allocate(kBytes));
  std::memset(src->data(), 0x5A, kBytes);
  STASH_ASSIGN_OR_RETURN(auto ping_channel, ConnectUnix(ping_socket, kConnectMs));
  auto ping = pb::Ping::NewStub(ping_channel);
  auto pinger = std::make_unique<StreamPinger>(ping.get());
  STASH_ASSIGN_OR_RETURN(auto daemon, DaemonStub(socket));
  STASH_RETURN_IF_ERROR(CheckMode(*daemon, *client, config.mode));

  StashArgs args;
  args.source = src.get();
  args.row_bytes = kBytes;
  args.max_rows = 1;
  args.count.value = 1;

  std::vector<double> submit_us, stash_us, reload_submit_us, reload_us, daemon_stash_us;
  std::vector<double> ping_us, stream_us, getstats_us;
  uint64_t ping_id = 0;

  auto unary_ping = [&](std::vector<double>* out) -> Status {
    grpc::ClientContext context;
    pb::PingMessage request, reply;
    request.set_id(++ping_id);
    const auto t0 = Clock::now();
    const grpc::Status s = ping->Echo(&context, request, &reply);
    const auto t1 = Clock::now();
    if (!s.ok()) return UnavailableError("ping: " + s.error_message());
    if (out != nullptr) out->push_back(MicrosBetween(t0, t1));
    return Status::Ok();
  };
  auto stream_ping = [&](std::vector<double>* out) -> Status {
    const auto t0 = Clock::now();
    if (!pinger->Ping(++ping_id)) return UnavailableError("stream ping broke");
    if (out != nullptr) out->push_back(MicrosBetween(t0, Clock::now()));
    return Status::Ok();
  };
  auto get_stats = [&](std::vector<double>* out) -> Status {
    const auto t0 = Clock::now();
    STASH_ASSIGN_OR_RETURN(const v1::DaemonStats unused, GetDaemonStats(*daemon));
    (void)unused;
    if (out != nullptr) out->push_back(MicrosBetween(t0, Clock::now()));
    return Status::Ok();
  };
  auto stash_once = [&](bool record) -> Status {
    const auto t0 = Clock::now();
    STASH_ASSIGN_OR_RETURN(const uint64_t ticket, client->Stash(args));
    const auto t1 = Clock::now();
    STASH_ASSIGN_OR_RETURN(const Completion s, client->Wait(ticket));
    const auto t2 = Clock::now();
    STASH_RETURN_IF_ERROR(CheckPlaced(s, kBytes));
    ReloadArgs r;
    r.ticket = ticket;
    r.destination = dst.get();
    const auto t3 = Clock::now();
    STASH_ASSIGN_OR_RETURN(const uint64_t op, client->Reload(r));
    const auto t4 = Clock::now();
    STASH_ASSIGN_OR_RETURN(const Completion unused, client->Wait(op));
    const auto t5 = Clock::now();
    (void)unused;
    if (record) {
      submit_us.push_back(MicrosBetween(t0, t1));
      stash_us.push_back(MicrosBetween(t0, t2));
      reload_submit_us.push_back(MicrosBetween(t3, t4));
      reload_us.push_back(MicrosBetween(t3, t5));
      daemon_stash_us.push_back(static_cast<double>(s.latency_us));
    }
    return Status::Ok();
  };

  // The one-call forms (StashAndWait, ReloadAndWait: the Python binding's wait=True).
  std::vector<double> sync_stash_us, sync_reload_us;
  auto sync_once = [&](bool record) -> Status {
    const auto t0 = Clock::now();
    uint64_t ticket = 0;
    STASH_ASSIGN_OR_RETURN(const Completion s, client->StashAndWait(args, -1, &ticket));
    const auto t1 = Clock::now();
    STASH_RETURN_IF_ERROR(CheckPlaced(s, kBytes));
    ReloadArgs r;
    r.ticket = ticket;
    r.destination = dst.get();
    const auto t2 = Clock::now();
    STASH_ASSIGN_OR_RETURN(const Completion unused, client->ReloadAndWait(r));
    const auto t3 = Clock::now();
    (void)unused;
    if (record) {
      sync_stash_us.push_back(MicrosBetween(t0, t1));
      sync_reload_us.push_back(MicrosBetween(t2, t3));
    }
    return Status::Ok();
  };

  // Eight Stash() calls back to back (a layer's buffers): after the first, a write is usually in
  // flight, so the call only queues.
  std::vector<double> burst_submit_us;
  auto stash_burst = [&](bool record) -> Status {
    constexpr int kBurst = 8;
    uint64_t tickets[kBurst];
    for (uint64_t& ticket : tickets) {
      const auto t0 = Clock::now();
      STASH_ASSIGN_OR_RETURN(ticket, client->Stash(args));
      if (record) burst_submit_us.push_back(MicrosBetween(t0, Clock::now()));
    }
    for (uint64_t ticket : tickets) {
      STASH_ASSIGN_OR_RETURN(const Completion s, client->Wait(ticket));
      STASH_RETURN_IF_ERROR(CheckPlaced(s, kBytes));
      STASH_ASSIGN_OR_RETURN(const uint64_t op, client->Release(ticket));
      STASH_ASSIGN_OR_RETURN(const Completion unused, client->Wait(op));
      (void)unused;
    }
    return Status::Ok();
  };

  for (uint64_t i = 0; i < warmup; ++i) {
    STASH_RETURN_IF_ERROR(unary_ping(nullptr));
    STASH_RETURN_IF_ERROR(stream_ping(nullptr));
    STASH_RETURN_IF_ERROR(stash_once(false));
    STASH_RETURN_IF_ERROR(sync_once(false));
  }
  STASH_RETURN_IF_ERROR(get_stats(nullptr));
  // Rounds interleave the kinds, so a noisy moment of the machine hits all of them alike.
  const uint64_t per_round = (iters + rounds - 1) / rounds;
  for (uint64_t round = 0; round < rounds; ++round) {
    for (uint64_t i = 0; i < per_round; ++i) STASH_RETURN_IF_ERROR(unary_ping(&ping_us));
    for (uint64_t i = 0; i < per_round; ++i) STASH_RETURN_IF_ERROR(stash_once(true));
    for (uint64_t i = 0; i < per_round; ++i) STASH_RETURN_IF_ERROR(sync_once(true));
    for (uint64_t i = 0; i < per_round; ++i) STASH_RETURN_IF_ERROR(stream_ping(&stream_us));
    for (uint64_t i = 0; i < per_round / 4; ++i) STASH_RETURN_IF_ERROR(get_stats(&getstats_us));
    for (uint64_t i = 0; i < per_round / 8; ++i) STASH_RETURN_IF_ERROR(stash_burst(true));
  }
  if (std::memcmp(dst->data(), src->data(), kBytes) != 0) {
    return InternalError("reloaded bytes differ from the stashed ones");
  }
  // Every recorded reload went to `dst`: the last one is checked above, one more with fresh
  // bytes checks the path once more after the timed rounds.
  std::memset(src->data(), 0xA5, kBytes);
  std::memset(dst->data(), 0, kBytes);
  STASH_RETURN_IF_ERROR(stash_once(false));
  if (std::memcmp(dst->data(), src->data(), kBytes) != 0) {
    return InternalError("reloaded bytes differ from the stashed ones (after the rounds)");
  }
  pinger.reset();
  Result()
      .Add("submit_median_us", Median(submit_us))
      .Add("submit_p99_us", Quantile(submit_us, 0.99))
      .Add("stash_median_us", Median(stash_us))
      .Add("stash_p99_us", Quantile(stash_us, 0.99))
      .Add("sync_stash_median_us", Median(sync_stash_us))
      .Add("sync_stash_p99_us", Quantile(sync_stash_us, 0.99))
      .Add("sync_reload_median_us", Median(sync_reload_us))
      .Add("burst_submit_median_us", Median(burst_submit_us))
      .Add("burst_submit_p99_us", Quantile(burst_submit_us, 0.99))
      .Add("reload_submit_median_us", Median(reload_submit_us))
      .Add("reload_median_us", Median(reload_us))
      .Add("reload_p99_us", Quantile(reload_us, 0.99))
      .Add("daemon_stash_median_us", Median(daemon_stash_us))
      .Add("ping_median_us", Median(ping_us))
      .Add("ping_p99_us", Quantile(ping_us, 0.99))
      .Add("stream_median_us", Median(stream_us))
      .Add("stream_p99_us", Quantile(stream_us, 0.99))
      .Add("getstats_median_us", Median(getstats_us))
      .Add("getstats_p99_us", Quantile(getstats_us, 0.99))
      .Add("ping_p10_us", Quantile(ping_us, 0.1))
      .Add("ping_p90_us", Quantile(ping_us, 0.9))
      .Add("stash_p10_us", Quantile(stash_us, 0.1))
      .Add("stash_p90_us", Quantile(stash_us, 0.9))
      .Add("stream_p10_us", Quantile(stream_us, 0.1))
      .Add("stream_p90_us", Quantile(stream_us, 0.9))
      .Add("samples", static_cast<double>(stash_us.size()))
      .Print();
  return Status::Ok();
}

// ---- saturate -------------------------------------------------------------------------------

// Reads "go <milliseconds>" from stdin (after printing "ready").
StatusOr<double> AwaitGo() {
  std::printf("ready\n");
  std::fflush(stdout);
  std::string word;
  double ms = 0;
  if (!(std::cin >> word >> ms) || word != "go")
    return UnavailableError("stdin closed before \"go\"");
  return ms / 1000.0;
}

Status RunSaturateStash(const Flags& flags) {
  const std::string socket = Flag(flags, "socket");
  const uint64_t window = FlagU64(flags, "window", 32);
  constexpr uint64_t kBytes = 4096;
  STASH_ASSIGN_OR_RETURN(const ClientConfig config, ConfigFromFlags(flags, 64ULL << 20));
  STASH_ASSIGN_OR_RETURN(auto client, OpenClient(socket, config));
  STASH_ASSIGN_OR_RETURN(auto src, HostBuffer::Allocate(kBytes));
  STASH_ASSIGN_OR_RETURN(auto dst, HostBuffer::Allocate(kBytes));
  StashArgs args;
  args.source = src.get();
  args.row_bytes = kBytes;
  args.max_rows = 1;
  args.count.value = 1;

  struct InFlight {
    uint64_t op;
    bool is_stash;
  };
  std::deque<InFlight> queue;
  uint64_t issued = 0;  // every request sent, warm-up and drain included
  // Answers of one session come back in order, so waiting on the oldest keeps `window` busy.
  auto step = [&]() -> Status {
    const InFlight front = queue.front();
    queue.pop_front();
    STASH_ASSIGN_OR_RETURN(const Completion done, client->Wait(front.op));
    if (front.is_stash) {
      STASH_RETURN_IF_ERROR(CheckPlaced(done, kBytes));
      ReloadArgs r;
      r.ticket = front.op;
      r.destination = dst.get();
      STASH_ASSIGN_OR_RETURN(const uint64_t op, client->Reload(r));
      ++issued;
      queue.push_back({op, false});
    } else {
      STASH_ASSIGN_OR_RETURN(const uint64_t ticket, client->Stash(args));
      ++issued;
      queue.push_back({ticket, true});
    }
    return Status::Ok();
  };
  for (uint64_t i = 0; i < window; ++i) {
    STASH_ASSIGN_OR_RETURN(const uint64_t ticket, client->Stash(args));
    ++issued;
    queue.push_back({ticket, true});
  }
  for (int i = 0; i < 500; ++i) STASH_RETURN_IF_ERROR(step());  // warm-up

  STASH_ASSIGN_OR_RETURN(const double seconds, AwaitGo());
  uint64_t done = 0;
  const auto t0 = Clock::now();
  const auto until = t0 + std::chrono::duration<double>(seconds);
  while (Clock::now() < until) {
    STASH_RETURN_IF_ERROR(step());
    ++done;
  }
  const double elapsed = SecondsBetween(t0, Clock::now());
  while (!queue.empty()) {  // drain: every stash is reloaded or released before leaving
    const InFlight front = queue.front();
    queue.pop_front();
    STASH_ASSIGN_OR_RETURN(const Completion c, client->Wait(front.op));
    if (front.is_stash) {
      STASH_ASSIGN_OR_RETURN(const uint64_t op, client->Release(c.ticket));
      ++issued;
      STASH_ASSIGN_OR_RETURN(const Completion unused, client->Wait(op));
      (void)unused;
    }
  }
  Result()
      .Add("ops", static_cast<double>(done))
      .Add("seconds", elapsed)
      .Add("issued", static_cast<double>(issued))
      .Print();
  return Status::Ok();
}

// Unary pings, `window` in flight through the callback API.
Status RunSaturatePing(const Flags& flags) {
  const std::string socket = Flag(flags, "socket");
  const uint64_t window = FlagU64(flags, "window", 32);
  STASH_ASSIGN_OR_RETURN(auto channel, ConnectUnix(socket, kConnectMs));
  auto stub = pb::Ping::NewStub(channel);

  struct Slot {
    std::unique_ptr<grpc::ClientContext> context;
    pb::PingMessage request, reply;
  };
  std::vector<Slot> slots(window);
  std::mutex mu;
  std::condition_variable cv;
  std::vector<size_t> finished;  // guarded by mu
  bool failed = false;           // guarded by mu
  uint64_t issued = 0;           // every call made, warm-up and drain included
  auto issue = [&](size_t i) {
    ++issued;
    Slot& s = slots[i];
    s.context = std::make_unique<grpc::ClientContext>();
    s.request.set_id(i);
    stub->async()->Echo(s.context.get(), &s.request, &s.reply, [&, i](const grpc::Status& status) {
      std::lock_guard<std::mutex> lock(mu);
      if (!status.ok()) failed = true;
      finished.push_back(i);
      cv.notify_one();
    });
  };
  // Waits for finished calls, reissues them while `more`; returns how many finished.
  auto turn = [&](bool more) -> StatusOr<uint64_t> {
    std::vector<size_t> ready;
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return !finished.empty(); });
      if (failed) return UnavailableError("ping failed");
      ready.swap(finished);
    }
    if (more) {
      for (size_t i : ready) issue(i);
    }
    return ready.size();
  };
  for (size_t i = 0; i < window; ++i) issue(i);
  for (uint64_t warm = 0; warm < 500;) {
    STASH_ASSIGN_OR_RETURN(const uint64_t n, turn(true));
    warm += n;
  }
  STASH_ASSIGN_OR_RETURN(const double seconds, AwaitGo());
  uint64_t done = 0;
  const auto t0 = Clock::now();
  const auto until = t0 + std::chrono::duration<double>(seconds);
  while (Clock::now() < until) {
    STASH_ASSIGN_OR_RETURN(const uint64_t n, turn(true));
    done += n;
  }
  const double elapsed = SecondsBetween(t0, Clock::now());
  for (uint64_t left = window; left > 0;) {
    STASH_ASSIGN_OR_RETURN(const uint64_t n, turn(false));
    left -= n;
  }
  Result()
      .Add("ops", static_cast<double>(done))
      .Add("seconds", elapsed)
      .Add("issued", static_cast<double>(issued))
      .Print();
  return Status::Ok();
}

// ---- throughput (the clients phase) ---------------------------------------------------------

// --task=throughput: Stash+Wait then Reload+Wait of one --bytes buffer, over and over for the
// time "go" names (several of these run at once, one per process); reports the bytes copied in
// and out. The reloaded bytes are checked against the source after the timed loop.
Status RunThroughput(const Flags& flags) {
  const std::string socket = Flag(flags, "socket");
  const uint64_t bytes = FlagU64(flags, "bytes", 16ULL << 20);
  constexpr uint64_t kRowBytes = 4096;
  if (bytes % kRowBytes != 0) return InvalidArgumentError("--bytes must be a multiple of 4096");
  STASH_ASSIGN_OR_RETURN(const ClientConfig config, ConfigFromFlags(flags, 2 * bytes));
  STASH_ASSIGN_OR_RETURN(auto client, OpenClient(socket, config));
  STASH_ASSIGN_OR_RETURN(auto src, HostBuffer::Allocate(bytes));
  STASH_ASSIGN_OR_RETURN(auto dst, HostBuffer::Allocate(bytes));
  const uint64_t salt = static_cast<uint64_t>(getpid()) << 32;  // each process its own bytes
  for (uint64_t i = 0; i < bytes; i += 8) {
    const uint64_t v = (i ^ salt) * 0x9E3779B97F4A7C15ULL;
    std::memcpy(src->data() + i, &v, 8);
  }
  std::memset(dst->data(), 0, bytes);
  STASH_ASSIGN_OR_RETURN(auto stub, DaemonStub(socket));
  STASH_RETURN_IF_ERROR(CheckMode(*stub, *client, config.mode));

  StashArgs args;
  args.source = src.get();
  args.row_bytes = kRowBytes;
  args.max_rows = bytes / kRowBytes;
  args.count.value = args.max_rows;
  auto cycle = [&]() -> Status {
    STASH_ASSIGN_OR_RETURN(const Completion s, StashAndWait(*client, args));
    STASH_RETURN_IF_ERROR(CheckPlaced(s, bytes));
    STASH_ASSIGN_OR_RETURN(const Completion r, ReloadAndWait(*client, s.ticket, *dst));
    if (r.bytes != bytes) {
      return InternalError("reload copied " + std::to_string(r.bytes) + " bytes, not " +
                           std::to_string(bytes));
    }
    return Status::Ok();
  };
  // Warm-up as in the copy task: two stashes held at once touch every page of the (pool share or
  // lease) the bench sized to two buffers, then both reloads.
  {
    STASH_ASSIGN_OR_RETURN(const Completion a, StashAndWait(*client, args));
    STASH_RETURN_IF_ERROR(CheckPlaced(a, bytes));
    STASH_ASSIGN_OR_RETURN(const Completion b, StashAndWait(*client, args));
    STASH_RETURN_IF_ERROR(CheckPlaced(b, bytes));
    STASH_RETURN_IF_ERROR(ReloadAndWait(*client, a.ticket, *dst).status());
    STASH_RETURN_IF_ERROR(ReloadAndWait(*client, b.ticket, *dst).status());
  }
  STASH_RETURN_IF_ERROR(cycle());

  STASH_ASSIGN_OR_RETURN(const double seconds, AwaitGo());
  uint64_t cycles = 0;
  const auto t0 = Clock::now();
  const auto until = t0 + std::chrono::duration<double>(seconds);
  while (Clock::now() < until) {
    STASH_RETURN_IF_ERROR(cycle());
    ++cycles;
  }
  const double elapsed = SecondsBetween(t0, Clock::now());
  std::memset(dst->data(), 0, bytes);
  STASH_RETURN_IF_ERROR(cycle());
  if (std::memcmp(dst->data(), src->data(), bytes) != 0) {
    return InternalError("reloaded bytes differ from the stashed ones");
  }
  Result()
      .Add("cycles", static_cast<double>(cycles))
      .Add("seconds", elapsed)
      .Add("bytes_moved", static_cast<double>(2 * bytes * cycles))  // stashed in + reloaded out
      .Add("verified", 1)
      .Print();
  return Status::Ok();
}

// ---- memory ---------------------------------------------------------------------------------

struct MemoryBuffer {
  uint64_t row_bytes;
  uint32_t divisor;
};

// Forward then backward through `tokens` (one entry per layer) on one client; returns the
// pool's high water mark and checks every page came back.
Status RunMemoryOnPool(Client& client, const HostBuffer& source, const HostBuffer& counts,
                       const std::vector<uint64_t>& tokens, uint64_t budget,
                       const std::vector<MemoryBuffer>& buffers, Result& result,
                       const std::string& prefix) {
  std::vector<uint64_t> tickets;
  uint64_t payload = 0;
  uint64_t pages = 0;
  // Counts live in shared memory and are read by the daemon when the copy runs (sync-free).
  for (size_t l = 0; l < tokens.size(); ++l) {
    const auto count = static_cast<int64_t>(tokens[l]);
    std::memcpy(counts.data() + 8 * l, &count, 8);
  }
  for (size_t l = 0; l < tokens.size(); ++l) {
    for (const MemoryBuffer& b : buffers) {
      StashArgs args;
      args.source = &source;
      args.row_bytes = b.row_bytes;
      args.max_rows = budget / b.divisor;
      args.count.buffer = &counts;
      args.count.offset = 8 * l;
      args.count.divisor = b.divisor;
      STASH_ASSIGN_OR_RETURN(const Completion done, StashAndWait(client, args));
      const uint64_t want = tokens[l] / b.divisor * b.row_bytes;
      STASH_RETURN_IF_ERROR(CheckPlaced(done, want));
      payload += done.bytes;
      pages += done.pages;
      tickets.push_back(done.ticket);
    }
  }
  STASH_ASSIGN_OR_RETURN(const SessionStats at_peak, client.Stats());
  for (auto it = tickets.rbegin(); it != tickets.rend(); ++it) {
    STASH_ASSIGN_OR_RETURN(const Completion unused, ReloadAndWait(client, *it, source));
    (void)unused;
  }
  STASH_ASSIGN_OR_RETURN(const SessionStats after, client.Stats());
  if (after.pool_pages_used != 0) {
    return InternalError("pages still in use after every reload: " +
                         std::to_string(after.pool_pages_used));
  }
  result.Add(prefix + "_high_water_pages", static_cast<double>(at_peak.pool_pages_high_water))
      .Add(prefix + "_pages_at_peak", static_cast<double>(at_peak.pool_pages_used))
      .Add(prefix + "_stash_pages", static_cast<double>(pages))
      .Add(prefix + "_payload_bytes", static_cast<double>(payload));
  return Status::Ok();
}

Status RunMemory(const Flags& flags) {
  const std::string socket = Flag(flags, "socket");
  const uint64_t budget = FlagU64(flags, "budget", 49152);
  const uint64_t hidden = FlagU64(flags, "hidden", 7168);
  std::vector<uint64_t> tokens;
  {
    std::istringstream in(Flag(flags, "tokens"));
    std::string item;
    while (std::getline(in, item, ',')) tokens.push_back(std::stoull(item));
  }
  if (tokens.empty()) return InvalidArgumentError("--tokens=t0,t1,... is required");
  const uint64_t scale_row = (hidden + 127) / 128 * 128;
  STASH_ASSIGN_OR_RETURN(auto bf16, OpenClient(socket, ClientConfig(), 0));
  STASH_ASSIGN_OR_RETURN(auto mxfp8, OpenClient(socket, ClientConfig(), 1));
  STASH_ASSIGN_OR_RETURN(auto source, HostBuffer::Allocate(budget * 2 * hidden));
  STASH_ASSIGN_OR_RETURN(auto counts, HostBuffer::Allocate(8 * tokens.size()));
  Result result;
  STASH_RETURN_IF_ERROR(
      RunMemoryOnPool(*bf16, *source, *counts, tokens, budget, {{2 * hidden, 1}}, result, "bf16"));
  STASH_RETURN_IF_ERROR(RunMemoryOnPool(*mxfp8, *source, *counts, tokens, budget,
                                        {{hidden, 1}, {scale_row, 32}}, result, "mxfp8"));
  result.Print();
  return Status::Ok();
}

// --task=blocked: queues --requests stashes whose ready event nobody signals (the daemon holds
// them all), prints "ready", and holds them until its stdin closes or it is killed.
Status RunBlocked(const Flags& flags) {
  const uint64_t requests = FlagU64(flags, "requests", 4095);
  STASH_ASSIGN_OR_RETURN(auto client, OpenClient(Flag(flags, "socket")));
  STASH_ASSIGN_OR_RETURN(auto source, HostBuffer::Allocate(4096));
  STASH_ASSIGN_OR_RETURN(auto events, HostBuffer::Allocate(4096));
  StashArgs args;
  args.source = source.get();
  args.row_bytes = 64;
  args.max_rows = 64;
  args.count.value = 64;
  // One answered stash first: both buffers are registered before the held ones queue, so all
  // --requests of them fit under the daemon's in-flight limit.
  args.ready = {events.get(), 0, 0};
  STASH_ASSIGN_OR_RETURN(const Completion first, StashAndWait(*client, args));
  STASH_RETURN_IF_ERROR(CheckPlaced(first, 4096));
  args.ready = {events.get(), 8, 1};  // never signalled
  for (uint64_t i = 0; i < requests; ++i) {
    STASH_RETURN_IF_ERROR(client->Stash(args).status());
  }
  // Ready once the daemon holds them all (Stash returns before the request is even written).
  auto stub = v1::StashService::NewStub(
      grpc::CreateChannel("unix:" + Flag(flags, "socket"), grpc::InsecureChannelCredentials()));
  for (bool held = false; !held; usleep(10000)) {
    grpc::ClientContext context;
    v1::GetStatsResponse stats;
    const grpc::Status s = stub->GetStats(&context, v1::GetStatsRequest(), &stats);
    if (!s.ok()) return UnavailableError("GetStats: " + s.error_message());
    for (const v1::SessionStats& row : stats.sessions()) {
      held |= row.session_id() == client->session_id() && row.requests_inflight() >= requests;
    }
  }
  std::printf("ready\n");
  std::fflush(stdout);
  for (std::string line; std::getline(std::cin, line);) {
  }
  return Status::Ok();
}

// --task=roundtrip: --iters 4 KiB Stash+Wait then Reload+Wait; reports the Stash+Wait median.
Status RunRoundTrip(const Flags& flags) {
  const uint64_t iters = FlagU64(flags, "iters", 2000);
  STASH_ASSIGN_OR_RETURN(auto client, OpenClient(Flag(flags, "socket")));
  STASH_ASSIGN_OR_RETURN(auto source, HostBuffer::Allocate(4096));
  STASH_ASSIGN_OR_RETURN(auto destination, HostBuffer::Allocate(4096));
  StashArgs args;
  args.source = source.get();
  args.row_bytes = 64;
  args.max_rows = 64;
  args.count.value = 64;
  std::vector<double> samples;
  for (uint64_t i = 0; i < iters + iters / 10; ++i) {  // the first tenth warms up
    const auto t0 = Clock::now();
    STASH_ASSIGN_OR_RETURN(const Completion done, StashAndWait(*client, args));
    const auto t1 = Clock::now();
    STASH_RETURN_IF_ERROR(CheckPlaced(done, 4096));
    STASH_RETURN_IF_ERROR(ReloadAndWait(*client, done.ticket, *destination).status());
    if (i >= iters / 10) samples.push_back(MicrosBetween(t0, t1));
  }
  Result result;
  result.Add("stash_median_us", Median(samples))
      .Add("stash_p99_us", Quantile(samples, 0.99))
      .Add("samples", static_cast<double>(samples.size()));
  result.Print();
  return Status::Ok();
}

}  // namespace

int RunWorker(const Flags& flags) {
  const std::string task = Flag(flags, "task");
  Status status;
  if (task == "copy") {
    status = RunCopy(flags);
  } else if (task == "latency") {
    status = RunLatency(flags);
  } else if (task == "saturate") {
    // --kind=stash|ping (before mapped mode this was --mode=stash|ping, still accepted).
    std::string kind = Flag(flags, "kind", "stash");
    Flags rest = flags;
    const std::string mode = Flag(flags, "mode");
    if (mode == "stash" || mode == "ping") {
      kind = mode;
      rest.erase("mode");
    }
    status = kind == "ping" ? RunSaturatePing(rest) : RunSaturateStash(rest);
  } else if (task == "throughput") {
    status = RunThroughput(flags);
  } else if (task == "memory") {
    status = RunMemory(flags);
  } else if (task == "blocked") {
    status = RunBlocked(flags);
  } else if (task == "roundtrip") {
    status = RunRoundTrip(flags);
  } else if (task == "rank") {
    return RunRankWorker(flags);  // bench/sharing_worker.h
  } else {
    status = InvalidArgumentError("unknown --task=" + task);
  }
  return status.ok() ? 0 : Fail(status);
}

}  // namespace stash::bench
