// A tier: one region the daemon owns and pages (a GPU pool, or the host tier), with its ring.
#ifndef STASH_DAEMON_TIER_H_
#define STASH_DAEMON_TIER_H_

#include <absl/base/thread_annotations.h>
#include "common/mutex.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/shm.h"
#include "stash/kernels/paging.h"
#include "stash/status.h"

namespace stash::daemon {

// Point-in-time counters of a tier.
struct TierSnapshot {
  std::string name;
  int pool = -1;
  uint64_t page_bytes = 0;
  uint64_t pages_total = 0;
  uint64_t pages_used = 0;
  uint64_t pages_high_water = 0;
  uint64_t bytes_stashed = 0;
  uint64_t stashes_live = 0;
};

// A host-backend tier owns its memory (allocated once: addresses never move) and its page ring;
// ring operations and the copies that read the ring happen under `mu`. A CUDA tier's memory and
// ring live on the device (cuda_executor.cc), and this object only keeps its accounting, updated
// when the stream's work finished. Counters are atomics so stats never wait behind a copy.
class Tier {
 public:
  // A host-backend tier. `pool` is the device pool index, or -1 for the host tier. `pages` > 0.
  static StatusOr<std::unique_ptr<Tier>> Create(std::string name, int pool, uint64_t page_bytes,
                                                uint64_t pages);
  // The accounting of a tier whose memory and ring live elsewhere (base() is null, ring() must
  // not be used).
  static std::unique_ptr<Tier> CreateAccounting(std::string name, int pool, uint64_t page_bytes,
                                                uint64_t pages);

  Tier(const Tier&) = delete;
  Tier& operator=(const Tier&) = delete;

  const std::string& name() const { return name_; }
  int pool() const { return pool_; }
  uint64_t page_bytes() const { return page_bytes_; }
  uint64_t pages() const { return pages_; }
  uint8_t* base() const { return memory_ != nullptr ? memory_->data() : nullptr; }

  Mutex& mu() ABSL_LOCK_RETURNED(mu_) { return mu_; }
  kernels::PageRing& ring() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return ring_; }

  // Publishes a ring change made under mu(): head advanced by `pages` for a stash of `bytes`.
  void PublishAlloc(uint64_t pages, uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Publishes tail advanced by `pages` for a stash of `bytes` that left the tier.
  void PublishFree(uint64_t pages, uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Accounting only (a ring that lives elsewhere): a stash of `pages` pages and `bytes` bytes
  // arrived, or left.
  void AccountAlloc(uint64_t pages, uint64_t bytes);
  void AccountFree(uint64_t pages, uint64_t bytes);

  // Whether every page id appears exactly once among the free slots (an at-rest invariant);
  // for tests and the debug log.
  bool RingIsPermutation();

  TierSnapshot Snapshot() const;

 private:
  Tier(std::string name, int pool, uint64_t page_bytes, uint64_t pages,
       std::unique_ptr<SharedMemory> memory);

  // Never change after construction.
  const std::string name_;
  const int pool_;
  const uint64_t page_bytes_;
  const uint64_t pages_;
  const std::unique_ptr<SharedMemory> memory_;
  std::vector<uint64_t> ids_;  // the ring's storage; touched only under mu_

  Mutex mu_;
  kernels::PageRing ring_ ABSL_GUARDED_BY(mu_);

  std::atomic<uint64_t> pages_used_{0};
  std::atomic<uint64_t> pages_high_water_{0};
  std::atomic<uint64_t> bytes_stashed_{0};
  std::atomic<uint64_t> stashes_live_{0};
};

}  // namespace stash::daemon

#endif  // STASH_DAEMON_TIER_H_
