// How the CUDA backends run split-K configurations
// (`cublaslt:bf16:fused@splitk=4,reduce=output`; docs/numerics.md,
// "Split-K"), in pure host functions (internal to this folder; no CUDA
// here, so the host test checks every rule in a build without CUDA too).
//
//   SplitKQuery q;
//   q.config = config;                   // cublaslt:bf16:fused@splitk=4,reduce=output
//   q.layer = SplitKLayer{/*d=*/DType::kBFloat16, /*out=*/DType::kBFloat16};
//   TC_ASSIGN_OR_RETURN(std::optional<SplitKGemm> split, CheckSplitK(q));
//   // split->splitk == 4, split->scheme == LtReductionScheme::kOutputType
//
// `cublaslt` takes the heuristic's algorithms for the problem and, on each
// whose capabilities allow it (CUBLASLT_ALGO_CAP_SPLITK_SUPPORT and
// CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK: AlgoTakesSplitK), sets
// CUBLASLT_ALGO_CONFIG_SPLITK_NUM to the count and
// CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME to the scheme; cublasLtMatmulAlgoCheck
// then has the last word, and the workspace must hold what it needs
// (WorkspaceFits). The schemes (cublasLt.h, cublasLtReductionScheme_t):
//   - reduce=output: OUTPUT_TYPE, "intermediate results are stored in
//     output type in the workspace and reduced in a separate step": what
//     PyTorch's allow_fp16/bf16_reduced_precision_reduction permit. The
//     output type is D's, so the rule asks that D be the layer's output
//     (gemm_plan.h: a 16-bit D needs the output in the A/B type and a bias
//     that converts to it exactly); otherwise cuBLASLt would reduce in fp32
//     and the name would be wrong.
//   - reduce=fp32: COMPUTE_TYPE, "stored in compute type in the workspace
//     and reduced in a separate step" (CUBLAS_COMPUTE_32F: fp32). Not
//     INPLACE: that one adds the partials "using the output buffer (and
//     output data type)", a reduction in bf16/fp16 when D is 16-bit, and
//     the request's disallow_reduced_precision_reduction excludes it too
//     (lt_matmul.cc's preference mask is NONE | COMPUTE_TYPE).
// `cublas` (cublasGemmEx) takes no split count: its split is cuBLAS's own
// choice (CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION only keeps its
// reduction in the compute type), so a split-K configuration is refused
// there naming cublaslt.
//
// Thread-safe (pure). Errors: FAILED_PRECONDITION naming the configuration
// and the rule; "no algorithm" refusals carry the NoKernel mark
// (core/status_macros.h), so that a default candidate goes to the CPU
// emulation instead.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/dtype.h"
#include "core/linear_config.h"

namespace tensorcheck::cuda::internal {

// cublasLtReductionScheme_t's values (lt_matmul.cc checks that they match).
enum class LtReductionScheme : uint32_t {
  kNone = 0,
  kInplace = 1,
  kComputeType = 2,
  kOutputType = 4,
};

// "CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE" and so on.
const char* LtReductionSchemeName(LtReductionScheme s);

// What the rules need of the layer: D's type (gemm_plan.h's Plan::d) and the
// layer's output dtype.
struct SplitKLayer {
  DType d = DType::kFloat32;
  DType out = DType::kFloat32;
};

struct SplitKQuery {
  Config config;
  // Unset: without a layer (a host's list of configurations).
  std::optional<SplitKLayer> layer;
  // The request's RunOptions::disallow_reduced_precision_reduction (false
  // where no request is known: Supports and Prepare).
  bool disallow_reduced_precision_reduction = false;
};

// What cuBLASLt's algorithm is given.
struct SplitKGemm {
  int splitk = 0;  // CUBLASLT_ALGO_CONFIG_SPLITK_NUM
  LtReductionScheme scheme = LtReductionScheme::kComputeType;
};

// The split a configuration asks of cuBLASLt, or nullopt when it asks none
// (splitk 0). FAILED_PRECONDITION naming the rule: split-K on a precision
// other than bf16/fp16 or outside 2..kMaxSplitK, on a backend other than
// cublaslt, reduce=output under disallow_reduced_precision_reduction, or
// reduce=output with a D that is not the layer's output.
absl::StatusOr<std::optional<SplitKGemm>> CheckSplitK(const SplitKQuery& q);

// An algorithm's capabilities as cublasLtMatmulAlgoCapGetAttribute tells
// them.
struct LtAlgoCaps {
  int32_t splitk_support = 0;          // CUBLASLT_ALGO_CAP_SPLITK_SUPPORT
  uint32_t reduction_scheme_mask = 0;  // CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK
};

// Why an algorithm is passed over for the split, or OK.
enum class SplitKMiss {
  kNone,         // it may take the split: cublasLtMatmulAlgoCheck decides
  kNoSplitK,     // CUBLASLT_ALGO_CAP_SPLITK_SUPPORT 0
  kNoScheme,     // the scheme is not in its mask
  kCheckFailed,  // cublasLtMatmulAlgoCheck refused the configured algorithm
  kNoWorkspace,  // it needs more workspace than the limit
};

// Whether an algorithm with `caps` may run `split` (kNone), or why not.
SplitKMiss AlgoTakesSplitK(const LtAlgoCaps& caps, const SplitKGemm& split);

// Whether `needed` bytes of workspace fit the `limit` (kNone), or
// kNoWorkspace.
SplitKMiss WorkspaceFits(uint64_t needed, uint64_t limit);

// The algorithms passed over, by reason, for the refusal's message.
struct SplitKTally {
  int tried = 0;
  std::map<SplitKMiss, int> missed;
  uint64_t largest_workspace_needed = 0;  // of those passed over for it

  void Count(SplitKMiss miss) {
    ++tried;
    if (miss != SplitKMiss::kNone) ++missed[miss];
  }
};

// FAILED_PRECONDITION, with the NoKernel mark: no algorithm runs `split`
// for the problem `problem` (as "m=.. n=.. k=.." and the types), with what
// was tried and why each was passed over, the workspace `limit` and the
// device.
absl::Status NoSplitKAlgorithm(absl::string_view cfg, const SplitKGemm& split,
                               const SplitKTally& tally, absl::string_view problem, uint64_t limit,
                               absl::string_view device_name);

// RunResult::details of a split-K run: "split_k" (the count and the
// scheme, in cuBLASLt's words) and "config" (the canonical configuration).
void DescribeSplitK(const Config& config, const SplitKGemm& split,
                    std::map<std::string, std::string>* details);

// The `cublas` backend's reduction in the same terms, for its details:
// cuBLAS chooses whether and how to split K; with `disallow` (the math mode
// CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION) its partials are
// reduced in the compute type only.
std::string CublasReduction(bool disallow);

}  // namespace tensorcheck::cuda::internal
