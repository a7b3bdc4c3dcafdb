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
    default:
      return std::nullopt;
  }
}

}  // namespace tensorcheck
