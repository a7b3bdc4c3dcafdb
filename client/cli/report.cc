#include "client/cli/report.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "server/core/share_format.h"

namespace tensorcheck::cli {
namespace {

using Json = nlohmann::ordered_json;

constexpr uint64_t kUlpInfinite = std::numeric_limits<uint64_t>::max();

// ---------------------------------------------------------------- JSON

Json Num(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

Json Ulp(uint64_t v) {
  if (v == kUlpInfinite) return "inf";
  return v;
}

Json Wrapped(bool has, const google::protobuf::DoubleValue& v) {
  if (!has) return nullptr;
  return Num(v.value());
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

template <typename Repeated>
Json IntList(const Repeated& r) {
  Json a = Json::array();
  for (auto v : r) a.push_back(v);
  return a;
}

template <typename Repeated>
Json StringList(const Repeated& r) {
  Json a = Json::array();
  for (const auto& v : r) a.push_back(v);
  return a;
}

Json ElementJson(const pb::Element& e) {
  Json j;
  j["index"] = IntList(e.index());
  j["actual"] = Num(e.actual());
  j["expected"] = Num(e.expected());
  j["actual_bits"] = e.actual_bits();
  j["expected_bits"] = e.expected_bits();
  j["abs_diff"] = Num(e.abs_diff());
  j["rel_diff"] = Num(e.rel_diff());
  j["ulp"] = Ulp(e.ulp());
  return j;
}

template <typename Repeated>
Json GroupList(const Repeated& groups) {
  Json a = Json::array();
  for (const pb::Group& g : groups) {
    Json j;
    j["index"] = g.index();
    j["mismatched"] = g.mismatched();
    j["share"] = Num(g.share());
    a.push_back(std::move(j));
  }
  return a;
}

Json StatsJson(const pb::Stats& s) {
  Json j;
  j["total"] = s.total();
  j["mismatched"] = s.mismatched();
  j["max_abs"] = Num(s.max_abs());
  j["max_abs_index"] = IntList(s.max_abs_index());
  j["max_rel"] = Num(s.max_rel());
  j["max_rel_index"] = IntList(s.max_rel_index());
  j["mean_abs"] = Num(s.mean_abs());
  j["rms"] = Num(s.rms());
  j["rel_l2"] = Num(s.rel_l2());
  j["cosine"] = Num(s.cosine());
  j["max_ulp"] = Ulp(s.max_ulp());
  j["mean_ulp"] = Num(s.mean_ulp());
  j["bitwise_equal"] = s.bitwise_equal();
  j["bitwise_equal_count"] = s.bitwise_equal_count();
  Json hist = Json::array();
  for (const pb::UlpBucket& b : s.ulp_histogram()) {
    Json h;
    h["lo"] = Ulp(b.lo());
    h["hi"] = Ulp(b.hi());
    h["count"] = b.count();
    hist.push_back(std::move(h));
  }
  j["ulp_histogram"] = std::move(hist);
  j["nan_actual"] = s.nan_actual();
  j["nan_expected"] = s.nan_expected();
  j["inf_actual"] = s.inf_actual();
  j["inf_expected"] = s.inf_expected();
  j["nan_mismatch"] = s.nan_mismatch();
  Json worst = Json::array();
  for (const pb::Element& e : s.worst()) worst.push_back(ElementJson(e));
  j["worst"] = std::move(worst);
  j["top_columns"] = GroupList(s.top_columns());
  j["top_rows"] = GroupList(s.top_rows());
  j["bound_ratio"] = Wrapped(s.has_bound_ratio(), s.bound_ratio());
  j["bound_precision"] = s.bound_precision();
  j["compared_dtype"] = DTypeJson(s.compared_dtype());
  j["passed"] = s.passed();
  return j;
}

Json ConfigResultJson(const pb::ConfigResult& c) {
  Json j;
  j["config"] = c.config();
  j["vs_reference"] = c.has_vs_reference() ? StatsJson(c.vs_reference()) : Json();
  j["vs_observed"] = c.has_vs_observed() ? StatsJson(c.vs_observed()) : Json();
  j["elapsed_ms"] = Num(c.elapsed_ms());
  // Sorted keys: proto maps have no order.
  std::vector<std::pair<std::string, std::string>> details(c.details().begin(), c.details().end());
  std::sort(details.begin(), details.end());
  Json d = Json::object();
  for (const auto& [k, v] : details) d[k] = v;
  j["details"] = std::move(d);
  j["deterministic"] = c.deterministic();
  j["runs"] = c.runs();
  j["shared_computation"] = c.shared_computation();
  return j;
}

Json ToleranceJson(const pb::Tolerance& t) {
  Json j;
  j["preset"] = PresetName(t.preset());
  j["atol"] = Wrapped(t.has_atol(), t.atol());
  j["rtol"] = Wrapped(t.has_rtol(), t.rtol());
  j["max_ulp"] = Ulp(t.max_ulp());
  // "0 means 1" in the API; the report shows the factor as applied.
  j["bound_factor"] = Num(t.bound_factor() == 0 ? 1.0 : t.bound_factor());
  j["nan_equal"] = t.nan_equal();
  return j;
}

Json DiagnosisJson(const pb::Diagnosis& d) {
  Json j;
  j["best"] = d.best().empty() ? Json() : Json(d.best());
  j["equivalent"] = StringList(d.equivalent());
  j["tied"] = StringList(d.tied());
  j["confidence"] = Num(d.confidence());
  Json ranking = Json::array();
  for (const pb::RankedCandidate& c : d.ranking()) {
    Json r;
    r["config"] = c.config();
    r["bitwise_equal_fraction"] = Num(c.bitwise_equal_fraction());
    r["max_ulp"] = Ulp(c.max_ulp());
    r["mean_ulp"] = Num(c.mean_ulp());
    r["bound_ratio"] = Wrapped(c.has_bound_ratio(), c.bound_ratio());
    r["equivalent"] = StringList(c.equivalent());
    r["disagreements"] = c.disagreements();
    r["expected_disagreements"] = Num(c.expected_disagreements());
    r["plausibility_p"] = Num(c.plausibility_p());
    r["plausible"] = c.plausible();
    r["consistent_fraction"] = Num(c.consistent_fraction());
    r["compared_elements"] = c.compared_elements();
    r["ruled_out"] = c.ruled_out();
    r["shared_computation"] = c.shared_computation();
    ranking.push_back(std::move(r));
  }
  j["ranking"] = std::move(ranking);
  j["framework_hint"] = d.framework_hint();
  Json loc;
  loc["columns"] = GroupList(d.localization().columns());
  loc["rows"] = GroupList(d.localization().rows());
  Json outliers = Json::array();
  for (const pb::Element& e : d.localization().outliers()) {
    outliers.push_back(ElementJson(e));
  }
  loc["outliers"] = std::move(outliers);
  j["localization"] = std::move(loc);
  j["explanation"] = d.explanation();
  return j;
}

// ---------------------------------------------------------------- text

std::string G(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return absl::StrFormat("%.6g", v);
}

std::string UlpText(uint64_t v) { return v == kUlpInfinite ? "inf" : absl::StrCat(v); }

// Python tuple notation: (), (3,), (1, 3).
template <typename Repeated>
std::string IndexText(const Repeated& idx) {
  std::string s = absl::StrCat("(", absl::StrJoin(idx, ", "));
  if (idx.size() == 1) s += ",";
  return s + ")";
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

// A plain text table with left-aligned first column.
class Table {
 public:
  // The first `left` columns are left-aligned, the others right-aligned.
  explicit Table(std::vector<std::string> header, size_t left = 1) : left_(left) {
    rows_.push_back(std::move(header));
  }
  void Add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  std::string Render(const std::string& indent = "") const {
    std::vector<size_t> w;
    for (const auto& r : rows_) {
      if (w.size() < r.size()) w.resize(r.size(), 0);
      for (size_t i = 0; i < r.size(); ++i) w[i] = std::max(w[i], r[i].size());
    }
    std::string out;
    for (const auto& r : rows_) {
      std::string line = indent;
      for (size_t i = 0; i < r.size(); ++i) {
        const std::string pad(w[i] - r[i].size(), ' ');
        if (i > 0) line += "  ";
        line += i < left_ ? r[i] + pad : pad + r[i];
      }
      out += line + "\n";
    }
    return out;
  }

 private:
  size_t left_;
  std::vector<std::vector<std::string>> rows_;
};

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
                      ", max_ulp ", UlpText(s.max_ulp()), ", bitwise-equal ",
                      FormatShare(s.bitwise_equal_count(), s.total()));
}

std::string ReferenceName(const pb::VerifyResponse& r) {
  if (r.has_reference() && !r.reference().config().empty()) {
    return r.reference().config();
  }
  return "the reference";
}

std::string Groups(const google::protobuf::RepeatedPtrField<pb::Group>& g) {
  std::vector<std::string> parts;
  for (const pb::Group& x : g) {
    parts.push_back(
        absl::StrCat(x.index(), " (", x.mismatched(), ", ", FormatShare(x.share()), ")"));
  }
  return absl::StrJoin(parts, ", ");
}

// The notes under the human report's tables are wrapped at this width.
constexpr size_t kTextWidth = 100;
// Ruled-out reasons are listed for the candidates ranked this high; the
// JSON report carries every one.
constexpr int kRuledOutListed = 5;
// Marks a configuration that reused another configuration's GEMM.
constexpr char kSharedMarker[] = "*";

// `text` word-wrapped at kTextWidth, the first line led by `first`, the
// others by `rest`; a word longer than a line stays whole.
std::string Wrap(absl::string_view text, absl::string_view first, absl::string_view rest) {
  std::string out(first);
  size_t column = first.size();
  bool empty_line = true;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (!empty_line && column + 1 + word.size() > kTextWidth) {
      absl::StrAppend(&out, "\n", rest);
      column = rest.size();
      empty_line = true;
    }
    if (!empty_line) {
      out += ' ';
      ++column;
    }
    absl::StrAppend(&out, word);
    column += word.size();
    empty_line = false;
  }
  return out + "\n";
}

// One footnote line per configuration whose GEMM others reused, in order of
// first appearance: "* A, B reused the GEMM of C<suffix>". `items` are
// ConfigResults or RankedCandidates.
template <typename Items>
std::string SharedFootnotes(const Items& items, absl::string_view suffix) {
  std::vector<std::pair<std::string, std::vector<std::string>>> groups;
  for (const auto& item : items) {
    if (item.shared_computation().empty()) continue;
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const auto& g) { return g.first == item.shared_computation(); });
    if (it == groups.end()) {
      groups.push_back({item.shared_computation(), {}});
      it = std::prev(groups.end());
    }
    it->second.push_back(item.config());
  }
  std::string out;
  for (const auto& [shared, configs] : groups) {
    out += Wrap(absl::StrCat(absl::StrJoin(configs, ", "), " reused the GEMM of ", shared, suffix),
                absl::StrCat("  ", kSharedMarker, " "), "    ");
  }
  return out;
}

