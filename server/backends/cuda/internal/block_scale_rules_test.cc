// The block-wise rules of the CUDA backends on the host: scaling=block128
// (fp8_rules.h) and MXFP8/NVFP4 (block_scale_rules.h), one case per rule
// that refuses, and what each accepted combination runs with (types, scale
// modes by their cuBLASLt names, quantisation, transposition). Expected
// values are the cuBLAS documentation's tables as the headers quote them,
// written out by hand.
#include "server/backends/cuda/internal/block_scale_rules.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "tests/testing/status_matchers.h"

namespace tensorcheck::cuda::internal {
namespace {

using ::tensorcheck::testing::IsOk;
using ::tensorcheck::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr ComputeCapability kAda{8, 9};
constexpr ComputeCapability kHopper{9, 0};
constexpr ComputeCapability kBlackwell{10, 0};
constexpr ComputeCapability kBlackwellGeForce{12, 0};

// A wide (bf16) layer under cublaslt:<p>, OUT_IN, bf16 output, no bias,
// 32 x 64 x 256, on `cc`.
Fp8Query Query(Precision p, std::optional<ComputeCapability> cc,
               Fp8Scaling scaling = Fp8Scaling::kTensor) {
  Fp8Query q;
  q.config.backend = "cublaslt";
  q.config.precision = p;
  q.config.bias = BiasMode::kFused;
  q.config.scaling = IsFp8(p) ? scaling : Fp8Scaling::kTensor;
  q.input = DType::kBFloat16;
  q.weight = DType::kBFloat16;
  q.layer =
      Fp8Layer{LayerShape{32, 64, 256, WeightLayout::kOutIn, Activation::kNone, DType::kBFloat16},
               std::nullopt};
  q.device = cc;
  return q;
}

Fp8Query Block128(std::optional<ComputeCapability> cc = kHopper) {
  return Query(Precision::kFp8E4M3, cc, Fp8Scaling::kBlock128);
}

// ---------------------------------------------------------------- block128

TEST(BlockScaleRules, Block128OnHopperRunsBlk128x128ForTheWeightAndVec128ForTheInput) {
  absl::StatusOr<Fp8Gemm> g = CheckNarrowGemm(Block128());
  ASSERT_THAT(g, IsOk());
  EXPECT_EQ(g->scale_mode, Fp8ScaleMode::kBlock128);
  EXPECT_STREQ(Fp8ScaleModeName(g->scale_mode), "CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F");
  EXPECT_STREQ(Fp8BScaleModeName(g->scale_mode), "CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F");
  EXPECT_EQ(g->a, DType::kFloat8E4M3Fn);
  EXPECT_EQ(g->b, DType::kFloat8E4M3Fn);
  EXPECT_EQ(g->d, DType::kBFloat16);
  EXPECT_TRUE(g->quantise_input);
  EXPECT_TRUE(g->quantise_weight);
  EXPECT_FALSE(g->global_scales);
  EXPECT_FALSE(g->transpose_weight);
}

TEST(BlockScaleRules, Block128WithFp8OperandsInOutTransposesTheWeight) {
  Fp8Query q = Block128();
  q.input = DType::kFloat8E4M3Fn;
  q.weight = DType::kFloat8E4M3Fn;
  q.layer->layout = WeightLayout::kInOut;
  absl::StatusOr<Fp8Gemm> g = CheckNarrowGemm(q);
  ASSERT_THAT(g, IsOk());
  EXPECT_FALSE(g->quantise_input);
  EXPECT_FALSE(g->quantise_weight);
  EXPECT_TRUE(g->transpose_weight);
}

TEST(BlockScaleRules, Block128WithoutADeviceIsAccepted) {
  // As the other FP8 scalings: the device rule is asked where there is one.
  EXPECT_THAT(CheckNarrowGemm(Block128(std::nullopt)), IsOk());
}

TEST(BlockScaleRules, Block128OffComputeCapability90IsFailedPrecondition) {
  for (ComputeCapability cc : {kAda, kBlackwell, kBlackwellGeForce}) {
    EXPECT_THAT(CheckNarrowGemm(Block128(cc)),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         AllOf(HasSubstr("CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F"),
                               HasSubstr("compute capability 9.0 only"))))
        << cc.major << "." << cc.minor;
  }
}

TEST(BlockScaleRules, Block128WithFastAccumIsFailedPrecondition) {
  Fp8Query q = Block128();
  q.config.fast_accum = true;
  EXPECT_THAT(CheckNarrowGemm(q),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("cublaslt:fp8e4m3:fused@scaling=block128,fast_accum"),
                             HasSubstr("CUBLASLT_MATMUL_DESC_FAST_ACCUM"))));
}

