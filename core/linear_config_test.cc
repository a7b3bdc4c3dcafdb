#include "core/linear_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/testing/status_matchers.h"

namespace tensorcheck {
namespace {

using ::tensorcheck::testing::IsOk;
using ::tensorcheck::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

// ---- ParseConfigSpec

TEST(ParseConfigSpecTest, BackendAndPrecision) {
  auto spec = ParseConfigSpec("cpu:fp64");
  ASSERT_THAT(spec, IsOk());
  EXPECT_EQ(spec->backend, "cpu");
  EXPECT_EQ(spec->precision, Precision::kFp64);
  EXPECT_FALSE(spec->bias.has_value());
}

TEST(ParseConfigSpecTest, BackendPrecisionAndBias) {
  auto spec = ParseConfigSpec("cublaslt:bf16:fused");
  ASSERT_THAT(spec, IsOk());
  EXPECT_EQ(spec->backend, "cublaslt");
  EXPECT_EQ(spec->precision, Precision::kBf16);
  EXPECT_EQ(spec->bias, BiasMode::kFused);
  EXPECT_EQ(ParseConfigSpec("cublas:bf16:unfused")->bias, BiasMode::kUnfused);
  EXPECT_EQ(ParseConfigSpec("cpu:tf32rna")->precision, Precision::kTf32Rna);
  EXPECT_EQ(ParseConfigSpec("cpu:tf32trunc")->precision, Precision::kTf32Trunc);
  EXPECT_EQ(ParseConfigSpec("cpu:fp16acc")->precision, Precision::kFp16Acc);
}

TEST(ParseConfigSpecTest, BackendNamesAreNotCheckedHere) {
  EXPECT_THAT(ParseConfigSpec("nosuchbackend:fp32"), IsOk());
}

TEST(ParseConfigSpecTest, MissingPrecisionIsInvalidArgumentNamingTheField) {
  for (const char* bad : {"cpu", "", ":fp32", "cpu:fp32:fused:extra"}) {
    SCOPED_TRACE(bad);
    EXPECT_THAT(ParseConfigSpec(bad, "reference"),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("reference"), HasSubstr("backend:precision[:bias]"))));
  }
}

