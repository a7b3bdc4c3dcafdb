#include "server/backends/resident_cache.h"

#include <utility>

namespace tensorcheck {

struct ResidentCache::Handle::Entry {
  std::string key;
  std::shared_ptr<void> payload;
  int64_t bytes = 0;
  int pins = 0;  // guarded by the cache's mutex
  Lru::iterator position;
};

ResidentCache::Handle::Handle(ResidentCache* cache, std::shared_ptr<Entry> entry)
    : cache_(cache), entry_(std::move(entry)) {}

ResidentCache::Handle::Handle(Handle&& other) noexcept
    : cache_(std::exchange(other.cache_, nullptr)), entry_(std::move(other.entry_)) {}

ResidentCache::Handle& ResidentCache::Handle::operator=(Handle&& other) noexcept {
  if (this != &other) {
    Release();
    cache_ = std::exchange(other.cache_, nullptr);
    entry_ = std::move(other.entry_);
  }
  return *this;
}

ResidentCache::Handle::~Handle() { Release(); }

void ResidentCache::Handle::Release() {
  if (cache_ != nullptr && entry_ != nullptr) cache_->Unpin(entry_);
  cache_ = nullptr;
  entry_.reset();
}

void* ResidentCache::Handle::payload() const { return entry_->payload.get(); }

int64_t ResidentCache::Handle::bytes() const { return entry_->bytes; }

ResidentCache::ResidentCache(int64_t capacity_bytes) : capacity_(capacity_bytes) {}

ResidentCache::~ResidentCache() = default;

std::optional<ResidentCache::Handle> ResidentCache::Find(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    ++misses_;
    return std::nullopt;
  }
  ++hits_;
  const std::shared_ptr<Handle::Entry>& entry = it->second;
  ++entry->pins;
  lru_.splice(lru_.begin(), lru_, entry->position);
  return Handle(this, entry);
}

bool ResidentCache::EvictUntilFits(int64_t extra) {
  // Least recently used first: from the back.
  for (auto it = lru_.end(); bytes_ + extra > capacity_ && it != lru_.begin();) {
    --it;
    auto found = entries_.find(*it);
    if (found->second->pins > 0) continue;
    bytes_ -= found->second->bytes;
    ++evictions_;
    entries_.erase(found);  // the payload's deleter frees it
    it = lru_.erase(it);
  }
  return bytes_ + extra <= capacity_;
}

bool ResidentCache::MakeRoom(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes >= 0 && EvictUntilFits(bytes);
}

std::optional<ResidentCache::Handle> ResidentCache::Insert(const std::string& key,
                                                           std::shared_ptr<void> payload,
                                                           int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(key);
  if (it != entries_.end()) {
    ++it->second->pins;
    lru_.splice(lru_.begin(), lru_, it->second->position);
    return Handle(this, it->second);
  }
  if (bytes < 0 || !EvictUntilFits(bytes)) return std::nullopt;
  auto entry = std::make_shared<Handle::Entry>();
  entry->key = key;
  entry->payload = std::move(payload);
  entry->bytes = bytes;
  entry->pins = 1;
  lru_.push_front(key);
  entry->position = lru_.begin();
  entries_.emplace(key, entry);
  bytes_ += bytes;
  return Handle(this, std::move(entry));
}

void ResidentCache::SetCapacity(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  capacity_ = bytes;
  EvictUntilFits(0);
}

void ResidentCache::EvictUnpinned() {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t capacity = capacity_;
  capacity_ = 0;
  EvictUntilFits(0);
  capacity_ = capacity;
}

void ResidentCache::Unpin(const std::shared_ptr<Handle::Entry>& entry) {
  std::lock_guard<std::mutex> lock(mu_);
  --entry->pins;
  // A capacity that shrank under pinned entries is met as they unpin.
  if (entry->pins == 0 && bytes_ > capacity_) EvictUntilFits(0);
}

ResidentStats ResidentCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  ResidentStats s;
  s.entries = static_cast<int64_t>(entries_.size());
  s.bytes = bytes_;
  s.capacity_bytes = capacity_;
  s.hits = hits_;
  s.misses = misses_;
  s.evictions = evictions_;
  return s;
}

}  // namespace tensorcheck
