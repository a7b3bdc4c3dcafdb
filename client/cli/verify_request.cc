// The request of verify and diagnose from their flags (internal/verify_request.h).
#include "client/cli/internal/verify_request.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "client/cli/tensor_io.h"
#include "client/cli/tensor_ref.h"
#include "core/dtype.h"
#include "core/linear_config.h"
#include "core/status_macros.h"
#include "proto/dtype_proto.h"

namespace tensorcheck::cli::internal {
namespace {

// Reads tensor argument `arg` of flag --`flag` into `out`: a file's bytes,
// or a `sha256:` argument's digest (client/cli/tensor_ref.h).
// `opts.expected_dtype`, when set, is required; `requirement` says who
// requires it, for a digest whose dtype is another.
absl::Status LoadTensorArg(const std::string& arg, const std::string& flag,
                           const TensorReadOptions& opts, absl::string_view requirement,
                           const std::string& field, pb::Tensor* out,
                           std::vector<HeldTensor>* held) {
  if (IsDigestArg(arg)) {
    // Already in the server's store: dtype and shape come from the argument.
    auto ref = ParseTensorRef(arg);
    if (!ref.ok()) return Usage(absl::StrCat("--", flag, ": ", ref.status().message()));
    if (opts.expected_dtype.has_value() && *opts.expected_dtype != ref->dtype &&
        std::find(opts.also_named.begin(), opts.also_named.end(), ref->dtype) ==
            opts.also_named.end()) {
      return Usage(absl::StrCat("--", flag, ": the digest argument says ",
                                DTypeShortName(ref->dtype), " but ", requirement));
    }
    out->set_dtype(DTypeToProto(ref->dtype));
    for (int64_t d : ref->shape) out->add_shape(d);
    out->set_digest(ref->digest());
    return absl::OkStatus();
  }
  auto t = ReadTensorArg(arg, opts);
  if (!t.ok()) {
    return absl::Status(t.status().code(), absl::StrCat("--", flag, ": ", t.status().message()));
  }
  out->set_dtype(DTypeToProto(t->dtype()));
  for (int64_t d : t->shape()) out->add_shape(d);
  if (held != nullptr && static_cast<int64_t>(t->nbytes()) > kInlineMaxBytes) {
    held->push_back(HeldTensor{field, *std::move(t)});
  } else {
    out->set_data(t->bytes().data(), t->bytes().size());
  }
  return absl::OkStatus();
}

// LoadTensorArg of the flag's last value.
absl::Status LoadTensor(const CommandLine& cl, const std::string& flag,
                        const TensorReadOptions& opts, absl::string_view requirement,
                        const std::string& field, pb::Tensor* out, std::vector<HeldTensor>* held) {
  return LoadTensorArg(cl.Get(flag), flag, opts, requirement, field, out, held);
}

// An operand (--input, --weight, --bias, --observed), of the dtype --dtype
// names for it if it names one.
absl::Status LoadOperand(const CommandLine& cl, const std::string& flag,
                         const std::map<std::string, DType>& dtypes, const std::string& field,
                         pb::Tensor* out, std::vector<HeldTensor>* held) {
  TensorReadOptions opts;
  std::string requirement;
  if (auto it = dtypes.find(flag); it != dtypes.end()) {
    opts.expected_dtype = it->second;
    requirement = absl::StrCat("--dtype ", flag, "=", DTypeShortName(it->second));
  }
  return LoadTensor(cl, flag, opts, requirement, field, out, held);
}

// A dequantisation scale (--input-scale, --weight-scale, and NVFP4's
// --input-global-scale, --weight-global-scale): a number is one per-tensor
// scale, rounded to float32, of shape [] (torch._scaled_mm's scalar
// scale); anything else is a tensor argument holding float32, or, for the
// block scales, the dtype `--dtype FLAG=DTYPE` names (MXFP8's e8m0, NVFP4's
// fp8e4m3: docs/numerics.md, "MXFP8 and NVFP4"), which the server judges.
absl::Status LoadScale(const CommandLine& cl, const std::string& flag, const std::string& field,
                       const std::map<std::string, DType>& dtypes, pb::Tensor* out,
                       std::vector<HeldTensor>* held) {
  const std::string arg = cl.Get(flag);
  float v;
  // SimpleAtof rounds the decimal once, to the nearest float32.
  if (absl::SimpleAtof(arg, &v)) {
    // The server's rule for every scale element, in its words
    // (docs/numerics.md, "FP8"); checked here too only because the number
    // is parsed here: the flag is named, and a decimal that rounds to 0
    // in float32 is said to.
    if (!std::isfinite(v) || !(v > 0)) {
      double d = 0;
      const bool underflow = v == 0 && absl::SimpleAtod(arg, &d) && d > 0;
      return Usage(absl::StrCat("--", flag, ": a finite, positive float32 scale expected, got '",
                                arg, "'", underflow ? " (0 in float32)" : ""));
    }
    out->set_dtype(pb::DTYPE_FLOAT32);
    out->clear_shape();
    out->set_data(&v, sizeof(v));
    return absl::OkStatus();
  }
  if (!IsDigestArg(arg) && !absl::EndsWith(arg, ".npy") &&
      !absl::StrContains(arg, ".safetensors")) {
    return Usage(absl::StrCat("--", flag,
                              ": a number (one per-tensor scale) or a float32 tensor "
                              "(FILE.npy, FILE.safetensors:TENSOR, sha256:...) expected, got '",
                              arg, "'"));
  }
  TensorReadOptions opts;
  opts.expected_dtype = DType::kFloat32;
  opts.expected_by = "scales are float32, as torch._scaled_mm takes them";
  if (auto it = dtypes.find(flag); it != dtypes.end()) {
    opts.expected_dtype = it->second;
    opts.expected_by = absl::StrCat("--dtype ", flag, "=", DTypeShortName(it->second));
  } else if (field == "op.input_scale" || field == "op.weight_scale") {
    // A file that names its dtype may hold MXFP8's or NVFP4's block scales.
    opts.also_named = {DType::kFloat8E8M0Fnu, DType::kFloat8E4M3Fn};
  }
  return LoadTensor(cl, flag, opts, opts.expected_by, field, out, held);
}

// Splits a --config or --candidates value at its commas into specs. An fp8
// spec's options are comma-separated too
// (`cpu:fp8e4m3:fused@scaling=row,fast_accum`): a piece without ':' after a
// spec with options continues those options.
std::vector<std::string> SplitSpecs(absl::string_view value) {
  std::vector<std::string> specs;
  for (absl::string_view s : absl::StrSplit(value, ',', absl::SkipWhitespace())) {
    if (!specs.empty() && absl::StrContains(specs.back(), '@') && !absl::StrContains(s, ':')) {
      absl::StrAppend(&specs.back(), ",", s);
    } else {
      specs.emplace_back(s);
    }
  }
  return specs;
}

}  // namespace

absl::StatusOr<pb::VerifyRequest> BuildRequestOptions(const CommandLine& cl,
                                                      absl::string_view config_flag) {
  pb::VerifyRequest req;
  pb::LinearOp* op = req.mutable_op();
  // Validate cheap flags before reading (possibly large) files.
  if (cl.Has("weight-layout")) {
    auto l = ParseWeightLayout(cl.Get("weight-layout"));
    if (!l.ok()) return Usage(absl::StrCat("--weight-layout: ", l.status().message()));
    op->set_weight_layout(*l == WeightLayout::kInOut ? pb::WEIGHT_LAYOUT_IN_OUT
                                                     : pb::WEIGHT_LAYOUT_OUT_IN);
  }
  if (cl.Has("activation")) {
    auto a = ParseActivation(cl.Get("activation"));
    if (!a.ok()) return Usage(absl::StrCat("--activation: ", a.status().message()));
    switch (*a) {
      case Activation::kNone:
        op->set_activation(pb::ACTIVATION_NONE);
        break;
      case Activation::kRelu:
        op->set_activation(pb::ACTIVATION_RELU);
        break;
      case Activation::kGeluTanh:
        op->set_activation(pb::ACTIVATION_GELU_TANH);
        break;
    }
  }
  if (cl.Has("output-dtype")) {
    auto d = ParseDType(cl.Get("output-dtype"));
    if (!d.ok()) return Usage(absl::StrCat("--output-dtype: ", d.status().message()));
    op->set_output_dtype(DTypeToProto(*d));
  }

  std::vector<std::string> specs;
  for (const char* flag : {"config", "candidates"}) {
    for (const std::string& v : cl.All(flag)) {
      for (std::string& s : SplitSpecs(v)) specs.push_back(std::move(s));
    }
  }
  for (const std::string& s : specs) {
    auto spec = ParseConfigSpec(s, config_flag);
    if (!spec.ok()) return Usage(spec.status().message());
    req.add_configs(s);
  }
  // Unset or empty, the field stays empty and the server applies its own
  // default (the fp64 configuration of its fastest backend).
  if (const std::string reference = cl.Get("reference"); !reference.empty()) {
    auto spec = ParseConfigSpec(reference, "--reference");
    if (!spec.ok()) return Usage(spec.status().message());
    req.set_reference(reference);
  }

  pb::Tolerance* tol = req.mutable_tolerance();
  std::string preset = cl.Get("tolerance");
  if (preset.empty() && cl.Has("max-ulp")) preset = "ulp";
  if (preset.empty() || preset == "torch") {
    tol->set_preset(pb::Tolerance::PRESET_TORCH);
  } else if (preset == "numpy") {
    tol->set_preset(pb::Tolerance::PRESET_NUMPY);
  } else if (preset == "polygraphy") {
    tol->set_preset(pb::Tolerance::PRESET_POLYGRAPHY);
  } else if (preset == "explicit") {
    tol->set_preset(pb::Tolerance::PRESET_EXPLICIT);
    if (!cl.Has("atol") && !cl.Has("rtol")) {
      return Usage("--tolerance explicit needs --atol and/or --rtol");
    }
  } else if (preset == "ulp") {
    tol->set_preset(pb::Tolerance::PRESET_ULP);
    if (!cl.Has("max-ulp")) return Usage("--tolerance ulp needs --max-ulp N");
  } else if (preset == "bound") {
    tol->set_preset(pb::Tolerance::PRESET_BOUND);
  } else {
    return Usage(
        absl::StrCat("--tolerance: torch, numpy, polygraphy, explicit, ulp or bound "
                     "expected, got '",
                     preset, "'"));
  }
  if (cl.Has("max-ulp") && preset != "ulp") {
    return Usage(absl::StrCat("--max-ulp applies to --tolerance ulp, not '", preset, "'"));
  }
  if ((cl.Has("atol") || cl.Has("rtol")) && (preset == "ulp" || preset == "bound")) {
    return Usage(absl::StrCat("--atol/--rtol do not apply to --tolerance ", preset));
  }
  if ((cl.Has("bound-factor") || cl.Has("bound-precision")) && preset != "bound") {
    return Usage("--bound-factor and --bound-precision apply to --tolerance bound");
  }
  if (cl.Has("bound-precision")) {
    auto p = ParsePrecision(cl.Get("bound-precision"));
    if (!p.ok()) return Usage(absl::StrCat("--bound-precision: ", p.status().message()));
    tol->set_bound_precision(std::string(PrecisionName(*p)));
  }
  if (cl.Has("atol")) {
    TC_ASSIGN_OR_RETURN(double v, ParseDoubleFlag(cl, "atol", /*positive=*/false));
    tol->mutable_atol()->set_value(v);
  }
  if (cl.Has("rtol")) {
    TC_ASSIGN_OR_RETURN(double v, ParseDoubleFlag(cl, "rtol", /*positive=*/false));
    tol->mutable_rtol()->set_value(v);
  }
  if (cl.Has("max-ulp")) {
    uint64_t v;
    if (!absl::SimpleAtoi(cl.Get("max-ulp"), &v)) {
      return Usage(absl::StrCat("--max-ulp: a non-negative integer expected, got '",
                                cl.Get("max-ulp"), "'"));
    }
    tol->set_max_ulp(v);
  }
  if (cl.Has("bound-factor")) {
    TC_ASSIGN_OR_RETURN(double v, ParseDoubleFlag(cl, "bound-factor", /*positive=*/true));
    tol->set_bound_factor(v);
  }
  tol->set_nan_equal(cl.Has("nan-equal"));

  if (cl.Has("top-k")) {
    TC_ASSIGN_OR_RETURN(int64_t k, ParseIntFlag(cl, "top-k", 0, 1'000'000));
    req.mutable_output()->set_top_k(static_cast<int32_t>(k));
  }
  if (cl.Has("repeat")) {
    TC_ASSIGN_OR_RETURN(int64_t n, ParseIntFlag(cl, "repeat", 1, 1'000'000));
    req.set_repeat(static_cast<int32_t>(n));
  }
  req.set_disallow_reduced_precision_reduction(cl.Has("disallow-reduced-precision-reduction"));
  if (cl.Has("algorithm-sweep")) {
    // The server's bound (VerifyRequest.algorithm_sweep: at most 16).
    TC_ASSIGN_OR_RETURN(int64_t n, ParseIntFlag(cl, "algorithm-sweep", 0, 16));
    req.set_algorithm_sweep(static_cast<int32_t>(n));
  }
  // The name is the server's to judge (INVALID_ARGUMENT naming `gpu`); an
  // empty one would ask for nothing.
  if (cl.Has("gpu")) {
    if (cl.Get("gpu").empty()) {
      return Usage(
          "--gpu: a GPU (a100, h100, h200, gh200, b200, gb200) or a generation "
          "(sm80, sm90, sm100) expected, got ''");
    }
    req.set_gpu(cl.Get("gpu"));
  }
  if (cl.Has("batch-sizes") && !cl.Has("batch-invariance")) {
    return Usage("--batch-sizes applies only with --batch-invariance");
  }
  if (cl.Has("batch-invariance")) {
    pb::BatchInvarianceOptions* bi = req.mutable_batch_invariance();
    bi->set_enabled(true);
    // The server checks each size against M and their count.
    for (const std::string& list : cl.All("batch-sizes")) {
      for (absl::string_view s : absl::StrSplit(list, ',')) {
        int64_t v;
        if (!absl::SimpleAtoi(s, &v) || v < 1) {
          return Usage(
              absl::StrCat("--batch-sizes: positive integers N,N,... expected, got '", list, "'"));
        }
        bi->add_batch_sizes(v);
      }
    }
  }
  if (cl.Has("save-outputs")) req.mutable_output()->set_return_outputs(true);
  // The heatmaps of --html need every output.
  if (cl.Has("html")) req.mutable_output()->set_return_outputs(true);

  return req;
}

namespace {

// The --dtype NAME=DTYPE flags: NAME one of input, weight, bias, observed,
// input-scale, weight-scale and `extra_names` (compare's output names).
absl::StatusOr<std::map<std::string, DType>> ParseDTypeFlags(
    const CommandLine& cl, const std::vector<std::string>& extra_names = {}) {
  std::map<std::string, DType> dtypes;
  for (const std::string& v : cl.All("dtype")) {
    const size_t eq = v.find('=');
    const std::string name = v.substr(0, eq == std::string::npos ? v.size() : eq);
    const bool known = name == "input" || name == "weight" || name == "bias" ||
                       name == "observed" || name == "input-scale" || name == "weight-scale" ||
                       std::find(extra_names.begin(), extra_names.end(), name) != extra_names.end();
    if (eq == std::string::npos || !known) {
      std::string names = "input, weight, bias, observed, input-scale, weight-scale";
      for (const std::string& n : extra_names) absl::StrAppend(&names, ", ", n);
      return Usage(
          absl::StrCat("--dtype: NAME=DTYPE with NAME one of ", names, " expected, got '", v, "'"));
    }
    auto d = ParseDType(v.substr(eq + 1));
    if (!d.ok()) return Usage(absl::StrCat("--dtype ", name, ": ", d.status().message()));
    if (name == "bias" && !cl.Has("bias")) return Usage("--dtype bias=... without --bias");
    if (name == "observed" && !cl.Has("observed")) {
      return Usage("--dtype observed=... without --observed");
    }
    for (const char* scale : {"input-scale", "weight-scale"}) {
      if (name == scale && !cl.Has(scale)) {
        return Usage(absl::StrCat("--dtype ", scale, "=... without --", scale));
      }
    }
    dtypes[name] = *d;
  }
  return dtypes;
}

// The layer's tensors: --input, --weight, --bias and the FP8 and FP4
// scales.
absl::Status LoadLayer(const CommandLine& cl, const std::map<std::string, DType>& dtypes,
                       pb::LinearOp* op, std::vector<HeldTensor>* held) {
  // The scales first: small, and a mistyped number fails before large
  // files are read.
  if (cl.Has("input-scale")) {
    TC_RETURN_IF_ERROR(
        LoadScale(cl, "input-scale", "op.input_scale", dtypes, op->mutable_input_scale(), held));
  }
  if (cl.Has("weight-scale")) {
    TC_RETURN_IF_ERROR(
        LoadScale(cl, "weight-scale", "op.weight_scale", dtypes, op->mutable_weight_scale(), held));
  }
  // NVFP4's per-tensor scales: float32 always (no --dtype names them).
  if (cl.Has("input-global-scale")) {
    TC_RETURN_IF_ERROR(LoadScale(cl, "input-global-scale", "op.input_global_scale", {},
                                 op->mutable_input_global_scale(), held));
  }
  if (cl.Has("weight-global-scale")) {
    TC_RETURN_IF_ERROR(LoadScale(cl, "weight-global-scale", "op.weight_global_scale", {},
                                 op->mutable_weight_global_scale(), held));
  }
  TC_RETURN_IF_ERROR(LoadOperand(cl, "input", dtypes, "op.input", op->mutable_input(), held));
  TC_RETURN_IF_ERROR(LoadOperand(cl, "weight", dtypes, "op.weight", op->mutable_weight(), held));
  // FP8 operands mean nothing without their scales; say so in flags rather
  // than in the request's field names.
  const std::optional<DType> x = DTypeFromProto(op->input().dtype());
  const std::optional<DType> w = DTypeFromProto(op->weight().dtype());
  if (x.has_value() && w.has_value() && IsFp8(*x) && IsFp8(*w)) {
    for (const char* flag : {"input-scale", "weight-scale"}) {
      if (!cl.Has(flag)) {
        return Usage(absl::StrCat(
            "--", flag, " is required: --input is ", DTypeName(*x), " and --weight ", DTypeName(*w),
            ", and FP8 operands need their dequantisation scales (a number per "
            "tensor, or float32 [M] and [N] row-wise, as torch._scaled_mm's scale_a/scale_b)"));
      }
    }
  }
  if (cl.Has("bias")) {
    TC_RETURN_IF_ERROR(LoadOperand(cl, "bias", dtypes, "op.bias", op->mutable_bias(), held));
  }
  return absl::OkStatus();
}

// The --accept patterns (repeatable; also PATTERN,PATTERN), non-empty.
absl::StatusOr<std::vector<std::string>> AcceptPatterns(const CommandLine& cl) {
  std::vector<std::string> out;
  for (const std::string& v : cl.All("accept")) {
    std::vector<std::string> parts = absl::StrSplit(v, ',', absl::SkipWhitespace());
    if (parts.empty()) {
      return Usage(
          absl::StrCat("--accept: a configuration (backend:precision[:bias], precision[:bias] or "
                       "backend:precision, e.g. tf32 or cpu:bf16:unfused) expected, got '",
                       v, "'"));
    }
    for (std::string& p : parts) out.push_back(std::move(p));
  }
  return out;
}

// A valid output name (NamedTensor.name): letters, digits, '_', '-', '.',
// 1 to 64 characters.
bool ValidOutputName(absl::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-' && c != '.') {
      return false;
    }
  }
  return true;
}

}  // namespace

