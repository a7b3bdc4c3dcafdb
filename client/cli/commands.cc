// The RPCs of the CLI's commands and their reports (internal/commands.h).
#include "client/cli/internal/commands.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "client/cli/internal/connection.h"
#include "client/cli/internal/output_files.h"
#include "client/cli/internal/progress.h"
#include "client/cli/internal/store_client.h"
#include "client/cli/internal/tensor_transfer.h"
#include "client/cli/internal/verify_request.h"
#include "client/cli/report.h"
#include "client/cli/tensor_io.h"
#include "client/cli/tensor_ref.h"
#include "core/dtype.h"
#include "core/executor.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "tensorcheck/v1/tensorcheck.grpc.pb.h"

namespace tensorcheck::cli::internal {
namespace {

constexpr int kMaxMessageBytes = 1 << 30;  // the server's limit governs
// Declares a request's serialized size, so that the server admits it for
// that much before receiving it (docs/api.md, "Request size").
constexpr char kRequestBytesKey[] = "tensorcheck-request-bytes";

// Tensors hashed and uploaded at once.
constexpr int kTransferThreads = 4;

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

// What to check after UNAUTHENTICATED (no token, or one the server does
// not know) or PERMISSION_DENIED (a token without the right to the call).
std::string AuthHint(grpc::StatusCode c, const Connection& server) {
  if (server.token.empty()) return " (no token was sent: check --token / TENSORCHECK_TOKEN)";
  if (c == grpc::StatusCode::UNAUTHENTICATED) {
    return absl::StrCat(" (the server refused the token of ", server.token_source,
                        ": check --token / TENSORCHECK_TOKEN)");
  }
  return absl::StrCat(" (the token of ", server.token_source, " is not allowed this call)");
}

}  // namespace

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

int ReportError(grpc::StatusCode c, absl::string_view message, const Connection& server) {
  const int code = ExitCodeForGrpc(c);
  if (code == kExitServer) {
    std::cerr << "tensorcheck: server error (" << GrpcCodeName(c) << "): " << message;
    if (c == grpc::StatusCode::UNAVAILABLE) {
      std::cerr << " [server " << server.Describe() << "]";
    } else if (c == grpc::StatusCode::UNAUTHENTICATED || c == grpc::StatusCode::PERMISSION_DENIED) {
      std::cerr << AuthHint(c, server);
    }
    std::cerr << "\n";
  } else {
    std::cerr << "tensorcheck: request rejected (" << GrpcCodeName(c) << "): " << message << "\n";
  }
  return code;
}

int ReportGrpcError(const grpc::Status& s, const Connection& server) {
  return ReportError(s.error_code(), s.error_message(), server);
}

// absl and gRPC number their codes alike.
int ReportStatus(const absl::Status& s, const Connection& server) {
  return ReportError(static_cast<grpc::StatusCode>(s.code()), s.message(), server);
}

std::unique_ptr<pb::TensorCheck::Stub> MakeStub(const Connection& server) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  return pb::TensorCheck::NewStub(MakeChannel(server, args));
}

std::chrono::system_clock::time_point DeadlineAfter(double seconds) {
  seconds = std::min(seconds, 1e7);  // keeps the microsecond count in range
  return std::chrono::system_clock::now() +
         std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6));
}

bool ProgressWanted(const CommandLine& cl) { return !cl.Has("no-progress") && StderrIsTerminal(); }

std::unique_ptr<Executor> TransferExecutor() {
  auto e = Executor::Create({/*threads=*/kTransferThreads});
  return e.ok() ? *std::move(e) : nullptr;
}

