// A CPU grouped linear layer: the reference the demo trainer and the tests compare against.
//
// The shape of an MoE expert layer after token dispatch (research/domain.md §1.5, §1.8):
//  - X is token-major, [max_tokens, in_features], row-major. Only the first `rows` tokens are
//    valid, where rows = counts[0] + ... + counts[E-1] <= max_tokens. They are split into
//    consecutive per-expert segments: expert 0 owns tokens [0, counts[0]), expert 1 the next
//    counts[1] tokens, and so on. Rows at and past `rows` are padding and are never read.
//  - W holds one weight per expert, [num_experts, in_features, out_features], row-major:
//    W_e = W + e * in_features * out_features is [K, N], so Y[t] = X[t] @ W_e.
//  - Forward:        Y[t]  = X[t] @ W_e     for t in expert e's segment; padding rows of Y = 0.
//  - Backward data:  dX[t] = dY[t] @ W_e^T  for t in expert e's segment; padding rows of dX = 0.
//  - Backward weight: dW_e = X_e^T @ dY_e   over expert e's segment (0 for an expert with no
//    tokens). Padding rows of X and dY are never read, so garbage or NaN there is harmless.
//
// Every output element is accumulated in one fixed order (K, N or the segment's tokens,
// ascending) in single precision, so the same inputs give the same bits on every run. The bf16
// variants load bf16, accumulate in fp32 in the same order and round once to nearest even.
//
// Errors: every function validates its geometry, counts and pointers first and returns false
// with a message in `*error` (when `error` is non-null) without writing any output. No
// exceptions. Outputs must not alias inputs.
#ifndef STASH_KERNELS_GROUPED_LINEAR_H_
#define STASH_KERNELS_GROUPED_LINEAR_H_

#include <cstdint>
#include <string>

namespace stash::kernels {

// The static shape of one grouped linear layer. All fields must be positive except max_tokens,
// which may be 0 (no tokens at all).
struct GroupedLinearGeometry {
  int64_t max_tokens = 0;    // T_max: rows of X, Y, dX and dY (the static token budget)
  int64_t in_features = 0;   // K: columns of X and dX, rows of each W_e
  int64_t out_features = 0;  // N: columns of Y and dY and of each W_e
  int64_t num_experts = 0;   // E: entries of `counts`, weights in W and dW
};

// Checks `geometry` and `counts` (num_experts entries, each >= 0, sum <= max_tokens) and that
// every element count fits in 64 bits. Returns true when valid, else false with a message.
bool ValidateGroupedLinear(const GroupedLinearGeometry& geometry, const int64_t* counts,
                           std::string* error);

// The valid tokens: the sum of `counts`. Call only after ValidateGroupedLinear succeeded.
int64_t GroupedLinearRows(const GroupedLinearGeometry& geometry, const int64_t* counts);

// Y = grouped X @ W. x: [max_tokens, K]; w: [E, K, N]; y: [max_tokens, N].
bool GroupedLinearForward(const GroupedLinearGeometry& geometry, const int64_t* counts,
                          const float* x, const float* w, float* y, std::string* error);

// dX = grouped dY @ W^T. dy: [max_tokens, N]; w: [E, K, N]; dx: [max_tokens, K].
bool GroupedLinearBackwardData(const GroupedLinearGeometry& geometry, const int64_t* counts,
                               const float* dy, const float* w, float* dx, std::string* error);

// dW_e = X_e^T @ dY_e for every expert. x: [max_tokens, K]; dy: [max_tokens, N]; dw: [E, K, N].
bool GroupedLinearBackwardWeight(const GroupedLinearGeometry& geometry, const int64_t* counts,
                                 const float* x, const float* dy, float* dw, std::string* error);

// bf16 stored as its 16 raw bits (the upper half of an IEEE-754 binary32).
using Bf16 = uint16_t;

// Rounds to the nearest bf16, ties to even. NaN stays NaN (quiet); infinities stay infinite;
// values past the largest finite bf16 round to infinity as IEEE rounding says.
Bf16 FloatToBf16(float value);

// Exact: every bf16 is a float.
float Bf16ToFloat(Bf16 value);

// The bf16 variants of the three functions above: same shapes and rules, bf16 in and out,
// fp32 accumulation in the same fixed order, one rounding per output element.
bool GroupedLinearForwardBf16(const GroupedLinearGeometry& geometry, const int64_t* counts,
                              const Bf16* x, const Bf16* w, Bf16* y, std::string* error);
bool GroupedLinearBackwardDataBf16(const GroupedLinearGeometry& geometry, const int64_t* counts,
                                   const Bf16* dy, const Bf16* w, Bf16* dx, std::string* error);
bool GroupedLinearBackwardWeightBf16(const GroupedLinearGeometry& geometry, const int64_t* counts,
                                     const Bf16* x, const Bf16* dy, Bf16* dw, std::string* error);

}  // namespace stash::kernels

#endif  // STASH_KERNELS_GROUPED_LINEAR_H_