absl::StatusOr<pb::VerifyRequest> BuildRequest(const CommandLine& cl,
                                               std::vector<HeldTensor>* held) {
  const bool diagnose = cl.command == "diagnose";
  for (const char* required : {"input", "weight"}) {
    if (!cl.Has(required)) return Usage(absl::StrCat("--", required, " is required"));
  }
  if (diagnose && !cl.Has("observed")) return Usage("diagnose needs --observed");
  TC_ASSIGN_OR_RETURN(std::vector<std::string> accept, AcceptPatterns(cl));
  if (!accept.empty() && !cl.Has("observed")) {
    return Usage("--accept needs --observed: it accepts or not the output your framework produced");
  }

  TC_ASSIGN_OR_RETURN(pb::VerifyRequest req, BuildRequestOptions(cl, "--config"));
  for (const std::string& a : accept) req.add_accept(a);
  TC_ASSIGN_OR_RETURN(const auto dtypes, ParseDTypeFlags(cl));
  TC_RETURN_IF_ERROR(LoadLayer(cl, dtypes, req.mutable_op(), held));
  if (cl.Has("observed")) {
    TC_RETURN_IF_ERROR(
        LoadOperand(cl, "observed", dtypes, "observed", req.mutable_observed(), held));
  }
  return req;
}

