// The copy executor of one pool: where client memory is opened and where a pool's copies run.
//
// The pool worker (pool.cc) owns the queue, the per-session order, ready events, admission
// bookkeeping and the answers; the executor owns the memory and the copy machinery:
//   host  (host_executor.cc): client memfds; copies run on the calling thread (split
//         across CopyWorkers) before the call returns.
//   cuda  (cuda_executor.cc): CUDA IPC memory; kernels are enqueued on the GPU's copy stream and
//         the call returns at once; `then` runs later on the pool worker.
// A third mode (the trainer's own stream runs the same kernels into daemon-owned, IPC-exported
// pool pages) would be one more implementation of this interface.
//
// Rules every implementation keeps:
//  - Work runs in the order it was submitted (a stream, or the serial worker).
//  - `then` runs exactly once, on the thread that holds the pool's run token (its worker, or a
//    gRPC thread running a small request inline), after the work and everything submitted
//    before it finished, and after the executor filled in the results it promises.
//  - A record's page record and plan stay valid until Reload or Release of that record finished.
#ifndef STASH_DAEMON_EXECUTOR_H_
#define STASH_DAEMON_EXECUTOR_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/unique_fd.h"
#include "daemon/copy/mapped_memory.h"
#include "daemon/copy/records.h"
#include "stash/status.h"
#include "stash/v1/stash.pb.h"

namespace stash::daemon {

class CopyExecutor {
 public:
  using Then = std::function<void()>;

  virtual ~CopyExecutor() = default;

  // Where an asynchronous executor hands its continuations (the pool worker's queue); called once,
  // before any work is submitted. `post` is thread-safe and never blocks for long.
  // NOLINTNEXTLINE(performance-unnecessary-value-param): overrides move it into a member
  virtual void Attach(std::function<void(Then)> /*post*/) {}

  // The pool's own tier and the spill tier it uses (null = none); for stats and answers.
  virtual Tier* device_tier() const = 0;
  virtual Tier* host_tier() const = 0;

  // Opens a registration (synchronously): MEMORY_KIND_HOST_FD memory from `fd`, the memfd the
  // client deposited (checked already; invalid for other kinds). Errors say what the client
  // must change.
  virtual StatusOr<std::unique_ptr<MappedMemory>> Open(const stash::v1::RegisterMemory& reg,
                                                       UniqueFd fd) = 0;

  // Plans and copies a stash. Before `then`: record->plan, record->tier and the placement state
  // are set, the tier's accounting includes the stash, and `done` is raised.
  // kInvalidCount / kOverflow plans take nothing (tier null); `done` is raised all the same.
  virtual void Stash(const StashWork& work, Then then) = 0;

  // Copies a placed stash back (or only returns its pages when destination is null). Before
  // `then`: the pages are back in the tier's ring and accounting, `done` is raised. A record that
  // placed nothing is left alone (the pool answers that it holds no data).
  virtual void Reload(const ReloadWork& work, Then then) = 0;

  // Raises `done` in order with the work submitted before (a request answered with an error still
  // raises its done event: the daemon no longer touches its buffers, and a stream waiting on it
  // must not hang). Follow it with a Fence (or more work): the cuda executor's raise for CPU
  // waiters rides on the next continuation's host callback.
  virtual void Raise(const DoneSignal& done) = 0;

  // `then` runs once everything submitted before finished.
  virtual void Fence(Then then) = 0;

  // Called by the pool worker every few milliseconds while work is outstanding. An executor
  // whose device failed for good (a sticky CUDA error: no submitted work, callback or done
  // event will ever run again) ends the process here, so that clients see UNAVAILABLE at once
  // and the service manager restarts the daemon, instead of every waiter hanging.
  virtual void CheckHealth() {}

  // Whether Stash, Reload and Fence run their work and `then` before they return (the host
  // executor). The pool may then run a small request on the thread that received it, instead
  // of handing it to the worker (Pool::Enqueue).
  virtual bool Synchronous() const { return false; }
};

}  // namespace stash::daemon

#endif  // STASH_DAEMON_EXECUTOR_H_
