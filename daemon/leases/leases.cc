#include "daemon/leases/leases.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "common/logging.h"
#include "common/macros.h"
#include "common/sys.h"

namespace stash::daemon {
namespace {

namespace v1 = stash::v1;
namespace k = stash::kernels;

constexpr uint32_t kDevice = k::kLeaseDevice;
constexpr uint32_t kPeer = k::kLeasePeer;
constexpr uint32_t kHost = k::kLeaseHost;

}  // namespace

v1::Tier Leases::ProtoTier(uint32_t lease_tier) {
  switch (lease_tier) {
    case kDevice:
      return v1::TIER_DEVICE;
    case kPeer:
      return v1::TIER_PEER;
    default:
      return v1::TIER_HOST;
  }
}

namespace {

const std::string& ProtoTierName(uint32_t lease_tier) {
  return v1::Tier_Name(Leases::ProtoTier(lease_tier));
}

uint32_t LeaseTierOf(v1::Tier tier) {
  return tier == v1::TIER_DEVICE ? kDevice : tier == v1::TIER_PEER ? kPeer : kHost;
}

uint64_t RoundUp(uint64_t pages, uint64_t unit) { return (pages + unit - 1) / unit * unit; }

int PidfdOpen(int64_t pid) {
  return static_cast<int>(syscall(SYS_pidfd_open, static_cast<pid_t>(pid), 0));
}

UniqueFd Dup(int fd) { return UniqueFd(fcntl(fd, F_DUPFD_CLOEXEC, 0)); }

}  // namespace

Leases::Leases(std::vector<Tier*> pools, std::vector<Tier*> hosts, LeaseConfig config)
    : config_(std::move(config)),
      tiers_([&] {
        STASH_CHECK(hosts.size() <= 1 || hosts.size() == pools.size())
            << hosts.size() << " host tiers for " << pools.size() << " pools";
        std::vector<Tier*> all = pools;
        all.insert(all.end(), hosts.begin(), hosts.end());
        return all;
      }()),
      pools_(pools.size()),
      has_host_(!hosts.empty()),
      chunk_pages_(std::max<uint64_t>(1, config_.chunk_bytes / config_.page_bytes)),
      quota_pages_(config_.max_lease_bytes / config_.page_bytes),
      wake_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
  STASH_CHECK(wake_.valid()) << "eventfd: " << std::strerror(errno);
  {
    MutexLock lock(&mu_);
    for (size_t t = 0; t < tiers_.size(); ++t) {
      chunks_.emplace_back(tiers_[t]->chunks());
      ChunkLender* lender = tiers_[t]->lender();
      if (lender == nullptr) continue;
      // Chunks without memory yet: out of every ring, renewed by the reaper until they have it.
      for (uint64_t c : lender->Waiting()) {
        chunks_[t][c].state = State::kRenewing;
        renew_.emplace_back(t, c);
      }
    }
  }
  for (Tier* tier : tiers_) {
    FairShare::Spec spec;
    spec.what = "chunks of tier " + tier->name();
    spec.capacity = tier->chunks();
    spec.first = config_.first_share_divisor == 0
                     ? 0
                     : std::max<uint64_t>(1, tier->chunks() / config_.first_share_divisor);
    spec.advice =
        "the lease grows no further; chunks come back as other users' sessions return them or "
        "exit";
    shares_.push_back(std::make_unique<FairShare>(std::move(spec)));
  }
  reaper_ = std::thread([this] { Reap(); });
}

Leases::~Leases() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  Wake();
  reaper_.join();
}

void Leases::Wake() {
  const uint64_t one = 1;
  if (write(wake_.get(), &one, sizeof(one)) != sizeof(one)) {
    Log("pool")->error("leases: cannot wake the reaper: {}", std::strerror(errno));
  }
}

uint64_t Leases::PagesOf(uint64_t id) const {
  return tiers_[TierOfId(id)]->ChunkPages(ChunkOfId(id));
}

