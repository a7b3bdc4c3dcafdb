// The `cublaslt` and `cublas` backends: one class for both, which differ
// in the GEMM call only (cuda_backends.h says what each computes).
//
// A request runs under the device context's mutex as RunLocked's steps:
// plan the operands and the comparisons' device memory, reserve it in one
// region, upload (and round) the inputs, prepare the GEMM call, run it
// `repeat` times comparing the outputs bit for bit, enqueue the statistics
// on the device, download, and finish the statistics on the host. How a
// configuration runs (compute types, the rounding of inputs and outputs):
// internal/gemm_plan.h; the calls: internal/gemm_call.h, with
// internal/lt_matmul.cc and internal/cublas_gemm.cc.
#include "server/backends/cuda/cuda_backends.h"

#include <cuda_runtime.h>

#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/backends/comparing_backend.h"
#include "server/backends/cuda/cuda_context.h"
#include "server/backends/cuda/cuda_kernels.h"
#include "server/backends/cuda/cuda_status.h"
#include "server/backends/cuda/device_compare.h"
#include "server/backends/cuda/internal/gemm_call.h"
#include "server/backends/cuda/internal/gemm_plan.h"
#include "server/core/status_macros.h"

namespace tensorcheck {
namespace cuda {
namespace {

using internal::Details;
using internal::GemmCall;
using internal::GemmOperands;
using internal::MakePlan;
using internal::Plan;

constexpr int kMaxRepeat = 1000;
constexpr int64_t kAlign = 256;

bool MulOk(int64_t a, int64_t b, int64_t* out) { return !__builtin_mul_overflow(a, b, out); }

// count * itemsize, or -1 on overflow (which RegionPlan::Add rejects).
int64_t Bytes(int64_t count, DType d) {
  int64_t out = 0;
  return MulOk(count, static_cast<int64_t>(ItemSize(d)), &out) ? out : -1;
}

// Carves one request's device regions out of a single reservation.
class RegionPlan {
 public:
  // Returns the region's offset, or -1 after an overflow.
  int64_t Add(int64_t bytes) {
    if (overflow_ || bytes < 0) {
      overflow_ = true;
      return -1;
    }
    const int64_t offset = total_;
    int64_t padded = 0;
    if (__builtin_add_overflow(bytes, kAlign - 1, &padded) ||
        __builtin_add_overflow(total_, padded / kAlign * kAlign, &total_)) {
      overflow_ = true;
      return -1;
    }
    return offset;
  }
  bool overflow() const { return overflow_; }
  int64_t total() const { return total_; }

 private:
  int64_t total_ = 0;
  bool overflow_ = false;
};

// ---- the steps of a request (CudaLinearBackend::RunLocked)

// One request on the device: the operands, the plan, and where each array
// lives in the request's reservation (offsets into it; -1 where an array
// is not needed).
struct Request {
  const LinearProblem* problem = nullptr;
  int64_t m = 0, n = 0, k = 0;
  DType out = DType::kFloat32;
  int repeat = 1;
  // The request's stop signal, checked between launches (null: never).
  const StopSignal* stop = nullptr;
  bool lt = false;  // the cublaslt flavour
  Plan plan;
  // The bias on the device: Lt, in D's type; cublas, as stored.
  DType bias_dev_type = DType::kFloat32;
  bool bias_convert = false;
  bool d_is_out = false;  // the GEMM writes the output dtype
  int64_t out_bytes = 0;
  RegionPlan regions;
  // The offsets: the input and the weight as stored (when that is not
  // plan.ab) and in plan.ab; the bias as stored (when converted) and on the
  // device; D when it is not the output dtype; the first and the second
  // run's output; the flag that two runs differed.
  int64_t x_raw = -1, x_ab = -1, w_raw = -1, w_ab = -1, bias_raw = -1, bias_dev = -1;
  int64_t d_buf = -1, out0 = -1, out1 = -1, flag = -1;
  // Per comparison: its statistics, the other tensor's memory, theirs.
  std::vector<std::unique_ptr<DeviceCompare>> compares;
  std::vector<int64_t> other_at, compare_at;
  // Set by Reserve.
  char* base = nullptr;
  cudaStream_t stream = nullptr;

