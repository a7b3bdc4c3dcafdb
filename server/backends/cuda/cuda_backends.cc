// The `cublaslt` and `cublas` backends: one class for both, which differ
// in the GEMM call only (cuda_backends.h says what each computes). Both
// run on the device's sessions (cuda_device.h): a request the engine runs
// whole on the device opens one session for everything; Run, for a
// configuration of a request the host runs (one that mixes backends, or a
// batch-invariance run), opens one for the configuration alone and brings
// its output back.
#include "server/backends/cuda/cuda_backends.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "core/status_macros.h"
#include "server/backends/cuda/cuda_device.h"
#include "server/backends/cuda/internal/block_scale_layout.h"
#include "server/backends/cuda/internal/block_scale_rules.h"
#include "server/backends/cuda/internal/cuda_session.h"
#include "server/backends/cuda/internal/fp8_rules.h"
#include "server/backends/cuda/internal/gemm_plan.h"
#include "server/backends/cuda/internal/multi_pass_rules.h"
#include "server/backends/cuda/internal/splitk_rules.h"

namespace tensorcheck {
namespace cuda {
namespace {

enum class Flavor { kLt, kGemmEx };

// Shared by both backends: the probe and the device.
struct CudaDevice {
  DeviceProbe probe;
  absl::Status init;  // OK, or why the device could not be set up
  std::unique_ptr<CudaComputeDevice> compute;
  bool tf32_disabled = false;  // NVIDIA_TF32_OVERRIDE=0 in the environment
};

// The fp8 precisions cuBLASLt multiplies (not fp8e5m2: no E5M2 x E5M2
// GEMM; internal/fp8_rules.h).
constexpr Precision kLtFp8Precisions[] = {Precision::kFp8E4M3, Precision::kFp8E4M3E5M2,
                                          Precision::kFp8E5M2E4M3};

// An FP8 operand's dequantisation scales as the run takes them: float32,
// 1 element per tensor, `rows` row-wise (one element is then spread over
// the rows, into `spread`, as the CPU backend applies it).
// INVALID_ARGUMENT naming the field otherwise.
absl::StatusOr<const Tensor*> ScalesFor(const Tensor* scale, const char* name, int64_t rows,
                                        Fp8Scaling scaling, std::optional<Tensor>* spread) {
  if (scale == nullptr || scale->dtype() != DType::kFloat32 ||
      (scale->numel() != 1 && scale->numel() != rows)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": float32 with 1 or ", rows, " elements expected"));
  }
  if (scaling == Fp8Scaling::kTensor && scale->numel() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": scaling=tensor takes 1 element, got ", scale->numel()));
  }
  if (scaling == Fp8Scaling::kRow && scale->numel() != rows) {
    TC_ASSIGN_OR_RETURN(Tensor t, Tensor::Create(DType::kFloat32, {rows}));
    std::fill(t.data<float>(), t.data<float>() + rows, scale->data<float>()[0]);
    *spread = std::move(t);
    return &**spread;
  }
  return scale;
}

class CudaLinearBackend final : public LinearBackend {
 public:
  CudaLinearBackend(Flavor flavor, std::shared_ptr<CudaDevice> device)
      : flavor_(flavor), device_(std::move(device)) {}

  absl::string_view name() const override { return flavor_ == Flavor::kLt ? "cublaslt" : "cublas"; }

  BackendKind kind() const override { return BackendKind::kDevice; }

  absl::Status Available() const override {
    if (!device_->init.ok()) {
      return absl::FailedPreconditionError(device_->init.message());
    }
    const absl::Status sticky = device_->compute->health();
    if (!sticky.ok()) return absl::FailedPreconditionError(sticky.message());
    return absl::OkStatus();
  }