TEST(BlockScaleRules, Block128WithMNotAMultipleOf4AndSeveralKBlocksIsFailedPrecondition) {
  Fp8Query q = Block128();
  q.layer->m = 6;  // k = 256: two columns of 6 floats, the second at byte 24
  EXPECT_THAT(CheckNarrowGemm(q), StatusIs(absl::StatusCode::kFailedPrecondition,
                                           AllOf(HasSubstr("VEC128_32F"), HasSubstr("m = 6"))));
  q.layer->k = 128;  // one column: aligned
  EXPECT_THAT(CheckNarrowGemm(q), IsOk());
}

TEST(BlockScaleRules, Block128KeepsTheFp8AlignmentAndTypeRules) {
  Fp8Query q = Block128();
  q.layer->k = 200;  // 200 % 16 = 8
  EXPECT_THAT(CheckNarrowGemm(q), StatusIs(absl::StatusCode::kFailedPrecondition,
                                           HasSubstr("k = 200 is not a multiple of 16")));
  EXPECT_THAT(CheckNarrowGemm(Query(Precision::kFp8E5M2, kHopper, Fp8Scaling::kBlock128)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("no FP8 GEMM with both operands float8_e5m2")));
}

// ---------------------------------------------------------------- MXFP8 and NVFP4

TEST(BlockScaleRules, Mxfp8OnBlackwellRunsVec32Ue8m0) {
  for (ComputeCapability cc : {kBlackwell, kBlackwellGeForce}) {
    absl::StatusOr<Fp8Gemm> g = CheckNarrowGemm(Query(Precision::kMxFp8E4M3, cc));
    ASSERT_THAT(g, IsOk());
    EXPECT_EQ(g->scale_mode, Fp8ScaleMode::kMxVec32);
    EXPECT_STREQ(Fp8ScaleModeName(g->scale_mode), "CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0");
    EXPECT_STREQ(Fp8BScaleModeName(g->scale_mode), "CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0");
    EXPECT_EQ(g->a, DType::kFloat8E4M3Fn);
    EXPECT_EQ(g->b, DType::kFloat8E4M3Fn);
    EXPECT_FALSE(g->global_scales);
    EXPECT_TRUE(g->quantise_input);
  }
}

TEST(BlockScaleRules, Nvfp4OnBlackwellRunsVec16Ue4m3WithGlobalScalesAsAlpha) {
  Fp8Query q = Query(Precision::kNvFp4, kBlackwell);
  q.input = DType::kFloat4E2M1Fn;
  q.weight = DType::kFloat4E2M1Fn;
  q.layer->layout = WeightLayout::kInOut;
  q.layer->output_dtype = DType::kFloat32;
  q.layer->bias = DType::kBFloat16;
  absl::StatusOr<Fp8Gemm> g = CheckNarrowGemm(q);
  ASSERT_THAT(g, IsOk());
  EXPECT_EQ(g->scale_mode, Fp8ScaleMode::kNvVec16);
  EXPECT_STREQ(Fp8ScaleModeName(g->scale_mode), "CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3");
  EXPECT_EQ(g->a, DType::kFloat4E2M1Fn);
  EXPECT_EQ(g->b, DType::kFloat4E2M1Fn);
  EXPECT_TRUE(g->global_scales);
  EXPECT_FALSE(g->quantise_input);
  EXPECT_FALSE(g->quantise_weight);
  EXPECT_TRUE(g->transpose_weight);
  // FP4 table: an fp32 D takes a bf16 bias.
  EXPECT_EQ(g->d, DType::kFloat32);
  EXPECT_EQ(g->bias, DType::kBFloat16);
}

TEST(BlockScaleRules, BlockScaledPrecisionsBeforeBlackwellAreFailedPreconditionNamingTheRule) {
  for (Precision p : {Precision::kMxFp8E4M3, Precision::kNvFp4}) {
    for (ComputeCapability cc : {kAda, kHopper}) {
      EXPECT_THAT(CheckNarrowGemm(Query(p, cc)),
                  StatusIs(absl::StatusCode::kFailedPrecondition,
                           AllOf(HasSubstr("compute capability 10.0 or later"),
                                 HasSubstr(p == Precision::kNvFp4 ? "VEC16_UE4M3" : "VEC32_UE8M0"),
                                 HasSubstr("the cpu backend runs it"))))
          << PrecisionName(p) << " " << cc.major;
    }
  }
}

TEST(BlockScaleRules, BlockScaledPrecisionsWithoutADeviceAreFailedPrecondition) {
  EXPECT_THAT(
      CheckNarrowGemm(Query(Precision::kNvFp4, std::nullopt)),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("this host has no device")));
}

TEST(BlockScaleRules, Mxfp8E5m2IsFailedPreconditionNamingTheTypeTable) {
  EXPECT_THAT(CheckNarrowGemm(Query(Precision::kMxFp8E5M2, kBlackwell)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("configuration cublaslt:mxfp8e5m2"),
                             HasSubstr("both operands float8_e5m2"))));
}