  char* at(int64_t offset) const { return offset < 0 ? nullptr : base + offset; }
};

// Plan: how the configuration runs (MakePlan), and the device memory of
// the operands and outputs, all sized before anything is allocated.
Request PlanOperands(const LinearProblem& problem, const Config& config, const RunOptions& options,
                     bool lt) {
  Request r;
  r.problem = &problem;
  r.m = problem.m;
  r.n = problem.n;
  r.k = problem.k;
  r.out = problem.output_dtype;
  r.repeat = options.repeat;
  r.stop = options.stop;
  r.lt = lt;
  const int64_t m = r.m, n = r.n, k = r.k;
  const Tensor& x = *problem.input;
  const Tensor& w = *problem.weight;
  const Tensor* bias = problem.bias;
  r.plan = MakePlan(config.precision, x.dtype(), w.dtype(), r.out, lt ? bias : nullptr);
  const Plan& plan = r.plan;
  RegionPlan& regions = r.regions;
  r.x_raw = x.dtype() == plan.ab ? -1 : regions.Add(static_cast<int64_t>(x.nbytes()));
  r.x_ab = regions.Add(Bytes(m * k, plan.ab));
  r.w_raw = w.dtype() == plan.ab ? -1 : regions.Add(static_cast<int64_t>(w.nbytes()));
  r.w_ab = regions.Add(Bytes(n * k, plan.ab));
  r.bias_dev_type = bias == nullptr ? plan.d : (lt ? plan.d : bias->dtype());
  r.bias_convert = bias != nullptr && bias->dtype() != r.bias_dev_type;
  r.bias_raw = r.bias_convert ? regions.Add(static_cast<int64_t>(bias->nbytes())) : -1;
  r.bias_dev = bias == nullptr ? -1 : regions.Add(Bytes(n, r.bias_dev_type));
  r.d_is_out = plan.d == r.out;
  r.out_bytes = Bytes(m * n, r.out);
  const int64_t d_bytes = Bytes(m * n, plan.d);
  r.d_buf = r.d_is_out ? -1 : regions.Add(d_bytes);
  r.out0 = regions.Add(r.out_bytes);
  r.out1 = r.repeat > 1 ? regions.Add(r.out_bytes) : -1;
  r.flag = regions.Add(sizeof(int));
  return r;
}

// Plan, continued: each comparison's statistics (whose host work, such as
// the sigma's sum of squares, is done here) and its device memory, the
// other tensor's and the statistics' own.
void PlanComparisons(const std::vector<OutputComparison>& comparisons, Request& r) {
  for (const OutputComparison& c : comparisons) {
    r.compares.push_back(std::make_unique<DeviceCompare>(r.m * r.n, c.options));
    r.other_at.push_back(r.regions.Add(static_cast<int64_t>(c.other->nbytes())));
    r.compare_at.push_back(r.regions.Add(r.compares.back()->bytes()));
  }
}

// Reserve: the request's device memory, one region of the context's pool.
absl::Status Reserve(CudaContext& ctx, Request& r) {
  TC_RETURN_IF_ERROR(ToStatus(cudaSetDevice(ctx.device()), "cudaSetDevice"));
  TC_ASSIGN_OR_RETURN(r.base, ctx.Reserve(r.regions.total()));
  r.stream = ctx.stream();
  return absl::OkStatus();
}

// Upload: the inputs, then rounded to the A/B type where they are stored
// otherwise (and the bias to its device type); the determinism flag
// cleared.
absl::Status UploadInputs(const Request& r) {
  const LinearProblem& problem = *r.problem;
  const Tensor& x = *problem.input;
  const Tensor& w = *problem.weight;
  const Tensor* bias = problem.bias;
  auto upload = [&](const Tensor& t, int64_t raw, int64_t dst) -> absl::Status {
    void* target = raw < 0 ? r.at(dst) : r.at(raw);
    TC_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(target, t.raw(), t.nbytes(), cudaMemcpyHostToDevice, r.stream));
    return absl::OkStatus();
  };
  TC_RETURN_IF_ERROR(upload(x, r.x_raw, r.x_ab));
  TC_RETURN_IF_ERROR(upload(w, r.w_raw, r.w_ab));
  if (r.x_raw >= 0) {
    TC_CUDA_RETURN_IF_ERROR(LaunchConvert(r.at(r.x_raw), ToElem(x.dtype()), r.at(r.x_ab),
                                          ToElem(r.plan.ab), r.m * r.k, r.stream));
  }
  if (r.w_raw >= 0) {
    TC_CUDA_RETURN_IF_ERROR(LaunchConvert(r.at(r.w_raw), ToElem(w.dtype()), r.at(r.w_ab),
                                          ToElem(r.plan.ab), r.n * r.k, r.stream));
  }
  if (bias != nullptr) {
    TC_RETURN_IF_ERROR(upload(*bias, r.bias_raw, r.bias_dev));
    if (r.bias_convert) {
      TC_CUDA_RETURN_IF_ERROR(LaunchConvert(r.at(r.bias_raw), ToElem(bias->dtype()),
                                            r.at(r.bias_dev), ToElem(r.bias_dev_type), r.n,
                                            r.stream));
    }
  }
  TC_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(r.at(r.flag), 0, sizeof(int), r.stream));
  return absl::OkStatus();
}

// The plan in the run's details: the device, the types, where values are
// rounded, the workspace.
void DescribePlan(const Request& r, absl::string_view device_name, int64_t workspace_bytes,
                  Details* details) {
  const Plan& plan = r.plan;
  const Tensor& x = *r.problem->input;
  const Tensor& w = *r.problem->weight;
  const Tensor* bias = r.problem->bias;
  Details& d = *details;
  d["device"] = std::string(device_name);
  d["compute_type"] = internal::ComputeName(plan.compute);
  d["ab_type"] = std::string(DTypeName(plan.ab));
  d["d_type"] = std::string(DTypeName(plan.d));
  d["scale_type"] = plan.scale == CUDA_R_64F   ? "float64"
                    : plan.scale == CUDA_R_16F ? "float16"
                                               : "float32";
  std::string rounding;
  if (r.x_raw >= 0) {
    absl::StrAppend(&rounding, "input ", DTypeName(x.dtype()), "->", DTypeName(plan.ab), "; ");
  }
  if (r.w_raw >= 0) {
    absl::StrAppend(&rounding, "weight ", DTypeName(w.dtype()), "->", DTypeName(plan.ab), "; ");
  }
  if (r.bias_convert) {
    absl::StrAppend(&rounding, "bias ", DTypeName(bias->dtype()), "->", DTypeName(r.bias_dev_type),
                    "; ");
  }
  d["input_rounding"] =
      rounding.empty() ? "none" : absl::StrCat(rounding, "device kernel, nearest-even");
  d["output_rounding"] = r.d_is_out ? "none (GEMM writes the output dtype)"
                                    : absl::StrCat(DTypeName(plan.d), "->", DTypeName(r.out),
                                                   " (device kernel, nearest-even)");
  d["workspace_bytes"] = absl::StrCat(workspace_bytes);
}

// Prepare: the flavour's GEMM call over the uploaded operands.
absl::StatusOr<std::unique_ptr<GemmCall>> PrepareGemm(const Request& r, CudaContext& ctx,
                                                      const RunOptions& options,
                                                      absl::string_view cfg,
                                                      absl::string_view device_name,
                                                      Details* details) {
  GemmOperands ops;
  ops.plan = r.plan;
  ops.m = r.m;
  ops.n = r.n;
  ops.k = r.k;
  ops.a_transposed = r.problem->layout == WeightLayout::kOutIn;
  ops.w = r.at(r.w_ab);
  ops.x = r.at(r.x_ab);
  ops.d = r.d_is_out ? nullptr : r.at(r.d_buf);
  ops.out = r.out;
  ops.bias = r.problem->bias == nullptr ? nullptr : r.at(r.bias_dev);
  ops.bias_type = r.bias_dev_type;
  ops.activation = r.problem->activation;
  ops.stream = r.stream;
  if (r.lt) return internal::PrepareLtMatmul(ops, ctx, options, cfg, device_name, details);
  return internal::PrepareCublasGemm(ops, ctx, options, details);
}

// Run: the layer `repeat` times; every run after the first writes a second
// output, compared bit for bit with the first (the flag says whether any
// differed). With a stop signal, each run after the first waits for the
// one before and checks it, so a cancelled request leaves at most one GEMM
// on the device rather than `repeat` of them.
absl::Status RunRepeated(const Request& r, GemmCall& gemm) {
  for (int i = 0; i < r.repeat; ++i) {
    if (i > 0 && r.stop != nullptr) {
      TC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(r.stream));
      TC_RETURN_IF_ERROR(r.stop->Check());
    }
    char* dst = i == 0 ? r.at(r.out0) : r.at(r.out1);
    TC_RETURN_IF_ERROR(gemm.Run(dst));
    if (i > 0) {
      TC_CUDA_RETURN_IF_ERROR(LaunchCompareBits(r.at(r.out0), r.at(r.out1), r.out_bytes,
                                                reinterpret_cast<int*>(r.at(r.flag)), r.stream));
    }
  }
  return absl::OkStatus();
}

