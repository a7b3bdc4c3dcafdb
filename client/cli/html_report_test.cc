#include "client/cli/html_report.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/cli/internal/html_charts.h"
#include "client/cli/internal/report_format.h"
#include "tests/testing/status_matchers.h"

namespace tensorcheck::cli {
namespace {

using ::tensorcheck::testing::IsOk;
using ::tensorcheck::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

int Count(const std::string& haystack, const std::string& needle) {
  int n = 0;
  for (size_t p = haystack.find(needle); p != std::string::npos;
       p = haystack.find(needle, p + needle.size())) {
    ++n;
  }
  return n;
}

ReportContext Ctx(const char* command) {
  ReportContext c;
  c.command = command;
  return c;
}

// Nothing on the page may reach the network.
void ExpectSelfContained(const std::string& page) {
  EXPECT_THAT(page, Not(HasSubstr("http://")));
  EXPECT_THAT(page, Not(HasSubstr("https://")));
  EXPECT_THAT(page, Not(HasSubstr("src=\"//")));
  EXPECT_THAT(page, Not(HasSubstr("<script")));
  EXPECT_THAT(page, Not(HasSubstr("<link")));
  EXPECT_THAT(page, Not(HasSubstr("@import")));
  EXPECT_THAT(page, Not(HasSubstr("url(http")));
}

pb::Tensor Fp64Tensor(const std::vector<int64_t>& shape, const std::vector<double>& v) {
  pb::Tensor t;
  t.set_dtype(pb::DTYPE_FLOAT64);
  for (int64_t d : shape) t.add_shape(d);
  t.set_data(std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(double)));
  return t;
}

pb::Tensor Fp32Tensor(const std::vector<int64_t>& shape, const std::vector<float>& v) {
  pb::Tensor t;
  t.set_dtype(pb::DTYPE_FLOAT32);
  for (int64_t d : shape) t.add_shape(d);
  t.set_data(std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float)));
  return t;
}

void AddBucket(pb::Stats* s, uint64_t lo, uint64_t hi, int64_t count) {
  pb::UlpBucket* b = s->add_ulp_histogram();
  b->set_lo(lo);
  b->set_hi(hi);
  b->set_count(count);
}

// A 4x3 output. The reference is 0..11; cpu:fp32 equals the observed
// output except element (2, 1), which is 0.5 larger; cpu:tf32 is 1e-3 off
// everywhere. The observed output is the reference plus 1e-6 everywhere.
struct Fixture {
  pb::VerifyResponse response;
  Tensor observed;
};

Fixture DiagnoseFixture() {
  Fixture f;
  pb::VerifyResponse& r = f.response;
  r.add_output_shape(4);
  r.add_output_shape(3);
  std::vector<double> ref(12), obs(12), fp32(12), tf32(12);
  for (int i = 0; i < 12; ++i) {
    ref[i] = i;
    obs[i] = i + 1e-6;
    fp32[i] = obs[i];
    tf32[i] = obs[i] + 1e-3;
  }
  fp32[2 * 3 + 1] += 0.5;
  f.observed = *FromDoubles(DType::kFloat64, {4, 3}, obs);

  pb::ConfigResult* ref_res = r.mutable_reference();
  ref_res->set_config("cpu:fp64:none");
  *ref_res->mutable_output() = Fp64Tensor({4, 3}, ref);

  pb::ConfigResult* a = r.add_results();
  a->set_config("cpu:fp32:none");
  *a->mutable_output() = Fp64Tensor({4, 3}, fp32);
  pb::Stats* s = a->mutable_vs_observed();
  s->set_total(12);
  s->set_bitwise_equal_count(11);
  AddBucket(s, 0, 0, 11);
  AddBucket(s, 1, 1, 0);
  AddBucket(s, 3, 4, 1);

  pb::ConfigResult* b = r.add_results();
  b->set_config("cpu:tf32:none");
  *b->mutable_output() = Fp64Tensor({4, 3}, tf32);
  b->mutable_vs_observed()->set_total(12);

  pb::Stats* ovr = r.mutable_observed_vs_reference();
  ovr->set_total(12);
  AddBucket(ovr, 5, 8, 12);

  pb::Diagnosis* d = r.mutable_diagnosis();
  d->set_best("cpu:fp32:none");
  d->set_confidence(0.93);
  d->add_equivalent("cpu:fp64:none");
  d->set_framework_hint("PyTorch default: fp32 matmul");
  d->set_explanation("Matches <b>& nothing else");
  pb::RankedCandidate* c1 = d->add_ranking();
  c1->set_config("cpu:fp32:none");
  c1->set_bitwise_equal_fraction(11.0 / 12.0);
  c1->set_max_ulp(4);
  c1->set_mean_ulp(0.25);
  c1->mutable_bound_ratio()->set_value(1.5);
  c1->set_disagreements(1);
  c1->set_expected_disagreements(0.8);
  c1->set_plausibility_p(0.55);
  c1->set_plausible(true);
  c1->set_consistent_fraction(1.0);
  c1->set_compared_elements(12);
  pb::RankedCandidate* c2 = d->add_ranking();
  c2->set_config("cpu:tf32:none");
  c2->set_bitwise_equal_fraction(0.0);
  c2->set_max_ulp(70000);
  c2->set_mean_ulp(65000);
  c2->set_disagreements(12);
  c2->set_expected_disagreements(0.5);
  c2->set_plausibility_p(1e-12);
  c2->set_compared_elements(12);
  c2->set_ruled_out("12 of 12 elements differ where <0.5> are expected.");
  c2->set_shared_computation("cpu:fp32:none");
  b->set_shared_computation("cpu:fp32:none");
  return f;
}

// ---------------------------------------------------------------- encoders

TEST(Crc32Test, CheckValueOfTheStandardString) {
  // The CRC-32/ISO-HDLC check value.
  EXPECT_EQ(Crc32("123456789"), 0xCBF43926u);
  EXPECT_EQ(Crc32(""), 0u);
  // PNG's IEND chunk always ends in AE 42 60 82.
  EXPECT_EQ(Crc32("IEND"), 0xAE426082u);
}

TEST(Adler32Test, KnownValues) {
  EXPECT_EQ(Adler32(""), 1u);
  EXPECT_EQ(Adler32("Wikipedia"), 0x11E60398u);
  // 100000 bytes of 0xff: a = 1 + 255 * 100000 mod 65521, b = sum of the
  // running a's: sum_{k=1..n} (1 + 255 k) = n + 255 n (n + 1) / 2.
  const std::string ff(100000, '\xff');
  const uint64_t n = 100000, m = 65521;
  const uint64_t a = (1 + 255 * n) % m;
  const uint64_t b = (n + 255 * n * (n + 1) / 2) % m;
  EXPECT_EQ(Adler32(ff), static_cast<uint32_t>(b << 16 | a));
}

