#include "examples/cuda_elementwise.h"

namespace stash::demo {
namespace {

constexpr int kThreads = 256;

unsigned int Blocks(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned int>(blocks < 65535 ? (blocks > 0 ? blocks : 1) : 65535);
}

__global__ void Relu(float* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    y[i] = y[i] > 0.0f ? y[i] : 0.0f;
  }
}

__global__ void ReluMask(const float* x, const float* dx, float* dy, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    dy[i] = x[i] > 0.0f ? dx[i] : 0.0f;
  }
}

__global__ void StoreInt64(int64_t* d, int64_t value) { *d = value; }

}  // namespace

cudaError_t ReluCuda(float* y, int64_t n, cudaStream_t stream) {
  Relu<<<Blocks(n), kThreads, 0, stream>>>(y, n);
  return cudaGetLastError();
}

cudaError_t ReluMaskCuda(const float* x, const float* dx, float* dy, int64_t n,
                         cudaStream_t stream) {
  ReluMask<<<Blocks(n), kThreads, 0, stream>>>(x, dx, dy, n);
  return cudaGetLastError();
}

cudaError_t StoreInt64Cuda(int64_t* d, int64_t value, cudaStream_t stream) {
  StoreInt64<<<1, 1, 0, stream>>>(d, value);
  return cudaGetLastError();
}

}  // namespace stash::demo
