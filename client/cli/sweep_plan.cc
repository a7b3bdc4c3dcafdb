// The layer calls of a captures file and their weights
// (internal/sweep_plan.h).
#include "client/cli/internal/sweep_plan.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"
#include "core/tensor.h"
#include "nlohmann/json.hpp"

namespace tensorcheck::cli::internal {
namespace {

constexpr absl::string_view kInputSuffix = ".input";
constexpr absl::string_view kOutputSuffix = ".output";

// Names listed in a message at most.
constexpr size_t kListed = 8;
// Unused tensors of a --weights file listed at most.
constexpr size_t kListedWeights = 10;
// What a layer's tensors are called after its checkpoint prefix.
constexpr absl::string_view kWeightRoles[] = {".weight", ".kernel", ".bias"};

std::string ListOf(const std::vector<std::string>& names, size_t limit = kListed) {
  std::vector<std::string> shown;
  for (size_t i = 0; i < names.size() && i < limit; ++i) shown.push_back("'" + names[i] + "'");
  std::string out = absl::StrJoin(shown, ", ");
  if (names.size() > limit) absl::StrAppend(&out, ", ... (", names.size() - limit, " more)");
  return out;
}

bool IsCaptureTensor(absl::string_view name) {
  return absl::EndsWith(name, kInputSuffix) || absl::EndsWith(name, kOutputSuffix);
}

// The checkpoint prefix of a layer's weights: what the map gives it, else
// its own name.
const std::string& PrefixOf(const std::string& layer,
                            const std::map<std::string, std::string>& layer_map) {
  auto it = layer_map.find(layer);
  return it == layer_map.end() ? layer : it->second;
}

// The shortest dotted prefix ("model.", "module.") that every name (sorted,
// non-empty) starts with and whose removal makes one of them a name in
// `wanted`; empty when there is none.
std::string StrippablePrefix(const std::vector<std::string>& names,
                             const std::set<std::string>& wanted) {
  for (size_t dot = names[0].find('.'); dot != std::string::npos;
       dot = names[0].find('.', dot + 1)) {
    const absl::string_view prefix = absl::string_view(names[0]).substr(0, dot + 1);
    bool found = false;
    for (const std::string& n : names) {
      if (!absl::StartsWith(n, prefix)) return "";
      found = found || wanted.count(n.substr(prefix.size())) > 0;
    }
    if (found) return std::string(prefix);
  }
  return "";
}

std::string Shape(const std::vector<int64_t>& s) { return ShapeString(s); }

}  // namespace

std::string LayerCallName::Full() const {
  return call == 0 ? layer : absl::StrCat(layer, "#", call);
}

absl::StatusOr<LayerCallName> ParseLayerCallName(absl::string_view s) {
  LayerCallName out;
  const size_t hash = s.rfind('#');
  if (hash == absl::string_view::npos) {
    out.layer = std::string(s);
  } else {
    out.layer = std::string(s.substr(0, hash));
    const absl::string_view index = s.substr(hash + 1);
    int call = 0;
    const bool digits = !index.empty() && std::all_of(index.begin(), index.end(), [](char c) {
      return absl::ascii_isdigit(c);
    });
    if (!digits || index[0] == '0' || !absl::SimpleAtoi(index, &call)) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer call '", s,
                       "': a call index of 1 or more expected after '#' (the first call has "
                       "no '#')"));
    }
    out.call = call;
  }
  if (out.layer.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("layer call '", s, "': empty layer name"));
  }
  return out;
}

absl::StatusOr<std::optional<CaptureTensorName>> ParseCaptureTensorName(absl::string_view tensor) {
  CaptureTensorName out;
  absl::string_view base;
  if (absl::EndsWith(tensor, kInputSuffix)) {
    base = tensor.substr(0, tensor.size() - kInputSuffix.size());
    out.role = "input";
  } else if (absl::EndsWith(tensor, kOutputSuffix)) {
    base = tensor.substr(0, tensor.size() - kOutputSuffix.size());
    out.role = "output";
  } else {
    return std::optional<CaptureTensorName>();
  }
  auto call = ParseLayerCallName(base);
  if (!call.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", tensor, "': ", call.status().message()));
  }
  out.call = *std::move(call);
  return std::optional<CaptureTensorName>(std::move(out));
}

