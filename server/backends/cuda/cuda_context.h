// CudaContext: one lane of the CUDA device (internal to this folder;
// cuda_device.h pools them): a stream, cuBLAS and cuBLASLt handles bound
// to it, and the cuBLAS(Lt) workspace. One session uses a lane at a time,
// so nothing here is locked.
//
//   TC_ASSIGN_OR_RETURN(std::unique_ptr<CudaContext> ctx, CudaContext::Create(options, probe));
//   cublasLtMatmul(ctx->lt(), ..., ctx->workspace(), ctx->workspace_bytes(), ctx->stream());
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <type_traits>

#include "absl/status/statusor.h"
#include "server/backends/linear_backend.h"

namespace tensorcheck::cuda {

struct CudaFree {
  void operator()(void* p) const { cudaFree(p); }
};
struct StreamDestroy {
  void operator()(cudaStream_t s) const { cudaStreamDestroy(s); }
};
struct CublasDestroy {
  void operator()(cublasHandle_t h) const { cublasDestroy(h); }
};
struct CublasLtDestroy {
  void operator()(cublasLtHandle_t h) const { cublasLtDestroy(h); }
};

using DeviceBuffer = std::unique_ptr<void, CudaFree>;
using StreamPtr = std::unique_ptr<std::remove_pointer_t<cudaStream_t>, StreamDestroy>;
using CublasPtr = std::unique_ptr<std::remove_pointer_t<cublasHandle_t>, CublasDestroy>;
using CublasLtPtr = std::unique_ptr<std::remove_pointer_t<cublasLtHandle_t>, CublasLtDestroy>;

// What the host has, with or without a device: the reason it cannot run
// (OK when it can), and the description.
struct DeviceProbe {
  absl::Status available;
  DeviceDescription description;
  int cc_major = 0;
  int cc_minor = 0;
  int64_t free_bytes = 0;
};

// Probes device 0. Never fails: the reason lands in `available`.
DeviceProbe ProbeDevice();

class CudaContext {
 public:
  struct Options {
    int64_t workspace_bytes = int64_t{32} << 20;
  };

  // FAILED_PRECONDITION without a usable device; RESOURCE_EXHAUSTED when
  // the workspace does not fit.
  static absl::StatusOr<std::unique_ptr<CudaContext>> Create(const Options& options,
                                                             const DeviceProbe& probe);

  ~CudaContext();
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;

  cudaStream_t stream() const { return stream_.get(); }
  cublasHandle_t cublas() const { return cublas_.get(); }
  cublasLtHandle_t lt() const { return lt_.get(); }
  void* workspace() const { return workspace_.get(); }
  int64_t workspace_bytes() const { return workspace_bytes_; }
  int device() const { return device_; }

 private:
  CudaContext() = default;

  int device_ = 0;
  int64_t workspace_bytes_ = 0;
  // Declaration order is destruction order reversed: handles go first,
  // then the memory, then the stream they use.
  StreamPtr stream_;
  DeviceBuffer workspace_;
  CublasPtr cublas_;
  CublasLtPtr lt_;
};

}  // namespace tensorcheck::cuda
