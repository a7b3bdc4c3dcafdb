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

// One UploadTensor stream: the first message opens (or resumes) an upload
// in the store, each chunk is written into it as it arrives, and the
// client's half-close finishes it. A stream that breaks leaves the upload
// to be resumed (the Upload's destructor keeps it).
class UploadCall final : public grpc::ServerReadReactor<v1::UploadTensorRequest> {
 public:
  UploadCall(grpc::CallbackServerContext* context, TensorStore* store, bool draining,
             v1::UploadTensorResponse* response)
      : context_(context),
        store_(store),
        draining_(draining),
        response_(response),
        start_(absl::Now()) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // half-closed by the client (or the call is gone)
      End();
      return;
    }
    const absl::Status status = Take();
    if (!status.ok() || finished_) {
      FinishWith(status);
      return;
    }
    StartRead(&request_);
  }

  void OnDone() override {
    Log();
    delete this;
  }

 private:
  // One message: the first opens the upload; every one may carry a chunk.
  absl::Status Take() {
    if (upload_ == nullptr) {
      TC_RETURN_IF_ERROR(Open());
      if (finished_) return absl::OkStatus();
    } else if (request_.has_digest() && (request_.digest().hash() != digest_.ToString() ||
                                         request_.digest().size_bytes() != digest_.size)) {
      return absl::InvalidArgumentError(absl::StrCat("digest: a later message names ",
                                                     request_.digest().hash().substr(0, 80),
                                                     ", not the upload's ", digest_.ToString()));
    } else if (!request_.upload_id().empty() && request_.upload_id() != upload_id_) {
      return absl::InvalidArgumentError("upload_id: a later message names another upload");
    }
    const int64_t size = static_cast<int64_t>(request_.data().size());
    if (size > kStoreChunkBytes) {
      return absl::InvalidArgumentError(absl::StrCat("data: at most ", kStoreChunkBytes,
                                                     " bytes per message expected, got ", size));
    }
    if (size == 0 && request_.offset() == upload_->committed()) return absl::OkStatus();
    return upload_->Write(request_.offset(), request_.data());
  }

  absl::Status Open() {
    if (!request_.has_digest()) {
      return absl::InvalidArgumentError(
          "digest: the first UploadTensor message must name the tensor's digest and size");
    }
    TC_ASSIGN_OR_RETURN(digest_, DigestFromProto(request_.digest(), "digest"));
    if (request_.upload_id().size() > kMaxUploadIdLength) {
      return absl::InvalidArgumentError(absl::StrCat("upload_id: at most ", kMaxUploadIdLength,
                                                     " characters expected, got ",
                                                     request_.upload_id().size()));
    }
    upload_id_ = request_.upload_id();
    if (draining_) {
      return absl::UnavailableError("server is shutting down; retry on another replica");
    }
    bool present = false;
    absl::StatusOr<std::unique_ptr<TensorStore::Upload>> upload =
        store_->StartUpload(digest_, upload_id_, &present);
    if (!upload.ok()) {
      // Full of tensors in use: a retry can pass once requests end; over
      // the per-tensor limit it cannot.
      if (upload.status().code() == absl::StatusCode::kResourceExhausted &&
          digest_.size <= store_->max_tensor_bytes()) {
        pushback_ms_ = kStoreFullPushbackMs;
      }
      return upload.status();
    }
    if (present) {
      DigestToProto(digest_, response_->mutable_digest());
      response_->set_committed_size(digest_.size);
      response_->set_already_present(true);
      finished_ = true;
      return absl::OkStatus();
    }
    upload_ = std::move(upload).value();
    resumed_from_ = upload_->committed();
    return absl::OkStatus();
  }

  void End() {
    if (finished_) return;
    if (upload_ == nullptr) {
      FinishWith(absl::InvalidArgumentError(
          "UploadTensor: the stream ended before its first message (digest and size)"));
      return;
    }
    absl::StatusOr<TensorStore::Blob> stored = upload_->Finish();
    if (stored.ok()) {
      DigestToProto(digest_, response_->mutable_digest());
      response_->set_committed_size(digest_.size);
    }
    FinishWith(stored.status());
  }

  void FinishWith(const absl::Status& status) {
    finished_ = true;
    status_ = status;
    if (pushback_ms_ > 0 && !status.ok()) {
      context_->AddTrailingMetadata(kRetryPushbackKey, std::to_string(pushback_ms_));
    }
    received_ = upload_ != nullptr ? upload_->committed() - resumed_from_ : 0;
    // The Upload is released now (kept for resuming unless finished), so
    // that a retry on a new stream finds it free at once.
    upload_.reset();
    Finish(ToGrpcStatus(status));
  }

  void Log() const {
    nlohmann::json fields = {
        {"method", "UploadTensor"},
        {"digest", digest_.hash.empty() ? std::string("?") : digest_.ToString()},
        {"size", digest_.size},
        {"upload_id", upload_id_},
        {"received_bytes", received_},
        {"elapsed_ms", std::round(absl::ToDoubleMilliseconds(absl::Now() - start_) * 100) / 100},
        {"already_present", response_->already_present()},
        {"status", absl::StatusCodeToString(status_.code())}};
    if (resumed_from_ > 0) fields["resumed_from"] = resumed_from_;
    if (!status_.ok()) fields["error"] = std::string(status_.message().substr(0, 300));
    LogEvent(status_.ok() ? spdlog::level::info : spdlog::level::warn, "upload", fields);
  }

  grpc::CallbackServerContext* const context_;
  TensorStore* const store_;
  const bool draining_;
  v1::UploadTensorResponse* const response_;
  const absl::Time start_;
  v1::UploadTensorRequest request_;
  Digest digest_;
  std::string upload_id_;
  std::unique_ptr<TensorStore::Upload> upload_;
  int64_t resumed_from_ = 0;
  int64_t received_ = 0;
  int64_t pushback_ms_ = 0;
  bool finished_ = false;
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
