// The host backend's copy executor: client memory is POSIX shared memory, and every copy runs on
// the pool worker (split across CopyWorkers for large copies) before the call returns.
#ifndef STASH_DAEMON_HOST_EXECUTOR_H_
#define STASH_DAEMON_HOST_EXECUTOR_H_

#include <vector>

#include "common/copy_workers.h"
#include "daemon/copy/executor.h"
#include "daemon/tiers/tier.h"

namespace stash::daemon {

class HostExecutor final : public CopyExecutor {
 public:
  // Non-owning: `device` (the pool's tier), `host` (the host tier shared by every pool, may be
  // null) and `workers` outlive the executor.
  HostExecutor(Tier* device, Tier* host, CopyWorkers* workers)
      : device_(device), host_(host), workers_(workers) {}

  Tier* device_tier() const override { return device_; }
  Tier* host_tier() const override { return host_; }

  // Daemon-copy's peer tier: the other pools' tiers (non-owning, outlive the executor), which a
  // stash that does not fit the own pool tries before the host tier, each lending only beyond
  // the reserve it keeps for its own sessions (Tier::Lends). Called once, before any work.
  void SetPeers(std::vector<Tier*> peers) { peers_ = std::move(peers); }

  StatusOr<std::unique_ptr<MappedMemory>> Open(const stash::v1::RegisterMemory& reg,
                                               UniqueFd fd) override;
  void Stash(const StashWork& work, Then then) override;
  void Reload(const ReloadWork& work, Then then) override;
  void Raise(const DoneSignal& done) override;
  void Fence(Then then) override { then(); }
  bool Synchronous() const override { return true; }

 private:
  // Never change after construction.
  Tier* const device_;
  Tier* const host_;
  CopyWorkers* const workers_;
  std::vector<Tier*> peers_;  // set once before any work (SetPeers)
};

}  // namespace stash::daemon

#endif  // STASH_DAEMON_HOST_EXECUTOR_H_