  std::vector<Precision> precisions() const override {
    std::vector<Precision> out = {Precision::kFp64, Precision::kFp32};
    // With NVIDIA_TF32_OVERRIDE=0 cuBLAS computes FAST_TF32 in plain fp32.
    if (!device_->tf32_disabled) out.push_back(Precision::kTf32);
    // Emulated on the device (internal/session_run.cc): TF32 inputs
    // rounded by a kernel, then a strict-fp32 GEMM.
    out.insert(out.end(), {Precision::kTf32Rna, Precision::kTf32Trunc, Precision::kBf16,
                           Precision::kFp16, Precision::kFp16Acc});
    if (RunsFp8()) out.insert(out.end(), std::begin(kLtFp8Precisions), std::end(kLtFp8Precisions));
    // The multi-pass precisions (internal/multi_pass_rules.h): cuBLASLt
    // runs XLA's partial GEMMs on any device; cuBLAS its own BF16x9 where
    // the device has it (or, without one, would).
    for (Precision p : kMultiPassPrecisions) {
      if (internal::CheckMultiPass(MultiPassQueryOf(p)).ok()) out.push_back(p);
    }
    // The block-scaled precisions (internal/block_scale_rules.h): only on a
    // device whose compute capability has cuBLASLt's kernels for them.
    for (Precision p : kBlockScaledPrecisions) {
      if (RunsBlockScaled(p)) out.push_back(p);
    }
    return out;
  }

  std::vector<BiasMode> bias_modes() const override {
    return {BiasMode::kNone, flavor_ == Flavor::kLt ? BiasMode::kFused : BiasMode::kUnfused};
  }

  BiasMode default_bias_mode() const override {
    return flavor_ == Flavor::kLt ? BiasMode::kFused : BiasMode::kUnfused;
  }

  std::vector<DType> storage_dtypes() const override {
    std::vector<DType> out(std::begin(kWideDTypes), std::end(kWideDTypes));
    if (RunsFp8()) out.insert(out.end(), std::begin(kFp8DTypes), std::end(kFp8DTypes));
    if (RunsBlockScaled(Precision::kNvFp4)) out.push_back(DType::kFloat4E2M1Fn);
    return out;
  }

  // Without a layer (a host's list of configurations; Prepare asks the
  // same rules with the layer, once). The FP8 rules (internal/fp8_rules.h)
  // first, for their reasons: the cublas backend and E5M2 x E5M2 are
  // refused naming the rule, not as a precision missing from the list. So
  // are the split-K rules' (internal/splitk_rules.h): cublaslt runs every
  // split of bf16 and fp16 that cuBLASLt's algorithms take, which only a
  // layer tells (Prepare), and cublas none.
  absl::Status Supports(const Config& config, DType storage) const override {
    if (internal::InvolvesNarrow(config, storage, std::nullopt)) {
      internal::Fp8Query q;
      q.config = config;
      q.input = storage;
      q.device = Capability();
      TC_RETURN_IF_ERROR(internal::CheckNarrowGemm(q).status());
    }
    TC_RETURN_IF_ERROR(CheckMultiPassRules(config));
    internal::SplitKQuery split;
    split.config = config;
    TC_RETURN_IF_ERROR(internal::CheckSplitK(split).status());
    return LinearBackend::Supports(config, storage);
  }

  // Every rule once, for the layer: the FP8 rules (internal/fp8_rules.h;
  // first, for their reasons, as Supports; with the layer: alignment of k
  // and n, the bias type for the output, row-wise scales' device support),
  // the multi-pass and split-K rules (with the layer: reduce=output needs D
  // to be the output), the backend's lists for the input's and the
  // weight's dtypes, then, for cuBLASLt on a device, whether its heuristic
  // has a kernel for this layer at all (for a split-K configuration, one
  // that takes the split): the library's own answer, not a prediction. The FP8
  // GEMM the rules decided is kept in the PreparedRun for the run.
  PreparedRun Prepare(const LinearProblem& problem, const Config& config) const override {
    auto state = std::make_shared<internal::CudaPrepared>();
    absl::Status status = AskRules(problem, config, state.get());
    return PreparedRun(config, problem.shape(), std::move(status), std::move(state));
  }

  absl::Status SupportsProblem(const LinearProblem& problem, const Config& config) const override {
    return Prepare(problem, config).status();
  }

