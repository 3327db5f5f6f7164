#include "client/mapped/lease_rounds.h"

#include <utility>

#include "client/session/session_stream.h"
#include "common/logging.h"

namespace stash::client {

void GiveBack(const LeaseWork& work, SessionStream& current) {
  if (!work.give_back.empty() && !current.broken_now()) {
    StatusOr<uint64_t> returned = current.descriptors->Return(work.give_back);
    if (!returned.ok()) {
      Log("client")->warn("mapped session: chunks were not given back ({})",
                          returned.status().ToString());
    }
  }
  if (!work.orphans.empty() && !current.broken_now()) {
    // A daemon that still lives (the old stream ended, the daemon did not) takes an ended
    // session's chunks back at once instead of at this process's exit; a restarted daemon does
    // not know them and answers NOT_FOUND, which is fine.
    (void)current.descriptors->Return(work.orphans, work.orphans_of);
  }
}

bool LeaseWork::empty() const {
  return !lease && !reconnect && !end_session && give_back.empty() && orphans.empty();
}

void LeaseWork::Merge(LeaseWork other) {
  lease = lease || other.lease;
  reconnect = reconnect || other.reconnect;
  end_session = end_session || other.end_session;
  give_back.insert(give_back.end(), other.give_back.begin(), other.give_back.end());
  if (!other.orphans.empty()) {
    // Orphans of an older session than these are dropped: the daemon takes a batch whole or
    // not at all, and that session's daemon is gone (it frees them at this process's exit).
    if (other.orphans_of != orphans_of) orphans.clear();
    orphans.insert(orphans.end(), other.orphans.begin(), other.orphans.end());
    orphans_of = std::move(other.orphans_of);
  }
}

uint64_t LeaseRounds::Ask(LeaseWork work) {
  uint64_t round = 0;
  {
    MutexLock lock(&mu_);
    if (work.lease || work.reconnect) round = ++asked_;
    work_.Merge(std::move(work));
  }
  work_cv_.Signal();
  return round;
}

bool LeaseRounds::Next(LeaseWork* work, uint64_t* round) {
  MutexLock lock(&mu_);
  while (!stop_ && work_.empty()) work_cv_.Wait(&mu_);
  if (stop_) return false;
  *work = std::move(work_);
  work_ = LeaseWork{};
  *round = asked_;
  return true;
}

void LeaseRounds::Answered(uint64_t round) {
  {
    MutexLock lock(&mu_);
    if (round > answered_) answered_ = round;
  }
  slow_ = false;
  answered_cv_.SignalAll();
}

void LeaseRounds::WaitFor(uint64_t round, std::chrono::milliseconds wait_for) {
  if (round == 0 || slow_.load(std::memory_order_relaxed)) return;
  MutexLock lock(&mu_);
  const auto deadline = std::chrono::steady_clock::now() + wait_for;
  while (answered_ < round && !stop_) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      slow_ = true;
      return;
    }
    answered_cv_.WaitWithTimeout(&mu_, deadline - now);
  }
}

void LeaseRounds::Stop() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  work_cv_.SignalAll();
  answered_cv_.SignalAll();
}

LeaseWork LeaseRounds::TakeLeft() {
  MutexLock lock(&mu_);
  LeaseWork left = std::move(work_);
  work_ = LeaseWork{};
  return left;
}

void RunLeaseThread(LeaseRounds& rounds, LeaseThreadTwin& twin) {
  LeaseWork work;
  uint64_t round = 0;
  while (rounds.Next(&work, &round)) {
    // One new session at a time.
    if (work.reconnect && twin.ReconnectUnderway()) work.reconnect = false;
    const std::shared_ptr<SessionStream> current = twin.LeaseStream();
    GiveBack(work, *current);
    if (work.end_session) current->Close();
    if (work.reconnect && twin.ReconnectNeeded(*current)) {
      twin.ReconnectFrom(current);
    } else if (work.lease && !current->broken_now() && !twin.EndedDrained()) {
      twin.ResizeLease(current);
    }
    if (work.lease || work.reconnect) {
      twin.RoundDone();
      rounds.Answered(round);
    }
  }
}

}  // namespace stash::client