// Compare: each comparison's other tensor uploaded and its statistics
// enqueued on the device, against the first run's output.
absl::Status EnqueueComparisons(const Request& r,
                                const std::vector<OutputComparison>& comparisons) {
  const DeviceArray output{r.at(r.out0), r.out, r.m * r.n};
  for (size_t c = 0; c < comparisons.size(); ++c) {
    const Tensor& other_host = *comparisons[c].other;
    TC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(r.at(r.other_at[c]), other_host.raw(),
                                            other_host.nbytes(), cudaMemcpyHostToDevice, r.stream));
    const DeviceArray other{r.at(r.other_at[c]), other_host.dtype(), other_host.numel()};
    const bool output_is_actual = comparisons[c].output_is_actual;
    TC_RETURN_IF_ERROR(r.compares[c]->Enqueue(output_is_actual ? output : other,
                                              output_is_actual ? other : output,
                                              r.at(r.compare_at[c]), r.stream));
  }
  return absl::OkStatus();
}

// The copy of the first run's output into result->output, enqueued.
absl::Status EnqueueOutputDownload(const Request& r, RunResult* result) {
  TC_ASSIGN_OR_RETURN(result->output, Tensor::Create(r.out, {r.m, r.n}));
  TC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(result->output.raw(), r.at(r.out0),
                                          static_cast<size_t>(r.out_bytes), cudaMemcpyDeviceToHost,
                                          r.stream));
  return absl::OkStatus();
}