namespace {

// A new x-request-id: 32 random hex digits.
std::string NewRequestId() {
  std::random_device rd;
  std::string id;
  for (int i = 0; i < 4; ++i) id += absl::StrFormat("%08x", rd());
  return id;
}

// While a Verify, Diagnose or Compare call sent with `request_id` runs, asks
// the server how far it has come (GetProgress) every half second and shows
// "diagnosis: running the candidates 5/13, 12 s" on the progress line.
// Nothing when the line is off; stops asking when the server does not
// know the RPC (an older one) and when destroyed.
class ServerProgressWatch {
 public:
  ServerProgressWatch(pb::TensorCheck::Stub* stub, std::string request_id, std::string what,
                      Progress* progress)
      : stub_(stub), id_(std::move(request_id)), what_(std::move(what)), progress_(progress) {
    if (progress_->enabled()) thread_ = std::thread([this] { Loop(); });
  }
  ~ServerProgressWatch() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  ServerProgressWatch(const ServerProgressWatch&) = delete;
  ServerProgressWatch& operator=(const ServerProgressWatch&) = delete;

 private:
  static constexpr auto kEvery = std::chrono::milliseconds(500);

  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      const auto next = std::chrono::steady_clock::now() + kEvery;
      if (cv_.wait_until(lock, next, [this] { return stop_; })) return;
      lock.unlock();
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
      pb::GetProgressRequest req;
      req.set_request_id(id_);
      pb::GetProgressResponse resp;
      const grpc::Status s = stub_->GetProgress(&ctx, req, &resp);
      if (s.error_code() == grpc::StatusCode::UNIMPLEMENTED) return;  // an older server
      if (s.ok())
        progress_->Update(absl::StrCat(what_, ": ", resp.phase()), resp.done(), resp.total());
      lock.lock();
    }
  }

  pb::TensorCheck::Stub* const stub_;
  const std::string id_;
  const std::string what_;
  Progress* const progress_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

grpc::Status CallVerifyOrDiagnose(pb::TensorCheck::Stub* stub, const std::string& command,
                                  const pb::VerifyRequest& req,
                                  std::chrono::system_clock::time_point deadline,
                                  Progress* progress, pb::VerifyResponse* resp) {
  grpc::ClientContext ctx;
  ctx.set_deadline(deadline);
  const std::string id = NewRequestId();
  ctx.AddMetadata("x-request-id", id);
  ctx.AddMetadata(kRequestBytesKey, std::to_string(req.ByteSizeLong()));
  // The phase in words, with the elapsed time (internal/progress.h), then
  // the server's phase and count.
  const bool diagnosis = command == "diagnose" || !req.accept().empty();
  progress->Begin(
      diagnosis ? "waiting for the server's diagnosis" : "waiting for the server's verification",
      /*total_bytes=*/0);
  grpc::Status s;
  {
    ServerProgressWatch watch(stub, id, diagnosis ? "diagnosis" : "verification", progress);
    s = command == "diagnose" ? stub->Diagnose(&ctx, req, resp) : stub->Verify(&ctx, req, resp);
  }
  progress->End();
  return s;
}

}  // namespace

