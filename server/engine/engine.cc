#include "server/engine/engine.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <map>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/parallel.h"
#include "core/status_macros.h"
#include "server/backends/cpu/host_device.h"
#include "server/engine/call_decision.h"
#include "server/engine/diagnosis.h"
#include "server/engine/internal/fp8_operands.h"
#include "server/engine/internal/plan.h"
#include "server/stats/blas_gemm.h"

namespace tensorcheck {

namespace {

// The reference of last resort: the CPU emulation takes every operand.
constexpr absl::string_view kHostReference = "cpu:fp64";

// The sub-batch sizes of a batch-invariance check: single rows and the
// listed sizes (each 1..m), ascending, each once.
absl::StatusOr<std::vector<int64_t>> BatchSizes(const std::vector<int64_t>& listed, int64_t m,
                                                const RequestLimits& limits) {
  if (static_cast<int>(listed.size()) > limits.max_batch_sizes) {
    return absl::InvalidArgumentError(absl::StrCat("batch_invariance.batch_sizes: at most ",
                                                   limits.max_batch_sizes, " sizes expected, got ",
                                                   listed.size()));
  }
  std::vector<int64_t> sizes = {1};
  for (size_t i = 0; i < listed.size(); ++i) {
    if (listed[i] < 1 || listed[i] > m) {
      return InvalidFieldError(absl::StrCat("batch_invariance.batch_sizes[", i, "]"),
                               absl::StrCat("1..", m, " (M, the rows of the input)"),
                               absl::StrCat(listed[i]));
    }
    sizes.push_back(listed[i]);
  }
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  return sizes;
}

// The output dtype of a request that names none: the input's, bf16 for
// FP8 and FP4 inputs (torch._scaled_mm's usual out_dtype).
DType DefaultOutputDType(DType input) { return IsNarrow(input) ? DType::kBFloat16 : input; }

// The precision a tensor of `dtype` naturally carries: the bound an output
// stored in it is held to when no configuration says otherwise.
Precision NaturalPrecision(DType dtype) {
  switch (dtype) {
    case DType::kFloat64:
      return Precision::kFp64;
    case DType::kFloat32:
      return Precision::kFp32;
    case DType::kFloat16:
      return Precision::kFp16;
    case DType::kBFloat16:
    case DType::kFloat8E4M3Fn:  // never an output dtype (CheckFp8Operands)
    case DType::kFloat8E5M2:
    case DType::kFloat4E2M1Fn:
    case DType::kFloat8E8M0Fnu:
      return Precision::kBf16;
  }
  return Precision::kFp32;
}

// A tensor sent inline is bounded by max_tensor_bytes; a stored one
// (borrowed from the tensor store) was bounded by the store when it was
// uploaded, and may be far larger than a message.
absl::Status CheckTensorSize(const Tensor& t, absl::string_view field, int64_t max_bytes) {
  if (!t.borrowed() && static_cast<int64_t>(t.nbytes()) > max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        field, ": ", t.nbytes(), " bytes exceed the limit of ", max_bytes, " bytes per tensor"));
  }
  return absl::OkStatus();
}

// The first available backend that `qualifies`: a device backend before
// a host emulation, in registration order within each kind.
template <typename Qualifies>
LinearBackend* FastestBackend(const BackendRegistry& registry, Qualifies qualifies) {
  LinearBackend* host = nullptr;
  for (LinearBackend* backend : registry.backends()) {
    if (!backend->Available().ok() || !qualifies(backend)) continue;
    if (backend->kind() == BackendKind::kDevice) return backend;
    if (host == nullptr) host = backend;
  }
  return host;
}

// The fp64 configuration of the fastest available backend whose bias mode
// rounds once (fused).
absl::StatusOr<std::string> FastestFp64Reference(const BackendRegistry& registry) {
  LinearBackend* chosen = FastestBackend(registry, [](LinearBackend* backend) {
    const std::vector<Precision> p = backend->precisions();
    return backend->default_bias_mode() == BiasMode::kFused &&
           std::find(p.begin(), p.end(), Precision::kFp64) != p.end();
  });
  if (chosen == nullptr) {
    return absl::FailedPreconditionError(
        "default reference: no available backend runs fp64 with a fused bias; name one "
        "with --default-reference");
  }
  return absl::StrCat(chosen->name(), ":fp64");
}

}  // namespace

std::vector<int64_t> UnflattenIndex(int64_t flat, const std::vector<int64_t>& shape) {
  std::vector<int64_t> index(shape.size(), 0);
  for (size_t i = shape.size(); i-- > 0;) {
    const int64_t d = shape[i];
    if (d <= 0) continue;
    index[i] = flat % d;
    flat /= d;
  }
  return index;
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options,
                                                       const BackendRegistry* registry) {
  if (registry == nullptr) {
    return absl::InvalidArgumentError("engine: backend registry is null");
  }
  EngineOptions resolved = options;
  if (resolved.default_reference.empty()) {
    TC_ASSIGN_OR_RETURN(resolved.default_reference, FastestFp64Reference(*registry));
  }
  auto engine = std::unique_ptr<Engine>(new Engine(resolved, registry));
  // Requests that no one device runs whole run on the host, each
  // configuration on its own backend.
  HostDevice::Options host;
  host.resolve = [registry](absl::string_view name) { return registry->Find(name); };
  host.executor = resolved.executor;
  engine->host_device_ = std::make_unique<HostDevice>(std::move(host));
  // The default reference must resolve on this host.
  TC_ASSIGN_OR_RETURN(ConfigSpec spec,
                      ParseConfigSpec(resolved.default_reference, "default reference"));
  TC_ASSIGN_OR_RETURN(LinearBackend * backend, registry->Find(spec.backend));
  TC_RETURN_IF_ERROR(backend->Available());
  return engine;
}

