// Whether the CPU emulations' AVX2 kernels may run (fp16_accumulate.cc,
// fp8_accumulate.cc): they are compiled for AVX2 and FMA and chosen at run
// time, so the CPU must have both; and the portable path can be forced,
// per kernel, by an environment variable, which the tests and benchmarks
// use to exercise and time it.
//
//   if (UseAvx2Kernel("TENSORCHECK_FP16ACC_SCALAR")) { ... the AVX2 path ... }
#pragma once

#include <cstdlib>
#include <cstring>

namespace tensorcheck::internal {

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// The CPU has AVX2 and FMA, and `scalar_env` is unset, empty or "0".
inline bool UseAvx2Kernel(const char* scalar_env) {
  static const bool supported = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  const char* force_scalar = std::getenv(scalar_env);
  if (force_scalar != nullptr && force_scalar[0] != '\0' && std::strcmp(force_scalar, "0") != 0) {
    return false;
  }
  return supported;
}
#endif

}  // namespace tensorcheck::internal
