// The per-element rules of a comparison, written once for host and device:
// the bit layout of each compared type, the ULP distance between two bit
// patterns, its histogram bucket, and the tolerance rules for a pair of
// finite values. Stats' Compare uses them (ulp.cc, tolerance.h, the block
// kernels through internal/ulp_bits.h), and so does the device comparison
// (server/backends/cuda/compare_thread.h and its lean path): what the host
// tests check is the very code the kernels run.
//
//   const rules::BitLayout l = rules::LayoutOf(rules::ElemType::kBF16);
//   rules::DistanceFromBits(0x3f80, 0xbf80, l);  // 2 * 0x3f80 (1 to -1)
//   rules::BucketIndex(3);                       // 3 (the 3-4 bucket)
//   Tolerance t = ResolveTolerance(TolerancePreset::kTorch, DType::kBFloat16);
//   rules::FinitePairPasses<rules::ToleranceRule::kAbsPlusRel>(
//       t, /*abs_diff=*/1e-3, /*abs_expected=*/1.0, /*bound=*/0, /*ulp=*/0);  // true
//
// Every function is TC_HOST_DEVICE (core/host_device.h): inline for a
// host compiler, __host__ __device__ for nvcc. nvcc's device pass compiles
// this header, so it includes nothing that pass cannot take (no Abseil, no
// <string>) and keys the layouts by ElemType, not by DType
// (core/dtype.h, which uses Abseil); internal/ulp_bits.h maps one to
// the other. Pure functions, safe from any thread. What the rules mean is
// in docs/numerics.md.
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace tensorcheck::rules {

// A compared type: the values of DType (core/dtype.h), in its order.
enum class ElemType : int { kF64 = 0, kF32 = 1, kF16 = 2, kBF16 = 3 };

// The bit layout of a compared type, for ordered-integer ULP distances.
struct BitLayout {
  uint64_t sign;
  uint64_t magnitude;  // ~sign within the width
  uint64_t inf;        // magnitude bits of +inf; larger is NaN
};

TC_HOST_DEVICE constexpr BitLayout LayoutOf(ElemType t) {
  switch (t) {
    case ElemType::kF64:
      return {uint64_t{1} << 63, ~(uint64_t{1} << 63), 0x7ff0000000000000ull};
    case ElemType::kF32:
      return {0x80000000ull, 0x7fffffffull, 0x7f800000ull};
    case ElemType::kF16:
      return {0x8000ull, 0x7fffull, 0x7c00ull};
    case ElemType::kBF16:
      return {0x8000ull, 0x7fffull, 0x7f80ull};
  }
  return {0x80000000ull, 0x7fffffffull, 0x7f800000ull};
}

// The distance of a NaN from a number.
inline constexpr uint64_t kUlpInfinite = ~uint64_t{0};

// Distance between two non-NaN bit patterns: the values ordered as
// integers, negative ones mirrored, so +0 and -0 coincide; the number of
// representable values between them, counting across zero.
TC_HOST_DEVICE uint64_t OrderedDistance(uint64_t a, uint64_t b, const BitLayout& l) {
  const uint64_t ma = a & l.magnitude;
  const uint64_t mb = b & l.magnitude;
  if ((a & l.sign) == (b & l.sign)) return ma > mb ? ma - mb : mb - ma;
  return ma + mb;
}

// The ULP distance between two bit patterns: OrderedDistance, with NaN
// against a number kUlpInfinite and NaN against NaN 0. OrderedDistance's
// two lines are repeated here, not called: nvcc lays out the kernels
// differently for a nested call, even one inlined, and the kernels are
// tuned to this form (element_rules_test.cc holds the two together).
TC_HOST_DEVICE uint64_t DistanceFromBits(uint64_t a, uint64_t b, const BitLayout& l) {
  const uint64_t ma = a & l.magnitude, mb = b & l.magnitude;
  const bool nan_a = ma > l.inf, nan_b = mb > l.inf;
  if (nan_a || nan_b) return nan_a && nan_b ? 0 : kUlpInfinite;
  if ((a & l.sign) == (b & l.sign)) return ma > mb ? ma - mb : mb - ma;
  return ma + mb;
}

// The ULP histogram: bucket 0 holds distance 0, bucket i >= 1 holds
// (2^(i-2), 2^(i-1)] (1, 2, 3-4, 5-8, ...). Distances other than
// kUlpInfinite stay below 2^64, so 65 is the last bucket.
inline constexpr int kUlpBuckets = 66;

TC_HOST_DEVICE int BucketIndex(uint64_t d) {
  if (d == 0) return 0;
  if (d > (uint64_t{1} << 62)) return 1 + (64 - CountLeadingZeros64(d - 1));
  // ceil(log2(d)) + 1 == the bit length of 2(d-1)+1.
  return 64 - CountLeadingZeros64(((d - 1) << 1) | 1);
}

// The tolerance rules: tolerance.h's presets grouped by their formula.
enum class ToleranceRule : int {
  kAbsPlusRel = 0,  // torch, numpy, explicit: |a-e| <= atol + rtol|e|
  kAbsOrRel = 1,    // polygraphy: |a-e| <= atol or |a-e| <= rtol|e|
  kUlp = 2,         // ULP distance <= max_ulp
  kBound = 3,       // |a-e| <= bound_factor * bound
};

// Whether a pair of finite values passes rule kRule, given |a-e| and |e|,
// the element's unscaled hard bound (kBound; error_model.h's HardBound) and
// its ULP distance in the compared type (kUlp). `limits` has the fields
// atol, rtol, max_ulp and bound_factor: tolerance.h's Tolerance on the
// host, the kernels' CompareArgs on the device.
//
// kAbsPlusRel rounds atol + rtol|e| twice, after the product and after the
// sum: one FMA, which nvcc would otherwise make of it on the device, rounds
// once and can put an element exactly at the limit on the other side of
// it. kAbsOrRel is polygraphy's |a-e|/|e| <= rtol without the quotient, so
// e == 0 passes only when a == 0.
template <ToleranceRule kRule, typename Limits>
TC_HOST_DEVICE bool FinitePairPasses(const Limits& limits, double abs_diff, double abs_expected,
                                     double bound, uint64_t ulp) {
  if constexpr (kRule == ToleranceRule::kAbsPlusRel) {
    return abs_diff <= AddRn(limits.atol, MulRn(limits.rtol, abs_expected));
  } else if constexpr (kRule == ToleranceRule::kAbsOrRel) {
    return abs_diff <= limits.atol || abs_diff <= limits.rtol * abs_expected;
  } else if constexpr (kRule == ToleranceRule::kUlp) {
    return ulp <= limits.max_ulp;
  } else {
    static_assert(kRule == ToleranceRule::kBound, "a rule without a formula");
    return abs_diff <= limits.bound_factor * bound;
  }
}

}  // namespace tensorcheck::rules
