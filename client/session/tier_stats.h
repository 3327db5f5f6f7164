// Which tiers of a daemon's GetStats belong to a session's SessionStats (internal).
#ifndef STASH_CLIENT_TIER_STATS_H_
#define STASH_CLIENT_TIER_STATS_H_

#include "stash/client.h"
#include "stash/v1/stash.pb.h"

namespace stash::client {

// Adds `tier` to `out` if it is the session's pool (`out->pool`) or the host tier it spills to,
// matched on what the tier is (TierStats.tier), not on its pool index alone: on the cuda backend
// each GPU's share of the host tier carries that GPU's pool index. A tier from a daemon that
// does not say what it is counts as the host tier when its pool is -1 (the host backend's).
void AddTierStats(const stash::v1::TierStats& tier, SessionStats* out);

}  // namespace stash::client

#endif  // STASH_CLIENT_TIER_STATS_H_