  // cuBLASLt: its heuristic's list; cuBLAS: cublasGemmAlgo_t's values
  // (internal/gemm_call.h).
  bool selects_algorithms() const override { return true; }

  using LinearBackend::Algorithms;
  absl::StatusOr<std::vector<AlgorithmInfo>> Algorithms(const LinearProblem& problem,
                                                        const PreparedRun& prepared,
                                                        const RunOptions& options,
                                                        int limit) override;

  DeviceDescription device() const override { return device_->probe.description; }

  ComputeDevice* compute_device() override {
    return device_->init.ok() ? device_->compute.get() : nullptr;
  }

  absl::StatusOr<RunResult> Run(const LinearProblem& problem, const Config& config,
                                const RunOptions& options) override {
    return Run(problem, Prepare(problem, config), options);
  }

  // On a session of its own: the operands uploaded, the run, the output
  // downloaded.
  absl::StatusOr<RunResult> Run(const LinearProblem& problem, const PreparedRun& prepared,
                                const RunOptions& options) override;

 private:
  // cuBLASLt's FP8 GEMM, on this device (or, without one, on one that
  // would have it).
  bool RunsFp8() const {
    if (flavor_ != Flavor::kLt) return false;
    const std::optional<internal::ComputeCapability> cc = Capability();
    return !cc.has_value() || cc->major > 8 || (cc->major == 8 && cc->minor >= 9);
  }

  // cuBLASLt's kernels for block-scaled precision `p` on this device (never
  // without one: internal/block_scale_rules.h).
  bool RunsBlockScaled(Precision p) const {
    if (flavor_ != Flavor::kLt) return false;
    internal::Fp8Query q;
    q.config.backend = std::string(name());
    q.config.precision = p;
    q.config.bias = default_bias_mode();
    q.input = DType::kFloat32;
    q.device = Capability();
    return internal::CheckNarrowGemm(q).ok();
  }

  // The multi-pass rules for `config` on this device, when its precision is
  // a multi-pass one (first, for their reasons: cublas:bf16x3 is refused
  // naming cublaslt, not as a precision missing from the list).
  absl::Status CheckMultiPassRules(const Config& config) const {
    if (!IsMultiPass(config.precision) || config.backend != name()) return absl::OkStatus();
    internal::MultiPassQuery q;
    q.config = config;
    q.device = Capability();
    return internal::CheckMultiPass(q).status();
  }

  // The split-K rules for `config` on `layer` (without the request's
  // options: the run asks disallow_reduced_precision_reduction's rule).
  absl::Status CheckSplitKRules(const Config& config, const internal::LayerTypes& layer) const {
    if (config.splitk == 0) return absl::OkStatus();
    internal::SplitKQuery q;
    q.config = config;
    if (TakesSplitK(config.precision)) {
      const internal::Plan plan =
          internal::MakePlan(config.precision, layer.input, layer.weight, layer.output_dtype,
                             flavor_ == Flavor::kLt ? layer.bias : std::optional<DType>());
      q.layer = internal::SplitKLayer{plan.d, layer.output_dtype};
    }
    return internal::CheckSplitK(q).status();
  }

  // The multi-pass rules' question for precision `p` on this backend and
  // device.
  internal::MultiPassQuery MultiPassQueryOf(Precision p) const {
    internal::MultiPassQuery q;
    q.config.backend = std::string(name());
    q.config.precision = p;
    q.config.bias = default_bias_mode();
    q.device = Capability();
    return q;
  }

  // The device's compute capability; nullopt without a device.
  std::optional<internal::ComputeCapability> Capability() const {
    if (!device_->init.ok()) return std::nullopt;
    return internal::ComputeCapability{device_->probe.cc_major, device_->probe.cc_minor};
  }

