// TensorStore: tensors kept by digest (digest.h) in memory, under a byte
// budget, evicting the least recently used; optionally also on disk
// (store_dir.h), so that they survive a restart in their order of use. A
// restarted store lists its directory without reading it: each tensor
// there is read and re-hashed when first wanted (Get), and one whose file
// does not match is dropped then, as if it had been evicted; no unverified
// byte is ever handed out (docs/api.md, "The store itself"). A tensor
// handed out is pinned for as long as its handle lives: a running request
// or a read never loses what it holds, and a store whose budget is all
// pinned refuses new tensors rather than evicting them. Uploads arrive in
// chunks into the tensor's final buffer, hashed as they come; an
// interrupted upload is kept for a while to be resumed. No gRPC inside:
// the service's store RPCs and the by-digest tensors of requests are
// built on it (docs/api.md).
//
//   TC_ASSIGN_OR_RETURN(auto store, TensorStore::Create({/*budget_bytes=*/1 << 30}));
//   TC_ASSIGN_OR_RETURN(TensorStore::Blob b, store->Put(digest, std::move(bytes)));
//   std::vector<Digest> missing = store->FindMissing({d1, d2});  // refreshes d1, d2
//   TC_ASSIGN_OR_RETURN(TensorStore::Blob w, store->Get(d1));   // NOT_FOUND if evicted
//   w->size(); w->data();                                       // pinned while w lives
//
//   bool present = false;                                       // chunked upload
//   TC_ASSIGN_OR_RETURN(auto up, store->StartUpload(d, "client-uuid", &present));
//   if (!present) {
//     TC_RETURN_IF_ERROR(up->Write(up->committed(), chunk));    // ... in order
//     TC_ASSIGN_OR_RETURN(TensorStore::Blob stored, up->Finish());
//   }                                                           // dropped unfinished: kept
//
// Thread-safe: every method may be called from any thread at once; one
// Upload is used by one thread at a time. Putting a digest already present
// keeps the stored bytes and returns them (two concurrent uploads of one
// tensor are stored once). The empty blob is always present and costs
// nothing. The budget covers stored tensors and uploads: an upload being
// written reserves its declared size (when it starts or resumes); one
// interrupted and kept for resuming holds only the bytes it received. A
// tensor on disk not read yet counts its whole size, as if in memory.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <future>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/digest.h"
#include "server/store/store_dir.h"

namespace tensorcheck {

class TensorStore {
 public:
  struct Options {
    // Bytes all stored tensors and uploads in progress may hold together.
    int64_t budget_bytes = int64_t{1} << 30;
    // Largest single tensor; 0: the budget.
    int64_t max_tensor_bytes = 0;
    // How long an interrupted upload keeps its bytes after its last chunk.
    absl::Duration partial_upload_ttl = absl::Minutes(10);
    // Called for each file of the store directory dropped after Create
    // (corrupt when first read), from the thread whose Get read it, no
    // lock held; Create's own go to its `dropped`.
    std::function<void(const StoreDir::Dropped&)> on_dropped = nullptr;
  };

  // A stored tensor's bytes; the tensor is pinned while any copy lives.
  using Blob = std::shared_ptr<const std::string>;

  struct Stats {
    int64_t bytes_used = 0;  // stored tensors and uploads in progress
    int64_t tensors = 0;
    // Of `tensors`: on disk since the start, not read (nor verified) yet.
    int64_t unread = 0;
    int64_t largest = 0;
    int64_t evictions = 0;
    // Lookups by digest (Get, and each digest FindMissing asks about)
    // that found the tensor, and that did not.
    int64_t hits = 0;
    int64_t misses = 0;
    // Tensors stored by uploads (not those already present), and bytes.
    int64_t uploads = 0;
    int64_t uploaded_bytes = 0;
    int64_t partial_uploads = 0;
    int64_t partial_bytes = 0;  // received so far
  };

  class Upload;

  // INVALID_ARGUMENT for a negative budget or a max_tensor_bytes over it.
  // With `dir`, tensors are also written there, and the ones it holds are
  // the store's from now on, in their order of use before the restart:
  // listed, not read (Get reads and verifies each). The most recently used
  // are kept while the budget lasts; the rest, and every file that cannot
  // be one (named wrongly, of the wrong size, a tensor over
  // max_tensor_bytes), are deleted and reported in `dropped` (or, when it
  // is null, to options.on_dropped). An error when `dir` cannot be listed.
  static absl::StatusOr<std::unique_ptr<TensorStore>> Create(
      const Options& options, std::unique_ptr<StoreDir> dir = nullptr,
      std::vector<StoreDir::Dropped>* dropped = nullptr);
  ~TensorStore();

