// Reports of a Verify/Diagnose response: the JSON object of
// docs/json-report.md, numpy/torch-style text for people, JUnit XML and
// GitHub Actions annotations for CI.
//
//   ReportContext ctx{"verify"};
//   std::cout << FormatHuman(response, ctx);
//   std::cout << VerifyResponseToJson(response).dump(2);
//   WriteFile("report.xml", FormatJUnit(response, ctx));
//
// Every format derives its pass/fail lines from one list of Outcomes, so
// the JUnit failures, the `::error` annotations and the exit code agree.
//
// The HTML report (`--html FILE`: ranking table, ULP histogram,
// heatmaps) is FormatHtml in client/cli/html_report.h: it also needs the
// observed tensor and the returned outputs, so the CLI sets return_outputs
// when --html is given.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "tensorcheck/v1/tensorcheck.pb.h"

namespace tensorcheck::cli {

namespace pb = ::tensorcheck::v1;

// Which command produced the response ("verify" or "diagnose"), and how
// the reports should show it.
struct ReportContext {
  ReportContext() = default;
  explicit ReportContext(std::string cmd) : command(std::move(cmd)) {}

  std::string command = "verify";
  // --verbose: the full tables (every ranked candidate, the tolerance's
  // comparison, the configurations, shared GEMMs); otherwise a diagnosis
  // is shown short (FormatHuman).
  bool verbose = false;
  // The --accept patterns sent (VerifyRequest.accept): the exit code is
  // then the server's acceptance.
  std::vector<std::string> accept;
};

// The JSON report of docs/json-report.md: keys in the documented order,
// enums as lower-case words, non-finite numbers as "inf"/"-inf"/"nan",
// unset messages as null, infinite ULP distances as "inf".
nlohmann::ordered_json VerifyResponseToJson(const pb::VerifyResponse& r);

// The JSON report of `tensorcheck compare` (docs/json-report.md, "compare"):
// the CompareResponse with the same conventions, each output's diagnosis
// as in VerifyResponseToJson.
nlohmann::ordered_json CompareResponseToJson(const pb::CompareResponse& r);

// The capabilities as JSON, with the same conventions.
nlohmann::ordered_json CapabilitiesToJson(const pb::GetCapabilitiesResponse& r);

// One pass/fail line of a report: a JUnit test case, a GitHub annotation.
struct Outcome {
  // "observed vs cpu:fp64:none", "cpu:tf32:none", "diagnosis".
  std::string name;
  // Whether this outcome is a parity failure (counted in the exit code).
  bool failed = false;
  // Informational outcomes (each configuration when an observed output
  // decides the verdict) never fail; they carry their statistics.
  bool informational = false;
  // Not a failure (the exit code stays 0) but worth a warning: the
  // diagnosis when the server's verdict is "defect" or "unexplained" while
  // it names a best match (internal::VerdictWarns).
  bool warning = false;
  // One line, e.g. "Tensor-likes are not close! Mismatched elements: ...".
  std::string summary;
  // The full numpy-style message.
  std::string details;
  double seconds = 0;
};

// The outcomes of a response:
// - verify with an observed output: "observed vs REFERENCE" (fails when the
//   observed output is not within tolerance of the reference), then each
//   configuration, informational, compared with the observed output;
// - verify without one: each configuration, failing when it is not within
//   tolerance of the reference;
// - diagnose, and verify with --accept (the response has a diagnosis):
//   "diagnosis" (fails as ExitCodeFor: no candidate explains the observed
//   output, or with --accept the server did not accept it; its summary is
//   the server's headline, its details open with the headline, the advice
//   and where to look), then (verify) the observed output vs the reference
//   and each configuration, informational.
std::vector<Outcome> Outcomes(const pb::VerifyResponse& r, const ReportContext& ctx);

// Exit status of a successful RPC: 0 pass, 1 parity failure (verify: the
// verdict is fail; diagnose: no candidate explains the observed output;
// with --accept, verify and diagnose: the server did not accept the
// output, its verdict is fail), 3 when the server sent no verdict.
int ExitCodeFor(const pb::VerifyResponse& r, const ReportContext& ctx);

// Exit status of a Compare: 0 when the two outputs differ by rounding
// (pair.rounding; with --accept also only when the verdict is pass, every
// output accepted), 1 otherwise, 3 when the response has no pair.
int ExitCodeForCompare(const pb::CompareResponse& r, bool accept);

// The text of `tensorcheck compare`: the server's headline first, then each
// output's best match, the pair's numbers and the status word; with
// `verbose` each output's diagnosis (short) and the advice both ways.
std::string FormatCompareHuman(const pb::CompareResponse& r, const ReportContext& ctx);

// numpy/torch-style text for one comparison:
//   Tensor-likes are not close!
//
//   Mismatched elements: 3 / 1024 (0.3%)
//   Greatest absolute difference: 0.015625 at index (1, 3) (up to 1e-05 allowed)
//   Greatest relative difference: 0.0039 at index (1, 3) (up to 0.016 allowed)
std::string ClosenessMessage(const pb::Stats& s, const pb::Tolerance& t);

// The human report (verify or diagnose), ending in a newline.
std::string FormatHuman(const pb::VerifyResponse& r, const ReportContext& ctx);
std::string FormatCapabilities(const pb::GetCapabilitiesResponse& r);

// JUnit XML: one <testcase> per Outcome, failures carrying the
// numpy-style message.
std::string FormatJUnit(const pb::VerifyResponse& r, const ReportContext& ctx);

// GitHub Actions workflow commands: `::error` for each failed Outcome,
// `::warning` for each warning one (a "defect" or "unexplained" verdict
// with a best match: the verdict's reason and where to look), and one
// `::notice` with the overall result.
std::string FormatGithubAnnotations(const pb::VerifyResponse& r, const ReportContext& ctx);
// Markdown for $GITHUB_STEP_SUMMARY.
std::string FormatGithubSummary(const pb::VerifyResponse& r, const ReportContext& ctx);

// Escaping, exposed for tests.
// XML/HTML text and attribute values: & < > " '; control characters XML
// 1.0 forbids become U+FFFD; tab, newline and carriage return become
// character references with `escape_whitespace` (attributes keep them),
// else tab and newline stay and carriage return is dropped.
std::string MarkupEscape(absl::string_view s, bool escape_whitespace);
// MarkupEscape with whitespace escaped (JUnit XML).
std::string XmlEscape(absl::string_view s);
// Workflow-command data: % \r \n.
std::string GithubEscapeData(absl::string_view s);
// Workflow-command property values: also : and ,.
std::string GithubEscapeProperty(absl::string_view s);

}  // namespace tensorcheck::cli
