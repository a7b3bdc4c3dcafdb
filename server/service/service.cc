#include "server/service/service.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"
#include "google/rpc/status.pb.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/support/proto_buffer_writer.h"
#include "nlohmann/json.hpp"
#include "server/service/logging.h"
#include "server/service/request_id.h"

namespace tensorcheck {

namespace {

constexpr size_t kMaxStatusMessage = 2048;
// Bytes of server memory per byte of a request, until it is parsed: gRPC's
// transport holds the message as it arrives and assembled, then the parsed
// copy. Measured peaks over idle of one request: 2.92x for 50 MiB and 200
// MiB (bench/loadgen.py --big-requests 1; docs/reliability.md).
constexpr int64_t kHeldPerRequestByte = 3;
// A cancel this close to the call's deadline is taken for the deadline.
constexpr absl::Duration kDeadlineSlack = absl::Milliseconds(500);

}  // namespace

absl::Status ParseRequest(const grpc::ByteBuffer& bytes, google::protobuf::Message* request) {
  grpc::ByteBuffer copy(bytes);  // shares the slices; the reader consumes its own
  grpc::ProtoBufferReader reader(&copy);
  google::protobuf::io::CodedInputStream input(&reader);
  input.SetTotalBytesLimit(INT32_MAX);
  if (!request->ParseFromCodedStream(&input) || !input.ConsumedEntireMessage()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request: the ", bytes.Length(), " bytes received are not a valid ", request->GetTypeName(),
        " (truncated or corrupt protobuf, or a string field that is not UTF-8)"));
  }
  return absl::OkStatus();
}

