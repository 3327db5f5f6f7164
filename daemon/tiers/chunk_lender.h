// What a tier lends to mapped sessions (daemon/leases/leases.h): its chunks, taken out of the
// tier's daemon-copy ring while a session holds them and put back after. Leases decides who gets
// which chunk; the lender knows where the ring and the memory live. Two lenders:
//   host (tier.cc, Tier::lender() of a host-backend tier): the ring in host memory, changed
//        under the tier's lock; memfd chunks (daemon/tiers/chunk_memory.h).
//   cuda (daemon/cuda/cuda_chunk_lender.h): the ring in device memory, changed only by kernels on
//   the
//        GPU's copy stream; a GPU pool's VMM chunks exported as POSIX fds
//        (daemon/cuda/vmm_chunk_memory.h), or the GPU's share of the host tier, memfds page-locked
//        for it (daemon/cuda/pinned_chunk_memory.h).
//
// Calls come from Leases without its lock, from several threads at once (a lease, a return, the
// reaper), and the daemon-copy path runs beside them. Take and Return are safe to call at once
// (each lender changes its ring under its own lock or in its stream's order); Renew and Export may
// run at once for different chunks, never for one chunk (Leases works on a chunk it took or took
// back from one thread at a time). `want` runs inside Take and must not call into Leases.
#ifndef STASH_DAEMON_CHUNK_LENDER_H_
#define STASH_DAEMON_CHUNK_LENDER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/unique_fd.h"
#include "stash/status.h"

namespace stash::daemon {

class ChunkLender {
 public:
  // Asked once per chunk that is wholly free, in chunk order: the chunk, and how many wholly
  // free chunks are left counting this one. True takes it; false stops the walk.
  using Want = std::function<bool(uint64_t chunk, uint64_t free_left)>;
  struct Taken {
    uint64_t chunk = 0;
    // Daemon-copy stashes may have written it since it entered the ring: renew before lending.
    bool written = false;
  };

  virtual ~ChunkLender() = default;

  // Takes the chunks `want` chose out of the ring: they count as used, in no ring, until
  // Return. May take fewer than chosen (a stash took a page of one meanwhile: it stays pooled);
  // never one that was not chosen. An error takes nothing.
  virtual StatusOr<std::vector<Taken>> Take(const Want& want) = 0;
  // Puts a chunk Take took back at the ring's tail, its memory as it is. A chunk Waiting listed
  // (or one a failed Renew left without memory) is renewed first.
  virtual void Return(uint64_t chunk) = 0;
  // Gives a taken chunk fresh zero-filled memory at the same daemon address, so no byte of a
  // holder or of daemon-copy stashes reaches the next one. RESOURCE_EXHAUSTED when there is no
  // memory now: the chunk is left out of the ring (its old memory released) and may be renewed
  // again later.
  virtual Status Renew(uint64_t chunk) = 0;
  // A new descriptor of a taken chunk's memory, to send with its lease.
  virtual StatusOr<UniqueFd> Export(uint64_t chunk) = 0;
  // The chunk's size in bytes (whole pages; the last chunk may be smaller).
  virtual uint64_t ChunkBytes(uint64_t chunk) const = 0;
  // The 16-byte UUID of the GPU a chunk lives on (LeasedChunk.gpu_uuid); empty for host memory.
  virtual std::string gpu_uuid() const { return {}; }
  // Whether a chunk a live holder returns must stay charged to it until its process exits
  // (Leases lends it again only to that holder): a holder that keeps a mapping or an exported
  // descriptor keeps the old memory alive after a renew, so renewing at once would let a client
  // that leases and returns in a loop take memory nobody accounts for. True for GPU chunks
  // (VRAM) and for the cuda backend's host chunks (populated and locked by the daemon); a host
  // backend's memfds are renewed at once (their next holder populates them).
  virtual bool ChargeReturnsUntilExit() const { return false; }
  // Chunks out of the ring since start because they have no memory yet (created lazily: a GPU
  // still holding a restarted daemon's old chunks for ranks that map them). Leases renews them
  // until they get memory, then returns them. Asked once, when Leases starts.
  virtual std::vector<uint64_t> Waiting() { return {}; }
};

}  // namespace stash::daemon

#endif  // STASH_DAEMON_CHUNK_LENDER_H_
