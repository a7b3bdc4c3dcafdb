#include "server/store/tensor_store.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tensorcheck {

namespace {

bool IsEmptyBlob(const Digest& d) { return d.size == 0 && d.hash == kEmptySha256; }

const TensorStore::Blob& EmptyBlob() {
  static const auto* empty = new TensorStore::Blob(std::make_shared<const std::string>());
  return *empty;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TensorStore>> TensorStore::Create(const Options& options) {
  if (options.budget_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("store budget: 0 bytes or more expected, got ", options.budget_bytes));
  }
  if (options.max_tensor_bytes < 0 || options.max_tensor_bytes > options.budget_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("store max_tensor_bytes: 0..", options.budget_bytes,
                     " (the budget) expected, got ", options.max_tensor_bytes));
  }
  return std::unique_ptr<TensorStore>(new TensorStore(options));
}

void TensorStore::Touch(std::map<Digest, Entry>::iterator it) {
  lru_.splice(lru_.end(), lru_, it->second.lru);
}

bool TensorStore::MakeRoom(int64_t bytes) {
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
    lru_.erase(it->second.lru);
    entries_.erase(it);
    ++evictions_;
  }
  return true;
}

absl::StatusOr<TensorStore::Blob> TensorStore::Put(const Digest& digest, std::string bytes) {
  const int64_t max =
      options_.max_tensor_bytes > 0 ? options_.max_tensor_bytes : options_.budget_bytes;
  if (digest.size > max) {
    return absl::ResourceExhaustedError(absl::StrCat(digest.ToString(), ": ", digest.size,
                                                     " bytes exceed the limit of ", max,
                                                     " bytes per stored tensor"));
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
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = entries_.find(digest); it != entries_.end()) {
    Touch(it);
    return it->second.blob;
  }
  if (!MakeRoom(digest.size)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        digest.ToString(), ": ", digest.size, " bytes do not fit the store's budget of ",
        options_.budget_bytes, " bytes: ", bytes_used_,
        " are held, and those in use by requests or uploads cannot be evicted; retry later"));
  }
  Blob blob = std::make_shared<const std::string>(std::move(bytes));
  lru_.push_back(digest);
  entries_.emplace(digest, Entry{blob, std::prev(lru_.end())});
  bytes_used_ += digest.size;
  return blob;
}

absl::StatusOr<TensorStore::Blob> TensorStore::Get(const Digest& digest) {
  if (IsEmptyBlob(digest)) return EmptyBlob();
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(digest);
  if (it == entries_.end()) {
    return absl::NotFoundError(
        absl::StrCat(digest.ToString(), " (", digest.size, " bytes) is not in the store"));
  }
  Touch(it);
  return it->second.blob;
}

std::vector<Digest> TensorStore::FindMissing(const std::vector<Digest>& digests) {
  std::vector<Digest> missing;
  std::lock_guard<std::mutex> lock(mu_);
  for (const Digest& d : digests) {
    if (IsEmptyBlob(d)) continue;
    auto it = entries_.find(d);
    if (it == entries_.end()) {
      missing.push_back(d);
    } else {
      Touch(it);
    }
  }
  return missing;
}

TensorStore::Stats TensorStore::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  Stats s;
  s.bytes_used = bytes_used_;
  s.tensors = static_cast<int64_t>(entries_.size());
  for (const auto& [d, e] : entries_) s.largest = std::max(s.largest, d.size);
  s.evictions = evictions_;
  return s;
}

}  // namespace tensorcheck
