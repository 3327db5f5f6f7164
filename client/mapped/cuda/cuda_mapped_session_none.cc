// CudaMappedSession in a client library built with STASH_ENABLE_CUDA=OFF: Open says so, and
// since no session can then exist, its other members are never called.
#include "client/mapped/cuda/cuda_mapped_session.h"

namespace stash {

StatusOr<std::unique_ptr<CudaMappedSession>> CudaMappedSession::Open(const Options& /*options*/) {
  return FailedPreconditionError(
      "this libstash_client was built without CUDA (STASH_ENABLE_CUDA=OFF): rebuild it with the "
      "CUDA toolkit installed to use Backend::kCuda");
}

CudaMappedSession::~CudaMappedSession() = default;

StatusOr<uint64_t> CudaMappedSession::Stash(const StashArgs&) {
  return FailedPreconditionError("built without CUDA");
}
StatusOr<uint64_t> CudaMappedSession::Reload(const ReloadArgs&) {
  return FailedPreconditionError("built without CUDA");
}
StatusOr<uint64_t> CudaMappedSession::Release(uint64_t, void*) {
  return FailedPreconditionError("built without CUDA");
}
StatusOr<uint64_t> CudaMappedSession::BeginStep(uint64_t, void*) {
  return FailedPreconditionError("built without CUDA");
}
StatusOr<Completion> CudaMappedSession::Wait(uint64_t, int64_t) {
  return FailedPreconditionError("built without CUDA");
}
std::optional<StatusOr<Completion>> CudaMappedSession::Poll(uint64_t) {
  return StatusOr<Completion>(FailedPreconditionError("built without CUDA"));
}
Status CudaMappedSession::GraphsDestroyed() {
  return FailedPreconditionError("built without CUDA");
}
StepFlags CudaMappedSession::CurrentStepFlags() const { return {}; }
StatusOr<SessionStats> CudaMappedSession::Stats() {
  return FailedPreconditionError("built without CUDA");
}

}  // namespace stash
