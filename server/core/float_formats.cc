#include "server/core/float_formats.h"

#include <cmath>
#include <cstring>

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

// Encodes a double as fp16 bits, rounding once to nearest even, on the
// double's bits (this runs for every input and output element of the fp16
// configurations; the library's ilogb/ldexp took a third of a diagnosis).
uint16_t EncodeFp16(double d) {
  uint64_t bits;
  std::memcpy(&bits, &d, sizeof bits);
  const uint16_t sign = static_cast<uint16_t>((bits >> 48) & 0x8000u);
  const int biased = static_cast<int>((bits >> 52) & 0x7ffu);
  const uint64_t fraction = bits & ((uint64_t{1} << 52) - 1);
  if (biased == 0x7ff) return sign | (fraction != 0 ? 0x7e00u : 0x7c00u);
  // |d| >= 65520 (the tie between 65504 and 2^16) rounds to infinity.
  if (biased >= 1023 + 16 || (biased == 1023 + 15 && fraction >= (uint64_t{0xffe} << 40))) {
    return sign | 0x7c00u;
  }
  if (biased == 0) return sign;  // zero, or a double subnormal: far below 2^-25
  const int e = biased - 1023;   // |d| in [2^e, 2^(e+1))
  const uint64_t m = fraction | (uint64_t{1} << 52);
  // Bits of m below the fp16 quantum at this exponent, 2^(max(e, -14) - 10).
  const int shift = e >= -14 ? 42 : 28 - e;
  if (shift > 53) return sign;  // below 2^-25: rounds to zero
  uint64_t q = m >> shift;
  const uint64_t rest = m & ((uint64_t{1} << shift) - 1);
  const uint64_t half = uint64_t{1} << (shift - 1);
  if (rest > half || (rest == half && (q & 1))) ++q;
  if (e < -14) return sign | static_cast<uint16_t>(q);  // 1024 is the least normal
  // q in [1024, 2048]: 2048 carries into the exponent.
  const int exponent = e + 15 + (q == 2048 ? 1 : 0);
  const uint16_t mantissa = static_cast<uint16_t>(q == 2048 ? 0 : q - 1024);
  return sign | static_cast<uint16_t>(exponent << 10) | mantissa;
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
