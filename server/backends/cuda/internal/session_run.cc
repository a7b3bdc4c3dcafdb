// A configuration's run, its algorithms and the magnitude sums on a
// CudaSession (internal/cuda_session.h). How a configuration runs (compute
// types, the rounding of inputs and outputs): gemm_plan.h; the calls:
// gemm_call.h; the FP8 rules: fp8_rules.h; the multi-pass rules:
// multi_pass_rules.h.
//
// tf32rna and tf32trunc, which no cuBLAS compute type offers, run as an
// emulation with the CPU backend's semantics: the inputs rounded to TF32
// on the device (ties away, or truncated), then a strict-fp32 GEMM
// (CUBLAS_COMPUTE_32F_PEDANTIC): products of TF32 values are exact in
// fp32, so only the summation order differs from the CPU emulation.
//
// The fp8 precisions run cuBLASLt's FP8 GEMM. Wide operands are quantised
// on the host by the configuration's recipe (QuantizeFp8, exactly what the
// CPU backend multiplies) and uploaded with their scales, as forms of the
// operand (resident with a stored weight); FP8 operands come with theirs.
// An IN_OUT FP8 weight is transposed to [n, k] (the host transposes a
// quantised one as it uploads it; a device kernel an FP8 one), so that A
// is always transposed and B not (TN).
//
// The multi-pass precisions (internal/multi_pass_rules.h): on cuBLASLt,
// each operand is split into its parts by a kernel (forms of the operand,
// resident with a stored weight), one cublasLtMatmul per partial product
// and the sums and epilogue by kernels (internal/multi_pass_call.cc); on
// cuBLAS, bf16x9 is one cublasGemmEx with cuBLAS's own BF16x9 emulation.
//
// Split-K (`@splitk=N,reduce=...`, internal/splitk_rules.h): bf16's and
// fp16's plan, with the split count and reduction scheme set on cuBLASLt's
// algorithm (lt_matmul.cc); cuBLAS refuses it.
#include <climits>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/float_formats.h"
#include "core/fp8_scaling.h"
#include "core/status_macros.h"
#include "server/backends/cuda/cuda_status.h"
#include "server/backends/cuda/internal/block_scale_layout.h"
#include "server/backends/cuda/internal/block_scale_rules.h"
#include "server/backends/cuda/internal/compare_args.h"
#include "server/backends/cuda/internal/cuda_kernels.h"
#include "server/backends/cuda/internal/cuda_session.h"
#include "server/backends/cuda/internal/error_model_kernels.h"
#include "server/backends/cuda/internal/fp8_rules.h"
#include "server/backends/cuda/internal/gemm_call.h"
#include "server/backends/cuda/internal/gemm_plan.h"
#include "server/backends/cuda/internal/multi_pass_rules.h"
#include "server/backends/cuda/internal/replay_rules.h"
#include "server/backends/cuda/internal/splitk_rules.h"

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

// How a configuration runs a layer, from the layer's dtypes and shape
// alone: what both the run and the list of algorithms start from.
struct RunSetup {
  bool lt = true;
  Plan plan;
  // tf32rna/tf32trunc: the TF32 rounding of fp32 operands on the device.
  std::optional<Tf32Rounding> round;
  // A multi-pass precision: how it runs (the rules' answer).
  std::optional<MultiPassGemm> multi_pass;
  // The bias on the device: Lt, the epilogue's type; cublas, as stored.
  DType bias_type = DType::kFloat32;
  bool a_transposed = false;
  // A split-K configuration: what cuBLASLt's algorithm is given.
  std::optional<SplitKGemm> split;

  // cuBLASLt's partial GEMMs of a multi-pass precision: the plan is one
  // partial GEMM's (fp32 D, no epilogue); kernels do the rest.
  bool partial_gemms() const {
    return multi_pass.has_value() && multi_pass->method == MultiPassMethod::kPartialGemms;
  }
};

// The device's side of a set-up: whether TF32 is turned off for cuBLAS
// (NVIDIA_TF32_OVERRIDE=0) and the compute capability the FP8 rules ask.
struct DeviceTraits {
  bool tf32_disabled = false;
  ComputeCapability cc;
};

DeviceTraits TraitsOf(const CudaComputeDevice& device) {
  return {device.tf32_disabled(),
          ComputeCapability{device.probe().cc_major, device.probe().cc_minor}};
}

