// The split-K rules of the CUDA backends (splitk_rules.h), on the host. The
// expected values are cublasLt.h's (the reduction schemes' numbers, the
// capability attributes' meaning) and the rules as splitk_rules.h states
// them.
#include "server/backends/cuda/internal/splitk_rules.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <string>

#include "core/status_macros.h"
#include "tests/testing/status_matchers.h"

namespace tensorcheck::cuda::internal {
namespace {

using ::tensorcheck::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

Config Split(const std::string& backend, Precision p, int splitk, SplitKReduce reduce) {
  Config c;
  c.backend = backend;
  c.precision = p;
  c.bias = backend == "cublaslt" ? BiasMode::kFused : BiasMode::kUnfused;
  c.splitk = splitk;
  c.reduce = reduce;
  return c;
}

SplitKQuery Query(const Config& c, std::optional<SplitKLayer> layer = std::nullopt,
                  bool disallow = false) {
  SplitKQuery q;
  q.config = c;
  q.layer = layer;
  q.disallow_reduced_precision_reduction = disallow;
  return q;
}

constexpr SplitKLayer kBf16Out{DType::kBFloat16, DType::kBFloat16};
constexpr SplitKLayer kFp16Out{DType::kFloat16, DType::kFloat16};

TEST(SplitKRulesTest, SchemeValuesAreCublasLtsEnum) {
  // cublasLt.h: NONE 0, INPLACE 1, COMPUTE_TYPE 2, OUTPUT_TYPE 4.
  EXPECT_EQ(static_cast<uint32_t>(LtReductionScheme::kNone), 0u);
  EXPECT_EQ(static_cast<uint32_t>(LtReductionScheme::kInplace), 1u);
  EXPECT_EQ(static_cast<uint32_t>(LtReductionScheme::kComputeType), 2u);
  EXPECT_EQ(static_cast<uint32_t>(LtReductionScheme::kOutputType), 4u);
  EXPECT_STREQ(LtReductionSchemeName(LtReductionScheme::kOutputType),
               "CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE");
  EXPECT_STREQ(LtReductionSchemeName(LtReductionScheme::kComputeType),
               "CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE");
}

TEST(SplitKRulesTest, NoSplitAsksNothing) {
  Config c = Split("cublas", Precision::kBf16, 0, SplitKReduce::kOutput);
  auto r = CheckSplitK(Query(c, kBf16Out, /*disallow=*/true));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->has_value());
}

TEST(SplitKRulesTest, ReduceOutputIsOutputTypeScheme) {
  for (Precision p : {Precision::kBf16, Precision::kFp16}) {
    const SplitKLayer layer = p == Precision::kBf16 ? kBf16Out : kFp16Out;
    auto r = CheckSplitK(Query(Split("cublaslt", p, 4, SplitKReduce::kOutput), layer));
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(r->has_value());
    EXPECT_EQ((*r)->splitk, 4);
    EXPECT_EQ((*r)->scheme, LtReductionScheme::kOutputType);
  }
}

TEST(SplitKRulesTest, ReduceFp32IsComputeTypeSchemeNotInplace) {
  // INPLACE adds in the output buffer's (bf16) type: not an fp32 reduction.
  auto r =
      CheckSplitK(Query(Split("cublaslt", Precision::kBf16, 16, SplitKReduce::kFp32), kBf16Out));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->has_value());
  EXPECT_EQ((*r)->splitk, 16);
  EXPECT_EQ((*r)->scheme, LtReductionScheme::kComputeType);
}

TEST(SplitKRulesTest, ReduceFp32IsAllowedUnderDisallowReducedPrecisionReduction) {
  auto r = CheckSplitK(
      Query(Split("cublaslt", Precision::kFp16, 3, SplitKReduce::kFp32), kFp16Out, true));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->scheme, LtReductionScheme::kComputeType);
}

