// The tensor store's RPCs: FindMissingTensors, UploadTensor,
// QueryUploadStatus, ReadTensor (docs/api.md has the contract). The store
// itself (server/store) knows nothing of gRPC; this file maps messages and
// streams onto it.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "server/core/status_macros.h"
#include "server/service/logging.h"
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

absl::StatusOr<Digest> DigestFromProto(const v1::TensorDigest& d, absl::string_view field) {
  return ParseDigest(d.hash(), d.size_bytes(), field);
}

void DigestToProto(const Digest& d, v1::TensorDigest* p) {
  p->set_hash(d.ToString());
  p->set_size_bytes(d.size);
}

grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* context,
                                      const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

// One UploadTensor stream: messages go to an UploadSession as they
// arrive (upload_session.h has the rules); the client's half-close ends it.
// A stream that breaks leaves the upload to be resumed.
class UploadCall final : public grpc::ServerReadReactor<v1::UploadTensorRequest> {
 public:
  UploadCall(grpc::CallbackServerContext* context, TensorStore* store, bool draining,
             v1::UploadTensorResponse* response)
      : context_(context), response_(response), session_(store, draining), start_(absl::Now()) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // half-closed by the client (or the call is gone)
      FinishWith(session_.End(response_));
      return;
    }
    const absl::Status status = session_.Take(request_);
    if (!status.ok()) {
      FinishWith(status);
    } else if (session_.finished()) {
      FinishWith(session_.End(response_));  // already present: read no more
    } else {
      StartRead(&request_);
    }
  }

  void OnDone() override {
    Log();
    delete this;
  }

 private:
  void FinishWith(const absl::Status& status) {
    status_ = status;
    received_ = session_.received();
    session_.Release();
    if (!status.ok() && session_.retryable()) {
      context_->AddTrailingMetadata(kRetryPushbackKey, std::to_string(kStoreFullPushbackMs));
    }
    Finish(ToGrpcStatus(status));
  }

  void Log() const {
    const Digest& d = session_.digest();
    nlohmann::json fields = {
        {"method", "UploadTensor"},
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

  grpc::CallbackServerContext* const context_;
  v1::UploadTensorResponse* const response_;
  UploadSession session_;
  const absl::Time start_;
  v1::UploadTensorRequest request_;
  int64_t received_ = 0;
  absl::Status status_;
};

// One ReadTensor stream: the pinned blob's range, a chunk at a time.
class ReadCall final : public grpc::ServerWriteReactor<v1::ReadTensorResponse> {
 public:
  ReadCall(TensorStore::Blob blob, int64_t begin, int64_t end)
      : blob_(std::move(blob)), pos_(begin), end_(end) {
    Next();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the client went away"));
      return;
    }
    Next();
  }

  void OnDone() override { delete this; }

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
    StartWrite(&message_);
  }

  TensorStore::Blob blob_;  // pinned until the stream ends
  int64_t pos_, end_;
  v1::ReadTensorResponse message_;
};

}  // namespace

grpc::ServerUnaryReactor* TensorCheckServiceImpl::FindMissingTensors(
    grpc::CallbackServerContext* context, const v1::FindMissingTensorsRequest* request,
    v1::FindMissingTensorsResponse* response) {
  if (options_.store == nullptr) return FinishUnary(context, NoStore());
  if (request->digests_size() > kMaxDigestsPerCall) {
    return FinishUnary(context, absl::InvalidArgumentError(absl::StrCat(
                                    "digests: at most ", kMaxDigestsPerCall,
                                    " per call expected, got ", request->digests_size())));
  }
  std::vector<Digest> digests;
  digests.reserve(static_cast<size_t>(request->digests_size()));
  for (int i = 0; i < request->digests_size(); ++i) {
    absl::StatusOr<Digest> d =
        DigestFromProto(request->digests(i), absl::StrCat("digests[", i, "]"));
    if (!d.ok()) return FinishUnary(context, d.status());
    digests.push_back(*std::move(d));
  }
  for (const Digest& d : options_.store->FindMissing(digests)) {
    DigestToProto(d, response->add_missing_digests());
  }
  return FinishUnary(context, absl::OkStatus());
}

grpc::ServerReadReactor<v1::UploadTensorRequest>* TensorCheckServiceImpl::UploadTensor(
    grpc::CallbackServerContext* context, v1::UploadTensorResponse* response) {
  if (options_.store == nullptr) {
    // A reactor that refuses at once, reading nothing.
    class Refuse final : public grpc::ServerReadReactor<v1::UploadTensorRequest> {
     public:
      Refuse() { Finish(ToGrpcStatus(NoStore())); }
      void OnDone() override { delete this; }
    };
    return new Refuse();
  }
  return new UploadCall(context, options_.store, draining_.load(), response);
}

grpc::ServerUnaryReactor* TensorCheckServiceImpl::QueryUploadStatus(
    grpc::CallbackServerContext* context, const v1::QueryUploadStatusRequest* request,
    v1::QueryUploadStatusResponse* response) {
  if (options_.store == nullptr) return FinishUnary(context, NoStore());
  absl::StatusOr<Digest> d = DigestFromProto(request->digest(), "digest");
  if (!d.ok()) return FinishUnary(context, d.status());
  const TensorStore::UploadStatus s = options_.store->QueryUpload(*d, request->upload_id());
  response->set_committed_size(s.committed);
  response->set_complete(s.complete);
  return FinishUnary(context, absl::OkStatus());
}

grpc::ServerWriteReactor<v1::ReadTensorResponse>* TensorCheckServiceImpl::ReadTensor(
    grpc::CallbackServerContext* context, const v1::ReadTensorRequest* request) {
  class Refuse final : public grpc::ServerWriteReactor<v1::ReadTensorResponse> {
   public:
    explicit Refuse(const absl::Status& s) { Finish(ToGrpcStatus(s)); }
    void OnDone() override { delete this; }
  };
  (void)context;
  if (options_.store == nullptr) return new Refuse(NoStore());
  absl::StatusOr<Digest> d = DigestFromProto(request->digest(), "digest");
  if (!d.ok()) return new Refuse(d.status());
  if (request->limit() < 0) {
    return new Refuse(
        InvalidFieldError("limit", "0 (to the end) or more bytes", absl::StrCat(request->limit())));
  }
  const int64_t size = d->size;
  const int64_t begin = request->offset();
  const int64_t end = request->limit() == 0 ? size : begin + request->limit();
  if (begin < 0 || begin > size || request->limit() > size || end > size) {
    return new Refuse(
        absl::OutOfRangeError(absl::StrCat("offset ", begin, ", limit ", request->limit(),
                                           ": outside the ", size, " bytes of ", d->ToString())));
  }
  absl::StatusOr<TensorStore::Blob> blob = options_.store->Get(*d);
  if (!blob.ok()) return new Refuse(blob.status());
  return new ReadCall(*std::move(blob), begin, end);
}

}  // namespace tensorcheck
