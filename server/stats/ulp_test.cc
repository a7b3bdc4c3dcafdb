// ULP distances and bit patterns (ulp.h), against hand-computed values.
#include "server/stats/ulp.h"

#include <gtest/gtest.h>

#include <limits>

#include "core/dtype.h"

namespace tensorcheck {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(UlpDistanceTest, SmallestSubnormalsOfOppositeSignAreTwoApart) {
  const double tiny = std::numeric_limits<float>::denorm_min();  // 2^-149
  EXPECT_EQ(UlpDistance(tiny, -tiny, DType::kFloat32), 2u);
  EXPECT_EQ(UlpDistance(0x1p-24, -0x1p-24, DType::kFloat16), 2u);
  EXPECT_EQ(UlpDistance(0x1p-133, -0x1p-133, DType::kBFloat16), 2u);
  EXPECT_EQ(UlpDistance(0x1p-1074, -0x1p-1074, DType::kFloat64), 2u);
}

TEST(UlpDistanceTest, SignedZerosAreZeroApart) {
  for (DType d : kWideDTypes) {
    EXPECT_EQ(UlpDistance(0.0, -0.0, d), 0u) << DTypeName(d);
  }
  EXPECT_EQ(UlpDistance(-0.0, std::numeric_limits<float>::denorm_min(), DType::kFloat32), 1u);
}

TEST(UlpDistanceTest, AdjacentValuesAreOneApartInEachDType) {
  EXPECT_EQ(UlpDistance(1.0, 1.0 + 0x1p-52, DType::kFloat64), 1u);
  EXPECT_EQ(UlpDistance(1.0, 1.0 + 0x1p-23, DType::kFloat32), 1u);
  EXPECT_EQ(UlpDistance(1.0, 1.0 + 0x1p-10, DType::kFloat16), 1u);
  EXPECT_EQ(UlpDistance(1.0, 1.0 + 0x1p-7, DType::kBFloat16), 1u);
  // Across a binade: 2 - 2^-23 and 2 + 2^-22 are 2 fp32 values apart.
  EXPECT_EQ(UlpDistance(2.0 - 0x1p-23, 2.0 + 0x1p-22, DType::kFloat32), 2u);
  // Largest finite to infinity is one step.
  EXPECT_EQ(UlpDistance(std::numeric_limits<float>::max(), kInf, DType::kFloat32), 1u);
}

TEST(UlpDistanceTest, RoundsToTheComparedDTypeFirst) {
  // 1 + 2^-9 is below bf16's half step: rounds to 1.0.
  EXPECT_EQ(UlpDistance(1.0, 1.0 + 0x1p-9, DType::kBFloat16), 0u);
  // 1 + 2^-8 is a tie: to even, 1.0.
  EXPECT_EQ(UlpDistance(1.0, 1.0 + 0x1p-8, DType::kBFloat16), 0u);
  // 1 + 3*2^-8 is a tie between 1+2^-7 (odd) and 1+2^-6 (even).
  EXPECT_EQ(UlpDistance(1.0, 1.0 + 3 * 0x1p-8, DType::kBFloat16), 2u);
}

TEST(UlpDistanceTest, NanAgainstNumberIsInfiniteNanAgainstNanIsZero) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (DType d : kWideDTypes) {
    EXPECT_EQ(UlpDistance(nan, 1.0, d), kUlpInfinite) << DTypeName(d);
    EXPECT_EQ(UlpDistance(-kInf, nan, d), kUlpInfinite) << DTypeName(d);
    EXPECT_EQ(UlpDistance(nan, -nan, d), 0u) << DTypeName(d);
  }
}

TEST(BitsInTest, RoundsToNearestEvenInEachDType) {
  EXPECT_EQ(BitsIn(1.0, DType::kFloat64), 0x3ff0000000000000u);
  EXPECT_EQ(BitsIn(1.0, DType::kFloat32), 0x3f800000u);
  EXPECT_EQ(BitsIn(-2.0, DType::kFloat16), 0xc000u);
  EXPECT_EQ(BitsIn(1.0 + 0x1p-8, DType::kBFloat16), 0x3f80u);
  EXPECT_EQ(BitsIn(1.0 + 0x1p-8 + 0x1p-30, DType::kBFloat16), 0x3f81u);
  EXPECT_EQ(BitsIn(65520.0, DType::kFloat16), 0x7c00u);  // overflows to inf
}

}  // namespace
}  // namespace tensorcheck
