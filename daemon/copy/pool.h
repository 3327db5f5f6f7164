// One device pool and its serial copy queue (docs/design.md: "one serial copy queue per pool").
//
// Requests of the sessions on this pool are submitted to the pool's executor one at a time, in
// the order they arrived per session; a session whose next request waits on a ready event that
// has not been signalled does not hold up the others. The executor runs them in submission order
// (host: at once, on this worker; cuda: on the GPU's copy stream) and hands each one's
// continuation back to this worker, which answers it.
//
// One thread at a time holds the pool's run token and only it touches the sessions' records, the
// rings and the executor: the worker, or, for a small request of a synchronous executor that
// arrives with nothing of its session queued and the worker idle, the gRPC thread that received
// it. That saves the hand-off to the worker (a thread wake-up, 13-18 us of a 4 KiB round trip).
#ifndef STASH_DAEMON_POOL_H_
#define STASH_DAEMON_POOL_H_

#include <absl/base/thread_annotations.h>
#include <absl/container/flat_hash_map.h>
#include "common/mutex.h"

#include <chrono>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "daemon/copy/executor.h"
#include "daemon/sessions/session.h"
#include "daemon/stats/stats.h"
#include "daemon/tiers/tier.h"
#include "stash/v1/stash.pb.h"

namespace stash::daemon {

class Pool {
 public:
  // `counters` (non-owning) outlives the pool.
  Pool(int index, std::unique_ptr<CopyExecutor> executor, DaemonCounters* counters);
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;
  ~Pool();  // Stop()s

  int index() const { return index_; }
  Tier* device() const { return executor_->device_tier(); }
  Tier* host() const { return executor_->host_tier(); }

  // Queues a validated request of `session` (which must be on this pool), or runs it on the
  // calling thread when it is small and nothing would run before it (the run token, above).
  void Enqueue(std::shared_ptr<Session> session, stash::v1::SessionRequest request,
               std::chrono::steady_clock::time_point received);

  // The session's stream ended: drops its queued requests and queues its teardown (pages
  // returned, mappings closed) behind the request running now, if any. `closed` (optional) runs
  // once every copy and done write submitted for the session finished, so the caller may end
  // the stream then: the client raises the session's pending done counters when its stream
  // ends, and a done write of the daemon landing after that raise could move a counter back
  // (the cuda executor's writes are plain stores). It runs on the worker, or at once when the
  // pool has stopped (all work drained).
  void CloseSession(const std::shared_ptr<Session>& session, CopyExecutor::Then closed = nullptr);

  // Whether a small request enqueued now would run inline: no thread holds the run token, the
  // worker does not wait for it, and nothing is queued (tests: the worker has finished what it
  // answered and woke from the last inline op's hand-back).
  bool Idle() {
    MutexLock lock(&mu_);
    return !running_ && !worker_waiting_ && lanes_.empty() && teardowns_.empty() &&
           completions_.empty();
  }

  // Finishes the request running now, the work in flight and the queued teardowns, then stops
  // the worker. Requests queued later are answered UNAVAILABLE.
  void Stop();

  // Runs `then` on the worker thread (the executor's completions). Thread-safe.
  void Post(CopyExecutor::Then then);

  // An answer to `request_id` with `status`'s code and message.
  static stash::v1::SessionResponse Reply(uint64_t request_id, const Status& status = Status::Ok());
  // The ready event of a stash or reload, if it has one.
  static const stash::v1::EventRef* ReadyOf(const stash::v1::SessionRequest& req);

 private:
  struct Op {
    std::shared_ptr<Session> session;
    stash::v1::SessionRequest request;
    std::chrono::steady_clock::time_point received;
    bool teardown = false;
    CopyExecutor::Then closed;  // teardown: runs once the session's work finished
    uint64_t seq = 0;           // arrival order across sessions
  };
  // The queued requests of one session, in arrival order. The worker looks only at each lane's
  // head, so requests waiting on a ready event nobody signals cost one check per session per
  // poll, however many are queued behind it.
  struct Lane {
    std::shared_ptr<Session> session;
    std::deque<Op> ops;
    // When the head, found waiting on its ready event, is checked again, and the wait before
    // that (doubling from kMinBackoff to kMaxBackoff); zero for a head not checked yet.
    std::chrono::steady_clock::time_point next_check{};
    std::chrono::steady_clock::duration backoff{};
  };
  static constexpr std::chrono::steady_clock::duration kMinBackoff = std::chrono::microseconds(20);
  static constexpr std::chrono::steady_clock::duration kMaxBackoff =
      std::chrono::microseconds(1000);
  // The largest stash or reload run inline: a few microseconds of copying on a gRPC thread.
  static constexpr uint64_t kInlineBytes = 64 << 10;

