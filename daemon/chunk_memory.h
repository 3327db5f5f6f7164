// The memory of a host-backend tier cut into chunks (docs/design.md, "Mapped mode"): each chunk
// is a sealed memfd of its own, mapped by the daemon MAP_FIXED into one reserved address range,
// so the tier's base address and its page ids never move while chunks are leased, handed back
// and renewed.
#ifndef STASH_DAEMON_CHUNK_MEMORY_H_
#define STASH_DAEMON_CHUNK_MEMORY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/unique_fd.h"
#include "stash/status.h"

namespace stash::daemon {

// Thread-compatible: Renew of one chunk must not run while anyone copies into it (the
// caller guarantees it: a chunk is renewed only while it is out of the daemon-copy ring).
class ChunkMemory {
 public:
  // Reserves `bytes` (> 0, a whole number of pages) and maps chunks of `chunk_bytes` (> 0; the
  // last one may be shorter) into it, each a fresh zero-filled memfd sealed with
  // F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL. `label` names the memfds (/proc). With `lock`,
  // every chunk (and every renewed one) is populated and locked in memory (mlock), with progress
  // in the log for a large tier; RESOURCE_EXHAUSTED naming the locked-memory limit when the
  // kernel refuses.
  static StatusOr<std::unique_ptr<ChunkMemory>> Create(const std::string& label, uint64_t bytes,
                                                       uint64_t chunk_bytes, bool lock = false);
  ChunkMemory(const ChunkMemory&) = delete;
  ChunkMemory& operator=(const ChunkMemory&) = delete;
  ~ChunkMemory();

  uint8_t* base() const { return base_; }
  uint64_t bytes() const { return bytes_; }
  uint64_t chunk_bytes() const { return chunk_bytes_; }
  uint64_t chunks() const { return fds_.size(); }
  // The size of chunk `chunk` (< chunks()): chunk_bytes(), or less for the last one.
  uint64_t ChunkBytes(uint64_t chunk) const;
  // The memfd of chunk `chunk`, owned here; borrowed until the chunk is renewed.
  int fd(uint64_t chunk) const { return fds_[chunk].get(); }

  // Gives chunk `chunk` fresh zero-filled memory at the same address: a new memfd mapped
  // MAP_FIXED over the old one. Whoever still maps the old memfd keeps memory nobody else sees.
  Status Renew(uint64_t chunk);

 private:
  ChunkMemory(std::string label, uint8_t* base, uint64_t bytes, uint64_t chunk_bytes, bool lock);
  StatusOr<UniqueFd> MapFresh(uint64_t chunk);

  // Never change after construction (fds_ entries change on Renew).
  const std::string label_;
  uint8_t* const base_;
  const uint64_t bytes_;
  const uint64_t chunk_bytes_;
  const bool lock_;
  std::vector<UniqueFd> fds_;
};

}  // namespace stash::daemon

#endif  // STASH_DAEMON_CHUNK_MEMORY_H_
