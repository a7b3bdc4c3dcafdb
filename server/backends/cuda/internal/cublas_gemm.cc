// The cuBLAS call: cublasGemmEx in the plan's types with the chosen
// algorithm, then the rounding to the output dtype, the bias and the
// activation by a kernel each.
//
// Algorithms. cublasGemmEx takes a cublasGemmAlgo_t. The cuBLAS
// documentation (cublasGemmAlgo_t) says: "cublasGemmAlgo_t type is an
// enumerant to specify the algorithm for matrix-matrix multiplication on
// GPU architectures up to sm_75. On sm_80 and newer GPU architectures, this
// enumerant has no effect." and, of CUBLAS_GEMM_ALGO0 to
// CUBLAS_GEMM_ALGO23, "Explicitly choose an Algorithm 0..23. Note: Doesn't
// have effect on NVIDIA Ampere architecture GPUs and newer." The backends
// run on compute capability 8.0 and newer only (cuda_context.cc), so every
// entry of the list runs what CUBLAS_GEMM_DEFAULT runs ("Apply Heuristics
// to select the GEMM algorithm"); the mapping is honoured all the same, and
// each entry past the default says so in "algo_note".
//
// The list leaves out CUBLAS_GEMM_DEFAULT_TENSOR_OP and
// CUBLAS_GEMM_ALGO0_TENSOR_OP..ALGO15_TENSOR_OP: the documentation marks
// them "[DEPRECATED] ... will be removed in a future release" and says
// they allow "use of reduced precision CUBLAS_COMPUTE_32F_FAST_16F kernels"
// which would change what a configuration's precision means (fp32 run
// through fp16) rather than which kernel computes it.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "server/backends/cuda/cuda_status.h"
#include "server/backends/cuda/internal/compare_args.h"
#include "server/backends/cuda/internal/cuda_kernels.h"
#include "server/backends/cuda/internal/gemm_call.h"
#include "server/backends/cuda/internal/splitk_rules.h"

namespace tensorcheck::cuda::internal {
namespace {

struct CublasAlgo {
  cublasGemmAlgo_t value;
  std::string name;
};

// Index 0: CUBLAS_GEMM_DEFAULT (what the backend has always run); 1..24:
// CUBLAS_GEMM_ALGO0..ALGO23.
const std::vector<CublasAlgo>& AlgoList() {
  static const std::vector<CublasAlgo>* list = [] {
    auto* l = new std::vector<CublasAlgo>{{CUBLAS_GEMM_DEFAULT, "CUBLAS_GEMM_DEFAULT"}};
    for (int i = 0; i <= 23; ++i) {
      l->push_back({static_cast<cublasGemmAlgo_t>(static_cast<int>(CUBLAS_GEMM_ALGO0) + i),
                    absl::StrCat("CUBLAS_GEMM_ALGO", i)});
    }
    return l;
  }();
  return *list;
}

constexpr char kAlgoNote[] =
    "no effect on compute capability 8.0 and newer (cuBLAS documentation, cublasGemmAlgo_t): "
    "cublasGemmEx applies its heuristic as with CUBLAS_GEMM_DEFAULT";

void DescribeAlgo(size_t index, Details* details) {
  const CublasAlgo& a = AlgoList()[index];
  (*details)["algo"] = absl::StrCat(static_cast<int>(a.value));
  (*details)["algo_name"] = a.name;
  if (index > 0) (*details)["algo_note"] = kAlgoNote;
}

class CublasGemm final : public GemmCall {
 public:
  CublasGemm(const GemmOperands& operands, CudaContext& ctx) : ops_(operands), ctx_(ctx) {}

