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
using ::testing::HasSubstr;
using ::testing::Not;

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
  EXPECT_THAT(keys,
              ElementsAre("config", "bitwise_equal_fraction", "max_ulp", "mean_ulp", "bound_ratio",
                          "equivalent", "disagreements", "expected_disagreements", "plausibility_p",
                          "plausible", "consistent_fraction", "compared_elements", "ruled_out",
                          "shared_computation", "exact", "details"));
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
  const std::string out = FormatHuman(BatchInvarianceResponse(), ReportContext{"verify"});
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
  EXPECT_THAT(FormatHuman(r, ReportContext{"diagnose"}), Not(HasSubstr("exact")));
  r.mutable_diagnosis()->mutable_ranking(0)->set_exact(true);
  const std::string out = FormatHuman(r, ReportContext{"diagnose"});
  EXPECT_THAT(out, HasSubstr("bound_ratio  exact"));
  for (const std::string& line : Lines(out)) {
    EXPECT_LE(line.size(), 100u) << line;
  }
}

TEST(FormatHumanTest, RankingShowsPlausibilitySharesAndRuledOutReasons) {
  const std::string out = FormatHuman(DiagnoseResponse(), ReportContext{"diagnose"});
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
  const std::string out = FormatHuman(r, ReportContext{"diagnose"});
  EXPECT_THAT(out, HasSubstr("3. cpu:fp32:fused:"));
  EXPECT_THAT(out, Not(HasSubstr("Sixth and not listed.")));
}

TEST(FormatHumanTest, CandidatesWithoutAPlausibilityTestShowADash) {
  // A server older than the plausibility test leaves every field unset.
  pb::VerifyResponse r;
  pb::RankedCandidate* c = r.mutable_diagnosis()->add_ranking();
  c->set_config("cpu:fp32:fused");
  c->set_bitwise_equal_fraction(1.0);
  const std::string out = FormatHuman(r, ReportContext{"diagnose"});
  EXPECT_THAT(out, HasSubstr("  1     cpu:fp32:fused  -                   100%"));
  EXPECT_THAT(out, Not(HasSubstr("Ruled out")));
  EXPECT_THAT(out, Not(HasSubstr("reused the GEMM")));
}

TEST(FormatHumanTest, LongRuledOutReasonsWrapWithinOneHundredColumns) {
  pb::VerifyResponse r = DiagnoseResponse();
  std::string reason;
  for (int i = 0; i < 40; ++i) reason += "word ";
  r.mutable_diagnosis()->mutable_ranking(2)->set_ruled_out(reason);
  const std::string out = FormatHuman(r, ReportContext{"diagnose"});
  EXPECT_THAT(out, HasSubstr("    3. cpu:fp32:fused: word word"));
  EXPECT_THAT(out, HasSubstr("\n      word word"));
  for (const std::string& line : Lines(out)) EXPECT_LE(line.size(), 100u) << line;
}

