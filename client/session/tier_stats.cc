#include "client/session/tier_stats.h"

namespace stash::client {

void AddTierStats(const stash::v1::TierStats& tier, SessionStats* out) {
  const bool host = tier.tier() == stash::v1::TIER_HOST ||
                    (tier.tier() == stash::v1::TIER_UNSPECIFIED && tier.pool() < 0);
  if (host) {
    // The host backend's host tier is shared (pool -1); the cuda backend's is split per GPU.
    if (tier.pool() >= 0 && tier.pool() != out->pool) return;
    out->host_pages_total = tier.pages_total();
    out->host_pages_used = tier.pages_used();
    out->host_pages_high_water = tier.pages_high_water();
    return;
  }
  if (tier.pool() != out->pool) return;
  out->pool_pages_total = tier.pages_total();
  out->pool_pages_used = tier.pages_used();
  out->pool_pages_high_water = tier.pages_high_water();
}

}  // namespace stash::client
