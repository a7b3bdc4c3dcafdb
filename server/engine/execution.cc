// Engine::Run: carries out a plan. The reference runs first; then every
// configuration, compared with the reference and with the observed output.
//
// Work that several configurations have in common is done once when
// EngineOptions::share_computations is on (the default):
//   - a backend without device comparisons runs its configurations as one
//     batch (LinearBackend::RunBatch), together with the reference when it
//     is the reference's backend: the CPU backend then runs one GEMM per
//     arithmetic (docs/numerics.md, "Shared computations");
//   - error-model arrays are computed once per set of parameters that
//     determine them (bf16 tensors under fp32, tf32 and bf16 have equal
//     ones);
//   - outputs known to be bitwise equal (same GEMM, same epilogue) are
//     compared once per error-model array and the statistics copied.
// With it off, every configuration runs and is compared on its own, as
// diagnose_bench's baseline does.
#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/parallel.h"
#include "core/status_macros.h"
#include "server/backends/comparing_backend.h"
#include "server/engine/internal/model_key.h"
#include "server/engine/internal/plan.h"
#include "server/stats/error_model.h"
#include "server/stats/magnitude_sums.h"

namespace tensorcheck {

namespace {

using Clock = std::chrono::steady_clock;

double MillisSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

using internal::ModelKey;

// An error-model array and the sum of its squares (when it has one).
struct ModelArray {
  SharedFloats values;
  double sum_sq = -1;
  const float* data() const { return values ? values->data() : nullptr; }
};

// Statistics of one comparison, keyed by what determines them: the
// output's class (outputs of one class are bitwise equal), which side of
// which comparison, and the error-model arrays the options point at.
struct StatsKey {
  std::string output_class;
  bool vs_observed = false;
  const float* sigma = nullptr;
  const float* bound = nullptr;
  bool operator<(const StatsKey& o) const {
    return std::tie(output_class, vs_observed, sigma, bound) <
           std::tie(o.output_class, o.vs_observed, o.sigma, o.bound);
  }
};

}  // namespace

class Engine::Execution {
 public:
  Execution(const EngineOptions& options, const LinearRequest& req, const Engine::Plan& plan,
            Engine::Artifacts* artifacts)
      : share_(options.share_computations),
        bound_used_(plan.tolerance.preset == TolerancePreset::kBound),
        executor_(options.executor),
        req_(req),
        plan_(plan),
        artifacts_(artifacts) {
    problem_ = ProblemOf(req, plan);
    count_ = plan.shape.m * plan.shape.n;
  }

  absl::StatusOr<VerifyOutcome> Run() {
    outcome_.tolerance = plan_.tolerance;
    outcome_.output_shape = plan_.output_shape;
    outcome_.observed_bound_precision = plan_.observed_bound_precision;
    results_.resize(plan_.configs.size());
    if (artifacts_ != nullptr) artifacts_->Resize(plan_.configs.size());
    TC_RETURN_IF_ERROR(RunReferenceBatch());
    TC_RETURN_IF_ERROR(RunRemaining());
    TC_RETURN_IF_ERROR(FinishReference());
    bool all_pass = true;
    for (std::optional<ConfigOutcome>& r : results_) {
      all_pass = all_pass && r->vs_reference.passed;
      outcome_.results.push_back(*std::move(r));
    }
    outcome_.passed =
        outcome_.observed_vs_reference ? outcome_.observed_vs_reference->passed : all_pass;
    outcome_.notes = Engine::Notes(req_, plan_);
    return std::move(outcome_);
  }

 private:
  // Compare options of a configuration and the error-model arrays they
  // point at.
  struct Options {
    ModelArray sigma, bound, pair;
    CompareOptions vs_reference, vs_observed;
  };

  // ---- Steps.

  // The reference, and with it the configurations its backend can run in
  // the same batch (all of them on that backend, when it compares on the
  // host and sharing is on).
  absl::Status RunReferenceBatch() {
    LinearBackend* backend = plan_.reference_backend;
    if (!share_ || backend->comparing() != nullptr) {
      const auto start = Clock::now();
      auto run = backend->Run(problem_, plan_.reference_run, plan_.run);
      if (!run.ok()) return WithConfigContext(run.status(), plan_.reference);
      return OnReference(*std::move(run), MillisSince(start));
    }
    std::vector<size_t> members;
    for (size_t i = 0; i < plan_.configs.size(); ++i) {
      if (plan_.backends[i] == backend) members.push_back(i);
    }
    return RunBatch(backend, members, /*with_reference=*/true);
  }