  // Prepare's rules, in order; `state` receives the FP8 GEMM.
  absl::Status AskRules(const LinearProblem& problem, const Config& config,
                        internal::CudaPrepared* state) const {
    if (problem.input == nullptr || problem.weight == nullptr) {
      return absl::InvalidArgumentError("linear problem without input or weight");
    }
    if (config.backend != name()) {
      return absl::InvalidArgumentError(
          absl::StrCat("configuration ", config.ToString(), " given to the ", name(), " backend"));
    }
    const internal::LayerTypes layer = internal::LayerOf(problem);
    if (internal::InvolvesNarrowGemm(config, layer)) {
      TC_ASSIGN_OR_RETURN(
          state->fp8, internal::CheckNarrowGemm(internal::Fp8QueryOf(config, layer, Capability())));
    }
    TC_RETURN_IF_ERROR(CheckMultiPassRules(config));
    TC_RETURN_IF_ERROR(CheckSplitKRules(config, layer));
    TC_RETURN_IF_ERROR(LinearBackend::Supports(config, layer.input));
    if (layer.weight != layer.input) {
      TC_RETURN_IF_ERROR(LinearBackend::Supports(config, layer.weight));
    }
    return HasKernel(layer, config, state->fp8);
  }

  // What Run and Algorithms check before the device: that `prepared` is
  // OK, this backend's, and for `problem`'s layer. Its state.
  absl::StatusOr<const internal::CudaPrepared*> CheckRequest(const LinearProblem& problem,
                                                             const PreparedRun& prepared) const {
    TC_RETURN_IF_ERROR(prepared.status());
    const Config& config = prepared.config();
    const internal::CudaPrepared* state = prepared.state<internal::CudaPrepared>();
    if (config.backend != name() || state == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("configuration ", config.ToString(),
                                                     " not prepared by the ", name(), " backend"));
    }
    if (problem.input == nullptr || problem.weight == nullptr) {
      return absl::InvalidArgumentError("linear problem without input or weight");
    }
    if (prepared.shape() != problem.shape()) {
      return absl::InvalidArgumentError(absl::StrCat("configuration ", config.ToString(),
                                                     ": prepared for another layer than this one"));
    }
    return state;
  }

  // OK unless cuBLASLt's heuristic answers "no algorithm" for `config` on
  // `layer` (FAILED_PRECONDITION with its message). Asked on a lane that
  // is free now; with every lane busy, or on any other error, the run
  // decides instead. Answers are kept per configuration and layer shape.
  absl::Status HasKernel(const internal::LayerTypes& layer, const Config& config,
                         const std::optional<internal::Fp8Gemm>& fp8) const {
    if (flavor_ != Flavor::kLt || !device_->init.ok()) return absl::OkStatus();
    Config any = config;
    any.algo.reset();
    const std::string key = absl::StrCat(
        any.ToString(), "|", layer.m, "x", layer.k, "x", layer.n, "|", DTypeName(layer.input), "|",
        DTypeName(layer.weight), "|", layer.bias.has_value() ? DTypeName(*layer.bias) : "-", "|",
        DTypeName(layer.output_dtype), "|", static_cast<int>(layer.layout), "|",
        static_cast<int>(layer.activation));
    {
      std::lock_guard<std::mutex> lock(kernels_mu_);
      if (auto it = kernels_.find(key); it != kernels_.end()) return it->second;
    }
    const StopSignal now(absl::Now());  // a lane free now, or none
    absl::StatusOr<std::unique_ptr<CudaSession>> session = device_->compute->OpenCudaSession(&now);
    if (!session.ok()) return absl::OkStatus();
    absl::StatusOr<std::vector<AlgorithmInfo>> listed =
        internal::AlgorithmsOnSession(**session, layer, any, fp8, RunOptions{}, 1);
    absl::Status answer = absl::OkStatus();
    if (!listed.ok()) {
      (void)(*session)->Checked(listed.status());
      if (!IsNoKernel(listed.status())) return absl::OkStatus();
      answer = listed.status();  // FAILED_PRECONDITION, with the NoKernel mark
    }
    std::lock_guard<std::mutex> lock(kernels_mu_);
    if (kernels_.size() >= kMaxKernelAnswers) kernels_.clear();
    kernels_.emplace(key, answer);
    return answer;
  }

  static constexpr size_t kMaxKernelAnswers = 4096;

  Flavor flavor_;
  std::shared_ptr<CudaDevice> device_;
  mutable std::mutex kernels_mu_;
  mutable std::map<std::string, absl::Status> kernels_;
};

