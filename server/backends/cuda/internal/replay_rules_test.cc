// The kernel-replay rules of the CUDA backends (replay_rules.h), on the
// host. The expected values are written out by hand from cublasLt.h (CUDA
// 13): cublasLtMatmulStages_t (CUBLASLT_MATMUL_STAGES_16x1 = 1 ... 16x6 = 6,
// 32x1 = 7 ... 32x6 = 12, 64x1 = 13 ... 64x6 = 18, 128x1 = 19 ... 128x6 =
// 24, 32x10 = 25, 8x4 = 26, 16x10 = 27, 8x5 = 28, 8x3 = 31, 8xAUTO = 32,
// 16xAUTO = 33, 32xAUTO = 34, 64xAUTO = 35, 128xAUTO = 36, 256xAUTO = 37,
// 768xAUTO = 38; no 29 or 30) and cublasLtReductionScheme_t (NONE 0,
// INPLACE 1, COMPUTE_TYPE 2, OUTPUT_TYPE 4), and from the model blocks of
// core/tensor_core_model.h (sm80 bf16/fp16 8, TF32 4; sm90 and sm100 16,
// TF32 8, FP8 32).
#include "server/backends/cuda/internal/replay_rules.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "tests/testing/status_matchers.h"

namespace tensorcheck::cuda::internal {
namespace {

using ::tensorcheck::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr ComputeCapability kA100{8, 0};
constexpr ComputeCapability kRtx3090{8, 6};
constexpr ComputeCapability kAda{8, 9};
constexpr ComputeCapability kHopper{9, 0};
constexpr ComputeCapability kB200{10, 0};

// Stages ids as cublasLt.h numbers them.
constexpr uint32_t kUndefined = 0, k32x3 = 9, k64x3 = 15, k64x4 = 16, k128x3 = 21, k32x10 = 25,
                   k8x4 = 26, k16x10 = 27, k8x3 = 31, k8xAuto = 32, k64xAuto = 35, k128xAuto = 36,
                   k256xAuto = 37, k768xAuto = 38;
// Reduction schemes.
constexpr uint32_t kNone = 0, kInplace = 1, kComputeType = 2, kOutputType = 4;

ReplayRun LtRun(Precision p, ComputeCapability cc, DType out, BiasMode bias = BiasMode::kFused) {
  ReplayRun r;
  r.config.backend = "cublaslt";
  r.config.precision = p;
  r.config.bias = bias;
  r.device = cc;
  r.d = out;
  r.out = out;
  return r;
}

ReplayRun Fp8Run(ComputeCapability cc, Fp8Scaling scaling, bool fast_accum) {
  ReplayRun r = LtRun(Precision::kFp8E4M3, cc, DType::kBFloat16);
  r.config.scaling = scaling;
  r.config.fast_accum = fast_accum;
  return r;
}

LtAlgoConfig Algo(uint32_t stages, int32_t splitk = 1, uint32_t scheme = kNone) {
  return LtAlgoConfig{stages, splitk, scheme};
}

// The replay's string, or the reason as "unavailable: ...".
std::string Replay(const ReplayRun& run, const LtAlgoConfig& algo) {
  absl::StatusOr<std::string> r = ReplayConfig(run, algo);
  return r.ok() ? *r : absl::StrCat("unavailable: ", r.status().message());
}

TEST(ReplayRulesTest, StagesIdsGiveTheKOfTheirStage) {
  EXPECT_EQ(StagesTileK(kUndefined), 0);
  EXPECT_EQ(StagesTileK(1), 16);  // 16x1
  EXPECT_EQ(StagesTileK(6), 16);  // 16x6
  EXPECT_EQ(StagesTileK(7), 32);  // 32x1
  EXPECT_EQ(StagesTileK(k32x3), 32);
  EXPECT_EQ(StagesTileK(13), 64);  // 64x1
  EXPECT_EQ(StagesTileK(k64x3), 64);
  EXPECT_EQ(StagesTileK(18), 64);   // 64x6
  EXPECT_EQ(StagesTileK(19), 128);  // 128x1
  EXPECT_EQ(StagesTileK(24), 128);  // 128x6
  EXPECT_EQ(StagesTileK(k32x10), 32);
  EXPECT_EQ(StagesTileK(k8x4), 8);
  EXPECT_EQ(StagesTileK(k16x10), 16);
  EXPECT_EQ(StagesTileK(28), 8);  // 8x5
  EXPECT_EQ(StagesTileK(k8x3), 8);
  EXPECT_EQ(StagesTileK(k8xAuto), 8);
  EXPECT_EQ(StagesTileK(33), 16);  // 16xAUTO
  EXPECT_EQ(StagesTileK(34), 32);  // 32xAUTO
  EXPECT_EQ(StagesTileK(k64xAuto), 64);
  EXPECT_EQ(StagesTileK(k128xAuto), 128);
  EXPECT_EQ(StagesTileK(k256xAuto), 256);
  EXPECT_EQ(StagesTileK(k768xAuto), 768);
  // Not in the header: unknown, not "no tile".
  EXPECT_EQ(StagesTileK(29), std::nullopt);
  EXPECT_EQ(StagesTileK(30), std::nullopt);
  EXPECT_EQ(StagesTileK(39), std::nullopt);  // CUBLASLT_MATMUL_STAGES_END
}

TEST(ReplayRulesTest, StagesNamesAndIdsAreTheHeaders) {
  EXPECT_EQ(LtStagesName(kUndefined), "UNDEFINED");
  EXPECT_EQ(LtStagesName(k64x3), "64x3");
  EXPECT_EQ(LtStagesName(k64xAuto), "64xAUTO");
  EXPECT_EQ(LtStagesName(k768xAuto), "768xAUTO");
  EXPECT_EQ(LtStagesName(k32x10), "32x10");
  EXPECT_EQ(LtStagesName(30), "id 30");
  EXPECT_EQ(LtStagesId(64, 3), k64x3);
  EXPECT_EQ(LtStagesId(128, 3), k128x3);
  EXPECT_EQ(LtStagesId(128, 0), k128xAuto);
  EXPECT_EQ(LtStagesId(8, 3), k8x3);
  EXPECT_EQ(LtStagesId(768, 1), 0u);  // no such stages
}

TEST(ReplayRulesTest, ComputeCapabilitiesWithAModel) {
  EXPECT_EQ(ReplayGeneration(kA100), TensorCoreGpu::kSm80);
  EXPECT_EQ(ReplayGeneration(kRtx3090), TensorCoreGpu::kSm80);
  EXPECT_EQ(ReplayGeneration(kAda), TensorCoreGpu::kSm80);
  EXPECT_EQ(ReplayGeneration(kHopper), TensorCoreGpu::kSm90);
  EXPECT_EQ(ReplayGeneration(kB200), TensorCoreGpu::kSm100);
  for (ComputeCapability cc :
       {ComputeCapability{7, 5}, ComputeCapability{8, 7}, ComputeCapability{9, 1},
        ComputeCapability{10, 3}, ComputeCapability{11, 0}, ComputeCapability{12, 0}}) {
    EXPECT_EQ(ReplayGeneration(cc), std::nullopt) << cc.major << "." << cc.minor;
  }
}

TEST(ReplayRulesTest, ReductionSchemesAsTheSplitKRulesMapThem) {
  // reduce=fp32 is COMPUTE_TYPE, reduce=output OUTPUT_TYPE (splitk_rules.h).
  EXPECT_EQ(*ReplayReduce(kComputeType, DType::kBFloat16, DType::kBFloat16), SplitKReduce::kFp32);
  EXPECT_EQ(*ReplayReduce(kOutputType, DType::kBFloat16, DType::kBFloat16), SplitKReduce::kOutput);
  EXPECT_EQ(*ReplayReduce(kOutputType, DType::kFloat16, DType::kFloat16), SplitKReduce::kOutput);
  // OUTPUT_TYPE with an fp32 D reduces in fp32.
  EXPECT_EQ(*ReplayReduce(kOutputType, DType::kFloat32, DType::kBFloat16), SplitKReduce::kFp32);
  EXPECT_THAT(ReplayReduce(kOutputType, DType::kBFloat16, DType::kFloat16).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("OUTPUT_TYPE")));
  // INPLACE: fp32 additions in sequence with an fp32 D; with a 16-bit D no
  // configuration is that sum.
  EXPECT_EQ(*ReplayReduce(kInplace, DType::kFloat32, DType::kFloat32), SplitKReduce::kFp32);
  EXPECT_THAT(ReplayReduce(kInplace, DType::kBFloat16, DType::kBFloat16).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("CUBLASLT_REDUCTION_SCHEME_INPLACE"),
                             HasSubstr("running bfloat16 output"))));
  EXPECT_THAT(ReplayReduce(kNone, DType::kBFloat16, DType::kBFloat16).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no reduction")));
  EXPECT_THAT(ReplayReduce(3, DType::kBFloat16, DType::kBFloat16).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("scheme 3")));
}

