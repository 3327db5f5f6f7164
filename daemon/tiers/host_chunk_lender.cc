#include "daemon/tiers/host_chunk_lender.h"

#include <fcntl.h>

#include "common/macros.h"
#include "common/sys.h"

namespace stash::daemon {

StatusOr<std::vector<ChunkLender::Taken>> HostChunkLender::Take(const Want& want) {
  MutexLock lock(&tier_.mu());
  const std::vector<uint64_t> free = tier_.WhollyFreeChunks();
  std::vector<uint64_t> take;
  uint64_t left = free.size();
  for (uint64_t c : free) {
    if (!want(c, left)) break;
    take.push_back(c);
    --left;
  }
  std::vector<bool> written;
  tier_.TakeChunks(take, &written);
  std::vector<Taken> out(take.size());
  for (size_t i = 0; i < take.size(); ++i) out[i] = {take[i], written[i]};
  return out;
}

void HostChunkLender::Return(uint64_t chunk) {
  MutexLock lock(&tier_.mu());
  tier_.ReturnChunk(chunk);
}

Status HostChunkLender::Renew(uint64_t chunk) { return tier_.memory_->Renew(chunk); }

StatusOr<UniqueFd> HostChunkLender::Export(uint64_t chunk) {
  UniqueFd fd(fcntl(tier_.memory_->fd(chunk), F_DUPFD_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoStatus("dup of a chunk's memfd");
  return fd;
}

uint64_t HostChunkLender::ChunkBytes(uint64_t chunk) const {
  return tier_.memory_->ChunkBytes(chunk);
}

}  // namespace stash::daemon
