#include "core/float_formats.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "tests/testing/ref_round.h"

namespace tensorcheck {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// ---- Independent formulas, written from the format definitions.

// fp16: (-1)^s * 2^(e-15) * (1 + m/1024); subnormals (-1)^s * m * 2^-24.
double Fp16Formula(uint16_t bits) {
  const int s = bits >> 15;
  const int e = (bits >> 10) & 0x1f;
  const int m = bits & 0x3ff;
  double v;
  if (e == 0x1f) {
    v = m == 0 ? kInf : std::numeric_limits<double>::quiet_NaN();
  } else if (e == 0) {
    v = m * std::pow(2.0, -24);
  } else {
    v = std::pow(2.0, e - 15) * (1.0 + m / 1024.0);
  }
  return s ? -v : v;
}

// bf16: (-1)^s * 2^(e-127) * (1 + m/128); subnormals (-1)^s * m * 2^-133.
double Bf16Formula(uint16_t bits) {
  const int s = bits >> 15;
  const int e = (bits >> 7) & 0xff;
  const int m = bits & 0x7f;
  double v;
  if (e == 0xff) {
    v = m == 0 ? kInf : std::numeric_limits<double>::quiet_NaN();
  } else if (e == 0) {
    v = m * std::pow(2.0, -133);
  } else {
    v = std::pow(2.0, e - 127) * (1.0 + m / 128.0);
  }
  return s ? -v : v;
}

bool Fp16IsNan(uint16_t b) { return (b & 0x7c00) == 0x7c00 && (b & 0x3ff) != 0; }
bool Bf16IsNan(uint16_t b) { return (b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0; }

// The reference rounding (tests/testing/ref_round.h).
using ::tensorcheck::testing::RefRound;
using ::tensorcheck::testing::Tie;
constexpr ::tensorcheck::testing::Format kFp16 = ::tensorcheck::testing::kFp16Format;
constexpr ::tensorcheck::testing::Format kBf16 = ::tensorcheck::testing::kBf16Format;
constexpr ::tensorcheck::testing::Format kTf32 = ::tensorcheck::testing::kTf32Format;

// Same value (NaN matches NaN), and the same sign for zeros.
void ExpectSameValue(double got, double want) {
  if (std::isnan(want)) {
    EXPECT_TRUE(std::isnan(got)) << got;
    return;
  }
  EXPECT_EQ(got, want);
  EXPECT_EQ(std::signbit(got), std::signbit(want)) << got << " vs " << want;
}

// ---- Exhaustive over all 65,536 patterns, for both 16-bit formats.

struct Codec16 {
  const char* name;
  float (*decode)(uint16_t);
  double (*formula)(uint16_t);  // the independent formula above
  bool (*is_nan)(uint16_t);
  uint16_t (*from_float)(float);
  uint16_t (*from_double)(double);
  float (*round)(float);
  uint16_t largest_finite;  // positive finite patterns 0 .. this increase in value
};

const Codec16 kFp16Codec{"fp16",          Fp16BitsToFloat,  Fp16Formula, Fp16IsNan,
                         FloatToFp16Bits, DoubleToFp16Bits, RoundToFp16, 0x7bff};
const Codec16 kBf16Codec{"bf16",          Bf16BitsToFloat,  Bf16Formula, Bf16IsNan,
                         FloatToBf16Bits, DoubleToBf16Bits, RoundToBf16, 0x7f7f};

class Codec16Test : public ::testing::TestWithParam<Codec16> {};

TEST_P(Codec16Test, EveryPatternDecodesToTheFormula) {
  const Codec16& c = GetParam();
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    SCOPED_TRACE(b);
    ExpectSameValue(c.decode(static_cast<uint16_t>(b)), c.formula(static_cast<uint16_t>(b)));
  }
}

TEST_P(Codec16Test, EveryNonNanPatternRoundTripsThroughFloatAndDouble) {
  const Codec16& c = GetParam();
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    const uint16_t bits = static_cast<uint16_t>(b);
    const float f = c.decode(bits);
    if (c.is_nan(bits)) {
      EXPECT_TRUE(c.is_nan(c.from_float(f))) << b;
      EXPECT_TRUE(c.is_nan(c.from_double(f))) << b;
      continue;
    }
    EXPECT_EQ(c.from_float(f), bits) << b;
    EXPECT_EQ(c.from_double(static_cast<double>(f)), bits) << b;
    EXPECT_EQ(c.round(f), f) << b;
  }
}

