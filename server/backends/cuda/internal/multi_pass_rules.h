// How the CUDA backends run the multi-pass precisions (bf16x3, bf16x6,
// bf16x9, tf32x3; docs/numerics.md, "Multi-pass precisions"), and which
// device runs what, in one pure host function (internal to this folder; no
// CUDA here, so the host test checks every rule in a build without CUDA
// too).
//
//   MultiPassQuery q;
//   q.config = config;                       // cublaslt:bf16x3:fused
//   q.device = ComputeCapability{9, 0};
//   TC_ASSIGN_OR_RETURN(MultiPassGemm g, CheckMultiPass(q));
//   // g.method == MultiPassMethod::kPartialGemms, g.part == kBFloat16,
//   // g.compute == PartCompute::k32F, g.scheme.products.size() == 3
//
// Two ways, one per backend:
//   - `cublaslt`: XLA's passes, exactly as the CPU emulation defines them:
//     each fp32 operand split on the device (core/multi_pass_split.h, the
//     CPU's code), one cublasLtMatmul per partial product (bf16 parts:
//     CUDA_R_16BF with CUBLAS_COMPUTE_32F; TF32 parts: fp32 with
//     CUBLAS_COMPUTE_32F_FAST_TF32, the parts being TF32 values already),
//     fp32 D, the partials summed by a kernel in the scheme's order with
//     XLA's NaN guard before high x high, then the bias, activation and
//     output rounding by kernels. Any device the backend runs on (compute
//     capability 8.0 or later: bf16 and TF32 tensor cores).
//   - `cublas`: cuBLAS's own BF16x9 emulation, bf16x9 only: one
//     cublasGemmEx with CUBLAS_COMPUTE_32F_EMULATED_16BFX9 (cublas_api.h:
//     "float - emulated, converts inputs into 3xBF16 values") under
//     CUBLAS_EMULATION_STRATEGY_EAGER ("use emulation whenever possible";
//     the default, PERFORMANT, may run plain fp32 instead). How cuBLAS
//     splits and in which order it sums is not documented: its bits are
//     cuBLAS's, not XLA's. NVIDIA documents the FP32 emulation for
//     Blackwell's BF16 tensor cores (cuBLAS 12.9 release blog), so the rule
//     is compute capability 10.0 or later; earlier devices are refused
//     naming it (where cuBLAS does not emulate, the strategies' wording
//     suggests plain fp32, which would be the wrong name for the output).
//
// Thread-safe (pure). Errors: FAILED_PRECONDITION naming the configuration
// and the rule; INVALID_ARGUMENT for a precision that is not multi-pass or a
// backend other than the two.
#pragma once

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "core/dtype.h"
#include "core/linear_config.h"
#include "server/backends/cuda/internal/fp8_rules.h"

namespace tensorcheck::cuda::internal {

enum class MultiPassMethod {
  kPartialGemms,          // cublaslt: XLA's partial GEMMs, summed by a kernel
  kCublasEmulatedBf16x9,  // cublas: CUBLAS_COMPUTE_32F_EMULATED_16BFX9
};

// The compute type of each GEMM, without CUDA's enum (gemm_plan.cc maps it).
enum class PartCompute {
  k32F,                // CUBLAS_COMPUTE_32F (bf16 parts)
  k32FFastTf32,        // CUBLAS_COMPUTE_32F_FAST_TF32 (TF32 parts)
  k32FEmulated16BFx9,  // CUBLAS_COMPUTE_32F_EMULATED_16BFX9 (fp32 operands)
};

// The earliest compute capability of cuBLAS's BF16x9 emulation.
inline constexpr ComputeCapability kEmulatedBf16x9Device{10, 0};

struct MultiPassQuery {
  Config config;                            // backend and precision; its name in messages
  std::optional<ComputeCapability> device;  // nullopt: not checked (no device)
};

// How a multi-pass configuration runs, when the rules allow it.
struct MultiPassGemm {
  MultiPassMethod method = MultiPassMethod::kPartialGemms;
  // kPartialGemms: the split and the partial products in summation order
  // (MultiPassSchemeOf); kCublasEmulatedBf16x9: unused.
  MultiPassScheme scheme;
  // The GEMMs' A and B on the device: bf16 parts, TF32 parts held as fp32,
  // or (cuBLAS's emulation) the fp32 operands.
  DType part = DType::kBFloat16;
  PartCompute compute = PartCompute::k32F;
};

absl::StatusOr<MultiPassGemm> CheckMultiPass(const MultiPassQuery& query);

// "CUBLAS_COMPUTE_32F", "CUBLAS_COMPUTE_32F_FAST_TF32",
// "CUBLAS_COMPUTE_32F_EMULATED_16BFX9".
const char* PartComputeName(PartCompute c);

}  // namespace tensorcheck::cuda::internal
