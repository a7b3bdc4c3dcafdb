// TensorStore: tensors kept by digest (digest.h) in memory, under a byte
// budget, evicting the least recently used. A tensor handed out is pinned
// for as long as its handle lives: a running request or an upload never
// loses what it holds, and a store whose budget is all pinned refuses new
// tensors rather than evicting them. No gRPC inside: the service's upload
// and read RPCs and the engine's by-digest tensors are built on it.
//
//   TC_ASSIGN_OR_RETURN(auto store, TensorStore::Create({/*budget_bytes=*/1 << 30}));
//   TC_ASSIGN_OR_RETURN(TensorStore::Blob b, store->Put(digest, std::move(bytes)));
//   std::vector<Digest> missing = store->FindMissing({d1, d2});  // refreshes d1, d2
//   TC_ASSIGN_OR_RETURN(TensorStore::Blob w, store->Get(d1));   // NOT_FOUND if evicted
//   w->size(); w->data();                                       // pinned while w lives
//
// Thread-safe: every method may be called from any thread at once. Putting
// a digest already present keeps the stored bytes and returns them (two
// concurrent uploads of one tensor are stored once). The empty blob is
// always present and costs nothing.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/store/digest.h"

namespace tensorcheck {

class TensorStore {
 public:
  struct Options {
    // Bytes all stored tensors may hold together.
    int64_t budget_bytes = int64_t{1} << 30;
    // Largest single tensor; 0: the budget.
    int64_t max_tensor_bytes = 0;
  };

  // A stored tensor's bytes; the tensor is pinned while any copy lives.
  using Blob = std::shared_ptr<const std::string>;

  struct Stats {
    int64_t bytes_used = 0;
    int64_t tensors = 0;
    int64_t largest = 0;
    int64_t evictions = 0;
  };

  // INVALID_ARGUMENT for a negative budget or a max_tensor_bytes over it.
  static absl::StatusOr<std::unique_ptr<TensorStore>> Create(const Options& options);

  // Stores `bytes` under `digest` after checking that they are its size
  // and hash (INVALID_ARGUMENT, naming both, and nothing stored, when not).
  // Evicts unpinned tensors, least recently used first, to make room;
  // RESOURCE_EXHAUSTED when the tensor is over max_tensor_bytes or when
  // what is pinned leaves no room (nothing is evicted then).
  absl::StatusOr<Blob> Put(const Digest& digest, std::string bytes);

  // The tensor, pinned while the handle lives, and now the most recently
  // used; NOT_FOUND naming the digest when the store does not hold it.
  absl::StatusOr<Blob> Get(const Digest& digest);

  // The digests of `digests` the store does not hold, in their order; the
  // ones it holds become the most recently used.
  std::vector<Digest> FindMissing(const std::vector<Digest>& digests);

  Stats stats() const;
  const Options& options() const { return options_; }

 private:
  explicit TensorStore(const Options& options) : options_(options) {}

  struct Entry {
    Blob blob;
    std::list<Digest>::iterator lru;  // position in lru_
  };
  // Moves `it` to the most recently used end. Needs mu_.
  void Touch(std::map<Digest, Entry>::iterator it);
  // Evicts unpinned tensors, oldest first, until `bytes` more fit; false
  // (and nothing evicted) when they cannot. Needs mu_.
  bool MakeRoom(int64_t bytes);

  const Options options_;
  mutable std::mutex mu_;
  std::map<Digest, Entry> entries_;  // guarded by mu_
  std::list<Digest> lru_;            // guarded by mu_; front: least recently used
  int64_t bytes_used_ = 0;           // guarded by mu_
  int64_t evictions_ = 0;            // guarded by mu_
};

}  // namespace tensorcheck