absl::StatusOr<std::vector<CapturedCall>> PlanCaptures(const SafetensorsIndex& captures,
                                                       const std::string& file) {
  // Full name -> call, in name order.
  std::map<std::string, CapturedCall> calls;
  std::map<std::string, bool> has_input, has_output;
  for (const SafetensorsTensorInfo& t : captures.tensors) {
    auto parsed = ParseCaptureTensorName(t.name);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(file, ": ", parsed.status().message()));
    }
    if (!parsed->has_value()) continue;
    const CaptureTensorName& n = **parsed;
    const std::string full = n.call.Full();
    CapturedCall& c = calls[full];
    c.name = n.call;
    if (n.role == "input") {
      c.input = t;
      has_input[full] = true;
    } else {
      c.output = t;
      has_output[full] = true;
    }
  }
  if (calls.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no layer captures found in ", file, ": expected '{layer}.input' and '{layer}.output'"));
  }
  for (const auto& [full, c] : calls) {
    if (!has_output[full]) {
      return absl::InvalidArgumentError(absl::StrCat("layer '", full, "' in ", file, ": '",
                                                     c.input.name, "' has no '", full,
                                                     kOutputSuffix, "' beside it"));
    }
    if (!has_input[full]) {
      return absl::InvalidArgumentError(absl::StrCat("layer '", full, "' in ", file, ": '",
                                                     c.output.name, "' has no '", full,
                                                     kInputSuffix, "' beside it"));
    }
  }

  std::vector<CapturedCall> order;
  auto listed = captures.metadata.find(std::string(kLayersMetadataKey));
  if (listed == captures.metadata.end()) {
    for (auto& [full, c] : calls) order.push_back(c);
    std::stable_sort(order.begin(), order.end(), [](const CapturedCall& a, const CapturedCall& b) {
      return std::tie(a.input.data_begin, a.input.data_end) <
             std::tie(b.input.data_begin, b.input.data_end);
    });
    return order;
  }
  const std::string what = absl::StrCat(file, ": __metadata__[\"", kLayersMetadataKey, "\"]");
  const nlohmann::json j = nlohmann::json::parse(listed->second, /*cb=*/nullptr,
                                                 /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": a JSON array of layer-call names expected"));
  }
  std::set<std::string> seen;
  for (const nlohmann::json& v : j) {
    if (!v.is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": strings expected, found ", v.dump(-1, ' ', true)));
    }
    const std::string name = v.get<std::string>();
    auto parsed = ParseLayerCallName(name);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", parsed.status().message()));
    }
    auto it = calls.find(parsed->Full());
    if (it == calls.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": lists '", name, "', but the file has no '", parsed->Full(), kInputSuffix, "'"));
    }
    if (!seen.insert(it->first).second) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": lists '", name, "' twice"));
    }
    order.push_back(it->second);
  }
  std::vector<std::string> unlisted;
  for (const auto& [full, c] : calls) {
    if (seen.count(full) == 0) unlisted.push_back(full);
  }
  if (!unlisted.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": does not list ", ListOf(unlisted),
                     ", captured in the file (list every layer call, in execution order)"));
  }
  return order;
}

absl::StatusOr<WeightIndex> WeightIndex::Build(
    const std::vector<std::pair<std::string, SafetensorsIndex>>& files) {
  WeightIndex w;
  std::vector<std::string> names;
  for (const auto& [file, index] : files) {
    names.push_back(file);
    for (const SafetensorsTensorInfo& t : index.tensors) {
      auto [it, inserted] = w.by_name_.emplace(t.name, WeightSource{file, t});
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrCat("--weights: tensor '", t.name,
                                                       "' is in both ", it->second.file, " and ",
                                                       file, "; which one is meant?"));
      }
    }
  }
  w.files_ = absl::StrJoin(names, ", ");
  return w;
}

