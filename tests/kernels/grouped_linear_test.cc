// The CPU grouped linear against a naive double-precision reference written independently here,
// plus determinism, padding rows, zero-token experts, bf16 rounding and argument checks.
#include "stash/kernels/grouped_linear.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace stash::kernels {
namespace {

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

const float kNaN = std::numeric_limits<float>::quiet_NaN();

// One layer's tensors: random valid rows, NaN in the padding rows of the inputs (which must
// never be read), and outputs pre-filled with a sentinel.
struct Problem {
  GroupedLinearGeometry g;
  std::vector<int64_t> counts;
  int64_t rows = 0;
  std::vector<float> x, w, dy;  // [T, K], [E, K, N], [T, N]

  Problem(int64_t max_tokens, int64_t k, int64_t n, std::vector<int64_t> expert_counts,
          std::mt19937_64& rng)
      : g{max_tokens, k, n, static_cast<int64_t>(expert_counts.size())},
        counts(std::move(expert_counts)) {
    for (int64_t c : counts) rows += c;
    std::uniform_real_distribution<float> value(-2.0f, 2.0f);
    x.assign(static_cast<size_t>(max_tokens * k), kNaN);
    dy.assign(static_cast<size_t>(max_tokens * n), kNaN);
    w.resize(static_cast<size_t>(g.num_experts * k * n));
    for (int64_t i = 0; i < rows * k; ++i) x[i] = value(rng);
    for (int64_t i = 0; i < rows * n; ++i) dy[i] = value(rng);
    for (float& v : w) v = value(rng);
  }

