#include "server/engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/backends/comparing_backend.h"
#include "server/backends/cpu/cpu_backend.h"
#include "server/core/status_macros.h"
#include "server/engine/diagnosis.h"
#include "server/stats/error_model.h"

namespace tensorcheck {

namespace {

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
      return Precision::kBf16;
  }
  return Precision::kFp32;
}

absl::Status CheckTensorSize(const Tensor& t, absl::string_view field,
                             int64_t max_bytes) {
  if (static_cast<int64_t>(t.nbytes()) > max_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat(field, ": ", t.nbytes(), " bytes exceed the limit of ",
                     max_bytes, " bytes per tensor"));
  }
  return absl::OkStatus();
}

// Whether every value of `storage` is exact in the input format of
// `precision` (so the multiply rounds nothing), decided from the dtypes.
bool InputsAlreadyIn(Precision precision, DType storage) {
  switch (precision) {
    case Precision::kFp64:
      return true;
    case Precision::kFp32:
    case Precision::kTf32:
    case Precision::kTf32Rna:
    case Precision::kTf32Trunc:
      // bf16 (8 significant bits) and fp16 (11) values lie in fp32's
      // exponent range: exact in TF32 and fp32.
      return storage != DType::kFloat64 &&
             (precision == Precision::kFp32 || storage != DType::kFloat32);
    case Precision::kBf16:
      return storage == DType::kBFloat16;
    case Precision::kFp16:
    case Precision::kFp16Acc:
      return storage == DType::kFloat16;
  }
  return false;
}

// Per-element error model arrays of one precision.
struct ErrorArrays {
  std::vector<float> sigma;
  std::vector<float> bound;
  double sigma_sum_sq = -1;  // sum of sigma^2, as PredictSigma returns it
};

}  // namespace

std::vector<int64_t> UnflattenIndex(int64_t flat,
                                    const std::vector<int64_t>& shape) {
  std::vector<int64_t> index(shape.size(), 0);
  for (size_t i = shape.size(); i-- > 0;) {
    const int64_t d = shape[i];
    if (d <= 0) continue;
    index[i] = flat % d;
    flat /= d;
  }
  return index;
}

// Everything decided before running anything.
struct Engine::Plan {
  int64_t m = 0, n = 0, k = 0;
  DType output_dtype = DType::kFloat32;
  std::vector<int64_t> output_shape;
  Config reference;
  LinearBackend* reference_backend = nullptr;
  std::vector<Config> configs;
  std::vector<LinearBackend*> backends;
  Tolerance tolerance;
  Precision observed_bound_precision = Precision::kFp32;
  CompareOptions compare;
  RunOptions run;
};

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(
    const EngineOptions& options, const BackendRegistry* registry) {
  if (registry == nullptr) {
    return absl::InvalidArgumentError("engine: backend registry is null");
  }
  auto engine = std::unique_ptr<Engine>(new Engine(options, registry));
  // The default reference must resolve on this host.
  TC_ASSIGN_OR_RETURN(ConfigSpec spec,
                      ParseConfigSpec(options.default_reference, "reference"));
  TC_ASSIGN_OR_RETURN(LinearBackend * backend, registry->Find(spec.backend));
  TC_RETURN_IF_ERROR(backend->Available());
  return engine;
}

