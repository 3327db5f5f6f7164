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

#include "daemon/tiers/chunk_lender.h"
#include "daemon/tiers/chunk_memory.h"
#include "stash/kernels/paging.h"
#include "stash/status.h"

namespace stash::daemon {

class HostChunkLender;

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
  // Device pools: pages holding other pools' daemon-copy stashes (the peer tier); in pages_used.
  uint64_t pages_lent = 0;
};

// Daemon-copy's peer tier: how many free pages a device pool keeps for its own sessions when
// another pool's session asks it for pages (docs/design.md, "Daemon-copy's peer tier"). A device
// keeps what its own ranks are using now, and lends what they are not, less 1/32 of the pool
// (at least a page) so that its own ranks' next stash finds room at once. Not room for the most
// they ever held: the ranks of a job stash in lock step and peak at the same instant, so a
// device whose ranks are below their peak now is exactly the one that can lend then, and its
// own ranks, should they need more later, borrow from peers in turn (the node's total is what
// bounds them, as in one shared pool). Pages held by mapped sessions' leases count as in use.
inline uint64_t PeerReservePages(uint64_t pool_pages) { return (pool_pages + 31) / 32; }

// Whether a pool with `free_pages` free and `reserve` reserved (PeerReservePages) lends a stash of
// `pages` pages to another pool's session: only while its free pages stay at or above the reserve
// after the stash.
inline bool PeerLends(uint64_t free_pages, uint64_t pages, uint64_t reserve) {
  return free_pages >= pages && free_pages - pages >= reserve;
}

// A host-backend tier owns its memory (allocated once: addresses never move) and its page ring;
// ring operations and the copies that read the ring happen under `mu`, and it lends its chunks
// itself (lender()). A CUDA tier's memory and ring live on the device (cuda_executor.cc), and
// this object only keeps its accounting, updated when the stream's work finished; the executor
// lends its chunks (SetLender). Counters are atomics so stats never wait behind a copy.
class Tier {
 public:
  // A host-backend tier. `pool` is the device pool index, or -1 for the host tier. `pages` > 0.
  // Its memory is cut into chunks of `chunk_pages` pages (0 = one chunk; the last may be
  // shorter), each its own memfd (ChunkMemory), which mapped sessions lease whole; `memory`
  // says whether it is locked (--lock-memory) and which pages it asks for.
  static StatusOr<std::unique_ptr<Tier>> Create(std::string name, int pool, uint64_t page_bytes,
                                                uint64_t pages, uint64_t chunk_pages = 0,
                                                const ChunkMemoryOptions& memory = {});
  // The accounting of a tier whose memory and ring live elsewhere (base() is null, ring() must
  // not be used). `chunk_pages` > 0: its memory is cut into chunks of that many pages (the last
  // may be shorter), which a lender set with SetLender lends. `reported` (borrowed, may be null):
  // memory held elsewhere whose page kind and warm bytes the stats show (the cuda backend's host
  // tier share).
  static std::unique_ptr<Tier> CreateAccounting(std::string name, int pool, uint64_t page_bytes,
                                                uint64_t pages, uint64_t chunk_pages = 0,
                                                const ChunkMemory* reported = nullptr);
  ~Tier();

  Tier(const Tier&) = delete;
  Tier& operator=(const Tier&) = delete;

  const std::string& name() const { return name_; }
  int pool() const { return pool_; }
  uint64_t page_bytes() const { return page_bytes_; }
  uint64_t pages() const { return pages_; }
  uint8_t* base() const { return memory_ != nullptr ? memory_->base() : nullptr; }

  // Chunks (mapped mode). A host-backend tier's memory; null on an accounting-only tier.
  ChunkMemory* chunk_memory() const { return memory_.get(); }
  // What the stats report of the tier's host memory: its own, or the memory an accounting tier
  // was given; null for GPU memory.
  const ChunkMemory* reported_memory() const {
    return memory_ != nullptr ? memory_.get() : reported_;
  }
  uint64_t chunk_pages() const { return chunk_pages_; }
  uint64_t chunks() const {
    return chunk_pages_ == 0 ? 0 : (pages_ + chunk_pages_ - 1) / chunk_pages_;
  }
  // Pages of chunk `chunk` (< chunks()).
  uint64_t ChunkPages(uint64_t chunk) const;
  // Chunks whose every page is free in the daemon-copy ring (leasable), for stats and sizing
  // first leases: now on a host-backend tier; on a CUDA tier, as the lender last saw the
  // device's ring (SetChunksFree).
  uint64_t chunks_free() const { return chunks_free_.load(std::memory_order_relaxed); }
  void SetChunksFree(uint64_t chunks) { chunks_free_.store(chunks, std::memory_order_relaxed); }
  // Who lends this tier's chunks to mapped sessions: the tier itself (host backend), the
  // lender set with SetLender (CUDA), or null (no chunks).
  ChunkLender* lender() const { return lender_; }
  // For an accounting-only tier with chunks; `lender` outlives the tier's use by Leases.
  void SetLender(ChunkLender* lender) { lender_ = lender; }

