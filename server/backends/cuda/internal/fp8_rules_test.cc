// The FP8 rules of the CUDA backends (fp8_rules.h), on the host: one case
// per rule that refuses, and the combinations it accepts with how they run.
// Expected values are the cuBLAS documentation's tables as fp8_rules.h
// quotes them, written out by hand.
#include "server/backends/cuda/internal/fp8_rules.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "tests/testing/status_matchers.h"

namespace tensorcheck::cuda::internal {
namespace {

using ::tensorcheck::testing::IsOk;
using ::tensorcheck::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr ComputeCapability kAda{8, 9};
constexpr ComputeCapability kHopper{9, 0};

Config Fp8Config(const std::string& backend, Precision p, Fp8Scaling scaling = Fp8Scaling::kTensor,
                 bool fast_accum = false) {
  Config c;
  c.backend = backend;
  c.precision = p;
  c.bias = backend == "cublaslt" ? BiasMode::kFused : BiasMode::kUnfused;
  c.scaling = scaling;
  c.fast_accum = fast_accum;
  return c;
}

// A wide (bf16) layer under cublaslt:<p>, OUT_IN, bf16 output, no bias,
// 32 x 64 x 128, on a Hopper.
Fp8Query WideQuery(Precision p, Fp8Scaling scaling = Fp8Scaling::kTensor) {
  Fp8Query q;
  q.config = Fp8Config("cublaslt", p, scaling);
  q.input = DType::kBFloat16;
  q.weight = DType::kBFloat16;
  q.layer =
      Fp8Layer{LayerShape{32, 64, 128, WeightLayout::kOutIn, Activation::kNone, DType::kBFloat16},
               std::nullopt};
  q.device = kHopper;
  return q;
}

// ---------------------------------------------------------------- refused

TEST(Fp8RulesTest, CublasFp8PrecisionIsFailedPreconditionNamingScalePointers) {
  Fp8Query q = WideQuery(Precision::kFp8E4M3);
  q.config = Fp8Config("cublas", Precision::kFp8E4M3);
  EXPECT_THAT(CheckFp8Gemm(q),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("configuration cublas:fp8e4m3:unfused@scaling=tensor"),
                             HasSubstr("cublasGemmEx takes no scale pointers"))));
}

TEST(Fp8RulesTest, CublasFp8OperandsUnderFp64AreFailedPrecondition) {
  Fp8Query q;
  q.config = Fp8Config("cublas", Precision::kFp64);
  q.input = DType::kFloat8E4M3Fn;
  EXPECT_THAT(CheckFp8Gemm(q), StatusIs(absl::StatusCode::kFailedPrecondition,
                                        AllOf(HasSubstr("does not multiply float8_e4m3fn"),
                                              HasSubstr("cublasGemmEx takes no scale pointers"))));
}

TEST(Fp8RulesTest, CublasltFp8OperandsUnderAWidePrecisionAreFailedPrecondition) {
  // The dequantised fp64 reference of FP8 operands is the CPU's.
  Fp8Query q;
  q.config = Fp8Config("cublaslt", Precision::kFp64);
  q.input = DType::kFloat8E4M3Fn;
  q.weight = DType::kFloat8E4M3Fn;
  EXPECT_THAT(CheckFp8Gemm(q), StatusIs(absl::StatusCode::kFailedPrecondition,
                                        AllOf(HasSubstr("configuration cublaslt:fp64:fused"),
                                              HasSubstr("only under an fp8 precision"))));
}

TEST(Fp8RulesTest, OneFp8AndOneWideOperandIsFailedPrecondition) {
  Fp8Query q = WideQuery(Precision::kFp8E4M3);
  q.input = DType::kFloat8E4M3Fn;
  EXPECT_THAT(CheckFp8Gemm(q), StatusIs(absl::StatusCode::kFailedPrecondition,
                                        HasSubstr("both operands FP8 (with their scales) or both "
                                                  "wide")));
}

TEST(Fp8RulesTest, Fp8OperandsOfOtherFormatsThanThePrecisionAreFailedPrecondition) {
  Fp8Query q = WideQuery(Precision::kFp8E5M2E4M3);
  q.input = DType::kFloat8E4M3Fn;
  q.weight = DType::kFloat8E4M3Fn;
  EXPECT_THAT(
      CheckFp8Gemm(q),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               HasSubstr("float8_e4m3fn inputs are multiplied by fp8e4m3, not fp8e5m2e4m3")));
  q = WideQuery(Precision::kFp8E4M3);
  q.input = DType::kFloat8E4M3Fn;
  q.weight = DType::kFloat8E5M2;
  EXPECT_THAT(
      CheckFp8Gemm(q),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               HasSubstr("float8_e5m2 weights are multiplied by fp8e4m3e5m2, not fp8e4m3")));
}

TEST(Fp8RulesTest, BothOperandsE5M2IsFailedPreconditionNamingTheRule) {
  EXPECT_THAT(CheckFp8Gemm(WideQuery(Precision::kFp8E5M2)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("configuration cublaslt:fp8e5m2:fused@scaling=tensor"),
                             HasSubstr("cuBLASLt has no FP8 GEMM with both operands "
                                       "float8_e5m2"))));
}

