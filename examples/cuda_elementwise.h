// The demo trainer's elementwise GPU kernels (--backend=cuda): the ReLU between layers, its
// backward mask, and an int64 store enqueued on a stream (the row count a stash reads by
// reference). Comparisons and stores only, so the bits equal the CPU path's.
#ifndef STASH_EXAMPLES_CUDA_ELEMENTWISE_H_
#define STASH_EXAMPLES_CUDA_ELEMENTWISE_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace stash::demo {

// y[i] = y[i] > 0 ? y[i] : 0 for i < n.
cudaError_t ReluCuda(float* y, int64_t n, cudaStream_t stream);
// dy[i] = x[i] > 0 ? dx[i] : 0 for i < n.
cudaError_t ReluMaskCuda(const float* x, const float* dx, float* dy, int64_t n,
                         cudaStream_t stream);
// *d = value, when the stream gets there.
cudaError_t StoreInt64Cuda(int64_t* d, int64_t value, cudaStream_t stream);

}  // namespace stash::demo

#endif  // STASH_EXAMPLES_CUDA_ELEMENTWISE_H_