// `fp8`: the FP8 GEMM the configuration's Prepare decided, required when
// it involves FP8 (the rules are not asked again here).
absl::StatusOr<RunSetup> SetUp(const Config& config, const LayerTypes& l, const RunOptions& options,
                               const DeviceTraits& device, const std::optional<Fp8Gemm>& fp8) {
  RunSetup r;
  r.lt = config.backend == "cublaslt";
  if (!r.lt && config.backend != "cublas") {
    return absl::FailedPreconditionError(
        absl::StrCat("configuration ", config.ToString(), ": backend '", config.backend,
                     "' does not run on the CUDA device (cublaslt and cublas do)"));
  }
  TC_RETURN_IF_ERROR(CheckConfig(config, r.lt, l.bias.has_value(), options, device.tf32_disabled));
  // The split-K rules without the layer first: a split on any other
  // precision, or on cublas, is refused before the branches below.
  TC_RETURN_IF_ERROR(
      CheckSplitK(SplitKQuery{config, std::nullopt, options.disallow_reduced_precision_reduction})
          .status());
  const int64_t m = l.m, n = l.n, k = l.k;
  if (m <= 0 || n <= 0 || k <= 0 || m > INT_MAX || n > INT_MAX || k > INT_MAX) {
    return absl::FailedPreconditionError(absl::StrCat(
        "configuration ", config.ToString(), ": the GPU backends need 1 <= m, n, k <= ", INT_MAX,
        ", got m=", m, " n=", n, " k=", k));
  }
  if (InvolvesNarrowGemm(config, l)) {
    if (!fp8.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "configuration ", config.ToString(), ": its FP8 GEMM was not prepared for this layer"));
    }
    const Fp8Gemm& gemm = *fp8;
    r.plan = MakeFp8Plan(gemm);
    r.bias_type = gemm.bias.value_or(gemm.d);
    // OUT_IN as stored, IN_OUT once transposed: TN.
    r.a_transposed = true;
    return r;
  }
  if (IsMultiPass(config.precision)) {
    TC_ASSIGN_OR_RETURN(r.multi_pass, CheckMultiPass(MultiPassQuery{config, device.cc}));
    r.plan = MakeMultiPassPlan(*r.multi_pass);
    // The bias as stored: kernels add it (cuBLASLt's passes), or cuBLAS's
    // bias kernel.
    r.bias_type = l.bias.value_or(DType::kFloat32);
    r.a_transposed = l.layout == WeightLayout::kOutIn;
    return r;
  }
  // tf32rna/tf32trunc: fp32's plan (strict fp32 when the inputs are wider
  // than 16 bits), with the inputs rounded to TF32 first. 16-bit inputs
  // are exact in TF32, and fp32's plan then rounds nothing either.
  const std::optional<Tf32Rounding> tf32 = EmulatedTf32(config.precision);
  const Precision planned = tf32 ? Precision::kFp32 : config.precision;
  r.plan =
      MakePlan(planned, l.input, l.weight, l.output_dtype, r.lt ? l.bias : std::optional<DType>());
  r.round = tf32 && r.plan.ab == DType::kFloat32 ? tf32 : std::nullopt;
  r.bias_type = !l.bias.has_value() ? r.plan.d : (r.lt ? r.plan.d : *l.bias);
  r.a_transposed = l.layout == WeightLayout::kOutIn;
  TC_ASSIGN_OR_RETURN(r.split,
                      CheckSplitK(SplitKQuery{config, SplitKLayer{r.plan.d, l.output_dtype},
                                              options.disallow_reduced_precision_reduction}));
  return r;
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

// The parts of a multi-pass operand (`source`, whose fp32 form is `fp32`),
// highest first, in the part type: forms of `source`, made once per session
// (resident with a stored weight). bf16x6 and bf16x9 share their three
// parts.
absl::StatusOr<std::vector<ArrayRef>> SplitParts(CudaSession& s, ArrayRef source, ArrayRef fp32,
                                                 const MultiPassGemm& g) {
  TC_ASSIGN_OR_RETURN(const CudaSession::Array* src, s.Get(fp32, "operand"));
  const float* data = static_cast<const float*>(src->data);
  const int64_t count = src->count;
  const int parts = g.scheme.parts;
  const bool tf32 = g.scheme.tf32;
  cudaStream_t stream = s.stream();
  std::vector<ArrayRef> out;
  for (int i = 0; i < parts; ++i) {
    const std::string form = absl::StrCat("split|", tf32 ? "tf32" : "bf16", "|", parts, "|", i);
    TC_ASSIGN_OR_RETURN(ArrayRef part, s.Form(source, form, g.part, [=](void* dst) -> absl::Status {
      TC_CUDA_RETURN_IF_ERROR(LaunchSplitMultiPass(data, dst, parts, tf32, i, count, stream));
      return absl::OkStatus();
    }));
    out.push_back(part);
  }
  return out;
}

// An FP8 (or FP4) operand on the device with its dequantisation scales
// and, for NVFP4, its per-tensor scale (1 float32).
struct Fp8Operand {
  ArrayRef values;
  ArrayRef scales;
  ArrayRef global;
};