ControlView Leases::ReadControl(const Holder& h,
                                const std::array<uint64_t, k::kLeaseTiers>& held) const {
  // Demand may pass the pool: up to the quota in every tier.
  return h.control->Read(held, quota_pages_ * k::kLeaseTiers, config_.page_bytes);
}

uint64_t Leases::HeldPages(const Holder& h, uint32_t lease_tier) const {
  uint64_t pages = 0;
  for (uint64_t id : h.held[lease_tier]) pages += PagesOf(id);
  return pages;
}

uint64_t Leases::KeptPages(const Holder& h, uint32_t lease_tier) const {
  uint64_t pages = 0;
  for (uint64_t id : h.kept[lease_tier]) pages += PagesOf(id);
  return pages;
}

bool Leases::HoldsNothing(const Holder& h) {
  auto none = [](const auto& lists) {
    return std::all_of(lists.begin(), lists.end(), [](const auto& l) { return l.empty(); });
  };
  return none(h.held) && none(h.kept) && h.sent.empty();
}

Leases::Holder* Leases::FindOrCreate(const LeaseHolder& who, Status* status) {
  auto it = holders_.find(who.session_id);
  if (it != holders_.end()) return it->second.get();
  // Each holder costs the daemon a pidfd, a control block (a descriptor and a mapping) and a
  // place in the reaper's poll: bounded per Unix user, like descriptor connections.
  uint64_t of_user = 0;
  for (const auto& [id, other] : holders_) of_user += other->uid == who.uid ? 1 : 0;
  if (of_user >= kMaxHoldersPerUser) {
    *status = ResourceExhaustedError(
        "uid " + std::to_string(who.uid) + " already has " + std::to_string(of_user) +
        " mapped sessions holding leases (the most one user may have; sessions whose process "
        "still lives count until it exits): close some first");
    return nullptr;
  }
  // The holder's identity for the reaper: a pidfd of the connecting process. The connection
  // must still be open once the pidfd is: then the pid was not reused in between.
  UniqueFd pidfd(PidfdOpen(who.pid));
  if (!pidfd.valid()) {
    *status = ErrnoStatus("pidfd_open(" + std::to_string(who.pid) + ") of the leasing process");
    return nullptr;
  }
  if (who.socket >= 0) {
    pollfd p{who.socket, POLLRDHUP, 0};
    int rc = 0;
    STASH_SYSCALL_RETRY(rc, poll(&p, 1, 0));
    if (rc < 0 || (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) {
      *status = PermissionDeniedError("the process that asked for a lease has gone");
      return nullptr;
    }
  }
  auto control = ControlBlock::Create();
  if (!control.ok()) {
    *status = control.status();
    return nullptr;
  }
  auto holder = std::make_unique<Holder>();
  holder->session_id = who.session_id;
  holder->pool = who.pool;
  holder->allow_host_spill = who.allow_host_spill;
  holder->uid = who.uid;
  holder->rank = who.rank;
  holder->hello_pid = who.hello_pid;
  holder->label = who.label;
  holder->pid = who.pid;
  holder->pidfd = std::move(pidfd);
  holder->control = std::move(control).value();
  if (draining_) holder->control->SetDraining(true);
  Holder* raw = holder.get();
  holders_[who.session_id] = std::move(holder);
  Wake();  // a new pidfd to watch
  return raw;
}

// Marks a holder busy for one Lease, and idle again at its end (mu_ held then: declared after
// the MutexLock), waking whoever waits for it.
class Leases::BusyHolder {
 public:
  BusyHolder(Leases* leases, Holder* h) : leases_(leases), h_(h) { h_->busy = true; }
  BusyHolder(const BusyHolder&) = delete;
  BusyHolder& operator=(const BusyHolder&) = delete;
  ~BusyHolder() {
    h_->busy = false;
    leases_->idle_.SignalAll();
  }

 private:
  Leases* const leases_;
  Holder* const h_;
};

Leases::Holder* Leases::WaitIdle(const std::string& session_id) {
  while (true) {
    auto it = holders_.find(session_id);
    if (it == holders_.end()) return nullptr;
    if (!it->second->busy) return it->second.get();
    idle_.Wait(&mu_);
  }
}

DescriptorReply Leases::Lease(const LeaseHolder& who, const v1::LeaseChunks& request) {
  MutexLock lock(&mu_);
  Status status;
  WaitIdle(who.session_id);  // another lease of the same session first
  Holder* h = FindOrCreate(who, &status);
  if (h == nullptr) return status;
  const BusyHolder busy(this, h);
  if (h->ended) return FailedPreconditionError("this session has ended");

  // The control block goes with every answer until the rank says it mapped it (an answer the
  // rank lost or could not map would otherwise leave the session without one for good).
  const bool send_control = !h->control->attached();
  // Each chunk granted is a descriptor sent; the answer may carry `who.max_descriptors` of them
  // (the user's share of descriptors in flight), the control block's first.
  if (send_control && who.max_descriptors == 0) {
    return ResourceExhaustedError(
        "uid " + std::to_string(who.uid) +
        " has its share of descriptors in flight to it, sent in answers not yet read: read "
        "those answers first");
  }
  const uint64_t max_chunks = who.max_descriptors - (send_control ? 1 : 0);
  if (who.group_id != 0) return LeaseGroup(*h, who, request, max_chunks, send_control);
  // A host tier without a lender (the cuda backend's share beside a pool without VMM) lends
  // nothing: as no host tier at all.
  const bool host_ok =
      has_host_ && h->allow_host_spill && tiers_[HostSource(h->pool)]->lender() != nullptr;
  std::array<bool, k::kLeaseTiers> allowed{true, config_.peer_tier && pools_ > 1, host_ok};
  std::array<uint64_t, k::kLeaseTiers> held{};
  for (uint32_t t = 0; t < k::kLeaseTiers; ++t) held[t] = HeldPages(*h, t);
  std::array<uint64_t, k::kLeaseTiers> capacity{};
  capacity[kDevice] = tiers_[static_cast<size_t>(h->pool)]->pages();
  for (size_t p = 0; p < pools_; ++p) {
    if (static_cast<int>(p) != h->pool) capacity[kPeer] += tiers_[p]->pages();
  }
  capacity[kHost] = has_host_ ? tiers_[HostSource(h->pool)]->pages() : 0;

  DescriptorReply reply;
  // Grows tier t to `want` pages where that is above what is held, within the quota (chunks may
  // be shorter or rounded, so the quota is checked in pages as granted).
  auto grow = [&](uint32_t t, uint64_t want) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!allowed[t] || want <= held[t]) return;
    // Chunks it returned and may still hold count against its quota until they are lent
    // back to it (Grow lends them first).
    const uint64_t charged = held[t] + KeptPages(*h, t);
    const uint64_t budget = quota_pages_ > charged ? quota_pages_ - charged : 0;
    Status grown = Grow(*h, t, want, budget, max_chunks, &reply.parts);
    if (!grown.ok()) Log("pool")->warn("session {}: lease: {}", h->session_id, grown.message());
    held[t] = HeldPages(*h, t);
    // A new automatic session (its first lease, or the first one a step sized) short of what
    // it aimed at, within the quota and the descriptors one answer may carry: the tier is
    // leased out. Sessions holding chunks their demand does not need are asked to give them
    // back at their next step: only its own user's when the user holds its whole share (no
    // other user's chunks could go to it). Not for every lease that falls short: in a pool
    // whose ranks' aims add up past it, giving back at once only leaves chunks free until the
    // next BeginStep, where the three steps' hysteresis keeps them used.
    if (request.automatic() && h->samples <= 1 && t != kPeer && held[t] < want &&
        held[t] + chunk_pages_ <= quota_pages_ && reply.parts.size() < max_chunks) {
      const size_t source = t == kDevice ? static_cast<size_t>(h->pool) : HostSource(h->pool);
      AskForReturns(*h, t, /*same_user_only=*/shares_[source]->Headroom(h->uid) == 0);
    }
  };
  std::array<uint64_t, k::kLeaseTiers> target = held;
  std::array<uint64_t, k::kLeaseTiers> pages_target = held;
  // Automatic: steps above the aim are counted once per step, not per request (a rank asks
  // mid-step too, when it outgrows its lease).
  bool new_step = false;
  bool sample = false;  // automatic: the request carries a step's demand
  if (!request.automatic()) {
    h->automatic = false;
    h->aim = {};
    h->below = {};
    bool over = false;
    std::string asked;
    for (uint32_t t = 0; t < k::kLeaseTiers; ++t) {
      for (const v1::TierPages& w : request.want()) {
        if (LeaseTierOf(w.tier()) != t) continue;
        if (!allowed[t] && w.pages() > 0) {
          return FailedPreconditionError(
              t == kPeer ? "this daemon lends no peer chunks (start stashd with --peer-tier and "
                           "--devices > 1), so TIER_PEER cannot be leased"
                         : "this session cannot lease TIER_HOST: the daemon has no host tier "
                           "that lends chunks (--host-tier-bytes=0, or a GPU without VMM) or "
                           "the session's Hello did not set allow_host_spill");
        }
        target[t] = std::min(w.pages(), quota_pages_ + 1);  // bounded: no overflow below
        target[t] = RoundUp(target[t], chunk_pages_);
        pages_target[t] = target[t];
        // As asked (whole chunks where that does not overflow), for the message.
        if (w.pages() > 0) {
          asked += std::string(asked.empty() ? "" : ", ") + v1::Tier_Name(ProtoTier(t)) + " " +
                   std::to_string(w.pages() <= quota_pages_ ? target[t] : w.pages()) + " pages";
        }
      }
      over = over || target[t] > quota_pages_;
    }
    if (over) {
      return ResourceExhaustedError(
          "the lease asks for " + (asked.empty() ? std::string("nothing") : asked) + " (pages of " +
          std::to_string(config_.page_bytes) + " bytes, in whole chunks of " +
          std::to_string(chunk_pages_) + " pages) but a session may lease at most " +
          std::to_string(quota_pages_) + " pages, " + std::to_string(config_.max_lease_bytes) +
          " bytes, of each tier (--max-lease-bytes): ask for less");
    }
    for (uint32_t t = 0; t < k::kLeaseTiers; ++t) grow(t, target[t]);
  } else {
    h->automatic = true;
    const ControlView view = ReadControl(*h, held);
    // Demand: the step before's, or the current step's so far when that is more (a rank that
    // outgrows its lease mid-step asks at once). A step with no stash tried (a rerun with the
    // stash off) says nothing about demand: the lease stays as it is.
    sample = view.last_step_stashes > 0 || view.step_stashes > 0;
    new_step = view.steps != h->steps_seen;
    h->steps_seen = view.steps;
    if (h->samples == 0 && held == std::array<uint64_t, k::kLeaseTiers>{} && !sample) {
      // No step behind: half the own pool's free chunks (at least one, at most the quota), so
      // ranks that start together each get room and a lone rank most of its pool. Steps then
      // size it to demand; a rank holding more than it needs gives back when asked. (A rank
      // that got nothing, its pool leased out, is sized by its steps' demand as soon as it has
      // one: into the host tier, and asking others back.)
      Tier* pool = tiers_[static_cast<size_t>(h->pool)];
      const uint64_t free_pages = pool->chunks_free() * chunk_pages_;
      const uint64_t want = std::min(RoundUp(quota_pages_, chunk_pages_),
                                     std::max(chunk_pages_, RoundUp(free_pages / 2, chunk_pages_)));
      grow(kDevice, want);
      for (uint32_t t = 0; t < k::kLeaseTiers; ++t) h->aim[t] = held[t];
    } else if (sample) {
      h->samples = std::min<uint32_t>(h->samples + 1, 2);
      const uint64_t demand =
          std::max(view.last_step_stashes > 0 ? view.last_step_demand_high_water : 0,
                   view.demand_high_water);
      const uint64_t largest =
          std::max(view.last_step_largest_stash_pages, view.largest_stash_pages);
      const uint64_t margin = std::max<uint64_t>(1, (demand + 7) / 8);
      uint64_t remaining = demand + margin;
      for (uint32_t t = 0; t < k::kLeaseTiers; ++t) {
        // A stash goes whole into one tier: a tier that takes part of the demand past the own
        // pool holds at least the step's largest stash, or that stash would overflow again.
        const uint64_t want =
            t != kDevice && remaining > 0 ? std::max(remaining, largest) : remaining;
        const uint64_t aim = allowed[t] ? std::min({RoundUp(want, chunk_pages_), capacity[t],
                                                    RoundUp(quota_pages_, chunk_pages_)})
                                        : 0;
        h->aim[t] = aim;
        grow(t, aim);
        // What the tier holds now covers that much of the demand; the rest goes on.
        remaining -= std::min(remaining, held[t]);
      }
    }
  }

  if (request.automatic()) {
    for (uint32_t t = 0; t < k::kLeaseTiers; ++t) {
      if (h->aim[t] < held[t]) {
        // A step with no stash (a rerun with the stash off) does not count toward shrinking.
        if (new_step && sample) h->below[t] = std::min<uint64_t>(h->below[t] + 1, 1000);
        // Above its aim for three steps, or asked to give back (another session waits for the
        // tier): down to the aim now.
        const bool asked = h->return_asked[t];
        pages_target[t] = h->below[t] >= 3 || asked ? h->aim[t] : held[t];
      } else {
        h->below[t] = 0;
        h->return_asked[t] = false;
        pages_target[t] = held[t];
      }
    }
  }
  for (uint32_t t = 0; t < k::kLeaseTiers; ++t) {
    if (!allowed[t]) continue;
    v1::TierLease* lease = reply.last.add_lease();
    lease->set_tier(ProtoTier(t));
    lease->set_chunks(h->held[t].size());
    lease->set_pages(held[t]);
    lease->set_pages_target(pages_target[t]);
  }
  if (send_control) {
    v1::DescriptorResponse block;
    block.set_more(true);
    block.mutable_control_block()->set_bytes(k::kControlBlockBytes);
    UniqueFd fd = Dup(h->control->fd());
    if (!fd.valid()) return ErrnoStatus("dup of the control block");
    reply.parts.insert(reply.parts.begin(),
                       DescriptorPart{DescriptorAnswer(Status::Ok(), block), std::move(fd)});
  }
  return reply;
}