TEST(ReplayRulesTest, SixteenAndNineteenBitKernels) {
  EXPECT_EQ(Replay(LtRun(Precision::kBf16, kHopper, DType::kBFloat16), Algo(k64x3)),
            "cpu:bf16:fused@mma=sm90,tile_k=64");
  EXPECT_EQ(Replay(LtRun(Precision::kBf16, kHopper, DType::kBFloat16), Algo(k64xAuto)),
            "cpu:bf16:fused@mma=sm90,tile_k=64");
  EXPECT_EQ(Replay(LtRun(Precision::kFp16, kA100, DType::kFloat16, BiasMode::kNone), Algo(k32x3)),
            "cpu:fp16:none@mma=sm80,tile_k=32");
  EXPECT_EQ(Replay(LtRun(Precision::kTf32, kRtx3090, DType::kFloat32), Algo(k32x10)),
            "cpu:tf32:fused@mma=sm80,tile_k=32");
  EXPECT_EQ(Replay(LtRun(Precision::kTf32, kB200, DType::kFloat32), Algo(k256xAuto)),
            "cpu:tf32:fused@mma=sm100,tile_k=256");
  EXPECT_EQ(Replay(LtRun(Precision::kBf16, kAda, DType::kBFloat16), Algo(k128x3)),
            "cpu:bf16:fused@mma=sm80,tile_k=128");
  // STAGES_UNDEFINED: the model without a tile.
  EXPECT_EQ(Replay(LtRun(Precision::kBf16, kHopper, DType::kBFloat16), Algo(kUndefined)),
            "cpu:bf16:fused@mma=sm90");
  // An 8-wide stage: a multiple of sm80's bf16 block (8), not of sm90's (16).
  EXPECT_EQ(Replay(LtRun(Precision::kBf16, kA100, DType::kBFloat16), Algo(k8x4)),
            "cpu:bf16:fused@mma=sm80,tile_k=8");
  EXPECT_THAT(
      Replay(LtRun(Precision::kBf16, kHopper, DType::kBFloat16), Algo(k8x4)),
      AllOf(HasSubstr("unavailable: "), HasSubstr("tile_k=8"), HasSubstr("multiple of 16")));
  // TF32 on sm80: a block of 4 divides 8.
  EXPECT_EQ(Replay(LtRun(Precision::kTf32, kA100, DType::kFloat32), Algo(k8xAuto)),
            "cpu:tf32:fused@mma=sm80,tile_k=8");
}

