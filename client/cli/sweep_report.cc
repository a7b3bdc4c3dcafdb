// The reports of `tensorcheck sweep` (internal/sweep_report.h).
#include "client/cli/internal/sweep_report.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "client/cli/html_report.h"
#include "client/cli/internal/json_values.h"
#include "client/cli/internal/report_format.h"
#include "core/share_format.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/type_resolver_util.h"
#include "proto/dtype_proto.h"

namespace tensorcheck::cli::internal {
namespace {

using Json = nlohmann::ordered_json;

// gRPC codes (absl's numbering) that the CLI reports as a rejected request
// (exit 2), as kExitCodes in main.cc lists them.
bool IsRejection(int code) {
  switch (static_cast<absl::StatusCode>(code)) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kUnimplemented:
      return true;
    default:
      return false;
  }
}

// A number in three significant digits ("7.2", "1.05", "3").
std::string G3(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return absl::StrFormat("%.3g", v);
}

// "a = b": the best and the candidates that computed the same bits.
std::string BestText(const pb::VerifyResponse& r) {
  const pb::Diagnosis& d = r.diagnosis();
  if (d.best().empty()) return "";
  std::vector<std::string> names{d.best()};
  for (const std::string& e : d.equivalent()) {
    if (std::find(names.begin(), names.end(), e) == names.end()) names.push_back(e);
  }
  return absl::StrJoin(names, " = ");
}

// BestText for the table: a class of more than two names as the best and
// a count, "cpu:bf16:fused (+5 same bits)", so that the table stays
// readable; the JSON, GitHub summary and HTML list every name.
std::string BestCell(const pb::VerifyResponse& r) {
  const pb::Diagnosis& d = r.diagnosis();
  if (d.equivalent_size() <= 1) return BestText(r);
  return absl::StrCat(d.best(), " (+", d.equivalent_size(), " same bits)");
}

// The statistics the table and JSON show for a checked layer (max_abs,
// max_ulp): observed vs the reference, as the Python client's report.
const pb::Stats* ShownStats(const LayerResult& l) {
  const pb::VerifyResponse& r = l.response;
  return r.has_observed_vs_reference() ? &r.observed_vs_reference() : nullptr;
}

// Where the mismatches concentrate: the localization's groups (diagnose),
// else observed vs reference's.
const google::protobuf::RepeatedPtrField<pb::Group>& Columns(const LayerResult& l) {
  const pb::VerifyResponse& r = l.response;
  if (r.has_diagnosis()) return r.diagnosis().localization().columns();
  return r.observed_vs_reference().top_columns();
}
const google::protobuf::RepeatedPtrField<pb::Group>& Rows(const LayerResult& l) {
  const pb::VerifyResponse& r = l.response;
  if (r.has_diagnosis()) return r.diagnosis().localization().rows();
  return r.observed_vs_reference().top_rows();
}

std::string ShapeText(const std::vector<int64_t>& s) {
  return absl::StrCat("[", absl::StrJoin(s, ","), "]");
}

// "col 17 (40%), row 3 (12.5%)": the top column and row, short.
std::string WhereText(const LayerResult& l) {
  std::vector<std::string> parts;
  if (!Columns(l).empty()) {
    const pb::Group& g = Columns(l)[0];
    parts.push_back(absl::StrCat("col ", g.index(), " (", FormatShare(g.share()), ")"));
  }
  if (!Rows(l).empty()) {
    const pb::Group& g = Rows(l)[0];
    parts.push_back(absl::StrCat("row ", g.index(), " (", FormatShare(g.share()), ")"));
  }
  return absl::StrJoin(parts, ", ");
}

// The response in protobuf's JSON mapping (lowerCamelCase names, default
// values left out, enums by name, 64-bit integers and bytes as strings),
// map entries (`details`) sorted by key: printed from the deterministic
// serialization, so that the same response always prints the same text
// (MessageToJsonString follows the map's own order, which is not).
Json ResponseJson(const pb::VerifyResponse& r) {
  std::string binary;
  {
    google::protobuf::io::StringOutputStream stream(&binary);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    r.SerializeToCodedStream(&coded);
  }
  constexpr char kTypeUrlPrefix[] = "type.googleapis.com";
  const std::unique_ptr<google::protobuf::util::TypeResolver> resolver(
      google::protobuf::util::NewTypeResolverForDescriptorPool(kTypeUrlPrefix,
                                                               r.GetDescriptor()->file()->pool()));
  std::string text;
  const auto printed = google::protobuf::util::BinaryToJsonString(
      resolver.get(), absl::StrCat(kTypeUrlPrefix, "/", r.GetDescriptor()->full_name()), binary,
      &text);
  // Only a string that is not UTF-8 fails, and a parsed response holds none.
  if (!printed.ok()) return Json(nullptr);
  return Json::parse(text);
}

std::string NotCheckedReason() { return "not checked: the server went away before it"; }

// A layer call named with its place in execution order, "#13
// blocks.3.mlp.down (of 24 layer calls)": the index counted from 0, as the
// JSON report's `first_divergence.index` and the Python client's `#13`.
std::string NumberedCall(const std::vector<LayerResult>& layers, size_t i) {
  return absl::StrCat("#", i, " ", layers[i].FullName(), " (of ", layers.size(),
                      layers.size() == 1 ? " layer call)" : " layer calls)");
}

// The overall line of every report.
std::string OverallText(const std::vector<LayerResult>& layers, const SweepSummary& s) {
  const size_t n = layers.size();
  if (s.first_divergence.has_value()) {
    const size_t i = *s.first_divergence;
    return absl::StrCat("First divergence: ", NumberedCall(layers, i), ": ", s.layers[i].reason);
  }
  int errors = 0, not_checked = 0;
  std::optional<size_t> first_failed;
  for (size_t i = 0; i < s.layers.size(); ++i) {
    const LayerVerdict& v = s.layers[i];
    errors += v.status == LayerStatus::kError;
    not_checked += v.status == LayerStatus::kNotChecked;
    if (v.status == LayerStatus::kFailed && !first_failed.has_value()) first_failed = i;
  }
  if (first_failed.has_value()) {
    const size_t i = *first_failed;
    return absl::StrCat("No divergence, but ", NumberedCall(layers, i),
                        " failed: ", s.layers[i].reason);
  }
  if (errors == 0 && not_checked == 0) {
    return s.consensus.has_value()
               ? absl::StrCat("No divergence: all ", n, " layer calls explained by ", *s.consensus)
               : absl::StrCat("No divergence: all ", n, " layer calls passed");
  }
  return absl::StrCat("No divergence among the ", s.checked, " layer calls checked of ", n, " (",
                      errors, errors == 1 ? " error, " : " errors, ", not_checked, " not checked)");
}

}  // namespace