absl::StatusOr<std::vector<AlgorithmInfo>> CudaLinearBackend::Algorithms(
    const LinearProblem& problem, const PreparedRun& prepared, const RunOptions& options,
    int limit) {
  TC_ASSIGN_OR_RETURN(const internal::CudaPrepared* state, CheckRequest(problem, prepared));
  const Config& config = prepared.config();
  if (problem.input->numel() != problem.m * problem.k ||
      problem.weight->numel() != problem.n * problem.k ||
      (problem.bias != nullptr && problem.bias->numel() != problem.n)) {
    return absl::InvalidArgumentError(absl::StrCat("configuration ", config.ToString(),
                                                   ": tensor sizes do not match m=", problem.m,
                                                   " n=", problem.n, " k=", problem.k));
  }
  if (!device_->init.ok()) return absl::FailedPreconditionError(device_->init.message());
  const internal::LayerTypes layer = internal::LayerOf(problem);
  // A session for its lane's cuBLASLt handle and workspace; nothing is
  // uploaded.
  TC_ASSIGN_OR_RETURN(std::unique_ptr<CudaSession> session,
                      device_->compute->OpenCudaSession(options.stop));
  auto algorithms =
      internal::AlgorithmsOnSession(*session, layer, config, state->fp8, options, limit);
  if (!algorithms.ok()) return session->Checked(algorithms.status());
  return algorithms;
}

absl::StatusOr<RunResult> CudaLinearBackend::Run(const LinearProblem& problem,
                                                 const PreparedRun& prepared,
                                                 const RunOptions& options) {
  TC_ASSIGN_OR_RETURN(const internal::CudaPrepared* state, CheckRequest(problem, prepared));
  const Config& config = prepared.config();
  int64_t mn = 0;
  if (problem.m < 0 || problem.n < 0 || __builtin_mul_overflow(problem.m, problem.n, &mn)) {
    return absl::InvalidArgumentError(
        absl::StrCat("configuration ", config.ToString(), ": m*n overflows or is negative"));
  }
  // FP8 operands' scales (wide operands under an fp8 configuration are
  // quantised on the session, with their own): the caller's error,
  // answered before the device.
  const bool fp8_operands = IsNarrow(problem.input->dtype()) || IsNarrow(problem.weight->dtype());
  const std::optional<internal::Fp8ScaleMode> mode =
      state->fp8 ? std::optional<internal::Fp8ScaleMode>(state->fp8->scale_mode) : std::nullopt;
  const bool block_scales = mode == internal::Fp8ScaleMode::kBlock128 ||
                            mode == internal::Fp8ScaleMode::kMxVec32 ||
                            mode == internal::Fp8ScaleMode::kNvVec16;
  std::optional<Tensor> x_spread, w_spread;
  const Tensor* x_scale = nullptr;
  const Tensor* w_scale = nullptr;
  if (fp8_operands && block_scales) {
    // The request's plain block scales in cuBLASLt's layout
    // (internal/block_scale_layout.h).
    if (problem.input_scale == nullptr || problem.weight_scale == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "configuration ", config.ToString(), ": block-scaled operands without their scales"));
    }
    TC_ASSIGN_OR_RETURN(x_spread, internal::LtBlockScales(*problem.input_scale, *mode,
                                                          /*weight=*/false, problem.shape()));
    TC_ASSIGN_OR_RETURN(w_spread, internal::LtBlockScales(*problem.weight_scale, *mode,
                                                          /*weight=*/true, problem.shape()));
    x_scale = &*x_spread;
    w_scale = &*w_spread;
  } else if (fp8_operands) {
    TC_ASSIGN_OR_RETURN(x_scale, ScalesFor(problem.input_scale, "input_scale", problem.m,
                                           config.scaling, &x_spread));
    TC_ASSIGN_OR_RETURN(w_scale, ScalesFor(problem.weight_scale, "weight_scale", problem.n,
                                           config.scaling, &w_spread));
  }
  if (!device_->init.ok()) return absl::FailedPreconditionError(device_->init.message());

  // Where a run's time goes, in the details: "host_prepare_ms" (a lane),
  // "device_ms" (uploads and the run) and "host_finish_ms" (the output
  // back).
  using Clock = std::chrono::steady_clock;
  auto ms = [](Clock::time_point a, Clock::time_point b) {
    return absl::StrFormat("%.3f", std::chrono::duration<double, std::milli>(b - a).count());
  };
  const auto t_prepare = Clock::now();
  TC_ASSIGN_OR_RETURN(std::unique_ptr<CudaSession> session,
                      device_->compute->OpenCudaSession(options.stop));
  const auto t_device = Clock::now();
  SessionOperands op;
  TC_ASSIGN_OR_RETURN(op.input, session->Upload(*problem.input));
  TC_ASSIGN_OR_RETURN(op.weight, session->Upload(*problem.weight));
  if (problem.bias != nullptr) {
    TC_ASSIGN_OR_RETURN(op.bias, session->Upload(*problem.bias));
  }
  SessionScales scales;
  if (fp8_operands) {
    TC_ASSIGN_OR_RETURN(scales.input, session->Upload(*x_scale));
    TC_ASSIGN_OR_RETURN(scales.weight, session->Upload(*w_scale));
  }
  if (fp8_operands && problem.input_global_scale != nullptr &&
      problem.weight_global_scale != nullptr) {
    TC_ASSIGN_OR_RETURN(op.input_global_scale, session->Upload(*problem.input_global_scale));
    TC_ASSIGN_OR_RETURN(op.weight_global_scale, session->Upload(*problem.weight_global_scale));
  }
  op.shape() = problem.shape();
  TC_ASSIGN_OR_RETURN(SessionRun run, session->RunWithScales(op, scales, prepared, options));
  const auto t_finish = Clock::now();
  TC_ASSIGN_OR_RETURN(run.run.output, session->Download(run.output));
  TC_RETURN_IF_ERROR(run.run.output.Reshape({problem.m, problem.n}));
  RunResult result = std::move(run.run);
  std::map<std::string, std::string>& details = result.details;
  details.erase("statistics");
  details["host_prepare_ms"] = ms(t_prepare, t_device);
  details["device_ms"] = ms(t_device, t_finish);
  details["host_finish_ms"] = ms(t_finish, Clock::now());
  return result;
}

}  // namespace
}  // namespace cuda

