// The CUDA grouped linear (grouped_linear_cuda.h) against the CPU reference (grouped_linear.h):
// forward, backward data and backward weight over a matrix of geometries (an expert with no
// tokens, every token in one expert, a budget with padding rows, ragged tiles, more experts than
// one scan chunk, no tokens at all), with NaN in the padding rows of the inputs (never read) and
// NaN in every output byte before the run (padding rows must come back +0). Each element must be
// within 1e-5 of the sum of the magnitudes of its terms (the CPU reference run on |inputs|), and
// two runs must give identical bits.
//
// Tests that need a GPU skip when cudaGetDeviceCount fails or finds none; the argument checks run
// everywhere because a rejected call never touches the GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "stash/kernels/grouped_linear.h"
#include "stash/kernels/grouped_linear_cuda.h"

namespace stash::kernels {
namespace {

// Every CUDA call of these tests: the expression, the CUDA error string, file and line.
#define ASSERT_CUDA_OK(expr)                                                                 \
  do {                                                                                       \
    const cudaError_t stash_cuda_error_ = (expr);                                            \
    ASSERT_EQ(stash_cuda_error_, cudaSuccess)                                                \
        << #expr << ": " << cudaGetErrorString(stash_cuda_error_) << " (" << __FILE__ << ":" \
        << __LINE__ << ")";                                                                  \
  } while (0)
#define EXPECT_CUDA_OK(expr)                                                                 \
  do {                                                                                       \
    const cudaError_t stash_cuda_error_ = (expr);                                            \
    EXPECT_EQ(stash_cuda_error_, cudaSuccess)                                                \
        << #expr << ": " << cudaGetErrorString(stash_cuda_error_) << " (" << __FILE__ << ":" \
        << __LINE__ << ")";                                                                  \
  } while (0)

uint64_t TestSeed() {
  const char* env = std::getenv("STASH_TEST_SEED");
  if (env != nullptr && *env != '\0') return std::strtoull(env, nullptr, 0);
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) ^ device();
}

#define STASH_SEEDED_RNG(rng)                                             \
  const uint64_t rng##_seed = TestSeed();                                 \
  SCOPED_TRACE(::testing::Message() << "STASH_TEST_SEED=" << rng##_seed); \
  ::testing::Test::RecordProperty("seed", std::to_string(rng##_seed));    \
  std::mt19937_64 rng(rng##_seed)

bool HaveDevice() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

const float kNaN = std::numeric_limits<float>::quiet_NaN();

// Device memory a test owns (at least 16 bytes, so an empty tensor still has a non-null
// pointer); freed on destruction.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() {
    if (ptr_ != nullptr) {
      EXPECT_CUDA_OK(cudaFree(ptr_));
    }
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // Allocates room for `count` elements and sets every byte to `fill`.
  cudaError_t Allocate(size_t count, int fill) {
    count_ = count;
    void* p = nullptr;
    const size_t bytes = count * sizeof(T) < 16 ? 16 : count * sizeof(T);
    cudaError_t error = cudaMalloc(&p, bytes);
    if (error != cudaSuccess) return error;
    ptr_ = static_cast<T*>(p);
    error = cudaMemset(ptr_, fill, bytes);
    if (error != cudaSuccess) return error;
    return cudaDeviceSynchronize();
  }
  cudaError_t Upload(const std::vector<T>& host) {
    count_ = host.size();
    if (host.empty()) return cudaSuccess;
    return cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  cudaError_t Download(std::vector<T>* host) const {
    host->assign(count_, T{});
    if (count_ == 0) return cudaSuccess;
    return cudaMemcpy(host->data(), ptr_, count_ * sizeof(T), cudaMemcpyDeviceToHost);
  }
  T* d() const { return ptr_; }

 private:
  T* ptr_ = nullptr;
  size_t count_ = 0;
};

struct Case {
  std::string name;
  GroupedLinearGeometry g;
  std::vector<int64_t> counts;
};

// How gtest names a case in its output (instead of a dump of its bytes).
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::vector<Case> Cases() {
  std::vector<Case> cases = {
      {"expert_with_no_tokens", {100, 40, 24, 4}, {10, 0, 37, 20}},
      {"all_tokens_in_one_expert", {64, 32, 48, 3}, {0, 64, 0}},
      {"all_tokens_in_the_first_expert", {32, 16, 16, 2}, {32, 0}},
      {"ragged_tiles_and_padding", {53, 17, 33, 5}, {1, 2, 3, 15, 31}},
      {"budget_with_no_tokens", {48, 8, 8, 2}, {0, 0}},
      {"no_token_budget", {0, 8, 8, 2}, {0, 0}},
      {"single_column_and_feature", {40, 1, 1, 3}, {5, 17, 9}},
      {"demo_sized", {1536, 256, 256, 8}, {200, 0, 310, 95, 130, 0, 260, 221}},
  };
  Case many{"many_small_experts_in_one_tile", {256, 8, 24, 40}, {}};
  for (int e = 0; e < 40; ++e) many.counts.push_back(e % 4);
  cases.push_back(many);
  // More experts than one scan chunk of a block (256), so the segment ends carry across chunks.
  Case wide{"more_experts_than_a_scan_chunk", {700, 16, 20, 300}, {}};
  for (int e = 0; e < 300; ++e) wide.counts.push_back((e * 7) % 5);
  cases.push_back(wide);
  return cases;
}

// One layer's inputs: random valid rows in [-2, 2], NaN in the padding rows of X and dY.
struct Problem {
  GroupedLinearGeometry g;
  std::vector<int64_t> counts;
  int64_t rows = 0;
  std::vector<float> x, w, dy;  // [T, K], [E, K, N], [T, N]

  Problem(const Case& c, std::mt19937_64& rng) : g(c.g), counts(c.counts) {
    for (int64_t count : counts) rows += count;
    std::uniform_real_distribution<float> value(-2.0f, 2.0f);
    x.assign(static_cast<size_t>(g.max_tokens * g.in_features), kNaN);
    dy.assign(static_cast<size_t>(g.max_tokens * g.out_features), kNaN);
    w.resize(static_cast<size_t>(g.num_experts * g.in_features * g.out_features));
    for (int64_t i = 0; i < rows * g.in_features; ++i) x[i] = value(rng);
    for (int64_t i = 0; i < rows * g.out_features; ++i) dy[i] = value(rng);
    for (float& v : w) v = value(rng);
  }
};

// The CPU reference refuses null pointers, and an empty vector's data() may be null: a
// stand-in for the tensors of a layer with max_tokens 0 (never read or written).
template <typename T>
T* NonNull(std::vector<T>& v) {
  static T unused[1];
  return v.empty() ? unused : v.data();
}
template <typename T>
const T* NonNull(const std::vector<T>& v) {
  static const T unused[1] = {};
  return v.empty() ? unused : v.data();
}

std::vector<float> Abs(const std::vector<float>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = std::fabs(v[i]);
  return out;
}

uint32_t Bits(float value) {
  uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}
std::vector<uint32_t> Bits(const std::vector<float>& values) {
  std::vector<uint32_t> bits(values.size());
  for (size_t i = 0; i < values.size(); ++i) bits[i] = Bits(values[i]);
  return bits;
}
bool SameBits(float a, float b) { return Bits(a) == Bits(b); }

// Compares a [rows_total, width] GPU result with the reference: rows < valid_rows within 1e-5 of
// the magnitude, the rest exactly +0. Counts elements whose bits differ from the reference.
void ExpectMatches(const std::vector<float>& got, const std::vector<float>& want,
                   const std::vector<float>& magnitude, int64_t valid_rows, int64_t width,
                   const std::string& what, int64_t* bit_differences) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int failures = 0;
  for (size_t i = 0; i < got.size() && failures < 10; ++i) {
    const int64_t row = static_cast<int64_t>(i) / width;
    const int64_t col = static_cast<int64_t>(i) % width;
    if (row >= valid_rows) {
      if (!SameBits(got[i], 0.0f)) {
        ++failures;
        ADD_FAILURE() << what << " padding row " << row << " column " << col << ": got " << got[i]
                      << ", want +0";
      }
      continue;
    }
    if (!SameBits(got[i], want[i])) ++*bit_differences;
    const double tolerance = 1e-5 * static_cast<double>(magnitude[i]) + 1e-30;
    if (std::isnan(got[i]) ||
        std::fabs(static_cast<double>(got[i]) - static_cast<double>(want[i])) > tolerance) {
      ++failures;
      ADD_FAILURE() << what << " row " << row << " column " << col << ": got " << got[i]
                    << ", want " << want[i] << " (tolerance " << tolerance << ")";
    }
  }
}

// The three GPU outputs of one problem.
struct GpuOutputs {
  std::vector<float> y, dx, dw;
};

// Runs forward, backward data and backward weight on the GPU, outputs pre-filled with
// `fill_byte` in every byte (0xff: NaN).
void RunOnGpu(const Problem& p, int fill_byte, cudaStream_t stream, GpuOutputs* out) {
  const GroupedLinearGeometry& g = p.g;
  DeviceBuffer<int64_t> counts;
  DeviceBuffer<float> x, w, dy, y, dx, dw;
  ASSERT_CUDA_OK(counts.Allocate(p.counts.size(), 0));
  ASSERT_CUDA_OK(counts.Upload(p.counts));
  ASSERT_CUDA_OK(x.Allocate(p.x.size(), 0));
  ASSERT_CUDA_OK(x.Upload(p.x));
  ASSERT_CUDA_OK(w.Allocate(p.w.size(), 0));
  ASSERT_CUDA_OK(w.Upload(p.w));
  ASSERT_CUDA_OK(dy.Allocate(p.dy.size(), 0));
  ASSERT_CUDA_OK(dy.Upload(p.dy));
  ASSERT_CUDA_OK(y.Allocate(static_cast<size_t>(g.max_tokens * g.out_features), fill_byte));
  ASSERT_CUDA_OK(dx.Allocate(static_cast<size_t>(g.max_tokens * g.in_features), fill_byte));
  ASSERT_CUDA_OK(dw.Allocate(p.w.size(), fill_byte));
  std::string error;
  ASSERT_TRUE(GroupedLinearForwardCuda(g, counts.d(), x.d(), w.d(), y.d(), stream, &error))
      << error;
  ASSERT_TRUE(GroupedLinearBackwardDataCuda(g, counts.d(), dy.d(), w.d(), dx.d(), stream, &error))
      << error;
  ASSERT_TRUE(GroupedLinearBackwardWeightCuda(g, counts.d(), x.d(), dy.d(), dw.d(), stream, &error))
      << error;
  ASSERT_CUDA_OK(cudaStreamSynchronize(stream));
  ASSERT_CUDA_OK(y.Download(&out->y));
  ASSERT_CUDA_OK(dx.Download(&out->dx));
  ASSERT_CUDA_OK(dw.Download(&out->dw));
}

class GroupedLinearGpu : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
    ASSERT_CUDA_OK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  void TearDown() override {
    if (stream_ != nullptr) {
      EXPECT_CUDA_OK(cudaStreamDestroy(stream_));
    }
  }
  cudaStream_t stream_ = nullptr;
};

TEST_P(GroupedLinearGpu, MatchesTheCpuReferenceAndRepeatsBitForBit) {
  STASH_SEEDED_RNG(rng);
  const Case& c = GetParam();
  const Problem p(c, rng);
  const GroupedLinearGeometry& g = p.g;
  std::string error;

  // The reference and the magnitudes sum |term| of every output element.
  std::vector<float> y(static_cast<size_t>(g.max_tokens * g.out_features));
  std::vector<float> dx(static_cast<size_t>(g.max_tokens * g.in_features));
  std::vector<float> dw(p.w.size());
  std::vector<float> y_mag(y.size()), dx_mag(dx.size()), dw_mag(dw.size());
  const std::vector<float> x_abs = Abs(p.x), w_abs = Abs(p.w), dy_abs = Abs(p.dy);
  ASSERT_TRUE(
      GroupedLinearForward(g, p.counts.data(), NonNull(p.x), NonNull(p.w), NonNull(y), &error))
      << error;
  ASSERT_TRUE(GroupedLinearBackwardData(g, p.counts.data(), NonNull(p.dy), NonNull(p.w),
                                        NonNull(dx), &error))
      << error;
  ASSERT_TRUE(GroupedLinearBackwardWeight(g, p.counts.data(), NonNull(p.x), NonNull(p.dy),
                                          NonNull(dw), &error))
      << error;
  ASSERT_TRUE(GroupedLinearForward(g, p.counts.data(), NonNull(x_abs), NonNull(w_abs),
                                   NonNull(y_mag), &error));
  ASSERT_TRUE(GroupedLinearBackwardData(g, p.counts.data(), NonNull(dy_abs), NonNull(w_abs),
                                        NonNull(dx_mag), &error));
  ASSERT_TRUE(GroupedLinearBackwardWeight(g, p.counts.data(), NonNull(x_abs), NonNull(dy_abs),
                                          NonNull(dw_mag), &error));

  GpuOutputs first;
  ASSERT_NO_FATAL_FAILURE(RunOnGpu(p, 0xff, stream_, &first));
  int64_t bit_differences = 0;
  ASSERT_NO_FATAL_FAILURE(
      ExpectMatches(first.y, y, y_mag, p.rows, g.out_features, "Y", &bit_differences));
  ASSERT_NO_FATAL_FAILURE(
      ExpectMatches(first.dx, dx, dx_mag, p.rows, g.in_features, "dX", &bit_differences));
  // dW has no padding: every row (e, k) is valid.
  ASSERT_NO_FATAL_FAILURE(ExpectMatches(first.dw, dw, dw_mag, g.num_experts * g.in_features,
                                        g.out_features, "dW", &bit_differences));
  // Informational: the kernels never fuse a multiply-add, so on a host without FMA contraction
  // the bits usually equal the reference's too.
  RecordProperty("elements_with_other_bits_than_the_cpu", std::to_string(bit_differences));
  if (bit_differences != 0) {
    std::printf("note: %lld elements within tolerance but not bit-identical to the CPU\n",
                static_cast<long long>(bit_differences));
  }

  // A second run, from outputs pre-filled with other bytes, gives the same bits.
  GpuOutputs second;
  ASSERT_NO_FATAL_FAILURE(RunOnGpu(p, 0x5a, stream_, &second));
  EXPECT_TRUE(Bits(first.y) == Bits(second.y)) << "Y differs between two runs";
  EXPECT_TRUE(Bits(first.dx) == Bits(second.dx)) << "dX differs between two runs";
  EXPECT_TRUE(Bits(first.dw) == Bits(second.dw)) << "dW differs between two runs";
}

INSTANTIATE_TEST_SUITE_P(Geometries, GroupedLinearGpu, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& param_info) {
                           return param_info.param.name;
                         });

// The bf16 variants against the CPU bf16 reference: one bf16 rounding of an fp32 accumulation,
// so they agree within one bf16 step (2^-8 relative) of the magnitude.
TEST(GroupedLinearGpuBf16, MatchesTheCpuReferenceWithinOneRounding) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  STASH_SEEDED_RNG(rng);
  const Case c{"bf16", {75, 40, 36, 4}, {11, 0, 30, 20}};
  const Problem p(c, rng);
  const GroupedLinearGeometry& g = p.g;
  // bf16 inputs (NaN padding stays NaN) and their exact fp32 values for the magnitudes.
  auto to_bf16 = [](const std::vector<float>& v) {
    std::vector<Bf16> out(v.size());
    for (size_t i = 0; i < v.size(); ++i) out[i] = FloatToBf16(v[i]);
    return out;
  };
  auto abs_of = [](const std::vector<Bf16>& v) {
    std::vector<float> out(v.size());
    for (size_t i = 0; i < v.size(); ++i) out[i] = std::fabs(Bf16ToFloat(v[i]));
    return out;
  };
  const std::vector<Bf16> x = to_bf16(p.x), w = to_bf16(p.w), dy = to_bf16(p.dy);
  const std::vector<float> x_abs = abs_of(x), w_abs = abs_of(w), dy_abs = abs_of(dy);
  std::string error;
  std::vector<Bf16> y(static_cast<size_t>(g.max_tokens * g.out_features));
  std::vector<Bf16> dx(static_cast<size_t>(g.max_tokens * g.in_features));
  std::vector<Bf16> dw(w.size());
  std::vector<float> y_mag(y.size()), dx_mag(dx.size()), dw_mag(dw.size());
  ASSERT_TRUE(
      GroupedLinearForwardBf16(g, p.counts.data(), NonNull(x), NonNull(w), NonNull(y), &error));
  ASSERT_TRUE(GroupedLinearBackwardDataBf16(g, p.counts.data(), NonNull(dy), NonNull(w),
                                            NonNull(dx), &error));
  ASSERT_TRUE(GroupedLinearBackwardWeightBf16(g, p.counts.data(), NonNull(x), NonNull(dy),
                                              NonNull(dw), &error));
  ASSERT_TRUE(GroupedLinearForward(g, p.counts.data(), NonNull(x_abs), NonNull(w_abs),
                                   NonNull(y_mag), &error));
  ASSERT_TRUE(GroupedLinearBackwardData(g, p.counts.data(), NonNull(dy_abs), NonNull(w_abs),
                                        NonNull(dx_mag), &error));
  ASSERT_TRUE(GroupedLinearBackwardWeight(g, p.counts.data(), NonNull(x_abs), NonNull(dy_abs),
                                          NonNull(dw_mag), &error));

  cudaStream_t stream = nullptr;
  ASSERT_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  DeviceBuffer<int64_t> d_counts;
  DeviceBuffer<Bf16> d_x, d_w, d_dy, d_y, d_dx, d_dw;
  ASSERT_CUDA_OK(d_counts.Allocate(p.counts.size(), 0));
  ASSERT_CUDA_OK(d_counts.Upload(p.counts));
  ASSERT_CUDA_OK(d_x.Allocate(x.size(), 0));
  ASSERT_CUDA_OK(d_x.Upload(x));
  ASSERT_CUDA_OK(d_w.Allocate(w.size(), 0));
  ASSERT_CUDA_OK(d_w.Upload(w));
  ASSERT_CUDA_OK(d_dy.Allocate(dy.size(), 0));
  ASSERT_CUDA_OK(d_dy.Upload(dy));
  ASSERT_CUDA_OK(d_y.Allocate(y.size(), 0xff));
  ASSERT_CUDA_OK(d_dx.Allocate(dx.size(), 0xff));
  ASSERT_CUDA_OK(d_dw.Allocate(dw.size(), 0xff));
  const bool launched =
      GroupedLinearForwardBf16Cuda(g, d_counts.d(), d_x.d(), d_w.d(), d_y.d(), stream, &error) &&
      GroupedLinearBackwardDataBf16Cuda(g, d_counts.d(), d_dy.d(), d_w.d(), d_dx.d(), stream,
                                        &error) &&
      GroupedLinearBackwardWeightBf16Cuda(g, d_counts.d(), d_x.d(), d_dy.d(), d_dw.d(), stream,
                                          &error);
  EXPECT_TRUE(launched) << error;
  EXPECT_CUDA_OK(cudaStreamSynchronize(stream));
  EXPECT_CUDA_OK(cudaStreamDestroy(stream));
  ASSERT_TRUE(launched);

  struct Output {
    const char* name;
    const DeviceBuffer<Bf16>* gpu;
    const std::vector<Bf16>* want;
    const std::vector<float>* magnitude;
    int64_t valid;  // elements before the padding rows
  };
  const Output outputs[] = {
      {"Y", &d_y, &y, &y_mag, p.rows * g.out_features},
      {"dX", &d_dx, &dx, &dx_mag, p.rows * g.in_features},
      {"dW", &d_dw, &dw, &dw_mag, static_cast<int64_t>(dw.size())},
  };
  for (const Output& o : outputs) {
    std::vector<Bf16> got;
    ASSERT_CUDA_OK(o.gpu->Download(&got));
    ASSERT_EQ(got.size(), o.want->size());
    int failures = 0;
    for (size_t i = 0; i < got.size() && failures < 10; ++i) {
      const float gf = Bf16ToFloat(got[i]);
      const float wf = Bf16ToFloat((*o.want)[i]);
      bool ok = false;
      if (static_cast<int64_t>(i) >= o.valid) {
        ok = got[i] == 0;  // +0
      } else {
        const double tolerance = std::ldexp(static_cast<double>((*o.magnitude)[i]), -7) + 1e-30;
        ok = !std::isnan(gf) && std::fabs(static_cast<double>(gf) - wf) <= tolerance;
      }
      if (!ok) {
        ++failures;
        ADD_FAILURE() << o.name << " element " << i << ": got " << gf << ", want " << wf;
      }
    }
  }
}

// ---- Argument checks: no GPU needed (a rejected call makes no CUDA call). ----

// Valid-looking host pointers that are never dereferenced.
struct FakeTensors {
  alignas(16) int64_t counts[4] = {1, 2, 3, 4};
  alignas(16) float a[64] = {};
  alignas(16) float b[64] = {};
  alignas(16) float out[64] = {};
  alignas(16) uint8_t bytes[64] = {};
};

TEST(GroupedLinearGpuArguments, RejectsBadGeometryAndPointersWithAMessage) {
  FakeTensors f;
  const GroupedLinearGeometry good{16, 4, 4, 4};
  std::string error;
  ASSERT_TRUE(CanImplementGroupedLinearCuda(good, &error)) << error;

  const GroupedLinearGeometry bad_geometries[] = {
      {-1, 4, 4, 4},
      {16, 0, 4, 4},
      {16, 4, 0, 4},
      {16, 4, 4, 0},
      {16, 4, 4, kGroupedLinearCudaMaxExperts + 1},
      {int64_t{1} << 31, 4, 4, 4},
      {16, int64_t{1} << 30, int64_t{1} << 30, 16},  // E * K * N overflows int64
  };
  for (const GroupedLinearGeometry& g : bad_geometries) {
    SCOPED_TRACE(::testing::Message() << "geometry T=" << g.max_tokens << " K=" << g.in_features
                                      << " N=" << g.out_features << " E=" << g.num_experts);
    error.clear();
    EXPECT_FALSE(CanImplementGroupedLinearCuda(g, &error));
    EXPECT_FALSE(error.empty());
    error.clear();
    EXPECT_FALSE(GroupedLinearForwardCuda(g, f.counts, f.a, f.b, f.out, nullptr, &error));
    EXPECT_FALSE(error.empty());
    error.clear();
    EXPECT_FALSE(GroupedLinearBackwardDataCuda(g, f.counts, f.a, f.b, f.out, nullptr, &error));
    EXPECT_FALSE(error.empty());
    error.clear();
    EXPECT_FALSE(GroupedLinearBackwardWeightCuda(g, f.counts, f.a, f.b, f.out, nullptr, &error));
    EXPECT_FALSE(error.empty());
    // A null error pointer is allowed.
    EXPECT_FALSE(GroupedLinearForwardCuda(g, f.counts, f.a, f.b, f.out, nullptr, nullptr));
  }

  auto* misaligned_counts = reinterpret_cast<const int64_t*>(f.bytes + 4);
  auto* misaligned_float = reinterpret_cast<const float*>(f.bytes + 2);
  struct BadPointers {
    const char* why;
    const int64_t* counts;
    const float* a;
    const float* b;
    float* out;
  };
  const BadPointers bad_pointers[] = {
      {"null counts", nullptr, f.a, f.b, f.out},
      {"null first input", f.counts, nullptr, f.b, f.out},
      {"null second input", f.counts, f.a, nullptr, f.out},
      {"null output", f.counts, f.a, f.b, nullptr},
      {"misaligned counts", misaligned_counts, f.a, f.b, f.out},
      {"misaligned input", f.counts, misaligned_float, f.b, f.out},
      {"output aliases the first input", f.counts, f.a, f.b, f.a},
      {"output aliases the second input", f.counts, f.a, f.b, f.b},
  };
  for (const BadPointers& bad : bad_pointers) {
    SCOPED_TRACE(bad.why);
    error.clear();
    EXPECT_FALSE(
        GroupedLinearForwardCuda(good, bad.counts, bad.a, bad.b, bad.out, nullptr, &error));
    EXPECT_FALSE(error.empty());
    error.clear();
    EXPECT_FALSE(
        GroupedLinearBackwardDataCuda(good, bad.counts, bad.a, bad.b, bad.out, nullptr, &error));
    EXPECT_FALSE(error.empty());
    error.clear();
    EXPECT_FALSE(
        GroupedLinearBackwardWeightCuda(good, bad.counts, bad.a, bad.b, bad.out, nullptr, &error));
    EXPECT_FALSE(error.empty());
  }

  // The bf16 entry points check the same way (bf16 needs 2-byte alignment).
  auto* bf16_a = reinterpret_cast<const Bf16*>(f.a);
  auto* bf16_b = reinterpret_cast<const Bf16*>(f.b);
  auto* bf16_out = reinterpret_cast<Bf16*>(f.out);
  auto* bf16_misaligned = reinterpret_cast<const Bf16*>(f.bytes + 1);
  error.clear();
  EXPECT_FALSE(GroupedLinearForwardBf16Cuda(good, f.counts, bf16_misaligned, bf16_b, bf16_out,
                                            nullptr, &error));
  EXPECT_NE(error.find("aligned"), std::string::npos) << error;
  error.clear();
  EXPECT_FALSE(
      GroupedLinearBackwardDataBf16Cuda(good, nullptr, bf16_a, bf16_b, bf16_out, nullptr, &error));
  EXPECT_NE(error.find("d_counts"), std::string::npos) << error;
  error.clear();
  EXPECT_FALSE(GroupedLinearBackwardWeightBf16Cuda(bad_geometries[0], f.counts, bf16_a, bf16_b,
                                                   bf16_out, nullptr, &error));
  EXPECT_NE(error.find("geometry"), std::string::npos) << error;
}

}  // namespace
}  // namespace stash::kernels
