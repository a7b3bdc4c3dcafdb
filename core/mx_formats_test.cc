#include "core/mx_formats.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <utility>
#include <vector>

#include "tests/testing/ref_round.h"
#include "tests/testing/status_matchers.h"

namespace tensorcheck {
namespace {

using ::tensorcheck::testing::IsOk;
using ::tensorcheck::testing::RefFp8Nearest;
using ::tensorcheck::testing::RefFp8Value;
using ::tensorcheck::testing::StatusIs;
using ::testing::HasSubstr;

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// ---- Independent references, from the formats' definitions.

// E2M1 from its fields: exponent 0 is subnormal (m * 0.5), else
// 2^(e - 1) * (1 + m / 2).
double RefFp4Value(int code) {
  const int e = (code >> 1) & 0x3;
  const int m = code & 0x1;
  const double v = e == 0 ? m * 0.5 : std::ldexp(1.0 + m / 2.0, e - 1);
  return (code & 0x8) ? -v : v;
}

// The nearest E2M1 code by brute force, ties to the even code, saturating
// beyond 6; the sign of v kept.
int RefFp4Nearest(double v) {
  const int sign = std::signbit(v) ? 0x8 : 0;
  const double a = std::fabs(v);
  if (a > 6) return sign | 7;  // (far beyond, the distances would tie in fp64)
  int best = 0;
  double best_d = kInf;
  for (int c = 0; c < 8; ++c) {
    const double d = std::fabs(RefFp4Value(c) - a);
    if (d < best_d || (d == best_d && (c & 1) == 0)) {
      best = c;
      best_d = d;
    }
  }
  return sign | best;
}

// The saturating FP8 cast by brute force.
int RefFp8Saturating(double v, bool e4m3) {
  if (std::isnan(v)) return e4m3 ? 0x7f : 0x7e;
  const std::optional<int> q = RefFp8Nearest(v, e4m3);
  if (q.has_value()) return *q;
  return (v < 0 ? 0x80 : 0) | (e4m3 ? 0x7e : 0x7b);
}

// ---- FP4 E2M1.

TEST(Fp4E2M1Test, EveryCodeDecodesByItsFieldsAndRoundTrips) {
  const float want[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (int c = 0; c < 16; ++c) {
    const float v = Fp4E2M1BitsToFloat(static_cast<uint8_t>(c));
    EXPECT_EQ(v, static_cast<float>(RefFp4Value(c))) << c;
    EXPECT_EQ(std::fabs(v), want[c & 7]) << c;
    EXPECT_EQ(std::signbit(v), c >= 8) << c;  // 0x8 is -0
    EXPECT_EQ(DoubleToFp4E2M1Bits(v), c) << c;
    // The high nibble is ignored.
    EXPECT_EQ(Fp4E2M1BitsToFloat(static_cast<uint8_t>(c | 0xa0)), v) << c;
  }
}

// Every midpoint between neighbours is a tie that goes to the even code
// (0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4),
// and the doubles either side of it go to the nearer neighbour.
TEST(Fp4E2M1Test, MidpointsTieToEvenAndNeighboursRoundToNearest) {
  const int want_tie[7] = {0x0, 0x2, 0x2, 0x4, 0x4, 0x6, 0x6};
  for (int c = 0; c < 7; ++c) {
    const double lo = RefFp4Value(c);
    const double hi = RefFp4Value(c + 1);
    const double mid = (lo + hi) / 2;
    for (double sign : {1.0, -1.0}) {
      const int s = sign < 0 ? 0x8 : 0;
      EXPECT_EQ(DoubleToFp4E2M1Bits(sign * mid), s | want_tie[c]) << mid;
      EXPECT_EQ(DoubleToFp4E2M1Bits(sign * std::nextafter(mid, 0.0)), s | c) << mid;
      EXPECT_EQ(DoubleToFp4E2M1Bits(sign * std::nextafter(mid, kInf)), s | (c + 1)) << mid;
    }
  }
}

TEST(Fp4E2M1Test, OverflowSaturatesNanIsPositiveSixZeroKeepsItsSign) {
  EXPECT_EQ(DoubleToFp4E2M1Bits(6.0), 0x7);
  EXPECT_EQ(DoubleToFp4E2M1Bits(5.5), 0x7);
  EXPECT_EQ(DoubleToFp4E2M1Bits(7.0), 0x7);
  EXPECT_EQ(DoubleToFp4E2M1Bits(1e300), 0x7);
  EXPECT_EQ(DoubleToFp4E2M1Bits(kInf), 0x7);
  EXPECT_EQ(DoubleToFp4E2M1Bits(-1e300), 0xf);
  EXPECT_EQ(DoubleToFp4E2M1Bits(-kInf), 0xf);
  EXPECT_EQ(DoubleToFp4E2M1Bits(kNan), 0x7);
  EXPECT_EQ(DoubleToFp4E2M1Bits(-kNan), 0x7);
  EXPECT_EQ(DoubleToFp4E2M1Bits(0.0), 0x0);
  EXPECT_EQ(DoubleToFp4E2M1Bits(-0.0), 0x8);
  EXPECT_EQ(DoubleToFp4E2M1Bits(-0.1), 0x8);
  EXPECT_EQ(DoubleToFp4E2M1Bits(1e-300), 0x0);
  EXPECT_EQ(DoubleToFp4E2M1Bits(5e-324), 0x0);  // a double subnormal
}

TEST(Fp4E2M1Test, RandomValuesMatchTheBruteForceNearest) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> uniform(-8.0, 8.0);
  for (int i = 0; i < 20000; ++i) {
    const double v = uniform(rng);
    ASSERT_EQ(DoubleToFp4E2M1Bits(v), RefFp4Nearest(v)) << v;
  }
}

// ---- UE8M0.

TEST(E8M0Test, EveryCodeIsAPowerOfTwoButNan) {
  for (int b = 0; b < 255; ++b) {
    // 2^(b - 127) by repeated doubling from 2^-127 = 2^-63 * 2^-64.
    double want = 1.0 / 9223372036854775808.0 / 18446744073709551616.0;
    for (int k = 0; k < b; ++k) want *= 2;
    EXPECT_EQ(static_cast<double>(E8M0BitsToFloat(static_cast<uint8_t>(b))), want) << b;
  }
  EXPECT_TRUE(std::isnan(E8M0BitsToFloat(0xff)));
  EXPECT_EQ(FloatBits(E8M0BitsToFloat(0x00)), 0x00400000u);  // the fp32 subnormal 2^-127
  EXPECT_EQ(E8M0BitsToFloat(127), 1.0f);
  EXPECT_EQ(FloatBits(E8M0BitsToFloat(254)), 0x7f000000u);  // 2^127
}

// ---- MXFP8.

std::vector<float> Block32(std::vector<float> head) {
  head.resize(32, 0.0f);
  return head;
}

// Hand-derived: amax 480 (E4M3). Floor: floor(log2 480) = 8, e = 8 - 8 = 0
// (code 127), so 480 saturates to 448 (0x7e) and 1 stays 1 (0 0111 000).
// Rceil: fl32(480 * fl32(1/448)) = 1.07.. rounds up to 2^1 (code 128):
// 480 / 2 = 240 (0 1110 111), 1 / 2 = 0.5 (0 0110 000).
TEST(QuantizeMxFp8Test, FloorSaturatesWhereRceilTakesTheNextPowerOfTwo) {
  const std::vector<float> x = Block32({480.0f, 1.0f, -1.0f});
  auto floor = QuantizeMxFp8(x, 1, 32, Fp8Format::kE4M3Fn, MxScaleRounding::kFloor);
  ASSERT_THAT(floor, IsOk());
  EXPECT_EQ(floor->format, BlockFormat::kMxFp8E4M3);
  EXPECT_EQ(floor->scale_rows, 1);
  EXPECT_EQ(floor->scale_cols, 1);
  EXPECT_EQ(floor->scales, std::vector<uint8_t>{127});
  EXPECT_EQ(floor->codes[0], 0x7e);
  EXPECT_EQ(floor->codes[1], 0x38);
  EXPECT_EQ(floor->codes[2], 0xb8);
  EXPECT_EQ(floor->codes[3], 0x00);

  auto rceil = QuantizeMxFp8(x, 1, 32, Fp8Format::kE4M3Fn, MxScaleRounding::kRceil);
  ASSERT_THAT(rceil, IsOk());
  EXPECT_EQ(rceil->scales, std::vector<uint8_t>{128});
  EXPECT_EQ(rceil->codes[0], 0x77);
  EXPECT_EQ(rceil->codes[1], 0x30);
  EXPECT_EQ(DequantizeBlockScaled(*rceil)[0], 480.0f);
  EXPECT_EQ(DequantizeBlockScaled(*floor)[0], 448.0f);
}

// amax 3.5 = 448 / 128: fl32(1/448) = 1/448 (1 + 4.5e-8), so the descale
// 2^-7 (1 + 4.5e-8) rounds to 2^-7 in fp32 (half an ulp is 6e-8): rceil
// gives 2^-7 as floor does (floor(log2 3.5) - 8 = -7), code 120, and 3.5
// becomes 448. E5M2 floor with amax 1: e = 0 - 15, 1 -> 2^15 (0 11110 00).
TEST(QuantizeMxFp8Test, ExactFitAndE5M2ByHand) {
  const std::vector<float> x = Block32({3.5f, 0.0f, -0.5f});
  for (MxScaleRounding r : {MxScaleRounding::kFloor, MxScaleRounding::kRceil}) {
    auto q = QuantizeMxFp8(x, 1, 32, Fp8Format::kE4M3Fn, r);
    ASSERT_THAT(q, IsOk());
    EXPECT_EQ(q->scales, std::vector<uint8_t>{120});
    EXPECT_EQ(q->codes[0], 0x7e);
    EXPECT_EQ(q->codes[2], 0xe8);  // -64: 1 1101 000
  }
  auto e5 = QuantizeMxFp8(Block32({1.0f}), 1, 32, Fp8Format::kE5M2, MxScaleRounding::kFloor);
  ASSERT_THAT(e5, IsOk());
  EXPECT_EQ(e5->format, BlockFormat::kMxFp8E5M2);
  EXPECT_EQ(e5->scales, std::vector<uint8_t>{112});
  EXPECT_EQ(e5->codes[0], 0x78);
}

// A zero block takes 2^-127 (code 0) and zeros; a NaN or an infinity
// anywhere in a block makes its scale NaN (0xff) and every code NaN; the
// other block of the row is untouched.
TEST(QuantizeMxFp8Test, ZeroNanAndInfinityBlocks) {
  std::vector<float> x(96, 0.0f);
  x[32] = 2.0f;
  x[33] = std::numeric_limits<float>::quiet_NaN();
  x[64] = 1.0f;
  x[65] = -std::numeric_limits<float>::infinity();
  for (MxScaleRounding r : {MxScaleRounding::kFloor, MxScaleRounding::kRceil}) {
    auto q = QuantizeMxFp8(x, 1, 96, Fp8Format::kE4M3Fn, r);
    ASSERT_THAT(q, IsOk());
    EXPECT_EQ(q->scales, (std::vector<uint8_t>{0x00, 0xff, 0xff}));
    for (int i = 0; i < 32; ++i) EXPECT_EQ(q->codes[i], 0x00) << i;
    for (int i = 32; i < 96; ++i) EXPECT_EQ(q->codes[i], 0x7f) << i;
    const std::vector<float> back = DequantizeBlockScaled(*q);
    EXPECT_EQ(back[0], 0.0f);
    EXPECT_TRUE(std::isnan(back[40]));
  }
}

struct MxCase {
  int64_t outer;
  int64_t inner;
  bool per_column;
};

// Random blocks over fp32's whole range (subnormals, 1e38, exact zeros,
// zero blocks, NaN blocks, a partial last block) against the definition:
// floor: e = floor(log2 amax) - emax_elem from frexp; rceil: the least
// 2^e >= fl32(amax * fl32(1 / fp8_max)); both clamped to [-127, 127];
// codes the brute-force saturating nearest FP8 of v / 2^e.
TEST(QuantizeMxFp8Test, RandomTensorsAgainstTheDefinition) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> mantissa(-2.0, 2.0);
  std::uniform_int_distribution<int> pick(0, 99);
  for (const MxCase& c : {MxCase{4, 96, false}, MxCase{3, 70, false}, MxCase{70, 5, true}}) {
    for (bool e4m3 : {true, false}) {
      const Fp8Format f = e4m3 ? Fp8Format::kE4M3Fn : Fp8Format::kE5M2;
      const double fp8_max = e4m3 ? 448.0 : 57344.0;
      const int emax_elem = e4m3 ? 8 : 15;
      std::vector<float> x(static_cast<size_t>(c.outer * c.inner));
      // Each block draws around one exponent so its values are alike.
      for (size_t i = 0; i < x.size(); ++i) {
        const int64_t row = static_cast<int64_t>(i) / c.inner;
        const int64_t col = static_cast<int64_t>(i) % c.inner;
        const int64_t block = c.per_column ? (row / 32) * 1000 + col : row * 1000 + col / 32;
        std::mt19937 block_rng(static_cast<uint32_t>(block * 7 + (e4m3 ? 1 : 2)));
        const int e = std::uniform_int_distribution<int>(-150, 120)(block_rng);
        const int roll = pick(rng);
        x[i] = roll < 5 ? 0.0f : static_cast<float>(std::ldexp(mantissa(rng), e));
      }
      x[0] = std::numeric_limits<float>::quiet_NaN();  // the first block is NaN
      if (c.per_column) {
        for (int64_t r = 0; r < 32; ++r) x[static_cast<size_t>(r * c.inner + 1)] = 0.0f;
      } else {
        for (int64_t j = 32; j < 64; ++j) x[static_cast<size_t>(j)] = 0.0f;
      }
      for (MxScaleRounding rounding : {MxScaleRounding::kFloor, MxScaleRounding::kRceil}) {
        auto q = QuantizeMxFp8(x, c.outer, c.inner, f, rounding, c.per_column);
        ASSERT_THAT(q, IsOk());
        const int64_t srows = c.per_column ? (c.outer + 31) / 32 : c.outer;
        const int64_t scols = c.per_column ? c.inner : (c.inner + 31) / 32;
        ASSERT_EQ(q->scale_rows, srows);
        ASSERT_EQ(q->scale_cols, scols);
        ASSERT_EQ(q->scales.size(), static_cast<size_t>(srows * scols));
        const std::vector<float> back = DequantizeBlockScaled(*q);
        for (int64_t sr = 0; sr < srows; ++sr) {
          for (int64_t sc = 0; sc < scols; ++sc) {
            std::vector<size_t> members;
            for (int64_t t = 0; t < 32; ++t) {
              const int64_t row = c.per_column ? sr * 32 + t : sr;
              const int64_t col = c.per_column ? sc : sc * 32 + t;
              if (row < c.outer && col < c.inner) {
                members.push_back(static_cast<size_t>(row * c.inner + col));
              }
            }
            double amax = 0;
            for (size_t i : members)
              amax = std::isnan(amax) ? amax : std::fmax(amax, std::fabs(x[i]));
            for (size_t i : members) {
              if (std::isnan(x[i])) amax = kNan;
            }
            const uint8_t got = q->scales[static_cast<size_t>(sr * scols + sc)];
            if (std::isnan(amax)) {
              ASSERT_EQ(got, 0xff);
              for (size_t i : members) ASSERT_TRUE(std::isnan(back[i])) << i;
              continue;
            }
            int e = -127;
            if (amax > 0 && rounding == MxScaleRounding::kFloor) {
              int ex = 0;
              std::frexp(amax, &ex);  // amax in [2^(ex-1), 2^ex)
              e = ex - 1 - emax_elem;
            } else if (amax > 0) {
              const float descale = static_cast<float>(amax) * static_cast<float>(1.0 / fp8_max);
              while (e < 127 && std::ldexp(1.0, e) < descale) ++e;
            }
            e = std::max(-127, std::min(127, e));
            ASSERT_EQ(got, e + 127) << sr << "," << sc << " amax " << amax;
            for (size_t i : members) {
              const int want = RefFp8Saturating(std::ldexp(static_cast<double>(x[i]), -e), e4m3);
              ASSERT_EQ(q->codes[i], want) << i << " " << x[i];
              ASSERT_EQ(back[i], static_cast<float>(RefFp8Value(want, e4m3) * std::ldexp(1.0, e)))
                  << i;
            }
          }
        }
      }
    }
  }
}

TEST(QuantizeMxFp8Test, ShapeMismatchIsInvalidArgument) {
  const std::vector<float> x(64, 1.0f);
  EXPECT_THAT(QuantizeMxFp8(x, 3, 32, Fp8Format::kE4M3Fn, MxScaleRounding::kFloor),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("[3, 32]")));
  EXPECT_THAT(QuantizeNvFp4(x, 2, 16), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(QuantizeNvFp4(x, -1, -64), StatusIs(absl::StatusCode::kInvalidArgument));
}

// ---- NVFP4.

// Hand-derived, tensor amax 2688 = 448 * 6: S_enc = 1, S_dec = 1, and the
// multiplier fl32(1/6) = 0.16666667163. Block 0 (amax 2688): 2688 *
// 0.16666667163 = 448.0000134 -> fl32 448 (half an ulp is 1.5e-5) -> e4m3
// 448 (0x7e); its values times fl32(1/448). Block 1 (amax 12): 12 *
// 0.16666667163 = 2.0000001 -> fl32 2 -> e4m3 2 (0x40), inv = 1/2: 12 -> 6
// (0x7), -3 -> -1.5 (0xb), 5 -> 2.5, a tie, to 2 (0x4), 0.2 -> 0.1 -> 0.
// Block 2 is all zero: scale 0, inv FLT_MAX, codes 0 (and -0 -> 0x8).
TEST(QuantizeNvFp4Test, TransformerEngineRecipeByHand) {
  std::vector<float> x(48, 0.0f);
  x[0] = 2688.0f;
  x[1] = -448.0f;  // -448 / 448 (1 + 4.5e-8) -> -1 (0xa)
  x[16] = 12.0f;
  x[17] = -3.0f;
  x[18] = 5.0f;
  x[19] = 0.2f;
  x[33] = -0.0f;
  auto q = QuantizeNvFp4(x, 1, 48);
  ASSERT_THAT(q, IsOk());
  EXPECT_EQ(q->format, BlockFormat::kNvFp4);
  EXPECT_EQ(q->global_amax, 2688.0f);
  EXPECT_EQ(q->global_encode_scale, 1.0f);
  EXPECT_EQ(q->global_scale, 1.0f);
  EXPECT_EQ(q->scales, (std::vector<uint8_t>{0x7e, 0x40, 0x00}));
  EXPECT_EQ(q->codes[0], 0x7);
  EXPECT_EQ(q->codes[1], 0xa);
  EXPECT_EQ(q->codes[16], 0x7);
  EXPECT_EQ(q->codes[17], 0xb);
  EXPECT_EQ(q->codes[18], 0x4);
  EXPECT_EQ(q->codes[19], 0x0);
  EXPECT_EQ(q->codes[32], 0x0);
  EXPECT_EQ(q->codes[33], 0x8);
  const std::vector<float> back = DequantizeBlockScaled(*q);
  EXPECT_EQ(back[0], 2688.0f);  // 6 * 448
  EXPECT_EQ(back[17], -3.0f);   // -1.5 * 2
  EXPECT_EQ(back[18], 4.0f);
}

// An all-zero tensor: amax 0 gives S_enc = 1 (TE's special case), zero
// scales and zero codes. A NaN is ignored by the amaxes (fmaxf) and its
// own code is +6; an infinity makes S_enc = 2688 / inf = 0, replaced by 1,
// and its block's scale 448 (satfinite), its code 6.
TEST(QuantizeNvFp4Test, ZeroTensorNanAndInfinity) {
  auto zero = QuantizeNvFp4(std::vector<float>(32, 0.0f), 2, 16);
  ASSERT_THAT(zero, IsOk());
  EXPECT_EQ(zero->global_encode_scale, 1.0f);
  EXPECT_EQ(zero->global_scale, 1.0f);
  EXPECT_EQ(zero->scales, (std::vector<uint8_t>{0, 0}));
  EXPECT_EQ(zero->codes, std::vector<uint8_t>(32, 0));

  std::vector<float> x(32, 0.0f);
  x[0] = std::numeric_limits<float>::quiet_NaN();
  x[1] = 6.0f;
  x[16] = -std::numeric_limits<float>::infinity();
  x[17] = 448.0f;
  auto q = QuantizeNvFp4(x, 1, 32);
  ASSERT_THAT(q, IsOk());
  EXPECT_EQ(q->global_amax, std::numeric_limits<float>::infinity());
  EXPECT_EQ(q->global_encode_scale, 1.0f);
  // Block 0: amax 6, 6 * fl32(1/6) = 1.0000000298 -> fl32 1 -> e4m3 1 (0x38).
  EXPECT_EQ(q->scales[0], 0x38);
  EXPECT_EQ(q->codes[0], 0x7);  // NaN
  EXPECT_EQ(q->codes[1], 0x7);
  EXPECT_EQ(q->scales[1], 0x7e);
  EXPECT_EQ(q->codes[16], 0xf);
  EXPECT_EQ(q->codes[17], 0x2);  // 448 * fl32(1/448) -> 1
}

// Random tensors (a wide spread of block magnitudes, zero blocks, a
// per_column weight) against the recipe computed step by step in fp32
// from its definition, with brute-force e4m3 and e2m1 roundings.
TEST(QuantizeNvFp4Test, RandomTensorsAgainstTheDefinition) {
  std::mt19937 rng(9);
  std::normal_distribution<double> normal(0.0, 1.0);
  for (const MxCase& c : {MxCase{8, 64, false}, MxCase{5, 40, false}, MxCase{40, 6, true}}) {
    for (double spread : {1.0, 1e-3, 1e30}) {
      std::vector<float> x(static_cast<size_t>(c.outer * c.inner));
      for (size_t i = 0; i < x.size(); ++i) {
        const int64_t row = static_cast<int64_t>(i) / c.inner;
        const int64_t col = static_cast<int64_t>(i) % c.inner;
        const int64_t block = c.per_column ? (row / 16) * 1000 + col : row * 1000 + col / 16;
        // Block magnitudes spread over 2^-20 .. 2^20 times `spread`.
        const double scale = spread * std::ldexp(1.0, static_cast<int>(block % 41) - 20);
        x[i] = static_cast<float>(normal(rng) * scale);
      }
      for (int64_t t = 0; t < 16; ++t) {  // one zero block
        const int64_t row = c.per_column ? 16 + t : 1;
        const int64_t col = c.per_column ? 2 : 16 + t;
        x[static_cast<size_t>(row * c.inner + col)] = 0.0f;
      }
      auto q = QuantizeNvFp4(x, c.outer, c.inner, c.per_column);
      ASSERT_THAT(q, IsOk());
      float amax = 0;
      for (float v : x) amax = std::max(amax, std::fabs(v));
      float s_enc = std::min(2688.0f / amax, FLT_MAX);
      const float s_dec = static_cast<float>(1.0 / s_enc);
      ASSERT_EQ(q->global_amax, amax);
      ASSERT_EQ(q->global_encode_scale, s_enc);
      ASSERT_EQ(q->global_scale, s_dec);
      const float multiplier = s_enc * static_cast<float>(1.0 / 6.0);
      const int64_t srows = c.per_column ? (c.outer + 15) / 16 : c.outer;
      const int64_t scols = c.per_column ? c.inner : (c.inner + 15) / 16;
      ASSERT_EQ(q->scales.size(), static_cast<size_t>(srows * scols));
      const std::vector<float> back = DequantizeBlockScaled(*q);
      for (int64_t sr = 0; sr < srows; ++sr) {
        for (int64_t sc = 0; sc < scols; ++sc) {
          std::vector<size_t> members;
          for (int64_t t = 0; t < 16; ++t) {
            const int64_t row = c.per_column ? sr * 16 + t : sr;
            const int64_t col = c.per_column ? sc : sc * 16 + t;
            if (row < c.outer && col < c.inner) {
              members.push_back(static_cast<size_t>(row * c.inner + col));
            }
          }
          float block_amax = 0;
          for (size_t i : members) block_amax = std::max(block_amax, std::fabs(x[i]));
          const float decode = block_amax * multiplier;
          const int scale = RefFp8Saturating(decode, /*e4m3=*/true);
          ASSERT_EQ(q->scales[static_cast<size_t>(sr * scols + sc)], scale) << sr << "," << sc;
          const float denominator = static_cast<float>(RefFp8Value(scale, true)) * s_dec;
          const float encode = denominator == 0 ? FLT_MAX : std::min(1.0f / denominator, FLT_MAX);
          for (size_t i : members) {
            const int want = RefFp4Nearest(x[i] * encode);
            ASSERT_EQ(q->codes[i], want) << i << " " << x[i];
            // Exact: 2 by 4 significant bits.
            ASSERT_EQ(static_cast<double>(back[i]),
                      RefFp4Value(want) * RefFp8Value(scale, /*e4m3=*/true))
                << i;
          }
        }
      }
    }
  }
}

// ---- Swizzled scale layout.

// torchao's to_blocked, transcribed as loops: the padded [128 R, 4 C]
// matrix viewed (R, 128, C, 4), permuted to (R, C, 128, 4), each tile
// reshaped (4, 32, 4), transposed to (32, 4, 4), flattened.
std::vector<uint8_t> TorchaoToBlocked(const std::vector<uint8_t>& plain, int64_t rows,
                                      int64_t cols) {
  const int64_t rb = (rows + 127) / 128;
  const int64_t cb = (cols + 3) / 4;
  std::vector<uint8_t> out;
  for (int64_t i = 0; i < rb; ++i) {
    for (int64_t j = 0; j < cb; ++j) {
      for (int64_t a = 0; a < 32; ++a) {     // row within a 32-row group
        for (int64_t g = 0; g < 4; ++g) {    // which 32-row group
          for (int64_t k = 0; k < 4; ++k) {  // column within the tile
            const int64_t r = i * 128 + g * 32 + a;
            const int64_t cc = j * 4 + k;
            out.push_back(r < rows && cc < cols ? plain[static_cast<size_t>(r * cols + cc)] : 0);
          }
        }
      }
    }
  }
  return out;
}

TEST(SwizzledScalesTest, LengthsAndHandDerivedOffsets) {
  EXPECT_EQ(SwizzledScaleLength(130, 6), 256 * 8);
  EXPECT_EQ(SwizzledScaleLength(128, 4), 512);
  EXPECT_EQ(SwizzledScaleLength(1, 1), 512);
  EXPECT_EQ(SwizzledScaleLength(0, 0), 0);
  // 130 x 6: padded 256 x 8, tiles (0,0) (0,1) (1,0) (1,1) at 0, 512,
  // 1024, 1536. (33, 5): tile (0, 1); within it r = 33, c = 1:
  // (33 % 32) * 16 + (33 / 32) * 4 + 1 = 16 + 4 + 1 = 21, so 533.
  EXPECT_EQ(SwizzledScaleOffset(33, 5, 6), 533);
  // (129, 2): tile (1, 0) at 1024; r = 1: 16 + 0 + 2 = 18.
  EXPECT_EQ(SwizzledScaleOffset(129, 2, 6), 1042);
  // (127, 3) is a tile's last byte: 31 * 16 + 3 * 4 + 3 = 511.
  EXPECT_EQ(SwizzledScaleOffset(127, 3, 4), 511);
  EXPECT_EQ(SwizzledScaleOffset(0, 0, 6), 0);
  // (64, 0): 0 * 16 + 2 * 4 = 8.
  EXPECT_EQ(SwizzledScaleOffset(64, 0, 6), 8);
}

TEST(SwizzledScalesTest, MatchesTorchaoToBlockedAndRoundTrips) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> byte(1, 255);
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{130, 6}, {128, 4}, {1, 1}, {300, 13}}) {
    std::vector<uint8_t> plain(static_cast<size_t>(rows * cols));
    for (uint8_t& b : plain) b = static_cast<uint8_t>(byte(rng));
    auto blocked = SwizzleScales(plain, rows, cols);
    ASSERT_THAT(blocked, IsOk());
    EXPECT_EQ(*blocked, TorchaoToBlocked(plain, rows, cols)) << rows << "x" << cols;
    auto back = UnswizzleScales(*blocked, rows, cols);
    ASSERT_THAT(back, IsOk());
    EXPECT_EQ(*back, plain);
  }
  // The byte at plain (33, 5) of a 130 x 6 scale lands at 533.
  std::vector<uint8_t> plain(130 * 6, 0);
  plain[33 * 6 + 5] = 0xab;
  auto blocked = SwizzleScales(plain, 130, 6);
  ASSERT_THAT(blocked, IsOk());
  EXPECT_EQ((*blocked)[533], 0xab);
}

TEST(SwizzledScalesTest, WrongLengthsAreInvalidArgument) {
  EXPECT_THAT(SwizzleScales(std::vector<uint8_t>(10), 130, 6),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("[130, 6]")));
  EXPECT_THAT(UnswizzleScales(std::vector<uint8_t>(130 * 6), 130, 6),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("2048")));
  EXPECT_THAT(UnswizzleScales(std::vector<uint8_t>(), -1, 6),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace tensorcheck
