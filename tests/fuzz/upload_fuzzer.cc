// Fuzz target: the UploadTensor stream, in process (docs/api.md).
//
//   bytes -> a tensor's true bytes and a script of streams of chunk
//            messages (digests right or wrong, offsets in order or not,
//            chunks overlapping, past the size, streams ending early,
//            resumed under the same upload_id) -> UploadSession -> store
//
// Whatever the script, these hold after every stream, or it is a bug:
//  * a stream that ends OK left the tensor in the store, and the stored
//    bytes hash to the digest (never a wrong tensor under a right name);
//  * the true digest, once stored, holds exactly the true bytes;
//  * the store's bytes stay within its budget, and interrupted uploads are
//    freed when they expire (nothing leaks: the run ends with none);
//  * errors are the contract's codes: INVALID_ARGUMENT, RESOURCE_EXHAUSTED,
//    ABORTED, FAILED_PRECONDITION (a message after a failed one).
//
//   scripts/fuzz.sh 60     # builds build-fuzz, runs every target
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/digest.h"
#include "server/service/upload_session.h"
#include "server/store/tenant_store.h"
#include "server/store/tensor_store.h"
#include "tests/fuzz/fuzz_support.h"

namespace tensorcheck {
namespace {

constexpr char kTarget[] = "upload_fuzzer";
constexpr int64_t kBudget = 64 << 10;

void Check(bool ok, const std::string& what) {
  if (!ok) fuzz::FuzzFail(kTarget, what);
}

bool ExpectedCode(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kFailedPrecondition:
      return true;
    default:
      return false;
  }
}

// The digest a stream names: mostly the true one, sometimes another.
v1::TensorDigest PickDigest(FuzzedDataProvider& in, const std::string& truth) {
  const Digest d = DigestOf(truth);
  v1::TensorDigest p;
  p.set_hash(d.ToString());
  p.set_size_bytes(d.size);
  switch (in.ConsumeIntegralInRange<int>(0, 7)) {
    case 0:
      p.set_size_bytes(in.ConsumeIntegralInRange<int64_t>(-2, 2 * kBudget));
      break;
    case 1:
      p.set_hash(DigestOf(in.ConsumeBytesAsString(8)).ToString());
      break;
    case 2:
      p.set_hash(in.ConsumeRandomLengthString(80));
      break;
    default:
      break;  // the true digest
  }
  return p;
}

void RunStream(FuzzedDataProvider& in, TensorStore& store, const std::string& truth,
               const std::vector<std::string>& ids) {
  const v1::TensorDigest named = PickDigest(in, truth);
  const bool named_truth =
      named.hash() == DigestOf(truth).ToString() && named.size_bytes() == DigestOf(truth).size;
  const std::string& id = ids[in.ConsumeIntegralInRange<size_t>(0, ids.size() - 1)];
  // Where this id's upload stands (for the script to continue it).
  int64_t next = 0;
  if (auto d = ParseDigest(named.hash(), named.size_bytes()); d.ok()) {
    next = store.QueryUpload(*d, id).committed;
  }
  TenantStore whole(&store);
  UploadSession session(StoreView{&whole, {}});
  const int messages = in.ConsumeIntegralInRange<int>(1, 12);
  absl::Status status;
  for (int i = 0; i < messages && status.ok() && !session.finished(); ++i) {
    v1::UploadTensorRequest m;
    if (i == 0 ? in.ConsumeIntegralInRange<int>(0, 15) != 0 : in.ConsumeBool()) {
      *m.mutable_digest() = i == 0 ? named : PickDigest(in, truth);
    }
    if (i == 0 || in.ConsumeBool()) m.set_upload_id(id);
    // Mostly the next bytes in order; sometimes a gap, an overlap, garbage.
    int64_t offset = next;
    if (in.ConsumeIntegralInRange<int>(0, 5) == 0) {
      offset = in.ConsumeIntegralInRange<int64_t>(-1, static_cast<int64_t>(truth.size()) + 2);
    }
    m.set_offset(offset);
    const size_t len = in.ConsumeIntegralInRange<size_t>(0, truth.size() + 2);
    if (in.ConsumeIntegralInRange<int>(0, 7) == 0) {
      m.set_data(in.ConsumeBytesAsString(len));
    } else if (offset >= 0 && static_cast<size_t>(offset) <= truth.size()) {
      m.set_data(truth.substr(static_cast<size_t>(offset), len));
    }
    status = session.Take(m);
    if (status.ok()) next = offset + static_cast<int64_t>(m.data().size());
  }
  if (status.ok() && in.ConsumeIntegralInRange<int>(0, 3) != 0) {
    v1::UploadTensorResponse response;
    status = session.End(&response);
    if (status.ok()) {
      // Stored (or already there) under the digest named: the stored
      // bytes must hash to it, and only the true bytes can be stored.
      auto d = ParseDigest(response.digest().hash(), response.digest().size_bytes());
      Check(d.ok(), "an OK upload answered a malformed digest");
      auto blob = store.Get(*d);
      Check(blob.ok(), "an OK upload is not in the store");
      Check(DigestOf(**blob) == *d, "stored bytes do not hash to their digest");
      Check(!named_truth || **blob == truth, "the true digest holds other bytes");
    }
  }
  Check(ExpectedCode(status.code()), "unexpected code: " + status.ToString());
  Check(store.stats().bytes_used <= kBudget, "the store went over its budget");
}

}  // namespace
}  // namespace tensorcheck

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tensorcheck;
  FuzzedDataProvider in(data, size);
  TensorStore::Options options;
  options.budget_bytes = kBudget;
  options.max_tensor_bytes = kBudget / 2;
  auto store = TensorStore::Create(options);
  Check(store.ok(), "store");
  const std::string truth = in.ConsumeBytesAsString(in.ConsumeIntegralInRange<size_t>(0, 3000));
  const std::vector<std::string> ids = {"a", "b", ""};
  const int streams = in.ConsumeIntegralInRange<int>(1, 6);
  for (int s = 0; s < streams && in.remaining_bytes() > 0; ++s) {
    RunStream(in, **store, truth, ids);
  }
  // Nothing held after every upload's time to live.
  (*store)->ExpirePartialUploads(absl::Now() + options.partial_upload_ttl + absl::Seconds(1));
  const TensorStore::Stats st = (*store)->stats();
  Check(st.partial_uploads == 0 && st.partial_bytes == 0, "an interrupted upload was not freed");
  return 0;
}
