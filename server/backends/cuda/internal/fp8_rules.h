// The rules an FP8 configuration of the CUDA backends must satisfy, in one
// pure host function (internal to this folder; no CUDA here, so the host
// test checks every rule in a build without CUDA too). What it answers is
// also how the FP8 GEMM runs: the cuBLASLt types, the scale mode, whether
// the weight is transposed first and whether the operands are quantised.
//
//   Fp8Query q;
//   q.config = config;                       // cublaslt:fp8e4m3:fused@scaling=row
//   q.input = DType::kBFloat16;              // wide: quantised by the recipe
//   q.layer = Fp8Layer{LayerShape{m, n, k, WeightLayout::kOutIn, Activation::kNone,
//                                 DType::kBFloat16}, DType::kBFloat16};
//   q.device = ComputeCapability{9, 0};
//   TC_ASSIGN_OR_RETURN(Fp8Gemm gemm, CheckFp8Gemm(q));
//   // gemm.d == kBFloat16, gemm.scale_mode == Fp8ScaleMode::kOuterVector, ...
//
// Where the rules come from (cuBLAS 13 documentation, "cublasLtMatmul()",
// the FP8 requirements and type table, and "Narrow Precision Data Types
// Usage", the scaling-mode table; docs/numerics.md, "FP8"):
//   - "To use tensor- or block-scaled FP8 kernels ...: all matrix
//     dimensions must meet the optimal requirements listed in Tensor Core
//     Usage (i.e. pointers and matrix dimension must support 16-byte
//     alignment)"; "A must be transposed and B non-transposed (The 'TN'
//     format) on Ada (8.9), Hopper (9.0), and Blackwell GeForce (12.x)";
//     "The compute type must be CUBLAS_COMPUTE_32F"; "The scale type must
//     be CUDA_R_32F".
//   - The type table: A x B in {E4M3 x E4M3, E4M3 x E5M2, E5M2 x E4M3} (no
//     E5M2 x E5M2); C = D in {bf16, fp16, fp32} (FP8 D too, which this
//     service never asks for, and not with outer-vector scaling); the bias
//     is bf16 with a bf16 D, fp16 with an fp16 D and bf16 with an fp32 D.
//   - Scaling modes: tensorwide (CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F)
//     on compute capability 8.9+; outer vector
//     (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F, one fp32 scale per row of
//     A and per column of B) on 9.0 only; block-wise (scaling=block128:
//     CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F for A, the weight, and
//     VEC128_32F for B, the input; cuBLAS 12.9's Hopper schemes) on 9.0
//     only. Block-wise scales are laid out as NVIDIA's CUDALibrarySamples
//     size them (cuBLASLt/Common/helpers.h, getScaleTensorSize): VEC128 is
//     ceil(k/128) columns of the operand's outer dimension (m floats each,
//     m fastest), BLK128x128 is ceil(n/128) columns of roundup(ceil(k/128),
//     4) floats (block_scale_layout.h). fast_accum with block scaling is
//     refused: the documentation does not say what the flag does there and
//     torch._scaled_mm refuses the pair ("scaled_gemm doesn't support fast
//     accum with 1x128 blockwise scaling").
//   - cublasGemmEx (the `cublas` backend) takes no scale pointers
//     (CUBLASLT_MATMUL_DESC_A_SCALE_POINTER is a cuBLASLt attribute), so it
//     has no FP8 GEMM.
//
// Thread-safe (pure). Errors: FAILED_PRECONDITION naming the configuration
// and the rule it breaks; INVALID_ARGUMENT when asked about a configuration
// that involves no FP8 at all.
#pragma once

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/dtype.h"
#include "core/layer_shape.h"
#include "core/linear_config.h"