absl::StatusOr<Engine::Plan> Engine::MakePlan(const LinearRequest& req, bool diagnose,
                                              const StopSignal* stop,
                                              const Plan* first_tier) const {
  Plan plan;
  const bool second_tier = first_tier != nullptr;
  const Tensor& x = req.input;
  const Tensor& w = req.weight;

  // Sizes first: nothing below allocates before these pass.
  TC_RETURN_IF_ERROR(CheckTensorSize(x, "op.input", options_.limits.max_tensor_bytes));
  TC_RETURN_IF_ERROR(CheckTensorSize(w, "op.weight", options_.limits.max_tensor_bytes));
  if (req.bias) {
    TC_RETURN_IF_ERROR(CheckTensorSize(*req.bias, "op.bias", options_.limits.max_tensor_bytes));
  }
  if (req.observed) {
    TC_RETURN_IF_ERROR(
        CheckTensorSize(*req.observed, "observed", options_.limits.max_tensor_bytes));
  }

  if (x.rank() < 1 || x.numel() == 0) {
    return InvalidFieldError("op.input.shape", "a non-empty [..., K] tensor",
                             ShapeString(x.shape()));
  }
  plan.shape.layout = req.layout;
  plan.shape.activation = req.activation;
  plan.shape.k = x.shape().back();
  plan.shape.m = x.numel() / plan.shape.k;
  if (w.rank() != 2) {
    return InvalidFieldError("op.weight.shape",
                             req.layout == WeightLayout::kOutIn ? "rank 2 [N, K]" : "rank 2 [K, N]",
                             ShapeString(w.shape()));
  }
  const int64_t w_k = req.layout == WeightLayout::kOutIn ? w.dim(1) : w.dim(0);
  plan.shape.n = req.layout == WeightLayout::kOutIn ? w.dim(0) : w.dim(1);
  if (w_k != plan.shape.k) {
    return absl::InvalidArgumentError(absl::StrCat(
        "op.weight.shape: ", ShapeString(w.shape()), " does not match K=", plan.shape.k,
        " (the input's last dim) in layout ", WeightLayoutName(req.layout), "; expected ",
        req.layout == WeightLayout::kOutIn ? absl::StrCat("[N, ", plan.shape.k, "]")
                                           : absl::StrCat("[", plan.shape.k, ", N]")));
  }
  if (plan.shape.n == 0) {
    return InvalidFieldError("op.weight.shape", "N >= 1", ShapeString(w.shape()));
  }
  TC_ASSIGN_OR_RETURN(Fp8Request fp8, CheckFp8Operands(req, plan.shape));
  plan.scale_blocks = fp8.scale_blocks;
  if (fp8.input_scale) plan.input_scale = fp8.input_scale->Clone();
  if (fp8.weight_scale) plan.weight_scale = fp8.weight_scale->Clone();
  if (req.bias) {
    if (req.bias->rank() != 1 || req.bias->dim(0) != plan.shape.n) {
      return InvalidFieldError("op.bias.shape", absl::StrCat("[", plan.shape.n, "] (N)"),
                               ShapeString(req.bias->shape()));
    }
  }
  // Output size and work, with checked arithmetic.
  if (plan.shape.m > options_.limits.max_output_elements / plan.shape.n) {
    return absl::ResourceExhaustedError(
        absl::StrCat("output [", plan.shape.m, ", ", plan.shape.n, "] exceeds the limit of ",
                     options_.limits.max_output_elements, " elements"));
  }
  if (plan.shape.m * plan.shape.n > options_.limits.max_macs / plan.shape.k) {
    return absl::ResourceExhaustedError(
        absl::StrCat("problem M*N*K = ", plan.shape.m, "*", plan.shape.n, "*", plan.shape.k,
                     " exceeds the limit of ", options_.limits.max_macs, " multiply-adds"));
  }
  plan.shape.output_dtype = req.output_dtype.value_or(DefaultOutputDType(x.dtype()));
  plan.output_shape.assign(x.shape().begin(), x.shape().end() - 1);
  plan.output_shape.push_back(plan.shape.n);
  if (req.observed && req.observed->shape() != plan.output_shape) {
    return InvalidFieldError(
        "observed.shape",
        absl::StrCat(ShapeString(plan.output_shape), " (input's leading dims, N)"),
        ShapeString(req.observed->shape()));
  }

  // Options.
  if (req.top_k < 0 || req.top_k > options_.limits.max_top_k) {
    return InvalidFieldError("output.top_k", absl::StrCat("0..", options_.limits.max_top_k),
                             absl::StrCat(req.top_k));
  }
  if (req.top_groups < 0 || req.top_groups > options_.limits.max_top_groups) {
    return InvalidFieldError("output.top_groups",
                             absl::StrCat("0..", options_.limits.max_top_groups),
                             absl::StrCat(req.top_groups));
  }
  if (req.repeat < 0 || req.repeat > options_.limits.max_repeat) {
    return InvalidFieldError("repeat", absl::StrCat("0..", options_.limits.max_repeat),
                             absl::StrCat(req.repeat));
  }
  if (!req.gpu.empty()) {
    TC_ASSIGN_OR_RETURN(plan.gpu, ParseGpuName(req.gpu, "gpu"));
  }
  // Configurations: a diagnosis that names none takes the default set for
  // these operands, on backends that can run this layer.
  const LinearProblem layer = ProblemOf(req, plan);
  // Default candidates come prepared for this layer; resolve takes them as
  // they are, so that no rule is asked twice of a configuration.
  std::vector<PreparedRun> prepared;
  std::vector<std::string> config_specs = req.configs;
  if (diagnose && req.configs.empty()) {
    // The first tier, and the second after it when asked for
    // (docs/numerics.md, "Diagnosis").
    config_specs =
        DefaultCandidates(x.dtype(), w.dtype(), req.bias.has_value(), req.activation, fp8.scaling,
                          layer, &plan.passed_over, &prepared, fp8.block_precision);
    plan.tiers = {1};
    if (plan.gpu.has_value()) {
      for (std::string& c : ReplayCandidates(*plan.gpu, x.dtype(), w.dtype(), req.bias.has_value(),
                                             req.activation, fp8.scaling, layer, &prepared,
                                             fp8.block_precision, &plan.replay_sources)) {
        if (absl::c_find(config_specs, c) == config_specs.end()) config_specs.push_back(c);
      }
    }
    if (second_tier) {
      for (std::string& c :
           SecondTierCandidates(x.dtype(), w.dtype(), req.bias.has_value(), req.activation, layer,
                                &plan.passed_over, &prepared)) {
        if (absl::c_find(config_specs, c) == config_specs.end()) config_specs.push_back(c);
      }
      plan.tiers.push_back(2);
    }
  }
  if (static_cast<int>(config_specs.size()) > options_.limits.max_configs) {
    const std::string message = absl::StrCat("configs: at most ", options_.limits.max_configs,
                                             " configurations expected, got ", config_specs.size());
    // The server's own choice, not the request's: a limit the second tier
    // would pass, as the work limit is.
    if (second_tier) return absl::ResourceExhaustedError(message);
    return absl::InvalidArgumentError(message);
  }
  const ToleranceRequest& tr = req.tolerance;
  for (const auto& [name, value] :
       {std::pair<const char*, std::optional<double>>{"tolerance.atol", tr.atol},
        {"tolerance.rtol", tr.rtol}}) {
    if (value && !(*value >= 0 && std::isfinite(*value))) {
      return InvalidFieldError(name, "a finite value >= 0", absl::StrCat(*value));
    }
  }
  if (!(tr.bound_factor >= 0 && std::isfinite(tr.bound_factor))) {
    return InvalidFieldError("tolerance.bound_factor", "a finite value >= 0",
                             absl::StrCat(tr.bound_factor));
  }
  plan.tolerance =
      ResolveTolerance(tr.preset, plan.shape.output_dtype, tr.atol, tr.rtol, tr.max_ulp,
                       tr.bound_factor == 0 ? 1.0 : tr.bound_factor, tr.nan_equal);
  plan.observed_bound_precision = NaturalPrecision(plan.shape.output_dtype);
  if (!tr.bound_precision.empty()) {
    auto p = ParsePrecision(tr.bound_precision);
    if (!p.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tolerance.bound_precision: ", p.status().message()));
    }
    plan.observed_bound_precision = *p;
  }

  // Configurations.
  const bool has_bias = req.bias.has_value();
  auto resolve = [&](absl::string_view spec_text, absl::string_view field, Config* config,
                     LinearBackend** backend, PreparedRun* run) -> absl::Status {
    TC_ASSIGN_OR_RETURN(ConfigSpec spec, ParseConfigSpec(spec_text, field));
    TC_ASSIGN_OR_RETURN(*backend, registry_->Find(spec.backend));
    if (has_bias && spec.bias == BiasMode::kNone) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " '", spec_text,
                       "': bias mode 'none' given but the request has a bias; expected "
                       "'fused' or 'unfused'"));
    }
    *config =
        ResolveConfig(spec, has_bias, req.activation, (*backend)->default_bias_mode(), fp8.scaling);
    TC_RETURN_IF_ERROR(CheckFp8Config(*config, fp8, req, field, spec_text));
    absl::Status available = (*backend)->Available();
    if (!available.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat(field, " '", spec_text, "': backend '", spec.backend,
                       "' is not available on this host: ", available.message()));
    }
    auto known = absl::c_find_if(
        prepared, [&](const PreparedRun& p) { return p.ok() && p.config() == *config; });
    *run = known != prepared.end() ? *known : (*backend)->Prepare(layer, *config);
    if (!run->ok()) {
      return absl::FailedPreconditionError(absl::StrCat(field, ": ", run->status().message()));
    }
    return absl::OkStatus();
  };
  const std::string& reference_spec =
      req.reference.empty() ? options_.default_reference : req.reference;
  absl::Status reference = resolve(reference_spec, "reference", &plan.reference,
                                   &plan.reference_backend, &plan.reference_run);
  if (!reference.ok() && req.reference.empty() && absl::IsFailedPrecondition(reference) &&
      reference_spec != kHostReference) {
    // The default reference's backend does not take these operands (the
    // GPU backends and FP8 ones, until they do): the host's fp64.
    reference = resolve(kHostReference, "reference", &plan.reference, &plan.reference_backend,
                        &plan.reference_run);
  }
  TC_RETURN_IF_ERROR(reference);
  for (size_t i = 0; i < config_specs.size(); ++i) {
    Config c;
    LinearBackend* b = nullptr;
    PreparedRun run;
    TC_RETURN_IF_ERROR(resolve(config_specs[i], absl::StrCat("configs[", i, "]"), &c, &b, &run));
    // The same configuration twice is run once.
    if (std::find(plan.configs.begin(), plan.configs.end(), c) != plan.configs.end()) {
      continue;
    }
    plan.configs.push_back(c);
    plan.backends.push_back(b);
    plan.runs.push_back(std::move(run));
  }
  // Accepted configurations: each pattern that no configuration matches
  // adds its own (on the reference's backend when it names none; both
  // bias placements when it names neither).
  if (!req.accept.empty() && !req.observed) {
    return absl::InvalidArgumentError(
        "accept: accepting a configuration needs the observed output (observed), got none");
  }
  if (static_cast<int>(req.accept.size()) > options_.limits.max_configs) {
    return InvalidFieldError(
        "accept", absl::StrCat("at most ", options_.limits.max_configs, " configurations"),
        absl::StrCat(req.accept.size()));
  }
  for (size_t i = 0; i < req.accept.size(); ++i) {
    const std::string field = absl::StrCat("accept[", i, "]");
    TC_ASSIGN_OR_RETURN(ConfigPattern pattern, ParseConfigPattern(req.accept[i], field));
    plan.accept.push_back(pattern);
    if (absl::c_any_of(plan.configs, [&](const Config& c) { return pattern.Matches(c); })) {
      continue;
    }
    const std::string backend = pattern.backend.value_or(plan.reference.backend);
    std::vector<std::string> specs;
    const std::string base = absl::StrCat(backend, ":", PrecisionName(pattern.precision));
    if (pattern.bias.has_value()) {
      specs.push_back(absl::StrCat(base, ":", BiasModeName(*pattern.bias)));
    } else if (has_bias) {
      specs = {absl::StrCat(base, ":fused"), absl::StrCat(base, ":unfused")};
    } else {
      specs = {base};
    }
    for (const std::string& spec : specs) {
      Config c;
      LinearBackend* b = nullptr;
      PreparedRun run;
      TC_RETURN_IF_ERROR(resolve(spec, field, &c, &b, &run));
      if (std::find(plan.configs.begin(), plan.configs.end(), c) != plan.configs.end()) continue;
      plan.configs.push_back(c);
      plan.backends.push_back(b);
      plan.runs.push_back(std::move(run));
    }
  }
  if (static_cast<int>(plan.configs.size()) > options_.limits.max_configs) {
    const std::string message =
        absl::StrCat("configs: at most ", options_.limits.max_configs,
                     " configurations expected with the accepted ones, got ", plan.configs.size());
    if (second_tier) return absl::ResourceExhaustedError(message);
    return absl::InvalidArgumentError(message);
  }

  plan.run.repeat = req.repeat == 0 ? 1 : req.repeat;
  plan.run.disallow_reduced_precision_reduction = req.disallow_reduced_precision_reduction;
  plan.run.stop = stop;
  const RequestLimits& limits = options_.limits;
  if (req.algorithm_sweep < 0 || req.algorithm_sweep > limits.max_algorithm_sweep) {
    return InvalidFieldError("algorithm_sweep", absl::StrCat("0..", limits.max_algorithm_sweep),
                             absl::StrCat(req.algorithm_sweep));
  }
  if (req.algorithm_sweep > 0) TC_RETURN_IF_ERROR(SweepAlgorithms(req, req.algorithm_sweep, &plan));
  if (req.batch_invariance) {
    TC_ASSIGN_OR_RETURN(plan.batch_sizes, BatchSizes(req.batch_sizes, plan.shape.m, limits));
  } else if (!req.batch_sizes.empty()) {
    return absl::InvalidArgumentError(
        "batch_invariance.batch_sizes: given without batch_invariance.enabled");
  }

  plan.compare.tolerance = plan.tolerance;
  plan.compare.compared_dtype = plan.shape.output_dtype;
  plan.compare.cols = plan.shape.n;
  plan.compare.top_k = req.top_k == 0 ? 10 : req.top_k;
  plan.compare.top_groups = req.top_groups == 0 ? 5 : req.top_groups;
  plan.compare.executor = options_.executor;
  plan.compare.stop = stop;
  if (second_tier) {
    plan.prior_runs = first_tier->prior_runs +
                      static_cast<int64_t>(first_tier->configs.size() + 1) * first_tier->run.repeat;
  }
  TC_RETURN_IF_ERROR(CheckCost(plan, req, diagnose));
  return plan;
}

