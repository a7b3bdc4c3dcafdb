// The diagnosis's host passes and per-element rules (diagnosis_passes.h,
// diagnosis_rules.h) on small tensors whose every count and sum is worked
// out by hand in the comments.
#include "server/stats/diagnosis_passes.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "server/stats/error_model.h"

namespace tensorcheck {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

Tensor Floats(const std::vector<double>& values) {
  Tensor t = *Tensor::Create(DType::kFloat32, {static_cast<int64_t>(values.size())});
  for (size_t i = 0; i < values.size(); ++i) t.data<float>()[i] = static_cast<float>(values[i]);
  return t;
}

TEST(DiagnosisRulesTest, FlipChanceEdges) {
  // sqrt(2/pi) * 0.5 / 1.
  EXPECT_DOUBLE_EQ(rules::FlipChance(0.5f, 1.0f), 0.3989422804014327);
  EXPECT_EQ(rules::FlipChance(2.0f, 1.0f), 1.0);  // capped
  EXPECT_EQ(rules::FlipChance(0.5f, 0.0f), 1.0);  // no grid: any difference shows
  EXPECT_EQ(rules::FlipChance(0.5f, std::nanf("")), 1.0);
  EXPECT_EQ(rules::FlipChance(0.5f, INFINITY), 0.0);  // no flip can show
  EXPECT_EQ(rules::FlipChance(std::nanf(""), 1.0f), 1.0);
  // The host's FlipChance is the rule.
  EXPECT_EQ(FlipChance(0.25f, 0.5f), rules::FlipChance(0.25f, 0.5f));
}

TEST(DiagnosisRulesTest, ConsistentIsBitwiseOrWithinFourSigma) {
  EXPECT_TRUE(rules::ElementConsistent(kInf, kInf, 0, 0.0f));
  EXPECT_FALSE(rules::ElementConsistent(kInf, 1.0, 5, 1e30f));
  EXPECT_TRUE(rules::ElementConsistent(1.0, 1.5, 7, 0.125f));    // 0.5 <= 4 * 0.125
  EXPECT_FALSE(rules::ElementConsistent(1.0, 1.5, 7, 0.0625f));  // 0.5 > 0.25
}

TEST(DiagnosisPassesTest, UlpIsZeroAcrossSignedZeros) {
  EXPECT_EQ(DiagnosisUlp(0.0, -0.0, DType::kBFloat16), 0u);
  EXPECT_EQ(DiagnosisUlp(1.0, 1.0 + 0x1p-7, DType::kBFloat16), 1u);
  EXPECT_EQ(DiagnosisUlp(1.0, 1.0 + 0x1p-7, DType::kFloat32), 1u << 16);
}

// observed  1    2          3     inf
// candidate 1    2+2^-22    3.5   1
// ULP (fp32) 0   1          2^21  0x40000000 (capped to 1024 in the sum)
// pair sigma 0.25  2^-20    0.0625  0.5
// consistent yes   yes (2^-22 <= 4 * 2^-20)  no (0.5 > 0.25)  no (not finite)
TEST(DiagnosisPassesTest, ScoreSumsByHand) {
  const Tensor observed = Floats({1, 2, 3, kInf});
  const Tensor candidate = Floats({1, 2 + 0x1p-22, 3.5, 1});
  const std::vector<float> sigma = {0.25f, 0x1p-20f, 0.0625f, 0.5f};
  const std::vector<float> acc = {0.0f, 0.5f, 2.0f, 0.0f};
  const std::vector<float> grid = {1.0f, 1.0f, 1.0f, 1.0f};
  rules::ScoreSums s = ScorePass(
      {&observed, &candidate, sigma.data(), acc.data(), grid.data(), nullptr, DType::kFloat32});
  EXPECT_EQ(s.counted, 4);
  EXPECT_EQ(s.bitwise, 1);
  EXPECT_EQ(s.consistent, 2);
  EXPECT_EQ(s.ulp_sum, 0 + 1 + 1024 + 1024);
  EXPECT_EQ(s.max_ulp, 0x40000000u);
  // FlipChance: 0, sqrt(2/pi) * 0.5, min(1, sqrt(2/pi) * 2), 0.
  EXPECT_DOUBLE_EQ(s.expected_disagreements, 0.3989422804014327 + 1.0);
  // Finite elements only (the first three).
  EXPECT_EQ(s.err_sq, 0x1p-44 + 0.25);
  EXPECT_EQ(s.sigma_sq, 0.0625 + 0x1p-40 + 0x1p-8);

  // The mask leaves out element 2: its ULPs, inconsistency and error go.
  const std::vector<uint8_t> mask = {1, 1, 0, 1};
  s = ScorePass(
      {&observed, &candidate, sigma.data(), acc.data(), grid.data(), mask.data(), DType::kFloat32});
  EXPECT_EQ(s.counted, 3);
  EXPECT_EQ(s.consistent, 2);
  EXPECT_EQ(s.ulp_sum, 0 + 1 + 1024);
  EXPECT_EQ(s.err_sq, 0x1p-44);

  // Without a flip grid: the output spacing at the candidate's value
  // (fp32 at 1: 2^-23; at 2: 2^-22; at 3.5: 2^-22), each chance capped at 1.
  s = ScorePass(
      {&observed, &candidate, sigma.data(), acc.data(), nullptr, nullptr, DType::kFloat32});
  EXPECT_EQ(s.expected_disagreements, 0.0 + 1.0 + 1.0 + 0.0);
}

TEST(DiagnosisPassesTest, MarkConsistentGrowsTheMask) {
  const Tensor observed = Floats({1, 2, 3, kInf});
  const Tensor first = Floats({1, 2 + 0x1p-22, 3.5, 1});
  const std::vector<float> sigma = {0.25f, 0x1p-20f, 0.0625f, 0.5f};
  std::vector<uint8_t> mask(4, 0);
  EXPECT_EQ(MarkConsistentPass(observed, first, sigma.data(), DType::kFloat32, &mask), 2);
  EXPECT_EQ(mask, (std::vector<uint8_t>{1, 1, 0, 0}));
  // A second candidate explains element 3 (bitwise: inf) but not 2.
  const Tensor second = Floats({0, 0, 4, kInf});
  EXPECT_EQ(MarkConsistentPass(observed, second, sigma.data(), DType::kFloat32, &mask), 3);
  EXPECT_EQ(mask, (std::vector<uint8_t>{1, 1, 0, 1}));
}

// best/runner/observed per element, sigma 0.1 except element 3 (1.0):
// 0: 1 / 1 / 1: no difference, skipped
// 1: 2 / 2.5 / 2: counts, runner further
// 2: 3.5 / 3 / 3: counts, runner closer
// 3: 5+2^-21 / 5+2^-20 / 5: 2^-21 apart, under half a sigma: skipped
// 4: inf / 1 / inf: difference not finite, counts, runner further
TEST(DiagnosisPassesTest, PairedCountsByHand) {
  const Tensor observed = Floats({1, 2, 3, 5, kInf});
  const Tensor best = Floats({1, 2, 3.5, 5 + 0x1p-21, kInf});
  const Tensor runner = Floats({1, 2.5, 3, 5 + 0x1p-20, 1});
  const std::vector<float> sigma = {0.1f, 0.1f, 0.1f, 1.0f, 0.1f};
  rules::PairedSums p = PairedPass(observed, best, runner, sigma.data(), nullptr, DType::kFloat32);
  EXPECT_EQ(p.further, 2);
  EXPECT_EQ(p.closer, 1);
  const std::vector<uint8_t> mask = {1, 1, 1, 1, 0};
  p = PairedPass(observed, best, runner, sigma.data(), mask.data(), DType::kFloat32);
  EXPECT_EQ(p.further, 1);
  EXPECT_EQ(p.closer, 1);
}

TEST(DiagnosisPassesTest, DifferingCountsByColumnAndRow) {
  // A 2x3 matrix differing at (0, 1) and (1, 1).
  const Tensor a = Floats({1, 2, 3, 4, 5, 6});
  const Tensor b = Floats({1, 2.5, 3, 4, 5.5, 6});
  DifferingCounts d = DifferingPass(a, b, nullptr, 3, DType::kFloat32);
  EXPECT_EQ(d.columns, (std::vector<int64_t>{0, 2, 0}));
  EXPECT_EQ(d.rows, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(d.total, 2);
  const std::vector<uint8_t> mask = {1, 0, 1, 1, 1, 1};
  d = DifferingPass(a, b, mask.data(), 3, DType::kFloat32);
  EXPECT_EQ(d.columns, (std::vector<int64_t>{0, 1, 0}));
  EXPECT_EQ(d.rows, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(d.total, 1);
}

TEST(DiagnosisPassesTest, ErrorAgainstTheReferenceSkipsNonFinite) {
  // Differences -0.5, 0 and inf (left out).
  const Tensor observed = Floats({1, 2, kInf});
  const Tensor reference = Floats({1.5, 2, 1});
  const std::vector<float> sigma = {0.5f, 0.25f, 9.0f};
  const rules::ErrorSums e = ErrorPass(observed, reference, sigma.data(), nullptr);
  EXPECT_EQ(e.err_sq, 0.25);
  EXPECT_EQ(e.sigma_sq, 0.25 + 0.0625);
  EXPECT_EQ(e.max_abs, 0.5);
}

TEST(DiagnosisPassesTest, SameBitsIsByteEquality) {
  EXPECT_TRUE(SameBitsPass(Floats({1, 2}), Floats({1, 2})));
  // -0 and +0 are equal values but not the same bits.
  EXPECT_FALSE(SameBitsPass(Floats({0.0, 2}), Floats({-0.0, 2})));
  EXPECT_FALSE(SameBitsPass(Floats({1, 2}), Floats({1, 2, 3})));
}

// The verdict's scan on a 2 x 3 bf16 output, every number by hand. bf16
// spacing at [1, 2) is 2^-7 = 0.0078125; sigma_acc 0.001 and a flip grid
// of 2^-7 everywhere, so each element's flip chance is
// sqrt(2/pi) * 0.001 / 0.0078125 = 0.10212922.
TEST(DefectScanPassTest, CountsFlipsAndDistancesBeyondRoundingByHand) {
  const Tensor observed =
      *FromDoubles(DType::kBFloat16, {2, 3}, {1, 1.0078125, 1.0234375, NAN, 1.5, 1.5});
  const Tensor candidate = *FromDoubles(DType::kBFloat16, {2, 3}, {1, 1, 1, 1, 1.5, 1.5});
  const std::vector<float> sigma(6, 0.001f), grid(6, 0.0078125f);
  DefectScanInput in;
  in.observed = &observed;
  in.candidate = &candidate;
  in.pair_accumulation_sigma = sigma.data();
  in.flip_grid = grid.data();
  in.compared = DType::kBFloat16;
  in.cols = 3;
  in.threshold = 6.0;
  const DefectScan d = DefectScanPass(in);
  const double p = 0.7978845608028654 * static_cast<double>(0.001f) / 0.0078125;
  // Element 1: one step apart, within the slack of one spacing: z = 0.
  // Element 2: three steps (0.0234375) - one spacing = 0.015625 = 15.625 sigma.
  // Element 3: NaN against 1: infinitely far.
  ASSERT_EQ(d.columns.size(), 3u);
  ASSERT_EQ(d.rows.size(), 2u);
  EXPECT_EQ(d.columns[0].differing, 1);  // the NaN
  EXPECT_EQ(d.columns[0].beyond, 1);
  EXPECT_EQ(d.columns[0].max_sigma, kInf);
  EXPECT_NEAR(d.columns[0].expected, 2 * p, 1e-12);
  EXPECT_EQ(d.columns[1].differing, 1);
  EXPECT_EQ(d.columns[1].beyond, 0);
  EXPECT_EQ(d.columns[1].max_ulp, 1u);
  EXPECT_EQ(d.columns[1].max_sigma, 0.0);
  EXPECT_EQ(d.columns[2].beyond, 1);
  EXPECT_EQ(d.columns[2].max_ulp, 3u);
  EXPECT_NEAR(d.columns[2].max_sigma, 0.015625 / static_cast<double>(0.001f), 1e-9);
  EXPECT_EQ(d.rows[0].differing, 2);
  EXPECT_EQ(d.rows[0].beyond, 1);
  EXPECT_EQ(d.rows[1].differing, 1);
  EXPECT_EQ(d.all.differing, 3);
  EXPECT_EQ(d.all.beyond, 2);
  EXPECT_NEAR(d.all.expected, 6 * p, 1e-12);
  // Largest first: the NaN, then element 2.
  ASSERT_EQ(d.largest.size(), 2u);
  EXPECT_EQ(d.largest[0].diff.flat_index, 3);
  EXPECT_EQ(d.largest[1].diff.flat_index, 2);
  EXPECT_EQ(d.largest[1].diff.ulp, 3u);
  // An unfused bias adds the flip grid to the slack: 0.015625 - 0.0078125
  // = 0.0078125 = 7.8125 sigma, still beyond 6; a top_k of 1 keeps the NaN.
  in.unfused_bias = true;
  in.top_k = 1;
  const DefectScan u = DefectScanPass(in);
  EXPECT_NEAR(u.columns[2].max_sigma, 0.0078125 / static_cast<double>(0.001f), 1e-9);
  ASSERT_EQ(u.largest.size(), 1u);
  EXPECT_EQ(u.largest[0].diff.flat_index, 3);
  // The shift sums, over the finite elements that differ: e = (o - v) / s
  // is 0.0078125 / s in column 1 and 0.0234375 / s in column 2 (the NaN
  // is left out of its column's sums but still differs).
  const double s = static_cast<double>(0.001f);
  EXPECT_EQ(d.columns[0].signed_sum, 0.0);
  EXPECT_EQ(d.columns[0].squared_sum, 0.0);
  EXPECT_NEAR(d.columns[1].signed_sum, 0.0078125 / s, 1e-9);
  EXPECT_NEAR(d.columns[2].squared_sum, (0.0234375 / s) * (0.0234375 / s), 1e-6);
  EXPECT_NEAR(d.rows[0].signed_sum, (0.0078125 + 0.0234375) / s, 1e-9);
  EXPECT_NEAR(d.all.signed_sum, (0.0078125 + 0.0234375) / s, 1e-9);
}

}  // namespace
}  // namespace tensorcheck
