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

#include "common/mutex.h"

namespace stash {

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

}  // namespace stash

#endif  // STASH_CLIENT_LEASE_ROUNDS_H_