TEST(ZlibStoredTest, EmptyInputIsOneFinalEmptyBlock) {
  const std::string z = ZlibStored("");
  EXPECT_EQ(z, std::string("\x78\x01\x01\x00\x00\xff\xff\x00\x00\x00\x01", 11));
}

TEST(ZlibStoredTest, LongInputIsSplitInto65535ByteBlocks) {
  const std::string data(70000, 'a');
  const std::string z = ZlibStored(data);
  ASSERT_EQ(z.size(), 2u + 5 + 65535 + 5 + (70000 - 65535) + 4);
  // First block: not final, LEN 0xffff, NLEN 0x0000.
  EXPECT_EQ(z.substr(2, 5), std::string("\x00\xff\xff\x00\x00", 5));
  // Second block: final, LEN 4465 = 0x1171, NLEN 0xee8e.
  EXPECT_EQ(z.substr(2 + 5 + 65535, 5), std::string("\x01\x71\x11\x8e\xee", 5));
}

TEST(EncodePalettePngTest, HeaderChunksAndSizeAreAsSpecified) {
  const std::string palette("\x00\x00\x00\xff\xff\xff", 6);
  const std::string png =
      EncodePalettePng(3, 2, std::string("\x00\x01\x00\x01\x00\x01", 6), palette);
  EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  // IHDR: length 13, width 3, height 2, depth 8, colour type 3 (palette).
  EXPECT_EQ(png.substr(8, 8), std::string("\x00\x00\x00\x0dIHDR", 8));
  EXPECT_EQ(png.substr(16, 13),
            std::string("\x00\x00\x00\x03\x00\x00\x00\x02\x08\x03\x00\x00\x00", 13));
  EXPECT_EQ(png.substr(33, 8), std::string("\x00\x00\x00\x06PLTE", 8));
  // Signature, IHDR (12 + 13), PLTE (12 + 6), IDAT (12 + zlib of 2 rows of
  // 1 + 3 bytes: 2 + 5 + 8 + 4), IEND (12).
  EXPECT_EQ(png.size(), 8u + 25 + 18 + 12 + 19 + 12);
  EXPECT_EQ(png.substr(png.size() - 12), std::string("\x00\x00\x00\x00IEND\xae\x42\x60\x82", 12));
}

TEST(Base64Test, PaddingCases) {
  EXPECT_EQ(Base64(""), "");
  EXPECT_EQ(Base64("M"), "TQ==");
  EXPECT_EQ(Base64("Ma"), "TWE=");
  EXPECT_EQ(Base64("Man"), "TWFu");
  EXPECT_EQ(Base64(std::string("\xff\xfe\x00", 3)), "//4A");
}

TEST(HtmlEscapeTest, MarkupCharactersAndControlsAreEscaped) {
  EXPECT_EQ(HtmlEscape("<b>&\"'"), "&lt;b&gt;&amp;&quot;&#39;");
  EXPECT_EQ(HtmlEscape("a\x01z"), "a\xef\xbf\xbdz");
  EXPECT_EQ(HtmlEscape("cpu:fp32:none"), "cpu:fp32:none");
}

// ---------------------------------------------------------------- downsampling

TEST(MatrixViewTest, LeadingDimensionsAreFlattened) {
  EXPECT_EQ(MatrixView({2, 3, 5}), std::make_pair(int64_t{6}, int64_t{5}));
  EXPECT_EQ(MatrixView({7}), std::make_pair(int64_t{1}, int64_t{7}));
  EXPECT_EQ(MatrixView({}), std::make_pair(int64_t{1}, int64_t{1}));
}

TEST(MaxPoolAbsDiffTest, SmallMatrixIsNotResampled) {
  auto g = MaxPoolAbsDiff({1, 2, 3, 4, 5, 6}, {1, 2, 3.5, 4, 3, 6}, 2, 3, 512);
  ASSERT_THAT(g, IsOk());
  EXPECT_EQ(g->grid_rows, 2);
  EXPECT_EQ(g->grid_cols, 3);
  EXPECT_EQ(g->cells, (std::vector<double>{0, 0, 0.5, 0, 2, 0}));
}

TEST(MaxPoolAbsDiffTest, FourBySixIntoTwoByTwoTakesEachBlocksMaximum) {
  // a[i][j] = -(10 i + j), b = 0: |a - b| = 10 i + j. Cell (0, 0) covers
  // rows 0-1 and cols 0-2 (max 12); (0, 1) cols 3-5 (15); (1, 0) rows 2-3
  // (32); (1, 1) 35.
  std::vector<double> a(24), b(24, 0.0);
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 6; ++j) a[i * 6 + j] = -(10.0 * i + j);
  }
  auto g = MaxPoolAbsDiff(a, b, 4, 6, 2);
  ASSERT_THAT(g, IsOk());
  EXPECT_EQ(g->grid_rows, 2);
  EXPECT_EQ(g->grid_cols, 2);
  EXPECT_EQ(g->cells, (std::vector<double>{12, 15, 32, 35}));
}

TEST(MaxPoolAbsDiffTest, ThousandByThreeKeepsOneLargeElementVisible) {
  // 1000 rows into 512 cells: row i lands in floor(512 i / 1000); row 700
  // in floor(358.4) = 358. Rows 698 and 699 share cell 357 (357.4, 357.9),
  // rows 700 and 701 cell 358 (358.4, 358.9).
  std::vector<double> a(3000, 1.0), b(3000, 1.0);
  for (size_t k = 0; k < b.size(); ++k) b[k] += 1e-3;
  a[700 * 3 + 1] = 6.0;  // |6 - 1.001| = 4.999
  auto g = MaxPoolAbsDiff(a, b, 1000, 3, 512);
  ASSERT_THAT(g, IsOk());
  EXPECT_EQ(g->grid_rows, 512);
  EXPECT_EQ(g->grid_cols, 3);
  ASSERT_EQ(g->cells.size(), 512u * 3);
  EXPECT_EQ(GridIndex(700, 1000, 512), 358);
  EXPECT_EQ(GridIndex(699, 1000, 512), 357);
  EXPECT_EQ(GridIndex(701, 1000, 512), 358);
  EXPECT_EQ(GridIndex(702, 1000, 512), 359);
  EXPECT_EQ(GridIndex(999, 1000, 512), 511);
  EXPECT_DOUBLE_EQ(g->cells[358 * 3 + 1], 6.0 - 1.001);
  int at_max = 0;
  for (size_t k = 0; k < g->cells.size(); ++k) {
    if (k == 358 * 3 + 1) continue;
    EXPECT_NEAR(g->cells[k], 1e-3, 1e-12) << "cell " << k;
    at_max += g->cells[k] > 1 ? 1 : 0;
  }
  EXPECT_EQ(at_max, 0);
}