absl::Status SerializeResponse(const google::protobuf::Message& message, grpc::ByteBuffer* out) {
  bool own_buffer = false;
  const grpc::Status s = grpc::GenericSerialize<grpc::ProtoBufferWriter, google::protobuf::Message>(
      message, out, &own_buffer);
  if (!s.ok()) return absl::InternalError(absl::StrCat("response: ", s.error_message()));
  return absl::OkStatus();
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  std::string message(status.message());
  if (message.size() > kMaxStatusMessage) {
    message.resize(kMaxStatusMessage - 3);
    message += "...";
  }
  // absl and gRPC share the canonical code numbering.
  const auto code = static_cast<grpc::StatusCode>(status.code());
  if (absl::optional<absl::Cord> missing = status.GetPayload(kMissingTensorsTypeUrl)) {
    // The rich error model: a google.rpc.Status in grpc-status-details-bin.
    google::rpc::Status detail;
    detail.set_code(static_cast<int>(status.code()));
    detail.set_message(message);
    google::protobuf::Any* any = detail.add_details();
    any->set_type_url(std::string(kMissingTensorsTypeUrl));
    any->set_value(std::string(*missing));
    return grpc::Status(code, message, detail.SerializeAsString());
  }
  return grpc::Status(code, message);
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

size_t WorkerPool::queued() {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size();
}

// One Verify or Diagnose call: its reactor (OnCancel stops the work;
// OnDone logs what the client actually got, then deletes the call), its
// stop signal, and what the log line says of it.
class LinearCall final : public grpc::ServerGenericBidiReactor {
 public:
  LinearCall(TensorCheckServiceImpl* service, grpc::CallbackServerContext* context,
             LinearMethod method, absl::Time deadline, bool deadline_is_server_cap)
      : service_(service),
        context_(context),
        method_(method),
        deadline_is_server_cap_(deadline_is_server_cap),
        start_(absl::Now()),
        stop_(deadline) {}

  // The request, read once admitted (StartLinear).
  void OnReadDone(bool ok) override { service_->Received(this, ok); }

  void OnCancel() override {
    // gRPC cancels a call whose deadline passes too, and the client's
    // stack cancels it a little before the server's clock gets there (the
    // server counts from when the call arrived): a cancel that close to
    // the deadline is the deadline (DEADLINE_EXCEEDED, and so logged), not
    // the client cancelling.
    const bool at_deadline = absl::Now() + kDeadlineSlack >= context_deadline_;
    stop_.Cancel(at_deadline ? StopSignal::Reason::kDeadline
                             : StopSignal::Reason::kClientCancelled);
  }

  void OnDone() override {
    const absl::StatusCode delivered = Delivered();
    LogOutcome(delivered);
    RecordMetrics(delivered);
    delete this;
  }

  // Finishes with `status`, and the retry hint when `pushback_ms` > 0.
  // The last thing the service does with the call.
  void FinishWith(const absl::Status& status, int64_t pushback_ms = 0) {
    status_ = status;
    elapsed_ms_ = absl::ToDoubleMilliseconds(absl::Now() - start_);
    if (status.ok()) response_bytes_ = static_cast<int64_t>(response_.Length());
    if (pushback_ms > 0) {
      context_->AddTrailingMetadata(kRetryPushbackKey, std::to_string(pushback_ms));
    }
    // The tenant's concurrent place is free once the answer is handed to
    // gRPC, not when it has been delivered: a client that sends its next
    // request as soon as it has this answer is never refused for it.
    quota_slot_ = RequestQuotas::Slot();
    { ByteBudget::Reservation released(std::move(read_reservation_)); }
    if (status.ok()) {
      StartWriteAndFinish(&response_, grpc::WriteOptions(), grpc::Status::OK);
    } else {
      Finish(ToGrpcStatus(status));
    }
  }

  absl::string_view method() const {
    switch (method_) {
      case LinearMethod::kVerify:
        return "Verify";
      case LinearMethod::kDiagnose:
        return "Diagnose";
      case LinearMethod::kCompare:
        return "Compare";
    }
    return "";
  }

 private:
  friend class TensorCheckServiceImpl;

  // The status the client got: ours when it was delivered; otherwise
  // CANCELLED or DEADLINE_EXCEEDED (the client went away, its deadline
  // passed, or the response could not be sent).
  absl::StatusCode Delivered() const {
    if (!context_->IsCancelled()) return status_.code();
    return absl::Now() >= context_deadline_ ? absl::StatusCode::kDeadlineExceeded
                                            : absl::StatusCode::kCancelled;
  }

  // One line per call, with the status the client got (Delivered).
  void LogOutcome(absl::StatusCode delivered) const {
    const bool lost = context_->IsCancelled();
    nlohmann::json fields = {{"method", std::string(method())},
                             {"request_id", request_id_},
                             {"tenant", tenant_},
                             {"configs", summary_.configs},
                             {"reference", summary_.reference},
                             {"input", summary_.input},
                             {"weight", summary_.weight},
                             {"request_bytes", request_bytes_},
                             {"elapsed_ms", std::round(elapsed_ms_ * 100) / 100},
                             {"status", absl::StatusCodeToString(delivered)}};
    if (lost) {
      fields["server_status"] = absl::StatusCodeToString(status_.code());
      fields["delivered"] = false;
    }
    if (!status_.ok()) fields["error"] = std::string(status_.message().substr(0, 300));
    const bool ok = delivered == absl::StatusCode::kOk;
    LogEvent(ok ? spdlog::level::info : spdlog::level::warn, "request", fields);
  }

  // Counts the call in the metrics, when on, as the log line tells it.
  void RecordMetrics(absl::StatusCode delivered) const {
    if (metrics_ == nullptr) return;
    CallRecord call;
    call.method = method();
    call.tenant = tenant_;
    call.code = delivered;
    call.total_seconds = elapsed_ms_ / 1000;
    if (worker_start_ != absl::InfiniteFuture()) {  // a worker ran it
      call.queue_seconds = absl::ToDoubleSeconds(worker_start_ - start_);
      call.compute_seconds = std::max(0.0, call.total_seconds - *call.queue_seconds);
    }
    call.received_bytes = request_bytes_;
    call.sent_bytes = call.code == absl::StatusCode::kOk ? response_bytes_ : 0;
    metrics_->Record(call);
  }

  struct Summary {
    std::string configs, reference = "default", input = "?", weight = "?";
  };

  TensorCheckServiceImpl* const service_;
  grpc::CallbackServerContext* const context_;
  grpc::ByteBuffer request_;   // as received, until parsed
  grpc::ByteBuffer response_;  // serialised, being sent
  // What the request may take while it is received (StartLinear).
  ByteBudget::Reservation read_reservation_;
  const LinearMethod method_;
  const bool deadline_is_server_cap_;
  const absl::Time start_;
  absl::Time context_deadline_ = absl::InfiniteFuture();
  StopSignal stop_;
  std::string request_id_;  // AttachRequestId
  int64_t request_bytes_ = 0;
  int64_t response_bytes_ = 0;                        // serialised, when answered OK
  int64_t max_inline_output_bytes_ = 0;               // the request's; 0: the server's
  ServiceMetrics* metrics_ = nullptr;                 // null: metrics off
  absl::Time worker_start_ = absl::InfiniteFuture();  // when a worker took it
  RequestProgress progress_;  // what GetProgress reports ("" until a worker takes it)
  Summary summary_;
  absl::Status status_;
  double elapsed_ms_ = 0;
  std::string tenant_;              // empty: the server has no tenants
  StoreView store_;                 // the tenant's namespace of the store
  RequestQuotas::Slot quota_slot_;  // the tenant's concurrent place, until answered
};

namespace {

std::string ShapeOf(const v1::Tensor& t) {
  return ShapeString(std::vector<int64_t>(t.shape().begin(), t.shape().end()));
}

absl::Status Refusal(ByteBudget::Outcome o, int64_t bytes, const ByteBudget& budget,
                     absl::string_view what) {
  if (o == ByteBudget::Outcome::kOverBudget) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, " needs about ", bytes, " bytes of server memory, more than its limit of ",
        budget.limit(), " bytes for all requests in flight (--max-inflight-bytes)"));
  }
  // Not how much is held: on a server shared by tenants that would tell
  // one tenant of another's requests (docs/operations.md, "What a tenant
  // can learn").
  return absl::ResourceExhaustedError(absl::StrCat(
      "server busy: ", what, " needs about ", bytes, " bytes of server memory, more than the ",
      "requests in flight leave of its limit of ", budget.limit(), " bytes now; retry later"));
}

}  // namespace

