// CUDA kernels and launchers for the paging rules (see paging_cuda.h for the contract).
#include <cuda_runtime.h>  // cudaLaunchKernelEx (the C++ template)

#include <cstdarg>
#include <cstdio>

#include "stash/kernels/paging.h"
#include "stash/kernels/paging_blocks.cuh"
#include "stash/kernels/paging_cuda.h"

namespace stash::kernels {
namespace {

constexpr unsigned kThreadsPerBlock = 256;
// Grid-stride loops cover the rest; enough blocks to fill an H100/H200 several times over.
constexpr uint64_t kMaxBlocks = 4096;

__attribute__((format(printf, 2, 3))) LaunchResult Fail(LaunchStatus status, const char* format,
                                                        ...) {
  LaunchResult result;
  result.status = status;
  va_list args;
  va_start(args, format);
  std::vsnprintf(result.message, sizeof(result.message), format, args);
  va_end(args);
  return result;
}

LaunchResult CudaFailure(cudaError_t error, const char* expression, const char* file, int line) {
  // A failed launch also sets the thread's last error: clear it, so the next launch on this
  // thread (the pool worker runs every GPU call of its pool) is not failed by this one.
  (void)cudaGetLastError();
  LaunchResult result = Fail(LaunchStatus::kCudaError, "%s failed: %s (%s:%d)", expression,
                             cudaGetErrorString(error), file, line);
  result.cuda_error = static_cast<int>(error);
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

bool Aligned(const void* pointer, uintptr_t alignment) {
  return (reinterpret_cast<uintptr_t>(pointer) & (alignment - 1)) == 0;
}

// The checks stash and reload share: page and row sizes, the buffer size, the tiers.
LaunchResult CheckGeometryAndTiers(uint64_t max_rows, uint64_t row_bytes, uint64_t page_bytes,
                                   const CudaTier& device, const CudaTier& peer,
                                   const CudaTier& host) {
  if (device.d_ring == nullptr) return Fail(LaunchStatus::kNullPointer, "device.d_ring is null");
  if (device.d_base == nullptr) return Fail(LaunchStatus::kNullPointer, "device.d_base is null");
  if ((peer.d_ring == nullptr) != (peer.d_base == nullptr)) {
    return Fail(LaunchStatus::kBadTier,
                "peer.d_ring and peer.d_base must both be set (a peer tier) or both be null");
  }
  if ((host.d_ring == nullptr) != (host.d_base == nullptr)) {
    return Fail(LaunchStatus::kBadTier,
                "host.d_ring and host.d_base must both be set (a host tier) or both be null");
  }
  if (page_bytes < kVectorBytes || (page_bytes & (page_bytes - 1)) != 0) {
    return Fail(LaunchStatus::kBadPageBytes, "page_bytes %llu is not a power of two >= 16",
                static_cast<unsigned long long>(page_bytes));
  }
  if (row_bytes == 0) return Fail(LaunchStatus::kBadRowBytes, "row_bytes is 0");
  if (max_rows > UINT64_MAX / row_bytes) {
    return Fail(LaunchStatus::kTooLarge, "max_rows %llu * row_bytes %llu overflows 64 bits",
                static_cast<unsigned long long>(max_rows),
                static_cast<unsigned long long>(row_bytes));
  }
  if (!Aligned(device.d_ring, 16) || !Aligned(peer.d_ring, 16) || !Aligned(host.d_ring, 16)) {
    return Fail(LaunchStatus::kMisaligned, "a PageRing is not 16-byte aligned");
  }
  return LaunchResult{};
}

// Blocks for a grid-stride loop over `items` work items (at least one).
unsigned BlocksFor(uint64_t items) {
  if (items == 0) return 1;
  return static_cast<unsigned>(items < kMaxBlocks ? items : kMaxBlocks);
}

// Blocks for the chunks of a stash of at most `max_bytes` bytes: grids depend only on the static
// maximum, so launches can be captured in a graph.
unsigned ChunkBlocksFor(uint64_t max_bytes, uint64_t page_bytes) {
  return BlocksFor(ChunksFor(PagesFor(max_bytes, page_bytes), ChunkShapeOf(page_bytes)));
}

// The tier a plan placed its stash in; a tier with a null ring when it placed nothing.
template <typename Launch>
__device__ __forceinline__ CudaTier PlacedTier(const StashPlan& plan, const Launch& args) {
  switch (plan.placement) {
    case Placement::kDevice:
      return args.device;
    case Placement::kPeer:
      return args.peer;
    case Placement::kHost:
      return args.host;
    default:
      return CudaTier{};
  }
}

// (a) One thread: decide where the stash goes.
__global__ void StashPlanKernel(StashLaunch args) {
  const int64_t count = args.d_count != nullptr ? *args.d_count : args.count;
  const TierChoice tiers[3] = {{args.device.d_ring, Placement::kDevice},
                               {args.peer.d_ring, Placement::kPeer},
                               {args.host.d_ring, Placement::kHost}};
  *args.d_plan = PlanStashInOrder(count, args.divisor, args.max_rows, args.row_bytes,
                                  args.page_bytes, tiers, 3);
}

// (b) A block per chunk of the placed stash's page slots (StashChunks, paging_blocks.cuh).
__global__ void StashCopyKernel(StashLaunch args) {
  const StashPlan plan = *args.d_plan;
  const CudaTier tier = PlacedTier(plan, args);
  if (tier.d_ring == nullptr) return;
  StashChunks(args.d_src, *tier.d_ring, tier.d_base, args.page_bytes, plan, args.d_page_record);
}

// (c) One thread, after the copy kernel: publish the new head.
__global__ void StashPublishKernel(StashLaunch args) {
  const StashPlan plan = *args.d_plan;
  const CudaTier tier = PlacedTier(plan, args);
  if (tier.d_ring == nullptr) return;
  tier.d_ring->head = plan.head + plan.pages;
}

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

// (d) One thread, after the pop kernel: publish the new tail.
__global__ void ReloadPublishKernel(ReloadLaunch args) {
  const StashPlan plan = *args.d_plan;
  const CudaTier tier = PlacedTier(plan, args);
  if (tier.d_ring == nullptr) return;
  tier.d_ring->tail += plan.pages;
}

}  // namespace

const char* LaunchStatusName(LaunchStatus status) {
  switch (status) {
    case LaunchStatus::kOk:
      return "kOk";
    case LaunchStatus::kNullPointer:
      return "kNullPointer";
    case LaunchStatus::kBadPageBytes:
      return "kBadPageBytes";
    case LaunchStatus::kBadRowBytes:
      return "kBadRowBytes";
    case LaunchStatus::kBadTier:
      return "kBadTier";
    case LaunchStatus::kMisaligned:
      return "kMisaligned";
    case LaunchStatus::kTooLarge:
      return "kTooLarge";
    case LaunchStatus::kCudaError:
      return "kCudaError";
    case LaunchStatus::kOverlap:
      return "kOverlap";
  }
  return "unknown";
}

LaunchResult CanImplementStash(const StashLaunch& args) {
  if (args.d_src == nullptr) return Fail(LaunchStatus::kNullPointer, "d_src is null");
  if (args.d_page_record == nullptr) {
    return Fail(LaunchStatus::kNullPointer, "d_page_record is null");
  }
  if (args.d_plan == nullptr) return Fail(LaunchStatus::kNullPointer, "d_plan is null");
  LaunchResult result = CheckGeometryAndTiers(args.max_rows, args.row_bytes, args.page_bytes,
                                              args.device, args.peer, args.host);
  if (!result.ok()) return result;
  if (!Aligned(args.d_plan, 16) || !Aligned(args.d_page_record, 8) || !Aligned(args.d_count, 8)) {
    return Fail(LaunchStatus::kMisaligned,
                "d_plan must be 16-byte aligned, d_page_record and d_count 8-byte aligned");
  }
  return result;
}

LaunchResult LaunchStash(const StashLaunch& args, cudaStream_t stream) {
  LaunchResult result = CanImplementStash(args);
  if (!result.ok()) return result;
  STASH_CUDA_RETURN_IF_ERROR(Launch(StashPlanKernel, 1, 1, stream, args));
  STASH_CUDA_RETURN_IF_ERROR(Launch(StashCopyKernel,
                                    ChunkBlocksFor(args.max_rows * args.row_bytes, args.page_bytes),
                                    kThreadsPerBlock, stream, args));
  STASH_CUDA_RETURN_IF_ERROR(Launch(StashPublishKernel, 1, 1, stream, args));
  return result;
}

LaunchResult CanImplementReload(const ReloadLaunch& args) {
  if (args.d_plan == nullptr) return Fail(LaunchStatus::kNullPointer, "d_plan is null");
  if (args.d_page_record == nullptr) {
    return Fail(LaunchStatus::kNullPointer, "d_page_record is null");
  }
  if (args.zero_tail && args.d_dst == nullptr) {
    return Fail(LaunchStatus::kNullPointer, "zero_tail is set but d_dst is null");
  }
  if (args.d_kept_src != nullptr && args.d_dst == nullptr) {
    return Fail(LaunchStatus::kNullPointer, "d_kept_src is set but d_dst is null");
  }
  if (args.d_kept_src != nullptr && args.d_kept_src != args.d_dst && args.row_bytes != 0 &&
      args.max_rows <= UINT64_MAX / args.row_bytes) {
    const uint64_t bytes = args.max_rows * args.row_bytes;
    const auto src = reinterpret_cast<uintptr_t>(args.d_kept_src);
    const auto dst = reinterpret_cast<uintptr_t>(args.d_dst);
    if (src < dst + bytes && dst < src + bytes) {
      return Fail(LaunchStatus::kOverlap,
                  "d_kept_src and d_dst overlap without being the same buffer");
    }
  }
  LaunchResult result = CheckGeometryAndTiers(args.max_rows, args.row_bytes, args.page_bytes,
                                              args.device, args.peer, args.host);
  if (!result.ok()) return result;
  if (!Aligned(args.d_plan, 16) || !Aligned(args.d_page_record, 8)) {
    return Fail(LaunchStatus::kMisaligned,
                "d_plan must be 16-byte aligned and d_page_record 8-byte aligned");
  }
  return result;
}

LaunchResult LaunchReload(const ReloadLaunch& args, cudaStream_t stream) {
  LaunchResult result = CanImplementReload(args);
  if (!result.ok()) return result;
  STASH_CUDA_RETURN_IF_ERROR(Launch(ReloadPopKernel,
                                    ChunkBlocksFor(args.max_rows * args.row_bytes, args.page_bytes),
                                    kThreadsPerBlock, stream, args));
  STASH_CUDA_RETURN_IF_ERROR(Launch(ReloadPublishKernel, 1, 1, stream, args));
  return result;
}

}  // namespace stash::kernels