absl::StatusOr<std::pair<std::string, std::string>> ObservedNameAndFile(absl::string_view arg) {
  // NAME=FILE when what precedes the first '=' is a name (a path would hold
  // '/' or ':' before it, or nothing).
  if (const size_t eq = arg.find('='); eq != absl::string_view::npos) {
    const absl::string_view name = arg.substr(0, eq);
    if (ValidOutputName(name)) {
      return std::make_pair(std::string(name), std::string(arg.substr(eq + 1)));
    }
  }
  if (IsDigestArg(arg)) {
    return Usage(
        absl::StrCat("--observed: a sha256: argument has no file name to call the output "
                     "by; write NAME=",
                     arg));
  }
  // FILE.safetensors:TENSOR: the tensor's name; FILE.npy: the file's stem.
  absl::string_view stem = arg;
  if (const size_t st = arg.find(".safetensors:"); st != absl::string_view::npos) {
    stem = arg.substr(st + std::string(".safetensors:").size());
  } else {
    if (const size_t slash = stem.find_last_of('/'); slash != absl::string_view::npos) {
      stem = stem.substr(slash + 1);
    }
    if (const size_t dot = stem.find_last_of('.'); dot != absl::string_view::npos && dot > 0) {
      stem = stem.substr(0, dot);
    }
  }
  if (!ValidOutputName(stem)) {
    return Usage(absl::StrCat("--observed ", arg, ": '", stem,
                              "' cannot name the output (letters, digits, '_', '-', '.', at most "
                              "64): write NAME=",
                              arg));
  }
  return std::make_pair(std::string(stem), std::string(arg));
}

