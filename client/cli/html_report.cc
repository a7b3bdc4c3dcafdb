// The HTML page (declared in html_report.h): summary, ranking and
// configuration tables, then the charts of html_charts.cc for each
// comparison.
#include "client/cli/html_report.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/cli/internal/html_charts.h"
#include "client/cli/internal/report_format.h"
#include "core/share_format.h"
#include "proto/dtype_proto.h"

namespace tensorcheck::cli {

using internal::G;
using internal::G3;
using internal::HeadlineUlpCell;
using internal::HeatmapFigure;
using internal::HistogramSvg;
using internal::UlpText;

namespace {

template <typename Repeated>
std::string IndexText(const Repeated& idx) {
  return absl::StrCat("(", absl::StrJoin(idx, ", "), ")");
}

template <typename Repeated>
std::string CodeList(const Repeated& items) {
  std::vector<std::string> parts;
  for (const std::string& s : items)
    parts.push_back(absl::StrCat("<code>", HtmlEscape(s), "</code>"));
  return parts.empty() ? "none" : absl::StrJoin(parts, ", ");
}

// A returned output widened to doubles, or why it cannot be.
absl::StatusOr<std::vector<double>> OutputValues(const pb::ConfigResult& c) {
  if (!c.has_output() || c.output().source_case() != pb::Tensor::kData) {
    return absl::NotFoundError(absl::StrCat("the server returned no output for ", c.config()));
  }
  const std::optional<DType> d = DTypeFromProto(c.output().dtype());
  if (!d.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat("output of ", c.config(), ": unknown dtype"));
  }
  auto t = Tensor::FromBytes(*d, {c.output().shape().begin(), c.output().shape().end()},
                             c.output().data());
  if (!t.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("output of ", c.config(), ": ", t.status().message()));
  }
  std::vector<double> v(static_cast<size_t>(t->numel()));
  ToDouble(*t, v.data());
  return v;
}

const pb::ConfigResult* FindResult(const pb::VerifyResponse& r, const std::string& config) {
  for (const pb::ConfigResult& c : r.results()) {
    if (c.config() == config) return &c;
  }
  return nullptr;
}

constexpr const char kCss[] = R"(
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1f2328;
       background: #fff; box-sizing: border-box; width: 100%; max-width: 1800px;
       margin: 0 auto; padding: 16px 24px; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; }
