// A configuration's run and the magnitude sums on a CudaSession
// (internal/cuda_session.h). How a configuration runs (compute types, the
// rounding of inputs and outputs): gemm_plan.h; the calls: gemm_call.h.
//
// tf32rna and tf32trunc, which no cuBLAS compute type offers, run as an
// emulation with the CPU backend's semantics: the inputs rounded to TF32
// on the device (ties away, or truncated), then a strict-fp32 GEMM
// (CUBLAS_COMPUTE_32F_PEDANTIC): products of TF32 values are exact in
// fp32, so only the summation order differs from the CPU emulation.
#include <climits>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/backends/cuda/cuda_kernels.h"
#include "server/backends/cuda/cuda_status.h"
#include "server/backends/cuda/error_model_kernels.h"
#include "server/backends/cuda/internal/compare_args.h"
#include "server/backends/cuda/internal/cuda_session.h"
#include "server/backends/cuda/internal/gemm_call.h"
#include "server/backends/cuda/internal/gemm_plan.h"
#include "server/core/float_formats.h"
#include "server/core/status_macros.h"

namespace tensorcheck::cuda::internal {
namespace {

constexpr int kMaxRepeat = 1000;

// The TF32 rounding a precision emulates on the device, if any.
std::optional<Tf32Rounding> EmulatedTf32(Precision p) {
  if (p == Precision::kTf32Rna) return Tf32Rounding::kTiesAway;
  if (p == Precision::kTf32Trunc) return Tf32Rounding::kTruncate;
  return std::nullopt;
}

absl::Status CheckConfig(const Config& config, bool lt, bool has_bias, const RunOptions& options,
                         bool tf32_disabled) {
  const std::string cfg = config.ToString();
  if (!lt && config.bias == BiasMode::kFused) {
    return absl::FailedPreconditionError(
        absl::StrCat("configuration ", cfg,
                     ": the cublas backend adds the bias in its own kernel after the GEMM "
                     "(bias mode unfused); use cublaslt:",
                     PrecisionName(config.precision), ":fused for the bias in the epilogue"));
  }
  if (lt && config.bias == BiasMode::kUnfused) {
    return absl::FailedPreconditionError(
        absl::StrCat("configuration ", cfg,
                     ": the cublaslt backend adds the bias in the matmul epilogue (bias "
                     "mode fused); use cublas:",
                     PrecisionName(config.precision), ":unfused for a separate bias add"));
  }
  if (config.bias == BiasMode::kNone && has_bias) {
    return absl::FailedPreconditionError(
        absl::StrCat("configuration ", cfg, ": bias mode none, but the layer has a bias"));
  }
  if (config.precision == Precision::kTf32 && tf32_disabled) {
    return absl::FailedPreconditionError(absl::StrCat(
        "configuration ", cfg, ": NVIDIA_TF32_OVERRIDE=0 makes cuBLAS compute TF32 in plain fp32"));
  }
  if (options.repeat < 1 || options.repeat > kMaxRepeat) {
    return absl::InvalidArgumentError(
        absl::StrCat("repeat: expected 1..", kMaxRepeat, ", got ", options.repeat));
  }
  return absl::OkStatus();
}

// `source` (of `from`) as `to`, rounded to TF32 by `tf32` when given: the
// session's form of it, or `source` itself when nothing changes.
absl::StatusOr<ArrayRef> Operand(CudaSession& s, ArrayRef source, DType to,
                                 std::optional<Tf32Rounding> tf32) {
  TC_ASSIGN_OR_RETURN(const CudaSession::Array* src, s.Get(source, "operand"));
  const DType from = src->dtype;
  if (from == to && !tf32) return source;
  const void* data = src->data;
  const int64_t count = src->count;
  cudaStream_t stream = s.stream();
  std::string form(DTypeName(to));
  if (tf32) absl::StrAppend(&form, *tf32 == Tf32Rounding::kTiesAway ? "|tf32rna" : "|tf32trunc");
  return s.Form(source, form, to, [=](void* dst) -> absl::Status {
    const void* in = data;
    if (from != to) {
      TC_CUDA_RETURN_IF_ERROR(LaunchConvert(data, ToElem(from), dst, ToElem(to), count, stream));
      in = dst;
    }
    if (tf32) {
      TC_CUDA_RETURN_IF_ERROR(LaunchRoundTf32(static_cast<const float*>(in),
                                              static_cast<float*>(dst), count,
                                              static_cast<int>(*tf32), stream));
    }
    return absl::OkStatus();
  });
}

// The plan in the run's details: the device, the types, where values are
// rounded, the workspace.
void DescribePlan(const Plan& plan, const Config& config, DType x, DType w,
                  const CudaSession::Array* bias, DType bias_to, DType out, CudaSession& s,
                  Details* details) {
  Details& d = *details;
  d["device"] = s.device().probe().description.name;
  d["compute_type"] = ComputeName(plan.compute);
  d["ab_type"] = std::string(DTypeName(plan.ab));
  d["d_type"] = std::string(DTypeName(plan.d));
  d["scale_type"] = plan.scale == CUDA_R_64F   ? "float64"
                    : plan.scale == CUDA_R_16F ? "float16"
                                               : "float32";
  std::string rounding;
  if (x != plan.ab)
    absl::StrAppend(&rounding, "input ", DTypeName(x), "->", DTypeName(plan.ab), "; ");
  if (w != plan.ab) {
    absl::StrAppend(&rounding, "weight ", DTypeName(w), "->", DTypeName(plan.ab), "; ");
  }
  if (bias != nullptr && bias->dtype != bias_to) {
    absl::StrAppend(&rounding, "bias ", DTypeName(bias->dtype), "->", DTypeName(bias_to), "; ");
  }
  d["input_rounding"] =
      rounding.empty() ? "none" : absl::StrCat(rounding, "device kernel, nearest-even");
  if (std::optional<Tf32Rounding> tf32 = EmulatedTf32(config.precision)) {
    if (plan.ab == DType::kFloat32) {
      d["input_rounding"] = absl::StrCat(
          rounding, "x and W rounded to TF32 (",
          *tf32 == Tf32Rounding::kTiesAway ? "ties away" : "truncated", ") by a device kernel");
    }
    d["emulation"] =
        "TF32 inputs rounded on the device, then a strict-fp32 GEMM (CUBLAS_COMPUTE_32F_PEDANTIC)";
  }
  d["output_rounding"] = plan.d == out ? "none (GEMM writes the output dtype)"
                                       : absl::StrCat(DTypeName(plan.d), "->", DTypeName(out),
                                                      " (device kernel, nearest-even)");
  d["workspace_bytes"] = absl::StrCat(s.ctx().workspace_bytes());
  d["statistics"] = "device";
}

}  // namespace

absl::StatusOr<SessionRun> RunOnSession(CudaSession& s, const SessionOperands& op,
                                        const Config& config, const RunOptions& options) {
  const bool lt = config.backend == "cublaslt";
  if (!lt && config.backend != "cublas") {
    return absl::FailedPreconditionError(
        absl::StrCat("configuration ", config.ToString(), ": backend '", config.backend,
                     "' does not run on the CUDA device (cublaslt and cublas do)"));
  }
  TC_ASSIGN_OR_RETURN(const CudaSession::Array* x, s.Get(op.input, "op.input"));
  TC_ASSIGN_OR_RETURN(const CudaSession::Array* w, s.Get(op.weight, "op.weight"));
  const CudaSession::Array* bias = nullptr;
  if (op.bias.valid()) {
    TC_ASSIGN_OR_RETURN(bias, s.Get(op.bias, "op.bias"));
  }
  TC_RETURN_IF_ERROR(CheckConfig(config, lt, bias != nullptr, options, s.device().tf32_disabled()));
  const int64_t m = op.m, n = op.n, k = op.k;
  if (m <= 0 || n <= 0 || k <= 0 || m > INT_MAX || n > INT_MAX || k > INT_MAX) {
    return absl::FailedPreconditionError(absl::StrCat(
        "configuration ", config.ToString(), ": the GPU backends need 1 <= m, n, k <= ", INT_MAX,
        ", got m=", m, " n=", n, " k=", k));
  }
  if (x->count != m * k || w->count != n * k || (bias != nullptr && bias->count != n)) {
    return absl::InvalidArgumentError(absl::StrCat("configuration ", config.ToString(),
                                                   ": tensor sizes do not match m=", m, " n=", n,
                                                   " k=", k));
  }
  const DType x_type = x->dtype, w_type = w->dtype, out = op.output_dtype;

  // tf32rna/tf32trunc: fp32's plan (strict fp32 when the inputs are wider
  // than 16 bits), with the inputs rounded to TF32 first. 16-bit inputs
  // are exact in TF32, and fp32's plan then rounds nothing either.
  const std::optional<Tf32Rounding> tf32 = EmulatedTf32(config.precision);
  const Precision planned = tf32 ? Precision::kFp32 : config.precision;
  const Plan plan =
      MakePlan(planned, x_type, w_type, out, lt && bias != nullptr ? bias->host : nullptr);
  const std::optional<Tf32Rounding> round =
      tf32 && plan.ab == DType::kFloat32 ? tf32 : std::nullopt;

  TC_ASSIGN_OR_RETURN(ArrayRef x_ab, Operand(s, op.input, plan.ab, round));
  TC_ASSIGN_OR_RETURN(ArrayRef w_ab, Operand(s, op.weight, plan.ab, round));
  // The bias on the device: Lt, in D's type; cublas, as stored.
  const DType bias_dev_type = bias == nullptr ? plan.d : (lt ? plan.d : bias->dtype);
  ArrayRef bias_dev;
  if (bias != nullptr) {
    TC_ASSIGN_OR_RETURN(bias_dev, Operand(s, op.bias, bias_dev_type, std::nullopt));
  }
  const bool d_is_out = plan.d == out;
  ArrayRef d_buf, out1, flag;
  if (!d_is_out) {
    TC_ASSIGN_OR_RETURN(d_buf, s.Allocate(plan.d, m * n));
  }
  TC_ASSIGN_OR_RETURN(ArrayRef out0, s.Allocate(out, m * n));
  if (options.repeat > 1) {
    TC_ASSIGN_OR_RETURN(out1, s.Allocate(out, m * n));
  }
  TC_ASSIGN_OR_RETURN(flag, s.Allocate(DType::kFloat32, 1));  // an int's worth
  TC_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(s.data(flag), 0, sizeof(int), s.stream()));

