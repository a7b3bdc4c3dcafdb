#include "server/engine/engine.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "tests/testing/ref_round.h"
#include "tests/testing/stats_testing.h"
#include "tests/testing/status_matchers.h"

namespace tensorcheck {
namespace {

using ::tensorcheck::testing::IsOk;
using ::tensorcheck::testing::StatusIs;
using ::testing::HasSubstr;

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_THAT(RegisterBuiltinBackends(&registry_), IsOk());
    auto engine = Engine::Create(EngineOptions{}, &registry_);
    ASSERT_THAT(engine, IsOk());
    engine_ = std::move(engine).value();
  }

  static Tensor Random(std::vector<int64_t> shape, double stddev, uint32_t seed,
                       DType dtype = DType::kFloat32) {
    return ::tensorcheck::testing::RandomNormal(shape, stddev, seed, dtype);
  }

  // y = x W^T + b in fp64 from the tensors' exact values ([N, K] weight).
  static std::vector<double> Fp64Linear(const Tensor& x, const Tensor& w, const Tensor* b) {
    const int64_t k = x.shape().back(), m = x.numel() / k, n = w.dim(0);
    std::vector<double> y(static_cast<size_t>(m * n));
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double acc = b ? b->GetDouble(j) : 0.0;
        for (int64_t p = 0; p < k; ++p) acc += x.GetDouble(i * k + p) * w.GetDouble(j * k + p);
        y[static_cast<size_t>(i * n + j)] = acc;
      }
    }
    return y;
  }

  LinearRequest Request(int64_t m, int64_t k, int64_t n, bool bias) {
    LinearRequest r;
    r.input = Random({m, k}, 1.0, 1);
    r.weight = Random({n, k}, 1.0 / std::sqrt(double(k)), 2);
    if (bias) r.bias = Random({n}, 0.5, 3);
    return r;
  }

  BackendRegistry registry_;
  std::unique_ptr<Engine> engine_;
};

TEST_F(EngineTest, ObservedFp64ResultPassesUnderTorchTolerance) {
  LinearRequest r = Request(4, 64, 8, /*bias=*/true);
  const std::vector<double> y = Fp64Linear(r.input, r.weight, &*r.bias);
  r.observed = *FromDoubles(DType::kFloat32, {4, 8}, y);
  r.configs = {"cpu:fp32", "cpu:tf32:unfused"};
  auto out = engine_->Verify(r);
  ASSERT_THAT(out, IsOk());
  EXPECT_TRUE(out->passed);
  ASSERT_EQ(out->results.size(), 2u);
  EXPECT_EQ(out->results[0].config, "cpu:fp32:fused");
  EXPECT_EQ(out->results[1].config, "cpu:tf32:unfused");
  EXPECT_EQ(out->reference.config, "cpu:fp64:fused");
  EXPECT_EQ(out->output_shape, (std::vector<int64_t>{4, 8}));
  ASSERT_TRUE(out->observed_vs_reference.has_value());
  // Both are the fp64 result rounded once to fp32.
  EXPECT_TRUE(out->observed_vs_reference->bitwise_equal);
  ASSERT_TRUE(out->results[0].vs_observed.has_value());
  EXPECT_EQ(out->results[0].vs_observed->total, 32);
}

TEST_F(EngineTest, ObservedOffByOnePercentFailsAndNamesWorstElement) {
  LinearRequest r = Request(3, 16, 5, /*bias=*/false);
  std::vector<double> y = Fp64Linear(r.input, r.weight, nullptr);
  y[7] += 0.01 * std::fabs(y[7]) + 0.01;  // row 1, column 2
  r.observed = *FromDoubles(DType::kFloat32, {3, 5}, y);
  auto out = engine_->Verify(r);
  ASSERT_THAT(out, IsOk());
  EXPECT_FALSE(out->passed);
  EXPECT_EQ(out->observed_vs_reference->mismatched, 1);
  EXPECT_EQ(out->observed_vs_reference->max_abs_index, 7);
  EXPECT_EQ(UnflattenIndex(7, out->output_shape), (std::vector<int64_t>{1, 2}));
}

