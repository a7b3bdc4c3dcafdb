// ULP distances and bit patterns in a compared dtype: what Compare measures
// element by element, available on its own.
//
//   UlpDistance(1.0, 1.0 + 0x1p-23, DType::kFloat32);   // 1
//   UlpDistance(0x1p-149, -0x1p-149, DType::kFloat32);  // 2 (across zero)
//   BitsIn(1.0, DType::kBFloat16);                      // 0x3f80
//   UlpHistogramBucket(3);                              // 3 (the 3-4 bucket)
//
// Pure functions, safe from any thread. diff_stats.h includes this header,
// so its users see these declarations as before. The rules behind them are
// element_rules.h's, which the device comparison shares.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "server/stats/element_rules.h"

namespace tensorcheck {

// Bit pattern of `v` rounded to `dtype` (to nearest even).
uint64_t BitsIn(double v, DType dtype);

// Distance in units in the last place of `dtype` between a and b, each
// rounded to `dtype` first: the number of representable values between
// them, counting across zero (+0 and -0 are 0 apart). NaN against a
// non-NaN is kUlpInfinite; NaN against NaN is 0.
inline constexpr uint64_t kUlpInfinite = rules::kUlpInfinite;
uint64_t UlpDistance(double a, double b, DType dtype);

// ULP histogram: bucket 0 holds distance 0, bucket i >= 1 holds
// (2^(i-2), 2^(i-1)] (1, 2, 3-4, 5-8, ...); 65 is the last finite one.
inline constexpr int kUlpHistogramBuckets = rules::kUlpBuckets;

// The shared rules' element type of a DType (element_rules.h cannot name
// DType, which is not nvcc-safe): the same values in the same order. The
// stats kernels and the device comparison's arguments both map with it.
static_assert(static_cast<int>(DType::kFloat64) == static_cast<int>(rules::ElemType::kF64) &&
                  static_cast<int>(DType::kFloat32) == static_cast<int>(rules::ElemType::kF32) &&
                  static_cast<int>(DType::kFloat16) == static_cast<int>(rules::ElemType::kF16) &&
                  static_cast<int>(DType::kBFloat16) == static_cast<int>(rules::ElemType::kBF16),
              "rules::ElemType follows DType");
inline rules::ElemType ElemTypeOf(DType d) { return static_cast<rules::ElemType>(d); }
int UlpHistogramBucket(uint64_t ulp);

}  // namespace tensorcheck