absl::Status Engine::CheckCost(const Plan& plan, const LinearRequest& req, bool diagnose) const {
  const RequestLimits& limits = options_.limits;
  // Work: every run of every configuration, the reference's included; a
  // batch-invariance check runs each once more whole and once per
  // sub-batch size (M rows in all).
  // A second tier of default candidates counts the first tier's runs too.
  const int64_t configs = static_cast<int64_t>(plan.configs.size() + 1);
  const int64_t batch_runs = static_cast<int64_t>(plan.batch_sizes.size()) + 1;
  const int64_t runs =
      configs * (plan.run.repeat + (plan.batch_sizes.empty() ? 0 : batch_runs)) + plan.prior_runs;
  const int64_t macs = plan.shape.m * plan.shape.n * plan.shape.k;  // <= max_macs, checked above
  if (macs > limits.max_work_macs / runs) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "work: M*N*K = ", macs, " multiply-adds x ", plan.configs.size(),
        " configurations (+ the reference) x ", plan.run.repeat, " repeats",
        plan.batch_sizes.empty() ? "" : absl::StrCat(" (+ ", batch_runs, " batch-invariance runs)"),
        plan.prior_runs == 0 ? ""
                             : absl::StrCat(" (+ ", plan.prior_runs, " runs of the first tier)"),
        " exceeds the limit of ", limits.max_work_macs,
        " multiply-adds per request; ask for fewer configurations, repeats or batch sizes, "
        "or split the layer"));
  }
  int64_t sub_batch_runs = 0;
  for (const int64_t size : plan.batch_sizes) sub_batch_runs += (plan.shape.m + size - 1) / size;
  if (sub_batch_runs > limits.max_sub_batch_runs / configs) {
    return absl::ResourceExhaustedError(
        absl::StrCat("batch_invariance: ", sub_batch_runs, " sub-batch runs per configuration x ",
                     configs, " configurations (the reference's included) exceeds the limit of ",
                     limits.max_sub_batch_runs,
                     " runs per request; list larger batch sizes or fewer "
                     "configurations, or send fewer rows"));
  }
  // The response: statistics, and the outputs when asked for (a diagnosis
  // returns the reference's and one candidate's).
  const int64_t results = static_cast<int64_t>(plan.configs.size()) + 1;
  const int64_t per_result_stats =
      int64_t{4096} + int64_t{96} * plan.compare.top_k + int64_t{64} * plan.compare.top_groups;
  int64_t bytes = results * per_result_stats;
  if (req.return_outputs) {
    const int64_t outputs = diagnose ? 2 : results;
    bytes += outputs * (plan.shape.m * plan.shape.n *
                            static_cast<int64_t>(ItemSize(plan.shape.output_dtype)) +
                        64);
  }
  if (bytes > limits.max_message_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "output.return_outputs: the response would need about ", bytes,
        " bytes, over the message limit of ", limits.max_message_bytes,
        " bytes; ask without return_outputs, for fewer configurations or a smaller top_k"));
  }
  return absl::OkStatus();
}

