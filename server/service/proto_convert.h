// Conversions between the tensorcheck.v1 proto messages and the engine's
// core types. Validation of everything the wire can get wrong (enums,
// shapes, byte counts, sizes) happens here, before any tensor is allocated;
// every error names the proto field.
//
//   TC_ASSIGN_OR_RETURN(LinearRequest req, FromProto(request, limits));
//   TC_ASSIGN_OR_RETURN(VerifyOutcome out, engine.Verify(req));
//   ToProto(out, &response);
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "proto/dtype_proto.h"
#include "server/engine/engine.h"
#include "tensorcheck/v1/tensorcheck.pb.h"

namespace tensorcheck {

// Decodes one tensor. `field` is its path in the request ("op.input").
absl::StatusOr<Tensor> TensorFromProto(const v1::Tensor& proto, absl::string_view field,
                                       const RequestLimits& limits);

// Copies a tensor into a proto (data bytes, shape, dtype).
void TensorToProto(const Tensor& tensor, v1::Tensor* proto);

absl::StatusOr<LinearRequest> FromProto(const v1::VerifyRequest& request,
                                        const RequestLimits& limits);

void ToProto(const VerifyOutcome& outcome, v1::VerifyResponse* response);

// DTypeFromProto naming `field` in the error.
absl::StatusOr<DType> DTypeFromProto(int dtype, absl::string_view field);

}  // namespace tensorcheck