// Download: the output when asked for and the determinism flag, once the
// stream is done.
absl::Status Download(const Request& r, bool return_output, RunResult* result) {
  if (return_output) TC_RETURN_IF_ERROR(EnqueueOutputDownload(r, result));
  int differ = 0;
  TC_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(&differ, r.at(r.flag), sizeof(differ), cudaMemcpyDeviceToHost, r.stream));
  TC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(r.stream));
  result->runs = r.repeat;
  result->deterministic = differ == 0;
  return absl::OkStatus();
}

// Finish: each comparison's statistics from what came back; a comparison
// that needs the tensors on the host gets the output downloaded too.
absl::StatusOr<std::vector<DiffStats>> FinishComparisons(
    const Request& r, const std::vector<OutputComparison>& comparisons, RunResult* result) {
  std::vector<DiffStats> stats;
  for (size_t c = 0; c < comparisons.size(); ++c) {
    const Tensor* host_output = nullptr;
    if (r.compares[c]->NeedsTensorsOnHost()) {
      // Rare: too many NaN/Inf pairs for bound_ratio's device path.
      if (result->output.numel() != r.m * r.n) {
        TC_RETURN_IF_ERROR(EnqueueOutputDownload(r, result));
        TC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(r.stream));
      }
      host_output = &result->output;
    }
    const bool output_is_actual = comparisons[c].output_is_actual;
    TC_ASSIGN_OR_RETURN(
        DiffStats s, r.compares[c]->Finish(output_is_actual ? host_output : comparisons[c].other,
                                           output_is_actual ? comparisons[c].other : host_output));
    stats.push_back(std::move(s));
  }
  return stats;
}