TEST(Fp8RulesTest, ComputeCapabilityBelow89IsFailedPrecondition) {
  for (ComputeCapability cc : {ComputeCapability{8, 0}, ComputeCapability{8, 6}}) {
    Fp8Query q = WideQuery(Precision::kFp8E4M3);
    q.device = cc;
    EXPECT_THAT(
        CheckFp8Gemm(q),
        StatusIs(absl::StatusCode::kFailedPrecondition,
                 AllOf(HasSubstr("compute capability 8.9 or newer"),
                       HasSubstr(absl::StrCat("this device is ", cc.major, ".", cc.minor)))));
  }
}

TEST(Fp8RulesTest, RowScalingOffComputeCapability90IsFailedPrecondition) {
  for (ComputeCapability cc : {kAda, ComputeCapability{10, 0}, ComputeCapability{12, 0}}) {
    Fp8Query q = WideQuery(Precision::kFp8E4M3, Fp8Scaling::kRow);
    q.device = cc;
    EXPECT_THAT(CheckFp8Gemm(q),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         AllOf(HasSubstr("CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F"),
                               HasSubstr("compute capability 9.0 only"))))
        << cc.major << "." << cc.minor;
  }
}

TEST(Fp8RulesTest, Fp8OutputOrBiasIsFailedPrecondition) {
  Fp8Query q = WideQuery(Precision::kFp8E4M3);
  q.layer->output_dtype = DType::kFloat8E4M3Fn;
  EXPECT_THAT(CheckFp8Gemm(q), StatusIs(absl::StatusCode::kFailedPrecondition,
                                        HasSubstr("a narrow output (float8_e4m3fn)")));
  q = WideQuery(Precision::kFp8E4M3);
  q.layer->bias = DType::kFloat8E5M2;
  EXPECT_THAT(CheckFp8Gemm(q), StatusIs(absl::StatusCode::kFailedPrecondition,
                                        HasSubstr("a narrow bias (float8_e5m2)")));
}

TEST(Fp8RulesTest, KNotAMultipleOf16IsFailedPrecondition) {
  Fp8Query q = WideQuery(Precision::kFp8E4M3);
  q.layer->k = 24;
  EXPECT_THAT(CheckFp8Gemm(q),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("16-byte aligned"), HasSubstr("k = 24 is not a multiple"))));
}

TEST(Fp8RulesTest, Float32BiasIsFailedPreconditionForEveryD) {
  // bf16 D and fp32 D both take a bf16 bias: a float32 one would be rounded.
  Fp8Query q = WideQuery(Precision::kFp8E4M3);
  q.layer->bias = DType::kFloat32;
  EXPECT_THAT(CheckFp8Gemm(q),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("a bfloat16 D takes a bfloat16 bias, and the layer's "
                                       "float32 bias would be rounded"),
                             HasSubstr("a float32 D takes a bfloat16 bias"))));
  q.layer->output_dtype = DType::kFloat32;
  EXPECT_THAT(CheckFp8Gemm(q), StatusIs(absl::StatusCode::kFailedPrecondition,
                                        HasSubstr("gives the float32 output")));
}

TEST(Fp8RulesTest, Float16BiasWithABf16OutputIsFailedPrecondition) {
  Fp8Query q = WideQuery(Precision::kFp8E4M3);
  q.layer->bias = DType::kFloat16;
  EXPECT_THAT(CheckFp8Gemm(q), StatusIs(absl::StatusCode::kFailedPrecondition,
                                        HasSubstr("the layer's float16 bias would be rounded")));
}

TEST(Fp8RulesTest, UnalignedDColumnsAreFailedPrecondition) {
  // n = 2: 4 bytes of bf16, 8 of fp32.
  Fp8Query q = WideQuery(Precision::kFp8E4M3);
  q.layer->n = 2;
  EXPECT_THAT(CheckFp8Gemm(q),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("a bfloat16 D's columns (n = 2 x 2 bytes)"),
                             HasSubstr("a float32 D's columns (n = 2 x 4 bytes)"))));
}

TEST(Fp8RulesTest, NoFp8AtAllIsInvalidArgument) {
  Fp8Query q = WideQuery(Precision::kFp8E4M3);
  q.config.precision = Precision::kBf16;
  EXPECT_THAT(CheckFp8Gemm(q), StatusIs(absl::StatusCode::kInvalidArgument));
}

// ---------------------------------------------------------------- accepted

TEST(Fp8RulesTest, WideOperandsPerTensorOnAdaRunAsBf16DQuantisedOnTheHost) {
  Fp8Query q = WideQuery(Precision::kFp8E4M3);
  q.device = kAda;
  q.layer->bias = DType::kBFloat16;
  auto g = CheckFp8Gemm(q);
  ASSERT_THAT(g, IsOk());
  EXPECT_EQ(g->a, DType::kFloat8E4M3Fn);
  EXPECT_EQ(g->b, DType::kFloat8E4M3Fn);
  EXPECT_EQ(g->d, DType::kBFloat16);
  EXPECT_EQ(g->bias, DType::kBFloat16);
  EXPECT_EQ(g->scale_mode, Fp8ScaleMode::kTensor);
  EXPECT_TRUE(g->quantise_input);
  EXPECT_TRUE(g->quantise_weight);
  EXPECT_FALSE(g->transpose_weight);
}

