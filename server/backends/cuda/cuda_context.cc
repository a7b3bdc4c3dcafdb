#include "server/backends/cuda/cuda_context.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "server/backends/cuda/cuda_backends.h"
#include "server/backends/cuda/cuda_status.h"

namespace tensorcheck::cuda {
namespace {

// 12080 -> "12.8", 13000 -> "13.0".
std::string CudaVersionString(int v) { return absl::StrCat(v / 1000, ".", (v % 1000) / 10); }

std::string CublasVersionString() {
  int major = 0, minor = 0, patch = 0;
  if (cublasGetProperty(MAJOR_VERSION, &major) != CUBLAS_STATUS_SUCCESS ||
      cublasGetProperty(MINOR_VERSION, &minor) != CUBLAS_STATUS_SUCCESS ||
      cublasGetProperty(PATCH_LEVEL, &patch) != CUBLAS_STATUS_SUCCESS) {
    return "";
  }
  // cublasLtGetVersion(): major*10000 + minor*100 + patch.
  const size_t lt = cublasLtGetVersion();
  return absl::StrCat("cuBLAS ", major, ".", minor, ".", patch, ", cuBLASLt ", lt / 10000, ".",
                      (lt / 100) % 100, ".", lt % 100);
}

}  // namespace

DeviceProbe ProbeDevice() {
  DeviceProbe p;
  int runtime = 0;
  if (cudaRuntimeGetVersion(&runtime) == cudaSuccess) {
    p.description.runtime_version = CudaVersionString(runtime);
  }
  int driver = 0;
  if (cudaDriverGetVersion(&driver) == cudaSuccess && driver > 0) {
    p.description.driver_version = CudaVersionString(driver);
  }
  p.description.cublas_version = CublasVersionString();

  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    // Clear the (non-sticky) error so it does not surface elsewhere.
    (void)cudaGetLastError();
    p.available =
        absl::FailedPreconditionError(absl::StrCat("no CUDA device: ", cudaGetErrorString(e)));
    return p;
  }
  if (count == 0) {
    p.available = absl::FailedPreconditionError("no CUDA device: cudaGetDeviceCount found none");
    return p;
  }
  cudaDeviceProp prop{};
  const cudaError_t pe = cudaGetDeviceProperties(&prop, 0);
  if (pe != cudaSuccess) {
    (void)cudaGetLastError();
    p.available = absl::FailedPreconditionError(
        absl::StrCat("no usable CUDA device: cudaGetDeviceProperties: ", cudaGetErrorString(pe)));
    return p;
  }
  p.description.name = prop.name;
  p.cc_major = prop.major;
  p.cc_minor = prop.minor;
  p.description.compute_capability = absl::StrCat(prop.major, ".", prop.minor);
  p.description.memory_bytes = static_cast<int64_t>(prop.totalGlobalMem);
  if (prop.major < 8) {
    // The builds carry sm_80/sm_90 code only, and TF32/bf16 need Ampere.
    p.available = absl::FailedPreconditionError(
        absl::StrCat("CUDA device '", prop.name, "' has compute capability ",
                     p.description.compute_capability, "; the GPU backends need 8.0+"));
    return p;
  }
  p.available = absl::OkStatus();
  return p;
}

absl::StatusOr<std::unique_ptr<CudaContext>> CudaContext::Create(const Options& options,
                                                                 const DeviceProbe& probe) {
  if (!probe.available.ok()) return probe.available;
  if (options.workspace_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuBLASLt workspace must be >= 0 bytes, got ", options.workspace_bytes));
  }
  std::unique_ptr<CudaContext> ctx(new CudaContext());
  ctx->device_ = 0;
  TC_CUDA_RETURN_IF_ERROR(cudaSetDevice(ctx->device_));

  cudaStream_t stream = nullptr;
  TC_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  ctx->stream_.reset(stream);

  ctx->workspace_bytes_ = options.workspace_bytes;
  if (ctx->workspace_bytes_ > 0) {
    void* ws = nullptr;
    TC_CUDA_RETURN_IF_ERROR(cudaMalloc(&ws, static_cast<size_t>(ctx->workspace_bytes_)));
    ctx->workspace_.reset(ws);
  }

  cublasHandle_t handle = nullptr;
  TC_CUDA_RETURN_IF_ERROR(cublasCreate(&handle));
  ctx->cublas_.reset(handle);
  TC_CUDA_RETURN_IF_ERROR(cublasSetStream(handle, stream));
  // The same workspace serves cublasGemmEx: requests are serialised on one
  // stream, and cuBLAS then allocates nothing of its own.
  if (ctx->workspace_bytes_ > 0) {
    TC_CUDA_RETURN_IF_ERROR(cublasSetWorkspace(handle, ctx->workspace_.get(),
                                               static_cast<size_t>(ctx->workspace_bytes_)));
  }
  // Deterministic reductions (the default, stated).
  TC_CUDA_RETURN_IF_ERROR(cublasSetAtomicsMode(handle, CUBLAS_ATOMICS_NOT_ALLOWED));

  cublasLtHandle_t lt = nullptr;
  TC_CUDA_RETURN_IF_ERROR(cublasLtCreate(&lt));
  ctx->lt_.reset(lt);

  return ctx;
}

CudaContext::~CudaContext() {
  // Nothing may still run on our stream when the memory goes (after a
  // sticky error this fails at once, and the process is exiting).
  if (stream_ != nullptr) cudaStreamSynchronize(stream_.get());
}

}  // namespace tensorcheck::cuda
