// The `cublaslt` and `cublas` backends.
//
// Row-major trick: y[m, n] row-major is y^T[n, m] column-major, and
// y^T = W x^T. So cuBLAS sees A = W (OUT_IN [n, k] row-major is a k x n
// column-major matrix, transposed; IN_OUT [k, n] row-major is n x k
// column-major, not transposed), B = x^T (k x m column-major, ld k), and
// D = y^T (n x m column-major, ld n). The bias is then a vector over D's
// rows, which is what the cuBLASLt BIAS epilogue adds.
//
// Compute types actually used (docs/numerics.md). D is what the GEMM
// (and the Lt epilogue) writes:
//
//   precision  A/B on device        compute             scale  D
//   fp64       fp64                 64F                 fp64   fp64
//   fp32       fp32 (fp32/fp64      32F_PEDANTIC        fp32   fp32
//              storage)
//              fp16/bf16 (x and W   32F                 fp32   out dtype if
//              stored so)                                      it is A/B's
//                                                              type, else fp32
//   tf32       fp32                 32F_FAST_TF32       fp32   fp32
//   bf16       bf16                 32F                 fp32   bf16 if out is
//                                                              bf16, else fp32
//   fp16       fp16                 32F                 fp32   fp16 if out is
//                                                              fp16, else fp32
//   fp16acc    fp16                 16F                 fp16   fp16
//
// Inputs whose storage differs from the A/B type are converted on the
// device by one kernel each, rounding once to nearest even (fp64 -> fp32,
// fp32/fp64 -> bf16/fp16, bf16 -> fp16). We round explicitly rather than
// use CUBLAS_COMPUTE_32F_FAST_16BF/_16F because those "allow" a
// down-conversion (to bf16/fp16 *or TF32*, per cublas_api.h) whose rounding
// is not specified; the explicit kernel is what `x.to(torch.bfloat16)` does
// and what the CPU emulation assumes. TF32 is different: the hardware reads
// fp32 and decides the rounding, which is the thing we want to observe, so
// tf32/tf32rna/tf32trunc all map to FAST_TF32 and only `tf32` is listed.
//
// Output dtype: where cuBLAS(Lt) can write problem.output_dtype directly
// (the column above), it does; otherwise the GEMM (with the Lt epilogue)
// writes D and one kernel rounds D to the output dtype. For an fp32 D this
// is the same single rounding of the same fp32 value the epilogue would
// have rounded, so the result is identical; writing the 16-bit type
// directly is still preferred because it keeps cuBLAS's own choices
// (e.g. split-K reduction in the output type) visible, as in PyTorch.
// For the Lt epilogue the bias has D's type (cublasLt.h); D is widened to
// fp32 when the bias would not convert to D's type exactly. With fp16acc
// the epilogue runs in fp16 and the bias is rounded to fp16.
#include "server/backends/cuda/cuda_backends.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/backends/comparing_backend.h"
#include "server/backends/cuda/cuda_context.h"
#include "server/backends/cuda/cuda_kernels.h"
#include "server/backends/cuda/device_compare.h"
#include "server/backends/cuda/cuda_status.h"
#include "server/core/status_macros.h"

