// What every report derives from: the numpy-style closeness message, the
// list of Outcomes and the exit code. The formats are report_json.cc,
// report_text.cc and report_ci.cc (JUnit XML, GitHub Actions); the HTML
// page is html_report.cc.
#include "client/cli/report.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cli/internal/report_format.h"
#include "core/share_format.h"

namespace tensorcheck::cli {

using internal::DTypeJson;
using internal::G;
using internal::Headline;
using internal::HeadlineUlp;
using internal::IndexText;
using internal::OneLine;
using internal::ReferenceName;
using internal::StatsSummaryLine;
using internal::StatusWord;
using internal::UlpText;
using internal::VerdictWarns;

std::string ClosenessMessage(const pb::Stats& s, const pb::Tolerance& t) {
  std::string out = s.passed() ? "Tensor-likes are close.\n\n" : "Tensor-likes are not close!\n\n";
  absl::StrAppend(&out, "Mismatched elements: ", s.mismatched(), " / ", s.total(), " (",
                  FormatShare(s.mismatched(), s.total()), ")\n");
  const bool ulp = t.preset() == pb::Tolerance::PRESET_ULP;
  const bool bound = t.preset() == pb::Tolerance::PRESET_BOUND;
  absl::StrAppend(&out, "Greatest absolute difference: ", G(s.max_abs()), " at index ",
                  IndexText(s.max_abs_index()));
  if (!ulp && !bound && t.has_atol()) {
    absl::StrAppend(&out, " (up to ", G(t.atol().value()), " allowed)");
  }
  absl::StrAppend(&out, "\nGreatest relative difference: ", G(s.max_rel()), " at index ",
                  IndexText(s.max_rel_index()));
  if (!ulp && !bound && t.has_rtol()) {
    absl::StrAppend(&out, " (up to ", G(t.rtol().value()), " allowed)");
  }
  // A ULP tolerance judged every element: its figure is the one shown.
  absl::StrAppend(&out, "\nGreatest ULP distance: ", UlpText(ulp ? s.max_ulp() : HeadlineUlp(s)));
  if (ulp) absl::StrAppend(&out, " (up to ", t.max_ulp(), " allowed)");
  if (s.compared_dtype() != pb::DTYPE_UNSPECIFIED) {
    absl::StrAppend(&out, " in ", DTypeJson(s.compared_dtype()).get<std::string>());
  }
  if (!ulp && s.has_negligible()) absl::StrAppend(&out, ", ", s.negligible().note());
  if (s.has_bound_ratio()) {
    absl::StrAppend(&out, "\nError / predicted error (",
                    s.bound_precision().empty() ? "error model" : s.bound_precision(),
                    "): ", G(s.bound_ratio().value()));
    if (bound) out += " (each element within its bound allowed)";
  }
  if (s.nan_mismatch() > 0) {
    absl::StrAppend(&out, "\nElements where exactly one side is NaN: ", s.nan_mismatch());
  }
  return out;
}

std::vector<Outcome> Outcomes(const pb::VerifyResponse& r, const ReportContext& ctx) {
  std::vector<Outcome> out;
  const std::string ref = ReferenceName(r);
  // diagnose, and verify with --accept (it diagnoses too): the diagnosis
  // decides, the tolerance's comparison is informational.
  const bool diagnosis = ctx.command == "diagnose" || r.has_diagnosis();
  if (diagnosis) {
    Outcome o;
    o.name = "diagnosis";
    const pb::Diagnosis& d = r.diagnosis();
    o.failed = ExitCodeFor(r, ctx) != 0;
    const std::string best =
        d.best().empty()
            ? "No candidate configuration explains the observed output."
            : absl::StrCat("Best match: ", d.best(), " (confidence ", G(d.confidence()), ")");
    // The server's answer first, as the text report shows it.
    const std::string headline = Headline(d);
    o.summary = headline.empty() ? best : OneLine(headline);
    o.details = headline.empty() ? "" : headline + "\n";
    if (!d.advice().empty()) absl::StrAppend(&o.details, "Advice: ", d.advice(), "\n");
    if (!ctx.accept.empty()) {
      absl::StrAppend(&o.details, internal::AcceptLine(d, !o.failed, ctx.accept), "\n");
    }
    if (!d.defect().where_to_look().empty()) {
      absl::StrAppend(&o.details, "Where to look: ", d.defect().where_to_look(), "\n");
    }
    o.details += best;
    o.warning = !o.failed && VerdictWarns(d);
    if (!d.explanation().empty()) absl::StrAppend(&o.details, "\n\n", d.explanation());
    out.push_back(std::move(o));
  }
  if (r.has_observed_vs_reference() && (!diagnosis || ctx.command == "verify")) {
    Outcome o;
    o.name = absl::StrCat("observed vs ", ref);
    o.informational = diagnosis;
    o.failed = !diagnosis && !r.observed_vs_reference().passed();
    o.details = ClosenessMessage(r.observed_vs_reference(), r.tolerance());
    o.summary = OneLine(o.details);
    o.seconds = r.reference().elapsed_ms() / 1000;
    out.push_back(std::move(o));
  }
  for (const pb::ConfigResult& c : r.results()) {
    Outcome o;
    o.name = c.config();
    o.seconds = c.elapsed_ms() / 1000;
    if (c.has_vs_observed() && (diagnosis || r.has_observed_vs_reference())) {
      o.informational = true;
      o.details = absl::StrCat("Compared with the observed output:\n",
                               ClosenessMessage(c.vs_observed(), r.tolerance()));
      o.summary = absl::StrCat("vs observed: ", StatsSummaryLine(c.vs_observed()));
    } else {
      o.informational = diagnosis;
      o.failed = !diagnosis && !c.vs_reference().passed();
      o.details = absl::StrCat("Compared with ", ref, ":\n",
                               ClosenessMessage(c.vs_reference(), r.tolerance()));
      o.summary = OneLine(o.details);
    }
    out.push_back(std::move(o));
  }
  return out;
}

int ExitCodeFor(const pb::VerifyResponse& r, const ReportContext& ctx) {
  // With --accept the answer is the server's acceptance: the response's
  // verdict, or (a diagnosis without one) the diagnosis's `accepted`.
  if (!ctx.accept.empty() && r.verdict() == pb::VERDICT_UNSPECIFIED && r.has_diagnosis()) {
    return r.diagnosis().accepted() ? 0 : 1;
  }
  if (ctx.command == "diagnose" && ctx.accept.empty()) {
    if (!r.has_diagnosis()) return 3;
    return r.diagnosis().best().empty() ? 1 : 0;
  }
  switch (r.verdict()) {
    case pb::VERDICT_PASS:
      return 0;
    case pb::VERDICT_FAIL:
      return 1;
    default:
      return 3;
  }
}

int ExitCodeForCompare(const pb::CompareResponse& r, bool accept) {
  if (!r.has_pair()) return 3;
  if (accept && r.verdict() != pb::VERDICT_PASS) return 1;
  return r.pair().rounding() ? 0 : 1;
}

}  // namespace tensorcheck::cli