TEST(CellSourceRangeTest, InvertsGridIndex) {
  // Cell 358 of 512 over 1000 rows: rows 700 (358.4) and 701 (358.9).
  EXPECT_EQ(CellSourceRange(358, 1000, 512), std::make_pair(int64_t{700}, int64_t{701}));
  EXPECT_EQ(CellSourceRange(0, 1000, 512), std::make_pair(int64_t{0}, int64_t{1}));
  EXPECT_EQ(CellSourceRange(511, 1000, 512), std::make_pair(int64_t{999}, int64_t{999}));
  EXPECT_EQ(CellSourceRange(2, 3, 3), std::make_pair(int64_t{2}, int64_t{2}));
  for (int64_t i = 0; i < 1000; ++i) {
    const auto [lo, hi] = CellSourceRange(GridIndex(i, 1000, 512), 1000, 512);
    EXPECT_LE(lo, i);
    EXPECT_GE(hi, i);
  }
}

TEST(MaxPoolAbsDiffTest, EveryCellCoversOneOrTwoRowsOfAThousand) {
  std::vector<int> covered(512, 0);
  for (int64_t i = 0; i < 1000; ++i) ++covered[static_cast<size_t>(GridIndex(i, 1000, 512))];
  for (int c : covered) {
    EXPECT_GE(c, 1);
    EXPECT_LE(c, 2);
  }
}

TEST(MaxPoolAbsDiffTest, NonFiniteMismatchesAreInfiniteAndMatchesAreZero) {
  auto g = MaxPoolAbsDiff({kNaN, kNaN, kInf, kInf, 1.0}, {1.0, kNaN, kInf, 1.0, -kInf}, 1, 5, 8);
  ASSERT_THAT(g, IsOk());
  EXPECT_EQ(g->cells, (std::vector<double>{kInf, 0, 0, kInf, kInf}));
}

TEST(MaxPoolAbsDiffTest, SizeMismatchIsInvalidArgument) {
  EXPECT_THAT(MaxPoolAbsDiff({1, 2, 3}, {1, 2}, 1, 3, 512),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("needs 3 values")));
  EXPECT_THAT(MaxPoolAbsDiff({1}, {1}, 1, 1, 0), StatusIs(absl::StatusCode::kInvalidArgument));
}

// ---------------------------------------------------------------- page

TEST(FormatHtmlTest, DiagnosePageHasSummaryRankingHistogramsAndHeatmaps) {
  Fixture f = DiagnoseFixture();
  const std::string page = FormatHtml(f.response, Ctx("diagnose"), &f.observed);
  ExpectSelfContained(page);
  EXPECT_THAT(page, HasSubstr("<!DOCTYPE html>"));
  EXPECT_THAT(page, HasSubstr("<code class=\"pass\">cpu:fp32:none</code>"));
  EXPECT_THAT(page, HasSubstr("0.93"));
  EXPECT_THAT(page, HasSubstr("<code>cpu:fp64:none</code>"));  // equivalent
  EXPECT_THAT(page, HasSubstr("PyTorch default: fp32 matmul"));
  // The explanation is escaped, never markup.
  EXPECT_THAT(page, HasSubstr("Matches &lt;b&gt;&amp; nothing else"));
  EXPECT_THAT(page, Not(HasSubstr("<b>&")));
  // Ranking rows, the best one marked.
  EXPECT_THAT(page, HasSubstr("<th>plausible</th><th>bitwise-equal</th>"));
  EXPECT_THAT(page, HasSubstr("<tr class=\"best\"><td class=\"num\">1</td><td><code>"
                              "cpu:fp32:none</code></td><td><span class=\"pass\">yes</span></td>"
                              "<td class=\"num\">91.7%</td>"
                              "<td class=\"num\">4</td><td class=\"num\">0.25</td>"
                              "<td class=\"num\">1.5</td>"
                              "<td class=\"num\">1 of 12 (0.8 expected, p 0.55)</td><td></td>"
                              "</tr>"));
  EXPECT_THAT(page, HasSubstr("<tr><td class=\"num\">2</td><td><code>cpu:tf32:none</code>"
                              "</td><td><span class=\"fail\">no</span></td>"
                              "<td class=\"num\">0%</td><td class=\"num\">70000</td>"
                              "<td class=\"num\">65000</td><td class=\"num\">&ndash;</td>"
                              "<td class=\"num\">12 of 12 (0.5 expected, p 1e-12)</td>"
                              "<td><code>cpu:fp32:none</code></td></tr>"));
  // The ruled-out reason, escaped, and the shared GEMM in the configurations.
  EXPECT_THAT(page, HasSubstr("<li>2. <code>cpu:tf32:none</code>: 12 of 12 elements differ "
                              "where &lt;0.5&gt; are expected.</li>"));
  EXPECT_THAT(page, HasSubstr("<tr><td><code>cpu:tf32:none</code><br><span class=\"shared\">"
                              "epilogue only; GEMM shared with <code>cpu:fp32:none</code></span>"
                              "</td><td>"));
  // Histograms: the best candidate's buckets 0, 1, 3-4, then observed vs
  // reference's 5-8.
  EXPECT_THAT(page, HasSubstr("ULP distance, observed vs best candidate cpu:fp32:none"));
  EXPECT_THAT(page, HasSubstr(">3-4</text>"));
  EXPECT_THAT(page, HasSubstr(">5-8</text>"));
  EXPECT_EQ(Count(page, "<rect class=\"bar\""), 4);
  // Two heatmaps, each a PNG with its legend. |observed - fp32| is 0.5 at
  // one element and 0 elsewhere; |observed - reference| is 1e-6 everywhere
  // (to rounding of i + 1e-6).
  EXPECT_EQ(Count(page, "data:image/png;base64,"), 2);
  EXPECT_THAT(page, HasSubstr("|observed vs best candidate cpu:fp32:none|"));
  EXPECT_THAT(page, HasSubstr("|observed vs reference cpu:fp64:none|"));
  EXPECT_THAT(page, HasSubstr(">min 0.5</text>"));
  EXPECT_THAT(page, HasSubstr(">max 0.5</text>"));
  EXPECT_THAT(page, HasSubstr(">min 1e-06</text>"));
  EXPECT_THAT(page, HasSubstr(">max 1e-06</text>"));
  EXPECT_THAT(page, HasSubstr("Output viewed as 4 &times; 3"));
  // The largest difference, element (2, 1), is ringed and named.
  EXPECT_THAT(page, HasSubstr("Largest |difference| <span class=\"num\">0.5</span> in rows 2, "
                              "columns 1 (ringed)."));
  EXPECT_EQ(Count(page, "<circle class=\"largest\""), 2);
}