absl::StatusOr<Engine::Plan> Engine::MakePlan(
    const LinearRequest& req, const std::vector<std::string>& config_specs) const {
  Plan plan;
  const Tensor& x = req.input;
  const Tensor& w = req.weight;

  // Sizes first: nothing below allocates before these pass.
  TC_RETURN_IF_ERROR(CheckTensorSize(x, "op.input", options_.max_tensor_bytes));
  TC_RETURN_IF_ERROR(CheckTensorSize(w, "op.weight", options_.max_tensor_bytes));
  if (req.bias) {
    TC_RETURN_IF_ERROR(CheckTensorSize(*req.bias, "op.bias", options_.max_tensor_bytes));
  }
  if (req.observed) {
    TC_RETURN_IF_ERROR(
        CheckTensorSize(*req.observed, "observed", options_.max_tensor_bytes));
  }

  if (x.rank() < 1 || x.numel() == 0) {
    return InvalidFieldError("op.input.shape", "a non-empty [..., K] tensor",
                   ShapeString(x.shape()));
  }
  plan.k = x.shape().back();
  plan.m = x.numel() / plan.k;
  if (w.rank() != 2) {
    return InvalidFieldError("op.weight.shape",
                   req.layout == WeightLayout::kOutIn ? "rank 2 [N, K]" : "rank 2 [K, N]",
                   ShapeString(w.shape()));
  }
  const int64_t w_k = req.layout == WeightLayout::kOutIn ? w.dim(1) : w.dim(0);
  plan.n = req.layout == WeightLayout::kOutIn ? w.dim(0) : w.dim(1);
  if (w_k != plan.k) {
    return absl::InvalidArgumentError(absl::StrCat(
        "op.weight.shape: ", ShapeString(w.shape()), " does not match K=", plan.k,
        " (the input's last dim) in layout ", WeightLayoutName(req.layout),
        "; expected ",
        req.layout == WeightLayout::kOutIn ? absl::StrCat("[N, ", plan.k, "]")
                                           : absl::StrCat("[", plan.k, ", N]")));
  }
  if (plan.n == 0) {
    return InvalidFieldError("op.weight.shape", "N >= 1", ShapeString(w.shape()));
  }
  if (w.dtype() != x.dtype()) {
    return InvalidFieldError("op.weight.dtype",
                   absl::StrCat(DTypeName(x.dtype()), " (the input's dtype)"),
                   DTypeName(w.dtype()));
  }
  if (req.bias) {
    if (req.bias->rank() != 1 || req.bias->dim(0) != plan.n) {
      return InvalidFieldError("op.bias.shape", absl::StrCat("[", plan.n, "] (N)"),
                     ShapeString(req.bias->shape()));
    }
  }
  // Output size and work, with checked arithmetic.
  if (plan.m > options_.max_output_elements / plan.n) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "output [", plan.m, ", ", plan.n, "] exceeds the limit of ",
        options_.max_output_elements, " elements"));
  }
  if (plan.m * plan.n > options_.max_macs / plan.k) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "problem M*N*K = ", plan.m, "*", plan.n, "*", plan.k,
        " exceeds the limit of ", options_.max_macs, " multiply-adds"));
  }
  plan.output_dtype = req.output_dtype.value_or(x.dtype());
  plan.output_shape.assign(x.shape().begin(), x.shape().end() - 1);
  plan.output_shape.push_back(plan.n);
  if (req.observed && req.observed->shape() != plan.output_shape) {
    return InvalidFieldError("observed.shape",
                   absl::StrCat(ShapeString(plan.output_shape), " (input's leading dims, N)"),
                   ShapeString(req.observed->shape()));
  }

  // Options.
  if (req.top_k < 0 || req.top_k > options_.max_top_k) {
    return InvalidFieldError("output.top_k", absl::StrCat("0..", options_.max_top_k),
                   absl::StrCat(req.top_k));
  }
  if (req.top_groups < 0 || req.top_groups > options_.max_top_groups) {
    return InvalidFieldError("output.top_groups",
                   absl::StrCat("0..", options_.max_top_groups),
                   absl::StrCat(req.top_groups));
  }
  if (req.repeat < 0 || req.repeat > options_.max_repeat) {
    return InvalidFieldError("repeat", absl::StrCat("0..", options_.max_repeat),
                   absl::StrCat(req.repeat));
  }
  if (static_cast<int>(config_specs.size()) > options_.max_configs) {
    return absl::InvalidArgumentError(
        absl::StrCat("configs: at most ", options_.max_configs,
                     " configurations expected, got ", config_specs.size()));
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
  plan.tolerance = ResolveTolerance(tr.preset, plan.output_dtype, tr.atol, tr.rtol,
                                    tr.max_ulp,
                                    tr.bound_factor == 0 ? 1.0 : tr.bound_factor,
                                    tr.nan_equal);
  plan.observed_bound_precision = NaturalPrecision(plan.output_dtype);
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
  auto resolve = [&](absl::string_view spec_text, absl::string_view field,
                     Config* config, LinearBackend** backend) -> absl::Status {
    TC_ASSIGN_OR_RETURN(ConfigSpec spec, ParseConfigSpec(spec_text, field));
    TC_ASSIGN_OR_RETURN(*backend, registry_->Find(spec.backend));
    if (has_bias && spec.bias == BiasMode::kNone) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, " '", spec_text,
          "': bias mode 'none' given but the request has a bias; expected "
          "'fused' or 'unfused'"));
    }
    *config = ResolveConfig(spec, has_bias, req.activation,
                            (*backend)->default_bias_mode());
    absl::Status available = (*backend)->Available();
    if (!available.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          field, " '", spec_text, "': backend '", spec.backend,
          "' is not available on this host: ", available.message()));
    }
    absl::Status supported = (*backend)->Supports(*config, x.dtype());
    if (!supported.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat(field, ": ", supported.message()));
    }
    return absl::OkStatus();
  };
  const std::string& reference_spec =
      req.reference.empty() ? options_.default_reference : req.reference;
  TC_RETURN_IF_ERROR(resolve(reference_spec, "reference", &plan.reference,
                             &plan.reference_backend));
  for (size_t i = 0; i < config_specs.size(); ++i) {
    Config c;
    LinearBackend* b = nullptr;
    TC_RETURN_IF_ERROR(resolve(config_specs[i], absl::StrCat("configs[", i, "]"), &c, &b));
    // The same configuration twice is run once.
    if (std::find(plan.configs.begin(), plan.configs.end(), c) != plan.configs.end()) {
      continue;
    }
    plan.configs.push_back(c);
    plan.backends.push_back(b);
  }

  plan.compare.tolerance = plan.tolerance;
  plan.compare.compared_dtype = plan.output_dtype;
  plan.compare.cols = plan.n;
  plan.compare.top_k = req.top_k == 0 ? 10 : req.top_k;
  plan.compare.top_groups = req.top_groups == 0 ? 5 : req.top_groups;
  plan.compare.threads = options_.stats_threads;
  plan.run.repeat = req.repeat == 0 ? 1 : req.repeat;
  plan.run.disallow_reduced_precision_reduction =
      req.disallow_reduced_precision_reduction;
  return plan;
}