TEST(ReplayRulesTest, Fp8KeepsItsScalingAndFastAccumulation) {
  EXPECT_EQ(Replay(Fp8Run(kHopper, Fp8Scaling::kTensor, false), Algo(k128xAuto)),
            "cpu:fp8e4m3:fused@scaling=tensor,mma=sm90,tile_k=128");
  EXPECT_EQ(Replay(Fp8Run(kHopper, Fp8Scaling::kRow, true), Algo(k64xAuto)),
            "cpu:fp8e4m3:fused@scaling=row,fast_accum,mma=sm90,tile_k=64");
  EXPECT_EQ(Replay(Fp8Run(kB200, Fp8Scaling::kTensor, false), Algo(k768xAuto)),
            "cpu:fp8e4m3:fused@scaling=tensor,mma=sm100,tile_k=768");
  ReplayRun mixed = Fp8Run(kHopper, Fp8Scaling::kTensor, false);
  mixed.config.precision = Precision::kFp8E4M3E5M2;
  EXPECT_EQ(Replay(mixed, Algo(k128xAuto)),
            "cpu:fp8e4m3e5m2:fused@scaling=tensor,mma=sm90,tile_k=128");
  // Ada's FP8 has no model (sm80 has no FP8 tensor cores); block-wise
  // scaling is not modelled.
  EXPECT_THAT(Replay(Fp8Run(kAda, Fp8Scaling::kTensor, false), Algo(k128xAuto)),
              AllOf(HasSubstr("unavailable: "), HasSubstr("8.9"), HasSubstr("no FP8")));
  EXPECT_THAT(Replay(Fp8Run(kHopper, Fp8Scaling::kBlock128, false), Algo(k128xAuto)),
              AllOf(HasSubstr("unavailable: "), HasSubstr("block128")));
}