TEST(KeepDrawnOutputsTest, KeepsTheOutputsThePageDrawsAndTheSamePage) {
  Fixture f = DiagnoseFixture();
  const std::string page = FormatHtml(f.response, Ctx("diagnose"), &f.observed);
  pb::VerifyResponse kept = f.response;
  KeepDrawnOutputs(&kept, Ctx("diagnose"), /*has_observed=*/true);
  EXPECT_TRUE(kept.reference().has_output());
  for (const pb::ConfigResult& c : kept.results()) {
    EXPECT_EQ(c.has_output(), c.config() == "cpu:fp32:none") << c.config();
  }
  EXPECT_EQ(FormatHtml(kept, Ctx("diagnose"), &f.observed), page);
  // No best: the top of the ranking's output is the one drawn.
  kept = f.response;
  kept.mutable_diagnosis()->clear_best();
  const std::string no_best = FormatHtml(kept, Ctx("diagnose"), &f.observed);
  KeepDrawnOutputs(&kept, Ctx("diagnose"), /*has_observed=*/true);
  EXPECT_EQ(FormatHtml(kept, Ctx("diagnose"), &f.observed), no_best);
  // Verify against an observed output draws the reference's alone.
  kept = f.response;
  KeepDrawnOutputs(&kept, Ctx("verify"), /*has_observed=*/true);
  for (const pb::ConfigResult& c : kept.results()) EXPECT_FALSE(c.has_output()) << c.config();
  EXPECT_TRUE(kept.reference().has_output());
}

TEST(FormatHtmlTest, NullBestSaysNoCandidateExplainsTheOutput) {
  Fixture f = DiagnoseFixture();
  f.response.mutable_diagnosis()->clear_best();
  f.response.mutable_diagnosis()->clear_equivalent();
  const std::string page = FormatHtml(f.response, Ctx("diagnose"), &f.observed);
  ExpectSelfContained(page);
  EXPECT_THAT(page, HasSubstr("no candidate explains the output"));
  EXPECT_THAT(page, Not(HasSubstr("class=\"best\"")));
  // The heatmap falls back to the top-ranked candidate, labelled as such.
  EXPECT_THAT(page, HasSubstr("closest candidate cpu:fp32:none (which does not explain it)"));
}

TEST(FormatHtmlTest, ConfigNamesAreEscaped) {
  Fixture f = DiagnoseFixture();
  f.response.mutable_diagnosis()->mutable_ranking(1)->set_config("cpu:<img src=x>");
  const std::string page = FormatHtml(f.response, Ctx("diagnose"), &f.observed);
  EXPECT_THAT(page, HasSubstr("cpu:&lt;img src=x&gt;"));
  EXPECT_THAT(page, Not(HasSubstr("<img")));
}

TEST(FormatHtmlTest, MissingOutputsBecomeNotesInsteadOfHeatmaps) {
  Fixture f = DiagnoseFixture();
  f.response.mutable_results(0)->clear_output();
  f.response.mutable_reference()->clear_output();
  const std::string page = FormatHtml(f.response, Ctx("diagnose"), &f.observed);
  EXPECT_EQ(Count(page, "data:image/png;base64,"), 0);
  EXPECT_THAT(page, HasSubstr("the server returned no output for cpu:fp32:none"));
  EXPECT_THAT(page, HasSubstr("the server returned no output for cpu:fp64:none"));
}

TEST(FormatHtmlTest, ObservedOfAnotherShapeIsANoteNotACrash) {
  Fixture f = DiagnoseFixture();
  Tensor wrong = *FromDoubles(DType::kFloat64, {5}, {1, 2, 3, 4, 5});
  const std::string page = FormatHtml(f.response, Ctx("diagnose"), &wrong);
  EXPECT_EQ(Count(page, "data:image/png;base64,"), 0);
  EXPECT_THAT(page, HasSubstr("needs 12 values; got 5 and 12"));
}

TEST(FormatHtmlTest, VerifyWithoutObservedShowsEachConfigurationAgainstTheReference) {
  Fixture f = DiagnoseFixture();
  pb::VerifyResponse& r = f.response;
  r.clear_diagnosis();
  r.clear_observed_vs_reference();
  r.set_verdict(pb::VERDICT_FAIL);
  for (pb::ConfigResult& c : *r.mutable_results()) {
    c.clear_vs_observed();
    c.mutable_vs_reference()->set_total(12);
    AddBucket(c.mutable_vs_reference(), 0, 0, 12);
  }
  const std::string page = FormatHtml(r, Ctx("verify"), /*observed=*/nullptr);
  ExpectSelfContained(page);
  EXPECT_THAT(page, HasSubstr("<span class=\"fail\">FAIL</span>"));
  EXPECT_THAT(page, HasSubstr("ULP distance, cpu:fp32:none vs reference cpu:fp64:none"));
  EXPECT_THAT(page, HasSubstr("ULP distance, cpu:tf32:none vs reference cpu:fp64:none"));
  EXPECT_EQ(Count(page, "data:image/png;base64,"), 2);
  // |fp32 - ref| peaks at (2, 1): 0.5 + 1e-6.
  EXPECT_THAT(page, HasSubstr(">max 0.5</text>"));
  EXPECT_THAT(page, Not(HasSubstr("Ranking")));
}

TEST(FormatHtmlTest, HeatmapsBeyondTheLimitAreLeftOutWithANote) {
  Fixture f = DiagnoseFixture();
  HtmlOptions opts;
  opts.max_heatmaps = 1;
  const std::string page = FormatHtml(f.response, Ctx("diagnose"), &f.observed, opts);
  EXPECT_EQ(Count(page, "data:image/png;base64,"), 1);
  EXPECT_THAT(page, HasSubstr("left out (at most 1 heatmaps per page)"));
}

// The size budget of the HTML report: a 1921 x 3072 output (the motivating case)
// gives a page well under 10 MB.
TEST(FormatHtmlTest, PageForA1921By3072OutputStaysUnderTenMegabytes) {
  const int64_t m = 1921, n = 3072;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  std::vector<float> ref(static_cast<size_t>(m * n)), cand(ref.size()), obs(ref.size());
  for (size_t k = 0; k < ref.size(); ++k) {
    ref[k] = normal(rng);
    cand[k] = ref[k] * (1 + 1e-3f * normal(rng));
    obs[k] = cand[k] * (1 + 1e-6f * normal(rng));
  }
  pb::VerifyResponse r;
  r.add_output_shape(m);
  r.add_output_shape(n);
  r.mutable_reference()->set_config("cpu:fp64:none");
  *r.mutable_reference()->mutable_output() = Fp32Tensor({m, n}, ref);
  pb::ConfigResult* c = r.add_results();
  c->set_config("cpu:bf16:fused");
  *c->mutable_output() = Fp32Tensor({m, n}, cand);
  pb::Stats* s = c->mutable_vs_observed();
  s->set_total(m * n);
  for (uint64_t lo = 0; lo < 40; ++lo) AddBucket(s, lo, lo, 1000);
  r.mutable_diagnosis()->set_best("cpu:bf16:fused");
  r.mutable_diagnosis()->add_ranking()->set_config("cpu:bf16:fused");
  Tensor observed = *FromFloats(DType::kFloat32, {m, n}, obs);
  const std::string page = FormatHtml(r, Ctx("diagnose"), &observed);
  std::cout << "page size for a " << m << "x" << n << " output: " << page.size() << " bytes\n";
  ::testing::Test::RecordProperty("page_bytes", static_cast<int>(page.size()));
  EXPECT_EQ(Count(page, "data:image/png;base64,"), 2);
  EXPECT_LT(page.size(), 10u << 20);
  ExpectSelfContained(page);
}

