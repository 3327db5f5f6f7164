#include "daemon/startup/memory_fit.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>

#include "common/bytes.h"
#include "common/macros.h"
#include "common/shm.h"
#include "daemon/startup/cuda_probe.h"

namespace stash::daemon {

FreeMemory ReadFreeMemory(stash::v1::Backend backend) {
  FreeMemory free;
  uint64_t rsvd = 0;
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib) {
    std::getline(meminfo, unit);
    if (key == "MemAvailable:") free.host_bytes = kib * 1024;
    // Counts, not kB, except the size.
    if (key == "HugePages_Total:") free.huge_pages_total = kib;
    if (key == "HugePages_Free:") free.huge_pages_free += kib;
    if (key == "HugePages_Rsvd:") rsvd = kib;
    if (key == "Hugepagesize:") free.huge_page_bytes = kib * 1024;
  }
  free.huge_pages_free = free.huge_pages_free > rsvd ? free.huge_pages_free - rsvd : 0;
  if (backend == stash::v1::BACKEND_CUDA) ReadCudaMemory(&free);
  return free;
}

std::string PoolRecord(const std::vector<std::string>& uuids, uint64_t pool_bytes) {
  std::string out;
  for (const std::string& uuid : uuids) out += uuid + " " + std::to_string(pool_bytes) + "\n";
  return out;
}

std::vector<uint64_t> CreditPreviousPools(const std::string& record, uint64_t pool_bytes,
                                          FreeMemory* free) {
  std::vector<uint64_t> credited(free->gpu_free_bytes.size(), 0);
  std::istringstream lines(record);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    std::string uuid;
    uint64_t bytes = 0;
    if (!(fields >> uuid >> bytes) || uuid.rfind("GPU-", 0) != 0) continue;
    for (size_t gpu = 0; gpu < free->gpu_uuids.size() && gpu < credited.size(); ++gpu) {
      if (free->gpu_uuids[gpu] != uuid || free->gpu_free_bytes[gpu] == 0) continue;
      const uint64_t credit = std::min(bytes, pool_bytes - credited[gpu]);
      credited[gpu] += credit;
      free->gpu_free_bytes[gpu] += credit;
    }
  }
  return credited;
}

namespace {

Status CheckHugePagesFit(const DaemonConfig& config, const FreeMemory& free) {
  const uint64_t huge = free.huge_page_bytes;
  if (huge == 0) {
    return InvalidArgumentError(
        "--huge-pages=hugetlb: this kernel has no huge page pool (no Hugepagesize in "
        "/proc/meminfo): start with --huge-pages=auto or off");
  }
  if (huge != kHugePageBytes) {
    return InvalidArgumentError(
        "--huge-pages=hugetlb takes 2 MiB huge pages, and this node's "
        "default size is " +
        FormatBytes(huge) +
        " (Hugepagesize in /proc/meminfo): boot with "
        "default_hugepagesz=2M, or start with --huge-pages=auto");
  }
  const uint64_t page = config.page_bytes;
  const uint64_t pool = config.pool_bytes / page * page;
  const uint64_t host_tier = config.host_tier_bytes / page * page;
  const uint64_t chunk = config.chunk_bytes;
  auto whole = [&](uint64_t bytes, const char* knob) -> Status {
    if (bytes % huge == 0) return Status::Ok();
    return InvalidArgumentError(std::string("--huge-pages=hugetlb maps whole 2 MiB pages, and ") +
                                knob + "=" + FormatBytes(bytes) +
                                " is not a multiple of 2 MiB: round it to one");
  };
  STASH_RETURN_IF_ERROR(whole(pool, "--pool-bytes"));
  STASH_RETURN_IF_ERROR(whole(host_tier, "--host-tier-bytes"));
  if (chunk == 0 || chunk % huge != 0) {
    return InvalidArgumentError(
        "--huge-pages=hugetlb needs --chunk-bytes set to a multiple of 2 MiB (every chunk is "
        "its own huge-page memfd; now " +
        (chunk == 0 ? std::string("0, the default") : FormatBytes(chunk)) +
        "): set e.g. --chunk-bytes=" +
        FormatBytes(std::max<uint64_t>(huge, pool / 32 / huge * huge)));
  }
  const uint64_t bytes = pool * config.devices + host_tier;
  // One chunk more: a chunk back from a mapped session gets a new memfd, reserved before the
  // old one's pages are let go (and those live on while its holder still maps them).
  const uint64_t needed = bytes / huge + chunk / huge;
  if (needed > free.huge_pages_free) {
    return ResourceExhaustedError(
        "--huge-pages=hugetlb: the tiers need " + std::to_string(needed) +
        " huge pages of 2 MiB (" + FormatBytes(bytes) + ": --pool-bytes=" + FormatBytes(pool) +
        " x --devices=" + std::to_string(config.devices) + " + --host-tier-bytes=" +
        FormatBytes(host_tier) + ", and one --chunk-bytes=" + FormatBytes(chunk) +
        " more to renew a chunk) but the node has " + std::to_string(free.huge_pages_free) +
        " free of " + std::to_string(free.huge_pages_total) +
        " reserved (HugePages_Free less HugePages_Rsvd in /proc/meminfo): reserve more "
        "(sysctl vm.nr_hugepages=" +
        std::to_string(free.huge_pages_total + needed - free.huge_pages_free) +
        ", or hugepages= on the kernel command line), lower the tiers, or start with "
        "--huge-pages=auto");
  }
  return Status::Ok();
}

}  // namespace

Status CheckMemoryFits(const DaemonConfig& config, stash::v1::Backend backend,
                       const FreeMemory& free) {
  const uint64_t page = config.page_bytes;
  const uint64_t pool = config.pool_bytes / page * page;
  const uint64_t host_tier = config.host_tier_bytes / page * page;
  const bool cuda = backend == stash::v1::BACKEND_CUDA;
  const uint64_t host_pools = cuda ? 0 : pool * config.devices;
  const uint64_t host_needed = host_pools + host_tier;
  if (config.huge_pages == HugePages::kHugetlb) {
    if (cuda) {
      return InvalidArgumentError(
          "--huge-pages=hugetlb is for the host backend; the cuda backend's host tier takes "
          "transparent huge pages where the kernel offers them (--huge-pages=auto) or 4 KiB pages "
          "(--huge-pages=off)");
    }
    return CheckHugePagesFit(config, free);
  }
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
                                    " free (cuMemGetInfo): lower --pool-bytes or free the GPU");
    }
  }
  return Status::Ok();
}

}  // namespace stash::daemon
