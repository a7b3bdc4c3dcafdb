// What `tensorcheck sweep` checks, worked out from files before anything is
// sent: the layer calls of a captures file in execution order, and for each
// its weight and bias in the weights files (docs/model-checks.md, "Captures
// file"). Internal to client/cli; no gRPC.
//
//   TC_ASSIGN_OR_RETURN(SafetensorsIndex caps, ReadSafetensorsIndex("captures.safetensors"));
//   TC_ASSIGN_OR_RETURN(std::vector<CapturedCall> calls,
//                       PlanCaptures(caps, "captures.safetensors"));
//   TC_ASSIGN_OR_RETURN(WeightIndex weights, WeightIndex::Build({{"model.safetensors", idx}}));
//   for (const CapturedCall& c : calls) {
//     TC_ASSIGN_OR_RETURN(LayerPlan p, ResolveLayer(c, "captures.safetensors", weights, {}));
//   }
//
// Names: `{layer}.input` [..., K] and `{layer}.output` [..., N] hold the
// first call of module `{layer}`, `{layer}#1.input` ... the second, and so
// on. Weights: `{w}.weight` [N, K] (out_in) or `{w}.kernel` [K, N]
// (in_out), optional `{w}.bias` [N], where `{w}` is the layer's name or what
// the --map file maps it to.
//
// Every error is INVALID_ARGUMENT whose message names the layer and file.
// Pure functions; thread-safe.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/cli/tensor_io.h"
#include "core/dtype.h"

namespace tensorcheck::cli::internal {

// The metadata key whose value (a JSON array of layer-call names) gives the
// execution order.
inline constexpr absl::string_view kLayersMetadataKey = "tensorcheck.layers";

// A layer call's name: "blocks.0.attn.qkv" for call 0, "lm_head#2" for call 2.
struct LayerCallName {
  std::string layer;
  int call = 0;

  // The name as the captures file writes it: "layer" or "layer#i".
  std::string Full() const;
};

// Splits "layer#i" (i >= 1, no leading zeros) or "layer"; an empty layer
// name, an empty or malformed call index, and "#0" are errors.
absl::StatusOr<LayerCallName> ParseLayerCallName(absl::string_view s);

// A tensor of the captures file split into its layer call and role ("input"
// or "output"); nullopt for a tensor that is neither (a weight kept in the
// same file, say).
struct CaptureTensorName {
  LayerCallName call;
  std::string role;
};
absl::StatusOr<std::optional<CaptureTensorName>> ParseCaptureTensorName(absl::string_view tensor);

// One layer call of the captures file.
struct CapturedCall {
  LayerCallName name;
  SafetensorsTensorInfo input;
  SafetensorsTensorInfo output;
};

// The layer calls of a captures file in execution order: the order of
// `__metadata__["tensorcheck.layers"]` when present (it must list every call
// once and nothing else), else the order of the `.input` tensors' data
// offsets. `file` labels messages.
absl::StatusOr<std::vector<CapturedCall>> PlanCaptures(const SafetensorsIndex& captures,
                                                       const std::string& file);

// A tensor of one of the weights files.
struct WeightSource {
  std::string file;
  SafetensorsTensorInfo info;

  // "model.safetensors:fc.weight".
  std::string Label() const { return file + ":" + info.name; }
};

// The tensors of every --weights file by name; a name in two files is an
// error naming both.
class WeightIndex {
 public:
  static absl::StatusOr<WeightIndex> Build(
      const std::vector<std::pair<std::string, SafetensorsIndex>>& files);

  const WeightSource* Find(const std::string& name) const;
  // The files, comma-separated, for messages.
  const std::string& files() const { return files_; }

 private:
  std::map<std::string, WeightSource> by_name_;
  std::string files_;
};

// Checks that every --weights file gives at least one of `calls` its weight
// or bias (`{w}.weight`, `{w}.kernel`, `{w}.bias`, `{w}` the layer's name or
// what `layer_map` gives it). A file of which no call uses a tensor (tensors
// named `*.input` and `*.output`, captures, aside) is an error listing its
// tensors, sorted (the first 10 and a count), with the prefix they all carry
// when removing it would make them match ("model."), as a --map example:
// otherwise the layer calls would silently take their weights from another
// file (a captures file that holds them too) and the checkpoint go
// unchecked. The sweep knows no model beyond the captured layer calls, so a
// file that gives some call its weights may hold anything else (norms,
// embeddings).
absl::Status CheckWeightsFilesUsed(
    const std::vector<std::pair<std::string, SafetensorsIndex>>& files,
    const std::vector<CapturedCall>& calls, const std::map<std::string, std::string>& layer_map);

// The --map file's JSON object {"capture layer name": "checkpoint prefix"};
// `file` labels messages.
absl::StatusOr<std::map<std::string, std::string>> ParseLayerMap(absl::string_view json,
                                                                 const std::string& file);

// Everything one layer call's request needs.
struct LayerPlan {
  CapturedCall call;
  // The checkpoint prefix its weights were looked up under.
  std::string prefix;
  WeightSource weight;
  // true: `{w}.kernel` [K, N]; false: `{w}.weight` [N, K].
  bool in_out = false;
  std::optional<WeightSource> bias;
  DType dtype = DType::kFloat32;
};

// Finds the weight (and bias) of `call` and checks dtypes and shapes:
// input [..., K], output [..., N] with the same leading dims, weight [N, K]
// or [K, N], bias [N]; input, output and weight of one dtype (F64, F32, F16
// or BF16), the bias of any of those four. FP8 tensors (F8_E4M3, F8_E5M2)
// are refused: a sweep has no dequantisation scales to send with them.
absl::StatusOr<LayerPlan> ResolveLayer(const CapturedCall& call, const std::string& captures_file,
                                       const WeightIndex& weights,
                                       const std::map<std::string, std::string>& layer_map);

}  // namespace tensorcheck::cli::internal
