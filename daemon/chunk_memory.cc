#include "daemon/chunk_memory.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "common/bytes.h"
#include "common/logging.h"
#include "common/macros.h"
#include "common/shm.h"
#include "common/sys.h"

namespace stash::daemon {

StatusOr<std::unique_ptr<ChunkMemory>> ChunkMemory::Create(const std::string& label, uint64_t bytes,
                                                           uint64_t chunk_bytes, bool lock) {
  if (bytes == 0 || chunk_bytes == 0) {
    return InvalidArgumentError("chunked memory " + label + " needs bytes and chunk bytes > 0");
  }
  // One reservation: nothing else lands between the chunks, and base() never moves.
  void* addr = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (addr == MAP_FAILED) return ErrnoStatus("mmap reserve of " + std::to_string(bytes) + " bytes");
  std::unique_ptr<ChunkMemory> memory(
      new ChunkMemory(label, static_cast<uint8_t*>(addr), bytes, chunk_bytes, lock));
  const uint64_t chunks = (bytes + chunk_bytes - 1) / chunk_bytes;
  memory->fds_.resize(chunks);
  // Locking a large tier takes a while (the kernel zeroes every page): say how far it is.
  const bool progress = lock && bytes >= (1ULL << 30);
  const auto start = std::chrono::steady_clock::now();
  uint64_t said = 0;  // tenths said so far
  for (uint64_t c = 0; c < chunks; ++c) {
    STASH_ASSIGN_OR_RETURN(memory->fds_[c], memory->MapFresh(c));
    const uint64_t tenths = (c + 1) * 10 / chunks;
    if (progress && tenths > said) {
      said = tenths;
      Log("pool")->info(
          "{}: locked {} of {} in memory ({} s)", label,
          FormatBytes(std::min(bytes, (c + 1) * chunk_bytes)), FormatBytes(bytes),
          std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - start)
              .count());
    }
  }
  return memory;
}

ChunkMemory::ChunkMemory(std::string label, uint8_t* base, uint64_t bytes, uint64_t chunk_bytes,
                         bool lock)
    : label_(std::move(label)),
      base_(base),
      bytes_(bytes),
      chunk_bytes_(chunk_bytes),
      lock_(lock) {}

ChunkMemory::~ChunkMemory() { munmap(base_, bytes_); }

uint64_t ChunkMemory::ChunkBytes(uint64_t chunk) const {
  const uint64_t first = chunk * chunk_bytes_;
  return std::min(chunk_bytes_, bytes_ - first);
}

StatusOr<UniqueFd> ChunkMemory::MapFresh(uint64_t chunk) {
  const uint64_t size = ChunkBytes(chunk);
  const std::string name = label_ + "-chunk" + std::to_string(chunk);
  STASH_ASSIGN_OR_RETURN(UniqueFd fd, CreateSealedMemfd(name, size));
  void* want = base_ + chunk * chunk_bytes_;
  void* got =
      mmap(want, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED | MAP_NORESERVE, fd.get(), 0);
  if (got == MAP_FAILED) return ErrnoStatus("mmap of " + name);
  if (lock_ && mlock(want, size) != 0) {
    const int err = errno;
    return ResourceExhaustedError(
        "cannot lock " + FormatBytes(size) + " of " + name + " in memory (" + std::strerror(err) +
        "): raise the locked-memory limit (LimitMEMLOCK=infinity in the systemd unit, ulimit -l, "
        "the IPC_LOCK capability in Kubernetes), free memory, or start without --lock-memory");
  }
  return fd;
}

Status ChunkMemory::Renew(uint64_t chunk) {
  STASH_ASSIGN_OR_RETURN(UniqueFd fd, MapFresh(chunk));
  fds_[chunk] = std::move(fd);
  return Status::Ok();
}

}  // namespace stash::daemon