void Leases::AskForReturns(const Holder& wanting, uint32_t lease_tier, bool same_user_only) {
  if (lease_tier == kPeer) return;  // peers lend only spare chunks: nothing to ask back
  for (auto& [id, other] : holders_) {
    Holder& g = *other;
    if (&g == &wanting || g.ended || !g.automatic || g.samples == 0) continue;
    if (same_user_only && g.uid != wanting.uid) continue;
    // Only holders of the tier the wanting session leases from: its pool, or its host tier (the
    // cuda backend's host tier is a share per pool).
    if (lease_tier == kDevice && g.pool != wanting.pool) continue;
    if (lease_tier == kHost && HostSource(g.pool) != HostSource(wanting.pool)) continue;
    // Its next automatic lease goes down to its new aim at once, not after three steps.
    const bool asked_before = g.return_asked[lease_tier];
    g.return_asked[lease_tier] = true;
    if (asked_before || HeldPages(g, lease_tier) <= g.aim[lease_tier]) continue;
    // Above its aim (its last step's demand and margin) now: down to it at its next step,
    // through the control block. Tiers not asked about keep what they hold.
    std::array<uint64_t, k::kLeaseTiers> target{};
    for (uint32_t t = 0; t < k::kLeaseTiers; ++t) {
      target[t] = g.return_asked[t] ? g.aim[t] : UINT64_MAX;
    }
    g.control->RequestReturn(target);
    Log("pool")->info(
        "session {}: asked to give back {} pages of {} it does not use at its next step, for "
        "session {}",
        g.session_id, HeldPages(g, lease_tier) - g.aim[lease_tier], ProtoTierName(lease_tier),
        wanting.session_id);
  }
}