LinearProblem Engine::ProblemOf(const LinearRequest& req, const Plan& plan) {
  LinearProblem p;
  p.shape() = plan.shape;
  p.input = &req.input;
  p.weight = &req.weight;
  p.bias = req.bias ? &*req.bias : nullptr;
  p.input_scale = plan.input_scale  ? &*plan.input_scale
                  : req.input_scale ? &*req.input_scale
                                    : nullptr;
  p.weight_scale = plan.weight_scale  ? &*plan.weight_scale
                   : req.weight_scale ? &*req.weight_scale
                                      : nullptr;
  p.input_global_scale = req.input_global_scale ? &*req.input_global_scale : nullptr;
  p.weight_global_scale = req.weight_global_scale ? &*req.weight_global_scale : nullptr;
  p.scale_blocks = plan.scale_blocks;
  return p;
}

absl::Status Engine::SweepAlgorithms(const LinearRequest& req, int sweep, Plan* plan) const {
  const LinearProblem problem = ProblemOf(req, *plan);
  std::vector<Config> configs;
  std::vector<LinearBackend*> backends;
  std::vector<PreparedRun> runs;
  for (size_t i = 0; i < plan->configs.size(); ++i) {
    const Config& config = plan->configs[i];
    LinearBackend* backend = plan->backends[i];
    std::vector<Config> expanded = {config};
    const bool swept = !config.algo.has_value() && backend->selects_algorithms();
    if (swept) {
      absl::StatusOr<std::vector<AlgorithmInfo>> algorithms =
          backend->Algorithms(problem, plan->runs[i], plan->run, sweep);
      if (!algorithms.ok()) {
        return WithContext(algorithms.status(),
                           absl::StrCat("algorithm_sweep: configuration ", config.ToString()));
      }
      expanded.clear();
      for (const AlgorithmInfo& algorithm : *algorithms) {
        Config c = config;
        c.algo = algorithm.index;
        expanded.push_back(c);
      }
    }
    for (Config& c : expanded) {
      if (std::find(configs.begin(), configs.end(), c) != configs.end()) continue;
      // Each `@algo=N` is a configuration of its own, prepared once.
      PreparedRun run = swept ? backend->Prepare(problem, c) : plan->runs[i];
      if (!run.ok()) {
        return WithContext(run.status(),
                           absl::StrCat("algorithm_sweep: configuration ", config.ToString()));
      }
      configs.push_back(std::move(c));
      backends.push_back(backend);
      runs.push_back(std::move(run));
    }
  }
  if (static_cast<int>(configs.size()) > options_.limits.max_swept_configs) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "algorithm_sweep: ", sweep, " algorithms per configuration make ", configs.size(),
        " configurations, over the limit of ", options_.limits.max_swept_configs,
        "; sweep fewer algorithms or name fewer configurations"));
  }
  plan->configs = std::move(configs);
  plan->backends = std::move(backends);
  plan->runs = std::move(runs);
  return absl::OkStatus();
}

absl::Status Engine::CheckBatches(const LinearRequest& req, const Plan& plan,
                                  VerifyOutcome* outcome) const {
  if (plan.batch_sizes.empty()) return absl::OkStatus();
  const LinearProblem problem = ProblemOf(req, plan);
  auto check = [&](LinearBackend* backend, const PreparedRun& prepared,
                   ConfigOutcome* out) -> absl::Status {
    const Config& config = prepared.config();
    absl::StatusOr<BatchInvarianceOutcome> batches =
        CheckBatchInvariance(*backend, prepared, problem, plan.batch_sizes, plan.run);
    if (!batches.ok()) {
      return WithContext(batches.status(),
                         absl::StrCat("batch_invariance: configuration ", config.ToString()));
    }
    out->batch_invariance = *std::move(batches);
    return absl::OkStatus();
  };
  TC_RETURN_IF_ERROR(check(plan.reference_backend, plan.reference_run, &outcome->reference));
  for (size_t i = 0; i < plan.configs.size(); ++i) {
    TC_RETURN_IF_ERROR(check(plan.backends[i], plan.runs[i], &outcome->results[i]));
  }
  return absl::OkStatus();
}

absl::StatusOr<VerifyOutcome> Engine::Verify(const LinearRequest& request, const StopSignal* stop,
                                             RequestProgress* progress) const {
  TC_ASSIGN_OR_RETURN(Plan plan, MakePlan(request, /*diagnose=*/false, stop));
  plan.progress = progress;
  // Accepting a configuration is a diagnosis's answer.
  VerifyOutcome outcome;
  if (!request.accept.empty()) {
    TC_ASSIGN_OR_RETURN(outcome, DiagnosePlanned(request, plan, stop));
  } else {
    TC_ASSIGN_OR_RETURN(outcome, Run(request, plan, /*artifacts=*/nullptr));
    TC_RETURN_IF_ERROR(CheckBatches(request, plan, &outcome));
  }
  outcome.call = DecideCall(request, outcome);
  return outcome;
}