// What Run keeps for a diagnosis, per configuration (results order).
struct Engine::Artifacts {
  Tensor reference;
  std::vector<Tensor> outputs;
  std::vector<std::vector<float>> pair_sigma;
  std::vector<std::vector<float>> pair_accumulation_sigma;
  std::vector<std::vector<float>> sigma_vs_reference;
};

absl::StatusOr<VerifyOutcome> Engine::Verify(const LinearRequest& request) const {
  TC_ASSIGN_OR_RETURN(Plan plan, MakePlan(request, request.configs));
  return Run(request, plan, /*artifacts=*/nullptr);
}

absl::StatusOr<VerifyOutcome> Engine::Diagnose(const LinearRequest& request) const {
  if (!request.observed) {
    return absl::InvalidArgumentError(
        "observed: the output to diagnose is required, got none");
  }
  std::vector<std::string> candidates = request.configs;
  if (candidates.empty()) {
    candidates = DefaultCandidates(request.input.dtype(), request.bias.has_value(),
                                   request.activation);
  }
  TC_ASSIGN_OR_RETURN(Plan plan, MakePlan(request, candidates));
  Artifacts artifacts;
  TC_ASSIGN_OR_RETURN(VerifyOutcome outcome, Run(request, plan, &artifacts));
  DiagnosisInput in;
  in.observed = &*request.observed;
  in.reference = &artifacts.reference;
  in.reference_config = plan.reference.ToString();
  in.storage_dtype = request.input.dtype();
  in.output_dtype = plan.output_dtype;
  in.has_bias = request.bias.has_value();
  in.activation = request.activation;
  in.output_shape = plan.output_shape;
  in.top_k = plan.compare.top_k;
  in.top_groups = plan.compare.top_groups;
  for (size_t i = 0; i < outcome.results.size(); ++i) {
    DiagnosisCandidate c;
    c.config = plan.configs[i];
    c.output = &artifacts.outputs[i];
    c.vs_observed = &*outcome.results[i].vs_observed;
    c.vs_reference = &outcome.results[i].vs_reference;
    c.pair_sigma = artifacts.pair_sigma[i].data();
    c.pair_accumulation_sigma = artifacts.pair_accumulation_sigma[i].data();
    c.sigma_vs_reference = artifacts.sigma_vs_reference[i].data();
    in.candidates.push_back(c);
  }
  outcome.diagnosis = RankCandidates(in);
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
  return outcome;
}