// Routes Verify, Diagnose and Compare (marked generic in the service) to
// StartLinear; any other method the server does not know is UNIMPLEMENTED.
class TensorCheckServiceImpl::LinearMethods final : public grpc::CallbackGenericService {
 public:
  explicit LinearMethods(TensorCheckServiceImpl* service) : service_(service) {}

  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* context) override {
    static const auto* const kMethods = new std::map<std::string, LinearMethod>{
        {"/tensorcheck.v1.TensorCheck/Verify", LinearMethod::kVerify},
        {"/tensorcheck.v1.TensorCheck/Diagnose", LinearMethod::kDiagnose},
        {"/tensorcheck.v1.TensorCheck/Compare", LinearMethod::kCompare},
    };
    const auto it = kMethods->find(context->method());
    if (it != kMethods->end()) return service_->StartLinear(context, it->second);
    return grpc::CallbackGenericService::CreateReactor(context);  // UNIMPLEMENTED
  }

 private:
  TensorCheckServiceImpl* const service_;
};

TensorCheckServiceImpl::TensorCheckServiceImpl(const Engine* engine, ServiceOptions options)
    : engine_(engine),
      options_(std::move(options)),
      budget_(options_.max_inflight_bytes),
      pool_(options_.workers, options_.max_queue) {
  linear_methods_ = std::make_unique<LinearMethods>(this);
  if (options_.trim_when_idle > absl::ZeroDuration()) {
    idle_trim_ = std::make_unique<IdleTrim>(IdleTrim::Options{options_.trim_when_idle, nullptr});
  }
  if (options_.store != nullptr) {
    tenant_store_ = std::make_unique<TenantStore>(options_.store);
    sweeper_ = std::thread([this] { SweepUploads(); });
  }
}

TensorCheckServiceImpl::~TensorCheckServiceImpl() {
  {
    std::lock_guard<std::mutex> lock(sweeper_mu_);
    stopping_ = true;
  }
  sweeper_cv_.notify_all();
  if (sweeper_.joinable()) sweeper_.join();
}

void TensorCheckServiceImpl::WatchStream(const void* key, grpc::CallbackServerContext* context,
                                         const std::atomic<int64_t>* last_activity_ns) {
  if (idle_trim_ != nullptr) idle_trim_->CallStarted();
  std::lock_guard<std::mutex> lock(streams_mu_);
  streams_[key] = StreamWatch{context, last_activity_ns, false};
  streams_open_.store(static_cast<int>(streams_.size()));
}

void TensorCheckServiceImpl::UnwatchStream(const void* key) {
  {
    std::lock_guard<std::mutex> lock(streams_mu_);
    streams_.erase(key);
    streams_open_.store(static_cast<int>(streams_.size()));
  }
  // Taken and released so that WaitForIdle, between reading the count and
  // waiting, cannot miss this notification.
  { std::lock_guard<std::mutex> lock(calls_mu_); }
  idle_cv_.notify_all();
  if (idle_trim_ != nullptr) idle_trim_->CallEnded();
}

int TensorCheckServiceImpl::CancelIdleUploads(absl::Time now) {
  const int64_t limit_ns = absl::ToInt64Nanoseconds(options_.upload_idle);
  const int64_t now_ns = absl::ToUnixNanos(now);
  int cancelled = 0;
  std::lock_guard<std::mutex> lock(streams_mu_);
  for (auto& [key, watch] : streams_) {
    if (watch.last_activity_ns == nullptr || watch.cancelled) continue;
    if (now_ns - watch.last_activity_ns->load() > limit_ns) {
      watch.cancelled = true;
      watch.context->TryCancel();  // the bytes received stay, for resuming
      ++cancelled;
    }
  }
  return cancelled;
}