enum class Flavor { kLt, kGemmEx };

// Shared by both backends: the probe and the context.
struct CudaDevice {
  DeviceProbe probe;
  absl::Status init;  // OK, or why the context could not be created
  std::unique_ptr<CudaContext> ctx;
  bool tf32_disabled = false;  // NVIDIA_TF32_OVERRIDE=0 in the environment
};

class CudaLinearBackend final : public LinearBackend, public ComparingBackend {
 public:
  CudaLinearBackend(Flavor flavor, std::shared_ptr<CudaDevice> device)
      : flavor_(flavor), device_(std::move(device)) {}

  absl::string_view name() const override { return flavor_ == Flavor::kLt ? "cublaslt" : "cublas"; }

  BackendKind kind() const override { return BackendKind::kDevice; }

  absl::Status Available() const override {
    if (!device_->init.ok()) {
      return absl::FailedPreconditionError(device_->init.message());
    }
    const absl::Status sticky = device_->ctx->health();
    if (!sticky.ok()) return absl::FailedPreconditionError(sticky.message());
    return absl::OkStatus();
  }

  std::vector<Precision> precisions() const override {
    std::vector<Precision> out = {Precision::kFp64, Precision::kFp32};
    // With NVIDIA_TF32_OVERRIDE=0 cuBLAS computes FAST_TF32 in plain fp32.
    if (!device_->tf32_disabled) out.push_back(Precision::kTf32);
    out.insert(out.end(), {Precision::kBf16, Precision::kFp16, Precision::kFp16Acc});
    return out;
  }

  std::vector<BiasMode> bias_modes() const override {
    return {BiasMode::kNone, flavor_ == Flavor::kLt ? BiasMode::kFused : BiasMode::kUnfused};
  }

  BiasMode default_bias_mode() const override {
    return flavor_ == Flavor::kLt ? BiasMode::kFused : BiasMode::kUnfused;
  }

  std::vector<DType> storage_dtypes() const override {
    return {DType::kFloat64, DType::kFloat32, DType::kFloat16, DType::kBFloat16};
  }

  DeviceDescription device() const override { return device_->probe.description; }

  ComparingBackend* comparing() override { return this; }

  absl::StatusOr<RunResult> Run(const LinearProblem& problem, const Config& config,
                                const RunOptions& options) override;

  absl::StatusOr<ComparedRun> RunAndCompare(const LinearProblem& problem, const Config& config,
                                            const RunOptions& options,
                                            const std::vector<OutputComparison>& comparisons,
                                            bool return_output) override;

 private:
  absl::Status CheckRequest(const LinearProblem& problem, const Config& config,
                            const RunOptions& options) const;
  // One request, with ctx's mutex held, as its steps: plan, reserve,
  // upload, prepare the GEMM, run, compare, download, finish.
  absl::StatusOr<ComparedRun> RunLocked(const LinearProblem& problem, const Config& config,
                                        const RunOptions& options,
                                        const std::vector<OutputComparison>& comparisons,
                                        bool return_output, CudaContext& ctx);

  Flavor flavor_;
  std::shared_ptr<CudaDevice> device_;
};