TEST(ParseConfigSpecTest, UnknownPrecisionIsInvalidArgumentListingTheAccepted) {
  EXPECT_THAT(ParseConfigSpec("cpu:fp8", "configs[2]"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("configs[2]"), HasSubstr("'fp8'"), HasSubstr("fp64"),
                             HasSubstr("tf32trunc"), HasSubstr("fp16acc"))));
  // Names are exact: no case folding, no whitespace.
  EXPECT_THAT(ParseConfigSpec("cpu:FP32"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseConfigSpec("cpu: fp32"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseConfigSpec("cpu::fused"), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(ParseConfigSpecTest, UnknownBiasModeIsInvalidArgumentNamingTheField) {
  EXPECT_THAT(ParseConfigSpec("cpu:fp32:sideways"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("config"), HasSubstr("bias mode"), HasSubstr("'sideways'"),
                             HasSubstr("unfused"))));
  EXPECT_THAT(ParseConfigSpec("cpu:fp32:"), StatusIs(absl::StatusCode::kInvalidArgument));
}

// ---- ResolveConfig

Config Resolve(const std::string& spec, bool has_bias, Activation act,
               BiasMode backend_default = BiasMode::kFused) {
  auto s = ParseConfigSpec(spec);
  EXPECT_THAT(s, IsOk());
  return ResolveConfig(*s, has_bias, act, backend_default);
}

TEST(ResolveConfigTest, CanonicalFormNamesAllThreeParts) {
  EXPECT_EQ(Resolve("cpu:tf32:fused", true, Activation::kNone).ToString(), "cpu:tf32:fused");
  EXPECT_EQ(Resolve("cublas:bf16:unfused", true, Activation::kRelu).ToString(),
            "cublas:bf16:unfused");
}

TEST(ResolveConfigTest, UnspecifiedBiasTakesTheBackendDefault) {
  EXPECT_EQ(Resolve("cpu:fp32", true, Activation::kNone).ToString(), "cpu:fp32:fused");
  EXPECT_EQ(Resolve("cpu:fp32", true, Activation::kNone, BiasMode::kUnfused).ToString(),
            "cpu:fp32:unfused");
}

TEST(ResolveConfigTest, NoBiasAndNoGeluIsNone) {
  for (const char* spec : {"cpu:fp64", "cpu:bf16:fused", "cpu:bf16:unfused"}) {
    for (Activation act : {Activation::kNone, Activation::kRelu}) {
      SCOPED_TRACE(spec);
      const Config c = Resolve(spec, /*has_bias=*/false, act);
      EXPECT_EQ(c.bias, BiasMode::kNone);
      EXPECT_THAT(c.ToString(), ::testing::EndsWith(":none"));
    }
  }
  EXPECT_EQ(Resolve("cpu:fp64", false, Activation::kNone).ToString(), "cpu:fp64:none");
}

TEST(ResolveConfigTest, GeluWithoutBiasKeepsThePlacement) {
  // round(gelu(acc)) and round(gelu(round(acc))) differ, bias or not.
  EXPECT_EQ(Resolve("cpu:bf16:unfused", false, Activation::kGeluTanh).ToString(),
            "cpu:bf16:unfused");
  EXPECT_EQ(Resolve("cpu:bf16", false, Activation::kGeluTanh).ToString(), "cpu:bf16:fused");
}

TEST(ResolveConfigTest, ExplicitNoneWithABiasTakesTheBackendDefault) {
  EXPECT_EQ(Resolve("cpu:fp16:none", true, Activation::kNone, BiasMode::kUnfused).ToString(),
            "cpu:fp16:unfused");
}

TEST(ConfigTest, EqualityComparesAllParts) {
  const Config a{"cpu", Precision::kBf16, BiasMode::kFused};
  Config b = a;
  EXPECT_EQ(a, b);
  b.bias = BiasMode::kUnfused;
  EXPECT_FALSE(a == b);
}

// ---- Names round trip

TEST(NamesTest, PrecisionsRoundTrip) {
  for (Precision p : kAllPrecisions) {
    auto back = ParsePrecision(PrecisionName(p));
    ASSERT_THAT(back, IsOk());
    EXPECT_EQ(*back, p);
  }
  EXPECT_EQ(PrecisionName(Precision::kTf32Rna), "tf32rna");
  EXPECT_EQ(PrecisionName(Precision::kFp16Acc), "fp16acc");
}

TEST(NamesTest, BiasModesActivationsAndLayoutsRoundTrip) {
  for (BiasMode b : {BiasMode::kNone, BiasMode::kFused, BiasMode::kUnfused}) {
    EXPECT_EQ(*ParseBiasMode(BiasModeName(b)), b);
  }
  for (Activation a : {Activation::kNone, Activation::kRelu, Activation::kGeluTanh}) {
    EXPECT_EQ(*ParseActivation(ActivationName(a)), a);
  }
  EXPECT_EQ(ActivationName(Activation::kGeluTanh), "gelu");
  for (WeightLayout l : {WeightLayout::kOutIn, WeightLayout::kInOut}) {
    EXPECT_EQ(*ParseWeightLayout(WeightLayoutName(l)), l);
  }
  EXPECT_EQ(WeightLayoutName(WeightLayout::kInOut), "in_out");
}

TEST(NamesTest, UnknownNamesAreInvalidArgumentSayingWhatCame) {
  EXPECT_THAT(ParseActivation("swish"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("activation"), HasSubstr("'swish'"))));
  EXPECT_THAT(ParseWeightLayout("nk"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("weight layout"), HasSubstr("out_in"))));
}

TEST(NamesTest, SpecRoundTripsThroughCanonicalForm) {
  for (Precision p : kAllPrecisions) {
    for (BiasMode b : {BiasMode::kFused, BiasMode::kUnfused}) {
      const Config c{"cpu", p, b};
      const Config back = Resolve(c.ToString(), true, Activation::kNone);
      EXPECT_EQ(back, c) << c.ToString();
    }
  }
}

TEST(ConfigAlgoTest, AlgoOptionParsesForAnyPrecisionAndRoundTrips) {
  auto spec = ParseConfigSpec("cublaslt:fp32:fused@algo=3");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->algo, 3);
  const Config c = ResolveConfig(*spec, /*has_bias=*/true, Activation::kNone, BiasMode::kUnfused);
  EXPECT_EQ(c.ToString(), "cublaslt:fp32:fused@algo=3");
  // With the fp8 options, algo comes last after the one '@'.
  auto fp8 = ParseConfigSpec("cublaslt:fp8e4m3@algo=0,scaling=row");
  ASSERT_TRUE(fp8.ok()) << fp8.status();
  const Config c8 = ResolveConfig(*fp8, false, Activation::kNone, BiasMode::kFused);
  EXPECT_EQ(c8.ToString(), "cublaslt:fp8e4m3:none@scaling=row,algo=0");
  EXPECT_EQ(Resolve(c.ToString(), true, Activation::kNone), c);
  EXPECT_EQ(Resolve(c8.ToString(), false, Activation::kNone), c8);
  // Unset and algo=0 are different configurations: the backend's choice
  // may depend on the shape; algo=0 names its first algorithm.
  Config unset = c;
  unset.algo.reset();
  EXPECT_FALSE(unset == c);
  EXPECT_EQ(unset.ToString(), "cublaslt:fp32:fused");
}

