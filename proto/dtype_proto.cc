#include "proto/dtype_proto.h"

namespace tensorcheck {

v1::DType DTypeToProto(DType dtype) {
  switch (dtype) {
    case DType::kFloat64:
      return v1::DTYPE_FLOAT64;
    case DType::kFloat32:
      return v1::DTYPE_FLOAT32;
    case DType::kFloat16:
      return v1::DTYPE_FLOAT16;
    case DType::kBFloat16:
      return v1::DTYPE_BFLOAT16;
    case DType::kFloat8E4M3Fn:
      return v1::DTYPE_FLOAT8_E4M3FN;
    case DType::kFloat8E5M2:
      return v1::DTYPE_FLOAT8_E5M2;
    case DType::kFloat4E2M1Fn:
      return v1::DTYPE_FLOAT4_E2M1FN;
    case DType::kFloat8E8M0Fnu:
      return v1::DTYPE_FLOAT8_E8M0FNU;
  }
  return v1::DTYPE_UNSPECIFIED;
}

std::optional<DType> DTypeFromProto(int dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT64:
      return DType::kFloat64;
    case v1::DTYPE_FLOAT32:
      return DType::kFloat32;
    case v1::DTYPE_FLOAT16:
      return DType::kFloat16;
    case v1::DTYPE_BFLOAT16:
      return DType::kBFloat16;
    case v1::DTYPE_FLOAT8_E4M3FN:
      return DType::kFloat8E4M3Fn;
    case v1::DTYPE_FLOAT8_E5M2:
      return DType::kFloat8E5M2;
    case v1::DTYPE_FLOAT4_E2M1FN:
      return DType::kFloat4E2M1Fn;
    case v1::DTYPE_FLOAT8_E8M0FNU:
      return DType::kFloat8E8M0Fnu;
    default:
      return std::nullopt;
  }
}

}  // namespace tensorcheck