std::string LayerResult::FullName() const {
  return call == 0 ? layer : absl::StrCat(layer, "#", call);
}

const char* LayerStatusName(LayerStatus s) {
  switch (s) {
    case LayerStatus::kPassed:
      return "passed";
    case LayerStatus::kFailed:
      return "failed";
    case LayerStatus::kError:
      return "error";
    case LayerStatus::kNotChecked:
      return "not_checked";
  }
  return "error";
}

const char* LayerStatusWord(LayerStatus s) {
  switch (s) {
    case LayerStatus::kPassed:
      return "PASS";
    case LayerStatus::kFailed:
      return "FAIL";
    case LayerStatus::kError:
      return "ERROR";
    case LayerStatus::kNotChecked:
      return "-";
  }
  return "ERROR";
}

SweepSummary Summarize(const std::vector<LayerResult>& layers, const SweepOptions& options) {
  SweepSummary s;
  s.layers.resize(layers.size());
  // Pass 1: what each checked layer's response says by itself.
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerResult& l = layers[i];
    LayerVerdict& v = s.layers[i];
    if (l.rpc == LayerRpc::kNotChecked) {
      v.status = LayerStatus::kNotChecked;
      v.reason = NotCheckedReason();
      continue;
    }
    if (l.rpc == LayerRpc::kError) {
      v.status = LayerStatus::kError;
      v.reason = l.error;
      continue;
    }
    const pb::VerifyResponse& r = l.response;
    if (options.diagnose && !r.has_diagnosis()) {
      v.status = LayerStatus::kError;
      v.reason = "server error: the response carries no diagnosis";
      continue;
    }
    if (!options.diagnose && r.verdict() == pb::VERDICT_UNSPECIFIED) {
      v.status = LayerStatus::kError;
      v.reason = "server error: the response carries no verdict";
      continue;
    }
    if (!r.has_call()) {
      v.status = LayerStatus::kError;
      v.reason = "server error: the response carries no call decision";
      continue;
    }
    ++s.checked;
    // The server's decisions about this call (docs/model-checks.md,
    // "The rules"); only the consensus spans calls and is decided here.
    v.explained = r.call().explained();
    v.explaining.assign(r.call().explaining().begin(), r.call().explaining().end());
    if (!s.bound_threshold.has_value()) s.bound_threshold = r.call().bound_threshold();
    if (r.observed_vs_reference().has_bound_ratio()) {
      v.bound_ratio = r.observed_vs_reference().bound_ratio().value();
    }
  }

  // Pass 2: the consensus, the configuration explaining the most checked
  // layers; among equals the one that is `best` (first in `explaining`)
  // most often, then the greatest name (docs/model-checks.md).
  if (options.diagnose) {
    std::map<std::string, int> count, best;
    for (const LayerVerdict& v : s.layers) {
      for (const std::string& c : v.explaining) ++count[c];
      if (!v.explaining.empty()) ++best[v.explaining[0]];
    }
    for (const auto& [c, n] : count) {
      if (!s.consensus.has_value() ||
          std::make_pair(n, best[c]) >= std::make_pair(s.consensus_count, best[*s.consensus])) {
        s.consensus_count = n;
        s.consensus = c;
      }
    }
    if (2 * s.consensus_count <= s.checked) {
      s.consensus.reset();
    }
  }

  // Pass 3: each checked layer's status and reason.
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerResult& l = layers[i];
    LayerVerdict& v = s.layers[i];
    if (l.rpc != LayerRpc::kOk || v.status == LayerStatus::kError) continue;
    const pb::VerifyResponse& r = l.response;
    // The call's own divergence first (the server's reason), then the
    // consensus, then the server's bound_ratio decision.
    std::string reason = r.call().divergence();
    if (reason.empty() && v.explained && s.consensus.has_value() &&
        std::find(v.explaining.begin(), v.explaining.end(), *s.consensus) == v.explaining.end()) {
      reason = absl::StrCat("matches ", r.diagnosis().best(), ", while ", s.consensus_count, " of ",
                            s.checked, " layers match ", *s.consensus);
    }
    if (reason.empty() && r.call().bound_exceeded()) reason = r.call().bound_reason();
    // A divergence; a verdict of fail alone fails the layer call without
    // being one.
    v.diverged = !reason.empty();
    if (reason.empty() && r.verdict() == pb::VERDICT_FAIL) {
      reason = absl::StrCat("observed output not within tolerance of the reference ",
                            ReferenceName(r), ": ", StatsSummaryLine(r.observed_vs_reference()));
    }
    v.status = reason.empty() ? LayerStatus::kPassed : LayerStatus::kFailed;
    v.reason = std::move(reason);
    if (v.diverged && !s.first_divergence.has_value()) s.first_divergence = i;
  }
  s.passed = !layers.empty() &&
             std::all_of(s.layers.begin(), s.layers.end(),
                         [](const LayerVerdict& v) { return v.status == LayerStatus::kPassed; });
  return s;
}

