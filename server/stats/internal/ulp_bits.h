// The ULP arithmetic of the statistics kernels on raw bit patterns, inline
// for their per-element loops. ulp.h is the public face of the same rules.
#pragma once

#include <cstdint>

#include "server/core/dtype.h"
#include "server/stats/ulp.h"

namespace tensorcheck::internal {

// Histogram bucket of distance `d` (UlpHistogramBucket): index 0 holds
// distance 0, index i >= 1 holds (2^(i-2), 2^(i-1)] (1, 2, 3-4, 5-8, ...).
// Distances stay below 2^64, so index 65 is the last.
inline int BucketIndex(uint64_t d) {
  // Branch-free for the common range: ceil(log2(d)) + 1 == bit length of
  // 2(d-1)+1; d == 0 selects 0.
  if (d > (uint64_t{1} << 62)) return 1 + (64 - __builtin_clzll(d - 1));
  const int b = 64 - __builtin_clzll(((d - 1) << 1) | 1);
  return d == 0 ? 0 : b;
}

// Bit layout of the compared dtype, for ordered-integer ULP distances.
struct BitLayout {
  uint64_t sign;
  uint64_t magnitude;  // ~sign within the width
  uint64_t inf;        // magnitude bits of +inf; larger is NaN
};

inline BitLayout LayoutOf(DType d) {
  switch (d) {
    case DType::kFloat64:
      return {uint64_t{1} << 63, ~(uint64_t{1} << 63), 0x7ff0000000000000ull};
    case DType::kFloat32:
      return {0x80000000ull, 0x7fffffffull, 0x7f800000ull};
    case DType::kFloat16:
      return {0x8000ull, 0x7fffull, 0x7c00ull};
    case DType::kBFloat16:
      return {0x8000ull, 0x7fffull, 0x7f80ull};
  }
  return {0x80000000ull, 0x7fffffffull, 0x7f800000ull};
}

// Distance between two non-NaN bit patterns: values ordered as integers,
// negative ones mirrored, so +0 and -0 coincide.
inline uint64_t OrderedDistance(uint64_t a, uint64_t b, const BitLayout& l) {
  const uint64_t ma = a & l.magnitude;
  const uint64_t mb = b & l.magnitude;
  if ((a & l.sign) == (b & l.sign)) return ma > mb ? ma - mb : mb - ma;
  return ma + mb;
}

// OrderedDistance, with NaN against a number kUlpInfinite and NaN against
// NaN 0.
inline uint64_t DistanceFromBits(uint64_t a, uint64_t b, const BitLayout& l) {
  const bool nan_a = (a & l.magnitude) > l.inf;
  const bool nan_b = (b & l.magnitude) > l.inf;
  if (nan_a || nan_b) return nan_a && nan_b ? 0 : kUlpInfinite;
  return OrderedDistance(a, b, l);
}

// Ordered integer of a bit pattern `width` <= 32 bits wide: negative
// values mirrored, so +0 and -0 both map to 0.
inline int64_t OrderedInt(uint64_t bits, int width) {
  // Sign-extend, then map sign-magnitude to two's complement.
  const int64_t x = static_cast<int64_t>(bits << (64 - width)) >> (64 - width);
  const int64_t min = -(int64_t{1} << (width - 1));
  return x < 0 ? min - x : x;
}

}  // namespace tensorcheck::internal