h2 { font-size: 1.2em; border-bottom: 1px solid #d0d7de; padding-bottom: 4px; margin-top: 1.6em; }
p { max-width: 120ch; }
code { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size: 0.92em; }
table { border-collapse: collapse; font-size: 0.92em; }
th, td { border: 1px solid #d0d7de; padding: 3px 8px; }
th { background: #f6f8fa; text-align: left; white-space: nowrap; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.num { white-space: nowrap; }
tr.best td { background: #e6f4ea; font-weight: 600; }
tr.failed td { background: #ffebe9; }
tr.first td { font-weight: 600; }
tr.first td:first-child { box-shadow: inset 4px 0 #cf222e; }
dl.summary { display: grid; grid-template-columns: max-content auto; gap: 4px 16px; }
dl.summary dt { font-weight: 600; }
dl.summary dd { margin: 0; }
p.explanation { background: #f6f8fa; border-left: 4px solid #8c959f; padding: 8px 12px; }
.pass { color: #1a7f37; font-weight: 600; }
.fail { color: #cf222e; font-weight: 600; }
p.note { color: #57606a; font-size: 0.88em; }
figure { margin: 12px 0 24px 0; }
figcaption { font-weight: 600; margin-bottom: 6px; }
svg { max-width: 100%; height: auto; }
svg text { font-family: system-ui, sans-serif; font-size: 11px; fill: #1f2328; }
rect.bar { fill: #4f7cc9; }
span.shared { color: #57606a; font-size: 0.88em; }
p.verdict { font-size: 1.1em; padding: 10px 14px; border-left: 6px solid #8c959f;
            background: #f6f8fa; margin-bottom: 0.4em; }
p.headline { font-size: 1.25em; font-weight: 600; }
p.advice { padding: 2px 20px; margin-top: 0; }
p.verdict-rounding { border-color: #1a7f37; background: #e6f4ea; }
p.verdict-defect { border-color: #cf222e; background: #ffebe9; }
p.verdict-unexplained { border-color: #9a6700; background: #fff8c5; }
p.where { font-weight: 600; }
)";

// "yes" / "no", or a dash from a server that ran no plausibility test (it
// compared no elements and found nothing plausible).
std::string PlausibleCell(const pb::RankedCandidate& c) {
  if (c.plausible()) return "<span class=\"pass\">yes</span>";
  return c.compared_elements() > 0 ? "<span class=\"fail\">no</span>" : "&ndash;";
}

// "12 of 4096 (3.1 expected, p 0.02)": the plausibility test's evidence.
std::string DisagreementsCell(const pb::RankedCandidate& c) {
  if (c.compared_elements() == 0) return "&ndash;";
  return absl::StrCat(c.disagreements(), " of ", c.compared_elements(), " (",
                      G3(c.expected_disagreements()), " expected, p ", G3(c.plausibility_p()), ")");
}

// The ranking table, its note on shared GEMMs and the ruled-out list.
// Candidates that computed the same bits share one row, "A = B = C" (their
// statistics are identical); ranks count rows.
std::string RankingSection(const pb::Diagnosis& d) {
  std::string out = "<h2>Ranking</h2>\n";
  if (d.ranking_size() == 0) return out + "<p class=\"note\">No candidates were ranked.</p>\n";
  out +=
      "<table class=\"ranking\">\n<tr><th>rank</th><th>config</th><th>plausible</th>"
      "<th>bitwise-equal</th><th>max_ulp</th><th>mean_ulp</th><th>bound_ratio</th>"
      "<th>disagreements</th><th>GEMM shared with</th></tr>\n";
  const std::vector<internal::RankingRow> rows = internal::RankingRows(d);
  std::string ruled_out;
  for (size_t i = 0; i < rows.size(); ++i) {
    const internal::RankingRow& row = rows[i];
    const pb::RankedCandidate& c = *row.candidates[0];
    std::vector<std::string> names;
    std::vector<std::string> shared;
    bool best = false;
    for (const pb::RankedCandidate* m : row.candidates) {
      names.push_back(absl::StrCat("<code>", HtmlEscape(m->config()), "</code>"));
      best = best || (!d.best().empty() && m->config() == d.best());
      if (m->shared_computation().empty()) continue;
      const std::string gemm =
          absl::StrCat("<code>", HtmlEscape(m->shared_computation()), "</code>");
      // In a row of one the column says whose GEMM; in a row of several,
      // also which member reused it.
      shared.push_back(row.candidates.size() + row.unranked.size() == 1
                           ? gemm
                           : absl::StrCat("<code>", HtmlEscape(m->config()), "</code>: ", gemm));
    }
    for (const std::string& e : row.unranked) {
      names.push_back(absl::StrCat("<code>", HtmlEscape(e), "</code>"));
    }
    // A line breaks only before an "=", never inside "= name".
    const std::string config = absl::StrJoin(names, " =&nbsp;");
    absl::StrAppend(
        &out, "<tr", best ? " class=\"best\"" : "", "><td class=\"num\">", i + 1, "</td><td>",
        config, "</td><td>", PlausibleCell(c), "</td><td class=\"num\">",
        FormatShare(c.bitwise_equal_fraction()), "</td><td class=\"num\">", UlpText(c.max_ulp()),
        "</td><td class=\"num\">", G(c.mean_ulp()), "</td><td class=\"num\">",
        c.has_bound_ratio() ? G(c.bound_ratio().value()) : "&ndash;", "</td><td class=\"num\">",
        DisagreementsCell(c), "</td><td>", absl::StrJoin(shared, "<br>"), "</td></tr>\n");
    if (!c.ruled_out().empty()) {
      absl::StrAppend(&ruled_out, "<li>", i + 1, ". ", config, ": ", HtmlEscape(c.ruled_out()),
                      "</li>\n");
    }
  }
  out += "</table>\n";
  if (std::any_of(d.ranking().begin(), d.ranking().end(),
                  [](const pb::RankedCandidate& c) { return !c.shared_computation().empty(); })) {
    out +=
        "<p class=\"note\">A candidate with a shared GEMM multiplies the same operands in "
        "the same arithmetic as the one named on these inputs: that GEMM ran once, and only "
        "the candidate's own epilogue (bias, activation, output rounding) ran for it.</p>\n";
  }
  if (!ruled_out.empty()) {
    out += "<h3>Ruled out</h3>\n<ul class=\"ruled-out\">\n" + ruled_out + "</ul>\n";
  }
  return out;
}

// The answer first: the server's headline (the verdict in words) as a
// banner, and what to change under it when the server says; from a server
// that predates the headline, the verdict and its reason; nothing from one
// that predates the verdict too.
std::string VerdictBanner(const pb::Diagnosis& d) {
  const std::string name = internal::VerdictName(d.verdict());
  const std::string kind = name.empty() ? "" : absl::StrCat(" verdict-", name);
  if (!d.headline().empty()) {
    std::string out = absl::StrCat("<p class=\"verdict headline", kind, "\">",
                                   HtmlEscape(d.headline()), "</p>\n");
    if (!d.advice().empty()) {
      absl::StrAppend(&out, "<p class=\"advice\">", HtmlEscape(d.advice()), "</p>\n");
    }
    return out;
  }
  if (name.empty()) return "";
  return absl::StrCat(
      "<p class=\"verdict", kind, "\"><strong>Verdict: ", name, "</strong>",
      d.verdict_reason().empty() ? "" : absl::StrCat(" &mdash; ", HtmlEscape(d.verdict_reason())),
      "</p>\n");
}

// A number in running text: never broken across lines ("7.31945e-" over
// "05").
std::string Num(const std::string& text) {
  return absl::StrCat("<span class=\"num\">", text, "</span>");
}

// The page lists this many of a defect's columns, rows and elements each
// (a defect along a row can flag many columns); the JSON report has them
// all.
constexpr int kDefectRowsShown = 50;

// The defect: where to look, the columns and rows that rounding of best
// does not explain, and the elements beyond the threshold, largest first.
std::string DefectSection(const pb::Diagnosis& d) {
  if (!d.has_defect()) return "";
  const pb::Defect& f = d.defect();
  std::string out;
  if (!f.where_to_look().empty()) {
    absl::StrAppend(&out, "<p class=\"where\">Where to look: ", HtmlEscape(f.where_to_look()),
                    "</p>\n");
  }
  int more = 0;
  if (f.columns_size() + f.rows_size() > 0) {
    out +=
        "<p class=\"note\">Columns and rows holding more disagreements with the best "
        "candidate than its rounding allows (p: the chance of at least that many under "
        "rounding, times the groups tested).</p>\n<table class=\"defect\">\n<tr><th>group</th>"
        "<th>disagreements</th><th>expected</th><th>p</th><th>beyond threshold</th>"
        "<th>max_ulp</th><th>max_sigma</th></tr>\n";
    auto add = [&](const char* kind,
                   const google::protobuf::RepeatedPtrField<pb::DefectGroup>& gs) {
      for (int i = 0; i < gs.size(); ++i) {
        if (i == kDefectRowsShown) {
          more += gs.size() - kDefectRowsShown;
          break;
        }
        const pb::DefectGroup& g = gs[i];
        absl::StrAppend(&out, "<tr><td>", kind, " ", g.index(), "</td><td class=\"num\">",
                        g.disagreements(), "</td><td class=\"num\">",
                        G3(g.expected_disagreements()), "</td><td class=\"num\">", G3(g.p_value()),
                        "</td><td class=\"num\">", g.beyond_threshold(), "</td><td class=\"num\">",
                        UlpText(g.max_ulp()), "</td><td class=\"num\">", G(g.max_sigma()),
                        "</td></tr>\n");
      }
    };
    add("column", f.columns());
    add("row", f.rows());
    out += "</table>\n";
  }
  if (f.element_count() > 0 || f.elements_size() > 0) {
    absl::StrAppend(&out, "<p class=\"note\">Elements beyond ", Num(G(f.element_threshold_sigma())),
                    " predicted standard errors of another summation order (false-alarm rate ",
                    Num(G(f.false_alarm_rate())), "): ", f.element_count(), "; the farthest is ",
                    Num(UlpText(f.max_ulp())), " ULP, ", Num(G(f.max_sigma())),
                    " sigma from the best candidate.</p>\n");
  }
  if (f.elements_size() > 0) {
    out +=
        "<table class=\"defect-elements\">\n<tr><th>index</th><th>observed</th><th>best</th>"
        "<th>abs_diff</th><th>ulp</th><th>sigma</th></tr>\n";
    for (int i = 0; i < f.elements_size(); ++i) {
      if (i == kDefectRowsShown) {
        more += f.elements_size() - kDefectRowsShown;
        break;
      }
      const pb::DefectElement& de = f.elements(i);
      const pb::Element& e = de.element();
      absl::StrAppend(&out, "<tr><td>", IndexText(e.index()), "</td><td class=\"num\">",
                      G(e.actual()), "</td><td class=\"num\">", G(e.expected()),
                      "</td><td class=\"num\">", G(e.abs_diff()), "</td><td class=\"num\">",
                      UlpText(e.ulp()), "</td><td class=\"num\">", G(de.sigma()), "</td></tr>\n");
    }
    out += "</table>\n";
  }
  if (out.empty()) return "";
  if (more > 0) {
    absl::StrAppend(&out, "<p class=\"note\">", more, " more rows in the JSON report.</p>\n");
  }
  return "<h2>Defect</h2>\n" + out;
}

// One histogram and heatmap pair: `actual` against `expected`.
struct Comparison {
  std::string title;
  const pb::Stats* stats = nullptr;  // histogram source, may be null
  // Heatmap operands: the observed tensor (nullptr: `actual_result`) and a
  // returned output.
  bool actual_is_observed = false;
  const pb::ConfigResult* actual_result = nullptr;
  const pb::ConfigResult* expected_result = nullptr;
};

}  // namespace

std::string HtmlEscape(absl::string_view s) { return MarkupEscape(s, /*escape_whitespace=*/false); }

std::string HeatmapCandidate(const pb::VerifyResponse& r) {
  const pb::Diagnosis& d = r.diagnosis();
  if (!d.best().empty()) return d.best();
  return d.ranking_size() > 0 ? d.ranking(0).config() : "";
}

void KeepDrawnOutputs(pb::VerifyResponse* r, const ReportContext& ctx, bool has_observed) {
  // Without an observed output every configuration is drawn against the
  // reference: all outputs stay.
  if (!has_observed && !r->has_observed_vs_reference()) return;
  const std::string heat = ctx.command == "diagnose" ? HeatmapCandidate(*r) : "";
  for (pb::ConfigResult& c : *r->mutable_results()) {
    if (heat.empty() || c.config() != heat) c.clear_output();
  }
}

std::string HtmlStyleSheet() { return kCss; }

std::string FormatHtml(const pb::VerifyResponse& r, const ReportContext& ctx,
                       const Tensor* observed, const HtmlOptions& options) {
  std::string out =
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  absl::StrAppend(&out, "<title>tensorcheck ", HtmlEscape(ctx.command), " report</title>\n");
  absl::StrAppend(&out, "<style>", kCss, "</style>\n</head>\n<body>\n");
  absl::StrAppend(&out, "<h1>tensorcheck ", HtmlEscape(ctx.command), "</h1>\n");
  out += FormatHtmlSection(r, ctx, observed, options);
  out += "<p class=\"note\">Written by the tensorcheck CLI; this page is self-contained.</p>\n";
  out += "</body>\n</html>\n";
  return out;
}

std::string FormatHtmlSection(const pb::VerifyResponse& r, const ReportContext& ctx,
                              const Tensor* observed, const HtmlOptions& options) {
  const bool diagnose = ctx.command == "diagnose";
  const bool has_observed = r.has_observed_vs_reference() || observed != nullptr;
  const std::string ref_name = r.has_reference() && !r.reference().config().empty()
                                   ? r.reference().config()
                                   : "the reference";
  std::string out;

  // ---- the answer, then the summary
  if (diagnose || r.has_diagnosis()) out += VerdictBanner(r.diagnosis());
  out += "<h2>Summary</h2>\n<dl class=\"summary\">\n";
  std::string heat_config;  // the candidate the first heatmap compares with
  bool heat_is_best = false;
  if (diagnose) {
    const pb::Diagnosis& d = r.diagnosis();
    if (d.best().empty()) {
      out +=
          "<dt>Best</dt><dd><span class=\"fail\">none</span>: no candidate explains the "
          "output</dd>\n";
    } else {
      absl::StrAppend(&out, "<dt>Best</dt><dd><code class=\"pass\">", HtmlEscape(d.best()),
                      "</code></dd>\n");
      absl::StrAppend(&out, "<dt>Confidence</dt><dd>", absl::StrFormat("%.2f", d.confidence()),
                      "</dd>\n");
    }
    // Under a headline the verdict's own sentence stays in the summary.
    const std::string verdict = internal::VerdictName(d.verdict());
    if (!d.headline().empty() && !verdict.empty()) {
      absl::StrAppend(&out, "<dt>Verdict</dt><dd>", verdict,
                      d.verdict_reason().empty()
                          ? ""
                          : absl::StrCat(" &mdash; ", HtmlEscape(d.verdict_reason())),
                      "</dd>\n");
    }
    absl::StrAppend(&out, "<dt>Equivalent</dt><dd>", CodeList(d.equivalent()), "</dd>\n");
    absl::StrAppend(&out, "<dt>Tied</dt><dd>", CodeList(d.tied()), "</dd>\n");
    if (!d.framework_hint().empty()) {
      absl::StrAppend(&out, "<dt>Framework hint</dt><dd>", HtmlEscape(d.framework_hint()),
                      "</dd>\n");
    }
    heat_config = HeatmapCandidate(r);
    heat_is_best = !d.best().empty();
  } else {
    const bool pass = r.verdict() == pb::VERDICT_PASS;
    absl::StrAppend(
        &out, "<dt>Verdict</dt><dd>",
        r.verdict() == pb::VERDICT_UNSPECIFIED
            ? "<span class=\"fail\">none</span>"
            : absl::StrCat("<span class=\"", pass ? "pass\">PASS" : "fail\">FAIL", "</span>"),
        "</dd>\n");
  }
  // Acceptance (VerifyRequest.accept): verify diagnoses only with it.
  if (r.has_diagnosis() && (!diagnose || r.diagnosis().accepted())) {
    const pb::Diagnosis& d = r.diagnosis();
    absl::StrAppend(
        &out, "<dt>Accepted</dt><dd>",
        d.accepted() ? "<span class=\"pass\">yes</span>" : "<span class=\"fail\">no</span>",
        d.accepted_as().empty()
            ? ""
            : absl::StrCat(", as <code>", HtmlEscape(d.accepted_as()), "</code>"),
        "</dd>\n");
  }
  absl::StrAppend(&out, "<dt>Reference</dt><dd><code>", HtmlEscape(ref_name), "</code></dd>\n");
  if (r.output_shape_size() > 0) {
    absl::StrAppend(&out, "<dt>Output shape</dt><dd>[", absl::StrJoin(r.output_shape(), ", "),
                    "]</dd>\n");
  }
  if (r.has_observed_vs_reference()) {
    const pb::Stats& s = r.observed_vs_reference();
    absl::StrAppend(&out, "<dt>Observed vs reference</dt><dd>",
                    s.passed() ? "<span class=\"pass\">within tolerance</span>"
                               : "<span class=\"fail\">not within tolerance</span>",
                    ": mismatched ", Num(absl::StrCat(s.mismatched(), " / ", s.total())),
                    ", max_abs ", Num(G(s.max_abs())), ", max_ulp ", Num(HeadlineUlpCell(s)),
                    ", bitwise-equal ", Num(FormatShare(s.bitwise_equal_count(), s.total())),
                    "</dd>\n");
  }
  out += "</dl>\n";
  if (diagnose && !r.diagnosis().explanation().empty()) {
    absl::StrAppend(&out, "<p class=\"explanation\">", HtmlEscape(r.diagnosis().explanation()),
                    "</p>\n");
  }

  // ---- tables
  if (diagnose) {
    const pb::Diagnosis& d = r.diagnosis();
    out += DefectSection(d);
    out += RankingSection(d);
    const pb::Localization& loc = d.localization();
    if (loc.outliers_size() > 0) {
      out +=
          "<h2>Outliers</h2>\n<p class=\"note\">Elements that disagree with the best "
          "candidate far beyond its error model.</p>\n<table>\n<tr><th>index</th>"
          "<th>observed</th><th>candidate</th><th>abs_diff</th><th>ulp</th></tr>\n";
      for (const pb::Element& e : loc.outliers()) {
        absl::StrAppend(&out, "<tr><td>", IndexText(e.index()), "</td><td class=\"num\">",
                        G(e.actual()), "</td><td class=\"num\">", G(e.expected()),
                        "</td><td class=\"num\">", G(e.abs_diff()), "</td><td class=\"num\">",
                        UlpText(e.ulp()), "</td></tr>\n");
      }
      out += "</table>\n";
    }
  }
  if (r.results_size() > 0) {
    absl::StrAppend(&out, "<h2>Configurations</h2>\n<p class=\"note\">Compared with ",
                    has_observed ? "the observed output" : HtmlEscape(ref_name), ".</p>\n");
    out +=
        "<table class=\"configs\">\n<tr><th>config</th><th>pass</th><th>mismatched</th>"
        "<th>max_abs</th><th>max_ulp</th><th>mean_ulp</th><th>bitwise-equal</th>"
        "<th>bound_ratio</th><th>elapsed</th></tr>\n";
    for (const pb::ConfigResult& c : r.results()) {
      const pb::Stats& s = has_observed && c.has_vs_observed() ? c.vs_observed() : c.vs_reference();
      absl::StrAppend(
          &out, "<tr><td><code>", HtmlEscape(c.config()), "</code>",
          // Under the name: the note is words, and the number cells never wrap.
          c.shared_computation().empty()
              ? ""
              : absl::StrCat("<br><span class=\"shared\">epilogue only; GEMM shared with <code>",
                             HtmlEscape(c.shared_computation()), "</code></span>"),
          "</td><td>", s.passed() ? "yes" : "no", "</td><td class=\"num\">", s.mismatched(), " / ",
          s.total(), "</td><td class=\"num\">", G(s.max_abs()), "</td><td class=\"num\">",
          HeadlineUlpCell(s), "</td><td class=\"num\">", G(s.mean_ulp()), "</td><td class=\"num\">",
          FormatShare(s.bitwise_equal_count(), s.total()), "</td><td class=\"num\">",
          s.has_bound_ratio() ? G(s.bound_ratio().value()) : "&ndash;", "</td><td class=\"num\">",
          absl::StrFormat("%.1f ms", c.elapsed_ms()), "</td></tr>\n");
    }
    out += "</table>\n";
  }

  // ---- comparisons: histograms and heatmaps
  std::vector<Comparison> comparisons;
  const pb::ConfigResult* reference = r.has_reference() ? &r.reference() : nullptr;
  if (diagnose) {
    if (!heat_config.empty()) {
      Comparison c;
      c.title = absl::StrCat("observed vs ", heat_is_best ? "best" : "closest", " candidate ",
                             heat_config, heat_is_best ? "" : " (which does not explain it)");
      c.actual_result = FindResult(r, heat_config);
      c.stats = c.actual_result != nullptr && c.actual_result->has_vs_observed()
                    ? &c.actual_result->vs_observed()
                    : nullptr;
      c.actual_is_observed = true;
      c.expected_result = c.actual_result;
      comparisons.push_back(std::move(c));
    }
  }
  if (has_observed) {
    Comparison c;
    c.title = absl::StrCat("observed vs reference ", ref_name);
    c.stats = r.has_observed_vs_reference() ? &r.observed_vs_reference() : nullptr;
    c.actual_is_observed = true;
    c.expected_result = reference;
    comparisons.push_back(std::move(c));
  } else {
    for (const pb::ConfigResult& res : r.results()) {
      Comparison c;
      c.title = absl::StrCat(res.config(), " vs reference ", ref_name);
      c.stats = res.has_vs_reference() ? &res.vs_reference() : nullptr;
      c.actual_result = &res;
      c.expected_result = reference;
      comparisons.push_back(std::move(c));
    }
  }

  out += "<h2>ULP histograms</h2>\n";
  if (comparisons.empty()) out += "<p class=\"note\">Nothing was compared.</p>\n";
  for (const Comparison& c : comparisons) {
    if (c.stats == nullptr) {
      absl::StrAppend(&out, "<p class=\"note\">", HtmlEscape(c.title),
                      ": no statistics in the response.</p>\n");
      continue;
    }
    out += HistogramSvg(*c.stats, absl::StrCat("ULP distance, ", c.title));
  }

  out += "<h2>Heatmaps</h2>\n";
  std::vector<double> observed_values;
  if (observed != nullptr) {
    observed_values.resize(static_cast<size_t>(observed->numel()));
    ToDouble(*observed, observed_values.data());
  }
  std::vector<int64_t> shape(r.output_shape().begin(), r.output_shape().end());
  if (shape.empty() && observed != nullptr) shape = observed->shape();
  const auto [rows, cols] = MatrixView(shape);
  int shown = 0;
  for (const Comparison& c : comparisons) {
    const std::string title = absl::StrCat("|", c.title, "|");
    if (shown >= options.max_heatmaps) {
      absl::StrAppend(&out, "<p class=\"note\">", HtmlEscape(title), ": left out (at most ",
                      options.max_heatmaps, " heatmaps per page).</p>\n");
      continue;
    }
    std::string why;
    std::vector<double> actual_buffer;
    const std::vector<double>* actual = nullptr;
    if (c.actual_is_observed) {
      if (observed == nullptr) why = "the observed output is not available";
      actual = &observed_values;
    } else if (c.actual_result == nullptr) {
      why = "no result for this configuration";
    } else {
      auto v = OutputValues(*c.actual_result);
      if (v.ok()) {
        actual_buffer = *std::move(v);
        actual = &actual_buffer;
      } else {
        why = std::string(v.status().message());
      }
    }
    std::vector<double> expected;
    if (why.empty()) {
      if (c.expected_result == nullptr) {
        why = "no output to compare with";
      } else {
        auto v = OutputValues(*c.expected_result);
        if (v.ok()) {
          expected = *std::move(v);
        } else {
          why = std::string(v.status().message());
        }
      }
    }
    absl::StatusOr<AbsDiffGrid> grid = absl::InternalError("unset");
    if (why.empty()) {
      grid = MaxPoolAbsDiff(*actual, expected, rows, cols, options.max_heatmap_cells);
      if (!grid.ok()) why = std::string(grid.status().message());
    }
    if (!why.empty()) {
      absl::StrAppend(&out, "<p class=\"note\">", HtmlEscape(title), ": no heatmap (",
                      HtmlEscape(why), ").</p>\n");
      continue;
    }
    out += HeatmapFigure(*grid, title, options.first_heatmap_id + shown);
    ++shown;
  }

  if (r.notes_size() > 0) {
    out += "<h2>Notes</h2>\n<ul>\n";
    for (const std::string& n : r.notes()) absl::StrAppend(&out, "<li>", HtmlEscape(n), "</li>\n");
    out += "</ul>\n";
  }
  return out;
}

}  // namespace tensorcheck::cli