  SessionRun result;
  DescribePlan(plan, config, x_type, w_type, bias, bias_dev_type, out, s, &result.run.details);
  GemmOperands ops;
  ops.plan = plan;
  ops.m = m;
  ops.n = n;
  ops.k = k;
  ops.a_transposed = op.layout == WeightLayout::kOutIn;
  ops.w = s.data(w_ab);
  ops.x = s.data(x_ab);
  ops.d = d_is_out ? nullptr : s.data(d_buf);
  ops.out = out;
  ops.bias = bias == nullptr ? nullptr : s.data(bias_dev);
  ops.bias_type = bias_dev_type;
  ops.activation = op.activation;
  ops.stream = s.stream();
  const std::string cfg = config.ToString();
  const std::string& device_name = s.device().probe().description.name;
  std::unique_ptr<GemmCall> gemm;
  if (lt) {
    TC_ASSIGN_OR_RETURN(
        gemm, PrepareLtMatmul(ops, s.ctx(), options, cfg, device_name, &result.run.details));
  } else {
    TC_ASSIGN_OR_RETURN(gemm, PrepareCublasGemm(ops, s.ctx(), options, &result.run.details));
  }
  // `repeat` runs; every run after the first writes a second output,
  // compared bit for bit with the first. With a stop signal, each run
  // after the first waits for the one before and checks it, so a
  // cancelled request leaves at most one GEMM on the device.
  for (int i = 0; i < options.repeat; ++i) {
    if (i > 0 && s.stop() != nullptr) {
      TC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s.stream()));
      TC_RETURN_IF_ERROR(s.stop()->Check());
    }
    TC_RETURN_IF_ERROR(gemm->Run(static_cast<char*>(s.data(i == 0 ? out0 : out1))));
    if (i > 0) {
      TC_CUDA_RETURN_IF_ERROR(LaunchCompareBits(s.data(out0), s.data(out1),
                                                m * n * static_cast<int64_t>(ItemSize(out)),
                                                static_cast<int*>(s.data(flag)), s.stream()));
    }
  }
  int differ = 0;
  if (options.repeat > 1) {
    TC_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(&differ, s.data(flag), sizeof(differ), cudaMemcpyDeviceToHost, s.stream()));
    TC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s.stream()));
    s.Free(out1);
  }
  if (!d_is_out) s.Free(d_buf);
  s.Free(flag);
  result.run.runs = options.repeat;
  result.run.deterministic = differ == 0;
  result.output = out0;
  return result;
}

