// The tensor store's RPCs: FindMissingTensors, UploadTensor,
// QueryUploadStatus, ReadTensor (docs/api.md has the contract). The store
// itself (server/store) knows nothing of gRPC; this file maps messages and
// streams onto it.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <deque>
#include <memory>
#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"
#include "server/service/logging.h"
#include "server/service/request_id.h"
#include "server/service/service.h"

namespace tensorcheck {

namespace {

// Digests one FindMissingTensors may ask about.
constexpr int kMaxDigestsPerCall = 10000;
// The retry hint of an upload refused because the store is full of tensors
// in use: about when running requests will have released some.
constexpr int64_t kStoreFullPushbackMs = 1000;

absl::Status NoStore() {
  return absl::UnimplementedError(
      "this server has no tensor store (--store-bytes 0): send tensors as data");
}

grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* context,
                                      const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

// One store call as the metrics count it (metrics.h): its method, when it
// began and the bytes it received.
struct StoreCallRecord {
  StoreCallRecord(ServiceMetrics* metrics, absl::string_view method, absl::Time start,
                  int64_t received_bytes = 0, std::string tenant = "")
      : metrics(metrics),
        method(method),
        start(start),
        received_bytes(received_bytes),
        tenant(std::move(tenant)) {}

  ServiceMetrics* metrics;  // null: metrics off
  absl::string_view method;
  absl::Time start;
  int64_t received_bytes;
  std::string tenant;  // empty: not authenticated

  // Counts the call, ended with `code` after sending `sent_bytes`.
  void Done(absl::StatusCode code, int64_t sent_bytes) const {
    if (metrics == nullptr) return;
    CallRecord call;
    call.method = method;
    call.tenant = tenant;
    call.code = code;
    call.total_seconds = absl::ToDoubleSeconds(absl::Now() - start);
    call.received_bytes = received_bytes;
    call.sent_bytes = sent_bytes;
    metrics->Record(call);
  }
};

// FinishUnary, with `response` serialized into `out` when `status` is OK,
// counting the call and its response.
grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* context, absl::Status status,
                                      const StoreCallRecord& record,
                                      const google::protobuf::Message& response,
                                      grpc::ByteBuffer* out) {
  if (status.ok()) status = SerializeResponse(response, out);
  record.Done(status.code(), status.ok() ? static_cast<int64_t>(out->Length()) : 0);
  return FinishUnary(context, status);
}

// One UploadTensor stream: messages go to an UploadSession as they
// arrive (upload_session.h has the rules); the client's half-close ends it.
// A stream that breaks leaves the upload to be resumed.
//
// gRPC runs OnReadDone on the threads that also move bytes off the
// sockets, so the chunks are not copied and hashed there: each message is
// queued, the next read started at once, and a task on the service's
// upload pool applies the queue in order (a few chunks at most are held).
// Receiving, copying and hashing then overlap (docs/performance.md,
// "Tensor store"). Finish is called exactly once, when no read is
// outstanding and no task is running, as the last thing its caller does.
class UploadCall final : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  UploadCall(TensorCheckServiceImpl* service, grpc::CallbackServerContext* context, StoreView store,
             WorkerPool* pool, grpc::ByteBuffer* response, std::string request_id,
             std::string tenant)
      : service_(service),
        context_(context),
        request_id_(std::move(request_id)),
        out_(response),
        pool_(pool),
        session_(std::move(store)),
        tenant_(std::move(tenant)),
        start_(absl::Now()) {
    last_activity_ns_ = absl::ToUnixNanos(start_);
    service_->WatchStream(this, context_, &last_activity_ns_);
    read_outstanding_ = true;
    StartRead(&received_bytes_);
  }

  void OnReadDone(bool ok) override {
    last_activity_ns_ = absl::ToUnixNanos(absl::Now());
    std::unique_lock<std::mutex> lock(mu_);
    read_outstanding_ = false;
    if (ok) {
      // Bytes that are not an UploadTensorRequest end the stream with
      // INVALID_ARGUMENT and the reason, as on every other method; what
      // arrived before stays resumable.
      const absl::Status parsed = ParseRequest(received_bytes_, &request_);
      received_bytes_.Clear();
      if (!parsed.ok()) {
        if (error_.ok()) error_ = parsed;
        ended_ = true;  // read no more
        if (!started_) return FinishLocked(std::move(lock), error_);
        return Step(std::move(lock));
      }
    }
    if (!started_ && ok) {
      // The first message opens the upload, here: it may end the call at
      // once (a tensor already present), before any other read.
      started_ = true;
      absl::Status status = session_.Take(request_);
      request_.Clear();
      if (status.ok() && session_.finished()) status = session_.End(&response_);
      if (!status.ok() || session_.finished()) {
        error_ = status;
        return FinishLocked(std::move(lock), status);
      }
    } else if (!ok) {
      ended_ = true;  // half-closed by the client, or the call is gone
    } else if (error_.ok()) {
      queue_.emplace_back();
      queue_.back().Swap(&request_);
    }
    Step(std::move(lock));
  }

