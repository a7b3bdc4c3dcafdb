#include "server/service/service.h"

#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "server/core/status_macros.h"
#include "server/service/logging.h"

namespace tensorcheck {

namespace {

constexpr size_t kMaxStatusMessage = 2048;

std::string ShapeOf(const v1::Tensor& t) {
  return ShapeString(std::vector<int64_t>(t.shape().begin(), t.shape().end()));
}

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  std::string message(status.message());
  if (message.size() > kMaxStatusMessage) {
    message.resize(kMaxStatusMessage - 3);
    message += "...";
  }
  // absl and gRPC share the canonical code numbering.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), message);
}

WorkerPool::WorkerPool(int threads, int max_queue)
    : max_queue_(static_cast<size_t>(std::max(1, max_queue))) {
  for (int i = 0; i < std::max(1, threads); ++i) {
    threads_.emplace_back([this] { Loop(); });
  }
}

WorkerPool::~WorkerPool() {
  Close();
  for (auto& t : threads_) t.join();
}

bool WorkerPool::TrySubmit(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_ || queue_.size() >= max_queue_) return false;
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
  return true;
}

void WorkerPool::Close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  cv_.notify_all();
}

void WorkerPool::Loop() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return closed_ || !queue_.empty(); });
      if (queue_.empty()) return;  // closed and drained
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

TensorCheckServiceImpl::TensorCheckServiceImpl(const Engine* engine, ServiceOptions options)
    : engine_(engine), options_(std::move(options)), pool_(options_.workers, options_.max_queue) {}

TensorCheckServiceImpl::~TensorCheckServiceImpl() = default;

void TensorCheckServiceImpl::StartDraining() { draining_ = true; }

bool TensorCheckServiceImpl::WaitForIdle(absl::Time deadline) {
  std::unique_lock<std::mutex> lock(idle_mu_);
  return idle_cv_.wait_until(lock, absl::ToChronoTime(deadline),
                             [this] { return in_flight_ == 0; });
}

grpc::ServerUnaryReactor* TensorCheckServiceImpl::Verify(grpc::CallbackServerContext* context,
                                                         const v1::VerifyRequest* request,
                                                         v1::VerifyResponse* response) {
  return RunLinear(context, request, response, /*diagnose=*/false);
}

grpc::ServerUnaryReactor* TensorCheckServiceImpl::Diagnose(grpc::CallbackServerContext* context,
                                                           const v1::VerifyRequest* request,
                                                           v1::VerifyResponse* response) {
  return RunLinear(context, request, response, /*diagnose=*/true);
}

grpc::ServerUnaryReactor* TensorCheckServiceImpl::RunLinear(grpc::CallbackServerContext* context,
                                                            const v1::VerifyRequest* request,
                                                            v1::VerifyResponse* response,
                                                            bool diagnose) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::string_view method = diagnose ? "Diagnose" : "Verify";
  const auto start = std::chrono::steady_clock::now();
  if (draining_) {
    const absl::Status s = absl::UnavailableError("server is shutting down");
    LogRequest(method, request, 0, s);
    reactor->Finish(ToGrpcStatus(s));
    return reactor;
  }
  auto task = [this, context, request, response, reactor, diagnose, method, start] {
    absl::Status status = [&]() -> absl::Status {
      if (context->IsCancelled()) {
        return absl::CancelledError("the client cancelled the request");
      }
      TC_ASSIGN_OR_RETURN(LinearRequest req, FromProto(*request, engine_->options().limits));
      TC_ASSIGN_OR_RETURN(VerifyOutcome outcome,
                          diagnose ? engine_->Diagnose(req) : engine_->Verify(req));
      ToProto(outcome, response);
      return absl::OkStatus();
    }();
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    LogRequest(method, request, ms, status);
    if (IsFatalDeviceError(status) && options_.on_fatal && !fatal_reported_.exchange(true)) {
      options_.on_fatal(status);
    }
    reactor->Finish(ToGrpcStatus(status));
    {
      std::lock_guard<std::mutex> lock(idle_mu_);
      --in_flight_;
    }
    idle_cv_.notify_all();
  };
  {
    std::lock_guard<std::mutex> lock(idle_mu_);
    ++in_flight_;
  }
  if (!pool_.TrySubmit(std::move(task))) {
    {
      std::lock_guard<std::mutex> lock(idle_mu_);
      --in_flight_;
    }
    idle_cv_.notify_all();
    const absl::Status s = absl::UnavailableError(
        absl::StrCat("server busy: ", options_.max_queue, " requests already queued; retry later"));
    LogRequest(method, request, 0, s);
    reactor->Finish(ToGrpcStatus(s));
  }
  return reactor;
}

