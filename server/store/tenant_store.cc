#include "server/store/tenant_store.h"

#include <algorithm>
#include <iterator>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tensorcheck {

namespace {
// Upload ids are the clients' to choose: each namespace has its own, so
// that no tenant can resume, or ask after, another's upload. Tenant names
// hold no newline.
std::string UploadIdPrefix(const StoreNamespace& ns) { return absl::StrCat(ns.tenant, "\n"); }
std::string NamespacedUploadId(const StoreNamespace& ns, const std::string& upload_id) {
  return ns.whole_store() ? upload_id : UploadIdPrefix(ns) + upload_id;
}

// What a digest the namespace does not hold gets: the store's own answer
// to a digest no one stored, word for word.
absl::Status NotStored(const Digest& digest) {
  return absl::NotFoundError(
      absl::StrCat(digest.ToString(), " (", digest.size, " bytes) is not in the store"));
}
// RESOURCE_EXHAUSTED (permanent) when the tensor alone is over the
// namespace's quota.
absl::Status WithinQuota(const StoreNamespace& ns, const Digest& digest) {
  if (ns.whole_store() || ns.quota_bytes <= 0 || digest.size <= ns.quota_bytes) {
    return absl::OkStatus();
  }
  return absl::ResourceExhaustedError(
      absl::StrCat(digest.ToString(), ": ", digest.size, " bytes exceed tenant '", ns.tenant,
                   "''s quota of ", ns.quota_bytes, " stored bytes"));
}
}  // namespace

int64_t TenantStore::MakeRoom(const StoreNamespace& ns, Space* space, int64_t bytes,
                              int64_t uploading) {
  if (ns.quota_bytes <= 0 || space->bytes + uploading + bytes <= ns.quota_bytes) return 0;
  Prune(space);
  // The tenant's own least recently used make room, as the store's budget
  // does for everyone.
  while (space->bytes + uploading + bytes > ns.quota_bytes && !space->lru.empty()) {
    const Digest oldest = space->lru.front();  // a copy: Release erases the element
    Release(space, oldest);
  }
  return std::max<int64_t>(0, space->bytes + uploading + bytes - ns.quota_bytes);
}

bool TenantStore::Holds(Space* space, const Digest& digest) {
  auto it = space->held.find(digest);
  if (it == space->held.end()) return false;
  space->lru.splice(space->lru.end(), space->lru, it->second);
  return true;
}

void TenantStore::Release(Space* space, Digest digest) {
  auto it = space->held.find(digest);
  if (it == space->held.end()) return;
  space->lru.erase(it->second);
  space->held.erase(it);
  space->bytes -= digest.size;
  auto h = holders_.find(digest);
  if (h != holders_.end() && --h->second == 0) {
    holders_.erase(h);
    // No one's any more; pinned by a request, it is evicted in turn later.
    store_->Discard(digest);
  }
}

void TenantStore::Prune(Space* space) {
  std::vector<Digest> gone;
  for (const Digest& d : space->lru) {
    if (!store_->Holds(d)) gone.push_back(d);
  }
  for (const Digest& d : gone) Release(space, d);
}

std::vector<Digest> TenantStore::FindMissing(const StoreNamespace& ns,
                                             const std::vector<Digest>& digests) {
  if (ns.whole_store()) return store_->FindMissing(digests);
  std::vector<Digest> held;
  std::vector<Digest> missing;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Space& space = spaces_[ns.tenant];
    for (const Digest& d : digests) {
      if (d.size == 0) continue;  // the empty tensor: always there
      (Holds(&space, d) ? held : missing).push_back(d);
    }
  }
  // The ones held may have been evicted since; this refreshes the rest.
  const std::vector<Digest> evicted = store_->FindMissing(held);
  if (evicted.empty()) return missing;
  std::lock_guard<std::mutex> lock(mu_);
  Space& space = spaces_[ns.tenant];
  for (const Digest& d : evicted) {
    if (space.held.count(d) == 0) continue;  // not held: already counted as missing
    Release(&space, d);
    missing.push_back(d);
  }
  // In the order asked.
  const std::set<Digest> missing_set(missing.begin(), missing.end());
  std::vector<Digest> ordered;
  for (const Digest& d : digests) {
    if (missing_set.count(d) > 0) ordered.push_back(d);
  }
  return ordered;
}

absl::StatusOr<TensorStore::Blob> TenantStore::Get(const StoreNamespace& ns, const Digest& digest) {
  if (ns.whole_store() || digest.size == 0) return store_->Get(digest);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!Holds(&spaces_[ns.tenant], digest)) return NotStored(digest);
  }
  absl::StatusOr<TensorStore::Blob> blob = store_->Get(digest);
  if (!blob.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    Release(&spaces_[ns.tenant], digest);  // evicted
  }
  return blob;
}