  void OnDone() override {
    service_->UnwatchStream(this);
    Log();
    StoreCallRecord{service_->metrics(), "UploadTensor", start_, received_, tenant_}.Done(
        status_.code(), static_cast<int64_t>(response_.ByteSizeLong()));
    delete this;
  }

 private:
  static constexpr size_t kMaxQueued = 4;

  // Decides what comes next: read, drain, or finish. Consumes the lock;
  // may finish the call (then `this` may be gone on return).
  void Step(std::unique_lock<std::mutex> lock) {
    if (finished_) return;
    if (!error_.ok()) {
      if (!read_outstanding_ && !task_running_) return FinishLocked(std::move(lock), error_);
      return;
    }
    if (!queue_.empty() && !task_running_) {
      task_running_ = true;
      if (!pool_->TrySubmit([this] { Drain(); })) {
        task_running_ = false;  // the pool is full: apply the queue here
        lock.unlock();
        Drain();
        return;
      }
    }
    if (!ended_ && !read_outstanding_ && queue_.size() < kMaxQueued) {
      read_outstanding_ = true;
      StartRead(&received_bytes_);
    }
    if (ended_ && queue_.empty() && !task_running_ && !read_outstanding_) {
      lock.unlock();
      const absl::Status status = session_.End(&response_);  // waits for the hash
      lock.lock();
      return FinishLocked(std::move(lock), status);
    }
  }

  // Applies queued messages in order until the queue is empty or one
  // fails; then steps (which may read more or finish).
  void Drain() {
    std::unique_lock<std::mutex> lock(mu_);
    task_running_ = true;
    while (!queue_.empty() && error_.ok()) {
      v1::UploadTensorRequest m;
      m.Swap(&queue_.front());
      queue_.pop_front();
      const bool resume_reading = !ended_ && !read_outstanding_ && queue_.size() < kMaxQueued;
      if (resume_reading) {
        read_outstanding_ = true;
        StartRead(&received_bytes_);
      }
      lock.unlock();
      const absl::Status status = session_.Take(m);
      lock.lock();
      if (!status.ok()) {
        error_ = status;
        queue_.clear();
        received_ = session_.received();
        session_.Release();  // resumable at once
      }
    }
    task_running_ = false;
    Step(std::move(lock));
  }

  // Finishes the call with `status`; the lock is released first and
  // nothing of `this` is touched after Finish.
  void FinishLocked(std::unique_lock<std::mutex> lock, absl::Status status) {
    if (finished_) return;
    finished_ = true;
    if (status.ok()) status = SerializeResponse(response_, out_);
    status_ = status;
    received_ = std::max(received_, session_.received());
    session_.Release();
    if (!status.ok() && session_.retryable()) {
      context_->AddTrailingMetadata(kRetryPushbackKey, std::to_string(kStoreFullPushbackMs));
    }
    lock.unlock();
    Finish(ToGrpcStatus(status));
  }

  void Log() const {
    const Digest& d = session_.digest();
    nlohmann::json fields = {
        {"method", "UploadTensor"},
        {"request_id", request_id_},
        {"tenant", tenant_},
        {"digest", d.hash.empty() ? std::string("?") : d.ToString()},
        {"size", d.size},
        {"upload_id", session_.upload_id()},
        {"received_bytes", received_},
        {"elapsed_ms", std::round(absl::ToDoubleMilliseconds(absl::Now() - start_) * 100) / 100},
        {"already_present", session_.already_present()},
        {"status", absl::StatusCodeToString(status_.code())}};
    if (session_.resumed_from() > 0) fields["resumed_from"] = session_.resumed_from();
    if (!status_.ok()) fields["error"] = std::string(status_.message().substr(0, 300));
    LogEvent(status_.ok() ? spdlog::level::info : spdlog::level::warn, "upload", fields);
  }

  TensorCheckServiceImpl* const service_;
  grpc::CallbackServerContext* const context_;
  const std::string request_id_;
  grpc::ByteBuffer* const out_;  // gRPC's: response_ serialised
  v1::UploadTensorResponse response_;
  WorkerPool* const pool_;
  std::atomic<int64_t> last_activity_ns_{0};  // the last message's arrival
  UploadSession session_;                     // used by one thread at a time (the lock or the task)
  const std::string tenant_;
  const absl::Time start_;
  grpc::ByteBuffer received_bytes_;  // the outstanding read's
  v1::UploadTensorRequest request_;  // received_bytes_ parsed

