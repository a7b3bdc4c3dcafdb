// Reduced-precision float formats: bf16, fp16 and TF32 conversion and
// rounding.
//
// bf16 and fp16 values travel as their 16-bit patterns (uint16_t). Every
// conversion to a wider format is exact; every narrowing rounds to nearest,
// ties to even (IEEE 754 default), unless a TF32 rounding variant says
// otherwise.
//
//   float x = 1.00390625f;                  // 1 + 2^-8
//   RoundToBf16(x) == 1.0f;                 // tie, rounds to even
//   Bf16BitsToFloat(FloatToBf16Bits(x)) == RoundToBf16(x);
//   RoundToTf32(x, Tf32Rounding::kTruncate) == 1.0f;
#pragma once

#include <cstdint>
#include <cstring>

#include "server/core/tf32_rounding.h"

namespace tensorcheck {

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

inline float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

inline uint64_t DoubleBits(double d) {
  uint64_t u;
  std::memcpy(&u, &d, sizeof(u));
  return u;
}

inline double BitsToDouble(uint64_t u) {
  double d;
  std::memcpy(&d, &u, sizeof(d));
  return d;
}

// ---- bf16: 1 sign, 8 exponent, 7 mantissa bits (the top half of fp32).

inline float Bf16BitsToFloat(uint16_t bits) {
  return BitsToFloat(static_cast<uint32_t>(bits) << 16);
}

// Round to nearest even; NaN stays NaN (quiet, sign kept).
inline uint16_t FloatToBf16Bits(float f) {
  const uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((u >> 16) | 0x0040u);
  }
  const uint32_t lsb = (u >> 16) & 1u;
  return static_cast<uint16_t>((u + 0x7fffu + lsb) >> 16);
}

inline float RoundToBf16(float f) { return Bf16BitsToFloat(FloatToBf16Bits(f)); }

// ---- fp16: 1 sign, 5 exponent, 10 mantissa bits; max 65504.

float Fp16BitsToFloat(uint16_t bits);

// Round to nearest even; overflow goes to infinity; NaN stays NaN.
uint16_t FloatToFp16Bits(float f);

// Same, from a double in one rounding (no double rounding through fp32).
uint16_t DoubleToFp16Bits(double d);

// Same for bf16, from a double in one rounding.
uint16_t DoubleToBf16Bits(double d);

inline float RoundToFp16(float f) { return Fp16BitsToFloat(FloatToFp16Bits(f)); }

// ---- TF32: fp32's exponent range with a 10-bit mantissa. Tf32Rounding and
// RoundToTf32(float, Tf32Rounding) are in tf32_rounding.h, written once for
// host and device (the device kernels round TF32 inputs with the same code).

// Rounds a double to fp32 (the C++ conversion, round to nearest even).
inline float RoundToFp32(double d) { return static_cast<float>(d); }

}  // namespace tensorcheck
