#include "daemon/startup/cuda_probe.h"

#if defined(STASH_HAVE_CUDA)
#include "common/cuda_driver.h"
#include "common/cuda_vmm.h"
#endif

namespace stash::daemon {

bool CudaDeviceAnswers(std::string* why) {
#if defined(STASH_HAVE_CUDA)
  auto driver = CudaDriver::Get();
  if (!driver.ok()) {
    *why = driver.status().message();
    return false;
  }
  int count = 0;
  const Status counted = (*driver)->Check((*driver)->DeviceGetCount(&count), "cuDeviceGetCount");
  if (!counted.ok()) {
    *why = counted.message();
    return false;
  }
  if (count == 0) {
    *why = "cuDeviceGetCount found no device";
    return false;
  }
  *why = std::to_string(count) + " CUDA device(s)";
  return true;
#else
  *why = "this stashd was built without CUDA (STASH_ENABLE_CUDA=OFF)";
  return false;
#endif
}

int CudaDeviceCount() {
#if defined(STASH_HAVE_CUDA)
  auto driver = CudaDriver::Get();
  int count = 0;
  if (!driver.ok() || (*driver)->DeviceGetCount(&count) != CUDA_SUCCESS) return 0;
  return count;
#else
  return 0;
#endif
}

void ReadCudaMemory(FreeMemory* out) {
#if defined(STASH_HAVE_CUDA)
  auto driver = CudaDriver::Get();
  int count = 0;
  if (!driver.ok() || (*driver)->DeviceGetCount(&count) != CUDA_SUCCESS) return;
  // Each GPU's primary context stays retained for the process: the cuda backend's executors
  // retain the same contexts right after, and releasing them here would destroy and create each
  // one again (costly on an 8-GPU node).
  static auto* kept = new std::vector<PrimaryContext>();
  for (int d = 0; d < count; ++d) {
    size_t free = 0;
    size_t total = 0;
    // 0 = unknown: the check skips a GPU it cannot ask.
    auto context = PrimaryContext::Retain(*driver, d);
    if (context.ok()) {
      {
        const PrimaryContext::Scope scope(*context);
        if (!scope.status().ok() || (*driver)->MemGetInfo(&free, &total) != CUDA_SUCCESS) free = 0;
      }
      kept->push_back(std::move(context).value());
    }
    out->gpu_free_bytes.push_back(free);
    auto uuid = GpuUuid(*driver, d);
    out->gpu_uuids.push_back(uuid.ok() ? *uuid : std::string());
  }
#else
  (void)out;
#endif
}

}  // namespace stash::daemon