// x W^T + b of bf16 tensors the way a bf16 layer computes it: products
// exact in fp32, summed in fp32 over k in order, the bias added to the fp32
// sum (fused) or to the sum rounded to bf16 (unfused), one rounding to bf16.
std::vector<double> Bf16Linear(const Tensor& x, const Tensor& w, const Tensor& b, bool unfused) {
  using ::tensorcheck::testing::kBf16Format;
  using ::tensorcheck::testing::kFp32Format;
  using ::tensorcheck::testing::RefRound;
  const int64_t k = x.shape().back(), m = x.numel() / k, n = w.dim(0);
  std::vector<double> y(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t p = 0; p < k; ++p) {
        acc = RefRound(acc + x.GetDouble(i * k + p) * w.GetDouble(j * k + p), kFp32Format);
      }
      if (unfused) acc = RefRound(acc, kBf16Format);
      y[static_cast<size_t>(i * n + j)] =
          RefRound(RefRound(acc + b.GetDouble(j), kFp32Format), kBf16Format);
    }
  }
  return y;
}

TEST_F(EngineTest, BoundChargesNoInputRoundingToInputsAlreadyInThePrecision) {
  // bf16 tensors under the bf16 bound: nothing rounds the inputs, so the
  // bound is fp32 accumulation's plus two output roundings (the output's
  // and the reference's). Clean outputs, fused and unfused, pass it; one
  // weight element doubled does not, and only in its column.
  const int64_t m = 64, k = 256, n = 16;
  LinearRequest r;
  r.input = Random({m, k}, 1.0, 11, DType::kBFloat16);
  r.weight = Random({n, k}, 1.0 / std::sqrt(double(k)), 12, DType::kBFloat16);
  r.bias = Random({n}, 0.5, 13, DType::kBFloat16);
  r.configs = {"cpu:bf16"};
  r.tolerance.preset = TolerancePreset::kBound;
  for (bool unfused : {false, true}) {
    r.observed =
        *FromDoubles(DType::kBFloat16, {m, n}, Bf16Linear(r.input, r.weight, *r.bias, unfused));
    auto out = engine_->Verify(r);
    ASSERT_THAT(out, IsOk());
    EXPECT_TRUE(out->observed_vs_reference->passed) << (unfused ? "unfused" : "fused");
    EXPECT_EQ(out->observed_vs_reference->mismatched, 0);
  }
  // The largest weight of row 5 (output column 5), doubled.
  int64_t largest = 0;
  for (int64_t p = 0; p < k; ++p) {
    if (std::fabs(r.weight.GetDouble(5 * k + p)) > std::fabs(r.weight.GetDouble(5 * k + largest))) {
      largest = p;
    }
  }
  std::vector<double> w(static_cast<size_t>(n * k));
  for (int64_t i = 0; i < n * k; ++i) w[static_cast<size_t>(i)] = r.weight.GetDouble(i);
  w[static_cast<size_t>(5 * k + largest)] *= 2;  // exact in bf16
  const Tensor wrong = *FromDoubles(DType::kBFloat16, {n, k}, w);
  r.observed = *FromDoubles(DType::kBFloat16, {m, n}, Bf16Linear(r.input, wrong, *r.bias, false));
  auto out = engine_->Verify(r);
  ASSERT_THAT(out, IsOk());
  EXPECT_FALSE(out->passed);
  EXPECT_GT(out->observed_vs_reference->mismatched, m / 2);
  EXPECT_EQ(out->observed_vs_reference->max_abs_index % n, 5);
}

