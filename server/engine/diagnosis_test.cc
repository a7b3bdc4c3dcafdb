// Diagnosis against observed outputs produced independently of the CPU
// backend: naive loops in this file, with their own rounding functions and
// other summation orders (pairwise, reversed), as a framework would.
#include "server/engine/diagnosis.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <set>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "server/engine/engine.h"
#include "server/engine/internal/diagnosis_evidence.h"
#include "tests/testing/status_matchers.h"

namespace tensorcheck {
namespace {

using ::tensorcheck::testing::IsOk;

// Rounds to a binary format with `mant` fraction bits and minimum normal
// exponent `emin`, to nearest even (written independently of core/).
double RoundTo(double v, int mant, int emin) {
  if (v == 0 || !std::isfinite(v)) return v;
  int e = std::ilogb(v);
  if (e < emin) e = emin;
  const double scaled = std::ldexp(v, mant - e);
  return std::ldexp(std::nearbyint(scaled), e - mant);
}
double Bf16(double v) { return RoundTo(v, 7, -126); }
double Fp16(double v) { return RoundTo(v, 10, -14); }
double Tf32(double v) { return RoundTo(v, 10, -126); }
float F32(double v) { return static_cast<float>(v); }

enum class Order { kPairwise, kReversed };

// fp32 sum of fp32 products in the given order.
float SumFp32(const std::vector<float>& terms, Order order) {
  if (order == Order::kReversed) {
    float acc = 0;
    for (size_t i = terms.size(); i-- > 0;) acc += terms[i];
    return acc;
  }
  std::vector<float> level = terms;
  while (level.size() > 1) {
    std::vector<float> next((level.size() + 1) / 2);
    for (size_t i = 0; i < next.size(); ++i) {
      next[i] = level[2 * i] + (2 * i + 1 < level.size() ? level[2 * i + 1] : 0.0f);
    }
    level.swap(next);
  }
  return level.empty() ? 0.0f : level[0];
}

struct Case {
  DType storage;
  std::function<double(double)> round_input;  // as the framework rounds x, W
  std::function<double(double)> round_out;    // to the output dtype
  bool fused;
  std::string truth;  // configuration that should be named
};

class DiagnosisTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_THAT(RegisterBuiltinBackends(&registry_), IsOk());
    auto engine = Engine::Create(EngineOptions{}, &registry_);
    ASSERT_THAT(engine, IsOk());
    engine_ = std::move(engine).value();
  }

  // x [m, k], W [n, k], b [n] stored in `storage`; a few large biases.
  LinearRequest MakeRequest(int64_t m, int64_t k, int64_t n, DType storage, uint32_t seed,
                            double bias_scale = 1.0) {
    std::mt19937 rng(seed);
    std::normal_distribution<double> normal(0.0, 1.0);
    std::vector<double> x(m * k), w(n * k), b(n);
    for (double& v : x) v = normal(rng);
    for (double& v : w) v = normal(rng) / std::sqrt(double(k));
    for (int64_t j = 0; j < n; ++j) {
      b[j] = bias_scale * normal(rng) * (j % 17 == 0 ? 4.0 : 0.5);
    }
    LinearRequest r;
    r.input = *FromDoubles(storage, {m, k}, x);
    r.weight = *FromDoubles(storage, {n, k}, w);
    r.bias = *FromDoubles(storage, {n}, b);
    return r;
  }

  // The observed output a framework following `c` produces.
  Tensor Observed(const LinearRequest& r, const Case& c, Order order, bool transpose_weight = false,
                  bool drop_bias = false) {
    const int64_t k = r.input.shape().back(), m = r.input.numel() / k;
    const int64_t n = r.weight.dim(0);
    std::vector<double> y(m * n);
    std::vector<float> terms(k);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        for (int64_t p = 0; p < k; ++p) {
          const double xv = c.round_input(r.input.GetDouble(i * k + p));
          const double wv = c.round_input(transpose_weight ? r.weight.GetDouble(p * n + j)
                                                           : r.weight.GetDouble(j * k + p));
          terms[p] = F32(xv * wv);  // exact for 16-bit and TF32 inputs
        }
        const float acc = SumFp32(terms, order);
        const double b = drop_bias ? 0.0 : r.bias->GetDouble(j);
        y[i * n + j] =
            c.fused ? c.round_out(F32(double(acc) + b)) : c.round_out(F32(c.round_out(acc) + b));
      }
    }
    return *FromDoubles(c.storage, {m, n}, y);
  }

  // The observed output of `c` computed with weight element `index` scaled
  // by `factor` (the request keeps the clean weight).
  Tensor ObservedWithWeightScaled(const LinearRequest& r, const Case& c, int64_t index,
                                  double factor) {
    LinearRequest wrong;
    wrong.input = r.input.Clone();
    wrong.bias = r.bias->Clone();
    std::vector<double> w(static_cast<size_t>(r.weight.numel()));
    for (int64_t i = 0; i < r.weight.numel(); ++i)
      w[static_cast<size_t>(i)] = r.weight.GetDouble(i);
    w[static_cast<size_t>(index)] *= factor;
    wrong.weight = *FromDoubles(r.weight.dtype(), r.weight.shape(), w);
    return Observed(wrong, c, Order::kPairwise);
  }

  static bool Names(const DiagnosisOutcome& d, const std::string& config) {
    if (!d.best) return false;
    if (*d.best == config) return true;
    for (const auto& e : d.equivalent) {
      if (e == config) return true;
    }
    return false;
  }

  BackendRegistry registry_;
  std::unique_ptr<Engine> engine_;
};

const Case kFp32{DType::kFloat32, [](double v) { return v; },
                 [](double v) { return double(F32(v)); }, true, "cpu:fp32:fused"};
const Case kTf32{DType::kFloat32, Tf32, [](double v) { return double(F32(v)); }, false,
                 "cpu:tf32:unfused"};
const Case kBf16Fused{DType::kBFloat16, [](double v) { return v; }, Bf16, true, "cpu:bf16:fused"};
const Case kBf16Unfused{DType::kBFloat16, [](double v) { return v; }, Bf16, false,
                        "cpu:bf16:unfused"};
const Case kFp16Fused{DType::kFloat16, [](double v) { return v; }, Fp16, true, "cpu:fp16:fused"};

class TruthRanksFirst : public DiagnosisTest,
                        public ::testing::WithParamInterface<std::tuple<int, int>> {};

TEST_P(TruthRanksFirst, AtFlaxAndLargerSizes) {
  const Case* cases[] = {&kFp32, &kTf32, &kBf16Fused, &kBf16Unfused, &kFp16Fused};
  const auto [case_index, size_index] = GetParam();
  const Case& c = *cases[case_index];
  // 2x768->512 (the Flax case) and the largest CI affords for a naive
  // reference loop (the full 1921x4096->3072 runs in bench/).
  const int64_t m = size_index == 0 ? 2 : 48;
  const int64_t k = size_index == 0 ? 768 : 1024;
  const int64_t n = size_index == 0 ? 512 : 768;
  LinearRequest r = MakeRequest(m, k, n, c.storage, 100 + case_index);
  r.observed = Observed(r, c, size_index == 0 ? Order::kPairwise : Order::kReversed);
  auto out = engine_->Diagnose(r);
  ASSERT_THAT(out, IsOk());
  const DiagnosisOutcome& d = *out->diagnosis;
  EXPECT_TRUE(Names(d, c.truth)) << "best: " << d.best.value_or("null") << "\n" << d.explanation;
  EXPECT_EQ(d.verdict, DiagnosisVerdict::kRounding) << d.verdict_reason;
  EXPECT_FALSE(d.defect.has_value());
  EXPECT_GT(d.confidence, 0.0) << d.explanation;
  EXPECT_FALSE(d.framework_hint.empty());
  EXPECT_TRUE(d.outliers.empty()) << d.explanation;
}

INSTANTIATE_TEST_SUITE_P(Cases, TruthRanksFirst,
                         ::testing::Combine(::testing::Range(0, 5), ::testing::Range(0, 2)));