std::vector<std::string> Engine::DefaultCandidates(DType storage, bool has_bias,
                                                   Activation activation) const {
  std::vector<std::string> out;
  for (Precision p : kAllPrecisions) {
    for (BiasMode b : {BiasMode::kFused, BiasMode::kUnfused}) {
      // The best backend for this pair: the first available one that runs
      // it, GPU backends before the CPU emulation.
      LinearBackend* chosen = nullptr;
      for (LinearBackend* backend : registry_->backends()) {
        if (!backend->Available().ok()) continue;
        ConfigSpec spec{std::string(backend->name()), p, b};
        Config c = ResolveConfig(spec, has_bias, activation, b);
        if (!backend->Supports(c, storage).ok()) continue;
        if (chosen == nullptr || chosen->name() == "cpu") chosen = backend;
      }
      if (chosen == nullptr) continue;
      ConfigSpec spec{std::string(chosen->name()), p, b};
      const std::string c =
          ResolveConfig(spec, has_bias, activation, b).ToString();
      if (std::find(out.begin(), out.end(), c) == out.end()) out.push_back(c);
    }
  }
  return out;
}

absl::StatusOr<VerifyOutcome> Engine::Run(const LinearRequest& req,
                                          const Plan& plan,
                                          Artifacts* artifacts) const {
  using Clock = std::chrono::steady_clock;
  LinearProblem problem;
  problem.input = &req.input;
  problem.weight = &req.weight;
  problem.layout = req.layout;
  problem.bias = req.bias ? &*req.bias : nullptr;
  problem.activation = req.activation;
  problem.output_dtype = plan.output_dtype;
  problem.m = plan.m;
  problem.n = plan.n;
  problem.k = plan.k;
  const int64_t count = plan.m * plan.n;

  auto shape_output = [&](const Config& config, Tensor& output) -> absl::Status {
    if (output.numel() != count) {
      return absl::InternalError(absl::StrCat("configuration ", config.ToString(),
                                              ": backend returned ", output.numel(),
                                              " elements, expected ", count));
    }
    return output.Reshape(plan.output_shape);
  };

  auto run_one = [&](LinearBackend* backend, const Config& config)
      -> absl::StatusOr<std::pair<RunResult, double>> {
    const auto start = Clock::now();
    auto result = backend->Run(problem, config, plan.run);
    const double ms =
        std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    if (!result.ok()) {
      return absl::Status(result.status().code(),
                          absl::StrCat("configuration ", config.ToString(), ": ",
                                       result.status().message()));
    }
    TC_RETURN_IF_ERROR(shape_output(config, result->output));
    return std::make_pair(std::move(result).value(), ms);
  };

  VerifyOutcome outcome;
  outcome.tolerance = plan.tolerance;
  outcome.output_shape = plan.output_shape;
  outcome.observed_bound_precision = plan.observed_bound_precision;

  TC_ASSIGN_OR_RETURN(auto reference, run_one(plan.reference_backend, plan.reference));
  const Tensor& ref = reference.first.output;

  // Error model inputs, shared by every comparison: per element
  // sum_k |x||w|, sqrt(sum_k (xw)^2) and the reference value.
  std::vector<float> abs_dot(static_cast<size_t>(count));
  std::vector<float> sq_dot(static_cast<size_t>(count));
  TC_RETURN_IF_ERROR(ComputeMagnitudeSums(problem, abs_dot.data(), sq_dot.data()));
  std::vector<double> ref_values(static_cast<size_t>(count));
  ToDouble(ref, ref_values.data());

  // Whether the stored x and W are already in a precision's input format,
  // so that it rounds nothing (cached per precision).
  std::map<Precision, bool> exact_cache;
  auto inputs_exact = [&](Precision precision) {
    auto it = exact_cache.find(precision);
    if (it != exact_cache.end()) return it->second;
    bool exact = InputsAlreadyIn(precision, req.input.dtype());
    if (!exact) {
      exact = true;
      for (const Tensor* t : {&req.input, &req.weight}) {
        for (int64_t i = 0; exact && i < t->numel(); ++i) {
          const double v = t->GetDouble(i);
          const float f = static_cast<float>(v);
          exact = static_cast<double>(f) == v && RoundInput(precision, f) == f;
        }
      }
    }
    exact_cache[precision] = exact;
    return exact;
  };
  auto model_input = [&](Precision precision, bool unfused_bias) {
    ErrorModelInput in;
    in.precision = precision;
    in.k = plan.k;
    in.output_dtype = plan.output_dtype;
    in.unfused_bias = unfused_bias;
    in.inputs_exact = inputs_exact(precision);
    in.abs_dot = abs_dot.data();
    in.sq_dot = sq_dot.data();
    in.value = ref_values.data();
    in.count = count;
    return in;
  };
  // Against the exact result: input rounding, accumulation, output rounding.
  auto model = [&](Precision precision, bool unfused_bias) {
    const ErrorModelInput in = model_input(precision, unfused_bias);
    ErrorArrays arrays;
    arrays.sigma.resize(static_cast<size_t>(count));
    arrays.bound.resize(static_cast<size_t>(count));
    arrays.sigma_sum_sq = PredictSigma(in, arrays.sigma.data());
    HardBound(in, /*c=*/1.0, arrays.bound.data());  // Compare applies bound_factor
    return arrays;
  };

  // Between two runs of one configuration in different summation orders:
  // only the sigma differs; the hard bound is the configuration's own.
  auto pair_sigma = [&](Precision precision, bool unfused_bias, double* sum_sq) {
    std::vector<float> sigma(static_cast<size_t>(count));
    *sum_sq = PredictPairSigma(model_input(precision, unfused_bias), sigma.data());
    return sigma;
  };

  auto options_for = [&](const float* sigma, const float* bound, double sigma_sum_sq) {
    CompareOptions opts = plan.compare;
    opts.predicted_sigma = sigma;
    opts.predicted_sigma_sum_sq = sigma_sum_sq;
    opts.error_bound = bound;
    return opts;
  };

  // A configuration's outcome: its output against the reference, and the
  // observed output against it. Backends that compare where they compute
  // (GPU: on the device) get the comparisons with the run; the others'
  // outputs are compared here. `keep` stores what a diagnosis needs in
  // `artifacts` (candidates only, not the reference); `ran` is the
  // reference's run, already done.
  auto outcome_of = [&](LinearBackend* backend, const Config& config, Artifacts* keep,
                        std::pair<RunResult, double>* ran) -> absl::StatusOr<ConfigOutcome> {
    const bool unfused = config.bias == BiasMode::kUnfused;
    ErrorArrays to_reference = model(config.precision, unfused);
    std::vector<float> pair;
    double pair_sum_sq = -1;
    if (req.observed) pair = pair_sigma(config.precision, unfused, &pair_sum_sq);
    const CompareOptions vs_reference_options =
        options_for(to_reference.sigma.data(), to_reference.bound.data(),
                    to_reference.sigma_sum_sq);
    const CompareOptions vs_observed_options =
        options_for(pair.data(), to_reference.bound.data(), pair_sum_sq);

    ConfigOutcome o;
    o.config = config.ToString();
    RunResult run;
    ComparingBackend* comparing = ran == nullptr ? backend->comparing() : nullptr;
    if (comparing != nullptr) {
      std::vector<OutputComparison> comparisons = {{&ref, true, vs_reference_options}};
      if (req.observed) comparisons.push_back({&*req.observed, false, vs_observed_options});
      const bool need_output = req.return_outputs || keep != nullptr;
      const auto start = Clock::now();
      auto compared =
          comparing->RunAndCompare(problem, config, plan.run, comparisons, need_output);
      o.elapsed_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
      if (!compared.ok()) {
        return absl::Status(compared.status().code(),
                            absl::StrCat("configuration ", o.config, ": ",
                                         compared.status().message()));
      }
      o.vs_reference = std::move(compared->stats[0]);
      if (req.observed) o.vs_observed = std::move(compared->stats[1]);
      run = std::move(compared->run);
      if (need_output) TC_RETURN_IF_ERROR(shape_output(config, run.output));
    } else {
      std::pair<RunResult, double> done;
      if (ran == nullptr) {
        TC_ASSIGN_OR_RETURN(done, run_one(backend, config));
        ran = &done;
      }
      o.elapsed_ms = ran->second;
      TC_ASSIGN_OR_RETURN(o.vs_reference,
                          Compare(ran->first.output, ref, vs_reference_options));
      if (req.observed) {
        TC_ASSIGN_OR_RETURN(DiffStats s,
                            Compare(*req.observed, ran->first.output, vs_observed_options));
        o.vs_observed = std::move(s);
      }
      run = std::move(ran->first);  // last use of `ref` when this is the reference
    }
    o.details = std::move(run.details);
    o.deterministic = run.deterministic;
    o.runs = run.runs;
    if (keep != nullptr) {
      if (req.observed) {
        keep->pair_sigma.push_back(std::move(pair));
        std::vector<float> accumulation(static_cast<size_t>(count));
        PredictPairAccumulationSigma(model_input(config.precision, unfused),
                                     accumulation.data());
        keep->pair_accumulation_sigma.push_back(std::move(accumulation));
        keep->sigma_vs_reference.push_back(std::move(to_reference.sigma));
      }
      if (req.return_outputs) o.output = run.output.Clone();
      keep->outputs.push_back(std::move(run.output));
    } else if (req.return_outputs) {
      o.output = std::move(run.output);
    }
    return o;
  };

  if (req.observed) {
    ErrorArrays arrays = model(plan.observed_bound_precision, false);
    TC_ASSIGN_OR_RETURN(DiffStats s, Compare(*req.observed, ref,
                                             options_for(arrays.sigma.data(),
                                                         arrays.bound.data(),
                                                         arrays.sigma_sum_sq)));
    outcome.observed_vs_reference = std::move(s);
  }

  bool all_pass = true;
  for (size_t i = 0; i < plan.configs.size(); ++i) {
    TC_ASSIGN_OR_RETURN(ConfigOutcome o, outcome_of(plan.backends[i], plan.configs[i],
                                                    artifacts, /*ran=*/nullptr));
    all_pass = all_pass && o.vs_reference.passed;
    outcome.results.push_back(std::move(o));
  }
  // The reference against itself is trivially equal; its outcome carries
  // its timing, details and (when asked) its output.
  if (artifacts != nullptr) artifacts->reference = reference.first.output.Clone();
  TC_ASSIGN_OR_RETURN(outcome.reference,
                      outcome_of(plan.reference_backend, plan.reference, /*keep=*/nullptr,
                                 &reference));

  outcome.passed = outcome.observed_vs_reference
                       ? outcome.observed_vs_reference->passed
                       : all_pass;

  // Side facts worth knowing for this request.
  bool sixteen_bit_fused = false, gpu = false;
  for (const Config& c : plan.configs) {
    if ((c.precision == Precision::kBf16 || c.precision == Precision::kFp16) &&
        c.bias == BiasMode::kFused) {
      sixteen_bit_fused = true;
    }
    if (c.backend != "cpu") gpu = true;
  }
  if (sixteen_bit_fused) {
    outcome.notes.push_back(
        "PyTorch may add the bias at output precision (not in the fp32 "
        "epilogue) in split-K kernels with 16-bit inputs.");
  }
  if (gpu) {
    outcome.notes.push_back(
        "cuBLAS is bitwise reproducible run to run only for one stream and "
        "one architecture/SM count.");
  }
  if (req.activation == Activation::kGeluTanh) {
    outcome.notes.push_back(
        "GELU is the tanh approximation (as cuBLASLt's epilogue); the erf "
        "form differs by up to ~1e-3 relative.");
  }
  if (req.observed && req.observed->dtype() != plan.output_dtype) {
    outcome.notes.push_back(absl::StrCat(
        "observed is ", DTypeName(req.observed->dtype()),
        " but configurations round their outputs to ", DTypeName(plan.output_dtype),
        "; set output_dtype to compare like with like."));
  }
  return outcome;
}

}  // namespace tensorcheck
