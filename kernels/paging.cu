// CUDA kernels and launchers for the paging rules (see paging_cuda.h for the contract).
#include <cuda_runtime_api.h>

#include <cstdarg>
#include <cstdio>

#include "stash/kernels/paging.h"
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

bool Aligned(const void* pointer, uintptr_t alignment) {
  return (reinterpret_cast<uintptr_t>(pointer) & (alignment - 1)) == 0;
}

// The checks stash and reload share: page and row sizes, the buffer size, the tiers.
LaunchResult CheckGeometryAndTiers(uint64_t max_rows, uint64_t row_bytes, uint64_t page_bytes,
                                   const CudaTier& device, const CudaTier& host) {
  if (device.d_ring == nullptr) return Fail(LaunchStatus::kNullPointer, "device.d_ring is null");
  if (device.d_base == nullptr) return Fail(LaunchStatus::kNullPointer, "device.d_base is null");
  if ((host.d_ring == nullptr) != (host.d_base == nullptr)) {
    return Fail(LaunchStatus::kBadHostTier,
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
  if (!Aligned(device.d_ring, 16) || !Aligned(host.d_ring, 16)) {
    return Fail(LaunchStatus::kMisaligned, "a PageRing is not 16-byte aligned");
  }
  return LaunchResult{};
}

// Blocks for a grid-stride loop over the 16-byte vectors of `bytes` bytes (at least one).
unsigned BlocksFor(uint64_t bytes) {
  const uint64_t blocks = (VectorsFor(bytes) + kThreadsPerBlock - 1) / kThreadsPerBlock;
  if (blocks == 0) return 1;
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

// The tier a plan placed its stash in; a tier with a null ring when it placed nothing.
__device__ __forceinline__ CudaTier PlacedTier(const StashPlan& plan, const CudaTier& device,
                                               const CudaTier& host) {
  if (plan.placement == Placement::kDevice) return device;
  if (plan.placement == Placement::kHost) return host;
  return CudaTier{};
}

__device__ __forceinline__ uint64_t GlobalThread() {
  return static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ uint64_t GridThreads() {
  return static_cast<uint64_t>(gridDim.x) * blockDim.x;
}

// (a) One thread: decide where the stash goes.
__global__ void StashPlanKernel(StashLaunch args) {
  const int64_t count = args.d_count != nullptr ? *args.d_count : args.count;
  *args.d_plan = PlanStash(count, args.divisor, args.max_rows, args.row_bytes, args.page_bytes,
                           *args.device.d_ring, args.host.d_ring);
}

// (b) Every thread: copy its vectors into the pages at ring slots plan.head + slot.
__global__ void StashCopyKernel(StashLaunch args) {
  const StashPlan plan = *args.d_plan;
  const CudaTier tier = PlacedTier(plan, args.device, args.host);
  if (tier.d_ring == nullptr) return;
  const PageRing ring = *tier.d_ring;  // the ids pointer and capacity; the head is plan.head
  const PagedSpan span{tier.d_base, args.page_bytes, args.d_page_record, plan.bytes};
  const uint64_t vectors = VectorsFor(plan.bytes);
  for (uint64_t v = GlobalThread(); v < vectors; v += GridThreads()) {
    StashVector(args.d_src, ring, plan.head, span, v);
  }
}

// (c) One thread, after the copy kernel: publish the new head.
__global__ void StashPublishKernel(StashLaunch args) {
  const StashPlan plan = *args.d_plan;
  const CudaTier tier = PlacedTier(plan, args.device, args.host);
  if (tier.d_ring == nullptr) return;
  tier.d_ring->head = plan.head + plan.pages;
}

// (d) Every thread: ReloadVector over its vectors (copy back, zero its share of the tail,
// return the pages of the slots whose first vector it holds). The tail is read here and
// published by the next kernel, so every thread returns pages relative to the same old tail.
__global__ void ReloadPopKernel(ReloadLaunch args) {
  const StashPlan plan = *args.d_plan;
  const CudaTier tier = PlacedTier(plan, args.device, args.host);
  if (tier.d_ring == nullptr) return;
  PageRing ring = *tier.d_ring;  // a copy: ReturnPages writes through ring.ids only
  const uint64_t tail = ring.tail;
  const PagedSpan span{tier.d_base, args.page_bytes, const_cast<uint64_t*>(args.d_page_record),
                       plan.bytes};
  const uint64_t max_bytes = args.max_rows * args.row_bytes;
  const uint64_t vectors = VectorsFor(args.zero_tail ? max_bytes : plan.bytes);
  for (uint64_t v = GlobalThread(); v < vectors; v += GridThreads()) {
    ReloadVector(args.d_dst, span, ring, tail, max_bytes, args.zero_tail, v);
  }
}

// (d) One thread, after the pop kernel: publish the new tail.
__global__ void ReloadPublishKernel(ReloadLaunch args) {
  const StashPlan plan = *args.d_plan;
  const CudaTier tier = PlacedTier(plan, args.device, args.host);
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
    case LaunchStatus::kBadHostTier:
      return "kBadHostTier";
    case LaunchStatus::kMisaligned:
      return "kMisaligned";
    case LaunchStatus::kTooLarge:
      return "kTooLarge";
    case LaunchStatus::kCudaError:
      return "kCudaError";
  }
  return "unknown";
}

LaunchResult CanImplementStash(const StashLaunch& args) {
  if (args.d_src == nullptr) return Fail(LaunchStatus::kNullPointer, "d_src is null");
  if (args.d_page_record == nullptr) {
    return Fail(LaunchStatus::kNullPointer, "d_page_record is null");
  }
  if (args.d_plan == nullptr) return Fail(LaunchStatus::kNullPointer, "d_plan is null");
  LaunchResult result =
      CheckGeometryAndTiers(args.max_rows, args.row_bytes, args.page_bytes, args.device, args.host);
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
  StashPlanKernel<<<1, 1, 0, stream>>>(args);
  STASH_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  StashCopyKernel<<<BlocksFor(args.max_rows * args.row_bytes), kThreadsPerBlock, 0, stream>>>(args);
  STASH_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  StashPublishKernel<<<1, 1, 0, stream>>>(args);
  STASH_CUDA_RETURN_IF_ERROR(cudaGetLastError());
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
  LaunchResult result =
      CheckGeometryAndTiers(args.max_rows, args.row_bytes, args.page_bytes, args.device, args.host);
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
  ReloadPopKernel<<<BlocksFor(args.max_rows * args.row_bytes), kThreadsPerBlock, 0, stream>>>(args);
  STASH_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  ReloadPublishKernel<<<1, 1, 0, stream>>>(args);
  STASH_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return result;
}

}  // namespace stash::kernels
