#include "server/store/tensor_store.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/core/status_macros.h"
#include "server/store/trailing_hasher.h"

namespace tensorcheck {

namespace {

// Uploads at least this large hash on a thread of their own.
constexpr int64_t kTrailingHashBytes = int64_t{16} << 20;

bool IsEmptyBlob(const Digest& d) { return d.size == 0 && d.hash == kEmptySha256; }

const TensorStore::Blob& EmptyBlob() {
  static const auto* empty = new TensorStore::Blob(std::make_shared<const std::string>());
  return *empty;
}

}  // namespace

// An upload in progress or kept for resuming. `bytes` and `hash` belong
// to the live Upload (at most one: `active`); the rest is guarded by the
// store's mu_, except `committed`, which QueryUpload reads.
struct TensorStore::Partial {
  Digest digest;
  std::string id;
  std::string bytes;  // capacity reserved for the whole tensor
  // Large uploads hash on a thread of their own, behind the writer
  // (trailing_hasher.h); small ones inline.
  std::unique_ptr<TrailingHasher> trailing;
  Sha256 hash;
  std::atomic<int64_t> committed{0};
  // Budget bytes held: the declared size while a stream writes it, only
  // the bytes received while it waits to be resumed (so that a client that
  // stalls holds no more than it sent). Guarded by the store's mu_.
  int64_t reserved = 0;
  bool active = false;
  absl::Time last_write;
};

absl::StatusOr<std::unique_ptr<TensorStore>> TensorStore::Create(
    const Options& options, std::unique_ptr<StoreDir> dir,
    std::vector<StoreDir::Dropped>* dropped) {
  if (options.budget_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("store budget: 0 bytes or more expected, got ", options.budget_bytes));
  }
  if (options.max_tensor_bytes < 0 || options.max_tensor_bytes > options.budget_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("store max_tensor_bytes: 0..", options.budget_bytes,
                     " (the budget) expected, got ", options.max_tensor_bytes));
  }
  std::unique_ptr<TensorStore> store(new TensorStore(options));
  if (dir != nullptr) {
    // Loaded before dir_ is set: Put must not write them back.
    absl::StatusOr<StoreDir::LoadReport> report = dir->LoadAll([&store](StoreDir::Loaded&& blob) {
      return store->Put(blob.digest, std::move(blob.bytes), /*persist=*/false).ok();
    });
    if (!report.ok()) return report.status();
    if (dropped != nullptr) *dropped = std::move(report->dropped);
    store->dir_ = std::move(dir);
  }
  return store;
}

TensorStore::~TensorStore() = default;

void TensorStore::Touch(std::map<Digest, Entry>::iterator it) {
  lru_.splice(lru_.end(), lru_, it->second.lru);
}

bool TensorStore::MakeRoom(int64_t bytes, std::vector<Digest>* removed) {
  if (bytes_used_ + bytes <= options_.budget_bytes) return true;
  // Enough unpinned bytes, oldest first? Decide before evicting anything.
  int64_t freeable = 0;
  std::vector<std::map<Digest, Entry>::iterator> victims;
  for (const Digest& d : lru_) {
    auto it = entries_.find(d);
    // Pinned: a handle besides the store's own is alive.
    if (it->second.blob.use_count() > 1) continue;
    victims.push_back(it);
    freeable += d.size;
    if (bytes_used_ - freeable + bytes <= options_.budget_bytes) break;
  }
  if (bytes_used_ - freeable + bytes > options_.budget_bytes) return false;
  for (auto it : victims) {
    bytes_used_ -= it->first.size;
    removed->push_back(it->first);
    lru_.erase(it->second.lru);
    entries_.erase(it);
    ++evictions_;
  }
  return true;
}

void TensorStore::RemoveFiles(const std::vector<Digest>& removed) {
  if (dir_ == nullptr) return;
  // A file left behind is harmless: it is a valid blob, loaded (or not)
  // at the next start.
  for (const Digest& d : removed) dir_->Remove(d).IgnoreError();
}

