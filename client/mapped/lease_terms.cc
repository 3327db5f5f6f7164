#include "client/mapped/lease_terms.h"

#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <string>

#include "common/sys.h"

namespace stash::client {
namespace {

uint64_t PagesOf(uint64_t bytes, uint64_t page_bytes) {
  return (bytes + page_bytes - 1) / page_bytes;
}

}  // namespace

uint32_t LeaseTierOf(int wire_tier) {
  switch (wire_tier) {
    case v1::TIER_PEER:
      return kernels::kLeasePeer;
    case v1::TIER_HOST:
      return kernels::kLeaseHost;
    default:
      return kernels::kLeaseDevice;
  }
}

Status CheckLeasesChunks(const v1::Welcome& welcome, const std::string& socket) {
  if (welcome.chunk_bytes() != 0) return Status::Ok();
  return FailedPreconditionError("stashd on " + socket +
                                 " leases no chunks (its Welcome has no chunk_bytes): "
                                 "update it, or use mode daemon-copy");
}

std::array<uint64_t, kernels::kLeaseTiers> LeaseTierBytes(const v1::Welcome& w) {
  const uint64_t max_lease = w.max_lease_bytes() != 0
                                 ? w.max_lease_bytes()
                                 : std::max(w.pool_pages(), w.host_tier_pages()) * w.page_bytes();
  return {std::min(max_lease, w.pool_pages() * w.page_bytes()), max_lease,
          std::min(max_lease, w.host_tier_pages() * w.page_bytes())};
}

std::vector<std::pair<int, uint64_t>> FixedLeaseWant(const Options& options,
                                                     const v1::Welcome& welcome) {
  const uint64_t page = welcome.page_bytes();
  std::vector<std::pair<int, uint64_t>> want;
  want.emplace_back(v1::TIER_DEVICE, PagesOf(options.lease.device_bytes, page));
  if (options.lease.peer_bytes > 0 && welcome.peer_tier()) {
    want.emplace_back(v1::TIER_PEER, PagesOf(options.lease.peer_bytes, page));
  }
  if (options.lease.host_bytes > 0 && options.allow_host_spill && welcome.host_tier_pages() > 0) {
    want.emplace_back(v1::TIER_HOST, PagesOf(options.lease.host_bytes, page));
  }
  return want;
}

StatusOr<kernels::SessionControl*> MapControlBlock(int fd, uint64_t bytes) {
  struct stat st {};
  if (fstat(fd, &st) != 0) return ErrnoStatus("fstat of the control block");
  if (bytes < sizeof(kernels::SessionControl) || static_cast<uint64_t>(st.st_size) < bytes) {
    return InvalidArgumentError("stashd's control block is " + std::to_string(st.st_size) +
                                " bytes (said " + std::to_string(bytes) + "), needs " +
                                std::to_string(sizeof(kernels::SessionControl)));
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return ErrnoStatus("mapping the control block");
  madvise(p, bytes, MADV_DONTFORK);
  auto* block = static_cast<kernels::SessionControl*>(p);
  const uint64_t version = kernels::ControlLoad(block->version);
  if (kernels::ControlLoad(block->magic) != kernels::kControlMagic ||
      version != kernels::kControlVersion) {
    munmap(p, bytes);
    return FailedPreconditionError(
        "stashd's control block is layout version " + std::to_string(version) +
        ", this client library speaks version " + std::to_string(kernels::kControlVersion) +
        ": use a client library and a stashd of the same release");
  }
  return block;
}

}  // namespace stash::client