TEST_F(DiagnosisTest, FlaxCaseIsTf32WithErrorNearItsBound) {
  LinearRequest r = MakeRequest(2, 768, 512, DType::kFloat32, 7, /*bias_scale=*/0.0);
  r.observed = Observed(r, kTf32, Order::kPairwise);
  auto out = engine_->Diagnose(r);
  ASSERT_THAT(out, IsOk());
  const DiagnosisOutcome& d = *out->diagnosis;
  ASSERT_TRUE(d.best.has_value()) << d.explanation;
  EXPECT_THAT(*d.best, ::testing::StartsWith("cpu:tf32"));
  // Zero bias: fused and unfused compute the same bits and are merged.
  EXPECT_THAT(d.framework_hint, ::testing::HasSubstr("TF32"));
  EXPECT_THAT(d.explanation, ::testing::HasSubstr("Strict fp32"));
  EXPECT_GT(d.confidence, 0.5);
  // Observed vs the fp64 reference: TF32-sized, not fp32-sized.
  EXPECT_GT(out->observed_vs_reference->max_abs, 3e-4);
}

TEST_F(DiagnosisTest, CandleCaseMatchesUnfusedAndLocalizesTheDifferences) {
  LinearRequest r = MakeRequest(48, 1024, 768, DType::kBFloat16, 8);
  r.observed = Observed(r, kBf16Unfused, Order::kReversed);
  auto out = engine_->Diagnose(r);
  ASSERT_THAT(out, IsOk());
  const DiagnosisOutcome& d = *out->diagnosis;
  ASSERT_TRUE(Names(d, "cpu:bf16:unfused")) << d.explanation;
  EXPECT_THAT(d.framework_hint, ::testing::HasSubstr("candle"));
  // The fused (PyTorch) result differs from candle's in a share of the
  // elements, mostly by one bf16 ULP (more only where x W^T + b cancels to
  // near zero); localization says where, largest first.
  const RankedCandidate* fused = nullptr;
  for (const RankedCandidate& c : d.ranking) {
    if (c.config == "cpu:bf16:fused") fused = &c;
  }
  ASSERT_NE(fused, nullptr);
  EXPECT_LT(fused->bitwise_equal_fraction, 0.999);
  EXPECT_GT(fused->bitwise_equal_fraction, 0.5);
  // Here the bias of every column moves the fused result's roundings
  // alike: the differences from it are spread, and the text says so.
  EXPECT_TRUE(d.columns.empty());
  EXPECT_THAT(d.explanation, ::testing::HasSubstr("differ from cpu:bf16:fused are spread over "
                                                  "the output"));
  EXPECT_THAT(d.explanation, ::testing::Not(::testing::HasSubstr("concentrate")));
}

// With a bias in a few columns only, fused and unfused part there alone
// (a zero bias adds nothing to round): localization names those columns,
// against the other bias placement, as docs/numerics.md says.
TEST_F(DiagnosisTest, DifferencesFromTheOtherBiasPlacementConcentrateWhereTheBiasIs) {
  const int64_t m = 64, k = 256, n = 96;
  LinearRequest r = MakeRequest(m, k, n, DType::kBFloat16, 8);
  std::vector<double> b(n, 0.0);
  b[3] = 3.3;
  b[17] = -2.7;
  r.bias = *FromDoubles(DType::kBFloat16, {n}, b);
  r.observed = Observed(r, kBf16Unfused, Order::kReversed);
  auto out = engine_->Diagnose(r);
  ASSERT_THAT(out, IsOk());
  const DiagnosisOutcome& d = *out->diagnosis;
  ASSERT_TRUE(Names(d, "cpu:bf16:unfused")) << d.explanation;
  std::set<int64_t> named;
  for (const GroupCount& g : d.columns) named.insert(g.index);
  EXPECT_EQ(named, (std::set<int64_t>{3, 17})) << d.explanation;
  EXPECT_THAT(d.explanation, ::testing::HasSubstr("differ from cpu:bf16:fused concentrate in "
                                                  "columns {"));
}

TEST_F(DiagnosisTest, TransposedWeightExplainsNothing) {
  LinearRequest r = MakeRequest(2, 512, 512, DType::kFloat32, 9);
  r.observed = Observed(r, kFp32, Order::kPairwise, /*transpose_weight=*/true);
  auto out = engine_->Diagnose(r);
  ASSERT_THAT(out, IsOk());
  const DiagnosisOutcome& d = *out->diagnosis;
  EXPECT_FALSE(d.best.has_value()) << *d.best << ": " << d.explanation;
  EXPECT_EQ(d.confidence, 0.0);
  EXPECT_THAT(d.explanation, ::testing::HasSubstr("No candidate explains"));
  EXPECT_THAT(d.explanation, ::testing::HasSubstr("weight layout"));
}

TEST_F(DiagnosisTest, MissingBiasExplainsNothing) {
  LinearRequest r = MakeRequest(2, 768, 512, DType::kFloat32, 10);
  r.observed = Observed(r, kFp32, Order::kPairwise, false, /*drop_bias=*/true);
  auto out = engine_->Diagnose(r);
  ASSERT_THAT(out, IsOk());
  const DiagnosisOutcome& d = *out->diagnosis;
  EXPECT_FALSE(d.best.has_value()) << *d.best << ": " << d.explanation;
  EXPECT_THAT(d.explanation, ::testing::HasSubstr("bias"));
}

TEST_F(DiagnosisTest, CorruptedElementsAreOutliersAndTheBulkStillDecides) {
  LinearRequest r = MakeRequest(2, 768, 512, DType::kFloat32, 11);
  Tensor observed = Observed(r, kTf32, Order::kPairwise);
  const std::set<int64_t> corrupted = {3, 77, 300, 511, 900};
  for (int64_t i : corrupted) observed.data<float>()[i] += 10.0f;
  r.observed = std::move(observed);
  auto out = engine_->Diagnose(r);
  ASSERT_THAT(out, IsOk());
  const DiagnosisOutcome& d = *out->diagnosis;
  ASSERT_TRUE(Names(d, "cpu:tf32:unfused")) << d.explanation;
  std::set<int64_t> listed;
  for (const ElementDiff& e : d.outliers) listed.insert(e.flat_index);
  EXPECT_EQ(listed, corrupted);
  EXPECT_THAT(d.explanation, ::testing::HasSubstr("outliers"));
}

TEST_F(DiagnosisTest, Bf16InputsMergeBf16Tf32AndFp32Rounding) {
  LinearRequest r = MakeRequest(2, 256, 64, DType::kBFloat16, 12);
  r.observed = Observed(r, kBf16Fused, Order::kPairwise);
  r.configs = {"cpu:fp32:fused", "cpu:tf32:fused", "cpu:bf16:fused", "cpu:bf16:unfused"};
  auto out = engine_->Diagnose(r);
  ASSERT_THAT(out, IsOk());
  const DiagnosisOutcome& d = *out->diagnosis;
  ASSERT_TRUE(d.best.has_value()) << d.explanation;
  EXPECT_EQ(*d.best, "cpu:bf16:fused");  // the storage dtype names the class
  EXPECT_THAT(d.equivalent, ::testing::UnorderedElementsAre("cpu:fp32:fused", "cpu:tf32:fused"));
}

TEST_F(DiagnosisTest, IndistinguishableCandidatesAreReportedAsTied) {
  // fp32 output without bias: tf32 with ties-to-even and ties-away differ
  // only on inputs exactly halfway between TF32 values, which random data
  // almost never has. Small K keeps the evidence thin.
  LinearRequest r = MakeRequest(2, 16, 8, DType::kFloat32, 13);
  r.bias.reset();
  Case tf32_no_bias = kTf32;
  tf32_no_bias.fused = true;
  LinearRequest for_observed = MakeRequest(2, 16, 8, DType::kFloat32, 13, 0.0);
  r.observed = Observed(for_observed, tf32_no_bias, Order::kPairwise);
  r.configs = {"cpu:tf32", "cpu:tf32rna"};
  auto out = engine_->Diagnose(r);
  ASSERT_THAT(out, IsOk());
  const DiagnosisOutcome& d = *out->diagnosis;
  ASSERT_TRUE(d.best.has_value()) << d.explanation;
  std::vector<std::string> together = d.equivalent;
  together.insert(together.end(), d.tied.begin(), d.tied.end());
  together.push_back(*d.best);
  EXPECT_THAT(together, ::testing::IsSupersetOf({"cpu:tf32:none", "cpu:tf32rna:none"}));
}

