#include "core/fp8_scaling.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
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

Tensor Floats(std::vector<int64_t> shape, const std::vector<double>& v,
              DType dtype = DType::kFloat32) {
  return *FromDoubles(dtype, std::move(shape), v);
}

// Hand-derived: amax 3.5, s = 448 / 3.5 = 128 (exact), so 1 -> 128
// (0 1110 000), -2 -> -256 (1 1111 000), 3.5 -> 448 (0x7e), and
// fl32(0.1f * 128) = 12.8000002 -> 13 (0 1010 101); the dequantisation
// scale is 1/128.
TEST(QuantizeFp8Test, PerTensorByHand) {
  const Tensor x = Floats({2, 2}, {1.0, -2.0, 3.5, 0.1});
  auto q = QuantizeFp8(x, 2, 2, Fp8Format::kE4M3Fn, Fp8Scaling::kTensor);
  ASSERT_THAT(q, IsOk());
  EXPECT_EQ(q->values.dtype(), DType::kFloat8E4M3Fn);
  EXPECT_EQ(q->values.shape(), x.shape());
  EXPECT_EQ(q->values.bytes(), absl::string_view("\x70\xf8\x7e\x55", 4));
  EXPECT_EQ(q->scales, std::vector<float>{1.0f / 128});
}

// Rows scaled on their own; an all-zero row takes the amax floor (a
// finite scale, zeros out); per-column groups the columns instead.
TEST(QuantizeFp8Test, RowWiseColumnWiseAndAZeroRow) {
  const Tensor w = Floats({3, 2}, {2.0, 1.0, 0.0, 0.0, -57344.0, 8.0}, DType::kBFloat16);
  auto rows = QuantizeFp8(w, 3, 2, Fp8Format::kE5M2, Fp8Scaling::kRow);
  ASSERT_THAT(rows, IsOk());
  ASSERT_EQ(rows->scales.size(), 3u);
  // Row 0: s = 57344 / 2 = 28672: 2 -> 57344 (0x7b), 1 -> 28672 (0 11101 11).
  EXPECT_EQ(rows->scales[0], 1.0f / 28672);
  EXPECT_EQ(rows->values.data<uint8_t>()[0], 0x7b);
  EXPECT_EQ(rows->values.data<uint8_t>()[1], 0x77);
  // Row 1: amax 0 -> 1e-12: s = fl32(57344e12), zeros stay zero.
  EXPECT_EQ(rows->scales[1], 1.0f / static_cast<float>(57344.0 / 1e-12));
  EXPECT_EQ(rows->values.data<uint8_t>()[2], 0x00);
  // Row 2: s = 1: -57344 (0xfb), 8 (0 10010 00).
  EXPECT_EQ(rows->scales[2], 1.0f);
  EXPECT_EQ(rows->values.data<uint8_t>()[4], 0xfb);
  EXPECT_EQ(rows->values.data<uint8_t>()[5], 0x48);

  auto cols = QuantizeFp8(w, 3, 2, Fp8Format::kE5M2, Fp8Scaling::kRow, /*per_column=*/true);
  ASSERT_THAT(cols, IsOk());
  // Column amaxes: 57344 and 8.
  EXPECT_EQ(cols->scales, (std::vector<float>{1.0f, 1.0f / 7168}));
}