// Whether the observed output could be this candidate in another summation
// order: "yes", "no", or "-" from a server that ran no plausibility test
// (it compared no elements and found nothing plausible).
std::string PlausibleText(const pb::RankedCandidate& c) {
  if (c.plausible()) return "yes";
  return c.compared_elements() > 0 ? "no" : "-";
}

// "Same bits: A = B" for each set of candidates that computed the same bits,
// once per set.
std::string SameBitsLines(const pb::Diagnosis& d) {
  std::vector<std::vector<std::string>> seen;
  std::string out;
  for (const pb::RankedCandidate& c : d.ranking()) {
    if (c.equivalent_size() == 0) continue;
    std::vector<std::string> set(c.equivalent().begin(), c.equivalent().end());
    set.push_back(c.config());
    std::sort(set.begin(), set.end());
    set.erase(std::unique(set.begin(), set.end()), set.end());
    if (std::find(seen.begin(), seen.end(), set) != seen.end()) continue;
    seen.push_back(set);
    // The candidate first, as ranked; then the others.
    std::vector<std::string> shown = {c.config()};
    for (const std::string& e : c.equivalent()) {
      if (e != c.config()) shown.push_back(e);
    }
    out += Wrap(absl::StrCat("Same bits: ", absl::StrJoin(shown, " = ")), "  ", "    ");
  }
  return out;
}

}  // namespace