  Mutex& mu() ABSL_LOCK_RETURNED(mu_) { return mu_; }
  kernels::PageRing& ring() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return ring_; }

  // Publishes a ring change made under mu(): head advanced by `pages` for a stash of `bytes`.
  // `lent`: the stash is another pool's session's (the peer tier; it counts in pages_lent and not
  // in the own sessions' high water).
  void PublishAlloc(uint64_t pages, uint64_t bytes, bool lent = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Publishes tail advanced by `pages` for a stash of `bytes` that left the tier (`lent` as it was
  // published with).
  void PublishFree(uint64_t pages, uint64_t bytes, bool lent = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Daemon-copy's peer tier. Free pages now, without the lock (to order the peers a stash tries;
  // Lends decides under the lock).
  uint64_t pages_free_estimate() const {
    const uint64_t used = pages_used_.load(std::memory_order_relaxed);
    return used < pages_ ? pages_ - used : 0;
  }
  // Pages the pool keeps for its own sessions now (PeerReservePages).
  uint64_t PeerReserve() const;
  // Whether the pool lends `pages` pages to another pool's stash now (PeerLends).
  bool Lends(uint64_t pages) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return PeerLends(kernels::RingFree(ring_), pages, PeerReserve());
  }

  // Accounting only (a ring that lives elsewhere): a stash of `pages` pages and `bytes` bytes
  // arrived, or left.
  void AccountAlloc(uint64_t pages, uint64_t bytes);
  void AccountFree(uint64_t pages, uint64_t bytes);
  // Accounting only: whole chunks of `pages` pages left the ring (leased, or waiting for memory),
  // or came back to it.
  void AccountTaken(uint64_t pages) { AddUsed(pages); }
  void AccountReturned(uint64_t pages) { pages_used_.fetch_sub(pages, std::memory_order_relaxed); }

  // Chunk ring functions (mapped mode), under mu(). Which chunks are in the ring with every
  // page free, in chunk order: O(chunks), from per-chunk counts kept by PublishAlloc/Free.
  std::vector<uint64_t> WhollyFreeChunks() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes chunks (each from WhollyFreeChunks) out of the ring: one pass over the free slots
  // rewrites [head, tail) without their page ids, and tail moves back by their pages. Their
  // pages count as used. Sets `*written` (optional) to whether a daemon-copy stash wrote any
  // of them since it last entered the ring. CHECK-fails on a chunk that is not wholly free.
  void TakeChunks(const std::vector<uint64_t>& chunks, std::vector<bool>* written = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Puts a chunk taken by TakeChunks back: its page ids are appended at tail.
  void ReturnChunk(uint64_t chunk) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Whether every page id appears exactly once among the free slots and the pages of chunks
  // taken out (an at-rest invariant); for tests and the debug log.
  bool RingIsPermutation();

  TierSnapshot Snapshot() const;

 private:
  friend class HostChunkLender;  // its twin of the cuda lender, over this tier's ring and memory
  Tier(std::string name, int pool, uint64_t page_bytes, uint64_t pages, uint64_t chunk_pages,
       std::unique_ptr<ChunkMemory> memory);
  // `lent`: pages of another pool's stash (they do not raise the own sessions' high water).
  void AddUsed(uint64_t pages, bool lent = false);
  // Page ids of slots [first, first + n) left (`delta` = -1) or entered (+1) the ring.
  void CountChunkPages(uint64_t first, uint64_t n, int delta) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Never change after construction.
  const std::string name_;
  const int pool_;
  const uint64_t page_bytes_;
  const uint64_t pages_;
  const uint64_t chunk_pages_;  // 0 = no chunks (an accounting-only tier without a lender)
  const std::unique_ptr<ChunkMemory> memory_;
  const ChunkMemory* reported_ = nullptr;        // an accounting tier's, for stats
  std::vector<uint64_t> ids_;                    // the ring's storage; touched only under mu_
  std::unique_ptr<HostChunkLender> own_lender_;  // a host-backend tier's
  ChunkLender* lender_ = nullptr;

  Mutex mu_;
  kernels::PageRing ring_ ABSL_GUARDED_BY(mu_);
  // Per chunk: its pages free in the ring, whether it is in the ring at all (not taken), and
  // whether a stash wrote it since it entered the ring.
  std::vector<uint64_t> chunk_free_pages_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> chunk_in_ring_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> chunk_written_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> chunks_free_{0};

  std::atomic<uint64_t> pages_used_{0};
  std::atomic<uint64_t> pages_high_water_{0};
  std::atomic<uint64_t> pages_lent_{0};  // in pages_used_: other pools' stashes
  std::atomic<uint64_t> bytes_stashed_{0};
  std::atomic<uint64_t> stashes_live_{0};
};

}  // namespace stash::daemon

#endif  // STASH_DAEMON_TIER_H_
