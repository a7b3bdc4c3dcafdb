// The backends the tests of the cuda_backends_test binary share: one
// registry of the CUDA backends (one CUDA context) and one CPU backend for
// the whole binary, made on first use (inline functions: their statics are
// one per program, whichever test file calls them).
//
//   LinearBackend* lt = TestBackend("cublaslt");  // nullptr without a device
//   LinearBackend* cpu = TestCpuBackend();
#pragma once

#include <cstdio>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "server/backends/cpu/cpu_backend.h"
#include "server/backends/cuda/cuda_backends.h"
#include "server/backends/linear_backend.h"

namespace tensorcheck::testing {

// The registry of RegisterCudaBackends (a failure is printed to stderr and
// leaves it without the CUDA backends).
inline BackendRegistry& TestCudaRegistry() {
  static BackendRegistry* registry = [] {
    auto* r = new BackendRegistry();
    const absl::Status s = RegisterCudaBackends(r, BuiltinBackendOptions{});
    if (!s.ok()) std::fprintf(stderr, "RegisterCudaBackends: %s\n", s.ToString().c_str());
    return r;
  }();
  return *registry;
}

// `name`'s backend from that registry; nullptr when it has none.
inline LinearBackend* TestBackend(absl::string_view name) {
  auto b = TestCudaRegistry().Find(name);
  return b.ok() ? *b : nullptr;
}

// A CPU backend with the default options.
inline LinearBackend* TestCpuBackend() {
  static CpuBackend* cpu = [] {
    auto c = CpuBackend::Create({});
    return c.ok() ? c->release() : nullptr;
  }();
  return cpu;
}

}  // namespace tensorcheck::testing
