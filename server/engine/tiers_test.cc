// The tiers of a diagnosis's default candidates (docs/numerics.md,
// "Diagnosis"): the second runs only when the first leaves the output
// unexplained, and its candidates are ranked with the first's. Observed
// outputs are made here, by loops of the test's own: the row-wise FP8
// recipe from docs/numerics.md's "Scaling recipes" with a brute-force
// nearest-E4M3 search, XLA's bf16x3 split from "Multi-pass precisions".
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "core/linear_config.h"
#include "server/engine/engine.h"
#include "tests/testing/ref_round.h"
#include "tests/testing/status_matchers.h"

namespace tensorcheck {
namespace {

using ::tensorcheck::testing::IsOk;
using ::tensorcheck::testing::kBf16Format;
using ::tensorcheck::testing::RefFp8Nearest;
using ::tensorcheck::testing::RefFp8Value;
using ::tensorcheck::testing::RefRound;

float F32(double v) { return static_cast<float>(v); }
double Bf16(double v) { return RefRound(v, kBf16Format); }

// x [m, k], W [n, k], b [n]: Gaussian values stored in `storage`.
LinearRequest MakeLayer(int64_t m, int64_t k, int64_t n, DType storage, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> x(m * k), w(n * k), b(n);
  for (double& v : x) v = normal(rng);
  for (double& v : w) v = normal(rng) / std::sqrt(double(k));
  for (double& v : b) v = 0.5 * normal(rng);
  LinearRequest r;
  r.input = *FromDoubles(storage, {m, k}, x);
  r.weight = *FromDoubles(storage, {n, k}, w);
  r.bias = *FromDoubles(storage, {n}, b);
  return r;
}

// One row of the row-wise recipe (docs/numerics.md, "Scaling recipes"):
// amax in fp64, s = 448 / max(amax, 1e-12) rounded to fp32, each value
// fl32(v * s) cast to E4M3 by the nearest of its 256 values (ties to the
// even pattern; beyond the largest, saturated to +-448). Returns the
// dequantisation scale fl32(1 / s); `q` receives the E4M3 values.
float QuantiseRow(const std::vector<double>& v, std::vector<double>* q) {
  double amax = 0;
  for (double a : v) amax = std::max(amax, std::fabs(a));
  const float s = F32(448.0 / std::max(amax, 1e-12));
  q->resize(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const double scaled = F32(F32(v[i]) * double(s));
    const std::optional<int> bits = RefFp8Nearest(scaled, /*e4m3=*/true);
    (*q)[i] = bits.has_value() ? RefFp8Value(*bits, /*e4m3=*/true) : std::copysign(448.0, scaled);
  }
  return F32(1.0 / double(s));
}

// torchao's Float8Linear with row-wise scaling, then torch._scaled_mm
// with a fused bias and a bf16 output: each row of x and of W quantised;
// the exact products summed in fp64 and rounded to fp32; the row scales
// applied in fp32, (acc * sx[i]) * sw[j]; the bias added in fp32; one
// rounding to bf16.
Tensor RowWiseFp8Output(const LinearRequest& r) {
  const int64_t k = r.input.shape().back(), m = r.input.numel() / k, n = r.weight.dim(0);
  std::vector<std::vector<double>> xq(m), wq(n);
  std::vector<float> sx(m), sw(n);
  std::vector<double> row(k);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t p = 0; p < k; ++p) row[p] = r.input.GetDouble(i * k + p);
    sx[i] = QuantiseRow(row, &xq[i]);
  }
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t p = 0; p < k; ++p) row[p] = r.weight.GetDouble(j * k + p);
    sw[j] = QuantiseRow(row, &wq[j]);
  }
  std::vector<double> y(m * n);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0;  // each product exact: at most 8 significant bits
      for (int64_t p = 0; p < k; ++p) sum += xq[i][p] * wq[j][p];
      const float acc = F32(F32(F32(sum) * double(sx[i])) * double(sw[j]));
      y[i * n + j] = Bf16(F32(double(acc) + r.bias->GetDouble(j)));
    }
  }
  return *FromDoubles(DType::kBFloat16, {m, n}, y);
}