// A wide operand viewed as [outer, inner], quantised to `fp8` by the
// recipe (QuantizeFp8 on the host, from the tensor it was uploaded from:
// the CPU backend's very values and scales), its values transposed to
// [inner, outer] when `transpose`. Both are forms of `source`: made once
// per session, resident with a stored weight.
absl::StatusOr<Fp8Operand> Quantised(CudaSession& s, ArrayRef source, DType fp8, Fp8Scaling scaling,
                                     int64_t outer, int64_t inner, bool per_column,
                                     bool transpose) {
  TC_ASSIGN_OR_RETURN(const CudaSession::Array* src, s.Get(source, "operand"));
  if (src->host == nullptr) {
    return absl::InternalError(
        "an FP8 configuration's wide operand has no host tensor to quantise");
  }
  const Tensor* host = src->host;
  const int64_t scale_count = scaling == Fp8Scaling::kTensor ? 1 : (per_column ? inner : outer);
  const std::string form =
      absl::StrCat(DTypeName(fp8), "|", Fp8ScalingName(scaling), per_column ? "|columns" : "",
                   transpose ? "|transposed" : "");
  // Quantised once, when the first of the two forms is made.
  auto quantised = std::make_shared<std::optional<Fp8Quantized>>();
  auto quantise = [=]() -> absl::StatusOr<const Fp8Quantized*> {
    if (!quantised->has_value()) {
      TC_ASSIGN_OR_RETURN(Fp8Quantized q,
                          QuantizeFp8(*host, outer, inner, *Fp8FormatOf(fp8), scaling, per_column));
      if (transpose) {
        TC_ASSIGN_OR_RETURN(Tensor t, Tensor::Create(fp8, {inner, outer}));
        const uint8_t* from = q.values.data<uint8_t>();
        uint8_t* to = t.data<uint8_t>();
        for (int64_t r = 0; r < outer; ++r) {
          for (int64_t c = 0; c < inner; ++c) to[c * outer + r] = from[r * inner + c];
        }
        q.values = std::move(t);
      }
      *quantised = std::move(q);
    }
    return &**quantised;
  };
  CudaSession* session = &s;
  Fp8Operand out;
  TC_ASSIGN_OR_RETURN(out.values, s.Form(source, form, fp8, [=](void* dst) -> absl::Status {
    TC_ASSIGN_OR_RETURN(const Fp8Quantized* q, quantise());
    return session->CopyToDevice(q->values.raw(), dst, static_cast<int64_t>(q->values.nbytes()));
  }));
  TC_ASSIGN_OR_RETURN(out.scales, s.Form(
                                      source, absl::StrCat(form, "|scales"), DType::kFloat32,
                                      [=](void* dst) -> absl::Status {
                                        TC_ASSIGN_OR_RETURN(const Fp8Quantized* q, quantise());
                                        return session->CopyToDevice(
                                            q->scales.data(), dst,
                                            static_cast<int64_t>(q->scales.size() * sizeof(float)));
                                      },
                                      scale_count));
  return out;
}

// An FP8 or block-scaled operand's scales as the session holds them:
// `spec`'s dtype and count (block_scale_layout.h's LtScaleSpecOf).
absl::StatusOr<ArrayRef> GivenScales(CudaSession& s, ArrayRef scales, const char* name,
                                     const LtScaleSpec& spec, const Config& config) {
  if (!scales.valid()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "configuration ", config.ToString(), ": narrow operands reached the device without ", name,
        " (a device session's operands carry no scales; the backends' own runs pass them)"));
  }
  TC_ASSIGN_OR_RETURN(const CudaSession::Array* a, s.Get(scales, name));
  if (a->dtype != spec.dtype || a->count != spec.count) {
    return absl::InvalidArgumentError(absl::StrCat(
        "configuration ", config.ToString(), ": ", name, ": ", DTypeName(spec.dtype), " with ",
        spec.count, " elements expected, got ", a->count, " ", DTypeName(a->dtype)));
  }
  return scales;
}

