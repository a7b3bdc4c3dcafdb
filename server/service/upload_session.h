// UploadSession: the messages of one UploadTensor stream applied to the
// store (docs/api.md, "UploadTensor"), without gRPC, so that the stream's
// rules are tested and fuzzed directly; the reactor in store_calls.cc only
// moves messages in and the status out.
//
//   UploadSession session(StoreView{&tenants, ns});
//   for (const auto& m : messages) {
//     TC_RETURN_IF_ERROR(session.Take(m));
//     if (session.finished()) break;          // the store already held it
//   }
//   v1::UploadTensorResponse response;
//   TC_RETURN_IF_ERROR(session.End(&response));  // the client half-closed
//
// Destroyed unfinished (the stream broke), the upload stays in the store
// for resuming.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "server/store/tenant_store.h"
#include "server/store/tensor_store.h"
#include "tensorcheck/v1/tensorcheck.pb.h"

namespace tensorcheck {

// The chunk size the server advertises (StoreInfo.chunk_bytes) and sends
// in ReadTensor: 4 MiB less 1 KiB, so that a chunk with its message
// framing stays within gRPC's default 4 MiB message limit, and so within
// the defaults of proxies, load balancers and clients.
inline constexpr int64_t kStoreChunkBytes = (int64_t{4} << 20) - 1024;
// The largest chunk an upload message may carry (the contract's 4 MiB).
inline constexpr int64_t kMaxUploadChunkBytes = int64_t{4} << 20;
// The longest upload_id a client may choose.
inline constexpr size_t kMaxUploadIdLength = 128;

class UploadSession {
 public:
  // Uploads into `store`'s namespace, which holds the tensor once stored.
  explicit UploadSession(StoreView store) : store_(std::move(store)) {}

  // One message: the first opens (or resumes) the upload; every one may
  // carry a chunk. An error ends the stream.
  absl::Status Take(const v1::UploadTensorRequest& message);
  // The store held the tensor already: the answer is ready, read no more.
  bool finished() const { return finished_; }
  // The client half-closed: stores the tensor when every byte arrived and
  // the hash matches. Fills `response` on success (also when finished()).
  absl::Status End(v1::UploadTensorResponse* response);

  // Lets go of the store's upload now (kept for resuming unless it was
  // stored), so that a client retrying at once finds it free.
  void Release() { upload_.reset(); }

  // Whether a RESOURCE_EXHAUSTED from Take can pass on retry (the store
  // was full of tensors in use, not a tensor over the limit).
  bool retryable() const { return retryable_; }
  const Digest& digest() const { return digest_; }
  const std::string& upload_id() const { return upload_id_; }
  // Bytes this stream added, and where it resumed.
  int64_t received() const;
  int64_t resumed_from() const { return resumed_from_; }
  bool already_present() const { return already_present_; }

 private:
  absl::Status Open(const v1::UploadTensorRequest& first);

  const StoreView store_;
  Digest digest_;
  std::string upload_id_;
  std::unique_ptr<TensorStore::Upload> upload_;
  int64_t resumed_from_ = 0;
  bool opened_ = false;
  bool finished_ = false;
  bool already_present_ = false;
  bool retryable_ = false;
};

}  // namespace tensorcheck