namespace tensorcheck::cuda::internal {

struct ComputeCapability {
  int major = 0;
  int minor = 0;
};

// How the FP8 GEMM's two scales reach cuBLASLt
// (CUBLASLT_MATMUL_DESC_A_SCALE_MODE / B_SCALE_MODE).
enum class Fp8ScaleMode {
  kTensor,       // CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F: one fp32 each
  kOuterVector,  // CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F: n for W, m for x
  // scaling=block128: A (W) CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, B
  // (x) CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F.
  kBlock128,
  // MXFP8 (block_scale_rules.h): CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0,
  // both, swizzled.
  kMxVec32,
  // NVFP4 (block_scale_rules.h): CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3,
  // both, swizzled; the per-tensor scales as alpha.
  kNvVec16,
};

// CUBLASLT_MATMUL_DESC_A_SCALE_MODE's value, by name:
// "CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F", "..._OUTER_VEC_32F",
// "..._BLK128x128_32F", "..._VEC32_UE8M0", "..._VEC16_UE4M3".
const char* Fp8ScaleModeName(Fp8ScaleMode mode);
// CUBLASLT_MATMUL_DESC_B_SCALE_MODE's: as A's but "..._VEC128_32F" for
// kBlock128.
const char* Fp8BScaleModeName(Fp8ScaleMode mode);

// The layer, where it is known (Run knows it; Supports does not): its
// shape (the rules read m, n, k, layout and output_dtype) and the bias's
// dtype.
struct Fp8Layer : LayerShape {
  std::optional<DType> bias;  // nullopt: no bias
};

// What the rules are asked about. Unknown parts (nullopt) are not checked.
struct Fp8Query {
  Config config;                  // backend, precision, scaling, fast_accum; its name in messages
  DType input = DType::kFloat32;  // x as stored (wide: quantised by the recipe)
  std::optional<DType> weight;    // W as stored
  std::optional<Fp8Layer> layer;
  std::optional<ComputeCapability> device;
};

// How an FP8 configuration runs, when the rules allow it.
struct Fp8Gemm {
  // cuBLASLt's A: the weight's FP8 format (NVFP4: float4_e2m1fn, packed).
  DType a = DType::kFloat8E4M3Fn;
  // cuBLASLt's B: the input's FP8 format (NVFP4: float4_e2m1fn, packed).
  DType b = DType::kFloat8E4M3Fn;
  DType d = DType::kBFloat16;  // C and D: what the matmul writes
  // The epilogue's bias type (CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE); nullopt
  // without a bias.
  std::optional<DType> bias;
  Fp8ScaleMode scale_mode = Fp8ScaleMode::kTensor;
  // NVFP4: the operands' per-tensor scales multiply the accumulator as
  // alpha = fl32(gx * gw) (the CPU backend's GlobalScale); alpha 1 otherwise.
  bool global_scales = false;
  // Wide operands are quantised on the host by the configuration's recipe
  // (core/fp8_scaling.h; core/mx_formats.h for MXFP8 and NVFP4), as the
  // CPU backend does.
  bool quantise_input = false;
  bool quantise_weight = false;
  // An IN_OUT weight is transposed to OUT_IN ([n, k]) before the GEMM, so
  // that A is transposed and B not (TN), which every FP8 device takes.
  bool transpose_weight = false;
};

// The rules for a configuration of the `cublaslt` or `cublas` backend that
// involves FP8 (an fp8 precision, or an FP8 input or weight). OK: how it
// runs (with `layer` unknown, d and bias are what an OUT_IN layer with a
// bf16 output and no bias would use).
absl::StatusOr<Fp8Gemm> CheckFp8Gemm(const Fp8Query& query);

// The layer rules both narrow GEMMs share (cublasLtMatmul's FP8 and FP4
// type tables have the same D and bias rows): no FP8 output or bias, the
// weight transposed to TN when IN_OUT, and D the output dtype when
// cuBLASLt writes it with the layer's bias, else fp32 (16-byte aligned).
// Fills gemm->transpose_weight, d and bias; FAILED_PRECONDITION naming
// `cfg` and `table` otherwise. Alignment of k is the caller's.
absl::Status ChooseNarrowOutput(const Fp8Layer& layer, absl::string_view cfg,
                                absl::string_view table, Fp8Gemm* gemm);

}  // namespace tensorcheck::cuda::internal
