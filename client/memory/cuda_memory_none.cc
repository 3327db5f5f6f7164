// CudaSide in a client library built with STASH_ENABLE_CUDA=OFF: Open says so, and since no
// CudaSide can then exist, its other methods are never called.
#include "client/memory/cuda_memory.h"

namespace stash::client {

StatusOr<std::unique_ptr<CudaSide>> CudaSide::Open(int /*device*/) {
  return FailedPreconditionError(
      "this libstash_client was built without CUDA (STASH_ENABLE_CUDA=OFF): rebuild it with the "
      "CUDA toolkit installed to use Backend::kCuda");
}

CudaSide::~CudaSide() = default;

StatusOr<DeviceLocation> CudaSide::Locate(const void*, uint64_t, const char*) {
  return FailedPreconditionError("built without CUDA");
}
uint64_t CudaSide::Forget(const void*) { return 0; }
std::vector<uint64_t> CudaSide::ForgetAll() { return {}; }
// NOLINTNEXTLINE(performance-unnecessary-value-param): the cuda twin's signature, unused here
StatusOr<uint64_t> CudaSide::MapHost(void*, uint64_t, std::shared_ptr<void>,
                                     std::function<void()>*) {
  return FailedPreconditionError("built without CUDA");
}
Status CudaSide::WriteValue(void*, uint64_t, uint64_t) {
  return FailedPreconditionError("built without CUDA");
}
Status CudaSide::WaitValue(void*, uint64_t, uint64_t) {
  return FailedPreconditionError("built without CUDA");
}

}  // namespace stash::client
