#include "server/core/float_formats.h"

#include <cmath>

namespace tensorcheck {

float Fp16BitsToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exp = (bits >> 10) & 0x1fu;
  const uint32_t mant = bits & 0x3ffu;
  if (exp == 0x1f) return BitsToFloat(sign | 0x7f800000u | (mant << 13));
  if (exp != 0) return BitsToFloat(sign | ((exp + 112u) << 23) | (mant << 13));
  // Zero or subnormal: mant * 2^-24, exact in fp32.
  const float magnitude = std::ldexp(static_cast<float>(mant), -24);
  return sign ? -magnitude : magnitude;
}

namespace {

// Encodes a double as fp16 bits, rounding once to nearest even.
uint16_t EncodeFp16(double d) {
  const uint16_t sign = std::signbit(d) ? 0x8000u : 0u;
  if (std::isnan(d)) return sign | 0x7e00u;
  const double a = std::fabs(d);
  if (std::isinf(a)) return sign | 0x7c00u;
  if (a == 0.0) return sign;
  int e = std::ilogb(a);  // a in [2^e, 2^(e+1))
  if (e < -14) e = -14;   // subnormal range shares the quantum 2^-24
  // Quantum at this exponent is 2^(e-10); nearbyint rounds to even.
  const double q = std::nearbyint(std::ldexp(a, 10 - e));  // in [0, 2048]
  double value = std::ldexp(q, e - 10);
  if (value > 65504.0) return sign | 0x7c00u;
  // Re-derive fields from the rounded value (handles carry into exponent).
  if (value < std::ldexp(1.0, -14)) {
    return sign | static_cast<uint16_t>(std::ldexp(value, 24));
  }
  const int re = std::ilogb(value);
  const uint16_t mant = static_cast<uint16_t>(std::ldexp(value, 10 - re) - 1024.0);
  return sign | static_cast<uint16_t>((re + 15) << 10) | mant;
}

}  // namespace

uint16_t FloatToFp16Bits(float f) { return EncodeFp16(static_cast<double>(f)); }

uint16_t DoubleToFp16Bits(double d) { return EncodeFp16(d); }

uint16_t DoubleToBf16Bits(double d) {
  if (std::isnan(d)) {
    return static_cast<uint16_t>((std::signbit(d) ? 0x8000u : 0u) | 0x7fc0u);
  }
  // Round to fp32 toward zero first, keeping a sticky bit, so that the
  // final rounding to bf16 happens once.
  float f = static_cast<float>(d);
  if (std::isinf(f) || static_cast<double>(f) == d) return FloatToBf16Bits(f);
  // f is d rounded to nearest fp32; if that rounding crossed a bf16
  // tie point the result could be double-rounded. Step f toward d's side so
  // the discarded bits carry the sticky information.
  float toward_zero = f;
  if (std::fabs(static_cast<double>(f)) > std::fabs(d)) {
    toward_zero = std::nextafter(f, 0.0f);
  }
  uint32_t u = FloatBits(toward_zero) | 1u;  // sticky: d is not exact here
  return FloatToBf16Bits(BitsToFloat(u));
}

}  // namespace tensorcheck