TEST(FormatHtmlTest, CandidatesWithTheSameBitsShareOneRankingRow) {
  // Five candidates over 24,576 elements; the first three computed the same
  // bits (24,575 equal to the observed output) and cpu:fp32:unfused reused
  // the GEMM of cpu:fp32:fused.
  pb::VerifyResponse r;
  pb::Diagnosis* d = r.mutable_diagnosis();
  d->set_best("cpu:fp32:fused");
  const std::vector<std::string> same = {"cpu:fp32:fused", "cpu:tf32:fused", "cpu:fp32:unfused"};
  for (const std::string& name : same) {
    pb::RankedCandidate* c = d->add_ranking();
    c->set_config(name);
    c->set_bitwise_equal_fraction(24575.0 / 24576.0);
    c->set_max_ulp(1);
    c->set_plausible(true);
    c->set_compared_elements(24576);
    for (const std::string& e : same) {
      if (e != name) c->add_equivalent(e);
    }
    if (name == "cpu:fp32:unfused") c->set_shared_computation("cpu:fp32:fused");
  }
  for (const char* name : {"cpu:bf16:fused", "cpu:fp16:fused"}) {
    pb::RankedCandidate* c = d->add_ranking();
    c->set_config(name);
    c->set_bitwise_equal_fraction(0.25);
    c->set_compared_elements(24576);
    c->set_ruled_out("Too far.");
  }
  const std::string page = FormatHtml(r, Ctx("diagnose"), nullptr);
  EXPECT_THAT(page, HasSubstr("<tr class=\"best\"><td class=\"num\">1</td><td>"
                              "<code>cpu:fp32:fused</code> =&nbsp;<code>cpu:tf32:fused</code> "
                              "=&nbsp;<code>cpu:fp32:unfused</code></td>"
                              "<td><span class=\"pass\">yes</span></td>"
                              "<td class=\"num\">99.996%</td>"));
  EXPECT_THAT(page, HasSubstr("<td><code>cpu:fp32:unfused</code>: <code>cpu:fp32:fused</code>"
                              "</td></tr>"));
  EXPECT_THAT(page, HasSubstr("<tr><td class=\"num\">2</td><td><code>cpu:bf16:fused</code></td>"));
  EXPECT_THAT(page, HasSubstr("<tr><td class=\"num\">3</td><td><code>cpu:fp16:fused</code></td>"));
  EXPECT_EQ(
      Count(page, "<tr class=\"best\"><td class=\"num\">") + Count(page, "<tr><td class=\"num\">"),
      3);
  EXPECT_THAT(page, HasSubstr("<li>2. <code>cpu:bf16:fused</code>: Too far.</li>\n"
                              "<li>3. <code>cpu:fp16:fused</code>: Too far.</li>"));
  // 24,575 of 24,576 elements equal: never all.
  EXPECT_THAT(page, Not(HasSubstr(">100.0%")));
  EXPECT_THAT(page, Not(HasSubstr(">100%")));
}

// The server's verdict on DiagnoseFixture: cpu:fp32:none explains the
// output but for element (2, 1), 0.5 away (column 1 <-> weight row 1).
void AddDefect(pb::VerifyResponse* r) {
  pb::Diagnosis* d = r->mutable_diagnosis();
  d->set_verdict(pb::Diagnosis::VERDICT_DEFECT);
  d->set_verdict_reason("Element (2, 1) is 2.1e5 sigma from cpu:fp32:none <beyond 5.4>.");
  pb::Defect* f = d->mutable_defect();
  f->set_element_threshold_sigma(5.4375);
  f->set_false_alarm_rate(1e-3);
  f->set_element_count(1);
  f->set_max_ulp(4194304);
  f->set_max_sigma(210000);
  f->set_where_to_look("output column 1 <-> weight row 1 (out_in layout) & bias element 1");
  pb::DefectGroup* col = f->add_columns();
  col->set_index(1);
  col->set_disagreements(1);
  col->set_expected_disagreements(0.0125);
  col->set_p_value(0.0375);
  col->set_beyond_threshold(1);
  col->set_max_ulp(4194304);
  col->set_max_sigma(210000);
  pb::DefectElement* e = f->add_elements();
  e->set_sigma(210000);
  pb::Element* el = e->mutable_element();
  el->add_index(2);
  el->add_index(1);
  el->set_actual(7.000001);
  el->set_expected(7.500001);
  el->set_abs_diff(0.5);
  el->set_ulp(4194304);
}

TEST(FormatHtmlTest, DefectVerdictIsABannerOverTheSummaryWithWhereToLookAndTheDefectTables) {
  Fixture f = DiagnoseFixture();
  AddDefect(&f.response);
  const std::string page = FormatHtml(f.response, Ctx("diagnose"), &f.observed);
  ExpectSelfContained(page);
  // From a server without a headline the verdict and its reason open the
  // page, the server's sentence escaped.
  EXPECT_THAT(page, HasSubstr("</h1>\n<p class=\"verdict verdict-defect\"><strong>"
                              "Verdict: defect</strong> &mdash; Element (2, 1) is 2.1e5 sigma "
                              "from cpu:fp32:none &lt;beyond 5.4&gt;.</p>\n<h2>Summary</h2>\n"
                              "<dl class=\"summary\">"));
  EXPECT_THAT(page, HasSubstr("p.verdict-defect {"));
  // The defect section comes before the ranking.
  const size_t defect = page.find("<h2>Defect</h2>");
  ASSERT_NE(defect, std::string::npos);
  EXPECT_LT(defect, page.find("<h2>Ranking</h2>"));
  EXPECT_THAT(page, HasSubstr("<h2>Defect</h2>\n<p class=\"where\">Where to look: output column "
                              "1 &lt;-&gt; weight row 1 (out_in layout) &amp; bias element 1"
                              "</p>\n"));
  EXPECT_THAT(page, HasSubstr("<tr><th>group</th><th>disagreements</th><th>expected</th>"
                              "<th>p</th><th>beyond threshold</th><th>max_ulp</th>"
                              "<th>max_sigma</th></tr>\n<tr><td>column 1</td>"
                              "<td class=\"num\">1</td><td class=\"num\">0.0125</td>"
                              "<td class=\"num\">0.0375</td><td class=\"num\">1</td>"
                              "<td class=\"num\">4194304</td><td class=\"num\">210000</td>"
                              "</tr>\n</table>\n"));
  EXPECT_THAT(page, HasSubstr("<p class=\"note\">Elements beyond <span class=\"num\">5.4375</span> "
                              "predicted standard errors of another summation order (false-alarm "
                              "rate <span class=\"num\">0.001</span>): 1; the farthest is "
                              "<span class=\"num\">4194304</span> ULP, <span class=\"num\">"
                              "210000</span> sigma from the best candidate.</p>\n"));
  EXPECT_THAT(page, HasSubstr("<tr><td>(2, 1)</td><td class=\"num\">7</td><td class=\"num\">7.5"
                              "</td><td class=\"num\">0.5</td><td class=\"num\">4194304</td>"
                              "<td class=\"num\">210000</td></tr>"));
}