TEST(SplitKRulesTest, ReduceOutputUnderDisallowIsRefusedNamingIt) {
  // With or without the layer: the request's option alone decides.
  for (std::optional<SplitKLayer> layer : {std::optional<SplitKLayer>(), std::optional(kBf16Out)}) {
    EXPECT_THAT(
        CheckSplitK(Query(Split("cublaslt", Precision::kBf16, 4, SplitKReduce::kOutput), layer,
                          /*disallow=*/true))
            .status(),
        StatusIs(
            absl::StatusCode::kFailedPrecondition,
            AllOf(HasSubstr("cublaslt:bf16:fused@splitk=4,reduce=output"),
                  HasSubstr("disallow_reduced_precision_reduction"), HasSubstr("reduce=fp32"))));
  }
}

TEST(SplitKRulesTest, CublasIsRefusedNamingCublasLt) {
  const absl::Status s =
      CheckSplitK(Query(Split("cublas", Precision::kBf16, 4, SplitKReduce::kOutput))).status();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kFailedPrecondition,
                          AllOf(HasSubstr("cublas:bf16:unfused@splitk=4,reduce=output"),
                                HasSubstr("cublasGemmEx takes no split-K count"),
                                HasSubstr("cublaslt:bf16:fused@splitk=4,reduce=output"),
                                HasSubstr("CUBLASLT_ALGO_CONFIG_SPLITK_NUM"))));
  // A "no kernel" refusal would send a named configuration elsewhere: this
  // is a rule.
  EXPECT_FALSE(IsNoKernel(s));
}

TEST(SplitKRulesTest, CublasWithoutBiasSuggestsCublasLtWithoutBias) {
  Config c = Split("cublas", Precision::kFp16, 2, SplitKReduce::kFp32);
  c.bias = BiasMode::kNone;
  EXPECT_THAT(CheckSplitK(Query(c)).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("cublaslt:fp16:none@splitk=2,reduce=fp32 sets it")));
}

TEST(SplitKRulesTest, OtherPrecisionsAndCountsAreRefused) {
  // Configurations built by hand (the parser refuses these already).
  EXPECT_THAT(
      CheckSplitK(Query(Split("cublaslt", Precision::kFp32, 4, SplitKReduce::kOutput))).status(),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               HasSubstr("bf16 and fp16 precisions only, not fp32")));
  EXPECT_THAT(
      CheckSplitK(Query(Split("cublaslt", Precision::kFp16Acc, 4, SplitKReduce::kOutput))).status(),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not fp16acc")));
  EXPECT_THAT(
      CheckSplitK(Query(Split("cublaslt", Precision::kBf16, 1, SplitKReduce::kOutput))).status(),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("outside 2..64")));
  EXPECT_THAT(
      CheckSplitK(Query(Split("cublaslt", Precision::kBf16, 65, SplitKReduce::kOutput))).status(),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("outside 2..64")));
  EXPECT_TRUE(
      CheckSplitK(Query(Split("cublaslt", Precision::kBf16, 64, SplitKReduce::kOutput))).ok());
}

TEST(SplitKRulesTest, ReduceOutputNeedsDToBeTheOutput) {
  // bf16 output, fp32 bias: D is fp32 (gemm_plan.h), and OUTPUT_TYPE would
  // reduce in fp32.
  EXPECT_THAT(CheckSplitK(Query(Split("cublaslt", Precision::kBf16, 4, SplitKReduce::kOutput),
                                SplitKLayer{DType::kFloat32, DType::kBFloat16}))
                  .status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("D is float32"), HasSubstr("output's bfloat16"),
                             HasSubstr("cuBLASLt would reduce in float32"))));
  // fp32 output: D is the output, and the output type is fp32.
  EXPECT_TRUE(CheckSplitK(Query(Split("cublaslt", Precision::kBf16, 4, SplitKReduce::kOutput),
                                SplitKLayer{DType::kFloat32, DType::kFloat32}))
                  .ok());
  // reduce=fp32 does not care where D is.
  EXPECT_TRUE(CheckSplitK(Query(Split("cublaslt", Precision::kBf16, 4, SplitKReduce::kFp32),
                                SplitKLayer{DType::kFloat32, DType::kBFloat16}))
                  .ok());
}

