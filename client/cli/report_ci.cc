// The reports for CI (declared in report.h): JUnit XML and GitHub Actions
// annotations and step summary, with the escaping each needs.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/cli/internal/report_format.h"
#include "client/cli/report.h"
#include "core/share_format.h"

namespace tensorcheck::cli {

using internal::G;
using internal::Headline;
using internal::HeadlineUlpCell;
using internal::kDefectListed;
using internal::kRuledOutListed;
using internal::PlausibleText;
using internal::RankingRow;
using internal::RankingRows;
using internal::ReferenceName;
using internal::StatsSummaryLine;
using internal::StatusWord;
using internal::ToleranceText;
using internal::UlpText;

std::string MarkupEscape(absl::string_view s, bool escape_whitespace) {
  std::string out;
  out.reserve(s.size());
  for (const char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";  // &apos; is not HTML 4; the numeric form is both.
        break;
      case '\n':
      case '\r':
      case '\t':
        if (escape_whitespace) {
          absl::StrAppend(&out, "&#", static_cast<int>(c), ";");
        } else if (c != '\r') {
          out.push_back(ch);
        }
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          out += "\xef\xbf\xbd";  // U+FFFD: XML 1.0 forbids these.
        } else {
          out.push_back(ch);
        }
    }
  }
  return out;
}

std::string XmlEscape(absl::string_view s) { return MarkupEscape(s, /*escape_whitespace=*/true); }

std::string FormatJUnit(const pb::VerifyResponse& r, const ReportContext& ctx) {
  const std::vector<Outcome> outcomes = Outcomes(r, ctx);
  int failures = 0;
  double total = 0;
  for (const Outcome& o : outcomes) {
    failures += o.failed ? 1 : 0;
    total += o.seconds;
  }
  const std::string suite = absl::StrCat("tensorcheck.", ctx.command);
  std::string out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  absl::StrAppend(&out, "<testsuites name=\"tensorcheck\" tests=\"", outcomes.size(),
                  "\" failures=\"", failures, "\" errors=\"0\" time=\"",
                  absl::StrFormat("%.6f", total), "\">\n");
  absl::StrAppend(&out, "  <testsuite name=\"", XmlEscape(suite), "\" tests=\"", outcomes.size(),
                  "\" failures=\"", failures, "\" errors=\"0\" skipped=\"0\" time=\"",
                  absl::StrFormat("%.6f", total), "\">\n");
  for (const Outcome& o : outcomes) {
    absl::StrAppend(&out, "    <testcase classname=\"", XmlEscape(suite), "\" name=\"",
                    XmlEscape(o.name), "\" time=\"", absl::StrFormat("%.6f", o.seconds), "\">\n");
    if (o.failed) {
      absl::StrAppend(&out, "      <failure type=\"ParityFailure\" message=\"",
                      XmlEscape(o.summary), "\">", XmlEscape(o.details), "</failure>\n");
    } else {
      absl::StrAppend(&out, "      <system-out>", XmlEscape(o.details), "</system-out>\n");
    }
    out += "    </testcase>\n";
  }
  out += "  </testsuite>\n</testsuites>\n";
  return out;
}