// A wide operand as cuBLASLt multiplies it under a block-wise GEMM
// (scaling=block128, MXFP8, NVFP4): QuantiseForLt on the host, from the
// tensor it was uploaded from (the CPU backend's very recipe), its values
// TN, its scales in cuBLASLt's layout and NVFP4's per-tensor scale: forms
// of `source`, made once per session (resident with a stored weight).
absl::StatusOr<Fp8Operand> BlockQuantised(CudaSession& s, ArrayRef source, bool weight,
                                          const LayerShape& shape, const Config& config,
                                          const Fp8Gemm& gemm) {
  TC_ASSIGN_OR_RETURN(const CudaSession::Array* src, s.Get(source, "operand"));
  if (src->host == nullptr) {
    return absl::InternalError(
        "a block-scaled configuration's wide operand has no host tensor to quantise");
  }
  const Tensor* host = src->host;
  const DType values = weight ? gemm.a : gemm.b;
  const LtScaleSpec spec = LtScaleSpecOf(gemm.scale_mode, weight, shape);
  const bool transposed = weight && shape.layout == WeightLayout::kInOut;
  std::string form = absl::StrCat(DTypeName(values), "|", Fp8BScaleModeName(gemm.scale_mode));
  if (gemm.scale_mode == Fp8ScaleMode::kMxVec32) {
    absl::StrAppend(&form, "|", MxScaleRoundingName(config.mx_rounding));
  }
  if (transposed) absl::StrAppend(&form, "|transposed");
  // Quantised once, when the first of the forms is made.
  auto quantised = std::make_shared<std::optional<LtOperand>>();
  auto quantise = [=]() -> absl::StatusOr<const LtOperand*> {
    if (!quantised->has_value()) {
      TC_ASSIGN_OR_RETURN(LtOperand q, QuantiseForLt(*host, weight, shape, config, gemm));
      *quantised = std::move(q);
    }
    return &**quantised;
  };
  CudaSession* session = &s;
  const int64_t rows = weight ? shape.n : shape.m;
  Fp8Operand out;
  TC_ASSIGN_OR_RETURN(out.values, s.Form(
                                      source, form, values,
                                      [=](void* dst) -> absl::Status {
                                        TC_ASSIGN_OR_RETURN(const LtOperand* q, quantise());
                                        return session->CopyToDevice(
                                            q->values.raw(), dst,
                                            static_cast<int64_t>(q->values.nbytes()));
                                      },
                                      rows* shape.k));
  TC_ASSIGN_OR_RETURN(out.scales, s.Form(
                                      source, absl::StrCat(form, "|scales"), spec.dtype,
                                      [=](void* dst) -> absl::Status {
                                        TC_ASSIGN_OR_RETURN(const LtOperand* q, quantise());
                                        return session->CopyToDevice(
                                            q->scales.raw(), dst,
                                            static_cast<int64_t>(q->scales.nbytes()));
                                      },
                                      spec.count));
  if (gemm.global_scales) {
    TC_ASSIGN_OR_RETURN(out.global, s.Form(
                                        source, absl::StrCat(form, "|global"), DType::kFloat32,
                                        [=](void* dst) -> absl::Status {
                                          TC_ASSIGN_OR_RETURN(const LtOperand* q, quantise());
                                          return session->CopyToDevice(&q->global_scale, dst,
                                                                       sizeof(float));
                                        },
                                        1));
  }
  return out;
}

// The FP8 GEMM's A (the weight, [n, k]) and B (the input), each with its
// scales.
struct Fp8Arrays {
  Fp8Operand x, w;
};

// A stored IN_OUT weight as [n, k] (TN): FP8 bytes transposed by a
// device kernel; packed FP4 on the host, from the tensor it was uploaded
// from. A form of the weight.
absl::StatusOr<ArrayRef> TransposedWeight(CudaSession& s, ArrayRef weight, int64_t n, int64_t k) {
  TC_ASSIGN_OR_RETURN(const CudaSession::Array* w, s.Get(weight, "op.weight"));
  const void* data = w->data;
  cudaStream_t stream = s.stream();
  if (w->dtype != DType::kFloat4E2M1Fn) {
    return s.Form(weight, "transposed", w->dtype, [=](void* dst) -> absl::Status {
      TC_CUDA_RETURN_IF_ERROR(LaunchTransposeBytes(data, dst, /*rows=*/k, /*cols=*/n, stream));
      return absl::OkStatus();
    });
  }
  if (w->host == nullptr) {
    return absl::InternalError("an FP4 IN_OUT weight has no host tensor to transpose");
  }
  const Tensor* host = w->host;
  CudaSession* session = &s;
  return s.Form(weight, "transposed", w->dtype, [=](void* dst) -> absl::Status {
    const std::vector<uint8_t> t = TransposeFp4(host->data<uint8_t>(), /*rows=*/k, /*cols=*/n);
    return session->CopyToDevice(t.data(), dst, static_cast<int64_t>(t.size()));
  });
}

absl::StatusOr<Fp8Arrays> Fp8Operands(CudaSession& s, const SessionOperands& op,
                                      const SessionScales& scales, const Config& config,
                                      const Fp8Gemm& gemm) {
  const int64_t m = op.m, n = op.n, k = op.k;
  const LayerShape shape = op.shape();
  const bool block = gemm.scale_mode == Fp8ScaleMode::kBlock128 ||
                     gemm.scale_mode == Fp8ScaleMode::kMxVec32 ||
                     gemm.scale_mode == Fp8ScaleMode::kNvVec16;
  Fp8Arrays f;
  if (gemm.quantise_input && block) {
    TC_ASSIGN_OR_RETURN(f.x, BlockQuantised(s, op.input, /*weight=*/false, shape, config, gemm));
  } else if (gemm.quantise_input) {
    TC_ASSIGN_OR_RETURN(f.x, Quantised(s, op.input, gemm.b, config.scaling, m, k,
                                       /*per_column=*/false, /*transpose=*/false));
  } else {
    f.x.values = op.input;
    TC_ASSIGN_OR_RETURN(f.x.scales,
                        GivenScales(s, scales.input, "input_scale",
                                    LtScaleSpecOf(gemm.scale_mode, false, shape), config));
    f.x.global = op.input_global_scale;
  }
  const bool out_in = op.layout == WeightLayout::kOutIn;
  if (gemm.quantise_weight && block) {
    TC_ASSIGN_OR_RETURN(f.w, BlockQuantised(s, op.weight, /*weight=*/true, shape, config, gemm));
  } else if (gemm.quantise_weight) {
    // W's output features are its rows (OUT_IN) or its columns (IN_OUT).
    TC_ASSIGN_OR_RETURN(f.w, Quantised(s, op.weight, gemm.a, config.scaling, out_in ? n : k,
                                       out_in ? k : n, /*per_column=*/!out_in,
                                       /*transpose=*/gemm.transpose_weight));
  } else {
    f.w.values = op.weight;
    TC_ASSIGN_OR_RETURN(f.w.scales,
                        GivenScales(s, scales.weight, "weight_scale",
                                    LtScaleSpecOf(gemm.scale_mode, true, shape), config));
    f.w.global = op.weight_global_scale;
    if (gemm.transpose_weight) {
      TC_ASSIGN_OR_RETURN(f.w.values, TransposedWeight(s, op.weight, n, k));
    }
  }
  return f;
}