TEST(SplitKRulesTest, AlgorithmCapabilities) {
  const SplitKGemm output{4, LtReductionScheme::kOutputType};
  const SplitKGemm fp32{4, LtReductionScheme::kComputeType};
  EXPECT_EQ(AlgoTakesSplitK(LtAlgoCaps{0, 0x7}, output), SplitKMiss::kNoSplitK);
  EXPECT_EQ(AlgoTakesSplitK(LtAlgoCaps{1, 0x7}, output), SplitKMiss::kNone);
  EXPECT_EQ(AlgoTakesSplitK(LtAlgoCaps{1, 0x7}, fp32), SplitKMiss::kNone);
  // INPLACE | COMPUTE_TYPE: no OUTPUT_TYPE.
  EXPECT_EQ(AlgoTakesSplitK(LtAlgoCaps{1, 0x3}, output), SplitKMiss::kNoScheme);
  EXPECT_EQ(AlgoTakesSplitK(LtAlgoCaps{1, 0x3}, fp32), SplitKMiss::kNone);
  // OUTPUT_TYPE only.
  EXPECT_EQ(AlgoTakesSplitK(LtAlgoCaps{1, 0x4}, fp32), SplitKMiss::kNoScheme);
  EXPECT_EQ(AlgoTakesSplitK(LtAlgoCaps{1, 0x0}, output), SplitKMiss::kNoScheme);
}

TEST(SplitKRulesTest, Workspace) {
  // 64 x 512 fp32 partials, 4 of them: 524288 bytes.
  EXPECT_EQ(WorkspaceFits(524288, 524288), SplitKMiss::kNone);
  EXPECT_EQ(WorkspaceFits(524289, 524288), SplitKMiss::kNoWorkspace);
  EXPECT_EQ(WorkspaceFits(0, 0), SplitKMiss::kNone);
}

TEST(SplitKRulesTest, NoAlgorithmIsNoKernelWithTheTally) {
  SplitKTally t;
  t.Count(SplitKMiss::kNoSplitK);
  t.Count(SplitKMiss::kNoSplitK);
  t.Count(SplitKMiss::kNoScheme);
  t.Count(SplitKMiss::kNoWorkspace);
  t.largest_workspace_needed = 8388608;
  EXPECT_EQ(t.tried, 4);
  const absl::Status s = NoSplitKAlgorithm("cublaslt:bf16:fused@splitk=8,reduce=output",
                                           SplitKGemm{8, LtReductionScheme::kOutputType}, t,
                                           "m=16 n=512 k=14336", 4194304, "NVIDIA H200");
  EXPECT_TRUE(IsNoKernel(s));
  EXPECT_THAT(s,
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("cublaslt:bf16:fused@splitk=8,reduce=output"),
                             HasSubstr("split-K with 8 partitions reduced by "
                                       "CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE"),
                             HasSubstr("m=16 n=512 k=14336"), HasSubstr("4194304 bytes"),
                             HasSubstr("NVIDIA H200"), HasSubstr("of 4 algorithms tried"),
                             HasSubstr("2 without split-K"), HasSubstr("1 without the reduction"),
                             HasSubstr("1 needing more workspace than the limit (up to "
                                       "8388608 bytes)"))));
  // Nothing to try at all.
  EXPECT_THAT(NoSplitKAlgorithm("c", SplitKGemm{2, LtReductionScheme::kComputeType}, SplitKTally{},
                                "p", 0, "d"),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("of 0 algorithms tried")));
}

TEST(SplitKRulesTest, DetailsNameTheSplitAndTheCanonicalConfiguration) {
  std::map<std::string, std::string> d;
  DescribeSplitK(Split("cublaslt", Precision::kBf16, 4, SplitKReduce::kFp32),
                 SplitKGemm{4, LtReductionScheme::kComputeType}, &d);
  EXPECT_EQ(d.at("config"), "cublaslt:bf16:fused@splitk=4,reduce=fp32");
  EXPECT_EQ(d.at("split_k"),
            "splitk=4,reduce=fp32: CUBLASLT_ALGO_CONFIG_SPLITK_NUM 4, "
            "CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE");
}

TEST(SplitKRulesTest, CublasReductionInTheSameTerms) {
  EXPECT_THAT(CublasReduction(true),
              AllOf(HasSubstr("compute type only"),
                    HasSubstr("CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION")));
  EXPECT_THAT(CublasReduction(false), HasSubstr("may be reduced in the output type"));
}

}  // namespace
}  // namespace tensorcheck::cuda::internal