grpc::ServerUnaryReactor* TensorCheckServiceImpl::GetCapabilities(
    grpc::CallbackServerContext* context, const v1::GetCapabilitiesRequest*,
    v1::GetCapabilitiesResponse* response) {
  FillCapabilities(response);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

void TensorCheckServiceImpl::FillCapabilities(v1::GetCapabilitiesResponse* response) const {
  response->set_server_version(options_.server_version);
  response->set_default_reference(engine_->options().default_reference);
  for (TolerancePreset p : kAllTolerancePresets) {
    response->add_tolerance_presets(std::string(TolerancePresetName(p)));
  }
  response->set_tensor_store(false);
  const RequestLimits& l = engine_->options().limits;
  v1::Limits* limits = response->mutable_limits();
  limits->set_max_message_bytes(l.max_message_bytes);
  limits->set_max_tensor_bytes(l.max_tensor_bytes);
  limits->set_max_configs(l.max_configs);
  limits->set_max_rank(kMaxRank);
  limits->set_max_top_k(l.max_top_k);
  limits->set_max_repeat(l.max_repeat);
  for (const LinearBackend* backend : engine_->registry().backends()) {
    v1::BackendInfo* info = response->add_backends();
    info->set_name(std::string(backend->name()));
    const absl::Status available = backend->Available();
    info->set_available(available.ok());
    if (!available.ok()) info->set_unavailable_reason(std::string(available.message()));
    for (Precision p : backend->precisions()) {
      info->add_precisions(std::string(PrecisionName(p)));
    }
    for (BiasMode b : backend->bias_modes()) {
      info->add_bias_modes(std::string(BiasModeName(b)));
    }
    for (DType d : backend->storage_dtypes()) info->add_storage_dtypes(DTypeToProto(d));
    if (available.ok()) {
      for (Precision p : backend->precisions()) {
        for (BiasMode b : backend->bias_modes()) {
          info->add_configs(Config{std::string(backend->name()), p, b}.ToString());
        }
      }
    }
    const DeviceDescription d = backend->device();
    if (!d.name.empty()) {
      v1::DeviceInfo* di = info->mutable_device();
      di->set_name(d.name);
      di->set_compute_capability(d.compute_capability);
      di->set_memory_bytes(d.memory_bytes);
      di->set_driver_version(d.driver_version);
      di->set_runtime_version(d.runtime_version);
      di->set_cublas_version(d.cublas_version);
    }
  }
}

void TensorCheckServiceImpl::LogRequest(absl::string_view method, const v1::VerifyRequest* request,
                                        double elapsed_ms, const absl::Status& status) const {
  nlohmann::json fields = {
      {"method", std::string(method)},
      {"configs", absl::StrJoin(request->configs(), ",")},
      {"reference", request->reference().empty() ? "default" : request->reference()},
      {"input", ShapeOf(request->op().input())},
      {"weight", ShapeOf(request->op().weight())},
      {"elapsed_ms", std::round(elapsed_ms * 100) / 100},
      {"status", absl::StatusCodeToString(status.code())}};
  if (!status.ok()) fields["error"] = std::string(status.message().substr(0, 300));
  LogEvent(status.ok() ? spdlog::level::info : spdlog::level::warn, "request", fields);
}

}  // namespace tensorcheck