// Against an independent fp64 computation over random data: the scale is
// fp8_max / amax rounded to fp32, every value the brute-force nearest FP8
// value of fl32(v * s) (saturated), and the dequantised value within the
// format's half-unit of v.
TEST(QuantizeFp8Test, RandomTensorsAgainstTheFormula) {
  std::mt19937 rng(7);
  std::normal_distribution<double> normal(0.0, 3.0);
  for (bool e4m3 : {true, false}) {
    const Fp8Format f = e4m3 ? Fp8Format::kE4M3Fn : Fp8Format::kE5M2;
    const double max = e4m3 ? 448.0 : 57344.0;
    std::vector<double> v(64 * 48);
    for (double& e : v) e = static_cast<float>(normal(rng));  // fp32 storage
    const Tensor x = Floats({64, 48}, v);
    for (Fp8Scaling scaling : {Fp8Scaling::kTensor, Fp8Scaling::kRow}) {
      auto q = QuantizeFp8(x, 64, 48, f, scaling);
      ASSERT_THAT(q, IsOk());
      for (int64_t i = 0; i < 64; ++i) {
        double amax = 0;
        for (int64_t j = 0; j < 48; ++j) {
          if (scaling == Fp8Scaling::kRow || i == 0) {
            for (int64_t r = scaling == Fp8Scaling::kRow ? i : 0;
                 r < (scaling == Fp8Scaling::kRow ? i + 1 : 64); ++r) {
              amax = std::max(amax, std::fabs(v[r * 48 + j]));
            }
          }
        }
        if (scaling == Fp8Scaling::kTensor && i > 0) continue;  // checked with i == 0
        const float s = static_cast<float>(max / amax);
        EXPECT_EQ(q->scales[scaling == Fp8Scaling::kRow ? i : 0], 1.0f / s);
        const int64_t end = scaling == Fp8Scaling::kRow ? (i + 1) * 48 : 64 * 48;
        for (int64_t e = scaling == Fp8Scaling::kRow ? i * 48 : 0; e < end; ++e) {
          const float scaled = static_cast<float>(v[e]) * s;
          const std::optional<int> want = RefFp8Nearest(scaled, e4m3);
          ASSERT_TRUE(want.has_value()) << scaled;  // |scaled| <= max: never beyond
          ASSERT_EQ(q->values.data<uint8_t>()[e], *want) << e;
          const double back = RefFp8Value(*want, e4m3) / s;
          // (1 + 2^-20): the fp32 rounding of v * s.
          EXPECT_LE(std::fabs(back - v[e]),
                    std::fabs(v[e]) * (e4m3 ? 0x1p-4 : 0x1p-3) * (1 + 0x1p-20) +
                        std::ldexp(1.0, e4m3 ? -10 : -17) / s)
              << e;
        }
      }
    }
  }
}

TEST(QuantizeFp8Test, NanAmaxPoisonsItsGroupAndBadShapesAreErrors) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const Tensor x = Floats({2, 2}, {1.0, nan, 2.0, 4.0});
  auto q = QuantizeFp8(x, 2, 2, Fp8Format::kE4M3Fn, Fp8Scaling::kRow);
  ASSERT_THAT(q, IsOk());
  EXPECT_TRUE(std::isnan(q->scales[0]));
  EXPECT_EQ(q->scales[1], 1.0f / 112);  // 448 / 4
  EXPECT_EQ(q->values.data<uint8_t>()[3], 0x7e);
  EXPECT_THAT(QuantizeFp8(x, 3, 2, Fp8Format::kE4M3Fn, Fp8Scaling::kRow),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("[3, 2]")));
  EXPECT_THAT(QuantizeFp8(q->values, 2, 2, Fp8Format::kE4M3Fn, Fp8Scaling::kRow),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("float8_e4m3fn")));
}

