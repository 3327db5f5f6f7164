// Mapped mode's broker (docs/design.md, "Mapped mode"): which session holds which chunk of which
// tier, the per-session quota, auto sizing from the control blocks, and taking chunks back when
// their holder says it unmapped them or its process exited (a pidfd per holder, watched by a
// reaper thread: a SIGKILLed rank's chunks are free again within a second).
//
// A chunk is in exactly one state: pooled (its pages are in the tier's daemon-copy ring),
// leased (to one mapped session; out of the ring), or orphaned (its session's stream ended while
// the holder process lives: it may still write there, so the chunk waits for the exit).
//
// Memory hygiene: every chunk that comes back from a holder (it said it unmapped it, or its
// process exited) gets a fresh memfd at the same daemon address before it goes back to the ring
// every user's stashes share: a mapping or descriptor the holder kept, passed on or left to a
// child reaches memory nobody else will see. A pooled chunk that daemon-copy stashes wrote gets
// a fresh memfd before it is leased. So a lease always starts zero-filled and no byte crosses
// from one holder to the next.
//
// Peer chunks (--peer-tier): a session may lease another device pool's chunks only while that
// pool keeps more than half its chunks free after lending, so a pool's own ranks come first.
#ifndef STASH_DAEMON_LEASES_H_
#define STASH_DAEMON_LEASES_H_

#include <absl/base/thread_annotations.h>
#include <absl/container/flat_hash_map.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/unique_fd.h"
#include "daemon/control_block.h"
#include "daemon/descriptor_message.h"
#include "daemon/tier.h"
#include "stash/kernels/lease_control.h"
#include "stash/v1/descriptor.pb.h"
#include "stash/v1/stash.pb.h"

namespace stash::daemon {

struct LeaseConfig {
  uint64_t page_bytes = 0;
  uint64_t chunk_bytes = 0;      // Welcome.chunk_bytes (a whole number of pages)
  uint64_t max_lease_bytes = 0;  // per session over all tiers
  bool peer_tier = false;        // lend other pools' spare chunks
};

// The mapped session a request comes from, as checked by DaemonCore.
struct LeaseHolder {
  std::string session_id;
  int pool = 0;
  bool allow_host_spill = false;
  uint32_t uid = 0;
  int64_t pid = 0;  // SO_PEERCRED of the descriptor connection (daemon's pid namespace)
  int socket = -1;  // that connection, to confirm it still lives once the pidfd is open
};

// Thread-safe.
class Leases {
 public:
  // `pools` are the device tiers by pool index, `host` the host tier (may be null); non-owning,
  // they outlive this. Starts the reaper thread.
  Leases(std::vector<Tier*> pools, Tier* host, LeaseConfig config);
  Leases(const Leases&) = delete;
  Leases& operator=(const Leases&) = delete;
  ~Leases();  // stops the reaper

  const LeaseConfig& config() const { return config_; }

  // Sets a session's lease (stash/v1/descriptor.proto LeaseChunks): one part per chunk newly
  // granted, the control block's first at the session's first granted lease, then `last`.
  DescriptorReply Lease(const LeaseHolder& who, const stash::v1::LeaseChunks& request);
  // Takes back chunks the session holds; NOT_FOUND (nothing returned) for any other id.
  DescriptorReply Return(const LeaseHolder& who, const stash::v1::ReturnChunks& request);
  // The session's stream ended: its chunks stay orphaned until its process exits.
  void SessionEnded(const std::string& session_id);

  // Stats of one tier (by pointer) and of one session; false when the session leased nothing.
  struct TierCounts {
    uint64_t leased = 0;
    uint64_t orphaned = 0;
  };
  TierCounts Counts(const Tier* tier);
  bool Describe(const std::string& session_id, std::vector<stash::v1::LeaseStats>* leases,
                ControlView* control);
  // Holders tracked (sessions with a lease, live or orphaned), for tests.
  size_t holders();

  // Chunk ids: the tier index (pools, then host) in the high 32 bits, the chunk in the low.
  static uint64_t ChunkId(uint64_t tier, uint64_t chunk) { return (tier << 32) | chunk; }

 private:
  enum class State { kPooled, kLeased, kOrphaned };
  static constexpr uint64_t kMaxHoldersPerUser = 256;
  struct Chunk {
    State state = State::kPooled;
    std::string holder;  // session id while leased or orphaned
  };
  struct Holder {
    std::string session_id;
    int pool = 0;
    bool allow_host_spill = false;
    uint32_t uid = 0;
    UniqueFd pidfd;
    std::unique_ptr<ControlBlock> control;
    bool control_sent = false;
    bool ended = false;      // the stream ended: chunks are orphaned
    bool automatic = false;  // its last lease was automatic
    std::array<std::vector<uint64_t>, kernels::kLeaseTiers> held;  // chunk ids per lease tier
    std::array<uint64_t, kernels::kLeaseTiers> below{};  // auto requests the aim sat below
    std::array<uint64_t, kernels::kLeaseTiers> aim{};    // auto: the pages aimed at
  };

  Holder* FindOrCreate(const LeaseHolder& who, Status* status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t HeldPages(const Holder& h, uint32_t lease_tier) const;
  uint64_t PagesOf(uint64_t id) const;
  // Grants chunks of `lease_tier` until the holder holds >= `target` pages, at most `budget`
  // pages more; appends a part per chunk.
  Status Grow(Holder& h, uint32_t lease_tier, uint64_t target, uint64_t budget,
              std::vector<DescriptorPart>* parts) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands one chunk just taken out of its ring to `h`.
  Status Hand(Holder& h, uint32_t lease_tier, uint64_t tier, uint64_t chunk, bool written,
              std::vector<DescriptorPart>* parts) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives a chunk fresh memory and puts it back in its ring (retired, with an error logged, when
  // it cannot get fresh memory: the holder's may still be reachable).
  void PutBack(uint64_t tier, uint64_t chunk) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Drop(const std::string& session_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Reap();
  void Wake();

  // Never change after construction.
  const LeaseConfig config_;
  const std::vector<Tier*> tiers_;  // pools, then the host tier if any
  const size_t pools_;
  const bool has_host_;
  const uint64_t chunk_pages_;
  const uint64_t quota_pages_;
  UniqueFd wake_;  // eventfd: the holder set changed, or stop

  Mutex mu_;
  std::vector<std::vector<Chunk>> chunks_ ABSL_GUARDED_BY(mu_);  // per tier
  absl::flat_hash_map<std::string, std::unique_ptr<Holder>> holders_ ABSL_GUARDED_BY(mu_);
  std::vector<UniqueFd> closing_ ABSL_GUARDED_BY(mu_);  // pidfds the reaper closes
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread reaper_;
};

}  // namespace stash::daemon

#endif  // STASH_DAEMON_LEASES_H_
