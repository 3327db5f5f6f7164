// Warm memory (docs/design.md, "Warm memory"): the host backend's tiers are populated in the
// background from the daemon's start, so the first stash into a pool, or into a lease of its
// chunks, does not pay a page fault per page. The socket is up at once: a stash that arrives
// before its pages are warm still works, it only runs at page-fault speed.
//
// Only the start-up pass: a chunk that gets fresh memory later (back from a mapped session) is
// not populated by the daemon, since a holder that kept the old one mapped could make the daemon
// pay for memory without end (its next holder allocates it, charged to itself).
#ifndef STASH_DAEMON_WARMER_H_
#define STASH_DAEMON_WARMER_H_

#include <atomic>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "daemon/tiers/chunk_memory.h"

namespace stash::daemon {

class Warmer {
 public:
  struct Region {
    std::string name;  // the tier's, for the log
    ChunkMemory* memory = nullptr;
  };
  // Starts one thread that populates every chunk of `regions` in order (regions already warm,
  // locked ones, are passed over), with progress in the log for regions of 1 GiB or more, and
  // then ends, calling `done` (may be null) with the seconds since it started. Non-owning: the
  // regions outlive this.
  explicit Warmer(std::vector<Region> regions, std::function<void(double seconds)> done = nullptr);
  Warmer(const Warmer&) = delete;
  Warmer& operator=(const Warmer&) = delete;
  ~Warmer();  // stops the pass where it is (the daemon is going away)

  // Waits until the pass is over, for tests.
  void Wait();

 private:
  void Run();

  const std::vector<Region> regions_;
  const std::function<void(double)> done_;
  std::atomic<bool> stop_{false};
  std::thread thread_;  // last: it reads the rest
};

}  // namespace stash::daemon

#endif  // STASH_DAEMON_WARMER_H_