TEST(FormatHtmlTest, EachVerdictHasItsBannerAndAnOlderServersPageHasNone) {
  Fixture f = DiagnoseFixture();
  std::string page = FormatHtml(f.response, Ctx("diagnose"), &f.observed);
  EXPECT_THAT(page, Not(HasSubstr("<p class=\"verdict")));
  EXPECT_THAT(page, Not(HasSubstr("<h2>Defect</h2>")));
  const std::vector<std::pair<pb::Diagnosis::Verdict, std::string>> cases = {
      {pb::Diagnosis::VERDICT_ROUNDING, "rounding"},
      {pb::Diagnosis::VERDICT_UNEXPLAINED, "unexplained"},
  };
  for (const auto& [verdict, word] : cases) {
    f.response.mutable_diagnosis()->set_verdict(verdict);
    f.response.mutable_diagnosis()->set_verdict_reason("A sentence of the server, as sent.");
    f.response.mutable_diagnosis()->mutable_defect();  // empty: no section
    page = FormatHtml(f.response, Ctx("diagnose"), &f.observed);
    EXPECT_THAT(page, HasSubstr(absl::StrCat(
                          "<p class=\"verdict verdict-", word, "\"><strong>Verdict: ", word,
                          "</strong> &mdash; A sentence of the server, as sent.</p>")))
        << word;
    EXPECT_THAT(page, Not(HasSubstr("<h2>Defect</h2>"))) << word;
  }
}

// ---------------------------------------------------------------- the answer first

TEST(FormatHtmlTest, HeadlineOpensThePageWithTheAdviceUnderIt) {
  Fixture f = DiagnoseFixture();
  AddDefect(&f.response);
  pb::Diagnosis* d = f.response.mutable_diagnosis();
  d->set_headline("Not rounding: column 1 is <wrong>. Look at weight row 1 & its bias.");
  d->set_advice("Set torch.backends.cuda.matmul.allow_tf32 = False.");
  const std::string page = FormatHtml(f.response, Ctx("diagnose"), &f.observed);
  ExpectSelfContained(page);
  // Right after the title: the headline, escaped, then the advice; the
  // summary and everything else come after.
  EXPECT_THAT(page, HasSubstr("<h1>tensorcheck diagnose</h1>\n"
                              "<p class=\"verdict headline verdict-defect\">Not rounding: column 1 "
                              "is &lt;wrong&gt;. Look at weight row 1 &amp; its bias.</p>\n"
                              "<p class=\"advice\">Set torch.backends.cuda.matmul.allow_tf32 = "
                              "False.</p>\n<h2>Summary</h2>\n"));
  // The verdict's own sentence moves into the summary.
  EXPECT_THAT(page, HasSubstr("<dt>Verdict</dt><dd>defect &mdash; Element (2, 1) is 2.1e5 sigma "
                              "from cpu:fp32:none &lt;beyond 5.4&gt;.</dd>"));
  EXPECT_THAT(page, Not(HasSubstr("<strong>Verdict:")));
  EXPECT_EQ(Count(page, "class=\"verdict"), 1);
}

TEST(FormatHtmlTest, HeadlineWithoutAdviceHasNoAdviceLine) {
  Fixture f = DiagnoseFixture();
  pb::Diagnosis* d = f.response.mutable_diagnosis();
  d->set_verdict(pb::Diagnosis::VERDICT_ROUNDING);
  d->set_headline("Rounding, not a bug: cpu:fp32:none explains every element.");
  const std::string page = FormatHtml(f.response, Ctx("diagnose"), &f.observed);
  EXPECT_THAT(page, HasSubstr("</h1>\n<p class=\"verdict headline verdict-rounding\">Rounding, "
                              "not a bug: cpu:fp32:none explains every element.</p>\n"
                              "<h2>Summary</h2>"));
  EXPECT_THAT(page, Not(HasSubstr("class=\"advice\"")));
  // Without a reason from the server the summary says the verdict alone.
  EXPECT_THAT(page, HasSubstr("<dt>Verdict</dt><dd>rounding</dd>"));
}

TEST(FormatHtmlTest, VerifyWithAcceptShowsTheHeadlineAndTheAcceptance) {
  Fixture f = DiagnoseFixture();
  pb::VerifyResponse& r = f.response;
  r.set_verdict(pb::VERDICT_PASS);
  pb::Diagnosis* d = r.mutable_diagnosis();
  d->set_verdict(pb::Diagnosis::VERDICT_ROUNDING);
  d->set_headline("Rounding, not a bug: the output is cpu:fp32:none, which you accept.");
  d->set_accepted(true);
  d->set_accepted_as("cpu:fp32:none");
  std::string page = FormatHtml(r, Ctx("verify"), &f.observed);
  EXPECT_THAT(page, HasSubstr("</h1>\n<p class=\"verdict headline verdict-rounding\">Rounding, "
                              "not a bug: the output is cpu:fp32:none, which you accept.</p>\n"
                              "<h2>Summary</h2>"));
  EXPECT_THAT(page, HasSubstr("<dt>Accepted</dt><dd><span class=\"pass\">yes</span>, as "
                              "<code>cpu:fp32:none</code></dd>"));
  d->set_accepted(false);
  d->clear_accepted_as();
  r.set_verdict(pb::VERDICT_FAIL);
  page = FormatHtml(r, Ctx("verify"), &f.observed);
  EXPECT_THAT(page, HasSubstr("<dt>Accepted</dt><dd><span class=\"fail\">no</span></dd>"));
  // A verify response without a diagnosis (no accept) shows neither.
  r.clear_diagnosis();
  page = FormatHtml(r, Ctx("verify"), &f.observed);
  EXPECT_THAT(page, Not(HasSubstr("class=\"verdict")));
  EXPECT_THAT(page, Not(HasSubstr("<dt>Accepted</dt>")));
}

// ---------------------------------------------------------------- layout