  // The expert owning token t (t < rows).
  int64_t ExpertOf(int64_t t) const {
    int64_t end = 0;
    for (int64_t e = 0; e < g.num_experts; ++e) {
      end += counts[e];
      if (t < end) return e;
    }
    return -1;
  }
  float W(int64_t e, int64_t k, int64_t n) const {
    return w[(e * g.in_features + k) * g.out_features + n];
  }
};

// |got - want| within 1e-5 of the sum of |terms| (fp32 accumulation of at most a few hundred
// terms is far inside that).
void ExpectClose(float got, double want, double magnitude, const std::string& where) {
  ASSERT_FALSE(std::isnan(got)) << where;
  EXPECT_LE(std::fabs(got - want), 1e-5 * magnitude + 1e-30)
      << where << ": got " << got << ", want " << want;
}

std::vector<float> Filled(size_t n, float value) {
  std::vector<float> filled(n, value);
  return filled;
}

// The bit patterns of `values`: "the same bits" compared exactly, NaN and -0 included.
std::vector<uint32_t> BitsOf(const std::vector<float>& values) {
  std::vector<uint32_t> bits(values.size());
  std::memcpy(bits.data(), values.data(), values.size() * sizeof(float));
  return bits;
}

TEST(GroupedLinear, ForwardMatchesDoubleReferenceAndZeroesPaddingRows) {
  STASH_SEEDED_RNG(rng);
  Problem p(64, 24, 20, {5, 0, 17, 9}, rng);
  std::vector<float> y = Filled(64 * 20, 7.0f);
  std::string error;
  ASSERT_TRUE(GroupedLinearForward(p.g, p.counts.data(), p.x.data(), p.w.data(), y.data(), &error))
      << error;
  for (int64_t t = 0; t < 64; ++t) {
    for (int64_t n = 0; n < 20; ++n) {
      const float got = y[t * 20 + n];
      if (t >= p.rows) {
        ASSERT_EQ(got, 0.0f) << "padding row " << t;
        continue;
      }
      double want = 0.0;
      double magnitude = 0.0;
      for (int64_t k = 0; k < 24; ++k) {
        const double term = double{p.x[t * 24 + k]} * p.W(p.ExpertOf(t), k, n);
        want += term;
        magnitude += std::fabs(term);
      }
      ExpectClose(got, want, magnitude, "y[" + std::to_string(t) + "," + std::to_string(n) + "]");
    }
  }
}

TEST(GroupedLinear, BackwardDataMatchesDoubleReferenceAndZeroesPaddingRows) {
  STASH_SEEDED_RNG(rng);
  Problem p(48, 16, 33, {0, 12, 1, 20, 0}, rng);
  std::vector<float> dx = Filled(48 * 16, 7.0f);
  std::string error;
  ASSERT_TRUE(
      GroupedLinearBackwardData(p.g, p.counts.data(), p.dy.data(), p.w.data(), dx.data(), &error))
      << error;
  for (int64_t t = 0; t < 48; ++t) {
    for (int64_t k = 0; k < 16; ++k) {
      const float got = dx[t * 16 + k];
      if (t >= p.rows) {
        ASSERT_EQ(got, 0.0f) << "padding row " << t;
        continue;
      }
      double want = 0.0;
      double magnitude = 0.0;
      for (int64_t n = 0; n < 33; ++n) {
        const double term = double{p.dy[t * 33 + n]} * p.W(p.ExpertOf(t), k, n);
        want += term;
        magnitude += std::fabs(term);
      }
      ExpectClose(got, want, magnitude, "dx[" + std::to_string(t) + "," + std::to_string(k) + "]");
    }
  }
}

TEST(GroupedLinear, BackwardWeightMatchesDoubleReferenceAndIsZeroForEmptyExperts) {
  STASH_SEEDED_RNG(rng);
  Problem p(80, 12, 10, {30, 0, 25, 3}, rng);
  std::vector<float> dw = Filled(4 * 12 * 10, 7.0f);
  std::string error;
  ASSERT_TRUE(
      GroupedLinearBackwardWeight(p.g, p.counts.data(), p.x.data(), p.dy.data(), dw.data(), &error))
      << error;
  int64_t begin = 0;
  for (int64_t e = 0; e < 4; ++e) {
    for (int64_t k = 0; k < 12; ++k) {
      for (int64_t n = 0; n < 10; ++n) {
        const float got = dw[(e * 12 + k) * 10 + n];
        double want = 0.0;
        double magnitude = 0.0;
        for (int64_t t = begin; t < begin + p.counts[e]; ++t) {
          const double term = double{p.x[t * 12 + k]} * p.dy[t * 10 + n];
          want += term;
          magnitude += std::fabs(term);
        }
        if (p.counts[e] == 0) {
          ASSERT_EQ(got, 0.0f) << "expert " << e << " has no tokens";
        } else {
          ExpectClose(got, want, magnitude, "dw[" + std::to_string(e) + "]");
        }
      }
    }
    begin += p.counts[e];
  }
}

TEST(GroupedLinear, SameInputsGiveTheSameBits) {
  STASH_SEEDED_RNG(rng);
  Problem p(96, 40, 28, {11, 37, 0, 20, 6}, rng);
  const size_t y_size = 96 * 28, dx_size = 96 * 40, dw_size = 5 * 40 * 28;
  std::vector<float> y1 = Filled(y_size, 1.0f), y2 = Filled(y_size, -3.0f);
  std::vector<float> dx1 = Filled(dx_size, 1.0f), dx2 = Filled(dx_size, -3.0f);
  std::vector<float> dw1 = Filled(dw_size, 1.0f), dw2 = Filled(dw_size, -3.0f);
  const int64_t* c = p.counts.data();
  ASSERT_TRUE(GroupedLinearForward(p.g, c, p.x.data(), p.w.data(), y1.data(), nullptr));
  ASSERT_TRUE(GroupedLinearForward(p.g, c, p.x.data(), p.w.data(), y2.data(), nullptr));
  ASSERT_TRUE(GroupedLinearBackwardData(p.g, c, p.dy.data(), p.w.data(), dx1.data(), nullptr));
  ASSERT_TRUE(GroupedLinearBackwardData(p.g, c, p.dy.data(), p.w.data(), dx2.data(), nullptr));
  ASSERT_TRUE(GroupedLinearBackwardWeight(p.g, c, p.x.data(), p.dy.data(), dw1.data(), nullptr));
  ASSERT_TRUE(GroupedLinearBackwardWeight(p.g, c, p.x.data(), p.dy.data(), dw2.data(), nullptr));
  EXPECT_EQ(BitsOf(y1), BitsOf(y2));
  EXPECT_EQ(BitsOf(dx1), BitsOf(dx2));
  EXPECT_EQ(BitsOf(dw1), BitsOf(dw2));
}

TEST(GroupedLinear, AllExpertsEmptyGiveAllZeroOutputs) {
  STASH_SEEDED_RNG(rng);
  Problem p(16, 8, 4, {0, 0, 0}, rng);  // every input row is NaN padding
  std::vector<float> y = Filled(16 * 4, 7.0f), dx = Filled(16 * 8, 7.0f),
                     dw = Filled(3 * 8 * 4, 7.0f);
  const int64_t* c = p.counts.data();
  ASSERT_TRUE(GroupedLinearForward(p.g, c, p.x.data(), p.w.data(), y.data(), nullptr));
  ASSERT_TRUE(GroupedLinearBackwardData(p.g, c, p.dy.data(), p.w.data(), dx.data(), nullptr));
  ASSERT_TRUE(GroupedLinearBackwardWeight(p.g, c, p.x.data(), p.dy.data(), dw.data(), nullptr));
  for (float v : y) EXPECT_EQ(v, 0.0f);
  for (float v : dx) EXPECT_EQ(v, 0.0f);
  for (float v : dw) EXPECT_EQ(v, 0.0f);
}

TEST(GroupedLinear, NoPaddingWhenCountsFillMaxTokens) {
  STASH_SEEDED_RNG(rng);
  Problem p(10, 3, 2, {4, 6}, rng);
  std::vector<float> y = Filled(10 * 2, kNaN);
  ASSERT_TRUE(
      GroupedLinearForward(p.g, p.counts.data(), p.x.data(), p.w.data(), y.data(), nullptr));
  // Token 9 belongs to expert 1.
  const float want = p.x[27] * p.W(1, 0, 1) + p.x[28] * p.W(1, 1, 1) + p.x[29] * p.W(1, 2, 1);
  EXPECT_NEAR(y[19], want, 1e-5);
  for (float v : y) EXPECT_FALSE(std::isnan(v));
}

TEST(GroupedLinear, ZeroMaxTokensIsValid) {
  const GroupedLinearGeometry g{0, 4, 4, 2};
  const int64_t counts[] = {0, 0};
  std::vector<float> w(2 * 4 * 4, 1.0f), dw(2 * 4 * 4, 7.0f);
  float unused = 0.0f;
  std::string error;
  EXPECT_TRUE(GroupedLinearForward(g, counts, &unused, w.data(), &unused, &error)) << error;
  EXPECT_TRUE(GroupedLinearBackwardWeight(g, counts, &unused, &unused, dw.data(), &error)) << error;
  for (float v : dw) EXPECT_EQ(v, 0.0f);
}

TEST(GroupedLinear, RejectsBadGeometryAndWritesNothing) {
  const int64_t two_experts[] = {3, 4};
  std::vector<float> in(64 * 64, 1.0f), w(64 * 64, 1.0f), out(64 * 64, 7.0f);
  struct Bad {
    const char* why;
    GroupedLinearGeometry g;
    std::vector<int64_t> counts;
  };
  const int64_t big = int64_t{1} << 62;
  const Bad bad[] = {
      {"in_features 0", {8, 0, 4, 2}, {3, 4}},
      {"negative out_features", {8, 4, -1, 2}, {3, 4}},
      {"no experts", {8, 4, 4, 0}, {}},
      {"negative max_tokens", {-1, 4, 4, 2}, {0, 0}},
      {"negative count", {8, 4, 4, 2}, {3, -1}},
      {"counts past max_tokens", {6, 4, 4, 2}, {3, 4}},
      {"count overflowing the sum", {8, 4, 4, 2}, {5, std::numeric_limits<int64_t>::max()}},
      {"weights overflow int64", {8, big, 4, 2}, {3, 4}},
      {"tokens overflow int64", {big, 1, 8, 2}, {3, 4}},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.why);
    std::string error;
    EXPECT_FALSE(ValidateGroupedLinear(b.g, b.counts.data(), &error));
    EXPECT_FALSE(error.empty());
    error.clear();
    EXPECT_FALSE(
        GroupedLinearForward(b.g, b.counts.data(), in.data(), w.data(), out.data(), &error));
    EXPECT_NE(error.find("grouped linear"), std::string::npos) << error;
    EXPECT_FALSE(
        GroupedLinearBackwardData(b.g, b.counts.data(), in.data(), w.data(), out.data(), nullptr));
    EXPECT_FALSE(GroupedLinearBackwardWeight(b.g, b.counts.data(), in.data(), in.data(), out.data(),
                                             nullptr));
    for (float v : out) ASSERT_EQ(v, 7.0f);
  }

