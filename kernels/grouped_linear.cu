// CUDA grouped linear (see grouped_linear_cuda.h for the contract).
//
// Two kernels, both one thread per output element in kTile x kTile tiles, grid-stride over the
// tiles so grids depend only on the static geometry (never on the counts):
//  - GroupedRowsKernel (forward, backward data): a tile covers kTile consecutive token rows and
//    kTile output columns. The rows of one tile may belong to several experts; the block runs one
//    pass per expert whose segment overlaps the tile, and each row keeps only the pass of its own
//    expert. Rows at and past the sum of the counts are written as 0.
//  - GroupedWeightKernel (backward weight): a tile covers kTile x kTile elements of one dW_e and
//    walks the tokens of expert e's segment in chunks of kTile.
// Every block first computes the segment ends from the device counts (a block-wide scan into
// shared memory), so the launch needs no host copy of the counts.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <limits>
#include <string>
#include <utility>

#include "stash/kernels/grouped_linear.h"
#include "stash/kernels/grouped_linear_cuda.h"

namespace stash::kernels {
namespace {

constexpr int kTile = 16;
constexpr int kThreads = kTile * kTile;
// Extents are < 2^31, so a row, column or token index always fits in 32 bits and every product
// used for an offset was checked to fit in 64.
constexpr int64_t kMaxExtent = std::numeric_limits<int32_t>::max();
// Grid-stride loops cover tiles past this many blocks.
constexpr int64_t kMaxBlocks = 65536;

void SetError(std::string* error, std::string message) {
  if (error != nullptr) *error = std::move(message);
}

// a * b for a, b >= 0; false when the product does not fit in int64.
bool CheckedProduct(int64_t a, int64_t b, int64_t* product) {
  if (a != 0 && b > std::numeric_limits<int64_t>::max() / a) return false;
  *product = a * b;
  return true;
}

bool Aligned(const void* pointer, uintptr_t alignment) {
  return (reinterpret_cast<uintptr_t>(pointer) & (alignment - 1)) == 0;
}

// Null, misaligned and aliasing checks of one call's pointers.
template <typename T>
bool CheckPointers(const int64_t* d_counts, const T* a, const char* a_name, const T* b,
                   const char* b_name, const T* out, const char* out_name, std::string* error) {
  const void* pointers[] = {d_counts, a, b, out};
  const char* names[] = {"d_counts", a_name, b_name, out_name};
  const uintptr_t alignments[] = {alignof(int64_t), alignof(T), alignof(T), alignof(T)};
  for (int i = 0; i < 4; ++i) {
    if (pointers[i] == nullptr) {
      SetError(error, std::string("grouped linear (cuda): ") + names[i] + " is null");
      return false;
    }
    if (!Aligned(pointers[i], alignments[i])) {
      SetError(error, std::string("grouped linear (cuda): ") + names[i] + " is not " +
                          std::to_string(alignments[i]) + "-byte aligned");
      return false;
    }
  }
  if (out == a || out == b) {
    SetError(error, std::string("grouped linear (cuda): ") + out_name + " aliases " +
                        (out == a ? a_name : b_name) + " (outputs must not alias inputs)");
    return false;
  }
  return true;
}

bool LaunchFailed(cudaError_t launch_error, const char* kernel, std::string* error) {
  if (launch_error == cudaSuccess) return false;
  SetError(error, std::string("grouped linear (cuda): launching ") + kernel +
                      " failed: cudaGetLastError: " + cudaGetErrorString(launch_error) + " (" +
                      __FILE__ + ")");
  return true;
}

// Loads and stores that convert between the storage type and the fp32 accumulator. The bf16
// store is FloatToBf16 of grouped_linear.cc, bit for bit.
__device__ __forceinline__ float Load(float value) { return value; }
__device__ __forceinline__ float Load(Bf16 value) {
  return __uint_as_float(static_cast<uint32_t>(value) << 16);
}
__device__ __forceinline__ void Store(float* out, float value) { *out = value; }
__device__ __forceinline__ void Store(Bf16* out, float value) {
  uint32_t bits = __float_as_uint(value);
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0) {
    *out = static_cast<Bf16>((bits >> 16) | 0x0040u);  // NaN stays a quiet NaN
    return;
  }
  bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest, ties to even
  *out = static_cast<Bf16>(bits >> 16);
}

// acc + a * b with the product and the sum rounded separately (never an FMA), as the host does.
__device__ __forceinline__ float MulAdd(float acc, float a, float b) {
  return __fadd_rn(acc, __fmul_rn(a, b));
}

// Every thread of the block: seg_end[e] = min(counts[0] + ... + counts[e], max_tokens), each
// count clamped to [0, max_tokens] first (the sum stays below 2^43). Expert e owns the tokens
// [seg_end[e - 1], seg_end[e]) (from 0 for e = 0). A Hillis-Steele scan over kThreads experts at
// a time in `scan`; returns after a barrier, so seg_end is visible to the whole block.
__device__ void LoadSegmentEnds(const int64_t* d_counts, int64_t num_experts, int64_t max_tokens,
                                int64_t* seg_end, int64_t* scan) {
  const int tid = static_cast<int>(threadIdx.y * blockDim.x + threadIdx.x);
  int64_t carry = 0;
  for (int64_t base = 0; base < num_experts; base += kThreads) {
    const int64_t e = base + tid;
    int64_t count = e < num_experts ? d_counts[e] : 0;
    count = count < 0 ? 0 : (count > max_tokens ? max_tokens : count);
    scan[tid] = count;
    __syncthreads();
    for (int offset = 1; offset < kThreads; offset *= 2) {
      const int64_t add = tid >= offset ? scan[tid - offset] : 0;
      __syncthreads();
      scan[tid] += add;
      __syncthreads();
    }
    if (e < num_experts) {
      const int64_t end = carry + scan[tid];
      seg_end[e] = end < max_tokens ? end : max_tokens;
    }
    carry += scan[kThreads - 1];
    __syncthreads();  // every thread has read `scan` before the next chunk overwrites it
  }
}

// The first expert whose segment ends after token `row` (num_experts when none does).
__device__ int64_t FirstExpertEndingAfter(const int64_t* seg_end, int64_t num_experts,
                                          int64_t row) {
  int64_t lo = 0;
  int64_t hi = num_experts;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (seg_end[mid] > row) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

// out[t, c] = sum over r ascending of a[t, r] * B_e(r, c) for each token t of expert e's segment,
// where B_e(r, c) = b[e * b_expert_stride + r * b_row_stride + c * b_col_stride]; a is
// [max_tokens, reduce], out [max_tokens, width]. Rows at and past the segments' end are 0.
// Forward: reduce = K, width = N, B_e = W_e. Backward data: reduce = N, width = K, B_e = W_e^T.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    GroupedRowsKernel(const int64_t* d_counts, int64_t num_experts, int64_t max_tokens,
                      int64_t reduce, int64_t width, const T* a, const T* b,
                      int64_t b_expert_stride, int64_t b_row_stride, int64_t b_col_stride, T* out) {
  extern __shared__ int64_t seg_end[];  // num_experts entries
  __shared__ int64_t scan[kThreads];
  __shared__ float a_tile[kTile][kTile + 1];  // [row in tile][reduction index in chunk]
  __shared__ float b_tile[kTile][kTile + 1];  // [reduction index in chunk][column in tile]
  LoadSegmentEnds(d_counts, num_experts, max_tokens, seg_end, scan);
  const int64_t rows = seg_end[num_experts - 1];
  const int64_t col_tiles = (width + kTile - 1) / kTile;
  const int64_t tiles = (max_tokens + kTile - 1) / kTile * col_tiles;
  const int ty = static_cast<int>(threadIdx.y);
  const int tx = static_cast<int>(threadIdx.x);
  // Which way to read a B tile so that consecutive threads read consecutive addresses.
  const bool b_rows_contiguous = b_col_stride == 1;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t r0 = tile / col_tiles * kTile;
    const int64_t c0 = tile % col_tiles * kTile;
    const int64_t t = r0 + ty;
    const int64_t c = c0 + tx;
    // One pass per expert overlapping rows [r0, r0 + kTile). The loop bounds, `break` and
    // `continue` depend only on shared values, so every thread reaches the same barriers.
    for (int64_t e = FirstExpertEndingAfter(seg_end, num_experts, r0); e < num_experts; ++e) {
      const int64_t begin = e == 0 ? 0 : seg_end[e - 1];
      const int64_t end = seg_end[e];
      if (begin >= r0 + kTile) break;
      if (begin == end) continue;
      const bool mine = t >= begin && t < end;
      const T* b_e = b + e * b_expert_stride;
      float acc = 0.0f;
      for (int64_t r_base = 0; r_base < reduce; r_base += kTile) {
        const int chunk = reduce - r_base < kTile ? static_cast<int>(reduce - r_base) : kTile;
        a_tile[ty][tx] = mine && tx < chunk ? Load(a[t * reduce + r_base + tx]) : 0.0f;
        if (b_rows_contiguous) {
          b_tile[ty][tx] =
              ty < chunk && c < width ? Load(b_e[(r_base + ty) * b_row_stride + c]) : 0.0f;
        } else {
          b_tile[tx][ty] = tx < chunk && c0 + ty < width
                               ? Load(b_e[(r_base + tx) * b_row_stride + (c0 + ty) * b_col_stride])
                               : 0.0f;
        }
        __syncthreads();
        for (int i = 0; i < chunk; ++i) acc = MulAdd(acc, a_tile[ty][i], b_tile[i][tx]);
        __syncthreads();
      }
      if (mine && c < width) Store(&out[t * width + c], acc);
    }
    if (t >= rows && t < max_tokens && c < width) Store(&out[t * width + c], 0.0f);
  }
}