// Ranking alone, on synthetic outputs: the wrong candidate shares the bits
// of 60% of the elements with the observed output (a kernel summing in
// nearly the observed order) but leaves 8% of them 20 sigma away (the wrong
// input rounding); the right one shares no bits (another summation order)
// and keeps every element within a few sigma. The right one must be named.
// This is what an H200 showed for Flax's Dense (TF32 rounded ties away)
// against cuBLAS's fp16 and TF32 (ties to even) kernels.
TEST(RankCandidatesTest, FewInconsistentElementsOutrankManyBitwiseMatches) {
  const int64_t n = 4096;
  const float sigma = 1e-4f;
  std::mt19937 rng(21);
  std::normal_distribution<double> normal;
  std::uniform_real_distribution<double> uniform;
  auto make = [&] {
    auto t = Tensor::Create(DType::kFloat32, {2, n / 2});
    EXPECT_THAT(t.status(), IsOk());
    return std::move(t).value();
  };
  Tensor observed = make(), wrong = make(), right = make();
  for (int64_t i = 0; i < n; ++i) {
    const double o = 1.0 + normal(rng);  // magnitude ~1: spacing 1.2e-7 << sigma
    observed.data<float>()[i] = static_cast<float>(o);
    right.data<float>()[i] = static_cast<float>(o + sigma * normal(rng));
    const double u = uniform(rng);
    wrong.data<float>()[i] = static_cast<float>(u < 0.60   ? o
                                                : u < 0.68 ? o + 20.0 * sigma
                                                           : o + sigma * normal(rng));
  }
  const std::vector<float> pair_sigma(static_cast<size_t>(n), sigma);
  DiagnosisInput in;
  in.observed = &observed;
  in.storage_dtype = DType::kFloat32;
  in.output_dtype = DType::kFloat32;
  in.output_shape = {2, n / 2};
  for (const auto& [precision, bias, output] :
       {std::tuple<Precision, BiasMode, const Tensor*>{Precision::kFp16, BiasMode::kFused, &wrong},
        std::tuple<Precision, BiasMode, const Tensor*>{Precision::kTf32Rna, BiasMode::kUnfused,
                                                       &right}}) {
    DiagnosisCandidate c;
    c.config = Config{"cpu", precision, bias};
    c.output = output;
    c.pair_sigma = pair_sigma.data();
    c.pair_accumulation_sigma = pair_sigma.data();
    in.candidates.push_back(c);
  }
  const DiagnosisOutcome d = RankCandidates(in);
  ASSERT_TRUE(d.best.has_value()) << d.explanation;
  EXPECT_EQ(*d.best, "cpu:tf32rna:unfused") << d.explanation;
  ASSERT_EQ(d.ranking.size(), 2u);
  // The wrong one does share more bits: bitwise share alone would pick it.
  EXPECT_GT(d.ranking[1].bitwise_equal_fraction, 0.5);
  EXPECT_LT(d.ranking[0].bitwise_equal_fraction, 0.01);
}

// An fp16 output accumulated in fp32 that happens to flip only two
// roundings against the exact result: fp64 accumulation stays plausible
// (too few disagreements to rule it out) and, being exact, wins the paired
// sign test against any other fp32 order (here z = 14 / sqrt(18) = 3.3).
// Its plausibility is the floor's, not the evidence's (its own noise
// predicts no disagreement at all), so the fp32-accumulated candidate,
// plausible on the evidence (16 disagreements where its noise predicts
// 16), is best and fp64 is tied. torch's fp16 nn.Linear on a CPU without
// AVX-512 showed this on one layer of the example transformer.
TEST(RankCandidatesTest, FloorPlausibleFp64IsTiedNotBest) {
  const int64_t n = 4096;
  const double spacing = std::ldexp(1.0, -10);  // fp16 in [1, 2)
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> uniform(1.0, 1.9);
  std::vector<double> obs(n), exact(n), fp32(n);
  for (int64_t i = 0; i < n; ++i) obs[i] = exact[i] = fp32[i] = Fp16(uniform(rng));
  for (int64_t i : {100, 2000}) exact[i] += spacing;               // 2 flips against fp64
  for (int64_t j = 0; j < 16; ++j) fp32[200 + 97 * j] += spacing;  // 16 against fp32
  const Tensor observed = *FromDoubles(DType::kFloat16, {1, n}, obs);
  const Tensor fp64_out = *FromDoubles(DType::kFloat16, {1, n}, exact);
  const Tensor fp32_out = *FromDoubles(DType::kFloat16, {1, n}, fp32);
  // Output rounding of both sides; fp32 accumulation noise predicting 16
  // flips over the n elements (FlipChance = sqrt(2/pi) sigma / spacing),
  // fp64's predicting none to speak of.
  const std::vector<float> pair_sigma(n, static_cast<float>(spacing / 2));
  const std::vector<float> fp32_noise(n, static_cast<float>(16.0 / n * spacing / 0.7978845608));
  const std::vector<float> fp64_noise(n, 1e-15f);
  DiagnosisInput in;
  in.observed = &observed;
  in.storage_dtype = DType::kFloat16;
  in.output_dtype = DType::kFloat16;
  in.output_shape = {1, n};
  in.has_bias = true;
  for (const auto& [precision, output, noise] :
       {std::tuple<Precision, const Tensor*, const float*>{Precision::kFp64, &fp64_out,
                                                           fp64_noise.data()},
        std::tuple<Precision, const Tensor*, const float*>{Precision::kFp16, &fp32_out,
                                                           fp32_noise.data()}}) {
    DiagnosisCandidate c;
    c.config = Config{"cpu", precision, BiasMode::kFused};
    c.output = output;
    c.pair_sigma = pair_sigma.data();
    c.pair_accumulation_sigma = noise;
    in.candidates.push_back(c);
  }
  const DiagnosisOutcome d = RankCandidates(in);
  ASSERT_TRUE(d.best.has_value()) << d.explanation;
  EXPECT_EQ(*d.best, "cpu:fp16:fused") << d.explanation;
  EXPECT_THAT(d.tied, ::testing::ElementsAre("cpu:fp64:fused")) << d.explanation;
  ASSERT_EQ(d.ranking.size(), 2u);
  EXPECT_EQ(d.ranking[1].disagreements, 2);
  EXPECT_TRUE(d.ranking[1].plausible);
  EXPECT_LT(d.ranking[1].plausibility_p, kPlausibilityAlpha);
}

TEST(FrameworkHintTest, NamesTheFrameworkDefaults) {
  EXPECT_THAT(FrameworkHint({"cpu", Precision::kTf32, BiasMode::kUnfused}, DType::kFloat32, true),
              ::testing::HasSubstr("JAX/Flax"));
  EXPECT_THAT(FrameworkHint({"cpu", Precision::kFp32, BiasMode::kFused}, DType::kFloat32, true),
              ::testing::HasSubstr("PyTorch"));
  EXPECT_THAT(FrameworkHint({"cpu", Precision::kBf16, BiasMode::kUnfused}, DType::kBFloat16, true),
              ::testing::HasSubstr("candle"));
}

// The explanation's "concentrate in columns {...} (x% of them)": the share
// is decided on the counts, so all but one of 24,576 never reads as all,
// and all of them (ten columns of one, whose shares of 0.1 add up to
// 0.9999999999999999) reads as all.
TEST(GroupListTest, ShareOfTheDifferingElementsIsDecidedOnTheCounts) {
  EXPECT_EQ(internal::GroupList({{7, 24575, 24575.0 / 24576.0}}, 24576), "{7} (99.996% of them)");
  std::vector<GroupCount> ten;
  for (int64_t i = 0; i < 10; ++i) ten.push_back({i, 1, 0.1});
  EXPECT_EQ(internal::GroupList(ten, 10), "{0, 1, 2, 3, 4, 5, 6, 7, 8, 9} (100% of them)");
}

// ---- The verdict (docs/numerics.md, "Verdict"): outputs computed by the
// loops above from operands the test perturbs itself, one element at a
// time, so that only the perturbation differs from rounding of best.

// `t` with element i set to v (rounded to t's dtype by FromDoubles).
Tensor WithElement(const Tensor& t, int64_t i, double v) {
  std::vector<double> values(static_cast<size_t>(t.numel()));
  for (int64_t j = 0; j < t.numel(); ++j) values[static_cast<size_t>(j)] = t.GetDouble(j);
  values[static_cast<size_t>(i)] = v;
  return *FromDoubles(t.dtype(), t.shape(), values);
}

