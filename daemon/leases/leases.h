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
// Fair shares: every tier's chunks are a FairShare between Unix users (daemon/limits/fair_share.h):
// a user may lease a tier's chunks only while a first session's worth (stashd keeps a sixteenth of
// the tier, at least one chunk: LeaseConfig::first_share_divisor) stays free for another user. A
// chunk that cannot get fresh memory when it comes back (out of memory) waits, out of every ring,
// and is renewed again by the reaper every second until it can go back: it is never lost to the
// pool.
//
// Peer chunks (--peer-tier): a session may lease another device pool's chunks only while that
// pool keeps more than half its chunks free after lending, so a pool's own ranks come first.
//
// Groups (docs/design.md, "Groups"): the sessions of one job (LeaseHolder.group_id) lease as
// one. The group holds chunks, every member is sent every one of them (with the group's depot,
// daemon/leases/group_block.h) and claims their pages itself, page by page; a member that
// exits has exactly the pages its tag owns freed, and the group's chunks go back to their rings,
// renewed, once its last member is gone.
//
// Files: daemon/leases/leases.cc leases and stats; daemon/leases/lease_returns.cc the way back
// (returns, ended sessions, the reaper); daemon/leases/group_leases.cc groups.
//
// Locking: one lock (mu_) over the books, never held while a lender waits or works on memory
// (Rehand's export of a kept chunk aside: one driver call on memory already committed). Taking
// chunks out of a GPU's ring waits for that GPU's copy stream, and renewing a GPU chunk releases
// and commits VRAM: a lease, a return or the reaper does that with mu_ released, so the calls on
// other threads never wait for one GPU's stream: stats (stashctl, Prometheus) and a session's end
// on gRPC's threads, and the reaper sampling control blocks and reaping exited ranks. (Leases and
// returns all come from the descriptor server's one thread, so they still take turns.) A chunk
// taken or given back is in no ring and no holder's hands meanwhile, so only the thread that took
// it works on it; a holder a Lease works on is busy, and other calls for it (its return, its
// session's end, the reaper at its exit) wait until it is idle.
#ifndef STASH_DAEMON_LEASES_H_
#define STASH_DAEMON_LEASES_H_

#include <absl/base/thread_annotations.h>
#include <absl/container/flat_hash_map.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/unique_fd.h"
#include "daemon/leases/control_block.h"
#include "daemon/leases/group_block.h"
#include "daemon/limits/fair_share.h"
#include "daemon/limits/rate_limiter.h"
#include "daemon/protocol/descriptor_message.h"
#include "daemon/tiers/tier.h"
#include "stash/kernels/lease_control.h"
#include "stash/v1/descriptor.pb.h"
#include "stash/v1/stash.pb.h"

namespace stash::daemon {

struct LeaseConfig {
  uint64_t page_bytes = 0;
  uint64_t chunk_bytes = 0;      // Welcome.chunk_bytes (a whole number of pages)
  uint64_t max_lease_bytes = 0;  // per session in each tier
  bool peer_tier = false;        // lend other pools' spare chunks
  // A group's members claim free pages of the group's chunks on other devices when their own
  // device's are taken (docs/design.md, "Groups").
  bool group_peer = true;
  // Each tier keeps tier chunks / first_share_divisor (at least one) for another user's first
  // session (daemon/limits/fair_share.h); 0 = no such share (every chunk to whoever asks first).
  uint64_t first_share_divisor = 0;
  // Makes each group's depot (daemon/leases/group_block.h): unset = the host backend's memfd
  // (HostGroupBlock); the cuda backend's puts one in each GPU's memory (CudaGroupBlock).
  GroupBlock::Factory group_blocks;
  // Whether a group's members may claim pages of other devices' pools (TIER_PEER): on the cuda
  // backend a member's plan kernel claims only in its own GPU's depot, so the daemon sends no
  // other GPU's chunks.
  bool group_peer_depots = true;
};

// The mapped session a request comes from, as checked by DaemonCore.
struct LeaseHolder {
  std::string session_id;
  int pool = 0;
  bool allow_host_spill = false;
  uint32_t uid = 0;
  int64_t pid = 0;  // SO_PEERCRED of the descriptor connection (daemon's pid namespace)
  int socket = -1;  // that connection, to confirm it still lives once the pidfd is open
  // The most descriptors the answer may carry (the user's share of descriptors in flight).
  uint64_t max_descriptors = UINT64_MAX;
  // What the rank said in its Hello, for the event lines of MappedActivity.
  int64_t rank = -1;
  int64_t hello_pid = 0;
  std::string label;
  // The session's group (daemon/sessions/group_registry.h): 0 = none, its chunks are its own.
  uint64_t group_id = 0;
  std::string group;
};

// What a mapped session's control block added to its totals since the previous sample of the
// same holder (ControlBlock::Read keeps the totals monotone, so nothing here is negative and no
// number is counted twice), with who the session is, for the node's totals and event log.
struct MappedActivity {
  std::string session_id;
  int64_t rank = -1;
  int64_t pid = 0;  // as the Hello said
  int pool = 0;
  std::string label;
  bool allow_host_spill = false;
  uint64_t step = 0;   // the rank's step at this sample
  uint64_t steps = 0;  // BeginSteps since the previous sample
  uint64_t stashes = 0;
  uint64_t reloads = 0;
  uint64_t releases = 0;
  uint64_t bytes_stashed = 0;
  uint64_t bytes_reloaded = 0;
  uint64_t spills = 0;
  uint64_t overflows = 0;
  uint64_t rejected = 0;
};

// Thread-safe.
class Leases {
 public:
  // `pools` are the device tiers by pool index; `hosts` the host tier: none, one every pool's
  // sessions lease from (host backend), or one per pool, by pool index (the cuda backend's
  // per-GPU shares). Non-owning, they outlive this. Starts the reaper thread.
  Leases(std::vector<Tier*> pools, std::vector<Tier*> hosts, LeaseConfig config);
  Leases(const Leases&) = delete;
  Leases& operator=(const Leases&) = delete;
  ~Leases();  // stops the reaper