absl::Status CudaLinearBackend::CheckRequest(const LinearProblem& problem, const Config& config,
                                             const RunOptions& options) const {
  const std::string cfg = config.ToString();
  if (flavor_ == Flavor::kGemmEx && config.bias == BiasMode::kFused) {
    return absl::FailedPreconditionError(
        absl::StrCat("configuration ", cfg,
                     ": the cublas backend adds the bias in its own kernel after the GEMM "
                     "(bias mode unfused); use cublaslt:",
                     PrecisionName(config.precision), ":fused for the bias in the epilogue"));
  }
  if (flavor_ == Flavor::kLt && config.bias == BiasMode::kUnfused) {
    return absl::FailedPreconditionError(
        absl::StrCat("configuration ", cfg,
                     ": the cublaslt backend adds the bias in the matmul epilogue (bias "
                     "mode fused); use cublas:",
                     PrecisionName(config.precision), ":unfused for a separate bias add"));
  }
  if (problem.input == nullptr || problem.weight == nullptr) {
    return absl::InvalidArgumentError("linear problem without input or weight");
  }
  TC_RETURN_IF_ERROR(Supports(config, problem.input->dtype()));
  TC_RETURN_IF_ERROR(Supports(config, problem.weight->dtype()));
  if (config.bias == BiasMode::kNone && problem.bias != nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("configuration ", cfg, ": bias mode none, but the layer has a bias"));
  }
  if (options.repeat < 1 || options.repeat > kMaxRepeat) {
    return absl::InvalidArgumentError(
        absl::StrCat("repeat: expected 1..", kMaxRepeat, ", got ", options.repeat));
  }
  return absl::OkStatus();
}

absl::StatusOr<RunResult> CudaLinearBackend::Run(const LinearProblem& problem, const Config& config,
                                                 const RunOptions& options) {
  TC_ASSIGN_OR_RETURN(ComparedRun r, RunAndCompare(problem, config, options, {},
                                                   /*return_output=*/true));
  return std::move(r.run);
}

absl::StatusOr<ComparedRun> CudaLinearBackend::RunAndCompare(
    const LinearProblem& problem, const Config& config, const RunOptions& options,
    const std::vector<OutputComparison>& comparisons, bool return_output) {
  TC_RETURN_IF_ERROR(CheckRequest(problem, config, options));
  // Shapes: the engine validated them; these checks keep every copy below
  // in bounds regardless.
  const std::string cfg = config.ToString();
  const int64_t m = problem.m, n = problem.n, k = problem.k;
  if (m <= 0 || n <= 0 || k <= 0 || m > INT_MAX || n > INT_MAX || k > INT_MAX) {
    return absl::FailedPreconditionError(
        absl::StrCat("configuration ", cfg, ": the GPU backends need 1 <= m, n, k <= ", INT_MAX,
                     ", got m=", m, " n=", n, " k=", k));
  }
  int64_t mk = 0, nk = 0, mn = 0;
  if (!MulOk(m, k, &mk) || !MulOk(n, k, &nk) || !MulOk(m, n, &mn)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("configuration ", cfg, ": m*k, n*k or m*n overflows"));
  }
  if (problem.input->numel() != mk || problem.weight->numel() != nk ||
      (problem.bias != nullptr && problem.bias->numel() != n)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "configuration ", cfg, ": tensor sizes do not match m=", m, " n=", n, " k=", k));
  }
  for (const OutputComparison& c : comparisons) {
    if (c.other == nullptr) {
      return absl::InvalidArgumentError("comparison without a tensor");
    }
    TC_RETURN_IF_ERROR(ValidateCompare(mn, c.other->numel(), c.options));
  }
  if (!device_->init.ok()) {
    return absl::FailedPreconditionError(device_->init.message());
  }
  CudaContext& ctx = *device_->ctx;
  std::lock_guard<std::mutex> lock(ctx.mutex());
  if (!ctx.health().ok()) return ctx.health();
  absl::StatusOr<ComparedRun> result =
      RunLocked(problem, config, options, comparisons, return_output, ctx);
  if (!result.ok()) {
    // Surface a fault of work already queued, and remember a sticky one.
    const absl::Status sync =
        ctx.Note(ToStatus(cudaStreamSynchronize(ctx.stream()), "cudaStreamSynchronize"));
    if (IsStickyCudaError(sync)) return sync;
    return ctx.Note(result.status());
  }
  return result;
}

