// The device intrinsics of the device comparison and their host
// equivalents, so that its per-thread code (compare_thread.h, the lean path,
// the iteration, narrow_patterns.h) is written once and compiles for both:
// nvcc's device pass calls the intrinsic; a host compiler (nvcc's host pass,
// or a plain C++ compiler in a build without CUDA) the equivalent written
// here. On the host no CUDA header is included, so that the tests of that
// code (CompareThreadTest, NarrowPatternsTest) build and run on any machine
// (internal to this folder).
//
//   const float f = dev::LoadBFloat16(p, i);      // element i, widened exactly
//   const unsigned short h = dev::HalfBits(0.1);  // 0x2e66 on host and device
//   Vec16 raw = a4[q];                            // four 32-bit words: raw.x .. raw.w
//
// A host "thread" runs alone: its atomics are plain adds. The host's 16-bit
// conversions are those of CUDA's own host code (cuda_fp16.hpp,
// cuda_bf16.hpp): to nearest, ties to even, in one rounding, and a NaN
// becomes the canonical 0x7fff (0x7fffffff when an fp16 NaN is widened).
// The intrinsics the shared element rules need as well (CountLeadingZeros64,
// AddRn, MulRn) are in core/host_device.h.
#pragma once

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math_constants.h>
#endif

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "core/host_device.h"