  const GroupedLinearGeometry ok{8, 4, 4, 2};
  std::string error;
  EXPECT_FALSE(GroupedLinearForward(ok, nullptr, in.data(), w.data(), out.data(), &error));
  EXPECT_NE(error.find("counts"), std::string::npos) << error;
  EXPECT_FALSE(GroupedLinearForward(ok, two_experts, nullptr, w.data(), out.data(), &error));
  EXPECT_NE(error.find("x is null"), std::string::npos) << error;
  EXPECT_FALSE(GroupedLinearBackwardData(ok, two_experts, in.data(), nullptr, out.data(), &error));
  EXPECT_NE(error.find("w is null"), std::string::npos) << error;
  EXPECT_FALSE(GroupedLinearBackwardWeight(ok, two_experts, in.data(), in.data(), nullptr, &error));
  EXPECT_NE(error.find("dw is null"), std::string::npos) << error;
  for (float v : out) ASSERT_EQ(v, 7.0f);
  EXPECT_TRUE(ValidateGroupedLinear(ok, two_experts, nullptr));
  EXPECT_EQ(GroupedLinearRows(ok, two_experts), 7);
}

uint32_t Bits(float f) {
  uint32_t b = 0;
  std::memcpy(&b, &f, sizeof(b));
  return b;
}

float FromBits(uint32_t b) {
  float f = 0.0f;
  std::memcpy(&f, &b, sizeof(f));
  return f;
}