void TensorCheckServiceImpl::SweepUploads() {
  // Often enough that an abandoned upload's memory is back within half
  // its time to live past the deadline, and an idle stream is cut within
  // half its limit (at most every 10 s).
  const absl::Duration ttl = options_.store->options().partial_upload_ttl;
  const absl::Duration period = std::clamp(std::min(ttl, options_.upload_idle) / 2,
                                           absl::Milliseconds(100), absl::Seconds(10));
  std::unique_lock<std::mutex> lock(sweeper_mu_);
  while (!sweeper_cv_.wait_for(
      lock, absl::ToChronoSeconds(period) + absl::ToChronoMilliseconds(period % absl::Seconds(1)),
      [this] { return stopping_; })) {
    lock.unlock();
    if (const int idle = CancelIdleUploads(absl::Now()); idle > 0) {
      LogEvent(spdlog::level::warn, "idle uploads cancelled",
               {{"count", idle}, {"idle_seconds", absl::ToDoubleSeconds(options_.upload_idle)}});
    }
    const int freed = options_.store->ExpirePartialUploads();
    if (freed > 0) {
      LogEvent(spdlog::level::info, "uploads_expired",
               {{"count", freed}, {"ttl_seconds", absl::ToInt64Seconds(ttl)}});
    }
    lock.lock();
  }
}

void TensorCheckServiceImpl::StartDraining() { draining_ = true; }

void TensorCheckServiceImpl::CancelAll() {
  {
    std::lock_guard<std::mutex> lock(calls_mu_);
    for (LinearCall* call : calls_) call->stop_.Cancel(StopSignal::Reason::kShutdown);
  }
  std::lock_guard<std::mutex> lock(streams_mu_);
  for (auto& [key, watch] : streams_) {
    if (!watch.cancelled) watch.context->TryCancel();  // an upload stays resumable
    watch.cancelled = true;
  }
}

bool TensorCheckServiceImpl::WaitForIdle(absl::Time deadline) {
  std::unique_lock<std::mutex> lock(calls_mu_);
  return idle_cv_.wait_until(lock, absl::ToChronoTime(deadline),
                             [this] { return in_flight_ == 0 && streams_open_.load() == 0; });
}

void TensorCheckServiceImpl::Track(LinearCall* call) {
  if (idle_trim_ != nullptr) idle_trim_->CallStarted();
  std::lock_guard<std::mutex> lock(calls_mu_);
  ++in_flight_;
  calls_.insert(call);
}

void TensorCheckServiceImpl::Untrack(LinearCall* call) {
  {
    std::lock_guard<std::mutex> lock(calls_mu_);
    --in_flight_;
    calls_.erase(call);
  }
  idle_cv_.notify_all();
  if (idle_trim_ != nullptr) idle_trim_->CallEnded();
}

void TensorCheckServiceImpl::NoteSaturation(bool saturated) {
  if (saturated_.exchange(saturated) != saturated && options_.on_saturation) {
    options_.on_saturation(saturated);
  }
}

int64_t TensorCheckServiceImpl::RetryPushbackMs(int64_t requests_ahead) const {
  // About when a worker will have finished that many more requests, from
  // the moving average of request times.
  const double ms = mean_request_ms_.load() *
                    static_cast<double>(std::max<int64_t>(1, requests_ahead)) /
                    std::max(1, options_.workers);
  return static_cast<int64_t>(std::clamp(ms, 100.0, 30000.0));
}