absl::StatusOr<VerifyOutcome> Engine::Diagnose(const LinearRequest& request, const StopSignal* stop,
                                               RequestProgress* progress) const {
  if (!request.observed) {
    return absl::InvalidArgumentError("observed: the output to diagnose is required, got none");
  }
  TC_ASSIGN_OR_RETURN(Plan plan, MakePlan(request, /*diagnose=*/true, stop));
  plan.progress = progress;
  TC_ASSIGN_OR_RETURN(VerifyOutcome outcome, RankPlanned(request, plan, stop));
  // The second tier of default candidates only when the first explains
  // nothing (docs/numerics.md, "Diagnosis"), or names fp16 accumulation:
  // its wide error model explains most reduced-precision reductions, and
  // split-K reduced in the output type, the other one, is in the second
  // tier. Its candidates are ranked with the first's, in one run of both.
  const bool unexplained = outcome.diagnosis->verdict == DiagnosisVerdict::kUnexplained;
  absl::StatusOr<ConfigSpec> best = outcome.diagnosis->best.has_value()
                                        ? ParseConfigSpec(*outcome.diagnosis->best)
                                        : absl::NotFoundError("none");
  const bool reduced_reduction = best.ok() && best->precision == Precision::kFp16Acc;
  if (plan.tiers == std::vector<int>{1} && (unexplained || reduced_reduction) &&
      !SecondTierCandidateSpecs(request.input.dtype(), request.weight.dtype()).empty()) {
    TC_RETURN_IF_ERROR(CheckStop(stop));
    absl::StatusOr<Plan> both = MakePlan(request, /*diagnose=*/true, stop, &plan);
    if (!both.ok() && !absl::IsResourceExhausted(both.status())) return both.status();
    if (!both.ok()) {
      // Over a limit: the first tier's answer stands, and says why no more.
      outcome.notes.push_back(absl::StrCat("The second tier of default candidates did not run: ",
                                           both.status().message()));
    } else if (both->configs.size() > plan.configs.size()) {
      both->progress = progress;
      const size_t added = both->configs.size() - plan.configs.size();
      TC_ASSIGN_OR_RETURN(VerifyOutcome ranked, RankPlanned(request, *both, stop));
      if (unexplained || ranked.diagnosis->verdict != DiagnosisVerdict::kUnexplained) {
        plan = *std::move(both);
        outcome = std::move(ranked);
        outcome.notes.push_back(absl::StrCat(
            unexplained ? "No candidate of the first tier explained the output"
                        : "The first tier named fp16 accumulation, which split-K reduced in the "
                          "output type can pass for",
            "; the second tier of default candidates ran (", added,
            " more), ranked with the first."));
      } else {
        // A second tier that explains less than the first's fp16
        // accumulation leaves the first tier's answer.
        outcome.notes.push_back(absl::StrCat(
            "The second tier of default candidates ran (", added,
            " more) beside the first's fp16 accumulation and explained the output no better; "
            "the first tier's answer stands."));
      }
    }
  }
  TC_RETURN_IF_ERROR(FinishDiagnosis(request, plan, &outcome));
  outcome.call = DecideCall(request, outcome);
  return outcome;
}

absl::StatusOr<VerifyOutcome> Engine::DiagnosePlanned(const LinearRequest& request,
                                                      const Plan& plan,
                                                      const StopSignal* stop) const {
  TC_ASSIGN_OR_RETURN(VerifyOutcome outcome, RankPlanned(request, plan, stop));
  TC_RETURN_IF_ERROR(FinishDiagnosis(request, plan, &outcome));
  return outcome;
}

absl::StatusOr<VerifyOutcome> Engine::RankPlanned(const LinearRequest& request, const Plan& plan,
                                                  const StopSignal* stop) const {
  Artifacts artifacts;
  TC_ASSIGN_OR_RETURN(VerifyOutcome outcome, Run(request, plan, &artifacts));
  TC_RETURN_IF_ERROR(CheckStop(stop));
  BeginProgress(plan.progress, "ranking the candidates", 0);
  DiagnosisInput in;
  in.observed = &*request.observed;
  in.reference_config = plan.reference.ToString();
  in.storage_dtype = request.input.dtype();
  in.output_dtype = plan.shape.output_dtype;
  in.has_bias = request.bias.has_value();
  in.activation = request.activation;
  in.weight_layout = request.layout;
  in.output_shape = plan.output_shape;
  in.top_k = plan.compare.top_k;
  in.top_groups = plan.compare.top_groups;
  in.executor = options_.executor;
  in.accept = plan.accept;
  for (size_t i = 0; i < outcome.results.size(); ++i) {
    DiagnosisCandidate c;
    c.config = plan.configs[i];
    c.backend_kind = plan.backends[i]->kind();
    c.vs_observed = &*outcome.results[i].vs_observed;
    c.vs_reference = &outcome.results[i].vs_reference;
    c.shared_computation = outcome.results[i].shared_computation;
    in.candidates.push_back(c);
  }
  // The candidates' arrays stay on the run's session, which the evidence
  // reads (and holds until it is reset below).
  if (artifacts.evidence == nullptr) {
    return absl::InternalError("diagnosis: the run kept no evidence");
  }
  TC_ASSIGN_OR_RETURN(outcome.diagnosis, RankCandidates(in, *artifacts.evidence));
  outcome.diagnosis->candidate_tiers = plan.tiers;
  artifacts.evidence->Describe(&outcome.reference.details);
  for (RankedCandidate& ranked : outcome.diagnosis->ranking) {
    for (const ConfigOutcome& r : outcome.results) {
      if (r.config == ranked.config) ranked.details = KernelDetails(r.details);
    }
    // A default candidate the device could not run on this layer ran on
    // another backend: the ranking says which and why.
    if (auto it = plan.passed_over.find(ranked.config); it != plan.passed_over.end()) {
      ranked.details["passed_over"] = it->second;
    }
  }
  // Device evidence holds the request's session, and with it a lane; the
  // batch-invariance runs (FinishDiagnosis) and a second tier's run each
  // open a session of their own, so with every lane held they would wait
  // for this one forever. `artifacts` ends here.
  return outcome;
}

absl::Status Engine::FinishDiagnosis(const LinearRequest& request, const Plan& plan,
                                     VerifyOutcome* out) const {
  VerifyOutcome& outcome = *out;
  TC_RETURN_IF_ERROR(CheckBatches(request, plan, &outcome));
  if (plan.gpu.has_value()) {
    outcome.notes.push_back(
        plan.tiers.empty()
            ? absl::StrCat("gpu '", request.gpu,
                           "' adds replays to a diagnosis's default candidates only, and this "
                           "request ranked none (a replay is named as a configuration, "
                           "`cpu:PRECISION@mma=",
                           TensorCoreGpuName(*plan.gpu), "`).")
            : absl::StrCat("Replays of ", request.gpu, "'s kernels (", TensorCoreGpuName(*plan.gpu),
                           " tensor-core model) are among the candidates: ",
                           absl::StrJoin(plan.replay_sources, "; "), "."));
  }
  // With accepted configurations the verdict is the diagnosis's: rounding
  // of one of them.
  if (!plan.accept.empty()) outcome.passed = outcome.diagnosis->accepted;
  if (request.return_outputs && !outcome.diagnosis->ranking.empty()) {
    // A diagnosis returns the outputs that explain it, not every
    // candidate's: the reference's and the best (or closest) candidate's.
    const std::string& keep = outcome.diagnosis->best.has_value()
                                  ? *outcome.diagnosis->best
                                  : outcome.diagnosis->ranking.front().config;
    for (ConfigOutcome& r : outcome.results) {
      if (r.config != keep) r.output.reset();
    }
  }
  return absl::OkStatus();
}

