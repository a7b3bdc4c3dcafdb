#include "server/backends/cuda/internal/splitk_rules.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"

namespace tensorcheck::cuda::internal {
namespace {

absl::Status Refuse(const Config& c, absl::string_view why) {
  return absl::FailedPreconditionError(absl::StrCat("configuration ", c.ToString(), ": ", why));
}

// The configuration on cublaslt: the same split, the bias in the epilogue.
std::string OnCublasLt(const Config& c) {
  Config lt = c;
  lt.backend = "cublaslt";
  if (lt.bias == BiasMode::kUnfused) lt.bias = BiasMode::kFused;
  lt.algo.reset();
  return lt.ToString();
}

const char* MissName(SplitKMiss m) {
  switch (m) {
    case SplitKMiss::kNoSplitK:
      return "without split-K (CUBLASLT_ALGO_CAP_SPLITK_SUPPORT 0)";
    case SplitKMiss::kNoScheme:
      return "without the reduction scheme (CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK)";
    case SplitKMiss::kCheckFailed:
      return "refused by cublasLtMatmulAlgoCheck";
    case SplitKMiss::kNoWorkspace:
      return "needing more workspace than the limit";
    case SplitKMiss::kNone:
      break;
  }
  return "usable";
}

}  // namespace

const char* LtReductionSchemeName(LtReductionScheme s) {
  switch (s) {
    case LtReductionScheme::kNone:
      return "CUBLASLT_REDUCTION_SCHEME_NONE";
    case LtReductionScheme::kInplace:
      return "CUBLASLT_REDUCTION_SCHEME_INPLACE";
    case LtReductionScheme::kComputeType:
      return "CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE";
    case LtReductionScheme::kOutputType:
      return "CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE";
  }
  return "CUBLASLT_REDUCTION_SCHEME_?";
}

absl::StatusOr<std::optional<SplitKGemm>> CheckSplitK(const SplitKQuery& q) {
  const Config& c = q.config;
  if (c.splitk == 0) return std::optional<SplitKGemm>();
  if (!TakesSplitK(c.precision)) {
    return Refuse(c, absl::StrCat("split-K applies to the bf16 and fp16 precisions only, not ",
                                  PrecisionName(c.precision)));
  }
  if (c.splitk < 2 || c.splitk > kMaxSplitK) {
    return Refuse(c, absl::StrCat("splitk=", c.splitk, " is outside 2..", kMaxSplitK));
  }
  if (c.backend == "cublas") {
    return Refuse(c, absl::StrCat("cublasGemmEx takes no split-K count (cuBLAS chooses its own "
                                  "split); ",
                                  OnCublasLt(c),
                                  " sets it on the algorithm (CUBLASLT_ALGO_CONFIG_SPLITK_NUM)"));
  }
  if (c.backend != "cublaslt") {
    return Refuse(c, absl::StrCat("backend '", c.backend,
                                  "' does not run split-K on the CUDA device (cublaslt does)"));
  }
  if (c.reduce == SplitKReduce::kOutput && q.disallow_reduced_precision_reduction) {
    return Refuse(c,
                  "the request's disallow_reduced_precision_reduction forbids reduce=output "
                  "(partial results reduced in the output type); reduce=fp32 keeps them in fp32");
  }
  if (q.layer.has_value() && c.reduce == SplitKReduce::kOutput && q.layer->d != q.layer->out) {
    return Refuse(
        c, absl::StrCat("reduce=output reduces the partial results in D's type, and D is ",
                        DTypeName(q.layer->d), " for this layer, not its output's ",
                        DTypeName(q.layer->out), " (a 16-bit D needs the output in the ",
                        PrecisionName(c.precision),
                        " type and a bias that converts to it exactly): cuBLASLt would reduce in ",
                        DTypeName(q.layer->d)));
  }
  SplitKGemm g;
  g.splitk = c.splitk;
  g.scheme = c.reduce == SplitKReduce::kOutput ? LtReductionScheme::kOutputType
                                               : LtReductionScheme::kComputeType;
  return std::optional<SplitKGemm>(g);
}

SplitKMiss AlgoTakesSplitK(const LtAlgoCaps& caps, const SplitKGemm& split) {
  if (caps.splitk_support == 0) return SplitKMiss::kNoSplitK;
  const uint32_t scheme = static_cast<uint32_t>(split.scheme);
  if ((caps.reduction_scheme_mask & scheme) != scheme) return SplitKMiss::kNoScheme;
  return SplitKMiss::kNone;
}

SplitKMiss WorkspaceFits(uint64_t needed, uint64_t limit) {
  return needed <= limit ? SplitKMiss::kNone : SplitKMiss::kNoWorkspace;
}

absl::Status NoSplitKAlgorithm(absl::string_view cfg, const SplitKGemm& split,
                               const SplitKTally& tally, absl::string_view problem, uint64_t limit,
                               absl::string_view device_name) {
  std::vector<std::string> why;
  for (const auto& [miss, count] : tally.missed) {
    std::string part = absl::StrCat(count, " ", MissName(miss));
    if (miss == SplitKMiss::kNoWorkspace) {
      absl::StrAppend(&part, " (up to ", tally.largest_workspace_needed, " bytes)");
    }
    why.push_back(std::move(part));
  }
  return MarkNoKernel(absl::FailedPreconditionError(
      absl::StrCat("configuration ", cfg, ": cuBLASLt has no algorithm that runs split-K with ",
                   split.splitk, " partitions reduced by ", LtReductionSchemeName(split.scheme),
                   " for ", problem, ", workspace ", limit, " bytes on ", device_name, ": of ",
                   tally.tried, tally.tried == 1 ? " algorithm" : " algorithms", " tried",
                   why.empty() ? std::string() : absl::StrCat(", ", absl::StrJoin(why, ", ")))));
}

void DescribeSplitK(const Config& config, const SplitKGemm& split,
                    std::map<std::string, std::string>* details) {
  (*details)["split_k"] =
      absl::StrCat("splitk=", split.splitk, ",reduce=", SplitKReduceName(config.reduce),
                   ": CUBLASLT_ALGO_CONFIG_SPLITK_NUM ", split.splitk, ", ",
                   LtReductionSchemeName(split.scheme));
  (*details)["config"] = config.ToString();
}

std::string CublasReduction(bool disallow) {
  return disallow ? "split-K as cuBLAS chooses; partial results reduced in the compute type "
                    "only (CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)"
                  : "split-K as cuBLAS chooses; partial results may be reduced in the output "
                    "type (CUBLAS_DEFAULT_MATH)";
}

}  // namespace tensorcheck::cuda::internal