TEST(Fp8RulesTest, Fp8OperandsRowWiseOnHopperRunWithOuterVectorScales) {
  Fp8Query q = WideQuery(Precision::kFp8E4M3, Fp8Scaling::kRow);
  q.input = DType::kFloat8E4M3Fn;
  q.weight = DType::kFloat8E4M3Fn;
  auto g = CheckFp8Gemm(q);
  ASSERT_THAT(g, IsOk());
  EXPECT_EQ(g->scale_mode, Fp8ScaleMode::kOuterVector);
  EXPECT_STREQ(Fp8ScaleModeName(g->scale_mode), "CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F");
  EXPECT_FALSE(g->quantise_input);
  EXPECT_FALSE(g->quantise_weight);
  EXPECT_FALSE(g->bias.has_value());
}

TEST(Fp8RulesTest, MixedFormatsPutTheWeightsFormatInAAndTheInputsInB) {
  // The row-major trick: A is the weight, B the input (gemm_call.h).
  Fp8Query q = WideQuery(Precision::kFp8E4M3E5M2);
  q.input = DType::kFloat8E4M3Fn;
  q.weight = DType::kFloat8E5M2;
  auto g = CheckFp8Gemm(q);
  ASSERT_THAT(g, IsOk());
  EXPECT_EQ(g->a, DType::kFloat8E5M2);
  EXPECT_EQ(g->b, DType::kFloat8E4M3Fn);
  g = CheckFp8Gemm(WideQuery(Precision::kFp8E5M2E4M3));
  ASSERT_THAT(g, IsOk());
  EXPECT_EQ(g->a, DType::kFloat8E4M3Fn);
  EXPECT_EQ(g->b, DType::kFloat8E5M2);
}

TEST(Fp8RulesTest, InOutWeightIsTransposedToTn) {
  Fp8Query q = WideQuery(Precision::kFp8E4M3);
  q.layer->layout = WeightLayout::kInOut;
  auto g = CheckFp8Gemm(q);
  ASSERT_THAT(g, IsOk());
  EXPECT_TRUE(g->transpose_weight);
}

TEST(Fp8RulesTest, Fp16OutputWithABf16BiasWritesAnFp32D) {
  // fp16 D takes an fp16 bias; fp32 D a bf16 one, then one rounding to fp16.
  Fp8Query q = WideQuery(Precision::kFp8E4M3);
  q.layer->output_dtype = DType::kFloat16;
  q.layer->bias = DType::kBFloat16;
  auto g = CheckFp8Gemm(q);
  ASSERT_THAT(g, IsOk());
  EXPECT_EQ(g->d, DType::kFloat32);
  EXPECT_EQ(g->bias, DType::kBFloat16);
  q.layer->bias = DType::kFloat16;
  g = CheckFp8Gemm(q);
  ASSERT_THAT(g, IsOk());
  EXPECT_EQ(g->d, DType::kFloat16);
  EXPECT_EQ(g->bias, DType::kFloat16);
}

TEST(Fp8RulesTest, Float32AndFloat64OutputsWriteAnFp32DWithABf16Bias) {
  for (DType out : {DType::kFloat32, DType::kFloat64}) {
    Fp8Query q = WideQuery(Precision::kFp8E4M3);
    q.layer->output_dtype = out;
    q.layer->bias = DType::kBFloat16;
    auto g = CheckFp8Gemm(q);
    ASSERT_THAT(g, IsOk()) << DTypeName(out);
    EXPECT_EQ(g->d, DType::kFloat32);
    EXPECT_EQ(g->bias, DType::kBFloat16);
  }
}

TEST(Fp8RulesTest, NarrowNFallsBackToAnFp32DWhoseColumnsAlign) {
  // n = 4: 8 bytes of bf16 (unaligned), 16 of fp32.
  Fp8Query q = WideQuery(Precision::kFp8E4M3);
  q.layer->n = 4;
  auto g = CheckFp8Gemm(q);
  ASSERT_THAT(g, IsOk());
  EXPECT_EQ(g->d, DType::kFloat32);
}

TEST(Fp8RulesTest, WithoutLayerOrDeviceOnlyTheConfigurationsRulesApply) {
  // What Supports knows: the configuration and the input's storage.
  Fp8Query q;
  q.config = Fp8Config("cublaslt", Precision::kFp8E4M3, Fp8Scaling::kRow, /*fast_accum=*/true);
  q.input = DType::kFloat32;
  auto g = CheckFp8Gemm(q);
  ASSERT_THAT(g, IsOk());
  EXPECT_TRUE(g->quantise_input);
  EXPECT_TRUE(g->quantise_weight);
  q.input = DType::kFloat8E4M3Fn;
  g = CheckFp8Gemm(q);
  ASSERT_THAT(g, IsOk());
  EXPECT_FALSE(g->quantise_weight);
}

}  // namespace
}  // namespace tensorcheck::cuda::internal
