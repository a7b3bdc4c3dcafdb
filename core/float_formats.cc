#include "core/float_formats.h"

#include <algorithm>
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

namespace {

struct Fp8Spec {
  int mantissa_bits;
  int bias;
  double max_finite;
  uint8_t max_bits;  // the largest finite value's pattern, sign clear
  uint8_t nan_bits;
  bool has_infinity;  // 0x7c (E5M2)
};

constexpr Fp8Spec kE4M3Fn{3, 7, 448.0, 0x7e, 0x7f, false};
constexpr Fp8Spec kE5M2{2, 15, 57344.0, 0x7b, 0x7e, true};

const Fp8Spec& SpecOf(Fp8Format format) { return format == Fp8Format::kE4M3Fn ? kE4M3Fn : kE5M2; }

float DecodeFp8(uint8_t bits, const Fp8Spec& spec) {
  const int m_bits = spec.mantissa_bits;
  const int e_bits = 7 - m_bits;
  const bool negative = (bits & 0x80u) != 0;
  const int exponent = (bits >> m_bits) & ((1 << e_bits) - 1);
  const int mantissa = bits & ((1 << m_bits) - 1);
  const int e_max_field = (1 << e_bits) - 1;
  float magnitude;
  if (spec.has_infinity && exponent == e_max_field) {
    magnitude = mantissa == 0 ? INFINITY : NAN;
  } else if (!spec.has_infinity && (bits & 0x7fu) == 0x7fu) {
    magnitude = NAN;
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), 1 - spec.bias - m_bits);
  } else {
    magnitude =
        std::ldexp(static_cast<float>(mantissa + (1 << m_bits)), exponent - spec.bias - m_bits);
  }
  return negative ? -magnitude : magnitude;
}

struct Fp8Table {
  float values[256];
  explicit Fp8Table(const Fp8Spec& spec) {
    for (int b = 0; b < 256; ++b) values[b] = DecodeFp8(static_cast<uint8_t>(b), spec);
  }
};

}  // namespace

float Fp8BitsToFloat(uint8_t bits, Fp8Format format) {
  static const Fp8Table e4m3(kE4M3Fn);
  static const Fp8Table e5m2(kE5M2);
  return (format == Fp8Format::kE4M3Fn ? e4m3 : e5m2).values[bits];
}

double Fp8MaxFinite(Fp8Format format) { return SpecOf(format).max_finite; }

uint8_t DoubleToFp8Bits(double d, Fp8Format format, Fp8Overflow overflow) {
  const Fp8Spec& spec = SpecOf(format);
  const uint8_t sign = std::signbit(d) ? 0x80u : 0u;
  if (std::isnan(d)) return sign | spec.nan_bits;
  const uint8_t too_large = overflow == Fp8Overflow::kSaturate ? spec.max_bits
                            : spec.has_infinity                ? uint8_t{0x7c}
                                                               : spec.nan_bits;
  const double a = std::fabs(d);
  if (std::isinf(a)) return sign | too_large;
  if (a == 0) return sign;
  // The quantum at a's exponent (no smaller than the subnormals'), and a
  // rounded to a multiple of it: an exact division by a power of two,
  // then one rounding to nearest even.
  const int e_min = 1 - spec.bias;
  const int m_bits = spec.mantissa_bits;
  const int e = std::max(std::ilogb(a), e_min);
  const double quantum = std::ldexp(1.0, e - m_bits);
  const double q = std::nearbyint(a / quantum);
  const double r = q * quantum;
  if (r > spec.max_finite) return sign | too_large;
  if (r < std::ldexp(1.0, e_min)) return sign | static_cast<uint8_t>(q);  // subnormal
  const int r_exp = std::ilogb(r);  // e, or e + 1 when q carried to 2^(m+1)
  const int mantissa = static_cast<int>(std::ldexp(r, m_bits - r_exp)) - (1 << m_bits);
  return sign | static_cast<uint8_t>(((r_exp + spec.bias) << m_bits) | mantissa);
}

}  // namespace tensorcheck
