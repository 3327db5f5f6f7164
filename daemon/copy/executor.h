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
#include "stash/kernels/paging.h"
#include "stash/status.h"
#include "stash/v1/stash.pb.h"

namespace stash::daemon {

class Tier;

// A client allocation the daemon opened for one session. Closing (destruction) must happen only
// after every copy that uses it finished (the pool fences first).
class MappedMemory {
 public:
  virtual ~MappedMemory() = default;
  // Where copies address byte 0 (a host address for host memory, a device address in the
  // daemon's context for CUDA memory and for host memory the CUDA executor registered).
  uint8_t* data() const { return data_; }
  // Where the daemon's CPU reads byte 0; null for device memory.
  uint8_t* host() const { return host_; }
  uint64_t bytes() const { return bytes_; }

 protected:
  MappedMemory(uint8_t* data, uint8_t* host, uint64_t bytes)
      : data_(data), host_(host), bytes_(bytes) {}

 private:
  uint8_t* data_;
  uint8_t* host_;
  uint64_t bytes_;
};

// One stash the pool holds for a session, from its Stash until its Reload or Release finished.
struct StashRecord {
  uint64_t row_bytes = 0;
  uint64_t max_rows = 0;
  // Set by the executor before the stash's `then` runs.
  kernels::StashPlan plan{};
  Tier* tier = nullptr;  // where the plan placed it; null when it placed nothing
  // Executor-owned placement state: the host executor keeps the page record here, the CUDA
  // executor keeps its slot in device-visible metadata.
  std::vector<uint64_t> page_record;
  int64_t slot = -1;
  uint64_t record_offset = 0;
  uint64_t record_entries = 0;
  // Set instead of a plan when the executor could not run the stash (nothing was taken).
  Status error;
};

// A row count: a value known now, or an int64 the copy reads from client memory when it runs.
struct CountSource {
  const uint8_t* data = nullptr;  // executor address of the int64; null = `value`
  int64_t value = 0;
  uint32_t divisor = 1;
};

// A counter to raise to `value` after the work (the client's done event); null = none.
struct DoneSignal {
  const MappedMemory* memory = nullptr;
  uint64_t offset = 0;
  uint64_t value = 0;
};

struct StashWork {
  const uint8_t* source = nullptr;  // executor address of row 0
  CountSource count;
  bool allow_host_spill = true;
  DoneSignal done;
  StashRecord* record = nullptr;  // filled in; owned by the pool, outlives `then`
};

struct ReloadWork {
  uint8_t* destination = nullptr;  // executor address of row 0; null = release (no copy)
  bool zero_tail = false;
  DoneSignal done;
  StashRecord* record = nullptr;  // the stash's record; its pages go back to its tier
};

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
