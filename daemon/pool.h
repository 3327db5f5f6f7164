// One device pool and its serial copy queue (DESIGN.md §4: "one serial copy queue per pool").
//
// Requests of the sessions on this pool run one at a time, in the order they arrived per
// session; a session whose next request waits on a ready event that has not been signalled does
// not hold up the others. Ring changes happen only here (and in the other pools' queues for the
// shared host tier, under its mutex).
#ifndef STASH_DAEMON_POOL_H_
#define STASH_DAEMON_POOL_H_

#include <absl/base/thread_annotations.h>
#include "common/mutex.h"

#include <chrono>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "daemon/copy_workers.h"
#include "daemon/session.h"
#include "daemon/stats.h"
#include "daemon/tier.h"
#include "stash/v1/stash.pb.h"

namespace stash::daemon {

class Pool {
 public:
  // Non-owning: `device` (this pool's tier), `host` (shared host tier, may be null), `workers`
  // and `counters` outlive the pool.
  Pool(int index, Tier* device, Tier* host, CopyWorkers* workers, DaemonCounters* counters);
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;
  ~Pool();  // Stop()s

  int index() const { return index_; }
  Tier* device() const { return device_; }

  // Queues a validated request of `session` (which must be on this pool).
  void Enqueue(std::shared_ptr<Session> session, stash::v1::SessionRequest request,
               std::chrono::steady_clock::time_point received);

  // The session's stream ended: drops its queued requests and queues its teardown (pages
  // returned, mappings closed) behind the request running now, if any.
  void CloseSession(const std::shared_ptr<Session>& session);

  // Finishes the request running now and the queued teardowns, then stops the worker.
  void Stop();

 private:
  struct Op {
    std::shared_ptr<Session> session;
    stash::v1::SessionRequest request;
    std::chrono::steady_clock::time_point received;
    bool teardown = false;
  };

  // Shared memory names of a closed session whose process had not exited yet at teardown. The
  // worker unlinks them once it has (a SIGKILLed client closes its socket before it is a
  // zombie), or forgets them after a few seconds: a live client unlinks its own.
  struct Orphan {
    int64_t pid;
    std::vector<std::string> names;
    std::chrono::steady_clock::time_point until;
  };

  void Run();
  void SweepOrphans() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the op's ready event (if any) is signalled. Worker thread only.
  bool Ready(const Op& op);
  void Execute(Op& op);
  void DoRegister(Session& s, const stash::v1::SessionRequest& req);
  void DoUnregister(Session& s, const stash::v1::SessionRequest& req);
  void DoStash(Session& s, const stash::v1::SessionRequest& req,
               std::chrono::steady_clock::time_point received);
  void DoReload(Session& s, const stash::v1::SessionRequest& req,
                std::chrono::steady_clock::time_point received);
  void DoRelease(Session& s, const stash::v1::SessionRequest& req);
  void DoBeginStep(Session& s, const stash::v1::SessionRequest& req);
  void DoTeardown(Session& s);
  // Returns a stash's pages to its tier.
  void FreeStash(Session& s, StashRecord& record);

  // Never change after construction.
  const int index_;
  Tier* const device_;
  Tier* const host_;
  CopyWorkers* const workers_;
  DaemonCounters* const counters_;

  Mutex mu_;
  CondVar cv_;
  std::deque<Op> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<Orphan> orphans_ ABSL_GUARDED_BY(mu_);
  std::thread worker_;
};

}  // namespace stash::daemon

#endif  // STASH_DAEMON_POOL_H_
