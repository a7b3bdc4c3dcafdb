#include "server/backends/cuda/internal/fp8_rules.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"

namespace tensorcheck::cuda::internal {
namespace {

// The fp8 precision that multiplies `input` x `weight` (both FP8).
Precision PrecisionOfFormats(DType input, DType weight) {
  if (input == DType::kFloat8E5M2) {
    return weight == DType::kFloat8E5M2 ? Precision::kFp8E5M2 : Precision::kFp8E5M2E4M3;
  }
  return weight == DType::kFloat8E5M2 ? Precision::kFp8E4M3E5M2 : Precision::kFp8E4M3;
}

// The bias type cublasLtMatmul's FP8 table pairs with D.
DType BiasTypeFor(DType d) { return d == DType::kFloat16 ? DType::kFloat16 : DType::kBFloat16; }

bool IsWideD(DType d) {
  return d == DType::kBFloat16 || d == DType::kFloat16 || d == DType::kFloat32;
}

}  // namespace

const char* Fp8ScaleModeName(Fp8ScaleMode mode) {
  switch (mode) {
    case Fp8ScaleMode::kTensor:
      return "CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F";
    case Fp8ScaleMode::kOuterVector:
      return "CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F";
    case Fp8ScaleMode::kBlock128:
      return "CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F";
    case Fp8ScaleMode::kMxVec32:
      return "CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0";
    case Fp8ScaleMode::kNvVec16:
      return "CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3";
  }
  return "CUBLASLT_MATMUL_MATRIX_SCALE_?";
}

const char* Fp8BScaleModeName(Fp8ScaleMode mode) {
  return mode == Fp8ScaleMode::kBlock128 ? "CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F"
                                         : Fp8ScaleModeName(mode);
}

absl::StatusOr<Fp8Gemm> CheckFp8Gemm(const Fp8Query& q) {
  const Config& c = q.config;
  const std::string cfg = c.ToString();
  const bool fp8_precision = IsFp8(c.precision);
  const bool fp8_input = IsFp8(q.input);
  const bool fp8_weight = q.weight.has_value() && IsFp8(*q.weight);
  if (!fp8_precision && !fp8_input && !fp8_weight) {
    return absl::InvalidArgumentError(
        absl::StrCat("configuration ", cfg, ": no fp8 precision and no FP8 operand"));
  }
  auto refuse = [&cfg](auto&&... parts) {
    return absl::FailedPreconditionError(absl::StrCat("configuration ", cfg, ": ", parts...));
  };
  const DType fp8_operand = fp8_input ? q.input : (fp8_weight ? *q.weight : q.input);

  // The backend: only cuBLASLt has scale pointers.
  if (c.backend != "cublaslt") {
    if (fp8_precision) {
      return refuse("the ", c.backend,
                    " backend runs no FP8 GEMM: cublasGemmEx takes no scale pointers (FP8's "
                    "dequantisation scales are cuBLASLt's CUBLASLT_MATMUL_DESC_A_SCALE_POINTER and "
                    "B_SCALE_POINTER); use the cublaslt backend");
    }
    return refuse("the ", c.backend, " backend does not multiply ", DTypeName(fp8_operand),
                  " operands: cublasGemmEx takes no scale pointers; the cublaslt backend runs "
                  "them under their fp8 precision, and the cpu backend the dequantised layer");
  }

  // FP8 operands are multiplied as FP8, with their scales.
  if (!fp8_precision) {
    return refuse("the cublaslt backend multiplies ", DTypeName(fp8_operand),
                  " operands only under an fp8 precision (cuBLASLt applies their scales in an "
                  "FP8 GEMM); the dequantised layer in ",
                  PrecisionName(c.precision), " runs on the cpu backend");
  }
  const Fp8Operands want = Fp8OperandsOf(c.precision);
  if (q.weight.has_value() && fp8_input != fp8_weight) {
    return refuse("the input is ", DTypeName(q.input), " and the weight ", DTypeName(*q.weight),
                  ": both operands FP8 (with their scales) or both wide (quantised by the "
                  "configuration's recipe)");
  }
  if (fp8_input && q.input != want.input) {
    return refuse(DTypeName(q.input), " inputs are multiplied by ",
                  PrecisionName(PrecisionOfFormats(q.input, fp8_weight ? *q.weight : want.weight)),
                  ", not ", PrecisionName(c.precision));
  }
  if (fp8_weight && *q.weight != want.weight) {
    return refuse(DTypeName(*q.weight), " weights are multiplied by ",
                  PrecisionName(PrecisionOfFormats(want.input, *q.weight)), ", not ",
                  PrecisionName(c.precision));
  }

  // cublasLtMatmul's FP8 type table.
  if (want.input == DType::kFloat8E5M2 && want.weight == DType::kFloat8E5M2) {
    return refuse(
        "cuBLASLt has no FP8 GEMM with both operands float8_e5m2 (cublasLtMatmul's FP8 type "
        "table pairs E4M3 x E4M3, E4M3 x E5M2 and E5M2 x E4M3 only); the cpu backend runs "
        "fp8e5m2");
  }

  const bool block = c.scaling == Fp8Scaling::kBlock128;
  if (block && c.fast_accum) {
    return refuse(
        "scaling=block128 with fast_accum: the cuBLAS documentation does not say what "
        "CUBLASLT_MATMUL_DESC_FAST_ACCUM does with block scales (torch._scaled_mm refuses the "
        "pair); the cpu backend runs DeepGEMM's accumulation for it");
  }

  // The device: the scaling modes' compute capabilities.
  if (q.device.has_value()) {
    const ComputeCapability cc = *q.device;
    const std::string has = absl::StrCat(cc.major, ".", cc.minor);
    if (cc.major < 8 || (cc.major == 8 && cc.minor < 9)) {
      return refuse(
          "FP8 GEMMs need compute capability 8.9 or newer (cuBLASLt's tensorwide FP8 scaling, "
          "CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F: Ada, Hopper and later); this device is ",
          has);
    }
    if (block && cc.major != 9) {
      return refuse(
          "scaling=block128 needs cuBLASLt's block scaling (CUBLASLT_MATMUL_MATRIX_SCALE_"
          "BLK128x128_32F for the weight, VEC128_32F for the input), which cuBLAS provides for "
          "compute capability 9.0 only; this device is ",
          has, " (the cpu backend runs it)");
    }
    if (c.scaling == Fp8Scaling::kRow && cc.major != 9) {
      return refuse(
          "scaling=row needs cuBLASLt's outer-vector scaling "
          "(CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F), which the cuBLAS documentation lists "
          "for compute capability 9.0 only; this device is ",
          has, " (scaling=tensor runs here)");
    }
  }

  Fp8Gemm gemm;
  gemm.a = want.weight;
  gemm.b = want.input;
  gemm.scale_mode = block                           ? Fp8ScaleMode::kBlock128
                    : c.scaling == Fp8Scaling::kRow ? Fp8ScaleMode::kOuterVector
                                                    : Fp8ScaleMode::kTensor;
  gemm.quantise_input = !fp8_input;
  gemm.quantise_weight = q.weight.has_value() ? !fp8_weight : !fp8_input;
  if (!q.layer.has_value()) return gemm;

  // The layer: layout, dimensions, D and the bias.
  const Fp8Layer& l = *q.layer;
  if (l.k % 16 != 0) {
    return refuse(
        "cuBLASLt's FP8 kernels need 16-byte aligned matrices (cublasLtMatmul: \"all matrix "
        "dimensions must meet the optimal requirements listed in Tensor Core Usage\"): k = ",
        l.k, " is not a multiple of 16 (A and B hold k one-byte elements per column)");
  }
  if (block && l.k > kFp8BlockSize && l.m % 4 != 0) {
    // VEC128's scales of B are ceil(k/128) columns of m floats, one after
    // the other: each column 16-byte aligned only when m is a multiple of 4.
    return refuse(
        "scaling=block128 gives cuBLASLt the input's scales as ceil(k/128) columns of m floats "
        "(CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, m fastest), each 16-byte aligned only when m "
        "is a multiple of 4; m = ",
        l.m, " (the cpu backend runs it)");
  }
  TC_RETURN_IF_ERROR(ChooseNarrowOutput(l, cfg, "cublasLtMatmul's FP8 type table", &gemm));
  return gemm;
}

absl::Status ChooseNarrowOutput(const Fp8Layer& l, absl::string_view cfg, absl::string_view table,
                                Fp8Gemm* gemm) {
  auto refuse = [&cfg](auto&&... parts) {
    return absl::FailedPreconditionError(absl::StrCat("configuration ", cfg, ": ", parts...));
  };
  if (IsNarrow(l.output_dtype)) {
    return refuse("a narrow output (", DTypeName(l.output_dtype),
                  ") is not written: the service returns wide outputs, and cuBLASLt writes no "
                  "FP8 D with outer-vector or block scaling");
  }
  if (l.bias.has_value() && IsNarrow(*l.bias)) {
    return refuse("a narrow bias (", DTypeName(*l.bias),
                  ") is not added: cuBLASLt's FP8 and FP4 epilogues take a bf16 or fp16 bias");
  }
  // "A must be transposed and B non-transposed (the TN format)" (FP8 on
  // 8.9, 9.0 and 12.x; FP4 everywhere): OUT_IN is TN in the row-major
  // trick (gemm_call.h); an IN_OUT weight is transposed first, on every
  // device alike.
  gemm->transpose_weight = l.layout == WeightLayout::kInOut;
  // D: the output dtype when cuBLASLt writes it, else fp32 (a kernel then
  // rounds D to the output once, as the epilogue would have).
  std::vector<DType> candidates;
  if (IsWideD(l.output_dtype)) candidates.push_back(l.output_dtype);
  if (l.output_dtype != DType::kFloat32) candidates.push_back(DType::kFloat32);
  std::vector<std::string> why;
  for (DType d : candidates) {
    const DType bias_type = BiasTypeFor(d);
    if (l.bias.has_value() && *l.bias != bias_type) {
      why.push_back(absl::StrCat("a ", DTypeName(d), " D takes a ", DTypeName(bias_type),
                                 " bias, and the layer's ", DTypeName(*l.bias),
                                 " bias would be rounded"));
      continue;
    }
    const int64_t row_bytes = l.n * static_cast<int64_t>(ItemSize(d));
    if (row_bytes % 16 != 0) {
      why.push_back(absl::StrCat("a ", DTypeName(d), " D's columns (n = ", l.n, " x ", ItemSize(d),
                                 " bytes) are not a multiple of 16 bytes"));
      continue;
    }
    gemm->d = d;
    gemm->bias = l.bias.has_value() ? std::optional<DType>(bias_type) : std::nullopt;
    return absl::OkStatus();
  }
  return refuse("no D type of ", table,
                " (bf16 D with a bf16 bias, fp16 with fp16, fp32 with bf16; 16-byte aligned) "
                "gives the ",
                DTypeName(l.output_dtype), " output: ", absl::StrJoin(why, "; "));
}

}  // namespace tensorcheck::cuda::internal
