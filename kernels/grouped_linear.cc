// CPU grouped linear (see the header for shapes and rules). Written for clarity: one loop nest
// per pass, each output accumulated in ascending order of its reduction index.
#include "stash/kernels/grouped_linear.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

namespace stash::kernels {
namespace {

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

void SetError(std::string* error, std::string message) {
  if (error != nullptr) *error = std::move(message);
}

// a * b for a, b >= 0; false when the product does not fit in int64.
bool CheckedProduct(int64_t a, int64_t b, int64_t* product) {
  if (a != 0 && b > kInt64Max / a) return false;
  *product = a * b;
  return true;
}

bool CheckPointers(const void* a, const char* a_name, const void* b, const char* b_name,
                   const void* out, const char* out_name, std::string* error) {
  const void* pointers[] = {a, b, out};
  const char* names[] = {a_name, b_name, out_name};
  for (int i = 0; i < 3; ++i) {
    if (pointers[i] == nullptr) {
      SetError(error, std::string("grouped linear: ") + names[i] + " is null");
      return false;
    }
  }
  return true;
}

// Loads and stores that convert between the storage type and the fp32 accumulator.
float Load(float value) { return value; }
float Load(Bf16 value) { return Bf16ToFloat(value); }
void Store(float* out, float value) { *out = value; }
void Store(Bf16* out, float value) { *out = FloatToBf16(value); }

// Zero rows [rows, max_tokens) of a [max_tokens, width] matrix.
template <typename T>
void ZeroPaddingRows(T* matrix, int64_t rows, int64_t max_tokens, int64_t width) {
  for (int64_t i = rows * width; i < max_tokens * width; ++i) Store(&matrix[i], 0.0f);
}

template <typename T>
bool Forward(const GroupedLinearGeometry& g, const int64_t* counts, const T* x, const T* w, T* y,
             std::string* error) {
  if (!CheckPointers(x, "x", w, "w", y, "y", error)) return false;
  if (!ValidateGroupedLinear(g, counts, error)) return false;
  const int64_t k_dim = g.in_features;
  const int64_t n_dim = g.out_features;
  std::vector<float> acc(static_cast<size_t>(n_dim));
  int64_t t = 0;
  for (int64_t e = 0; e < g.num_experts; ++e) {
    const T* w_e = w + e * k_dim * n_dim;
    for (const int64_t end = t + counts[e]; t < end; ++t) {
      // acc[n] = sum over k ascending of X[t, k] * W_e[k, n]: row-wise so W_e is read in order.
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t k = 0; k < k_dim; ++k) {
        const float x_tk = Load(x[t * k_dim + k]);
        const T* w_row = w_e + k * n_dim;
        for (int64_t n = 0; n < n_dim; ++n) acc[n] += x_tk * Load(w_row[n]);
      }
      for (int64_t n = 0; n < n_dim; ++n) Store(&y[t * n_dim + n], acc[n]);
    }
  }
  ZeroPaddingRows(y, t, g.max_tokens, n_dim);
  return true;
}

template <typename T>
bool BackwardData(const GroupedLinearGeometry& g, const int64_t* counts, const T* dy, const T* w,
                  T* dx, std::string* error) {
  if (!CheckPointers(dy, "dy", w, "w", dx, "dx", error)) return false;
  if (!ValidateGroupedLinear(g, counts, error)) return false;
  const int64_t k_dim = g.in_features;
  const int64_t n_dim = g.out_features;
  int64_t t = 0;
  for (int64_t e = 0; e < g.num_experts; ++e) {
    const T* w_e = w + e * k_dim * n_dim;
    for (const int64_t end = t + counts[e]; t < end; ++t) {
      // dX[t, k] = sum over n ascending of dY[t, n] * W_e[k, n].
      const T* dy_row = dy + t * n_dim;
      for (int64_t k = 0; k < k_dim; ++k) {
        const T* w_row = w_e + k * n_dim;
        float acc = 0.0f;
        for (int64_t n = 0; n < n_dim; ++n) acc += Load(dy_row[n]) * Load(w_row[n]);
        Store(&dx[t * k_dim + k], acc);
      }
    }
  }
  ZeroPaddingRows(dx, t, g.max_tokens, k_dim);
  return true;
}

template <typename T>
bool BackwardWeight(const GroupedLinearGeometry& g, const int64_t* counts, const T* x, const T* dy,
                    T* dw, std::string* error) {
  if (!CheckPointers(x, "x", dy, "dy", dw, "dw", error)) return false;
  if (!ValidateGroupedLinear(g, counts, error)) return false;
  const int64_t k_dim = g.in_features;
  const int64_t n_dim = g.out_features;
  std::vector<float> acc(static_cast<size_t>(k_dim * n_dim));
  int64_t t = 0;
  for (int64_t e = 0; e < g.num_experts; ++e) {
    // dW_e[k, n] = sum over the segment's tokens ascending of X[t, k] * dY[t, n].
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (const int64_t end = t + counts[e]; t < end; ++t) {
      const T* dy_row = dy + t * n_dim;
      for (int64_t k = 0; k < k_dim; ++k) {
        const float x_tk = Load(x[t * k_dim + k]);
        float* acc_row = acc.data() + k * n_dim;
        for (int64_t n = 0; n < n_dim; ++n) acc_row[n] += x_tk * Load(dy_row[n]);
      }
    }
    T* dw_e = dw + e * k_dim * n_dim;
    for (int64_t i = 0; i < k_dim * n_dim; ++i) Store(&dw_e[i], acc[i]);
  }
  return true;
}

}  // namespace