// NVFP4's alpha, fl32(gx * gw) (the CPU backend's GlobalScale), from the
// operands' per-tensor scales on the device.
absl::StatusOr<float> GlobalAlpha(CudaSession& s, const Fp8Arrays& f, const Config& config) {
  if (!f.x.global.valid() || !f.w.global.valid()) {
    return absl::FailedPreconditionError(
        absl::StrCat("configuration ", config.ToString(),
                     ": FP4 operands reached the device without their global scales"));
  }
  TC_ASSIGN_OR_RETURN(Tensor gx, s.Download(f.x.global));
  TC_ASSIGN_OR_RETURN(Tensor gw, s.Download(f.w.global));
  if (gx.dtype() != DType::kFloat32 || gx.numel() != 1 || gw.dtype() != DType::kFloat32 ||
      gw.numel() != 1) {
    return absl::InvalidArgumentError(absl::StrCat("configuration ", config.ToString(),
                                                   ": global scales: one float32 each expected"));
  }
  return gx.data<float>()[0] * gw.data<float>()[0];
}

// The plan in the run's details: the device, the types, where values are
// rounded (or quantised), the workspace.
void DescribePlan(const Plan& plan, const Config& config, DType x, DType w,
                  const CudaSession::Array* bias, DType bias_to, DType out,
                  const std::optional<MultiPassGemm>& multi_pass, CudaSession& s,
                  Details* details) {
  Details& d = *details;
  d["device"] = s.device().probe().description.name;
  d["workspace_bytes"] = absl::StrCat(s.ctx().workspace_bytes());
  d["statistics"] = "device";
  d["compute_type"] = ComputeName(plan.compute);
  d["d_type"] = std::string(DTypeName(plan.d));
  d["scale_type"] = plan.scale == CUDA_R_64F   ? "float64"
                    : plan.scale == CUDA_R_16F ? "float16"
                                               : "float32";
  // Conversions by a device kernel, and the recipe's quantisation on the host.
  std::string rounding, quantised;
  if (plan.fp8) {
    const Fp8Gemm& f = *plan.fp8;
    d["ab_type"] = absl::StrCat(DTypeName(f.b), " (input) x ", DTypeName(f.a), " (weight)");
    if (IsFp8(config.precision)) {
      d["fp8_scaling"] = std::string(Fp8ScalingName(config.scaling));
      d["accumulation"] =
          config.fast_accum ? "fast (CUBLASLT_MATMUL_DESC_FAST_ACCUM)" : "fp32 (split accumulator)";
    } else if (config.precision != Precision::kNvFp4) {
      d["mx_scaling"] = std::string(MxScaleRoundingName(config.mx_rounding));
    }
    switch (f.scale_mode) {
      case Fp8ScaleMode::kTensor:
        d["dequantisation"] = "cuBLASLt per tensor: acc * alpha * scale_A * scale_B";
        break;
      case Fp8ScaleMode::kOuterVector:
        d["dequantisation"] =
            "cuBLASLt outer vector: y[i, j] from acc * scale_A[j] (weight) * scale_B[i] (input)";
        break;
      case Fp8ScaleMode::kBlock128:
        d["dequantisation"] =
            "cuBLASLt block-wise: each 128-wide slice of k times scale_A (the weight's 128x128 "
            "block, BLK128x128_32F) and scale_B (the input's 1x128 block, VEC128_32F)";
        break;
      case Fp8ScaleMode::kMxVec32:
        d["dequantisation"] =
            "cuBLASLt block-scaled: 32-element blocks of k with UE8M0 scales (VEC32_UE8M0)";
        break;
      case Fp8ScaleMode::kNvVec16:
        d["dequantisation"] =
            "cuBLASLt block-scaled: 16-element blocks of k with UE4M3 scales (VEC16_UE4M3), "
            "alpha = fl32(global_x * global_w)";
        break;
    }
    if (f.bias) d["bias_type"] = std::string(DTypeName(*f.bias));
    if (f.transpose_weight) {
      d["weight_transpose"] =
          f.quantise_weight || f.a == DType::kFloat4E2M1Fn
              ? "IN_OUT weight transposed to [n, k] on the host (TN)"
              : "IN_OUT FP8 weight transposed to [n, k] by a device kernel (TN)";
    }
    if (f.quantise_input) {
      absl::StrAppend(&quantised, "input ", DTypeName(x), "->", DTypeName(f.b), "; ");
    }
    if (f.quantise_weight) {
      absl::StrAppend(&quantised, "weight ", DTypeName(w), "->", DTypeName(f.a), "; ");
    }
  } else {
    d["ab_type"] = std::string(DTypeName(plan.ab));
    if (x != plan.ab) {
      absl::StrAppend(&rounding, "input ", DTypeName(x), "->", DTypeName(plan.ab), "; ");
    }
    if (w != plan.ab) {
      absl::StrAppend(&rounding, "weight ", DTypeName(w), "->", DTypeName(plan.ab), "; ");
    }
  }
  if (bias != nullptr && bias->dtype != bias_to) {
    absl::StrAppend(&rounding, "bias ", DTypeName(bias->dtype), "->", DTypeName(bias_to), "; ");
  }
  std::vector<std::string> parts;
  if (!rounding.empty()) parts.push_back(absl::StrCat(rounding, "device kernel, nearest-even"));
  if (!quantised.empty()) {
    if (IsFp8(config.precision)) {
      parts.push_back(absl::StrCat(quantised, "host, current scaling (scaling=",
                                   Fp8ScalingName(config.scaling), ", core/fp8_scaling.h)"));
    } else {
      parts.push_back(absl::StrCat(quantised, "host, the ", PrecisionName(config.precision),
                                   " recipe (core/mx_formats.h)"));
    }
  }
  d["input_rounding"] = parts.empty() ? "none" : absl::StrJoin(parts, "; ");
  if (std::optional<Tf32Rounding> tf32 = EmulatedTf32(config.precision)) {
    if (plan.ab == DType::kFloat32) {
      d["input_rounding"] = absl::StrCat(
          rounding, "x and W rounded to TF32 (",
          *tf32 == Tf32Rounding::kTiesAway ? "ties away" : "truncated", ") by a device kernel");
    }
    d["emulation"] =
        "TF32 inputs rounded on the device, then a strict-fp32 GEMM (CUBLAS_COMPUTE_32F_PEDANTIC)";
  }
  if (multi_pass && multi_pass->method == MultiPassMethod::kPartialGemms) {
    const MultiPassScheme& scheme = multi_pass->scheme;
    const char* part = scheme.tf32 ? "tf32" : "bf16";
    d["ab_type"] = absl::StrCat(DTypeName(plan.ab), scheme.tf32 ? " (TF32 parts)" : " parts");
    d["input_rounding"] = absl::StrCat(
        "x and W split into ", scheme.parts, " ", part,
        " parts by a device kernel (core/multi_pass_split.h, the cpu backend's split)");
    d["passes"] = absl::StrCat(scheme.products.size(), " ", part, " GEMMs with fp32 accumulation");
    d["partial_sum_order"] = PartialSumOrder(scheme);
    d["output_rounding"] =
        absl::StrCat("float32->", DTypeName(out), " (device kernel, nearest-even)");
    return;
  }
  if (multi_pass) {
    d["emulation"] =
        "cuBLAS's own BF16x9 (CUBLAS_COMPUTE_32F_EMULATED_16BFX9): its split and its order of "
        "the partial products are cuBLAS's, not XLA's";
  }
  d["output_rounding"] = plan.d == out ? "none (GEMM writes the output dtype)"
                                       : absl::StrCat(DTypeName(plan.d), "->", DTypeName(out),
                                                      " (device kernel, nearest-even)");
}

