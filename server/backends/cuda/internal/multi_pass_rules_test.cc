// The multi-pass rules of the CUDA backends (multi_pass_rules.h) and the
// host/device code their kernels run (core/multi_pass_split.h: the split and
// one step of the partial sums), on the host. Expected values are worked out
// by hand from the definitions in docs/numerics.md, "Multi-pass precisions".
#include "server/backends/cuda/internal/multi_pass_rules.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/float_formats.h"
#include "core/multi_pass_split.h"
#include "tests/testing/status_matchers.h"

namespace tensorcheck::cuda::internal {
namespace {

using ::tensorcheck::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr ComputeCapability kAmpere{8, 0};
constexpr ComputeCapability kHopper{9, 0};
constexpr ComputeCapability kBlackwell{10, 0};
constexpr ComputeCapability kBlackwellGeForce{12, 0};

MultiPassQuery Query(const std::string& backend, Precision p,
                     std::optional<ComputeCapability> device = kHopper) {
  MultiPassQuery q;
  q.config.backend = backend;
  q.config.precision = p;
  q.config.bias = backend == "cublaslt" ? BiasMode::kFused : BiasMode::kUnfused;
  q.device = device;
  return q;
}

TEST(MultiPassRules, CublasltRunsEveryMultiPassPrecisionAsXlasPartialGemms) {
  struct Case {
    Precision p;
    size_t passes;
    int parts;
    DType part;
    PartCompute compute;
  };
  const Case cases[] = {
      {Precision::kBf16x3, 3, 2, DType::kBFloat16, PartCompute::k32F},
      {Precision::kBf16x6, 6, 3, DType::kBFloat16, PartCompute::k32F},
      {Precision::kBf16x9, 9, 3, DType::kBFloat16, PartCompute::k32F},
      {Precision::kTf32x3, 3, 2, DType::kFloat32, PartCompute::k32FFastTf32},
  };
  for (const Case& c : cases) {
    for (ComputeCapability cc : {kAmpere, kHopper, kBlackwell}) {
      absl::StatusOr<MultiPassGemm> g = CheckMultiPass(Query("cublaslt", c.p, cc));
      ASSERT_TRUE(g.ok()) << g.status();
      EXPECT_EQ(g->method, MultiPassMethod::kPartialGemms);
      EXPECT_EQ(g->scheme.products.size(), c.passes) << PrecisionName(c.p);
      EXPECT_EQ(g->scheme.parts, c.parts);
      EXPECT_EQ(g->part, c.part);
      EXPECT_EQ(g->compute, c.compute);
      // High x high is always the last partial (after the NaN guard).
      EXPECT_EQ(g->scheme.products.back(), (std::pair<int, int>{0, 0}));
    }
  }
  EXPECT_TRUE(CheckMultiPass(Query("cublaslt", Precision::kBf16x9, std::nullopt)).ok());
}

TEST(MultiPassRules, CublasRunsItsOwnBf16x9EmulationOnBlackwellAndWithoutADevice) {
  for (std::optional<ComputeCapability> cc :
       {std::optional<ComputeCapability>(kBlackwell),
        std::optional<ComputeCapability>(kBlackwellGeForce),
        std::optional<ComputeCapability>(ComputeCapability{10, 3}),
        std::optional<ComputeCapability>()}) {
    absl::StatusOr<MultiPassGemm> g = CheckMultiPass(Query("cublas", Precision::kBf16x9, cc));
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_EQ(g->method, MultiPassMethod::kCublasEmulatedBf16x9);
    EXPECT_EQ(g->part, DType::kFloat32);
    EXPECT_EQ(g->compute, PartCompute::k32FEmulated16BFx9);
  }
}

TEST(MultiPassRules, CublasBf16x9BeforeBlackwellIsFailedPreconditionNamingTheRule) {
  for (ComputeCapability cc : {kAmpere, kHopper, ComputeCapability{8, 9}}) {
    EXPECT_THAT(CheckMultiPass(Query("cublas", Precision::kBf16x9, cc)).status(),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         AllOf(HasSubstr("cublas:bf16x9:unfused"),
                               HasSubstr("CUBLAS_COMPUTE_32F_EMULATED_16BFX9"),
                               HasSubstr("compute capability 10.0 or later"),
                               HasSubstr(absl::StrCat("this device is ", cc.major, ".", cc.minor)),
                               HasSubstr("cublaslt:bf16x9"))));
  }
}

TEST(MultiPassRules, CublasHasNoOtherMultiPassPrecisionAndNamesCublaslt) {
  for (Precision p : {Precision::kBf16x3, Precision::kBf16x6, Precision::kTf32x3}) {
    EXPECT_THAT(CheckMultiPass(Query("cublas", p, kBlackwell)).status(),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         AllOf(HasSubstr("BF16x9 only"),
                               HasSubstr(absl::StrCat("cublaslt:", PrecisionName(p))))))
        << PrecisionName(p);
  }
}

