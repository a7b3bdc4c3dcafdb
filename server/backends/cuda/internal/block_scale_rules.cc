#include "server/backends/cuda/internal/block_scale_rules.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace tensorcheck::cuda::internal {

bool InvolvesNarrow(const Config& config, DType input, std::optional<DType> weight) {
  return IsFp8(config.precision) || IsBlockScaled(config.precision) || IsNarrow(input) ||
         (weight.has_value() && IsNarrow(*weight));
}

absl::StatusOr<Fp8Gemm> CheckNarrowGemm(const Fp8Query& q) {
  const bool fp4 = q.input == DType::kFloat4E2M1Fn ||
                   (q.weight.has_value() && *q.weight == DType::kFloat4E2M1Fn);
  if (IsBlockScaled(q.config.precision) || fp4) return CheckBlockScaledGemm(q);
  return CheckFp8Gemm(q);
}

absl::StatusOr<Fp8Gemm> CheckBlockScaledGemm(const Fp8Query& q) {
  const Config& c = q.config;
  const std::string cfg = c.ToString();
  auto refuse = [&cfg](auto&&... parts) {
    return absl::FailedPreconditionError(absl::StrCat("configuration ", cfg, ": ", parts...));
  };
  const bool block_precision = IsBlockScaled(c.precision);
  const bool narrow_input = IsNarrow(q.input);
  const bool narrow_weight = q.weight.has_value() && IsNarrow(*q.weight);
  if (!block_precision && !narrow_input && !narrow_weight) {
    return absl::InvalidArgumentError(
        absl::StrCat("configuration ", cfg, ": no block-scaled precision and no narrow operand"));
  }

  // The backend: only cuBLASLt has scale pointers.
  if (c.backend != "cublaslt") {
    return refuse("the ", c.backend,
                  " backend runs no block-scaled GEMM: cublasGemmEx takes no scale pointers "
                  "(cuBLASLt's CUBLASLT_MATMUL_DESC_A_SCALE_POINTER and B_SCALE_POINTER); the "
                  "cpu backend runs it");
  }
  if (!block_precision) {
    return refuse("the cublaslt backend multiplies ", DTypeName(q.input),
                  " operands only under nvfp4 (cuBLASLt applies their block scales in the "
                  "GEMM); the dequantised layer in ",
                  PrecisionName(c.precision), " runs on the cpu backend");
  }
  const BlockScaledOperands want = BlockScaledOperandsOf(c.precision);
  if (q.weight.has_value() && narrow_input != narrow_weight) {
    return refuse("the input is ", DTypeName(q.input), " and the weight ", DTypeName(*q.weight),
                  ": both operands narrow (with their block scales) or both wide (quantised by "
                  "the configuration's recipe)");
  }
  for (const auto& [dtype, what] :
       {std::pair<std::optional<DType>, const char*>{q.input, "inputs"}, {q.weight, "weights"}}) {
    if (dtype.has_value() && IsNarrow(*dtype) && *dtype != want.values) {
      return refuse(DTypeName(*dtype), " ", what, " are not multiplied by ",
                    PrecisionName(c.precision), " (its operands are ", DTypeName(want.values), ")");
    }
  }

  // cublasLtMatmul's FP8 type table (block-scaled FP8 kernels use it too).
  if (want.values == DType::kFloat8E5M2) {
    return refuse(
        "cuBLASLt has no block-scaled FP8 GEMM with both operands float8_e5m2 (cublasLtMatmul's "
        "FP8 type table pairs E4M3 x E4M3, E4M3 x E5M2 and E5M2 x E4M3 only); the cpu backend "
        "runs mxfp8e5m2");
  }

  // The device: Blackwell's block-scaled tensor cores.
  const bool fp4 = want.values == DType::kFloat4E2M1Fn;
  const char* mode =
      fp4 ? "CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3" : "CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0";
  if (!q.device.has_value()) {
    return refuse(PrecisionName(c.precision), " needs cuBLASLt's block scaling (", mode,
                  ") on a device of compute capability ", kBlockScaledDevice.major, ".",
                  kBlockScaledDevice.minor,
                  " or later, and this host has no device; the cpu backend runs it");
  }
  const ComputeCapability cc = *q.device;
  if (cc.major < kBlockScaledDevice.major) {
    return refuse(PrecisionName(c.precision), " needs cuBLASLt's block scaling (", mode,
                  ", Blackwell's block-scaled tensor cores) on compute capability ",
                  kBlockScaledDevice.major, ".", kBlockScaledDevice.minor,
                  " or later; this device is ", cc.major, ".", cc.minor,
                  " (the cpu backend runs it)");
  }

  Fp8Gemm gemm;
  gemm.a = want.values;
  gemm.b = want.values;
  gemm.scale_mode = fp4 ? Fp8ScaleMode::kNvVec16 : Fp8ScaleMode::kMxVec32;
  gemm.global_scales = fp4;
  gemm.quantise_input = !narrow_input;
  gemm.quantise_weight = q.weight.has_value() ? !narrow_weight : !narrow_input;
  if (!q.layer.has_value()) return gemm;

  const Fp8Layer& l = *q.layer;
  if (l.k % want.block != 0) {
    return refuse("cuBLASLt's ", mode, " scales whole ", want.block,
                  "-element blocks of k (one scale per block in the innermost dimension); k = ",
                  l.k, " is not a multiple of ", want.block, " (the cpu backend runs it)");
  }
  if (fp4 && l.k % 32 != 0) {
    return refuse(
        "cuBLASLt's FP4 kernels need 16-byte aligned matrices (cublasLtMatmul: \"all matrix "
        "dimensions must meet the optimal requirements listed in Tensor Core Usage\"): k = ",
        l.k, " FP4 elements are ", l.k / 2, " bytes, not a multiple of 16");
  }
  TC_RETURN_IF_ERROR(ChooseNarrowOutput(
      l, cfg, fp4 ? "cublasLtMatmul's FP4 type table" : "cublasLtMatmul's FP8 type table", &gemm));
  return gemm;
}

}  // namespace tensorcheck::cuda::internal
