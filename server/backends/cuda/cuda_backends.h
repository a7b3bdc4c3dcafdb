// The GPU backends: `cublaslt` (one cuBLASLt matmul whose epilogue adds the
// bias and applies the activation, PyTorch's `addmm` semantics, bias mode
// `fused`) and `cublas` (cublasGemmEx, then separate bias-add and activation
// kernels that each round to the output dtype, candle/XLA semantics, bias
// mode `unfused`).
//
//   BackendRegistry registry;
//   TC_RETURN_IF_ERROR(RegisterCudaBackends(&registry, options));
//   TC_ASSIGN_OR_RETURN(LinearBackend* lt, registry.Find("cublaslt"));
//   if (lt->Available().ok()) { ... lt->Run(problem, config, {}) ... }
//
// Both backends share one per-device context (device 0 of the visible
// ones), created here once: cuBLAS and cuBLASLt handles, a stream, the
// cuBLASLt workspace, and a device-memory pool with a byte budget. Requests
// are serialised on the device by a mutex in that context.
//
// `cublaslt` also runs the fp8 precisions on compute capability 8.9 and
// newer (not fp8e5m2: cuBLASLt has no E5M2 x E5M2 GEMM): FP8 operands with
// their scales, or wide ones quantised by the configuration's recipe as
// the CPU backend does; `cublas` refuses them (cublasGemmEx has no scale
// pointers). internal/fp8_rules.h holds every rule and where it is
// written. Both select algorithms (`algo=N`, LinearBackend::Algorithms):
// cuBLASLt's heuristic list for the problem, and cublasGemmEx's
// cublasGemmAlgo_t values, which the cuBLAS documentation says have no
// effect on compute capability 8.0 and newer (internal/gemm_call.h).
//
// Without a device both backends are still registered: Available() and
// Run() answer FAILED_PRECONDITION "no CUDA device: <reason>", while
// precisions()/bias_modes() list what they would run.
//
// Errors from Run: FAILED_PRECONDITION (configuration this backend or device
// does not run, no cuBLASLt algorithm, `algo=N` past the list),
// INVALID_ARGUMENT (FP8 operands without their scales), RESOURCE_EXHAUSTED
// (over the memory budget, device out of memory; the backend keeps
// working), INTERNAL. An
// INTERNAL status marked as a fatal device error (IsFatalDeviceError in
// core/status_macros.h; its message starts with kStickyCudaErrorPrefix for
// the reader) means the CUDA context is corrupted (illegal address and its
// kind): every later request fails the same way and the process must exit
// so an orchestrator restarts it.
//
// This header includes no CUDA header; only the implementation files in
// this folder do.
#pragma once

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "server/backends/linear_backend.h"

namespace tensorcheck {

// Message prefix of the INTERNAL status a sticky CUDA error produces.
inline constexpr absl::string_view kStickyCudaErrorPrefix = "sticky CUDA error:";

// True for the status of a sticky CUDA error (see above): INTERNAL and
// marked fatal.
bool IsStickyCudaError(const absl::Status& status);

// Registers `cublaslt` and `cublas` (in that order). Fails only when the
// names are taken; a missing device is reported by the backends'
// Available().
absl::Status RegisterCudaBackends(BackendRegistry* registry, const BuiltinBackendOptions& options);

}  // namespace tensorcheck