  // Every configuration not run yet: GPU backends one by one (they compare
  // on the device), others in one batch per backend.
  absl::Status RunRemaining() {
    std::vector<LinearBackend*> batched;
    for (size_t i = 0; i < plan_.configs.size(); ++i) {
      if (results_[i].has_value()) continue;
      TC_RETURN_IF_ERROR(CheckStop(plan_.run.stop));
      LinearBackend* backend = plan_.backends[i];
      if (ComparingBackend* comparing = backend->comparing()) {
        TC_ASSIGN_OR_RETURN(results_[i], RunAndCompare(comparing, i));
      } else if (!share_) {
        const auto start = Clock::now();
        auto run = backend->Run(problem_, plan_.runs[i], plan_.run);
        if (!run.ok()) return WithConfigContext(run.status(), plan_.configs[i]);
        TC_ASSIGN_OR_RETURN(results_[i], OutcomeOf(i, *std::move(run), MillisSince(start)));
      } else if (std::find(batched.begin(), batched.end(), backend) == batched.end()) {
        batched.push_back(backend);
        std::vector<size_t> members;
        for (size_t j = i; j < plan_.configs.size(); ++j) {
          if (plan_.backends[j] == backend && !results_[j].has_value()) members.push_back(j);
        }
        TC_RETURN_IF_ERROR(RunBatch(backend, members, /*with_reference=*/false));
      }
    }
    return absl::OkStatus();
  }

  // The reference's own outcome: against itself (trivially equal), and
  // the observed output against it; its timing, details and output.
  absl::Status FinishReference() {
    if (artifacts_ != nullptr) artifacts_->reference = reference_->output.Clone();
    TC_ASSIGN_OR_RETURN(outcome_.reference,
                        Compared(plan_.reference, std::move(*reference_), reference_ms_,
                                 /*index=*/std::nullopt));
    return absl::OkStatus();
  }

  // ---- Running.

  // Runs plan configurations `members` (and first the reference when
  // `with_reference`) as one batch of `backend`.
  absl::Status RunBatch(LinearBackend* backend, const std::vector<size_t>& members,
                        bool with_reference) {
    std::vector<PreparedRun> runs;
    if (with_reference) runs.push_back(plan_.reference_run);
    for (size_t i : members) runs.push_back(plan_.runs[i]);
    absl::Status consumer_status;
    auto last = Clock::now();
    absl::Status run = backend->RunBatch(
        problem_, runs, plan_.run, [&](size_t index, RunResult result) -> absl::Status {
          const double ms = MillisSince(last);
          // A stop ends the batch here: RunBatch returns what we return.
          absl::Status s = CheckStop(plan_.run.stop);
          if (s.ok() && with_reference && index == 0) {
            s = OnReference(std::move(result), ms);
          } else if (s.ok()) {
            const size_t i = members[index - (with_reference ? 1 : 0)];
            auto o = OutcomeOf(i, std::move(result), ms);
            if (o.ok()) {
              results_[i] = *std::move(o);
            } else {
              s = o.status();
            }
          }
          consumer_status = s;
          last = Clock::now();
          return s;
        });
    if (!consumer_status.ok()) return consumer_status;
    return run;  // the backend's error names its configuration
  }

  // A GPU configuration: the backend compares on the device.
  absl::StatusOr<ConfigOutcome> RunAndCompare(ComparingBackend* comparing, size_t i) {
    const Config& config = plan_.configs[i];
    const Options opts = OptionsFor(config);
    std::vector<OutputComparison> comparisons = {{&reference_->output, true, opts.vs_reference}};
    if (req_.observed) comparisons.push_back({&*req_.observed, false, opts.vs_observed});
    const bool need_output = req_.return_outputs || artifacts_ != nullptr;
    const auto start = Clock::now();
    auto compared =
        comparing->RunAndCompare(problem_, plan_.runs[i], plan_.run, comparisons, need_output);
    const double ms = MillisSince(start);
    if (!compared.ok()) return WithConfigContext(compared.status(), config);
    if (need_output) TC_RETURN_IF_ERROR(ShapeOutput(config, compared->run.output));
    ConfigOutcome o = DescribeRun(config, compared->run, ms);
    o.vs_reference = std::move(compared->stats[0]);
    if (req_.observed) o.vs_observed = std::move(compared->stats[1]);
    Keep(i, opts, std::move(compared->run.output), &o);
    AdvanceProgress(plan_.progress);
    return o;
  }

  // ---- Comparing.

  absl::Status OnReference(RunResult run, double ms) {
    TC_RETURN_IF_ERROR(ShapeOutput(plan_.reference, run.output));
    reference_ = std::move(run);
    reference_ms_ = ms;
    TC_RETURN_IF_ERROR(PrepareErrorModel());
    AdvanceProgress(plan_.progress);
    return absl::OkStatus();
  }