absl::StatusOr<pb::CompareRequest> BuildCompareRequest(const CommandLine& cl,
                                                       std::vector<HeldTensor>* held) {
  for (const char* required : {"input", "weight"}) {
    if (!cl.Has(required)) return Usage(absl::StrCat("--", required, " is required"));
  }
  const std::vector<std::string> observed = cl.All("observed");
  if (observed.size() != 2) {
    return Usage(absl::StrCat(
        "compare needs exactly two --observed outputs (NAME=FILE or FILE), got ", observed.size()));
  }
  std::vector<std::pair<std::string, std::string>> named;
  for (const std::string& arg : observed) {
    TC_ASSIGN_OR_RETURN(auto nf, ObservedNameAndFile(arg));
    named.push_back(std::move(nf));
  }
  if (named[0].first == named[1].first) {
    return Usage(absl::StrCat("--observed: both outputs are called '", named[0].first,
                              "'; name them: --observed torch=", named[0].second,
                              " --observed flax=", named[1].second));
  }
  TC_ASSIGN_OR_RETURN(std::vector<std::string> accept, AcceptPatterns(cl));
  TC_ASSIGN_OR_RETURN(const pb::VerifyRequest options, BuildRequestOptions(cl, "--config"));
  pb::CompareRequest req;
  *req.mutable_op() = options.op();
  *req.mutable_configs() = options.configs();
  req.set_reference(options.reference());
  if (options.has_output()) *req.mutable_output() = options.output();
  for (const std::string& a : accept) req.add_accept(a);

  TC_ASSIGN_OR_RETURN(const auto dtypes, ParseDTypeFlags(cl, {named[0].first, named[1].first}));
  TC_RETURN_IF_ERROR(LoadLayer(cl, dtypes, req.mutable_op(), held));
  for (size_t i = 0; i < named.size(); ++i) {
    const auto& [name, file] = named[i];
    TensorReadOptions opts;
    std::string requirement;
    // --dtype NAME=... for this output, else --dtype observed=... for both.
    auto it = dtypes.find(name);
    if (it == dtypes.end()) it = dtypes.find("observed");
    if (it != dtypes.end()) {
      opts.expected_dtype = it->second;
      requirement = absl::StrCat("--dtype ", it->first, "=", DTypeShortName(it->second));
    }
    pb::NamedTensor* t = req.add_observed();
    t->set_name(name);
    TC_RETURN_IF_ERROR(LoadTensorArg(file, "observed", opts, requirement,
                                     absl::StrCat("observed[", i, "]"), t->mutable_tensor(), held));
  }
  return req;
}

}  // namespace tensorcheck::cli::internal