Status Leases::Grow(Holder& h, uint32_t lease_tier, uint64_t target, uint64_t budget,
                    uint64_t max_chunks, std::vector<DescriptorPart>* parts) {
  std::vector<size_t> sources;
  if (lease_tier == kDevice) {
    sources.push_back(static_cast<size_t>(h.pool));
  } else if (lease_tier == kPeer) {
    for (size_t p = 0; p < pools_; ++p) {
      if (static_cast<int>(p) != h.pool) sources.push_back(p);
    }
  } else {
    sources.push_back(HostSource(h.pool));
  }
  uint64_t held = HeldPages(h, lease_tier);
  // First the chunks it returned and may still hold: the same memory, no renew, no new charge.
  while (held < target && !h.kept[lease_tier].empty() && parts->size() < max_chunks) {
    const uint64_t id = h.kept[lease_tier].back();
    h.kept[lease_tier].pop_back();
    STASH_RETURN_IF_ERROR(Rehand(h, lease_tier, id, parts));
    held += PagesOf(id);
  }
  for (size_t source : sources) {
    if (held >= target || budget == 0) break;
    Tier* tier = tiers_[source];
    ChunkLender* lender = tier->lender();
    if (lender == nullptr) continue;
    // The user's fair share of this tier's chunks (daemon/limits/fair_share.h), reserved now, under
    // mu_, for as many chunks as this lease could take (the tier's last chunk may be short:
    // one more); what is not handed goes back below.
    const uint64_t share = shares_[source]->Headroom(h.uid);
    const uint64_t room = max_chunks - std::min<uint64_t>(max_chunks, parts->size());
    const uint64_t need = (std::min(target - held, budget) + chunk_pages_ - 1) / chunk_pages_ + 1;
    const uint64_t reserved = std::min({share, room, need});
    STASH_CHECK(shares_[source]->Take(h.uid, reserved).ok()) << "fair share moved under mu_";
    StatusOr<std::vector<ChunkLender::Taken>> taken{std::vector<ChunkLender::Taken>{}};
    std::vector<Prepared> ready;
    mu_.Unlock();
    {
      uint64_t chosen = 0;
      uint64_t chosen_pages = 0;
      // Runs inside the lender's take: locals only (it must not call into Leases).
      taken = lender->Take([&](uint64_t c, uint64_t free_left) {
        if (held + chosen_pages >= target || chosen >= reserved) return false;
        const uint64_t pages = tier->ChunkPages(c);
        if (chosen_pages + pages > budget) return false;
        // A pool lends to peers only while it keeps more than half its chunks free.
        if (lease_tier == kPeer && (free_left - 1) * 2 <= tier->chunks()) return false;
        ++chosen;
        chosen_pages += pages;
        return true;
      });
      if (taken.ok()) ready = Prepare(lender, *taken);
    }
    mu_.Lock();
    Status failed = taken.status();
    uint64_t handed = 0;
    for (Prepared& p : ready) {
      if (!p.status.ok()) {
        if (failed.ok()) failed = p.status;
        if (p.renewed) continue;  // its export failed: Prepare put it back in the ring
        // Daemon-copy stashes may have left bytes in its old memory, which may be gone.
        RenewLater(source, p.chunk, p.status, /*first=*/true);
        continue;
      }
      const uint64_t pages = tier->ChunkPages(p.chunk);
      Lent(h, lease_tier, source, p.chunk, std::move(p.fd), parts);
      held += pages;
      budget -= pages;
      ++handed;
    }
    shares_[source]->Give(h.uid, reserved - handed);
    if (held < target && handed == share) {
      uint64_t held_back = 0;
      if (share_log_.Allow(RateLimiter::Clock::now(), &held_back)) {
        Log("pool")->info(
            "session {}: uid {} holds its share of {} ({} of {} chunks leased; {} stay for "
            "another user's first session): the lease grows no further",
            h.session_id, h.uid, tier->name(), shares_[source]->used(),
            shares_[source]->spec().capacity, shares_[source]->spec().first);
      }
    }
    if (!failed.ok()) return failed;
  }
  return Status::Ok();
}

