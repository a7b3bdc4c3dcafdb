// The GEMM call of the `cublaslt` and `cublas` backends (internal to this
// folder). Prepared once per request, after the operands are on the device
// (cuBLASLt: descriptors, preference and the heuristic's algorithm;
// cuBLAS: the math mode), it runs the layer into an output array as often
// as the request repeats: the GEMM, the rounding of D to the output dtype
// where they differ, and what the flavour adds (cuBLASLt's epilogue, or
// cuBLAS's bias and activation kernels).
//
//   TC_ASSIGN_OR_RETURN(std::unique_ptr<GemmCall> gemm,
//                       PrepareLtMatmul(operands, ctx, options, cfg, device_name, &details));
//   for (int r = 0; r < repeat; ++r) TC_RETURN_IF_ERROR(gemm->Run(outputs[r]));
//
// Row-major trick: y[m, n] row-major is y^T[n, m] column-major, and
// y^T = W x^T. So cuBLAS sees A = W (OUT_IN [n, k] row-major is a k x n
// column-major matrix, transposed; IN_OUT [k, n] row-major is n x k
// column-major, not transposed), B = x^T (k x m column-major, ld k), and
// D = y^T (n x m column-major, ld n). The bias is then a vector over D's
// rows, which is what the cuBLASLt BIAS epilogue adds.
//
// Algorithms (`algo=N`, LinearBackend::Algorithms): entry N of the list is
// what `algo=N` runs, entry 0 what runs when no algorithm is named. Each
// cuBLASLt entry's details, and the run's, carry the CPU configuration that
// replays its kernel ("replay", or "replay_unavailable" with the reason;
// replay_rules.h) when operands.replay is set.
// cuBLASLt's list is its heuristic's answer for the very descriptors the
// run builds (cublasLtMatmulAlgoGetHeuristic, in its order of estimated
// time); cuBLAS's is CUBLAS_GEMM_DEFAULT, then CUBLAS_GEMM_ALGO0..ALGO23.
// A split-K configuration's list (operands.split) is the heuristic's
// entries that take the split, each with CUBLASLT_ALGO_CONFIG_SPLITK_NUM
// and _REDUCTION_SCHEME set and passed by cublasLtMatmulAlgoCheck within
// the workspace, in the heuristic's order; when none does, the algorithm
// ids cuBLASLt has for the types (cublasLtMatmulAlgoGetIds), each with the
// first tile and stages that pass (splitk_rules.h).
//
//   TC_ASSIGN_OR_RETURN(std::vector<AlgorithmInfo> algos,
//                       LtAlgorithms(operands, ctx, options, /*limit=*/8, cfg, device_name));
//
// Errors: a cuBLAS(Lt) or launch error as its Status (cuda_status.h);
// FAILED_PRECONDITION when cuBLASLt has no algorithm for the problem (or
// none that takes the split) or `algo` is past the list. Call on the
// request's lane, as the rest of a request; a GemmCall must not outlive the
// request's device memory.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/dtype.h"
#include "core/linear_config.h"
#include "server/backends/cuda/cuda_context.h"
#include "server/backends/cuda/internal/gemm_plan.h"
#include "server/backends/cuda/internal/replay_rules.h"
#include "server/backends/cuda/internal/splitk_rules.h"
#include "server/backends/linear_backend.h"

namespace tensorcheck::cuda::internal {

// RunResult::details: what the call reports (algorithm, math mode, ...).
using Details = std::map<std::string, std::string>;

// What one request's GEMM reads and writes, on the device. For a query of
// the algorithms only, the pointers may be placeholders: the heuristic
// reads their alignment, never what they point at (cublasLt.h,
// CUBLASLT_MATMUL_DESC_BIAS_POINTER).
struct GemmOperands {
  Plan plan;
  int64_t m = 0, n = 0, k = 0;
  bool a_transposed = false;  // W stored OUT_IN, [n, k] row-major
  const void* w = nullptr;    // A: the weight in plan.a()
  const void* x = nullptr;    // B: the input in plan.b()
  // D's own array when D's type is not the output dtype (a kernel then
  // rounds it to the output); nullptr: the GEMM writes the output.
  void* d = nullptr;
  DType out = DType::kFloat32;
  const void* bias = nullptr;  // nullptr without a bias
  DType bias_type = DType::kFloat32;
  Activation activation = Activation::kNone;
  cudaStream_t stream = nullptr;
  // FP8 and block-scaled (plan.fp8): the dequantisation scales on the
  // device, in the layout of plan.fp8->scale_mode (block_scale_layout.h's
  // LtScaleSpecOf): the weight's (cuBLASLt's A scale) and the input's (B),
  // CUBLASLT_MATMUL_DESC_FAST_ACCUM, and alpha (NVFP4: fl32(gx * gw)).
  const void* w_scale = nullptr;
  const void* x_scale = nullptr;
  bool fast_accum = false;
  float alpha = 1.0f;
  // The configuration's `algo=N`; unset: the library's first choice.
  std::optional<int> algo;
  // cuBLASLt only: the split-K count and reduction scheme the algorithm is
  // given (splitk_rules.h's CheckSplitK); unset: the heuristic's own.
  std::optional<SplitKGemm> split;
  // cuBLASLt only: the run whose kernels a CPU replays (replay_rules.h),
  // for the "replay" detail of each algorithm described; unset: none
  // described (the multi-pass precisions' partial GEMMs).
  std::optional<ReplayRun> replay;
};

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

// One run of the layer, prepared.
class GemmCall {
 public:
  virtual ~GemmCall() = default;