// dw[e, k, n] = sum over the tokens t of expert e's segment, ascending, of x[t, k] * dy[t, n].
template <typename T>
__global__ void __launch_bounds__(kThreads)
    GroupedWeightKernel(const int64_t* d_counts, int64_t num_experts, int64_t max_tokens,
                        int64_t k_dim, int64_t n_dim, const T* x, const T* dy, T* dw) {
  extern __shared__ int64_t seg_end[];  // num_experts entries
  __shared__ int64_t scan[kThreads];
  __shared__ float x_tile[kTile][kTile + 1];   // [token in chunk][k in tile]
  __shared__ float dy_tile[kTile][kTile + 1];  // [token in chunk][n in tile]
  LoadSegmentEnds(d_counts, num_experts, max_tokens, seg_end, scan);
  const int64_t k_tiles = (k_dim + kTile - 1) / kTile;
  const int64_t n_tiles = (n_dim + kTile - 1) / kTile;
  const int64_t tiles_per_expert = k_tiles * n_tiles;
  const int64_t tiles = num_experts * tiles_per_expert;
  const int ty = static_cast<int>(threadIdx.y);
  const int tx = static_cast<int>(threadIdx.x);
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t e = tile / tiles_per_expert;
    const int64_t in_expert = tile % tiles_per_expert;
    const int64_t k0 = in_expert / n_tiles * kTile;
    const int64_t n0 = in_expert % n_tiles * kTile;
    const int64_t begin = e == 0 ? 0 : seg_end[e - 1];
    const int64_t end = seg_end[e];
    const int64_t k = k0 + ty;
    const int64_t n = n0 + tx;
    float acc = 0.0f;
    for (int64_t t0 = begin; t0 < end; t0 += kTile) {
      const int chunk = end - t0 < kTile ? static_cast<int>(end - t0) : kTile;
      x_tile[ty][tx] = ty < chunk && k0 + tx < k_dim ? Load(x[(t0 + ty) * k_dim + k0 + tx]) : 0.0f;
      dy_tile[ty][tx] = ty < chunk && n < n_dim ? Load(dy[(t0 + ty) * n_dim + n]) : 0.0f;
      __syncthreads();
      for (int i = 0; i < chunk; ++i) acc = MulAdd(acc, x_tile[i][ty], dy_tile[i][tx]);
      __syncthreads();
    }
    if (k < k_dim && n < n_dim) Store(&dw[(e * k_dim + k) * n_dim + n], acc);
  }
}