const WeightSource* WeightIndex::Find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &it->second;
}

absl::Status CheckWeightsFilesUsed(
    const std::vector<std::pair<std::string, SafetensorsIndex>>& files,
    const std::vector<CapturedCall>& calls, const std::map<std::string, std::string>& layer_map) {
  // Every name a layer call may take a tensor under.
  std::set<std::string> wanted;
  for (const CapturedCall& c : calls) {
    const std::string& prefix = PrefixOf(c.name.layer, layer_map);
    for (absl::string_view role : kWeightRoles) wanted.insert(absl::StrCat(prefix, role));
  }
  for (const auto& [file, index] : files) {
    std::vector<std::string> unused;
    bool used = false;
    for (const SafetensorsTensorInfo& t : index.tensors) {
      if (IsCaptureTensor(t.name)) continue;
      used = used || wanted.count(t.name) > 0;
      unused.push_back(t.name);
    }
    if (used || unused.empty()) continue;
    std::sort(unused.begin(), unused.end());
    std::string message = absl::StrCat(
        "--weights ", file, ": no captured layer call takes a weight or bias from it; its ",
        unused.size(),
        unused.size() == 1 ? " tensor: " : " tensors: ", ListOf(unused, kListedWeights));
    const std::string strip = StrippablePrefix(unused, wanted);
    if (!strip.empty()) {
      // A map entry for the first layer call found under that prefix, as
      // the example.
      const std::set<std::string> names(unused.begin(), unused.end());
      std::string example;
      for (const CapturedCall& c : calls) {
        const std::string& prefix = PrefixOf(c.name.layer, layer_map);
        for (absl::string_view role : kWeightRoles) {
          if (example.empty() && names.count(absl::StrCat(strip, prefix, role)) > 0) {
            example = absl::StrCat("{\"", c.name.layer, "\": \"", strip, prefix, "\", ...}");
          }
        }
      }
      absl::StrAppend(&message, "; they all start with \"", strip,
                      "\": map each layer to its name under that prefix with --map FILE (", example,
                      ")");
    } else {
      absl::StrAppend(&message,
                      " (a layer's weights are '{w}.weight' or '{w}.kernel' and '{w}.bias', "
                      "'{w}' its name or what --map gives it; leave out a file that holds none)");
    }
    return absl::InvalidArgumentError(message);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::map<std::string, std::string>> ParseLayerMap(absl::string_view json,
                                                                 const std::string& file) {
  const nlohmann::json j = nlohmann::json::parse(json.begin(), json.end(), /*cb=*/nullptr,
                                                 /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat("--map ", file, ": not valid JSON"));
  }
  if (!j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--map ", file,
                     ": a JSON object {\"capture layer name\": \"checkpoint prefix\"} expected, "
                     "found ",
                     j.type_name()));
  }
  std::map<std::string, std::string> out;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!it.value().is_string() || it.value().get<std::string>().empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--map ", file, ": '", it.key(),
                                                     "': a non-empty string expected, found ",
                                                     it.value().dump(-1, ' ', true)));
    }
    out[it.key()] = it.value().get<std::string>();
  }
  return out;
}