absl::StatusOr<SessionMagnitudes> MagnitudeSumsOnSession(CudaSession& s, const SessionOperands& op,
                                                         bool abs_dot, bool sq_dot, bool dot) {
  const int64_t m = op.m, n = op.n, k = op.k;
  if (m <= 0 || n <= 0 || k <= 0 || m > INT_MAX || n > INT_MAX || k > INT_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("magnitude sums: need 1 <= m, n, k <= ", INT_MAX));
  }
  TC_ASSIGN_OR_RETURN(const CudaSession::Array* x, s.Get(op.input, "op.input"));
  TC_ASSIGN_OR_RETURN(const CudaSession::Array* w, s.Get(op.weight, "op.weight"));
  if (x->count != m * k || w->count != n * k) {
    return absl::InvalidArgumentError(
        absl::StrCat("magnitude sums: operands do not match m=", m, ", n=", n, ", k=", k));
  }
  cudaStream_t stream = s.stream();
  // One fp32 form of an operand: the value, its magnitude or its square
  // (stats/magnitude_sums.cc's x, |x| and x^2).
  enum Power { kRaw, kAbs, kSq };
  auto form = [&](ArrayRef source, const CudaSession::Array* a,
                  Power power) -> absl::StatusOr<ArrayRef> {
    const void* data = a->data;
    const DType type = a->dtype;
    const int64_t count = a->count;
    const char* name = power == kRaw ? "mag_raw" : power == kAbs ? "mag_abs" : "mag_sq";
    return s.Form(source, name, DType::kFloat32, [=](void* dst) -> absl::Status {
      float* f = static_cast<float*>(dst);
      TC_CUDA_RETURN_IF_ERROR(
          LaunchMagnitudeOperands(data, ToElem(type), count, power == kRaw ? f : nullptr,
                                  power == kAbs ? f : nullptr, power == kSq ? f : nullptr, stream));
      return absl::OkStatus();
    });
  };
  // C [m, n] row-major = X [m, k] . W^T, as gemm_call.h's row-major trick:
  // C^T = W X^T column-major.
  const float one = 1.0f, zero = 0.0f;
  const bool out_in = op.layout == WeightLayout::kOutIn;
  auto gemm = [&](Power power) -> absl::StatusOr<ArrayRef> {
    TC_ASSIGN_OR_RETURN(ArrayRef xf, form(op.input, x, power));
    TC_ASSIGN_OR_RETURN(ArrayRef wf, form(op.weight, w, power));
    TC_ASSIGN_OR_RETURN(ArrayRef c, s.Allocate(DType::kFloat32, m * n));
    TC_CUDA_RETURN_IF_ERROR(
        cublasGemmEx(s.ctx().cublas(), out_in ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N,
                     static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &one,
                     s.data(wf), CUDA_R_32F, static_cast<int>(out_in ? k : n), s.data(xf),
                     CUDA_R_32F, static_cast<int>(k), &zero, s.data(c), CUDA_R_32F,
                     static_cast<int>(n), CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT));
    return c;
  };
  SessionMagnitudes out;
  if (dot) {
    TC_ASSIGN_OR_RETURN(out.dot, gemm(kRaw));
  }
  if (abs_dot) {
    TC_ASSIGN_OR_RETURN(out.abs_dot, gemm(kAbs));
  }
  if (sq_dot) {
    TC_ASSIGN_OR_RETURN(out.sq_dot, gemm(kSq));
    TC_CUDA_RETURN_IF_ERROR(
        LaunchSqrtInPlace(static_cast<float*>(s.data(out.sq_dot)), m * n, stream));
  }
  return out;
}

}  // namespace tensorcheck::cuda::internal