TEST(FormatHumanTest, SharedComputationMarksTheEpilogueOnlyElapsedTime) {
  const std::string out = FormatHuman(DiagnoseResponse(), ReportContext{"diagnose"});
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
  const std::string out = FormatHuman(r, ReportContext{"verify"});
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

TEST(FormatGithubSummaryTest, RankingHasPlausibilitySharedGemmAndRuledOut) {
  const std::string md = FormatGithubSummary(DiagnoseResponse(), ReportContext{"diagnose"});
  EXPECT_THAT(md, HasSubstr("| rank | config | plausible | bitwise-equal |"));
  EXPECT_THAT(md,
              HasSubstr("| 1 | `cpu:tf32:unfused` = `cpu:tf32rna:unfused` | yes | 99.997% | 1 |"));
  EXPECT_THAT(md, HasSubstr("| 2 | `cpu:tf32:fused` (GEMM of `cpu:tf32:unfused`) | yes | 50.0% |"));
  EXPECT_THAT(md, HasSubstr("- `cpu:fp32:fused`: 94671 of 94674 elements"));
}

TEST(FormatGithubSummaryTest, VerifyTableNamesTheSharedGemm) {
  const std::string md = FormatGithubSummary(DiagnoseResponse(), ReportContext{"verify"});
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
  const std::string out = FormatHuman(ThreeEquivalentOfFive(), ReportContext{"diagnose"});
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
  const std::string out = FormatHuman(r, ReportContext{"diagnose"});
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
                          "localization", "explanation", "verdict", "verdict_reason", "defect"));
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
  const std::vector<std::string> lines =
      Lines(FormatHuman(DefectResponse(), ReportContext{"diagnose"}));
  ASSERT_GE(lines.size(), 13u);
  // The server's sentence, wrapped at 100 columns.
  const std::vector<std::string> head(lines.begin(), lines.begin() + 13);
  EXPECT_THAT(
      head,
      ElementsAre(
          "Verdict: defect \xe2\x80\x94 Column 2 holds 64 of the 72 disagreements with "
          "cpu:fp32:fused where rounding",
          "  predicts 0.8 (p < 1e-30): not rounding.",
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
    const std::vector<std::string> lines = Lines(FormatHuman(r, ReportContext{"diagnose"}));
    const std::string word =
        verdict == pb::Diagnosis::VERDICT_ROUNDING ? "rounding" : "unexplained";
    ASSERT_GE(lines.size(), 3u);
    EXPECT_EQ(lines[0], "Verdict: " + word +
                            " \xe2\x80\x94 Every element within 4 sigma of cpu:tf32:unfused.");
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
  EXPECT_EQ(outcomes[0].details, absl::StrCat("Verdict: defect \xe2\x80\x94 ", kDefectReason,
                                              "\nWhere to look: ", kWhereToLook,
                                              "\nBest match: cpu:fp32:fused (confidence 0.9)"));
}

TEST(FormatGithubAnnotationsTest, DefectWithABestMatchIsAWarningCarryingTheReason) {
  const pb::VerifyResponse r = DefectResponse();
  const std::string out = FormatGithubAnnotations(r, ReportContext{"diagnose"});
  EXPECT_THAT(out, HasSubstr(absl::StrCat(
                       "::warning title=tensorcheck diagnose%3A diagnosis::Verdict: defect "
                       "\xe2\x80\x94 ",
                       kDefectReason, "%0AWhere to look: ", kWhereToLook, "%0ABest match: ")));
  EXPECT_THAT(out, Not(HasSubstr("::error")));
  // The overall notice opens with the verdict too.
  EXPECT_THAT(out, HasSubstr(absl::StrCat("::notice title=tensorcheck diagnose::Verdict: defect "
                                          "\xe2\x80\x94 ",
                                          kDefectReason, "%0Abest match cpu:fp32:fused")));
  // The exit code keeps its meaning: a configuration explains the output.
  EXPECT_EQ(ExitCodeFor(r, ReportContext{"diagnose"}), 0);
}

TEST(FormatGithubAnnotationsTest, UnexplainedIsAnErrorWithoutABestMatchAndAWarningWithOne) {
  pb::VerifyResponse r = DiagnoseResponse();
  pb::Diagnosis* d = r.mutable_diagnosis();
  d->set_verdict(pb::Diagnosis::VERDICT_UNEXPLAINED);
  d->set_verdict_reason("No candidate is within 1.5x of its error model.");
  std::string out = FormatGithubAnnotations(r, ReportContext{"diagnose"});
  EXPECT_THAT(out, HasSubstr("::warning title=tensorcheck diagnose%3A diagnosis::Verdict: "
                             "unexplained \xe2\x80\x94 No candidate is within 1.5x of its error "
                             "model.%0ABest match: cpu:tf32:unfused"));
  d->clear_best();
  out = FormatGithubAnnotations(r, ReportContext{"diagnose"});
  EXPECT_THAT(out, HasSubstr("::error title=tensorcheck diagnose%3A diagnosis::Verdict: "
                             "unexplained \xe2\x80\x94 No candidate is within 1.5x of its error "
                             "model.%0ANo candidate configuration explains the observed output."));
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
  EXPECT_THAT(out, HasSubstr("::notice title=tensorcheck diagnose::Verdict: rounding "
                             "\xe2\x80\x94 Rounding of cpu:tf32:unfused.%0Abest match "));
}

TEST(FormatGithubSummaryTest, VerdictWhereToLookAndDefectTableComeFirst) {
  const std::string md = FormatGithubSummary(DefectResponse(), ReportContext{"diagnose"});
  EXPECT_THAT(md, HasSubstr(absl::StrCat("## tensorcheck diagnose: `cpu:fp32:fused`\n\n"
                                         "Verdict: **defect** \xe2\x80\x94 Column 2 holds 64 of "
                                         "the 72 disagreements with cpu:fp32:fused where "
                                         "rounding predicts 0.8 (p &lt; 1e-30): not rounding.\n\n"
                                         "Where to look: output column 2 &lt;-&gt; weight row 2 "
                                         "(out_in layout) and bias element 2\n\n")));
  EXPECT_THAT(md, HasSubstr("| column 2 | 64 | 0.8 | 1e-30 | 7 | inf | inf |\n"
                            "| row 5 | 3 | 0.025 | 2.5e-06 | 1 | 4096 | 812.25 |\n"));
}

}  // namespace
}  // namespace tensorcheck::cli