unsigned BlocksFor(int64_t tiles) {
  return static_cast<unsigned>(tiles < kMaxBlocks ? tiles : kMaxBlocks);
}

size_t SharedBytesFor(const GroupedLinearGeometry& g) {
  return static_cast<size_t>(g.num_experts) * sizeof(int64_t);
}

// Forward (transpose_w false) or backward data (true).
template <typename T>
bool LaunchRows(const GroupedLinearGeometry& g, const int64_t* d_counts, const T* d_a,
                const char* a_name, const T* d_w, T* d_out, const char* out_name, bool transpose_w,
                cudaStream_t stream, std::string* error) {
  if (!CheckPointers(d_counts, d_a, a_name, d_w, "d_w", d_out, out_name, error)) return false;
  if (!CanImplementGroupedLinearCuda(g, error)) return false;
  const int64_t reduce = transpose_w ? g.out_features : g.in_features;
  const int64_t width = transpose_w ? g.in_features : g.out_features;
  const int64_t tiles = (g.max_tokens + kTile - 1) / kTile * ((width + kTile - 1) / kTile);
  if (tiles == 0) return true;  // max_tokens == 0: no rows to write
  const int64_t b_row_stride = transpose_w ? 1 : g.out_features;
  const int64_t b_col_stride = transpose_w ? g.out_features : 1;
  GroupedRowsKernel<T><<<BlocksFor(tiles), dim3(kTile, kTile), SharedBytesFor(g), stream>>>(
      d_counts, g.num_experts, g.max_tokens, reduce, width, d_a, d_w,
      g.in_features * g.out_features, b_row_stride, b_col_stride, d_out);
  return !LaunchFailed(cudaGetLastError(), "GroupedRowsKernel", error);
}

