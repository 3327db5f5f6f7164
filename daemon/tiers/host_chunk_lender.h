// The host backend's ChunkLender (tiers/chunk_lender.h): a tier lends its own chunks, out of the
// same memfds and ring daemon-copy pages. The twin of the cuda backend's lender
// (daemon/cuda/cuda_chunk_lender.h):
//   memory  the tier's ChunkMemory: memfds, exported as duplicates of their descriptors, renewed
//           (fresh pages) when they come back;
//   ring    the tier's page ring, under the tier's lock: Take takes out chunks wholly free at
//           that moment, Return appends a chunk's pages at the tail.
// Which chunks a stash wrote is known here (Taken.written), so a chunk never written needs no
// renewal. Calls come from Leases on several threads; each takes the tier's lock for the ring.
#ifndef STASH_DAEMON_HOST_CHUNK_LENDER_H_
#define STASH_DAEMON_HOST_CHUNK_LENDER_H_

#include <cstdint>
#include <vector>

#include "common/unique_fd.h"
#include "daemon/tiers/chunk_lender.h"
#include "daemon/tiers/tier.h"

namespace stash::daemon {

class HostChunkLender final : public ChunkLender {
 public:
  // `tier` (non-owning) owns this lender and outlives it.
  explicit HostChunkLender(Tier* tier) : tier_(*tier) {}

  StatusOr<std::vector<Taken>> Take(const Want& want) override;
  void Return(uint64_t chunk) override;
  Status Renew(uint64_t chunk) override;
  StatusOr<UniqueFd> Export(uint64_t chunk) override;
  uint64_t ChunkBytes(uint64_t chunk) const override;

 private:
  Tier& tier_;
};

}  // namespace stash::daemon

#endif  // STASH_DAEMON_HOST_CHUNK_LENDER_H_
