#include "server/backends/linear_backend.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"

namespace tensorcheck {

absl::StatusOr<DequantizedOperands> DequantizeOperands(const LinearProblem& p, DType dtype) {
  const bool out_in = p.layout == WeightLayout::kOutIn;
  DequantizedOperands out;
  TC_ASSIGN_OR_RETURN(out.input, DequantizeBlocks(*p.input, *p.input_scale, p.m, p.k,
                                                  p.scale_blocks.input(), dtype));
  TC_ASSIGN_OR_RETURN(out.weight,
                      DequantizeBlocks(*p.weight, *p.weight_scale, out_in ? p.n : p.k,
                                       out_in ? p.k : p.n, p.scale_blocks.weight(out_in), dtype));
  return out;
}

absl::Status LinearBackend::Supports(const Config& config, DType storage) const {
  const auto p = precisions();
  if (std::find(p.begin(), p.end(), config.precision) == p.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("configuration ", config.ToString(), ": backend '", name(),
                     "' does not run precision ", PrecisionName(config.precision), " on this host",
                     IsMultiPass(config.precision)
                         ? " (the multi-pass precisions run on the cpu backend only, for now)"
                         : ""));
  }
  const auto b = bias_modes();
  if (std::find(b.begin(), b.end(), config.bias) == b.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("configuration ", config.ToString(), ": backend '", name(),
                     "' does not support bias mode ", BiasModeName(config.bias)));
  }
  const auto s = storage_dtypes();
  if (std::find(s.begin(), s.end(), storage) == s.end()) {
    return absl::FailedPreconditionError(absl::StrCat("configuration ", config.ToString(),
                                                      ": backend '", name(), "' does not accept ",
                                                      DTypeName(storage), " inputs"));
  }
  if (config.mma.has_value() && !replays_kernels()) {
    return absl::FailedPreconditionError(
        absl::StrCat("configuration ", config.ToString(), ": backend '", name(),
                     "' runs its own kernels; mma= names a replay on the cpu backend"));
  }
  if (config.mma.has_value() && IsFp8(config.precision) &&
      config.scaling == Fp8Scaling::kBlock128) {
    return absl::FailedPreconditionError(
        absl::StrCat("configuration ", config.ToString(),
                     ": a kernel replay (mma=) of block-wise FP8 is not modelled; per tensor or "
                     "row scaling"));
  }
  if (config.algo.value_or(0) != 0 && !selects_algorithms()) {
    return absl::FailedPreconditionError(
        absl::StrCat("configuration ", config.ToString(), ": backend '", name(),
                     "' runs one algorithm per configuration; algo=0 is the only one"));
  }
  return absl::OkStatus();
}

PreparedRun::PreparedRun()
    : status_(absl::FailedPreconditionError("configuration not prepared for this layer")) {}

PreparedRun::PreparedRun(Config config, const LayerShape& shape, absl::Status status,
                         std::shared_ptr<const State> state)
    : config_(std::move(config)),
      shape_(shape),
      status_(std::move(status)),
      state_(std::move(state)) {}

PreparedRun LinearBackend::Prepare(const LinearProblem& layer, const Config& config) const {
  absl::Status status = absl::OkStatus();
  if (layer.input == nullptr || layer.weight == nullptr) {
    status = absl::InvalidArgumentError("linear problem without input or weight");
  }
  if (status.ok()) status = Supports(config, layer.input->dtype());
  if (status.ok() && layer.weight->dtype() != layer.input->dtype()) {
    status = Supports(config, layer.weight->dtype());
  }
  if (status.ok()) status = SupportsProblem(layer, config);
  return PreparedRun(config, layer.shape(), std::move(status));
}

absl::StatusOr<std::vector<AlgorithmInfo>> LinearBackend::Algorithms(
    const LinearProblem& /*problem*/, const PreparedRun& prepared, const RunOptions& /*options*/,
    int limit) {
  TC_RETURN_IF_ERROR(prepared.status());
  if (limit < 1) return std::vector<AlgorithmInfo>{};
  return std::vector<AlgorithmInfo>{AlgorithmInfo{0, {{"algo", std::string(name())}}}};
}

absl::StatusOr<std::vector<AlgorithmInfo>> LinearBackend::Algorithms(const LinearProblem& problem,
                                                                     const Config& config,
                                                                     const RunOptions& options,
                                                                     int limit) {
  return Algorithms(problem, Prepare(problem, config), options, limit);
}

absl::StatusOr<RunResult> LinearBackend::Run(const LinearProblem& problem,
                                             const PreparedRun& prepared,
                                             const RunOptions& options) {
  TC_RETURN_IF_ERROR(prepared.status());
  return Run(problem, prepared.config(), options);
}

absl::Status WithConfigContext(const absl::Status& status, const Config& config) {
  return WithContext(status, absl::StrCat("configuration ", config.ToString()));
}

absl::Status LinearBackend::RunBatch(const LinearProblem& problem,
                                     const std::vector<PreparedRun>& runs,
                                     const RunOptions& options, const BatchConsumer& consume) {
  for (size_t i = 0; i < runs.size(); ++i) {
    absl::StatusOr<RunResult> result = Run(problem, runs[i], options);
    if (!result.ok()) {
      return WithConfigContext(result.status(), runs[i].config());
    }
    absl::Status consumed = consume(i, *std::move(result));
    if (!consumed.ok()) return consumed;
  }
  return absl::OkStatus();
}

absl::Status LinearBackend::RunBatch(const LinearProblem& problem,
                                     const std::vector<Config>& configs, const RunOptions& options,
                                     const BatchConsumer& consume) {
  std::vector<PreparedRun> runs;
  runs.reserve(configs.size());
  for (const Config& config : configs) {
    runs.push_back(Prepare(problem, config));
    if (!runs.back().ok()) return runs.back().status();
  }
  return RunBatch(problem, runs, options, consume);
}

absl::Status BackendRegistry::Register(std::unique_ptr<LinearBackend> backend) {
  if (Find(backend->name()).ok()) {
    return absl::AlreadyExistsError(
        absl::StrCat("backend '", backend->name(), "' is already registered"));
  }
  backends_.push_back(std::move(backend));
  return absl::OkStatus();
}

absl::StatusOr<LinearBackend*> BackendRegistry::Find(absl::string_view name) const {
  for (const auto& b : backends_) {
    if (b->name() == name) return b.get();
  }
  std::vector<std::string> names;
  for (const auto& b : backends_) names.emplace_back(b->name());
  return absl::NotFoundError(
      absl::StrCat("unknown backend '", name, "': this server has ", absl::StrJoin(names, ", ")));
}

std::vector<LinearBackend*> BackendRegistry::backends() const {
  std::vector<LinearBackend*> out;
  for (const auto& b : backends_) out.push_back(b.get());
  return out;
}

}  // namespace tensorcheck
