// An independent reference for rounding to binary floating-point formats,
// written out from the formats' definitions (integer part and remainder of
// the scaled value), not from core's float_formats: tests check the
// code under test against it.
//
//   RefRound(x, kBf16Format)                 // nearest, ties to even
//   RefRound(x, kTf32Format, Tie::kAway)     // nearest, ties away from zero
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

namespace tensorcheck::testing {

struct Format {
  int mant;  // fraction bits
  int emin;  // exponent of the smallest normal
  int emax;  // exponent of the largest finite
};
inline constexpr Format kFp32Format{23, -126, 127};
inline constexpr Format kTf32Format{10, -126, 127};
inline constexpr Format kBf16Format{7, -126, 127};
inline constexpr Format kFp16Format{10, -14, 15};

enum class Tie { kEven, kAway, kTruncate };

// `v` rounded to `f` (overflow to infinity, subnormals below emin).
inline double RefRound(double v, Format f, Tie tie = Tie::kEven) {
  if (v == 0.0 || !std::isfinite(v)) return v;
  const double a = std::fabs(v);
  int e = 0;
  std::frexp(a, &e);  // a in [2^(e-1), 2^e)
  e = std::max(e - 1, f.emin);
  const double scaled = std::ldexp(a, f.mant - e);  // exact: a power-of-two scale
  const double whole = std::floor(scaled);
  const double rem = scaled - whole;
  double q = whole;
  switch (tie) {
    case Tie::kEven:
      if (rem > 0.5 || (rem == 0.5 && std::fmod(whole, 2.0) == 1.0)) q += 1.0;
      break;
    case Tie::kAway:
      if (rem >= 0.5) q += 1.0;
      break;
    case Tie::kTruncate:
      break;
  }
  double r = std::ldexp(q, e - f.mant);
  const double max_finite = std::ldexp(2.0 - std::ldexp(1.0, -f.mant), f.emax);
  if (r > max_finite) r = std::numeric_limits<double>::infinity();
  return std::copysign(r, v);
}

// FP8 by brute force: the pattern whose value (from the format's
// definition) is nearest to v, ties to the even pattern; nullopt when v is
// beyond the largest finite value by half a step or more (a tie there goes
// to the even neighbour: 448 for e4m3fn, whose 0x7e is even; for e5m2 the
// even neighbour of 57344 (0x7b) is 2^16, an overflow).
//
//   RefFp8Value(0x7e, /*e4m3=*/true) == 448
//   RefFp8Nearest(300.0, /*e4m3=*/true) == 0x79   // 288
inline double RefFp8Value(int bits, bool e4m3) {
  const int m_bits = e4m3 ? 3 : 2;
  const int bias = e4m3 ? 7 : 15;
  const int e = (bits & 0x7f) >> m_bits;
  const int m = bits & ((1 << m_bits) - 1);
  double v;
  if (e4m3 && (bits & 0x7f) == 0x7f) {
    v = std::numeric_limits<double>::quiet_NaN();
  } else if (!e4m3 && e == 31) {
    v = m == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else if (e == 0) {
    v = m * std::pow(2.0, 1 - bias - m_bits);
  } else {
    v = std::pow(2.0, e - bias) * (1.0 + m / std::pow(2.0, m_bits));
  }
  return (bits & 0x80) ? -v : v;
}

inline std::optional<int> RefFp8Nearest(double v, bool e4m3) {
  const double max = e4m3 ? 448.0 : 57344.0;
  const double top_step = e4m3 ? 32.0 : 8192.0;
  if (std::isnan(v)) return std::nullopt;
  if (std::fabs(v) >= max + top_step / 2) {
    if (e4m3 && std::fabs(v) == max + top_step / 2) return v < 0 ? 0xfe : 0x7e;
    return std::nullopt;
  }
  int best = -1;
  double best_d = std::numeric_limits<double>::infinity();
  for (int b = 0; b < 256; ++b) {
    const double c = RefFp8Value(b, e4m3);
    if (!std::isfinite(c) || std::signbit(c) != std::signbit(v)) continue;
    const double d = std::fabs(c - v);
    if (d < best_d || (d == best_d && (b & 1) == 0)) {
      best = b;
      best_d = d;
    }
  }
  return best;
}

// The saturating cast of the scaling recipes: v's nearest FP8 value, and
// beyond the largest finite one that value of v's sign (NaN stays NaN).
inline double RefFp8Saturated(double v, bool e4m3) {
  const double max = e4m3 ? 448.0 : 57344.0;
  if (std::isnan(v)) return v;
  if (std::fabs(v) >= max) return v < 0 ? -max : max;
  return RefFp8Value(*RefFp8Nearest(v, e4m3), e4m3);
}

}  // namespace tensorcheck::testing