// ---------------------------------------------------------------- public

nlohmann::ordered_json VerifyResponseToJson(const pb::VerifyResponse& r) {
  Json j;
  switch (r.verdict()) {
    case pb::VERDICT_PASS:
      j["verdict"] = "pass";
      break;
    case pb::VERDICT_FAIL:
      j["verdict"] = "fail";
      break;
    default:
      j["verdict"] = nullptr;
  }
  j["tolerance"] = ToleranceJson(r.tolerance());
  j["observed_vs_reference"] =
      r.has_observed_vs_reference() ? StatsJson(r.observed_vs_reference()) : Json();
  j["reference"] = r.has_reference() ? ConfigResultJson(r.reference()) : Json();
  Json results = Json::array();
  for (const pb::ConfigResult& c : r.results()) results.push_back(ConfigResultJson(c));
  j["results"] = std::move(results);
  j["output_shape"] = IntList(r.output_shape());
  j["notes"] = StringList(r.notes());
  j["diagnosis"] = r.has_diagnosis() ? DiagnosisJson(r.diagnosis()) : Json();
  return j;
}

nlohmann::ordered_json CapabilitiesToJson(const pb::GetCapabilitiesResponse& r) {
  Json j;
  j["server_version"] = r.server_version();
  Json backends = Json::array();
  for (const pb::BackendInfo& b : r.backends()) {
    Json x;
    x["name"] = b.name();
    x["available"] = b.available();
    x["unavailable_reason"] = b.unavailable_reason();
    x["precisions"] = StringList(b.precisions());
    x["bias_modes"] = StringList(b.bias_modes());
    x["configs"] = StringList(b.configs());
    if (b.has_device()) {
      Json d;
      d["name"] = b.device().name();
      d["compute_capability"] = b.device().compute_capability();
      d["memory_bytes"] = b.device().memory_bytes();
      d["driver_version"] = b.device().driver_version();
      d["runtime_version"] = b.device().runtime_version();
      d["cublas_version"] = b.device().cublas_version();
      x["device"] = std::move(d);
    } else {
      x["device"] = nullptr;
    }
    Json dtypes = Json::array();
    for (int d : b.storage_dtypes()) dtypes.push_back(DTypeJson(static_cast<pb::DType>(d)));
    x["storage_dtypes"] = std::move(dtypes);
    backends.push_back(std::move(x));
  }
  j["backends"] = std::move(backends);
  if (r.has_limits()) {
    Json l;
    l["max_message_bytes"] = r.limits().max_message_bytes();
    l["max_tensor_bytes"] = r.limits().max_tensor_bytes();
    l["max_configs"] = r.limits().max_configs();
    l["max_rank"] = r.limits().max_rank();
    l["max_top_k"] = r.limits().max_top_k();
    l["max_repeat"] = r.limits().max_repeat();
    j["limits"] = std::move(l);
  } else {
    j["limits"] = nullptr;
  }
  j["default_reference"] = r.default_reference();
  j["tolerance_presets"] = StringList(r.tolerance_presets());
  j["tensor_store"] = r.tensor_store();
  return j;
}

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
  absl::StrAppend(&out, "\nGreatest ULP distance: ", UlpText(s.max_ulp()));
  if (ulp) absl::StrAppend(&out, " (up to ", t.max_ulp(), " allowed)");
  if (s.compared_dtype() != pb::DTYPE_UNSPECIFIED) {
    absl::StrAppend(&out, " in ", DTypeJson(s.compared_dtype()).get<std::string>());
  }
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
  const bool diagnose = ctx.command == "diagnose";
  if (diagnose) {
    Outcome o;
    o.name = "diagnosis";
    const pb::Diagnosis& d = r.diagnosis();
    o.failed = d.best().empty();
    o.summary =
        o.failed ? "No candidate configuration explains the observed output."
                 : absl::StrCat("Best match: ", d.best(), " (confidence ", G(d.confidence()), ")");
    o.details = o.summary;
    if (!d.explanation().empty()) absl::StrAppend(&o.details, "\n\n", d.explanation());
    out.push_back(std::move(o));
  } else if (r.has_observed_vs_reference()) {
    Outcome o;
    o.name = absl::StrCat("observed vs ", ref);
    o.failed = !r.observed_vs_reference().passed();
    o.details = ClosenessMessage(r.observed_vs_reference(), r.tolerance());
    o.summary = OneLine(o.details);
    o.seconds = r.reference().elapsed_ms() / 1000;
    out.push_back(std::move(o));
  }
  for (const pb::ConfigResult& c : r.results()) {
    Outcome o;
    o.name = c.config();
    o.seconds = c.elapsed_ms() / 1000;
    if (c.has_vs_observed() && (diagnose || r.has_observed_vs_reference())) {
      o.informational = true;
      o.details = absl::StrCat("Compared with the observed output:\n",
                               ClosenessMessage(c.vs_observed(), r.tolerance()));
      o.summary = absl::StrCat("vs observed: ", StatsSummaryLine(c.vs_observed()));
    } else {
      o.informational = diagnose;
      o.failed = !diagnose && !c.vs_reference().passed();
      o.details = absl::StrCat("Compared with ", ref, ":\n",
                               ClosenessMessage(c.vs_reference(), r.tolerance()));
      o.summary = OneLine(o.details);
    }
    out.push_back(std::move(o));
  }
  return out;
}