TEST(BlockScaleRules, CublasIsFailedPreconditionNamingScalePointers) {
  Fp8Query q = Query(Precision::kNvFp4, kBlackwell);
  q.config.backend = "cublas";
  q.config.bias = BiasMode::kUnfused;
  EXPECT_THAT(CheckNarrowGemm(q), StatusIs(absl::StatusCode::kFailedPrecondition,
                                           HasSubstr("cublasGemmEx takes no scale pointers")));
}

TEST(BlockScaleRules, Fp4OperandsUnderAnotherPrecisionAreFailedPrecondition) {
  Fp8Query q = Query(Precision::kFp64, kBlackwell);
  q.input = DType::kFloat4E2M1Fn;
  q.weight = DType::kFloat4E2M1Fn;
  EXPECT_THAT(CheckNarrowGemm(q),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("only under nvfp4")));
  q = Query(Precision::kMxFp8E4M3, kBlackwell);
  q.input = DType::kFloat4E2M1Fn;
  q.weight = DType::kFloat4E2M1Fn;
  EXPECT_THAT(CheckNarrowGemm(q),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("float4_e2m1fn inputs are not multiplied by mxfp8e4m3")));
}

TEST(BlockScaleRules, OneNarrowAndOneWideOperandIsFailedPrecondition) {
  Fp8Query q = Query(Precision::kMxFp8E4M3, kBlackwell);
  q.input = DType::kFloat8E4M3Fn;
  EXPECT_THAT(CheckNarrowGemm(q),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("both operands narrow")));
}

TEST(BlockScaleRules, KMustHoldWholeBlocksAndNvfp4RowsMustAlign) {
  Fp8Query q = Query(Precision::kMxFp8E4M3, kBlackwell);
  q.layer->k = 48;  // 16-byte aligned, not whole 32-blocks
  EXPECT_THAT(CheckNarrowGemm(q), StatusIs(absl::StatusCode::kFailedPrecondition,
                                           HasSubstr("k = 48 is not a multiple of 32")));
  q = Query(Precision::kNvFp4, kBlackwell);
  q.layer->k = 48;  // whole 16-blocks, 24 bytes
  EXPECT_THAT(CheckNarrowGemm(q), StatusIs(absl::StatusCode::kFailedPrecondition,
                                           HasSubstr("24 bytes, not a multiple of 16")));
  q.layer->k = 64;
  EXPECT_THAT(CheckNarrowGemm(q), IsOk());
}

TEST(BlockScaleRules, OutputAndBiasFollowTheFp8Table) {
  Fp8Query q = Query(Precision::kMxFp8E4M3, kBlackwell);
  q.layer->bias = DType::kFloat32;
  EXPECT_THAT(CheckNarrowGemm(q), StatusIs(absl::StatusCode::kFailedPrecondition,
                                           AllOf(HasSubstr("cublasLtMatmul's FP8 type table"),
                                                 HasSubstr("float32 bias would be rounded"))));
  q = Query(Precision::kNvFp4, kBlackwell);
  q.layer->output_dtype = DType::kFloat16;
  q.layer->bias = DType::kFloat16;
  absl::StatusOr<Fp8Gemm> g = CheckNarrowGemm(q);
  ASSERT_THAT(g, IsOk());
  EXPECT_EQ(g->d, DType::kFloat16);
  EXPECT_EQ(g->bias, DType::kFloat16);
}

TEST(BlockScaleRules, WithoutALayerOnlyTheConfigurationsRulesApply) {
  Fp8Query q = Query(Precision::kNvFp4, kBlackwell);
  q.layer.reset();
  q.weight.reset();
  q.input = DType::kFloat32;
  absl::StatusOr<Fp8Gemm> g = CheckNarrowGemm(q);
  ASSERT_THAT(g, IsOk());
  EXPECT_TRUE(g->quantise_input);
  EXPECT_TRUE(g->quantise_weight);
}

TEST(BlockScaleRules, InvolvesNarrowNamesEveryNarrowPrecisionAndOperand) {
  Config c;
  c.precision = Precision::kBf16;
  EXPECT_FALSE(InvolvesNarrow(c, DType::kFloat32, DType::kFloat32));
  EXPECT_TRUE(InvolvesNarrow(c, DType::kFloat4E2M1Fn, std::nullopt));
  EXPECT_TRUE(InvolvesNarrow(c, DType::kFloat32, DType::kFloat8E5M2));
  c.precision = Precision::kNvFp4;
  EXPECT_TRUE(InvolvesNarrow(c, DType::kFloat32, DType::kFloat32));
  c.precision = Precision::kFp8E4M3;
  EXPECT_TRUE(InvolvesNarrow(c, DType::kFloat32, DType::kFloat32));
}

TEST(BlockScaleRules, NoNarrowPrecisionOrOperandIsInvalidArgument) {
  Fp8Query q = Query(Precision::kBf16, kBlackwell);
  EXPECT_THAT(CheckBlockScaledGemm(q), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace tensorcheck::cuda::internal