TEST(ReplayRulesTest, TheReplayWalksTheKernelsOrder) {
  // What the CPU will run (core's KernelOrderOf): the model's block, the
  // tile, the residue last, FP8's promotion once per tile.
  auto order_of = [](const std::string& text) {
    absl::StatusOr<ConfigSpec> spec = ParseConfigSpec(text);
    EXPECT_TRUE(spec.ok()) << spec.status();
    return KernelOrderOf(ResolveConfig(*spec, true, Activation::kNone, BiasMode::kFused));
  };
  std::optional<KernelOrder> bf16 =
      order_of(Replay(LtRun(Precision::kBf16, kHopper, DType::kBFloat16), Algo(k64x4)));
  ASSERT_TRUE(bf16.has_value());
  EXPECT_EQ(bf16->model.block, 16);
  EXPECT_EQ(bf16->tile_k, 64);
  EXPECT_EQ(bf16->residue, KResidue::kLast);
  EXPECT_EQ(bf16->promote, 0);
  std::optional<KernelOrder> fp8 =
      order_of(Replay(Fp8Run(kHopper, Fp8Scaling::kTensor, false), Algo(k128xAuto)));
  ASSERT_TRUE(fp8.has_value());
  EXPECT_EQ(fp8->model.block, 32);
  EXPECT_EQ(fp8->tile_k, 128);
  EXPECT_EQ(fp8->promote, 128);
  std::optional<KernelOrder> fast =
      order_of(Replay(Fp8Run(kHopper, Fp8Scaling::kTensor, true), Algo(k128xAuto)));
  ASSERT_TRUE(fast.has_value());
  EXPECT_EQ(fast->promote, 0);
}

TEST(ReplayRulesTest, SplitKernelsReplayTheirSplitAndReduction) {
  const ReplayRun bf16 = LtRun(Precision::kBf16, kHopper, DType::kBFloat16);
  EXPECT_EQ(Replay(bf16, Algo(k64x3, 4, kOutputType)),
            "cpu:bf16:fused@splitk=4,reduce=output,mma=sm90,tile_k=64");
  EXPECT_EQ(Replay(bf16, Algo(k64x3, 3, kComputeType)),
            "cpu:bf16:fused@splitk=3,reduce=fp32,mma=sm90,tile_k=64");
  EXPECT_EQ(Replay(bf16, Algo(k64x3, 1, kOutputType)), "cpu:bf16:fused@mma=sm90,tile_k=64");
  EXPECT_THAT(Replay(bf16, Algo(k64x3, 2, kInplace)),
              AllOf(HasSubstr("unavailable: "), HasSubstr("INPLACE")));
  // A bf16 layer with an fp32 output: D is fp32, and so are the additions.
  ReplayRun wide = LtRun(Precision::kBf16, kHopper, DType::kFloat32);
  EXPECT_EQ(Replay(wide, Algo(k64x3, 2, kInplace)),
            "cpu:bf16:fused@splitk=2,reduce=fp32,mma=sm90,tile_k=64");
  EXPECT_EQ(Replay(wide, Algo(k64x3, 2, kOutputType)),
            "cpu:bf16:fused@splitk=2,reduce=fp32,mma=sm90,tile_k=64");
  EXPECT_THAT(Replay(bf16, Algo(k64x3, 2, kNone)),
              AllOf(HasSubstr("unavailable: "), HasSubstr("no reduction")));
  EXPECT_THAT(Replay(bf16, Algo(k64x3, 65, kComputeType)),
              AllOf(HasSubstr("unavailable: "), HasSubstr("65"), HasSubstr("64")));
  // The CPU splits bf16 and fp16 only.
  EXPECT_THAT(
      Replay(LtRun(Precision::kTf32, kHopper, DType::kFloat32), Algo(k32x3, 2, kComputeType)),
      AllOf(HasSubstr("unavailable: "), HasSubstr("bf16 and fp16 only, not tf32")));
  EXPECT_THAT(Replay(Fp8Run(kHopper, Fp8Scaling::kTensor, false), Algo(k128xAuto, 2, kComputeType)),
              AllOf(HasSubstr("unavailable: "), HasSubstr("not fp8e4m3")));
}

