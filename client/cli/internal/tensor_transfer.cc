// Large tensors by digest (internal/tensor_transfer.h).
#include "client/cli/internal/tensor_transfer.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/cli/tensor_ref.h"
#include "core/dtype.h"
#include "core/status_macros.h"
#include "google/rpc/status.pb.h"
#include "proto/dtype_proto.h"

namespace tensorcheck::cli::internal {
namespace {

// Hashing proceeds in pieces this large, so that the progress line moves.
constexpr size_t kHashPiece = size_t{64} << 20;

// "sha256:<hex>" whether or not Tensor.digest carried the prefix.
std::string Prefixed(const std::string& digest) {
  return absl::StartsWith(digest, kDigestPrefix) ? digest : absl::StrCat(kDigestPrefix, digest);
}

// numel(shape) * itemsize(dtype) of a tensor sent by digest (-1 when the
// dtype is unknown: the server then rejects the request itself).
int64_t SizeOf(const pb::Tensor& t) {
  const std::optional<DType> d = DTypeFromProto(t.dtype());
  if (!d.has_value()) return -1;
  int64_t n = static_cast<int64_t>(ItemSize(*d));
  for (int64_t s : t.shape()) n *= s;
  return n;
}

}  // namespace

struct TensorTransfer::Field {
  std::string field;
  std::string flag;
  pb::Tensor* tensor;
};

namespace {

void OpFields(pb::LinearOp* op, std::vector<TensorTransfer::Field>& f) {
  if (op->has_input()) f.push_back({"op.input", "--input", op->mutable_input()});
  if (op->has_weight()) f.push_back({"op.weight", "--weight", op->mutable_weight()});
  if (op->has_bias()) f.push_back({"op.bias", "--bias", op->mutable_bias()});
  if (op->has_input_scale()) {
    f.push_back({"op.input_scale", "--input-scale", op->mutable_input_scale()});
  }
  if (op->has_weight_scale()) {
    f.push_back({"op.weight_scale", "--weight-scale", op->mutable_weight_scale()});
  }
}

}  // namespace

void HashBlobs(std::vector<Blob>& blobs, Executor* executor, Progress* progress) {
  int64_t total = 0;
  for (const Blob& b : blobs) total += static_cast<int64_t>(b.bytes().size());
  progress->Begin("hashing", total);
  ParallelFor(executor, static_cast<int64_t>(blobs.size()), [&](int64_t i) {
    Blob& b = blobs[static_cast<size_t>(i)];
    if (!b.local()) return;
    const absl::string_view bytes = b.bytes();
    Sha256 h;
    for (size_t pos = 0; pos < bytes.size(); pos += kHashPiece) {
      const size_t n = std::min(kHashPiece, bytes.size() - pos);
      h.Update(bytes.substr(pos, n));
      progress->Advance(static_cast<int64_t>(n));
    }
    b.digest.set_hash(absl::StrCat(kDigestPrefix, h.HexDigest()));
    b.digest.set_size_bytes(static_cast<int64_t>(bytes.size()));
  });
  progress->End();
}

absl::Status UploadBlobs(const std::vector<Blob*>& blobs, StoreClient* store, Executor* executor,
                         Progress* progress, TransferCounts* counts) {
  int64_t total = 0;
  for (const Blob* b : blobs) total += b->digest.size_bytes();
  progress->Begin(
      absl::StrCat("uploading ", blobs.size(), blobs.size() == 1 ? " tensor" : " tensors"), total);
  std::vector<absl::StatusOr<bool>> results(blobs.size(), false);
  ParallelFor(executor, static_cast<int64_t>(blobs.size()), [&](int64_t i) {
    const Blob* b = blobs[static_cast<size_t>(i)];
    results[static_cast<size_t>(i)] = store->Upload(b->digest, b->bytes(), progress);
  });
  progress->End();
  absl::Status first;
  for (size_t i = 0; i < blobs.size(); ++i) {
    if (!results[i].ok()) {
      if (first.ok()) {
        first = absl::Status(results[i].status().code(),
                             absl::StrCat(blobs[i]->label, ": ", results[i].status().message()));
      }
      continue;
    }
    (*results[i] ? counts->reused_bytes : counts->uploaded_bytes) += blobs[i]->digest.size_bytes();
  }
  return first;
}

std::optional<pb::MissingTensors> MissingTensorsOf(const grpc::Status& s) {
  if (s.error_code() != grpc::StatusCode::FAILED_PRECONDITION || s.error_details().empty()) {
    return std::nullopt;
  }
  google::rpc::Status detail;
  if (!detail.ParseFromString(s.error_details())) return std::nullopt;
  for (const google::protobuf::Any& any : detail.details()) {
    pb::MissingTensors m;
    if (any.Is<pb::MissingTensors>() && any.UnpackTo(&m)) return m;
  }
  return std::nullopt;
}

absl::StatusOr<bool> TensorTransfer::Prepare(pb::VerifyRequest* req, std::vector<HeldTensor> held) {
  std::vector<Field> fields;
  OpFields(req->mutable_op(), fields);
  if (req->has_observed()) fields.push_back({"observed", "--observed", req->mutable_observed()});
  return PrepareFields(std::move(fields), std::move(held));
}

absl::StatusOr<bool> TensorTransfer::Prepare(pb::CompareRequest* req,
                                             std::vector<HeldTensor> held) {
  std::vector<Field> fields;
  OpFields(req->mutable_op(), fields);
  for (int i = 0; i < req->observed_size(); ++i) {
    pb::NamedTensor* t = req->mutable_observed(i);
    fields.push_back({absl::StrCat("observed[", i, "]"), absl::StrCat("--observed ", t->name()),
                      t->mutable_tensor()});
  }
  return PrepareFields(std::move(fields), std::move(held));
}

absl::StatusOr<bool> TensorTransfer::PrepareFields(std::vector<Field> fields,
                                                   std::vector<HeldTensor> held) {
  blobs_.clear();
  for (const Field& f : fields) {
    Blob b;
    b.label = f.flag;
    b.field = f.field;
    b.tensor = f.tensor;
    auto h = std::find_if(held.begin(), held.end(),
                          [&](const HeldTensor& t) { return t.field == f.field; });
    if (f.tensor->source_case() == pb::Tensor::kDigest) {
      b.digest.set_hash(Prefixed(f.tensor->digest()));
      b.digest.set_size_bytes(SizeOf(*f.tensor));
    } else if (h != held.end()) {
      b.data = std::move(h->tensor);
    } else {
      continue;
    }
    blobs_.push_back(std::move(b));
  }
  if (blobs_.empty()) return false;
  HashBlobs(blobs_, executor_, progress_);

  std::vector<pb::TensorDigest> digests;
  for (const Blob& b : blobs_) digests.push_back(b.digest);
  auto missing = store_->FindMissing(digests);
  if (absl::IsUnimplemented(missing.status())) {
    for (const Blob& b : blobs_) {
      if (!b.local()) {
        return absl::FailedPreconditionError(
            absl::StrCat(b.label, ": a sha256: argument needs a server with a tensor store, and ",
                         "this one has none (FindMissingTensors is not implemented there)"));
      }
    }
    PutInline();  // no store: everything inline, as before the store existed
    blobs_.clear();
    return false;
  }
  if (!missing.ok()) return missing.status();
  std::set<std::string> absent;
  for (const pb::TensorDigest& d : *missing) absent.insert(d.hash());

  std::vector<Blob*> upload;
  std::set<std::string> seen;
  for (Blob& b : blobs_) {
    if (!seen.insert(b.digest.hash()).second) continue;  // the same tensor twice
    if (absent.count(b.digest.hash()) == 0) {
      counts_.reused_bytes += b.digest.size_bytes();
    } else if (!b.local()) {
      return absl::FailedPreconditionError(absl::StrCat(
          b.label, ": the server's store does not hold ", b.digest.hash(), " (",
          b.digest.size_bytes(), " bytes); upload it first with `tensorcheck upload FILE`"));
    } else {
      upload.push_back(&b);
    }
  }
  if (!upload.empty()) {
    TC_RETURN_IF_ERROR(UploadBlobs(upload, store_, executor_, progress_, &counts_));
  }
  for (Blob& b : blobs_) {
    if (b.local()) b.tensor->set_digest(b.digest.hash());
  }
  return true;
}

absl::Status TensorTransfer::Reupload(const pb::MissingTensors& missing) {
  std::vector<Blob*> upload;
  std::set<std::string> seen;
  for (int i = 0; i < missing.digests_size(); ++i) {
    const std::string& hash = missing.digests(i).hash();
    if (!seen.insert(hash).second) continue;
    Blob* found = nullptr;
    for (Blob& b : blobs_) {
      if (b.local() && b.digest.hash() == Prefixed(hash)) found = &b;
    }
    if (found == nullptr) {
      const std::string field = i < missing.fields_size() ? missing.fields(i) : "a tensor";
      return absl::FailedPreconditionError(
          absl::StrCat(field, ": the server's store does not hold ", hash,
                       "; upload it first with `tensorcheck upload FILE`"));
    }
    upload.push_back(found);
  }
  // What the first round counted as reused was evicted since: it is
  // uploaded now, and counted as such.
  for (const Blob* b : upload) {
    counts_.reused_bytes = std::max<int64_t>(0, counts_.reused_bytes - b->digest.size_bytes());
  }
  TransferCounts again;
  const absl::Status s = UploadBlobs(upload, store_, executor_, progress_, &again);
  counts_.uploaded_bytes += again.uploaded_bytes;
  counts_.reused_bytes += again.reused_bytes;
  return s;
}

void TensorTransfer::PutInline(absl::string_view field) {
  for (Blob& b : blobs_) {
    if (b.local() && b.tensor != nullptr && (field.empty() || b.field == field)) {
      b.tensor->set_data(b.bytes().data(), b.bytes().size());
    }
  }
}

absl::Status ReadOutputsByDigest(pb::VerifyResponse* resp, StoreClient* store, Progress* progress) {
  std::vector<pb::ConfigResult*> by_digest;
  if (resp->has_reference()) by_digest.push_back(resp->mutable_reference());
  for (pb::ConfigResult& c : *resp->mutable_results()) by_digest.push_back(&c);
  by_digest.erase(std::remove_if(by_digest.begin(), by_digest.end(),
                                 [](const pb::ConfigResult* c) {
                                   return c->output().source_case() != pb::Tensor::kDigest;
                                 }),
                  by_digest.end());
  if (by_digest.empty()) return absl::OkStatus();
  int64_t total = 0;
  for (const pb::ConfigResult* c : by_digest) total += std::max<int64_t>(0, SizeOf(c->output()));
  progress->Begin("reading outputs", total);
  absl::Status first;
  for (pb::ConfigResult* c : by_digest) {
    pb::TensorDigest d;
    d.set_hash(Prefixed(c->output().digest()));
    d.set_size_bytes(SizeOf(c->output()));
    auto bytes = store->Read(d, progress);
    if (!bytes.ok()) {
      if (first.ok()) {
        first = absl::Status(bytes.status().code(), absl::StrCat("output of ", c->config(), ": ",
                                                                 bytes.status().message()));
      }
      continue;
    }
    c->mutable_output()->set_data(*std::move(bytes));
  }
  progress->End();
  return first;
}

}  // namespace tensorcheck::cli::internal
