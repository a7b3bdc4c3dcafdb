// The RPCs of the CLI's commands and their reports (internal/commands.h).
#include "client/cli/internal/commands.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "client/cli/internal/output_files.h"
#include "client/cli/internal/verify_request.h"
#include "client/cli/report.h"
#include "grpcpp/grpcpp.h"
#include "tensorcheck/v1/tensorcheck.grpc.pb.h"

namespace tensorcheck::cli::internal {
namespace {

constexpr int kMaxMessageBytes = 1 << 30;  // the server's limit governs

const char* GrpcCodeName(grpc::StatusCode c) {
  switch (c) {
    case grpc::StatusCode::OK:
      return "OK";
    case grpc::StatusCode::CANCELLED:
      return "CANCELLED";
    case grpc::StatusCode::UNKNOWN:
      return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND:
      return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS:
      return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED:
      return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE:
      return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL:
      return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS:
      return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    default:
      return "UNKNOWN";
  }
}

// The exit-code mapping documented in kExitCodes (main.cc).
int ExitCodeForGrpc(grpc::StatusCode c) {
  switch (c) {
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::NOT_FOUND:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::OUT_OF_RANGE:
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
    case grpc::StatusCode::UNIMPLEMENTED:
      return kExitUsage;
    default:
      return kExitServer;
  }
}

int ReportGrpcError(const grpc::Status& s, const std::string& server) {
  const int code = ExitCodeForGrpc(s.error_code());
  if (code == kExitServer) {
    std::cerr << "tensorcheck: server error (" << GrpcCodeName(s.error_code())
              << "): " << s.error_message();
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
      std::cerr << " [server " << server << "]";
    }
    std::cerr << "\n";
  } else {
    std::cerr << "tensorcheck: request rejected (" << GrpcCodeName(s.error_code())
              << "): " << s.error_message() << "\n";
  }
  return code;
}

std::unique_ptr<pb::TensorCheck::Stub> MakeStub(const std::string& server) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  return pb::TensorCheck::NewStub(
      grpc::CreateCustomChannel(server, grpc::InsecureChannelCredentials(), args));
}

void SetDeadline(grpc::ClientContext* ctx, double seconds) {
  seconds = std::min(seconds, 1e7);  // keeps the microsecond count in range
  ctx->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6)));
}

}  // namespace

int RunVerifyOrDiagnose(const CommandLine& cl, const std::string& server, double timeout) {
  auto req = BuildRequest(cl);
  if (!req.ok()) {
    std::cerr << "tensorcheck: " << req.status().message() << "\n";
    if (absl::IsInvalidArgument(req.status()) &&
        absl::string_view(req.status().message()).rfind("--", 0) == 0) {
      std::cerr << "(see tensorcheck " << cl.command << " --help)\n";
    }
    return kExitUsage;
  }
  const ReportContext ctx{cl.command};
  auto stub = MakeStub(server);
  grpc::ClientContext grpc_ctx;
  SetDeadline(&grpc_ctx, timeout);
  pb::VerifyResponse resp;
  const grpc::Status s = cl.command == "diagnose" ? stub->Diagnose(&grpc_ctx, *req, &resp)
                                                  : stub->Verify(&grpc_ctx, *req, &resp);
  if (!s.ok()) return ReportGrpcError(s, server);

  const bool json = cl.Has("json");
  if (json) {
    std::cout << VerifyResponseToJson(resp).dump(2) << "\n";
  } else {
    std::cout << FormatHuman(resp, ctx);
  }
  int code = ExitCodeFor(resp, ctx);
  if (code == kExitServer) {
    std::cerr << "tensorcheck: server error: the response carries no "
              << (cl.command == "diagnose" ? "diagnosis" : "verdict") << "\n";
  }
  if (cl.Has("github")) {
    (json ? std::cerr : std::cout) << FormatGithubAnnotations(resp, ctx);
    if (const char* summary = std::getenv("GITHUB_STEP_SUMMARY");
        summary != nullptr && summary[0] != '\0') {
      const absl::Status w = WriteTextFile(summary, FormatGithubSummary(resp, ctx),
                                           /*append=*/true);
      if (!w.ok()) std::cerr << "tensorcheck: warning: " << w.message() << "\n";
    }
  }
  absl::Status out_status;
  if (cl.Has("junit")) {
    out_status.Update(WriteTextFile(cl.Get("junit"), FormatJUnit(resp, ctx), /*append=*/false));
  }
  if (cl.Has("save-outputs")) out_status.Update(SaveOutputs(resp, cl.Get("save-outputs")));
  if (cl.Has("html")) out_status.Update(WriteHtml(resp, ctx, *req, cl.Get("html")));
  if (!out_status.ok()) {
    std::cerr << "tensorcheck: " << out_status.message() << "\n";
    if (code == kExitPass) code = kExitUsage;
  }
  return code;
}

int RunCapabilities(const CommandLine& cl, const std::string& server, double timeout) {
  auto stub = MakeStub(server);
  grpc::ClientContext grpc_ctx;
  SetDeadline(&grpc_ctx, timeout);
  pb::GetCapabilitiesResponse resp;
  const grpc::Status s = stub->GetCapabilities(&grpc_ctx, pb::GetCapabilitiesRequest(), &resp);
  if (!s.ok()) return ReportGrpcError(s, server);
  if (cl.Has("json")) {
    std::cout << CapabilitiesToJson(resp).dump(2) << "\n";
  } else {
    std::cout << FormatCapabilities(resp);
  }
  return kExitPass;
}

}  // namespace tensorcheck::cli::internal
