// An independent reference for rounding to binary floating-point formats,
// written out from the formats' definitions (integer part and remainder of
// the scaled value), not from server/core's float_formats: tests check the
// code under test against it.
//
//   RefRound(x, kBf16Format)                 // nearest, ties to even
//   RefRound(x, kTf32Format, Tie::kAway)     // nearest, ties away from zero
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>

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

}  // namespace tensorcheck::testing
