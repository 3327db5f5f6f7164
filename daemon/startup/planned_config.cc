#include "daemon/startup/planned_config.h"

#include <string>

#include "common/socket_path.h"
#include "common/version.h"
#include "daemon/core/core.h"
#include "daemon/startup/cuda_probe.h"
#include "daemon/startup/daemon.h"

namespace stash::daemon {

v1::GetConfigResponse PlannedConfig(const DaemonConfig& config) {
  v1::GetConfigResponse out;
  AddConfigEntries(config, &out);
  const std::string socket = DaemonSocketPath(config.socket);
  for (v1::ConfigEntry& entry : *out.mutable_entries()) {
    if (entry.name() == "socket") entry.set_value(socket);
  }
  std::string why;
  const bool cuda = config.backend == BackendChoice::kCuda ||
                    (config.backend == BackendChoice::kAuto && CudaDeviceAnswers(&why));
  out.set_backend(cuda ? v1::BACKEND_CUDA : v1::BACKEND_HOST);
  out.set_socket(socket);
  const uint32_t pools = cuda ? static_cast<uint32_t>(CudaDeviceCount()) : config.devices;
  out.set_pools(pools);
  out.set_page_bytes(config.page_bytes);
  out.set_pool_pages(config.pool_bytes / config.page_bytes);
  // cuda: each GPU gets an even share of the host tier (config.cc, host_tier_bytes).
  const uint64_t host_share =
      cuda && pools > 0 ? config.host_tier_bytes / pools : config.host_tier_bytes;
  out.set_host_tier_pages(host_share / config.page_bytes);
  out.set_version(kVersion);
  return out;
}

}  // namespace stash::daemon
