// The ULP arithmetic of the statistics kernels on raw bit patterns, inline
// for their per-element loops: the shared rules of element_rules.h (which
// the device comparison runs too) under the names the kernels use, keyed by
// DType, and the one host-only form of them the portable kernel needs
// (OrderedInt). ulp.h is the public face of the same rules.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "server/stats/element_rules.h"
#include "server/stats/ulp.h"

namespace tensorcheck::internal {

using rules::BitLayout;
using rules::BucketIndex;
using rules::DistanceFromBits;
using rules::OrderedDistance;

inline BitLayout LayoutOf(DType d) { return rules::LayoutOf(ElemTypeOf(d)); }

// Ordered integer of a bit pattern `width` <= 32 bits wide: negative
// values mirrored, so +0 and -0 both map to 0; the difference of two is
// OrderedDistance (element_rules_test.cc checks it).
inline int64_t OrderedInt(uint64_t bits, int width) {
  // Sign-extend, then map sign-magnitude to two's complement.
  const int64_t x = static_cast<int64_t>(bits << (64 - width)) >> (64 - width);
  const int64_t min = -(int64_t{1} << (width - 1));
  return x < 0 ? min - x : x;
}

}  // namespace tensorcheck::internal