nlohmann::ordered_json SweepToJson(const std::vector<LayerResult>& layers,
                                   const SweepSummary& summary, const SweepCounts& counts,
                                   const SweepOptions& options) {
  Json out;
  Json arr = Json::array();
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerResult& l = layers[i];
    const LayerVerdict& v = summary.layers[i];
    const bool ok = l.rpc == LayerRpc::kOk && v.status != LayerStatus::kError;
    const pb::VerifyResponse& r = l.response;
    const bool has_best = ok && r.has_diagnosis() && !r.diagnosis().best().empty();
    Json j;
    j["name"] = l.layer;
    j["call"] = l.call;
    j["input_shape"] = l.input_shape;
    j["weight_shape"] = l.weight_shape;
    j["weight_layout"] = l.in_out ? "in_out" : "out_in";
    j["dtype"] = DTypeJson(DTypeToProto(l.dtype));
    j["status"] = LayerStatusName(v.status);
    j["verdict"] = !ok || r.verdict() == pb::VERDICT_UNSPECIFIED
                       ? Json(nullptr)
                       : Json(r.verdict() == pb::VERDICT_PASS ? "pass" : "fail");
    // The diagnosis' verdict and the server's sentence for it; null without
    // a diagnosis and from a server that predates the verdict.
    const bool has_diagnosis_verdict =
        ok && r.has_diagnosis() && *VerdictName(r.diagnosis().verdict()) != '\0';
    j["diagnosis_verdict"] =
        has_diagnosis_verdict ? Json(VerdictName(r.diagnosis().verdict())) : Json(nullptr);
    j["verdict_reason"] =
        has_diagnosis_verdict ? Json(r.diagnosis().verdict_reason()) : Json(nullptr);
    j["best"] = has_best ? Json(r.diagnosis().best()) : Json(nullptr);
    j["confidence"] = has_best ? JsonNumber(r.diagnosis().confidence()) : Json(nullptr);
    j["equivalent"] = ok ? JsonStrings(r.diagnosis().equivalent()) : Json::array();
    j["tied"] = ok ? JsonStrings(r.diagnosis().tied()) : Json::array();
    j["explained"] = ok && v.explained;
    const pb::Stats* st = ok ? ShownStats(l) : nullptr;
    j["max_abs"] = st != nullptr ? JsonNumber(st->max_abs()) : Json(nullptr);
    j["max_ulp"] = st != nullptr ? JsonUlp(st->max_ulp()) : Json(nullptr);
    j["negligible"] = st != nullptr ? NegligibleJson(*st) : Json(nullptr);
    j["bound_ratio"] = v.bound_ratio.has_value() ? JsonNumber(*v.bound_ratio) : Json(nullptr);
    j["columns"] = ok ? JsonGroups(Columns(l)) : Json::array();
    j["rows"] = ok ? JsonGroups(Rows(l)) : Json::array();
    std::string explanation;
    if (ok && options.diagnose) {
      explanation = r.diagnosis().explanation();
    } else if (ok && r.has_observed_vs_reference()) {
      explanation = absl::StrCat("observed vs ", ReferenceName(r), ": ",
                                 StatsSummaryLine(r.observed_vs_reference()));
    }
    j["explanation"] = explanation;
    j["error"] = v.status == LayerStatus::kError ? Json(v.reason) : Json(nullptr);
    if (l.rpc == LayerRpc::kOk) {
      Json report = VerifyResponseToJson(r);
      report["uploaded_bytes"] = l.uploaded_bytes;
      report["reused_bytes"] = l.reused_bytes;
      j["report"] = std::move(report);
    } else {
      j["report"] = nullptr;
    }
    // What `tensorcheck render` rebuilds the layer call from: the failed
    // RPC's code (the exit code tells a rejected request from a server
    // error) and the whole response.
    j["error_code"] =
        l.rpc == LayerRpc::kError
            ? Json(absl::StatusCodeToString(static_cast<absl::StatusCode>(l.error_code)))
            : Json(nullptr);
    j["response"] = l.rpc == LayerRpc::kOk ? ResponseJson(r) : Json(nullptr);
    arr.push_back(std::move(j));
  }
  out["layers"] = std::move(arr);
  if (summary.first_divergence.has_value()) {
    const size_t i = *summary.first_divergence;
    Json f;
    f["name"] = layers[i].layer;
    f["call"] = layers[i].call;
    f["index"] = i;
    f["reason"] = summary.layers[i].reason;
    out["first_divergence"] = std::move(f);
  } else {
    out["first_divergence"] = nullptr;
  }
  out["consensus"] = summary.consensus.has_value() ? Json(*summary.consensus) : Json(nullptr);
  out["layers_checked"] = summary.checked;
  out["layers_total"] = layers.size();
  out["passed"] = summary.passed;
  out["uploaded_bytes"] = counts.uploaded_bytes;
  out["reused_bytes"] = counts.reused_bytes;
  // The run's options that the rendering needs and the responses do not
  // carry (tensorcheck render).
  out["diagnose"] = options.diagnose;
  out["bound_threshold"] =
      options.bound_threshold.has_value() ? Json(*options.bound_threshold) : Json(nullptr);
  if (!options.framework.empty()) out["framework"] = options.framework;
  if (!options.model.empty()) out["model"] = options.model;
  return out;
}