int64_t Engine::EstimateWorkingBytes(const LinearRequest& req, bool diagnose) const {
  const Tensor& x = req.input;
  const Tensor& w = req.weight;
  if (x.rank() < 1 || x.numel() == 0 || w.rank() != 2) return 0;
  const int64_t k = x.shape().back();
  const int64_t m = x.numel() / k;
  const int64_t n = req.layout == WeightLayout::kOutIn ? w.dim(0) : w.dim(1);
  // Shapes past the limits are refused by MakePlan before anything runs.
  if (n <= 0 || m > options_.limits.max_output_elements / n) return 0;
  const int64_t mn = m * n;
  int64_t configs = static_cast<int64_t>(req.configs.size());
  if (diagnose && configs == 0) {
    // As many for either FP8 scaling; both tiers, which run together when
    // the second runs (the first's session is closed by then).
    configs = static_cast<int64_t>(
        DefaultCandidates(x.dtype(), w.dtype(), req.bias.has_value(), req.activation).size() +
        SecondTierCandidates(x.dtype(), w.dtype(), req.bias.has_value(), req.activation).size());
  }
  if (req.algorithm_sweep > 0) {
    configs = std::min<int64_t>(
        configs * std::min(req.algorithm_sweep, options_.limits.max_algorithm_sweep),
        options_.limits.max_swept_configs);
  }
  const int64_t out_item =
      static_cast<int64_t>(ItemSize(req.output_dtype.value_or(DefaultOutputDType(x.dtype()))));
  // fp32 or fp64 copies of the operands. The input whole: the reference's
  // fp64 copy, or the magnitude sums' three fp32 ones (x, |x|, x^2). The
  // weight never whole (stats/blas_gemm.h, "blocks along N"): one converted
  // block with its product or fp16acc's packed copy, each at most twice
  // kWeightBlockBytes, or two 64-column blocks when k is so deep that one of
  // those is larger; never more than two fp64 copies of the whole weight.
  const int64_t widest_block =
      2 * std::max(kWeightBlockBytes, kWeightBlockAlign * k * int64_t{sizeof(double)});
  const int64_t operands = 2 * 8 * x.numel() + std::min(2 * widest_block, 2 * 8 * w.numel());
  // Per output element: the fp64 accumulator, the reference as doubles,
  // three magnitude sums and up to six error-model arrays in fp32.
  const int64_t per_element = 8 + 8 + 3 * 4 + 6 * 4;
  // Outputs held at once: a diagnosis keeps every candidate's; a
  // verification the reference, the one being compared, and the returned
  // ones. The response holds the returned outputs twice (message and
  // serialised bytes).
  const int64_t kept = diagnose ? configs + 1 : (req.return_outputs ? configs + 1 : 0) + 2;
  const int64_t returned = req.return_outputs ? (diagnose ? 2 : configs + 1) : 0;
  // A batch-invariance check holds the whole batch's output again and one
  // sub-batch's.
  const int64_t batches = req.batch_invariance ? 2 : 0;
  return operands + mn * per_element + mn * out_item * (kept + 2 * returned + batches) +
         (int64_t{1} << 20);
}

std::vector<ConfigSpec> FirstTierCandidateSpecs(DType storage, DType weight_storage,
                                                Fp8Scaling scaling,
                                                std::optional<Precision> block_precision) {
  // Wide operands: the wide precisions. FP8 operands: the fp8 precision of
  // their formats, with and without fast accumulation; their scales fix
  // the scaling. MXFP8/NVFP4 operands: their precision.
  std::vector<ConfigSpec> specs;
  if (!IsNarrow(storage)) {
    for (Precision p : kWidePrecisions) {
      ConfigSpec spec;
      spec.precision = p;
      specs.push_back(spec);
    }
  } else if (block_precision.has_value()) {
    // MXFP8/NVFP4 operands: their precision (the recipe's scale rounding
    // does not apply to scales that came with them).
    ConfigSpec spec;
    spec.precision = *block_precision;
    specs.push_back(spec);
  } else if (const std::optional<Precision> p = Fp8PrecisionOf(storage, weight_storage)) {
    for (bool fast : {false, true}) {
      ConfigSpec spec;
      spec.precision = *p;
      spec.scaling = scaling;
      spec.fast_accum = fast;
      specs.push_back(spec);
    }
  }
  return specs;
}

std::vector<ConfigSpec> SecondTierCandidateSpecs(DType storage, DType weight_storage, int64_t k) {
  std::vector<ConfigSpec> specs;
  const bool wide =
      storage == DType::kFloat32 || storage == DType::kBFloat16 || storage == DType::kFloat16;
  if (!wide || weight_storage != storage) return specs;
  // The FP8 recipes the server quantises wide operands with
  // (docs/numerics.md, "Scaling recipes"): torchao's Float8Linear
  // tensorwise and rowwise, each with and without fast accumulation.
  for (Fp8Scaling scaling : kFp8Scalings) {
    for (bool fast : {false, true}) {
      ConfigSpec spec;
      spec.precision = Precision::kFp8E4M3;
      spec.scaling = scaling;
      spec.fast_accum = fast;
      specs.push_back(spec);
    }
  }
  // MXFP8 as torchao's MX recipe and TransformerEngine's MXFP8BlockScaling
  // quantise, NVFP4 as TransformerEngine's NVFP4BlockScaling
  // (docs/numerics.md, "MXFP8 and NVFP4").
  for (MxScaleRounding rounding : {MxScaleRounding::kFloor, MxScaleRounding::kRceil}) {
    ConfigSpec spec;
    spec.precision = Precision::kMxFp8E4M3;
    spec.mx_rounding = rounding;
    specs.push_back(spec);
  }
  ConfigSpec nvfp4;
  nvfp4.precision = Precision::kNvFp4;
  specs.push_back(nvfp4);
  // The multi-pass precisions that differ from one pass here: one whose
  // parts hold every value of the storage dtype forms every product
  // exactly and is fp32's function in another order (all four for bf16,
  // bf16x6, bf16x9 and tf32x3 for fp16, bf16x9 for fp32;
  // docs/numerics.md, "Multi-pass precisions").
  for (Precision p : kMultiPassPrecisions) {
    if (StorageExactIn(p, storage)) continue;
    ConfigSpec spec;
    spec.precision = p;
    specs.push_back(spec);
  }
  // Split-K reduced in the output type, as PyTorch's reduced-precision
  // reductions allow for 16-bit GEMMs (docs/numerics.md, "Split-K"): the
  // storage's own precision at each scanned split count whose slices are
  // all non-empty for this K (K unknown: all of them).
  if (storage == DType::kBFloat16 || storage == DType::kFloat16) {
    for (int s : kScannedSplitK) {
      if (k > 0 && (s - 1) * SplitKSlice(k, s) >= k) continue;
      ConfigSpec spec;
      spec.precision = storage == DType::kBFloat16 ? Precision::kBf16 : Precision::kFp16;
      spec.splitk = s;
      spec.reduce = SplitKReduce::kOutput;
      specs.push_back(spec);
    }
  }
  return specs;
}