TEST_F(EngineTest, WithoutObservedVerdictRequiresEveryConfigurationToPass) {
  LinearRequest r = Request(2, 256, 16, /*bias=*/true);
  r.configs = {"cpu:fp32"};
  auto pass = engine_->Verify(r);
  ASSERT_THAT(pass, IsOk());
  EXPECT_TRUE(pass->passed);
  r.configs = {"cpu:fp32", "cpu:bf16"};  // bf16 inputs miss fp32's tolerance
  auto fail = engine_->Verify(r);
  ASSERT_THAT(fail, IsOk());
  EXPECT_FALSE(fail->passed);
  EXPECT_TRUE(fail->results[0].vs_reference.passed);
  EXPECT_FALSE(fail->results[1].vs_reference.passed);
}

TEST_F(EngineTest, BatchDimsAndInOutLayoutGiveTheSameNumbers) {
  LinearRequest r = Request(6, 32, 4, /*bias=*/false);
  const std::vector<double> y = Fp64Linear(r.input, r.weight, nullptr);
  // x as [2, 3, K]; W transposed to [K, N].
  ASSERT_THAT(r.input.Reshape({2, 3, 32}), IsOk());
  std::vector<double> wt(32 * 4);
  for (int64_t j = 0; j < 4; ++j) {
    for (int64_t p = 0; p < 32; ++p) wt[p * 4 + j] = r.weight.GetDouble(j * 32 + p);
  }
  r.weight = *FromDoubles(DType::kFloat32, {32, 4}, wt);
  r.layout = WeightLayout::kInOut;
  r.observed = *FromDoubles(DType::kFloat32, {2, 3, 4}, y);
  r.return_outputs = true;
  auto out = engine_->Verify(r);
  ASSERT_THAT(out, IsOk());
  EXPECT_EQ(out->output_shape, (std::vector<int64_t>{2, 3, 4}));
  EXPECT_TRUE(out->observed_vs_reference->bitwise_equal);
  ASSERT_TRUE(out->reference.output.has_value());
  EXPECT_EQ(out->reference.output->shape(), (std::vector<int64_t>{2, 3, 4}));
}

TEST_F(EngineTest, FlaxCaseTf32DiffersFromStrictFp32) {
  // The Flax case (README.md): 2x768 -> 512, x ~ N(0,1), W ~ N(0, 1/768), b = 0.
  LinearRequest r;
  r.input = Random({2, 768}, 1.0, 11);
  r.weight = Random({512, 768}, 1.0 / std::sqrt(768.0), 12);
  r.bias = *Tensor::Create(DType::kFloat32, {512});
  r.configs = {"cpu:tf32:fused", "cpu:fp32"};
  auto out = engine_->Verify(r);
  ASSERT_THAT(out, IsOk());
  const double tf32 = out->results[0].vs_reference.max_abs;
  const double fp32 = out->results[1].vs_reference.max_abs;
  EXPECT_GT(tf32, 3e-4);
  EXPECT_LT(tf32, 3e-3);
  EXPECT_LT(fp32, 1e-5);
  // The error model: TF32's error is what TF32 predicts, within a factor.
  ASSERT_TRUE(out->results[0].vs_reference.bound_ratio.has_value());
  EXPECT_GT(*out->results[0].vs_reference.bound_ratio, 0.2);
  EXPECT_LT(*out->results[0].vs_reference.bound_ratio, 3.0);
}

TEST_F(EngineTest, DuplicateConfigurationsRunOnce) {
  LinearRequest r = Request(2, 8, 3, /*bias=*/true);
  r.configs = {"cpu:fp32", "cpu:fp32:fused", "cpu:fp32:unfused"};
  auto out = engine_->Verify(r);
  ASSERT_THAT(out, IsOk());
  ASSERT_EQ(out->results.size(), 2u);
  EXPECT_EQ(out->results[1].config, "cpu:fp32:unfused");
}

