#include "daemon/cuda/paging_kernels.h"

#include <cstdio>

#include "stash/kernels/daemon_paging.h"

namespace stash::daemon {

StatusOr<std::unique_ptr<PagingKernels>> PagingKernels::Load(const CudaDriver* driver,
                                                             const void* fatbin) {
  std::unique_ptr<PagingKernels> k(new PagingKernels(driver));
  STASH_CU_RETURN_IF_ERROR(driver, ModuleLoadData(&k->module_, fatbin));
  const char* const names[kFunctions] = {
      kernels::kDaemonStashPlanKernel,     kernels::kDaemonStashCopyKernel,
      kernels::kDaemonStashPublishKernel,  kernels::kDaemonReloadPopKernel,
      kernels::kDaemonReloadPublishKernel, kernels::kDaemonTakeChunksKernel,
      kernels::kDaemonReturnChunkKernel};
  for (int f = 0; f < kFunctions; ++f) {
    const Status found = driver->Check(
        driver->ModuleGetFunction(&k->functions_[f], k->module_, names[f]), "cuModuleGetFunction");
    if (!found.ok()) {
      return FailedPreconditionError(std::string("daemon-copy's kernel ") + names[f] +
                                     " is not in stashd's fatbin: " + found.message());
    }
  }
  return k;
}

PagingKernels::~PagingKernels() {
  if (module_ != nullptr) (void)driver_->ModuleUnload(module_);
}

kernels::LaunchResult PagingKernels::Launch(Function function, unsigned blocks, unsigned threads,
                                            CUstream stream, const void* args,
                                            const char* what) const {
  // The driver copies the parameter (its size is known from the image) at the call.
  void* params[] = {const_cast<void*>(args)};
  const CUresult r = driver_->LaunchKernel(functions_[function], blocks, 1, 1, threads, 1, 1, 0,
                                           stream, params, nullptr);
  kernels::LaunchResult result;
  if (r == CUDA_SUCCESS) return result;
  result.status = kernels::LaunchStatus::kCudaError;
  result.cuda_error = static_cast<int>(r);
  std::snprintf(result.message, sizeof(result.message), "%s",
                driver_->Check(r, what).message().c_str());
  return result;
}

kernels::LaunchResult PagingKernels::Stash(const kernels::StashLaunch& args,
                                           CUstream stream) const {
  kernels::LaunchResult result = kernels::CanImplementStash(args);
  if (!result.ok()) return result;
  const unsigned blocks = kernels::PagingBlocksFor(args.max_rows * args.row_bytes, args.page_bytes);
  MutexLock lock(&launch_mu_);
  result = Launch(kPlan, 1, 1, stream, &args, "cuLaunchKernel(stash plan)");
  if (result.ok()) {
    result = Launch(kCopy, blocks, kernels::kPagingThreadsPerBlock, stream, &args,
                    "cuLaunchKernel(stash copy)");
  }
  if (result.ok()) result = Launch(kPublish, 1, 1, stream, &args, "cuLaunchKernel(stash publish)");
  return result;
}

kernels::LaunchResult PagingKernels::Reload(const kernels::ReloadLaunch& args,
                                            CUstream stream) const {
  kernels::LaunchResult result = kernels::CanImplementReload(args);
  if (!result.ok()) return result;
  const unsigned blocks = kernels::PagingBlocksFor(args.max_rows * args.row_bytes, args.page_bytes);
  MutexLock lock(&launch_mu_);
  result = Launch(kPop, blocks, kernels::kPagingThreadsPerBlock, stream, &args,
                  "cuLaunchKernel(reload pop)");
  if (result.ok()) {
    result = Launch(kReloadPublish, 1, 1, stream, &args, "cuLaunchKernel(reload publish)");
  }
  return result;
}

kernels::LaunchResult PagingKernels::TakeChunks(const kernels::ChunkRingLaunch& args,
                                                CUstream stream) const {
  MutexLock lock(&launch_mu_);
  return Launch(kTake, 1, 1, stream, &args, "cuLaunchKernel(take chunks)");
}

kernels::LaunchResult PagingKernels::ReturnChunk(const kernels::ChunkRingLaunch& args,
                                                 CUstream stream) const {
  MutexLock lock(&launch_mu_);
  return Launch(kReturn, 1, 1, stream, &args, "cuLaunchKernel(return chunk)");
}

}  // namespace stash::daemon