// The element threshold from the Gaussian tail: P(|Z| > t) = 1e-3 / 3 /
// count, from Python's math.erfc by bisection (at least 4).
TEST(ElementThresholdSigma, GrowsWithTheElementCountForABoundedFalseAlarmRate) {
  EXPECT_DOUBLE_EQ(ElementThresholdSigma(1), 4.0);
  EXPECT_NEAR(ElementThresholdSigma(1000), 5.1036, 1e-3);
  EXPECT_NEAR(ElementThresholdSigma(131072), 5.9587, 1e-3);
  EXPECT_NEAR(ElementThresholdSigma(1000000), 6.2824, 1e-3);
  EXPECT_NEAR(ElementThresholdSigma(1921 * 3072), 6.5528, 1e-3);
}

// Clean outputs of several orders and sizes are rounding: no element,
// column or row test fires (the false-alarm side; bench/detection_bench.py
// runs hundreds more).
TEST_F(DiagnosisTest, CleanOutputsAreRoundingAcrossSeedsAndOrders) {
  const Case* cases[] = {&kBf16Fused, &kBf16Unfused, &kFp16Fused, &kFp32, &kTf32};
  int clean = 0;
  for (uint32_t seed = 0; seed < 6; ++seed) {
    for (const Case* c : cases) {
      LinearRequest r = MakeRequest(24, 96, 40, c->storage, 500 + seed);
      r.observed = Observed(r, *c, seed % 2 ? Order::kPairwise : Order::kReversed);
      auto out = engine_->Diagnose(r);
      ASSERT_THAT(out, IsOk());
      const DiagnosisOutcome& d = *out->diagnosis;
      EXPECT_EQ(d.verdict, DiagnosisVerdict::kRounding)
          << c->truth << " seed " << seed << ": " << d.verdict_reason;
      EXPECT_THAT(d.verdict_reason, ::testing::StartsWith("Rounding:"));
      clean += d.verdict == DiagnosisVerdict::kRounding;
    }
  }
  EXPECT_EQ(clean, 30);
}

// One weight element doubled: the elements of its output column move by
// many ULP; the verdict is a defect there, and says which W row to read.
TEST_F(DiagnosisTest, AWeightElementTimesTwoIsADefectInItsOutputColumn) {
  LinearRequest r = MakeRequest(64, 256, 96, DType::kBFloat16, 41);
  const int64_t k = 256, n0 = 5, k0 = 17;
  r.observed = ObservedWithWeightScaled(r, kBf16Fused, n0 * k + k0, 2.0);
  auto out = engine_->Diagnose(r);
  ASSERT_THAT(out, IsOk());
  const DiagnosisOutcome& d = *out->diagnosis;
  EXPECT_TRUE(Names(d, "cpu:bf16:fused")) << d.explanation;
  ASSERT_EQ(d.verdict, DiagnosisVerdict::kDefect) << d.verdict_reason;
  ASSERT_TRUE(d.defect.has_value());
  ASSERT_FALSE(d.defect->columns.empty());
  EXPECT_EQ(d.defect->columns[0].index, n0);
  EXPECT_GT(d.defect->element_count, 0);
  for (const DefectElement& e : d.defect->elements) {
    EXPECT_EQ(e.element.flat_index % 96, n0);
    EXPECT_GT(e.sigma, d.defect->element_threshold_sigma);
  }
  EXPECT_THAT(d.defect->where_to_look, ::testing::HasSubstr("output column 5 ↔ weight row 5"));
  EXPECT_THAT(d.defect->where_to_look, ::testing::HasSubstr("bias element 5"));
  EXPECT_THAT(d.verdict_reason, ::testing::StartsWith("Defect: cpu:bf16:fused"));
  EXPECT_THAT(d.explanation, ::testing::StartsWith(d.verdict_reason));
}

// A weight element that is inf in the request too: every configuration
// computes the inf column the framework did, so the verdict is rounding,
// and the headline says how many elements are not finite (one output
// column for every row: 64 of 64 x 96) rather than hiding them.
TEST_F(DiagnosisTest, AnInfWeightIsRoundingThatSaysItsNonFiniteElements) {
  LinearRequest r = MakeRequest(64, 256, 96, DType::kBFloat16, 41);
  const int64_t k = 256, n0 = 5, k0 = 17;
  std::vector<double> w(static_cast<size_t>(r.weight.numel()));
  for (int64_t i = 0; i < r.weight.numel(); ++i) w[static_cast<size_t>(i)] = r.weight.GetDouble(i);
  w[static_cast<size_t>(n0 * k + k0)] = std::numeric_limits<double>::infinity();
  r.weight = *FromDoubles(DType::kBFloat16, {96, k}, w);
  r.observed = Observed(r, kBf16Fused, Order::kPairwise);
  auto out = engine_->Diagnose(r);
  ASSERT_THAT(out, IsOk());
  const DiagnosisOutcome& d = *out->diagnosis;
  ASSERT_EQ(d.verdict, DiagnosisVerdict::kRounding) << d.explanation;
  EXPECT_THAT(d.headline, ::testing::StartsWith("Rounding, not a bug: "));
  EXPECT_THAT(d.headline, ::testing::HasSubstr("But 64 of its 6144 elements are inf or NaN"));
  EXPECT_THAT(d.headline, ::testing::HasSubstr("beyond bfloat16's range"));
}

// The same in fp32, where another summation order flips almost every
// element anyway, so no count test can flag the column: the elements
// beyond the threshold, all in one column, are the defect (not a misfit
// of the whole output, although they inflate best's bound_ratio), and the
// rows they lie in are not listed.
TEST_F(DiagnosisTest, AnFp32WeightElementTimesTwoIsADefectInItsColumnNotUnexplained) {
  const int64_t m = 64, k = 256, n = 96, n0 = 7, k0 = 30;
  LinearRequest r = MakeRequest(m, k, n, DType::kFloat32, 43);
  r.observed = ObservedWithWeightScaled(r, kFp32, n0 * k + k0, 2.0);
  auto out = engine_->Diagnose(r);
  ASSERT_THAT(out, IsOk());
  const DiagnosisOutcome& d = *out->diagnosis;
  EXPECT_TRUE(Names(d, "cpu:fp32:fused")) << d.explanation;
  ASSERT_EQ(d.verdict, DiagnosisVerdict::kDefect) << d.verdict_reason;
  ASSERT_TRUE(d.defect.has_value());
  ASSERT_EQ(d.defect->columns.size(), 1u);
  EXPECT_EQ(d.defect->columns[0].index, n0);
  EXPECT_GT(d.defect->columns[0].beyond_threshold, m / 2);
  EXPECT_TRUE(d.defect->rows.empty());
  EXPECT_THAT(d.defect->where_to_look, ::testing::HasSubstr("output column 7 ↔ weight row 7"));
  EXPECT_THAT(d.defect->where_to_look, ::testing::Not(::testing::HasSubstr("output row")));
}

// A bias element four fp32 ULP off moves every element of its column by
// about one predicted standard error of another summation order, all the
// same way: no element is beyond the threshold and every element of an
// fp32 output differs anyway, but the column is shifted to one side.
TEST_F(DiagnosisTest, AnFp32BiasElementFourUlpOffIsAShiftedColumn) {
  const int64_t m = 256, k = 256, n = 64, n0 = 9;
  LinearRequest r = MakeRequest(m, k, n, DType::kFloat32, 47);
  const Tensor clean_b = r.bias->Clone();
  double b0 = clean_b.GetDouble(n0);
  for (int step = 0; step < 4; ++step) b0 = std::nextafter(F32(b0), INFINITY);
  r.bias = WithElement(clean_b, n0, b0);
  r.observed = Observed(r, kFp32, Order::kPairwise);
  r.bias = clean_b.Clone();
  auto out = engine_->Diagnose(r);
  ASSERT_THAT(out, IsOk());
  const DiagnosisOutcome& d = *out->diagnosis;
  EXPECT_TRUE(Names(d, "cpu:fp32:fused")) << d.explanation;
  ASSERT_EQ(d.verdict, DiagnosisVerdict::kDefect) << d.verdict_reason;
  ASSERT_TRUE(d.defect.has_value());
  ASSERT_FALSE(d.defect->columns.empty());
  const DefectGroup& g = d.defect->columns[0];
  EXPECT_EQ(g.index, n0);
  EXPECT_GT(g.shift_t, 0);
  EXPECT_LT(g.shift_p_value, kVerdictFalseAlarm);
  EXPECT_THAT(d.verdict_reason, ::testing::HasSubstr("column 9 is shifted above it"));
}

