// What every stash-bench worker task shares: flags, the "result" line, opening a session in the
// mode asked for, the daemon's stats over gRPC, and the copy-rate helpers. Each task lives in a
// worker_<task>.cc of its own (bench/worker.h lists them); worker.cc picks one.
#ifndef STASH_BENCH_WORKER_SESSION_H_
#define STASH_BENCH_WORKER_SESSION_H_

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <sstream>
#include <string>

#include "common/copy_workers.h"
#include "stash/client.h"
#include "stash/v1/stash.grpc.pb.h"

namespace stash::bench {

using Flags = std::map<std::string, std::string>;

constexpr int kConnectMs = 10000;

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

// The client session a task opens: --mode=daemon-copy|mapped, and for mapped mode
// --copy-threads (Options.copy_threads) and --lease-bytes (an explicit device lease).
struct ClientConfig {
  Mode mode = Mode::kDaemonCopy;
  uint64_t lease_bytes = 0;   // mapped: Options.lease.device_bytes
  uint32_t copy_threads = 2;  // mapped: Options.copy_threads
};

std::string Flag(const Flags& flags, const std::string& name, const std::string& fallback = "");

uint64_t FlagU64(const Flags& flags, const std::string& name, uint64_t fallback);

// "error <text>" on stdout; the exit code 1.
int Fail(const Status& status);

// `default_lease` is what the task's buffers need (at least twice the largest one).
StatusOr<ClientConfig> ConfigFromFlags(const Flags& flags, uint64_t default_lease);

// A session of stash-bench on `device`: no host spill (a full pool must show, not hide in the
// host tier); mapped mode with an explicit device lease of config.lease_bytes.
StatusOr<std::unique_ptr<Client>> OpenClient(const std::string& socket,
                                             const ClientConfig& config = {}, int device = 0);

StatusOr<Completion> StashAndWait(Client& client, const StashArgs& args);

StatusOr<Completion> ReloadAndWait(Client& client, uint64_t ticket, const HostBuffer& dst);

Status CheckPlaced(const Completion& done, uint64_t want_bytes);

StatusOr<v1::DaemonStats> GetDaemonStats(v1::StashService::Stub& stub);

// Waits (up to 120 s) until the daemon shows every chunk back in its ring and, with `warm`,
// every tier warm (stashd --warm-memory populates its tiers after start; chunks back from a
// mapped session get fresh memory that their next holder allocates); the seconds it waited.
StatusOr<double> WaitForTiers(v1::StashService::Stub& stub, bool warm_too);

// Fails unless the daemon shows this session in the mode asked for (so a mapped row can never
// quietly measure daemon-copy mode), and for mapped mode with a device lease.
Status CheckMode(v1::StashService::Stub& stub, const Client& client, Mode mode);

StatusOr<std::unique_ptr<v1::StashService::Stub>> DaemonStub(const std::string& socket);

// One memcpy split over `workers` the way the daemon's and the mapped copier's copies are
// (CopyWorkers::ParallelFor, parts of at least 4 MiB): the baseline with as many threads as the
// copier has.
void ParallelMemcpy(CopyWorkers& workers, uint8_t* dst, const uint8_t* src, uint64_t bytes);

// Page faults this process has taken so far (minor and major). A mapped rank copies in its own
// threads, so a fault of the leased memory during a stash shows here; 0 means the lease came
// mapped populated.
uint64_t PageFaults();

// Bytes copied in `seconds`, in GB/s (1e9 bytes per second).
double Gbps(uint64_t bytes, double seconds);

// The daemon's copy rate of the copies after a first batch: its window reports bytes/seconds over
// every copy so far, so the seconds of the first batch (bytes_a at rate_a) are taken out.
double LaterCopyGbps(uint64_t bytes_a, double gbps_a, uint64_t bytes_b, double gbps_ab);

// The tasks (bench/worker.h), one file each.
Status RunCopy(const Flags& flags);
Status RunLatency(const Flags& flags);
Status RunSaturateStash(const Flags& flags);
Status RunSaturatePing(const Flags& flags);
Status RunThroughput(const Flags& flags);
Status RunMemory(const Flags& flags);
Status RunBlocked(const Flags& flags);
Status RunRoundTrip(const Flags& flags);

}  // namespace stash::bench

#endif  // STASH_BENCH_WORKER_SESSION_H_
