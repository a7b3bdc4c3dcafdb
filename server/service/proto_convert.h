// Conversions between the tensorcheck.v1 proto messages and the engine's
// core types. Validation of everything the wire can get wrong (enums,
// shapes, byte counts, sizes) happens here, before any tensor is allocated;
// every error names the proto field.
//
//   TC_ASSIGN_OR_RETURN(LinearRequest req, FromProto(request, limits, store));
//   TC_ASSIGN_OR_RETURN(VerifyOutcome out, engine.Verify(req));
//   ToProto(out, &response);
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "proto/dtype_proto.h"
#include "server/engine/engine.h"
#include "server/store/tenant_store.h"
#include "server/store/tensor_store.h"
#include "tensorcheck/v1/tensorcheck.pb.h"

namespace tensorcheck {

// The type URL of the FAILED_PRECONDITION payload that lists the stored
// tensors a request referenced and the store lacks: a serialized
// tensorcheck.v1.MissingTensors (the gRPC status detail, docs/api.md).
inline constexpr absl::string_view kMissingTensorsTypeUrl =
    "type.googleapis.com/tensorcheck.v1.MissingTensors";

// Where tensors given by digest come from: the caller's namespace of the
// store (null: none; every digest is then FAILED_PRECONDITION). Digests
// it lacks are collected in `missing` rather than failing at once, so that
// one error names them all.
struct TensorSource {
  StoreView store;
  v1::MissingTensors* missing = nullptr;
};

// Decodes one tensor. `field` is its path in the request ("op.input").
// A tensor by digest is a read-only view of the stored bytes (no copy),
// pinning them while it lives; one the store lacks is added to
// `source.missing` and answered with an empty tensor.
absl::StatusOr<Tensor> TensorFromProto(const v1::Tensor& proto, absl::string_view field,
                                       const RequestLimits& limits,
                                       const TensorSource& source = {});

// A TensorDigest of the store RPCs as a Digest (INVALID_ARGUMENT naming
// `field` when malformed), and back.
absl::StatusOr<Digest> DigestFromProto(const v1::TensorDigest& proto, absl::string_view field);
void DigestToProto(const Digest& digest, v1::TensorDigest* proto);

// Copies a tensor into a proto (data bytes, shape, dtype).
void TensorToProto(const Tensor& tensor, v1::Tensor* proto);

// FAILED_PRECONDITION with a kMissingTensorsTypeUrl payload when tensors
// by digest are missing from `store`.
absl::StatusOr<LinearRequest> FromProto(const v1::VerifyRequest& request,
                                        const RequestLimits& limits, StoreView store = {});

void ToProto(const VerifyOutcome& outcome, v1::VerifyResponse* response);

// A Compare request: the layer (with the request's options), and the
// named outputs, tensors moved out of `request` (not copied). Errors as
// FromProto's, naming `observed[i].tensor`.
struct CompareInput {
  LinearRequest request;
  std::vector<std::pair<std::string, Tensor>> observed;
};
absl::StatusOr<CompareInput> FromProto(v1::CompareRequest* request, const RequestLimits& limits,
                                       StoreView store = {});

void ToProto(const CompareOutcome& outcome, v1::CompareResponse* response);

// DTypeFromProto naming `field` in the error.
absl::StatusOr<DType> DTypeFromProto(int dtype, absl::string_view field);

}  // namespace tensorcheck
