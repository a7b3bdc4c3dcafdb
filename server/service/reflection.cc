#include "server/service/reflection.h"

#include <set>
#include <utility>

#include "google/protobuf/descriptor.h"
#include "google/protobuf/descriptor.pb.h"
#include "server/service/service.h"

namespace tensorcheck {

namespace {

namespace rpb = grpc::reflection::v1alpha;
using google::protobuf::DescriptorPool;
using google::protobuf::FileDescriptor;

// `file` and every file it imports, each once, imports first.
void AddFileAndDependencies(const FileDescriptor* file, std::set<std::string>* seen,
                            rpb::FileDescriptorResponse* out) {
  if (file == nullptr || !seen->insert(file->name()).second) return;
  for (int i = 0; i < file->dependency_count(); ++i) {
    AddFileAndDependencies(file->dependency(i), seen, out);
  }
  google::protobuf::FileDescriptorProto proto;
  file->CopyTo(&proto);
  out->add_file_descriptor_proto(proto.SerializeAsString());
}

void Error(grpc::StatusCode code, const std::string& message, rpb::ServerReflectionResponse* r) {
  r->mutable_error_response()->set_error_code(code);
  r->mutable_error_response()->set_error_message(message);
}

}  // namespace

ReflectionService::ReflectionService(std::vector<std::string> services,
                                     std::function<absl::Status(const Metadata&)> authorize)
    : services_(std::move(services)), authorize_(std::move(authorize)) {}

rpb::ServerReflectionResponse ReflectionService::Answer(
    const rpb::ServerReflectionRequest& request) const {
  const DescriptorPool* pool = DescriptorPool::generated_pool();
  rpb::ServerReflectionResponse response;
  response.set_valid_host(request.host());
  *response.mutable_original_request() = request;
  std::set<std::string> seen;
  switch (request.message_request_case()) {
    case rpb::ServerReflectionRequest::kListServices:
      for (const std::string& name : services_) {
        response.mutable_list_services_response()->add_service()->set_name(name);
      }
      break;
    case rpb::ServerReflectionRequest::kFileByFilename: {
      const FileDescriptor* file = pool->FindFileByName(request.file_by_filename());
      if (file == nullptr) {
        Error(grpc::StatusCode::NOT_FOUND, "file not found: " + request.file_by_filename(),
              &response);
      } else {
        AddFileAndDependencies(file, &seen, response.mutable_file_descriptor_response());
      }
      break;
    }
    case rpb::ServerReflectionRequest::kFileContainingSymbol: {
      const FileDescriptor* file = pool->FindFileContainingSymbol(request.file_containing_symbol());
      if (file == nullptr) {
        Error(grpc::StatusCode::NOT_FOUND, "symbol not found: " + request.file_containing_symbol(),
              &response);
      } else {
        AddFileAndDependencies(file, &seen, response.mutable_file_descriptor_response());
      }
      break;
    }
    case rpb::ServerReflectionRequest::kFileContainingExtension: {
      const auto& ext = request.file_containing_extension();
      const auto* type = pool->FindMessageTypeByName(ext.containing_type());
      const auto* field =
          type != nullptr ? pool->FindExtensionByNumber(type, ext.extension_number()) : nullptr;
      if (field == nullptr) {
        Error(grpc::StatusCode::NOT_FOUND, "extension not found", &response);
      } else {
        AddFileAndDependencies(field->file(), &seen, response.mutable_file_descriptor_response());
      }
      break;
    }
    case rpb::ServerReflectionRequest::kAllExtensionNumbersOfType: {
      const auto* type = pool->FindMessageTypeByName(request.all_extension_numbers_of_type());
      if (type == nullptr) {
        Error(grpc::StatusCode::NOT_FOUND,
              "type not found: " + request.all_extension_numbers_of_type(), &response);
      } else {
        std::vector<const google::protobuf::FieldDescriptor*> extensions;
        pool->FindAllExtensions(type, &extensions);
        auto* numbers = response.mutable_all_extension_numbers_response();
        numbers->set_base_type_name(type->full_name());
        for (const auto* e : extensions) numbers->add_extension_number(e->number());
      }
      break;
    }
    default:
      Error(grpc::StatusCode::UNIMPLEMENTED, "unknown reflection request", &response);
  }
  return response;
}

grpc::Status ReflectionService::ServerReflectionInfo(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<rpb::ServerReflectionResponse, rpb::ServerReflectionRequest>* stream) {
  if (const absl::Status allowed = authorize_(context->client_metadata()); !allowed.ok()) {
    return ToGrpcStatus(allowed);
  }
  rpb::ServerReflectionRequest request;
  while (stream->Read(&request)) {
    if (!stream->Write(Answer(request))) break;
  }
  return grpc::Status::OK;
}

}  // namespace tensorcheck