TEST(ReplayRulesTest, WhatHasNoReplay) {
  // Emulated TF32 roundings run a strict-fp32 GEMM.
  for (Precision p : {Precision::kTf32Rna, Precision::kTf32Trunc}) {
    EXPECT_THAT(Replay(LtRun(p, kHopper, DType::kFloat32), Algo(k32x3)),
                AllOf(HasSubstr("unavailable: "), HasSubstr("CUBLAS_COMPUTE_32F_PEDANTIC")));
  }
  // A capability without a model.
  EXPECT_THAT(
      Replay(LtRun(Precision::kBf16, ComputeCapability{12, 0}, DType::kBFloat16), Algo(k64x3)),
      AllOf(HasSubstr("unavailable: "), HasSubstr("compute capability 12.0")));
  // A stages id this build does not know, and attributes not told.
  EXPECT_THAT(Replay(LtRun(Precision::kBf16, kHopper, DType::kBFloat16), Algo(30)),
              AllOf(HasSubstr("unavailable: "), HasSubstr("stages id 30")));
  LtAlgoConfig untold = Algo(k64x3);
  untold.stages.reset();
  EXPECT_THAT(Replay(LtRun(Precision::kBf16, kHopper, DType::kBFloat16), untold),
              HasSubstr("did not tell"));
  // Precisions without `mma=`: no replay to describe.
  for (Precision p : {Precision::kFp32, Precision::kFp64, Precision::kFp16Acc, Precision::kBf16x3,
                      Precision::kTf32x3, Precision::kMxFp8E4M3, Precision::kNvFp4}) {
    const ReplayRun run = LtRun(p, kHopper, DType::kFloat32);
    EXPECT_FALSE(ReplayApplies(run.config)) << PrecisionName(p);
    EXPECT_THAT(ReplayConfig(run, Algo(k64x3)).status(),
                StatusIs(absl::StatusCode::kInvalidArgument));
  }
}

TEST(ReplayRulesTest, DetailsHoldTheReplayOrWhyNot) {
  std::map<std::string, std::string> d;
  DescribeReplay(LtRun(Precision::kFp16, kHopper, DType::kFloat16), Algo(k64x3), &d);
  EXPECT_EQ(d,
            (std::map<std::string, std::string>{{"replay", "cpu:fp16:fused@mma=sm90,tile_k=64"}}));
  d.clear();
  DescribeReplay(LtRun(Precision::kBf16, ComputeCapability{12, 0}, DType::kBFloat16), Algo(k64x3),
                 &d);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_THAT(d["replay_unavailable"], HasSubstr("compute capability 12.0"));
  d.clear();
  DescribeReplay(LtRun(Precision::kFp32, kHopper, DType::kFloat32), Algo(k64x3), &d);
  EXPECT_TRUE(d.empty());
}

}  // namespace
}  // namespace tensorcheck::cuda::internal
