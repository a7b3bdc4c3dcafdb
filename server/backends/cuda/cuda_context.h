// CudaContext: what the GPU backends create once per device (internal to
// this folder).
//
//   TC_ASSIGN_OR_RETURN(std::unique_ptr<CudaContext> ctx,
//                       CudaContext::Create(options));
//   std::lock_guard<std::mutex> lock(ctx->mutex());
//   TC_ASSIGN_OR_RETURN(char* base, ctx->Reserve(bytes));   // under budget
//
// Holds the device's stream, cuBLAS and cuBLASLt handles, the cuBLAS(Lt)
// workspace, and a device-memory pool: one slab, grown on demand up to the
// byte budget and reused by every later request. A request checks its
// whole size against the budget before anything is allocated. Requests are
// serialised by mutex(): simple, and cuBLAS numerics do not depend on
// concurrency. After a sticky CUDA error the context refuses every request
// with that error.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <mutex>
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
    // Per-request device memory; 0: 90% of the free memory at creation.
    int64_t memory_budget_bytes = 0;
    int64_t workspace_bytes = int64_t{32} << 20;
  };

  // FAILED_PRECONDITION without a usable device; RESOURCE_EXHAUSTED when
  // the workspace does not fit.
  static absl::StatusOr<std::unique_ptr<CudaContext>> Create(const Options& options,
                                                             const DeviceProbe& probe);

  ~CudaContext();
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;

  std::mutex& mutex() { return mu_; }

  // OK, or the sticky error that poisoned the context. Thread-safe without
  // mutex() (Available() must not wait for a running request).
  absl::Status health() const;
  // Records `s` when it is a sticky error; returns `s`. Thread-safe.
  absl::Status Note(absl::Status s);

  // The rest: call with mutex() held.

  // A device region of `bytes` (256-byte aligned base) for this request:
  // RESOURCE_EXHAUSTED over the budget (nothing allocated) or when the
  // device is out of memory (the pool is left empty and usable).
  absl::StatusOr<char*> Reserve(int64_t bytes);

  cudaStream_t stream() const { return stream_.get(); }
  cublasHandle_t cublas() const { return cublas_.get(); }
  cublasLtHandle_t lt() const { return lt_.get(); }
  void* workspace() const { return workspace_.get(); }
  int64_t workspace_bytes() const { return workspace_bytes_; }
  int64_t budget_bytes() const { return budget_bytes_; }
  int device() const { return device_; }

 private:
  CudaContext() = default;

  std::mutex mu_;
  mutable std::mutex health_mu_;
  absl::Status sticky_;  // guarded by health_mu_
  int device_ = 0;
  int64_t budget_bytes_ = 0;
  int64_t workspace_bytes_ = 0;
  int64_t pool_bytes_ = 0;
  // Declaration order is destruction order reversed: handles go first,
  // then the memory, then the stream they use.
  StreamPtr stream_;
  DeviceBuffer workspace_;
  DeviceBuffer pool_;
  CublasPtr cublas_;
  CublasLtPtr lt_;
};

}  // namespace tensorcheck::cuda