  // Stores `bytes` under `digest` after checking that they are its size
  // and hash (INVALID_ARGUMENT, naming both, and nothing stored, when not).
  // Evicts unpinned tensors, least recently used first, to make room;
  // RESOURCE_EXHAUSTED when the tensor is over max_tensor_bytes or when
  // what is pinned leaves no room (nothing is evicted then). `persist`:
  // also write it to the store directory, if any (returned outputs are
  // not worth keeping across restarts). `bytes` is moved from only when
  // the tensor is stored: on an error the caller still has it.
  absl::StatusOr<Blob> Put(const Digest& digest, std::string&& bytes, bool persist = true);
  absl::StatusOr<Blob> Put(const Digest& digest, const std::string& bytes, bool persist = true) {
    return Put(digest, std::string(bytes), persist);
  }

  // The tensor, pinned while the handle lives, and now the most recently
  // used; NOT_FOUND naming the digest when the store does not hold it.
  // One on disk not read yet is read and re-hashed first (concurrent Gets
  // wait for that one read); when its file does not match, it is deleted,
  // reported to options.on_dropped, and the answer is NOT_FOUND, as for
  // any tensor evicted (a request then names it missing, and the clients
  // upload it again: docs/api.md). RESOURCE_EXHAUSTED when memory for its
  // bytes cannot be had (it stays on disk).
  absl::StatusOr<Blob> Get(const Digest& digest);

  // The digests of `digests` the store does not hold, in their order; the
  // ones it holds become the most recently used. A tensor on disk not read
  // yet counts as held, unverified: its Get may still find it corrupt.
  std::vector<Digest> FindMissing(const std::vector<Digest>& digests);

  // Whether an upload of a tensor the store already holds is answered at
  // once or must send every byte. Tenants (tenant_store.h) prove that
  // they have a tensor someone else stored by uploading it: a digest alone
  // would let them read bytes they never had, and an instant answer would
  // tell them that another tenant stored it.
  enum class IfPresent { kDone, kUploadAnyway };

  // Starts the upload of `digest` named `upload_id`, or resumes the one
  // kept under that name. Sets `*present` (and returns null) when the
  // store already holds the tensor, unless `if_present` asks for the bytes
  // anyway (the finished upload then returns the stored blob).
  // RESOURCE_EXHAUSTED when the size is over max_tensor_bytes or no room
  // can be made (as Put); ABORTED when another Upload of that name is
  // alive.
  absl::StatusOr<std::unique_ptr<Upload>> StartUpload(const Digest& digest,
                                                      const std::string& upload_id, bool* present,
                                                      IfPresent if_present = IfPresent::kDone);

  struct UploadStatus {
    int64_t committed = 0;  // bytes held; the size once stored
    bool complete = false;  // the store holds the tensor
  };
  // With IfPresent::kUploadAnyway a stored tensor does not count: the
  // status is the upload's alone.
  UploadStatus QueryUpload(const Digest& digest, const std::string& upload_id,
                           IfPresent if_present = IfPresent::kDone);

  // Budget bytes held by uploads whose upload_id starts with `id_prefix`
  // (a tenant's, tenant_store.h), leaving out the upload of `digest` named
  // `upload_id`: the declared size of each one being written, the bytes
  // received of each one kept for resuming.
  int64_t UploadBytes(absl::string_view id_prefix, const Digest& digest,
                      const std::string& upload_id) const;

  // Whether the store holds the tensor (its recency unchanged).
  bool Holds(const Digest& digest) const;
  // Drops the tensor now unless a request or read holds it (it is then
  // evicted in turn, as any other); its file too. False when it stays.
  bool Discard(const Digest& digest);

  // Frees interrupted uploads whose last chunk is older than the TTL;
  // returns how many. The service calls it periodically.
  int ExpirePartialUploads(absl::Time now = absl::Now());

  Stats stats() const;
  const Options& options() const { return options_; }
  // The largest tensor this store takes.
  int64_t max_tensor_bytes() const {
    return options_.max_tensor_bytes > 0 ? options_.max_tensor_bytes : options_.budget_bytes;
  }
  bool persistent() const { return dir_ != nullptr; }

 private:
  explicit TensorStore(const Options& options) : options_(options) {}

