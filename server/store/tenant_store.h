// TenantStore: each tenant's own namespace over one TensorStore
// (docs/operations.md, "Tenants"). A tenant finds, reads and uses only the
// tensors it uploaded itself (or that its requests returned by digest);
// another tenant's are NOT_FOUND to it, with the very answer a digest no
// one stored gets, and uploading such a tensor takes every byte, as if it
// were new. Identical tensors share one copy underneath.
//
// Each tenant may hold at most its quota of bytes (charged in full for
// every tensor it holds, shared or not, so that the charge tells nothing
// about the others), its uploads included: one being written counts its
// declared size, one interrupted and kept for resuming the bytes it
// received. Storing or starting to upload more drops the tenant's own
// least recently used tensors, as the store's budget does for everyone;
// a tensor over the quota by itself is RESOURCE_EXHAUSTED, and so is an
// upload that its other uploads leave no room for. A tensor no tenant
// holds any more leaves the store.
//
// The namespace with an empty tenant name is the whole store, unchanged:
// a server without tenants uses it.
//
//   TenantStore tenants(store.get());
//   const StoreNamespace team_a{"team-a", /*quota_bytes=*/8 << 30};
//   bool present = false;
//   TC_ASSIGN_OR_RETURN(auto up, tenants.StartUpload(team_a, d, "id", &present));
//   ... up->Write(...), up->Finish() ...
//   tenants.Adopt(team_a, d);                       // the upload is team-a's
//   tenants.FindMissing(team_b, {d});               // {d}: not team-b's
//
// Thread-safe.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/store/tensor_store.h"

namespace tensorcheck {

// Whose tensors: a tenant's name (empty: the whole store, no tenants) and
// the bytes it may hold (0: no limit but the store's budget).
struct StoreNamespace {
  std::string tenant;
  int64_t quota_bytes = 0;

  bool whole_store() const { return tenant.empty(); }
};

class TenantStore {
 public:
  // `store` must outlive this.
  explicit TenantStore(TensorStore* store) : store_(store) {}

  // As TensorStore's, within the namespace.
  std::vector<Digest> FindMissing(const StoreNamespace& ns, const std::vector<Digest>& digests);
  absl::StatusOr<TensorStore::Blob> Get(const StoreNamespace& ns, const Digest& digest);
  // Stores bytes the server made (returned outputs) and gives them to the
  // namespace.
  absl::StatusOr<TensorStore::Blob> Put(const StoreNamespace& ns, const Digest& digest,
                                        std::string&& bytes, bool persist);
  // Upload ids are per namespace. RESOURCE_EXHAUSTED when the tensor
  // alone is over the namespace's quota.
  absl::StatusOr<std::unique_ptr<TensorStore::Upload>> StartUpload(const StoreNamespace& ns,
                                                                   const Digest& digest,
                                                                   const std::string& upload_id,
                                                                   bool* present);
  TensorStore::UploadStatus QueryUpload(const StoreNamespace& ns, const Digest& digest,
                                        const std::string& upload_id);
  // The namespace now holds the stored tensor (after its upload finished).
  void Adopt(const StoreNamespace& ns, const Digest& digest);

  // Bytes the namespace holds (what its quota is charged).
  int64_t bytes_held(const StoreNamespace& ns) { return usage(ns).bytes; }
  struct Usage {
    int64_t bytes = 0;
    int64_t tensors = 0;
    int64_t largest = 0;
  };
  // What the namespace holds (the whole store's for the whole store).
  Usage usage(const StoreNamespace& ns);
  // The largest tensor the namespace takes.
  int64_t max_tensor_bytes(const StoreNamespace& ns) const;

  TensorStore* store() const { return store_; }

 private:
  struct Space {
    std::list<Digest> lru;  // front: least recently used
    std::map<Digest, std::list<Digest>::iterator> held;
    int64_t bytes = 0;
  };
  // Drops `digest` from `space` (and from the store once no one holds
  // it). Needs mu_.
  void Release(Space* space, Digest digest);
  // Forgets the tensors the store evicted. Needs mu_.
  void Prune(Space* space);
  // Drops the namespace's least recently used tensors until `bytes` more
  // fit its quota beside what it holds and its `uploading` bytes; the
  // bytes still over the quota when nothing is left to drop (0: they fit).
  // Needs mu_.
  int64_t MakeRoom(const StoreNamespace& ns, Space* space, int64_t bytes, int64_t uploading);
  // Whether the namespace holds the tensor; refreshes it. Needs mu_.
  bool Holds(Space* space, const Digest& digest);

  TensorStore* const store_;
  std::mutex mu_;
  std::map<std::string, Space> spaces_;  // guarded by mu_
  std::map<Digest, int> holders_;        // guarded by mu_: namespaces per tensor
};

// One namespace of a TenantStore, as the service's calls hold it: a
// TenantStore's methods with the namespace bound. Copyable; null when the
// server has no store.
struct StoreView {
  TenantStore* tenants = nullptr;
  StoreNamespace ns;

  explicit operator bool() const { return tenants != nullptr; }
  std::vector<Digest> FindMissing(const std::vector<Digest>& digests) const {
    return tenants->FindMissing(ns, digests);
  }
  absl::StatusOr<TensorStore::Blob> Get(const Digest& digest) const {
    return tenants->Get(ns, digest);
  }
  absl::StatusOr<TensorStore::Blob> Put(const Digest& digest, std::string&& bytes,
                                        bool persist) const {
    return tenants->Put(ns, digest, std::move(bytes), persist);
  }
  absl::StatusOr<std::unique_ptr<TensorStore::Upload>> StartUpload(const Digest& digest,
                                                                   const std::string& upload_id,
                                                                   bool* present) const {
    return tenants->StartUpload(ns, digest, upload_id, present);
  }
  TensorStore::UploadStatus QueryUpload(const Digest& digest, const std::string& upload_id) const {
    return tenants->QueryUpload(ns, digest, upload_id);
  }
  void Adopt(const Digest& digest) const { tenants->Adopt(ns, digest); }
  int64_t max_tensor_bytes() const { return tenants->max_tensor_bytes(ns); }
};

}  // namespace tensorcheck
