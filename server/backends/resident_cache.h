// ResidentCache: tensors a device keeps between requests, by content id
// (a stored tensor's digest), least recently used first out, within a byte
// capacity (docs/architecture.md, "Resident tensors").
//
//   ResidentCache cache(/*capacity_bytes=*/1 << 30);
//   std::optional<ResidentCache::Handle> h = cache.Find("sha256:...|bfloat16");
//   if (!h && cache.MakeRoom(bytes)) {
//     h = cache.Insert(key, std::shared_ptr<void>(ptr, free_fn), bytes);
//   }
//   use(h->payload());   // pinned: never evicted while `h` lives
//
// The payload is what the device allocated (its deleter frees it); the
// cache owns it from Insert on and lets it go on eviction, once no handle
// pins it. An entry is never evicted while a handle to it lives, so a
// running request keeps what it uses. The capacity may shrink (the
// budget less what requests have reserved): unpinned entries then go, LRU
// first; pinned ones stay over it until unpinned.
//
// Thread-safe; handles may be dropped on any thread.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "server/backends/device_session.h"

namespace tensorcheck {

class ResidentCache {
 public:
  explicit ResidentCache(int64_t capacity_bytes);
  ~ResidentCache();
  ResidentCache(const ResidentCache&) = delete;
  ResidentCache& operator=(const ResidentCache&) = delete;

  // A pinned entry.
  class Handle {
   public:
    Handle(Handle&& other) noexcept;
    Handle& operator=(Handle&& other) noexcept;
    Handle(const Handle&) = delete;
    Handle& operator=(const Handle&) = delete;
    ~Handle();
    void* payload() const;
    int64_t bytes() const;

   private:
    friend class ResidentCache;
    struct Entry;
    Handle(ResidentCache* cache, std::shared_ptr<Entry> entry);
    void Release();
    ResidentCache* cache_ = nullptr;
    std::shared_ptr<Entry> entry_;
  };

  // The entry for `key`, pinned, and now the most recently used; nullopt
  // on a miss. Counts the hit or miss.
  std::optional<Handle> Find(const std::string& key);

  // Evicts unpinned entries, least recently used first, until `bytes`
  // more fit under the capacity. False (nothing evicted needlessly: it
  // stops once it fits) when they cannot fit even then.
  bool MakeRoom(int64_t bytes);

  // Adds `payload` of `bytes` under `key`, pinned. Nullopt when it does
  // not fit (after MakeRoom's eviction): the payload is then dropped (its
  // deleter runs) and the caller uses its own copy. When `key` is already
  // present (another request inserted it meanwhile) the present entry is
  // returned and `payload` dropped.
  std::optional<Handle> Insert(const std::string& key, std::shared_ptr<void> payload,
                               int64_t bytes);

  // Sets the capacity; evicts unpinned entries over it.
  void SetCapacity(int64_t bytes);

  // Evicts every unpinned entry (a device out of memory frees what it can).
  void EvictUnpinned();

  ResidentStats stats() const;

 private:
  using Lru = std::list<std::string>;  // front: most recently used
  // Evicts LRU unpinned entries until bytes_ + extra <= capacity_; true
  // when it then fits. mu_ held.
  bool EvictUntilFits(int64_t extra);
  void Unpin(const std::shared_ptr<Handle::Entry>& entry);

  mutable std::mutex mu_;
  int64_t capacity_ = 0;
  int64_t bytes_ = 0;
  int64_t hits_ = 0, misses_ = 0, evictions_ = 0;
  std::map<std::string, std::shared_ptr<Handle::Entry>> entries_;
  Lru lru_;
};

}  // namespace tensorcheck
