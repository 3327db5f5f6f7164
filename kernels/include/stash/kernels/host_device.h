// STASH_HOST_DEVICE: a function g++ compiles for the host and nvcc for both the host and the
// device, so the host backend, the tests and the CUDA kernels run one definition.
#ifndef STASH_KERNELS_HOST_DEVICE_H_
#define STASH_KERNELS_HOST_DEVICE_H_

#if defined(__CUDACC__)
#define STASH_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define STASH_HOST_DEVICE inline
#endif

// Before a loop over a small fixed count (the lease tiers) whose body indexes a local array: nvcc
// unrolls it, so the array stays in registers instead of local memory. Nothing on the host.
#if defined(__CUDA_ARCH__)
#define STASH_UNROLL _Pragma("unroll")
#else
#define STASH_UNROLL
#endif

#endif  // STASH_KERNELS_HOST_DEVICE_H_