  // A host-side configuration's outcome: compared here, kept for a
  // diagnosis when asked.
  absl::StatusOr<ConfigOutcome> OutcomeOf(size_t i, RunResult run, double ms) {
    const Config& config = plan_.configs[i];
    TC_RETURN_IF_ERROR(ShapeOutput(config, run.output));
    absl::StatusOr<ConfigOutcome> o = Compared(config, std::move(run), ms, i);
    if (o.ok()) AdvanceProgress(plan_.progress);
    return o;
  }

  // Compares `run` (of `config`; plan index `index`, none for the
  // reference) with the reference and the observed output; keeps what a
  // diagnosis needs.
  absl::StatusOr<ConfigOutcome> Compared(const Config& config, RunResult run, double ms,
                                         std::optional<size_t> index) {
    const Options opts = OptionsFor(config);
    ConfigOutcome o = DescribeRun(config, run, ms);
    const std::string output_class =
        share_ ? absl::StrCat(
                     run.shared_computation.empty() ? config.ToString() : run.shared_computation,
                     "|", BiasModeName(config.bias))
               : std::string();
    // The reference itself was moved into `run` by FinishReference.
    const Tensor& reference = index.has_value() ? reference_->output : run.output;
    TC_ASSIGN_OR_RETURN(o.vs_reference, CachedCompare(output_class, /*vs_observed=*/false,
                                                      run.output, reference, opts.vs_reference));
    if (req_.observed) {
      TC_ASSIGN_OR_RETURN(DiffStats s, CachedCompare(output_class, /*vs_observed=*/true,
                                                     *req_.observed, run.output, opts.vs_observed));
      o.vs_observed = std::move(s);
    }
    if (index.has_value()) {
      Keep(*index, opts, std::move(run.output), &o);
    } else if (req_.return_outputs) {
      o.output = std::move(run.output);
    }
    return o;
  }

  // Compare, or the statistics of an earlier comparison that is known to
  // give the same ones.
  absl::StatusOr<DiffStats> CachedCompare(const std::string& output_class, bool vs_observed,
                                          const Tensor& actual, const Tensor& expected,
                                          const CompareOptions& options) {
    if (output_class.empty()) return Compare(actual, expected, options);
    const bool bound_used = options.tolerance.preset == TolerancePreset::kBound;
    const StatsKey key{output_class, vs_observed, options.predicted_sigma,
                       bound_used ? options.error_bound : nullptr};
    auto it = stats_.find(key);
    if (it != stats_.end()) return it->second;
    TC_ASSIGN_OR_RETURN(DiffStats s, Compare(actual, expected, options));
    stats_.emplace(key, s);
    return s;
  }

  // Stores the output and error-model arrays of plan configuration `i`
  // for a diagnosis, and the output in `o` when it was asked for.
  void Keep(size_t i, const Options& opts, Tensor output, ConfigOutcome* o) {
    if (artifacts_ == nullptr) {
      if (req_.return_outputs) o->output = std::move(output);
      return;
    }
    if (req_.observed) {
      const Config& config = plan_.configs[i];
      const bool unfused = config.bias == BiasMode::kUnfused;
      artifacts_->pair_sigma[i] = opts.pair.values;
      artifacts_->pair_accumulation_sigma[i] =
          Model(ModelKey::kPairAccumulation, config.precision, unfused).values;
      artifacts_->sigma_vs_reference[i] = opts.sigma.values;
      artifacts_->flip_grid[i] = FlipGridFor(unfused);
    }
    if (req_.return_outputs) o->output = output.Clone();
    artifacts_->outputs[i] = std::move(output);
  }

  // ---- The error model.