  const LeaseConfig& config() const { return config_; }

  // Receives every sample of every holder's control block that found its totals grown, called
  // under the broker's lock (it must not call into Leases): the reaper samples each holder once
  // a second, Sample() on demand, and each holder gets a last sample when its session ends and
  // when it is dropped (a SIGKILLed rank's last step included). Set before the first Lease;
  // without a listener no block is sampled.
  void SetActivityListener(std::function<void(const MappedActivity&)> listener);
  // Samples every holder's control block now (before stats are read).
  void Sample();

  // Sets a session's lease (stash/v1/descriptor.proto LeaseChunks): one part per chunk newly
  // granted, the control block's first at the session's first granted lease, then `last`.
  DescriptorReply Lease(const LeaseHolder& who, const stash::v1::LeaseChunks& request);
  // Takes back chunks the session holds; NOT_FOUND (nothing returned) for any other id.
  DescriptorReply Return(const LeaseHolder& who, const stash::v1::ReturnChunks& request);
  // The session's stream ended: its chunks stay orphaned until its process exits, or until a
  // later session of the same process (pid and uid) returns them.
  void SessionEnded(const std::string& session_id);
  // Sets or clears kDaemonDraining in every holder's control block, and in those created from
  // now on (stashctl drain, undrain).
  void SetDraining(bool draining);
  // The stashes a session's control block says are live (clamped; 0 for an unknown session).
  uint64_t StashesLive(const std::string& session_id);
  // The daemon_flags of a session's control block (0 for an unknown session), for tests.
  uint64_t DaemonFlags(const std::string& session_id);

  // Stats of one tier (by pointer) and of one session; false when the session leased nothing.
  struct TierCounts {
    uint64_t leased = 0;
    uint64_t orphaned = 0;
    uint64_t kept = 0;
    uint64_t waiting = 0;  // State::kRenewing
  };
  TierCounts Counts(const Tier* tier);
  // `live` (optional): its live stashes by tag, from the block's live-stash table.
  bool Describe(const std::string& session_id, std::vector<stash::v1::LeaseStats>* leases,
                ControlView* control, LiveView* live = nullptr);
  // One row per group holding memory (stashctl sessions, the metrics), at most `max_rows`.
  std::vector<stash::v1::GroupStats> DescribeGroups(size_t max_rows = 256);
  // Holders tracked (sessions with a lease, live or orphaned), for tests.
  size_t holders();
  // Chunks out of every ring until they have fresh memory (being renewed now, or waiting for the
  // reaper's retry), for tests.
  size_t renewing();
  // The fair share of tier `tier` (pools, then the host tiers), for tests and stats.
  const FairShare& share(size_t tier) const { return *shares_[tier]; }