TEST(ConfigAlgoTest, BadAlgoValuesAreInvalidArgumentNamingTheFieldAndTheForm) {
  for (const char* bad :
       {"cpu:fp32@algo=", "cpu:fp32@algo=-1", "cpu:fp32@algo=x", "cpu:fp32@algo=1024",
        "cpu:fp32@algo=01", "cpu:fp32@algo=1,algo=2", "cpu:fp32@algo=+1"}) {
    auto spec = ParseConfigSpec(bad, "configs[2]");
    ASSERT_FALSE(spec.ok()) << bad;
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(spec.status().message()), HasSubstr("configs[2]")) << bad;
    EXPECT_THAT(std::string(spec.status().message()), HasSubstr("algo")) << bad;
  }
  auto fp8_only = ParseConfigSpec("cpu:fp32@scaling=row");
  ASSERT_FALSE(fp8_only.ok());
  EXPECT_THAT(std::string(fp8_only.status().message()), HasSubstr("fp8 precisions only"));
}

// ---- Precision facts

TEST(PrecisionInfoTest, UnitRoundoffsFollowTheDesignTable) {
  EXPECT_EQ(GetPrecisionInfo(Precision::kFp64).u_input, 0.0);
  EXPECT_EQ(GetPrecisionInfo(Precision::kFp32).u_accumulate, std::ldexp(1.0, -24));
  EXPECT_EQ(GetPrecisionInfo(Precision::kTf32).u_input, std::ldexp(1.0, -11));
  EXPECT_EQ(GetPrecisionInfo(Precision::kBf16).u_input, std::ldexp(1.0, -8));
  EXPECT_EQ(GetPrecisionInfo(Precision::kFp16).u_input, std::ldexp(1.0, -11));
  EXPECT_TRUE(GetPrecisionInfo(Precision::kFp16Acc).fp16_accumulate);
  EXPECT_EQ(GetPrecisionInfo(Precision::kTf32Trunc).tf32_rounding, Tf32Rounding::kTruncate);
  EXPECT_FALSE(GetPrecisionInfo(Precision::kBf16).tf32_rounding.has_value());
}

TEST(RoundInputTest, RoundsToEachPrecisionsInputFormat) {
  const float x = 1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20);  // above TF32/fp16 ties
  EXPECT_EQ(RoundInput(Precision::kFp32, x), x);
  EXPECT_EQ(RoundInput(Precision::kFp64, x), x);
  EXPECT_EQ(RoundInput(Precision::kTf32, x), 1.0f + std::ldexp(1.0f, -10));
  EXPECT_EQ(RoundInput(Precision::kTf32Trunc, x), 1.0f);
  EXPECT_EQ(RoundInput(Precision::kFp16, x), 1.0f + std::ldexp(1.0f, -10));
  EXPECT_EQ(RoundInput(Precision::kBf16, x), 1.0f);
  EXPECT_EQ(RoundInput(Precision::kFp16Acc, 70000.0f), std::numeric_limits<float>::infinity());
  EXPECT_EQ(RoundInput(Precision::kTf32, 262144.0f),
            262144.0f);  // no fp16 overflow
}

// ---- Multi-pass precisions and the jax= alias

TEST(MultiPassTest, NamesParseWithEitherBiasAndPrintBack) {
  for (const char* spec :
       {"cpu:bf16x3", "cpu:bf16x6:fused", "cpu:bf16x9:unfused", "cpu:tf32x3:unfused"}) {
    auto parsed = ParseConfigSpec(spec);
    ASSERT_THAT(parsed, IsOk()) << spec;
    EXPECT_TRUE(IsMultiPass(parsed->precision)) << spec;
    const Config c = ResolveConfig(*parsed, /*has_bias=*/true, Activation::kNone,
                                   /*backend_default=*/BiasMode::kFused);
    auto again = ParseConfigSpec(c.ToString());
    ASSERT_THAT(again, IsOk());
    EXPECT_EQ(ResolveConfig(*again, true, Activation::kNone, BiasMode::kFused), c);
  }
  EXPECT_EQ(PrecisionName(Precision::kBf16x3), "bf16x3");
  EXPECT_EQ(PrecisionName(Precision::kTf32x3), "tf32x3");
}

