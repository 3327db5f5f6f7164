// TEST AID, NEVER A BACKEND. The CUDA driver stand-in (libstash_cuda_standin.so) models the
// driver entry points common/cuda_driver.h loads on host memory and enforces their documented
// contracts, so mapped mode on GPUs can be tested on machines without one. Nothing here runs on a
// GPU or belongs in a shipped binary. What it models and where each rule comes from: README.md.
//
// Tests load the stand-in by path (CudaDriver::Load(STASH_CUDA_STANDIN_LIBRARY)) and reach the two
// functions below with dlsym on the same handle (CudaDriver::library), so they talk to the copy
// of the stand-in the driver table uses.
#ifndef STASH_TESTS_CUDA_STANDIN_STANDIN_H_
#define STASH_TESTS_CUDA_STANDIN_STANDIN_H_

#include <stddef.h>  // NOLINT(modernize-deprecated-headers): a C header

#ifdef __cplusplus
extern "C" {
#endif

// The host twin of a kernel. `kernel_params` has the shape of cuLaunchKernel's kernelParams:
// kernel_params[i] points at a copy of parameter i, made when the launch was enqueued (or
// captured; every replay of a graph sees the same copy, as on a GPU). grid_x and block_x are the
// launch's x dimensions (the stand-in refuses y or z dimensions other than 1). It runs on the
// stream's worker thread, in stream order.
// NOLINTNEXTLINE(modernize-use-using): a C header
typedef void (*StashStandinKernel)(void** kernel_params, unsigned grid_x, unsigned block_x);

// Registers (or replaces) the host twin of the kernel `name`, with `param_count` parameters of
// `param_sizes[i]` bytes each: cuLaunchKernel copies that many bytes from each kernelParams[i]
// when it enqueues, as the driver does (it knows the sizes from the module's image; the stand-in
// has no image, hence the sizes here). cuModuleGetFunction finds registered names in any module;
// others are CUDA_ERROR_NOT_FOUND. May be called before cuInit. Returns 0, or -1 (with a line on
// stderr) for a null name or function, or sizes missing while param_count > 0.
int stash_standin_register_kernel(const char* name, StashStandinKernel fn, unsigned param_count,
                                  const size_t* param_sizes);

// The number of bytes of stand-in device memory alive on `device` in every process that shares
// this process's registry (STASH_STANDIN_REGISTRY): what the VRAM budget counts. -1 before
// cuInit or for a bad ordinal. For tests that check memory came back without a context.
long long stash_standin_device_bytes_in_use(int device);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // STASH_TESTS_CUDA_STANDIN_STANDIN_H_
