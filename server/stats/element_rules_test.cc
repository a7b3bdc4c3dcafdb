// The rules host and device share (element_rules.h), against values derived
// by hand from each format's fields and against independent loops: the
// layouts, the ULP distance (counted by nextafter steps), the histogram
// bucket (the smallest power of two at or above a distance), the portable
// intrinsics of core/host_device.h, and the tolerance rules at their
// boundaries. The device comparison's tests (CompareThreadTest,
// NarrowPatternsTest) hold its code to the same definitions.
#include "server/stats/element_rules.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/host_device.h"
#include "server/stats/internal/ulp_bits.h"

namespace tensorcheck::rules {
namespace {

constexpr ElemType kAllTypes[] = {ElemType::kF64, ElemType::kF32, ElemType::kF16, ElemType::kBF16};

// Width, exponent and mantissa bits of each format (IEEE 754 binary64,
// binary32, binary16; bfloat16).
struct Format {
  int width, exponent_bits, mantissa_bits;
};

Format FormatOf(ElemType t) {
  switch (t) {
    case ElemType::kF64:
      return {64, 11, 52};
    case ElemType::kF32:
      return {32, 8, 23};
    case ElemType::kF16:
      return {16, 5, 10};
    case ElemType::kBF16:
      return {16, 8, 7};
  }
  return {0, 0, 0};
}

TEST(ElementRulesTest, LayoutsFollowEachFormatsFields) {
  for (ElemType t : kAllTypes) {
    const Format f = FormatOf(t);
    const uint64_t sign = uint64_t{1} << (f.width - 1);
    const uint64_t inf = ((uint64_t{1} << f.exponent_bits) - 1) << f.mantissa_bits;
    const BitLayout l = LayoutOf(t);
    EXPECT_EQ(l.sign, sign) << static_cast<int>(t);
    EXPECT_EQ(l.magnitude, sign - 1) << static_cast<int>(t);
    EXPECT_EQ(l.inf, inf) << static_cast<int>(t);
  }
  // Known patterns of +inf, and LayoutOf is usable at compile time (the
  // device's narrow masks are built from it).
  static_assert(LayoutOf(ElemType::kF64).inf == 0x7ff0000000000000u);
  static_assert(LayoutOf(ElemType::kF32).inf == 0x7f800000u);
  static_assert(LayoutOf(ElemType::kF16).inf == 0x7c00u);
  static_assert(LayoutOf(ElemType::kBF16).inf == 0x7f80u);
}

TEST(ElementRulesTest, StatsTypesMapOntoTheSameLayouts) {
  EXPECT_EQ(internal::LayoutOf(DType::kFloat64).inf, 0x7ff0000000000000u);
  EXPECT_EQ(internal::LayoutOf(DType::kFloat32).inf, 0x7f800000u);
  EXPECT_EQ(internal::LayoutOf(DType::kFloat16).inf, 0x7c00u);
  EXPECT_EQ(internal::LayoutOf(DType::kBFloat16).inf, 0x7f80u);
}

uint64_t Bits(double v) {
  uint64_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}
uint64_t Bits(float v) {
  uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

// Walks up from each start by nextafter and checks that the distance from
// the start is the number of steps taken, both ways round.
template <typename T>
void CheckStepsFrom(const std::vector<T>& starts, ElemType t) {
  const BitLayout l = LayoutOf(t);
  for (T a : starts) {
    T b = a;
    for (uint64_t steps = 0; steps <= 300; ++steps) {
      ASSERT_EQ(DistanceFromBits(Bits(a), Bits(b), l), steps) << a << " " << b;
      ASSERT_EQ(DistanceFromBits(Bits(b), Bits(a), l), steps) << a << " " << b;
      const T next = std::nextafter(b, std::numeric_limits<T>::infinity());
      if (std::isinf(next)) {
        ASSERT_EQ(DistanceFromBits(Bits(a), Bits(next), l), steps + 1);  // infinity is one more
        break;
      }
      b = next == 0 ? T{0} : next;  // from the least negative subnormal, 0 of either sign
    }
  }
}

TEST(ElementRulesTest, DistanceCountsNextafterSteps) {
  const double dmin = std::numeric_limits<double>::denorm_min();
  const double dmax = std::numeric_limits<double>::max();
  CheckStepsFrom<double>(
      {0.0, -0.0, dmin, -dmin, 1.0, -1.0, 0x1p-1022, -dmax, dmax * (1 - 0x1p-45)}, ElemType::kF64);
  const float fmin = std::numeric_limits<float>::denorm_min();
  const float fmax = std::numeric_limits<float>::max();
  CheckStepsFrom<float>({0.0f, -0.0f, fmin, -fmin, 1.0f, -1.0f, 0x1p-126f, -fmax, 0x1.fffep127f},
                        ElemType::kF32);
}

TEST(ElementRulesTest, DistanceCountsAcrossZero) {
  // -x to +x is twice x's distance from 0; +0 and -0 coincide.
  for (ElemType t : kAllTypes) {
    const BitLayout l = LayoutOf(t);
    for (uint64_t m : {uint64_t{1}, uint64_t{2}, l.inf - 1, l.inf}) {
      EXPECT_EQ(DistanceFromBits(m, l.sign | m, l), 2 * m) << static_cast<int>(t);
    }
    EXPECT_EQ(DistanceFromBits(0, l.sign, l), 0u) << static_cast<int>(t);
    // -inf to +inf: every finite value and both infinities' steps.
    EXPECT_EQ(DistanceFromBits(l.sign | l.inf, l.inf, l), 2 * l.inf) << static_cast<int>(t);
  }
}

TEST(ElementRulesTest, NanIsInfinitelyFarFromNumbersAndZeroFromNan) {
  for (ElemType t : kAllTypes) {
    const BitLayout l = LayoutOf(t);
    const uint64_t nans[] = {l.inf + 1, l.magnitude, l.sign | (l.inf + 1), l.sign | l.magnitude};
    const uint64_t numbers[] = {0, l.sign, 1, l.inf, l.sign | l.inf, l.inf - 1};
    for (uint64_t n : nans) {
      for (uint64_t x : numbers) {
        EXPECT_EQ(DistanceFromBits(n, x, l), kUlpInfinite) << static_cast<int>(t);
        EXPECT_EQ(DistanceFromBits(x, n, l), kUlpInfinite) << static_cast<int>(t);
      }
      for (uint64_t m : nans) EXPECT_EQ(DistanceFromBits(n, m, l), 0u) << static_cast<int>(t);
    }
  }
}

// DistanceFromBits repeats OrderedDistance rather than calling it (the
// kernels' code is laid out for that form): the two agree on every pair
// without a NaN.
TEST(ElementRulesTest, DistanceIsOrderedDistanceWithoutNan) {
  std::mt19937_64 rng(7);
  for (ElemType t : kAllTypes) {
    const BitLayout l = LayoutOf(t);
    const uint64_t width_mask = l.sign | l.magnitude;
    int64_t checked = 0;
    for (int k = 0; k < 200000; ++k) {
      const uint64_t a = rng() & width_mask, b = rng() & width_mask;
      if ((a & l.magnitude) > l.inf || (b & l.magnitude) > l.inf) continue;
      ASSERT_EQ(DistanceFromBits(a, b, l), OrderedDistance(a, b, l)) << std::hex << a << " " << b;
      ++checked;
    }
    EXPECT_GT(checked, 1000) << static_cast<int>(t);
  }
}

// The portable kernel's ordered integers (internal/ulp_bits.h) differ by
// OrderedDistance.
TEST(ElementRulesTest, OrderedIntDifferencesAreOrderedDistances) {
  std::mt19937_64 rng(9);
  for (ElemType t : {ElemType::kF32, ElemType::kF16, ElemType::kBF16}) {
    const BitLayout l = LayoutOf(t);
    const int width = t == ElemType::kF32 ? 32 : 16;
    for (int k = 0; k < 200000; ++k) {
      const uint64_t a = rng() & (l.sign | l.magnitude), b = rng() & (l.sign | l.magnitude);
      if ((a & l.magnitude) > l.inf || (b & l.magnitude) > l.inf) continue;
      const int64_t oa = internal::OrderedInt(a, width), ob = internal::OrderedInt(b, width);
      ASSERT_EQ(static_cast<uint64_t>(oa > ob ? oa - ob : ob - oa), OrderedDistance(a, b, l))
          << std::hex << a << " " << b;
    }
  }
}

// The bucket by its definition: 0 for 0, else the smallest i with
// d <= 2^(i-1).
int BucketByLoop(uint64_t d) {
  if (d == 0) return 0;
  int i = 1;
  while (i - 1 < 64 && d > (uint64_t{1} << (i - 1))) ++i;
  return i;
}

TEST(ElementRulesTest, BucketIsTheSmallestPowerOfTwoAtOrAbove) {
  EXPECT_EQ(BucketIndex(0), 0);
  EXPECT_EQ(BucketIndex(1), 1);
  EXPECT_EQ(BucketIndex(2), 2);
  EXPECT_EQ(BucketIndex(3), 3);
  EXPECT_EQ(BucketIndex(4), 3);
  EXPECT_EQ(BucketIndex(5), 4);
  EXPECT_EQ(BucketIndex(kUlpInfinite - 1), kUlpBuckets - 1);
  for (uint64_t d = 0; d <= 70000; ++d) ASSERT_EQ(BucketIndex(d), BucketByLoop(d)) << d;
  for (int k = 0; k < 64; ++k) {
    const uint64_t p = uint64_t{1} << k;
    for (uint64_t d : {p - 1, p, p + 1}) ASSERT_EQ(BucketIndex(d), BucketByLoop(d)) << d;
  }
  std::mt19937_64 rng(3);
  for (int k = 0; k < 100000; ++k) {
    const uint64_t d = rng() >> (rng() % 64);
    ASSERT_EQ(BucketIndex(d), BucketByLoop(d)) << d;
  }
}

TEST(HostDeviceTest, CountLeadingZerosAgreesWithALoop) {
  std::mt19937_64 rng(5);
  for (int k = 0; k < 100000; ++k) {
    const uint64_t v = (rng() >> (rng() % 64)) | (k < 64 ? uint64_t{1} << k : 0);
    if (v == 0) continue;
    int zeros = 0;
    while ((v & (uint64_t{1} << (63 - zeros))) == 0) ++zeros;
    ASSERT_EQ(CountLeadingZeros64(v), zeros) << std::hex << v;
  }
}

// Limits of the rules' own (any struct with these fields will do).
struct Limits {
  double atol = 0, rtol = 0;
  uint64_t max_ulp = 0;
  double bound_factor = 1;
};

TEST(ElementRulesTest, AbsPlusRelRoundsTheLimitTwiceNeverFused) {
  // atol + rtol|e| for this e: the product rounded, then the sum, is
  // 0x1.064f102363b25p-6; one fused rounding would give ...b26p-6.
  const Limits l{/*atol=*/1e-5, /*rtol=*/1.6e-2};
  const double e = 0x1.00004p+0;
  const double twice = 0x1.064f102363b25p-6, fused = 0x1.064f102363b26p-6;
  ASSERT_EQ(std::fma(l.rtol, e, l.atol), fused);  // the case tells the two apart
  EXPECT_TRUE(FinitePairPasses<ToleranceRule::kAbsPlusRel>(l, twice, e, 0, 0));
  EXPECT_FALSE(FinitePairPasses<ToleranceRule::kAbsPlusRel>(l, fused, e, 0, 0));
  EXPECT_EQ(AddRn(l.atol, MulRn(l.rtol, e)), twice);
}

TEST(ElementRulesTest, AbsOrRelPassesOnEitherAndAtZeroOnlyWhenEqual) {
  const Limits l{/*atol=*/1e-3, /*rtol=*/1e-2};
  EXPECT_TRUE(FinitePairPasses<ToleranceRule::kAbsOrRel>(l, 1e-3, 0.05, 0, 0));         // atol
  EXPECT_TRUE(FinitePairPasses<ToleranceRule::kAbsOrRel>(l, 0.5, 50.0, 0, 0));          // rtol
  EXPECT_FALSE(FinitePairPasses<ToleranceRule::kAbsOrRel>(l, 0.5 + 1e-9, 50.0, 0, 0));  // neither
  const Limits no_atol{/*atol=*/0, /*rtol=*/1e-2};
  EXPECT_TRUE(FinitePairPasses<ToleranceRule::kAbsOrRel>(no_atol, 0.0, 0.0, 0, 0));
  EXPECT_FALSE(FinitePairPasses<ToleranceRule::kAbsOrRel>(no_atol, 1e-300, 0.0, 0, 0));
}

TEST(ElementRulesTest, UlpAndBoundRulesCompareWithTheirLimits) {
  Limits l;
  l.max_ulp = 3;
  l.bound_factor = 2;
  EXPECT_TRUE(FinitePairPasses<ToleranceRule::kUlp>(l, 1e9, 1.0, 0, 3));
  EXPECT_FALSE(FinitePairPasses<ToleranceRule::kUlp>(l, 0.0, 1.0, 0, 4));
  EXPECT_TRUE(FinitePairPasses<ToleranceRule::kBound>(l, 0.5, 1.0, /*bound=*/0.25, 0));
  EXPECT_FALSE(FinitePairPasses<ToleranceRule::kBound>(l, 0.5 + 1e-12, 1.0, 0.25, 0));
}

}  // namespace
}  // namespace tensorcheck::rules