TEST(MultiPassTest, JaxPresetAliasNamesThePrecisionAndPrintsTheCanonicalName) {
  const std::pair<const char*, Precision> cases[] = {
      {"BF16_BF16_F32_X3", Precision::kBf16x3}, {"BF16_BF16_F32_X6", Precision::kBf16x6},
      {"BF16_BF16_F32_X9", Precision::kBf16x9}, {"TF32_TF32_F32_X3", Precision::kTf32x3},
      {"F32_F32_F32", Precision::kFp32},        {"BF16_BF16_F32", Precision::kBf16},
      {"TF32_TF32_F32", Precision::kTf32},
  };
  for (const auto& [preset, precision] : cases) {
    auto spec = ParseConfigSpec(absl::StrCat("cpu:jax=", preset, ":unfused"));
    ASSERT_THAT(spec, IsOk()) << preset;
    EXPECT_EQ(spec->precision, precision) << preset;
    const Config c = ResolveConfig(*spec, /*has_bias=*/true, Activation::kNone, BiasMode::kFused);
    EXPECT_EQ(c.ToString(), absl::StrCat("cpu:", PrecisionName(precision), ":unfused"));
    EXPECT_EQ(JaxPresetName(precision), preset);
  }
  auto pattern = ParseConfigPattern("jax=BF16_BF16_F32_X3:fused");
  ASSERT_THAT(pattern, IsOk());
  EXPECT_EQ(pattern->ToString(), "bf16x3:fused");
  EXPECT_EQ(JaxPresetName(Precision::kTf32Rna), "");
}

TEST(MultiPassTest, UnknownJaxPresetIsInvalidArgumentNamingTheFieldAndTheKnownOnes) {
  auto spec = ParseConfigSpec("cpu:jax=BF16_BF16_F32_X4", "configs[1]");
  EXPECT_THAT(spec.status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("configs[1]"), HasSubstr("BF16_BF16_F32_X4"),
                             HasSubstr("BF16_BF16_F32_X3"), HasSubstr("TF32_TF32_F32_X3"),
                             HasSubstr("F32_F32_F32"))));
}

// Parts worked by hand. bf16 has 7 fraction bits, TF32 10.
TEST(MultiPassTest, SplitsAsXlaDoesHighPartsTowardZeroTheLastToNearest) {
  float parts[3];
  // 1 + 2^-8 + 2^-9: bf16 rounding to nearest would give 1 + 2^-7; XLA's
  // mask keeps 1, and the rest (3 * 2^-9) is exact in bf16.
  const float a = 1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -9);
  SplitMultiPass(MultiPassSchemeOf(Precision::kBf16x3), a, parts);
  EXPECT_EQ(parts[0], 1.0f);
  EXPECT_EQ(parts[1], 3 * std::ldexp(1.0f, -9));
  // 1 + 2^-8 + 2^-17 + 2^-23 in three parts: 1, 2^-8 (the next 8 bits of
  // the rest, cut), 2^-17 + 2^-23 (7 bits apart: exact in bf16).
  const float b = 1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -17) + std::ldexp(1.0f, -23);
  SplitMultiPass(MultiPassSchemeOf(Precision::kBf16x6), b, parts);
  EXPECT_EQ(parts[0], 1.0f);
  EXPECT_EQ(parts[1], std::ldexp(1.0f, -8));
  EXPECT_EQ(parts[2], std::ldexp(1.0f, -17) + std::ldexp(1.0f, -23));
  // 1 + 2^-11 is a TF32 tie: ties-away gives 1 + 2^-10, the rest -2^-11.
  SplitMultiPass(MultiPassSchemeOf(Precision::kTf32x3), 1.0f + std::ldexp(1.0f, -11), parts);
  EXPECT_EQ(parts[0], 1.0f + std::ldexp(1.0f, -10));
  EXPECT_EQ(parts[1], -std::ldexp(1.0f, -11));
  // The last TF32 part is truncated: the rest 2^-12 + 2^-22 + 2^-23 keeps
  // 2^-12 + 2^-22 (to nearest even it would carry to 2^-12 + 2^-21).
  const float c = 1.0f + std::ldexp(1.0f, -12) + std::ldexp(1.0f, -22) + std::ldexp(1.0f, -23);
  SplitMultiPass(MultiPassSchemeOf(Precision::kTf32x3), c, parts);
  EXPECT_EQ(parts[0], 1.0f);
  EXPECT_EQ(parts[1], std::ldexp(1.0f, -12) + std::ldexp(1.0f, -22));
}