// The page's CSS rule for `selector` (the text between its braces), or "".
std::string CssRule(const std::string& css, const std::string& selector) {
  const size_t at = css.find("\n" + selector + " {");
  if (at == std::string::npos) return "";
  const size_t open = css.find('{', at), close = css.find('}', at);
  return css.substr(open + 1, close - open - 1);
}

TEST(FormatHtmlTest, PageIsFluidAndNumbersDoNotWrap) {
  const std::string css = HtmlStyleSheet();
  // The body takes the window's width up to a wide cap, not a fixed
  // column of 1100 px.
  const std::string body = CssRule(css, "body");
  EXPECT_THAT(body, HasSubstr("width: 100%;"));
  EXPECT_THAT(body, HasSubstr("max-width: 1800px;"));
  EXPECT_THAT(CssRule(css, ".num"), HasSubstr("white-space: nowrap;"));
  EXPECT_THAT(CssRule(css, "svg"), HasSubstr("max-width: 100%;"));

  // 7.31945e-05 may break after its '-' in running text: every number on
  // the page sits in an element of class "num" (or in an SVG, where text
  // never wraps).
  Fixture f = DiagnoseFixture();
  AddDefect(&f.response);
  f.response.mutable_observed_vs_reference()->set_max_abs(7.31945e-05);
  f.response.mutable_results(0)->mutable_vs_observed()->set_max_abs(7.31945e-05);
  f.response.mutable_diagnosis()->mutable_defect()->set_false_alarm_rate(7.31945e-05);
  f.response.mutable_diagnosis()
      ->mutable_defect()
      ->mutable_elements(0)
      ->mutable_element()
      ->set_abs_diff(7.31945e-05);
  const std::string page = FormatHtml(f.response, Ctx("diagnose"), &f.observed);
  int seen = 0;
  for (size_t p = page.find("7.31945e-05"); p != std::string::npos;
       p = page.find("7.31945e-05", p + 1)) {
    ++seen;
    const std::string before = page.substr(p - 12, 12);
    EXPECT_EQ(before, "class=\"num\">") << page.substr(p - 80, 100);
  }
  EXPECT_EQ(seen, 4);  // summary, defect note, defect element, configurations table
}

// Where a <text> of an SVG may reach, by the bound SvgTextWidth promises
// (0.64 em a character at 11 px) and the font's ascent and descent (at
// most 0.95 and 0.25 em): the four corners of its box, after its rotation.
struct TextBox {
  std::string text;
  double min_x, min_y, max_x, max_y;
};

std::string Attr(const std::string& tag, const std::string& name) {
  const std::string key = " " + name + "=\"";
  const size_t p = tag.find(key);
  if (p == std::string::npos) return "";
  const size_t q = tag.find('"', p + key.size());
  return tag.substr(p + key.size(), q - p - key.size());
}

std::vector<TextBox> TextBoxes(const std::string& svg) {
  std::vector<TextBox> out;
  for (size_t p = svg.find("<text"); p != std::string::npos; p = svg.find("<text", p + 1)) {
    const size_t end_tag = svg.find('>', p);
    const std::string tag = svg.substr(p, end_tag - p);
    const size_t close = svg.find("</text>", end_tag);
    std::string text = svg.substr(end_tag + 1, close - end_tag - 1);
    // Entities count as one character.
    std::string plain;
    for (size_t i = 0; i < text.size(); ++i) {
      plain += text[i];
      if (text[i] == '&') i = text.find(';', i);
    }
    const double font = 11, w = 0.64 * font * static_cast<double>(plain.size());
    const double x = std::stod(Attr(tag, "x")), y = std::stod(Attr(tag, "y"));
    const std::string anchor = Attr(tag, "text-anchor");
    const double x0 = anchor == "end" ? x - w : anchor == "middle" ? x - w / 2 : x;
    double angle = 0, cx = 0, cy = 0;
    const std::string transform = Attr(tag, "transform");
    if (!transform.empty()) {
      EXPECT_EQ(std::sscanf(transform.c_str(), "rotate(%lf %lf %lf)", &angle, &cx, &cy), 3)
          << transform;
    }
    const double a = angle * M_PI / 180, c = std::cos(a), s = std::sin(a);
    TextBox b{plain, 1e300, 1e300, -1e300, -1e300};
    for (double px : {x0, x0 + w}) {
      for (double py : {y - 0.95 * font, y + 0.25 * font}) {
        const double rx = cx + (px - cx) * c - (py - cy) * s;
        const double ry = cy + (px - cx) * s + (py - cy) * c;
        b.min_x = std::min(b.min_x, rx);
        b.max_x = std::max(b.max_x, rx);
        b.min_y = std::min(b.min_y, ry);
        b.max_y = std::max(b.max_y, ry);
      }
    }
    out.push_back(b);
  }
  return out;
}

// Every <svg> of `html`: each text's box inside its viewBox.
void ExpectTextInsideEverySvg(const std::string& html) {
  int svgs = 0;
  for (size_t p = html.find("<svg"); p != std::string::npos; p = html.find("<svg", p + 1)) {
    ++svgs;
    const std::string svg = html.substr(p, html.find("</svg>", p) - p);
    double w = 0, h = 0;
    ASSERT_EQ(
        std::sscanf(Attr(svg.substr(0, svg.find('>')), "viewBox").c_str(), "0 0 %lf %lf", &w, &h),
        2);
    for (const TextBox& b : TextBoxes(svg)) {
      EXPECT_GE(b.min_x, 0) << b.text;
      EXPECT_GE(b.min_y, 0) << b.text;
      EXPECT_LE(b.max_x, w) << b.text;
      EXPECT_LE(b.max_y, h) << b.text;
    }
  }
  EXPECT_GT(svgs, 0);
}

TEST(HistogramSvgTest, ANarrowHistogramKeepsItsAxisCaptionInside) {
  pb::Stats s;
  s.set_total(5);
  AddBucket(&s, 0, 0, 5);
  const std::string svg = internal::HistogramSvg(s, "one bucket");
  // The caption, 36 characters, is wider than one bar: the picture is at
  // least 36 * 7.04 = 253.4 px wide plus margins.
  EXPECT_THAT(svg, HasSubstr(">ULP distance (bar height: log scale)</text>"));
  ExpectTextInsideEverySvg(svg);
}

TEST(HistogramSvgTest, LongTurnedLabelsAndHugeCountsStayInside) {
  pb::Stats s;
  s.set_total(1);
  AddBucket(&s, 1000000000, 1999999999, 123456789012);  // a 21-character label, turned
  AddBucket(&s, 2000000000, internal::kUlpInfinite, 7);
  AddBucket(&s, internal::kUlpInfinite, internal::kUlpInfinite, 3);
  const std::string svg = internal::HistogramSvg(s, "far apart");
  EXPECT_THAT(svg, HasSubstr(">1000000000-1999999999</text>"));
  EXPECT_THAT(svg, HasSubstr(">123456789012</text>"));
  EXPECT_THAT(svg, HasSubstr("rotate(-45 "));
  ExpectTextInsideEverySvg(svg);
  // Counts of neighbouring bars do not overlap: 12 digits need 84.5 px.
  const std::vector<TextBox> boxes = TextBoxes(svg);
  ASSERT_GE(boxes.size(), 2u);
  EXPECT_EQ(boxes[0].text, "123456789012");
  EXPECT_EQ(boxes[2].text, "7");
  EXPECT_LE(boxes[0].max_x, boxes[2].min_x);
}