// What the GEMM call takes from the layer and its set-up (types, shape,
// layout, epilogue), without the arrays. The run and the algorithm list
// both start from it, so the heuristic is asked about the descriptors the
// run builds.
GemmOperands GemmShapeOf(const RunSetup& setup, const LayerTypes& l, cudaStream_t stream) {
  GemmOperands ops;
  ops.plan = setup.plan;
  ops.m = l.m;
  ops.n = l.n;
  ops.k = l.k;
  ops.a_transposed = setup.a_transposed;
  // cuBLASLt's multi-pass partial GEMMs write fp32 partials, without an
  // epilogue.
  ops.out = setup.partial_gemms() ? DType::kFloat32 : l.output_dtype;
  ops.bias_type = setup.bias_type;
  ops.activation = setup.partial_gemms() ? Activation::kNone : l.activation;
  ops.stream = stream;
  ops.split = setup.split;
  return ops;
}

// The run whose kernels a CPU replays (replay_rules.h): cuBLASLt's GEMM of
// the configuration itself, not a multi-pass precision's partial GEMMs.
std::optional<ReplayRun> ReplayRunOf(const RunSetup& setup, const Config& config,
                                     const LayerTypes& layer, ComputeCapability cc) {
  if (!setup.lt || setup.multi_pass.has_value()) return std::nullopt;
  ReplayRun r;
  r.config = config;
  r.device = cc;
  r.d = setup.plan.d;
  r.out = layer.output_dtype;
  return r;
}

