// What a mapped session asks its lease thread to do, and the rounds that number it: shared by
// both twins (MappedSession on the host backend, CudaMappedSession on the cuda backend). Every
// round trip to the daemon after Open runs on the lease thread, never on the path that pages,
// so a slow or hung daemon never stalls a rank's stashes. A BeginStep that asks a lease (or a new
// session) waits for its round a bounded time; once a round came late, later steps do not wait
// until one is answered again.
#ifndef STASH_CLIENT_LEASE_ROUNDS_H_
#define STASH_CLIENT_LEASE_ROUNDS_H_

#include <absl/base/thread_annotations.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <memory>

#include "common/mutex.h"

namespace stash::client {

struct SessionStream;

struct LeaseWork {
  bool lease = false;               // an automatic lease for the step just begun
  bool reconnect = false;           // the stream broke (or ended drained), no stash is live
  bool end_session = false;         // drained: end the session after giving back
  std::vector<uint64_t> give_back;  // chunk ids no stash uses any more
  // Chunks of an ended session of this process (`orphans_of`), returned through the new one.
  std::vector<uint64_t> orphans;
  std::string orphans_of;

  bool empty() const;
  // Adds `other`'s asks to these (ids appended; orphans of another session replace these).
  void Merge(LeaseWork other);
};

// The lease thread: gives `work`'s chunks back over `current` (its give-backs, then an ended
// session's orphans), unless that stream broke; a failure is logged, never fatal.
void GiveBack(const LeaseWork& work, SessionStream& current);

class LeaseRounds;

// What the lease thread asks of the twin it serves (MappedSession, CudaMappedSession): each
// twin applies answers its own way (the host copier between operations, the cuda twin on the
// trainer's stream), but the thread's rounds are one loop (RunLeaseThread).
class LeaseThreadTwin {
 public:
  virtual ~LeaseThreadTwin() = default;
  // The stream the round works over.
  virtual std::shared_ptr<SessionStream> LeaseStream() const = 0;
  // A reconnect was asked while one of this twin's is still on its way: true drops this ask.
  virtual bool ReconnectUnderway() = 0;
  // A reconnect was asked: whether `current` (after the round's give-backs) must be replaced.
  virtual bool ReconnectNeeded(const SessionStream& current) const = 0;
  // Opens a new session in place of `current`.
  virtual void ReconnectFrom(const std::shared_ptr<SessionStream>& current) = 0;
  // The session ended drained: no lease is asked any more.
  virtual bool EndedDrained() const = 0;
  // One automatic lease over `current`, applied.
  virtual void ResizeLease(const std::shared_ptr<SessionStream>& current) = 0;
  // A round that asked a lease or a reconnect is through (its answers are in, or it failed).
  virtual void RoundDone() = 0;
};

// The lease thread's loop until `rounds` stops: for each round, the give-backs over the current
// stream, the session's end when drained, then a reconnect or an automatic lease, then the round
// answered. After Stop the twin's destructor gives back what is left (LeaseRounds::TakeLeft).
void RunLeaseThread(LeaseRounds& rounds, LeaseThreadTwin& twin);

class LeaseRounds {
 public:
  // Adds `work` to what the lease thread does next (any thread); returns the round it joins, 0
  // when it asks neither a lease nor a reconnect.
  uint64_t Ask(LeaseWork work);
  // The lease thread: waits for work and takes all of it; `round` is the last round it answers.
  // False once Stop was called.
  bool Next(LeaseWork* work, uint64_t* round);
  // The lease thread: the rounds up to `round` are answered (or failed): waiters go on.
  void Answered(uint64_t round);
  // Waits up to `wait_for` for round `round` (any thread; 0: nothing to wait for). Not at all
  // while a round came late: the step goes on without it, and later steps wait again once one
  // is answered.
  void WaitFor(uint64_t round, std::chrono::milliseconds wait_for);
  // Ends Next and every wait; TakeLeft then hands back what was still asked.
  void Stop();
  LeaseWork TakeLeft();

 private:
  Mutex mu_;
  CondVar work_cv_;
  CondVar answered_cv_;
  LeaseWork work_ ABSL_GUARDED_BY(mu_);
  uint64_t asked_ ABSL_GUARDED_BY(mu_) = 0;     // leases and reconnects asked so far
  uint64_t answered_ ABSL_GUARDED_BY(mu_) = 0;  // the last round answered (or failed)
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> slow_{false};  // a round did not come in time: stop waiting
};

}  // namespace stash::client

#endif  // STASH_CLIENT_LEASE_ROUNDS_H_
