#include "server/backends/cuda/cuda_status.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/status_macros.h"
#include "server/backends/cuda/cuda_backends.h"

namespace tensorcheck {

bool IsStickyCudaError(const absl::Status& status) {
  return status.code() == absl::StatusCode::kInternal && IsFatalDeviceError(status);
}

namespace cuda {
namespace {

absl::string_view ApiName(const char* call) {
  absl::string_view s(call);
  const size_t paren = s.find('(');
  if (paren != absl::string_view::npos) s = s.substr(0, paren);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\n')) s.remove_suffix(1);
  return s;
}

absl::Status Sticky(absl::string_view api, cudaError_t e) {
  return MarkFatalDeviceError(absl::InternalError(absl::StrCat(
      kStickyCudaErrorPrefix, " ", api, ": ", cudaGetErrorName(e), ": ", cudaGetErrorString(e),
      " (the CUDA context is unusable; the process must restart)")));
}

}  // namespace

bool IsStickyError(cudaError_t e) {
  switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable:
    case cudaErrorContextIsDestroyed:
    case cudaErrorExternalDevice:
      return true;
    default:
      return false;
  }
}

absl::Status ToStatus(cudaError_t e, const char* call) {
  if (e == cudaSuccess) return absl::OkStatus();
  const absl::string_view api = ApiName(call);
  if (IsStickyError(e)) return Sticky(api, e);
  const std::string msg = absl::StrCat(api, ": ", cudaGetErrorName(e), ": ", cudaGetErrorString(e));
  switch (e) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(absl::StrCat("device out of memory: ", msg));
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
    case cudaErrorDevicesUnavailable:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
      return absl::FailedPreconditionError(msg);
    default:
      return absl::InternalError(msg);
  }
}

absl::Status ToStatus(cublasStatus_t s, const char* call) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  const absl::string_view api = ApiName(call);
  const std::string msg = absl::StrCat(api, ": ", cublasGetStatusString(s));
  switch (s) {
    case CUBLAS_STATUS_ALLOC_FAILED:
      return absl::ResourceExhaustedError(absl::StrCat("device out of memory: ", msg));
    case CUBLAS_STATUS_NOT_SUPPORTED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return absl::FailedPreconditionError(msg);
    case CUBLAS_STATUS_EXECUTION_FAILED:
    case CUBLAS_STATUS_INTERNAL_ERROR: {
      // cuBLAS reports a kernel that faulted this way; the runtime knows
      // whether the context survived.
      const cudaError_t e = cudaPeekAtLastError();
      if (IsStickyError(e)) return Sticky(api, e);
      return absl::InternalError(msg);
    }
    default:
      return absl::InternalError(msg);
  }
}

}  // namespace cuda
}  // namespace tensorcheck
