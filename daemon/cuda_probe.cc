// The one place the daemon asks the CUDA runtime anything before the CUDA backend exists.
#include "daemon/daemon.h"
#include "daemon/memory_fit.h"
#include "daemon/planned_config.h"

#if defined(STASH_HAVE_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace stash::daemon {

bool CudaDeviceAnswers(std::string* why) {
#if defined(STASH_HAVE_CUDA)
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    *why = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(err);
    return false;
  }
  if (count == 0) {
    *why = "cudaGetDeviceCount found no device";
    return false;
  }
  *why = std::to_string(count) + " CUDA device(s)";
  return true;
#else
  *why = "this stashd was built without CUDA (STASH_ENABLE_CUDA=OFF)";
  return false;
#endif
}

}  // namespace stash::daemon

namespace stash::daemon {

int CudaDeviceCount() {
#if defined(STASH_HAVE_CUDA)
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
#else
  return 0;
#endif
}

}  // namespace stash::daemon

namespace stash::daemon {

std::vector<uint64_t> CudaFreeBytes() {
  std::vector<uint64_t> out;
#if defined(STASH_HAVE_CUDA)
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) return out;
  int previous = 0;
  (void)cudaGetDevice(&previous);
  for (int d = 0; d < count; ++d) {
    size_t free = 0;
    size_t total = 0;
    // 0 = unknown: the check skips a GPU it cannot ask.
    if (cudaSetDevice(d) != cudaSuccess || cudaMemGetInfo(&free, &total) != cudaSuccess) free = 0;
    out.push_back(free);
  }
  (void)cudaSetDevice(previous);
#endif
  return out;
}

}  // namespace stash::daemon
