// Leases, groups (daemon/leases/leases.h, "Groups"; docs/design.md, "Groups"): one job's mapped
// sessions lease as one. The group holds chunks; every member maps every one at the same place
// of one address space and claims their pages page by page in the group's depot
// (stash/kernels/group_depot.h), with no message to the daemon. The daemon only grows the group
// (a member's first lease on its device, or a depot that ran dry) and reclaims what members that
// are gone owned.
#include <fcntl.h>

#include <algorithm>

#include "common/logging.h"
#include "common/macros.h"
#include "common/sys.h"
#include "daemon/leases/host_group_block.h"
#include "daemon/leases/leases.h"

namespace stash::daemon {
namespace {

namespace v1 = stash::v1;
namespace k = stash::kernels;

}  // namespace

uint32_t Leases::LeaseTierFor(size_t tier, int pool) const {
  if (tier >= pools_) return k::kLeaseHost;
  return static_cast<int>(tier) == pool ? k::kLeaseDevice : k::kLeasePeer;
}

Leases::Group* Leases::JoinGroup(Holder& h, const LeaseHolder& who, Status* status) {
  auto it = groups_.find(who.group_id);
  if (it == groups_.end()) {
    std::vector<GroupBlock::TierShape> shapes;
    for (size_t t = 0; t < tiers_.size(); ++t) {
      shapes.push_back(
          {t < pools_ ? static_cast<int64_t>(t) : -1, tiers_[t]->pages(), tiers_[t]->chunks()});
    }
    auto block = config_.group_blocks
                     ? config_.group_blocks(config_.page_bytes, chunk_pages_, shapes)
                     : HostGroupBlock::Create(config_.page_bytes, chunk_pages_, shapes);
    if (!block.ok()) {
      *status = block.status();
      return nullptr;
    }
    auto g = std::make_unique<Group>();
    g->id = who.group_id;
    g->uid = who.uid;
    g->name = who.group;
    g->block = std::move(block).value();
    g->dry_seen.assign(std::max<size_t>(pools_, 1), 0);
    g->dry_pages_seen.assign(std::max<size_t>(pools_, 1), 0);
    it = groups_.emplace(who.group_id, std::move(g)).first;
    Log("pool")->info("group {} ({}): formed by session {}", who.group, who.group_id,
                      who.session_id);
  }
  Group& g = *it->second;
  if (g.uid != who.uid) {  // the registry checked it at Hello: never reached
    *status = PermissionDeniedError("group " + who.group + " belongs to another user");
    return nullptr;
  }
  if (h.group == 0) {
    if (g.next_tag == UINT32_MAX) {
      *status = ResourceExhaustedError("group " + who.group +
                                       " has had 4 billion members: start the job with a new "
                                       "group name");
      return nullptr;
    }
    h.group = g.id;
    h.tag = g.next_tag++;
    g.members.push_back(h.session_id);
    g.live_tags.push_back(h.tag);
  }
  return &g;
}

uint64_t Leases::GrowGroup(Group& g, size_t source, uint64_t max_chunks, int pool) {
  Tier* tier = tiers_[source];
  ChunkLender* lender = tier->lender();
  if (lender == nullptr || max_chunks == 0) return 0;
  const uint64_t reserved = std::min(shares_[source]->Headroom(g.uid), max_chunks);
  if (reserved == 0) return 0;
  STASH_CHECK(shares_[source]->Take(g.uid, reserved).ok()) << "fair share moved under mu_";
  StatusOr<std::vector<ChunkLender::Taken>> taken{std::vector<ChunkLender::Taken>{}};
  std::vector<Prepared> ready;
  mu_.Unlock();
  {
    uint64_t chosen = 0;
    taken = lender->Take([&](uint64_t /*c*/, uint64_t /*free_left*/) {
      if (chosen >= reserved) return false;
      ++chosen;
      return true;
    });
    if (taken.ok()) ready = Prepare(lender, *taken);
  }
  mu_.Lock();
  uint64_t joined = 0;
  for (Prepared& p : ready) {
    if (!p.status.ok()) {
      if (!p.renewed) RenewLater(source, p.chunk, p.status, /*first=*/true);
      continue;
    }
    p.fd.reset();  // each member gets a descriptor of its own (Export) when it is sent
    Chunk& c = chunks_[source][p.chunk];
    c.state = State::kLeased;
    c.holder = GroupKey(g.id);
    g.block->Join(source, p.chunk, tier->ChunkPages(p.chunk), pool);
    g.chunks.push_back(ChunkId(source, p.chunk));
    ++joined;
  }
  shares_[source]->Give(g.uid, reserved - joined);
  if (!taken.ok()) {
    Log("pool")->warn("group {}: growing in {}: {}", g.name, tier->name(),
                      taken.status().message());
  }
  return joined;
}

DescriptorReply Leases::LeaseGroup(Holder& h, const LeaseHolder& who,
                                   const v1::LeaseChunks& request, uint64_t max_chunks,
                                   bool send_control) {
  Status status;
  Group* joined = JoinGroup(h, who, &status);
  if (joined == nullptr) return status;
  const bool host_ok =
      has_host_ && h.allow_host_spill && tiers_[HostSource(h.pool)]->lender() != nullptr;
  const bool peer_ok = config_.group_peer && config_.group_peer_depots && pools_ > 1;
  const auto own = static_cast<size_t>(h.pool);

  // Grow: the member's device has none of the group's chunks yet, or the depot ran dry.
  Group& g = *joined;  // lives while this busy member is in it, whatever GrowGroup unlocks
  {
    // The member's own depot's counters (one depot for all on the host backend, its GPU's on
    // the cuda backend).
    const GroupBlock::Counters counters = g.block->Read(g.block->pages(), h.pool);
    const size_t depot = std::min(g.block->DepotOf(h.pool), g.dry_seen.size() - 1);
    const bool dry = counters.dry != g.dry_seen[depot];
    const uint64_t missed =
        counters.dry_pages - std::min(counters.dry_pages, g.dry_pages_seen[depot]);
    g.dry_seen[depot] = counters.dry;
    g.dry_pages_seen[depot] = counters.dry_pages;
    const bool has_own = std::any_of(g.chunks.begin(), g.chunks.end(),
                                     [&](uint64_t id) { return TierOfId(id) == own; });
    uint64_t grown = 0;
    if (!has_own || dry) grown += GrowGroup(g, own, tiers_[own]->chunks(), h.pool);
    // A fixed lease (Options.lease.automatic false) is a floor: the group holds at least that
    // much of the member's device (the group sizes itself from there; nothing is the member's
    // alone).
    if (!request.automatic()) {
      uint64_t want = 0;
      for (const v1::TierPages& w : request.want()) {
        if (w.tier() == v1::TIER_DEVICE) want = std::max(want, w.pages());
      }
      uint64_t held = 0;
      for (uint64_t id : g.chunks) held += TierOfId(id) == own ? PagesOf(id) : 0;
      if (want > held) {
        grown += GrowGroup(g, own, (want - held + chunk_pages_ - 1) / chunk_pages_, h.pool);
      }
    }
    if (dry && grown == 0) {
      // The own device has no free chunk: what the depot missed, from the other devices (their
      // spare chunks: while each keeps more than half its chunks free for its own ranks) and then
      // the host tier.
      const uint64_t need = std::max<uint64_t>(1, (missed + chunk_pages_ - 1) / chunk_pages_);
      uint64_t got = 0;
      for (size_t p = 0; p < pools_ && peer_ok && got < need; ++p) {
        if (p == own) continue;
        const uint64_t spare = tiers_[p]->chunks_free() > tiers_[p]->chunks() / 2
                                   ? tiers_[p]->chunks_free() - tiers_[p]->chunks() / 2
                                   : 0;
        got += GrowGroup(g, p, std::min(spare, need - got), h.pool);
      }
      if (host_ok && got < need) GrowGroup(g, HostSource(h.pool), need - got, h.pool);
    }
  }
  SizeGroup(g);

  DescriptorReply reply;
  if (send_control) {
    v1::DescriptorResponse block;
    block.set_more(true);
    block.mutable_control_block()->set_bytes(k::kControlBlockBytes);
    UniqueFd fd(fcntl(h.control->fd(), F_DUPFD_CLOEXEC, 0));
    if (!fd.valid()) return ErrnoStatus("dup of the control block");
    reply.parts.push_back(DescriptorPart{DescriptorAnswer(Status::Ok(), block), std::move(fd)});
  }
  if (!h.depot_sent && reply.parts.size() < max_chunks + (send_control ? 1 : 0)) {
    v1::DescriptorResponse depot;
    depot.set_more(true);
    v1::GroupBlock* b = depot.mutable_group_block();
    b->set_bytes(g.block->bytes());
    b->set_member_tag(h.tag);
    b->set_pages(g.block->pages());
    b->set_chunks(g.block->chunks());
    b->set_gpu_uuid(g.block->gpu_uuid(h.pool));
    // Where each lease tier's pages start in the group's address space: the own pool's and the
    // member's host tier's first pages (a GPU member's ranges start there), 0 for the peer tier
    // (it spans every pool).
    b->add_tier_first_page(g.block->FirstPage(own, 0));
    b->add_tier_first_page(0);
    b->add_tier_first_page(has_host_ ? g.block->FirstPage(HostSource(h.pool), 0) : 0);
    STASH_ASSIGN_OR_RETURN(UniqueFd fd, g.block->Export(h.pool));
    reply.parts.push_back(DescriptorPart{DescriptorAnswer(Status::Ok(), depot), std::move(fd)});
    h.depot_sent = true;
  }
  // Every chunk of the group this member has not mapped yet, as many as the answer may carry and
  // at most kGroupChunksPerAnswer (the member asks again for the rest: chunks_not_sent), so the
  // members of a job that start together share the user's descriptors in flight.
  const uint64_t limit = std::min(max_chunks, kGroupChunksPerAnswer) + reply.parts.size();
  uint64_t not_sent = 0;
  std::array<uint64_t, k::kLeaseTiers> chunks{};
  std::array<uint64_t, k::kLeaseTiers> pages{};
  for (uint64_t id : g.chunks) {
    if (std::find(g.leaving.begin(), g.leaving.end(), id) != g.leaving.end()) continue;
    const size_t tier = TierOfId(id);
    const uint64_t chunk = ChunkOfId(id);
    const uint32_t lease_tier = LeaseTierFor(tier, h.pool);
    if (lease_tier == k::kLeaseHost && (!host_ok || tier != HostSource(h.pool))) continue;
    if (lease_tier == k::kLeasePeer && !peer_ok) continue;
    const bool sent = std::find(h.sent.begin(), h.sent.end(), id) != h.sent.end();
    if (!sent) {
      if (reply.parts.size() >= limit) {
        ++not_sent;
        continue;
      }
      ChunkLender* lender = tiers_[tier]->lender();
      auto fd = lender->Export(chunk);
      if (!fd.ok()) {
        Log("pool")->warn("group {}: exporting chunk {} for session {}: {}", g.name, id,
                          h.session_id, fd.status().message());
        continue;
      }
      v1::DescriptorResponse packet;
      packet.set_more(true);
      v1::LeasedChunk* leased = packet.mutable_chunk();
      leased->set_chunk_id(id);
      leased->set_tier(ProtoTier(lease_tier));
      leased->set_pool(tiers_[tier]->pool());
      leased->set_bytes(lender->ChunkBytes(chunk));
      leased->set_gpu_uuid(lender->gpu_uuid());
      leased->set_group_page(g.block->FirstPage(tier, chunk));
      reply.parts.push_back(
          DescriptorPart{DescriptorAnswer(Status::Ok(), packet), std::move(fd).value()});
      h.sent.push_back(id);
    }
    chunks[lease_tier] += 1;
    pages[lease_tier] += tiers_[tier]->ChunkPages(chunk);
  }
  const std::array<bool, k::kLeaseTiers> allowed{true, peer_ok, host_ok};
  for (uint32_t t = 0; t < k::kLeaseTiers; ++t) {
    if (!allowed[t]) continue;
    v1::TierLease* lease = reply.last.add_lease();
    lease->set_tier(ProtoTier(t));
    lease->set_chunks(chunks[t]);
    lease->set_pages(pages[t]);
    lease->set_pages_target(pages[t]);  // a group never asks a member to give back
  }
  reply.last.set_chunks_not_sent(not_sent);
  return reply;
}

DescriptorReply Leases::ReturnGroupChunks(Holder& h, const v1::ReturnChunks& request,
                                          Renewals* renew) {
  for (uint64_t id : request.chunk_ids()) {
    if (std::find(h.sent.begin(), h.sent.end(), id) == h.sent.end()) {
      return NotFoundError("chunk " + std::to_string(id) +
                           " is not a chunk of this session's group it was sent: return only "
                           "chunk ids its LeaseChunks answers named (nothing was returned)");
    }
  }
  for (uint64_t id : request.chunk_ids()) {
    h.sent.erase(std::remove(h.sent.begin(), h.sent.end(), id), h.sent.end());
  }
  auto it = groups_.find(h.group);
  if (it != groups_.end()) {
    if (h.sent.empty()) {
      // It maps none of the group's memory any more: what its tag still owns is free (and any
      // tag no live member has).
      std::vector<uint32_t> live = it->second->live_tags;
      live.erase(std::remove(live.begin(), live.end(), h.tag), live.end());
      it->second->block->Reclaim(live);
    }
    SettleLeaving(*it->second, renew);
  }
  DescriptorReply reply;
  reply.last.set_chunks_returned(static_cast<uint64_t>(request.chunk_ids_size()));
  return reply;
}

void Leases::LeaveGroup(Holder& h, Renewals* renew) {
  if (h.group == 0) return;
  auto it = groups_.find(h.group);
  h.sent.clear();
  h.group = 0;
  if (it == groups_.end()) return;
  Group& g = *it->second;
  g.members.erase(std::remove(g.members.begin(), g.members.end(), h.session_id), g.members.end());
  g.live_tags.erase(std::remove(g.live_tags.begin(), g.live_tags.end(), h.tag), g.live_tags.end());
  // Exactly the pages its tag owns (its cache, its live stashes, a claim it died in), and any tag
  // no live member has (garbage a member wrote): compared, never followed.
  const uint64_t freed = g.block->Reclaim(g.live_tags);
  Log("pool")->info("group {}: session {} left; {} pages it owned are free again", g.name,
                    h.session_id, freed);
  if (!g.members.empty()) {
    SettleLeaving(g, renew);
    return;
  }
  // The last member is gone: the group's memory goes back to its rings, renewed.
  for (uint64_t id : g.chunks) PutBack(TierOfId(id), ChunkOfId(id), g.uid, renew);
  Log("pool")->info("group {}: its last member left; {} chunks go back to the pools", g.name,
                    g.chunks.size());
  groups_.erase(it);
}

void Leases::SizeGroup(Group& g) {
  // The group's step: the most BeginSteps any member made (a member's control block is
  // untrusted: a member that claims more steps only makes the group size itself sooner).
  uint64_t step = 0;
  for (const std::string& id : g.members) {
    auto it = holders_.find(id);
    if (it == holders_.end()) continue;
    step = std::max(step, it->second->control->Read({}, 0, config_.page_bytes).steps);
  }
  if (step <= g.step) return;
  g.step = step;
  uint64_t held = 0;
  for (uint64_t id : g.chunks) {
    if (std::find(g.leaving.begin(), g.leaving.end(), id) == g.leaving.end()) held += PagesOf(id);
  }
  const GroupBlock::Counters counters = g.block->Read(held, -1);
  g.block->ResetHighWater();
  g.high_water = std::max(g.high_water, counters.high_water);
  g.windows.push_back(counters.high_water);
  if (g.windows.size() > 3) g.windows.erase(g.windows.begin());
  if (g.windows.size() < 3) return;
  const uint64_t peak = *std::max_element(g.windows.begin(), g.windows.end());
  const uint64_t target = peak + std::max(chunk_pages_, (peak + 7) / 8);
  g.above = held > target ? std::min<uint32_t>(g.above + 1, 1000) : 0;
  if (g.above < 3) return;
  // Which chunks go first: the host tier's, then other devices', then the latest joined.
  std::vector<uint64_t> order(g.chunks.rbegin(), g.chunks.rend());
  std::stable_sort(order.begin(), order.end(), [&](uint64_t a, uint64_t b) {
    return (TierOfId(a) >= pools_) > (TierOfId(b) >= pools_);
  });
  uint64_t taken = 0;
  for (uint64_t id : order) {
    if (held <= target) break;
    if (std::find(g.leaving.begin(), g.leaving.end(), id) != g.leaving.end()) continue;
    const uint64_t pages = PagesOf(id);
    if (held - pages < target) continue;
    if (!g.block->Take(TierOfId(id), ChunkOfId(id), pages)) continue;
    g.leaving.push_back(id);
    held -= pages;
    ++taken;
  }
  if (taken > 0) {
    Log("pool")->info(
        "group {}: gives back {} chunks it has not needed for 3 steps (holds {} pages, its last "
        "3 steps claimed at most {}); members unmap them at their next step",
        g.name, taken, held, peak);
  }
  g.above = 0;
}

void Leases::ScrubGroups() {
  for (auto& [id, group] : groups_) {
    Group& g = *group;
    const uint64_t freed = g.block->Reclaim(g.live_tags);
    uint64_t held_back = 0;
    if (freed > 0 && garbage_log_.Allow(RateLimiter::Clock::now(), &held_back)) {
      Log("pool")->warn(
          "group {}: {} pages of its depot carried a tag no live member has (a member wrote "
          "there); they are free again",
          g.name, freed);
    }
  }
}

void Leases::SettleLeaving(Group& g, Renewals* renew) {
  std::vector<uint64_t> still;
  for (uint64_t id : g.leaving) {
    bool mapped = false;
    for (const std::string& member : g.members) {
      auto it = holders_.find(member);
      if (it == holders_.end()) continue;
      const std::vector<uint64_t>& sent = it->second->sent;
      mapped = mapped || std::find(sent.begin(), sent.end(), id) != sent.end();
    }
    if (mapped) {
      still.push_back(id);
      continue;
    }
    g.block->Out(TierOfId(id), ChunkOfId(id));
    g.chunks.erase(std::remove(g.chunks.begin(), g.chunks.end(), id), g.chunks.end());
    PutBack(TierOfId(id), ChunkOfId(id), g.uid, renew);
  }
  g.leaving = std::move(still);
}

std::vector<v1::GroupStats> Leases::DescribeGroups(size_t max_rows) {
  std::vector<v1::GroupStats> rows;
  MutexLock lock(&mu_);
  DescribeGroupsLocked(&rows, max_rows);
  return rows;
}

void Leases::DescribeGroupsLocked(std::vector<v1::GroupStats>* rows, size_t max_rows) {
  for (const auto& [id, group] : groups_) {
    if (rows->size() >= max_rows) return;
    const Group& g = *group;
    v1::GroupStats row;
    row.set_name(g.name);
    row.set_group_id(g.id);
    row.set_uid(g.uid);
    row.set_members(static_cast<uint32_t>(g.members.size()));
    row.set_chunks_leaving(g.leaving.size());
    // Pages owned per daemon tier and tag, from the tags.
    std::vector<v1::GroupTierStats> tiers(tiers_.size());
    uint64_t held = 0, claimed = 0;
    std::vector<absl::flat_hash_map<uint32_t, uint64_t>> per_tier(tiers_.size());
    for (uint64_t cid : g.chunks) {
      const size_t t = TierOfId(cid);
      v1::GroupTierStats& ts = tiers[t];
      ts.set_tier(tiers_[t]->name());
      ts.set_chunks(ts.chunks() + 1);
      ts.set_pages(ts.pages() + PagesOf(cid));
      held += PagesOf(cid);
      g.block->ForEachOwned(t, ChunkOfId(cid), [&](uint32_t tag) {
        ts.set_pages_claimed(ts.pages_claimed() + 1);
        ++per_tier[t][tag];
        ++claimed;
      });
    }
    for (v1::GroupTierStats& ts : tiers) {
      if (ts.chunks() > 0) *row.add_tiers() = std::move(ts);
    }
    const GroupBlock::Counters counters = g.block->Read(held, -1);
    row.set_pages_claimed(claimed);
    row.set_pages_claimed_high_water(std::max(g.high_water, counters.high_water));
    row.set_depot_misses(counters.dry);
    row.set_depot_missed_pages(counters.dry_pages);
    for (const std::string& member : g.members) {
      auto it = holders_.find(member);
      if (it == holders_.end()) continue;
      const Holder& h = *it->second;
      v1::GroupMemberStats* m = row.add_member_rows();
      m->set_session_id(h.session_id);
      m->set_rank(h.rank);
      for (size_t t = 0; t < tiers_.size(); ++t) {
        auto found = per_tier[t].find(h.tag);
        if (found == per_tier[t].end()) continue;
        const uint32_t lt = LeaseTierFor(t, h.pool);
        if (lt == k::kLeaseDevice) m->set_device_pages(m->device_pages() + found->second);
        if (lt == k::kLeasePeer) m->set_peer_pages(m->peer_pages() + found->second);
        if (lt == k::kLeaseHost) m->set_host_pages(m->host_pages() + found->second);
      }
    }
    rows->push_back(std::move(row));
  }
}

}  // namespace stash::daemon
