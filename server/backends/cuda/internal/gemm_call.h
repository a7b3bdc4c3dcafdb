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
// Errors: a cuBLAS(Lt) or launch error as its Status (cuda_status.h);
// FAILED_PRECONDITION when cuBLASLt has no algorithm for the problem. Call
// with the context's mutex held, as the rest of a request; a GemmCall must
// not outlive the request's device memory.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/backends/cuda/cuda_context.h"
#include "server/backends/cuda/internal/gemm_plan.h"
#include "server/backends/linear_backend.h"
#include "server/core/dtype.h"
#include "server/core/linear_config.h"

namespace tensorcheck::cuda::internal {

// RunResult::details: what the call reports (algorithm, math mode, ...).
using Details = std::map<std::string, std::string>;

// What one request's GEMM reads and writes, on the device.
struct GemmOperands {
  Plan plan;
  int64_t m = 0, n = 0, k = 0;
  bool a_transposed = false;  // W stored OUT_IN, [n, k] row-major
  const void* w = nullptr;    // A: the weight in plan.ab
  const void* x = nullptr;    // B: the input in plan.ab
  // D's own array when D's type is not the output dtype (a kernel then
  // rounds it to the output); nullptr: the GEMM writes the output.
  void* d = nullptr;
  DType out = DType::kFloat32;
  const void* bias = nullptr;  // nullptr without a bias
  DType bias_type = DType::kFloat32;
  Activation activation = Activation::kNone;
  cudaStream_t stream = nullptr;
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

// cuBLASLt (`cublaslt`): the bias and activation in the matmul epilogue.
// `cfg` and `device_name` go into the "no algorithm" message.
absl::StatusOr<std::unique_ptr<GemmCall>> PrepareLtMatmul(
    const GemmOperands& operands, CudaContext& ctx, const RunOptions& options,
    absl::string_view cfg, absl::string_view device_name, Details* details);

// cuBLAS (`cublas`): cublasGemmEx, then the bias and the activation by a
// kernel each, each rounding to the output dtype.
absl::StatusOr<std::unique_ptr<GemmCall>> PrepareCublasGemm(const GemmOperands& operands,
                                                            CudaContext& ctx,
                                                            const RunOptions& options,
                                                            Details* details);

}  // namespace tensorcheck::cuda::internal
