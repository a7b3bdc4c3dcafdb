// ReflectionService: gRPC server reflection (grpc.reflection.v1alpha, what
// grpcurl and Postman ask), answered from the server's compiled-in
// descriptors. Its own rather than gRPC's plugin so that it can ask for a
// token: where the server has tenants, only a tenant with the
// "reflection" right may list and describe the services
// (docs/operations.md, "Tenants and tokens").
//
//   ReflectionService reflection({"tensorcheck.v1.TensorCheck", "grpc.health.v1.Health"},
//                                [&](const auto& metadata) { return Check(metadata); });
//   builder.RegisterService(&reflection);
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace tensorcheck {

class ReflectionService final : public grpc::reflection::v1alpha::ServerReflection::Service {
 public:
  using Metadata = std::multimap<grpc::string_ref, grpc::string_ref>;
  // `services`: the full names to list. `authorize`: OK, or the status a
  // call is refused with (checked once per stream, before any answer).
  ReflectionService(std::vector<std::string> services,
                    std::function<absl::Status(const Metadata&)> authorize);

  grpc::Status ServerReflectionInfo(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<grpc::reflection::v1alpha::ServerReflectionResponse,
                               grpc::reflection::v1alpha::ServerReflectionRequest>* stream)
      override;

  // The answer to one request (also for tests).
  grpc::reflection::v1alpha::ServerReflectionResponse Answer(
      const grpc::reflection::v1alpha::ServerReflectionRequest& request) const;

 private:
  std::vector<std::string> services_;
  std::function<absl::Status(const Metadata&)> authorize_;
};

}  // namespace tensorcheck
