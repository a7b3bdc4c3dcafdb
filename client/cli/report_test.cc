#include "client/cli/report.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cctype>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cli/internal/report_format.h"

namespace tensorcheck::cli {
namespace {

using ::testing::AnyOf;
using ::testing::ElementsAre;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::Not;

// The context of a --verbose run: every table, as before the short report.
ReportContext Verbose(const char* command) {
  ReportContext c(command);
  c.verbose = true;
  return c;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// A diagnose answer over 94,674 elements: cpu:tf32:unfused matches all but
// three in bits and is plausible; cpu:tf32:fused reused its GEMM; cpu:fp32
// is ruled out.
pb::VerifyResponse DiagnoseResponse() {
  pb::VerifyResponse r;
  pb::ConfigResult* ref = r.mutable_reference();
  ref->set_config("cpu:fp64:none");
  ref->set_elapsed_ms(4.0);

  pb::ConfigResult* a = r.add_results();
  a->set_config("cpu:tf32:unfused");
  a->set_elapsed_ms(2.5);
  pb::Stats* s = a->mutable_vs_observed();
  s->set_total(94674);
  s->set_mismatched(0);
  s->set_bitwise_equal_count(94671);
  s->set_passed(true);
  pb::ConfigResult* b = r.add_results();
  b->set_config("cpu:tf32:fused");
  b->set_elapsed_ms(0.25);
  b->set_shared_computation("cpu:tf32:unfused");
  b->mutable_vs_observed()->set_total(94674);
  b->mutable_vs_observed()->set_bitwise_equal_count(94674);
  b->mutable_vs_observed()->set_passed(true);
  pb::Stats* observed = r.mutable_observed_vs_reference();
  observed->set_total(94674);
  observed->set_mismatched(3);

  pb::Diagnosis* d = r.mutable_diagnosis();
  d->set_best("cpu:tf32:unfused");
  d->set_confidence(0.97);
  pb::RankedCandidate* c1 = d->add_ranking();
  c1->set_config("cpu:tf32:unfused");
  c1->set_bitwise_equal_fraction(94671.0 / 94674.0);
  c1->set_max_ulp(1);
  c1->set_mean_ulp(3.2e-5);
  c1->mutable_bound_ratio()->set_value(0.71);
  c1->add_equivalent("cpu:tf32rna:unfused");
  c1->set_disagreements(3);
  c1->set_expected_disagreements(2.5);
  c1->set_plausibility_p(0.46);
  c1->set_plausible(true);
  c1->set_consistent_fraction(1.0);
  c1->set_compared_elements(94674);
  pb::RankedCandidate* c2 = d->add_ranking();
  c2->set_config("cpu:tf32:fused");
  c2->set_bitwise_equal_fraction(0.5);
  c2->set_max_ulp(2);
  c2->set_plausible(true);
  c2->set_compared_elements(94674);
  c2->set_shared_computation("cpu:tf32:unfused");
  pb::RankedCandidate* c3 = d->add_ranking();
  c3->set_config("cpu:fp32:fused");
  c3->set_bitwise_equal_fraction(3e-5);
  c3->set_max_ulp(900);
  c3->set_mean_ulp(41);
  c3->set_disagreements(94671);
  c3->set_expected_disagreements(12.5);
  c3->set_plausibility_p(0);
  c3->set_plausible(false);
  c3->set_consistent_fraction(0.25);
  c3->set_compared_elements(94674);
  c3->set_ruled_out(
      "94671 of 94674 elements differ from it in bits where its accumulation noise predicts "
      "12.5, and only 25% lie within 4 predicted standard errors.");
  return r;
}

TEST(VerifyResponseToJsonTest, RankingCarriesThePlausibilityTestAndSharedComputation) {
  const nlohmann::ordered_json j = VerifyResponseToJson(DiagnoseResponse());
  const nlohmann::ordered_json& c1 = j["diagnosis"]["ranking"][0];
  std::vector<std::string> keys;
  for (const auto& item : c1.items()) keys.push_back(item.key());
  EXPECT_THAT(
      keys, ElementsAre("config", "bitwise_equal_fraction", "max_ulp", "mean_ulp", "bound_ratio",
                        "equivalent", "disagreements", "expected_disagreements", "plausibility_p",
                        "plausible", "consistent_fraction", "compared_elements", "ruled_out",
                        "shared_computation", "exact", "details", "framework_default", "accepted"));
  EXPECT_EQ(c1["disagreements"], 3);
  EXPECT_EQ(c1["expected_disagreements"], 2.5);
  EXPECT_EQ(c1["plausibility_p"], 0.46);
  EXPECT_EQ(c1["plausible"], true);
  EXPECT_EQ(c1["consistent_fraction"], 1.0);
  EXPECT_EQ(c1["compared_elements"], 94674);
  EXPECT_EQ(c1["ruled_out"], "");
  EXPECT_EQ(c1["shared_computation"], "");
  const nlohmann::ordered_json& c2 = j["diagnosis"]["ranking"][1];
  EXPECT_EQ(c2["shared_computation"], "cpu:tf32:unfused");
  const nlohmann::ordered_json& c3 = j["diagnosis"]["ranking"][2];
  EXPECT_EQ(c3["plausible"], false);
  EXPECT_EQ(c3["plausibility_p"], 0.0);
  EXPECT_THAT(c3["ruled_out"].get<std::string>(), HasSubstr("94671 of 94674 elements"));
}

TEST(VerifyResponseToJsonTest, ResultsAndReferenceCarrySharedComputationLast) {
  const nlohmann::ordered_json j = VerifyResponseToJson(DiagnoseResponse());
  std::vector<std::string> keys;
  for (const auto& item : j["results"][1].items()) keys.push_back(item.key());
  EXPECT_THAT(keys, ElementsAre("config", "vs_reference", "vs_observed", "elapsed_ms", "details",
                                "deterministic", "runs", "shared_computation", "batch_invariance"));
  EXPECT_TRUE(j["results"][1]["batch_invariance"].is_null());
  EXPECT_EQ(j["results"][0]["shared_computation"], "");
  EXPECT_EQ(j["results"][1]["shared_computation"], "cpu:tf32:unfused");
  EXPECT_EQ(j["reference"]["shared_computation"], "");
}

// A verify answer whose cublaslt result changed 3 of 10 rows when run one
// row at a time (another algorithm), and whose reference kept its bits.
pb::VerifyResponse BatchInvarianceResponse() {
  pb::VerifyResponse r;
  pb::ConfigResult* ref = r.mutable_reference();
  ref->set_config("cpu:fp64:none");
  pb::BatchInvariance* rb = ref->mutable_batch_invariance();
  rb->set_invariant(true);
  rb->set_rows(10);
  rb->add_sub_batches()->set_batch_size(1);
  pb::ConfigResult* c = r.add_results();
  c->set_config("cublaslt:fp32:fused@algo=1");
  pb::BatchInvariance* b = c->mutable_batch_invariance();
  b->set_rows(10);
  b->set_rows_differing(3);
  b->set_max_ulp(2);
  (*b->mutable_full_batch_details())["algo"] = "1";
  pb::SubBatch* one = b->add_sub_batches();
  one->set_batch_size(1);
  one->set_runs(10);
  one->set_rows_differing(3);
  one->set_max_ulp(2);
  (*one->mutable_details())["algo"] = "4";
  pb::SubBatch* four = b->add_sub_batches();
  four->set_batch_size(4);
  four->set_runs(3);
  four->set_tail_rows(2);
  (*four->mutable_details())["algo"] = "1";
  (*four->mutable_tail_details())["algo"] = "2";
  return r;
}

TEST(VerifyResponseToJsonTest, BatchInvarianceCarriesSubBatchesAndTheirKernels) {
  const nlohmann::ordered_json j = VerifyResponseToJson(BatchInvarianceResponse());
  const nlohmann::ordered_json& b = j["results"][0]["batch_invariance"];
  std::vector<std::string> keys;
  for (const auto& item : b.items()) keys.push_back(item.key());
  EXPECT_THAT(keys, ElementsAre("invariant", "rows", "rows_differing", "max_ulp",
                                "full_batch_details", "sub_batches"));
  EXPECT_EQ(b["invariant"], false);
  EXPECT_EQ(b["rows_differing"], 3);
  EXPECT_EQ(b["max_ulp"], 2);
  EXPECT_EQ(b["full_batch_details"]["algo"], "1");
  const nlohmann::ordered_json& four = b["sub_batches"][1];
  keys.clear();
  for (const auto& item : four.items()) keys.push_back(item.key());
  EXPECT_THAT(keys, ElementsAre("batch_size", "runs", "rows_differing", "max_ulp", "details",
                                "tail_rows", "tail_details"));
  EXPECT_EQ(four["runs"], 3);
  EXPECT_EQ(four["tail_rows"], 2);
  EXPECT_EQ(four["tail_details"]["algo"], "2");
  EXPECT_EQ(j["reference"]["batch_invariance"]["invariant"], true);
}

TEST(FormatHumanTest, BatchInvarianceNamesDifferingRowsAndEachSubBatchKernel) {
  const std::string out = FormatHuman(BatchInvarianceResponse(), Verbose("verify"));
  EXPECT_THAT(out, HasSubstr("  cpu:fp64:none (reference): batch invariance: invariant\n"));
  EXPECT_THAT(out, HasSubstr("  cublaslt:fp32:fused@algo=1: batch invariance: 3 of 10 rows "
                             "differ (max 2 ULP)\n"
                             "    whole batch (10 rows): algo=1\n"
                             "    batches of 1: 10 runs, 3 of 10 rows differ (max 2 ULP); "
                             "algo=4\n"
                             "    batches of 4: 3 runs (last of 2), invariant; algo=1; last run "
                             "algo=2\n"));
}

TEST(FormatHumanTest, ExactColumnOnlyWhenACandidateIsExact) {
  pb::VerifyResponse r = DiagnoseResponse();
  EXPECT_THAT(FormatHuman(r, Verbose("diagnose")), Not(HasSubstr("exact")));
  r.mutable_diagnosis()->mutable_ranking(0)->set_exact(true);
  const std::string out = FormatHuman(r, Verbose("diagnose"));
  EXPECT_THAT(out, HasSubstr("bound_ratio  exact"));
  for (const std::string& line : Lines(out)) {
    EXPECT_LE(line.size(), 100u) << line;
  }
}

TEST(FormatHumanTest, RankingShowsPlausibilitySharesAndRuledOutReasons) {
  const std::string out = FormatHuman(DiagnoseResponse(), Verbose("diagnose"));
  // 3 of 94,674 elements differ: never "100.0%".
  // The equivalent the ranking lacks joins row 1; "cpu:tf32:unfused =
  // cpu:tf32rna:unfused" is 38 characters, past the config column's 34, so
  // it wraps before the "=" and the column is 21 wide.
  EXPECT_THAT(out, HasSubstr("  rank  config                 plausible  bitwise-equal  max_ulp"));
  EXPECT_THAT(out, HasSubstr("  1     cpu:tf32:unfused       yes              99.997%        1"));
  EXPECT_THAT(out, HasSubstr("\n        = cpu:tf32rna:unfused\n"));
  EXPECT_THAT(out, HasSubstr("  2     cpu:tf32:fused*        yes                50.0%        2"));
  EXPECT_THAT(out, HasSubstr("  3     cpu:fp32:fused         no                0.003%      900"));
  EXPECT_THAT(out, Not(HasSubstr("Same bits")));
  EXPECT_THAT(out, HasSubstr("  * cpu:tf32:fused reused the GEMM of cpu:tf32:unfused.\n"));
  EXPECT_THAT(out, HasSubstr("  Ruled out:\n    3. cpu:fp32:fused: 94671 of 94674 elements"));
  EXPECT_THAT(out, Not(HasSubstr("100.0%")));
  for (const std::string& line : Lines(out)) {
    EXPECT_LE(line.size(), 100u) << line;
  }
}

TEST(FormatHumanTest, RuledOutReasonsAreListedForTheFirstFiveOnly) {
  pb::VerifyResponse r = DiagnoseResponse();
  pb::Diagnosis* d = r.mutable_diagnosis();
  for (int i = 0; i < 3; ++i) d->add_ranking()->set_config("cpu:fp16:fused");
  pb::RankedCandidate* sixth = d->mutable_ranking(5);
  sixth->set_config("cpu:bf16:fused");
  sixth->set_ruled_out("Sixth and not listed.");
  const std::string out = FormatHuman(r, Verbose("diagnose"));
  EXPECT_THAT(out, HasSubstr("3. cpu:fp32:fused:"));
  EXPECT_THAT(out, Not(HasSubstr("Sixth and not listed.")));
}

TEST(FormatHumanTest, CandidatesWithoutAPlausibilityTestShowADash) {
  // A server older than the plausibility test leaves every field unset.
  pb::VerifyResponse r;
  pb::RankedCandidate* c = r.mutable_diagnosis()->add_ranking();
  c->set_config("cpu:fp32:fused");
  c->set_bitwise_equal_fraction(1.0);
  const std::string out = FormatHuman(r, Verbose("diagnose"));
  EXPECT_THAT(out, HasSubstr("  1     cpu:fp32:fused  -                   100%"));
  EXPECT_THAT(out, Not(HasSubstr("Ruled out")));
  EXPECT_THAT(out, Not(HasSubstr("reused the GEMM")));
}

TEST(FormatHumanTest, LongRuledOutReasonsWrapWithinOneHundredColumns) {
  pb::VerifyResponse r = DiagnoseResponse();
  std::string reason;
  for (int i = 0; i < 40; ++i) reason += "word ";
  r.mutable_diagnosis()->mutable_ranking(2)->set_ruled_out(reason);
  const std::string out = FormatHuman(r, Verbose("diagnose"));
  EXPECT_THAT(out, HasSubstr("    3. cpu:fp32:fused: word word"));
  EXPECT_THAT(out, HasSubstr("\n      word word"));
  for (const std::string& line : Lines(out)) EXPECT_LE(line.size(), 100u) << line;
}

TEST(FormatHumanTest, SharedComputationMarksTheEpilogueOnlyElapsedTime) {
  const std::string out = FormatHuman(DiagnoseResponse(), Verbose("diagnose"));
  EXPECT_THAT(out, HasSubstr("  config            pass  mismatched  max_abs  max_ulp  "
                             "bitwise-equal  elapsed\n"));
  EXPECT_THAT(out, HasSubstr("  cpu:tf32:unfused   yes   0 / 94674        0        0        "
                             "99.997%  2.5 ms \n"));
  EXPECT_THAT(out, HasSubstr("  cpu:tf32:fused     yes   0 / 94674        0        0           "
                             "100%  0.2 ms*\n"));
  EXPECT_THAT(out, HasSubstr("  * cpu:tf32:fused reused the GEMM of cpu:tf32:unfused "
                             "(elapsed: epilogue only).\n"));
}

TEST(FormatHumanTest, WithoutSharedComputationElapsedHasNoMarker) {
  pb::VerifyResponse r = DiagnoseResponse();
  r.mutable_results(1)->clear_shared_computation();
  r.mutable_diagnosis()->mutable_ranking(1)->clear_shared_computation();
  const std::string out = FormatHuman(r, Verbose("verify"));
  EXPECT_THAT(out, HasSubstr("2.5 ms\n"));
  EXPECT_THAT(out, Not(HasSubstr("*")));
}

TEST(ClosenessMessageTest, NearlyAllMismatchedIsNotShownAsAll) {
  pb::Stats s;
  s.set_total(94674);
  s.set_mismatched(94671);
  EXPECT_THAT(ClosenessMessage(s, pb::Tolerance()),
              HasSubstr("Mismatched elements: 94671 / 94674 (99.997%)"));
  s.set_mismatched(94674);
  EXPECT_THAT(ClosenessMessage(s, pb::Tolerance()),
              HasSubstr("Mismatched elements: 94674 / 94674 (100%)"));
}

TEST(ClosenessMessageTest, UlpFigureLeavesOutElementsNearZeroUnlessTheToleranceCountedThem) {
  pb::Stats s;
  s.set_max_ulp(1901874441);
  s.set_compared_dtype(pb::DTYPE_FLOAT32);
  s.mutable_negligible()->set_significant_max_ulp(1);
  s.mutable_negligible()->set_note("leaving out 3 elements near zero (the server's words)");
  EXPECT_THAT(ClosenessMessage(s, pb::Tolerance()),
              EndsWith("\nGreatest ULP distance: 1 in float32, leaving out 3 elements near zero "
                       "(the server's words)"));
  // A ULP tolerance judged every element: the figure it judged.
  pb::Tolerance ulp;
  ulp.set_preset(pb::Tolerance::PRESET_ULP);
  ulp.set_max_ulp(4);
  const std::string out = ClosenessMessage(s, ulp);
  EXPECT_THAT(out, EndsWith("\nGreatest ULP distance: 1901874441 (up to 4 allowed) in float32"));
  EXPECT_THAT(out, Not(HasSubstr("near zero")));
  // Nothing left out: max_ulp as it is.
  s.clear_negligible();
  EXPECT_THAT(ClosenessMessage(s, pb::Tolerance()),
              EndsWith("\nGreatest ULP distance: 1901874441 in float32"));
}

TEST(StatsJsonTest, NegligibleIsAnObjectOrNull) {
  pb::VerifyResponse r;
  pb::Stats* s = r.mutable_observed_vs_reference();
  pb::NegligibleElements* n = s->mutable_negligible();
  n->set_below(0.5);
  n->set_differing(3);
  n->set_max_abs(0.125);
  n->set_significant_max_ulp(UINT64_MAX);
  n->set_note("words");
  nlohmann::ordered_json j = VerifyResponseToJson(r);
  EXPECT_EQ(j["observed_vs_reference"]["negligible"],
            nlohmann::ordered_json::parse(R"({"below": 0.5, "differing": 3, "max_abs": 0.125,
                                              "significant_max_ulp": "inf", "note": "words"})"));
  s->clear_negligible();
  EXPECT_TRUE(VerifyResponseToJson(r)["observed_vs_reference"]["negligible"].is_null());
}

TEST(FormatGithubSummaryTest, RankingHasPlausibilitySharedGemmAndRuledOut) {
  const std::string md = FormatGithubSummary(DiagnoseResponse(), ReportContext{"diagnose"});
  EXPECT_THAT(md, HasSubstr("| rank | config | plausible | bitwise-equal |"));
  EXPECT_THAT(md,
              HasSubstr("| 1 | `cpu:tf32:unfused` = `cpu:tf32rna:unfused` | yes | 99.997% | 1 |"));
  EXPECT_THAT(md, HasSubstr("| 2 | `cpu:tf32:fused` (GEMM of `cpu:tf32:unfused`) | yes | 50.0% |"));
  EXPECT_THAT(md, HasSubstr("- `cpu:fp32:fused`: 94671 of 94674 elements"));
}

TEST(FormatGithubSummaryTest, VerifyTableNamesTheSharedGemm) {
  pb::VerifyResponse r = DiagnoseResponse();
  r.clear_diagnosis();  // verify without --accept
  const std::string md = FormatGithubSummary(r, ReportContext{"verify"});
  EXPECT_THAT(md, HasSubstr("| 0.2 ms (epilogue; GEMM of `cpu:tf32:unfused`) |"));
  EXPECT_THAT(md, HasSubstr("| 99.997% | 2.5 ms |"));
}

// Five candidates over 24,576 elements: cpu:fp32:fused, cpu:tf32:fused and
// cpu:fp32:unfused computed the same bits (24,575 equal to the observed
// output; cpu:fp32:unfused reused the GEMM of cpu:fp32:fused), and two
// others are ruled out.
pb::VerifyResponse ThreeEquivalentOfFive() {
  pb::VerifyResponse r;
  pb::Diagnosis* d = r.mutable_diagnosis();
  d->set_best("cpu:fp32:fused");
  d->set_confidence(0.9);
  const std::vector<std::string> same = {"cpu:fp32:fused", "cpu:tf32:fused", "cpu:fp32:unfused"};
  for (const std::string& name : same) {
    pb::RankedCandidate* c = d->add_ranking();
    c->set_config(name);
    c->set_bitwise_equal_fraction(24575.0 / 24576.0);
    c->set_max_ulp(1);
    c->set_mean_ulp(4.1e-5);
    c->set_plausible(true);
    c->set_compared_elements(24576);
    for (const std::string& e : same) {
      if (e != name) c->add_equivalent(e);
    }
    if (name == "cpu:fp32:unfused") c->set_shared_computation("cpu:fp32:fused");
  }
  pb::RankedCandidate* bf16 = d->add_ranking();
  bf16->set_config("cpu:bf16:fused");
  bf16->set_bitwise_equal_fraction(0.25);
  bf16->set_max_ulp(40);
  bf16->set_compared_elements(24576);
  bf16->set_ruled_out("bf16 rounding everywhere.");
  pb::RankedCandidate* fp16 = d->add_ranking();
  fp16->set_config("cpu:fp16:fused");
  fp16->set_bitwise_equal_fraction(0.125);
  fp16->set_max_ulp(80);
  fp16->set_compared_elements(24576);
  fp16->set_ruled_out("fp16 rounding everywhere.");
  return r;
}

// The ranking rows of a text report: its lines that start with a rank.
int RankRows(const std::string& text) {
  int rows = 0;
  for (const std::string& line : Lines(text)) {
    if (line.size() > 2 && line.compare(0, 2, "  ") == 0 && std::isdigit(line[2])) ++rows;
  }
  return rows;
}

TEST(FormatHumanTest, CandidatesWithTheSameBitsShareOneRankingRow) {
  const std::string out = FormatHuman(ThreeEquivalentOfFive(), Verbose("diagnose"));
  // "cpu:fp32:fused = cpu:tf32:fused" is 31 characters; the third name
  // would take the cell past 34, so it wraps before its "=".
  EXPECT_THAT(out, HasSubstr("  1     cpu:fp32:fused = cpu:tf32:fused  yes              99.996%  "
                             "      1"));
  EXPECT_THAT(out, HasSubstr("\n        = cpu:fp32:unfused*\n  2     cpu:bf16:fused  "));
  EXPECT_THAT(out, HasSubstr("\n  3     cpu:fp16:fused  "));
  EXPECT_EQ(RankRows(out), 3);
  EXPECT_THAT(out, HasSubstr("  * cpu:fp32:unfused reused the GEMM of cpu:fp32:fused.\n"));
  EXPECT_THAT(out, HasSubstr("  Ruled out:\n    2. cpu:bf16:fused: bf16 rounding everywhere.\n"
                             "    3. cpu:fp16:fused: fp16 rounding everywhere.\n"));
  EXPECT_THAT(out, Not(HasSubstr("Same bits")));
  // 24,575 of 24,576 elements equal: never all.
  EXPECT_THAT(out, Not(HasSubstr("100.0%")));
  EXPECT_THAT(out, Not(HasSubstr("100%")));
  for (const std::string& line : Lines(out)) EXPECT_LE(line.size(), 100u) << line;
}

TEST(FormatHumanTest, RuledOutEntriesNameEveryCandidateOfTheirRow) {
  pb::VerifyResponse r = ThreeEquivalentOfFive();
  for (int i = 0; i < 3; ++i) r.mutable_diagnosis()->mutable_ranking(i)->set_ruled_out("Too far.");
  const std::string out = FormatHuman(r, Verbose("diagnose"));
  EXPECT_THAT(out, HasSubstr("  Ruled out:\n    1. cpu:fp32:fused = cpu:tf32:fused = "
                             "cpu:fp32:unfused: Too far.\n    2. cpu:bf16:fused:"));
}

TEST(FormatGithubSummaryTest, CandidatesWithTheSameBitsShareOneRankingRow) {
  const std::string md = FormatGithubSummary(ThreeEquivalentOfFive(), ReportContext{"diagnose"});
  EXPECT_THAT(md, HasSubstr("\n| 1 | `cpu:fp32:fused` = `cpu:tf32:fused` = `cpu:fp32:unfused` "
                            "(GEMM of `cpu:fp32:fused`) | yes | 99.996% | 1 |"));
  EXPECT_THAT(md, HasSubstr("\n| 2 | `cpu:bf16:fused` | no | 25.0% | 40 |"));
  EXPECT_THAT(md, HasSubstr("\n| 3 | `cpu:fp16:fused` | no | 12.5% | 80 |"));
  int rows = 0;
  for (const std::string& line : Lines(md)) {
    if (line.size() > 2 && line.compare(0, 2, "| ") == 0 && std::isdigit(line[2])) ++rows;
  }
  EXPECT_EQ(rows, 3);
  EXPECT_THAT(md, HasSubstr("- `cpu:bf16:fused`: bf16 rounding everywhere.\n"
                            "- `cpu:fp16:fused`: fp16 rounding everywhere.\n"));
  EXPECT_THAT(md, Not(HasSubstr("100.0%")));
  EXPECT_THAT(md, Not(HasSubstr("100%")));
}

// ---- The verdict (docs/numerics.md, "Verdict"): the server decides and
// words it; every report shows it as sent.

constexpr char kDefectReason[] =
    "Column 2 holds 64 of the 72 disagreements with cpu:fp32:fused where rounding predicts 0.8 "
    "(p < 1e-30): not rounding.";
constexpr char kWhereToLook[] =
    "output column 2 <-> weight row 2 (out_in layout) and bias element 2";

// cpu:fp32:fused explains a [32, 4] output but for column 2 (a wrong weight
// row): seven elements beyond the threshold, one of them NaN against a
// number.
pb::VerifyResponse DefectResponse() {
  pb::VerifyResponse r;
  r.mutable_reference()->set_config("cpu:fp64:none");
  pb::Diagnosis* d = r.mutable_diagnosis();
  d->set_best("cpu:fp32:fused");
  d->set_confidence(0.9);
  d->set_verdict(pb::Diagnosis::VERDICT_DEFECT);
  d->set_verdict_reason(kDefectReason);
  pb::RankedCandidate* c = d->add_ranking();
  c->set_config("cpu:fp32:fused");
  c->set_max_ulp(4096);
  c->set_plausible(true);
  c->set_compared_elements(128);
  pb::Defect* f = d->mutable_defect();
  f->set_element_threshold_sigma(6.1875);
  f->set_false_alarm_rate(1e-3);
  f->set_element_count(7);
  f->set_max_ulp(internal::kUlpInfinite);
  f->set_max_sigma(std::numeric_limits<double>::infinity());
  f->set_where_to_look(kWhereToLook);
  pb::DefectGroup* col = f->add_columns();
  col->set_index(2);
  col->set_disagreements(64);
  col->set_expected_disagreements(0.8);
  col->set_p_value(1e-30);
  col->set_beyond_threshold(7);
  col->set_max_ulp(internal::kUlpInfinite);
  col->set_max_sigma(std::numeric_limits<double>::infinity());
  col->set_shift_t(7.5);
  col->set_shift_p_value(0.25);
  pb::DefectGroup* row = f->add_rows();
  row->set_index(5);
  row->set_disagreements(3);
  row->set_expected_disagreements(0.025);
  row->set_p_value(2.5e-6);
  row->set_beyond_threshold(1);
  row->set_max_ulp(4096);
  row->set_max_sigma(812.25);
  pb::DefectElement* nan = f->add_elements();
  nan->set_sigma(std::numeric_limits<double>::infinity());
  nan->mutable_element()->add_index(9);
  nan->mutable_element()->add_index(2);
  nan->mutable_element()->set_actual(std::numeric_limits<double>::quiet_NaN());
  nan->mutable_element()->set_expected(0.5);
  nan->mutable_element()->set_ulp(internal::kUlpInfinite);
  pb::DefectElement* e = f->add_elements();
  e->set_sigma(812.25);
  e->mutable_element()->add_index(0);
  e->mutable_element()->add_index(2);
  e->mutable_element()->set_actual(1.5);
  e->mutable_element()->set_expected(0.5);
  e->mutable_element()->set_ulp(4096);
  return r;
}

std::vector<std::string> Keys(const nlohmann::ordered_json& j) {
  std::vector<std::string> keys;
  for (const auto& item : j.items()) keys.push_back(item.key());
  return keys;
}

TEST(VerifyResponseToJsonTest, DiagnosisCarriesTheVerdictItsReasonAndTheDefect) {
  const nlohmann::ordered_json j = VerifyResponseToJson(DefectResponse());
  const nlohmann::ordered_json& d = j["diagnosis"];
  // Added after the older keys, which keep their order.
  EXPECT_THAT(Keys(d),
              ElementsAre("best", "equivalent", "tied", "confidence", "ranking", "framework_hint",
                          "localization", "explanation", "verdict", "verdict_reason", "defect",
                          "headline", "advice", "accepted", "accepted_as", "candidate_tiers"));
  EXPECT_EQ(d["verdict"], "defect");
  EXPECT_EQ(d["verdict_reason"], kDefectReason);
  const nlohmann::ordered_json& f = d["defect"];
  EXPECT_THAT(Keys(f),
              ElementsAre("element_threshold_sigma", "false_alarm_rate", "element_count",
                          "elements", "columns", "rows", "max_ulp", "max_sigma", "where_to_look"));
  EXPECT_EQ(f["element_threshold_sigma"], 6.1875);
  EXPECT_EQ(f["false_alarm_rate"], 1e-3);
  EXPECT_EQ(f["element_count"], 7);
  EXPECT_EQ(f["max_ulp"], "inf");
  EXPECT_EQ(f["max_sigma"], "inf");
  EXPECT_EQ(f["where_to_look"], kWhereToLook);
  EXPECT_EQ(f["columns"], nlohmann::ordered_json::parse(
                              R"([{"index": 2, "disagreements": 64, "expected_disagreements": 0.8,
                     "p_value": 1e-30, "beyond_threshold": 7, "max_ulp": "inf",
                     "max_sigma": "inf", "shift_t": 7.5, "shift_p_value": 0.25}])"));
  EXPECT_EQ(f["rows"][0]["max_ulp"], 4096);
  EXPECT_EQ(f["rows"][0]["max_sigma"], 812.25);
  EXPECT_THAT(Keys(f["elements"][0]), ElementsAre("element", "sigma"));
  EXPECT_EQ(f["elements"][0]["sigma"], "inf");
  EXPECT_EQ(f["elements"][0]["element"]["index"], nlohmann::ordered_json::parse("[9, 2]"));
  EXPECT_EQ(f["elements"][0]["element"]["actual"], "nan");
  EXPECT_EQ(f["elements"][0]["element"]["ulp"], "inf");
  EXPECT_EQ(f["elements"][1]["sigma"], 812.25);
  EXPECT_EQ(f["elements"][1]["element"]["actual"], 1.5);
}

TEST(VerifyResponseToJsonTest, EachVerdictIsItsWordAndAnOlderServersIsEmpty) {
  const std::vector<std::pair<pb::Diagnosis::Verdict, std::string>> cases = {
      {pb::Diagnosis::VERDICT_ROUNDING, "rounding"},
      {pb::Diagnosis::VERDICT_DEFECT, "defect"},
      {pb::Diagnosis::VERDICT_UNEXPLAINED, "unexplained"},
      {pb::Diagnosis::VERDICT_UNSPECIFIED, ""},
  };
  for (const auto& [verdict, word] : cases) {
    pb::VerifyResponse r = DiagnoseResponse();
    r.mutable_diagnosis()->set_verdict(verdict);
    r.mutable_diagnosis()->set_verdict_reason("Because.");
    const nlohmann::ordered_json j = VerifyResponseToJson(r);
    EXPECT_EQ(j["diagnosis"]["verdict"], word) << word;
    EXPECT_EQ(j["diagnosis"]["verdict_reason"], "Because.") << word;
    EXPECT_TRUE(j["diagnosis"]["defect"].is_null()) << word;  // not sent
  }
}

TEST(FormatHumanTest, VerdictComesFirstThenWhereToLookAndWhatIsNotRounding) {
  const std::vector<std::string> lines = Lines(FormatHuman(DefectResponse(), Verbose("diagnose")));
  ASSERT_GE(lines.size(), 13u);
  // The server's sentence, wrapped at 100 columns.
  const std::vector<std::string> head(lines.begin(), lines.begin() + 13);
  EXPECT_THAT(
      head,
      ElementsAre(
          "Column 2 holds 64 of the 72 disagreements with cpu:fp32:fused where rounding predicts "
          "0.8 "
          "(p <",
          "  1e-30): not rounding.",
          "Where to look: output column 2 <-> weight row 2 (out_in layout) and bias element 2", "",
          "Columns and rows not explained by rounding:",
          "  not rounding  disagreements  expected        p  beyond threshold  max_ulp  max_sigma",
          "  column 2                 64       0.8    1e-30                 7      inf        inf",
          "  row 5                     3     0.025  2.5e-06                 1     4096     812.25",
          "Elements beyond 6.1875 sigma: 7 (farthest: inf ulp, inf sigma)",
          "  at (9, 2): observed nan, best 0.5 (inf ulp, inf sigma)",
          "  at (0, 2): observed 1.5, best 0.5 (4096 ulp, 812.25 sigma)",
          "  ... 5 more",  // 7 beyond the threshold, 2 listed
          ""));
  EXPECT_EQ(lines[13], "Best match: cpu:fp32:fused (confidence 0.90)");
  for (const std::string& line : lines) EXPECT_LE(line.size(), 100u) << line;
}

TEST(FormatHumanTest, EachVerdictIsTheFirstLineWithTheServersReason) {
  for (const pb::Diagnosis::Verdict verdict :
       {pb::Diagnosis::VERDICT_ROUNDING, pb::Diagnosis::VERDICT_UNEXPLAINED}) {
    pb::VerifyResponse r = DiagnoseResponse();
    r.mutable_diagnosis()->set_verdict(verdict);
    r.mutable_diagnosis()->set_verdict_reason("Every element within 4 sigma of cpu:tf32:unfused.");
    r.mutable_diagnosis()->mutable_defect();  // empty: no lines
    const std::vector<std::string> lines = Lines(FormatHuman(r, Verbose("diagnose")));
    const std::string word =
        verdict == pb::Diagnosis::VERDICT_ROUNDING ? "rounding" : "unexplained";
    ASSERT_GE(lines.size(), 3u);
    // A server without headlines: its reason leads.
    EXPECT_EQ(lines[0], "Every element within 4 sigma of cpu:tf32:unfused.") << word;
    EXPECT_EQ(lines[1], "");
    EXPECT_EQ(lines[2], "Best match: cpu:tf32:unfused (confidence 0.97)");
  }
}

TEST(FormatHumanTest, WithoutAVerdictTheDiagnosisOpensWithTheBestMatch) {
  const std::string out = FormatHuman(DiagnoseResponse(), ReportContext{"diagnose"});
  EXPECT_EQ(Lines(out)[0], "Best match: cpu:tf32:unfused (confidence 0.97)");
  EXPECT_THAT(out, Not(HasSubstr("Verdict")));
}

TEST(OutcomesTest, DiagnosisDetailsOpenWithTheVerdictAndWhereToLook) {
  const std::vector<Outcome> outcomes = Outcomes(DefectResponse(), ReportContext{"diagnose"});
  ASSERT_FALSE(outcomes.empty());
  EXPECT_EQ(outcomes[0].name, "diagnosis");
  EXPECT_FALSE(outcomes[0].failed);
  EXPECT_TRUE(outcomes[0].warning);
  // A server without headlines: its verdict's reason leads.
  EXPECT_EQ(outcomes[0].summary, kDefectReason);
  EXPECT_EQ(outcomes[0].details, absl::StrCat(kDefectReason, "\nWhere to look: ", kWhereToLook,
                                              "\nBest match: cpu:fp32:fused (confidence 0.9)"));
}

TEST(FormatGithubAnnotationsTest, DefectWithABestMatchIsAWarningCarryingTheReason) {
  const pb::VerifyResponse r = DefectResponse();
  const std::string out = FormatGithubAnnotations(r, ReportContext{"diagnose"});
  EXPECT_THAT(out, HasSubstr(absl::StrCat(
                       "::warning title=tensorcheck diagnose%3A diagnosis::", kDefectReason,
                       "%0AWhere to look: ", kWhereToLook, "%0ABest match: ")));
  EXPECT_THAT(out, Not(HasSubstr("::error")));
  // The overall notice opens with the server's sentence too, then the
  // status word.
  EXPECT_THAT(out, HasSubstr(absl::StrCat("::notice title=tensorcheck diagnose::", kDefectReason,
                                          "%0APASS: best match cpu:fp32:fused")));
  // The exit code keeps its meaning: a configuration explains the output.
  EXPECT_EQ(ExitCodeFor(r, ReportContext{"diagnose"}), 0);
}

TEST(FormatGithubAnnotationsTest, UnexplainedIsAnErrorWithoutABestMatchAndAWarningWithOne) {
  pb::VerifyResponse r = DiagnoseResponse();
  pb::Diagnosis* d = r.mutable_diagnosis();
  d->set_verdict(pb::Diagnosis::VERDICT_UNEXPLAINED);
  d->set_verdict_reason("No candidate is within 1.5x of its error model.");
  std::string out = FormatGithubAnnotations(r, ReportContext{"diagnose"});
  EXPECT_THAT(out, HasSubstr("::warning title=tensorcheck diagnose%3A diagnosis::No candidate is "
                             "within 1.5x of its error model.%0ABest match: cpu:tf32:unfused"));
  d->clear_best();
  out = FormatGithubAnnotations(r, ReportContext{"diagnose"});
  EXPECT_THAT(out,
              HasSubstr("::error title=tensorcheck diagnose%3A diagnosis::No candidate is "
                        "within 1.5x of its error model.%0ANo candidate configuration explains "
                        "the observed output."));
  EXPECT_THAT(out, Not(HasSubstr("::warning")));
  EXPECT_EQ(ExitCodeFor(r, ReportContext{"diagnose"}), 1);
}

TEST(FormatGithubAnnotationsTest, RoundingAndAnOlderServersDiagnosisAnnotateNothing) {
  pb::VerifyResponse r = DiagnoseResponse();
  EXPECT_THAT(FormatGithubAnnotations(r, ReportContext{"diagnose"}),
              Not(AnyOf(HasSubstr("::warning"), HasSubstr("::error"))));
  r.mutable_diagnosis()->set_verdict(pb::Diagnosis::VERDICT_ROUNDING);
  r.mutable_diagnosis()->set_verdict_reason("Rounding of cpu:tf32:unfused.");
  const std::string out = FormatGithubAnnotations(r, ReportContext{"diagnose"});
  EXPECT_THAT(out, Not(AnyOf(HasSubstr("::warning"), HasSubstr("::error"))));
  EXPECT_THAT(out, HasSubstr("::notice title=tensorcheck diagnose::Rounding of "
                             "cpu:tf32:unfused.%0APASS: best match "));
}

TEST(FormatGithubSummaryTest, VerdictWhereToLookAndDefectTableComeFirst) {
  const std::string md = FormatGithubSummary(DefectResponse(), ReportContext{"diagnose"});
  // A server without headlines: its verdict's reason leads, once.
  EXPECT_THAT(md, HasSubstr(absl::StrCat("## tensorcheck diagnose: **PASS**\n\n"
                                         "**Column 2 holds 64 of the 72 disagreements with "
                                         "cpu:fp32:fused where rounding predicts 0.8 (p &lt; "
                                         "1e-30): not rounding.**\n\n"
                                         "Best match: `cpu:fp32:fused` (confidence 0.90)\n\n"
                                         "Verdict: **defect**\n\n"
                                         "Where to look: output column 2 &lt;-&gt; weight row 2 "
                                         "(out_in layout) and bias element 2\n\n")));
  EXPECT_THAT(md, HasSubstr("| column 2 | 64 | 0.8 | 1e-30 | 7 | inf | inf |\n"
                            "| row 5 | 3 | 0.025 | 2.5e-06 | 1 | 4096 | 812.25 |\n"));
}

// ---- The answer first, short by default (the server's headline, advice and
// acceptance; a Flax nn.Dense output in TF32, as README's first case).

constexpr char kFlaxHeadline[] =
    "Rounding, not a bug: the output is cpu:tf32:unfused (JAX/Flax's default on Ampere+ GPUs, "
    "TF32), every element within 5.1 predicted standard errors of it; strict fp32 (PyTorch's "
    "default) would differ from the reference by at most 1.1e-06.";
constexpr char kFlaxAdvice[] =
    "To get PyTorch's default (strict fp32) in Flax, set "
    "jax.config.update(\"jax_default_matmul_precision\", \"highest\") or pass "
    "precision=jax.lax.Precision.HIGHEST to nn.Dense.";
constexpr char kFlaxHint[] =
    "JAX/Flax default on Ampere+: fp32 matmul in TF32, bias added separately; equally: fp32 "
    "matmul in TF32 with a fused bias: PyTorch with allow_tf32=True, or TensorFlow fp32 on "
    "Ampere+";
constexpr char kOutside4Sigma[] =
    "of the compared elements lie within 4 predicted standard errors of it (90% needed): not a "
    "summation-order difference";

// README's Flax case, 2x768 -> 512 in fp32, as the CPU server diagnoses it:
// 16 candidates in 9 rows of the same bits (the statistics a server run
// computed), every configuration's result and the tolerance's comparison.
pb::VerifyResponse FlaxCase() {
  pb::VerifyResponse r;
  r.set_verdict(pb::VERDICT_FAIL);
  r.mutable_reference()->set_config("cpu:fp64:fused");
  pb::Stats* o = r.mutable_observed_vs_reference();
  o->set_total(1024);
  o->set_mismatched(989);
  o->set_max_abs(0.00103068);
  o->set_compared_dtype(pb::DTYPE_FLOAT32);
  r.add_notes(
      "PyTorch may add the bias at output precision (not in the fp32 epilogue) in "
      "split-K kernels with 16-bit inputs.");
  pb::Diagnosis* d = r.mutable_diagnosis();
  d->set_best("cpu:tf32:unfused");
  d->set_confidence(1.0);
  d->add_equivalent("cpu:tf32:fused");
  d->add_tied("cpu:fp16:fused");
  d->add_tied("cpu:fp16:unfused");
  d->set_framework_hint(kFlaxHint);
  d->set_explanation(
      "The observed output matches cpu:tf32:unfused: 100% of elements bitwise "
      "equal (1024 of 1024).");
  d->set_verdict(pb::Diagnosis::VERDICT_ROUNDING);
  d->set_verdict_reason(
      "Rounding: every element is within 5.1 predicted standard errors of "
      "cpu:tf32:unfused beyond one output rounding.");
  d->set_headline(kFlaxHeadline);
  d->set_advice(kFlaxAdvice);
  struct Row {
    const char* config;
    const char* equivalent;  // "" for none
    double bitwise, bound_ratio;
    bool plausible;
    const char* shared;
    std::string ruled_out;
  };
  const std::string closer =
      "the observed output is closer to cpu:tf32:unfused where the two differ (paired sign test "
      "z = 32.0)";
  const std::vector<Row> rows = {
      {"cpu:tf32:unfused", "cpu:tf32:fused", 1.0, 0.0, true, "cpu:tf32:fused", ""},
      {"cpu:tf32:fused", "cpu:tf32:unfused", 1.0, 0.0, true, "", ""},
      {"cpu:fp16:fused", "cpu:fp16:unfused", 0.9013671875, 0.0306764, true, "", ""},
      {"cpu:fp16:unfused", "cpu:fp16:fused", 0.9013671875, 0.0306764, true, "cpu:fp16:fused", ""},
      {"cpu:fp16acc:fused", "cpu:fp16acc:unfused", 0, 0.3843, true, "", closer},
      {"cpu:fp16acc:unfused", "cpu:fp16acc:fused", 0, 0.3843, true, "cpu:fp16acc:fused", closer},
      {"cpu:tf32rna:unfused", "cpu:tf32rna:fused", 0.4697265625, 7.90031, false,
       "cpu:tf32rna:fused", absl::StrCat("only 68.4% ", kOutside4Sigma)},
      {"cpu:tf32rna:fused", "cpu:tf32rna:unfused", 0.4697265625, 7.90031, false, "",
       absl::StrCat("only 68.4% ", kOutside4Sigma)},
      {"cpu:fp64:fused", "", 0, 6003.47, false, "cpu:fp64:fused",
       absl::StrCat("only 0% ", kOutside4Sigma)},
      {"cpu:fp32:fused", "cpu:fp32:unfused", 0, 235.475, false, "",
       absl::StrCat("only 1.4% ", kOutside4Sigma)},
      {"cpu:fp32:unfused", "cpu:fp32:fused", 0, 235.475, false, "cpu:fp32:fused",
       absl::StrCat("only 1.4% ", kOutside4Sigma)},
      {"cpu:fp64:unfused", "", 0, 4249.5, false, "cpu:fp64:fused",
       absl::StrCat("only 0% ", kOutside4Sigma)},
      {"cpu:tf32trunc:unfused", "cpu:tf32trunc:fused", 0, 669.43, false, "cpu:tf32trunc:fused",
       absl::StrCat("only 0.7% ", kOutside4Sigma)},
      {"cpu:tf32trunc:fused", "cpu:tf32trunc:unfused", 0, 669.43, false, "",
       absl::StrCat("only 0.7% ", kOutside4Sigma)},
      {"cpu:bf16:fused", "cpu:bf16:unfused", 0, 1866.62, false, "",
       absl::StrCat("only 0.2% ", kOutside4Sigma)},
      {"cpu:bf16:unfused", "cpu:bf16:fused", 0, 1866.62, false, "cpu:bf16:fused",
       absl::StrCat("only 0.2% ", kOutside4Sigma)},
  };
  for (const Row& x : rows) {
    pb::RankedCandidate* c = d->add_ranking();
    c->set_config(x.config);
    if (x.equivalent[0] != '\0') c->add_equivalent(x.equivalent);
    c->set_bitwise_equal_fraction(x.bitwise);
    c->mutable_bound_ratio()->set_value(x.bound_ratio);
    c->set_plausible(x.plausible);
    c->set_compared_elements(1024);
    c->set_shared_computation(x.shared);
    c->set_ruled_out(x.ruled_out);
    c->set_exact(x.bitwise == 1.0);
    // The server's words for the fp32 defaults (with a bias).
    const std::string config = x.config;
    if (config == "cpu:fp32:fused") c->set_framework_default("PyTorch's default for fp32 tensors");
    if (config == "cpu:fp32:unfused") c->set_framework_default("candle's default for fp32 tensors");
    if (config == "cpu:tf32:unfused") {
      c->set_framework_default("JAX/Flax's default on Ampere+ GPUs for fp32 tensors");
    }
    pb::ConfigResult* res = r.add_results();
    res->set_config(x.config);
    res->set_shared_computation(x.shared);
    res->mutable_vs_observed()->set_total(1024);
  }
  return r;
}

TEST(FormatHumanTest, ShortDiagnosisOfTheFlaxCaseLeadsWithTheHeadlineInTwentyLines) {
  const pb::VerifyResponse r = FlaxCase();
  const std::string out = FormatHuman(r, ReportContext("diagnose"));
  const std::vector<std::string> lines = Lines(out);
  EXPECT_LE(lines.size(), 20u) << out;
  for (const std::string& line : lines) EXPECT_LE(line.size(), 100u) << line;
  // The headline first, wrapped; then the advice; then the best match with
  // its framework hint and confidence.
  EXPECT_EQ(lines[0],
            "Rounding, not a bug: the output is cpu:tf32:unfused (JAX/Flax's default on Ampere+ "
            "GPUs, TF32),");
  EXPECT_THAT(out, HasSubstr("\nAdvice: To get PyTorch's default (strict fp32) in Flax, set"));
  EXPECT_THAT(out, HasSubstr("\nBest match: cpu:tf32:unfused (confidence 1.00): JAX/Flax default "
                             "on Ampere+: fp32 matmul in TF32,\n"));
  // The top two rows, and the row of PyTorch's and candle's defaults (6 of
  // 9) with the server's reason it is ruled out; JAX's default is row 1.
  EXPECT_THAT(out,
              HasSubstr("\n  rank  config                             bitwise-equal  bound_ratio\n"
                        "  1     cpu:tf32:unfused = cpu:tf32:fused           100%            0\n"
                        "        JAX/Flax's default on Ampere+ GPUs for fp32 tensors\n"
                        "  2     cpu:fp16:fused = cpu:fp16:unfused          90.1%    0.0306764\n"
                        "  6     cpu:fp32:fused = cpu:fp32:unfused             0%      235.475\n"
                        "        PyTorch's default for fp32 tensors; candle's default for fp32 "
                        "tensors; ruled out: only 1.4%\n"
                        "          of the compared elements lie within 4 predicted standard "
                        "errors of it (90% needed): not a\n"
                        "          summation-order difference\n"));
  EXPECT_EQ(RankRows(out), 3);
  // 9 rows of the same bits, 3 shown.
  EXPECT_EQ(lines.back(), "  (6 more ranked; --verbose shows every row)");
  // What --verbose alone shows.
  for (const char* verbose_only :
       {"reused the GEMM", "Tensor-likes", "Verdict:", "Configurations compared",
        "Notes:", "Equivalent here", "cpu:fp16acc"}) {
    EXPECT_THAT(out, Not(HasSubstr(verbose_only))) << verbose_only;
  }
}

TEST(FormatHumanTest, VerboseDiagnosisOfTheFlaxCaseHasEveryTable) {
  ReportContext ctx = Verbose("diagnose");
  const std::string out = FormatHuman(FlaxCase(), ctx);
  const std::vector<std::string> lines = Lines(out);
  EXPECT_EQ(lines[0].rfind("Rounding, not a bug: the output is cpu:tf32:unfused", 0), 0u);
  // The verdict's own line follows the lead, then every table.
  EXPECT_THAT(out, HasSubstr("\nVerdict: rounding \xe2\x80\x94 Rounding: every element"));
  EXPECT_EQ(RankRows(out), 9);
  EXPECT_THAT(out, HasSubstr("  * cpu:tf32:unfused reused the GEMM of cpu:tf32:fused.\n"));
  EXPECT_THAT(out, HasSubstr("Tensor-likes are not close!"));
  EXPECT_THAT(out, HasSubstr("\nConfigurations compared with the observed output:\n"));
  EXPECT_THAT(out, HasSubstr("\nNotes:\n  - PyTorch may add the bias"));
}

TEST(FormatHumanTest, ShortRankingKeepsTheRowsTheServerAccepts) {
  pb::VerifyResponse r = FlaxCase();
  r.set_verdict(pb::VERDICT_FAIL);
  // --accept cpu:bf16: the server marks both bf16 candidates (row 9).
  for (pb::RankedCandidate& c : *r.mutable_diagnosis()->mutable_ranking()) {
    c.set_accepted(c.config().rfind("cpu:bf16:", 0) == 0);
  }
  ReportContext ctx("diagnose");
  ctx.accept = {"cpu:bf16"};
  const std::string out = FormatHuman(r, ctx);
  EXPECT_THAT(out, HasSubstr("\nVerdict: FAIL (accept cpu:bf16)\n"));
  EXPECT_THAT(out, HasSubstr("\n  9     cpu:bf16:fused = cpu:bf16:unfused             0%"
                             "      1866.62\n"
                             "        accepted; ruled out: only 0.2% of the compared elements"));
  EXPECT_EQ(RankRows(out), 4);  // 1, 2, 6 (the defaults) and 9
  EXPECT_EQ(ExitCodeFor(r, ctx), 1);
}

TEST(FormatHumanTest, VerifyWithAcceptLeadsWithTheHeadlineAndItsVerdictDecides) {
  // Not within the tolerance of the fp64 reference (989 of 1024 elements
  // mismatched), yet accepted: rounding of TF32.
  pb::VerifyResponse r = FlaxCase();
  r.set_verdict(pb::VERDICT_PASS);
  r.mutable_diagnosis()->set_accepted(true);
  r.mutable_diagnosis()->set_accepted_as("cpu:tf32:unfused");
  ReportContext ctx("verify");
  ctx.accept = {"tf32"};
  const std::string out = FormatHuman(r, ctx);
  EXPECT_EQ(Lines(out)[0].rfind("Rounding, not a bug:", 0), 0u);
  EXPECT_THAT(out, HasSubstr("\nVerdict: PASS (accept tf32): accepted as cpu:tf32:unfused\n"));
  // The server marks the accepted row; its note says so first.
  EXPECT_THAT(out,
              HasSubstr("  1     cpu:tf32:unfused = cpu:tf32:fused           100%            0\n"
                        "        accepted; JAX/Flax's default on Ampere+ GPUs for fp32 "
                        "tensors\n"));
  EXPECT_THAT(out, Not(HasSubstr("Tensor-likes")));
  EXPECT_THAT(out, Not(HasSubstr("Verdict: FAIL")));
  EXPECT_EQ(ExitCodeFor(r, ctx), 0);
  // The tolerance's comparison is informational: the one failure, if any,
  // is the diagnosis's.
  const std::vector<Outcome> outcomes = Outcomes(r, ctx);
  ASSERT_GE(outcomes.size(), 2u);
  EXPECT_EQ(outcomes[0].name, "diagnosis");
  EXPECT_FALSE(outcomes[0].failed);
  EXPECT_EQ(outcomes[0].summary, kFlaxHeadline);
  EXPECT_EQ(outcomes[1].name, "observed vs cpu:fp64:fused");
  EXPECT_TRUE(outcomes[1].informational);
  EXPECT_FALSE(outcomes[1].failed);
  // --verbose moves the tolerance's section back in, after the diagnosis.
  ctx.verbose = true;
  const std::string verbose = FormatHuman(r, ctx);
  EXPECT_EQ(Lines(verbose)[0].rfind("Rounding, not a bug:", 0), 0u);
  EXPECT_THAT(verbose, HasSubstr("Tensor-likes are not close!"));

  r.set_verdict(pb::VERDICT_FAIL);
  r.mutable_diagnosis()->set_accepted(false);
  r.mutable_diagnosis()->clear_accepted_as();
  ctx.accept = {"fp32"};
  EXPECT_EQ(ExitCodeFor(r, ctx), 1);
  EXPECT_TRUE(Outcomes(r, ctx)[0].failed);
  EXPECT_THAT(FormatHuman(r, ctx), HasSubstr("\nVerdict: FAIL (accept fp32)\n"));
}

TEST(ExitCodeForTest, DiagnoseWithAcceptFollowsTheServersVerdict) {
  pb::VerifyResponse r = FlaxCase();  // best cpu:tf32:unfused
  ReportContext ctx("diagnose");
  EXPECT_EQ(ExitCodeFor(r, ctx), 0);  // without --accept: a best match
  ctx.accept = {"fp32"};
  r.set_verdict(pb::VERDICT_FAIL);
  EXPECT_EQ(ExitCodeFor(r, ctx), 1);
  r.set_verdict(pb::VERDICT_PASS);
  EXPECT_EQ(ExitCodeFor(r, ctx), 0);
  // No verdict: the diagnosis's acceptance.
  r.clear_verdict();
  EXPECT_EQ(ExitCodeFor(r, ctx), 1);
  r.mutable_diagnosis()->set_accepted(true);
  EXPECT_EQ(ExitCodeFor(r, ctx), 0);
  r.clear_diagnosis();
  EXPECT_EQ(ExitCodeFor(r, ctx), 3);
}

TEST(VerifyResponseToJsonTest, DiagnosisCarriesHeadlineAdviceAndAcceptance) {
  pb::VerifyResponse r = FlaxCase();
  r.mutable_diagnosis()->set_accepted(true);
  r.mutable_diagnosis()->set_accepted_as("cpu:tf32:unfused");
  const nlohmann::ordered_json d = VerifyResponseToJson(r)["diagnosis"];
  EXPECT_EQ(d["headline"], kFlaxHeadline);
  EXPECT_EQ(d["advice"], kFlaxAdvice);
  EXPECT_EQ(d["accepted"], true);
  EXPECT_EQ(d["accepted_as"], "cpu:tf32:unfused");
  EXPECT_EQ(d["ranking"][9]["framework_default"], "PyTorch's default for fp32 tensors");
  EXPECT_EQ(d["ranking"][9]["accepted"], false);
  // An older server's: empty and false.
  const nlohmann::ordered_json old = VerifyResponseToJson(DefectResponse())["diagnosis"];
  EXPECT_EQ(old["headline"], "");
  EXPECT_EQ(old["advice"], "");
  EXPECT_EQ(old["accepted"], false);
  EXPECT_EQ(old["accepted_as"], "");
  EXPECT_EQ(old["candidate_tiers"], nlohmann::ordered_json::array());
}

TEST(VerifyResponseToJsonTest, CandidateTiersAreTheServersList) {
  pb::VerifyResponse r = FlaxCase();
  r.mutable_diagnosis()->add_candidate_tiers(1);
  EXPECT_EQ(VerifyResponseToJson(r)["diagnosis"]["candidate_tiers"],
            nlohmann::ordered_json::array({1}));
  r.mutable_diagnosis()->add_candidate_tiers(2);
  const nlohmann::ordered_json d = VerifyResponseToJson(r)["diagnosis"];
  EXPECT_EQ(d["candidate_tiers"], nlohmann::ordered_json::array({1, 2}));
  EXPECT_EQ(d.back(), d["candidate_tiers"]);  // the last key, after accepted_as
}

TEST(FormatGithubSummaryTest, DiagnosisLeadsWithTheStatusWordThenTheHeadline) {
  const std::string md = FormatGithubSummary(FlaxCase(), ReportContext("diagnose"));
  EXPECT_EQ(md.rfind(absl::StrCat("## tensorcheck diagnose: **PASS**\n\n**", kFlaxHeadline,
                                  "**\n\nAdvice: "),
                     0),
            0u);
  // The verdict's reason once, after the headline.
  EXPECT_THAT(md, HasSubstr("Verdict: **rounding** \xe2\x80\x94 Rounding: every element"));
}

TEST(FormatJUnitTest, DiagnosisFailureMessageIsTheHeadline) {
  pb::VerifyResponse r = FlaxCase();
  r.set_verdict(pb::VERDICT_FAIL);
  r.mutable_diagnosis()->set_headline("Not rounding: column 2 is off. Look at weight row 2.");
  ReportContext ctx("diagnose");
  ctx.accept = {"tf32"};
  const std::string xml = FormatJUnit(r, ctx);
  EXPECT_THAT(xml, HasSubstr("<failure type=\"ParityFailure\" message=\"Not rounding: column 2 is "
                             "off. Look at weight row 2.\">Not rounding: column 2 is off. Look at "
                             "weight row 2.&#10;Advice: To get"));
  EXPECT_THAT(xml, HasSubstr("Verdict: FAIL (accept tf32)"));
}

TEST(FormatGithubAnnotationsTest, VerifyNoticeUsesTheStatusWords) {
  pb::VerifyResponse r = DiagnoseResponse();
  r.clear_diagnosis();
  r.set_verdict(pb::VERDICT_PASS);
  EXPECT_THAT(FormatGithubAnnotations(r, ReportContext("verify")),
              HasSubstr("::notice title=tensorcheck verify::PASS (reference cpu:fp64:none"));
  r.set_verdict(pb::VERDICT_FAIL);
  EXPECT_THAT(FormatGithubAnnotations(r, ReportContext("verify")),
              HasSubstr("::notice title=tensorcheck verify::FAIL (reference cpu:fp64:none"));
  EXPECT_EQ(Lines(FormatHuman(r, ReportContext("verify")))[0].rfind("Verdict: FAIL", 0), 0u);
}

// ---- compare: two outputs of the Flax layer, PyTorch's (strict fp32) and
// Flax's (TF32).

pb::CompareResponse CompareCase() {
  pb::CompareResponse r;
  r.set_headline(
      "torch is cpu:fp32:fused (PyTorch's default), flax is cpu:tf32:unfused (JAX/Flax's default "
      "on Ampere+); their difference is rounding: at most 1.1e-03 expected, 1.05e-03 seen. To "
      "match torch, flax: set jax_default_matmul_precision to highest.");
  r.set_reference("cpu:fp64:fused");
  r.add_output_shape(2);
  r.add_output_shape(512);
  for (const auto& [name, best] : std::vector<std::pair<std::string, std::string>>{
           {"torch", "cpu:fp32:fused"}, {"flax", "cpu:tf32:unfused"}}) {
    pb::ComparedOutput* o = r.add_outputs();
    o->set_name(name);
    o->mutable_vs_reference()->set_total(1024);
    o->mutable_diagnosis()->set_best(best);
    o->mutable_diagnosis()->set_confidence(1.0);
    o->mutable_diagnosis()->set_verdict(pb::Diagnosis::VERDICT_ROUNDING);
    o->mutable_diagnosis()->set_headline(absl::StrCat("Rounding, not a bug: ", best, "."));
  }
  pb::OutputPair* p = r.mutable_pair();
  p->set_a("torch");
  p->set_b("flax");
  p->mutable_stats()->set_total(1024);
  p->mutable_stats()->set_max_abs(0.00105);
  p->mutable_stats()->set_max_ulp(11691520);
  p->mutable_stats()->set_bitwise_equal_count(0);
  p->set_rounding(true);
  p->set_configs_max_abs(0.00103092);
  p->set_expected_max_abs(0.0000625);
  p->set_advice_b_to_a("set jax_default_matmul_precision to highest");
  p->set_advice_a_to_b("torch.backends.cuda.matmul.allow_tf32 = True");
  return r;
}

TEST(FormatCompareHumanTest, HeadlineFirstThenEachOutputAndThePair) {
  const std::string out = FormatCompareHuman(CompareCase(), ReportContext("compare"));
  const std::vector<std::string> lines = Lines(out);
  EXPECT_EQ(lines[0],
            "torch is cpu:fp32:fused (PyTorch's default), flax is cpu:tf32:unfused (JAX/Flax's "
            "default on");
  EXPECT_THAT(out, HasSubstr("\n  output  best match        confidence   verdict\n"
                             "  torch   cpu:fp32:fused          1.00  rounding\n"
                             "  flax    cpu:tf32:unfused        1.00  rounding\n"));
  // 0.00103092 + 6.25e-05 = 0.00109342.
  EXPECT_THAT(out, HasSubstr("  torch vs flax: max_abs 0.00105, max_ulp 11691520, bitwise-equal "
                             "0%; rounding allows 0.00109342\n"
                             "    (configurations 0.00103092 apart, outputs 6.25e-05 from them); "
                             "rounding: yes\n"));
  EXPECT_LE(lines.size(), 12u);
  EXPECT_THAT(out, Not(HasSubstr("allow_tf32")));  // the advice both ways: --verbose
  ReportContext verbose("compare");
  verbose.verbose = true;
  const std::string v = FormatCompareHuman(CompareCase(), verbose);
  EXPECT_THAT(v, HasSubstr("\n== torch ==\nRounding, not a bug: cpu:fp32:fused.\n"));
  EXPECT_THAT(v, HasSubstr("\nWhat to change:\n  flax -> torch: set jax_default_matmul_precision "
                           "to highest\n  torch -> flax: torch.backends.cuda.matmul.allow_tf32 = "
                           "True\n"));
}

TEST(ExitCodeForCompareTest, RoundingPassesAndAcceptNeedsThePassVerdict) {
  pb::CompareResponse r = CompareCase();
  EXPECT_EQ(ExitCodeForCompare(r, /*accept=*/false), 0);
  r.mutable_pair()->set_rounding(false);
  EXPECT_EQ(ExitCodeForCompare(r, /*accept=*/false), 1);
  r.mutable_pair()->set_rounding(true);
  r.set_verdict(pb::VERDICT_FAIL);
  EXPECT_EQ(ExitCodeForCompare(r, /*accept=*/false), 0);  // no --accept: not its verdict
  EXPECT_EQ(ExitCodeForCompare(r, /*accept=*/true), 1);
  r.set_verdict(pb::VERDICT_PASS);
  EXPECT_EQ(ExitCodeForCompare(r, /*accept=*/true), 0);
  r.clear_pair();
  EXPECT_EQ(ExitCodeForCompare(r, /*accept=*/false), 3);
}

TEST(CompareResponseToJsonTest, KeysInProtoOrderEachOutputsDiagnosisAsVerifys) {
  const nlohmann::ordered_json j = CompareResponseToJson(CompareCase());
  EXPECT_THAT(Keys(j), ElementsAre("headline", "outputs", "pair", "reference", "output_shape",
                                   "notes", "verdict"));
  EXPECT_TRUE(j["verdict"].is_null());
  EXPECT_EQ(j["outputs"][1]["name"], "flax");
  EXPECT_EQ(j["outputs"][1]["diagnosis"]["best"], "cpu:tf32:unfused");
  EXPECT_EQ(j["outputs"][1]["diagnosis"]["headline"], "Rounding, not a bug: cpu:tf32:unfused.");
  EXPECT_THAT(Keys(j["pair"]), ElementsAre("a", "b", "stats", "rounding", "configs_max_abs",
                                           "expected_max_abs", "advice_b_to_a", "advice_a_to_b"));
  EXPECT_EQ(j["pair"]["rounding"], true);
  EXPECT_EQ(j["pair"]["expected_max_abs"], 0.0000625);
  EXPECT_EQ(j["pair"]["stats"]["max_ulp"], 11691520);
}

}  // namespace
}  // namespace tensorcheck::cli
