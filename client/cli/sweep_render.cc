// The renderer of a whole-model check and its JSON report read back
// (internal/sweep_render.h).
#include "client/cli/internal/sweep_render.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/cli/html_report.h"
#include "client/cli/tensor_io.h"
#include "core/status_macros.h"
#include "google/protobuf/util/json_util.h"

namespace tensorcheck::cli::internal {
namespace {

using Json = nlohmann::ordered_json;

// Heatmap colour scales per layer call's section, so that ids stay unique
// on the page.
constexpr int kHeatmapIdsPerLayer = 64;

absl::Status Bad(const std::string& path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

// What a JSON value is, for messages.
std::string TypeName(const Json& v) {
  if (v.is_number_integer()) return "an integer";
  if (v.is_number_float()) return "a number";
  return absl::StrCat(v.is_object() || v.is_array() ? "an " : "a ", v.type_name());
}

absl::StatusOr<const Json*> Key(const Json& object, const std::string& path,
                                const std::string& key) {
  auto it = object.find(key);
  if (it == object.end()) return Bad(path.empty() ? key : absl::StrCat(path, ".", key), "missing");
  return &*it;
}

absl::StatusOr<std::string> String(const Json& v, const std::string& path) {
  if (!v.is_string()) return Bad(path, absl::StrCat("a string expected, found ", TypeName(v)));
  return v.get<std::string>();
}

absl::StatusOr<bool> Bool(const Json& v, const std::string& path) {
  if (!v.is_boolean())
    return Bad(path, absl::StrCat("true or false expected, found ", TypeName(v)));
  return v.get<bool>();
}

// A non-negative integer that fits int64.
absl::StatusOr<int64_t> Count(const Json& v, const std::string& path) {
  if (v.is_number_unsigned() && v.get<uint64_t>() <= uint64_t{INT64_MAX}) {
    return static_cast<int64_t>(v.get<uint64_t>());
  }
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return v.get<int64_t>();
  return Bad(path, absl::StrCat("a non-negative integer expected, found ",
                                v.is_number_integer() ? v.dump() : TypeName(v)));
}

absl::StatusOr<std::vector<int64_t>> Shape(const Json& v, const std::string& path) {
  if (!v.is_array()) return Bad(path, absl::StrCat("an array expected, found ", TypeName(v)));
  std::vector<int64_t> shape;
  for (size_t i = 0; i < v.size(); ++i) {
    TC_ASSIGN_OR_RETURN(int64_t d, Count(v[i], absl::StrCat(path, "[", i, "]")));
    shape.push_back(d);
  }
  return shape;
}

absl::StatusOr<DType> DTypeOf(const Json& v, const std::string& path) {
  TC_ASSIGN_OR_RETURN(std::string name, String(v, path));
  // A model's layer calls come in these four, by the names the report
  // writes (DTypeName).
  for (DType d : {DType::kFloat64, DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    if (DTypeName(d) == name) return d;
  }
  return Bad(path, absl::StrCat("\"float64\", \"float32\", \"float16\" or \"bfloat16\" expected, "
                                "found \"",
                                name, "\""));
}

// A gRPC code by its name ("INVALID_ARGUMENT"), as absl names it.
absl::StatusOr<int> CodeOf(const Json& v, const std::string& path) {
  TC_ASSIGN_OR_RETURN(std::string name, String(v, path));
  for (int c = 0; c <= static_cast<int>(absl::StatusCode::kUnauthenticated); ++c) {
    if (absl::StatusCodeToString(static_cast<absl::StatusCode>(c)) == name) return c;
  }
  return Bad(path, absl::StrCat("a gRPC status code name (\"INVALID_ARGUMENT\", ...) expected, "
                                "found \"",
                                name, "\""));
}

absl::StatusOr<LayerResult> ParseLayer(const Json& j, const std::string& path) {
  if (!j.is_object()) return Bad(path, absl::StrCat("an object expected, found ", TypeName(j)));
  LayerResult l;
  auto at = [&](const std::string& key) { return Key(j, path, key); };
  auto sub = [&](const std::string& key) { return absl::StrCat(path, ".", key); };
  TC_ASSIGN_OR_RETURN(const Json* name, at("name"));
  TC_ASSIGN_OR_RETURN(l.layer, String(*name, sub("name")));
  TC_ASSIGN_OR_RETURN(const Json* call, at("call"));
  TC_ASSIGN_OR_RETURN(int64_t call_index, Count(*call, sub("call")));
  if (call_index > std::numeric_limits<int>::max()) return Bad(sub("call"), "too large");
  l.call = static_cast<int>(call_index);
  TC_ASSIGN_OR_RETURN(const Json* input_shape, at("input_shape"));
  TC_ASSIGN_OR_RETURN(l.input_shape, Shape(*input_shape, sub("input_shape")));
  TC_ASSIGN_OR_RETURN(const Json* weight_shape, at("weight_shape"));
  TC_ASSIGN_OR_RETURN(l.weight_shape, Shape(*weight_shape, sub("weight_shape")));
  TC_ASSIGN_OR_RETURN(const Json* layout, at("weight_layout"));
  TC_ASSIGN_OR_RETURN(std::string layout_name, String(*layout, sub("weight_layout")));
  if (layout_name != "out_in" && layout_name != "in_out") {
    return Bad(sub("weight_layout"),
               absl::StrCat("\"out_in\" or \"in_out\" expected, found \"", layout_name, "\""));
  }
  l.in_out = layout_name == "in_out";
  TC_ASSIGN_OR_RETURN(const Json* dtype, at("dtype"));
  TC_ASSIGN_OR_RETURN(l.dtype, DTypeOf(*dtype, sub("dtype")));

  TC_ASSIGN_OR_RETURN(const Json* response, at("response"));
  TC_ASSIGN_OR_RETURN(const Json* status, at("status"));
  TC_ASSIGN_OR_RETURN(std::string status_name, String(*status, sub("status")));
  const LayerStatus statuses[] = {LayerStatus::kPassed, LayerStatus::kFailed, LayerStatus::kError,
                                  LayerStatus::kNotChecked};
  if (std::none_of(std::begin(statuses), std::end(statuses),
                   [&](LayerStatus s) { return status_name == LayerStatusName(s); })) {
    return Bad(sub("status"),
               absl::StrCat("\"passed\", \"failed\", \"error\" or \"not_checked\" expected, "
                            "found \"",
                            status_name, "\""));
  }
  TC_ASSIGN_OR_RETURN(const Json* error, at("error"));
  TC_ASSIGN_OR_RETURN(const Json* error_code, at("error_code"));
  if (!error->is_null()) TC_RETURN_IF_ERROR(String(*error, sub("error")).status());
  if (!error_code->is_null()) TC_RETURN_IF_ERROR(CodeOf(*error_code, sub("error_code")).status());

  if (!response->is_null()) {
    if (!response->is_object()) {
      return Bad(sub("response"), absl::StrCat("an object (a VerifyResponse in protobuf's JSON "
                                               "mapping) or null expected, found ",
                                               TypeName(*response)));
    }
    // Strict: a field or enum value this CLI's API lacks is an error, not
    // dropped (a misspelt one would change the rendering without a word).
    const auto parsed = google::protobuf::util::JsonStringToMessage(response->dump(), &l.response);
    if (!parsed.ok()) return Bad(sub("response"), parsed.message().ToString());
    l.rpc = LayerRpc::kOk;
    // This call's transfers live in its report.
    TC_ASSIGN_OR_RETURN(const Json* report, at("report"));
    if (!report->is_object()) {
      return Bad(sub("report"),
                 absl::StrCat("an object expected beside a response, found ", TypeName(*report)));
    }
    const std::string report_path = sub("report");
    TC_ASSIGN_OR_RETURN(const Json* uploaded, Key(*report, report_path, "uploaded_bytes"));
    TC_ASSIGN_OR_RETURN(l.uploaded_bytes,
                        Count(*uploaded, absl::StrCat(report_path, ".uploaded_bytes")));
    TC_ASSIGN_OR_RETURN(const Json* reused, Key(*report, report_path, "reused_bytes"));
    TC_ASSIGN_OR_RETURN(l.reused_bytes, Count(*reused, absl::StrCat(report_path, ".reused_bytes")));
    return l;
  }
  // No answer: a failed RPC, or a call never sent.
  if (status_name == LayerStatusName(LayerStatus::kNotChecked)) {
    l.rpc = LayerRpc::kNotChecked;
    return l;
  }
  if (status_name != LayerStatusName(LayerStatus::kError)) {
    return Bad(sub("response"),
               absl::StrCat("null, but status is \"", status_name,
                            "\": a layer call without a response is \"error\" or \"not_checked\""));
  }
  if (error->is_null()) return Bad(sub("error"), "null, but status is \"error\"");
  if (error_code->is_null()) return Bad(sub("error_code"), "null, but status is \"error\"");
  l.rpc = LayerRpc::kError;
  l.error = error->get<std::string>();
  TC_ASSIGN_OR_RETURN(l.error_code, CodeOf(*error_code, sub("error_code")));
  return l;
}

}  // namespace

absl::StatusOr<SweepReport> ParseSweepReport(absl::string_view json_text) {
  Json j;
  try {
    j = Json::parse(json_text.begin(), json_text.end());
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("not JSON: ", e.what()));
  }
  if (!j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a JSON object (the report of tensorcheck sweep --json) expected, found ", TypeName(j)));
  }
  SweepReport report;
  TC_ASSIGN_OR_RETURN(const Json* diagnose, Key(j, "", "diagnose"));
  TC_ASSIGN_OR_RETURN(report.options.diagnose, Bool(*diagnose, "diagnose"));
  TC_ASSIGN_OR_RETURN(const Json* threshold, Key(j, "", "bound_threshold"));
  if (!threshold->is_null()) {
    if (!threshold->is_number() || !std::isfinite(threshold->get<double>()) ||
        threshold->get<double>() <= 0) {
      return Bad("bound_threshold",
                 absl::StrCat("a positive number or null expected, found ", threshold->dump()));
    }
    report.options.bound_threshold = threshold->get<double>();
  }
  for (auto [key, field] : {std::pair{"framework", &report.options.framework},
                            std::pair{"model", &report.options.model}}) {
    // Optional: what was checked (the Python client's report names it).
    const auto it = j.find(key);
    if (it == j.end() || it->is_null()) continue;
    if (!it->is_string()) {
      return Bad(key, absl::StrCat("a string expected, found ", it->dump()));
    }
    *field = it->get<std::string>();
  }
  TC_ASSIGN_OR_RETURN(const Json* uploaded, Key(j, "", "uploaded_bytes"));
  TC_ASSIGN_OR_RETURN(report.counts.uploaded_bytes, Count(*uploaded, "uploaded_bytes"));
  TC_ASSIGN_OR_RETURN(const Json* reused, Key(j, "", "reused_bytes"));
  TC_ASSIGN_OR_RETURN(report.counts.reused_bytes, Count(*reused, "reused_bytes"));
  TC_ASSIGN_OR_RETURN(const Json* layers, Key(j, "", "layers"));
  if (!layers->is_array()) {
    return Bad("layers", absl::StrCat("an array expected, found ", TypeName(*layers)));
  }
  for (size_t i = 0; i < layers->size(); ++i) {
    TC_ASSIGN_OR_RETURN(LayerResult l, ParseLayer((*layers)[i], absl::StrCat("layers[", i, "]")));
    report.layers.push_back(std::move(l));
  }
  return report;
}

absl::StatusOr<SweepRendering> RenderSweep(SweepReport report, const SweepRenderRequest& want) {
  std::vector<LayerResult>& layers = report.layers;
  const SweepOptions& options = report.options;
  if (want.html) {
    const ReportContext ctx{options.diagnose ? "diagnose" : "verify"};
    for (size_t i = 0; i < layers.size(); ++i) {
      LayerResult& l = layers[i];
      if (l.rpc != LayerRpc::kOk) continue;
      std::optional<Tensor> observed;
      if (!want.captures.empty()) {
        TC_ASSIGN_OR_RETURN(
            observed, ReadSafetensorsFile(want.captures, absl::StrCat(l.FullName(), ".output")));
      }
      HtmlOptions opts;
      opts.first_heatmap_id = static_cast<int>(i) * kHeatmapIdsPerLayer;
      opts.max_heatmaps = std::min(opts.max_heatmaps, kHeatmapIdsPerLayer);
      l.html_section =
          FormatHtmlSection(l.response, ctx, observed.has_value() ? &*observed : nullptr, opts);
    }
  }
  const SweepSummary summary = Summarize(layers, options);
  SweepRendering out;
  if (want.json) {
    out.stdout_text = SweepToJson(layers, summary, report.counts, options).dump(2) + "\n";
  } else if (want.text) {
    out.stdout_text = FormatSweepText(layers, summary, options);
  }
  if (want.junit) out.junit = FormatSweepJUnit(layers, summary);
  if (want.html) out.html = FormatSweepHtml(layers, summary, options);
  if (want.github) {
    out.github_annotations = FormatSweepGithubAnnotations(layers, summary);
    out.github_summary = FormatSweepGithubSummary(layers, summary);
  }
  out.exit_code = SweepExitCode(layers, summary);
  return out;
}

}  // namespace tensorcheck::cli::internal