namespace tensorcheck {
namespace cuda {
namespace {

constexpr int kMaxRepeat = 1000;
constexpr int64_t kAlign = 256;

// ---- RAII for cuBLASLt descriptors.

struct MatmulDescDestroy {
  void operator()(cublasLtMatmulDesc_t d) const {
    cublasLtMatmulDescDestroy(d);
  }
};
struct LayoutDestroy {
  void operator()(cublasLtMatrixLayout_t l) const {
    cublasLtMatrixLayoutDestroy(l);
  }
};
struct PreferenceDestroy {
  void operator()(cublasLtMatmulPreference_t p) const {
    cublasLtMatmulPreferenceDestroy(p);
  }
};
using MatmulDescPtr =
    std::unique_ptr<std::remove_pointer_t<cublasLtMatmulDesc_t>,
                    MatmulDescDestroy>;
using LayoutPtr = std::unique_ptr<std::remove_pointer_t<cublasLtMatrixLayout_t>,
                                  LayoutDestroy>;
using PreferencePtr =
    std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>,
                    PreferenceDestroy>;

// ---- types (ToElem: device_compare.h)

cudaDataType_t ToCudaType(DType d) {
  switch (d) {
    case DType::kFloat64:
      return CUDA_R_64F;
    case DType::kFloat32:
      return CUDA_R_32F;
    case DType::kFloat16:
      return CUDA_R_16F;
    case DType::kBFloat16:
      return CUDA_R_16BF;
  }
  return CUDA_R_32F;
}

bool Is16Bit(DType d) { return d == DType::kFloat16 || d == DType::kBFloat16; }

// Whether every value of `from` is a value of `to`.
bool ConvertsExactly(DType from, DType to) {
  if (from == to || to == DType::kFloat64) return true;
  return to == DType::kFloat32 && Is16Bit(from);
}

const char* ComputeName(cublasComputeType_t c) {
  switch (c) {
    case CUBLAS_COMPUTE_64F:
      return "CUBLAS_COMPUTE_64F";
    case CUBLAS_COMPUTE_32F:
      return "CUBLAS_COMPUTE_32F";
    case CUBLAS_COMPUTE_32F_PEDANTIC:
      return "CUBLAS_COMPUTE_32F_PEDANTIC";
    case CUBLAS_COMPUTE_32F_FAST_TF32:
      return "CUBLAS_COMPUTE_32F_FAST_TF32";
    case CUBLAS_COMPUTE_16F:
      return "CUBLAS_COMPUTE_16F";
    default:
      return "CUBLAS_COMPUTE_?";
  }
}

const char* EpilogueName(cublasLtEpilogue_t e) {
  switch (e) {
    case CUBLASLT_EPILOGUE_DEFAULT:
      return "DEFAULT";
    case CUBLASLT_EPILOGUE_BIAS:
      return "BIAS";
    case CUBLASLT_EPILOGUE_RELU_BIAS:
      return "RELU_BIAS";
    case CUBLASLT_EPILOGUE_GELU_BIAS:
      return "GELU_BIAS";
    case CUBLASLT_EPILOGUE_RELU:
      return "RELU";
    case CUBLASLT_EPILOGUE_GELU:
      return "GELU";
    default:
      return "?";
  }
}

// How one configuration runs on the device.
struct Plan {
  DType ab = DType::kFloat32;  // A and B on the device
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cudaDataType_t scale = CUDA_R_32F;
  DType d = DType::kFloat32;  // what the GEMM (and Lt epilogue) writes
};

// `epilogue_bias`: the bias (or nullptr) the Lt epilogue will add.
Plan MakePlan(Precision p, DType x, DType w, DType out,
              const Tensor* epilogue_bias) {
  Plan plan;
  // D may be the 16-bit A/B type when the output is that type and the
  // epilogue's bias (which then has D's type) converts exactly.
  auto d_for_16bit = [&](DType ab) {
    const bool bias_ok =
        epilogue_bias == nullptr || ConvertsExactly(epilogue_bias->dtype(), ab);
    return (out == ab && bias_ok) ? ab : DType::kFloat32;
  };
  switch (p) {
    case Precision::kFp64:
      plan = {DType::kFloat64, CUBLAS_COMPUTE_64F, CUDA_R_64F, DType::kFloat64};
      break;
    case Precision::kFp32:
      if (x == w && Is16Bit(x)) {
        plan = {x, CUBLAS_COMPUTE_32F, CUDA_R_32F, d_for_16bit(x)};
      } else {
        plan = {DType::kFloat32, CUBLAS_COMPUTE_32F_PEDANTIC, CUDA_R_32F,
                DType::kFloat32};
      }
      break;
    case Precision::kTf32:
    case Precision::kTf32Rna:
    case Precision::kTf32Trunc:
      plan = {DType::kFloat32, CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F,
              DType::kFloat32};
      break;
    case Precision::kBf16:
      plan = {DType::kBFloat16, CUBLAS_COMPUTE_32F, CUDA_R_32F,
              d_for_16bit(DType::kBFloat16)};
      break;
    case Precision::kFp16:
      plan = {DType::kFloat16, CUBLAS_COMPUTE_32F, CUDA_R_32F,
              d_for_16bit(DType::kFloat16)};
      break;
    case Precision::kFp16Acc:
      plan = {DType::kFloat16, CUBLAS_COMPUTE_16F, CUDA_R_16F, DType::kFloat16};
      break;
  }
  return plan;
}

// alpha = 1, beta = 0 in the scale type.
struct Scalars {
  double d1 = 1.0, d0 = 0.0;
  float f1 = 1.0f, f0 = 0.0f;
  uint16_t h1 = 0x3c00, h0 = 0x0000;  // fp16 1.0 and 0.0
  const void* one(cudaDataType_t t) const {
    return t == CUDA_R_64F   ? static_cast<const void*>(&d1)
           : t == CUDA_R_16F ? static_cast<const void*>(&h1)
                             : static_cast<const void*>(&f1);
  }
  const void* zero(cudaDataType_t t) const {
    return t == CUDA_R_64F   ? static_cast<const void*>(&d0)
           : t == CUDA_R_16F ? static_cast<const void*>(&h0)
                             : static_cast<const void*>(&f0);
  }
};

bool MulOk(int64_t a, int64_t b, int64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}

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

