// Sending a request's large tensors by digest (docs/api.md, "How the
// clients use it"), and the blobs of `tensorcheck upload`. Internal to
// client/cli.
//
//   std::vector<HeldTensor> held;
//   TC_ASSIGN_OR_RETURN(pb::VerifyRequest request, BuildRequest(cl, &held));
//   TensorTransfer transfer(&store, executor.get(), &progress);
//   TC_ASSIGN_OR_RETURN(bool by_digest, transfer.Prepare(&request, std::move(held)));
//   grpc::Status s = stub->Verify(&ctx, request, &response);
//   if (auto missing = MissingTensorsOf(s)) {       // evicted meanwhile
//     TC_RETURN_IF_ERROR(transfer.Reupload(*missing));
//     s = stub->Verify(&ctx2, request, &response);   // once
//   }
//
// Prepare hashes every tensor BuildRequest held back (those above
// kInlineMaxBytes; several at once on the executor), asks
// FindMissingTensors once for those and for the tensors given as `sha256:`
// arguments, uploads only the missing ones (several at once), and then names
// them by digest in the request. Against a server without a store it puts
// them inline instead.
//
// Thread safety: one thread uses a TensorTransfer; it fans out on the
// executor it is given.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/cli/internal/progress.h"
#include "client/cli/internal/store_client.h"
#include "client/cli/internal/verify_request.h"
#include "core/executor.h"
#include "core/tensor.h"
#include "tensorcheck/v1/tensorcheck.pb.h"

namespace tensorcheck::cli::internal {

// One tensor to name by digest.
struct Blob {
  // Where it came from, for messages: "--weight", or an upload argument.
  std::string label;
  // The request field ("op.weight"), as MissingTensors names it.
  std::string field;
  pb::TensorDigest digest;
  // The tensor (for its bytes); none for a `sha256:` argument.
  std::optional<Tensor> data;
  // Where it sits in the request (null for `upload`).
  pb::Tensor* tensor = nullptr;

  bool local() const { return data.has_value(); }
  absl::string_view bytes() const { return data ? data->bytes() : absl::string_view(); }
};

// Bytes this command uploaded, and bytes it named by digest that the store
// already held (the JSON report's uploaded_bytes and reused_bytes).
struct TransferCounts {
  int64_t uploaded_bytes = 0;
  int64_t reused_bytes = 0;
};

// Sets each local blob's digest (SHA-256 and size of its bytes).
void HashBlobs(std::vector<Blob>& blobs, Executor* executor, Progress* progress);

// Uploads `blobs` (local ones) several at once, counting into `counts`;
// the first error, naming the blob, if any failed.
absl::Status UploadBlobs(const std::vector<Blob*>& blobs, StoreClient* store, Executor* executor,
                         Progress* progress, TransferCounts* counts);

// The MissingTensors detail of a FAILED_PRECONDITION, if it carries one.
std::optional<pb::MissingTensors> MissingTensorsOf(const grpc::Status& s);

class TensorTransfer {
 public:
  TensorTransfer(StoreClient* store, Executor* executor, Progress* progress)
      : store_(store), executor_(executor), progress_(progress) {}

  // Sends the held tensors by digest (see above); false when the request
  // goes inline: nothing large, or a server without a store.
  // FAILED_PRECONDITION when the server lacks a `sha256:` argument's tensor
  // or has no store at all for one. `req` must outlive the TensorTransfer.
  absl::StatusOr<bool> Prepare(pb::VerifyRequest* req, std::vector<HeldTensor> held);
  // The same for compare's request (its outputs held as "observed[i]").
  absl::StatusOr<bool> Prepare(pb::CompareRequest* req, std::vector<HeldTensor> held);

  // Uploads again the tensors `missing` names (evicted since Prepare);
  // FAILED_PRECONDITION when one of them is a `sha256:` argument's.
  absl::Status Reupload(const pb::MissingTensors& missing);

  // Copies the held bytes of `field` (empty: of every field) into the
  // request, in place of their digests (for --html, which reads the
  // observed tensor from the request).
  void PutInline(absl::string_view field = "");

  const TransferCounts& counts() const { return counts_; }

  // A tensor field of a request: its name, the flag that gave it, where it
  // sits.
  struct Field;

 private:
  absl::StatusOr<bool> PrepareFields(std::vector<Field> fields, std::vector<HeldTensor> held);

  StoreClient* store_;
  Executor* executor_;
  Progress* progress_;
  std::vector<Blob> blobs_;
  TransferCounts counts_;
};

// Replaces every returned output that came back by digest with its bytes,
// read with ReadTensor.
absl::Status ReadOutputsByDigest(pb::VerifyResponse* resp, StoreClient* store, Progress* progress);

}  // namespace tensorcheck::cli::internal