std::vector<Leases::Prepared> Leases::Prepare(ChunkLender* lender,
                                              const std::vector<ChunkLender::Taken>& taken) {
  std::vector<Prepared> ready(taken.size());
  for (size_t i = 0; i < taken.size(); ++i) {
    Prepared& p = ready[i];
    p.chunk = taken[i].chunk;
    // Daemon-copy stashes of any user may have left bytes here.
    if (taken[i].written) p.status = lender->Renew(p.chunk);
    if (!p.status.ok()) {
      p.renewed = false;
      continue;
    }
    auto fd = lender->Export(p.chunk);
    if (!fd.ok()) {
      p.status = fd.status();
      lender->Return(p.chunk);
      continue;
    }
    p.fd = std::move(fd).value();
  }
  return ready;
}

Status Leases::Rehand(Holder& h, uint32_t lease_tier, uint64_t id,
                      std::vector<DescriptorPart>* parts) {
  const uint64_t tier = TierOfId(id);
  const uint64_t chunk = ChunkOfId(id);
  auto fd = tiers_[tier]->lender()->Export(chunk);
  if (!fd.ok()) {
    h.kept[lease_tier].push_back(id);  // still its, still charged
    return fd.status();
  }
  Lent(h, lease_tier, tier, chunk, std::move(fd).value(), parts);
  return Status::Ok();
}

