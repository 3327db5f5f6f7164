// The grouped linear layer of grouped_linear.h on a GPU: same shapes, same rules, device pointers
// and an explicit stream, so the demo trainer can run its expert layers on a GPU.
//
// Differences from the CPU reference, all forced by running sync-free:
//  - `d_counts` is a DEVICE pointer (num_experts int64, 8-byte aligned), read by the kernels when
//    they run; every block sums the counts itself (num_experts is small), so nothing syncs with
//    the host. The host therefore cannot check the counts: a negative count counts as 0 and
//    segments are cut at max_tokens, so bad counts never cause an out-of-bounds access, but such
//    inputs have no reference result.
//  - Only the geometry and the pointers are validated on the host, before any CUDA call (CUTLASS
//    can_implement): bad input returns false with a message and enqueues nothing.
//  - Limits of these kernels: num_experts <= kGroupedLinearCudaMaxExperts and
//    max_tokens, in_features, out_features < 2^31.
//
// Same as the reference: each output element is computed by one thread, accumulated in fp32 in
// one fixed order (the reduction index ascending, from 0.0f, one multiply and one add per term,
// never fused), so two runs give identical bits, and on a host without FMA contraction the same
// bits as grouped_linear.h. Padding rows (>= the sum of the counts) of Y and dX are written as
// +0; padding rows of X and dY are never read. The bf16 variants load bf16, accumulate in fp32
// and round once to nearest even, exactly as FloatToBf16 does.
//
// OK (true) means the kernel was enqueued on `stream`; the outputs are written when the stream
// reaches it. A failed launch returns false with the CUDA call, its error string, file and line
// in `*error` (when `error` is non-null). Outputs must not alias inputs. Thread-compatible: the
// functions keep no state.
//
// This header includes no CUDA header: cudaStream_t is declared below exactly as the runtime
// declares it (C++ allows repeating an identical typedef).
#ifndef STASH_KERNELS_GROUPED_LINEAR_CUDA_H_
#define STASH_KERNELS_GROUPED_LINEAR_CUDA_H_

#include <cstdint>
#include <string>

#include "stash/kernels/grouped_linear.h"

struct CUstream_st;
typedef struct CUstream_st* cudaStream_t;  // NOLINT(modernize-use-using): must match the runtime

namespace stash::kernels {

// The most experts the CUDA kernels take: every block keeps the segment ends in shared memory.
inline constexpr int64_t kGroupedLinearCudaMaxExperts = 4096;

// Checks `geometry` against the rules of grouped_linear.h and the limits above, without touching
// the GPU. Returns true when the kernels can run it, else false with a message.
bool CanImplementGroupedLinearCuda(const GroupedLinearGeometry& geometry, std::string* error);

// Y = grouped X @ W. d_x: [max_tokens, K]; d_w: [E, K, N]; d_y: [max_tokens, N].
bool GroupedLinearForwardCuda(const GroupedLinearGeometry& geometry, const int64_t* d_counts,
                              const float* d_x, const float* d_w, float* d_y, cudaStream_t stream,
                              std::string* error);

// dX = grouped dY @ W^T. d_dy: [max_tokens, N]; d_w: [E, K, N]; d_dx: [max_tokens, K].
bool GroupedLinearBackwardDataCuda(const GroupedLinearGeometry& geometry, const int64_t* d_counts,
                                   const float* d_dy, const float* d_w, float* d_dx,
                                   cudaStream_t stream, std::string* error);

// dW_e = X_e^T @ dY_e for every expert (0 for an expert with no tokens).
// d_x: [max_tokens, K]; d_dy: [max_tokens, N]; d_dw: [E, K, N].
bool GroupedLinearBackwardWeightCuda(const GroupedLinearGeometry& geometry, const int64_t* d_counts,
                                     const float* d_x, const float* d_dy, float* d_dw,
                                     cudaStream_t stream, std::string* error);

// The bf16 variants: same shapes and rules, bf16 in and out (2-byte aligned).
bool GroupedLinearForwardBf16Cuda(const GroupedLinearGeometry& geometry, const int64_t* d_counts,
                                  const Bf16* d_x, const Bf16* d_w, Bf16* d_y, cudaStream_t stream,
                                  std::string* error);
bool GroupedLinearBackwardDataBf16Cuda(const GroupedLinearGeometry& geometry,
                                       const int64_t* d_counts, const Bf16* d_dy, const Bf16* d_w,
                                       Bf16* d_dx, cudaStream_t stream, std::string* error);
bool GroupedLinearBackwardWeightBf16Cuda(const GroupedLinearGeometry& geometry,
                                         const int64_t* d_counts, const Bf16* d_x, const Bf16* d_dy,
                                         Bf16* d_dw, cudaStream_t stream, std::string* error);

}  // namespace stash::kernels

#endif  // STASH_KERNELS_GROUPED_LINEAR_CUDA_H_
