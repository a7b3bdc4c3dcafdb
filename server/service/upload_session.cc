#include "server/service/upload_session.h"

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "server/service/proto_convert.h"

namespace tensorcheck {

absl::Status UploadSession::Open(const v1::UploadTensorRequest& first) {
  opened_ = true;
  if (!first.has_digest()) {
    return absl::InvalidArgumentError(
        "digest: the first UploadTensor message must name the tensor's digest and size");
  }
  TC_ASSIGN_OR_RETURN(digest_, DigestFromProto(first.digest(), "digest"));
  if (first.upload_id().size() > kMaxUploadIdLength) {
    return absl::InvalidArgumentError(absl::StrCat("upload_id: at most ", kMaxUploadIdLength,
                                                   " characters expected, got ",
                                                   first.upload_id().size()));
  }
  upload_id_ = first.upload_id();
  bool present = false;
  absl::StatusOr<std::unique_ptr<TensorStore::Upload>> upload =
      store_.StartUpload(digest_, upload_id_, &present);
  if (!upload.ok()) {
    retryable_ = upload.status().code() == absl::StatusCode::kResourceExhausted &&
                 digest_.size <= store_.max_tensor_bytes();
    return upload.status();
  }
  if (present) {
    already_present_ = finished_ = true;
    return absl::OkStatus();
  }
  upload_ = std::move(upload).value();
  resumed_from_ = upload_->committed();
  return absl::OkStatus();
}

absl::Status UploadSession::Take(const v1::UploadTensorRequest& m) {
  if (finished_) return absl::OkStatus();
  if (!opened_) {
    TC_RETURN_IF_ERROR(Open(m));
    if (finished_) return absl::OkStatus();
  } else if (upload_ == nullptr) {
    return absl::FailedPreconditionError("UploadTensor: the stream already failed");
  } else if (m.has_digest() &&
             (m.digest().hash() != digest_.ToString() || m.digest().size_bytes() != digest_.size)) {
    return absl::InvalidArgumentError(absl::StrCat("digest: a later message names ",
                                                   m.digest().hash().substr(0, 80),
                                                   ", not the upload's ", digest_.ToString()));
  } else if (!m.upload_id().empty() && m.upload_id() != upload_id_) {
    return absl::InvalidArgumentError("upload_id: a later message names another upload");
  }
  const int64_t size = static_cast<int64_t>(m.data().size());
  if (size > kMaxUploadChunkBytes) {
    return absl::InvalidArgumentError(absl::StrCat("data: at most ", kMaxUploadChunkBytes,
                                                   " bytes per message expected, got ", size));
  }
  if (size == 0 && m.offset() == upload_->committed()) return absl::OkStatus();
  return upload_->Write(m.offset(), m.data());
}

absl::Status UploadSession::End(v1::UploadTensorResponse* response) {
  if (!opened_) {
    return absl::InvalidArgumentError(
        "UploadTensor: the stream ended before its first message (digest and size)");
  }
  if (!finished_) {
    if (upload_ == nullptr) {
      return absl::FailedPreconditionError("UploadTensor: the stream already failed");
    }
    TC_RETURN_IF_ERROR(upload_->Finish().status());
    store_.Adopt(digest_);
    finished_ = true;
  }
  DigestToProto(digest_, response->mutable_digest());
  response->set_committed_size(digest_.size);
  response->set_already_present(already_present_);
  return absl::OkStatus();
}

int64_t UploadSession::received() const {
  return upload_ != nullptr ? upload_->committed() - resumed_from_ : 0;
}

}  // namespace tensorcheck