TEST(MultiPassTest, ProductSetsAndOrdersAreXlas) {
  using P = std::vector<std::pair<int, int>>;
  EXPECT_EQ(MultiPassSchemeOf(Precision::kBf16x3).products, (P{{1, 0}, {0, 1}, {0, 0}}));
  EXPECT_EQ(MultiPassSchemeOf(Precision::kBf16x6).products,
            (P{{1, 1}, {0, 2}, {2, 0}, {0, 1}, {1, 0}, {0, 0}}));
  EXPECT_EQ(MultiPassSchemeOf(Precision::kBf16x9).products.size(), 9u);
  EXPECT_EQ(MultiPassSchemeOf(Precision::kTf32x3).products, (P{{1, 0}, {0, 1}, {0, 0}}));
  EXPECT_TRUE(MultiPassSchemeOf(Precision::kTf32x3).tf32);
}

TEST(MultiPassTest, PartialSumOrderIsTheDocumentedOrder) {
  EXPECT_EQ(PartialSumOrder(MultiPassSchemeOf(Precision::kBf16x3)),
            "lo*hi + hi*lo, NaN -> 0 + hi*hi");
  EXPECT_EQ(PartialSumOrder(MultiPassSchemeOf(Precision::kBf16x6)),
            "mid*mid + hi*lo + lo*hi + hi*mid + mid*hi, NaN -> 0 + hi*hi");
  EXPECT_EQ(PartialSumOrder(MultiPassSchemeOf(Precision::kBf16x9)),
            "lo*lo + mid*lo + lo*mid + mid*mid + lo*hi + hi*lo + mid*hi + hi*mid, NaN -> 0 + "
            "hi*hi");
  EXPECT_EQ(PartialSumOrder(MultiPassSchemeOf(Precision::kTf32x3)),
            "lo*hi + hi*lo, NaN -> 0 + hi*hi");
}

TEST(MultiPassTest, InputUnitIsTheResidualOfTheParts) {
  EXPECT_EQ(GetPrecisionInfo(Precision::kBf16x3).u_input, std::ldexp(1.0, -16));
  EXPECT_EQ(GetPrecisionInfo(Precision::kBf16x9).u_input, 0.0);
  EXPECT_LT(GetPrecisionInfo(Precision::kBf16x6).u_input, std::ldexp(1.0, -23));
  EXPECT_LT(GetPrecisionInfo(Precision::kTf32x3).u_input, std::ldexp(1.0, -23));
  EXPECT_EQ(GetPrecisionInfo(Precision::kTf32x3).u_accumulate, std::ldexp(1.0, -24));
  EXPECT_TRUE(StorageExactIn(Precision::kBf16x3, DType::kBFloat16));
  EXPECT_FALSE(StorageExactIn(Precision::kBf16x3, DType::kFloat16));
  EXPECT_TRUE(StorageExactIn(Precision::kBf16x6, DType::kFloat16));
  EXPECT_TRUE(StorageExactIn(Precision::kBf16x9, DType::kFloat32));
  EXPECT_FALSE(StorageExactIn(Precision::kTf32x3, DType::kFloat32));
}

// ---- Kernel replays (`mma=`, docs/numerics.md, "Kernel K order").

TEST(KernelReplayConfigTest, ParsesAndPrintsCanonically) {
  struct Case {
    const char* spec;
    const char* canonical;
  };
  for (const Case& c : {
           Case{"cpu:bf16:fused@mma=sm90", "cpu:bf16:fused@mma=sm90"},
           Case{"cpu:bf16:fused@tile_k=64,mma=sm90", "cpu:bf16:fused@mma=sm90,tile_k=64"},
           Case{"cpu:fp16:fused@mma=sm80,tile_k=32,residue=first",
                "cpu:fp16:fused@mma=sm80,tile_k=32,residue=first"},
           Case{"cpu:fp16:fused@mma=sm80,tile_k=32,residue=last",
                "cpu:fp16:fused@mma=sm80,tile_k=32"},
           Case{"cpu:bf16:fused@mma=sm90,reduce=fp32,splitk=2",
                "cpu:bf16:fused@splitk=2,reduce=fp32,mma=sm90"},
           Case{"cpu:fp8e4m3:fused@mma=sm100,fast_accum",
                "cpu:fp8e4m3:fused@scaling=tensor,fast_accum,mma=sm100"},
           Case{"cpu:tf32trunc:fused@mma=sm90,tile_k=16", "cpu:tf32trunc:fused@mma=sm90,tile_k=16"},
       }) {
    SCOPED_TRACE(c.spec);
    absl::StatusOr<ConfigSpec> spec = ParseConfigSpec(c.spec);
    ASSERT_THAT(spec, IsOk());
    const Config config =
        ResolveConfig(*spec, /*has_bias=*/true, Activation::kNone, BiasMode::kFused);
    EXPECT_EQ(config.ToString(), c.canonical);
    // The canonical form parses back to the same configuration.
    absl::StatusOr<ConfigSpec> again = ParseConfigSpec(config.ToString());
    ASSERT_THAT(again, IsOk());
    EXPECT_EQ(ResolveConfig(*again, true, Activation::kNone, BiasMode::kFused), config);
  }
}

