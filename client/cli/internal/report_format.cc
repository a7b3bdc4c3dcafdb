#include "client/cli/internal/report_format.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/share_format.h"

namespace tensorcheck::cli::internal {
namespace {

using Json = nlohmann::ordered_json;

}  // namespace

std::string G(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return absl::StrFormat("%.6g", v);
}

std::string UlpText(uint64_t v) { return v == kUlpInfinite ? "inf" : absl::StrCat(v); }

uint64_t HeadlineUlp(const pb::Stats& s) {
  return s.has_negligible() ? s.negligible().significant_max_ulp() : s.max_ulp();
}

std::string HeadlineUlpCell(const pb::Stats& s) {
  std::string out = UlpText(HeadlineUlp(s));
  if (s.has_negligible()) absl::StrAppend(&out, " (", s.negligible().differing(), " near 0)");
  return out;
}

const char* PresetName(pb::Tolerance::Preset p) {
  switch (p) {
    case pb::Tolerance::PRESET_NUMPY:
      return "numpy";
    case pb::Tolerance::PRESET_POLYGRAPHY:
      return "polygraphy";
    case pb::Tolerance::PRESET_EXPLICIT:
      return "explicit";
    case pb::Tolerance::PRESET_ULP:
      return "ulp";
    case pb::Tolerance::PRESET_BOUND:
      return "bound";
    default:
      return "torch";
  }
}

Json DTypeJson(pb::DType d) {
  switch (d) {
    case pb::DTYPE_FLOAT64:
      return "float64";
    case pb::DTYPE_FLOAT32:
      return "float32";
    case pb::DTYPE_FLOAT16:
      return "float16";
    case pb::DTYPE_BFLOAT16:
      return "bfloat16";
    default:
      return nullptr;
  }
}

std::string ToleranceText(const pb::Tolerance& t) {
  std::string s = PresetName(t.preset());
  switch (t.preset()) {
    case pb::Tolerance::PRESET_ULP:
      absl::StrAppend(&s, " max_ulp=", t.max_ulp());
      break;
    case pb::Tolerance::PRESET_BOUND:
      absl::StrAppend(&s, " c=", G(t.bound_factor() == 0 ? 1 : t.bound_factor()));
      break;
    default:
      if (t.has_atol()) absl::StrAppend(&s, " atol=", G(t.atol().value()));
      if (t.has_rtol()) absl::StrAppend(&s, " rtol=", G(t.rtol().value()));
  }
  if (t.nan_equal()) s += " nan_equal";
  return s;
}

std::string OneLine(const std::string& s) {
  std::string out;
  bool space = false;
  for (char c : s) {
    if (c == '\n' || c == '\r') {
      if (!space && !out.empty()) out += ' ';
      space = true;
      continue;
    }
    space = false;
    out += c;
  }
  return out;
}

std::string StatsSummaryLine(const pb::Stats& s) {
  return absl::StrCat("mismatched ", s.mismatched(), " / ", s.total(), " (",
                      FormatShare(s.mismatched(), s.total()), "), max_abs ", G(s.max_abs()),
                      ", max_ulp ", HeadlineUlpCell(s), ", bitwise-equal ",
                      FormatShare(s.bitwise_equal_count(), s.total()));
}

std::string ReferenceName(const pb::VerifyResponse& r) {
  if (r.has_reference() && !r.reference().config().empty()) {
    return r.reference().config();
  }
  return "the reference";
}

const char* VerdictName(pb::Diagnosis::Verdict v) {
  switch (v) {
    case pb::Diagnosis::VERDICT_ROUNDING:
      return "rounding";
    case pb::Diagnosis::VERDICT_DEFECT:
      return "defect";
    case pb::Diagnosis::VERDICT_UNEXPLAINED:
      return "unexplained";
    default:
      return "";
  }
}

std::string VerdictLine(const pb::Diagnosis& d) {
  const std::string name = VerdictName(d.verdict());
  if (name.empty()) return "";
  if (d.verdict_reason().empty()) return absl::StrCat("Verdict: ", name);
  // U+2014 (em dash) in UTF-8, as the Python and Go clients write it.
  return absl::StrCat("Verdict: ", name, " \xe2\x80\x94 ", d.verdict_reason());
}

std::string Headline(const pb::Diagnosis& d) {
  return d.headline().empty() ? d.verdict_reason() : d.headline();
}

std::string AcceptLine(const pb::Diagnosis& d, bool pass, const std::vector<std::string>& accept) {
  std::string out =
      absl::StrCat("Verdict: ", StatusWord(pass), " (accept ", absl::StrJoin(accept, ", "), ")");
  if (d.accepted()) absl::StrAppend(&out, ": accepted as ", d.accepted_as());
  return out;
}

bool VerdictWarns(const pb::Diagnosis& d) {
  return !d.best().empty() && (d.verdict() == pb::Diagnosis::VERDICT_DEFECT ||
                               d.verdict() == pb::Diagnosis::VERDICT_UNEXPLAINED);
}

std::string PlausibleText(const pb::RankedCandidate& c) {
  if (c.plausible()) return "yes";
  return c.compared_elements() > 0 ? "no" : "-";
}

std::vector<RankingRow> RankingRows(const pb::Diagnosis& d) {
  auto names = [](const pb::RankedCandidate& c, const std::string& config) {
    return std::find(c.equivalent().begin(), c.equivalent().end(), config) != c.equivalent().end();
  };
  std::vector<RankingRow> rows;
  std::vector<bool> placed(static_cast<size_t>(d.ranking_size()), false);
  for (int i = 0; i < d.ranking_size(); ++i) {
    if (placed[static_cast<size_t>(i)]) continue;
    const pb::RankedCandidate& head = d.ranking(i);
    RankingRow row;
    row.candidates.push_back(&head);
    for (int j = i + 1; j < d.ranking_size(); ++j) {
      const pb::RankedCandidate& c = d.ranking(j);
      if (placed[static_cast<size_t>(j)] || c.config() == head.config()) continue;
      if (!names(head, c.config()) && !names(c, head.config())) continue;
      row.candidates.push_back(&c);
      placed[static_cast<size_t>(j)] = true;
    }
    for (const std::string& e : head.equivalent()) {
      const bool ranked =
          std::any_of(d.ranking().begin(), d.ranking().end(),
                      [&](const pb::RankedCandidate& c) { return c.config() == e; });
      if (!ranked && std::find(row.unranked.begin(), row.unranked.end(), e) == row.unranked.end()) {
        row.unranked.push_back(e);
      }
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace tensorcheck::cli::internal
