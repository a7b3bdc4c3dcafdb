#include "server/stats/error_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/executor.h"
#include "core/float_formats.h"

namespace tensorcheck {
namespace {

TEST(ErrorModelTest, OutputUnitRoundoffIsHalfAnUlpAtOne) {
  EXPECT_EQ(OutputUnitRoundoff(DType::kFloat64), 0x1p-53);
  EXPECT_EQ(OutputUnitRoundoff(DType::kFloat32), 0x1p-24);
  EXPECT_EQ(OutputUnitRoundoff(DType::kFloat16), 0x1p-11);
  EXPECT_EQ(OutputUnitRoundoff(DType::kBFloat16), 0x1p-8);
}

TEST(ErrorModelTest, BoundUnitRoundoffIsTheCoarsestOfInputAndAccumulate) {
  EXPECT_EQ(BoundUnitRoundoff(Precision::kFp64), 0x1p-53);
  EXPECT_EQ(BoundUnitRoundoff(Precision::kFp32), 0x1p-24);
  EXPECT_EQ(BoundUnitRoundoff(Precision::kTf32), 0x1p-11);
  EXPECT_EQ(BoundUnitRoundoff(Precision::kTf32Rna), 0x1p-11);
  EXPECT_EQ(BoundUnitRoundoff(Precision::kTf32Trunc), 0x1p-10);
  EXPECT_EQ(BoundUnitRoundoff(Precision::kBf16), 0x1p-8);
  EXPECT_EQ(BoundUnitRoundoff(Precision::kFp16), 0x1p-11);
  EXPECT_EQ(BoundUnitRoundoff(Precision::kFp16Acc), 0x1p-11);
}

TEST(ErrorModelTest, HardBoundMatchesHandComputation) {
  // bf16, K = 16, sum|x||w| = 4, y = -2, bf16 output, c = 2:
  // 2 * 2^-8 * 4 * 4 + 2 * 2^-8 * 2 (the output's rounding and the
  // reference's) = 36/256; an unfused bias without x.w adds 2^-8 * 2 more.
  const float abs_dot[] = {4.0f};
  const float sq_dot[] = {1.0f};
  const double y[] = {-2.0};
  ErrorModelInput in{Precision::kBf16, 16, DType::kBFloat16, false, abs_dot, sq_dot, y, 1};
  float bound = 0;
  HardBound(in, /*c=*/2.0, &bound);
  EXPECT_EQ(bound, 36.0f / 256.0f);
  in.unfused_bias = true;
  HardBound(in, /*c=*/2.0, &bound);
  EXPECT_EQ(bound, 38.0f / 256.0f);
  // Inputs already bf16: fp32 accumulation's unit, 2 * 2^-24 * 4 * 4 + 4/256.
  in.unfused_bias = false;
  in.inputs_exact = true;
  HardBound(in, /*c=*/2.0, &bound);
  EXPECT_EQ(bound, static_cast<float>(32.0 * 0x1p-24 + 4.0 / 256.0));
}

TEST(ErrorModelTest, SigmaOfFp32AccumulationMatchesHandComputation) {
  // fp32 (exact inputs), K = 3, sq_dot = 2, y = 3, fp32 output:
  // (u^2/3)*3*(4/2 + 9/3) + (u^2/3)*9 = 5u^2 + 3u^2 = 8u^2, u = 2^-24.
  const float abs_dot[] = {5.0f};
  const float sq_dot[] = {2.0f};
  const double y[] = {3.0};
  ErrorModelInput in{Precision::kFp32, 3, DType::kFloat32, false, abs_dot, sq_dot, y, 1};
  float sigma = 0;
  const double sum_sq = PredictSigma(in, &sigma);
  EXPECT_FLOAT_EQ(sigma, static_cast<float>(std::sqrt(8.0) * 0x1p-24));
  EXPECT_EQ(sum_sq, double(sigma) * sigma);  // what it returns: the sum of squares written
}

TEST(ErrorModelTest, SumOfSquaresIsNotFiniteWhenASigmaIsNot) {
  const float abs_dot[] = {1.0f, 1.0f};
  const float sq_dot[] = {1.0f, std::numeric_limits<float>::quiet_NaN()};
  const double y[] = {1.0, 1.0};
  ErrorModelInput in{Precision::kFp32, 4, DType::kFloat32, false, abs_dot, sq_dot, y, 2};
  float sigma[2] = {0, 0};
  EXPECT_FALSE(std::isfinite(PredictPairSigma(in, sigma)));
  EXPECT_TRUE(std::isnan(sigma[1]));
}

TEST(ErrorModelTest, SigmaOfBf16InputsIsDominatedByInputRounding) {
  // K = 1, sq_dot = 1, y = 0: (2/3) 2^-16 + (2^-48/3)(1/2).
  const float abs_dot[] = {1.0f};
  const float sq_dot[] = {1.0f};
  const double y[] = {0.0};
  ErrorModelInput in{Precision::kBf16, 1, DType::kFloat32, false, abs_dot, sq_dot, y, 1};
  float sigma = 0;
  PredictSigma(in, &sigma);
  EXPECT_NEAR(sigma, 0x1p-8 * std::sqrt(2.0 / 3.0), 1e-9);
}

TEST(ErrorModelTest, UnfusedBiasCountsTheOutputRoundingTwice) {
  // fp64 compute into a bf16 output: the output rounding is all there is.
  const float abs_dot[] = {4.0f};
  const float sq_dot[] = {0.0f};
  const double y[] = {4.0};
  ErrorModelInput in{Precision::kFp64, 1, DType::kBFloat16, false, abs_dot, sq_dot, y, 1};
  float fused = 0, unfused = 0;
  PredictSigma(in, &fused);
  in.unfused_bias = true;
  PredictSigma(in, &unfused);
  EXPECT_NEAR(fused, 0x1p-8 * 4.0 / std::sqrt(3.0), 1e-9);
  EXPECT_NEAR(unfused / fused, std::sqrt(2.0), 1e-6);
}

TEST(ErrorModelTest, UnfusedBiasRoundsTheGemmResultAtItsOwnMagnitude) {
  // fp64 into bf16, y = 0.0625 after a = 3 met b = -2.9375: the first
  // rounding is of a (u_out^2/3 * 9), the second of y (u_out^2/3 / 256).
  const float abs_dot[] = {3.0f};
  const float sq_dot[] = {0.0f};
  const float pre_bias[] = {3.0f};
  const double y[] = {0.0625};
  ErrorModelInput in{
      Precision::kFp64, 1, DType::kBFloat16, /*unfused_bias=*/true, abs_dot, sq_dot, y, 1};
  in.pre_bias = pre_bias;
  float sigma = 0, bound = 0;
  PredictSigma(in, &sigma);
  HardBound(in, /*c=*/1.0, &bound);
  const double u = 0x1p-8;
  EXPECT_NEAR(sigma, std::sqrt(u * u / 3 * (9.0 + 0.0625 * 0.0625)), 1e-9);
  // c*u_p*sqrt(K)*A + u_out*|a| + 2*u_out*|y|, u_p = 2^-53.
  EXPECT_NEAR(bound, 0x1p-53 * 3.0 + u * 3.0 + 2 * u * 0.0625, 1e-9);
}

TEST(ErrorModelTest, PairAccumulationSigmaHasNoOutputFloor) {
  // fp64 accumulation of an exact zero into fp16: nothing to round, so the
  // accumulation sigma is the smallest float, not fp16's subnormal step.
  const float abs_dot[] = {0.0f};
  const float sq_dot[] = {0.0f};
  const double y[] = {0.0};
  ErrorModelInput in{Precision::kFp64, 8, DType::kFloat16, false, abs_dot, sq_dot, y, 1};
  float acc = 0, pair = 0;
  PredictPairAccumulationSigma(in, &acc);
  PredictPairSigma(in, &pair);
  EXPECT_EQ(acc, std::numeric_limits<float>::denorm_min());
  EXPECT_EQ(pair, 0x1p-25f);  // the output's floor: u_out * smallest normal
}

TEST(ErrorModelTest, OutputSpacingIsTheStepBetweenNeighbours) {
  EXPECT_EQ(OutputSpacing(1.0, DType::kBFloat16), 0x1p-7);
  EXPECT_EQ(OutputSpacing(-3.0, DType::kBFloat16), 0x1p-6);
  EXPECT_EQ(OutputSpacing(1.0, DType::kFloat16), 0x1p-10);
  EXPECT_EQ(OutputSpacing(1e-6, DType::kFloat16), 0x1p-24);  // subnormal
  EXPECT_EQ(OutputSpacing(0.0, DType::kBFloat16), 0x1p-133);
  EXPECT_EQ(OutputSpacing(1.0, DType::kFloat32), 0x1p-23);
}

// tanh-form GELU, for its slope by central differences.
double Gelu(double v) {
  return 0.5 * v * (1 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
}

TEST(ErrorModelTest, FlipGridIsTheCoarsestGridOnTheAccumulatorsWay) {
  // Column 0: a = 1.5, b = 0.25 (u = 1.75); column 1: a = 3, b = -2.9375
  // (u = 0.0625, an unfused cancellation); column 2: a = -1, b = 0.5.
  const float pre_bias[] = {1.5f, 3.0f, -1.0f};
  const double bias[] = {0.25, -2.9375, 0.5};
  FlipGridInput in;
  in.output_dtype = DType::kBFloat16;
  in.pre_bias = pre_bias;
  in.bias = bias;
  in.cols = 3;
  in.count = 3;
  float grid[3];
  FlipGrid(in, grid);  // fused, no activation: the step at a + b
  EXPECT_EQ(grid[0], 0x1p-7f);
  EXPECT_EQ(grid[1], 0x1p-11f);
  EXPECT_EQ(grid[2], 0x1p-8f);
  in.unfused_bias = true;  // the coarser of a's step and a + b's
  FlipGrid(in, grid);
  EXPECT_EQ(grid[0], 0x1p-7f);
  EXPECT_EQ(grid[1], 0x1p-6f);
  EXPECT_EQ(grid[2], 0x1p-7f);
  in.unfused_bias = false;
  in.activation = Activation::kRelu;  // a + b = -0.5 is cut: no flip shows
  FlipGrid(in, grid);
  EXPECT_EQ(grid[0], 0x1p-7f);
  EXPECT_TRUE(std::isinf(grid[2]));
  in.activation = Activation::kGeluTanh;  // the output step over the slope
  FlipGrid(in, grid);
  const double slope = (Gelu(1.75 + 1e-6) - Gelu(1.75 - 1e-6)) / 2e-6;
  EXPECT_NEAR(grid[0], OutputSpacing(Gelu(1.75), DType::kBFloat16) / slope, 1e-8);
}

TEST(ErrorModelTest, FlipChanceIsMeanAbsoluteDifferenceOverTheGrid) {
  EXPECT_NEAR(FlipChance(0x1p-10f, 0x1p-7f), std::sqrt(2 / M_PI) / 8, 1e-12);
  EXPECT_EQ(FlipChance(1.0f, 0x1p-7f), 1.0);  // capped
  EXPECT_EQ(FlipChance(1.0f, std::numeric_limits<float>::infinity()), 0.0);
}

// P(X >= d) for X ~ Poisson(l), summed naively in long double.
double NaivePoissonTail(int64_t d, double l) {
  long double term = std::exp(-static_cast<long double>(l)), below = 0;
  for (int64_t j = 0; j < d; ++j) {
    below += term;
    term *= static_cast<long double>(l) / static_cast<long double>(j + 1);
  }
  return static_cast<double>(1.0L - below);
}

TEST(ErrorModelTest, PoissonUpperTailMatchesHandAndNaiveSums) {
  EXPECT_EQ(PoissonUpperTail(0, 3.0), 1.0);
  EXPECT_NEAR(PoissonUpperTail(1, 0.5), 1 - std::exp(-0.5), 1e-15);
  EXPECT_NEAR(PoissonUpperTail(3, 0.5), 1 - std::exp(-0.5) * (1 + 0.5 + 0.125), 1e-15);
  // Far in the tail: about l^2/2 for two events at a tiny rate.
  EXPECT_NEAR(PoissonUpperTail(2, 1e-7) / (0.5e-14), 1.0, 1e-6);
  EXPECT_EQ(PoissonUpperTail(5, 0.0), 0.0);
  for (const auto& [d, l] : std::vector<std::pair<int64_t, double>>{
           {1100, 1000.0}, {950, 1000.0}, {30, 12.5}, {257, 3027.0}}) {
    SCOPED_TRACE(::testing::Message() << d << " " << l);
    EXPECT_NEAR(PoissonUpperTail(d, l), NaivePoissonTail(d, l), 1e-12);
  }
  // 187 rounding flips where 6e-6 are expected: beyond any doubt.
  EXPECT_LT(PoissonUpperTail(187, 5.6e-6), 1e-300);
}

TEST(ErrorModelTest, SigmaIsNeverZero) {
  const float zeros_f[] = {0.0f};
  const double zeros_d[] = {0.0};
  for (DType d : kWideDTypes) {
    ErrorModelInput in{Precision::kFp64, 8, d, false, zeros_f, zeros_f, zeros_d, 1};
    float sigma = 0;
    PredictSigma(in, &sigma);
    EXPECT_GT(sigma, 0.0f) << DTypeName(d);
  }
  ErrorModelInput fp16{Precision::kFp16, 8, DType::kFloat16, false, zeros_f, zeros_f, zeros_d, 1};
  float sigma = 0;
  PredictSigma(fp16, &sigma);
  EXPECT_EQ(sigma, 0x1p-25f);  // u_out * smallest normal = 2^-11 * 2^-14
}

// Runs an M x K times K x N product the way a precision does on the CPU
// (inputs rounded by `round`, sequential fp32 accumulation with fused
// multiply-add) and returns measured rms error vs fp64 over predicted rms
// sigma.
template <typename Round>
double MeasuredOverPredicted(Precision p, int64_t k, Round round) {
  const int64_t outputs = 512;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> abs_dot(outputs), sq_dot(outputs), sigma(outputs);
  std::vector<double> y(outputs);
  double err2 = 0;
  for (int64_t o = 0; o < outputs; ++o) {
    double exact = 0, abs_sum = 0, sq_sum = 0;
    float acc = 0;
    for (int64_t i = 0; i < k; ++i) {
      const float x = normal(rng);
      const float w = normal(rng);
      const double prod = static_cast<double>(x) * w;  // exact in fp64
      exact += prod;
      abs_sum += std::fabs(prod);
      sq_sum += prod * prod;
      acc = std::fma(round(x), round(w), acc);
    }
    y[o] = exact;
    abs_dot[o] = static_cast<float>(abs_sum);
    sq_dot[o] = static_cast<float>(std::sqrt(sq_sum));
    const double e = static_cast<double>(acc) - exact;
    err2 += e * e;
  }
  ErrorModelInput in{p,        k,      DType::kFloat32, false, abs_dot.data(), sq_dot.data(),
                     y.data(), outputs};
  PredictSigma(in, sigma.data());
  double sigma2 = 0;
  for (float s : sigma) sigma2 += static_cast<double>(s) * s;
  return std::sqrt(err2 / sigma2);
}

TEST(ErrorModelTest, Bf16ProductsAccumulatedInFp32MatchPredictedRms) {
  const double ratio =
      MeasuredOverPredicted(Precision::kBf16, 1024, [](float v) { return RoundToBf16(v); });
  RecordProperty("measured_over_predicted", std::to_string(ratio));
  EXPECT_GE(ratio, 0.3);
  EXPECT_LE(ratio, 3.0);
}

TEST(ErrorModelTest, Fp32AccumulationErrorMatchesPredictedRms) {
  const double ratio = MeasuredOverPredicted(Precision::kFp32, 4096, [](float v) { return v; });
  RecordProperty("measured_over_predicted", std::to_string(ratio));
  EXPECT_GE(ratio, 0.3);
  EXPECT_LE(ratio, 3.0);
}

TEST(ErrorModelTest, Tf32InputsAccumulatedInFp32MatchPredictedRms) {
  const double ratio = MeasuredOverPredicted(
      Precision::kTf32, 768, [](float v) { return RoundToTf32(v, Tf32Rounding::kNearestEven); });
  RecordProperty("measured_over_predicted", std::to_string(ratio));
  EXPECT_GE(ratio, 0.3);
  EXPECT_LE(ratio, 3.0);
}

TEST(ErrorModelTest, PairSigmaDropsInputRoundingAndDoublesTheRest) {
  // bf16, K = 1, sq_dot = 1, y = 0, fp32 output: only the accumulation term
  // (2^-48/3)(1/2) remains, twice.
  const float abs_dot[] = {1.0f};
  const float sq_dot[] = {1.0f};
  const double y[] = {0.0};
  ErrorModelInput in{Precision::kBf16, 1, DType::kFloat32, false, abs_dot, sq_dot, y, 1};
  float sigma = 0;
  PredictPairSigma(in, &sigma);
  EXPECT_FLOAT_EQ(sigma, static_cast<float>(0x1p-24 / std::sqrt(3.0)));
}

TEST(ErrorModelTest, TwoSummationOrdersDifferByThePredictedPairRms) {
  // fp32 products summed in fp32 forwards and backwards. (Short products,
  // e.g. bf16 x bf16 with 16 significant bits, make many fp32 additions
  // exact, and the model then overestimates.)
  const int64_t outputs = 256, k = 2048;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> abs_dot(outputs), sq_dot(outputs), sigma(outputs);
  std::vector<double> y(outputs);
  std::vector<float> p(k);
  double diff2 = 0;
  for (int64_t o = 0; o < outputs; ++o) {
    double exact = 0, abs_sum = 0, sq_sum = 0;
    for (int64_t i = 0; i < k; ++i) {
      p[i] = normal(rng) * normal(rng);  // the same rounded products in both
      exact += p[i];
      abs_sum += std::fabs(p[i]);
      sq_sum += static_cast<double>(p[i]) * p[i];
    }
    float fwd = 0, bwd = 0;
    for (int64_t i = 0; i < k; ++i) fwd += p[i];
    for (int64_t i = k - 1; i >= 0; --i) bwd += p[i];
    y[o] = exact;
    abs_dot[o] = static_cast<float>(abs_sum);
    sq_dot[o] = static_cast<float>(std::sqrt(sq_sum));
    const double d = static_cast<double>(fwd) - bwd;
    diff2 += d * d;
  }
  ErrorModelInput in{Precision::kFp32, k,        DType::kFloat32, false, abs_dot.data(),
                     sq_dot.data(),    y.data(), outputs};
  PredictPairSigma(in, sigma.data());
  double sigma2 = 0;
  for (float s : sigma) sigma2 += static_cast<double>(s) * s;
  const double ratio = std::sqrt(diff2 / sigma2);
  RecordProperty("measured_over_predicted", std::to_string(ratio));
  EXPECT_GE(ratio, 0.3);
  EXPECT_LE(ratio, 3.0);
}

// Short products (both operands rounded by `round`) summed in fp32 in two
// orders, `first` and `second` ("seq": one accumulator over k; "rev": the
// same backwards; "pairwise": a balanced tree), against the pair
// accumulation sigma with the short-product scale of `product_bits`:
// measured rms difference over predicted.
template <typename Round>
double ShortProductPairOverPredicted(int64_t k, int product_bits, Round round,
                                     const std::string& first, const std::string& second) {
  const int64_t outputs = 256;
  std::mt19937 rng(static_cast<unsigned>(k + product_bits));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> abs_dot(outputs), sq_dot(outputs), sigma(outputs), p(k);
  std::vector<double> y(outputs);
  auto sum = [&](const std::string& order) {
    if (order == "seq" || order == "rev") {
      float acc = 0;
      for (int64_t i = 0; i < k; ++i) acc += p[order == "seq" ? i : k - 1 - i];
      return acc;
    }
    std::vector<float> level(p);  // pairwise: halve until one is left
    while (level.size() > 1) {
      std::vector<float> next((level.size() + 1) / 2);
      for (size_t i = 0; i < next.size(); ++i) {
        next[i] = 2 * i + 1 < level.size() ? level[2 * i] + level[2 * i + 1] : level[2 * i];
      }
      level.swap(next);
    }
    return level[0];
  };
  double diff2 = 0;
  for (int64_t o = 0; o < outputs; ++o) {
    double exact = 0, abs_sum = 0, sq_sum = 0;
    for (int64_t i = 0; i < k; ++i) {
      // Products of two short significands are exact in fp32 and fp64.
      p[i] = round(normal(rng)) * round(normal(rng) / std::sqrt(static_cast<float>(k)));
      exact += p[i];
      abs_sum += std::fabs(p[i]);
      sq_sum += static_cast<double>(p[i]) * p[i];
    }
    y[o] = exact;
    abs_dot[o] = static_cast<float>(abs_sum);
    sq_dot[o] = static_cast<float>(std::sqrt(sq_sum));
    const double d = static_cast<double>(sum(first)) - sum(second);
    diff2 += d * d;
  }
  ErrorModelInput in{Precision::kFp32, k,        DType::kFloat32, false, abs_dot.data(),
                     sq_dot.data(),    y.data(), outputs};
  in.accumulation_scale = ShortProductAccumulationScale(product_bits);
  PredictPairAccumulationSigma(in, sigma.data());
  double sigma2 = 0;
  for (float s : sigma) sigma2 += static_cast<double>(s) * s;
  return std::sqrt(diff2 / sigma2);
}

TEST(ErrorModelTest, ShortProductScaleCoversTwoOrdersWithoutOverstatingThemMuch) {
  const auto bf16 = [](float v) { return RoundToBf16(v); };
  const auto tf32 = [](float v) { return RoundToTf32(v, Tf32Rounding::kNearestEven); };
  EXPECT_EQ(ShortProductAccumulationScale(16), 0.36);
  EXPECT_EQ(ShortProductAccumulationScale(22), 0.56);
  EXPECT_EQ(ShortProductAccumulationScale(48), 1.0);
  struct Case {
    int64_t k;
    int bits;
    bool bf16;
    const char* first;
    const char* second;
  };
  // Two sequential orders are the most two orders differ: the scaled
  // model must still cover them (ratio <= 1), and stay within a factor of
  // 3 of a sequential sum against a tree (the calibration's goal).
  for (const Case& c :
       {Case{1024, 16, true, "seq", "rev"}, Case{4096, 16, true, "seq", "rev"},
        Case{1024, 22, false, "seq", "rev"}, Case{4096, 22, false, "seq", "rev"},
        Case{4096, 16, true, "seq", "pairwise"}, Case{4096, 22, false, "seq", "pairwise"}}) {
    const double ratio = c.bf16
                             ? ShortProductPairOverPredicted(c.k, c.bits, bf16, c.first, c.second)
                             : ShortProductPairOverPredicted(c.k, c.bits, tf32, c.first, c.second);
    SCOPED_TRACE(::testing::Message() << "K=" << c.k << " " << c.bits << "-bit products, "
                                      << c.first << " vs " << c.second << ": " << ratio);
    EXPECT_LE(ratio, 1.0);
    EXPECT_GE(ratio, 1.0 / 3.0);
  }
}

TEST(ErrorModelTest, PerElementPassesAreBitwiseTheSameOnAnyExecutor) {
  // Enough elements for several chunks of the per-element pass.
  const int64_t n = 300001, cols = 100;
  std::mt19937 rng(5);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<float> abs_dot(n), sq_dot(n), pre_bias(n);
  std::vector<double> y(n), bias(cols);
  for (double& b : bias) b = normal(rng);
  for (int64_t i = 0; i < n; ++i) {
    abs_dot[i] = static_cast<float>(std::fabs(normal(rng)) * 10);
    sq_dot[i] = abs_dot[i] / 3;
    pre_bias[i] = static_cast<float>(normal(rng));
    y[i] = pre_bias[i] + bias[i % cols];
  }
  auto run = [&](Executor* executor, std::vector<float>* sigma, std::vector<float>* grid) {
    ErrorModelInput in{Precision::kBf16, 4096,          DType::kFloat32, true,
                       abs_dot.data(),   sq_dot.data(), y.data(),        n};
    in.pre_bias = pre_bias.data();
    in.executor = executor;
    sigma->assign(n, 0.0f);
    const double sum_sq = PredictSigma(in, sigma->data());
    FlipGridInput g;
    g.output_dtype = DType::kBFloat16;
    g.unfused_bias = true;
    g.activation = Activation::kGeluTanh;
    g.pre_bias = pre_bias.data();
    g.bias = bias.data();
    g.cols = cols;
    g.count = n;
    g.executor = executor;
    grid->assign(n, 0.0f);
    FlipGrid(g, grid->data());
    return sum_sq;
  };
  std::vector<float> sigma_inline, grid_inline;
  const double sum_inline = run(nullptr, &sigma_inline, &grid_inline);
  for (int threads : {1, 3}) {
    SCOPED_TRACE(threads);
    auto executor = Executor::Create({threads});
    ASSERT_TRUE(executor.ok());
    std::vector<float> sigma, grid;
    const double sum = run(executor->get(), &sigma, &grid);
    EXPECT_EQ(std::memcmp(&sum, &sum_inline, sizeof(sum)), 0);
    EXPECT_EQ(std::memcmp(sigma.data(), sigma_inline.data(), n * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(grid.data(), grid_inline.data(), n * sizeof(float)), 0);
  }
}

}  // namespace
}  // namespace tensorcheck