grpc::ServerGenericBidiReactor* TensorCheckServiceImpl::StartLinear(
    grpc::GenericCallbackServerContext* context, LinearMethod method) {
  // The deadline: the client's, or the server's cap on one request.
  const absl::Time cap = absl::Now() + options_.max_request_time;
  absl::Time client = absl::InfiniteFuture();
  if (context->deadline() != std::chrono::system_clock::time_point::max()) {
    client = absl::FromChrono(context->deadline());
  }
  auto* call = new LinearCall(this, context, method, std::min(cap, client),
                              /*deadline_is_server_cap=*/cap < client);
  call->request_id_ = AttachRequestId(context);
  call->context_deadline_ = client;
  call->metrics_ = options_.metrics;
  absl::StatusOr<Caller> caller =
      Authenticate(*context, method == LinearMethod::kVerify ? Right::kVerify : Right::kDiagnose,
                   call->method());
  if (!caller.ok()) {
    call->FinishWith(caller.status());
    return call;
  }
  call->tenant_ = caller->name();
  call->store_ = caller->store;
  if (caller->tenant != nullptr) {
    // Queued requests count: a tenant cannot fill the queue past its share.
    int64_t retry_ms = 0;
    absl::StatusOr<RequestQuotas::Slot> slot =
        quotas_.Admit(*caller->tenant, absl::Now(), &retry_ms, RetryPushbackMs(1));
    if (!slot.ok()) {
      call->FinishWith(slot.status(), retry_ms);
      return call;
    }
    call->quota_slot_ = *std::move(slot);
  }
  if (draining_) {
    call->FinishWith(ShuttingDown(), RetryPushbackMs(/*requests_ahead=*/1));
    return call;
  }
  // Before receiving: the bytes the request will take, for the size its
  // client declares, else for as large a message as the limit allows
  // (within the budget). Refused here, it is never received.
  const int64_t max_message = engine_->options().limits.max_message_bytes;
  int64_t declared = 0;
  const auto& metadata = context->client_metadata();
  if (auto it = metadata.find(kRequestBytesKey); it != metadata.end()) {
    if (!absl::SimpleAtoi(absl::string_view(it->second.data(), it->second.size()), &declared) ||
        declared < 0 || declared > max_message) {
      declared = 0;  // not a size it could send: as if not declared
    }
  }
  int64_t read_bytes = kHeldPerRequestByte * (declared > 0 ? declared : max_message);
  if (declared == 0 && budget_.limit() > 0) read_bytes = std::min(read_bytes, budget_.limit());
  const ByteBudget::Outcome admitted = budget_.TryReserve(read_bytes, &call->read_reservation_);
  if (admitted != ByteBudget::Outcome::kAdmitted) {
    call->FinishWith(Refusal(admitted, read_bytes, budget_, "this request"),
                     admitted == ByteBudget::Outcome::kBusy ? RetryPushbackMs(1) : 0);
    return call;
  }
  call->StartRead(&call->request_);
  return call;
}

void TensorCheckServiceImpl::Received(LinearCall* call, bool ok) {
  if (!ok) {
    // The client half-closed without a message, or the call is gone.
    call->FinishWith(absl::InvalidArgumentError("request: the call ended before its message"));
    return;
  }
  call->request_bytes_ = static_cast<int64_t>(call->request_.Length());
  // From what it may take to what it takes.
  const int64_t parse_bytes = kHeldPerRequestByte * call->request_bytes_;
  ByteBudget::Reservation reservation(std::move(call->read_reservation_));
  const ByteBudget::Outcome admitted = budget_.TryResize(&reservation, parse_bytes);
  if (admitted != ByteBudget::Outcome::kAdmitted) {
    { ByteBudget::Reservation released(std::move(reservation)); }  // before the answer
    call->FinishWith(Refusal(admitted, parse_bytes, budget_, "this request"),
                     admitted == ByteBudget::Outcome::kBusy ? RetryPushbackMs(1) : 0);
    return;
  }
  Track(call);
  auto held = std::make_shared<ByteBudget::Reservation>(std::move(reservation));
  if (!pool_.TrySubmit([this, call, held] {
        ByteBudget::Reservation r(std::move(*held));
        Work(call, &r);
      })) {
    Untrack(call);
    NoteSaturation(true);
    call->FinishWith(absl::UnavailableError(absl::StrCat("server busy: ", options_.max_queue,
                                                         " requests already queued; retry later")),
                     RetryPushbackMs(static_cast<int64_t>(pool_.max_queue()) + 1));
  } else if (pool_.queued() >= pool_.max_queue()) {
    // Full now: readiness says so before the next request is refused.
    NoteSaturation(true);
  }
}

void TensorCheckServiceImpl::Work(LinearCall* call, ByteBudget::Reservation* reservation) {
  call->worker_start_ = absl::Now();
  call->progress_.Begin("checking the request", 0);
  if (saturated_ && pool_.queued() < pool_.max_queue()) NoteSaturation(false);
  bool retry_later = false;
  absl::Status status = Execute(call, reservation, &retry_later);
  if (status.code() == absl::StatusCode::kDeadlineExceeded && IsStopStatus(status) &&
      call->deadline_is_server_cap_) {
    status = absl::DeadlineExceededError(
        absl::StrCat("the request ran longer than this server's limit of ",
                     absl::FormatDuration(options_.max_request_time),
                     " per request (--max-request-seconds); set a deadline, or ask for less work"));
  }
  if (IsFatalDeviceError(status) && options_.on_fatal && !fatal_reported_.exchange(true)) {
    options_.on_fatal(status);
  }
  if (status.ok()) {
    const double ms = absl::ToDoubleMilliseconds(absl::Now() - call->start_);
    mean_request_ms_.store(0.8 * mean_request_ms_.load() + 0.2 * ms);
  }
  // The request's tensors and working memory are gone; its response is
  // held by gRPC until sent (at most the message limit).
  { ByteBudget::Reservation done(std::move(*reservation)); }
  Untrack(call);  // the heap is trimmed once the server is idle (idle_trim.h)
  call->FinishWith(status,
                   retry_later ? RetryPushbackMs(1) : 0);  // the call may be gone after this
}