std::vector<std::string> Engine::DefaultCandidates(
    DType storage, DType weight_storage, bool has_bias, Activation activation, Fp8Scaling scaling,
    const std::optional<LinearProblem>& layer, std::map<std::string, std::string>* passed_over,
    std::vector<PreparedRun>* prepared, std::optional<Precision> block_precision) const {
  return OnBestBackends(FirstTierCandidateSpecs(storage, weight_storage, scaling, block_precision),
                        storage, has_bias, activation, layer, passed_over, prepared);
}

std::vector<std::string> Engine::SecondTierCandidates(
    DType storage, DType weight_storage, bool has_bias, Activation activation,
    const std::optional<LinearProblem>& layer, std::map<std::string, std::string>* passed_over,
    std::vector<PreparedRun>* prepared) const {
  return OnBestBackends(SecondTierCandidateSpecs(storage, weight_storage, layer ? layer->k : 0),
                        storage, has_bias, activation, layer, passed_over, prepared);
}

std::vector<std::string> Engine::ReplayCandidates(
    TensorCoreGpu gpu, DType storage, DType weight_storage, bool has_bias, Activation activation,
    Fp8Scaling scaling, const LinearProblem& layer, std::vector<PreparedRun>* prepared,
    std::optional<Precision> block_precision, std::vector<std::string>* sources) const {
  std::vector<ConfigSpec> replays;
  for (ConfigSpec spec :
       FirstTierCandidateSpecs(storage, weight_storage, scaling, block_precision)) {
    if (!TakesMma(spec.precision)) continue;
    if (IsFp8(spec.precision) &&
        (gpu == TensorCoreGpu::kSm80 || spec.scaling == Fp8Scaling::kBlock128)) {
      continue;
    }
    const ReplayOrder order =
        ReplayOrderFor(options_.kernel_orders, gpu, spec.precision, layer.m, layer.n, layer.k);
    // The recorded options, checked when the table was loaded, on this
    // candidate's precision.
    absl::StatusOr<ConfigSpec> replay =
        ParseConfigSpec(absl::StrCat("cpu:", PrecisionName(spec.precision), "@", order.options));
    if (!replay.ok()) continue;
    spec.mma = replay->mma;
    spec.tile_k = replay->tile_k;
    spec.residue = replay->residue;
    spec.splitk = replay->splitk;
    spec.reduce = replay->reduce;
    replays.push_back(spec);
    if (sources != nullptr && absl::c_find(*sources, order.source) == sources->end()) {
      sources->push_back(order.source);
    }
  }
  return OnBestBackends(replays, storage, has_bias, activation, layer, nullptr, prepared);
}

std::vector<std::string> Engine::OnBestBackends(const std::vector<ConfigSpec>& specs, DType storage,
                                                bool has_bias, Activation activation,
                                                const std::optional<LinearProblem>& layer,
                                                std::map<std::string, std::string>* passed_over,
                                                std::vector<PreparedRun>* prepared) const {
  std::vector<std::string> out;
  for (ConfigSpec spec : specs) {
    for (BiasMode b : {BiasMode::kFused, BiasMode::kUnfused}) {
      spec.bias = b;
      // The best backend for this pair: the first available one that runs
      // it, GPU backends before the CPU emulation. A device backend that
      // runs the configuration but not this layer is passed over, and why
      // is kept for the ranking.
      // Without a layer, Supports answers; with one, the backend's lists
      // (LinearBackend::Supports, which asks no rule of a backend's own)
      // pass over what it never runs, and Prepare asks the rest once.
      std::string refused;
      std::map<LinearBackend*, PreparedRun> runs;
      LinearBackend* chosen = FastestBackend(*registry_, [&](LinearBackend* backend) {
        spec.backend = std::string(backend->name());
        const Config config = ResolveConfig(spec, has_bias, activation, b);
        if (!layer.has_value()) return backend->Supports(config, storage).ok();
        if (!backend->LinearBackend::Supports(config, storage).ok()) return false;
        PreparedRun run = backend->Prepare(*layer, config);
        if (!run.ok() && backend->kind() == BackendKind::kDevice && refused.empty()) {
          refused = absl::StrCat(config.ToString(), ": ", run.status().message());
        }
        if (!run.ok()) return false;
        runs[backend] = std::move(run);
        return true;
      });
      if (chosen == nullptr) continue;
      spec.backend = std::string(chosen->name());
      const std::string c = ResolveConfig(spec, has_bias, activation, b).ToString();
      if (std::find(out.begin(), out.end(), c) == out.end()) {
        out.push_back(c);
        if (prepared != nullptr && layer.has_value()) prepared->push_back(runs[chosen]);
      }
      if (passed_over != nullptr && !refused.empty() && chosen->kind() != BackendKind::kDevice) {
        passed_over->emplace(c, refused);
      }
    }
  }
  return out;
}

