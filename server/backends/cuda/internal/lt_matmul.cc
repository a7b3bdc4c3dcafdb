// The cuBLASLt call, in the order of NVIDIA's samples: matmul descriptor
// (compute and scale types, transposes, epilogue, bias), layouts,
// preference (workspace, reduction schemes), heuristic, matmul.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/backends/cuda/cuda_kernels.h"
#include "server/backends/cuda/cuda_status.h"
#include "server/backends/cuda/internal/compare_args.h"
#include "server/backends/cuda/internal/gemm_call.h"
#include "server/core/status_macros.h"

namespace tensorcheck::cuda::internal {
namespace {

// ---- RAII for cuBLASLt descriptors.

struct MatmulDescDestroy {
  void operator()(cublasLtMatmulDesc_t d) const { cublasLtMatmulDescDestroy(d); }
};
struct LayoutDestroy {
  void operator()(cublasLtMatrixLayout_t l) const { cublasLtMatrixLayoutDestroy(l); }
};
struct PreferenceDestroy {
  void operator()(cublasLtMatmulPreference_t p) const { cublasLtMatmulPreferenceDestroy(p); }
};
using MatmulDescPtr =
    std::unique_ptr<std::remove_pointer_t<cublasLtMatmulDesc_t>, MatmulDescDestroy>;
using LayoutPtr = std::unique_ptr<std::remove_pointer_t<cublasLtMatrixLayout_t>, LayoutDestroy>;
using PreferencePtr =
    std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>, PreferenceDestroy>;

const char* EpilogueName(cublasLtEpilogue_t e) {
  switch (e) {
    case CUBLASLT_EPILOGUE_DEFAULT:
      return "DEFAULT";
    case CUBLASLT_EPILOGUE_BIAS:
      return "BIAS";
    case CUBLASLT_EPILOGUE_RELU_BIAS:
      return "RELU_BIAS";
    case CUBLASLT_EPILOGUE_GELU_BIAS:
      return "GELU_BIAS";
    case CUBLASLT_EPILOGUE_RELU:
      return "RELU";
    case CUBLASLT_EPILOGUE_GELU:
      return "GELU";
    default:
      return "?";
  }
}

// The epilogue that adds the bias (when there is one) and the activation.
cublasLtEpilogue_t EpilogueOf(bool bias, ActKind act) {
  if (bias) {
    return act == ActKind::kRelu       ? CUBLASLT_EPILOGUE_RELU_BIAS
           : act == ActKind::kGeluTanh ? CUBLASLT_EPILOGUE_GELU_BIAS
                                       : CUBLASLT_EPILOGUE_BIAS;
  }
  return act == ActKind::kRelu       ? CUBLASLT_EPILOGUE_RELU
         : act == ActKind::kGeluTanh ? CUBLASLT_EPILOGUE_GELU
                                     : CUBLASLT_EPILOGUE_DEFAULT;
}

class LtMatmul final : public GemmCall {
 public:
  LtMatmul(const GemmOperands& operands, CudaContext& ctx) : ops_(operands), ctx_(ctx) {}

  // Every step before the first matmul, in the samples' order.
  absl::Status Prepare(const RunOptions& options, absl::string_view cfg,
                       absl::string_view device_name, Details* details) {
    epilogue_ = EpilogueOf(ops_.bias != nullptr, ToActKind(ops_.activation));
    (*details)["epilogue"] = EpilogueName(epilogue_);
    TC_RETURN_IF_ERROR(CreateMatmulDesc());
    TC_RETURN_IF_ERROR(CreateLayouts());
    TC_RETURN_IF_ERROR(CreatePreference(options, details));
    TC_RETURN_IF_ERROR(ChooseAlgorithm(cfg, device_name));
    DescribeAlgorithm(details);
    return absl::OkStatus();
  }