absl::Status TensorCheckServiceImpl::Execute(LinearCall* call, ByteBudget::Reservation* reservation,
                                             bool* retry_later) {
  TC_RETURN_IF_ERROR(call->stop_.Check());  // cancelled or expired while queued
  if (call->method_ == LinearMethod::kCompare)
    return ExecuteCompare(call, reservation, retry_later);
  LinearRequest req;
  {
    v1::VerifyRequest proto;
    TC_RETURN_IF_ERROR(ParseRequest(call->request_, &proto));
    // The received bytes are not needed any more; gRPC would keep them
    // until the call ends.
    call->request_.Clear();
    LinearCall::Summary& s = call->summary_;
    s.configs = absl::StrJoin(proto.configs(), ",");
    if (!proto.reference().empty()) s.reference = proto.reference();
    s.input = ShapeOf(proto.op().input());
    s.weight = ShapeOf(proto.op().weight());
    if (proto.output().max_inline_output_bytes() < 0) {
      return InvalidFieldError("output.max_inline_output_bytes", "0 or more bytes",
                               absl::StrCat(proto.output().max_inline_output_bytes()));
    }
    call->max_inline_output_bytes_ = proto.output().max_inline_output_bytes();
    TC_ASSIGN_OR_RETURN(req, FromProto(proto, engine_->options().limits, call->store_));
  }
  // Now the shapes are known: the tensors and the engine's working memory.
  // Stored tensors are the store's bytes (its own budget), not copies.
  auto held = [](const Tensor& t) { return t.borrowed() ? 0 : static_cast<int64_t>(t.nbytes()); };
  auto held_if = [&](const std::optional<Tensor>& t) { return t ? held(*t) : int64_t{0}; };
  const int64_t tensors = held(req.input) + held(req.weight) + held_if(req.bias) +
                          held_if(req.observed) + held_if(req.input_scale) +
                          held_if(req.weight_scale) + held_if(req.input_global_scale) +
                          held_if(req.weight_global_scale);
  const int64_t need =
      tensors + engine_->EstimateWorkingBytes(req, call->method_ != LinearMethod::kVerify);
  const ByteBudget::Outcome admitted = budget_.TryResize(reservation, need);
  if (admitted != ByteBudget::Outcome::kAdmitted) {
    *retry_later = admitted == ByteBudget::Outcome::kBusy;
    return Refusal(admitted, need, budget_, "this request");
  }
  TC_RETURN_IF_ERROR(call->stop_.Check());
  v1::VerifyResponse response;
  {
    TC_ASSIGN_OR_RETURN(VerifyOutcome outcome,
                        call->method_ == LinearMethod::kDiagnose
                            ? engine_->Diagnose(req, &call->stop_, &call->progress_)
                            : engine_->Verify(req, &call->stop_, &call->progress_));
    req = LinearRequest();  // the tensors go before the response is built
    ToProto(outcome, &response);
  }
  TC_RETURN_IF_ERROR(StoreLargeOutputs(call->store_, call->max_inline_output_bytes_, &response));
  return Serialize(response, call);
}

absl::Status TensorCheckServiceImpl::Serialize(const google::protobuf::Message& response,
                                               LinearCall* call) const {
  TC_RETURN_IF_ERROR(SerializeResponse(response, &call->response_));
  const int64_t size = static_cast<int64_t>(call->response_.Length());
  if (size > engine_->options().limits.max_message_bytes) {
    call->response_.Clear();
    return absl::ResourceExhaustedError(
        absl::StrCat("response: ", size, " bytes exceed the message limit of ",
                     engine_->options().limits.max_message_bytes,
                     " bytes; ask without return_outputs or for fewer configurations"));
  }
  return absl::OkStatus();
}