void Leases::Lent(Holder& h, uint32_t lease_tier, uint64_t tier, uint64_t chunk, UniqueFd fd,
                  std::vector<DescriptorPart>* parts) {
  Chunk& c = chunks_[tier][chunk];
  ChunkLender* lender = tiers_[tier]->lender();
  c.state = State::kLeased;
  c.holder = h.session_id;
  const uint64_t id = ChunkId(tier, chunk);
  h.held[lease_tier].push_back(id);
  v1::DescriptorResponse packet;
  packet.set_more(true);
  v1::LeasedChunk* leased = packet.mutable_chunk();
  leased->set_chunk_id(id);
  leased->set_tier(ProtoTier(lease_tier));
  leased->set_pool(tiers_[tier]->pool());
  leased->set_bytes(lender->ChunkBytes(chunk));
  leased->set_gpu_uuid(lender->gpu_uuid());
  parts->push_back(DescriptorPart{DescriptorAnswer(Status::Ok(), packet), std::move(fd)});
}

Leases::TierCounts Leases::Counts(const Tier* tier) {
  TierCounts counts;
  MutexLock lock(&mu_);
  for (size_t t = 0; t < tiers_.size(); ++t) {
    if (tiers_[t] != tier) continue;
    for (const Chunk& c : chunks_[t]) {
      counts.leased += c.state == State::kLeased ? 1 : 0;
      counts.orphaned += c.state == State::kOrphaned ? 1 : 0;
      counts.kept += c.state == State::kKept ? 1 : 0;
      counts.waiting += c.state == State::kRenewing ? 1 : 0;
    }
  }
  return counts;
}