// 1% on the largest weight of one output column with a short reduction:
// each element of the column moves by a fraction of a bf16 ULP, no element
// by more than rounding allows, but the column flips far more often than
// rounding would. The column test finds it.
TEST_F(DiagnosisTest, OnePercentOnAWeightIsFoundByItsColumnsFlips) {
  const int64_t m = 256, k = 32, n = 48, n0 = 11;
  LinearRequest r = MakeRequest(m, k, n, DType::kBFloat16, 43);
  const Tensor clean_w = r.weight.Clone();
  int64_t k0 = 0;
  for (int64_t p = 0; p < k; ++p) {
    if (std::fabs(clean_w.GetDouble(n0 * k + p)) > std::fabs(clean_w.GetDouble(n0 * k + k0))) {
      k0 = p;
    }
  }
  r.weight = WithElement(clean_w, n0 * k + k0, 1.01 * clean_w.GetDouble(n0 * k + k0));
  ASSERT_NE(r.weight.GetDouble(n0 * k + k0), clean_w.GetDouble(n0 * k + k0));
  r.observed = Observed(r, kBf16Fused, Order::kReversed);
  r.weight = clean_w.Clone();
  auto out = engine_->Diagnose(r);
  ASSERT_THAT(out, IsOk());
  const DiagnosisOutcome& d = *out->diagnosis;
  EXPECT_TRUE(Names(d, "cpu:bf16:fused")) << d.explanation;
  ASSERT_EQ(d.verdict, DiagnosisVerdict::kDefect) << d.verdict_reason;
  ASSERT_FALSE(d.defect->columns.empty()) << d.verdict_reason;
  EXPECT_EQ(d.defect->columns[0].index, n0);
  EXPECT_LT(d.defect->columns[0].p_value, kVerdictFalseAlarm / 3);
  EXPECT_GT(static_cast<double>(d.defect->columns[0].disagreements),
            10 * d.defect->columns[0].expected_disagreements);
}

// One input element off: its output row is the defect.
TEST_F(DiagnosisTest, AnInputElementOffIsADefectInItsOutputRow) {
  const int64_t m = 32, k = 48, n = 256, m0 = 7;
  LinearRequest r = MakeRequest(m, k, n, DType::kBFloat16, 47);
  const Tensor clean_x = r.input.Clone();
  r.input = WithElement(clean_x, m0 * k + 3, 1.5 * clean_x.GetDouble(m0 * k + 3));
  r.observed = Observed(r, kBf16Fused, Order::kPairwise);
  r.input = clean_x.Clone();
  auto out = engine_->Diagnose(r);
  ASSERT_THAT(out, IsOk());
  const DiagnosisOutcome& d = *out->diagnosis;
  ASSERT_EQ(d.verdict, DiagnosisVerdict::kDefect) << d.verdict_reason;
  ASSERT_FALSE(d.defect->rows.empty()) << d.verdict_reason;
  EXPECT_EQ(d.defect->rows[0].index, m0);
  EXPECT_THAT(d.defect->where_to_look, ::testing::HasSubstr("output row 7 ↔ input row 7"));
}

// One output element 2 bf16 ULP off (its bits + 2): no rounding of a
// fused bf16 output lands two grid points away, so the element test
// names that element.
TEST_F(DiagnosisTest, AnOutputElementTwoUlpOffIsADefectAtThatElement) {
  LinearRequest r = MakeRequest(48, 128, 64, DType::kBFloat16, 53);
  Tensor observed = Observed(r, kBf16Fused, Order::kPairwise);
  const int64_t i0 = 7 * 64 + 9;
  uint16_t* bits = observed.data<uint16_t>();
  bits[i0] = static_cast<uint16_t>(bits[i0] + 2);  // same sign and binade here
  r.observed = std::move(observed);
  auto out = engine_->Diagnose(r);
  ASSERT_THAT(out, IsOk());
  const DiagnosisOutcome& d = *out->diagnosis;
  ASSERT_EQ(d.verdict, DiagnosisVerdict::kDefect) << d.verdict_reason;
  EXPECT_EQ(d.defect->element_count, 1);
  ASSERT_EQ(d.defect->elements.size(), 1u);
  EXPECT_EQ(d.defect->elements[0].element.flat_index, i0);
  EXPECT_EQ(d.defect->elements[0].element.ulp, 2u);
}

// A computation no candidate offers: fp32 weights quantised to int4 per
// output row (symmetric, amax / 7). It is not rounding of any candidate,
// and the answer is not a confident best. (int8 weights at this size err
// by about what fp16 accumulation would: docs/numerics.md, "Verdict",
// says what the verdict cannot tell apart.)
TEST_F(DiagnosisTest, Int4QuantisedWeightsAreUnexplained) {
  const int64_t m = 32, k = 256, n = 64;
  LinearRequest r = MakeRequest(m, k, n, DType::kFloat32, 59);
  const Tensor clean_w = r.weight.Clone();
  std::vector<double> q(static_cast<size_t>(n * k));
  for (int64_t j = 0; j < n; ++j) {
    double amax = 0;
    for (int64_t p = 0; p < k; ++p) amax = std::max(amax, std::fabs(clean_w.GetDouble(j * k + p)));
    const double scale = amax / 7;
    for (int64_t p = 0; p < k; ++p) {
      q[static_cast<size_t>(j * k + p)] =
          std::nearbyint(clean_w.GetDouble(j * k + p) / scale) * scale;
    }
  }
  r.weight = *FromDoubles(DType::kFloat32, {n, k}, q);
  r.observed = Observed(r, kFp32, Order::kPairwise);
  r.weight = clean_w.Clone();
  auto out = engine_->Diagnose(r);
  ASSERT_THAT(out, IsOk());
  const DiagnosisOutcome& d = *out->diagnosis;
  EXPECT_EQ(d.verdict, DiagnosisVerdict::kUnexplained) << d.verdict_reason;
  EXPECT_LE(d.confidence, kUnexplainedConfidence);
  EXPECT_THAT(d.verdict_reason, ::testing::StartsWith("Unexplained: "));
  EXPECT_THAT(d.verdict_reason, ::testing::HasSubstr("families tried: "));
}

// x W^T + b as a bf16 3-pass product of fp32 operands: v = hi + lo with
// hi = bf16(v), lo = bf16(v - hi); hi*hi + hi*lo + lo*hi per k (lo*lo
// dropped; each product exact), summed in fp32 pairwise, fp32 output.
Tensor Bf16ThreePass(const LinearRequest& r) {
  const int64_t k = r.input.shape().back(), m = r.input.numel() / k, n = r.weight.dim(0);
  std::vector<double> y(static_cast<size_t>(m * n));
  std::vector<float> terms(k);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t p = 0; p < k; ++p) {
        const double xv = r.input.GetDouble(i * k + p), wv = r.weight.GetDouble(j * k + p);
        const double xh = Bf16(xv), xl = Bf16(xv - xh), wh = Bf16(wv), wl = Bf16(wv - wh);
        terms[p] = F32(double(F32(xh * wh + xh * wl)) + xl * wh);
      }
      y[static_cast<size_t>(i * n + j)] =
          F32(double(SumFp32(terms, Order::kPairwise)) + r.bias->GetDouble(j));
    }
  }
  return *FromDoubles(DType::kFloat32, {m, n}, y);
}

// A bf16 3-pass product of fp32 operands (v = hi + lo, hi = bf16(v), lo =
// bf16(v - hi); hi*hi + hi*lo + lo*hi, lo*lo dropped), summed in fp32 with
// an fp32 output: far more precise than fp16 accumulation, far less than
// fp32's. fp16acc's wide noise holds it, but an output this close to the
// exact result is not an fp16 accumulation's.
TEST_F(DiagnosisTest, ABf16ThreePassProductIsUnexplainedNotFp16Accumulation) {
  const int64_t m = 32, k = 256, n = 64;
  LinearRequest r = MakeRequest(m, k, n, DType::kFloat32, 61);
  r.observed = Bf16ThreePass(r);
  auto out = engine_->Diagnose(r);
  ASSERT_THAT(out, IsOk());
  const DiagnosisOutcome& d = *out->diagnosis;
  EXPECT_EQ(d.verdict, DiagnosisVerdict::kUnexplained) << d.verdict_reason;
  EXPECT_LE(d.confidence, kUnexplainedConfidence);
}