TEST_F(EngineTest, ProgressCountsTheReferenceAndEachConfigurationThenTheRanking) {
  LinearRequest r = Request(2, 8, 3, /*bias=*/true);
  r.configs = {"cpu:fp32", "cpu:bf16:fused", "cpu:bf16:unfused"};
  RequestProgress progress;
  ASSERT_THAT(engine_->Verify(r, /*stop=*/nullptr, &progress), IsOk());
  RequestProgress::Snapshot s = progress.Get();
  EXPECT_EQ(s.phase, "running the configurations");
  EXPECT_EQ(s.done, 4);  // the reference and three configurations, all compared
  EXPECT_EQ(s.total, 4);
  r.observed = Random({2, 3}, 1.0, 4);
  ASSERT_THAT(engine_->Diagnose(r, /*stop=*/nullptr, &progress), IsOk());
  EXPECT_EQ(progress.Get().phase, "ranking the candidates");
}

TEST_F(EngineTest, NoBiasConfigurationsAreCanonicalNone) {
  LinearRequest r = Request(2, 8, 3, /*bias=*/false);
  r.configs = {"cpu:bf16:fused"};
  auto out = engine_->Verify(r);
  ASSERT_THAT(out, IsOk());
  EXPECT_EQ(out->results[0].config, "cpu:bf16:none");
}

TEST_F(EngineTest, WeightKMismatchIsInvalidArgumentNamingTheField) {
  LinearRequest r = Request(2, 8, 3, /*bias=*/false);
  r.weight = Random({3, 9}, 1.0, 4);
  EXPECT_THAT(engine_->Verify(r),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("op.weight.shape")));
}

TEST_F(EngineTest, BiasLengthMismatchIsInvalidArgument) {
  LinearRequest r = Request(2, 8, 3, /*bias=*/false);
  r.bias = Random({4}, 1.0, 5);
  EXPECT_THAT(engine_->Verify(r),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("op.bias.shape")));
}

TEST_F(EngineTest, ObservedShapeMismatchIsInvalidArgument) {
  LinearRequest r = Request(2, 8, 3, /*bias=*/false);
  r.observed = Random({3, 2}, 1.0, 6);
  EXPECT_THAT(engine_->Verify(r),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("observed.shape")));
}

TEST_F(EngineTest, WeightDtypeMismatchIsInvalidArgument) {
  LinearRequest r = Request(2, 8, 3, /*bias=*/false);
  r.weight = Random({3, 8}, 1.0, 7, DType::kFloat64);
  EXPECT_THAT(engine_->Verify(r),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("op.weight.dtype")));
}

TEST_F(EngineTest, UnknownBackendIsNotFound) {
  LinearRequest r = Request(2, 8, 3, /*bias=*/false);
  r.configs = {"tpu:fp32"};
  EXPECT_THAT(engine_->Verify(r), StatusIs(absl::StatusCode::kNotFound, HasSubstr("tpu")));
}

TEST_F(EngineTest, MalformedConfigurationIsInvalidArgument) {
  LinearRequest r = Request(2, 8, 3, /*bias=*/false);
  r.configs = {"cpu:fp32", "cpu:fp33"};
  EXPECT_THAT(engine_->Verify(r),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("configs[1]")));
}

TEST_F(EngineTest, BiasModeNoneWithABiasIsInvalidArgument) {
  LinearRequest r = Request(2, 8, 3, /*bias=*/true);
  r.configs = {"cpu:fp32:none"};
  EXPECT_THAT(engine_->Verify(r),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("configs[0]")));
}

TEST_F(EngineTest, OutputOverTheLimitIsResourceExhausted) {
  EngineOptions options;
  options.limits.max_output_elements = 100;
  auto engine = Engine::Create(options, &registry_);
  ASSERT_THAT(engine, IsOk());
  LinearRequest r = Request(11, 4, 10, /*bias=*/false);
  EXPECT_THAT((*engine)->Verify(r),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("output")));
}

TEST_F(EngineTest, TooManyConfigurationsIsInvalidArgument) {
  LinearRequest r = Request(2, 8, 3, /*bias=*/false);
  r.configs.assign(65, "cpu:fp32");
  EXPECT_THAT(engine_->Verify(r),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("configs")));
}