std::string FormatSweepText(const std::vector<LayerResult>& layers, const SweepSummary& summary,
                            const SweepOptions& options) {
  const std::vector<std::string> header = {"layer",       "shapes",    "dtype",   "best",
                                           "conf",        "status",    "max_abs", "max_ulp",
                                           "bound_ratio", "mismatches"};
  std::vector<std::vector<std::string>> rows;
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerResult& l = layers[i];
    const LayerVerdict& v = summary.layers[i];
    const bool ok = l.rpc == LayerRpc::kOk && v.status != LayerStatus::kError;
    const pb::Stats* st = ok ? ShownStats(l) : nullptr;
    std::string best = "-";
    std::string conf = "-";
    if (ok && options.diagnose) {
      best = v.explained ? BestCell(l.response) : "none";
      if (v.explained) conf = absl::StrFormat("%.2f", l.response.diagnosis().confidence());
    } else if (ok) {
      best = v.explained ? "pass" : "fail";
    }
    const std::string status = LayerStatusWord(v.status);
    rows.push_back(
        {l.FullName(), absl::StrCat(ShapeText(l.input_shape), "x", ShapeText(l.weight_shape)),
         std::string(DTypeShortName(l.dtype)), best, conf, status,
         st != nullptr ? G(st->max_abs()) : "-", st != nullptr ? HeadlineUlpCell(*st) : "-",
         v.bound_ratio.has_value() ? G3(*v.bound_ratio) : "-",
         // Only a failed layer's: for one explained bit for bit the
         // localization says where the runner-up would have differed.
         ok && v.status == LayerStatus::kFailed ? WhereText(l) : "-"});
  }
  std::vector<size_t> width(header.size());
  for (size_t c = 0; c < header.size(); ++c) width[c] = header[c].size();
  for (const auto& r : rows) {
    for (size_t c = 0; c < r.size(); ++c) width[c] = std::max(width[c], r[c].size());
  }
  // Numbers right-aligned, words left-aligned.
  const std::set<size_t> right = {4, 6, 7, 8};
  auto line = [&](const std::vector<std::string>& r) {
    std::string out;
    for (size_t c = 0; c < r.size(); ++c) {
      const std::string pad(width[c] - r[c].size(), ' ');
      absl::StrAppend(&out, c ? "  " : "", right.count(c) ? pad + r[c] : r[c] + pad);
    }
    while (!out.empty() && out.back() == ' ') out.pop_back();
    return out + "\n";
  };
  std::string out = line(header);
  for (const auto& r : rows) out += line(r);
  out += "\n";
  for (size_t i = 0; i < layers.size(); ++i) {
    if (summary.layers[i].status == LayerStatus::kError) {
      absl::StrAppend(&out, "Error in ", layers[i].FullName(), ": ", summary.layers[i].reason,
                      "\n");
    }
  }
  out += OverallText(layers, summary) + "\n";
  return out;
}