  // The handle's math mode for this request, the algorithm, and what the
  // runs will do.
  absl::Status Prepare(const RunOptions& options, absl::string_view cfg, Details* details) {
    const int index = ops_.algo.value_or(0);
    const size_t count = AlgoList().size();
    if (index < 0 || static_cast<size_t>(index) >= count) {
      return absl::FailedPreconditionError(
          absl::StrCat("configuration ", cfg, ": cuBLAS offers only ", count,
                       " algorithms (CUBLAS_GEMM_DEFAULT, CUBLAS_GEMM_ALGO0..ALGO23); algo=", index,
                       " is out of range"));
    }
    algo_ = AlgoList()[static_cast<size_t>(index)].value;
    int math = CUBLAS_DEFAULT_MATH;
    if (options.disallow_reduced_precision_reduction) {
      math |= CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
    }
    TC_CUDA_RETURN_IF_ERROR(cublasSetMathMode(ctx_.cublas(), static_cast<cublasMath_t>(math)));
    (*details)["math_mode"] = options.disallow_reduced_precision_reduction
                                  ? "CUBLAS_DEFAULT_MATH|DISALLOW_REDUCED_PRECISION_REDUCTION"
                                  : "CUBLAS_DEFAULT_MATH";
    // In a split-K run's terms (splitk_rules.h).
    (*details)["split_k"] = CublasReduction(options.disallow_reduced_precision_reduction);
    // cuBLAS's BF16x9: "EAGER" uses the emulation "whenever possible";
    // the default (PERFORMANT, unless CUBLAS_EMULATION_STRATEGY says
    // otherwise) only where it is faster, else plain fp32 (cublas_api.h).
    // Set per request, as the math mode, since the lane's handle is shared.
    const bool emulated = ops_.plan.compute == CUBLAS_COMPUTE_32F_EMULATED_16BFX9;
    TC_CUDA_RETURN_IF_ERROR(
        cublasSetEmulationStrategy(ctx_.cublas(), emulated ? CUBLAS_EMULATION_STRATEGY_EAGER
                                                           : CUBLAS_EMULATION_STRATEGY_DEFAULT));
    if (emulated) (*details)["emulation_strategy"] = "CUBLAS_EMULATION_STRATEGY_EAGER";
    DescribeAlgo(static_cast<size_t>(index), details);
    (*details)["algo_index"] = absl::StrCat(index);
    std::string steps = "gemm";
    if (ops_.d != nullptr) absl::StrAppend(&steps, ", round to ", DTypeName(ops_.out));
    if (ops_.bias != nullptr) absl::StrAppend(&steps, ", bias add (rounded)");
    if (act_ != ActKind::kNone) {
      absl::StrAppend(&steps, ", ", ActivationName(ops_.activation), " (rounded)");
    }
    (*details)["steps"] = steps;
    return absl::OkStatus();
  }

  absl::Status Run(char* dst) override {
    const int64_t m = ops_.m, n = ops_.n, k = ops_.k;
    const int64_t lda = ops_.a_transposed ? k : n;
    const cudaDataType_t ab_type = ToCudaType(ops_.plan.ab);
    void* d_ptr = ops_.d != nullptr ? ops_.d : dst;
    TC_CUDA_RETURN_IF_ERROR(
        cublasGemmEx(ctx_.cublas(), ops_.a_transposed ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N,
                     static_cast<int>(n), static_cast<int>(m), static_cast<int>(k),
                     scalars_.one(ops_.plan.scale), ops_.w, ab_type, static_cast<int>(lda), ops_.x,
                     ab_type, static_cast<int>(k), scalars_.zero(ops_.plan.scale), d_ptr,
                     ToCudaType(ops_.plan.d), static_cast<int>(n), ops_.plan.compute, algo_));
    if (ops_.d != nullptr) {
      TC_CUDA_RETURN_IF_ERROR(
          LaunchConvert(ops_.d, ToElem(ops_.plan.d), dst, ToElem(ops_.out), m * n, ops_.stream));
    }
    if (ops_.bias != nullptr) {
      TC_CUDA_RETURN_IF_ERROR(LaunchBiasAdd(dst, ToElem(ops_.out), ops_.bias,
                                            ToElem(ops_.bias_type), m, n, ops_.stream));
    }
    TC_CUDA_RETURN_IF_ERROR(LaunchActivation(dst, ToElem(ops_.out), act_, m * n, ops_.stream));
    return absl::OkStatus();
  }

 private:
  const GemmOperands ops_;
  CudaContext& ctx_;
  const Scalars scalars_;
  const ActKind act_ = ToActKind(ops_.activation);
  cublasGemmAlgo_t algo_ = CUBLAS_GEMM_DEFAULT;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GemmCall>> PrepareCublasGemm(const GemmOperands& operands,
                                                            CudaContext& ctx,
                                                            const RunOptions& options,
                                                            absl::string_view cfg,
                                                            Details* details) {
  auto call = std::make_unique<CublasGemm>(operands, ctx);
  TC_RETURN_IF_ERROR(call->Prepare(options, cfg, details));
  return std::unique_ptr<GemmCall>(std::move(call));
}

std::vector<AlgorithmInfo> CublasAlgorithms(int limit) {
  std::vector<AlgorithmInfo> out;
  const size_t count = std::min(AlgoList().size(), static_cast<size_t>(std::max(limit, 0)));
  for (size_t i = 0; i < count; ++i) {
    AlgorithmInfo info;
    info.index = static_cast<int>(i);
    DescribeAlgo(i, &info.details);
    out.push_back(std::move(info));
  }
  return out;
}

}  // namespace tensorcheck::cuda::internal