// The same product at K = 4096, offered only fp32 accumulation: its
// differences from fp32 are about 1.3 times another order's, too few to
// cross the element threshold often or to raise bound_ratio past 1.5, but
// they fill the band between 4 sigma and the threshold all over the output,
// where rounding leaves a Gaussian tail's few.
TEST_F(DiagnosisTest, ASpreadWiderThanRoundingFillsTheBandAndIsUnexplained) {
  const int64_t m = 64, k = 4096, n = 64;
  LinearRequest r = MakeRequest(m, k, n, DType::kFloat32, 71);
  r.observed = Bf16ThreePass(r);
  r.configs = {"cpu:fp32:fused"};
  auto out = engine_->Diagnose(r);
  ASSERT_THAT(out, IsOk());
  const DiagnosisOutcome& d = *out->diagnosis;
  EXPECT_EQ(d.verdict, DiagnosisVerdict::kUnexplained) << d.verdict_reason;
  EXPECT_THAT(d.verdict_reason, ::testing::HasSubstr("elements lie between 4 and"));
}

// The other side of that rule: an fp16 accumulation in another order (every
// multiply-add rounded to fp16, k backwards) is fp16acc, and rounding.
TEST_F(DiagnosisTest, AnFp16AccumulationInAnotherOrderIsRoundingOfFp16acc) {
  const int64_t m = 32, k = 256, n = 64;
  LinearRequest r = MakeRequest(m, k, n, DType::kFloat16, 67);
  std::vector<double> y(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t p = k; p-- > 0;) {
        acc = Fp16(acc + Fp16(r.input.GetDouble(i * k + p) * r.weight.GetDouble(j * k + p)));
      }
      y[static_cast<size_t>(i * n + j)] = Fp16(acc + r.bias->GetDouble(j));
    }
  }
  r.observed = *FromDoubles(DType::kFloat16, {m, n}, y);
  auto out = engine_->Diagnose(r);
  ASSERT_THAT(out, IsOk());
  const DiagnosisOutcome& d = *out->diagnosis;
  EXPECT_TRUE(Names(d, "cpu:fp16acc:fused")) << d.explanation;
  EXPECT_EQ(d.verdict, DiagnosisVerdict::kRounding) << d.verdict_reason;
}

// ---- The answer in words (docs/numerics.md, "Verdict" and "What to
// change"): each sentence checked against the numbers beside it.

TEST_F(DiagnosisTest, FlaxCaseHeadlineSaysRoundingAndAdvisesTurningTf32Off) {
  LinearRequest r = MakeRequest(2, 768, 512, DType::kFloat32, 7);
  r.observed = Observed(r, kTf32, Order::kPairwise);
  auto out = engine_->Diagnose(r);
  ASSERT_THAT(out, IsOk());
  const DiagnosisOutcome& d = *out->diagnosis;
  ASSERT_EQ(d.verdict, DiagnosisVerdict::kRounding) << d.explanation;
  EXPECT_THAT(d.headline,
              ::testing::StartsWith("Rounding, not a bug: the output is cpu:tf32:unfused (JAX/"
                                    "Flax's default on Ampere+ GPUs for fp32 tensors) in another "
                                    "summation order"));
  EXPECT_THAT(d.headline, ::testing::HasSubstr(absl::StrFormat(
                              "within %.1f predicted standard errors",
                              ElementThresholdSigma(out->observed_vs_reference->total))));
  // Not asked for anything: towards PyTorch's default, TF32 off and the
  // bias into the epilogue.
  EXPECT_THAT(d.advice, ::testing::StartsWith("To get cpu:fp32:fused (PyTorch's default"));
  EXPECT_THAT(d.advice, ::testing::HasSubstr("allow_tf32 = False"));
  EXPECT_THAT(d.advice, ::testing::HasSubstr("jax_default_matmul_precision='highest'"));
  EXPECT_THAT(d.advice, ::testing::HasSubstr("add the bias before the one rounding"));
  EXPECT_FALSE(d.accepted);
  // The error ratio's words agree with its value.
  EXPECT_THAT(d.explanation, ::testing::HasSubstr("(within what that precision predicts)"));
  // The defaults for fp32 tensors are named in the ranking.
  bool pytorch = false, jax = false;
  for (const RankedCandidate& c : d.ranking) {
    if (c.config == "cpu:fp32:fused") pytorch = c.framework_default.find("PyTorch") == 0;
    if (c.config == "cpu:tf32:unfused") jax = c.framework_default.find("JAX") == 0;
  }
  EXPECT_TRUE(pytorch && jax);
}

TEST_F(DiagnosisTest, AcceptingTheTrueConfigurationPassesAndAnotherFails) {
  LinearRequest r = MakeRequest(2, 768, 512, DType::kFloat32, 7);
  r.observed = Observed(r, kTf32, Order::kPairwise);
  r.accept = {"tf32"};
  auto accepted = engine_->Verify(r);
  ASSERT_THAT(accepted, IsOk());
  ASSERT_TRUE(accepted->diagnosis.has_value());
  EXPECT_TRUE(accepted->passed);
  EXPECT_TRUE(accepted->diagnosis->accepted);
  EXPECT_EQ(accepted->diagnosis->accepted_as, "cpu:tf32:unfused");
  EXPECT_THAT(accepted->diagnosis->headline, ::testing::EndsWith("Accepted (tf32)."));
  EXPECT_TRUE(accepted->diagnosis->advice.empty());

  r.observed = Observed(r, kTf32, Order::kPairwise);
  r.accept = {"cpu:fp32:fused"};
  auto refused = engine_->Diagnose(r);
  ASSERT_THAT(refused, IsOk());
  EXPECT_FALSE(refused->passed);
  EXPECT_FALSE(refused->diagnosis->accepted);
  EXPECT_THAT(refused->diagnosis->headline,
              ::testing::HasSubstr("Not accepted: it is not cpu:fp32:fused."));
  EXPECT_THAT(refused->diagnosis->advice, ::testing::StartsWith("To get cpu:fp32:fused"));
}

TEST_F(DiagnosisTest, CandleCaseVerifiedWithItsTrueConfigurationAccepted) {
  LinearRequest r = MakeRequest(48, 1024, 768, DType::kBFloat16, 8);
  r.observed = Observed(r, kBf16Unfused, Order::kReversed);
  r.configs = {"cpu:bf16:fused"};
  r.accept = {"cpu:bf16:unfused"};
  auto out = engine_->Verify(r);
  ASSERT_THAT(out, IsOk());
  EXPECT_TRUE(out->passed) << out->diagnosis->headline;
  // The accepted configuration was added to the one named.
  bool ran = false;
  for (const ConfigOutcome& c : out->results) ran = ran || c.config == "cpu:bf16:unfused";
  EXPECT_TRUE(ran);
}

TEST_F(DiagnosisTest, BadAcceptPatternsNameTheField) {
  LinearRequest r = MakeRequest(2, 16, 8, DType::kFloat32, 7);
  r.observed = Observed(r, kFp32, Order::kPairwise);
  r.accept = {"tf32", "cpu:tf99"};
  auto out = engine_->Diagnose(r);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(out.status().message()), ::testing::StartsWith("accept[1]: 'cpu:tf99'"));
  r.observed.reset();
  r.accept = {"tf32"};
  EXPECT_EQ(engine_->Verify(r).status().code(), absl::StatusCode::kInvalidArgument);
}

// The README demo's situation: the output was summed in the server's own
// order (numpy uses the same OpenBLAS), so TF32 reproduces every bit;
// fp16 inputs round like TF32 except in range and differ in a few
// elements by far less than the sign test counts. Exactness decides: not
// "cannot be told apart".
TEST_F(DiagnosisTest, AnExactReproductionIsNotTiedWithACandidateThatDiffersInBits) {
  LinearRequest r = MakeRequest(2, 768, 512, DType::kFloat32, 7);
  // Small inputs in a few places: fp16 flushes them, TF32 keeps them.
  std::vector<double> x(2 * 768);
  for (int64_t i = 0; i < 2 * 768; ++i) x[i] = r.input.GetDouble(i) * (i % 7 == 0 ? 1e-6 : 1.0);
  r.input = *FromDoubles(DType::kFloat32, {2, 768}, x);
  LinearRequest own = MakeRequest(2, 768, 512, DType::kFloat32, 7);
  own.input = r.input.Clone();
  own.configs = {"cpu:tf32:unfused"};
  own.return_outputs = true;
  auto produced = engine_->Verify(own);
  ASSERT_THAT(produced, IsOk());
  r.observed = std::move(*produced->results[0].output);
  auto out = engine_->Diagnose(r);
  ASSERT_THAT(out, IsOk());
  const DiagnosisOutcome& d = *out->diagnosis;
  ASSERT_TRUE(Names(d, "cpu:tf32:unfused")) << d.explanation;
  EXPECT_THAT(d.tied, ::testing::Not(::testing::Contains(::testing::HasSubstr("fp16"))))
      << d.explanation;
  EXPECT_THAT(d.headline, ::testing::HasSubstr("bit for bit"));
  const RankedCandidate* fp16 = nullptr;
  for (const RankedCandidate& c : d.ranking) {
    if (c.config.rfind("cpu:fp16:", 0) == 0 && fp16 == nullptr) fp16 = &c;
  }
  ASSERT_NE(fp16, nullptr);
  ASSERT_LT(fp16->bitwise_equal_fraction, 1.0);
  EXPECT_THAT(d.explanation, ::testing::HasSubstr("reproduces every bit of the observed output"));
}