bool ValidateGroupedLinear(const GroupedLinearGeometry& g, const int64_t* counts,
                           std::string* error) {
  if (g.max_tokens < 0 || g.in_features <= 0 || g.out_features <= 0 || g.num_experts <= 0) {
    SetError(error, "grouped linear: bad geometry (max_tokens " + std::to_string(g.max_tokens) +
                        " must be >= 0; in_features " + std::to_string(g.in_features) +
                        ", out_features " + std::to_string(g.out_features) + " and num_experts " +
                        std::to_string(g.num_experts) + " must be > 0)");
    return false;
  }
  int64_t unused = 0;
  int64_t weight_elements = 0;
  if (!CheckedProduct(g.max_tokens, g.in_features, &unused) ||
      !CheckedProduct(g.max_tokens, g.out_features, &unused) ||
      !CheckedProduct(g.in_features, g.out_features, &weight_elements) ||
      !CheckedProduct(weight_elements, g.num_experts, &unused)) {
    SetError(error, "grouped linear: geometry too large: an element count overflows int64");
    return false;
  }
  if (counts == nullptr) {
    SetError(error, "grouped linear: counts is null");
    return false;
  }
  int64_t rows = 0;
  for (int64_t e = 0; e < g.num_experts; ++e) {
    if (counts[e] < 0) {
      SetError(error, "grouped linear: counts[" + std::to_string(e) +
                          "] = " + std::to_string(counts[e]) + " is negative");
      return false;
    }
    if (counts[e] > g.max_tokens - rows) {
      SetError(error, "grouped linear: counts[0.." + std::to_string(e) + "] sum past max_tokens " +
                          std::to_string(g.max_tokens));
      return false;
    }
    rows += counts[e];
  }
  return true;
}

int64_t GroupedLinearRows(const GroupedLinearGeometry& geometry, const int64_t* counts) {
  int64_t rows = 0;
  for (int64_t e = 0; e < geometry.num_experts; ++e) rows += counts[e];
  return rows;
}

bool GroupedLinearForward(const GroupedLinearGeometry& geometry, const int64_t* counts,
                          const float* x, const float* w, float* y, std::string* error) {
  return Forward(geometry, counts, x, w, y, error);
}

bool GroupedLinearBackwardData(const GroupedLinearGeometry& geometry, const int64_t* counts,
                               const float* dy, const float* w, float* dx, std::string* error) {
  return BackwardData(geometry, counts, dy, w, dx, error);
}

bool GroupedLinearBackwardWeight(const GroupedLinearGeometry& geometry, const int64_t* counts,
                                 const float* x, const float* dy, float* dw, std::string* error) {
  return BackwardWeight(geometry, counts, x, dy, dw, error);
}

Bf16 FloatToBf16(float value) {
  uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof(bits));
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0) {
    // NaN: keep the sign and the top payload bits, and force the quiet bit so the payload
    // cannot truncate to zero (which would turn the NaN into an infinity).
    return static_cast<Bf16>((bits >> 16) | 0x0040u);
  }
  // Round to nearest, ties to even: add 0x7fff plus the lowest kept bit, then truncate. A carry
  // out of the mantissa bumps the exponent, which is the right rounding (up to infinity too).
  const uint32_t lowest_kept = (bits >> 16) & 1u;
  bits += 0x7fffu + lowest_kept;
  return static_cast<Bf16>(bits >> 16);
}

float Bf16ToFloat(Bf16 value) {
  const uint32_t bits = static_cast<uint32_t>(value) << 16;
  float result = 0.0f;
  std::memcpy(&result, &bits, sizeof(result));
  return result;
}

bool GroupedLinearForwardBf16(const GroupedLinearGeometry& geometry, const int64_t* counts,
                              const Bf16* x, const Bf16* w, Bf16* y, std::string* error) {
  return Forward(geometry, counts, x, w, y, error);
}

bool GroupedLinearBackwardDataBf16(const GroupedLinearGeometry& geometry, const int64_t* counts,
                                   const Bf16* dy, const Bf16* w, Bf16* dx, std::string* error) {
  return BackwardData(geometry, counts, dy, w, dx, error);
}

bool GroupedLinearBackwardWeightBf16(const GroupedLinearGeometry& geometry, const int64_t* counts,
                                     const Bf16* x, const Bf16* dy, Bf16* dw, std::string* error) {
  return BackwardWeight(geometry, counts, x, dy, dw, error);
}

}  // namespace stash::kernels