int ExitCodeFor(const pb::VerifyResponse& r, const ReportContext& ctx) {
  if (ctx.command == "diagnose") {
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

std::string FormatHuman(const pb::VerifyResponse& r, const ReportContext& ctx) {
  std::string out;
  const std::string ref = ReferenceName(r);
  const bool observed = r.has_observed_vs_reference();
  if (ctx.command == "diagnose") {
    const pb::Diagnosis& d = r.diagnosis();
    if (d.best().empty()) {
      out += "No candidate configuration explains the observed output.\n";
    } else {
      absl::StrAppend(&out, "Best match: ", d.best(), " (confidence ",
                      absl::StrFormat("%.2f", d.confidence()), ")\n");
    }
    if (d.equivalent_size() > 0) {
      absl::StrAppend(&out, "Equivalent here: ", absl::StrJoin(d.equivalent(), ", "), "\n");
    }
    if (d.tied_size() > 0) {
      absl::StrAppend(&out, "Cannot be told apart from: ", absl::StrJoin(d.tied(), ", "), "\n");
    }
    if (!d.framework_hint().empty()) absl::StrAppend(&out, "Framework: ", d.framework_hint(), "\n");
    if (!d.explanation().empty()) absl::StrAppend(&out, "\n", d.explanation(), "\n");
    if (d.ranking_size() > 0) {
      // Equivalents, shared GEMMs and ruled-out reasons go under the table:
      // as columns they would push it past 100 characters.
      Table t(
          {"rank", "config", "plausible", "bitwise-equal", "max_ulp", "mean_ulp", "bound_ratio"},
          /*left=*/3);
      int rank = 0;
      for (const pb::RankedCandidate& c : d.ranking()) {
        t.Add({absl::StrCat(++rank),
               c.config() + (c.shared_computation().empty() ? "" : kSharedMarker), PlausibleText(c),
               FormatShare(c.bitwise_equal_fraction()), UlpText(c.max_ulp()), G(c.mean_ulp()),
               c.has_bound_ratio() ? G(c.bound_ratio().value()) : "-"});
      }
      out += "\nRanking:\n" + t.Render("  ");
      out += SameBitsLines(d);
      out += SharedFootnotes(d.ranking(), ".");
      std::string ruled_out;
      for (int i = 0; i < std::min(d.ranking_size(), kRuledOutListed); ++i) {
        const pb::RankedCandidate& c = d.ranking(i);
        if (c.ruled_out().empty()) continue;
        ruled_out += Wrap(absl::StrCat(i + 1, ". ", c.config(), ": ", OneLine(c.ruled_out())),
                          "    ", "      ");
      }
      if (!ruled_out.empty()) out += "  Ruled out:\n" + ruled_out;
    }
    const pb::Localization& loc = d.localization();
    if (loc.columns_size() > 0)
      absl::StrAppend(&out, "\nColumns holding most differences: ", Groups(loc.columns()), "\n");
    if (loc.rows_size() > 0)
      absl::StrAppend(&out, "Rows holding most differences: ", Groups(loc.rows()), "\n");
    if (loc.outliers_size() > 0) {
      out += "Outliers (beyond the best candidate's error model):\n";
      for (const pb::Element& e : loc.outliers()) {
        absl::StrAppend(&out, "  at ", IndexText(e.index()), ": observed ", G(e.actual()),
                        ", candidate ", G(e.expected()), " (", UlpText(e.ulp()), " ulp)\n");
      }
    }
    if (observed) {
      absl::StrAppend(&out, "\nObserved output vs ", ref, " (", ToleranceText(r.tolerance()),
                      "):\n", ClosenessMessage(r.observed_vs_reference(), r.tolerance()), "\n");
    }
  } else {
    absl::StrAppend(&out, "Verdict: ", r.verdict() == pb::VERDICT_PASS ? "PASS" : "FAIL",
                    "  (reference ", ref, ", tolerance ", ToleranceText(r.tolerance()), ")\n");
    if (observed) {
      absl::StrAppend(&out, "\nObserved output vs ", ref, ":\n",
                      ClosenessMessage(r.observed_vs_reference(), r.tolerance()), "\n");
    } else {
      for (const pb::ConfigResult& c : r.results()) {
        if (c.vs_reference().passed()) continue;
        absl::StrAppend(&out, "\n", c.config(), " vs ", ref, ":\n",
                        ClosenessMessage(c.vs_reference(), r.tolerance()), "\n");
      }
    }
  }
  if (r.results_size() > 0) {
    const bool any_repeat = std::any_of(r.results().begin(), r.results().end(),
                                        [](const pb::ConfigResult& c) { return c.runs() > 1; });
    const bool any_shared =
        std::any_of(r.results().begin(), r.results().end(),
                    [](const pb::ConfigResult& c) { return !c.shared_computation().empty(); });
    std::vector<std::string> header = {"config",  "pass",          "mismatched", "max_abs",
                                       "max_ulp", "bitwise-equal", "elapsed"};
    if (any_repeat) header.push_back("deterministic");
    Table t(header);
    for (const pb::ConfigResult& c : r.results()) {
      const pb::Stats& s = observed && c.has_vs_observed() ? c.vs_observed() : c.vs_reference();
      // The marker (or a space, keeping the digits aligned) says that the
      // time is the epilogue's alone.
      std::string elapsed = absl::StrFormat("%.1f ms", c.elapsed_ms());
      if (any_shared) elapsed += c.shared_computation().empty() ? " " : kSharedMarker;
      std::vector<std::string> row = {c.config(),
                                      s.passed() ? "yes" : "no",
                                      absl::StrCat(s.mismatched(), " / ", s.total()),
                                      G(s.max_abs()),
                                      UlpText(s.max_ulp()),
                                      FormatShare(s.bitwise_equal_count(), s.total()),
                                      std::move(elapsed)};
      if (any_repeat) {
        row.push_back(c.runs() > 1
                          ? absl::StrCat(c.deterministic() ? "yes" : "no", " (", c.runs(), " runs)")
                          : "-");
      }
      t.Add(std::move(row));
    }
    absl::StrAppend(&out, "\nConfigurations compared with ", observed ? "the observed output" : ref,
                    ":\n", t.Render("  "));
    out += SharedFootnotes(r.results(), " (elapsed: epilogue only).");
  }
  if (r.notes_size() > 0) {
    out += "\nNotes:\n";
    for (const std::string& n : r.notes()) absl::StrAppend(&out, "  - ", n, "\n");
  }
  return out;
}

std::string FormatCapabilities(const pb::GetCapabilitiesResponse& r) {
  std::string out = absl::StrCat("tensorcheck server ", r.server_version(), "\n");
  if (!r.default_reference().empty()) {
    absl::StrAppend(&out, "Default reference: ", r.default_reference(), "\n");
  }
  if (r.tolerance_presets_size() > 0) {
    absl::StrAppend(&out, "Tolerance presets: ", absl::StrJoin(r.tolerance_presets(), ", "), "\n");
  }
  absl::StrAppend(&out, "Tensor store: ", r.tensor_store() ? "yes" : "no", "\n");
  for (const pb::BackendInfo& b : r.backends()) {
    absl::StrAppend(&out, "\nBackend ", b.name(), ": ", b.available() ? "available" : "unavailable",
                    "\n");
    if (!b.available() && !b.unavailable_reason().empty()) {
      absl::StrAppend(&out, "  reason: ", b.unavailable_reason(), "\n");
    }
    if (b.has_device() && !b.device().name().empty()) {
      const pb::DeviceInfo& d = b.device();
      absl::StrAppend(&out, "  device: ", d.name(), " (sm ", d.compute_capability(), ", ",
                      d.memory_bytes() >> 20, " MiB, driver ", d.driver_version(), ", cuBLAS ",
                      d.cublas_version(), ")\n");
    }
    if (b.precisions_size() > 0) {
      absl::StrAppend(&out, "  precisions: ", absl::StrJoin(b.precisions(), ", "), "\n");
    }
    if (b.bias_modes_size() > 0) {
      absl::StrAppend(&out, "  bias modes: ", absl::StrJoin(b.bias_modes(), ", "), "\n");
    }
    if (b.configs_size() > 0) {
      absl::StrAppend(&out, "  configs: ", absl::StrJoin(b.configs(), ", "), "\n");
    }
  }
  if (r.has_limits()) {
    const pb::Limits& l = r.limits();
    absl::StrAppend(&out, "\nLimits: message ", l.max_message_bytes(), " bytes, tensor ",
                    l.max_tensor_bytes(), " bytes, configs ", l.max_configs(), ", rank ",
                    l.max_rank(), ", top_k ", l.max_top_k(), ", repeat ", l.max_repeat(), "\n");
  }
  return out;
}

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
    if (!o.failed) continue;
    absl::StrAppend(&out, "::error title=", GithubEscapeProperty(title + ": " + o.name),
                    "::", GithubEscapeData(o.details), "\n");
  }
  const int code = ExitCodeFor(r, ctx);
  std::string overall;
  if (ctx.command == "diagnose") {
    overall = code == 0 ? absl::StrCat("best match ", r.diagnosis().best(), " (confidence ",
                                       absl::StrFormat("%.2f", r.diagnosis().confidence()), ")")
                        : "no candidate configuration explains the observed output";
    if (!r.diagnosis().explanation().empty()) {
      absl::StrAppend(&overall, "\n", r.diagnosis().explanation());
    }
  } else {
    overall = absl::StrCat(code == 0 ? "pass" : "fail", " (reference ", ReferenceName(r),
                           ", tolerance ", ToleranceText(r.tolerance()), ")");
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
}  // namespace

std::string FormatGithubSummary(const pb::VerifyResponse& r, const ReportContext& ctx) {
  const int code = ExitCodeFor(r, ctx);
  std::string out;
  if (ctx.command == "diagnose") {
    const pb::Diagnosis& d = r.diagnosis();
    absl::StrAppend(
        &out, "## tensorcheck diagnose: ",
        d.best().empty() ? "no matching configuration" : absl::StrCat("`", Md(d.best()), "`"),
        "\n\n");
    if (!d.best().empty()) {
      absl::StrAppend(&out, "Confidence: ", absl::StrFormat("%.2f", d.confidence()), "\n\n");
    }
    if (!d.framework_hint().empty()) absl::StrAppend(&out, "_", Md(d.framework_hint()), "_\n\n");
    if (!d.explanation().empty()) absl::StrAppend(&out, Md(d.explanation()), "\n\n");
    out += "| rank | config | plausible | bitwise-equal | max_ulp | mean_ulp | bound_ratio |\n";
    out += "|---:|---|---|---:|---:|---:|---:|\n";
    int rank = 0;
    for (const pb::RankedCandidate& c : d.ranking()) {
      std::string config = absl::StrCat("`", Md(c.config()), "`");
      if (!c.shared_computation().empty()) {
        absl::StrAppend(&config, " (GEMM of `", Md(c.shared_computation()), "`)");
      }
      absl::StrAppend(&out, "| ", ++rank, " | ", config, " | ", PlausibleText(c), " | ",
                      FormatShare(c.bitwise_equal_fraction()), " | ", UlpText(c.max_ulp()), " | ",
                      G(c.mean_ulp()), " | ",
                      c.has_bound_ratio() ? G(c.bound_ratio().value()) : "-", " |\n");
    }
    bool any_ruled_out = false;
    for (int i = 0; i < std::min(d.ranking_size(), kRuledOutListed); ++i) {
      const pb::RankedCandidate& c = d.ranking(i);
      if (c.ruled_out().empty()) continue;
      if (!any_ruled_out) out += "\nRuled out:\n\n";
      any_ruled_out = true;
      absl::StrAppend(&out, "- `", Md(c.config()), "`: ", Md(c.ruled_out()), "\n");
    }
    return out + "\n";
  }
  absl::StrAppend(&out, "## tensorcheck verify: ", code == 0 ? "**PASS**" : "**FAIL**", "\n\n");
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
                    UlpText(s.max_ulp()), " | ", FormatShare(s.bitwise_equal_count(), s.total()),
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
