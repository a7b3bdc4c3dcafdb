#include "server/store/tensor_store.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
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

absl::Status NotInStore(const Digest& digest) {
  return absl::NotFoundError(
      absl::StrCat(digest.ToString(), " (", digest.size, " bytes) is not in the store"));
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
  if (dir == nullptr) return store;
  TC_ASSIGN_OR_RETURN(StoreDir::ScanReport scan, dir->Scan());
  std::vector<StoreDir::Dropped> evicted = std::move(scan.dropped);
  // What the store would hold had it run on under this budget: the most
  // recently used first, while they fit; one over the tensor limit could
  // never have been stored.
  bool full = false;
  for (auto it = scan.blobs.rbegin(); it != scan.blobs.rend(); ++it) {
    const Digest& d = it->digest;
    if (IsEmptyBlob(d)) continue;
    const int64_t room = options.budget_bytes - store->bytes_used_;
    if (d.size > store->max_tensor_bytes() || full || d.size > room) {
      full = full || d.size <= store->max_tensor_bytes();
      const std::string reason =
          d.size > store->max_tensor_bytes()
              ? absl::StrCat("over the limit of ", store->max_tensor_bytes(),
                             " bytes per stored tensor; deleted")
              : absl::StrCat("evicted at start: the budget of ", options.budget_bytes,
                             " bytes is taken by tensors used more recently; deleted");
      if (absl::Status s = dir->Remove(d); !s.ok()) {
        evicted.push_back({dir->FilePath(d), absl::StrCat(reason, ", but: ", s.message())});
      } else {
        evicted.push_back({dir->FilePath(d), reason});
      }
      ++store->evictions_;
      continue;
    }
    store->lru_.push_front(d);
    Entry& e = store->entries_[d];
    e.lru = store->lru_.begin();
    e.used = it->used;
    e.on_disk = true;
    store->bytes_used_ += d.size;
    store->last_used_ = std::max(store->last_used_, it->used);
  }
  store->dir_ = std::move(dir);
  if (dropped != nullptr) {
    *dropped = std::move(evicted);
  } else if (options.on_dropped) {
    for (const StoreDir::Dropped& d : evicted) options.on_dropped(d);
  }
  return store;
}

TensorStore::~TensorStore() = default;

void TensorStore::Touch(std::map<Digest, Entry>::iterator it) {
  Entry& e = it->second;
  if (std::next(e.lru) == lru_.end()) return;  // already the most recent
  lru_.splice(lru_.end(), lru_, e.lru);
  e.used = NextUse();
  if (e.on_disk && !e.stamp_pending) {
    e.stamp_pending = true;
    stamps_pending_.push_back(it->first);
  }
}

absl::Time TensorStore::NextUse() {
  // Strictly increasing, so that the files' order is the store's even when
  // the clock stands still or steps back.
  last_used_ = std::max(absl::Now(), last_used_ + absl::Nanoseconds(1));
  return last_used_;
}

std::vector<TensorStore::Stamp> TensorStore::TakeStamps() {
  std::vector<Stamp> stamps;
  for (const Digest& d : stamps_pending_) {
    auto it = entries_.find(d);
    if (it == entries_.end() || !it->second.stamp_pending) continue;
    it->second.stamp_pending = false;
    stamps.emplace_back(d, it->second.used);
  }
  stamps_pending_.clear();
  return stamps;
}

void TensorStore::ApplyStamps(const std::vector<Stamp>& stamps) {
  // One utimensat per tensor whose place in the order changed. Failing
  // costs only order: the file keeps an older time of use.
  for (const auto& [digest, used] : stamps) dir_->Touch(digest, used).IgnoreError();
}

TensorStore::Blob TensorStore::Fill(Entry& entry, std::string&& bytes) {
  if (entry.blob == nullptr) entry.blob = std::make_shared<const std::string>(std::move(bytes));
  return entry.blob;
}

bool TensorStore::MakeRoom(int64_t bytes, std::vector<Digest>* removed) {
  if (bytes_used_ + bytes <= options_.budget_bytes) return true;
  // Enough unpinned bytes, oldest first? Decide before evicting anything.
  int64_t freeable = 0;
  std::vector<std::map<Digest, Entry>::iterator> victims;
  for (const Digest& d : lru_) {
    auto it = entries_.find(d);
    // Pinned: a handle besides the store's own is alive, or a Get is
    // reading its file.
    if (it->second.blob.use_count() > 1 || it->second.loading.valid()) continue;
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
  // A file left behind costs disk only: it is a valid blob (or found not
  // to be when read), listed at the next start and kept or evicted then.
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

TensorStore::Blob TensorStore::Insert(const Digest& digest, std::string bytes, bool persist) {
  Blob blob = std::make_shared<const std::string>(std::move(bytes));
  lru_.push_back(digest);
  Entry& e = entries_[digest];
  e.blob = blob;
  e.lru = std::prev(lru_.end());
  e.used = NextUse();
  e.on_disk = persist && dir_ != nullptr;
  bytes_used_ += digest.size;
  return blob;
}

absl::Status TensorStore::Persist(const Digest& digest, const std::string& bytes) {
  TC_RETURN_IF_ERROR(dir_->Write(digest, bytes));
  // The file's mtime is when it was written; the order wants when the
  // tensor was stored, which tensors used since then came after.
  absl::Time used;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(digest);
    if (it == entries_.end()) return absl::OkStatus();
    it->second.on_disk = true;
    it->second.stamp_pending = false;
    used = it->second.used;
  }
  dir_->Touch(digest, used).IgnoreError();
  return absl::OkStatus();
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
  bool inserted = false;
  std::vector<Digest> removed;
  std::vector<Stamp> stamps;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = entries_.find(digest); it != entries_.end()) {
      Touch(it);
      // On disk only so far: these bytes are verified, its file is not
      // (rewritten by a Get reading it now that finds it corrupt, else
      // checked at its first Get after the next restart).
      blob = Fill(it->second, std::move(bytes));
    } else {
      if (!MakeRoom(digest.size, &removed)) return NoRoom(digest);
      blob = Insert(digest, std::move(bytes), persist);
      inserted = true;
    }
    stamps = TakeStamps();
  }
  ApplyStamps(stamps);
  RemoveFiles(removed);
  if (!inserted) return blob;
  if (persist && dir_ != nullptr) TC_RETURN_IF_ERROR(Persist(digest, *blob));
  return blob;
}

