// The cuBLAS call: cublasGemmEx in the plan's types with the default
// algorithm, then the rounding to the output dtype, the bias and the
// activation by a kernel each.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/backends/cuda/cuda_kernels.h"
#include "server/backends/cuda/cuda_status.h"
#include "server/backends/cuda/internal/compare_args.h"
#include "server/backends/cuda/internal/gemm_call.h"
#include "server/core/status_macros.h"

namespace tensorcheck::cuda::internal {
namespace {

class CublasGemm final : public GemmCall {
 public:
  CublasGemm(const GemmOperands& operands, CudaContext& ctx) : ops_(operands), ctx_(ctx) {}

  // The handle's math mode for this request, and what the runs will do.
  absl::Status Prepare(const RunOptions& options, Details* details) {
    int math = CUBLAS_DEFAULT_MATH;
    if (options.disallow_reduced_precision_reduction) {
      math |= CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
    }
    TC_CUDA_RETURN_IF_ERROR(cublasSetMathMode(ctx_.cublas(), static_cast<cublasMath_t>(math)));
    (*details)["math_mode"] = options.disallow_reduced_precision_reduction
                                  ? "CUBLAS_DEFAULT_MATH|DISALLOW_REDUCED_PRECISION_REDUCTION"
                                  : "CUBLAS_DEFAULT_MATH";
    (*details)["algo"] = "CUBLAS_GEMM_DEFAULT";
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
    TC_CUDA_RETURN_IF_ERROR(cublasGemmEx(
        ctx_.cublas(), ops_.a_transposed ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N,
        static_cast<int>(n), static_cast<int>(m), static_cast<int>(k),
        scalars_.one(ops_.plan.scale), ops_.w, ab_type, static_cast<int>(lda), ops_.x, ab_type,
        static_cast<int>(k), scalars_.zero(ops_.plan.scale), d_ptr, ToCudaType(ops_.plan.d),
        static_cast<int>(n), ops_.plan.compute, CUBLAS_GEMM_DEFAULT));
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
};

}  // namespace

absl::StatusOr<std::unique_ptr<GemmCall>> PrepareCublasGemm(const GemmOperands& operands,
                                                            CudaContext& ctx,
                                                            const RunOptions& options,
                                                            Details* details) {
  auto call = std::make_unique<CublasGemm>(operands, ctx);
  TC_RETURN_IF_ERROR(call->Prepare(options, details));
  return std::unique_ptr<GemmCall>(std::move(call));
}

}  // namespace tensorcheck::cuda::internal