// XLA's bf16x3 of fp32 tensors (docs/numerics.md, "Multi-pass
// precisions"): hi = the value cut toward zero to bf16 (its low 16 bits
// cleared), lo = bf16(v - hi) to nearest even; per element
// (sum lo*hi + sum hi*lo) + sum hi*hi, each sum sequential in fp32; the
// bias added in fp32 (an fp32 output).
double TruncBf16(double v) {
  float f = F32(v);
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  bits &= 0xFFFF0000u;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

Tensor Bf16x3Output(const LinearRequest& r) {
  const int64_t k = r.input.shape().back(), m = r.input.numel() / k, n = r.weight.dim(0);
  std::vector<double> y(m * n);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      float lh = 0, hl = 0, hh = 0;
      for (int64_t p = 0; p < k; ++p) {
        const double xv = r.input.GetDouble(i * k + p), wv = r.weight.GetDouble(j * k + p);
        const double xh = TruncBf16(xv), xl = Bf16(xv - xh);
        const double wh = TruncBf16(wv), wl = Bf16(wv - wh);
        lh = F32(double(lh) + F32(xl * wh));  // products of bf16 values: exact in fp32
        hl = F32(double(hl) + F32(xh * wl));
        hh = F32(double(hh) + F32(xh * wh));
      }
      const float acc = F32(double(F32(double(lh) + hl)) + hh);
      y[i * n + j] = F32(double(acc) + r.bias->GetDouble(j));
    }
  }
  return *FromDoubles(DType::kFloat32, {m, n}, y);
}

// bf16 storage's own computation: the exact products summed in fp32 in
// index order, the bias added to the fp32 sum, one rounding to bf16.
Tensor Bf16FusedOutput(const LinearRequest& r) {
  const int64_t k = r.input.shape().back(), m = r.input.numel() / k, n = r.weight.dim(0);
  std::vector<double> y(m * n);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      float acc = 0;
      for (int64_t p = 0; p < k; ++p) {
        acc = F32(double(acc) + F32(r.input.GetDouble(i * k + p) * r.weight.GetDouble(j * k + p)));
      }
      y[i * n + j] = Bf16(F32(double(acc) + r.bias->GetDouble(j)));
    }
  }
  return *FromDoubles(DType::kBFloat16, {m, n}, y);
}

bool InSecondTier(const std::string& config) {
  return absl::StrContains(config, ":fp8") || absl::StrContains(config, "x3") ||
         absl::StrContains(config, "splitk=") || absl::StrContains(config, "x6") ||
         absl::StrContains(config, "x9") || absl::StrContains(config, ":mxfp8") ||
         absl::StrContains(config, ":nvfp4");
}

class TiersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_THAT(RegisterBuiltinBackends(&registry_), IsOk());
    auto engine = Engine::Create(options_, &registry_);
    ASSERT_THAT(engine, IsOk());
    engine_ = std::move(engine).value();
  }

  BackendRegistry registry_;
  EngineOptions options_;
  std::unique_ptr<Engine> engine_;
};

// What each tier holds, by storage dtype: bf16 values are their own high
// part under every bf16xN and exact in TF32, so no multi-pass precision
// differs from one pass; fp16's 11 bits fill bf16x6's high and middle
// parts and a TF32 part, leaving bf16x3 (which drops lo*lo); fp32 keeps
// all but bf16x9, whose three parts hold every fp32 bit.
TEST(SecondTierSpecsTest, FollowTheStorageDtype) {
  auto names = [](DType storage) {
    std::vector<std::string> out;
    for (ConfigSpec spec : SecondTierCandidateSpecs(storage, storage)) {
      spec.backend = "cpu";
      out.push_back(ResolveConfig(spec, /*has_bias=*/true, Activation::kNone, BiasMode::kFused,
                                  Fp8Scaling::kTensor)
                        .ToString());
    }
    return out;
  };
  const std::vector<std::string> fp8 = {"cpu:fp8e4m3:fused@scaling=tensor",
                                        "cpu:fp8e4m3:fused@scaling=tensor,fast_accum",
                                        "cpu:fp8e4m3:fused@scaling=row",
                                        "cpu:fp8e4m3:fused@scaling=row,fast_accum",
                                        "cpu:fp8e4m3:fused@scaling=block128",
                                        "cpu:fp8e4m3:fused@scaling=block128,fast_accum",
                                        "cpu:mxfp8e4m3:fused@scaling=floor",
                                        "cpu:mxfp8e4m3:fused@scaling=rceil",
                                        "cpu:nvfp4:fused"};
  // Then split-K reduced in the output type, for 16-bit storage (K
  // unknown: every scanned count).
  auto split = [](const char* precision) {
    std::vector<std::string> out;
    for (int s : {2, 3, 4, 6, 8, 16}) {
      out.push_back(absl::StrCat("cpu:", precision, ":fused@splitk=", s, ",reduce=output"));
    }
    return out;
  };
  std::vector<std::string> bf16 = fp8;
  for (const std::string& c : split("bf16")) bf16.push_back(c);
  EXPECT_EQ(names(DType::kBFloat16), bf16);
  std::vector<std::string> fp16 = fp8;
  fp16.push_back("cpu:bf16x3:fused");
  for (const std::string& c : split("fp16")) fp16.push_back(c);
  EXPECT_EQ(names(DType::kFloat16), fp16);
  std::vector<std::string> fp32 = fp8;
  for (const char* c : {"cpu:bf16x3:fused", "cpu:bf16x6:fused", "cpu:tf32x3:fused"}) {
    fp32.push_back(c);
  }
  EXPECT_EQ(names(DType::kFloat32), fp32);
  // FP8 operands are already quantised; fp64 has no recipe here.
  EXPECT_TRUE(SecondTierCandidateSpecs(DType::kFloat8E4M3Fn, DType::kFloat8E4M3Fn).empty());
  EXPECT_TRUE(SecondTierCandidateSpecs(DType::kFloat64, DType::kFloat64).empty());
  // The first tier is unchanged: the wide precisions, or the operands'
  // fp8 precision with and without fast accumulation.
  EXPECT_EQ(FirstTierCandidateSpecs(DType::kBFloat16, DType::kBFloat16, Fp8Scaling::kTensor).size(),
            std::size(kWidePrecisions));
  EXPECT_EQ(
      FirstTierCandidateSpecs(DType::kFloat8E4M3Fn, DType::kFloat8E4M3Fn, Fp8Scaling::kRow).size(),
      2u);
}