absl::StatusOr<LayerPlan> ResolveLayer(const CapturedCall& call, const std::string& captures_file,
                                       const WeightIndex& weights,
                                       const std::map<std::string, std::string>& layer_map) {
  const std::string layer = absl::StrCat("layer '", call.name.Full(), "'");
  LayerPlan p;
  p.call = call;
  auto mapped = layer_map.find(call.name.layer);
  p.prefix = mapped == layer_map.end() ? call.name.layer : mapped->second;

  const WeightSource* w = weights.Find(p.prefix + ".weight");
  const WeightSource* k = weights.Find(p.prefix + ".kernel");
  if (w == nullptr && k == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        layer, " (", captures_file, "): no weight '", p.prefix, ".weight' or '", p.prefix,
        ".kernel' in --weights ", weights.files(),
        mapped == layer_map.end() ? " (map the layer to its checkpoint prefix with --map FILE)"
                                  : " (the prefix --map gives it)"));
  }
  if (w != nullptr && k != nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(layer, ": both ", w->Label(), " and ",
                                                   k->Label(), "; which one is its weight?"));
  }
  p.in_out = w == nullptr;
  p.weight = w != nullptr ? *w : *k;
  if (const WeightSource* b = weights.Find(p.prefix + ".bias"); b != nullptr) p.bias = *b;

  // Dtypes: input, output and weight alike, the bias any float dtype.
  const SafetensorsTensorInfo& x = call.input;
  const SafetensorsTensorInfo& y = call.output;
  const SafetensorsTensorInfo& wt = p.weight.info;
  for (const auto& [label, info] :
       {std::pair<std::string, const SafetensorsTensorInfo*>{captures_file + ":" + x.name, &x},
        {captures_file + ":" + y.name, &y},
        {p.weight.Label(), &wt},
        {p.bias ? p.bias->Label() : "", p.bias ? &p.bias->info : nullptr}}) {
    if (info == nullptr) continue;
    const std::optional<DType> d = SafetensorsDTypeOf(info->dtype);
    if (!d.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(layer, ": ", label,
                                                     ": dtype F64, F32, F16 or BF16 expected, "
                                                     "found ",
                                                     info->dtype));
    }
    // An FP8 layer needs its dequantisation scales, which a captures file
    // does not carry by any convention the sweep knows.
    if (IsFp8(*d)) {
      return absl::InvalidArgumentError(absl::StrCat(
          layer, ": ", label, ": dtype F64, F32, F16 or BF16 expected, found ", info->dtype, " (",
          DTypeName(*d),
          "); sweep does not check FP8 layers (it has no dequantisation scales for them): check "
          "one with `tensorcheck verify` or `diagnose` and --input-scale/--weight-scale"));
    }
  }
  if (x.dtype != wt.dtype || x.dtype != y.dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat(layer, ": input, weight and output of one dtype expected, found ", x.dtype,
                     " (", captures_file, ":", x.name, "), ", wt.dtype, " (", p.weight.Label(),
                     "), ", y.dtype, " (", captures_file, ":", y.name, ")"));
  }
  p.dtype = *SafetensorsDTypeOf(x.dtype);

  // Shapes.
  const std::string shapes =
      absl::StrCat(x.name, " ", Shape(x.shape), ", ", y.name, " ", Shape(y.shape), ", ",
                   p.weight.Label(), " ", Shape(wt.shape));
  if (x.shape.empty() || x.shape.back() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(layer, ": input [..., K] with K >= 1 expected; ", shapes));
  }
  if (wt.shape.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(layer, ": a weight of rank 2 expected (",
                                                   p.in_out ? "[K, N]" : "[N, K]", "); ", shapes));
  }
  const int64_t kdim = x.shape.back();
  const int64_t w_k = p.in_out ? wt.shape[0] : wt.shape[1];
  const int64_t n = p.in_out ? wt.shape[1] : wt.shape[0];
  if (w_k != kdim) {
    return absl::InvalidArgumentError(
        absl::StrCat(layer, ": the weight's K (", w_k, ") does not match the input's last dim (",
                     kdim, "); ", shapes, p.in_out ? " ([K, N], in_out)" : " ([N, K], out_in)"));
  }
  std::vector<int64_t> expected_out(x.shape.begin(), x.shape.end() - 1);
  expected_out.push_back(n);
  if (y.shape != expected_out) {
    return absl::InvalidArgumentError(absl::StrCat(layer, ": output ", Shape(expected_out),
                                                   " expected (the input's leading dims, N=", n,
                                                   "); ", shapes));
  }
  if (p.bias && (p.bias->info.shape.size() != 1 || p.bias->info.shape[0] != n)) {
    return absl::InvalidArgumentError(absl::StrCat(
        layer, ": bias [", n, "] expected, ", p.bias->Label(), " is ", Shape(p.bias->info.shape)));
  }
  return p;
}

}  // namespace tensorcheck::cli::internal
