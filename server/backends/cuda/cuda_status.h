// CUDA / cuBLAS error codes as absl::Status (internal to this folder).
//
//   TC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, n, kind, stream));
//   TC_CUDA_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&desc, compute, scale));
//
// One macro for both APIs: the status carries the API's name and its own
// error string. Mapping:
//   cudaErrorMemoryAllocation, CUBLAS_STATUS_ALLOC_FAILED -> RESOURCE_EXHAUSTED
//   sticky errors (illegal address, launch failure, ...)   -> INTERNAL with
//       the kStickyCudaErrorPrefix marker (the context is unusable)
//   no device / driver / kernel image, NOT_SUPPORTED,
//   ARCH_MISMATCH                                          ->
//   FAILED_PRECONDITION anything else -> INTERNAL
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "absl/status/status.h"

namespace tensorcheck::cuda {

inline bool IsSuccess(cudaError_t e) { return e == cudaSuccess; }
inline bool IsSuccess(cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS; }

// Errors after which the CUDA context is corrupted: every later call fails
// and only a new process recovers.
bool IsStickyError(cudaError_t e);

// `call` is the stringised call; only the API's name (up to the first '(')
// goes into the message, never our variable names.
absl::Status ToStatus(cudaError_t e, const char* call);
absl::Status ToStatus(cublasStatus_t s, const char* call);

}  // namespace tensorcheck::cuda

#define TC_CUDA_RETURN_IF_ERROR(expr)                           \
  do {                                                          \
    const auto tc_cuda_rc_ = (expr);                            \
    if (!::tensorcheck::cuda::IsSuccess(tc_cuda_rc_)) {         \
      return ::tensorcheck::cuda::ToStatus(tc_cuda_rc_, #expr); \
    }                                                           \
  } while (0)