  // Chunk ids: the tier index (pools, then the host tiers) in the high 32 bits, the chunk in the
  // low.
  static uint64_t ChunkId(uint64_t tier, uint64_t chunk) { return (tier << 32) | chunk; }
  static uint64_t TierOfId(uint64_t id) { return id >> 32; }
  static uint64_t ChunkOfId(uint64_t id) { return id & 0xffffffffu; }
  // The wire's tier of a lease tier (kernels::LeaseTier).
  static stash::v1::Tier ProtoTier(uint32_t lease_tier);

 private:
  // kKept: returned by a live holder whose process may still hold its memory (GPU chunks:
  // ChunkLender::ChargeReturnsUntilExit); lent again only to it, renewed at its exit.
  // kRenewing: out of every ring until it has fresh memory (the reaper retries).
  enum class State { kPooled, kLeased, kOrphaned, kKept, kRenewing };
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
    int64_t pid = 0;  // the leasing process (its later sessions may return orphaned chunks)
    UniqueFd pidfd;
    std::unique_ptr<ControlBlock> control;
    bool ended = false;      // the stream ended: chunks are orphaned
    bool automatic = false;  // its last lease was automatic
    std::array<std::vector<uint64_t>, kernels::kLeaseTiers> held;  // chunk ids per lease tier
    // Chunk ids it returned that stay charged to it until its process exits (State::kKept).
    std::array<std::vector<uint64_t>, kernels::kLeaseTiers> kept;
    std::array<uint64_t, kernels::kLeaseTiers> below{};  // auto requests the aim sat below
    std::array<uint64_t, kernels::kLeaseTiers> aim{};    // auto: the pages aimed at
    uint32_t samples = 0;     // auto: leases sized from a step's demand (at most 2 counted)
    uint64_t steps_seen = 0;  // auto: the control block's `steps` at the last request
    // Asked (through the control block) to give back what it holds above its aim, per tier,
    // until it holds no more than the aim.
    std::array<bool, kernels::kLeaseTiers> return_asked{};
    int64_t rank = -1;  // from the Hello, for MappedActivity
    int64_t hello_pid = 0;
    std::string label;
    ControlView reported;  // the totals the listener was last given
    // A member of group `group` (0 = none), claiming with `tag`; the group's chunks it was
    // sent (and so may map), and whether it was sent the depot.
    uint64_t group = 0;
    uint32_t tag = 0;
    std::vector<uint64_t> sent;
    bool depot_sent = false;
    // A Lease is taking, renewing or exporting chunks for it with mu_ released: no other call
    // changes or drops it until it is idle again (WaitIdle).
    bool busy = false;
  };
  // Chunks (tier, chunk) taken out of every holder's hands (State::kRenewing) for the caller to
  // renew and put back after it released mu_ (RenewAndReturn).
  using Renewals = std::vector<std::pair<uint64_t, uint64_t>>;
  // One job's sessions on this node (group_leases.cc). Its chunks are State::kLeased with
  // holder GroupKey(id), charged to the group's user.
  struct Group {
    uint64_t id = 0;
    uint32_t uid = 0;
    std::string name;
    std::unique_ptr<GroupBlock> block;
    uint32_t next_tag = kernels::kFirstMemberTag;
    std::vector<uint64_t> chunks;      // chunk ids it holds
    std::vector<std::string> members;  // holders' session ids
    std::vector<uint32_t> live_tags;   // the members' tags
    // Per pool: the dry counters of its members' depot at the last lease of one of them.
    std::vector<uint64_t> dry_seen, dry_pages_seen;
    // Sizing: the group's step (its members' most BeginSteps), the claimed high water of its
    // last steps, and how many steps in a row it held more than they call for.
    uint64_t step = 0;
    std::vector<uint64_t> windows;
    uint64_t high_water = 0;  // the most pages claimed at once in any step so far
    uint32_t above = 0;
    std::vector<uint64_t> leaving;  // chunk ids taken back, waiting for members to unmap them
  };
  static std::string GroupKey(uint64_t id) { return "group:" + std::to_string(id); }
  // The most group chunks one lease answer carries (the member asks again for the rest).
  static constexpr uint64_t kGroupChunksPerAnswer = 16;
  class BusyHolder;

