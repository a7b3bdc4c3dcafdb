// Bit patterns of the narrow types (fp32, fp16, bf16) as the device
// comparison's lean path reads them, for host and device alike: the kernels
// use them, narrow_patterns_test.cc checks them on any host, in a build
// without CUDA too, against an independent enumeration (internal to this
// folder).
//
// A pattern is widened to 32 bits with its sign in bit 31: an fp32's own
// bits, a 16-bit pattern shifted up by 16. Then one code serves the three
// types, and a 16-bit distance is the 32-bit one shifted down by 16. These
// are the device path's 32-bit forms of the shared rules
// (server/stats/element_rules.h): the masks come from its LayoutOf, and
// narrow_patterns_test.cc checks Distance against its DistanceFromBits.
//
//   if (narrow::AllFinite<ElemType::kBF16>(ra, re)) {  // two vectors of 8 elements
//     const uint32_t pa = narrow::Widened<ElemType::kBF16>(ra, j);
//     const uint32_t pe = narrow::Widened<ElemType::kBF16>(re, j);
//     const uint32_t ulp = narrow::Distance<ElemType::kBF16>(pa, pe);  // stats' UlpDistance
//   }
#pragma once

#include <cstdint>

#include "core/host_device.h"
#include "server/backends/cuda/internal/device_intrinsics.h"  // Vec16
#include "server/backends/cuda/internal/elem_type.h"
#include "server/stats/element_rules.h"

namespace tensorcheck::cuda::narrow {

// A mask of the shared layout in each element's lane of a 32-bit word of
// storage: the word's one fp32, or its two 16-bit patterns.
template <ElemType kType>
TC_HOST_DEVICE constexpr uint32_t InEachLane(uint64_t mask) {
  return kType == ElemType::kF32 ? static_cast<uint32_t>(mask)
                                 : static_cast<uint32_t>(mask | (mask << 16));
}

template <ElemType kType>
struct Layout {
  static_assert(kType == ElemType::kF32 || kType == ElemType::kF16 || kType == ElemType::kBF16,
                "narrow types only");
  static constexpr int kShift = kType == ElemType::kF32 ? 0 : 16;
  static constexpr rules::BitLayout kElement = rules::LayoutOf(kType);
  // Per 32-bit word of storage, (word & kMagnitudes) + kToTop sets the top
  // bit (kTops: the sign bits) of each element's lane exactly when its
  // magnitude is at least infinity's (infinity or NaN); no lane carries
  // into the next.
  static constexpr uint32_t kMagnitudes = InEachLane<kType>(kElement.magnitude);
  static constexpr uint32_t kToTop = InEachLane<kType>(kElement.sign - kElement.inf);
  static constexpr uint32_t kTops = InEachLane<kType>(kElement.sign);
};

// A word of storage with the top bit of each element's lane set exactly
// when that element is infinite or NaN (the other bits are of no use).
template <ElemType kType>
TC_HOST_DEVICE uint32_t ExponentTops(uint32_t word) {
  return (word & Layout<kType>::kMagnitudes) + Layout<kType>::kToTop;
}

// Whether every element of two 16-byte vectors of storage is finite.
template <ElemType kType>
TC_HOST_DEVICE bool AllFinite(const Vec16& a, const Vec16& e) {
  const uint32_t tops = ExponentTops<kType>(a.x) | ExponentTops<kType>(a.y) |
                        ExponentTops<kType>(a.z) | ExponentTops<kType>(a.w) |
                        ExponentTops<kType>(e.x) | ExponentTops<kType>(e.y) |
                        ExponentTops<kType>(e.z) | ExponentTops<kType>(e.w);
  return (tops & Layout<kType>::kTops) == 0;
}

// Word k of a vector; selects, not an array, so that k may vary at run time
// without the vector going to local memory.
TC_HOST_DEVICE uint32_t Word(const Vec16& raw, int k) {
  return k == 0 ? raw.x : k == 1 ? raw.y : k == 2 ? raw.z : raw.w;
}

// The widened pattern of element j of a vector (little-endian: element 2k
// of a 16-bit type is the low half of word k).
template <ElemType kType>
TC_HOST_DEVICE uint32_t Widened(const Vec16& raw, int j) {
  if constexpr (kType == ElemType::kF32) {
    return Word(raw, j);
  } else {
    const uint32_t word = Word(raw, j / 2);
    return j % 2 == 0 ? word << 16 : word & 0xffff0000u;
  }
}

// Sign and magnitude to two's complement: ordered as the values, with
// -0 == +0.
TC_HOST_DEVICE int32_t Ordered(uint32_t p) {
  const int32_t sign = static_cast<int32_t>(p) >> 31;
  return (static_cast<int32_t>(p & 0x7fffffffu) ^ sign) - sign;
}

// ULP distance between two finite widened patterns: the shared
// rules::DistanceFromBits of the patterns before widening, in 32-bit
// arithmetic. Their ordered values differ by less than 2^32, so the
// unsigned difference of the larger and the smaller is exact.
template <ElemType kType>
TC_HOST_DEVICE uint32_t Distance(uint32_t pa, uint32_t pe) {
  const int32_t oa = Ordered(pa), oe = Ordered(pe);
  const int32_t hi = oa > oe ? oa : oe, lo = oa > oe ? oe : oa;
  return (static_cast<uint32_t>(hi) - static_cast<uint32_t>(lo)) >> Layout<kType>::kShift;
}

}  // namespace tensorcheck::cuda::narrow