std::string FormatSweepJUnit(const std::vector<LayerResult>& layers, const SweepSummary& summary) {
  int failures = 0, errors = 0, skipped = 0;
  for (const LayerVerdict& v : summary.layers) {
    failures += v.status == LayerStatus::kFailed;
    errors += v.status == LayerStatus::kError;
    skipped += v.status == LayerStatus::kNotChecked;
  }
  std::string out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  absl::StrAppend(&out, "<testsuites>\n<testsuite name=\"tensorcheck.sweep\" tests=\"",
                  layers.size(), "\" failures=\"", failures, "\" errors=\"", errors,
                  "\" skipped=\"", skipped, "\">\n");
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerResult& l = layers[i];
    const LayerVerdict& v = summary.layers[i];
    absl::StrAppend(&out, "  <testcase classname=\"tensorcheck.sweep\" name=\"",
                    XmlEscape(l.FullName()), "\"");
    const std::string details = l.rpc == LayerRpc::kOk && l.response.has_diagnosis()
                                    ? l.response.diagnosis().explanation()
                                    : "";
    switch (v.status) {
      case LayerStatus::kPassed:
        out += "/>\n";
        break;
      case LayerStatus::kFailed:
        absl::StrAppend(&out, ">\n    <failure message=\"", XmlEscape(v.reason), "\">",
                        XmlEscape(details.empty() ? v.reason : details), "</failure>\n",
                        "  </testcase>\n");
        break;
      case LayerStatus::kError:
        absl::StrAppend(&out, ">\n    <error message=\"", XmlEscape(v.reason), "\"/>\n",
                        "  </testcase>\n");
        break;
      case LayerStatus::kNotChecked:
        absl::StrAppend(&out, ">\n    <skipped message=\"", XmlEscape(v.reason), "\"/>\n",
                        "  </testcase>\n");
        break;
    }
  }
  out += "</testsuite>\n</testsuites>\n";
  return out;
}