absl::Status TensorStore::NoRoom(const Digest& digest) const {
  // Not how much is held: on a server shared by tenants that figure would
  // tell one tenant of another's uploads and holdings (docs/operations.md,
  // "What a tenant can learn").
  return absl::ResourceExhaustedError(absl::StrCat(
      digest.ToString(), ": ", digest.size, " bytes do not fit the store's budget of ",
      options_.budget_bytes,
      " bytes now: what it holds in use by requests or uploads cannot be evicted; retry later"));
}

TensorStore::Blob TensorStore::Insert(const Digest& digest, std::string bytes) {
  Blob blob = std::make_shared<const std::string>(std::move(bytes));
  lru_.push_back(digest);
  entries_.emplace(digest, Entry{blob, std::prev(lru_.end())});
  bytes_used_ += digest.size;
  return blob;
}

absl::StatusOr<TensorStore::Blob> TensorStore::Put(const Digest& digest, std::string&& bytes,
                                                   bool persist) {
  if (digest.size > max_tensor_bytes()) {
    return absl::ResourceExhaustedError(
        absl::StrCat(digest.ToString(), ": ", digest.size, " bytes exceed the limit of ",
                     max_tensor_bytes(), " bytes per stored tensor"));
  }
  if (static_cast<int64_t>(bytes.size()) != digest.size) {
    return absl::InvalidArgumentError(absl::StrCat(digest.ToString(), ": ", digest.size,
                                                   " bytes declared, ", bytes.size(),
                                                   " received; nothing stored"));
  }
  // Hashed outside the lock: the bytes are ours.
  const Digest actual = DigestOf(bytes);
  if (actual != digest) {
    return absl::InvalidArgumentError(absl::StrCat("the bytes received hash to ", actual.ToString(),
                                                   ", not ", digest.ToString(),
                                                   "; nothing stored"));
  }
  if (IsEmptyBlob(digest)) return EmptyBlob();
  Blob blob;
  std::vector<Digest> removed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = entries_.find(digest); it != entries_.end()) {
      Touch(it);
      return it->second.blob;
    }
    if (!MakeRoom(digest.size, &removed)) return NoRoom(digest);
    blob = Insert(digest, std::move(bytes));
  }
  RemoveFiles(removed);
  if (persist && dir_ != nullptr) TC_RETURN_IF_ERROR(dir_->Write(digest, *blob));
  return blob;
}

absl::StatusOr<TensorStore::Blob> TensorStore::Get(const Digest& digest) {
  if (IsEmptyBlob(digest)) return EmptyBlob();
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(digest);
  if (it == entries_.end()) {
    ++misses_;
    return absl::NotFoundError(
        absl::StrCat(digest.ToString(), " (", digest.size, " bytes) is not in the store"));
  }
  ++hits_;
  Touch(it);
  return it->second.blob;
}

bool TensorStore::Holds(const Digest& digest) const {
  if (IsEmptyBlob(digest)) return true;
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.count(digest) > 0;
}

bool TensorStore::Discard(const Digest& digest) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(digest);
    if (it == entries_.end()) return true;
    if (it->second.blob.use_count() > 1) return false;  // pinned
    bytes_used_ -= digest.size;
    lru_.erase(it->second.lru);
    entries_.erase(it);
  }
  RemoveFiles({digest});
  return true;
}

std::vector<Digest> TensorStore::FindMissing(const std::vector<Digest>& digests) {
  std::vector<Digest> missing;
  std::lock_guard<std::mutex> lock(mu_);
  for (const Digest& d : digests) {
    if (IsEmptyBlob(d)) continue;
    auto it = entries_.find(d);
    if (it == entries_.end()) {
      ++misses_;
      missing.push_back(d);
    } else {
      ++hits_;
      Touch(it);
    }
  }
  return missing;
}