// A plain bf16 output: the first tier explains it, and the second never
// runs (no fp8 recipe or multi-pass candidate ranked).
TEST_F(TiersTest, AFirstTierOutputRunsOnlyTheFirstTier) {
  LinearRequest r = MakeLayer(16, 256, 48, DType::kBFloat16, 5);
  r.observed = Bf16FusedOutput(r);
  auto out = engine_->Diagnose(r);
  ASSERT_THAT(out, IsOk());
  const DiagnosisOutcome& d = *out->diagnosis;
  EXPECT_EQ(d.candidate_tiers, std::vector<int>{1});
  EXPECT_EQ(d.verdict, DiagnosisVerdict::kRounding) << d.verdict_reason;
  ASSERT_TRUE(d.best.has_value()) << d.explanation;
  EXPECT_EQ(*d.best, "cpu:bf16:fused") << d.explanation;
  EXPECT_EQ(d.ranking.size(), engine_
                                  ->DefaultCandidates(DType::kBFloat16, DType::kBFloat16,
                                                      /*has_bias=*/true, Activation::kNone)
                                  .size());
  for (const RankedCandidate& c : d.ranking) EXPECT_FALSE(InSecondTier(c.config)) << c.config;
  for (const ConfigOutcome& c : out->results) EXPECT_FALSE(InSecondTier(c.config)) << c.config;
}

// The verdict's case: an output of torchao's row-wise FP8 recipe, sent
// with its wide (bf16) operands and no configuration named, is named
// fp8e4m3 with row scaling; the first tier left it unexplained.
TEST_F(TiersTest, ARowWiseFp8OutputIsNamedWithoutBeingAskedFor) {
  LinearRequest r = MakeLayer(32, 512, 96, DType::kBFloat16, 21);
  r.observed = RowWiseFp8Output(r);
  LinearRequest first_only = MakeLayer(32, 512, 96, DType::kBFloat16, 21);
  first_only.observed = RowWiseFp8Output(first_only);
  first_only.configs =
      engine_->DefaultCandidates(DType::kBFloat16, DType::kBFloat16, true, Activation::kNone);
  auto first = engine_->Diagnose(first_only);
  ASSERT_THAT(first, IsOk());
  EXPECT_EQ(first->diagnosis->verdict, DiagnosisVerdict::kUnexplained)
      << first->diagnosis->verdict_reason;

  auto out = engine_->Diagnose(r);
  ASSERT_THAT(out, IsOk());
  const DiagnosisOutcome& d = *out->diagnosis;
  EXPECT_EQ(d.candidate_tiers, (std::vector<int>{1, 2}));
  EXPECT_EQ(d.verdict, DiagnosisVerdict::kRounding) << d.verdict_reason;
  ASSERT_TRUE(d.best.has_value()) << d.explanation;
  EXPECT_EQ(*d.best, "cpu:fp8e4m3:fused@scaling=row") << d.explanation;
  // One ranking over both tiers.
  EXPECT_EQ(
      d.ranking.size(),
      engine_->DefaultCandidates(DType::kBFloat16, DType::kBFloat16, true, Activation::kNone)
              .size() +
          engine_->SecondTierCandidates(DType::kBFloat16, DType::kBFloat16, true, Activation::kNone)
              .size());
  EXPECT_THAT(out->notes, ::testing::Contains(::testing::HasSubstr(
                              "the second tier of default candidates ran (30 more)")));
}

