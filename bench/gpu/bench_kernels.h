// The few kernels stash-bench-gpu needs besides the paging kernels: a position-dependent fill,
// a plain SM copy, a mismatch counter, the gate of Gate (common.h) and the trainer's compute-bound
// FMA loop. Each launcher returns the launch's error (cudaGetLastError), cudaSuccess when enqueued.
#ifndef STASH_BENCH_GPU_BENCH_KERNELS_H_
#define STASH_BENCH_GPU_BENCH_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace stash::bench_gpu {

// d_words[i] = a mix of (i, seed), for i < words: every 8-byte word differs from its neighbours,
// so a page copied to the wrong place cannot compare equal by accident.
cudaError_t LaunchFill(uint64_t* d_words, uint64_t words, uint64_t seed, cudaStream_t stream);

// d_dst[0, bytes) = d_src[0, bytes) with a plain SM kernel (16-byte loads and stores, a grid
// of 8 blocks of 256 threads per SM): the SM copy baseline of `copy`. bytes must be a multiple
// of 16 and both pointers 16-byte aligned (cudaMalloc's are).
cudaError_t LaunchVectorCopy(void* d_dst, const void* d_src, uint64_t bytes, int sm_count,
                             cudaStream_t stream);

// Adds to *d_mismatches the number of i < words with d_a[i] != d_b[i].
cudaError_t LaunchCountMismatches(const uint64_t* d_a, const uint64_t* d_b, uint64_t words,
                                  unsigned long long* d_mismatches, cudaStream_t stream);

// One thread spins until d_flag[0] != 0 (mapped pinned memory the host writes), or until
// `timeout_ns` passed on the GPU's global timer; then it sets d_flag[1] = 1.
cudaError_t LaunchGate(int32_t* d_flag, uint64_t timeout_ns, cudaStream_t stream);

// Blocks of 256 threads for the FMA loop that fill every SM of the current device (occupancy
// times the SM count).
cudaError_t BurnBlocks(int sm_count, int* blocks);

// The trainer's stand-in: `blocks` x 256 threads, each `iterations` steps of 4 independent FMA
// chains, the sums written to d_out (blocks * 256 floats).
cudaError_t LaunchBurn(float* d_out, int blocks, int64_t iterations, cudaStream_t stream);

}  // namespace stash::bench_gpu

#endif  // STASH_BENCH_GPU_BENCH_KERNELS_H_
