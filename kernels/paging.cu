// Daemon-copy's kernels launched through the CUDA runtime (see paging_cuda.h for the contract):
// the GPU tests and benchmarks launch them this way. The daemon launches the same bodies
// (daemon_paging.h) from its fatbin through the driver API (kernels/daemon_paging.cu). The
// argument checks are kernels/paging_checks.cc.
#include <cuda_runtime.h>  // cudaLaunchKernelEx (the C++ template)

#include <cstdio>

#include "stash/kernels/daemon_paging.h"
#include "stash/kernels/paging.h"
#include "stash/kernels/paging_blocks.cuh"
#include "stash/kernels/paging_cuda.h"

namespace stash::kernels {
namespace {

LaunchResult CudaFailure(cudaError_t error, const char* expression, const char* file, int line) {
  // A failed launch also sets the thread's last error: clear it, so the next launch on this
  // thread is not failed by this one.
  (void)cudaGetLastError();
  LaunchResult result;
  result.status = LaunchStatus::kCudaError;
  result.cuda_error = static_cast<int>(error);
  std::snprintf(result.message, sizeof(result.message), "%s failed: %s (%s:%d)", expression,
                cudaGetErrorString(error), file, line);
  return result;
}

// Every CUDA call of this file: on failure return a kCudaError result naming the call.
#define STASH_CUDA_RETURN_IF_ERROR(expr)                                \
  do {                                                                  \
    const cudaError_t stash_cuda_error_ = (expr);                       \
    if (stash_cuda_error_ != cudaSuccess) {                             \
      return CudaFailure(stash_cuda_error_, #expr, __FILE__, __LINE__); \
    }                                                                   \
  } while (0)

// Launches `kernel` on `stream` and returns that launch's own error. Not cudaGetLastError():
// it returns any earlier error of this thread too (a refused cudaIpcOpenMemHandle, a failed
// cudaHostRegister), which would fail a launch that went through.
template <typename Args>
cudaError_t Launch(void (*kernel)(Args), unsigned blocks, unsigned threads, cudaStream_t stream,
                   const Args& args) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  config.attrs = nullptr;
  config.numAttrs = 0;
  return cudaLaunchKernelEx(&config, kernel, args);
}

// (a) One thread: decide where the stash goes.
__global__ void StashPlanKernel(StashLaunch args) { PlanStashLaunch(args); }

// (b) A block per chunk of the placed stash's page slots (StashChunks, paging_blocks.cuh).
__global__ void StashCopyKernel(StashLaunch args) {
  const StashPlan plan = *args.d_plan;
  const CudaTier tier = PlacedTier(plan, args);
  if (tier.d_ring == nullptr) return;
  StashChunks(args.d_src, *tier.d_ring, tier.d_base, args.page_bytes, plan, args.d_page_record);
}

// (c) One thread, after the copy kernel: publish the new head.
__global__ void StashPublishKernel(StashLaunch args) { PublishStashLaunch(args); }

// (d) A block per chunk of the placed stash's page slots: copy back, return the page ids at
// the old tail, zero the tail (PopChunks, paging_blocks.cuh); for a stash that overflowed, the
// kept source instead when given (ReloadKeptSource).
__global__ void ReloadPopKernel(ReloadLaunch args) {
  const StashPlan plan = *args.d_plan;
  const CudaTier tier = PlacedTier(plan, args);
  if (tier.d_ring == nullptr) {
    if (plan.placement != Placement::kOverflow || args.d_kept_src == nullptr) return;
    ReloadKeptSource(args.d_dst, args.d_kept_src, plan, args.max_rows, args.row_bytes,
                     args.zero_tail);
    return;
  }
  PopChunks(args.d_dst, *tier.d_ring, tier.d_base, args.page_bytes, plan, args.d_page_record,
            args.max_rows * args.row_bytes, args.zero_tail);
}

// (e) One thread, after the pop kernel: publish the new tail.
__global__ void ReloadPublishKernel(ReloadLaunch args) { PublishReloadLaunch(args); }

}  // namespace

LaunchResult LaunchStash(const StashLaunch& args, cudaStream_t stream) {
  LaunchResult result = CanImplementStash(args);
  if (!result.ok()) return result;
  STASH_CUDA_RETURN_IF_ERROR(Launch(StashPlanKernel, 1, 1, stream, args));
  STASH_CUDA_RETURN_IF_ERROR(
      Launch(StashCopyKernel, PagingBlocksFor(args.max_rows * args.row_bytes, args.page_bytes),
             kPagingThreadsPerBlock, stream, args));
  STASH_CUDA_RETURN_IF_ERROR(Launch(StashPublishKernel, 1, 1, stream, args));
  return result;
}

LaunchResult LaunchReload(const ReloadLaunch& args, cudaStream_t stream) {
  LaunchResult result = CanImplementReload(args);
  if (!result.ok()) return result;
  STASH_CUDA_RETURN_IF_ERROR(
      Launch(ReloadPopKernel, PagingBlocksFor(args.max_rows * args.row_bytes, args.page_bytes),
             kPagingThreadsPerBlock, stream, args));
  STASH_CUDA_RETURN_IF_ERROR(Launch(ReloadPublishKernel, 1, 1, stream, args));
  return result;
}

}  // namespace stash::kernels