  absl::string_view name() const override {
    return flavor_ == Flavor::kLt ? "cublaslt" : "cublas";
  }

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
    out.insert(out.end(),
               {Precision::kBf16, Precision::kFp16, Precision::kFp16Acc});
    return out;
  }

  std::vector<BiasMode> bias_modes() const override {
    return {BiasMode::kNone,
            flavor_ == Flavor::kLt ? BiasMode::kFused : BiasMode::kUnfused};
  }

  BiasMode default_bias_mode() const override {
    return flavor_ == Flavor::kLt ? BiasMode::kFused : BiasMode::kUnfused;
  }

  std::vector<DType> storage_dtypes() const override {
    return {DType::kFloat64, DType::kFloat32, DType::kFloat16,
            DType::kBFloat16};
  }

  DeviceDescription device() const override {
    return device_->probe.description;
  }

  ComparingBackend* comparing() override { return this; }

  absl::StatusOr<RunResult> Run(const LinearProblem& problem,
                                const Config& config,
                                const RunOptions& options) override;

  absl::StatusOr<ComparedRun> RunAndCompare(
      const LinearProblem& problem, const Config& config,
      const RunOptions& options,
      const std::vector<OutputComparison>& comparisons,
      bool return_output) override;

 private:
  absl::Status CheckRequest(const LinearProblem& problem, const Config& config,
                            const RunOptions& options) const;
  absl::StatusOr<ComparedRun> RunLocked(
      const LinearProblem& problem, const Config& config,
      const RunOptions& options,
      const std::vector<OutputComparison>& comparisons, bool return_output,
      CudaContext& ctx);

