#include "server/service/server.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "server/service/logging.h"
#include "server/core/status_macros.h"

namespace tensorcheck {

namespace {
constexpr char kServiceName[] = "tensorcheck.v1.TensorCheck";
}  // namespace

absl::StatusOr<std::unique_ptr<TensorCheckServer>> TensorCheckServer::Start(
    const ServerOptions& options) {
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("port: 0..65535 expected, got ", options.port));
  }
  auto server = std::unique_ptr<TensorCheckServer>(new TensorCheckServer());
  server->options_ = options;
  server->registry_ = std::make_unique<BackendRegistry>();
  TC_RETURN_IF_ERROR(RegisterBuiltinBackends(server->registry_.get(), options.backends));
  EngineOptions engine_options = options.engine;
  RequestLimits& limits = engine_options.limits;
  limits.max_tensor_bytes = std::min(limits.max_tensor_bytes, limits.max_message_bytes);
  TC_ASSIGN_OR_RETURN(server->engine_,
                      Engine::Create(engine_options, server->registry_.get()));

  ServiceOptions service_options;
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  service_options.workers = options.workers > 0 ? options.workers : hw;
  service_options.max_queue = options.max_queue;
  service_options.server_version = kServerVersion;
  TensorCheckServer* raw = server.get();
  service_options.on_fatal = [raw, cb = options.on_fatal](const absl::Status& s) {
    LogEvent(spdlog::level::critical, "fatal device error, going NOT_SERVING",
             {{"error", std::string(s.message())}});
    raw->SetNotServing();
    if (cb) cb(s);
  };
  server->service_ = std::make_unique<TensorCheckServiceImpl>(
      server->engine_.get(), std::move(service_options));

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  const std::string address = absl::StrCat(options.host, ":", options.port);
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &server->port_);
  const int max_message = static_cast<int>(
      std::min<int64_t>(limits.max_message_bytes, INT32_MAX));
  builder.SetMaxReceiveMessageSize(max_message);
  builder.SetMaxSendMessageSize(max_message);
  builder.RegisterService(server->service_.get());
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", address, " (address in use?)"));
  }
  auto* health = server->server_->GetHealthCheckService();
  health->SetServingStatus("", true);
  health->SetServingStatus(kServiceName, true);
  return server;
}

TensorCheckServer::~TensorCheckServer() { Shutdown(absl::ZeroDuration()); }

std::string TensorCheckServer::address() const {
  return absl::StrCat(options_.host, ":", port_);
}

void TensorCheckServer::SetNotServing() {
  if (server_ == nullptr) return;
  auto* health = server_->GetHealthCheckService();
  health->SetServingStatus("", false);
  health->SetServingStatus(kServiceName, false);
}

void TensorCheckServer::Shutdown(absl::Duration grace) {
  std::call_once(shutdown_once_, [&] {
    if (server_ == nullptr) return;
    SetNotServing();
    // Refuse new work with UNAVAILABLE while in-flight requests finish;
    // only then stop gRPC (which would answer new calls CANCELLED).
    const absl::Time deadline = absl::Now() + grace;
    service_->StartDraining();
    service_->WaitForIdle(deadline);
    server_->Shutdown(absl::ToChronoTime(deadline));
  });
}

void TensorCheckServer::Wait() {
  if (server_ != nullptr) server_->Wait();
}

}  // namespace tensorcheck
