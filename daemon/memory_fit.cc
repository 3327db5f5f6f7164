#include "daemon/memory_fit.h"

#include <fstream>
#include <sstream>
#include <string>

#include "common/bytes.h"

namespace stash::daemon {

FreeMemory ReadFreeMemory(stash::v1::Backend backend) {
  FreeMemory free;
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib) {
    std::getline(meminfo, unit);
    if (key == "MemAvailable:") free.host_bytes = kib * 1024;
  }
  if (backend == stash::v1::BACKEND_CUDA) free.gpu_free_bytes = CudaFreeBytes();
  return free;
}

Status CheckMemoryFits(const DaemonConfig& config, stash::v1::Backend backend,
                       const FreeMemory& free) {
  const uint64_t page = config.page_bytes;
  const uint64_t pool = config.pool_bytes / page * page;
  const uint64_t host_tier = config.host_tier_bytes / page * page;
  const bool cuda = backend == stash::v1::BACKEND_CUDA;
  const uint64_t host_pools = cuda ? 0 : pool * config.devices;
  const uint64_t host_needed = host_pools + host_tier;
  if (free.host_bytes > 0 && host_needed > free.host_bytes) {
    std::ostringstream why;
    why << "the tiers need " << FormatBytes(host_needed) << " of host memory (";
    if (!cuda) {
      why << "--pool-bytes=" << FormatBytes(pool) << " x --devices=" << config.devices << " + ";
    }
    why << "--host-tier-bytes=" << FormatBytes(host_tier) << ") but only "
        << FormatBytes(free.host_bytes) << " is available (MemAvailable in /proc/meminfo): lower "
        << (cuda ? "--host-tier-bytes" : "--pool-bytes, --devices or --host-tier-bytes");
    return ResourceExhaustedError(why.str());
  }
  for (size_t gpu = 0; cuda && gpu < free.gpu_free_bytes.size(); ++gpu) {
    const uint64_t gpu_free = free.gpu_free_bytes[gpu];
    if (gpu_free > 0 && pool > gpu_free) {
      return ResourceExhaustedError("--pool-bytes=" + FormatBytes(pool) + " does not fit GPU " +
                                    std::to_string(gpu) + ", which has " + FormatBytes(gpu_free) +
                                    " free (cudaMemGetInfo): lower --pool-bytes or free the GPU");
    }
  }
  return Status::Ok();
}

}  // namespace stash::daemon
