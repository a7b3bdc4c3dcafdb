#include "server/store/tensor_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>
#include <set>
#include <thread>
#include <vector>

#include "tests/testing/status_matchers.h"

namespace tensorcheck {
namespace {

using ::tensorcheck::testing::IsOk;
using ::tensorcheck::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string Bytes(size_t n, int seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 2654435761u + seed * 97u) >> 7);
  return s;
}

std::unique_ptr<TensorStore> Store(int64_t budget) {
  auto store = TensorStore::Create({budget, 0});
  EXPECT_THAT(store, IsOk());
  return std::move(store).value();
}

TEST(TensorStoreTest, PutThenGetReturnsTheBytes) {
  auto store = Store(1 << 20);
  const std::string b = Bytes(1000, 1);
  const Digest d = DigestOf(b);
  ASSERT_THAT(store->Put(d, b), IsOk());
  auto got = store->Get(d);
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(**got, b);
  EXPECT_EQ(store->stats().bytes_used, 1000);
  EXPECT_EQ(store->stats().tensors, 1);
}

TEST(TensorStoreTest, WrongSizeOrHashIsInvalidArgumentAndNothingIsStored) {
  auto store = Store(1 << 20);
  const std::string b = Bytes(1000, 1);
  Digest d = DigestOf(b);
  EXPECT_THAT(store->Put(Digest{d.hash, 999}, b),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("999 bytes declared")));
  std::string other = b;
  other[500] ^= 1;
  EXPECT_THAT(store->Put(d, other),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("nothing stored")));
  EXPECT_THAT(store->Get(d), StatusIs(absl::StatusCode::kNotFound, HasSubstr(d.ToString())));
  EXPECT_EQ(store->stats().bytes_used, 0);
}

TEST(TensorStoreTest, TheEmptyBlobIsAlwaysPresent) {
  auto store = Store(0);
  const Digest empty{kEmptySha256, 0};
  EXPECT_TRUE(store->FindMissing({empty}).empty());
  auto got = store->Get(empty);
  ASSERT_THAT(got, IsOk());
  EXPECT_TRUE((*got)->empty());
  EXPECT_THAT(store->Put(empty, ""), IsOk());
}

TEST(TensorStoreTest, LeastRecentlyUsedIsEvictedFirstAndFindMissingRefreshes) {
  auto store = Store(3000);
  std::vector<Digest> d;
  for (int i = 0; i < 3; ++i) {
    const std::string b = Bytes(1000, i);
    d.push_back(DigestOf(b));
    ASSERT_THAT(store->Put(d[i], b), IsOk());
  }
  // d0 is the oldest, but asking for it makes d1 the oldest.
  EXPECT_TRUE(store->FindMissing({d[0]}).empty());
  const std::string b3 = Bytes(1000, 3);
  ASSERT_THAT(store->Put(DigestOf(b3), b3), IsOk());
  EXPECT_THAT(store->FindMissing({d[0], d[1], d[2]}), ElementsAre(d[1]));
  EXPECT_EQ(store->stats().evictions, 1);
}

TEST(TensorStoreTest, PinnedTensorsAreNeverEvictedAndAFullPinnedStoreRefuses) {
  auto store = Store(2000);
  const std::string a = Bytes(1000, 1), b = Bytes(1000, 2), c = Bytes(1000, 3);
  auto pa = store->Put(DigestOf(a), a);
  auto pb = store->Put(DigestOf(b), b);
  ASSERT_THAT(pa, IsOk());
  ASSERT_THAT(pb, IsOk());
  EXPECT_THAT(store->Put(DigestOf(c), c),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("cannot be evicted")));
  EXPECT_EQ(store->stats().tensors, 2);
  EXPECT_EQ(store->stats().evictions, 0);
  pa->reset();  // a is unpinned now: it goes, b stays
  ASSERT_THAT(store->Put(DigestOf(c), c), IsOk());
  EXPECT_THAT(store->FindMissing({DigestOf(a), DigestOf(b)}), ElementsAre(DigestOf(a)));
  EXPECT_EQ(**pb, b);
}

TEST(TensorStoreTest, OverTheTensorLimitIsResourceExhausted) {
  auto store = TensorStore::Create({10000, 100});
  ASSERT_THAT(store, IsOk());
  const std::string b = Bytes(101, 1);
  EXPECT_THAT((*store)->Put(DigestOf(b), b),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("per stored tensor")));
  EXPECT_THAT(TensorStore::Create({100, 200}), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(TensorStoreTest, ConcurrentPutsOfOneTensorAreStoredOnce) {
  auto store = Store(1 << 20);
  const std::string b = Bytes(50000, 9);
  const Digest d = DigestOf(b);
  std::vector<std::thread> threads;
  std::vector<TensorStore::Blob> got(8);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      auto r = store->Put(d, b);
      if (r.ok()) got[t] = *r;
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& g : got) {
    ASSERT_NE(g, nullptr);
    EXPECT_EQ(g.get(), got[0].get());  // the same stored bytes
  }
  EXPECT_EQ(store->stats().bytes_used, 50000);
}

// Random puts, gets and releases under a tight budget from several threads:
// every byte served hashes to the digest asked for, and the budget holds.
TEST(TensorStoreTest, EvictionUnderPressureNeverServesAWrongTensor) {
  auto store = Store(20000);
  std::vector<std::string> blobs;
  std::vector<Digest> digests;
  for (int i = 0; i < 40; ++i) {
    blobs.push_back(Bytes(500 + 97 * i, i));
    digests.push_back(DigestOf(blobs.back()));
  }
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0}, served{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      std::vector<TensorStore::Blob> held;
      for (int step = 0; step < 3000; ++step) {
        const size_t i = rng() % blobs.size();
        if (rng() % 2) {
          auto r = store->Put(digests[i], blobs[i]);
          if (r.ok() && held.size() < 3) held.push_back(*r);
        } else if (auto r = store->Get(digests[i]); r.ok()) {
          ++served;
          if (DigestOf(**r) != digests[i]) ++wrong;
        }
        if (!held.empty() && rng() % 3 == 0) held.erase(held.begin());
        if (store->stats().bytes_used > 20000) ++wrong;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_GT(served.load(), 0);
  EXPECT_GT(store->stats().evictions, 0);
}

}  // namespace
}  // namespace tensorcheck
