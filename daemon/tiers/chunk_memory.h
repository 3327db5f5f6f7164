// Host memory of a tier cut into chunks (a host-backend tier; the cuda backend's host tier share
// through daemon/cuda/pinned_chunk_memory.h) (docs/design.md, "Mapped mode" and "Warm
// memory"): each chunk is a sealed memfd of its own, mapped by the daemon MAP_FIXED into one
// reserved address range, so the tier's base address and its page ids never move while chunks
// are leased, handed back and renewed.
#ifndef STASH_DAEMON_CHUNK_MEMORY_H_
#define STASH_DAEMON_CHUNK_MEMORY_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/unique_fd.h"
#include "stash/status.h"

namespace stash::daemon {

// Which pages back a tier's chunks.
enum class PageKind {
  kSmall,            // the kernel's base pages (4 KiB on x86-64)
  kTransparentHuge,  // shmem transparent huge pages (MADV_HUGEPAGE; 2 MiB where they form)
  kHugetlb,          // 2 MiB pages of the kernel's huge page pool (MFD_HUGETLB), reserved at map
};
// "4 KiB pages", "transparent huge pages" or "hugetlb 2 MiB pages", for the log, stats and
// metrics.
const char* PageKindName(PageKind kind);

struct ChunkMemoryOptions {
  // --lock-memory: every chunk (and every renewed one) is populated and mlock'ed as it is
  // mapped; RESOURCE_EXHAUSTED naming the locked-memory limit when the kernel refuses.
  bool lock = false;
  // Ask for shmem transparent huge pages (MADV_HUGEPAGE on every chunk); the reservation and
  // every chunk then start on a 2 MiB boundary where the chunk size allows it.
  bool transparent_huge = false;
  // Every chunk a hugetlb memfd (--huge-pages=hugetlb): chunk and tier sizes whole 2 MiB pages
  // (CheckMemoryFits refuses others), the pages reserved when each chunk is mapped, so a pool
  // short of huge pages fails there, not on a later fault. Wins over transparent_huge.
  bool hugetlb = false;
};

// How a chunk's pages were populated (Populate).
enum class PopulateMethod {
  // madvise(MADV_POPULATE_WRITE), Linux 5.14+: allocated and mapped writable, and (but on
  // hugetlb) each page written once without changing a byte
  kPopulateWrite,
  kWriteFault,  // an older kernel: that write of each page allocates it
};

// Thread-compatible, with one exception: Populate may run on any thread while others copy into
// any chunk (it never changes a byte). Renew of one chunk must not run while anyone copies into it
// (the caller guarantees it: a chunk is renewed only while it is out of the daemon-copy ring).
class ChunkMemory {
 public:
  // Reserves `bytes` (> 0, a whole number of pages) and maps chunks of `chunk_bytes` (> 0; the
  // last one may be shorter) into it, each a fresh zero-filled memfd sealed with
  // F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL. `label` names the memfds (/proc). With
  // options.lock, progress in the log for a large tier.
  static StatusOr<std::unique_ptr<ChunkMemory>> Create(const std::string& label, uint64_t bytes,
                                                       uint64_t chunk_bytes,
                                                       const ChunkMemoryOptions& options = {});
  ChunkMemory(const ChunkMemory&) = delete;
  ChunkMemory& operator=(const ChunkMemory&) = delete;
  ~ChunkMemory();

  uint8_t* base() const { return base_; }
  uint64_t bytes() const { return bytes_; }
  uint64_t chunk_bytes() const { return chunk_bytes_; }
  uint64_t chunks() const { return fds_.size(); }
  PageKind page_kind() const { return page_kind_; }
  // Bytes of chunks populated since they last got fresh memory (Populate, or locked).
  uint64_t bytes_warm() const { return bytes_warm_.load(std::memory_order_relaxed); }
  // The size of chunk `chunk` (< chunks()): chunk_bytes(), or less for the last one.
  uint64_t ChunkBytes(uint64_t chunk) const;
  // The memfd of chunk `chunk`, owned here; borrowed until the chunk is renewed.
  int fd(uint64_t chunk) const { return fds_[chunk].get(); }

  // Gives chunk `chunk` fresh zero-filled memory at the same address: a new memfd mapped
  // MAP_FIXED over the old one. Whoever still maps the old memfd keeps memory nobody else sees.
  // The new memory is not populated (whoever uses it next takes its pages). On an error the old
  // memory stays in place, or (a kernel that unmapped it before failing) the range holds an
  // inaccessible placeholder: never a hole another mapping could land in.
  Status Renew(uint64_t chunk);
  // Allocates every page of chunk `chunk` now, so the first copy into it runs at copy speed
  // instead of a page fault per page; changes no byte. RESOURCE_EXHAUSTED when memory is short
  // (the pages not populated fault in later, as without it).
  StatusOr<PopulateMethod> Populate(uint64_t chunk);

 private:
  ChunkMemory(std::string label, uint8_t* base, uint64_t bytes, uint64_t chunk_bytes,
              const ChunkMemoryOptions& options, PageKind page_kind);
  StatusOr<UniqueFd> MapFresh(uint64_t chunk);
  void SetWarm(uint64_t chunk, bool warm);

  // Never change after construction (fds_ entries change on Renew).
  const std::string label_;
  uint8_t* const base_;
  const uint64_t bytes_;
  const uint64_t chunk_bytes_;
  const ChunkMemoryOptions options_;
  const PageKind page_kind_;
  std::vector<UniqueFd> fds_;
  std::unique_ptr<std::atomic<bool>[]> warm_;  // per chunk
  std::atomic<uint64_t> bytes_warm_{0};
};

}  // namespace stash::daemon

#endif  // STASH_DAEMON_CHUNK_MEMORY_H_