TEST_F(EngineTest, OutOfRangeOptionsAreInvalidArgument) {
  LinearRequest r = Request(2, 8, 3, /*bias=*/false);
  r.repeat = -1;
  EXPECT_THAT(engine_->Verify(r),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("repeat")));
  r.repeat = 0;
  r.top_k = 100000;
  EXPECT_THAT(engine_->Verify(r), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("top_k")));
  r.top_k = 0;
  r.tolerance.atol = -1;
  EXPECT_THAT(engine_->Verify(r),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tolerance.atol")));
}

TEST_F(EngineTest, RepeatReportsDeterminism) {
  LinearRequest r = Request(2, 8, 3, /*bias=*/false);
  r.configs = {"cpu:fp32"};
  r.repeat = 3;
  auto out = engine_->Verify(r);
  ASSERT_THAT(out, IsOk());
  EXPECT_EQ(out->results[0].runs, 3);
  EXPECT_TRUE(out->results[0].deterministic);
}

TEST_F(EngineTest, DiagnoseWithoutObservedIsInvalidArgument) {
  LinearRequest r = Request(2, 8, 3, /*bias=*/false);
  EXPECT_THAT(engine_->Diagnose(r),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("observed")));
}

TEST_F(EngineTest, DefaultCandidatesCoverEveryPrecisionAndBiasMode) {
  const auto with_bias =
      engine_->DefaultCandidates(DType::kFloat32, DType::kFloat32, true, Activation::kNone);
  // 8 precisions x {fused, unfused} on the cpu backend (no device here).
  EXPECT_THAT(with_bias, ::testing::Contains("cpu:tf32:unfused"));
  EXPECT_THAT(with_bias, ::testing::Contains("cpu:tf32rna:fused"));
  EXPECT_THAT(with_bias, ::testing::Contains("cpu:fp16acc:unfused"));
  EXPECT_EQ(with_bias.size(), 16u);
  const auto no_bias =
      engine_->DefaultCandidates(DType::kFloat32, DType::kFloat32, false, Activation::kNone);
  EXPECT_EQ(no_bias.size(), 8u);
  EXPECT_THAT(no_bias, ::testing::Contains("cpu:fp32:none"));
}

TEST_F(EngineTest, DiagnoseReturnsOnlyTheBestAndReferenceOutputs) {
  LinearRequest r = Request(2, 64, 8, /*bias=*/true);
  const std::vector<double> y = Fp64Linear(r.input, r.weight, &*r.bias);
  r.observed = *FromDoubles(DType::kFloat32, {2, 8}, y);
  r.return_outputs = true;
  auto out = engine_->Diagnose(r);
  ASSERT_THAT(out, IsOk());
  ASSERT_TRUE(out->diagnosis.has_value());
  const std::string kept = out->diagnosis->best.value_or(out->diagnosis->ranking[0].config);
  int with_output = 0;
  for (const ConfigOutcome& c : out->results) {
    if (c.output.has_value()) {
      ++with_output;
      EXPECT_EQ(c.config, kept);
    }
  }
  EXPECT_EQ(with_output, 1);
  EXPECT_TRUE(out->reference.output.has_value());
}

TEST(UnflattenIndexTest, RowMajor) {
  EXPECT_EQ(UnflattenIndex(0, {2, 3, 4}), (std::vector<int64_t>{0, 0, 0}));
  EXPECT_EQ(UnflattenIndex(23, {2, 3, 4}), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(UnflattenIndex(5, {2, 3}), (std::vector<int64_t>{1, 2}));
}

}  // namespace
}  // namespace tensorcheck