absl::Status RegisterCudaBackends(BackendRegistry* registry, const BuiltinBackendOptions& options) {
  auto device = std::make_shared<cuda::CudaDevice>();
  device->probe = cuda::ProbeDevice();
  const char* tf32_env = std::getenv("NVIDIA_TF32_OVERRIDE");
  device->tf32_disabled = tf32_env != nullptr && std::strcmp(tf32_env, "0") == 0;
  if (device->probe.available.ok()) {
    cuda::CudaComputeDevice::Options device_options;
    device_options.memory_budget_bytes = options.gpu_memory_budget_bytes;
    device_options.workspace_bytes = options.cublaslt_workspace_bytes;
    device_options.lanes = options.gpu_lanes;
    device_options.tf32_disabled = device->tf32_disabled;
    auto compute = cuda::CudaComputeDevice::Create(device_options, device->probe);
    if (compute.ok()) {
      device->compute = std::move(compute).value();
    } else {
      device->init = absl::FailedPreconditionError(
          absl::StrCat("CUDA device '", device->probe.description.name,
                       "' could not be initialised: ", compute.status().message()));
    }
  } else {
    device->init = device->probe.available;
  }
  TC_RETURN_IF_ERROR(
      registry->Register(std::make_unique<cuda::CudaLinearBackend>(cuda::Flavor::kLt, device)));
  TC_RETURN_IF_ERROR(
      registry->Register(std::make_unique<cuda::CudaLinearBackend>(cuda::Flavor::kGemmEx, device)));
  return absl::OkStatus();
}

}  // namespace tensorcheck
