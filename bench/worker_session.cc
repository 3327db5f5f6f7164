// The helpers every worker task shares (worker_session.h).
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

std::string Flag(const Flags& flags, const std::string& name, const std::string& fallback) {
  auto it = flags.find(name);
  return it == flags.end() ? fallback : it->second;
}
uint64_t FlagU64(const Flags& flags, const std::string& name, uint64_t fallback) {
  const std::string v = Flag(flags, name);
  return v.empty() ? fallback : std::stoull(v);
}

int Fail(const Status& status) {
  std::printf("error %s\n", status.ToString().c_str());
  std::fflush(stdout);
  return 1;
}

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

StatusOr<std::unique_ptr<Client>> OpenClient(const std::string& socket, const ClientConfig& config,
                                             int device) {
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

}  // namespace stash::bench