namespace tensorcheck {
namespace {

// Sharing GEMMs, error-model arrays and comparisons changes nothing but the
// time: every statistic and the whole diagnosis equal those of running and
// comparing each candidate on its own, under each tolerance preset.
TEST(EngineSharingTest, SharedAndSeparateRunsGiveTheSameOutcome) {
  BackendRegistry registry;
  ASSERT_THAT(RegisterBuiltinBackends(&registry), ::tensorcheck::testing::IsOk());
  EngineOptions shared_options, separate_options;
  separate_options.share_computations = false;
  auto shared = Engine::Create(shared_options, &registry);
  auto separate = Engine::Create(separate_options, &registry);
  ASSERT_TRUE(shared.ok() && separate.ok());
  for (TolerancePreset preset : {TolerancePreset::kTorch, TolerancePreset::kBound}) {
    LinearRequest r;
    r.input = ::tensorcheck::testing::RandomNormal({24, 96}, 1.0, 11, DType::kBFloat16);
    r.weight = ::tensorcheck::testing::RandomNormal({40, 96}, 0.1, 12, DType::kBFloat16);
    r.bias = ::tensorcheck::testing::RandomNormal({40}, 0.5, 13, DType::kBFloat16);
    r.observed = ::tensorcheck::testing::RandomNormal({24, 40}, 1.0, 14, DType::kBFloat16);
    r.tolerance.preset = preset;
    auto a = (*shared)->Diagnose(r);
    auto b = (*separate)->Diagnose(r);
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_EQ(a->results.size(), b->results.size());
    int shared_runs = 0;
    for (size_t i = 0; i < a->results.size(); ++i) {
      SCOPED_TRACE(a->results[i].config);
      EXPECT_EQ(a->results[i].config, b->results[i].config);
      ::tensorcheck::testing::ExpectSameStats(a->results[i].vs_reference,
                                              b->results[i].vs_reference);
      ::tensorcheck::testing::ExpectSameStats(*a->results[i].vs_observed,
                                              *b->results[i].vs_observed);
      EXPECT_TRUE(b->results[i].shared_computation.empty());
      shared_runs += a->results[i].shared_computation.empty() ? 0 : 1;
    }
    // bf16 storage: fp64 x2 reuse the reference's GEMM, fp32/tf32 x3/bf16
    // x2 one fp32 GEMM (9 reuse it), the unfused fp16 and fp16acc their
    // fused siblings'; where these values happen to be exact in fp16
    // (checked here), fp16 x2 join the fp32 GEMM instead. The observed
    // output is noise, so the second tier runs too: each FP8, MXFP8 and
    // NVFP4 recipe's unfused configuration reuses its fused sibling's GEMM
    // (9 more), and each split-K count's whose slices K = 96 fills (2, 3,
    // 4 and 6: 4 more).
    bool fp16_exact = true;
    for (const Tensor* t : {&r.input, &r.weight}) {
      for (int64_t i = 0; i < t->numel(); ++i) {
        const double v = t->GetDouble(i);
        fp16_exact = fp16_exact &&
                     ::tensorcheck::testing::RefRound(v, ::tensorcheck::testing::kFp16Format) == v;
      }
    }
    EXPECT_EQ(a->diagnosis->candidate_tiers, (std::vector<int>{1, 2}));
    EXPECT_EQ(shared_runs, (fp16_exact ? 14 : 13) + 9 + 4);
    ::tensorcheck::testing::ExpectSameStats(a->reference.vs_reference, b->reference.vs_reference);
    ASSERT_TRUE(a->diagnosis && b->diagnosis);
    EXPECT_EQ(a->diagnosis->best, b->diagnosis->best);
    EXPECT_EQ(a->diagnosis->explanation, b->diagnosis->explanation);
    ASSERT_EQ(a->diagnosis->ranking.size(), b->diagnosis->ranking.size());
    for (size_t i = 0; i < a->diagnosis->ranking.size(); ++i) {
      EXPECT_EQ(a->diagnosis->ranking[i].config, b->diagnosis->ranking[i].config);
      EXPECT_EQ(a->diagnosis->ranking[i].disagreements, b->diagnosis->ranking[i].disagreements);
    }
  }
}

}  // namespace
}  // namespace tensorcheck