absl::StatusOr<TensorStore::Blob> TensorStore::Get(const Digest& digest) {
  if (IsEmptyBlob(digest)) return EmptyBlob();
  Blob blob;
  std::optional<std::promise<absl::StatusOr<Blob>>> promise;  // this Get reads it
  std::shared_future<absl::StatusOr<Blob>> another;           // another Get reads it
  std::vector<Stamp> stamps;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(digest);
    if (it == entries_.end()) {
      ++misses_;
      return NotInStore(digest);
    }
    Entry& e = it->second;
    if (e.blob != nullptr) {
      ++hits_;
      Touch(it);
      blob = e.blob;
      stamps = TakeStamps();
    } else if (e.loading.valid()) {
      another = e.loading;
    } else {
      promise.emplace();
      e.loading = promise->get_future().share();
    }
  }
  if (blob != nullptr) {
    ApplyStamps(stamps);
    return blob;
  }
  if (promise) return Load(digest, std::move(*promise));
  absl::StatusOr<Blob> got = another.get();
  std::lock_guard<std::mutex> lock(mu_);
  ++(got.ok() ? hits_ : misses_);
  return got;
}

absl::StatusOr<TensorStore::Blob> TensorStore::Load(const Digest& digest,
                                                    std::promise<absl::StatusOr<Blob>> promise) {
  // Outside the lock: a large tensor takes a while to read and hash.
  absl::StatusOr<std::string> bytes = dir_->Read(digest);
  const bool dropped = !bytes.ok() && !absl::IsResourceExhausted(bytes.status());
  absl::StatusOr<Blob> result;
  std::vector<Stamp> stamps;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(digest);  // still there: loading pins it
    if (it != entries_.end()) it->second.loading = {};
    if (it == entries_.end()) {
      result = NotInStore(digest);
    } else if (bytes.ok() || it->second.blob != nullptr) {
      // Verified, or filled meanwhile by a Put or an upload of the tensor.
      result = bytes.ok() ? Fill(it->second, *std::move(bytes)) : it->second.blob;
      Touch(it);
      stamps = TakeStamps();
    } else if (dropped) {
      // As if evicted: the file is gone (Read deleted it).
      result = NotInStore(digest);
      bytes_used_ -= digest.size;
      lru_.erase(it->second.lru);
      entries_.erase(it);
    } else {
      result = bytes.status();  // out of memory: it stays on disk, unread
    }
    ++(result.ok() ? hits_ : misses_);
  }
  promise.set_value(result);
  ApplyStamps(stamps);
  if (dropped) {
    if (options_.on_dropped) {
      options_.on_dropped({dir_->FilePath(digest), std::string(bytes.status().message())});
    }
    // Held in memory all the same (filled meanwhile): on disk again.
    if (result.ok()) Persist(digest, **result).IgnoreError();
  }
  return result;
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
    // Pinned: held by a request or a read, or being read from disk.
    if (it->second.blob.use_count() > 1 || it->second.loading.valid()) return false;
    bytes_used_ -= digest.size;
    lru_.erase(it->second.lru);
    entries_.erase(it);
  }
  RemoveFiles({digest});
  return true;
}

std::vector<Digest> TensorStore::FindMissing(const std::vector<Digest>& digests) {
  std::vector<Digest> missing;
  std::vector<Stamp> stamps;
  {
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
    stamps = TakeStamps();
  }
  ApplyStamps(stamps);
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

int64_t TensorStore::UploadBytes(absl::string_view id_prefix, const Digest& digest,
                                 const std::string& upload_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t bytes = 0;
  for (const auto& [key, p] : partials_) {
    if (!absl::StartsWith(key.second, id_prefix)) continue;
    if (key.first == digest && key.second == upload_id) continue;
    bytes += p->reserved;
  }
  return bytes;
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
      Touch(it);  // a concurrent upload of the same tensor won, or on disk only
      blob = Fill(it->second, std::move(p->bytes));
    } else {
      blob = Insert(p->digest, std::move(p->bytes));
      ++uploads_;
      uploaded_bytes_ += p->digest.size;
      stored = true;
    }
  }
  if (stored && dir_ != nullptr) TC_RETURN_IF_ERROR(Persist(p->digest, *blob));
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
  for (const auto& [d, e] : entries_) {
    s.largest = std::max(s.largest, d.size);
    if (e.blob == nullptr) ++s.unread;
  }
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