TEST(HeatmapFigureTest, LongRowLabelsAndTheLegendStayInside) {
  // 100000 x 2: a tall, narrow matrix (the box is 48 px wide) with a
  // non-finite mismatch, so the legend shows both swatches.
  const int64_t rows = 100000, cols = 2;
  std::vector<double> a(static_cast<size_t>(rows * cols), 1.0), b = a;
  b[7] = 1.5;
  b[9] = kNaN;
  auto g = MaxPoolAbsDiff(a, b, rows, cols, 512);
  ASSERT_THAT(g, IsOk());
  const std::string fig = internal::HeatmapFigure(*g, "tall", 0);
  EXPECT_THAT(fig, HasSubstr(">row 99999</text>"));
  EXPECT_THAT(fig, HasSubstr(">non-finite (NaN/inf mismatch)</text>"));
  ExpectTextInsideEverySvg(fig);
}

TEST(FormatHtmlTest, EveryChartOfTheDiagnosePageKeepsItsTextInside) {
  Fixture f = DiagnoseFixture();
  ExpectTextInsideEverySvg(FormatHtml(f.response, Ctx("diagnose"), &f.observed));
}

// ---------------------------------------------------------------- bound_ratio across depth

// The chart the Python client's ModelReport.to_html draws too
// (client/python/tests/test_model_chart.py holds the same case and the
// same numbers): threshold 3; three layer calls with bound_ratio 0, 0.5
// and 4. The axis spans the decades of 0.5 .. 4 and 3: 1e-1 .. 1e1, and
// one more below for the zero: 4 decades over the plot's 264 px, from
// y = 16 (top) to 280 (the floor); x spans 64 .. 880.
std::vector<DepthPoint> ThreeCalls() {
  return {{0, 0.0, "cpu:bf16:fused", "blocks.0.up"},
          {1, 0.5, "cpu:bf16:fused", "blocks.1.up"},
          {2, 4.0, "cpu:bf16:unfused", "blocks.2.mlp.down_proj#1"}};
}

TEST(BoundRatioSvgTest, ZerosSitOnTheFloorLabelledZeroAndTheLegendSaysSo) {
  const std::string svg = BoundRatioSvg(ThreeCalls(), 3, /*threshold=*/3.0, /*first_divergence=*/2);
  // Decade lines at 280, 192, 104, 16 (264 / 3 apart), labelled 0, 0.1, 1,
  // 10 (4 px below the line).
  EXPECT_THAT(svg, HasSubstr("y=\"284\" text-anchor=\"end\">0</text>"));
  EXPECT_THAT(svg, HasSubstr("y=\"196\" text-anchor=\"end\">0.1</text>"));
  EXPECT_THAT(svg, HasSubstr("y=\"108\" text-anchor=\"end\">1</text>"));
  EXPECT_THAT(svg, HasSubstr("y=\"20\" text-anchor=\"end\">10</text>"));
  EXPECT_THAT(svg, Not(HasSubstr(">0.01</text>")));  // the floor is 0, not a silent 1e-2
  // The zero: on the floor, hollow, its tooltip the true value.
  EXPECT_THAT(svg, HasSubstr("<circle cx=\"64\" cy=\"280\" r=\"4\" fill=\"#fff\" "
                             "stroke=\"#4f7cc9\" stroke-width=\"1.5\"><title>blocks.0.up: "
                             "cpu:bf16:fused, bound_ratio 0</title></circle>"));
  // 0.5: 16 + 264 * (1 - (log10 0.5 + 2) / 3) = 130.4906; 4: 51.0187;
  // the threshold 3: 62.0133.
  EXPECT_THAT(svg, HasSubstr("<circle cx=\"472\" cy=\"130.491\" r=\"4\" fill=\"#4f7cc9\""));
  EXPECT_THAT(svg, HasSubstr("<circle cx=\"880\" cy=\"51.0187\" r=\"4\" fill=\"#2da44e\""));
  EXPECT_THAT(svg, HasSubstr("y1=\"62.0133\" y2=\"62.0133\" stroke=\"#cf222e\""));
  // The legend: the configurations, then what the floor means.
  EXPECT_THAT(svg, HasSubstr(">cpu:bf16:fused</text>"));
  EXPECT_THAT(svg, HasSubstr(">cpu:bf16:unfused</text>"));
  EXPECT_THAT(svg, HasSubstr("<circle cx=\"70\" cy=\"370\" r=\"5\" fill=\"#fff\" "
                             "stroke=\"#57606a\" stroke-width=\"1.5\"/><text x=\"82\" y=\"374\">"
                             "0 (bit-exact) shown at the floor</text>"));
  EXPECT_THAT(svg, HasSubstr("viewBox=\"0 0 900 386\""));  // 320 + 3 legend rows of 22
  // The first divergence at the right edge: its label, 42 characters,
  // turns to the left of the ring.
  EXPECT_THAT(svg, HasSubstr("<text x=\"868\" y=\"43.0187\" text-anchor=\"end\" "
                             "fill=\"#cf222e\">first divergence: blocks.2.mlp.down_proj#1</text>"));
  ExpectTextInsideEverySvg(svg);
}

TEST(BoundRatioSvgTest, InfinitySitsOnTheTopLineAndNaNIsLeftOut) {
  const double inf = std::numeric_limits<double>::infinity();
  const std::string svg = BoundRatioSvg(
      {{0, inf, "a", "l0"}, {1, 2.0, "a", "l1"}, {2, kNaN, "a", "l2"}}, 3, 3.0, std::nullopt);
  // Decades of 2 .. 3: 1 .. 10, no floor of zeros.
  EXPECT_THAT(svg, HasSubstr("<circle cx=\"64\" cy=\"16\" r=\"4\" fill=\"#fff\""));
  EXPECT_THAT(svg, HasSubstr(">inf shown at the top</text>"));
  EXPECT_THAT(svg, Not(HasSubstr("at the floor")));
  EXPECT_THAT(svg, HasSubstr("y=\"284\" text-anchor=\"end\">1</text>"));
  EXPECT_THAT(svg, Not(HasSubstr("l2")));
  EXPECT_THAT(svg, Not(HasSubstr("nan")));
  ExpectTextInsideEverySvg(svg);
}

}  // namespace
}  // namespace tensorcheck::cli