absl::StatusOr<ComparedRun> CudaLinearBackend::RunLocked(
    const LinearProblem& problem, const Config& config, const RunOptions& options,
    const std::vector<OutputComparison>& comparisons, bool return_output, CudaContext& ctx) {
  const std::string cfg = config.ToString();
  const std::string& device_name = device_->probe.description.name;
  // Where a request's time goes, reported in the details as
  // "host_prepare_ms" (the comparisons' host work before the device),
  // "device_ms" (uploads, runs, statistics, until the stream is done) and
  // "host_finish_ms" (the statistics back and finished).
  using Clock = std::chrono::steady_clock;

  Request r = PlanOperands(problem, config, options, /*lt=*/flavor_ == Flavor::kLt);
  const auto t_prepare = Clock::now();
  PlanComparisons(comparisons, r);
  if (r.regions.overflow()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("configuration ", cfg, ": device memory size overflows"));
  }
  TC_RETURN_IF_ERROR(CheckStop(options.stop));
  TC_RETURN_IF_ERROR(Reserve(ctx, r));
  const auto t_device = Clock::now();
  TC_RETURN_IF_ERROR(UploadInputs(r));
  RunResult result;
  DescribePlan(r, device_name, ctx.workspace_bytes(), &result.details);
  TC_ASSIGN_OR_RETURN(std::unique_ptr<GemmCall> gemm,
                      PrepareGemm(r, ctx, options, cfg, device_name, &result.details));
  TC_RETURN_IF_ERROR(RunRepeated(r, *gemm));
  TC_RETURN_IF_ERROR(CheckStop(options.stop));
  TC_RETURN_IF_ERROR(EnqueueComparisons(r, comparisons));
  TC_RETURN_IF_ERROR(Download(r, return_output, &result));
  const auto t_finish = Clock::now();
  ComparedRun compared;
  TC_ASSIGN_OR_RETURN(compared.stats, FinishComparisons(r, comparisons, &result));

  if (!return_output) result.output = Tensor();
  Details& details = result.details;
  if (!comparisons.empty()) details["statistics"] = "device";
  auto ms = [](Clock::time_point a, Clock::time_point b) {
    return absl::StrFormat("%.3f", std::chrono::duration<double, std::milli>(b - a).count());
  };
  details["host_prepare_ms"] = ms(t_prepare, t_device);
  details["device_ms"] = ms(t_device, t_finish);
  details["host_finish_ms"] = ms(t_finish, Clock::now());
  compared.run = std::move(result);
  return compared;
}

}  // namespace
}  // namespace cuda

absl::Status RegisterCudaBackends(BackendRegistry* registry, const BuiltinBackendOptions& options) {
  auto device = std::make_shared<cuda::CudaDevice>();
  device->probe = cuda::ProbeDevice();
  const char* tf32_env = std::getenv("NVIDIA_TF32_OVERRIDE");
  device->tf32_disabled = tf32_env != nullptr && std::strcmp(tf32_env, "0") == 0;
  if (device->probe.available.ok()) {
    cuda::CudaContext::Options ctx_options;
    ctx_options.memory_budget_bytes = options.gpu_memory_budget_bytes;
    ctx_options.workspace_bytes = options.cublaslt_workspace_bytes;
    auto ctx = cuda::CudaContext::Create(ctx_options, device->probe);
    if (ctx.ok()) {
      device->ctx = std::move(ctx).value();
    } else {
      device->init = absl::FailedPreconditionError(
          absl::StrCat("CUDA device '", device->probe.description.name,
                       "' could not be initialised: ", ctx.status().message()));
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
