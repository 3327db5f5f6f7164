// STASH_HOST_DEVICE: a function g++ compiles for the host and nvcc for both the host and the
// device, so the host backend, the tests and the CUDA kernels run one definition.
#ifndef STASH_KERNELS_HOST_DEVICE_H_
#define STASH_KERNELS_HOST_DEVICE_H_

#if defined(__CUDACC__)
#define STASH_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define STASH_HOST_DEVICE inline
#endif

#endif  // STASH_KERNELS_HOST_DEVICE_H_
