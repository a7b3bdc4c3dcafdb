// The store RPCs as the CLI uses them (docs/api.md, "The store RPCs"):
// FindMissingTensors, UploadTensor in chunks with resumption, ReadTensor.
// Internal to client/cli.
//
//   StoreClient store(stub.get(), deadline);
//   TC_ASSIGN_OR_RETURN(std::vector<pb::TensorDigest> missing, store.FindMissing(digests));
//   TC_ASSIGN_OR_RETURN(bool was_there, store.Upload(digest, bytes, &progress));
//   TC_ASSIGN_OR_RETURN(std::string bytes, store.Read(digest, &progress));
//
// An upload sends chunks of kUploadChunkBytes (just under 4 MiB) under a random
// upload_id; a server that already holds the tensor ends it early
// (already_present). After UNAVAILABLE it asks QueryUploadStatus how much
// arrived and continues from there (a few times, backing off); after a
// RESOURCE_EXHAUSTED carrying a retry hint (grpc-retry-pushback-ms) it
// waits that long and continues the same way.
//
// Errors are the RPC's status as an absl::Status (the codes are the same),
// its message prefixed with the RPC; UNIMPLEMENTED from FindMissing means
// the server has no store. Every call ends by the deadline given.
//
// Thread safety: Upload and Read may run concurrently on one StoreClient
// (the stub is thread-safe).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/cli/internal/progress.h"
#include "grpcpp/grpcpp.h"
#include "tensorcheck/v1/tensorcheck.grpc.pb.h"
#include "tensorcheck/v1/tensorcheck.pb.h"

namespace tensorcheck::cli::internal {

namespace pb = ::tensorcheck::v1;

// The bytes of data one UploadTensor message carries: under
// StoreInfo.chunk_bytes (4 MiB) by enough that the whole message, its
// digest and upload_id included, stays within gRPC's default 4 MiB message
// limit, which proxies and servers with default settings enforce.
inline constexpr int64_t kUploadChunkBytes = (int64_t{4} << 20) - (int64_t{4} << 10);

// A gRPC status as an absl::Status whose message starts with `rpc`.
absl::Status FromGrpc(const grpc::Status& s, absl::string_view rpc);

// A fresh upload_id: 32 random hex digits (a UUID's worth of randomness).
std::string NewUploadId();

class StoreClient {
 public:
  StoreClient(pb::TensorCheck::Stub* stub, std::chrono::system_clock::time_point deadline)
      : stub_(stub), deadline_(deadline) {}

  // The digests the store lacks, in request order.
  absl::StatusOr<std::vector<pb::TensorDigest>> FindMissing(
      const std::vector<pb::TensorDigest>& digests);

  // Uploads `bytes` (whose SHA-256 and size `digest` names); true when the
  // store already held it. Each chunk sent is added to `progress`.
  absl::StatusOr<bool> Upload(const pb::TensorDigest& digest, absl::string_view bytes,
                              Progress* progress);

  // The stored bytes of `digest`, checked against its size and hash.
  absl::StatusOr<std::string> Read(const pb::TensorDigest& digest, Progress* progress);

 private:
  void SetDeadline(grpc::ClientContext* ctx) const { ctx->set_deadline(deadline_); }

  pb::TensorCheck::Stub* stub_;
  std::chrono::system_clock::time_point deadline_;
};

}  // namespace tensorcheck::cli::internal