absl::StatusOr<std::unique_ptr<TensorStore::Upload>> TensorStore::StartUpload(
    const Digest& digest, const std::string& upload_id, bool* present, IfPresent if_present) {
  *present = false;
  if (IsEmptyBlob(digest)) {
    *present = true;
    return nullptr;
  }
  if (digest.size > max_tensor_bytes()) {
    return absl::ResourceExhaustedError(
        absl::StrCat(digest.ToString(), ": ", digest.size, " bytes exceed the limit of ",
                     max_tensor_bytes(), " bytes per stored tensor"));
  }
  std::vector<Digest> removed;
  std::shared_ptr<Partial> partial;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = entries_.find(digest); it != entries_.end() && if_present == IfPresent::kDone) {
      Touch(it);
      *present = true;
      return nullptr;
    }
    const PartialKey key{digest, upload_id};
    if (auto it = partials_.find(key); it != partials_.end()) {
      if (it->second->active) {
        return absl::AbortedError(absl::StrCat("upload '", upload_id, "' of ", digest.ToString(),
                                               " is being written by another stream"));
      }
      partial = it->second;
      // Resumed: the rest of the declared size is reserved again.
      const int64_t rest = digest.size - partial->reserved;
      if (!MakeRoom(rest, &removed)) return NoRoom(digest);
      bytes_used_ += rest;
      partial->reserved = digest.size;
    } else {
      if (!MakeRoom(digest.size, &removed)) return NoRoom(digest);
      partial = std::make_shared<Partial>();
      partial->digest = digest;
      partial->id = upload_id;
      try {
        // Capacity only: pages are touched as chunks arrive.
        partial->bytes.reserve(static_cast<size_t>(digest.size));
      } catch (const std::bad_alloc&) {
        return absl::ResourceExhaustedError(absl::StrCat(digest.ToString(), ": cannot allocate ",
                                                         digest.size, " bytes for the upload"));
      }
      if (digest.size >= kTrailingHashBytes) {
        partial->trailing = std::make_unique<TrailingHasher>(partial->bytes.data(), digest.size);
      }
      bytes_used_ += digest.size;
      partial->reserved = digest.size;
      partials_.emplace(key, partial);
    }
    partial->active = true;
    partial->last_write = absl::Now();
  }
  RemoveFiles(removed);
  return std::unique_ptr<Upload>(new Upload(this, digest, std::move(partial)));
}

TensorStore::UploadStatus TensorStore::QueryUpload(const Digest& digest,
                                                   const std::string& upload_id,
                                                   IfPresent if_present) {
  if (IsEmptyBlob(digest)) return {0, true};
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = entries_.find(digest); it != entries_.end() && if_present == IfPresent::kDone) {
    Touch(it);
    return {digest.size, true};
  }
  auto it = partials_.find(PartialKey{digest, upload_id});
  if (it == partials_.end()) return {0, false};
  return {it->second->committed.load(), false};
}

int TensorStore::ExpirePartialUploads(absl::Time now) {
  std::vector<std::shared_ptr<Partial>> expired;  // freed outside the lock
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = partials_.begin(); it != partials_.end();) {
      const Partial& p = *it->second;
      if (!p.active && now - p.last_write > options_.partial_upload_ttl) {
        bytes_used_ -= p.reserved;
        expired.push_back(std::move(it->second));
        it = partials_.erase(it);
      } else {
        ++it;
      }
    }
  }
  return static_cast<int>(expired.size());
}

