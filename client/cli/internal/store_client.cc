// The store RPCs of the CLI (internal/store_client.h).
#include "client/cli/internal/store_client.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <random>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli/tensor_ref.h"

namespace tensorcheck::cli::internal {
namespace {

// Resumptions of one upload (after UNAVAILABLE or a RESOURCE_EXHAUSTED with
// a retry hint), and the waits between them: 0.25 s doubling, at most 4 s;
// a server's hint is capped at 10 s.
constexpr int kMaxUploadRetries = 5;
constexpr auto kFirstBackoff = std::chrono::milliseconds(250);
constexpr auto kMaxBackoff = std::chrono::milliseconds(4000);
constexpr auto kMaxPushback = std::chrono::milliseconds(10000);

// The server's retry hint on a RESOURCE_EXHAUSTED, if it sent one.
std::optional<std::chrono::milliseconds> Pushback(const grpc::ClientContext& ctx) {
  const auto& md = ctx.GetServerTrailingMetadata();
  auto it = md.find("grpc-retry-pushback-ms");
  if (it == md.end()) return std::nullopt;
  int64_t ms;
  if (!absl::SimpleAtoi(absl::string_view(it->second.data(), it->second.size()), &ms) || ms < 0) {
    return std::nullopt;
  }
  return std::min(std::chrono::milliseconds(ms), kMaxPushback);
}

std::chrono::milliseconds Backoff(int retry) {
  auto wait = kFirstBackoff * (1 << std::min(retry, 8));
  return std::min<std::chrono::milliseconds>(wait, kMaxBackoff);
}

}  // namespace

absl::Status FromGrpc(const grpc::Status& s, absl::string_view rpc) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(rpc, ": ", s.error_message()));
}

std::string NewUploadId() {
  std::random_device rd;
  std::mt19937_64 gen((static_cast<uint64_t>(rd()) << 32) ^ rd());
  return absl::StrFormat("%016x%016x", gen(), gen());
}

absl::StatusOr<std::vector<pb::TensorDigest>> StoreClient::FindMissing(
    const std::vector<pb::TensorDigest>& digests) {
  pb::FindMissingTensorsRequest req;
  for (const pb::TensorDigest& d : digests) *req.add_digests() = d;
  pb::FindMissingTensorsResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  const grpc::Status s = stub_->FindMissingTensors(&ctx, req, &resp);
  if (!s.ok()) return FromGrpc(s, "FindMissingTensors");
  return std::vector<pb::TensorDigest>(resp.missing_digests().begin(),
                                       resp.missing_digests().end());
}

absl::StatusOr<bool> StoreClient::Upload(const pb::TensorDigest& digest, absl::string_view bytes,
                                         Progress* progress) {
  const std::string upload_id = NewUploadId();
  const int64_t size = static_cast<int64_t>(bytes.size());
  int64_t offset = 0;   // where this attempt starts: what the server holds
  int64_t counted = 0;  // bytes added to `progress` so far
  int retries = 0;
  for (;;) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    pb::UploadTensorResponse resp;
    std::unique_ptr<grpc::ClientWriter<pb::UploadTensorRequest>> writer =
        stub_->UploadTensor(&ctx, &resp);
    bool open = true;
    bool first = true;
    for (int64_t pos = offset; first || pos < size; first = false) {
      pb::UploadTensorRequest m;
      if (first) {
        *m.mutable_digest() = digest;
        m.set_upload_id(upload_id);
      }
      const int64_t n = std::min(kUploadChunkBytes, size - pos);
      m.set_offset(pos);
      m.set_data(bytes.data() + pos, static_cast<size_t>(n));
      // A failed write: the server ended the call (already present, or an
      // error that Finish reports).
      if (!writer->Write(m)) {
        open = false;
        break;
      }
      pos += n;
      if (progress != nullptr) progress->Advance(pos - counted);
      counted = pos;
    }
    if (open) writer->WritesDone();
    const grpc::Status s = writer->Finish();
    if (s.ok()) {
      if (resp.already_present()) return true;
      if (resp.committed_size() != size) {
        return absl::InternalError(absl::StrCat("UploadTensor: the server committed ",
                                                resp.committed_size(), " of ", size, " bytes"));
      }
      return false;
    }
    // Resumable: a broken connection, or no room yet with a hint of when.
    std::optional<std::chrono::milliseconds> wait;
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE) wait = Backoff(retries);
    if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) wait = Pushback(ctx);
    if (!wait.has_value() || retries >= kMaxUploadRetries ||
        std::chrono::system_clock::now() + *wait >= deadline_) {
      return FromGrpc(s, "UploadTensor");
    }
    // Ask how much arrived; the query itself may meet the same outage.
    for (;;) {
      ++retries;
      std::this_thread::sleep_for(*wait);
      pb::QueryUploadStatusRequest q;
      *q.mutable_digest() = digest;
      q.set_upload_id(upload_id);
      pb::QueryUploadStatusResponse qr;
      grpc::ClientContext qctx;
      SetDeadline(&qctx);
      const grpc::Status qs = stub_->QueryUploadStatus(&qctx, q, &qr);
      if (qs.ok()) {
        if (qr.complete()) {
          if (progress != nullptr) progress->Advance(size - counted);
          return false;
        }
        offset = std::clamp<int64_t>(qr.committed_size(), 0, size);
        break;
      }
      if (qs.error_code() != grpc::StatusCode::UNAVAILABLE || retries >= kMaxUploadRetries) {
        return FromGrpc(qs, "QueryUploadStatus");
      }
      wait = Backoff(retries);
    }
    if (progress != nullptr) progress->Advance(offset - counted);
    counted = offset;
  }
}

absl::StatusOr<std::string> StoreClient::Read(const pb::TensorDigest& digest, Progress* progress) {
  pb::ReadTensorRequest req;
  *req.mutable_digest() = digest;
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  std::unique_ptr<grpc::ClientReader<pb::ReadTensorResponse>> reader = stub_->ReadTensor(&ctx, req);
  std::string out;
  out.reserve(static_cast<size_t>(std::max<int64_t>(digest.size_bytes(), 0)));
  pb::ReadTensorResponse m;
  absl::Status bad;
  while (reader->Read(&m)) {
    if (m.offset() != static_cast<int64_t>(out.size()) ||
        static_cast<int64_t>(out.size() + m.data().size()) > digest.size_bytes()) {
      bad = absl::DataLossError(absl::StrCat("ReadTensor: a chunk at offset ", m.offset(), " of ",
                                             m.data().size(), " bytes after ", out.size(), " of ",
                                             digest.size_bytes()));
      ctx.TryCancel();
      break;
    }
    out.append(m.data());
    if (progress != nullptr) progress->Advance(static_cast<int64_t>(m.data().size()));
  }
  const grpc::Status s = reader->Finish();
  if (!bad.ok()) return bad;
  if (!s.ok()) return FromGrpc(s, "ReadTensor");
  if (static_cast<int64_t>(out.size()) != digest.size_bytes()) {
    return absl::DataLossError(
        absl::StrCat("ReadTensor: ", out.size(), " bytes of ", digest.size_bytes(), " arrived"));
  }
  const std::string hash = absl::StrCat(kDigestPrefix, DigestOf(out).hash);
  if (hash != digest.hash()) {
    return absl::DataLossError(
        absl::StrCat("ReadTensor: the bytes hash to ", hash, ", not ", digest.hash()));
  }
  return out;
}

}  // namespace tensorcheck::cli::internal