std::string GithubEscapeData(absl::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '%':
        out += "%25";
        break;
      case '\r':
        out += "%0D";
        break;
      case '\n':
        out += "%0A";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

std::string GithubEscapeProperty(absl::string_view s) {
  std::string out;
  for (char c : GithubEscapeData(s)) {
    switch (c) {
      case ':':
        out += "%3A";
        break;
      case ',':
        out += "%2C";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

std::string FormatGithubAnnotations(const pb::VerifyResponse& r, const ReportContext& ctx) {
  std::string out;
  const std::string title = absl::StrCat("tensorcheck ", ctx.command);
  for (const Outcome& o : Outcomes(r, ctx)) {
    if (!o.failed && !o.warning) continue;
    absl::StrAppend(&out, o.failed ? "::error" : "::warning",
                    " title=", GithubEscapeProperty(title + ": " + o.name),
                    "::", GithubEscapeData(o.details), "\n");
  }
  const int code = ExitCodeFor(r, ctx);
  std::string overall;
  if (ctx.command == "diagnose" || r.has_diagnosis()) {
    const pb::Diagnosis& d = r.diagnosis();
    // The server's answer first, then the status word and the best match.
    const std::string headline = Headline(d);
    if (!headline.empty()) absl::StrAppend(&overall, headline, "\n");
    if (!d.advice().empty()) absl::StrAppend(&overall, "Advice: ", d.advice(), "\n");
    absl::StrAppend(&overall, StatusWord(code == 0), ": ",
                    d.best().empty() ? "no candidate configuration explains the observed output"
                                     : absl::StrCat("best match ", d.best(), " (confidence ",
                                                    absl::StrFormat("%.2f", d.confidence()), ")"));
    if (d.accepted()) absl::StrAppend(&overall, ", accepted as ", d.accepted_as());
    if (!d.explanation().empty()) absl::StrAppend(&overall, "\n", d.explanation());
  } else {
    overall = absl::StrCat(StatusWord(code == 0), " (reference ", ReferenceName(r), ", tolerance ",
                           ToleranceText(r.tolerance()), ")");
    if (r.has_observed_vs_reference()) {
      absl::StrAppend(&overall,
                      "\nobserved vs reference: ", StatsSummaryLine(r.observed_vs_reference()));
    }
  }
  // The failures are annotated above; this line is the overall result.
  absl::StrAppend(&out, "::notice title=", GithubEscapeProperty(title),
                  "::", GithubEscapeData(overall), "\n");
  return out;
}

namespace {
std::string Md(absl::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '|':
        out += "\\|";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '\n':
      case '\r':
        out += ' ';
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

// The names of one ranking row as code, "`A` = `B` = `C`"; `with_shared`
// adds " (GEMM of `X`)" after each candidate that reused another's GEMM.
std::string RowNamesMd(const RankingRow& row, bool with_shared) {
  std::vector<std::string> names;
  for (const pb::RankedCandidate* c : row.candidates) {
    std::string name = absl::StrCat("`", Md(c->config()), "`");
    if (with_shared && !c->shared_computation().empty()) {
      absl::StrAppend(&name, " (GEMM of `", Md(c->shared_computation()), "`)");
    }
    names.push_back(std::move(name));
  }
  for (const std::string& e : row.unranked) names.push_back(absl::StrCat("`", Md(e), "`"));
  return absl::StrJoin(names, " = ");
}

// The defect's evidence: where to look, then the columns and rows rounding
// does not explain (the first kDefectListed of each).
std::string DefectMd(const pb::Defect& f) {
  std::string out;
  if (!f.where_to_look().empty())
    absl::StrAppend(&out, "Where to look: ", Md(f.where_to_look()), "\n\n");
  if (f.columns_size() + f.rows_size() == 0) return out;
  out +=
      "| not rounding | disagreements | expected | p | beyond threshold | max_ulp | max_sigma |\n";
  out += "|---|---:|---:|---:|---:|---:|---:|\n";
  int more = 0;
  auto rows = [&](const char* kind, const google::protobuf::RepeatedPtrField<pb::DefectGroup>& gs) {
    more += std::max(gs.size() - kDefectListed, 0);
    for (int i = 0; i < std::min(gs.size(), kDefectListed); ++i) {
      const pb::DefectGroup& g = gs[i];
      absl::StrAppend(&out, "| ", kind, " ", g.index(), " | ", g.disagreements(), " | ",
                      G(g.expected_disagreements()), " | ", G(g.p_value()), " | ",
                      g.beyond_threshold(), " | ", UlpText(g.max_ulp()), " | ", G(g.max_sigma()),
                      " |\n");
    }
  };
  rows("column", f.columns());
  rows("row", f.rows());
  if (more > 0) absl::StrAppend(&out, "\n_", more, " more in the JSON report._\n");
  return out + "\n";
}
}  // namespace

std::string FormatGithubSummary(const pb::VerifyResponse& r, const ReportContext& ctx) {
  const int code = ExitCodeFor(r, ctx);
  std::string out;
  if (ctx.command == "diagnose" || r.has_diagnosis()) {
    const pb::Diagnosis& d = r.diagnosis();
    // The status word, then the server's answer in words first.
    absl::StrAppend(&out, "## tensorcheck ", ctx.command, ": **", StatusWord(code == 0), "**\n\n");
    if (!Headline(d).empty()) absl::StrAppend(&out, "**", Md(Headline(d)), "**\n\n");
    if (!d.advice().empty()) absl::StrAppend(&out, "Advice: ", Md(d.advice()), "\n\n");
    absl::StrAppend(&out, "Best match: ",
                    d.best().empty() ? "none (no configuration explains the observed output)"
                                     : absl::StrCat("`", Md(d.best()), "` (confidence ",
                                                    absl::StrFormat("%.2f", d.confidence()), ")"),
                    d.accepted() ? absl::StrCat(", accepted as `", Md(d.accepted_as()), "`") : "",
                    "\n\n");
    const std::string verdict = internal::VerdictName(d.verdict());
    if (!verdict.empty()) {
      // The word in bold, then the server's sentence (U+2014, em dash)
      // unless the lead above already is it (a server without headlines).
      const bool reason = !d.verdict_reason().empty() && !d.headline().empty();
      absl::StrAppend(&out, "Verdict: **", verdict, "**",
                      reason ? absl::StrCat(" \xe2\x80\x94 ", Md(d.verdict_reason())) : "", "\n\n");
    }
    if (d.has_defect()) out += DefectMd(d.defect());
    if (!d.framework_hint().empty()) absl::StrAppend(&out, "_", Md(d.framework_hint()), "_\n\n");
    if (!d.explanation().empty()) absl::StrAppend(&out, Md(d.explanation()), "\n\n");
    out += "| rank | config | plausible | bitwise-equal | max_ulp | mean_ulp | bound_ratio |\n";
    out += "|---:|---|---|---:|---:|---:|---:|\n";
    // Candidates that computed the same bits share one row: "`A` = `B`".
    const std::vector<RankingRow> rows = RankingRows(d);
    for (size_t i = 0; i < rows.size(); ++i) {
      const pb::RankedCandidate& c = *rows[i].candidates[0];
      absl::StrAppend(&out, "| ", i + 1, " | ", RowNamesMd(rows[i], /*with_shared=*/true), " | ",
                      PlausibleText(c), " | ", FormatShare(c.bitwise_equal_fraction()), " | ",
                      UlpText(c.max_ulp()), " | ", G(c.mean_ulp()), " | ",
                      c.has_bound_ratio() ? G(c.bound_ratio().value()) : "-", " |\n");
    }
    bool any_ruled_out = false;
    for (size_t i = 0; i < std::min(rows.size(), static_cast<size_t>(kRuledOutListed)); ++i) {
      const pb::RankedCandidate& c = *rows[i].candidates[0];
      if (c.ruled_out().empty()) continue;
      if (!any_ruled_out) out += "\nRuled out:\n\n";
      any_ruled_out = true;
      absl::StrAppend(&out, "- ", RowNamesMd(rows[i], /*with_shared=*/false), ": ",
                      Md(c.ruled_out()), "\n");
    }
    return out + "\n";
  }
  absl::StrAppend(&out, "## tensorcheck verify: **", StatusWord(code == 0), "**\n\n");
  absl::StrAppend(&out, "Reference `", Md(ReferenceName(r)), "`, tolerance ",
                  Md(ToleranceText(r.tolerance())), "\n\n");
  if (r.has_observed_vs_reference()) {
    absl::StrAppend(&out, "Observed output vs reference: ",
                    Md(StatsSummaryLine(r.observed_vs_reference())), "\n\n");
  }
  out += "| config | pass | mismatched | max_abs | max_ulp | bitwise-equal | elapsed |\n";
  out += "|---|---|---:|---:|---:|---:|---:|\n";
  for (const pb::ConfigResult& c : r.results()) {
    const pb::Stats& s =
        r.has_observed_vs_reference() && c.has_vs_observed() ? c.vs_observed() : c.vs_reference();
    absl::StrAppend(&out, "| `", Md(c.config()), "` | ", s.passed() ? "yes" : "no", " | ",
                    s.mismatched(), " / ", s.total(), " | ", G(s.max_abs()), " | ",
                    HeadlineUlpCell(s), " | ", FormatShare(s.bitwise_equal_count(), s.total()),
                    " | ", absl::StrFormat("%.1f ms", c.elapsed_ms()),
                    c.shared_computation().empty()
                        ? ""
                        : absl::StrCat(" (epilogue; GEMM of `", Md(c.shared_computation()), "`)"),
                    " |\n");
  }
  if (r.has_observed_vs_reference()) {
    out += "\n_Rows compare each configuration with the observed output._\n";
  }
  return out + "\n";
}

}  // namespace tensorcheck::cli