  // Inputs shared by every array: per element sum_k |x||w|,
  // sqrt(sum_k (xw)^2), x.w (when an unfused bias or a diagnosis needs
  // it) and the reference value; then the observed output against the
  // reference.
  absl::Status PrepareErrorModel() {
    if (bound_used_) abs_dot_.resize(static_cast<size_t>(count_));
    sq_dot_.resize(static_cast<size_t>(count_));
    bool need_dot = artifacts_ != nullptr && req_.observed.has_value();
    for (const Config& c : plan_.configs) {
      need_dot = need_dot || (c.bias == BiasMode::kUnfused && req_.bias.has_value());
    }
    // The observed output's bound allows its bias to have been added after
    // a rounding of x.w (whichever way the producer added it).
    need_dot = need_dot || (bound_used_ && req_.observed && req_.bias);
    if (need_dot) dot_.resize(static_cast<size_t>(count_));
    MagnitudeOperands operands{problem_.shape(), problem_.input, problem_.weight, plan_.run.stop};
    operands.input_scale = problem_.input_scale;
    operands.weight_scale = problem_.weight_scale;
    TC_RETURN_IF_ERROR(ComputeMagnitudeSums(
        operands, MagnitudeSums{bound_used_ ? abs_dot_.data() : nullptr, sq_dot_.data(),
                                need_dot ? dot_.data() : nullptr}));
    ref_values_.resize(static_cast<size_t>(count_));
    ToDouble(reference_->output, ref_values_.data());
    if (req_.observed) {
      const ModelArray sigma = Model(ModelKey::kSigma, plan_.observed_bound_precision, false);
      const ModelArray bound = bound_used_ ? Model(ModelKey::kBound, plan_.observed_bound_precision,
                                                   /*unfused=*/req_.bias.has_value())
                                           : ModelArray{};
      CompareOptions opts = plan_.compare;
      opts.predicted_sigma = sigma.data();
      opts.predicted_sigma_sum_sq = sigma.sum_sq;
      opts.error_bound = bound.data();
      TC_ASSIGN_OR_RETURN(DiffStats s, Compare(*req_.observed, reference_->output, opts));
      outcome_.observed_vs_reference = std::move(s);
    }
    return absl::OkStatus();
  }

  // An error-model array of precision `p`: computed once per request and
  // key when sharing (equal keys give equal arrays, whichever precision
  // asked), every time otherwise.
  ModelArray Model(ModelKey::Kind kind, Precision p, bool unfused) {
    const ModelKey key = keys_.Of(kind, p, unfused);
    if (share_) {
      auto it = models_.find(key);
      if (it != models_.end()) return it->second;
    }
    ErrorModelInput in;
    in.k = plan_.shape.k;
    in.output_dtype = plan_.shape.output_dtype;
    in.unfused_bias = key.unfused;
    in.abs_dot = abs_dot_.data();
    in.sq_dot = sq_dot_.data();
    in.value = ref_values_.data();
    in.count = count_;
    in.pre_bias = dot_.empty() ? nullptr : dot_.data();
    in.executor = executor_;
    in.precision = p;
    in.inputs_exact =
        key.u_input == 0 && (key.kind == ModelKey::kSigma || key.kind == ModelKey::kBound);
    in.accumulation_scale = key.accumulation_scale;
    auto values = std::make_shared<std::vector<float>>(static_cast<size_t>(count_));
    ModelArray array;
    switch (key.kind) {
      case ModelKey::kSigma:
        array.sum_sq = PredictSigma(in, values->data());
        break;
      case ModelKey::kBound:
        HardBound(in, /*c=*/1.0, values->data());  // Compare applies bound_factor
        break;
      case ModelKey::kPairSigma:
        array.sum_sq = PredictPairSigma(in, values->data());
        break;
      case ModelKey::kPairAccumulation:
        PredictPairAccumulationSigma(in, values->data());
        break;
    }
    array.values = std::move(values);
    if (share_) models_.emplace(key, array);
    return array;
  }

  // Compare options of a configuration, against the reference and for
  // the observed output against it.
  Options OptionsFor(const Config& config) {
    const bool unfused = config.bias == BiasMode::kUnfused;
    Options o;
    o.sigma = Model(ModelKey::kSigma, config.precision, unfused);
    if (bound_used_) o.bound = Model(ModelKey::kBound, config.precision, unfused);
    o.vs_reference = plan_.compare;
    o.vs_reference.predicted_sigma = o.sigma.data();
    o.vs_reference.predicted_sigma_sum_sq = o.sigma.sum_sq;
    o.vs_reference.error_bound = o.bound.data();
    if (req_.observed) {
      // Between two runs of one configuration in different summation
      // orders: only the sigma differs; the hard bound is the
      // configuration's own.
      o.pair = Model(ModelKey::kPairSigma, config.precision, unfused);
      o.vs_observed = o.vs_reference;
      o.vs_observed.predicted_sigma = o.pair.data();
      o.vs_observed.predicted_sigma_sum_sq = o.pair.sum_sq;
    }
    return o;
  }

