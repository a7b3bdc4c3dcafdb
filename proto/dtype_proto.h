// DType <-> tensorcheck.v1.DType, shared by the service and the CLI (beside
// the generated code: protobuf only, no gRPC).
//
//   v1::DType p = DTypeToProto(DType::kBFloat16);   // DTYPE_BFLOAT16
//   std::optional<DType> d = DTypeFromProto(p);     // kBFloat16; nullopt for
//                                                   // UNSPECIFIED or unknown
#pragma once

#include <optional>

#include "core/dtype.h"
#include "tensorcheck/v1/tensorcheck.pb.h"

namespace tensorcheck {

v1::DType DTypeToProto(DType dtype);
std::optional<DType> DTypeFromProto(int dtype);

}  // namespace tensorcheck