// Blocks of 128 x 128 over a [200, 300] view (partial blocks at both
// edges): each block's scale from its own amax, every value the nearest
// E4M3 value of fl32(v * s); scales row-major [2, 3].
TEST(QuantizeFp8Test, BlocksAgainstTheFormulaWithPartialEdges) {
  std::mt19937 rng(11);
  std::normal_distribution<double> normal(0.0, 1.0);
  const int64_t rows = 200, cols = 300;
  std::vector<double> v(static_cast<size_t>(rows * cols));
  for (size_t e = 0; e < v.size(); ++e) {
    // Blocks of different magnitudes: 2^(block row + 3 * block column).
    const int64_t r = static_cast<int64_t>(e) / cols, c = static_cast<int64_t>(e) % cols;
    v[e] = static_cast<float>(std::ldexp(normal(rng), static_cast<int>(r / 128 + 3 * (c / 128))));
  }
  const Tensor x = Floats({rows, cols}, v);
  auto q = QuantizeFp8Blocks(x, rows, cols, Fp8Format::kE4M3Fn, Fp8Block{128, 128});
  ASSERT_THAT(q, IsOk());
  ASSERT_EQ(q->scales.size(), 6u);
  for (int64_t br = 0; br < 2; ++br) {
    for (int64_t bc = 0; bc < 3; ++bc) {
      double amax = 0;
      for (int64_t r = br * 128; r < std::min(rows, br * 128 + 128); ++r) {
        for (int64_t c = bc * 128; c < std::min(cols, bc * 128 + 128); ++c) {
          amax = std::max(amax, std::fabs(v[static_cast<size_t>(r * cols + c)]));
        }
      }
      const float s = static_cast<float>(448.0 / amax);
      EXPECT_EQ(q->scales[static_cast<size_t>(br * 3 + bc)], 1.0f / s);
      for (int64_t r = br * 128; r < std::min(rows, br * 128 + 128); ++r) {
        for (int64_t c = bc * 128; c < std::min(cols, bc * 128 + 128); ++c) {
          const size_t e = static_cast<size_t>(r * cols + c);
          const std::optional<int> want = RefFp8Nearest(static_cast<float>(v[e]) * s, true);
          ASSERT_TRUE(want.has_value());
          ASSERT_EQ(q->values.data<uint8_t>()[e], *want) << r << ", " << c;
        }
      }
    }
  }
  // Dequantised: each value times its block's scale, exact in fp64.
  const Tensor scales = Floats({2, 3}, std::vector<double>(q->scales.begin(), q->scales.end()));
  auto back = DequantizeBlocks(q->values, scales, rows, cols, Fp8Block{128, 128}, DType::kFloat64);
  ASSERT_THAT(back, IsOk());
  EXPECT_EQ(back->data<double>()[299 * 0 + 299],
            RefFp8Value(q->values.data<uint8_t>()[299], true) * static_cast<double>(q->scales[2]));
  EXPECT_THAT(DequantizeBlocks(q->values, scales, rows, cols, Fp8Block{1, 128}, DType::kFloat64),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("blocks of 1 x 128")));
  // Block-wise scaling goes through QuantizeFp8Blocks only.
  EXPECT_THAT(QuantizeFp8(x, rows, cols, Fp8Format::kE4M3Fn, Fp8Scaling::kBlock128),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

// ---- Fast accumulation, hand-derived cases of the model.

float Dot(const std::vector<float>& a, int bits, int group) {
  const std::vector<float> ones(a.size(), 1.0f);
  return FastAccumDot(a.data(), ones.data(), 1, static_cast<int64_t>(a.size()),
                      FastAccumModel{bits, group});
}

TEST(FastAccumDotTest, WideAccumulatorIsTheExactSum) {
  // 52 fraction bits: nothing is truncated; the fp64 sum of these exact
  // products, rounded once to fp32.
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> pattern(0, 0x7e);
  std::vector<float> a(300), b(300);
  double exact = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = static_cast<float>(RefFp8Value(pattern(rng) | (i % 3 == 0 ? 0x80 : 0), true));
    b[i] = static_cast<float>(RefFp8Value(pattern(rng), true));
    exact += static_cast<double>(a[i]) * b[i];
  }
  EXPECT_EQ(FastAccumDot(a.data(), b.data(), 1, 300, FastAccumModel{52, 32}),
            static_cast<float>(exact));
}

TEST(FastAccumDotTest, SmallAddendsAreSwampedByALargeAccumulator) {
  // 2^14 then ones: aligned to 2^14 with 13 fraction bits the quantum is 2,
  // and each 1 truncates to 0 (the exact sum is 16415).
  std::vector<float> a(32, 1.0f);
  a[0] = 16384.0f;
  EXPECT_EQ(Dot(a, 13, 32), 16384.0f);
  EXPECT_EQ(Dot(a, 13, 1), 16384.0f);
  // With 14 fraction bits the quantum is 1: exact.
  EXPECT_EQ(Dot(a, 14, 32), 16415.0f);
}

TEST(FastAccumDotTest, TermsAndSumsTruncateTowardZero) {
  // 3 fraction bits at exponent 0: quantum 1/8, so 1/16 truncates away.
  EXPECT_EQ(Dot({1.0f, 0.125f, 0.0625f, 0.0f}, 3, 4), 1.125f);
  EXPECT_EQ(Dot({-1.0f, -0.0625f}, 3, 2), -1.0f);
  // 3 x 1.875 = 5.625 = 101.101b: normalised to 4 significant bits, 5.5.
  EXPECT_EQ(Dot({1.875f, 1.875f, 1.875f}, 3, 4), 5.5f);
  // Group by group: (1 + 1) = 2, then 2 + 1/8: quantum at exponent 1 is
  // 1/4, 1/8 truncates; in one group it would count (quantum 1/8).
  EXPECT_EQ(Dot({1.0f, 1.0f, 0.125f}, 3, 2), 2.0f);
  EXPECT_EQ(Dot({0.125f, 1.0f, 1.0f}, 3, 3), 2.0f);  // aligned to 2^0, then 2.125 -> 2
  EXPECT_EQ(Dot({0.125f, 1.0f}, 3, 2), 1.125f);
}

TEST(FastAccumDotTest, InfinitiesAndNanPropagateAndEmptyIsZero) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(Dot({1.0f, inf, 2.0f}, 13, 2), inf);
  EXPECT_TRUE(std::isnan(Dot({inf, -inf}, 13, 32)));
  EXPECT_EQ(Dot({}, 13, 32), 0.0f);
  EXPECT_EQ(Dot({0.0f, 0.0f}, 13, 32), 0.0f);
}

}  // namespace
}  // namespace tensorcheck
