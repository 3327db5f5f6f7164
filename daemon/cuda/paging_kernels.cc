#include "daemon/cuda/paging_kernels.h"

#include <cstdio>
#include <string>

#include "stash/kernels/daemon_paging.h"

namespace stash::daemon {
namespace {

kernels::LaunchResult Refuse(kernels::LaunchStatus status, const std::string& why) {
  kernels::LaunchResult result;
  result.status = status;
  std::snprintf(result.message, sizeof(result.message), "%s", why.c_str());
  return result;
}

// The host-side checks of a group depot launch (CUTLASS's can_implement): what the kernels index
// with comes from the daemon's own layout, so a bad one is the caller's bug, refused here.
kernels::LaunchResult CanImplementGroup(PagingKernels::GroupOp op,
                                        const kernels::GroupDepotLaunch& a) {
  using kernels::LaunchStatus;
  using Op = PagingKernels::GroupOp;
  const kernels::GroupView& d = a.depot;
  if (d.header == nullptr || d.chunk_free == nullptr || d.chunk_state == nullptr ||
      d.tags == nullptr) {
    return Refuse(LaunchStatus::kNullPointer, "a part of the group depot is null");
  }
  if (a.chunk_pages == 0) return Refuse(LaunchStatus::kTooLarge, "chunk_pages is 0");
  if ((op == Op::kTake || op == Op::kReclaim) && a.d_answer == nullptr) {
    return Refuse(LaunchStatus::kNullPointer, "d_answer is null");
  }
  if (op == Op::kReclaim && a.live > 0 && a.d_live == nullptr) {
    return Refuse(LaunchStatus::kNullPointer, "d_live is null");
  }
  if (op == Op::kJoin || op == Op::kTake || op == Op::kOut) {
    if (a.chunk >= d.chunks) {
      return Refuse(
          LaunchStatus::kTooLarge,
          "chunk " + std::to_string(a.chunk) + " is past the depot's " + std::to_string(d.chunks));
    }
    if (a.pages > a.chunk_pages) {
      return Refuse(LaunchStatus::kTooLarge, std::to_string(a.pages) + " pages in a chunk of " +
                                                 std::to_string(a.chunk_pages));
    }
  }
  return kernels::LaunchResult{};
}

}  // namespace

StatusOr<std::unique_ptr<PagingKernels>> PagingKernels::Load(const CudaDriver* driver,
                                                             const void* fatbin) {
  std::unique_ptr<PagingKernels> k(new PagingKernels(driver));
  STASH_CU_RETURN_IF_ERROR(driver, ModuleLoadData(&k->module_, fatbin));
  const char* const names[kFunctions] = {
      kernels::kDaemonStashPlanKernel,     kernels::kDaemonStashCopyKernel,
      kernels::kDaemonStashPublishKernel,  kernels::kDaemonReloadPopKernel,
      kernels::kDaemonReloadPublishKernel, kernels::kDaemonTakeChunksKernel,
      kernels::kDaemonReturnChunkKernel,   kernels::kDaemonGroupJoinKernel,
      kernels::kDaemonGroupTakeKernel,     kernels::kDaemonGroupOutKernel,
      kernels::kDaemonGroupReclaimKernel,  kernels::kDaemonGroupResetHighWaterKernel};
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

kernels::LaunchResult PagingKernels::Group(GroupOp op, const kernels::GroupDepotLaunch& args,
                                           CUstream stream) const {
  kernels::LaunchResult result = CanImplementGroup(op, args);
  if (!result.ok()) return result;
  MutexLock lock(&launch_mu_);
  switch (op) {
    case GroupOp::kJoin:
      return Launch(kGroupJoin, 1, 1, stream, &args, "cuLaunchKernel(group join)");
    case GroupOp::kTake:
      return Launch(kGroupTake, 1, 1, stream, &args, "cuLaunchKernel(group take)");
    case GroupOp::kOut:
      return Launch(kGroupOut, 1, 1, stream, &args, "cuLaunchKernel(group out)");
    case GroupOp::kResetHighWater:
      return Launch(kGroupResetHighWater, 1, 1, stream, &args,
                    "cuLaunchKernel(group reset high water)");
    case GroupOp::kReclaim:
      return Launch(kGroupReclaim, kernels::GroupReclaimBlocks(args.depot.pages),
                    kernels::kGroupReclaimThreads, stream, &args, "cuLaunchKernel(group reclaim)");
  }
  return Refuse(kernels::LaunchStatus::kNullPointer, "unknown group operation");
}

}  // namespace stash::daemon
