// Refusing pool sizes the machine cannot hold, before anything is allocated: a daemon that
// starts with more than the free memory fails later, on a trainer's stash, or gets OOM-killed.
#ifndef STASH_DAEMON_MEMORY_FIT_H_
#define STASH_DAEMON_MEMORY_FIT_H_

#include <cstdint>
#include <vector>

#include "daemon/config.h"
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
};

// Reads /proc/meminfo and, for the cuda backend, every visible GPU.
FreeMemory ReadFreeMemory(stash::v1::Backend backend);

// OK when the tiers `config` asks for fit `free`: host backend, pools x devices + host tier in
// host memory (with --huge-pages=hugetlb: in free huge pages, every size a whole number of
// them); cuda, the host tier in host memory and one pool in each GPU's free memory.
// RESOURCE_EXHAUSTED (INVALID_ARGUMENT for sizes) with the numbers and the knobs otherwise.
Status CheckMemoryFits(const DaemonConfig& config, stash::v1::Backend backend,
                       const FreeMemory& free);

// cuMemGetInfo's free bytes of each visible GPU; empty without CUDA (cuda_probe.cc).
std::vector<uint64_t> CudaFreeBytes();

}  // namespace stash::daemon

#endif  // STASH_DAEMON_MEMORY_FIT_H_
