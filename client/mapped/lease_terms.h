// What both twins of a mapped session (client/mapped/mapped_session.h on the host backend,
// client/mapped/cuda/cuda_mapped_session.h on the cuda backend) read the same way from the daemon's
// Welcome and the caller's Options: how big each lease tier's address range is, what a fixed lease
// asks for, and how the wire's tiers name the rank's.
#ifndef STASH_CLIENT_LEASE_TERMS_H_
#define STASH_CLIENT_LEASE_TERMS_H_

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "stash/kernels/lease_control.h"
#include "stash/options.h"
#include "stash/status.h"
#include "stash/v1/stash.pb.h"

namespace stash::client {

// The rank's lease tier (kernels::LeaseTier) of a stash.v1.Tier.
uint32_t LeaseTierOf(int wire_tier);

// FAILED_PRECONDITION when the daemon on `socket` leases no chunks (an old daemon).
Status CheckLeasesChunks(const v1::Welcome& welcome, const std::string& socket);

// Each tier's address range in bytes (kernels::LeaseTier order): the quota, within what the
// tier itself has (the own device: its pool; the peer tier: the quota; the host tier: its pages).
std::array<uint64_t, kernels::kLeaseTiers> LeaseTierBytes(const v1::Welcome& welcome);

// What a fixed lease (Options.lease.automatic false) asks for: (stash.v1.Tier, pages) per tier
// the session may lease. Peer chunks only from a daemon that lends them, host chunks only with
// allow_host_spill and a host tier (as in daemon-copy mode, where a session without them simply
// never spills).
std::vector<std::pair<int, uint64_t>> FixedLeaseWant(const Options& options,
                                                     const v1::Welcome& welcome);

// Maps the daemon's control block (a memfd of at least sizeof(SessionControl) bytes, said
// `bytes`) MAP_SHARED and MADV_DONTFORK, and checks its layout version: the caller munmaps it.
StatusOr<kernels::SessionControl*> MapControlBlock(int fd, uint64_t bytes);

}  // namespace stash::client

#endif  // STASH_CLIENT_LEASE_TERMS_H_
