// Warm memory (docs/design.md, "Warm memory"): the host backend's tiers are populated in the
// background from the daemon's start, so the first stash into a pool, or into a lease of its
// chunks, does not pay a page fault per page. The socket is up at once: a stash that arrives
// before its pages are warm still works, it only runs at page-fault speed.
//
// Only the start-up pass: a chunk that gets fresh memory later (back from a mapped session) is
// not populated by the daemon, since a holder that kept the old one mapped could make the daemon
// pay for memory without end (its next holder allocates it, charged to itself).
//
// One thread. Thread-safe.
#ifndef STASH_DAEMON_WARMER_H_
#define STASH_DAEMON_WARMER_H_

#include <absl/base/thread_annotations.h>

#include <cstdint>
#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "daemon/chunk_memory.h"

namespace stash::daemon {

class Warmer {
 public:
  struct Region {
    std::string name;  // the tier's, for the log
    ChunkMemory* memory = nullptr;
  };
  // Starts the thread, which populates every chunk of `regions` in order (those already warm,
  // locked ones, are passed over), with progress in the log for regions of 1 GiB or more.
  // Non-owning: the regions outlive this.
  explicit Warmer(std::vector<Region> regions);
  Warmer(const Warmer&) = delete;
  Warmer& operator=(const Warmer&) = delete;
  ~Warmer();  // stops; what is still queued is dropped (the daemon is going away)

  // Whether the start-up pass is over (every region populated once, or given up on).
  bool started_warm() const;
  // Waits until the start-up pass is over, for tests.
  void Drain();

 private:
  struct Job {
    ChunkMemory* memory = nullptr;
    uint64_t chunk = 0;
  };
  void Run();
  void Populate(const Job& job);

  mutable Mutex mu_;
  CondVar cv_;
  std::deque<Job> start_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;  // a job is running
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool started_warm_ ABSL_GUARDED_BY(mu_) = false;
  bool failure_logged_ ABSL_GUARDED_BY(mu_) = false;  // once per daemon: memory is short
  bool method_logged_ ABSL_GUARDED_BY(mu_) = false;   // how pages are populated, once
  std::vector<Region> regions_;                       // never changes after construction
  std::thread thread_;
};

}  // namespace stash::daemon

#endif  // STASH_DAEMON_WARMER_H_
