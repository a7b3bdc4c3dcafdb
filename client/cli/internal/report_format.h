// What the reports of client/cli/report.h share: numbers, ULP distances,
// indices and tolerances as the text, JUnit, GitHub and HTML reports print
// them, and the lines those reports have in common. Internal to client/cli.
//
//   absl::StrCat("max_abs ", internal::G(s.max_abs()),  // "0.015625"
//                ", max_ulp ", internal::UlpText(s.max_ulp()));
//
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "client/cli/report.h"
#include "nlohmann/json.hpp"
#include "tensorcheck/v1/tensorcheck.pb.h"

namespace tensorcheck::cli::internal {

// The ULP distance the server sends for "infinitely far" (a NaN or an
// infinity against a finite value).
inline constexpr uint64_t kUlpInfinite = std::numeric_limits<uint64_t>::max();

// Ruled-out reasons are listed for the candidates ranked this high; the
// JSON report carries every one.
inline constexpr int kRuledOutListed = 5;

// The text and GitHub reports list this many of a defect's columns, rows
// and elements each; the JSON report carries every one the server sent.
inline constexpr int kDefectListed = 10;

// A number as "%.6g"; non-finite ones as "inf", "-inf", "nan".
std::string G(double v);

// A ULP distance; kUlpInfinite as "inf".
std::string UlpText(uint64_t v);

// The headline ULP figure of a comparison: without the differing elements
// near zero when the server left them out (Stats.negligible), else max_ulp.
uint64_t HeadlineUlp(const pb::Stats& s);

// HeadlineUlp for a table cell: "5", or "5 (2 near 0)" when two differing
// elements near zero were left out.
std::string HeadlineUlpCell(const pb::Stats& s);

// Python tuple notation: (), (3,), (1, 3).
template <typename Repeated>
std::string IndexText(const Repeated& idx) {
  std::string s = absl::StrCat("(", absl::StrJoin(idx, ", "));
  if (idx.size() == 1) s += ",";
  return s + ")";
}

// The lower-case name of a tolerance preset ("torch" when unset).
const char* PresetName(pb::Tolerance::Preset p);

// A dtype as the JSON report names it ("float32"); null when unspecified.
nlohmann::ordered_json DTypeJson(pb::DType d);

// The tolerance on one line: "torch atol=1e-05 rtol=1.3e-06", "ulp
// max_ulp=4", "bound c=2", each with " nan_equal" when set.
std::string ToleranceText(const pb::Tolerance& t);

// `s` on one line: each run of line breaks becomes one space (none at the
// start).
std::string OneLine(const std::string& s);

// "mismatched 3 / 1024 (0.3%), max_abs 0.015625, max_ulp 2,
// bitwise-equal 99.7%".
std::string StatsSummaryLine(const pb::Stats& s);

// The reference's configuration, or "the reference" when the response
// names none.
std::string ReferenceName(const pb::VerifyResponse& r);

// The diagnosis's verdict as the JSON report names it: "rounding",
// "defect" or "unexplained"; "" from a server that predates the verdict
// (and for a value this client does not know).
const char* VerdictName(pb::Diagnosis::Verdict v);

// "Verdict: defect — <verdict_reason>", the reason as the server wrote
// it (the word alone when it sent none); "" without a verdict. The server
// decides both; the reports only show them.
std::string VerdictLine(const pb::Diagnosis& d);

// The diagnosis's answer in words, the first line of every report: the
// server's headline, or from a server that predates it the verdict's
// reason; "" when it sent neither.
std::string Headline(const pb::Diagnosis& d);

// The status words of the text, JUnit and GitHub reports: the proto's
// verdict words, "PASS" and "FAIL".
inline const char* StatusWord(bool pass) { return pass ? "PASS" : "FAIL"; }

// With --accept: "Verdict: PASS (accept tf32): accepted as
// cpu:tf32:unfused", or "Verdict: FAIL (accept fp32)"; `pass` is the
// response's verdict.
std::string AcceptLine(const pb::Diagnosis& d, bool pass, const std::vector<std::string>& accept);

// Whether the verdict says something is wrong that the exit code does not
// report: a defect or an unexplained output while a best match is named
// (without one, the diagnosis fails anyway). The GitHub report makes it a
// warning annotation.
bool VerdictWarns(const pb::Diagnosis& d);

// Whether the observed output could be this candidate in another summation
// order: "yes", "no", or "-" from a server that ran no plausibility test
// (it compared no elements and found nothing plausible).
std::string PlausibleText(const pb::RankedCandidate& c);

// One row of a ranking as the reports display it: the candidates that
// computed the same bits on the given inputs (the server ranks each and
// names the others in its `equivalent`, with identical statistics), shown
// once instead of once per candidate.
struct RankingRow {
  // In ranking order; the first is the one ranked highest and its
  // statistics are the row's.
  std::vector<const pb::RankedCandidate*> candidates;
  // Names in the first candidate's `equivalent` that the ranking lacks
  // (a server always ranks them; shown after the others all the same).
  std::vector<std::string> unranked;
};

// The rows of `d`'s ranking, in ranking order: a candidate joins the row of
// the first candidate ranked above it that names it in `equivalent` (or
// that it names). The pointers point into `d`, which must outlive them.
std::vector<RankingRow> RankingRows(const pb::Diagnosis& d);

}  // namespace tensorcheck::cli::internal