TEST(MultiPassRules, OtherPrecisionsAndBackendsAreInvalidArgument) {
  EXPECT_THAT(CheckMultiPass(Query("cublaslt", Precision::kFp32)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a multi-pass")));
  EXPECT_THAT(CheckMultiPass(Query("cpu", Precision::kBf16x3)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'cpu'")));
}

TEST(MultiPassRules, PartComputeNamesAreCublasNames) {
  EXPECT_STREQ(PartComputeName(PartCompute::k32F), "CUBLAS_COMPUTE_32F");
  EXPECT_STREQ(PartComputeName(PartCompute::k32FFastTf32), "CUBLAS_COMPUTE_32F_FAST_TF32");
  EXPECT_STREQ(PartComputeName(PartCompute::k32FEmulated16BFx9),
               "CUBLAS_COMPUTE_32F_EMULATED_16BFX9");
}

// ---- The split kernel's and the sum kernel's per-element code.

struct Split {
  float v;
  int parts;
  bool tf32;
  float expected[3];
};

TEST(MultiPassSplit, PartsAreCutTowardZeroThenTheLastRounded) {
  const Split cases[] = {
      // bf16, 2 parts: 1 + 2^-10 + 2^-20: hi cut to 1; lo = bf16(2^-10 + 2^-20) = 2^-10.
      {1.0f + 0x1p-10f + 0x1p-20f, 2, false, {1.0f, 0x1p-10f}},
      // 3 parts keep every bit: 1, 2^-10, 2^-20.
      {1.0f + 0x1p-10f + 0x1p-20f, 3, false, {1.0f, 0x1p-10f, 0x1p-20f}},
      // 1 + 255/256 is a bf16 tie (nearest even would give 2): cut toward
      // zero, hi = 1 + 127/128 and lo = 2^-8.
      {1.99609375f, 2, false, {1.9921875f, 0x1p-8f}},
      // Negative values are cut toward zero too.
      {-(1.0f + 0x1p-10f), 2, false, {-1.0f, -0x1p-10f}},
      // The last bf16 part rounds to nearest even: rest = 2^-9 (1 + 2^-8)
      // is a tie that goes to the even 2^-9 ...
      {1.0f + 0x1p-9f + 0x1p-17f, 2, false, {1.0f, 0x1p-9f}},
      // ... and 2^-9 (1 + 2^-7 + 2^-8) one that goes up, to 2^-9 (1 + 2^-6).
      {1.0f + 0x1p-9f + 0x1p-16f + 0x1p-17f, 2, false, {1.0f, 0x1p-9f + 0x1p-15f}},
      // TF32 (tf32x3): the high part ties away (1 + 2^-11 -> 1 + 2^-10), the
      // remainder -2^-11 is a TF32 value.
      {1.0f + 0x1p-11f, 2, true, {1.0f + 0x1p-10f, -0x1p-11f}},
      // ... and the low part is truncated: 2^-12 (1 + 2^-11) -> 2^-12.
      {1.0f + 0x1p-12f + 0x1p-23f, 2, true, {1.0f, 0x1p-12f}},
      {0.0f, 3, false, {0.0f, 0.0f, 0.0f}},
  };
  for (const Split& c : cases) {
    float parts[3] = {-7.0f, -7.0f, -7.0f};
    SplitMultiPassValue(c.parts, c.tf32, c.v, parts);
    for (int i = 0; i < c.parts; ++i) {
      EXPECT_EQ(parts[i], c.expected[i]) << "v=" << c.v << " part " << i;
    }
  }
}

TEST(MultiPassSplit, AnInfiniteOperandLeavesNaNLowPartsForTheGuard) {
  const float inf = std::numeric_limits<float>::infinity();
  float parts[3];
  SplitMultiPassValue(3, false, inf, parts);
  EXPECT_EQ(parts[0], inf);
  EXPECT_TRUE(std::isnan(parts[1]));
  EXPECT_TRUE(std::isnan(parts[2]));
  SplitMultiPassValue(2, true, -inf, parts);
  EXPECT_EQ(parts[0], -inf);
  EXPECT_TRUE(std::isnan(parts[1]));
}

TEST(MultiPassSplit, BitHelpersAgreeWithTheHostsBf16Functions) {
  // Every 2^12-th bit pattern, all NaN payloads near the top included.
  for (uint64_t b = 0; b <= 0xffffffffull; b += 0x1001) {
    const uint32_t u = static_cast<uint32_t>(b);
    const float f = BitsToFloat(u);
    EXPECT_EQ(FloatBits(multi_pass::NearestBf16(f)), FloatBits(RoundToBf16(f))) << std::hex << u;
    EXPECT_EQ(FloatBits(multi_pass::CutToBf16(f)), FloatBits(TruncateToBf16(f))) << std::hex << u;
  }
}

TEST(MultiPassSplit, TheGuardZeroesNaNAndKeepsInfinitiesBeforeTheLastPartial) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(AddPartial(nan, 1.5f, /*guard=*/true), 1.5f);
  EXPECT_TRUE(std::isnan(AddPartial(nan, 1.5f, /*guard=*/false)));
  EXPECT_EQ(AddPartial(inf, 1.5f, /*guard=*/true), inf);
  EXPECT_EQ(AddPartial(-inf, 1.5f, /*guard=*/true), -inf);
  EXPECT_EQ(AddPartial(2.0f, 3.0f, /*guard=*/true), 5.0f);
  // One fp32 rounding: 1 + 2^-24 is a tie that goes to the even 1.
  EXPECT_EQ(AddPartial(1.0f, 0x1p-24f, /*guard=*/false), 1.0f);
}

}  // namespace
}  // namespace tensorcheck::cuda::internal