absl::Status TensorCheckServiceImpl::ExecuteCompare(LinearCall* call,
                                                    ByteBudget::Reservation* reservation,
                                                    bool* retry_later) {
  CompareInput in;
  {
    v1::CompareRequest proto;
    TC_RETURN_IF_ERROR(ParseRequest(call->request_, &proto));
    call->request_.Clear();
    LinearCall::Summary& s = call->summary_;
    s.configs = absl::StrJoin(proto.configs(), ",");
    if (!proto.reference().empty()) s.reference = proto.reference();
    s.input = ShapeOf(proto.op().input());
    s.weight = ShapeOf(proto.op().weight());
    TC_ASSIGN_OR_RETURN(in, FromProto(&proto, engine_->options().limits, call->store_));
  }
  // The tensors, and a diagnosis's working memory: the two outputs are
  // diagnosed one after the other, and each keeps its best candidate's
  // output.
  const LinearRequest& req = in.request;
  auto held = [](const Tensor& t) { return t.borrowed() ? 0 : static_cast<int64_t>(t.nbytes()); };
  auto held_if = [&](const std::optional<Tensor>& t) { return t ? held(*t) : int64_t{0}; };
  int64_t tensors = held(req.input) + held(req.weight) + held_if(req.bias) +
                    held_if(req.input_scale) + held_if(req.weight_scale) +
                    held_if(req.input_global_scale) + held_if(req.weight_global_scale);
  for (const auto& [name, t] : in.observed) tensors += 2 * static_cast<int64_t>(t.nbytes());
  const int64_t need = tensors + engine_->EstimateWorkingBytes(req, /*diagnose=*/true);
  const ByteBudget::Outcome admitted = budget_.TryResize(reservation, need);
  if (admitted != ByteBudget::Outcome::kAdmitted) {
    *retry_later = admitted == ByteBudget::Outcome::kBusy;
    return Refusal(admitted, need, budget_, "this request");
  }
  TC_RETURN_IF_ERROR(call->stop_.Check());
  v1::CompareResponse response;
  {
    TC_ASSIGN_OR_RETURN(CompareOutcome outcome,
                        engine_->CompareOutputs(req, in.observed, &call->stop_, &call->progress_));
    in = CompareInput();  // the tensors go before the response is built
    ToProto(outcome, &response);
  }
  return Serialize(response, call);
}

