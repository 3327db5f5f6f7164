// Leases, the way back (daemon/leases/leases.h): chunks a session returns, the orphans of an ended
// session, and the reaper, which takes back an exited rank's chunks and retries the renews that
// found no memory. Every chunk that comes back gets fresh memory, without the broker's lock,
// before it goes back to its ring.
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/logging.h"
#include "common/macros.h"
#include "common/sys.h"
#include "daemon/leases/leases.h"

namespace stash::daemon {
namespace {

namespace v1 = stash::v1;
namespace k = stash::kernels;

}  // namespace

DescriptorReply Leases::Return(const LeaseHolder& who, const v1::ReturnChunks& request) {
  Renewals renew;
  DescriptorReply reply;
  {
    MutexLock lock(&mu_);
    reply = ReturnLocked(who, request, &renew);
  }
  RenewAndReturn(renew, /*retry=*/false);
  return reply;
}

DescriptorReply Leases::ReturnLocked(const LeaseHolder& who, const v1::ReturnChunks& request,
                                     Renewals* renew) {
  // Chunks an ended session of the same process (pid and uid) left orphaned: a reconnected
  // rank gives them back now instead of at its exit.
  if (!request.ended_session_id().empty()) return ReturnOrphans(who, request, renew);
  Holder* h = WaitIdle(who.session_id);  // a lease of the same session in flight first
  if (h != nullptr && h->group != 0) return ReturnGroupChunks(*h, request, renew);
  // Every id first: an id is trusted only once it names a chunk this session holds.
  for (uint64_t id : request.chunk_ids()) {
    if (h == nullptr || !ChunkIs(id, State::kLeased, who.session_id)) {
      return NotFoundError("chunk " + std::to_string(id) +
                           " is not leased to this session: return only chunk ids its "
                           "LeaseChunks answers named (nothing was returned)");
    }
  }
  GiveBack(*h, request.chunk_ids(), renew);
  DescriptorReply reply;
  reply.last.set_chunks_returned(static_cast<uint64_t>(request.chunk_ids_size()));
  return reply;
}

bool Leases::ChunkIs(uint64_t id, State state, const std::string& holder) const {
  const uint64_t tier = TierOfId(id);
  const uint64_t chunk = ChunkOfId(id);
  return tier < chunks_.size() && chunk < chunks_[tier].size() &&
         chunks_[tier][chunk].state == state && chunks_[tier][chunk].holder == holder;
}

void Leases::GiveBack(Holder& h, const google::protobuf::RepeatedField<uint64_t>& ids,
                      Renewals* renew) {
  for (uint64_t id : ids) {
    for (uint32_t t = 0; t < k::kLeaseTiers; ++t) {
      std::vector<uint64_t>& list = h.held[t];
      if (std::find(list.begin(), list.end(), id) == list.end()) continue;
      list.erase(std::remove(list.begin(), list.end(), id), list.end());
      Keep(h, t, id, renew);
    }
  }
}

void Leases::Keep(Holder& h, uint32_t lease_tier, uint64_t id, Renewals* renew) {
  const uint64_t tier = TierOfId(id);
  const uint64_t chunk = ChunkOfId(id);
  if (!tiers_[tier]->lender()->ChargeReturnsUntilExit()) {
    PutBack(tier, chunk, h.uid, renew);
    return;
  }
  // Its process may still map or hold the allocation: a renew now would leave that memory alive
  // and counted nowhere. It stays this holder's (its user's share, its quota) until the process
  // exits, and is the first lent to it again.
  Chunk& c = chunks_[tier][chunk];
  c.state = State::kKept;
  c.holder = h.session_id;
  h.kept[lease_tier].push_back(id);
}

DescriptorReply Leases::ReturnOrphans(const LeaseHolder& who, const v1::ReturnChunks& request,
                                      Renewals* renew) {
  const std::string& ended = request.ended_session_id();
  Holder* old = WaitIdle(ended);
  if (old == nullptr || !old->ended || old->pid != who.pid || old->uid != who.uid) {
    return NotFoundError("session " + ended.substr(0, 64) +
                         " is not an ended session of this process holding chunks: return "
                         "only chunks of this process's own earlier session (nothing was "
                         "returned)");
  }
  for (uint64_t id : request.chunk_ids()) {
    if (!ChunkIs(id, State::kOrphaned, ended)) {
      return NotFoundError("chunk " + std::to_string(id) + " is not orphaned by session " + ended +
                           " (nothing was returned)");
    }
  }
  GiveBack(*old, request.chunk_ids(), renew);
  const auto returned = static_cast<uint64_t>(request.chunk_ids_size());
  const bool holds_none = HoldsNothing(*old);
  if (holds_none) Drop(ended);  // as at its process's exit
  Log("pool")->info("session {}: {} chunks its process's ended session {} left were returned",
                    who.session_id, returned, ended);
  DescriptorReply reply;
  reply.last.set_chunks_returned(returned);
  return reply;
}

void Leases::PutBack(uint64_t tier, uint64_t chunk, uint32_t uid, Renewals* renew) {
  shares_[tier]->Give(uid, 1);
  Chunk& c = chunks_[tier][chunk];
  // Out of every holder's hands now; in no ring until it has fresh memory.
  c.state = State::kRenewing;
  c.holder.clear();
  renew->emplace_back(tier, chunk);
}

void Leases::RenewAndReturn(const Renewals& chunks, bool retry) {
  for (const auto& [tier, chunk] : chunks) {
    ChunkLender* lender = tiers_[tier]->lender();
    const Status renewed = lender->Renew(chunk);
    if (!renewed.ok()) {
      // The holder's memory may still be reachable: it must not go back to the ring yet.
      MutexLock lock(&mu_);
      RenewLater(tier, chunk, renewed, /*first=*/!retry);
      continue;
    }
    if (retry) {
      Log("pool")->info("chunk {} of tier {} has fresh memory and is back in the pool", chunk,
                        tiers_[tier]->name());
    }
    {
      // Pooled before it is in the ring: nothing takes it from there while the books say
      // otherwise.
      MutexLock lock(&mu_);
      chunks_[tier][chunk].state = State::kPooled;
    }
    lender->Return(chunk);
  }
}

void Leases::RenewLater(uint64_t tier, uint64_t chunk, const Status& why, bool first) {
  Chunk& c = chunks_[tier][chunk];
  c.state = State::kRenewing;
  c.holder.clear();
  renew_.emplace_back(tier, chunk);
  if (!first) return;
  Log("pool")->warn(
      "chunk {} of tier {} cannot get fresh memory yet; it is kept out of the pool and renewed "
      "again every second: {}",
      chunk, tiers_[tier]->name(), why.message());
  Wake();  // the reaper retries on its one-second timer from now on
}

size_t Leases::renewing() {
  MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& tier : chunks_) {
    for (const Chunk& c : tier) n += c.state == State::kRenewing ? 1 : 0;
  }
  return n;
}