int RunVerifyOrDiagnose(const CommandLine& cl, const Connection& server, double timeout) {
  std::vector<HeldTensor> held;
  auto req = BuildRequest(cl, &held);
  if (!req.ok()) {
    std::cerr << "tensorcheck: " << req.status().message() << "\n";
    if (absl::IsInvalidArgument(req.status()) &&
        absl::string_view(req.status().message()).rfind("--", 0) == 0) {
      std::cerr << "(see tensorcheck " << cl.command << " --help)\n";
    }
    return kExitUsage;
  }
  ReportContext ctx{cl.command};
  ctx.verbose = cl.Has("verbose");
  ctx.accept.assign(req->accept().begin(), req->accept().end());
  const auto deadline = DeadlineAfter(timeout);
  auto stub = MakeStub(server);
  Progress progress(ProgressWanted(cl));
  std::unique_ptr<Executor> executor = TransferExecutor();
  StoreClient store(stub.get(), deadline);
  TensorTransfer transfer(&store, executor.get(), &progress);
  auto by_digest = transfer.Prepare(&*req, std::move(held));
  if (!by_digest.ok()) return ReportStatus(by_digest.status(), server);
  pb::VerifyResponse resp;
  grpc::Status s = CallVerifyOrDiagnose(stub.get(), cl.command, *req, deadline, &progress, &resp);
  if (*by_digest) {
    // Evicted between FindMissingTensors and the request: upload, retry once.
    if (std::optional<pb::MissingTensors> missing = MissingTensorsOf(s); missing.has_value()) {
      const absl::Status again = transfer.Reupload(*missing);
      if (!again.ok()) return ReportStatus(again, server);
      resp.Clear();
      s = CallVerifyOrDiagnose(stub.get(), cl.command, *req, deadline, &progress, &resp);
    }
  }
  // The HTML page's heatmaps read the observed tensor from the request.
  if (cl.Has("html")) transfer.PutInline("observed");
  if (!s.ok()) return ReportGrpcError(s, server);
  if (req->output().return_outputs()) {
    const absl::Status read = ReadOutputsByDigest(&resp, &store, &progress);
    if (!read.ok()) std::cerr << "tensorcheck: warning: " << read.message() << "\n";
  }

  const bool json = cl.Has("json");
  if (json) {
    nlohmann::ordered_json j = VerifyResponseToJson(resp);
    j["uploaded_bytes"] = transfer.counts().uploaded_bytes;
    j["reused_bytes"] = transfer.counts().reused_bytes;
    std::cout << j.dump(2) << "\n";
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

int RunCompare(const CommandLine& cl, const Connection& server, double timeout) {
  std::vector<HeldTensor> held;
  auto req = BuildCompareRequest(cl, &held);
  if (!req.ok()) {
    std::cerr << "tensorcheck: " << req.status().message() << "\n";
    if (absl::IsInvalidArgument(req.status())) {
      std::cerr << "(see tensorcheck compare --help)\n";
    }
    return kExitUsage;
  }
  ReportContext ctx{cl.command};
  ctx.verbose = cl.Has("verbose");
  ctx.accept.assign(req->accept().begin(), req->accept().end());
  const auto deadline = DeadlineAfter(timeout);
  auto stub = MakeStub(server);
  Progress progress(ProgressWanted(cl));
  std::unique_ptr<Executor> executor = TransferExecutor();
  StoreClient store(stub.get(), deadline);
  TensorTransfer transfer(&store, executor.get(), &progress);
  auto by_digest = transfer.Prepare(&*req, std::move(held));
  if (!by_digest.ok()) return ReportStatus(by_digest.status(), server);
  auto call = [&](pb::CompareResponse* resp) {
    grpc::ClientContext grpc_ctx;
    grpc_ctx.set_deadline(deadline);
    const std::string id = NewRequestId();
    grpc_ctx.AddMetadata("x-request-id", id);
    grpc_ctx.AddMetadata(kRequestBytesKey, std::to_string(req->ByteSizeLong()));
    progress.Begin("waiting for the server's comparison", /*total_bytes=*/0);
    grpc::Status s;
    {
      ServerProgressWatch watch(stub.get(), id, "comparison", &progress);
      s = stub->Compare(&grpc_ctx, *req, resp);
    }
    progress.End();
    return s;
  };
  pb::CompareResponse resp;
  grpc::Status s = call(&resp);
  if (*by_digest) {
    // Evicted between FindMissingTensors and the request: upload, retry once.
    if (std::optional<pb::MissingTensors> missing = MissingTensorsOf(s); missing.has_value()) {
      const absl::Status again = transfer.Reupload(*missing);
      if (!again.ok()) return ReportStatus(again, server);
      resp.Clear();
      s = call(&resp);
    }
  }
  if (!s.ok()) return ReportGrpcError(s, server);
  if (cl.Has("json")) {
    nlohmann::ordered_json j = CompareResponseToJson(resp);
    j["uploaded_bytes"] = transfer.counts().uploaded_bytes;
    j["reused_bytes"] = transfer.counts().reused_bytes;
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << FormatCompareHuman(resp, ctx);
  }
  const int code = ExitCodeForCompare(resp, /*accept=*/!ctx.accept.empty());
  if (code == kExitServer) {
    std::cerr << "tensorcheck: server error: the response carries no comparison of the pair\n";
  }
  return code;
}

int RunCapabilities(const CommandLine& cl, const Connection& server, double timeout) {
  auto stub = MakeStub(server);
  grpc::ClientContext grpc_ctx;
  grpc_ctx.set_deadline(DeadlineAfter(timeout));
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

int RunHealth(const CommandLine& cl, const Connection& server, double timeout) {
  namespace health = ::grpc::health::v1;
  auto stub = health::Health::NewStub(MakeChannel(server, grpc::ChannelArguments()));
  grpc::ClientContext grpc_ctx;
  grpc_ctx.set_deadline(DeadlineAfter(timeout));
  health::HealthCheckRequest req;
  req.set_service(cl.Get("service", ""));
  health::HealthCheckResponse resp;
  const grpc::Status s = stub->Check(&grpc_ctx, req, &resp);
  if (!s.ok()) return ReportGrpcError(s, server);
  std::cout << health::HealthCheckResponse::ServingStatus_Name(resp.status()) << "\n";
  return resp.status() == health::HealthCheckResponse::SERVING ? kExitPass : kExitFail;
}

int RunUpload(const CommandLine& cl, const Connection& server, double timeout) {
  if (cl.args.empty()) {
    std::cerr << "tensorcheck: upload: FILE.npy or FILE.safetensors:TENSOR arguments expected\n"
              << "(see tensorcheck upload --help)\n";
    return kExitUsage;
  }
  TensorReadOptions opts;
  // upload's --dtype takes the dtype alone, for every tensor.
  opts.dtype_flag = "--dtype ";
  if (cl.Has("dtype")) {
    auto d = ParseDType(cl.Get("dtype"));
    if (!d.ok()) {
      std::cerr << "tensorcheck: --dtype: " << d.status().message() << "\n";
      return kExitUsage;
    }
    opts.expected_dtype = *d;
  }
  // Read every file before anything is sent: a bad argument uploads nothing.
  std::vector<Blob> blobs;
  std::vector<TensorRef> refs;
  for (const std::string& arg : cl.args) {
    if (IsDigestArg(arg)) {
      std::cerr << "tensorcheck: '" << arg
                << "': already a digest; upload takes FILE.npy or FILE.safetensors:TENSOR\n";
      return kExitUsage;
    }
    auto t = ReadTensorArg(arg, opts);
    if (!t.ok()) {
      std::cerr << "tensorcheck: " << t.status().message() << "\n";
      return kExitUsage;
    }
    refs.push_back(TensorRef{"", t->dtype(), t->shape()});
    Blob b;
    b.label = arg;
    b.data = *std::move(t);
    blobs.push_back(std::move(b));
  }
  auto stub = MakeStub(server);
  Progress progress(ProgressWanted(cl));
  std::unique_ptr<Executor> executor = TransferExecutor();
  StoreClient store(stub.get(), DeadlineAfter(timeout));
  HashBlobs(blobs, executor.get(), &progress);
  std::vector<pb::TensorDigest> digests;
  for (const Blob& b : blobs) digests.push_back(b.digest);
  auto missing = store.FindMissing(digests);
  if (!missing.ok()) {
    if (absl::IsUnimplemented(missing.status())) {
      return ReportStatus(
          absl::UnimplementedError("the server has no tensor store (FindMissingTensors is "
                                   "not implemented there)"),
          server);
    }
    return ReportStatus(missing.status(), server);
  }
  std::set<std::string> absent;
  for (const pb::TensorDigest& d : *missing) absent.insert(d.hash());
  std::vector<Blob*> upload;
  for (Blob& b : blobs) {
    if (absent.erase(b.digest.hash()) > 0) upload.push_back(&b);  // once per digest
  }
  TransferCounts counts;
  const absl::Status up = UploadBlobs(upload, &store, executor.get(), &progress, &counts);
  if (!up.ok()) return ReportStatus(up, server);
  for (size_t i = 0; i < blobs.size(); ++i) {
    refs[i].hash_hex = blobs[i].digest.hash().substr(kDigestPrefix.size());
    std::cout << FormatTensorRef(refs[i]) << "\n";
  }
  return kExitPass;
}

}  // namespace tensorcheck::cli::internal
