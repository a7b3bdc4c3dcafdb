#include "server/backends/cuda/internal/gemm_plan.h"

namespace tensorcheck::cuda::internal {
namespace {

bool Is16Bit(DType d) { return d == DType::kFloat16 || d == DType::kBFloat16; }

// A plan without FP8.
Plan Wide(DType ab, cublasComputeType_t compute, cudaDataType_t scale, DType d) {
  Plan plan;
  plan.ab = ab;
  plan.compute = compute;
  plan.scale = scale;
  plan.d = d;
  return plan;
}

}  // namespace

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
    case DType::kFloat8E4M3Fn:
      return CUDA_R_8F_E4M3;
    case DType::kFloat8E5M2:
      return CUDA_R_8F_E5M2;
    case DType::kFloat4E2M1Fn:
      return CUDA_R_4F_E2M1;
    case DType::kFloat8E8M0Fnu:
      return CUDA_R_8F_UE8M0;
  }
  return CUDA_R_32F;
}

bool ConvertsExactly(DType from, DType to) {
  if (from == to || to == DType::kFloat64) return true;
  return to == DType::kFloat32 && Is16Bit(from);
}

ActKind ToActKind(Activation a) {
  return a == Activation::kRelu       ? ActKind::kRelu
         : a == Activation::kGeluTanh ? ActKind::kGeluTanh
                                      : ActKind::kNone;
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
    case CUBLAS_COMPUTE_32F_EMULATED_16BFX9:
      return "CUBLAS_COMPUTE_32F_EMULATED_16BFX9";
    default:
      return "CUBLAS_COMPUTE_?";
  }
}

Plan MakePlan(Precision p, DType x, DType w, DType out, std::optional<DType> epilogue_bias) {
  Plan plan;
  // D may be the 16-bit A/B type when the output is that type and the
  // epilogue's bias (which then has D's type) converts exactly.
  auto d_for_16bit = [&](DType ab) {
    const bool bias_ok = !epilogue_bias.has_value() || ConvertsExactly(*epilogue_bias, ab);
    return (out == ab && bias_ok) ? ab : DType::kFloat32;
  };
  switch (p) {
    case Precision::kFp64:
      plan = Wide(DType::kFloat64, CUBLAS_COMPUTE_64F, CUDA_R_64F, DType::kFloat64);
      break;
    case Precision::kFp32:
      if (x == w && Is16Bit(x)) {
        plan = Wide(x, CUBLAS_COMPUTE_32F, CUDA_R_32F, d_for_16bit(x));
      } else {
        plan = Wide(DType::kFloat32, CUBLAS_COMPUTE_32F_PEDANTIC, CUDA_R_32F, DType::kFloat32);
      }
      break;
    case Precision::kTf32:
    case Precision::kTf32Rna:
    case Precision::kTf32Trunc:
      plan = Wide(DType::kFloat32, CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F, DType::kFloat32);
      break;
    case Precision::kBf16:
      plan = Wide(DType::kBFloat16, CUBLAS_COMPUTE_32F, CUDA_R_32F, d_for_16bit(DType::kBFloat16));
      break;
    case Precision::kFp16:
      plan = Wide(DType::kFloat16, CUBLAS_COMPUTE_32F, CUDA_R_32F, d_for_16bit(DType::kFloat16));
      break;
    case Precision::kFp16Acc:
      plan = Wide(DType::kFloat16, CUBLAS_COMPUTE_16F, CUDA_R_16F, DType::kFloat16);
      break;
    case Precision::kFp8E4M3:
    case Precision::kFp8E5M2:
    case Precision::kFp8E4M3E5M2:
    case Precision::kFp8E5M2E4M3:
    case Precision::kMxFp8E4M3:
    case Precision::kMxFp8E5M2:
    case Precision::kNvFp4:
      // MakeFp8Plan, from the FP8 or block-scale rules' answer.
      plan = Wide(DType::kFloat32, CUBLAS_COMPUTE_32F, CUDA_R_32F, DType::kFloat32);
      break;
    case Precision::kBf16x3:
    case Precision::kBf16x6:
    case Precision::kBf16x9:
    case Precision::kTf32x3:
      // MakeMultiPassPlan, from the multi-pass rules' answer; a
      // strict-fp32 plan keeps the switch whole.
      plan = Wide(DType::kFloat32, CUBLAS_COMPUTE_32F_PEDANTIC, CUDA_R_32F, DType::kFloat32);
      break;
  }
  return plan;
}

Plan MakeMultiPassPlan(const MultiPassGemm& gemm) {
  // Every GEMM writes fp32: the partials are summed (or, for cuBLAS's own
  // BF16x9, the result rounded) by kernels afterwards.
  const cublasComputeType_t compute =
      gemm.compute == PartCompute::k32FFastTf32         ? CUBLAS_COMPUTE_32F_FAST_TF32
      : gemm.compute == PartCompute::k32FEmulated16BFx9 ? CUBLAS_COMPUTE_32F_EMULATED_16BFX9
                                                        : CUBLAS_COMPUTE_32F;
  return Wide(gemm.part, compute, CUDA_R_32F, DType::kFloat32);
}

Plan MakeFp8Plan(const Fp8Gemm& gemm) {
  // "The compute type must be CUBLAS_COMPUTE_32F. The scale type must be
  // CUDA_R_32F." (cublasLtMatmul, FP8 and FP4)
  Plan plan = Wide(gemm.b, CUBLAS_COMPUTE_32F, CUDA_R_32F, gemm.d);
  plan.fp8 = gemm;
  return plan;
}

}  // namespace tensorcheck::cuda::internal
