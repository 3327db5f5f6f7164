// Kernels of stash-bench-gpu (see bench_kernels.h).
#include "bench/gpu/bench_kernels.h"

#include <cuda_runtime_api.h>

#include <cstdint>

namespace stash::bench_gpu {
namespace {

constexpr int kThreads = 256;
constexpr uint64_t kMaxBlocks = 8192;

unsigned BlocksFor(uint64_t items) {
  const uint64_t blocks = (items + kThreads - 1) / kThreads;
  if (blocks == 0) return 1;
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

__device__ __forceinline__ uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

__device__ __forceinline__ uint64_t GlobalTimerNs() {
  uint64_t t = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void FillKernel(uint64_t* words, uint64_t count, uint64_t seed) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    words[i] = Mix(i ^ (seed << 40));
  }
}

// 16 bytes per thread per step, a grid-stride loop: the plain SM copy a driver's D2D memcpy
// kernel is compared with (no paging, no plan).
__global__ void VectorCopyKernel(uint4* dst, const uint4* src, uint64_t count) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    dst[i] = src[i];
  }
}

__global__ void CountMismatchesKernel(const uint64_t* a, const uint64_t* b, uint64_t count,
                                      unsigned long long* mismatches) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  unsigned long long local = 0;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    if (a[i] != b[i]) ++local;
  }
  if (local != 0) atomicAdd(mismatches, local);
}

__global__ void GateKernel(volatile int32_t* flag, uint64_t timeout_ns) {
  const uint64_t start = GlobalTimerNs();
  while (flag[0] == 0) {
    if (GlobalTimerNs() - start > timeout_ns) {
      flag[1] = 1;
      return;
    }
    __nanosleep(1000);
  }
}

__global__ void __launch_bounds__(kThreads) BurnKernel(float* out, int64_t iterations) {
  float a = static_cast<float>(threadIdx.x) * 1e-3f;
  float b = a + 1.0f;
  float c = a + 2.0f;
  float d = a + 3.0f;
  for (int64_t i = 0; i < iterations; ++i) {
    a = fmaf(a, 0.999999f, 1e-6f);
    b = fmaf(b, 0.999999f, 1e-6f);
    c = fmaf(c, 0.999999f, 1e-6f);
    d = fmaf(d, 0.999999f, 1e-6f);
  }
  out[static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x] = a + b + c + d;
}

}  // namespace

cudaError_t LaunchFill(uint64_t* d_words, uint64_t words, uint64_t seed, cudaStream_t stream) {
  FillKernel<<<BlocksFor(words), kThreads, 0, stream>>>(d_words, words, seed);
  return cudaGetLastError();
}

cudaError_t LaunchVectorCopy(void* d_dst, const void* d_src, uint64_t bytes, int sm_count,
                             cudaStream_t stream) {
  if (bytes % 16 != 0) return cudaErrorInvalidValue;
  const uint64_t vectors = bytes / 16;
  // Enough resident blocks to fill every SM several times over; the loop covers the rest.
  const uint64_t wanted = static_cast<uint64_t>(sm_count > 0 ? sm_count : 1) * 8;
  const uint64_t needed = (vectors + kThreads - 1) / kThreads;
  const unsigned blocks =
      static_cast<unsigned>(needed < wanted ? (needed > 0 ? needed : 1) : wanted);
  VectorCopyKernel<<<blocks, kThreads, 0, stream>>>(static_cast<uint4*>(d_dst),
                                                    static_cast<const uint4*>(d_src), vectors);
  return cudaGetLastError();
}

cudaError_t LaunchCountMismatches(const uint64_t* d_a, const uint64_t* d_b, uint64_t words,
                                  unsigned long long* d_mismatches, cudaStream_t stream) {
  CountMismatchesKernel<<<BlocksFor(words), kThreads, 0, stream>>>(d_a, d_b, words, d_mismatches);
  return cudaGetLastError();
}

cudaError_t LaunchGate(int32_t* d_flag, uint64_t timeout_ns, cudaStream_t stream) {
  GateKernel<<<1, 1, 0, stream>>>(d_flag, timeout_ns);
  return cudaGetLastError();
}

cudaError_t BurnBlocks(int sm_count, int* blocks) {
  int per_sm = 0;
  const cudaError_t error =
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, BurnKernel, kThreads, 0);
  if (error != cudaSuccess) return error;
  *blocks = (per_sm > 0 ? per_sm : 1) * (sm_count > 0 ? sm_count : 1);
  return cudaSuccess;
}

cudaError_t LaunchBurn(float* d_out, int blocks, int64_t iterations, cudaStream_t stream) {
  BurnKernel<<<blocks, kThreads, 0, stream>>>(d_out, iterations);
  return cudaGetLastError();
}

}  // namespace stash::bench_gpu
