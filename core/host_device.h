// Qualifiers for code written once and compiled for host and device alike
// (CUTLASS's CUTLASS_HOST_DEVICE, helper_macros.hpp), and the few portable
// intrinsics such code needs. Without nvcc every macro is plain C++ and no
// CUDA header is included, so the rules that use them (stats'
// element_rules.h, the device comparison's per-thread code) build and are
// tested in a build without CUDA too.
//
//   TC_HOST_DEVICE int BitLength(uint64_t v) {  // g++ and nvcc alike
//     return v == 0 ? 0 : 64 - CountLeadingZeros64(v);
//   }
//   TC_UNROLL
//   for (int j = 0; j < 8; ++j) { ... }  // unrolled by nvcc's device pass
//
// TC_HOST_DEVICE is, as CUTLASS's, a qualifier of inline functions:
// __host__ __device__ __forceinline__ under nvcc, `inline` elsewhere.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define TC_HOST_DEVICE __host__ __device__ __forceinline__
// Before a host-and-device template that calls what it is given: a device
// instance may call device-only functions (lambdas of a kernel).
#define TC_EXEC_CHECK_DISABLE _Pragma("nv_exec_check_disable")
#else
#define TC_HOST_DEVICE inline
#define TC_EXEC_CHECK_DISABLE
#endif

// Loop unrolling hints for nvcc's device pass only (a host compiler would
// warn about an unknown pragma).
#if defined(__CUDA_ARCH__)
#define TC_PRAGMA(x) _Pragma(#x)
#else
#define TC_PRAGMA(x)
#endif
#define TC_UNROLL TC_PRAGMA(unroll)
#define TC_NO_UNROLL TC_PRAGMA(unroll 1)

namespace tensorcheck {

// The number of leading zero bits of v != 0 (0 to 63): __clzll on the
// device, the compiler's builtin on the host.
TC_HOST_DEVICE int CountLeadingZeros64(uint64_t v) {
#if defined(__CUDA_ARCH__)
  return __clzll(static_cast<long long>(v));
#else
  return __builtin_clzll(v);
#endif
}

// The bits of a double, and the double of bits: reinterpretations on the
// device, memcpy on the host.
TC_HOST_DEVICE uint64_t BitsOfDouble(double v) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint64_t>(__double_as_longlong(v));
#else
  uint64_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
#endif
}
TC_HOST_DEVICE double DoubleOfBits(uint64_t b) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(b));
#else
  double v;
  std::memcpy(&v, &b, sizeof v);
  return v;
#endif
}

// a + b and a * b, each rounded to nearest even on its own. nvcc's device
// pass fuses a product into a following add (one FMA, one rounding) unless
// told not to; these never fuse there. On the host they are the plain
// operators, contracted or not as the build's -ffp-contract says (no FMA
// on the x86-64 baseline the build targets).
TC_HOST_DEVICE double AddRn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
TC_HOST_DEVICE double MulRn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

// The classification and the few math functions that host-and-device
// rules use: the CUDA math library in nvcc's device pass, <cmath>
// elsewhere (correctly rounded on both sides but Tanh).
namespace hd_math {

TC_HOST_DEVICE double Infinity() { return DoubleOfBits(0x7ff0000000000000ull); }
#if defined(__CUDA_ARCH__)
TC_HOST_DEVICE double Sqrt(double v) { return sqrt(v); }
TC_HOST_DEVICE double Tanh(double v) { return tanh(v); }
TC_HOST_DEVICE double Fabs(double v) { return fabs(v); }
TC_HOST_DEVICE bool IsNan(double v) { return isnan(v); }
TC_HOST_DEVICE bool IsInf(double v) { return isinf(v); }
TC_HOST_DEVICE bool IsFinite(double v) { return isfinite(v); }
TC_HOST_DEVICE bool IsFinite(float v) { return isfinite(v); }
#else
TC_HOST_DEVICE double Sqrt(double v) { return std::sqrt(v); }
TC_HOST_DEVICE double Tanh(double v) { return std::tanh(v); }
TC_HOST_DEVICE double Fabs(double v) { return std::fabs(v); }
TC_HOST_DEVICE bool IsNan(double v) { return std::isnan(v); }
TC_HOST_DEVICE bool IsInf(double v) { return std::isinf(v); }
TC_HOST_DEVICE bool IsFinite(double v) { return std::isfinite(v); }
TC_HOST_DEVICE bool IsFinite(float v) { return std::isfinite(v); }
#endif

}  // namespace hd_math
}  // namespace tensorcheck
