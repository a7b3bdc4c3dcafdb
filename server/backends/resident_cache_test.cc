#include "server/backends/resident_cache.h"

#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace tensorcheck {
namespace {

// A payload that counts its frees, as a device allocation's deleter would.
std::shared_ptr<void> Payload(int* frees) {
  return std::shared_ptr<void>(new char[8], [frees](void* p) {
    delete[] static_cast<char*>(p);
    ++*frees;
  });
}

TEST(ResidentCacheTest, MissThenInsertThenHit) {
  ResidentCache cache(100);
  int frees = 0;
  EXPECT_FALSE(cache.Find("a").has_value());
  {
    std::optional<ResidentCache::Handle> h = cache.Insert("a", Payload(&frees), 40);
    ASSERT_TRUE(h.has_value());
    EXPECT_EQ(h->bytes(), 40);
  }
  std::optional<ResidentCache::Handle> again = cache.Find("a");
  ASSERT_TRUE(again.has_value());
  const ResidentStats s = cache.stats();
  EXPECT_EQ(s.entries, 1);
  EXPECT_EQ(s.bytes, 40);
  EXPECT_EQ(s.hits, 1);
  EXPECT_EQ(s.misses, 1);
  EXPECT_EQ(frees, 0);
}

TEST(ResidentCacheTest, EvictsLeastRecentlyUsedFirst) {
  ResidentCache cache(100);
  int frees_a = 0, frees_b = 0, frees_c = 0;
  cache.Insert("a", Payload(&frees_a), 40);
  cache.Insert("b", Payload(&frees_b), 40);
  cache.Find("a");  // b is now the least recently used
  ASSERT_TRUE(cache.MakeRoom(40));
  EXPECT_EQ(frees_b, 1);
  EXPECT_EQ(frees_a, 0);
  ASSERT_TRUE(cache.Insert("c", Payload(&frees_c), 40).has_value());
  EXPECT_TRUE(cache.Find("a").has_value());
  EXPECT_FALSE(cache.Find("b").has_value());
  EXPECT_EQ(cache.stats().evictions, 1);
  EXPECT_EQ(cache.stats().bytes, 80);
}

TEST(ResidentCacheTest, NeverEvictsAPinnedEntry) {
  ResidentCache cache(100);
  int frees_a = 0, frees_b = 0;
  std::optional<ResidentCache::Handle> a = cache.Insert("a", Payload(&frees_a), 70);
  ASSERT_TRUE(a.has_value());
  // 70 pinned + 40 > 100: no room, and the pinned entry stays.
  EXPECT_FALSE(cache.MakeRoom(40));
  EXPECT_FALSE(cache.Insert("b", Payload(&frees_b), 40).has_value());
  EXPECT_EQ(frees_b, 1);  // dropped: the caller keeps its own copy
  EXPECT_EQ(frees_a, 0);
  a.reset();  // unpinned: now it may go
  EXPECT_TRUE(cache.MakeRoom(40));
  EXPECT_EQ(frees_a, 1);
}

TEST(ResidentCacheTest, ShrunkCapacityIsMetWhenPinsGo) {
  ResidentCache cache(100);
  int frees = 0;
  std::optional<ResidentCache::Handle> a = cache.Insert("a", Payload(&frees), 60);
  cache.SetCapacity(50);  // a request reserved memory; `a` is in use
  EXPECT_EQ(cache.stats().bytes, 60);
  EXPECT_EQ(frees, 0);
  a.reset();
  EXPECT_EQ(cache.stats().bytes, 0);
  EXPECT_EQ(frees, 1);
}

TEST(ResidentCacheTest, SecondInsertOfAKeyReturnsTheFirst) {
  ResidentCache cache(100);
  int first = 0, second = 0;
  std::optional<ResidentCache::Handle> a = cache.Insert("a", Payload(&first), 30);
  std::optional<ResidentCache::Handle> b = cache.Insert("a", Payload(&second), 30);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(a->payload(), b->payload());
  EXPECT_EQ(second, 1);
  EXPECT_EQ(cache.stats().bytes, 30);
}

TEST(ResidentCacheTest, TooLargeNeverFits) {
  ResidentCache cache(100);
  int frees = 0;
  EXPECT_FALSE(cache.MakeRoom(101));
  EXPECT_FALSE(cache.Insert("big", Payload(&frees), 101).has_value());
  EXPECT_FALSE(cache.MakeRoom(-1));
  EXPECT_EQ(cache.stats().entries, 0);
}

TEST(ResidentCacheTest, EvictUnpinnedKeepsPinned) {
  ResidentCache cache(100);
  int frees_a = 0, frees_b = 0;
  std::optional<ResidentCache::Handle> a = cache.Insert("a", Payload(&frees_a), 30);
  cache.Insert("b", Payload(&frees_b), 30);
  cache.EvictUnpinned();
  EXPECT_EQ(frees_b, 1);
  EXPECT_EQ(frees_a, 0);
  EXPECT_EQ(cache.stats().capacity_bytes, 100);
}

TEST(ResidentCacheTest, ConcurrentUseKeepsTheBudget) {
  ResidentCache cache(1000);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&cache, t] {
      for (int i = 0; i < 500; ++i) {
        const std::string key = std::to_string((i * 7 + t) % 40);
        std::optional<ResidentCache::Handle> h = cache.Find(key);
        if (!h && cache.MakeRoom(100)) {
          h = cache.Insert(
              key,
              std::shared_ptr<void>(new char[1], [](void* p) { delete[] static_cast<char*>(p); }),
              100);
        }
        if (h) {
          EXPECT_NE(h->payload(), nullptr);
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const ResidentStats s = cache.stats();
  EXPECT_LE(s.bytes, 1000);
  EXPECT_EQ(s.bytes, 100 * s.entries);
  EXPECT_EQ(s.hits + s.misses, 4 * 500);
}

}  // namespace
}  // namespace tensorcheck