  std::mutex mu_;
  std::deque<v1::UploadTensorRequest> queue_;  // guarded by mu_
  bool started_ = false;                       // the first message was taken
  bool read_outstanding_ = false;
  bool task_running_ = false;
  bool ended_ = false;
  bool finished_ = false;
  absl::Status error_;  // the first error; the call finishes with it

  int64_t received_ = 0;
  absl::Status status_;
};

// One ReadTensor stream: the pinned blob's range, a chunk at a time.
// Registered with the service while it lives, so that draining waits for
// it.
class ReadCall final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  ReadCall(TensorCheckServiceImpl* service, grpc::CallbackServerContext* context,
           TensorStore::Blob blob, int64_t begin, int64_t end, StoreCallRecord record)
      : service_(service),
        blob_(std::move(blob)),
        pos_(begin),
        end_(end),
        record_(std::move(record)) {
    service_->WatchStream(this, context, /*last_activity_ns=*/nullptr);
    Next();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      code_ = absl::StatusCode::kCancelled;
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the client went away"));
      return;
    }
    sent_ += static_cast<int64_t>(message_.data().size());
    Next();
  }

  void OnDone() override {
    record_.Done(code_, sent_);
    service_->UnwatchStream(this);
    delete this;
  }

 private:
  void Next() {
    if (pos_ >= end_) {
      Finish(grpc::Status::OK);
      return;
    }
    const int64_t n = std::min(kStoreChunkBytes, end_ - pos_);
    message_.set_offset(pos_);
    message_.set_data(blob_->data() + pos_, static_cast<size_t>(n));
    pos_ += n;
    // Serialized here, as the typed stream would (the one copy of the chunk).
    bytes_.Clear();
    if (absl::Status s = SerializeResponse(message_, &bytes_); !s.ok()) {
      code_ = s.code();
      Finish(ToGrpcStatus(s));
      return;
    }
    StartWrite(&bytes_);
  }

  TensorCheckServiceImpl* const service_;
  TensorStore::Blob blob_;  // pinned until the stream ends
  int64_t pos_, end_;
  v1::ReadTensorResponse message_;
  grpc::ByteBuffer bytes_;  // message_ serialized, being written
  const StoreCallRecord record_;
  absl::StatusCode code_ = absl::StatusCode::kOk;
  int64_t sent_ = 0;  // tensor bytes whose write completed
};

}  // namespace

grpc::ServerUnaryReactor* TensorCheckServiceImpl::FindMissingTensors(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request_bytes,
    grpc::ByteBuffer* out) {
  AttachRequestId(context);
  StoreCallRecord record{options_.metrics, "FindMissingTensors", absl::Now(),
                         static_cast<int64_t>(request_bytes->Length())};
  v1::FindMissingTensorsResponse response;
  absl::StatusOr<Caller> caller = Authenticate(*context, Right::kStore, record.method);
  if (!caller.ok()) return FinishUnary(context, caller.status(), record, response, out);
  record.tenant = caller->name();
  v1::FindMissingTensorsRequest request;
  if (absl::Status s = ParseRequest(*request_bytes, &request); !s.ok()) {
    return FinishUnary(context, s, record, response, out);
  }
  if (options_.store == nullptr) return FinishUnary(context, NoStore(), record, response, out);
  if (request.digests_size() > kMaxDigestsPerCall) {
    return FinishUnary(context,
                       absl::InvalidArgumentError(
                           absl::StrCat("digests: at most ", kMaxDigestsPerCall,
                                        " per call expected, got ", request.digests_size())),
                       record, response, out);
  }
  std::vector<Digest> digests;
  digests.reserve(static_cast<size_t>(request.digests_size()));
  for (int i = 0; i < request.digests_size(); ++i) {
    absl::StatusOr<Digest> d =
        DigestFromProto(request.digests(i), absl::StrCat("digests[", i, "]"));
    if (!d.ok()) return FinishUnary(context, d.status(), record, response, out);
    digests.push_back(*std::move(d));
  }
  for (const Digest& d : caller->store.FindMissing(digests)) {
    DigestToProto(d, response.add_missing_digests());
  }
  return FinishUnary(context, absl::OkStatus(), record, response, out);
}