  // `wanting` could not grow `lease_tier` to its aim: every automatic session of the same
  // source goes down to its aim at its next lease (not after three steps), and one holding
  // more than its aim now is asked, through its control block, to give the rest back at its
  // next step (once, until it holds no more than its aim).
  // With `same_user_only`, only sessions of `wanting`'s user are asked.
  void AskForReturns(const Holder& wanting, uint32_t lease_tier, bool same_user_only)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Holder* FindOrCreate(const LeaseHolder& who, Status* status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The holder of `session_id` once no Lease works on it with mu_ released (null when there is
  // none, or it was dropped meanwhile). May release and retake mu_.
  Holder* WaitIdle(const std::string& session_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  DescriptorReply ReturnLocked(const LeaseHolder& who, const stash::v1::ReturnChunks& request,
                               Renewals* renew) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Return with ended_session_id set: chunks an ended session of who's process left orphaned.
  DescriptorReply ReturnOrphans(const LeaseHolder& who, const stash::v1::ReturnChunks& request,
                                Renewals* renew) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t HeldPages(const Holder& h, uint32_t lease_tier) const;
  uint64_t KeptPages(const Holder& h, uint32_t lease_tier) const;
  static bool HoldsNothing(const Holder& h);
  // True when chunk `id` names a chunk in `state` held by session `holder` (any id is checked).
  bool ChunkIs(uint64_t id, State state, const std::string& holder) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes chunks `ids` out of `h`'s held lists, each given back (Keep); ids it does not hold are
  // skipped.
  void GiveBack(Holder& h, const google::protobuf::RepeatedField<uint64_t>& ids, Renewals* renew)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A chunk `h` held in `lease_tier` and gave back: renewed for the pool (PutBack), or kept
  // charged to it when its process may still hold the memory.
  void Keep(Holder& h, uint32_t lease_tier, uint64_t id, Renewals* renew)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `h`'s control block, clamped to `held` (its pages per tier) and the quota.
  ControlView ReadControl(const Holder& h,
                          const std::array<uint64_t, kernels::kLeaseTiers>& held) const;
  uint64_t PagesOf(uint64_t id) const;
  // Grants chunks of `lease_tier` until the holder holds >= `target` pages, at most `budget`
  // pages more, within the user's fair share of the tier, while `parts` (a part per chunk,
  // appended) has fewer than `max_chunks`. `h` must be busy (BusyHolder): mu_ is released while
  // the lender takes, renews and exports chunks (it may wait for a GPU's copy stream and
  // commit VRAM), so the calls on other threads go on meanwhile ("Locking" above).
  Status Grow(Holder& h, uint32_t lease_tier, uint64_t target, uint64_t budget, uint64_t max_chunks,
              std::vector<DescriptorPart>* parts) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A chunk the lender took for a lease, renewed when written and exported, without mu_.
  struct Prepared {
    uint64_t chunk = 0;
    Status status;  // of its renew (the chunk then has no memory) or of its export
    bool renewed = true;
    UniqueFd fd;
  };
  // Renews (when written) and exports each chunk taken; a chunk whose export failed goes back
  // to the ring at once. Without mu_.
  static std::vector<Prepared> Prepare(ChunkLender* lender,
                                       const std::vector<ChunkLender::Taken>& taken);
  // Lends `h` again a chunk it returned and may still hold (kept): the same allocation. Exports
  // under mu_ (one driver call on memory already committed: no stream to wait for, no VRAM).
  Status Rehand(Holder& h, uint32_t lease_tier, uint64_t id, std::vector<DescriptorPart>* parts)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records a chunk as leased to `h` and adds its packet (with `fd`) to `parts`.
  void Lent(Holder& h, uint32_t lease_tier, uint64_t tier, uint64_t chunk, UniqueFd fd,
            std::vector<DescriptorPart>* parts) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives back a chunk `uid` held: out of its hands and its share now, onto `renew` for fresh
  // memory and its ring (RenewAndReturn, after mu_ is released).
  void PutBack(uint64_t tier, uint64_t chunk, uint32_t uid, Renewals* renew)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Renews each chunk and returns it to its ring, without mu_ (a GPU chunk's renew releases and
  // commits VRAM). One that cannot get fresh memory now (the holder's may still be reachable)
  // waits in renew_ and the reaper tries again; said in the log on the first try, not on the
  // reaper's retries.
  void RenewAndReturn(const Renewals& chunks, bool retry) ABSL_LOCKS_EXCLUDED(mu_);
  // A chunk whose renew failed (`why`): out of every ring and every holder's hands until the
  // reaper's retry gives it fresh memory. `first`: its first failure, said in the log and
  // starting the reaper's timer (not on the reaper's own retries: it would spin).
  void RenewLater(uint64_t tier, uint64_t chunk, const Status& why, bool first)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Drop(const std::string& session_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // group_leases.cc. A group member's lease: the group grows when its depot ran dry (or the
  // member's pool has none of its chunks yet), and the member is sent what it has not mapped.
  DescriptorReply LeaseGroup(Holder& h, const LeaseHolder& who,
                             const stash::v1::LeaseChunks& request, uint64_t max_chunks,
                             bool send_control) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Group* JoinGroup(Holder& h, const LeaseHolder& who, Status* status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes up to `max_chunks` free chunks of tier `source` for `g`, within its user's share (mu_
  // released meanwhile; `h` busy), for the members of pool `pool`. Returns how many.
  uint64_t GrowGroup(Group& g, size_t source, uint64_t max_chunks, int pool)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A member returns group chunks it unmapped (ReturnChunks): once it maps none, its pages are
  // freed.
  DescriptorReply ReturnGroupChunks(Holder& h, const stash::v1::ReturnChunks& request,
                                    Renewals* renew) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // At a new step of `g`: when it held more than its last three steps' claimed high water (plus
  // an eighth, at least a chunk) for three steps, takes back chunks none of whose pages a
  // member owns (the host tier's first, then other devices', then the own devices' last
  // joined) down to that.
  void SizeGroup(Group& g) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Once a second (the reaper): frees pages whose tag no live member of their group has
  // (garbage a member wrote), and says so in the log.
  void ScrubGroups() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Leaving chunks of `g` no member maps any more go back to their rings (onto `renew`).
  void SettleLeaving(Group& g, Renewals* renew) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Rows for GroupStats, at most `max_rows`.
  void DescribeGroupsLocked(std::vector<stash::v1::GroupStats>* rows, size_t max_rows)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `h` leaves its group (it exited, or ended mapping nothing): the pages its tag owns are
  // freed; the group's last member takes the group's chunks back to their rings (onto `renew`).
  void LeaveGroup(Holder& h, Renewals* renew) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The lease tier a chunk of daemon tier `tier` is to a member of pool `pool`.
  uint32_t LeaseTierFor(size_t tier, int pool) const;
  // Reads `h`'s control block and gives the listener what grew since the last sample.
  void SampleHolder(Holder& h) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Reap();
  void Wake();

  // Never change after construction.
  const LeaseConfig config_;
  // The index in tiers_ of the host tier the sessions of pool `pool` lease from (has_host_).
  size_t HostSource(int pool) const {
    return pools_ + (tiers_.size() - pools_ == 1 ? 0 : static_cast<size_t>(pool));
  }

  // Never change after construction.
  const std::vector<Tier*> tiers_;  // pools, then the host tiers if any
  const size_t pools_;
  const bool has_host_;
  const uint64_t chunk_pages_;
  const uint64_t quota_pages_;
  std::vector<std::unique_ptr<FairShare>> shares_;  // per tier, in chunks
  UniqueFd wake_;                                   // eventfd: the holder set changed, or stop

  Mutex mu_;
  CondVar idle_;                                                 // a busy holder became idle
  std::vector<std::vector<Chunk>> chunks_ ABSL_GUARDED_BY(mu_);  // per tier
  absl::flat_hash_map<std::string, std::unique_ptr<Holder>> holders_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::unique_ptr<Group>> groups_ ABSL_GUARDED_BY(mu_);
  std::vector<UniqueFd> closing_ ABSL_GUARDED_BY(mu_);  // pidfds the reaper closes
  // Chunks that came back and could not get fresh memory yet (tier, chunk): out of every ring.
  std::vector<std::pair<uint64_t, uint64_t>> renew_ ABSL_GUARDED_BY(mu_);
  // A group's chunks its last member left behind (Drop), for the reaper to renew at once.
  Renewals group_returns_ ABSL_GUARDED_BY(mu_);
  // Lines about leases that stopped at their user's share.
  RateLimiter share_log_{1, std::chrono::seconds(10)};
  // Lines about garbage in groups' depots.
  RateLimiter garbage_log_{1, std::chrono::seconds(10)};
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void(const MappedActivity&)> listener_;  // set before the first Lease
  bool draining_ ABSL_GUARDED_BY(mu_) = false;           // control blocks are created draining
  std::thread reaper_;
};

}  // namespace stash::daemon

#endif  // STASH_DAEMON_LEASES_H_