  // The output grid where two summation orders part, for a bias mode.
  SharedFloats FlipGridFor(bool unfused) {
    const bool with_bias = req_.bias.has_value();
    unfused = unfused && with_bias;
    SharedFloats& grid = unfused ? unfused_grid_ : fused_grid_;
    if (grid) return grid;
    std::vector<double> bias;
    if (with_bias) {
      bias.resize(static_cast<size_t>(plan_.shape.n));
      ToDouble(*req_.bias, bias.data());
    }
    FlipGridInput in;
    in.output_dtype = plan_.shape.output_dtype;
    in.unfused_bias = unfused;
    in.activation = req_.activation;
    in.pre_bias = dot_.data();
    in.bias = with_bias ? bias.data() : nullptr;
    in.cols = plan_.shape.n;
    in.count = count_;
    in.executor = executor_;
    auto values = std::make_shared<std::vector<float>>(static_cast<size_t>(count_));
    FlipGrid(in, values->data());
    grid = std::move(values);
    return grid;
  }

  // ---- Small things.

  absl::Status ShapeOutput(const Config& config, Tensor& output) const {
    if (output.numel() != count_) {
      return absl::InternalError(absl::StrCat("configuration ", config.ToString(),
                                              ": backend returned ", output.numel(),
                                              " elements, expected ", count_));
    }
    return output.Reshape(plan_.output_shape);
  }

  const bool share_;
  // Only the bound preset reads the hard bound; other presets skip its
  // arrays.
  const bool bound_used_;
  Executor* const executor_;  // the per-element passes; null: inline
  const LinearRequest& req_;
  const Engine::Plan& plan_;
  Engine::Artifacts* const artifacts_;
  LinearProblem problem_;
  int64_t count_ = 0;

  VerifyOutcome outcome_;
  std::vector<std::optional<ConfigOutcome>> results_;  // plan order
  std::optional<RunResult> reference_;
  double reference_ms_ = 0;

  std::vector<float> abs_dot_, sq_dot_, dot_;
  std::vector<double> ref_values_;
  internal::ModelKeys keys_{req_.input, req_.weight};
  std::map<ModelKey, ModelArray> models_;
  std::map<StatsKey, DiffStats> stats_;
  SharedFloats fused_grid_, unfused_grid_;
};

ConfigOutcome DescribeRun(const Config& config, const RunResult& run, double ms) {
  ConfigOutcome o;
  o.config = config.ToString();
  o.elapsed_ms = ms;
  o.details = run.details;
  o.deterministic = run.deterministic;
  o.runs = run.runs;
  o.shared_computation = run.shared_computation;
  return o;
}

std::vector<std::string> Engine::Notes(const LinearRequest& req, const Plan& plan) {
  std::vector<std::string> notes;
  bool sixteen_bit_fused = false, gpu = false;
  for (LinearBackend* backend : plan.backends) {
    gpu = gpu || backend->kind() == BackendKind::kDevice;
  }
  gpu = gpu || plan.reference_backend->kind() == BackendKind::kDevice;
  for (const Config& c : plan.configs) {
    if ((c.precision == Precision::kBf16 || c.precision == Precision::kFp16) &&
        c.bias == BiasMode::kFused) {
      sixteen_bit_fused = true;
    }
  }
  if (sixteen_bit_fused) {
    notes.push_back(
        "PyTorch may add the bias at output precision (not in the fp32 "
        "epilogue) in split-K kernels with 16-bit inputs.");
  }
  if (gpu) {
    notes.push_back(
        "cuBLAS is bitwise reproducible run to run only for one stream and "
        "one architecture/SM count.");
  }
  if (req.activation == Activation::kGeluTanh) {
    notes.push_back(
        "GELU is the tanh approximation (as cuBLASLt's epilogue); the erf "
        "form differs by up to ~1e-3 relative.");
  }
  if (req.observed && req.observed->dtype() != plan.shape.output_dtype) {
    notes.push_back(absl::StrCat("observed is ", DTypeName(req.observed->dtype()),
                                 " but configurations round their outputs to ",
                                 DTypeName(plan.shape.output_dtype),
                                 "; set output_dtype to compare like with like."));
  }
  return notes;
}

absl::StatusOr<VerifyOutcome> Engine::Run(const LinearRequest& req, const Plan& plan,
                                          Artifacts* artifacts) const {
  // The reference and each configuration, counted as each is compared.
  BeginProgress(plan.progress,
                artifacts != nullptr ? "running the candidates" : "running the configurations",
                static_cast<int64_t>(plan.configs.size()) + 1);
  if (ComputeDevice* device = DeviceOf(plan)) return RunOnDevice(req, plan, artifacts, device);
  // Backends that compare where they compute keep this execution's road
  // (for now); every other request runs on the host device.
  bool comparing = plan.reference_backend->comparing() != nullptr;
  for (LinearBackend* backend : plan.backends) comparing = comparing || backend->comparing();
  if (comparing) return Execution(options_, req, plan, artifacts).Run();
  return RunOnDevice(req, plan, artifacts, host_device_.get());
}

}  // namespace tensorcheck