namespace tensorcheck::cuda {

// 16 bytes of storage as four 32-bit words x, y, z, w (the unit of the
// vectorised loads): CUDA's uint4 under nvcc, a struct of the same layout
// and alignment on a plain host compiler.
#if defined(__CUDACC__)
using Vec16 = ::uint4;
#else
struct alignas(16) Vec16 {
  unsigned int x, y, z, w;
};
#endif

namespace cmp {

using ull = unsigned long long;

// The host equivalents of the 16-bit conversions (what CUDA's headers do on
// the host), callable from any host code.
namespace host {

// v rounded to the nearest 16-bit pattern (ties to even) of a format with
// kExponentBits and kMantissaBits (fp16: 5 and 10; bf16: 8 and 7), in one
// rounding; overflow to infinity, NaN to 0x7fff.
template <int kExponentBits, int kMantissaBits>
inline unsigned short RoundTo16(double v) {
  ull u;
  std::memcpy(&u, &v, sizeof u);
  const unsigned int sign = static_cast<unsigned int>(u >> 48) & 0x8000u;
  const ull magnitude = u & ~(1ull << 63);
  if (magnitude > 0x7ff0000000000000ull) return 0x7fff;
  constexpr int kBias = (1 << (kExponentBits - 1)) - 1;
  constexpr unsigned int kInf = ((1u << kExponentBits) - 1) << kMantissaBits;
  const int field = static_cast<int>(magnitude >> 52);
  // Zero, or a double subnormal: below half the least 16-bit subnormal.
  if (field == 0) return static_cast<unsigned short>(sign);
  const int e = field - 1023;  // |v| = m 2^(e-52) with m in [2^52, 2^53)
  if (e > kBias) return static_cast<unsigned short>(sign | kInf);  // and the infinities
  const ull m = (magnitude & ((1ull << 52) - 1)) | (1ull << 52);
  // The result's binade: e's, or the subnormals' (which share 1 - kBias).
  const int binade = e > 1 - kBias ? e : 1 - kBias;
  const int shift = 52 - kMantissaBits + (binade - e);
  if (shift > 53) return static_cast<unsigned short>(sign);  // below half the least subnormal
  ull q = m >> shift;                                        // whole quanta of the result's binade
  const ull rest = m & ((1ull << shift) - 1), half = 1ull << (shift - 1);
  if (rest > half || (rest == half && (q & 1) != 0)) ++q;
  // q counts the implicit bit (or not, for a subnormal); a carry out of the
  // mantissa moves to the next binade, past the largest value to infinity.
  const ull bits = (ull(binade + kBias - 1) << kMantissaBits) + q;
  return static_cast<unsigned short>(sign |
                                     (bits >= kInf ? kInf : static_cast<unsigned int>(bits)));
}

// An fp16 pattern widened exactly to float; a NaN to 0x7fffffff.
inline float HalfToFloat(unsigned short h) {
  const unsigned int sign = (h & 0x8000u) << 16, exponent = (h >> 10) & 0x1fu,
                     mantissa = h & 0x3ffu;
  unsigned int bits;
  if (exponent == 0x1fu) {
    bits = mantissa != 0 ? 0x7fffffffu : sign | 0x7f800000u;
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  } else {  // zero or subnormal: mantissa 2^-24, exact in float
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return sign != 0 ? -magnitude : magnitude;
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// A bf16 pattern widened exactly to float (the top half of its bits).
inline float BFloat16ToFloat(unsigned short b) {
  const unsigned int bits = static_cast<unsigned int>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

}  // namespace host

// ---- the intrinsics

namespace dev {

TC_HOST_DEVICE ull DoubleBits(double v) { return static_cast<ull>(BitsOfDouble(v)); }
TC_HOST_DEVICE double DoubleOf(ull b) { return DoubleOfBits(static_cast<uint64_t>(b)); }
TC_HOST_DEVICE unsigned int FloatBits(float v) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(v);
#else
  unsigned int b;
  std::memcpy(&b, &v, sizeof b);
  return b;
#endif
}
TC_HOST_DEVICE float FloatOf(unsigned int b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  float v;
  std::memcpy(&v, &b, sizeof v);
  return v;
#endif
}
TC_HOST_DEVICE float ToFloat(double v) {  // to nearest even
#if defined(__CUDA_ARCH__)
  return __double2float_rn(v);
#else
  return static_cast<float>(v);
#endif
}
// Element i of an array of fp16 (bf16) values, widened exactly to float.
TC_HOST_DEVICE float LoadHalf(const void* p, int64_t i) {
#if defined(__CUDA_ARCH__)
  return __half2float(static_cast<const __half*>(p)[i]);
#else
  return host::HalfToFloat(static_cast<const unsigned short*>(p)[i]);
#endif
}
TC_HOST_DEVICE float LoadBFloat16(const void* p, int64_t i) {
#if defined(__CUDA_ARCH__)
  return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
#else
  return host::BFloat16ToFloat(static_cast<const unsigned short*>(p)[i]);
#endif
}
// An fp16 pattern widened exactly to float.
TC_HOST_DEVICE float HalfToFloat(unsigned short h) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(h));
#else
  return host::HalfToFloat(h);
#endif
}
// The fp16 (bf16) pattern of v, rounded once to nearest even.
TC_HOST_DEVICE unsigned short HalfBits(double v) {
#if defined(__CUDA_ARCH__)
  return __half_as_ushort(__double2half(v));
#else
  return host::RoundTo16<5, 10>(v);
#endif
}
TC_HOST_DEVICE unsigned short BFloat16Bits(double v) {
#if defined(__CUDA_ARCH__)
  return __bfloat16_as_ushort(__double2bfloat16(v));
#else
  return host::RoundTo16<8, 7>(v);
#endif
}
TC_HOST_DEVICE double Inf() {
#if defined(__CUDA_ARCH__)
  return CUDART_INF;
#else
  return std::numeric_limits<double>::infinity();
#endif
}
TC_HOST_DEVICE int Popc(unsigned int v) {
#if defined(__CUDA_ARCH__)
  return __popc(v);
#else
  return __builtin_popcount(v);
#endif
}
TC_HOST_DEVICE int Ffs(unsigned int v) {  // 1 + the lowest set bit; 0 for 0
#if defined(__CUDA_ARCH__)
  return __ffs(static_cast<int>(v));
#else
  return __builtin_ffs(static_cast<int>(v));
#endif
}
template <typename T>
TC_HOST_DEVICE T AtomicAdd(T* p, T v) {  // returns the old value
#if defined(__CUDA_ARCH__)
  return atomicAdd(p, v);
#else
  const T old = *p;
  *p += v;
  return old;
#endif
}
#if defined(__CUDA_ARCH__)
TC_HOST_DEVICE unsigned int Min(unsigned int a, unsigned int b) { return min(a, b); }
TC_HOST_DEVICE unsigned int Max(unsigned int a, unsigned int b) { return max(a, b); }
TC_HOST_DEVICE ull Max(ull a, ull b) { return max(a, b); }
#else
TC_HOST_DEVICE unsigned int Min(unsigned int a, unsigned int b) { return a < b ? a : b; }
TC_HOST_DEVICE unsigned int Max(unsigned int a, unsigned int b) { return a > b ? a : b; }
TC_HOST_DEVICE ull Max(ull a, ull b) { return a > b ? a : b; }
#endif
// Classification and |v|: core/host_device.h's, shared with stats'
// rules.
using ::tensorcheck::hd_math::IsFinite;
using ::tensorcheck::hd_math::IsInf;
using ::tensorcheck::hd_math::IsNan;
TC_HOST_DEVICE double Abs(double v) { return ::tensorcheck::hd_math::Fabs(v); }

}  // namespace dev
}  // namespace cmp
}  // namespace tensorcheck::cuda