  Flavor flavor_;
  std::shared_ptr<CudaDevice> device_;
};

absl::Status CudaLinearBackend::CheckRequest(const LinearProblem& problem,
                                             const Config& config,
                                             const RunOptions& options) const {
  const std::string cfg = config.ToString();
  if (flavor_ == Flavor::kGemmEx && config.bias == BiasMode::kFused) {
    return absl::FailedPreconditionError(absl::StrCat(
        "configuration ", cfg,
        ": the cublas backend adds the bias in its own kernel after the GEMM "
        "(bias mode unfused); use cublaslt:",
        PrecisionName(config.precision),
        ":fused for the bias in the epilogue"));
  }
  if (flavor_ == Flavor::kLt && config.bias == BiasMode::kUnfused) {
    return absl::FailedPreconditionError(absl::StrCat(
        "configuration ", cfg,
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
    return absl::FailedPreconditionError(absl::StrCat(
        "configuration ", cfg, ": bias mode none, but the layer has a bias"));
  }
  if (options.repeat < 1 || options.repeat > kMaxRepeat) {
    return absl::InvalidArgumentError(absl::StrCat(
        "repeat: expected 1..", kMaxRepeat, ", got ", options.repeat));
  }
  return absl::OkStatus();
}

absl::StatusOr<RunResult> CudaLinearBackend::Run(const LinearProblem& problem,
                                                 const Config& config,
                                                 const RunOptions& options) {
  TC_ASSIGN_OR_RETURN(ComparedRun r,
                      RunAndCompare(problem, config, options, {},
                                    /*return_output=*/true));
  return std::move(r.run);
}

absl::StatusOr<ComparedRun> CudaLinearBackend::RunAndCompare(
    const LinearProblem& problem, const Config& config,
    const RunOptions& options, const std::vector<OutputComparison>& comparisons,
    bool return_output) {
  TC_RETURN_IF_ERROR(CheckRequest(problem, config, options));
  // Shapes: the engine validated them; these checks keep every copy below
  // in bounds regardless.
  const std::string cfg = config.ToString();
  const int64_t m = problem.m, n = problem.n, k = problem.k;
  if (m <= 0 || n <= 0 || k <= 0 || m > INT_MAX || n > INT_MAX || k > INT_MAX) {
    return absl::FailedPreconditionError(absl::StrCat(
        "configuration ", cfg, ": the GPU backends need 1 <= m, n, k <= ",
        INT_MAX, ", got m=", m, " n=", n, " k=", k));
  }
  int64_t mk = 0, nk = 0, mn = 0;
  if (!MulOk(m, k, &mk) || !MulOk(n, k, &nk) || !MulOk(m, n, &mn)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("configuration ", cfg, ": m*k, n*k or m*n overflows"));
  }
  if (problem.input->numel() != mk || problem.weight->numel() != nk ||
      (problem.bias != nullptr && problem.bias->numel() != n)) {
    return absl::InvalidArgumentError(
        absl::StrCat("configuration ", cfg, ": tensor sizes do not match m=", m,
                     " n=", n, " k=", k));
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
    const absl::Status sync = ctx.Note(
        ToStatus(cudaStreamSynchronize(ctx.stream()), "cudaStreamSynchronize"));
    if (IsStickyCudaError(sync)) return sync;
    return ctx.Note(result.status());
  }
  return result;
}

absl::StatusOr<ComparedRun> CudaLinearBackend::RunLocked(
    const LinearProblem& problem, const Config& config,
    const RunOptions& options, const std::vector<OutputComparison>& comparisons,
    bool return_output, CudaContext& ctx) {
  const std::string cfg = config.ToString();
  const int64_t m = problem.m, n = problem.n, k = problem.k;
  const Tensor& x = *problem.input;
  const Tensor& w = *problem.weight;
  const Tensor* bias = problem.bias;
  const DType out = problem.output_dtype;
  const bool lt = flavor_ == Flavor::kLt;
  const Plan plan = MakePlan(config.precision, x.dtype(), w.dtype(), out,
                             lt ? bias : nullptr);
  const int repeat = options.repeat;

  // ---- device regions, all sized before anything is allocated.
  RegionPlan regions;
  const int64_t x_raw =
      x.dtype() == plan.ab ? -1 : regions.Add(static_cast<int64_t>(x.nbytes()));
  const int64_t x_ab = regions.Add(Bytes(m * k, plan.ab));
  const int64_t w_raw =
      w.dtype() == plan.ab ? -1 : regions.Add(static_cast<int64_t>(w.nbytes()));
  const int64_t w_ab = regions.Add(Bytes(n * k, plan.ab));
  // Lt: the bias in D's type; cublas: the bias as stored.
  const DType bias_dev_type =
      bias == nullptr ? plan.d : (lt ? plan.d : bias->dtype());
  const bool bias_convert = bias != nullptr && bias->dtype() != bias_dev_type;
  const int64_t bias_raw =
      bias_convert ? regions.Add(static_cast<int64_t>(bias->nbytes())) : -1;
  const int64_t bias_dev =
      bias == nullptr ? -1 : regions.Add(Bytes(n, bias_dev_type));
  const bool d_is_out = plan.d == out;
  const int64_t out_bytes = Bytes(m * n, out);
  const int64_t d_bytes = Bytes(m * n, plan.d);
  const int64_t d_buf = d_is_out ? -1 : regions.Add(d_bytes);
  const int64_t out0 = regions.Add(out_bytes);
  const int64_t out1 = repeat > 1 ? regions.Add(out_bytes) : -1;
  const int64_t flag = regions.Add(sizeof(int));
  // Where a request's time goes, reported in the details as
  // "host_prepare_ms" (the comparisons' host work before the device),
  // "device_ms" (uploads, runs, statistics, until the stream is done) and
  // "host_finish_ms" (the statistics back and finished).
  using Clock = std::chrono::steady_clock;
  const auto t_prepare = Clock::now();
  // Comparisons: the other tensor and the statistics' device memory each.
  std::vector<std::unique_ptr<DeviceCompare>> compares;
  std::vector<int64_t> other_at, compare_at;
  for (const OutputComparison& c : comparisons) {
    compares.push_back(std::make_unique<DeviceCompare>(m * n, c.options));
    other_at.push_back(regions.Add(static_cast<int64_t>(c.other->nbytes())));
    compare_at.push_back(regions.Add(compares.back()->bytes()));
  }
  if (regions.overflow()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("configuration ", cfg, ": device memory size overflows"));
  }

  TC_RETURN_IF_ERROR(ToStatus(cudaSetDevice(ctx.device()), "cudaSetDevice"));
  TC_ASSIGN_OR_RETURN(char* base, ctx.Reserve(regions.total()));
  const auto t_device = Clock::now();
  auto at = [base](int64_t offset) -> char* {
    return offset < 0 ? nullptr : base + offset;
  };
  cudaStream_t stream = ctx.stream();

  // ---- inputs: upload, then round to the A/B type where they differ.
  auto upload = [&](const Tensor& t, int64_t raw, int64_t dst) -> absl::Status {
    void* target = raw < 0 ? at(dst) : at(raw);
    TC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(target, t.raw(), t.nbytes(),
                                            cudaMemcpyHostToDevice, stream));
    return absl::OkStatus();
  };
  TC_RETURN_IF_ERROR(upload(x, x_raw, x_ab));
  TC_RETURN_IF_ERROR(upload(w, w_raw, w_ab));
  if (x_raw >= 0) {
    TC_CUDA_RETURN_IF_ERROR(LaunchConvert(at(x_raw), ToElem(x.dtype()),
                                          at(x_ab), ToElem(plan.ab), m * k,
                                          stream));
  }
  if (w_raw >= 0) {
    TC_CUDA_RETURN_IF_ERROR(LaunchConvert(at(w_raw), ToElem(w.dtype()),
                                          at(w_ab), ToElem(plan.ab), n * k,
                                          stream));
  }
  if (bias != nullptr) {
    TC_RETURN_IF_ERROR(upload(*bias, bias_raw, bias_dev));
    if (bias_convert) {
      TC_CUDA_RETURN_IF_ERROR(LaunchConvert(at(bias_raw), ToElem(bias->dtype()),
                                            at(bias_dev), ToElem(bias_dev_type),
                                            n, stream));
    }
  }
  TC_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(at(flag), 0, sizeof(int), stream));

  const bool a_transposed = problem.layout == WeightLayout::kOutIn;
  const cublasOperation_t transa = a_transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int64_t lda = a_transposed ? k : n;
  const cudaDataType_t ab_type = ToCudaType(plan.ab);
  const cudaDataType_t d_type = ToCudaType(plan.d);
  const Scalars scalars;
  const ActKind act = problem.activation == Activation::kRelu ? ActKind::kRelu
                      : problem.activation == Activation::kGeluTanh
                          ? ActKind::kGeluTanh
                          : ActKind::kNone;

  RunResult result;
  auto& details = result.details;
  details["device"] = device_->probe.description.name;
  details["compute_type"] = ComputeName(plan.compute);
  details["ab_type"] = std::string(DTypeName(plan.ab));
  details["d_type"] = std::string(DTypeName(plan.d));
  details["scale_type"] = plan.scale == CUDA_R_64F   ? "float64"
                          : plan.scale == CUDA_R_16F ? "float16"
                                                     : "float32";
  {
    std::string rounding;
    if (x_raw >= 0) {
      absl::StrAppend(&rounding, "input ", DTypeName(x.dtype()), "->",
                      DTypeName(plan.ab), "; ");
    }
    if (w_raw >= 0) {
      absl::StrAppend(&rounding, "weight ", DTypeName(w.dtype()), "->",
                      DTypeName(plan.ab), "; ");
    }
    if (bias_convert) {
      absl::StrAppend(&rounding, "bias ", DTypeName(bias->dtype()), "->",
                      DTypeName(bias_dev_type), "; ");
    }
    details["input_rounding"] =
        rounding.empty()
            ? "none"
            : absl::StrCat(rounding, "device kernel, nearest-even");
  }
  details["output_rounding"] =
      d_is_out ? "none (GEMM writes the output dtype)"
               : absl::StrCat(DTypeName(plan.d), "->", DTypeName(out),
                              " (device kernel, nearest-even)");
  details["workspace_bytes"] = absl::StrCat(ctx.workspace_bytes());

  // ---- one run of the layer into `dst` (the output dtype).
  std::function<absl::Status(char*)> run_once;

  // cuBLASLt descriptors live for the whole request.
  MatmulDescPtr op_desc;
  LayoutPtr a_desc, b_desc, d_desc;
  PreferencePtr pref;
  cublasLtMatmulHeuristicResult_t heuristic{};

  if (lt) {
    cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    if (bias != nullptr) {
      epilogue = act == ActKind::kRelu       ? CUBLASLT_EPILOGUE_RELU_BIAS
                 : act == ActKind::kGeluTanh ? CUBLASLT_EPILOGUE_GELU_BIAS
                                             : CUBLASLT_EPILOGUE_BIAS;
    } else {
      epilogue = act == ActKind::kRelu       ? CUBLASLT_EPILOGUE_RELU
                 : act == ActKind::kGeluTanh ? CUBLASLT_EPILOGUE_GELU
                                             : CUBLASLT_EPILOGUE_DEFAULT;
    }
    details["epilogue"] = EpilogueName(epilogue);

    cublasLtMatmulDesc_t od = nullptr;
    TC_CUDA_RETURN_IF_ERROR(
        cublasLtMatmulDescCreate(&od, plan.compute, plan.scale));
    op_desc.reset(od);
    const cublasOperation_t transb = CUBLAS_OP_N;
    TC_CUDA_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        od, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof(transa)));
    TC_CUDA_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        od, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof(transb)));
    TC_CUDA_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        od, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    if (bias != nullptr) {
      const void* bias_ptr = at(bias_dev);
      TC_CUDA_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
          od, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_ptr, sizeof(bias_ptr)));
    }

    cublasLtMatrixLayout_t l = nullptr;
    // A as stored: k x n (OUT_IN, transposed) or n x k (IN_OUT).
    TC_CUDA_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(
        &l, ab_type, static_cast<uint64_t>(a_transposed ? k : n),
        static_cast<uint64_t>(a_transposed ? n : k), lda));
    a_desc.reset(l);
    TC_CUDA_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(
        &l, ab_type, static_cast<uint64_t>(k), static_cast<uint64_t>(m), k));
    b_desc.reset(l);
    TC_CUDA_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(
        &l, d_type, static_cast<uint64_t>(n), static_cast<uint64_t>(m), n));
    d_desc.reset(l);

    cublasLtMatmulPreference_t p = nullptr;
    TC_CUDA_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&p));
    pref.reset(p);
    const uint64_t ws = static_cast<uint64_t>(ctx.workspace_bytes());
    TC_CUDA_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
        p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    if (options.disallow_reduced_precision_reduction) {
      // Split-K partial sums only in the compute type: no in-place
      // reduction in D (D's type) and no output-type reduction.
      const uint32_t mask = CUBLASLT_REDUCTION_SCHEME_NONE |
                            CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
      TC_CUDA_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
          p, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask, sizeof(mask)));
      details["reduction_scheme_mask"] = absl::StrCat(mask);
    } else {
      details["reduction_scheme_mask"] =
          absl::StrCat(static_cast<uint32_t>(CUBLASLT_REDUCTION_SCHEME_MASK));
    }

    int found = 0;
    const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(
        ctx.lt(), od, a_desc.get(), b_desc.get(), d_desc.get(), d_desc.get(), p,
        1, &heuristic, &found);
    if (hs == CUBLAS_STATUS_NOT_SUPPORTED ||
        (hs == CUBLAS_STATUS_SUCCESS && found == 0)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "configuration ", cfg,
          ": cuBLASLt has no algorithm (no heuristic "
          "result) for A/B ",
          DTypeName(plan.ab), ", D ", DTypeName(plan.d), ", ",
          ComputeName(plan.compute), ", epilogue ", EpilogueName(epilogue),
          ", m=", m, " n=", n, " k=", k, ", workspace ", ws, " bytes on ",
          device_->probe.description.name));
    }
    TC_CUDA_RETURN_IF_ERROR(hs);
    {
      int32_t id = 0;
      uint32_t tile = 0, scheme = 0;
      int32_t splitk = 0;
      size_t written = 0;
      if (cublasLtMatmulAlgoConfigGetAttribute(
              &heuristic.algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof(id),
              &written) == CUBLAS_STATUS_SUCCESS) {
        details["algo"] = absl::StrCat(id);
      }
      if (cublasLtMatmulAlgoConfigGetAttribute(
              &heuristic.algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile,
              sizeof(tile), &written) == CUBLAS_STATUS_SUCCESS) {
        details["algo_tile"] = absl::StrCat(tile);
      }
      if (cublasLtMatmulAlgoConfigGetAttribute(
              &heuristic.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk,
              sizeof(splitk), &written) == CUBLAS_STATUS_SUCCESS) {
        details["algo_splitk"] = absl::StrCat(splitk);
      }
      if (cublasLtMatmulAlgoConfigGetAttribute(
              &heuristic.algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme,
              sizeof(scheme), &written) == CUBLAS_STATUS_SUCCESS) {
        details["algo_reduction_scheme"] = absl::StrCat(scheme);
      }
      details["algo_index"] = "0";  // the heuristic's first choice
      details["algo_workspace_bytes"] = absl::StrCat(heuristic.workspaceSize);
    }

    run_once = [&, od](char* dst) -> absl::Status {
      void* d_ptr = d_is_out ? dst : at(d_buf);
      TC_CUDA_RETURN_IF_ERROR(cublasLtMatmul(
          ctx.lt(), od, scalars.one(plan.scale), at(w_ab), a_desc.get(),
          at(x_ab), b_desc.get(), scalars.zero(plan.scale), d_ptr, d_desc.get(),
          d_ptr, d_desc.get(), &heuristic.algo, ctx.workspace(),
          static_cast<size_t>(ctx.workspace_bytes()), stream));
      if (!d_is_out) {
        TC_CUDA_RETURN_IF_ERROR(LaunchConvert(at(d_buf), ToElem(plan.d), dst,
                                              ToElem(out), m * n, stream));
      }
      return absl::OkStatus();
    };
  } else {
    int math = CUBLAS_DEFAULT_MATH;
    if (options.disallow_reduced_precision_reduction) {
      math |= CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
    }
    TC_CUDA_RETURN_IF_ERROR(
        cublasSetMathMode(ctx.cublas(), static_cast<cublasMath_t>(math)));
    details["math_mode"] =
        options.disallow_reduced_precision_reduction
            ? "CUBLAS_DEFAULT_MATH|DISALLOW_REDUCED_PRECISION_REDUCTION"
            : "CUBLAS_DEFAULT_MATH";
    details["algo"] = "CUBLAS_GEMM_DEFAULT";
    std::string steps = "gemm";
    if (!d_is_out) absl::StrAppend(&steps, ", round to ", DTypeName(out));
    if (bias != nullptr) absl::StrAppend(&steps, ", bias add (rounded)");
    if (act != ActKind::kNone)
      absl::StrAppend(&steps, ", ", ActivationName(problem.activation),
                      " (rounded)");
    details["steps"] = steps;

    run_once = [&](char* dst) -> absl::Status {
      void* d_ptr = d_is_out ? dst : at(d_buf);
      TC_CUDA_RETURN_IF_ERROR(cublasGemmEx(
          ctx.cublas(), transa, CUBLAS_OP_N, static_cast<int>(n),
          static_cast<int>(m), static_cast<int>(k), scalars.one(plan.scale),
          at(w_ab), ab_type, static_cast<int>(lda), at(x_ab), ab_type,
          static_cast<int>(k), scalars.zero(plan.scale), d_ptr, d_type,
          static_cast<int>(n), plan.compute, CUBLAS_GEMM_DEFAULT));
      if (!d_is_out) {
        TC_CUDA_RETURN_IF_ERROR(LaunchConvert(at(d_buf), ToElem(plan.d), dst,
                                              ToElem(out), m * n, stream));
      }
      if (bias != nullptr) {
        TC_CUDA_RETURN_IF_ERROR(LaunchBiasAdd(dst, ToElem(out), at(bias_dev),
                                              ToElem(bias_dev_type), m, n,
                                              stream));
      }
      TC_CUDA_RETURN_IF_ERROR(
          LaunchActivation(dst, ToElem(out), act, m * n, stream));
      return absl::OkStatus();
    };
  }

  // ---- run, repeat, compare on the device.
  for (int r = 0; r < repeat; ++r) {
    char* dst = r == 0 ? at(out0) : at(out1);
    TC_RETURN_IF_ERROR(run_once(dst));
    if (r > 0) {
      TC_CUDA_RETURN_IF_ERROR(
          LaunchCompareBits(at(out0), at(out1), out_bytes,
                            reinterpret_cast<int*>(at(flag)), stream));
    }
  }

  // ---- statistics on the device, against the other tensors.
  const DeviceArray output{at(out0), out, m * n};
  for (size_t c = 0; c < comparisons.size(); ++c) {
    const Tensor& other_host = *comparisons[c].other;
    TC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(at(other_at[c]), other_host.raw(),
                                            other_host.nbytes(),
                                            cudaMemcpyHostToDevice, stream));
    const DeviceArray other{at(other_at[c]), other_host.dtype(), other_host.numel()};
    const bool output_is_actual = comparisons[c].output_is_actual;
    TC_RETURN_IF_ERROR(compares[c]->Enqueue(output_is_actual ? output : other,
                                            output_is_actual ? other : output,
                                            at(compare_at[c]), stream));
  }

  auto download_output = [&]() -> absl::Status {
    TC_ASSIGN_OR_RETURN(result.output, Tensor::Create(out, {m, n}));
    TC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(result.output.raw(), at(out0),
                                            static_cast<size_t>(out_bytes),
                                            cudaMemcpyDeviceToHost, stream));
    return absl::OkStatus();
  };
  if (return_output) TC_RETURN_IF_ERROR(download_output());
  int differ = 0;
  TC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&differ, at(flag), sizeof(differ),
                                          cudaMemcpyDeviceToHost, stream));
  TC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  result.runs = repeat;
  result.deterministic = differ == 0;
  const auto t_finish = Clock::now();

  ComparedRun compared;
  for (size_t c = 0; c < comparisons.size(); ++c) {
    const Tensor* host_output = nullptr;
    if (compares[c]->NeedsTensorsOnHost()) {
      // Rare: too many NaN/Inf pairs for bound_ratio's device path.
      if (result.output.numel() != m * n) {
        TC_RETURN_IF_ERROR(download_output());
        TC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
      }
      host_output = &result.output;
    }
    const bool output_is_actual = comparisons[c].output_is_actual;
    TC_ASSIGN_OR_RETURN(
        DiffStats s,
        compares[c]->Finish(output_is_actual ? host_output : comparisons[c].other,
                            output_is_actual ? comparisons[c].other : host_output));
    compared.stats.push_back(std::move(s));
  }
  if (!return_output) result.output = Tensor();
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

absl::Status RegisterCudaBackends(BackendRegistry* registry,
                                  const BuiltinBackendOptions& options) {
  auto device = std::make_shared<cuda::CudaDevice>();
  device->probe = cuda::ProbeDevice();
  const char* tf32_env = std::getenv("NVIDIA_TF32_OVERRIDE");
  device->tf32_disabled =
      tf32_env != nullptr && std::strcmp(tf32_env, "0") == 0;
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
  TC_RETURN_IF_ERROR(registry->Register(
      std::make_unique<cuda::CudaLinearBackend>(cuda::Flavor::kLt, device)));
  TC_RETURN_IF_ERROR(
      registry->Register(std::make_unique<cuda::CudaLinearBackend>(
          cuda::Flavor::kGemmEx, device)));
  return absl::OkStatus();
}

}  // namespace tensorcheck
