// The host backend's GroupBlock (daemon/leases/group_block.h): one sealed memfd every member of
// the group maps read-write, whatever its device; the daemon joins, takes back and reclaims
// pages with the same host atomics the members' copiers use (stash/kernels/group_depot.h).
#ifndef STASH_DAEMON_HOST_GROUP_BLOCK_H_
#define STASH_DAEMON_HOST_GROUP_BLOCK_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "common/shm.h"
#include "daemon/leases/group_block.h"
#include "stash/kernels/group_depot.h"
#include "stash/status.h"

namespace stash::daemon {

class HostGroupBlock final : public GroupBlock {
 public:
  static StatusOr<std::unique_ptr<GroupBlock>> Create(uint64_t page_bytes, uint64_t chunk_pages,
                                                      const std::vector<TierShape>& tiers);

  StatusOr<UniqueFd> Export(int pool) override;
  void Join(size_t tier, uint64_t chunk, uint64_t pages, int pool) override;
  bool Take(size_t tier, uint64_t chunk, uint64_t pages) override;
  void Out(size_t tier, uint64_t chunk) override;
  uint64_t Reclaim(const std::vector<uint32_t>& live) override;
  void ForEachOwned(size_t tier, uint64_t chunk,
                    const std::function<void(uint32_t)>& owned) const override;
  Counters Read(uint64_t max, int pool) const override;
  void ResetHighWater() override;

 private:
  HostGroupBlock(uint64_t chunk_pages, const std::vector<TierShape>& tiers);

  std::unique_ptr<SharedMemory> memory_;
  kernels::GroupView view_{};
};

}  // namespace stash::daemon

#endif  // STASH_DAEMON_HOST_GROUP_BLOCK_H_