absl::StatusOr<TensorStore::Blob> TensorStore::FinishUpload(const std::shared_ptr<Partial>& p) {
  const int64_t committed = p->committed.load();
  if (committed != p->digest.size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the upload of ", p->digest.ToString(), " ended after ", committed, " of ", p->digest.size,
        " bytes; they are kept for ", absl::FormatDuration(options_.partial_upload_ttl),
        ": resume at offset ", committed, " with the same upload_id"));
  }
  const std::string hash = p->trailing ? p->trailing->Finish() : p->hash.HexDigest();
  p->trailing.reset();
  const PartialKey key{p->digest, p->id};
  Blob blob;
  bool stored = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    partials_.erase(key);
    bytes_used_ -= p->reserved;  // the reservation ends either way
    if (hash != p->digest.hash) {
      return absl::InvalidArgumentError(absl::StrCat("the bytes received hash to sha256:", hash,
                                                     ", not ", p->digest.ToString(),
                                                     "; nothing stored"));
    }
    if (auto it = entries_.find(p->digest); it != entries_.end()) {
      Touch(it);  // a concurrent upload of the same tensor won
      blob = it->second.blob;
    } else {
      blob = Insert(p->digest, std::move(p->bytes));
      ++uploads_;
      uploaded_bytes_ += p->digest.size;
      stored = true;
    }
  }
  if (stored && dir_ != nullptr) TC_RETURN_IF_ERROR(dir_->Write(p->digest, *blob));
  return blob;
}

void TensorStore::ReleaseUpload(const std::shared_ptr<Partial>& p) {
  std::lock_guard<std::mutex> lock(mu_);
  p->active = false;
  p->last_write = absl::Now();
  // Kept for resuming: only what arrived stays counted.
  const int64_t committed = p->committed.load();
  bytes_used_ -= p->reserved - committed;
  p->reserved = committed;
}

TensorStore::Upload::~Upload() {
  if (partial_ != nullptr) store_->ReleaseUpload(partial_);
}

int64_t TensorStore::Upload::committed() const {
  return partial_ != nullptr ? partial_->committed.load() : digest_.size;
}

absl::Status TensorStore::Upload::Write(int64_t offset, absl::string_view bytes) {
  if (partial_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("the upload of ", digest_.ToString(), " has already finished"));
  }
  Partial& p = *partial_;
  const int64_t committed = p.committed.load();
  if (offset != committed) {
    return absl::InvalidArgumentError(absl::StrCat(
        "offset: ", committed, " expected (the bytes of ", p.digest.ToString(),
        " held so far; chunks come in order, without gaps or overlaps), got ", offset));
  }
  const int64_t size = static_cast<int64_t>(bytes.size());
  if (size > p.digest.size - committed) {
    return absl::InvalidArgumentError(absl::StrCat("data: ", size, " bytes at offset ", offset,
                                                   " pass the declared size of ", p.digest.size,
                                                   " bytes"));
  }
  p.bytes.append(bytes.data(), bytes.size());
  if (p.trailing) {
    p.trailing->Advance(committed + size);
  } else {
    p.hash.Update(bytes);
  }
  p.committed.store(committed + size);
  return absl::OkStatus();
}

absl::StatusOr<TensorStore::Blob> TensorStore::Upload::Finish() {
  if (partial_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("the upload of ", digest_.ToString(), " has already finished"));
  }
  absl::StatusOr<Blob> blob = store_->FinishUpload(partial_);
  // Stored or dropped: nothing to keep. Missing bytes: kept for resuming.
  if (blob.ok() || partial_->committed.load() == partial_->digest.size) partial_ = nullptr;
  return blob;
}

TensorStore::Stats TensorStore::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  Stats s;
  s.bytes_used = bytes_used_;
  s.tensors = static_cast<int64_t>(entries_.size());
  for (const auto& [d, e] : entries_) s.largest = std::max(s.largest, d.size);
  s.evictions = evictions_;
  s.hits = hits_;
  s.misses = misses_;
  s.uploads = uploads_;
  s.uploaded_bytes = uploaded_bytes_;
  s.partial_uploads = static_cast<int64_t>(partials_.size());
  for (const auto& [k, p] : partials_) s.partial_bytes += p->committed.load();
  return s;
}

}  // namespace tensorcheck