// The GEMM's shape, with a placeholder for every pointer: the heuristic
// reads the descriptors' pointers (bias, FP8 scales) for their alignment
// only (cublasLt.h); the run's arrays come from allocations aligned to at
// least 256 bytes, and so is this placeholder.
GemmOperands PlaceholderOperands(const RunSetup& setup, const LayerTypes& layer, const Config& c,
                                 cudaStream_t stream) {
  const void* placeholder = reinterpret_cast<const void*>(uintptr_t{1} << 12);
  GemmOperands ops = GemmShapeOf(setup, layer, stream);
  ops.w = placeholder;
  ops.x = placeholder;
  ops.bias = layer.bias.has_value() && !setup.partial_gemms() ? placeholder : nullptr;
  if (setup.plan.fp8) {
    ops.w_scale = placeholder;
    ops.x_scale = placeholder;
    ops.fast_accum = c.fast_accum;
  }
  return ops;
}

}  // namespace

LayerTypes LayerOf(const LinearProblem& problem) {
  LayerTypes layer;
  layer.input = problem.input->dtype();
  layer.weight = problem.weight->dtype();
  if (problem.bias != nullptr) layer.bias = problem.bias->dtype();
  layer.shape() = problem.shape();
  return layer;
}

Fp8Query Fp8QueryOf(const Config& config, const LayerTypes& layer,
                    std::optional<ComputeCapability> device) {
  Fp8Query q;
  q.config = config;
  q.input = layer.input;
  q.weight = layer.weight;
  q.layer = Fp8Layer{layer.shape(), layer.bias};
  q.device = device;
  return q;
}

bool InvolvesNarrowGemm(const Config& config, const LayerTypes& layer) {
  return InvolvesNarrow(config, layer.input, layer.weight);
}

absl::StatusOr<SessionRun> RunOnSession(CudaSession& s, const SessionOperands& op,
                                        const SessionScales& scales, const PreparedRun& prepared,
                                        const RunOptions& options) {
  TC_RETURN_IF_ERROR(prepared.status());
  const CudaPrepared* state = prepared.state<CudaPrepared>();
  if (state == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("configuration ", prepared.config().ToString(),
                                                   ": not prepared by a CUDA backend"));
  }
  const Config& config = prepared.config();
  TC_ASSIGN_OR_RETURN(const CudaSession::Array* x, s.Get(op.input, "op.input"));
  TC_ASSIGN_OR_RETURN(const CudaSession::Array* w, s.Get(op.weight, "op.weight"));
  const CudaSession::Array* bias = nullptr;
  if (op.bias.valid()) {
    TC_ASSIGN_OR_RETURN(bias, s.Get(op.bias, "op.bias"));
  }
  const int64_t m = op.m, n = op.n, k = op.k;
  LayerTypes layer;
  layer.input = x->dtype;
  layer.weight = w->dtype;
  if (bias != nullptr) layer.bias = bias->dtype;
  layer.shape() = op.shape();
  TC_ASSIGN_OR_RETURN(const RunSetup setup,
                      SetUp(config, layer, options, TraitsOf(s.device()), state->fp8));
  if (x->count != m * k || w->count != n * k || (bias != nullptr && bias->count != n)) {
    return absl::InvalidArgumentError(absl::StrCat("configuration ", config.ToString(),
                                                   ": tensor sizes do not match m=", m, " n=", n,
                                                   " k=", k));
  }
  const DType x_type = x->dtype, w_type = w->dtype, out = op.output_dtype;
  const Plan& plan = setup.plan;

  GemmOperands ops = GemmShapeOf(setup, layer, s.stream());
  ops.replay = ReplayRunOf(setup, config, layer, TraitsOf(s.device()).cc);
  ArrayRef x_ab, w_ab;
  if (plan.fp8) {
    TC_ASSIGN_OR_RETURN(const Fp8Arrays f, Fp8Operands(s, op, scales, config, *plan.fp8));
    x_ab = f.x.values;
    w_ab = f.w.values;
    ops.x_scale = s.data(f.x.scales);
    ops.w_scale = s.data(f.w.scales);
    ops.fast_accum = config.fast_accum;
    if (plan.fp8->global_scales) {
      TC_ASSIGN_OR_RETURN(ops.alpha, GlobalAlpha(s, f, config));
    }
  } else if (setup.partial_gemms()) {
    // fp32 first (fp64 rounded to nearest, 16-bit widened exactly), as the
    // CPU backend reads the operands it splits.
    TC_ASSIGN_OR_RETURN(x_ab, Operand(s, op.input, DType::kFloat32, std::nullopt));
    TC_ASSIGN_OR_RETURN(w_ab, Operand(s, op.weight, DType::kFloat32, std::nullopt));
  } else {
    TC_ASSIGN_OR_RETURN(x_ab, Operand(s, op.input, plan.ab, setup.round));
    TC_ASSIGN_OR_RETURN(w_ab, Operand(s, op.weight, plan.ab, setup.round));
  }
  std::vector<ArrayRef> x_parts, w_parts;
  ArrayRef sum, partial;
  if (setup.partial_gemms()) {
    TC_ASSIGN_OR_RETURN(x_parts, SplitParts(s, op.input, x_ab, *setup.multi_pass));
    TC_ASSIGN_OR_RETURN(w_parts, SplitParts(s, op.weight, w_ab, *setup.multi_pass));
    TC_ASSIGN_OR_RETURN(sum, s.Allocate(DType::kFloat32, m * n));
    TC_ASSIGN_OR_RETURN(partial, s.Allocate(DType::kFloat32, m * n));
  }
  ArrayRef bias_dev;
  if (bias != nullptr) {
    TC_ASSIGN_OR_RETURN(bias_dev, Operand(s, op.bias, setup.bias_type, std::nullopt));
  }
  // The multi-pass call writes the output itself.
  const bool d_is_out = setup.partial_gemms() || plan.d == out;
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
  DescribePlan(plan, config, x_type, w_type, bias, setup.bias_type, out, setup.multi_pass, s,
               &result.run.details);
  if (setup.split) DescribeSplitK(config, *setup.split, &result.run.details);
  ops.w = s.data(w_ab);
  ops.x = s.data(x_ab);
  ops.d = d_is_out ? nullptr : s.data(d_buf);
  ops.bias = bias == nullptr ? nullptr : s.data(bias_dev);
  ops.algo = config.algo;
  const std::string cfg = config.ToString();
  const std::string& device_name = s.device().probe().description.name;
  std::unique_ptr<GemmCall> gemm;
  if (setup.partial_gemms()) {
    MultiPassOperands mp;
    mp.part = ops;
    mp.scheme = setup.multi_pass->scheme;
    for (ArrayRef a : x_parts) mp.x_parts.push_back(s.data(a));
    for (ArrayRef a : w_parts) mp.w_parts.push_back(s.data(a));
    mp.sum = static_cast<float*>(s.data(sum));
    mp.partial = static_cast<float*>(s.data(partial));
    mp.bias = ops.bias;
    mp.bias_type = setup.bias_type;
    mp.activation = layer.activation;
    mp.out = out;
    TC_ASSIGN_OR_RETURN(
        gemm, PrepareLtMultiPass(mp, s.ctx(), options, cfg, device_name, &result.run.details));
  } else if (setup.lt) {
    TC_ASSIGN_OR_RETURN(
        gemm, PrepareLtMatmul(ops, s.ctx(), options, cfg, device_name, &result.run.details));
  } else {
    TC_ASSIGN_OR_RETURN(gemm, PrepareCublasGemm(ops, s.ctx(), options, cfg, &result.run.details));
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
  if (setup.partial_gemms()) {
    s.Free(sum);
    s.Free(partial);
  }
  s.Free(flag);
  result.run.runs = options.repeat;
  result.run.deterministic = differ == 0;
  result.output = out0;
  return result;
}

