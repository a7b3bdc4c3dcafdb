// How one configuration of the `cublaslt` and `cublas` backends runs on the
// device: the type A and B are given in, the compute and scale types, and
// D's type, what the GEMM (and the Lt epilogue) writes (internal to this
// folder; docs/numerics.md).
//
//   const Plan plan = MakePlan(Precision::kBf16, /*x=*/DType::kFloat32, /*w=*/DType::kFloat32,
//                              /*out=*/DType::kBFloat16, /*epilogue_bias=*/std::nullopt);
//   // plan.ab == kBFloat16: x and W rounded on the device; CUBLAS_COMPUTE_32F,
//   // fp32 scale; plan.d == kBFloat16: the GEMM writes the output dtype.
//
// Compute types actually used:
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
//   fp8e4m3    A (W) E4M3, B (x)    32F                 fp32   out dtype if it
//              E4M3                                            is bf16/fp16/fp32
//                                                              and takes the
//                                                              bias, else fp32
//   fp8e4m3e5m2  A E5M2, B E4M3     32F                 fp32   as fp8e4m3
//   fp8e5m2e4m3  A E4M3, B E5M2     32F                 fp32   as fp8e4m3
//   fp8e5m2    (none: cuBLASLt has no E5M2 x E5M2 GEMM; the cpu backend runs it)
//   mxfp8e4m3  A, B E4M3 (VEC32_UE8M0   32F                 fp32   as fp8e4m3
//              scales), cc >= 10.0
//   mxfp8e5m2  (none: no E5M2 x E5M2 row in the FP8 table)
//   nvfp4      A, B E2M1 packed         32F                 fp32   as fp8e4m3;
//              (VEC16_UE4M3 scales),                               alpha the
//              cc >= 10.0                                          global scales
//   bf16x3/x6/x9 (cublaslt) bf16 parts 32F            fp32   fp32, one GEMM per
//                                                              partial product
//   tf32x3     (cublaslt) fp32 (TF32   32F_FAST_TF32       fp32   fp32, likewise
//              parts)
//   bf16x9     (cublas) fp32           32F_EMULATED_16BFX9 fp32   fp32
//
// Multi-pass (internal/multi_pass_rules.h has the rules): cuBLASLt runs
// XLA's partial GEMMs on parts split by a kernel, sums them and applies the
// bias, activation and output rounding by kernels; cuBLAS runs its own
// BF16x9 emulation.
//
// FP8 (cuBLASLt only; internal/fp8_rules.h has every rule and where it is
// written): A is the weight, B the input, each in its precision's format:
// FP8 operands as they come, wide ones quantised on the host by the
// configuration's recipe (QuantizeFp8, as the CPU backend does). A is
// always transposed (TN): an IN_OUT weight is transposed to [n, k] first
// (by the host as it uploads a quantised one, by a device kernel when it
// is stored as FP8). The dequantisation scales go in
// CUBLASLT_MATMUL_DESC_A_SCALE_POINTER (the weight's: 1 or n floats) and
// B_SCALE_POINTER (the input's: 1 or m), per tensor
// (CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F) or row-wise
// (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F, A and B's scale modes);
// CUBLASLT_MATMUL_DESC_FAST_ACCUM follows the configuration's fast_accum.
// scaling=block128 gives A BLK128x128_32F and B VEC128_32F scales, and the
// block-scaled precisions VEC32_UE8M0 / VEC16_UE4M3 (block_scale_rules.h;
// the layouts: block_scale_layout.h).
// The epilogue's bias type is bf16 with a bf16 or fp32 D and fp16 with an
// fp16 D (CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE): D is the output dtype when
// the layer's bias has that type and D's columns are 16-byte aligned, else
// fp32 with a bf16 bias, then rounded to the output by a kernel.
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
// For the Lt epilogue the bias has D's type (cublasLt.h; FP8: above); D
// is widened to fp32 when the bias would not convert to D's type exactly.
// With fp16acc the epilogue runs in fp16 and the bias is rounded to fp16.
#pragma once

#include <cublas_v2.h>
#include <library_types.h>

#include <optional>

#include "core/dtype.h"
#include "core/linear_config.h"
#include "core/tensor.h"
#include "server/backends/cuda/internal/cuda_kernels.h"
#include "server/backends/cuda/internal/fp8_rules.h"
#include "server/backends/cuda/internal/multi_pass_rules.h"

namespace tensorcheck::cuda::internal {

// How one configuration runs on the device.
struct Plan {
  DType ab = DType::kFloat32;  // A and B on the device (FP8: `fp8` has each)
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cudaDataType_t scale = CUDA_R_32F;
  DType d = DType::kFloat32;  // what the GEMM (and Lt epilogue) writes
  // FP8 (cuBLASLt): A's and B's formats, the bias type, the scale mode.
  std::optional<Fp8Gemm> fp8;

  DType a() const { return fp8 ? fp8->a : ab; }  // the weight on the device
  DType b() const { return fp8 ? fp8->b : ab; }  // the input on the device
};

// The plan for a wide precision `p`, inputs stored as `x` and `w`, output
// `out`. `epilogue_bias`: the dtype of the bias the Lt epilogue will add
// (nullopt without one).
Plan MakePlan(Precision p, DType x, DType w, DType out, std::optional<DType> epilogue_bias);

// The plan of one GEMM of a multi-pass configuration whose rules
// (CheckMultiPass) gave `gemm`: A and B in the part type (bf16; TF32 parts
// and cuBLAS's BF16x9 operands in fp32), the rules' compute type, fp32 D.
Plan MakeMultiPassPlan(const MultiPassGemm& gemm);

// The plan of an FP8 configuration whose rules (CheckFp8Gemm) gave `gemm`.
Plan MakeFp8Plan(const Fp8Gemm& gemm);

// Whether every value of `from` is a value of `to`.
bool ConvertsExactly(DType from, DType to);

// cuBLAS's data type of a dtype.
cudaDataType_t ToCudaType(DType d);

// The activation kernel's kind (cuda_kernels.h) of a layer's activation.
ActKind ToActKind(Activation a);

// "CUBLAS_COMPUTE_32F" and so on, for the details and messages.
const char* ComputeName(cublasComputeType_t c);

}  // namespace tensorcheck::cuda::internal