bool Leases::Describe(const std::string& session_id, std::vector<v1::LeaseStats>* leases,
                      ControlView* control, LiveView* live) {
  MutexLock lock(&mu_);
  auto it = holders_.find(session_id);
  if (it == holders_.end()) return false;
  const Holder& h = *it->second;
  std::array<uint64_t, k::kLeaseTiers> held{};
  std::array<uint64_t, k::kLeaseTiers> chunks{};
  for (uint32_t t = 0; t < k::kLeaseTiers; ++t) {
    held[t] = HeldPages(h, t);
    chunks[t] = h.held[t].size();
  }
  // A group's member: the group's chunks it maps, by what they are to it.
  for (uint64_t id : h.sent) {
    const uint32_t t = LeaseTierFor(TierOfId(id), h.pool);
    held[t] += PagesOf(id);
    ++chunks[t];
  }
  *control = ReadControl(h, held);
  if (live != nullptr) *live = h.control->ReadLive(*control);
  for (uint32_t t = 0; t < k::kLeaseTiers; ++t) {
    if (chunks[t] == 0 && h.aim[t] == 0) continue;
    v1::LeaseStats row;
    row.set_tier(ProtoTier(t));
    row.set_chunks(chunks[t]);
    row.set_pages_leased(held[t]);
    row.set_pages_used(control->tiers[t].pages_used);
    row.set_pages_high_water(control->tiers[t].high_water);
    row.set_last_step_high_water(control->tiers[t].last_step_high_water);
    row.set_pages_target(h.automatic ? h.aim[t] : 0);
    leases->push_back(std::move(row));
  }
  return true;
}

