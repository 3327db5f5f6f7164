// The daemon without its transport: tiers, pools, sessions and stats. The gRPC handlers
// (service.cc) convert requests and call this; tests can drive it directly.
#ifndef STASH_DAEMON_CORE_H_
#define STASH_DAEMON_CORE_H_

#include <absl/base/thread_annotations.h>
#include <absl/container/flat_hash_map.h>
#include "common/mutex.h"

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/copy_workers.h"
#include "common/unique_fd.h"
#include "daemon/config/config.h"
#include "daemon/copy/admit.h"
#include "daemon/copy/pool.h"
#include "daemon/leases/leases.h"
#include "daemon/limits/fair_share.h"
#include "daemon/limits/rate_limiter.h"
#include "daemon/protocol/descriptor_message.h"
#include "daemon/sessions/group_registry.h"
#include "daemon/sessions/session.h"
#include "daemon/stats/stats.h"
#include "daemon/tiers/tier.h"
#include "daemon/tiers/warmer.h"
#include "stash/status.h"
#include "stash/v1/descriptor.pb.h"
#include "stash/v1/stash.pb.h"

namespace stash::daemon {

// The knob rows of `config` as GetConfig reports them (also `stashd --print-config`).
void AddConfigEntries(const DaemonConfig& config, stash::v1::GetConfigResponse* out);

// The most per-session rows GetStats and ListSessions return (each row is at most ~400 bytes:
// labels are bounded by kMaxTextBytes), far below gRPC's 4 MiB default message limit.
inline constexpr size_t kMaxSessionRows = 1024;

// Thread-safe.
class DaemonCore {
 public:
  // Allocates every tier once (addresses never move) and starts one queue per pool.
  // `backend` is the resolved backend: host (--devices simulated GPUs in shared memory) or cuda
  // (one pool per visible GPU).
  static StatusOr<std::unique_ptr<DaemonCore>> Create(const DaemonConfig& config,
                                                      stash::v1::Backend backend,
                                                      std::string socket_path);
  DaemonCore(const DaemonCore&) = delete;
  DaemonCore& operator=(const DaemonCore&) = delete;
  ~DaemonCore();

  // Starts a session for a Hello that came from `peer` (the gRPC connection's credentials; an
  // unknown peer counts as uid 0); fills `welcome`. Responses go to `sink` until CloseSession.
  // RESOURCE_EXHAUSTED past the user's fair share of sessions. A Hello naming a group joins it
  // (GroupRegistry::Join with the peer's uid): PERMISSION_DENIED for a group of another user or
  // a wrong secret, and no session is made.
  StatusOr<std::shared_ptr<Session>> OpenSession(const stash::v1::Hello& hello, ResponseSink* sink,
                                                 stash::v1::Welcome* welcome,
                                                 const PeerCredentials& peer = {});

  // Admits one post-Hello request and queues it, or answers it at once with its error.
  void HandleRequest(const std::shared_ptr<Session>& session, stash::v1::SessionRequest request);

  // The descriptor channel's handler (DescriptorServer::Handler): checks the session's secret and
  // that `peer` is the process that said Hello. A deposit: checks the memfd and keeps it for the
  // session's RegisterMemory. LeaseChunks / ReturnChunks (mapped sessions only, else
  // FAILED_PRECONDITION): Leases. PERMISSION_DENIED for an unknown session or a wrong secret
  // (the two are not told apart), INVALID_ARGUMENT for a descriptor that is not a sealed memfd
  // of the size.
  DescriptorReply HandleDescriptors(const stash::v1::DescriptorRequest& request,
                                    const PeerCredentials& peer, std::vector<UniqueFd>& fds);

  // Mapped mode's broker; null on the cuda backend. For tests.
  Leases* leases() const { return leases_.get(); }
  // The groups of the live sessions. For tests.
  const GroupRegistry& groups() const { return groups_; }

  // The stream ended: cancels queued work, returns pages, closes mappings (asynchronously, on
  // the pool's queue, behind the request running now). `closed` (optional) runs once every copy
  // and done write submitted for the session finished (Pool::CloseSession): end the session's
  // stream only then, or a late done write could lower a counter the client raised.
  void CloseSession(const std::shared_ptr<Session>& session,
                    std::function<void()> closed = nullptr);

  // Counters of the daemon and its tiers, and one row per live session (the first
  // kMaxSessionRows by rank), so a response stays small whatever clients send. Without
  // `session_rows` (the TCP listener) no row is given. `sessions_omitted` counts the rows left out.
  stash::v1::GetStatsResponse Stats(bool session_rows = true);
  stash::v1::ListSessionsResponse ListSessions(bool session_rows = true);
  stash::v1::GetConfigResponse Config() const;

