#include "server/stats/ulp.h"

#include "core/float_formats.h"
#include "core/mx_formats.h"
#include "server/stats/internal/ulp_bits.h"

namespace tensorcheck {

uint64_t BitsIn(double v, DType dtype) {
  switch (dtype) {
    case DType::kFloat64:
      return DoubleBits(v);
    case DType::kFloat32:
      return FloatBits(static_cast<float>(v));
    case DType::kFloat16:
      return DoubleToFp16Bits(v);
    case DType::kBFloat16:
      return DoubleToBf16Bits(v);
    case DType::kFloat8E4M3Fn:
    case DType::kFloat8E5M2:
      return DoubleToFp8Bits(v, *Fp8FormatOf(dtype));
    case DType::kFloat4E2M1Fn:
      return DoubleToFp4E2M1Bits(v);
    case DType::kFloat8E8M0Fnu:
      return DoubleToE8M0Bits(v);
  }
  return 0;
}

uint64_t UlpDistance(double a, double b, DType dtype) {
  return internal::DistanceFromBits(BitsIn(a, dtype), BitsIn(b, dtype), internal::LayoutOf(dtype));
}

int UlpHistogramBucket(uint64_t ulp) { return internal::BucketIndex(ulp); }

}  // namespace tensorcheck