void Leases::SetActivityListener(std::function<void(const MappedActivity&)> listener) {
  MutexLock lock(&mu_);
  listener_ = std::move(listener);
}

void Leases::Sample() {
  MutexLock lock(&mu_);
  for (auto& [id, h] : holders_) SampleHolder(*h);
}

void Leases::SampleHolder(Holder& h) {
  if (listener_ == nullptr) return;  // nobody to tell (tests that drive the broker alone)
  std::array<uint64_t, k::kLeaseTiers> held{};
  for (uint32_t t = 0; t < k::kLeaseTiers; ++t) held[t] = HeldPages(h, t);
  // Read keeps every total monotone from one read to the next, whoever reads: the differences
  // below are never negative, and `reported` moves forward only.
  const ControlView now = ReadControl(h, held);
  if (!now.valid) return;  // the rank wrote over the header: nothing to take from it
  const ControlView& was = h.reported;
  MappedActivity a;
  a.steps = now.steps - std::min(now.steps, was.steps);
  a.stashes = now.stashes - std::min(now.stashes, was.stashes);
  a.reloads = now.reloads - std::min(now.reloads, was.reloads);
  a.releases = now.releases - std::min(now.releases, was.releases);
  a.bytes_stashed = now.bytes_stashed - std::min(now.bytes_stashed, was.bytes_stashed);
  a.bytes_reloaded = now.bytes_reloaded - std::min(now.bytes_reloaded, was.bytes_reloaded);
  a.spills = now.spills - std::min(now.spills, was.spills);
  a.overflows = now.overflows - std::min(now.overflows, was.overflows);
  a.rejected = now.rejected - std::min(now.rejected, was.rejected);
  const bool grew = (a.steps | a.stashes | a.reloads | a.releases | a.bytes_stashed |
                     a.bytes_reloaded | a.spills | a.overflows | a.rejected) != 0;
  h.reported = now;
  if (!grew) return;
  a.session_id = h.session_id;
  a.rank = h.rank;
  a.pid = h.hello_pid;
  a.pool = h.pool;
  a.label = h.label;
  a.allow_host_spill = h.allow_host_spill;
  a.step = now.step;
  listener_(a);
}

void Leases::SetDraining(bool draining) {
  MutexLock lock(&mu_);
  draining_ = draining;
  for (auto& [id, h] : holders_) h->control->SetDraining(draining);
}

uint64_t Leases::StashesLive(const std::string& session_id) {
  std::vector<v1::LeaseStats> rows;
  ControlView view;
  if (!Describe(session_id, &rows, &view)) return 0;
  uint64_t live = 0;
  for (const ControlTierView& t : view.tiers) live += t.stashes_live;
  return live;
}

uint64_t Leases::DaemonFlags(const std::string& session_id) {
  MutexLock lock(&mu_);
  auto it = holders_.find(session_id);
  return it == holders_.end() ? 0 : it->second->control->daemon_flags();
}

size_t Leases::holders() {
  MutexLock lock(&mu_);
  return holders_.size();
}

}  // namespace stash::daemon