TEST_F(DiagnosisTest, DefectAndUnexplainedHeadlinesSayWhereToLook) {
  LinearRequest r = MakeRequest(64, 256, 96, DType::kBFloat16, 41);
  r.observed = ObservedWithWeightScaled(r, kBf16Fused, 5 * 256 + 17, 2.0);
  auto defect = engine_->Diagnose(r);
  ASSERT_THAT(defect, IsOk());
  ASSERT_EQ(defect->diagnosis->verdict, DiagnosisVerdict::kDefect);
  EXPECT_THAT(defect->diagnosis->headline,
              ::testing::StartsWith("Not rounding: cpu:bf16:fused explains the output except "
                                    "column 5 ("));
  EXPECT_THAT(defect->diagnosis->headline, ::testing::HasSubstr("Look at output column 5"));
  EXPECT_TRUE(defect->diagnosis->advice.empty());

  LinearRequest t = MakeRequest(2, 512, 512, DType::kFloat32, 9);
  t.observed = Observed(t, kFp32, Order::kPairwise, /*transpose_weight=*/true);
  auto unexplained = engine_->Diagnose(t);
  ASSERT_THAT(unexplained, IsOk());
  const DiagnosisOutcome& u = *unexplained->diagnosis;
  EXPECT_THAT(u.headline, ::testing::StartsWith("Unexplained: no offered configuration"));
  // The shares it quotes are of all elements: the closest candidate's
  // consistent share plus the share beyond every candidate is at most 1.
  EXPECT_THAT(u.explanation, ::testing::HasSubstr("of all elements within them"));
}

TEST(FrameworkHintTest, FitsTheBiasAndTheBackend) {
  const std::string no_bias =
      FrameworkHint({"cpu", Precision::kTf32, BiasMode::kNone}, DType::kFloat32, false);
  EXPECT_THAT(no_bias, ::testing::Not(::testing::HasSubstr("bias")));
  EXPECT_THAT(no_bias, ::testing::HasSubstr("JAX"));
  EXPECT_THAT(no_bias, ::testing::HasSubstr("emulated on the CPU"));
  const std::string device =
      FrameworkHint({"cublaslt", Precision::kBf16, BiasMode::kFused}, DType::kBFloat16, true);
  EXPECT_THAT(device, ::testing::HasSubstr("epilogue"));
  EXPECT_THAT(device, ::testing::Not(::testing::HasSubstr("emulated")));
  EXPECT_EQ(HowToMatch({"cpu", Precision::kFp32, BiasMode::kFused},
                       {"cpu", Precision::kFp32, BiasMode::kFused}, DType::kFloat32, true),
            "");
  EXPECT_THAT(HowToMatch({"cpu", Precision::kBf16, BiasMode::kUnfused},
                         {"cpu", Precision::kBf16, BiasMode::kFused}, DType::kBFloat16, true),
              ::testing::StartsWith("Add the bias before the one rounding"));
  // Without a bias, the placements are one function: nothing to change.
  EXPECT_EQ(HowToMatch({"cpu", Precision::kBf16, BiasMode::kNone},
                       {"cpu", Precision::kBf16, BiasMode::kFused}, DType::kBFloat16, false),
            "");
}

// fp32 tensors multiplied in one bf16 pass are JAX/XLA on TPU with the
// default precision, not "PyTorch's bf16 default" (that is bf16 tensors);
// the way back to fp32 is the precision switch, the tensors being fp32.
TEST(FrameworkHintTest, OneBf16PassOnFp32TensorsNamesTpu) {
  const Config tpu{"cpu", Precision::kBf16, BiasMode::kUnfused};
  const std::string hint = FrameworkHint(tpu, DType::kFloat32, true);
  EXPECT_THAT(hint, ::testing::StartsWith("fp32 tensors multiplied in one bf16 pass"));
  EXPECT_THAT(hint, ::testing::HasSubstr("JAX/XLA on TPU with the default precision"));
  EXPECT_THAT(hint, ::testing::Not(::testing::HasSubstr("PyTorch")));
  EXPECT_THAT(FrameworkHint({"cpu", Precision::kBf16, BiasMode::kNone}, DType::kFloat32, false),
              ::testing::HasSubstr("JAX/XLA on TPU"));
  // Not a ranking row's framework_default: those are the defaults a
  // GPU/CPU port meets (README's Flax case lists them in 20 lines).
  EXPECT_EQ(FrameworkDefault(tpu, DType::kFloat32, true), "");
  // The epilogue form is a cuBLAS compute type, no framework's default.
  const Config fused{"cpu", Precision::kBf16, BiasMode::kFused};
  EXPECT_THAT(FrameworkHint(fused, DType::kFloat32, true),
              ::testing::HasSubstr("CUBLAS_COMPUTE_32F_FAST_16BF"));
  EXPECT_EQ(FrameworkDefault(fused, DType::kFloat32, true), "");
  EXPECT_THAT(FrameworkHint({"cpu", Precision::kFp16, BiasMode::kFused}, DType::kFloat32, true),
              ::testing::HasSubstr("CUBLAS_COMPUTE_32F_FAST_16F"));
  // bf16 tensors keep their own hint.
  EXPECT_THAT(FrameworkHint(tpu, DType::kBFloat16, true), ::testing::HasSubstr("candle"));
  const std::string advice =
      HowToMatch(tpu, {"cpu", Precision::kFp32, BiasMode::kFused}, DType::kFloat32, true);
  EXPECT_THAT(advice, ::testing::StartsWith(
                          "Multiply the float32 tensors in float32, not one bf16 pass (JAX, "
                          "TPU's default: precision=HIGHEST"));
  EXPECT_THAT(advice, ::testing::HasSubstr("; and add the bias before the one rounding"));
}