  void Run();
  // Runs `op` on the calling thread, which took the run token in Enqueue, when it is ready and
  // light; queues it for the worker otherwise. Gives the token back.
  void RunInline(Op op);
  // Whether a request of this kind and size may run on a gRPC thread: a release, a step boundary,
  // or a reload, or a stash of at most kInlineBytes (what the request alone says).
  static bool InlineKind(const stash::v1::SessionRequest& req);
  // The rest, which needs the token: a stash whose every row fits in the pool's own tier (a
  // spill would lock the shared host tier), a reload writing at most kInlineBytes, a reload or
  // release of a stash on the pool's own tier.
  bool Light(const Op& op);
  // Appends `op` to its session's lane and wakes the worker.
  void Queue(Op op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes the next op to run: a teardown, else the earliest-arrived lane head (of those due for
  // a check) whose ready event is signalled. False when every lane waits on its client; `wake`
  // is then when the next head is due (time_point::max() when none is).
  bool TakeNext(Op* op, std::chrono::steady_clock::time_point* wake)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the op's ready event (if any) is signalled. Token holder only.
  bool Ready(const Op& op);
  void Execute(Op& op);
  void DoRegister(Session& s, const stash::v1::SessionRequest& req);
  // Answers a failed stash or reload with `status` once its done event was raised.
  void FailAfterDone(const std::shared_ptr<Session>& s, uint64_t request_id, const Status& status,
                     const DoneSignal& done);
  void DoUnregister(const std::shared_ptr<Session>& session, const stash::v1::SessionRequest& req);
  void DoStash(const std::shared_ptr<Session>& s, const stash::v1::SessionRequest& req,
               std::chrono::steady_clock::time_point received);
  void DoReload(const std::shared_ptr<Session>& s, const stash::v1::SessionRequest& req,
                std::chrono::steady_clock::time_point received);
  void DoRelease(const std::shared_ptr<Session>& s, const stash::v1::SessionRequest& req);
  void DoBeginStep(const std::shared_ptr<Session>& s, const stash::v1::SessionRequest& req);
  void DoTeardown(const std::shared_ptr<Session>& s, CopyExecutor::Then closed);
  // Answers a stash once the executor finished it.
  void FinishStash(Session& s, const stash::v1::SessionRequest& req, StashRecord& record,
                   std::chrono::steady_clock::time_point received,
                   std::chrono::steady_clock::time_point submitted);
  // The done event of a request, resolved in the session's memory; none when it has none or its
  // memory is not open.
  DoneSignal DoneOf(Session& s, const stash::v1::EventRef* done);
  // Submits to the executor with `then` wrapped so Stop() waits for it.
  CopyExecutor::Then Track(CopyExecutor::Then then);

  // Never change after construction.
  const int index_;
  const std::unique_ptr<CopyExecutor> executor_;
  DaemonCounters* const counters_;

  Mutex mu_;
  CondVar cv_;
  absl::flat_hash_map<const Session*, Lane> lanes_ ABSL_GUARDED_BY(mu_);  // non-empty lanes
  std::deque<Op> teardowns_ ABSL_GUARDED_BY(mu_);                         // always ready: run first
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<CopyExecutor::Then> completions_ ABSL_GUARDED_BY(mu_);
  uint64_t outstanding_ ABSL_GUARDED_BY(mu_) = 0;     // submitted continuations not yet run
  bool running_ ABSL_GUARDED_BY(mu_) = false;         // the run token is taken (worker or inline)
  bool worker_waiting_ ABSL_GUARDED_BY(mu_) = false;  // the worker waits for the token
  std::chrono::steady_clock::time_point health_checked_;  // worker thread only
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;  // the worker has returned: nothing runs any more
  std::thread worker_;
};

}  // namespace stash::daemon

#endif  // STASH_DAEMON_POOL_H_