// Positive finite patterns 0 .. largest_finite are in increasing order of
// value; the negative ones mirror them.
TEST_P(Codec16Test, MidpointsOfAdjacentValuesRoundToEvenAndNeighboursToNearer) {
  const Codec16& c = GetParam();
  for (uint16_t lo = 0; lo < c.largest_finite; ++lo) {
    const uint16_t hi = lo + 1;
    const double a = c.formula(lo), b = c.formula(hi);
    const double mid = (a + b) / 2;  // exact: 12 (fp16) or 9 (bf16) significant bits
    const uint16_t even = (lo & 1) ? hi : lo;
    for (int sign : {1, -1}) {
      SCOPED_TRACE(::testing::Message() << "lo=" << lo << " sign=" << sign);
      const uint16_t s = sign < 0 ? 0x8000 : 0;
      const double m = sign * mid;
      ASSERT_EQ(static_cast<double>(static_cast<float>(m)), m);
      EXPECT_EQ(c.from_float(static_cast<float>(m)), even | s);
      EXPECT_EQ(c.from_double(m), even | s);
      // Just inside each side, in float and in double.
      const float mf = static_cast<float>(m);
      EXPECT_EQ(c.from_float(std::nextafter(mf, 0.0f)), lo | s);
      EXPECT_EQ(c.from_float(std::nextafter(mf, sign * std::numeric_limits<float>::infinity())),
                hi | s);
      EXPECT_EQ(c.from_double(std::nextafter(m, 0.0)), lo | s);
      EXPECT_EQ(c.from_double(std::nextafter(m, sign * kInf)), hi | s);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, Codec16Test, ::testing::Values(kFp16Codec, kBf16Codec),
                         [](const ::testing::TestParamInfo<Codec16>& info) {
                           return std::string(info.param.name);
                         });

// ---- Edge values.

TEST(Fp16Test, OverflowGoesToInfinityFromTheTieAt65520) {
  EXPECT_EQ(FloatToFp16Bits(65504.0f), 0x7bff);  // largest finite
  EXPECT_EQ(FloatToFp16Bits(std::nextafter(65520.0f, 0.0f)),
            0x7bff);                             // below the tie
  EXPECT_EQ(FloatToFp16Bits(65520.0f), 0x7c00);  // tie: even is inf
  EXPECT_EQ(FloatToFp16Bits(-65520.0f), 0xfc00);
  EXPECT_EQ(FloatToFp16Bits(1e10f), 0x7c00);
  EXPECT_EQ(FloatToFp16Bits(std::numeric_limits<float>::max()), 0x7c00);
  EXPECT_EQ(DoubleToFp16Bits(65519.99999999), 0x7bff);
  EXPECT_EQ(DoubleToFp16Bits(65520.0), 0x7c00);
  EXPECT_EQ(DoubleToFp16Bits(1e300), 0x7c00);
}

TEST(Fp16Test, SubnormalsZerosInfinitiesAndNan) {
  EXPECT_EQ(FloatToFp16Bits(std::ldexp(1.0f, -24)),
            0x0001);  // smallest subnormal
  EXPECT_EQ(FloatToFp16Bits(std::ldexp(1.0f, -25)),
            0x0000);  // tie with 0: even
  EXPECT_EQ(FloatToFp16Bits(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(FloatToFp16Bits(3 * std::ldexp(1.0f, -25)),
            0x0002);  // tie 1|2: even
  EXPECT_EQ(FloatToFp16Bits(1023 * std::ldexp(1.0f, -24)),
            0x03ff);                                           // largest subnormal
  EXPECT_EQ(FloatToFp16Bits(std::ldexp(1.0f, -14)), 0x0400);   // smallest normal
  EXPECT_EQ(FloatToFp16Bits(std::ldexp(1.0f, -140)), 0x0000);  // underflow
  EXPECT_EQ(FloatToFp16Bits(-std::ldexp(1.0f, -140)),
            0x8000);  // keeps the sign
  EXPECT_EQ(FloatToFp16Bits(0.0f), 0x0000);
  EXPECT_EQ(FloatToFp16Bits(-0.0f), 0x8000);
  EXPECT_EQ(FloatToFp16Bits(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(FloatToFp16Bits(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_TRUE(Fp16IsNan(FloatToFp16Bits(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(Fp16IsNan(FloatToFp16Bits(BitsToFloat(0x7f800001u))));  // signalling
  EXPECT_TRUE(Fp16IsNan(DoubleToFp16Bits(std::numeric_limits<double>::quiet_NaN())));
  EXPECT_EQ(FloatToFp16Bits(1.0f + std::ldexp(1.0f, -11)),
            0x3c00);  // tie: even
  EXPECT_EQ(FloatToFp16Bits(1.0f + 3 * std::ldexp(1.0f, -11)),
            0x3c02);  // tie: even
}

TEST(Bf16Test, TiesOverflowSubnormalsZerosAndNan) {
  EXPECT_EQ(FloatToBf16Bits(1.0f + std::ldexp(1.0f, -8)), 0x3f80);  // tie: even
  EXPECT_EQ(FloatToBf16Bits(1.0f + 3 * std::ldexp(1.0f, -8)),
            0x3f82);  // tie: even
  EXPECT_EQ(FloatToBf16Bits(BitsToFloat(0x7f7f7fffu)),
            0x7f7f);  // largest finite
  EXPECT_EQ(FloatToBf16Bits(BitsToFloat(0x7f7f8000u)),
            0x7f80);  // tie: even is inf
  EXPECT_EQ(FloatToBf16Bits(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(FloatToBf16Bits(-std::numeric_limits<float>::max()), 0xff80);
  EXPECT_EQ(FloatToBf16Bits(BitsToFloat(0x00008000u)),
            0x0000);  // subnormal tie: even
  EXPECT_EQ(FloatToBf16Bits(BitsToFloat(0x00018000u)), 0x0002);
  EXPECT_EQ(FloatToBf16Bits(BitsToFloat(0x00008001u)), 0x0001);
  EXPECT_EQ(FloatToBf16Bits(-0.0f), 0x8000);
  EXPECT_EQ(FloatToBf16Bits(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(FloatToBf16Bits(-std::numeric_limits<float>::infinity()), 0xff80);
  // A NaN whose payload sits in the dropped bits must not become infinity.
  EXPECT_TRUE(Bf16IsNan(FloatToBf16Bits(BitsToFloat(0x7f800001u))));
  EXPECT_TRUE(Bf16IsNan(FloatToBf16Bits(BitsToFloat(0xff800001u))));
  EXPECT_EQ(FloatToBf16Bits(BitsToFloat(0xff800001u)) & 0x8000, 0x8000);
  EXPECT_TRUE(Bf16IsNan(DoubleToBf16Bits(-std::numeric_limits<double>::quiet_NaN())));
  EXPECT_EQ(DoubleToBf16Bits(1e300), 0x7f80);
  EXPECT_EQ(DoubleToBf16Bits(-1e-300), 0x8000);
}

TEST(Tf32Test, TiesOnTheDroppedBitsFollowEachRounding) {
  const float tie_even_down = 1.0f + std::ldexp(1.0f, -11);    // 1 | 1+2^-10
  const float tie_even_up = 1.0f + 3 * std::ldexp(1.0f, -11);  // 1+2^-10 | 1+2^-9
  const float above_tie = std::nextafter(tie_even_down, 2.0f);
  const float below_tie = std::nextafter(tie_even_down, 0.0f);
  const float up1 = 1.0f + std::ldexp(1.0f, -10);
  const float up2 = 1.0f + std::ldexp(1.0f, -9);
  EXPECT_EQ(RoundToTf32(tie_even_down, Tf32Rounding::kNearestEven), 1.0f);
  EXPECT_EQ(RoundToTf32(tie_even_down, Tf32Rounding::kTiesAway), up1);
  EXPECT_EQ(RoundToTf32(tie_even_down, Tf32Rounding::kTruncate), 1.0f);
  EXPECT_EQ(RoundToTf32(tie_even_up, Tf32Rounding::kNearestEven), up2);
  EXPECT_EQ(RoundToTf32(tie_even_up, Tf32Rounding::kTiesAway), up2);
  EXPECT_EQ(RoundToTf32(tie_even_up, Tf32Rounding::kTruncate), up1);
  EXPECT_EQ(RoundToTf32(-tie_even_down, Tf32Rounding::kTiesAway), -up1);
  EXPECT_EQ(RoundToTf32(-tie_even_down, Tf32Rounding::kNearestEven), -1.0f);
  EXPECT_EQ(RoundToTf32(-tie_even_up, Tf32Rounding::kTruncate), -up1);
  EXPECT_EQ(RoundToTf32(above_tie, Tf32Rounding::kNearestEven), up1);
  EXPECT_EQ(RoundToTf32(above_tie, Tf32Rounding::kTruncate), 1.0f);
  EXPECT_EQ(RoundToTf32(below_tie, Tf32Rounding::kTiesAway), 1.0f);
}

TEST(Tf32Test, OverflowSubnormalsZerosInfinitiesAndNan) {
  const float max = std::numeric_limits<float>::max();
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(RoundToTf32(max, Tf32Rounding::kNearestEven), inf);
  EXPECT_EQ(RoundToTf32(max, Tf32Rounding::kTiesAway), inf);
  EXPECT_EQ(FloatBits(RoundToTf32(max, Tf32Rounding::kTruncate)), 0x7f7fe000u);
  EXPECT_EQ(RoundToTf32(-max, Tf32Rounding::kNearestEven), -inf);
  EXPECT_EQ(FloatBits(RoundToTf32(BitsToFloat(0x7f7fefffu), Tf32Rounding::kNearestEven)),
            0x7f7fe000u);  // largest TF32 value
  EXPECT_EQ(FloatBits(RoundToTf32(BitsToFloat(0x00001000u), Tf32Rounding::kNearestEven)), 0u);
  EXPECT_EQ(FloatBits(RoundToTf32(BitsToFloat(0x00001000u), Tf32Rounding::kTiesAway)), 0x00002000u);
  EXPECT_EQ(FloatBits(RoundToTf32(BitsToFloat(0x00003000u), Tf32Rounding::kNearestEven)),
            0x00004000u);
  EXPECT_EQ(FloatBits(RoundToTf32(BitsToFloat(0x00001fffu), Tf32Rounding::kTruncate)), 0u);
  for (Tf32Rounding r :
       {Tf32Rounding::kNearestEven, Tf32Rounding::kTiesAway, Tf32Rounding::kTruncate}) {
    EXPECT_EQ(FloatBits(RoundToTf32(-0.0f, r)), 0x80000000u);
    EXPECT_EQ(RoundToTf32(inf, r), inf);
    EXPECT_EQ(RoundToTf32(-inf, r), -inf);
    EXPECT_TRUE(std::isnan(RoundToTf32(std::numeric_limits<float>::quiet_NaN(), r)));
    EXPECT_TRUE(std::isnan(RoundToTf32(BitsToFloat(0x7f800001u), r)));  // payload low
  }
}

// ---- Random sweeps against the reference rounding.

TEST(FloatFormatsTest, RandomFloatsRoundLikeTheReference) {
  std::mt19937 rng(42);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 1'000'000; ++i) {
    const float f = BitsToFloat(bits(rng));
    if (std::isnan(f)) continue;
    const double d = f;
    SCOPED_TRACE(::testing::Message() << "bits " << std::hex << FloatBits(f));
    ExpectSameValue(Fp16BitsToFloat(FloatToFp16Bits(f)), RefRound(d, kFp16));
    ExpectSameValue(Bf16BitsToFloat(FloatToBf16Bits(f)), RefRound(d, kBf16));
    ExpectSameValue(RoundToTf32(f, Tf32Rounding::kNearestEven), RefRound(d, kTf32));
    ExpectSameValue(RoundToTf32(f, Tf32Rounding::kTiesAway), RefRound(d, kTf32, Tie::kAway));
    ExpectSameValue(RoundToTf32(f, Tf32Rounding::kTruncate), RefRound(d, kTf32, Tie::kTruncate));
    if (HasFailure()) break;
  }
}

TEST(FloatFormatsTest, RandomDoublesRoundOnceLikeTheReference) {
  // Doubles near the formats' ranges, with bits below fp32's precision, so
  // that a detour through fp32 would double-round some of them.
  std::mt19937_64 rng(43);
  std::uniform_int_distribution<uint64_t> mantissa(0, (uint64_t{1} << 52) - 1);
  std::uniform_int_distribution<int> exponent(-150, 130);
  std::bernoulli_distribution neg(0.5);
  for (int i = 0; i < 1'000'000; ++i) {
    const double d =
        (neg(rng) ? -1 : 1) *
        std::ldexp(1.0 + std::ldexp(static_cast<double>(mantissa(rng)), -52), exponent(rng));
    SCOPED_TRACE(::testing::Message() << "d=" << d);
    ExpectSameValue(Fp16BitsToFloat(DoubleToFp16Bits(d)), RefRound(d, kFp16));
    ExpectSameValue(Bf16BitsToFloat(DoubleToBf16Bits(d)), RefRound(d, kBf16));
    if (HasFailure()) break;
  }
}

TEST(FloatFormatsTest, DoubleToBf16AvoidsDoubleRoundingThroughFp32) {
  // d is just above the bf16 tie 1 + 2^-8; fp32 rounds it down onto the tie,
  // and the tie rounds to even (1.0). Rounded once, d goes up.
  const double d = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30);
  ASSERT_EQ(static_cast<float>(d), 1.0f + std::ldexp(1.0f, -8));
  EXPECT_EQ(FloatToBf16Bits(static_cast<float>(d)),
            0x3f80);                       // the double rounding
  EXPECT_EQ(DoubleToBf16Bits(d), 0x3f81);  // 1 + 2^-7
  EXPECT_EQ(DoubleToBf16Bits(-d), 0xbf81);
  // Just below the tie: down, both ways.
  EXPECT_EQ(DoubleToBf16Bits(1.0 + std::ldexp(1.0, -8) - std::ldexp(1.0, -30)), 0x3f80);
  // An odd neighbour: fp32 lands on the tie 1 + 3*2^-8, which goes up to
  // even; rounded once, d (below the tie) goes down.
  const double e = 1.0 + 3 * std::ldexp(1.0, -8) - std::ldexp(1.0, -30);
  ASSERT_EQ(static_cast<float>(e), 1.0f + 3 * std::ldexp(1.0f, -8));
  EXPECT_EQ(DoubleToBf16Bits(e), 0x3f81);
}

TEST(FloatFormatsTest, DoubleToFp16AvoidsDoubleRoundingThroughFp32) {
  const double d = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -30);
  ASSERT_EQ(static_cast<float>(d), 1.0f + std::ldexp(1.0f, -11));
  EXPECT_EQ(FloatToFp16Bits(static_cast<float>(d)), 0x3c00);
  EXPECT_EQ(DoubleToFp16Bits(d), 0x3c01);
  // The overflow tie, approached from above through fp32's rounding.
  EXPECT_EQ(DoubleToFp16Bits(65520.0 - 1e-9), 0x7bff);
  EXPECT_EQ(FloatToFp16Bits(static_cast<float>(65520.0 - 1e-9)), 0x7c00);
}

TEST(FloatFormatsTest, RoundToFp32IsNearestEven) {
  const double tie = 1.0 + std::ldexp(1.0, -24);  // 1 | 1+2^-23
  EXPECT_EQ(RoundToFp32(tie), 1.0f);
  EXPECT_EQ(RoundToFp32(1.0 + 3 * std::ldexp(1.0, -24)), 1.0f + std::ldexp(1.0f, -22));
  EXPECT_EQ(RoundToFp32(1e300), std::numeric_limits<float>::infinity());
}

// ---- FP8: exhaustive over both formats' 256 patterns, against the
// formats' definitions and a brute-force nearest-value search.

// The format definitions and a brute-force nearest search
// (tests/testing/ref_round.h).
double Fp8Formula(uint8_t bits, Fp8Format format) {
  return ::tensorcheck::testing::RefFp8Value(bits, format == Fp8Format::kE4M3Fn);
}

bool Fp8IsNan(uint8_t bits, Fp8Format format) { return std::isnan(Fp8Formula(bits, format)); }

std::optional<uint8_t> NearestFp8(double v, Fp8Format format) {
  const std::optional<int> b =
      ::tensorcheck::testing::RefFp8Nearest(v, format == Fp8Format::kE4M3Fn);
  if (!b) return std::nullopt;
  return static_cast<uint8_t>(*b);
}

class Fp8CodecTest : public ::testing::TestWithParam<Fp8Format> {};

TEST_P(Fp8CodecTest, EveryPatternDecodesToTheFormula) {
  for (int b = 0; b < 256; ++b) {
    SCOPED_TRACE(b);
    ExpectSameValue(Fp8BitsToFloat(static_cast<uint8_t>(b), GetParam()),
                    Fp8Formula(static_cast<uint8_t>(b), GetParam()));
  }
}

TEST_P(Fp8CodecTest, NanCountLargestValueAndSmallestSubnormal) {
  const Fp8Format f = GetParam();
  int nans = 0;
  for (int b = 0; b < 256; ++b) nans += Fp8IsNan(static_cast<uint8_t>(b), f) ? 1 : 0;
  if (f == Fp8Format::kE4M3Fn) {
    EXPECT_EQ(nans, 2);  // 0x7f, 0xff
    EXPECT_EQ(Fp8BitsToFloat(0x7e, f), 448.0f);
    EXPECT_EQ(Fp8BitsToFloat(0x01, f), std::ldexp(1.0f, -9));
  } else {
    EXPECT_EQ(nans, 6);  // 0x7d-0x7f and their negatives
    EXPECT_EQ(Fp8BitsToFloat(0x7b, f), 57344.0f);
    EXPECT_EQ(Fp8BitsToFloat(0x7c, f), std::numeric_limits<float>::infinity());
    EXPECT_EQ(Fp8BitsToFloat(0x01, f), std::ldexp(1.0f, -16));
  }
  EXPECT_EQ(Fp8MaxFinite(f), f == Fp8Format::kE4M3Fn ? 448.0 : 57344.0);
}

TEST_P(Fp8CodecTest, EveryNonNanPatternRoundTrips) {
  const Fp8Format f = GetParam();
  for (int b = 0; b < 256; ++b) {
    const uint8_t bits = static_cast<uint8_t>(b);
    const double v = Fp8BitsToFloat(bits, f);
    if (Fp8IsNan(bits, f)) {
      EXPECT_TRUE(Fp8IsNan(DoubleToFp8Bits(v, f), f)) << b;
      EXPECT_EQ(DoubleToFp8Bits(v, f) & 0x80, bits & 0x80) << b;  // sign kept
      continue;
    }
    EXPECT_EQ(DoubleToFp8Bits(v, f), bits) << b;
    // Saturation keeps every finite pattern; e5m2's infinities become ±max.
    const uint8_t saturated = std::isinf(v) ? static_cast<uint8_t>((bits & 0x80) | 0x7b) : bits;
    EXPECT_EQ(DoubleToFp8Bits(v, f, Fp8Overflow::kSaturate), saturated) << b;
  }
}

// Every midpoint between neighbouring finite values, each side of it, and
// values a third and two thirds of the way: against the brute-force search.
TEST_P(Fp8CodecTest, RoundsToTheNearestValueTiesToEven) {
  const Fp8Format f = GetParam();
  std::vector<double> finite;
  for (int b = 0; b < 128; ++b) {
    const double v = Fp8Formula(static_cast<uint8_t>(b), f);
    if (std::isfinite(v)) finite.push_back(v);
  }
  std::sort(finite.begin(), finite.end());
  const double max = finite.back();
  const double top_step = max - finite[finite.size() - 2];
  finite.push_back(max + top_step);  // one step past: probes the overflow rule
  int checked = 0;
  for (size_t i = 0; i + 1 < finite.size(); ++i) {
    const double a = finite[i], b = finite[i + 1];
    for (double v :
         {(a + b) / 2, std::nextafter((a + b) / 2, 0.0), std::nextafter((a + b) / 2, kInf),
          a + (b - a) / 3, a + 2 * (b - a) / 3, std::ldexp(a, -40)}) {
      for (double s : {1.0, -1.0}) {
        const double x = s * v;
        SCOPED_TRACE(::testing::Message() << "x=" << x);
        const std::optional<uint8_t> want = NearestFp8(x, f);
        const uint8_t got = DoubleToFp8Bits(x, f);
        const uint8_t sat = DoubleToFp8Bits(x, f, Fp8Overflow::kSaturate);
        const uint8_t sign = s < 0 ? 0x80 : 0;
        if (want) {
          EXPECT_EQ(got, *want);
          EXPECT_EQ(sat, *want);
        } else {
          // Beyond the largest value: NaN (e4m3fn) or infinity (e5m2);
          // saturated to the largest.
          EXPECT_EQ(got, sign | (f == Fp8Format::kE4M3Fn ? 0x7f : 0x7c));
          EXPECT_EQ(sat, sign | (f == Fp8Format::kE4M3Fn ? 0x7e : 0x7b));
        }
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 1000);
}

TEST(Fp8Test, OverflowInfinitiesNanAndZeros) {
  using F = Fp8Format;
  // e4m3fn: (448, 464) rounds to 448; 464 is a tie, to even 448; beyond: NaN.
  EXPECT_EQ(DoubleToFp8Bits(463.99, F::kE4M3Fn), 0x7e);
  EXPECT_EQ(DoubleToFp8Bits(464.0, F::kE4M3Fn), 0x7e);
  EXPECT_EQ(DoubleToFp8Bits(464.01, F::kE4M3Fn), 0x7f);
  EXPECT_EQ(DoubleToFp8Bits(-1e30, F::kE4M3Fn), 0xff);
  EXPECT_EQ(DoubleToFp8Bits(kInf, F::kE4M3Fn), 0x7f);
  EXPECT_EQ(DoubleToFp8Bits(-kInf, F::kE4M3Fn, Fp8Overflow::kSaturate), 0xfe);
  // e5m2: the tie at 61440 goes to even, which is 2^16: infinity.
  EXPECT_EQ(DoubleToFp8Bits(61439.0, F::kE5M2), 0x7b);
  EXPECT_EQ(DoubleToFp8Bits(61440.0, F::kE5M2), 0x7c);
  EXPECT_EQ(DoubleToFp8Bits(-kInf, F::kE5M2), 0xfc);
  EXPECT_EQ(DoubleToFp8Bits(kInf, F::kE5M2, Fp8Overflow::kSaturate), 0x7b);
  for (F f : {F::kE4M3Fn, F::kE5M2}) {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    EXPECT_TRUE(Fp8IsNan(DoubleToFp8Bits(nan, f), f));
    EXPECT_TRUE(Fp8IsNan(DoubleToFp8Bits(nan, f, Fp8Overflow::kSaturate), f));
    EXPECT_EQ(DoubleToFp8Bits(-nan, f) & 0x80, 0x80);
    EXPECT_EQ(DoubleToFp8Bits(0.0, f), 0x00);
    EXPECT_EQ(DoubleToFp8Bits(-0.0, f), 0x80);
    // Half the smallest subnormal is a tie with zero: to even, zero.
    const double tiny = f == F::kE4M3Fn ? std::ldexp(1.0, -9) : std::ldexp(1.0, -16);
    EXPECT_EQ(DoubleToFp8Bits(tiny / 2, f), 0x00);
    EXPECT_EQ(DoubleToFp8Bits(std::nextafter(tiny / 2, 1.0), f), 0x01);
    EXPECT_EQ(DoubleToFp8Bits(-1.5 * tiny, f), 0x82);  // tie between 1 and 2: even
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, Fp8CodecTest,
                         ::testing::Values(Fp8Format::kE4M3Fn, Fp8Format::kE5M2),
                         [](const ::testing::TestParamInfo<Fp8Format>& info) {
                           return std::string(info.param == Fp8Format::kE4M3Fn ? "e4m3fn" : "e5m2");
                         });

}  // namespace
}  // namespace tensorcheck