  absl::Status Run(char* dst) override {
    void* d_ptr = ops_.d != nullptr ? ops_.d : dst;
    TC_CUDA_RETURN_IF_ERROR(
        cublasLtMatmul(ctx_.lt(), op_desc_.get(), scalars_.one(ops_.plan.scale), ops_.w,
                       a_desc_.get(), ops_.x, b_desc_.get(), scalars_.zero(ops_.plan.scale), d_ptr,
                       d_desc_.get(), d_ptr, d_desc_.get(), &heuristic_.algo, ctx_.workspace(),
                       static_cast<size_t>(ctx_.workspace_bytes()), ops_.stream));
    if (ops_.d != nullptr) {
      TC_CUDA_RETURN_IF_ERROR(LaunchConvert(ops_.d, ToElem(ops_.plan.d), dst, ToElem(ops_.out),
                                            ops_.m * ops_.n, ops_.stream));
    }
    return absl::OkStatus();
  }

 private:
  // The operation: compute and scale types, transposes, epilogue and the
  // bias it adds.
  absl::Status CreateMatmulDesc() {
    cublasLtMatmulDesc_t od = nullptr;
    TC_CUDA_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&od, ops_.plan.compute, ops_.plan.scale));
    op_desc_.reset(od);
    const cublasOperation_t transa = ops_.a_transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t transb = CUBLAS_OP_N;
    TC_CUDA_RETURN_IF_ERROR(
        cublasLtMatmulDescSetAttribute(od, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof(transa)));
    TC_CUDA_RETURN_IF_ERROR(
        cublasLtMatmulDescSetAttribute(od, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof(transb)));
    TC_CUDA_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(od, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                           &epilogue_, sizeof(epilogue_)));
    if (ops_.bias != nullptr) {
      const void* bias_ptr = ops_.bias;
      TC_CUDA_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(od, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                             &bias_ptr, sizeof(bias_ptr)));
    }
    return absl::OkStatus();
  }

  // A, B and D as the row-major trick lays them out (gemm_call.h).
  absl::Status CreateLayouts() {
    const int64_t m = ops_.m, n = ops_.n, k = ops_.k;
    const int64_t lda = ops_.a_transposed ? k : n;
    const cudaDataType_t ab_type = ToCudaType(ops_.plan.ab);
    const cudaDataType_t d_type = ToCudaType(ops_.plan.d);
    cublasLtMatrixLayout_t l = nullptr;
    // A as stored: k x n (OUT_IN, transposed) or n x k (IN_OUT).
    TC_CUDA_RETURN_IF_ERROR(
        cublasLtMatrixLayoutCreate(&l, ab_type, static_cast<uint64_t>(ops_.a_transposed ? k : n),
                                   static_cast<uint64_t>(ops_.a_transposed ? n : k), lda));
    a_desc_.reset(l);
    TC_CUDA_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&l, ab_type, static_cast<uint64_t>(k),
                                                       static_cast<uint64_t>(m), k));
    b_desc_.reset(l);
    TC_CUDA_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&l, d_type, static_cast<uint64_t>(n),
                                                       static_cast<uint64_t>(m), n));
    d_desc_.reset(l);
    return absl::OkStatus();
  }

  // The workspace the algorithm may use and, when asked, no reduced
  // precision reduction.
  absl::Status CreatePreference(const RunOptions& options, Details* details) {
    cublasLtMatmulPreference_t p = nullptr;
    TC_CUDA_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&p));
    pref_.reset(p);
    const uint64_t ws = static_cast<uint64_t>(ctx_.workspace_bytes());
    TC_CUDA_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
        p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    if (options.disallow_reduced_precision_reduction) {
      // Split-K partial sums only in the compute type: no in-place
      // reduction in D (D's type) and no output-type reduction.
      const uint32_t mask = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
      TC_CUDA_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
          p, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask, sizeof(mask)));
      (*details)["reduction_scheme_mask"] = absl::StrCat(mask);
    } else {
      (*details)["reduction_scheme_mask"] =
          absl::StrCat(static_cast<uint32_t>(CUBLASLT_REDUCTION_SCHEME_MASK));
    }
    return absl::OkStatus();
  }

  // The heuristic's first choice; none is FAILED_PRECONDITION, naming the
  // problem and the device.
  absl::Status ChooseAlgorithm(absl::string_view cfg, absl::string_view device_name) {
    int found = 0;
    const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(
        ctx_.lt(), op_desc_.get(), a_desc_.get(), b_desc_.get(), d_desc_.get(), d_desc_.get(),
        pref_.get(), 1, &heuristic_, &found);
    if (hs == CUBLAS_STATUS_NOT_SUPPORTED || (hs == CUBLAS_STATUS_SUCCESS && found == 0)) {
      const uint64_t ws = static_cast<uint64_t>(ctx_.workspace_bytes());
      return absl::FailedPreconditionError(absl::StrCat(
          "configuration ", cfg,
          ": cuBLASLt has no algorithm (no heuristic "
          "result) for A/B ",
          DTypeName(ops_.plan.ab), ", D ", DTypeName(ops_.plan.d), ", ",
          ComputeName(ops_.plan.compute), ", epilogue ", EpilogueName(epilogue_), ", m=", ops_.m,
          " n=", ops_.n, " k=", ops_.k, ", workspace ", ws, " bytes on ", device_name));
    }
    TC_CUDA_RETURN_IF_ERROR(hs);
    return absl::OkStatus();
  }

  // The chosen algorithm's configuration, as far as cuBLASLt tells it.
  void DescribeAlgorithm(Details* details) const {
    int32_t id = 0;
    uint32_t tile = 0, scheme = 0;
    int32_t splitk = 0;
    size_t written = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(&heuristic_.algo, CUBLASLT_ALGO_CONFIG_ID, &id,
                                             sizeof(id), &written) == CUBLAS_STATUS_SUCCESS) {
      (*details)["algo"] = absl::StrCat(id);
    }
    if (cublasLtMatmulAlgoConfigGetAttribute(&heuristic_.algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile,
                                             sizeof(tile), &written) == CUBLAS_STATUS_SUCCESS) {
      (*details)["algo_tile"] = absl::StrCat(tile);
    }
    if (cublasLtMatmulAlgoConfigGetAttribute(&heuristic_.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM,
                                             &splitk, sizeof(splitk),
                                             &written) == CUBLAS_STATUS_SUCCESS) {
      (*details)["algo_splitk"] = absl::StrCat(splitk);
    }
    if (cublasLtMatmulAlgoConfigGetAttribute(&heuristic_.algo,
                                             CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme,
                                             sizeof(scheme), &written) == CUBLAS_STATUS_SUCCESS) {
      (*details)["algo_reduction_scheme"] = absl::StrCat(scheme);
    }
    (*details)["algo_index"] = "0";  // the heuristic's first choice
    (*details)["algo_workspace_bytes"] = absl::StrCat(heuristic_.workspaceSize);
  }

  const GemmOperands ops_;
  CudaContext& ctx_;
  const Scalars scalars_;
  cublasLtEpilogue_t epilogue_ = CUBLASLT_EPILOGUE_DEFAULT;
  // The descriptors live as long as the call.
  MatmulDescPtr op_desc_;
  LayoutPtr a_desc_, b_desc_, d_desc_;
  PreferencePtr pref_;
  cublasLtMatmulHeuristicResult_t heuristic_{};
};

}  // namespace

absl::StatusOr<std::unique_ptr<GemmCall>> PrepareLtMatmul(
    const GemmOperands& operands, CudaContext& ctx, const RunOptions& options,
    absl::string_view cfg, absl::string_view device_name, Details* details) {
  auto call = std::make_unique<LtMatmul>(operands, ctx);
  TC_RETURN_IF_ERROR(call->Prepare(options, cfg, device_name, details));
  return std::unique_ptr<GemmCall>(std::move(call));
}

}  // namespace tensorcheck::cuda::internal
