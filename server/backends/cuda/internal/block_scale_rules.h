// The rules of the block-scaled precisions (mxfp8e4m3, mxfp8e5m2, nvfp4;
// docs/numerics.md, "MXFP8 and NVFP4") on the CUDA backends, in one pure
// host function (internal to this folder; no CUDA here, so the host test
// checks every rule in a build without CUDA too), and the one entry that
// asks the right narrow rules for any configuration (CheckNarrowGemm).
//
//   Fp8Query q;
//   q.config = config;                       // cublaslt:nvfp4:fused
//   q.input = DType::kBFloat16;              // wide: quantised by the recipe
//   q.layer = Fp8Layer{shape, std::nullopt};
//   q.device = ComputeCapability{10, 0};
//   TC_ASSIGN_OR_RETURN(Fp8Gemm gemm, CheckNarrowGemm(q));
//   // gemm.a == gemm.b == kFloat4E2M1Fn, gemm.scale_mode == kNvVec16,
//   // gemm.global_scales, gemm.quantise_input, ...
//
// Where the rules come from (cuBLAS 13 documentation, "cublasLtMatmul()":
// "To use tensor- or block-scaled FP8 kernels" and "To use block-scaled
// FP4 kernels", their type tables; cublasLt.h, cublasLtMatmulMatrixScale_t;
// NVIDIA's CUDALibrarySamples LtMxfp8Matmul and LtNvfp4Matmul):
//   - MXFP8: A and B CUDA_R_8F_E4M3 or CUDA_R_8F_E5M2 with
//     CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0 ("a dedicated scaling factor
//     ... for each 32-element block in the innermost dimension"); the FP8
//     type table has no E5M2 x E5M2 row, so mxfp8e5m2 is refused.
//   - NVFP4: A and B CUDA_R_4F_E2M1 with
//     CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3 (16-element blocks, UE4M3
//     scales); the per-tensor scales are alpha = fl32(gx * gw), as the CPU
//     backend applies them.
//   - Both: "TN" (A transposed, B not), CUBLAS_COMPUTE_32F, CUDA_R_32F
//     scale type, 16-byte aligned dimensions (k one-byte elements for
//     MXFP8, k / 2 bytes for NVFP4: k a multiple of 32), whole blocks along
//     k, the scales in the swizzled "1D Block Scaling Factors Layout"
//     (core/mx_formats.h), D and bias as the FP8 table (bf16 D with a bf16
//     bias, fp16 with fp16, fp32 with bf16).
//   - The Blackwell tensor cores' block-scaled MMA (compute capability 10.0
//     or later). Without a device, or on an earlier one, the configurations
//     are refused naming this rule, so the CPU emulation runs them.
//   - `cublas` (cublasGemmEx) takes no scale pointers: refused.
//
// Thread-safe (pure). Errors: FAILED_PRECONDITION naming the configuration
// and the rule; INVALID_ARGUMENT when asked about a configuration with no
// narrow precision or operand.
#pragma once

#include "absl/status/statusor.h"
#include "core/linear_config.h"
#include "server/backends/cuda/internal/fp8_rules.h"

namespace tensorcheck::cuda::internal {

// The earliest compute capability of cuBLASLt's MXFP8 and NVFP4 kernels.
inline constexpr ComputeCapability kBlockScaledDevice{10, 0};

// The rules for a configuration with a block-scaled precision, or with
// float4_e2m1fn operands. OK: how it runs (with the layer unknown, d and
// bias as CheckFp8Gemm says). `query.device` nullopt means no device here,
// which refuses.
absl::StatusOr<Fp8Gemm> CheckBlockScaledGemm(const Fp8Query& query);

// Whether a configuration on operands stored as `input` / `weight` needs
// the narrow rules: an fp8 or block-scaled precision, or an FP8 or FP4
// operand.
bool InvolvesNarrow(const Config& config, DType input, std::optional<DType> weight);

// CheckBlockScaledGemm for a block-scaled precision or FP4 operands,
// CheckFp8Gemm for the rest.
absl::StatusOr<Fp8Gemm> CheckNarrowGemm(const Fp8Query& query);

}  // namespace tensorcheck::cuda::internal