// An XLA bf16x3 output of fp32 tensors: bf16x3 leaves out lo*lo, a
// relative error near 2^-16 per product, far beyond fp32's and far below
// TF32's or bf16's input rounding, so no first-tier candidate explains it
// and the second names bf16x3. (fp32 output: fused and unfused compute
// the same function and are merged.)
TEST_F(TiersTest, ABf16x3OutputIsNamedWithoutBeingAskedFor) {
  LinearRequest r = MakeLayer(32, 512, 64, DType::kFloat32, 83);
  r.observed = Bf16x3Output(r);
  auto out = engine_->Diagnose(r);
  ASSERT_THAT(out, IsOk());
  const DiagnosisOutcome& d = *out->diagnosis;
  EXPECT_EQ(d.candidate_tiers, (std::vector<int>{1, 2}));
  EXPECT_EQ(d.verdict, DiagnosisVerdict::kRounding) << d.verdict_reason;
  ASSERT_TRUE(d.best.has_value()) << d.explanation;
  EXPECT_THAT(*d.best, ::testing::StartsWith("cpu:bf16x3:")) << d.explanation;
}

// The limits hold for the second tier: where it would pass them, the
// first tier's answer stands, and a note says why no more ran.
TEST(TiersLimitsTest, TheSecondTierStaysWithinTheLimits) {
  BackendRegistry registry;
  ASSERT_THAT(RegisterBuiltinBackends(&registry), IsOk());
  LinearRequest r = MakeLayer(32, 512, 96, DType::kBFloat16, 21);
  r.observed = RowWiseFp8Output(r);
  const int64_t macs = 32 * 512 * 96;
  // 16 first-tier candidates and the reference fit either limit; the two
  // tiers together (first run, then 24 candidates and the reference) do not.
  for (const bool by_work : {true, false}) {
    SCOPED_TRACE(by_work ? "max_work_macs" : "max_configs");
    EngineOptions options;
    if (by_work) {
      options.limits.max_work_macs = 30 * macs;
    } else {
      options.limits.max_configs = 20;
    }
    auto engine = Engine::Create(options, &registry);
    ASSERT_THAT(engine, IsOk());
    auto out = (*engine)->Diagnose(r);
    ASSERT_THAT(out, IsOk());
    const DiagnosisOutcome& d = *out->diagnosis;
    EXPECT_EQ(d.candidate_tiers, std::vector<int>{1});
    EXPECT_EQ(d.verdict, DiagnosisVerdict::kUnexplained);
    EXPECT_EQ(d.ranking.size(), 16u);
    EXPECT_THAT(out->notes,
                ::testing::Contains(::testing::AllOf(
                    ::testing::HasSubstr("second tier"), ::testing::HasSubstr("did not run"),
                    ::testing::HasSubstr(by_work ? "work" : "at most 20"))));
  }
}

// Admission sizes a default diagnosis for both tiers: as a request naming
// every candidate of both does.
TEST_F(TiersTest, WorkingBytesCountBothTiers) {
  LinearRequest r = MakeLayer(8, 64, 16, DType::kFloat32, 3);
  r.observed = Bf16x3Output(r);
  LinearRequest named = MakeLayer(8, 64, 16, DType::kFloat32, 3);
  named.configs =
      engine_->DefaultCandidates(DType::kFloat32, DType::kFloat32, true, Activation::kNone);
  for (const std::string& c :
       engine_->SecondTierCandidates(DType::kFloat32, DType::kFloat32, true, Activation::kNone)) {
    named.configs.push_back(c);
  }
  EXPECT_EQ(named.configs.size(), 16u + 24u);
  EXPECT_EQ(engine_->EstimateWorkingBytes(r, /*diagnose=*/true),
            engine_->EstimateWorkingBytes(named, /*diagnose=*/true));
}

}  // namespace
}  // namespace tensorcheck