absl::StatusOr<TensorStore::Blob> TenantStore::Put(const StoreNamespace& ns, const Digest& digest,
                                                   std::string&& bytes, bool persist) {
  if (absl::Status s = WithinQuota(ns, digest); !s.ok()) return s;
  absl::StatusOr<TensorStore::Blob> blob = store_->Put(digest, std::move(bytes), persist);
  if (blob.ok()) Adopt(ns, digest);
  return blob;
}

absl::StatusOr<std::unique_ptr<TensorStore::Upload>> TenantStore::StartUpload(
    const StoreNamespace& ns, const Digest& digest, const std::string& upload_id, bool* present) {
  if (ns.whole_store()) return store_->StartUpload(digest, upload_id, present);
  *present = false;
  if (digest.size == 0) return store_->StartUpload(digest, upload_id, present);
  if (absl::Status s = WithinQuota(ns, digest); !s.ok()) return s;
  const std::string id = NamespacedUploadId(ns, upload_id);
  // Held while the upload starts, so that two of the tenant's uploads
  // starting at once cannot both take the last of its quota.
  std::lock_guard<std::mutex> lock(mu_);
  Space& space = spaces_[ns.tenant];
  const bool held = Holds(&space, digest);
  if (!held) {
    // The tenant's other uploads, being written or kept for resuming,
    // count against its quota as its stored tensors do: abandoned uploads
    // cannot fill the store past the tenant's share.
    const int64_t uploading = store_->UploadBytes(UploadIdPrefix(ns), digest, id);
    if (MakeRoom(ns, &space, digest.size, uploading) > 0) {
      return absl::ResourceExhaustedError(absl::StrCat(
          digest.ToString(), ": ", digest.size, " bytes do not fit tenant '", ns.tenant,
          "''s quota of ", ns.quota_bytes, " stored bytes beside its ", uploading,
          " bytes of uploads in progress or interrupted; finish or resume those (or let them "
          "expire, --partial-upload-seconds) first"));
    }
  }
  // Held by this tenant: answered at once if the store still has it.
  // Otherwise every byte, even when another tenant stored the tensor.
  return store_->StartUpload(
      digest, id, present,
      held ? TensorStore::IfPresent::kDone : TensorStore::IfPresent::kUploadAnyway);
}

TensorStore::UploadStatus TenantStore::QueryUpload(const StoreNamespace& ns, const Digest& digest,
                                                   const std::string& upload_id) {
  if (ns.whole_store()) return store_->QueryUpload(digest, upload_id);
  bool held = digest.size == 0;
  if (!held) {
    std::lock_guard<std::mutex> lock(mu_);
    held = Holds(&spaces_[ns.tenant], digest);
  }
  return store_->QueryUpload(
      digest, NamespacedUploadId(ns, upload_id),
      held ? TensorStore::IfPresent::kDone : TensorStore::IfPresent::kUploadAnyway);
}

void TenantStore::Adopt(const StoreNamespace& ns, const Digest& digest) {
  if (ns.whole_store() || digest.size == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  Space& space = spaces_[ns.tenant];
  if (Holds(&space, digest)) return;
  // Its uploads still in progress count; the one that stored `digest` is
  // over.
  const int64_t uploading =
      ns.quota_bytes > 0 ? store_->UploadBytes(UploadIdPrefix(ns), Digest{}, "") : 0;
  MakeRoom(ns, &space, digest.size, uploading);
  space.lru.push_back(digest);
  space.held.emplace(digest, std::prev(space.lru.end()));
  space.bytes += digest.size;
  ++holders_[digest];
}

TenantStore::Usage TenantStore::usage(const StoreNamespace& ns) {
  if (ns.whole_store()) {
    const TensorStore::Stats st = store_->stats();
    return {st.bytes_used, st.tensors, st.largest};
  }
  std::lock_guard<std::mutex> lock(mu_);
  Space& space = spaces_[ns.tenant];
  Prune(&space);
  Usage u;
  u.bytes = space.bytes;
  u.tensors = static_cast<int64_t>(space.held.size());
  for (const Digest& d : space.lru) u.largest = std::max(u.largest, d.size);
  return u;
}

int64_t TenantStore::max_tensor_bytes(const StoreNamespace& ns) const {
  const int64_t store_max = store_->max_tensor_bytes();
  if (ns.whole_store() || ns.quota_bytes <= 0) return store_max;
  return std::min(store_max, ns.quota_bytes);
}

}  // namespace tensorcheck