  // Enqueues one run of the layer on the operands' stream; `dst` receives
  // m*n elements of the output dtype.
  virtual absl::Status Run(char* dst) = 0;
};

// cuBLASLt (`cublaslt`): the bias and activation in the matmul epilogue,
// with the heuristic's algorithm operands.algo (0 when unset). `cfg` and
// `device_name` go into the "no algorithm" and out-of-range messages.
absl::StatusOr<std::unique_ptr<GemmCall>> PrepareLtMatmul(
    const GemmOperands& operands, CudaContext& ctx, const RunOptions& options,
    absl::string_view cfg, absl::string_view device_name, Details* details);

// Every descriptor PrepareLtMatmul builds for `operands` (the operation
// with its epilogue, bias and FP8 attributes, the three layouts, the
// preference), built and destroyed without a handle or a device: each
// attribute call's status, so that a host can check that the installed
// libcublasLt accepts what the backend sets (cuda_backends_test).
absl::Status BuildLtDescriptors(const GemmOperands& operands, uint64_t workspace_limit,
                                const RunOptions& options, Details* details);

// The heuristic's algorithms for `operands` (at most `limit`, and at most
// kMaxLtAlgorithms), without running any: index and details as
// PrepareLtMatmul reports the one it runs.
inline constexpr int kMaxLtAlgorithms = 64;
absl::StatusOr<std::vector<AlgorithmInfo>> LtAlgorithms(const GemmOperands& operands,
                                                        CudaContext& ctx, const RunOptions& options,
                                                        int limit, absl::string_view cfg,
                                                        absl::string_view device_name);

// cuBLAS (`cublas`): cublasGemmEx with the algorithm operands.algo of
// CublasAlgorithms' list, then the bias and the activation by a kernel
// each, each rounding to the output dtype. With
// CUBLAS_COMPUTE_32F_EMULATED_16BFX9 (bf16x9) the handle's emulation
// strategy is CUBLAS_EMULATION_STRATEGY_EAGER for the request, else the
// default.
absl::StatusOr<std::unique_ptr<GemmCall>> PrepareCublasGemm(const GemmOperands& operands,
                                                            CudaContext& ctx,
                                                            const RunOptions& options,
                                                            absl::string_view cfg,
                                                            Details* details);

// A multi-pass precision's partial GEMMs on cuBLASLt (`cublaslt`,
// internal/multi_pass_rules.h), summed as the CPU emulation defines them.
// `part` is one partial GEMM's shape, types (MakeMultiPassPlan: fp32 D) and
// algorithm, its pointers unused; the parts are on the device already.
struct MultiPassOperands {
  GemmOperands part;
  MultiPassScheme scheme;
  // The parts of x and W, highest first (scheme.parts each), in the plan's
  // A/B type.
  std::vector<const void*> x_parts, w_parts;
  // Two fp32 arrays of m*n: the running sum and the partial being added.
  float* sum = nullptr;
  float* partial = nullptr;
  // The epilogue, by kernels: the bias as stored (nullptr without one), the
  // activation and the output dtype. The bias mode is fused (or none), as
  // for every cublaslt configuration.
  const void* bias = nullptr;
  DType bias_type = DType::kFloat32;
  Activation activation = Activation::kNone;
  DType out = DType::kFloat32;
};

// One cublasLtMatmul per partial product, each into fp32 with no epilogue
// (the heuristic's entry operands.part.algo for every one: they share the
// descriptors), the partials summed in the scheme's order by a kernel with
// the NaN guard before high x high (core/multi_pass_split.h's AddPartial),
// then the bias added to the fp32 sum, the activation in fp32 and one
// rounding to the output dtype: round_out(act(acc + b)), the CPU backend's
// fused epilogue (multi_pass_call.cc says why not cuBLASLt's).
absl::StatusOr<std::unique_ptr<GemmCall>> PrepareLtMultiPass(
    const MultiPassOperands& operands, CudaContext& ctx, const RunOptions& options,
    absl::string_view cfg, absl::string_view device_name, Details* details);

// cublasGemmEx's algorithms (at most `limit`): CUBLAS_GEMM_DEFAULT, then
// CUBLAS_GEMM_ALGO0..ALGO23; the same for every problem.
std::vector<AlgorithmInfo> CublasAlgorithms(int limit);

}  // namespace tensorcheck::cuda::internal