TEST(GroupedLinear, Bf16RoundsToNearestEven) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3F80);
  EXPECT_EQ(FloatToBf16(-2.0f), 0xC000);
  EXPECT_EQ(FloatToBf16(0.0f), 0x0000);
  EXPECT_EQ(FloatToBf16(-0.0f), 0x8000);
  // Exactly halfway: ties go to the even neighbour.
  EXPECT_EQ(FloatToBf16(FromBits(0x3F808000)), 0x3F80);
  EXPECT_EQ(FloatToBf16(FromBits(0x3F818000)), 0x3F82);
  // Just above / below halfway.
  EXPECT_EQ(FloatToBf16(FromBits(0x3F808001)), 0x3F81);
  EXPECT_EQ(FloatToBf16(FromBits(0x3F807FFF)), 0x3F80);
  // A carry into the exponent, and past the largest finite bf16 to infinity.
  EXPECT_EQ(FloatToBf16(FromBits(0x3FFFFFFF)), 0x4000);
  EXPECT_EQ(FloatToBf16(FromBits(0x7F7FFFFF)), 0x7F80);
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(FloatToBf16(-std::numeric_limits<float>::infinity()), 0xFF80);
  // Subnormals round like everything else.
  EXPECT_EQ(FloatToBf16(FromBits(0x00008000)), 0x0000);
  EXPECT_EQ(FloatToBf16(FromBits(0x00018000)), 0x0002);
  // NaN stays NaN, even when its payload sits only in the bits that are dropped.
  for (uint32_t nan : {0x7FC00000u, 0x7F800001u, 0xFF800100u, 0x7FFFFFFFu}) {
    const Bf16 b = FloatToBf16(FromBits(nan));
    EXPECT_TRUE(std::isnan(Bf16ToFloat(b))) << std::hex << nan;
    EXPECT_EQ(b & 0x8000, (nan >> 16) & 0x8000) << "sign of " << std::hex << nan;
  }
  // Every non-NaN bf16 survives the round trip through float exactly.
  for (uint32_t b = 0; b <= 0xFFFF; ++b) {
    const float f = Bf16ToFloat(static_cast<Bf16>(b));
    EXPECT_EQ(Bits(f), b << 16);
    if (!std::isnan(f)) {
      ASSERT_EQ(FloatToBf16(f), b);
    }
  }
}

std::vector<Bf16> ToBf16(const std::vector<float>& v) {
  std::vector<Bf16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = FloatToBf16(v[i]);
  return out;
}

std::vector<float> ToFloat(const std::vector<Bf16>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = Bf16ToFloat(v[i]);
  return out;
}

// The bf16 variants accumulate in fp32 in the same order as the fp32 functions, so on the same
// (bf16-representable) inputs they give exactly the fp32 result rounded once.
TEST(GroupedLinear, Bf16VariantsEqualFp32RoundedOnce) {
  STASH_SEEDED_RNG(rng);
  Problem p(40, 20, 12, {7, 0, 19}, rng);
  const std::vector<Bf16> x = ToBf16(p.x), w = ToBf16(p.w), dy = ToBf16(p.dy);
  const std::vector<float> xf = ToFloat(x), wf = ToFloat(w), dyf = ToFloat(dy);
  const int64_t* c = p.counts.data();
  std::vector<float> y(40 * 12), dx(40 * 20), dw(3 * 20 * 12);
  std::vector<Bf16> y16(y.size(), 0x7777), dx16(dx.size(), 0x7777), dw16(dw.size(), 0x7777);
  std::string error;
  ASSERT_TRUE(GroupedLinearForward(p.g, c, xf.data(), wf.data(), y.data(), &error)) << error;
  ASSERT_TRUE(GroupedLinearForwardBf16(p.g, c, x.data(), w.data(), y16.data(), &error)) << error;
  ASSERT_TRUE(GroupedLinearBackwardData(p.g, c, dyf.data(), wf.data(), dx.data(), &error));
  ASSERT_TRUE(GroupedLinearBackwardDataBf16(p.g, c, dy.data(), w.data(), dx16.data(), &error));
  ASSERT_TRUE(GroupedLinearBackwardWeight(p.g, c, xf.data(), dyf.data(), dw.data(), &error));
  ASSERT_TRUE(GroupedLinearBackwardWeightBf16(p.g, c, x.data(), dy.data(), dw16.data(), &error));
  EXPECT_EQ(y16, ToBf16(y));
  EXPECT_EQ(dx16, ToBf16(dx));
  EXPECT_EQ(dw16, ToBf16(dw));

  const GroupedLinearGeometry bad{40, 0, 12, 3};
  EXPECT_FALSE(GroupedLinearForwardBf16(bad, c, x.data(), w.data(), y16.data(), &error));
}

}  // namespace
}  // namespace stash::kernels