  struct Entry {
    // Null while the tensor is only on disk (listed at start, not read).
    Blob blob;
    std::list<Digest>::iterator lru;  // position in lru_
    // When it was last used: its file's mtime, so that a restart knows.
    absl::Time used;
    bool on_disk = false;        // it has a file in dir_
    bool stamp_pending = false;  // `used` is not on the file yet
    // Valid while a Get reads and verifies the file; pins the entry.
    std::shared_future<absl::StatusOr<Blob>> loading;
  };
  // A file's new mtime, set without mu_.
  using Stamp = std::pair<Digest, absl::Time>;
  struct Partial;
  using PartialKey = std::pair<Digest, std::string>;

  // Moves `it` to the most recently used end, and its file's mtime with
  // it (at the next ApplyStamps). Needs mu_.
  void Touch(std::map<Digest, Entry>::iterator it);
  // A time of use later than every one before. Needs mu_.
  absl::Time NextUse();
  // The mtimes Touch left to set, taken under mu_ and set by ApplyStamps
  // without it.
  std::vector<Stamp> TakeStamps();
  void ApplyStamps(const std::vector<Stamp>& stamps);
  // Reads and verifies an entry's file for Get (the entry is marked
  // loading), then answers Get and whoever waits on `promise`.
  absl::StatusOr<Blob> Load(const Digest& digest, std::promise<absl::StatusOr<Blob>> promise);
  // Writes the tensor to dir_ and sets its file's mtime to its time of use.
  absl::Status Persist(const Digest& digest, const std::string& bytes);
  // Evicts unpinned tensors, oldest first, until `bytes` more fit; false
  // (and nothing evicted) when they cannot. Evicted digests whose files
  // must go are added to `removed`. Needs mu_.
  bool MakeRoom(int64_t bytes, std::vector<Digest>* removed);
  // Adds a verified tensor as the most recently used; `persist`: it will
  // have a file in dir_. Needs mu_.
  Blob Insert(const Digest& digest, std::string bytes, bool persist = true);
  // The entry's bytes: `bytes` (verified by the caller) when it has none
  // in memory yet. Needs mu_.
  static Blob Fill(Entry& entry, std::string&& bytes);
  // Deletes evicted tensors' files. Without mu_.
  void RemoveFiles(const std::vector<Digest>& removed);
  absl::Status NoRoom(const Digest& digest) const;  // needs mu_
  // The Upload's end: stores the tensor, or drops the partial upload.
  absl::StatusOr<Blob> FinishUpload(const std::shared_ptr<Partial>& p);
  void ReleaseUpload(const std::shared_ptr<Partial>& p);

  const Options options_;
  std::unique_ptr<StoreDir> dir_;
  mutable std::mutex mu_;
  std::map<Digest, Entry> entries_;              // guarded by mu_
  std::list<Digest> lru_;                        // guarded by mu_; front: least recently used
  std::vector<Digest> stamps_pending_;           // guarded by mu_; see Entry::stamp_pending
  absl::Time last_used_ = absl::InfinitePast();  // guarded by mu_
  std::map<PartialKey, std::shared_ptr<Partial>> partials_;  // guarded by mu_
  int64_t bytes_used_ = 0;                                   // guarded by mu_
  int64_t evictions_ = 0;                                    // guarded by mu_
  int64_t hits_ = 0;                                         // guarded by mu_
  int64_t misses_ = 0;                                       // guarded by mu_
  int64_t uploads_ = 0;                                      // guarded by mu_
  int64_t uploaded_bytes_ = 0;                               // guarded by mu_
};

// One upload in progress: bytes written in order into the tensor's final
// buffer and hashed as they come. Destroyed before Finish (the stream
// broke), it is kept for resuming until the TTL passes.
class TensorStore::Upload {
 public:
  ~Upload();
  Upload(const Upload&) = delete;
  Upload& operator=(const Upload&) = delete;

  const Digest& digest() const { return digest_; }
  // Bytes received so far (all of them once finished).
  int64_t committed() const;

  // Appends `bytes` at `offset`, which must be committed() (in order, no
  // gaps, no overlaps), without passing the declared size:
  // INVALID_ARGUMENT otherwise, and nothing written.
  absl::Status Write(int64_t offset, absl::string_view bytes);

  // Every byte arrived: stores the tensor when the hash matches and
  // returns it; INVALID_ARGUMENT (the upload dropped) when it does not,
  // or when bytes are missing (the upload kept). Call once.
  absl::StatusOr<Blob> Finish();

 private:
  friend class TensorStore;
  Upload(TensorStore* store, const Digest& digest, std::shared_ptr<Partial> partial)
      : store_(store), digest_(digest), partial_(std::move(partial)) {}

  TensorStore* store_;
  const Digest digest_;
  std::shared_ptr<Partial> partial_;  // null once finished
};

}  // namespace tensorcheck