  // Drains and stops the pool queues: their running request, the work in flight (copies and
  // done writes) and queued teardowns finish; later requests are answered UNAVAILABLE. Call it
  // before ending the streams at shutdown.
  void Stop();

  // Draining (daemon/core/drain.cc): from now on OpenSession and Stash requests get UNAVAILABLE;
  // reloads, releases and the rest go on. Idempotent. `who` names who asked, for the log.
  void Drain(const std::string& who = "a stop signal");
  // Ends draining: sessions and stashes are taken again. Idempotent.
  void Undrain(const std::string& who);
  // Called with the new state each time draining starts or ends (the daemon's health follows
  // it). Set before serving.
  void SetDrainListener(std::function<void(bool draining)> listener) {
    drain_listener_ = std::move(listener);
  }
  // Where the daemon serves besides its socket, as GetConfig reports it. Set before serving.
  void SetListeners(std::string metrics_url, std::string tcp_listener) {
    metrics_url_ = std::move(metrics_url);
    tcp_listener_ = std::move(tcp_listener);
  }
  bool draining() const { return draining_.load(std::memory_order_relaxed); }
  // What is left: sessions connected, and stashes held plus requests in flight over all of them.
  uint64_t SessionsLive();
  // Daemon-copy sessions' stashes from their counters, mapped sessions' from their control
  // blocks.
  uint64_t StashesLive();

  stash::v1::Backend backend() const { return backend_; }
  // The daemon-wide counters and histograms (metrics.cc reads them).
  const DaemonCounters& counters() const { return counters_; }
  // Adds what a mapped session's control block grew by to the daemon's totals, and says its
  // overflows, spills and rejects in the event log (Leases' activity listener; runs under the
  // broker's lock: takes no lock of the core).
  void FoldMapped(const MappedActivity& activity);
  size_t pools() const { return pools_.size(); }

 private:
  DaemonCore(const DaemonConfig& config, stash::v1::Backend backend, std::string socket_path);

  stash::v1::SessionStats SessionRow(Session& s);
  // Tells every session the drain state: a DaemonState message on each stream, the flag in
  // each mapped control block.
  void TellSessions(bool draining);
  // A mapped session's lease and counters (from its control block, clamped).
  void MappedRow(Session& s, stash::v1::SessionStats* row);

  // Never change after Create().
  const DaemonConfig config_;
  const stash::v1::Backend backend_;
  const std::string socket_path_;
  const std::chrono::steady_clock::time_point start_;
  const uint64_t max_lease_bytes_;  // mapped mode's quota per session, whole pages
  uint64_t chunk_bytes_ = 0;        // the chunk size of every pool (and the host tier)
  AdmitLimits limits_;
  // Host backend: the tiers and copy threads the pools' executors use (the cuda backend's
  // executors own their tiers).
  std::vector<std::unique_ptr<Tier>> host_backend_tiers_;
  std::unique_ptr<CopyWorkers> workers_;
  std::vector<std::unique_ptr<Pool>> pools_;
  std::vector<std::string> pool_uuids_;  // cuda: the 16-byte UUID of each pool's GPU
  std::vector<Tier*> tiers_;             // every tier once, pools' own first; for stats
  std::unique_ptr<Leases> leases_;       // after the tiers it points into (pools own CUDA ones)
  std::unique_ptr<Warmer> warmer_;       // host backend with --warm-memory: after the tiers

  DaemonCounters counters_;
  std::atomic<bool> draining_{false};
  Mutex drain_mu_;                            // orders drain state changes and their listener calls
  std::function<void(bool)> drain_listener_;  // set before serving
  std::string metrics_url_;                   // set before serving
  std::string tcp_listener_;                  // set before serving
  // Daemon-wide budgets shared fairly between Unix users (daemon/limits/fair_share.h,
  // docs/security.md "Limits").
  std::unique_ptr<FairShare> sessions_share_;
  std::unique_ptr<FairShare> memories_share_;
  std::unique_ptr<FairShare> bytes_share_;
  std::unique_ptr<FairShare> deposits_share_;
  // The groups sessions joined (Hello.group): thread-safe on its own.
  GroupRegistry groups_;
  RateLimiter group_refused_log_{1, std::chrono::seconds(10)};  // PERMISSION_DENIED joins

  Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Session>> sessions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stash::daemon

#endif  // STASH_DAEMON_CORE_H_
