// CudaMappedSession in a client library built with STASH_ENABLE_CUDA=OFF: Open says so. Nothing
// else of the class is defined or needed: no session of it can exist, and Client reaches a
// session only through ModeSession.
#include "client/mapped/cuda/cuda_mapped_session.h"

namespace stash::client {

StatusOr<std::unique_ptr<ModeSession>> CudaMappedSession::Open(const Options& /*options*/) {
  return FailedPreconditionError(
      "this libstash_client was built without CUDA (STASH_ENABLE_CUDA=OFF): rebuild it with the "
      "CUDA toolkit installed to use Backend::kCuda");
}

}  // namespace stash::client
