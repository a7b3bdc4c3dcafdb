// Reduced-precision float formats: bf16, fp16, FP8 and TF32 conversion and
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

#include "core/tf32_rounding.h"

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

// Toward zero: the low 16 bits cleared, as XLA's multi-pass dot algorithms
// cut the high parts (a NaN whose payload sits in those bits becomes an
// infinity there too).
inline float TruncateToBf16(float f) { return BitsToFloat(FloatBits(f) & 0xffff0000u); }

// ---- fp16: 1 sign, 5 exponent, 10 mantissa bits; max 65504.

float Fp16BitsToFloat(uint16_t bits);

// Round to nearest even; overflow goes to infinity; NaN stays NaN.
uint16_t FloatToFp16Bits(float f);

// Same, from a double in one rounding (no double rounding through fp32).
uint16_t DoubleToFp16Bits(double d);

// Same for bf16, from a double in one rounding.
uint16_t DoubleToBf16Bits(double d);

inline float RoundToFp16(float f) { return Fp16BitsToFloat(FloatToFp16Bits(f)); }

// ---- FP8 (OCP 8-bit floating point; torch.float8_e4m3fn, float8_e5m2).
// E4M3FN: 1 sign, 4 exponent (bias 7), 3 mantissa bits, no infinities,
// 0x7f/0xff NaN, largest finite 448. E5M2: 1 sign, 5 exponent (bias 15), 2
// mantissa bits, IEEE infinities and NaNs, largest finite 57344. Both have
// subnormals. docs/numerics.md, "FP8".
//
//   Fp8BitsToFloat(0x7e, Fp8Format::kE4M3Fn) == 448.0f;
//   DoubleToFp8Bits(464.0, Fp8Format::kE4M3Fn) == 0x7e;   // tie: to even, 448
//   DoubleToFp8Bits(500.0, Fp8Format::kE4M3Fn) == 0x7f;   // NaN: no infinity
//   DoubleToFp8Bits(500.0, Fp8Format::kE4M3Fn, Fp8Overflow::kSaturate) == 0x7e;

enum class Fp8Format { kE4M3Fn, kE5M2 };

// What a value beyond the largest finite one (after rounding) becomes.
enum class Fp8Overflow {
  // As ml_dtypes' casts: infinity for E5M2, NaN for E4M3FN (which has
  // none); infinities likewise. torch's E5M2 cast does the same.
  kNonSaturating,
  // The largest finite value of that sign, infinities included: the cast
  // of a quantisation recipe (torchao's to_fp8_saturated), and torch's own
  // E4M3FN cast (torch 2.15 measured: 500 and inf give 448). NaN stays NaN.
  kSaturate,
};

// Exact.
float Fp8BitsToFloat(uint8_t bits, Fp8Format format);

// Rounds to nearest, ties to even, once (no double rounding through fp32).
// NaN becomes NaN with its sign.
uint8_t DoubleToFp8Bits(double d, Fp8Format format,
                        Fp8Overflow overflow = Fp8Overflow::kNonSaturating);

// 448 or 57344.
double Fp8MaxFinite(Fp8Format format);

// ---- TF32: fp32's exponent range with a 10-bit mantissa. Tf32Rounding and
// RoundToTf32(float, Tf32Rounding) are in tf32_rounding.h, written once for
// host and device (the device kernels round TF32 inputs with the same code).

// Rounds a double to fp32 (the C++ conversion, round to nearest even).
inline float RoundToFp32(double d) { return static_cast<float>(d); }

}  // namespace tensorcheck
