// Refusing pool sizes the machine cannot hold, before anything is allocated: a daemon that
// starts with more than the free memory fails later, on a trainer's stash, or gets OOM-killed.
#ifndef STASH_DAEMON_MEMORY_FIT_H_
#define STASH_DAEMON_MEMORY_FIT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "daemon/config/config.h"
#include "stash/status.h"
#include "stash/v1/stash.pb.h"

namespace stash::daemon {

// What the machine has free now. 0 in a field = unknown (that check is skipped).
struct FreeMemory {
  uint64_t host_bytes = 0;  // MemAvailable of /proc/meminfo
  // The kernel's huge page pool (/proc/meminfo): HugePages_Total, HugePages_Free less
  // HugePages_Rsvd (reserved by mappings, not faulted in yet), Hugepagesize in bytes.
  uint64_t huge_pages_total = 0;
  uint64_t huge_pages_free = 0;
  uint64_t huge_page_bytes = 0;
  std::vector<uint64_t> gpu_free_bytes;  // cuda: cuMemGetInfo's free bytes, per visible GPU
  std::vector<std::string> gpu_uuids;    // cuda: each visible GPU's UUID ("GPU-..."), same order
};

// Reads /proc/meminfo and, for the cuda backend, every visible GPU.
FreeMemory ReadFreeMemory(stash::v1::Backend backend);

// OK when the tiers `config` asks for fit `free`: host backend, pools x devices + host tier in
// host memory (with --huge-pages=hugetlb: in free huge pages, every size a whole number of
// them); cuda, the host tier in host memory and one pool in each GPU's free memory.
// RESOURCE_EXHAUSTED (INVALID_ARGUMENT for sizes) with the numbers and the knobs otherwise.
Status CheckMemoryFits(const DaemonConfig& config, stash::v1::Backend backend,
                       const FreeMemory& free);

// What a cuda stashd writes into its socket's lock file once its pools exist: one
// "GPU-uuid pool-bytes" line per GPU. A stashd that did not stop cleanly (killed, crashed)
// leaves it behind, and ranks may still map its chunks (their memory stays theirs until they
// unmap it, which they do once they lease from a new stashd).
std::string PoolRecord(const std::vector<std::string>& uuids, uint64_t pool_bytes);
// Counts as free, for the next stashd on the socket, the memory of the pools `record` (the lock
// file's contents) names for the GPUs in `free`, at most `pool_bytes` per GPU: its chunks come
// back to the GPU as those ranks unmap them, and the new pool's chunks that do not fit yet wait
// for them (daemon/cuda/cuda_executor.cc). Without this, a killed stashd could not be restarted
// while its ranks hold more than the GPU's headroom, and they give back only to a running stashd.
// Lines it cannot read are ignored. Returns the bytes credited per GPU (for the log).
std::vector<uint64_t> CreditPreviousPools(const std::string& record, uint64_t pool_bytes,
                                          FreeMemory* free);

}  // namespace stash::daemon

#endif  // STASH_DAEMON_MEMORY_FIT_H_
