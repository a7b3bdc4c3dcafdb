#include "server/stats/tolerance.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "tests/testing/status_matchers.h"

namespace tensorcheck {
namespace {

using ::tensorcheck::testing::IsOk;
using ::tensorcheck::testing::StatusIs;
using ::testing::HasSubstr;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNan = std::numeric_limits<double>::quiet_NaN();

TEST(TolerancePresetTest, NamesRoundTrip) {
  for (TolerancePreset p :
       {TolerancePreset::kTorch, TolerancePreset::kNumpy, TolerancePreset::kPolygraphy,
        TolerancePreset::kExplicit, TolerancePreset::kUlp, TolerancePreset::kBound}) {
    auto parsed = ParseTolerancePreset(TolerancePresetName(p));
    ASSERT_THAT(parsed, IsOk());
    EXPECT_EQ(*parsed, p);
  }
  EXPECT_EQ(TolerancePresetName(TolerancePreset::kPolygraphy), "polygraphy");
}

TEST(TolerancePresetTest, UnknownNameIsInvalidArgumentNamingIt) {
  EXPECT_THAT(ParseTolerancePreset("scipy"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"scipy\"")));
  EXPECT_THAT(ParseTolerancePreset(""), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(ResolveToleranceTest, TorchDefaultsFollowAssertClose) {
  struct Case {
    DType dtype;
    double atol, rtol;
  };
  for (const Case& c : {Case{DType::kFloat64, 1e-7, 1e-7}, Case{DType::kFloat32, 1e-5, 1.3e-6},
                        Case{DType::kFloat16, 1e-5, 1e-3}, Case{DType::kBFloat16, 1e-5, 1.6e-2}}) {
    Tolerance t = ResolveTolerance(TolerancePreset::kTorch, c.dtype);
    EXPECT_EQ(t.preset, TolerancePreset::kTorch);
    EXPECT_EQ(t.atol, c.atol) << DTypeName(c.dtype);
    EXPECT_EQ(t.rtol, c.rtol) << DTypeName(c.dtype);
  }
}

TEST(ResolveToleranceTest, NumpyPolygraphyExplicitDefaults) {
  Tolerance np = ResolveTolerance(TolerancePreset::kNumpy, DType::kFloat16);
  EXPECT_EQ(np.atol, 0.0);
  EXPECT_EQ(np.rtol, 1e-7);
  Tolerance pg = ResolveTolerance(TolerancePreset::kPolygraphy, DType::kFloat32);
  EXPECT_EQ(pg.atol, 1e-5);
  EXPECT_EQ(pg.rtol, 1e-5);
  Tolerance ex = ResolveTolerance(TolerancePreset::kExplicit, DType::kFloat32);
  EXPECT_EQ(ex.atol, 0.0);
  EXPECT_EQ(ex.rtol, 0.0);
  Tolerance ex2 = ResolveTolerance(TolerancePreset::kExplicit, DType::kFloat32,
                                   /*atol=*/0.5, /*rtol=*/std::nullopt);
  EXPECT_EQ(ex2.atol, 0.5);
  EXPECT_EQ(ex2.rtol, 0.0);
}

TEST(ResolveToleranceTest, OverridesReplaceDefaultsAndCarryOptions) {
  Tolerance t = ResolveTolerance(TolerancePreset::kTorch, DType::kBFloat16,
                                 /*atol=*/1e-3, /*rtol=*/0.25, /*max_ulp=*/4,
                                 /*bound_factor=*/3.0, /*nan_equal=*/true);
  EXPECT_EQ(t.atol, 1e-3);
  EXPECT_EQ(t.rtol, 0.25);
  EXPECT_EQ(t.max_ulp, 4u);
  EXPECT_EQ(t.bound_factor, 3.0);
  EXPECT_TRUE(t.nan_equal);
}

TEST(ElementPassesTest, TorchAtolBoundaryAtZeroReference) {
  Tolerance t = ResolveTolerance(TolerancePreset::kTorch, DType::kFloat32);
  // e = 0: the threshold is exactly atol = 1e-5.
  EXPECT_TRUE(ElementPasses(t, 1e-5, 0.0, 0, 0));
  EXPECT_TRUE(ElementPasses(t, -1e-5, 0.0, 0, 0));
  EXPECT_FALSE(ElementPasses(t, std::nextafter(1e-5, 1.0), 0.0, 0, 0));
}

TEST(ElementPassesTest, TorchBf16RtolBoundary) {
  Tolerance t = ResolveTolerance(TolerancePreset::kTorch, DType::kBFloat16,
                                 /*atol=*/0.0);
  // atol 0, rtol 1.6e-2, e = 0.5: threshold 8e-3.
  EXPECT_TRUE(ElementPasses(t, 0.5 + 0.99 * 8e-3, 0.5, 0, 0));
  EXPECT_FALSE(ElementPasses(t, 0.5 + 1.01 * 8e-3, 0.5, 0, 0));
  // Relative to |e|, not |a|: a negative reference works the same way.
  EXPECT_TRUE(ElementPasses(t, -0.5 - 0.99 * 8e-3, -0.5, 0, 0));
}

TEST(ElementPassesTest, TorchSumsAtolAndRtol) {
  // fp32: atol 1e-5 + rtol 1.3e-6 * 10 = 2.3e-5.
  Tolerance t = ResolveTolerance(TolerancePreset::kTorch, DType::kFloat32);
  EXPECT_TRUE(ElementPasses(t, 10 + 2.2e-5, 10, 0, 0));
  EXPECT_FALSE(ElementPasses(t, 10 + 2.4e-5, 10, 0, 0));
}

TEST(ElementPassesTest, ExplicitRtolBoundaryIsExact) {
  Tolerance t = ResolveTolerance(TolerancePreset::kExplicit, DType::kFloat32,
                                 /*atol=*/0.0, /*rtol=*/0.5);
  // |3 - 2| = 1 = 0.5 * 2, all exact in binary.
  EXPECT_TRUE(ElementPasses(t, 3.0, 2.0, 0, 0));
  EXPECT_FALSE(ElementPasses(t, std::nextafter(3.0, 4.0), 2.0, 0, 0));
  EXPECT_TRUE(ElementPasses(t, 1.0, 2.0, 0, 0));
  EXPECT_FALSE(ElementPasses(t, 1.0 - 0x1p-52, 2.0, 0, 0));  // |d| = 1 + 2^-52
}

TEST(ElementPassesTest, NumpyHasNoAtolSoZeroReferenceNeedsExactZero) {
  Tolerance t = ResolveTolerance(TolerancePreset::kNumpy, DType::kFloat32);
  EXPECT_TRUE(ElementPasses(t, 0.0, 0.0, 0, 0));
  EXPECT_TRUE(ElementPasses(t, -0.0, 0.0, 0, 0));
  EXPECT_FALSE(ElementPasses(t, 1e-300, 0.0, 0, 0));
  // rtol 1e-7 at e = 1.
  EXPECT_TRUE(ElementPasses(t, 1.0 + 0.99e-7, 1.0, 0, 0));
  EXPECT_FALSE(ElementPasses(t, 1.0 + 1.01e-7, 1.0, 0, 0));
}

TEST(ElementPassesTest, PolygraphyPassesOnEitherAbsOrRel) {
  Tolerance pg = ResolveTolerance(TolerancePreset::kPolygraphy, DType::kFloat32);
  // abs 5e-3 > atol, rel 5e-6 <= 1e-5: passes on rel.
  EXPECT_TRUE(ElementPasses(pg, 1000.005, 1000.0, 0, 0));
  // abs 9e-6 <= atol at a tiny reference (rel 9): passes on abs.
  EXPECT_TRUE(ElementPasses(pg, 1e-6 + 9e-6, 1e-6, 0, 0));
  // abs 1.5e-5 and rel 1.5e-5 both above 1e-5: fails, although the torch
  // form with the same numbers (1.5e-5 <= 1e-5 + 1e-5) would pass.
  EXPECT_FALSE(ElementPasses(pg, 1.0 + 1.5e-5, 1.0, 0, 0));
  Tolerance sum_form = ResolveTolerance(TolerancePreset::kExplicit, DType::kFloat32, 1e-5, 1e-5);
  EXPECT_TRUE(ElementPasses(sum_form, 1.0 + 1.5e-5, 1.0, 0, 0));
}

TEST(ElementPassesTest, PolygraphyAtZeroReferenceFallsBackToAtol) {
  Tolerance pg = ResolveTolerance(TolerancePreset::kPolygraphy, DType::kFloat32,
                                  /*atol=*/0.0);
  // rel at e == 0 is +inf unless a == 0.
  EXPECT_TRUE(ElementPasses(pg, 0.0, 0.0, 0, 0));
  EXPECT_FALSE(ElementPasses(pg, 1e-30, 0.0, 0, 0));
}

TEST(ElementPassesTest, UlpPresetComparesDistanceToMaxUlp) {
  Tolerance t = ResolveTolerance(TolerancePreset::kUlp, DType::kFloat32, std::nullopt, std::nullopt,
                                 /*max_ulp=*/2);
  EXPECT_TRUE(ElementPasses(t, 1.0, 100.0, 0, /*ulp=*/2));
  EXPECT_FALSE(ElementPasses(t, 1.0, 1.0, 0, /*ulp=*/3));
}

TEST(ElementPassesTest, BoundPresetScalesTheBoundByItsFactor) {
  Tolerance t =
      ResolveTolerance(TolerancePreset::kBound, DType::kFloat32, std::nullopt, std::nullopt, 0,
                       /*bound_factor=*/2.0);
  // threshold 2 * 0.5 = 1.
  EXPECT_TRUE(ElementPasses(t, 2.0, 1.0, /*bound=*/0.5, 0));
  EXPECT_FALSE(ElementPasses(t, std::nextafter(2.0, 3.0), 1.0, 0.5, 0));
}

TEST(ElementPassesTest, EqualInfinitiesPassOthersFail) {
  Tolerance t = ResolveTolerance(TolerancePreset::kTorch, DType::kFloat32,
                                 /*atol=*/kInf);
  EXPECT_TRUE(ElementPasses(t, kInf, kInf, 0, 0));
  EXPECT_TRUE(ElementPasses(t, -kInf, -kInf, 0, 0));
  EXPECT_FALSE(ElementPasses(t, kInf, -kInf, 0, 0));
  EXPECT_FALSE(ElementPasses(t, 1e308, kInf, 0, 0));
  EXPECT_FALSE(ElementPasses(t, kInf, 1.0, 0, 0));
  Tolerance ulp =
      ResolveTolerance(TolerancePreset::kUlp, DType::kFloat32, std::nullopt, std::nullopt, 1000);
  EXPECT_FALSE(ElementPasses(ulp, kInf, 3.4e38, 0, /*ulp=*/1));
}

TEST(ElementPassesTest, NanPassesOnlyAgainstNanWhenNanEqual) {
  Tolerance t = ResolveTolerance(TolerancePreset::kTorch, DType::kFloat32);
  EXPECT_FALSE(ElementPasses(t, kNan, kNan, 0, 0));
  EXPECT_FALSE(ElementPasses(t, kNan, 1.0, 0, 0));
  EXPECT_FALSE(ElementPasses(t, 1.0, kNan, 0, 0));
  Tolerance eq =
      ResolveTolerance(TolerancePreset::kTorch, DType::kFloat32, std::nullopt, std::nullopt, 0, 1.0,
                       /*nan_equal=*/true);
  EXPECT_TRUE(ElementPasses(eq, kNan, kNan, 0, 0));
  EXPECT_FALSE(ElementPasses(eq, kNan, 1.0, 0, 0));
  EXPECT_FALSE(ElementPasses(eq, kNan, kInf, 0, 0));
  Tolerance ulp =
      ResolveTolerance(TolerancePreset::kUlp, DType::kFloat32, std::nullopt, std::nullopt, 5);
  EXPECT_FALSE(ElementPasses(ulp, kNan, 1.0, 0, 0));
}

}  // namespace
}  // namespace tensorcheck