template <typename T>
bool LaunchWeight(const GroupedLinearGeometry& g, const int64_t* d_counts, const T* d_x,
                  const T* d_dy, T* d_dw, cudaStream_t stream, std::string* error) {
  if (!CheckPointers(d_counts, d_x, "d_x", d_dy, "d_dy", d_dw, "d_dw", error)) return false;
  if (!CanImplementGroupedLinearCuda(g, error)) return false;
  const int64_t tiles = g.num_experts * ((g.in_features + kTile - 1) / kTile) *
                        ((g.out_features + kTile - 1) / kTile);
  GroupedWeightKernel<T><<<BlocksFor(tiles), dim3(kTile, kTile), SharedBytesFor(g), stream>>>(
      d_counts, g.num_experts, g.max_tokens, g.in_features, g.out_features, d_x, d_dy, d_dw);
  return !LaunchFailed(cudaGetLastError(), "GroupedWeightKernel", error);
}

}  // namespace

bool CanImplementGroupedLinearCuda(const GroupedLinearGeometry& g, std::string* error) {
  if (g.max_tokens < 0 || g.in_features <= 0 || g.out_features <= 0 || g.num_experts <= 0) {
    SetError(error, "grouped linear (cuda): bad geometry (max_tokens " +
                        std::to_string(g.max_tokens) + " must be >= 0; in_features " +
                        std::to_string(g.in_features) + ", out_features " +
                        std::to_string(g.out_features) + " and num_experts " +
                        std::to_string(g.num_experts) + " must be > 0)");
    return false;
  }
  if (g.num_experts > kGroupedLinearCudaMaxExperts) {
    SetError(error, "grouped linear (cuda): num_experts " + std::to_string(g.num_experts) +
                        " is more than the kernels take (" +
                        std::to_string(kGroupedLinearCudaMaxExperts) + ")");
    return false;
  }
  if (g.max_tokens > kMaxExtent || g.in_features > kMaxExtent || g.out_features > kMaxExtent) {
    SetError(error,
             "grouped linear (cuda): max_tokens, in_features and out_features must be below 2^31");
    return false;
  }
  int64_t unused = 0;
  int64_t weight_elements = 0;
  if (!CheckedProduct(g.max_tokens, g.in_features, &unused) ||
      !CheckedProduct(g.max_tokens, g.out_features, &unused) ||
      !CheckedProduct(g.in_features, g.out_features, &weight_elements) ||
      !CheckedProduct(weight_elements, g.num_experts, &unused)) {
    SetError(error, "grouped linear (cuda): geometry too large: an element count overflows int64");
    return false;
  }
  return true;
}

bool GroupedLinearForwardCuda(const GroupedLinearGeometry& geometry, const int64_t* d_counts,
                              const float* d_x, const float* d_w, float* d_y, cudaStream_t stream,
                              std::string* error) {
  return LaunchRows(geometry, d_counts, d_x, "d_x", d_w, d_y, "d_y", false, stream, error);
}

bool GroupedLinearBackwardDataCuda(const GroupedLinearGeometry& geometry, const int64_t* d_counts,
                                   const float* d_dy, const float* d_w, float* d_dx,
                                   cudaStream_t stream, std::string* error) {
  return LaunchRows(geometry, d_counts, d_dy, "d_dy", d_w, d_dx, "d_dx", true, stream, error);
}

bool GroupedLinearBackwardWeightCuda(const GroupedLinearGeometry& geometry, const int64_t* d_counts,
                                     const float* d_x, const float* d_dy, float* d_dw,
                                     cudaStream_t stream, std::string* error) {
  return LaunchWeight(geometry, d_counts, d_x, d_dy, d_dw, stream, error);
}

bool GroupedLinearForwardBf16Cuda(const GroupedLinearGeometry& geometry, const int64_t* d_counts,
                                  const Bf16* d_x, const Bf16* d_w, Bf16* d_y, cudaStream_t stream,
                                  std::string* error) {
  return LaunchRows(geometry, d_counts, d_x, "d_x", d_w, d_y, "d_y", false, stream, error);
}

bool GroupedLinearBackwardDataBf16Cuda(const GroupedLinearGeometry& geometry,
                                       const int64_t* d_counts, const Bf16* d_dy, const Bf16* d_w,
                                       Bf16* d_dx, cudaStream_t stream, std::string* error) {
  return LaunchRows(geometry, d_counts, d_dy, "d_dy", d_w, d_dx, "d_dx", true, stream, error);
}

bool GroupedLinearBackwardWeightBf16Cuda(const GroupedLinearGeometry& geometry,
                                         const int64_t* d_counts, const Bf16* d_x, const Bf16* d_dy,
                                         Bf16* d_dw, cudaStream_t stream, std::string* error) {
  return LaunchWeight(geometry, d_counts, d_x, d_dy, d_dw, stream, error);
}

}  // namespace stash::kernels