std::string FormatSweepGithubAnnotations(const std::vector<LayerResult>& layers,
                                         const SweepSummary& summary) {
  std::string out;
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerVerdict& v = summary.layers[i];
    if (v.status != LayerStatus::kFailed && v.status != LayerStatus::kError) continue;
    absl::StrAppend(&out, "::error title=",
                    GithubEscapeProperty(absl::StrCat("tensorcheck sweep: ", layers[i].FullName())),
                    "::", GithubEscapeData(v.reason), "\n");
  }
  absl::StrAppend(&out, summary.passed ? "::notice" : "::error",
                  " title=", GithubEscapeProperty("tensorcheck sweep"),
                  "::", GithubEscapeData(OverallText(layers, summary)), "\n");
  return out;
}

namespace {
// Markdown table cell text: | escaped, < > as entities, one line.
std::string Md(absl::string_view s) {
  return absl::StrReplaceAll(OneLine(std::string(s)), {{"|", "\\|"}, {"<", "&lt;"}, {">", "&gt;"}});
}
}  // namespace

std::string FormatSweepGithubSummary(const std::vector<LayerResult>& layers,
                                     const SweepSummary& summary) {
  std::string out = absl::StrCat("## tensorcheck sweep: ", summary.passed ? "**PASS**" : "**FAIL**",
                                 "\n\n", Md(OverallText(layers, summary)), "\n\n");
  out += "| # | layer | best | confidence | status | max_ulp | bound_ratio |\n";
  out += "|---:|---|---|---:|---|---:|---:|\n";
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerResult& l = layers[i];
    const LayerVerdict& v = summary.layers[i];
    const bool ok = l.rpc == LayerRpc::kOk && v.status != LayerStatus::kError;
    const pb::Stats* st = ok ? ShownStats(l) : nullptr;
    const bool best = ok && l.response.has_diagnosis() && v.explained;
    absl::StrAppend(
        &out, "| ", i, " | `", Md(l.FullName()), "` | ",
        best ? absl::StrCat("`", Md(BestText(l.response)), "`") : std::string("-"), " | ",
        best ? absl::StrFormat("%.2f", l.response.diagnosis().confidence()) : std::string("-"),
        " | ", v.status == LayerStatus::kFailed ? "**FAIL**" : LayerStatusWord(v.status), " | ",
        st != nullptr ? HeadlineUlpCell(*st) : "-", " | ",
        v.bound_ratio.has_value() ? G3(*v.bound_ratio) : "-", " |\n");
  }
  return out + "\n";
}

namespace {

// The bound_ratio chart's points (internal/html_charts.h): every layer
// call with a bound_ratio, labelled by the configuration explaining it.
std::string DepthChart(const std::vector<LayerResult>& layers, const SweepSummary& s,
                       const SweepOptions& options) {
  std::vector<DepthPoint> points;
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerVerdict& v = s.layers[i];
    if (!v.bound_ratio.has_value()) continue;
    points.push_back({i, *v.bound_ratio,
                      !options.diagnose      ? std::string("(verify only)")
                      : v.explaining.empty() ? std::string("none explains it")
                                             : v.explaining[0],
                      layers[i].FullName()});
  }
  return BoundRatioSvg(points, layers.size(), s.bound_threshold.value_or(0), s.first_divergence);
}

}  // namespace