TEST(ConfigPatternTest, PartsLeftOutMatchAny) {
  auto tf32 = ParseConfigPattern("tf32");
  ASSERT_THAT(tf32, IsOk());
  EXPECT_TRUE(tf32->Matches({"cublaslt", Precision::kTf32, BiasMode::kUnfused}));
  EXPECT_FALSE(tf32->Matches({"cpu", Precision::kTf32Rna, BiasMode::kUnfused}));
  auto cpu_bf16 = ParseConfigPattern("cpu:bf16");
  ASSERT_THAT(cpu_bf16, IsOk());
  EXPECT_TRUE(cpu_bf16->Matches({"cpu", Precision::kBf16, BiasMode::kFused}));
  EXPECT_FALSE(cpu_bf16->Matches({"cublas", Precision::kBf16, BiasMode::kFused}));
  auto fused = ParseConfigPattern("bf16:fused");
  ASSERT_THAT(fused, IsOk());
  EXPECT_TRUE(fused->Matches({"cpu", Precision::kBf16, BiasMode::kNone}));
  EXPECT_FALSE(fused->Matches({"cpu", Precision::kBf16, BiasMode::kUnfused}));
  EXPECT_EQ(fused->ToString(), "bf16:fused");
  for (const char* bad : {"", "cpu", "cpu:bf16:fused:x", "bf16:sideways", "cpu::bf16"}) {
    EXPECT_EQ(ParseConfigPattern(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

// Two outputs of one layer: PyTorch's (strict fp32, fused bias) and
// Flax's (TF32, bias added after), from this file's loops.
TEST_F(DiagnosisTest, CompareNamesEachOutputAndExplainsTheirDifference) {
  LinearRequest r = MakeRequest(2, 768, 512, DType::kFloat32, 7);
  std::vector<std::pair<std::string, Tensor>> outputs;
  outputs.emplace_back("torch", Observed(r, kFp32, Order::kPairwise));
  outputs.emplace_back("flax", Observed(r, kTf32, Order::kReversed));
  // The largest difference, computed here.
  double seen = 0;
  for (int64_t i = 0; i < outputs[0].second.numel(); ++i) {
    seen =
        std::max(seen, std::fabs(outputs[0].second.GetDouble(i) - outputs[1].second.GetDouble(i)));
  }
  auto out = engine_->CompareOutputs(r, outputs);
  ASSERT_THAT(out, IsOk());
  ASSERT_EQ(out->outputs.size(), 2u);
  EXPECT_TRUE(Names(out->outputs[0].diagnosis, "cpu:fp32:fused"));
  EXPECT_TRUE(Names(out->outputs[1].diagnosis, "cpu:tf32:unfused"));
  EXPECT_TRUE(out->pair.rounding);
  EXPECT_DOUBLE_EQ(out->pair.stats.max_abs, seen);
  EXPECT_GE(out->pair.expected_max_abs, seen);
  EXPECT_THAT(out->headline,
              ::testing::StartsWith("torch is cpu:fp32:fused (PyTorch's default for fp32 "
                                    "tensors), flax is cpu:tf32:unfused (JAX/Flax's default"));
  EXPECT_THAT(out->headline,
              ::testing::HasSubstr(absl::StrFormat("their difference is rounding: at most %.3g "
                                                   "expected, %.3g seen.",
                                                   out->pair.expected_max_abs, seen)));
  EXPECT_THAT(out->headline, ::testing::HasSubstr("For flax to match torch: turn TF32 off"));
  EXPECT_THAT(out->pair.advice_a_to_b, ::testing::StartsWith("Turn TF32 on"));
}

TEST_F(DiagnosisTest, CompareRefusesAnythingButTwoNamedOutputs) {
  LinearRequest r = MakeRequest(2, 16, 8, DType::kFloat32, 7);
  std::vector<std::pair<std::string, Tensor>> one;
  one.emplace_back("torch", Observed(r, kFp32, Order::kPairwise));
  EXPECT_THAT(std::string(engine_->CompareOutputs(r, one).status().message()),
              ::testing::StartsWith("observed:"));
  one.emplace_back("torch", Observed(r, kFp32, Order::kPairwise));
  EXPECT_THAT(std::string(engine_->CompareOutputs(r, one).status().message()),
              ::testing::StartsWith("observed[1].name:"));
  one[1].first = "bad name";
  EXPECT_THAT(std::string(engine_->CompareOutputs(r, one).status().message()),
              ::testing::StartsWith("observed[1].name:"));
}

// ---- Multi-pass precisions (docs/numerics.md, "Multi-pass precisions")

// Rounds toward zero to bf16 (written independently of core/).
double TruncBf16(double v) {
  if (v == 0 || !std::isfinite(v)) return v;
  const int e = std::ilogb(v);
  return std::ldexp(std::trunc(std::ldexp(v, 7 - e)), e - 7);
}

// XLA's BF16_BF16_F32_X3 on fp32 operands, written here on its own: v =
// hi + lo, hi = v cut toward zero to bf16, lo = bf16(v - hi); three dot
// products (lo.hi, hi.lo, hi.hi), each of exact products summed in fp32
// pairwise, then (lo.hi + hi.lo) + hi.hi in fp32, then the bias in fp32.
Tensor XlaBf16x3(const LinearRequest& r) {
  const int64_t k = r.input.shape().back(), m = r.input.numel() / k, n = r.weight.dim(0);
  std::vector<double> y(static_cast<size_t>(m * n));
  std::vector<float> lh(k), hl(k), hh(k);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t p = 0; p < k; ++p) {
        const double xv = r.input.GetDouble(i * k + p), wv = r.weight.GetDouble(j * k + p);
        const double xh = TruncBf16(xv), xl = Bf16(xv - xh);
        const double wh = TruncBf16(wv), wl = Bf16(wv - wh);
        lh[p] = F32(xl * wh);
        hl[p] = F32(xh * wl);
        hh[p] = F32(xh * wh);
      }
      const float low = SumFp32(lh, Order::kPairwise) + SumFp32(hl, Order::kPairwise);
      const float acc = low + SumFp32(hh, Order::kPairwise);
      y[static_cast<size_t>(i * n + j)] = F32(double(acc) + r.bias->GetDouble(j));
    }
  }
  return *FromDoubles(DType::kFloat32, {m, n}, y);
}

TEST_F(DiagnosisTest, AnXlaBf16x3OutputIsNamedBf16x3WithItsErrorAtItsBound) {
  const int64_t m = 32, k = 512, n = 64;
  LinearRequest r = MakeRequest(m, k, n, DType::kFloat32, 83);
  r.observed = XlaBf16x3(r);
  // bf16x3 named by its JAX preset: results print the canonical name.
  r.configs = {"cpu:jax=BF16_BF16_F32_X3", "cpu:bf16", "cpu:fp32", "cpu:tf32"};
  auto out = engine_->Diagnose(r);
  ASSERT_THAT(out, IsOk());
  const DiagnosisOutcome& d = *out->diagnosis;
  ASSERT_TRUE(d.best.has_value()) << d.explanation;
  EXPECT_THAT(*d.best, ::testing::StartsWith("cpu:bf16x3")) << d.explanation;
  EXPECT_THAT(d.framework_hint, ::testing::HasSubstr("precision=HIGH on TPU"));
  EXPECT_THAT(d.framework_hint, ::testing::HasSubstr("BF16_BF16_F32_X3"));
  for (const RankedCandidate& c : d.ranking) {
    if (!absl::StartsWith(c.config, "cpu:bf16x3")) continue;
    // Another order of the same passes: its pair error model's size.
    ASSERT_TRUE(c.bound_ratio.has_value());
    EXPECT_LT(*c.bound_ratio, 1.5) << c.config;
    EXPECT_TRUE(c.plausible) << c.config;
  }
  // Against the fp64 reference, bf16x3's own sigma (its input unit 2^-16)
  // sizes the error: the ratio is about 1, where fp32's would be far above.
  for (const ConfigOutcome& c : out->results) {
    if (!absl::StartsWith(c.config, "cpu:bf16x3")) continue;
    ASSERT_TRUE(c.vs_reference.bound_ratio.has_value());
    EXPECT_GT(*c.vs_reference.bound_ratio, 0.3) << c.config;
    EXPECT_LT(*c.vs_reference.bound_ratio, 1.5) << c.config;
  }
}

TEST(FrameworkHintTest, MultiPassPrecisionsNameTheirJaxPresets) {
  const Config x3{"cpu", Precision::kBf16x3, BiasMode::kUnfused};
  const std::string hint = FrameworkHint(x3, DType::kFloat32, true);
  EXPECT_THAT(hint, ::testing::HasSubstr("precision=HIGH on TPU"));
  EXPECT_THAT(hint, ::testing::HasSubstr("precision='BF16_BF16_F32_X3'"));
  EXPECT_THAT(hint, ::testing::HasSubstr("the bias added as its own op"));
  EXPECT_THAT(FrameworkHint({"cpu", Precision::kBf16x6, BiasMode::kNone}, DType::kFloat32, false),
              ::testing::HasSubstr("precision=HIGHEST on TPU"));
  EXPECT_THAT(FrameworkHint({"cpu", Precision::kBf16x9, BiasMode::kNone}, DType::kFloat32, false),
              ::testing::HasSubstr("CUBLAS_COMPUTE_32F_EMULATED_16BFX9"));
  EXPECT_THAT(FrameworkHint({"cpu", Precision::kTf32x3, BiasMode::kNone}, DType::kFloat32, false),
              ::testing::HasSubstr("TF32_TF32_F32_X3"));
  // No framework defaults to a multi-pass algorithm.
  EXPECT_EQ(FrameworkDefault(x3, DType::kFloat32, true), "");
  EXPECT_THAT(HowToMatch({"cpu", Precision::kBf16, BiasMode::kUnfused}, x3, DType::kFloat32, true),
              ::testing::StartsWith("Ask for the BF16_BF16_F32_X3 dot algorithm"));
  EXPECT_THAT(HowToMatch(x3, {"cpu", Precision::kFp32, BiasMode::kUnfused}, DType::kFloat32, true),
              ::testing::StartsWith("Ask for the F32_F32_F32 dot algorithm instead of "
                                    "BF16_BF16_F32_X3"));
}

}  // namespace
}  // namespace tensorcheck