void Leases::SessionEnded(const std::string& session_id) {
  MutexLock lock(&mu_);
  Holder* found = WaitIdle(session_id);  // chunks a lease in flight hands it are orphaned too
  if (found == nullptr) return;
  Holder& h = *found;
  SampleHolder(h);  // the rank's last step, as its stream ends
  h.ended = true;
  bool any = false;
  for (const auto& list : h.held) {
    for (uint64_t id : list) {
      chunks_[TierOfId(id)][ChunkOfId(id)].state = State::kOrphaned;
      any = true;
    }
  }
  if (!any && HoldsNothing(h)) Drop(session_id);
}

void Leases::Drop(const std::string& session_id) {
  auto it = holders_.find(session_id);
  if (it == holders_.end()) return;
  STASH_CHECK(!it->second->busy) << "session " << session_id << " dropped while it leases";
  SampleHolder(*it->second);  // its very last numbers (a killed rank's last step)
  Renewals group_chunks;
  LeaveGroup(*it->second, &group_chunks);  // it maps none of its group's memory now
  // The group's chunks when it was the last member: renewed by the reaper at once, off this lock.
  group_returns_.insert(group_returns_.end(), group_chunks.begin(), group_chunks.end());
  closing_.push_back(std::move(it->second->pidfd));  // closed by the reaper, never under its poll
  holders_.erase(it);
  Wake();
}