absl::StatusOr<std::vector<AlgorithmInfo>> AlgorithmsOnSession(
    CudaSession& s, const LayerTypes& layer, const Config& config,
    const std::optional<Fp8Gemm>& fp8, const RunOptions& options, int limit) {
  Config c = config;
  c.algo.reset();  // the list is the same whichever entry the configuration names
  TC_ASSIGN_OR_RETURN(const RunSetup setup, SetUp(c, layer, options, TraitsOf(s.device()), fp8));
  if (!setup.lt) return CublasAlgorithms(limit);
  GemmOperands ops = PlaceholderOperands(setup, layer, c, s.stream());
  ops.replay = ReplayRunOf(setup, c, layer, TraitsOf(s.device()).cc);
  return LtAlgorithms(ops, s.ctx(), options, limit, c.ToString(),
                      s.device().probe().description.name);
}

absl::Status BuildDescriptors(const Config& config, const LayerTypes& layer,
                              const RunOptions& options, ComputeCapability cc,
                              int64_t workspace_bytes,
                              std::map<std::string, std::string>* details) {
  Config c = config;
  c.algo.reset();
  // Descriptors alone, outside a prepared run: the FP8 rules asked here.
  std::optional<Fp8Gemm> fp8;
  if (InvolvesNarrowGemm(c, layer)) {
    TC_ASSIGN_OR_RETURN(fp8, CheckNarrowGemm(Fp8QueryOf(c, layer, cc)));
  }
  TC_ASSIGN_OR_RETURN(const RunSetup setup,
                      SetUp(c, layer, options, DeviceTraits{/*tf32_disabled=*/false, cc}, fp8));
  if (!setup.lt) return absl::OkStatus();  // cublasGemmEx takes no descriptors
  return BuildLtDescriptors(PlaceholderOperands(setup, layer, c, /*stream=*/nullptr),
                            static_cast<uint64_t>(workspace_bytes), options, details);
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
  if (IsFp8(x->dtype) || IsFp8(w->dtype)) {
    // Their magnitudes are those of the dequantised values, and the
    // session's operands carry no scales.
    return absl::FailedPreconditionError(
        "magnitude sums: FP8 operands need their scales, which a device session's operands do "
        "not carry");
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
