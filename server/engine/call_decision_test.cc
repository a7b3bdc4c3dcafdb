#include "server/engine/call_decision.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tensorcheck {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

LinearRequest NoBias() { return LinearRequest{}; }

LinearRequest WithBias() {
  LinearRequest r;
  r.bias = Tensor();
  return r;
}

VerifyOutcome Diagnosed(std::optional<std::string> best, std::vector<std::string> equivalent = {},
                        std::vector<std::string> tied = {},
                        DiagnosisVerdict verdict = DiagnosisVerdict::kRounding) {
  VerifyOutcome o;
  o.observed_vs_reference = DiffStats{};
  DiagnosisOutcome d;
  d.best = std::move(best);
  d.equivalent = std::move(equivalent);
  d.tied = std::move(tied);
  d.verdict = verdict;
  o.diagnosis = d;
  return o;
}

TEST(CallDecisionTest, ExplainingIsBestThenEquivalentThenTiedWithoutRepeats) {
  const CallDecision c =
      DecideCall(WithBias(), Diagnosed("cpu:bf16:fused", {"cpu:fp32:fused", "cpu:bf16:fused"},
                                       {"cpu:tf32:fused", "cpu:fp32:fused"}));
  EXPECT_TRUE(c.explained);
  EXPECT_THAT(c.explaining, ElementsAre("cpu:bf16:fused", "cpu:fp32:fused", "cpu:tf32:fused"));
  EXPECT_EQ(c.divergence, "");
}

TEST(CallDecisionTest, NoneStandsForBothBiasPlacementsOnlyWithoutABias) {
  const VerifyOutcome o = Diagnosed("cpu:bf16:none", {"cpu:tf32:none"});
  EXPECT_THAT(DecideCall(NoBias(), o).explaining,
              ElementsAre("cpu:bf16:none", "cpu:bf16:fused", "cpu:bf16:unfused", "cpu:tf32:none",
                          "cpu:tf32:fused", "cpu:tf32:unfused"));
  EXPECT_THAT(DecideCall(WithBias(), o).explaining, ElementsAre("cpu:bf16:none", "cpu:tf32:none"));
}

TEST(CallDecisionTest, NoBestIsNotExplainedAndDivergesOnItsOwn) {
  const CallDecision c = DecideCall(NoBias(), Diagnosed(std::nullopt));
  EXPECT_FALSE(c.explained);
  EXPECT_THAT(c.explaining, IsEmpty());
  EXPECT_EQ(c.divergence, "no candidate explains its output");
}

TEST(CallDecisionTest, ADefectOrUnexplainedVerdictDivergesWithTheServersSentence) {
  VerifyOutcome o = Diagnosed("cpu:bf16:fused", {}, {}, DiagnosisVerdict::kDefect);
  o.diagnosis->verdict_reason = "3 columns hold more disagreements than rounding allows.";
  EXPECT_EQ(DecideCall(NoBias(), o).divergence,
            "3 columns hold more disagreements than rounding allows.");
  // Still explained: best explains the bulk.
  EXPECT_TRUE(DecideCall(NoBias(), o).explained);
  o.diagnosis->verdict_reason.clear();
  EXPECT_EQ(DecideCall(NoBias(), o).divergence, "the server's verdict is defect");
  VerifyOutcome u = Diagnosed(std::nullopt, {}, {}, DiagnosisVerdict::kUnexplained);
  EXPECT_EQ(DecideCall(NoBias(), u).divergence, "the server's verdict is unexplained");
}

TEST(CallDecisionTest, NonFiniteObservedValuesComeFirst) {
  VerifyOutcome o = Diagnosed(std::nullopt, {}, {}, DiagnosisVerdict::kUnexplained);
  o.observed_vs_reference->nan_actual = 2;
  o.observed_vs_reference->inf_actual = 1;
  EXPECT_EQ(DecideCall(NoBias(), o).divergence, "its observed output holds 3 non-finite values");
  o.observed_vs_reference->nan_actual = 0;
  EXPECT_EQ(DecideCall(NoBias(), o).divergence, "its observed output holds 1 non-finite value");
}

TEST(CallDecisionTest, BoundThresholdDefaultsToThreeAndNanExceedsIt) {
  VerifyOutcome o = Diagnosed("cpu:bf16:fused");
  o.observed_vs_reference->bound_ratio = 3.0;  // equal: within
  CallDecision c = DecideCall(NoBias(), o);
  EXPECT_EQ(c.bound_threshold, 3.0);
  EXPECT_FALSE(c.bound_exceeded);
  EXPECT_EQ(c.bound_reason, "");

  o.observed_vs_reference->bound_ratio = 7.24;
  c = DecideCall(NoBias(), o);
  EXPECT_TRUE(c.bound_exceeded);
  EXPECT_EQ(c.bound_reason, "bound_ratio 7.24 exceeds 3");
  // The threshold decides, not the divergence: it is a separate rule.
  EXPECT_EQ(c.divergence, "");

  o.observed_vs_reference->bound_ratio = std::numeric_limits<double>::quiet_NaN();
  c = DecideCall(NoBias(), o);
  EXPECT_TRUE(c.bound_exceeded);
  EXPECT_EQ(c.bound_reason, "bound_ratio nan exceeds 3");

  LinearRequest loose = NoBias();
  loose.bound_threshold = 10;
  o.observed_vs_reference->bound_ratio = 7.24;
  c = DecideCall(loose, o);
  EXPECT_EQ(c.bound_threshold, 10.0);
  EXPECT_FALSE(c.bound_exceeded);
}

TEST(CallDecisionTest, WithoutADiagnosisTheVerdictExplains) {
  VerifyOutcome o;
  o.passed = true;
  EXPECT_TRUE(DecideCall(NoBias(), o).explained);
  EXPECT_EQ(DecideCall(NoBias(), o).divergence, "");
  o.passed = false;
  EXPECT_FALSE(DecideCall(NoBias(), o).explained);
  // A failed verify alone is not a divergence of its own.
  EXPECT_EQ(DecideCall(NoBias(), o).divergence, "");
  // No observed output: no bound decision.
  EXPECT_FALSE(DecideCall(NoBias(), o).bound_exceeded);
}

}  // namespace
}  // namespace tensorcheck