TEST(KernelReplayConfigTest, BadOptionsNameWhatIsWrong) {
  struct Case {
    const char* spec;
    const char* message;
  };
  for (const Case& c : {
           Case{"cpu:fp32@mma=sm90", "applies to bf16, fp16, the tf32 and the fp8"},
           Case{"cpu:fp16acc@mma=sm90", "not fp16acc"},
           Case{"cpu:bf16x3@mma=sm90", "not bf16x3"},
           Case{"cpu:bf16@mma=sm75", "expected sm80, sm90 or sm100"},
           Case{"cpu:bf16@tile_k=64", "need mma="},
           Case{"cpu:bf16@mma=sm90,residue=first", "needs tile_k"},
           Case{"cpu:bf16@mma=sm90,tile_k=24", "a multiple of 16"},
           Case{"cpu:bf16@mma=sm80,tile_k=12", "a multiple of 8"},
           Case{"cpu:bf16@mma=sm90,tile_k=0", "from 1 to 1024"},
           Case{"cpu:bf16@mma=sm90,tile_k=2048", "from 1 to 1024"},
           Case{"cpu:bf16@mma=sm90,residue=middle,tile_k=16", "residue=first or residue=last"},
           Case{"cpu:fp8e4m3@mma=sm80", "no FP8 tensor cores"},
           Case{"cpu:fp8e4m3@scaling=block128,mma=sm90", "not modelled"},
           Case{"cpu:bf16@mma=sm90,mma=sm80", "unknown or repeated option 'mma=sm80'"},
       }) {
    SCOPED_TRACE(c.spec);
    EXPECT_THAT(ParseConfigSpec(c.spec, "configs[0]"),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("configs[0]"), HasSubstr(c.message))));
  }
}

TEST(KernelReplayConfigTest, KernelOrderOfFollowsThePrecisionAndOptions) {
  auto order_of = [](const char* text) {
    return KernelOrderOf(
        ResolveConfig(*ParseConfigSpec(text), false, Activation::kNone, BiasMode::kFused));
  };
  EXPECT_FALSE(order_of("cpu:bf16").has_value());
  // sm80 TF32: blocks of 4 (A100TC.m), 24 fraction bits.
  std::optional<KernelOrder> o = order_of("cpu:tf32@mma=sm80");
  ASSERT_TRUE(o.has_value());
  EXPECT_EQ(o->model.block, 4);
  EXPECT_EQ(o->model.align_bits, 24);
  EXPECT_EQ(o->promote, 0);
  // FP8 split accumulation promotes once per tile; 128 without one; fast
  // accumulation never. E4M3 x E5M2 keeps each operand's floor.
  o = order_of("cpu:fp8e4m3e5m2@mma=sm90,tile_k=64");
  ASSERT_TRUE(o.has_value());
  EXPECT_EQ(o->promote, 64);
  EXPECT_EQ(o->model.input_min_exponent, -6);
  EXPECT_EQ(o->model.b_min_exponent, -14);
  EXPECT_EQ(order_of("cpu:fp8e5m2@mma=sm90")->promote, 128);
  EXPECT_EQ(order_of("cpu:fp8e5m2@mma=sm90,fast_accum")->promote, 0);
  o = order_of("cpu:fp16@mma=sm90,tile_k=64,residue=first");
  EXPECT_EQ(o->tile_k, 64);
  EXPECT_EQ(o->residue, KResidue::kFirst);
  EXPECT_EQ(o->Offset(100), 36);
}

}  // namespace
}  // namespace tensorcheck