namespace {

// A view of `t`'s bytes (no copy), valid while `t` lives; keeps its
// content id, so that a device keeps a stored weight resident.
Tensor ViewOf(const Tensor& t) {
  Tensor v = *Tensor::Borrow(t.dtype(), t.shape(), t.raw(), t.nbytes(), nullptr);
  v.set_content_id(t.content_id());
  return v;
}

std::optional<Tensor> ViewOf(const std::optional<Tensor>& t) {
  if (!t) return std::nullopt;
  return ViewOf(*t);
}

// Names of compared outputs: what the answer calls them.
absl::Status CheckOutputName(const std::string& name, size_t i) {
  const std::string field = absl::StrCat("observed[", i, "].name");
  if (name.empty() || name.size() > 64) {
    return InvalidFieldError(field, "1 to 64 characters", absl::StrCat("'", name, "'"));
  }
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-' && c != '.') {
      return InvalidFieldError(field, "letters, digits, '_', '-' or '.'",
                               absl::StrCat("'", name, "'"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CompareOutcome> Engine::CompareOutputs(
    const LinearRequest& request, const std::vector<std::pair<std::string, Tensor>>& observed,
    const StopSignal* stop, RequestProgress* progress) const {
  if (observed.size() != 2) {
    return InvalidFieldError("observed", "exactly two named outputs to compare",
                             absl::StrCat(observed.size()));
  }
  for (size_t i = 0; i < observed.size(); ++i) {
    TC_RETURN_IF_ERROR(CheckOutputName(observed[i].first, i));
  }
  if (observed[0].first == observed[1].first) {
    return InvalidFieldError("observed[1].name", "a name other than observed[0]'s",
                             absl::StrCat("'", observed[1].first, "' twice"));
  }
  CompareOutcome out;
  // Each output diagnosed against the same candidates, keeping the output
  // of the configuration that explains it.
  std::vector<Tensor> best_outputs;
  std::vector<double> strays;  // max |output - its configuration|
  std::vector<std::optional<Config>> bests;
  for (size_t i = 0; i < observed.size(); ++i) {
    LinearRequest one;
    one.input = ViewOf(request.input);
    one.weight = ViewOf(request.weight);
    one.layout = request.layout;
    one.bias = ViewOf(request.bias);
    one.activation = request.activation;
    one.output_dtype = request.output_dtype;
    one.input_scale = ViewOf(request.input_scale);
    one.weight_scale = ViewOf(request.weight_scale);
    one.observed = ViewOf(observed[i].second);
    one.configs = request.configs;
    one.reference = request.reference;
    one.tolerance = request.tolerance;
    one.return_outputs = true;
    one.top_k = request.top_k;
    one.top_groups = request.top_groups;
    one.accept = request.accept;
    absl::StatusOr<VerifyOutcome> diagnosed = Diagnose(one, stop, progress);
    if (!diagnosed.ok()) {
      const absl::Status& st = diagnosed.status();
      // Errors about the output name which one.
      if (absl::StrContains(st.message(), "observed")) {
        return absl::Status(
            st.code(), absl::StrCat("observed[", i, "] (", observed[i].first, "): ", st.message()));
      }
      return st;
    }
    ComparedOutcome c;
    c.name = observed[i].first;
    c.vs_reference = *std::move(diagnosed->observed_vs_reference);
    c.bound_precision = diagnosed->observed_bound_precision;
    c.diagnosis = *std::move(diagnosed->diagnosis);
    const std::string keep = c.diagnosis.best.has_value()   ? *c.diagnosis.best
                             : !c.diagnosis.ranking.empty() ? c.diagnosis.ranking[0].config
                                                            : std::string();
    Tensor kept;
    double stray = 0;
    for (ConfigOutcome& r : diagnosed->results) {
      if (r.config != keep || !r.output) continue;
      kept = *std::move(r.output);
      stray = r.vs_observed ? r.vs_observed->max_abs : 0;
    }
    best_outputs.push_back(std::move(kept));
    strays.push_back(stray);
    if (i == 0) {
      out.reference = diagnosed->reference.config;
      out.output_shape = diagnosed->output_shape;
      out.notes = diagnosed->notes;
    }
    out.outputs.push_back(std::move(c));
  }

  // The two outputs against each other, and the two configurations.
  OutputPairOutcome& pair = out.pair;
  pair.a = out.outputs[0].name;
  pair.b = out.outputs[1].name;
  CompareOptions opts;
  opts.compared_dtype = out.outputs[0].diagnosis.compared_dtype;
  // The request's tolerance between the two (the bound preset's per-element
  // bound belongs to one configuration: torch's defaults instead).
  const ToleranceRequest& tr = request.tolerance;
  opts.tolerance =
      ResolveTolerance(tr.preset == TolerancePreset::kBound ? TolerancePreset::kTorch : tr.preset,
                       opts.compared_dtype, tr.atol, tr.rtol, tr.max_ulp, 1.0, tr.nan_equal);
  opts.cols = out.output_shape.empty() ? 0 : out.output_shape.back();
  opts.top_k = request.top_k == 0 ? 10 : request.top_k;
  opts.top_groups = request.top_groups == 0 ? 5 : request.top_groups;
  opts.executor = options_.executor;
  opts.stop = stop;
  TC_ASSIGN_OR_RETURN(pair.stats,
                      tensorcheck::Compare(observed[0].second, observed[1].second, opts));
  if (best_outputs[0].numel() == best_outputs[1].numel() && best_outputs[0].numel() > 0) {
    TC_ASSIGN_OR_RETURN(const DiffStats configs,
                        tensorcheck::Compare(best_outputs[0], best_outputs[1], opts));
    pair.configs_max_abs = configs.max_abs;
  }
  pair.expected_max_abs = pair.configs_max_abs + strays[0] + strays[1];
  const DiagnosisOutcome& da = out.outputs[0].diagnosis;
  const DiagnosisOutcome& db = out.outputs[1].diagnosis;
  pair.rounding =
      da.verdict == DiagnosisVerdict::kRounding && db.verdict == DiagnosisVerdict::kRounding;
  out.passed = da.accepted && db.accepted;
  out.verdict_set = !request.accept.empty();
  CompareWords(request, &out);
  return out;
}

// The pair's advice and the headline (docs/numerics.md, "Comparing two
// outputs").
void Engine::CompareWords(const LinearRequest& request, CompareOutcome* out) {
  OutputPairOutcome& pair = out->pair;
  const ComparedOutcome& a = out->outputs[0];
  const ComparedOutcome& b = out->outputs[1];
  const DType storage = request.input.dtype();
  const bool has_bias = request.bias.has_value();
  auto config_of = [&](const DiagnosisOutcome& d) -> std::optional<Config> {
    if (!d.best.has_value()) return std::nullopt;
    absl::StatusOr<ConfigSpec> spec = ParseConfigSpec(*d.best);
    if (!spec.ok()) return std::nullopt;
    Config c;
    c.backend = spec->backend;
    c.precision = spec->precision;
    c.bias = spec->bias.value_or(BiasMode::kNone);
    return c;
  };
  const std::optional<Config> ca = config_of(a.diagnosis), cb = config_of(b.diagnosis);
  auto described = [&](const Config& c) {
    const std::string by_default = FrameworkDefault(c, storage, has_bias);
    return by_default.empty() ? c.ToString() : absl::StrCat(c.ToString(), " (", by_default, ")");
  };
  if (!pair.rounding) {
    std::vector<std::string> parts;
    for (const ComparedOutcome* o : {&a, &b}) {
      if (o->diagnosis.verdict == DiagnosisVerdict::kRounding && o->diagnosis.best) {
        parts.push_back(absl::StrCat(o->name, " is ", *o->diagnosis.best, " (rounding)"));
      } else {
        parts.push_back(absl::StrCat(o->name, ": ", o->diagnosis.headline));
      }
    }
    out->headline = absl::StrCat("Not explained as rounding: ", absl::StrJoin(parts, "; "));
    return;
  }
  const bool same = ca->precision == cb->precision && ca->bias == cb->bias;
  if (!same) {
    pair.advice_b_to_a = HowToMatch(*cb, *ca, storage, has_bias);
    pair.advice_a_to_b = HowToMatch(*ca, *cb, storage, has_bias);
  }
  out->headline = absl::StrFormat(
      "%s; their difference is rounding: at most %.3g expected, %.3g seen.",
      same ? absl::StrCat(a.name, " and ", b.name, " are both ", described(*ca),
                          ", summed in different orders")
           : absl::StrCat(a.name, " is ", described(*ca), ", ", b.name, " is ", described(*cb)),
      pair.expected_max_abs, pair.stats.max_abs);
  if (!pair.advice_b_to_a.empty()) {
    std::string advice = pair.advice_b_to_a;
    advice[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(advice[0])));
    absl::StrAppend(&out->headline, " For ", b.name, " to match ", a.name, ": ", advice);
  }
}

}  // namespace tensorcheck