void Leases::Reap() {
  std::vector<pollfd> fds;
  std::vector<std::string> ids;
  while (true) {
    fds.clear();
    ids.clear();
    fds.push_back({wake_.get(), POLLIN, 0});
    bool renewing = false;
    Renewals left_by_groups;
    {
      MutexLock lock(&mu_);
      if (stopping_) return;
      closing_.clear();
      left_by_groups.swap(group_returns_);
      for (const auto& [id, h] : holders_) {
        fds.push_back({h->pidfd.get(), POLLIN, 0});
        ids.push_back(id);
      }
      renewing = !renew_.empty();
    }
    RenewAndReturn(left_by_groups, /*retry=*/false);  // a group's chunks, back in their rings now
    // Once a second while anything is to renew or any control block to sample.
    const bool timed = renewing || fds.size() > 1;
    int rc = 0;
    STASH_SYSCALL_RETRY(rc, poll(fds.data(), fds.size(), timed ? 1000 : -1));
    if (rc < 0) {
      Log("pool")->error("leases: the reaper's poll failed: {}", std::strerror(errno));
      return;
    }
    if (fds[0].revents != 0) {
      uint64_t value = 0;
      (void)!read(wake_.get(), &value, sizeof(value));
    }
    Renewals retry;
    Renewals exited;
    std::vector<std::string> gone;  // exited holders, dropped once their chunks are back
    {
      MutexLock lock(&mu_);
      if (renewing) retry.swap(renew_);
      for (auto& [id, h] : holders_) SampleHolder(*h);
      ScrubGroups();
      for (size_t i = 1; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        // A lease in flight for it first: what it hands comes back here too.
        Holder* found = WaitIdle(ids[i - 1]);
        if (found == nullptr) continue;
        Holder& h = *found;
        // The process exited, but its memory may live on where no pidfd shows it (a descriptor
        // it passed on, a child that mapped it): every chunk gets fresh memory before it goes
        // back to the ring, which every user's stashes share.
        uint64_t returned = 0;
        for (auto* lists : {&h.held, &h.kept}) {
          for (auto& list : *lists) {
            for (uint64_t id : list) {
              PutBack(TierOfId(id), ChunkOfId(id), h.uid, &exited);
              ++returned;
            }
            list.clear();
          }
        }
        Log("pool")->info("session {}: its process exited; {} leased chunks returned", h.session_id,
                          returned);
        LeaveGroup(h, &exited);  // its group's pages it owned are free at once
        h.ended = true;          // leases nothing more (a packet it sent before it died)
        gone.push_back(ids[i - 1]);
      }
    }
    RenewAndReturn(retry, /*retry=*/true);
    RenewAndReturn(exited, /*retry=*/false);
    // Dropped once its chunks are back: a holder gone means its chunks are pooled (or waiting
    // for memory), never in between. Only while it holds nothing: its session may have ended
    // and been dropped meanwhile, and a lease its rank sent before it died made a new holder of
    // the same id (that one's pidfd is readable too: the next pass reaps it).
    if (!gone.empty()) {
      MutexLock lock(&mu_);
      for (const std::string& id : gone) {
        const Holder* h = WaitIdle(id);
        if (h != nullptr && h->ended && HoldsNothing(*h)) Drop(id);
      }
    }
  }
}

}  // namespace stash::daemon