absl::Status TensorCheckServiceImpl::StoreLargeOutputs(const StoreView& store,
                                                       int64_t request_limit,
                                                       v1::VerifyResponse* response) {
  if (!store) return absl::OkStatus();
  const int64_t limit = request_limit > 0 ? std::min(request_limit, options_.inline_output_bytes)
                                          : options_.inline_output_bytes;
  auto store_one = [&](v1::ConfigResult* result) -> absl::Status {
    if (!result->has_output()) return absl::OkStatus();
    v1::Tensor* t = result->mutable_output();
    if (t->source_case() != v1::Tensor::kData || static_cast<int64_t>(t->data().size()) <= limit) {
      return absl::OkStatus();
    }
    std::string* bytes = t->mutable_data();
    const Digest digest = DigestOf(*bytes);
    // Not pinned: the client reads it soon after (docs/api.md). A store
    // with no room leaves the output inline (the bytes are still there);
    // the response's size check then decides.
    absl::StatusOr<TensorStore::Blob> stored =
        store.Put(digest, std::move(*bytes), /*persist=*/false);
    if (!stored.ok()) {
      if (stored.status().code() == absl::StatusCode::kResourceExhausted) return absl::OkStatus();
      return stored.status();
    }
    t->set_digest(digest.ToString());  // clears the (moved-from) data
    return absl::OkStatus();
  };
  if (response->has_reference()) TC_RETURN_IF_ERROR(store_one(response->mutable_reference()));
  for (v1::ConfigResult& r : *response->mutable_results()) TC_RETURN_IF_ERROR(store_one(&r));
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* TensorCheckServiceImpl::GetCapabilities(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request_bytes,
    grpc::ByteBuffer* response_bytes) {
  AttachRequestId(context);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<Caller> caller = Authenticate(*context, std::nullopt, "GetCapabilities");
  v1::GetCapabilitiesRequest request;
  v1::GetCapabilitiesResponse response;
  absl::Status status = caller.status();
  if (status.ok()) status = ParseRequest(*request_bytes, &request);
  if (status.ok()) {
    FillCapabilities(&response, caller->tenant != nullptr ? &caller->store : nullptr);
    status = SerializeResponse(response, response_bytes);
  }
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

grpc::ServerUnaryReactor* TensorCheckServiceImpl::GetProgress(grpc::CallbackServerContext* context,
                                                              const grpc::ByteBuffer* request_bytes,
                                                              grpc::ByteBuffer* response_bytes) {
  AttachRequestId(context);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<Caller> caller = Authenticate(*context, std::nullopt, "GetProgress");
  v1::GetProgressRequest request;
  absl::Status parsed = caller.status();
  if (parsed.ok()) parsed = ParseRequest(*request_bytes, &request);
  if (!parsed.ok()) {
    reactor->Finish(ToGrpcStatus(parsed));
    return reactor;
  }
  v1::GetProgressResponse response;
  const std::string& id = request.request_id();
  if (!UsableRequestId(id)) {
    reactor->Finish(ToGrpcStatus(absl::InvalidArgumentError(absl::StrCat(
        "request_id: 1 to ", kMaxRequestIdLength,
        " characters of [A-Za-z0-9._:/-] (the x-request-id the call was sent with), got \"",
        id.substr(0, 64), id.size() > 64 ? "...\"" : "\""))));
    return reactor;
  }
  bool found = false;
  {
    // Under calls_mu_: a tracked call is not deleted before Untrack.
    std::lock_guard<std::mutex> lock(calls_mu_);
    for (const LinearCall* call : calls_) {
      // Another tenant's call is not this caller's to watch.
      if (call->request_id_ != id || call->tenant_ != caller->name()) continue;
      const RequestProgress::Snapshot now = call->progress_.Get();
      response.set_method(std::string(call->method()));
      response.set_phase(now.phase.empty() ? "queued" : now.phase);
      response.set_done(now.done);
      response.set_total(now.total);
      response.set_elapsed_seconds(absl::ToDoubleSeconds(absl::Now() - call->start_));
      found = true;
      break;
    }
  }
  reactor->Finish(ToGrpcStatus(
      found ? SerializeResponse(response, response_bytes)
            : absl::NotFoundError(absl::StrCat(
                  "request_id: no Verify, Diagnose or Compare call of yours with id \"", id,
                  "\" is in flight (not started, finished, or never sent)"))));
  return reactor;
}

void TensorCheckServiceImpl::FillCapabilities(v1::GetCapabilitiesResponse* response,
                                              const StoreView* tenant_store) const {
  response->set_server_version(options_.server_version);
  response->set_default_reference(engine_->options().default_reference);
  for (TolerancePreset p : kAllTolerancePresets) {
    response->add_tolerance_presets(std::string(TolerancePresetName(p)));
  }
  response->set_tensor_store(options_.store != nullptr);
  if (options_.store != nullptr) {
    const TensorStore& store = *options_.store;
    const TensorStore::Stats st = store.stats();
    v1::StoreInfo* info = response->mutable_store();
    info->set_present(true);
    info->set_budget_bytes(store.options().budget_bytes);
    info->set_bytes_used(st.bytes_used);
    info->set_tensor_count(st.tensors);
    info->set_largest_tensor_bytes(st.largest);
    info->set_chunk_bytes(kStoreChunkBytes);
    info->set_max_tensor_bytes(store.max_tensor_bytes());
    info->set_persistent(store.persistent());
    info->set_partial_upload_seconds(absl::ToInt64Seconds(store.options().partial_upload_ttl));
    info->set_inline_output_bytes(options_.inline_output_bytes);
    info->set_uploads(st.uploads);
    info->set_uploaded_bytes(st.uploaded_bytes);
    info->set_evictions(st.evictions);
    info->set_partial_uploads(st.partial_uploads);
    info->set_partial_bytes(st.partial_bytes);
    if (tenant_store != nullptr) {
      // A tenant sees its own share: the store's totals would tell it when
      // others upload.
      const TenantStore::Usage usage = tenant_store->tenants->usage(tenant_store->ns);
      if (tenant_store->ns.quota_bytes > 0) info->set_budget_bytes(tenant_store->ns.quota_bytes);
      info->set_bytes_used(usage.bytes);
      info->set_tensor_count(usage.tensors);
      info->set_largest_tensor_bytes(usage.largest);
      info->set_max_tensor_bytes(tenant_store->max_tensor_bytes());
      for (auto field : {&v1::StoreInfo::clear_uploads, &v1::StoreInfo::clear_uploaded_bytes,
                         &v1::StoreInfo::clear_evictions, &v1::StoreInfo::clear_partial_uploads,
                         &v1::StoreInfo::clear_partial_bytes}) {
        (info->*field)();
      }
    }
  }
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
          Config c{std::string(backend->name()), p, b};
          if (p == Precision::kMxFp8E4M3 || p == Precision::kMxFp8E5M2) {
            // Both scale roundings of the MXFP8 recipes.
            for (MxScaleRounding r : {MxScaleRounding::kFloor, MxScaleRounding::kRceil}) {
              c.mx_rounding = r;
              info->add_configs(c.ToString());
            }
            continue;
          }
          if (!IsFp8(p)) {
            info->add_configs(c.ToString());
            continue;
          }
          // The fp8 options too: each scaling the backend runs, with and
          // without fast accumulation.
          for (Fp8Scaling scaling : kFp8Scalings) {
            for (bool fast : {false, true}) {
              c.scaling = scaling;
              c.fast_accum = fast;
              if (!backend->Supports(c, Fp8OperandsOf(p).input).ok()) continue;
              info->add_configs(c.ToString());
            }
          }
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

}  // namespace tensorcheck
