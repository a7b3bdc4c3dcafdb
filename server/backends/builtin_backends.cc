#include "core/status_macros.h"
#include "server/backends/cpu/cpu_backend.h"
#include "server/backends/linear_backend.h"
#ifdef TENSORCHECK_HAVE_CUDA
#include "server/backends/cuda/cuda_backends.h"
#endif

namespace tensorcheck {

absl::Status RegisterBuiltinBackends(BackendRegistry* registry,
                                     const BuiltinBackendOptions& options) {
  CpuBackend::Options cpu;
  cpu.threads = options.cpu_threads;
  TC_ASSIGN_OR_RETURN(auto cpu_backend, CpuBackend::Create(cpu));
  TC_RETURN_IF_ERROR(registry->Register(std::move(cpu_backend)));
#ifdef TENSORCHECK_HAVE_CUDA
  TC_RETURN_IF_ERROR(RegisterCudaBackends(registry, options));
#endif
  return absl::OkStatus();
}

}  // namespace tensorcheck