grpc::ServerReadReactor<grpc::ByteBuffer>* TensorCheckServiceImpl::UploadTensor(
    grpc::CallbackServerContext* context, grpc::ByteBuffer* response) {
  std::string request_id = AttachRequestId(context);
  absl::StatusOr<Caller> caller = Authenticate(*context, Right::kStore, "UploadTensor");
  if (caller.ok() && options_.store == nullptr) caller = NoStore();
  if (caller.ok() && draining_) {
    caller = ShuttingDown();
    context->AddTrailingMetadata(kRetryPushbackKey, std::to_string(RetryPushbackMs(1)));
  }
  if (!caller.ok()) {
    StoreCallRecord{options_.metrics, "UploadTensor", absl::Now()}.Done(caller.status().code(), 0);
    // A reactor that refuses at once, reading nothing.
    class Refuse final : public grpc::ServerReadReactor<grpc::ByteBuffer> {
     public:
      explicit Refuse(const absl::Status& s) { Finish(ToGrpcStatus(s)); }
      void OnDone() override { delete this; }
    };
    return new Refuse(caller.status());
  }
  return new UploadCall(this, context, caller->store, &upload_pool_, response,
                        std::move(request_id), caller->name());
}

grpc::ServerUnaryReactor* TensorCheckServiceImpl::QueryUploadStatus(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request_bytes,
    grpc::ByteBuffer* out) {
  AttachRequestId(context);
  StoreCallRecord record{options_.metrics, "QueryUploadStatus", absl::Now(),
                         static_cast<int64_t>(request_bytes->Length())};
  v1::QueryUploadStatusResponse response;
  absl::StatusOr<Caller> caller = Authenticate(*context, Right::kStore, record.method);
  if (!caller.ok()) return FinishUnary(context, caller.status(), record, response, out);
  record.tenant = caller->name();
  v1::QueryUploadStatusRequest request;
  if (absl::Status s = ParseRequest(*request_bytes, &request); !s.ok()) {
    return FinishUnary(context, s, record, response, out);
  }
  if (options_.store == nullptr) return FinishUnary(context, NoStore(), record, response, out);
  absl::StatusOr<Digest> d = DigestFromProto(request.digest(), "digest");
  if (!d.ok()) return FinishUnary(context, d.status(), record, response, out);
  const TensorStore::UploadStatus s = caller->store.QueryUpload(*d, request.upload_id());
  response.set_committed_size(s.committed);
  response.set_complete(s.complete);
  return FinishUnary(context, absl::OkStatus(), record, response, out);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* TensorCheckServiceImpl::ReadTensor(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request_bytes) {
  class Refuse final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
   public:
    Refuse(const absl::Status& s, const StoreCallRecord& record) {
      record.Done(s.code(), 0);
      Finish(ToGrpcStatus(s));
    }
    void OnDone() override { delete this; }
  };
  AttachRequestId(context);
  StoreCallRecord record{options_.metrics, "ReadTensor", absl::Now(),
                         static_cast<int64_t>(request_bytes->Length())};
  absl::StatusOr<Caller> caller = Authenticate(*context, Right::kStore, record.method);
  if (!caller.ok()) return new Refuse(caller.status(), record);
  record.tenant = caller->name();
  v1::ReadTensorRequest request;
  if (absl::Status s = ParseRequest(*request_bytes, &request); !s.ok()) {
    return new Refuse(s, record);
  }
  if (options_.store == nullptr) return new Refuse(NoStore(), record);
  if (draining_) {
    context->AddTrailingMetadata(kRetryPushbackKey, std::to_string(RetryPushbackMs(1)));
    return new Refuse(ShuttingDown(), record);
  }
  absl::StatusOr<Digest> d = DigestFromProto(request.digest(), "digest");
  if (!d.ok()) return new Refuse(d.status(), record);
  if (request.limit() < 0) {
    return new Refuse(
        InvalidFieldError("limit", "0 (to the end) or more bytes", absl::StrCat(request.limit())),
        record);
  }
  const int64_t size = d->size;
  const int64_t begin = request.offset();
  const int64_t end = request.limit() == 0 ? size : begin + request.limit();
  if (begin < 0 || begin > size || request.limit() > size || end > size) {
    return new Refuse(
        absl::OutOfRangeError(absl::StrCat("offset ", begin, ", limit ", request.limit(),
                                           ": outside the ", size, " bytes of ", d->ToString())),
        record);
  }
  absl::StatusOr<TensorStore::Blob> blob = caller->store.Get(*d);
  if (!blob.ok()) return new Refuse(blob.status(), record);
  return new ReadCall(this, context, *std::move(blob), begin, end, record);
}

}  // namespace tensorcheck