std::string FormatSweepHtml(const std::vector<LayerResult>& layers, const SweepSummary& summary,
                            const SweepOptions& options) {
  // "tensorcheck sweep", or what was checked: "tensorcheck torch gpt2".
  std::string title = "tensorcheck";
  for (const std::string* part : {&options.framework, &options.model}) {
    if (!part->empty()) absl::StrAppend(&title, " ", *part);
  }
  if (title == "tensorcheck") title = "tensorcheck sweep";
  std::string out =
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  absl::StrAppend(&out, "<title>", HtmlEscape(title), " report</title>\n<style>", HtmlStyleSheet(),
                  "section.layer { border-top: 2px solid #8c959f; margin-top: 2em; }\n"
                  "</style>\n</head>\n<body>\n<h1>",
                  HtmlEscape(title), "</h1>\n");
  absl::StrAppend(&out, "<p class=\"", summary.passed ? "pass" : "fail", "\">",
                  HtmlEscape(OverallText(layers, summary)), "</p>\n");
  out += "<h2>bound_ratio across depth</h2>\n<figure>\n";
  out += DepthChart(layers, summary, options);
  out += "</figure>\n<h2>Layer calls</h2>\n<table class=\"layers\">\n";
  out +=
      "<tr><th>#</th><th>layer</th><th>best</th><th>status</th><th>bound_ratio</th>"
      "<th>reason</th></tr>\n";
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerResult& l = layers[i];
    const LayerVerdict& v = summary.layers[i];
    const bool best = l.rpc == LayerRpc::kOk && l.response.has_diagnosis() && v.explained;
    // A failed (or errored) row is shaded red, the first divergence also
    // marked; the green of "best" is the ranking's, never a failure's.
    // (A first divergence has failed.)
    const bool bad = v.status == LayerStatus::kFailed || v.status == LayerStatus::kError;
    const char* row_class = !bad                            ? ""
                            : summary.first_divergence == i ? " class=\"failed first\""
                                                            : " class=\"failed\"";
    absl::StrAppend(
        &out, "<tr", row_class, "><td class=\"num\">", i, "</td><td><a href=\"#layer-", i,
        "\"><code>", HtmlEscape(l.FullName()), "</code></a></td><td>",
        best ? absl::StrCat("<code>", HtmlEscape(BestText(l.response)), "</code>") : "&ndash;",
        "</td><td class=\"", v.status == LayerStatus::kPassed ? "pass" : "fail", "\">",
        LayerStatusWord(v.status), "</td><td class=\"num\">",
        v.bound_ratio.has_value() ? G3(*v.bound_ratio) : "&ndash;", "</td><td>",
        HtmlEscape(v.reason), "</td></tr>\n");
  }
  out += "</table>\n";
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerResult& l = layers[i];
    const LayerVerdict& v = summary.layers[i];
    absl::StrAppend(&out, "<section class=\"layer\" id=\"layer-", i, "\">\n<h2>", i, ". <code>",
                    HtmlEscape(l.FullName()), "</code>: <span class=\"",
                    v.status == LayerStatus::kPassed ? "pass" : "fail", "\">",
                    LayerStatusWord(v.status), "</span></h2>\n");
    if (!v.reason.empty()) absl::StrAppend(&out, "<p>", HtmlEscape(v.reason), "</p>\n");
    // The section's own headings sit one level below the layer's.
    out += absl::StrReplaceAll(
        l.html_section,
        {{"<h3>", "<h4>"}, {"</h3>", "</h4>"}, {"<h2>", "<h3>"}, {"</h2>", "</h3>"}});
    out += "</section>\n";
  }
  out += "<p class=\"note\">Written by the tensorcheck CLI; this page is self-contained.</p>\n";
  out += "</body>\n</html>\n";
  return out;
}

int SweepExitCode(const std::vector<LayerResult>& layers, const SweepSummary& summary) {
  int code = 0;
  for (size_t i = 0; i < layers.size(); ++i) {
    switch (summary.layers[i].status) {
      case LayerStatus::kPassed:
        break;
      case LayerStatus::kFailed:
        code = std::max(code, 1);
        break;
      case LayerStatus::kError:
        code = std::max(
            code, layers[i].rpc == LayerRpc::kError && IsRejection(layers[i].error_code) ? 2 : 3);
        break;
      case LayerStatus::kNotChecked:
        code = std::max(code, 3);
        break;
    }
  }
  return code;
}

}  // namespace tensorcheck::cli::internal
