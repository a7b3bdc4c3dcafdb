#include "server/store/tensor_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/status_macros.h"
#include "server/store/internal/store_testing.h"
#include "tests/testing/status_matchers.h"

namespace tensorcheck {
namespace {

using ::tensorcheck::testing::IsOk;
using ::tensorcheck::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

using ::tensorcheck::internal::Bytes;
using ::tensorcheck::internal::Store;

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

TEST(TensorStoreTest, LookupsByDigestCountHitsAndMisses) {
  auto store = Store(3000);
  const std::string a = Bytes(1000, 1), b = Bytes(1000, 2);
  ASSERT_THAT(store->Put(DigestOf(a), a), IsOk());
  EXPECT_EQ(store->stats().hits, 0);  // storing is no lookup
  EXPECT_EQ(store->stats().misses, 0);
  EXPECT_THAT(store->Get(DigestOf(a)), IsOk());                                 // hit
  EXPECT_THAT(store->Get(DigestOf(b)), StatusIs(absl::StatusCode::kNotFound));  // miss
  // One per digest asked about: a hit, a miss, a hit.
  EXPECT_THAT(store->FindMissing({DigestOf(a), DigestOf(b), DigestOf(a)}),
              ElementsAre(DigestOf(b)));
  EXPECT_EQ(store->stats().hits, 3);
  EXPECT_EQ(store->stats().misses, 2);
}

TEST(TensorStoreTest, AFullStoresRefusalDoesNotSayHowMuchItHolds) {
  // The same refusal whether 1500 or 1900 bytes are held: the figure would
  // tell a tenant of another's uploads and holdings.
  std::vector<std::string> messages;
  for (int held : {1500, 1900}) {
    auto store = Store(2000);
    const std::string a = Bytes(held, 1), c = Bytes(1000, 3);
    auto pa = store->Put(DigestOf(a), a);
    ASSERT_THAT(pa, IsOk());
    absl::StatusOr<TensorStore::Blob> refused = store->Put(DigestOf(c), c);
    ASSERT_THAT(refused, StatusIs(absl::StatusCode::kResourceExhausted));
    EXPECT_THAT(std::string(refused.status().message()), Not(HasSubstr(std::to_string(held))));
    messages.emplace_back(refused.status().message());
  }
  EXPECT_EQ(messages[0], messages[1]);
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

// Uploads `bytes` in chunks of `chunk`; the stored blob.
absl::StatusOr<TensorStore::Blob> UploadAll(TensorStore& store, const std::string& bytes,
                                            size_t chunk, const std::string& id = "u1") {
  bool present = false;
  TC_ASSIGN_OR_RETURN(auto up, store.StartUpload(DigestOf(bytes), id, &present));
  if (present) return store.Get(DigestOf(bytes));
  for (size_t off = up->committed(); off < bytes.size(); off += chunk) {
    TC_RETURN_IF_ERROR(
        up->Write(static_cast<int64_t>(off), absl::string_view(bytes).substr(off, chunk)));
  }
  return up->Finish();
}

TEST(TensorStoreUploadTest, ChunksInOrderStoreTheTensorAndCountIt) {
  auto store = Store(1 << 20);
  for (size_t n : {1ul, 7ul, 4096ul, 100003ul}) {
    const std::string b = Bytes(n, static_cast<int>(n));
    auto blob = UploadAll(*store, b, 4096);
    ASSERT_THAT(blob, IsOk());
    EXPECT_EQ(**blob, b);
    EXPECT_THAT(store->FindMissing({DigestOf(b)}), ::testing::IsEmpty());
  }
  const TensorStore::Stats s = store->stats();
  EXPECT_EQ(s.uploads, 4);
  EXPECT_EQ(s.uploaded_bytes, 1 + 7 + 4096 + 100003);
  EXPECT_EQ(s.partial_uploads, 0);
  EXPECT_EQ(s.bytes_used, 1 + 7 + 4096 + 100003);
}

TEST(TensorStoreUploadTest, AnUploadOfATensorPresentEndsAtOnce) {
  auto store = Store(1 << 20);
  const std::string b = Bytes(5000, 3);
  ASSERT_THAT(store->Put(DigestOf(b), b), IsOk());
  bool present = false;
  auto up = store->StartUpload(DigestOf(b), "x", &present);
  ASSERT_THAT(up, IsOk());
  EXPECT_TRUE(present);
  EXPECT_EQ(*up, nullptr);
  EXPECT_EQ(store->stats().uploads, 0);  // nothing was uploaded
  present = false;
  ASSERT_THAT(store->StartUpload(DigestOf(""), "x", &present), IsOk());
  EXPECT_TRUE(present);  // the empty blob
}

TEST(TensorStoreUploadTest, OutOfOrderOverlappingAndOversizedChunksAreRefusedAndNothingIsLost) {
  auto store = Store(1 << 20);
  const std::string b = Bytes(1000, 4);
  bool present = false;
  auto up = store->StartUpload(DigestOf(b), "u", &present);
  ASSERT_THAT(up, IsOk());
  ASSERT_THAT((*up)->Write(0, b.substr(0, 400)), IsOk());
  EXPECT_THAT((*up)->Write(500, b.substr(500, 100)),  // a gap
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("400 expected")));
  EXPECT_THAT((*up)->Write(300, b.substr(300, 200)),  // an overlap
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("got 300")));
  EXPECT_THAT((*up)->Write(400, b.substr(400) + "xy"),  // past the size
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("pass the declared size")));
  EXPECT_EQ((*up)->committed(), 400);
  EXPECT_THAT((*up)->Finish(),  // the stream ended early: kept
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("resume at offset 400")));
  ASSERT_THAT((*up)->Write(400, b.substr(400)), IsOk());
  auto blob = (*up)->Finish();
  ASSERT_THAT(blob, IsOk());
  EXPECT_EQ(**blob, b);
}

TEST(TensorStoreUploadTest, AMismatchedHashStoresNothingAndFreesTheUpload) {
  auto store = Store(1 << 20);
  const std::string b = Bytes(1000, 5);
  std::string wrong = b;
  wrong[999] ^= 1;
  bool present = false;
  auto up = store->StartUpload(DigestOf(b), "u", &present);
  ASSERT_THAT(up, IsOk());
  ASSERT_THAT((*up)->Write(0, wrong), IsOk());
  EXPECT_THAT((*up)->Finish(), StatusIs(absl::StatusCode::kInvalidArgument,
                                        HasSubstr("hash to " + DigestOf(wrong).ToString())));
  up->reset();
  EXPECT_THAT(store->FindMissing({DigestOf(b)}), ElementsAre(DigestOf(b)));
  EXPECT_EQ(store->stats().bytes_used, 0);
  EXPECT_EQ(store->stats().partial_uploads, 0);
  EXPECT_EQ(store->QueryUpload(DigestOf(b), "u").committed, 0);
}

TEST(TensorStoreUploadTest, AnInterruptedUploadResumesWhereItStopped) {
  auto store = Store(1 << 20);
  const std::string b = Bytes(10000, 6);
  const Digest d = DigestOf(b);
  {
    bool present = false;
    auto up = store->StartUpload(d, "resume-me", &present);
    ASSERT_THAT(up, IsOk());
    ASSERT_THAT((*up)->Write(0, b.substr(0, 6000)), IsOk());
    // A second stream on the same id while this one lives.
    EXPECT_THAT(store->StartUpload(d, "resume-me", &present), StatusIs(absl::StatusCode::kAborted));
  }  // the stream broke
  EXPECT_EQ(store->QueryUpload(d, "resume-me").committed, 6000);
  EXPECT_FALSE(store->QueryUpload(d, "resume-me").complete);
  EXPECT_EQ(store->QueryUpload(d, "another-id").committed, 0);
  EXPECT_EQ(store->stats().partial_bytes, 6000);
  EXPECT_EQ(store->stats().bytes_used, 6000);  // a stalled upload holds what it sent
  bool present = false;
  auto up = store->StartUpload(d, "resume-me", &present);
  ASSERT_THAT(up, IsOk());
  EXPECT_EQ((*up)->committed(), 6000);
  EXPECT_EQ(store->stats().bytes_used, 10000);  // resumed: its size again
  EXPECT_THAT((*up)->Write(0, b.substr(0, 10)), StatusIs(absl::StatusCode::kInvalidArgument));
  ASSERT_THAT((*up)->Write(6000, b.substr(6000)), IsOk());
  auto blob = (*up)->Finish();
  ASSERT_THAT(blob, IsOk());
  EXPECT_EQ(**blob, b);
  EXPECT_TRUE(store->QueryUpload(d, "resume-me").complete);
  EXPECT_EQ(store->QueryUpload(d, "resume-me").committed, 10000);
}

TEST(TensorStoreUploadTest, AnAbandonedUploadIsFreedAfterTheTimeToLive) {
  TensorStore::Options o;
  o.budget_bytes = 1 << 20;
  o.partial_upload_ttl = absl::Seconds(60);
  auto store = TensorStore::Create(o);
  ASSERT_THAT(store, IsOk());
  const std::string b = Bytes(300000, 7);
  {
    bool present = false;
    auto up = (*store)->StartUpload(DigestOf(b), "gone", &present);
    ASSERT_THAT(up, IsOk());
    ASSERT_THAT((*up)->Write(0, b.substr(0, 100000)), IsOk());
    // A live upload never expires.
    EXPECT_EQ((*store)->ExpirePartialUploads(absl::Now() + absl::Hours(1)), 0);
  }
  // Waiting to be resumed, it holds only what arrived, not its size.
  EXPECT_EQ((*store)->stats().bytes_used, 100000);
  EXPECT_EQ((*store)->ExpirePartialUploads(absl::Now() + absl::Seconds(30)), 0);
  EXPECT_EQ((*store)->ExpirePartialUploads(absl::Now() + absl::Seconds(61)), 1);
  const TensorStore::Stats s = (*store)->stats();
  EXPECT_EQ(s.partial_uploads, 0);
  EXPECT_EQ(s.partial_bytes, 0);
  EXPECT_EQ(s.bytes_used, 0);
}

TEST(TensorStoreUploadTest, UploadsReserveTheBudgetAndNeverEvictWhatIsPinned) {
  auto store = Store(3000);
  const std::string a = Bytes(1000, 1), b = Bytes(1500, 2), c = Bytes(1000, 3);
  auto pa = store->Put(DigestOf(a), a);  // pinned by pa
  ASSERT_THAT(pa, IsOk());
  bool present = false;
  auto ub = store->StartUpload(DigestOf(b), "b", &present);  // reserves 1500
  ASSERT_THAT(ub, IsOk());
  auto uc = store->StartUpload(DigestOf(c), "c", &present);
  EXPECT_THAT(uc, StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("retry later")));
  EXPECT_EQ(store->stats().evictions, 0);
  EXPECT_EQ(**pa, a);
  TensorStore::Options tiny;
  tiny.budget_bytes = 3000;
  tiny.max_tensor_bytes = 100;
  auto small = TensorStore::Create(tiny);
  ASSERT_THAT(small, IsOk());
  EXPECT_THAT((*small)->StartUpload(DigestOf(a), "a", &present),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("per stored tensor")));
}

TEST(TensorStoreUploadTest, ConcurrentUploadsOfOneTensorAreStoredOnce) {
  auto store = Store(1 << 22);
  const std::string b = Bytes(200000, 8);
  std::vector<std::thread> threads;
  std::vector<TensorStore::Blob> got(6);
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      auto r = UploadAll(*store, b, 8192, "id" + std::to_string(t));
      if (r.ok()) got[t] = *r;
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& g : got) {
    ASSERT_NE(g, nullptr);
    EXPECT_EQ(g.get(), got[0].get());
  }
  EXPECT_EQ(store->stats().bytes_used, 200000);
  EXPECT_EQ(store->stats().tensors, 1);
  EXPECT_EQ(store->stats().partial_uploads, 0);
}

TEST(TensorStorePersistenceTest, ARestartKeepsEveryAcknowledgedTensorAndDropsACorruptFile) {
  const std::string path = ::testing::TempDir() + "/store-restart-" + std::to_string(getpid());
  std::filesystem::remove_all(path);
  const std::string a = Bytes(5000, 1), b = Bytes(70000, 2), c = Bytes(3, 3);
  {
    auto dir = StoreDir::Open(path);
    ASSERT_THAT(dir, IsOk());
    auto store = TensorStore::Create({1 << 20, 0}, std::move(dir).value());
    ASSERT_THAT(store, IsOk());
    ASSERT_THAT((*store)->Put(DigestOf(a), a), IsOk());
    ASSERT_THAT(UploadAll(**store, b, 4096), IsOk());  // acknowledged once Finish returns
    ASSERT_THAT(UploadAll(**store, c, 1), IsOk());
    // A returned output is not worth keeping.
    ASSERT_THAT((*store)->Put(DigestOf("output"), "output", /*persist=*/false), IsOk());
    EXPECT_TRUE((*store)->persistent());
  }
  {
    std::vector<StoreDir::Dropped> dropped;
    auto dir = StoreDir::Open(path);
    ASSERT_THAT(dir, IsOk());
    auto store = TensorStore::Create({1 << 20, 0}, std::move(dir).value(), &dropped);
    ASSERT_THAT(store, IsOk());
    EXPECT_TRUE(dropped.empty());
    for (const std::string* t : {&a, &b, &c}) {
      auto got = (*store)->Get(DigestOf(*t));
      ASSERT_THAT(got, IsOk());
      EXPECT_EQ(**got, *t);
    }
    EXPECT_THAT((*store)->Get(DigestOf("output")), StatusIs(absl::StatusCode::kNotFound));
  }
  // One flipped byte in b's file: dropped when first read, never served.
  {
    const std::string file = path + "/" + StoreDir::FileName(DigestOf(b));
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good()) << file;
    f.seekp(1234);
    f.put(static_cast<char>(b[1234] ^ 1));
  }
  std::vector<StoreDir::Dropped> dropped, later;
  auto dir = StoreDir::Open(path);
  ASSERT_THAT(dir, IsOk());
  TensorStore::Options options{1 << 20, 0};
  options.on_dropped = [&later](const StoreDir::Dropped& d) { later.push_back(d); };
  auto store = TensorStore::Create(options, std::move(dir).value(), &dropped);
  ASSERT_THAT(store, IsOk());
  EXPECT_TRUE(dropped.empty());  // not read at start
  EXPECT_THAT((*store)->Get(DigestOf(b)), StatusIs(absl::StatusCode::kNotFound));
  ASSERT_EQ(later.size(), 1u);
  EXPECT_THAT(later[0].path, HasSubstr(DigestOf(b).hash));
  EXPECT_THAT((*store)->FindMissing({DigestOf(a), DigestOf(b), DigestOf(c)}),
              ElementsAre(DigestOf(b)));
  std::filesystem::remove_all(path);
}

// A store directory restarted in tests: TensorStores over it, one at a
// time, each reporting what it dropped.
class RestartTest : public ::testing::Test {
 protected:
  static constexpr int64_t kSize = 1000;

  void SetUp() override {
    static std::atomic<int> n{0};
    path_ = ::testing::TempDir() + "/store-restart-" + std::to_string(getpid()) + "-" +
            std::to_string(n.fetch_add(1));
    std::filesystem::remove_all(path_);
  }
  void TearDown() override { std::filesystem::remove_all(path_); }

  // A store over the directory with `budget`; `dropped` gets what Create
  // dropped, later_ what Gets drop, dir_ the StoreDir.
  std::unique_ptr<TensorStore> Open(int64_t budget,
                                    std::vector<StoreDir::Dropped>* dropped = nullptr) {
    auto dir = StoreDir::Open(path_);
    EXPECT_THAT(dir, IsOk());
    if (!dir.ok()) return nullptr;
    dir_ = dir->get();
    TensorStore::Options options{budget, 0};
    options.on_dropped = [this](const StoreDir::Dropped& d) {
      std::lock_guard<std::mutex> lock(mu_);
      later_.push_back(d);
    };
    auto store = TensorStore::Create(options, std::move(dir).value(), dropped);
    EXPECT_THAT(store, IsOk());
    return store.ok() ? std::move(store).value() : nullptr;
  }

  bool OnDisk(const Digest& d) const {
    return std::filesystem::exists(path_ + "/" + StoreDir::FileName(d));
  }

  // Stores 8 tensors of kSize bytes, then uses them in the order kUse
  // (least recently used first), some by Get, some by FindMissing; the
  // store is closed (as by a restart) when this returns.
  std::vector<Digest> StoreEightAndUseThem() {
    std::vector<Digest> d;
    auto store = Open(8 * kSize);
    if (store == nullptr) return d;
    for (int i = 0; i < 8; ++i) {
      const std::string b = Bytes(kSize, 100 + i);
      d.push_back(DigestOf(b));
      EXPECT_THAT(store->Put(d[i], b), IsOk());
    }
    for (int i : kUse) {
      if (i % 2 == 0) {
        EXPECT_THAT(store->Get(d[i]), IsOk());
      } else {
        EXPECT_TRUE(store->FindMissing({d[i]}).empty());
      }
    }
    return d;
  }

  static constexpr int kUse[8] = {3, 0, 6, 1, 7, 2, 5, 4};

  // Stores `tensors` (closed again, as by a restart, when this returns).
  void StoreAll(int64_t budget, const std::vector<std::string>& tensors) {
    auto store = Open(budget);
    ASSERT_NE(store, nullptr);
    for (const std::string& t : tensors) ASSERT_THAT(store->Put(DigestOf(t), t), IsOk());
  }

  // Corrupts the file of the stored `tensor`: its byte `at` XOR `mask`.
  void FlipByte(const std::string& tensor, size_t at, char mask) {
    std::fstream f(path_ + "/" + StoreDir::FileName(DigestOf(tensor)),
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(at));
    f.put(static_cast<char>(tensor[at] ^ mask));
  }

  std::string path_;
  StoreDir* dir_ = nullptr;  // the open store's
  std::mutex mu_;
  std::vector<StoreDir::Dropped> later_;  // guarded by mu_
};

TEST_F(RestartTest, ARestartKeepsTheMostRecentlyUsedAndDeletesTheFilesOfTheRest) {
  const std::vector<Digest> d = StoreEightAndUseThem();
  ASSERT_EQ(d.size(), 8u);
  {
    std::vector<StoreDir::Dropped> dropped;
    auto store = Open(8 * kSize, &dropped);  // the same budget: all of them
    ASSERT_NE(store, nullptr);
    EXPECT_TRUE(dropped.empty());
    for (const Digest& x : d) EXPECT_TRUE(store->Holds(x));
    EXPECT_EQ(store->stats().bytes_used, 8 * kSize);
  }
  std::vector<StoreDir::Dropped> dropped;
  auto store = Open(3 * kSize, &dropped);  // room for 3: the last 3 used
  ASSERT_NE(store, nullptr);
  std::set<int> kept, files;
  for (int i = 0; i < 8; ++i) {
    if (store->Holds(d[i])) kept.insert(i);
    if (OnDisk(d[i])) files.insert(i);
  }
  EXPECT_EQ(kept, (std::set<int>{kUse[5], kUse[6], kUse[7]}));
  EXPECT_EQ(files, kept);  // the others deleted, and reported
  ASSERT_EQ(dropped.size(), 5u);
  for (const auto& x : dropped) EXPECT_THAT(x.reason, HasSubstr("evicted at start"));
  EXPECT_EQ(store->stats().evictions, 5);
  EXPECT_EQ(store->stats().bytes_used, 3 * kSize);
  for (int i : kept) EXPECT_THAT(store->Get(d[i]), IsOk());
}

TEST_F(RestartTest, AfterARestartTheLeastRecentlyUsedBeforeItIsEvictedFirst) {
  const std::vector<Digest> d = StoreEightAndUseThem();
  ASSERT_EQ(d.size(), 8u);
  auto store = Open(8 * kSize);
  ASSERT_NE(store, nullptr);
  for (int n = 0; n < 2; ++n) {
    const std::string b = Bytes(kSize, 200 + n);
    ASSERT_THAT(store->Put(DigestOf(b), b), IsOk());
  }
  // Not the newest (the most recently written, or used): the first two used.
  EXPECT_THAT(store->FindMissing(d), ElementsAre(d[kUse[1]], d[kUse[0]]));
  EXPECT_FALSE(OnDisk(d[kUse[0]]));
  EXPECT_FALSE(OnDisk(d[kUse[1]]));
}

TEST_F(RestartTest, StartReadsNoFileAndACorruptOneIsDroppedAtItsFirstGet) {
  const std::string a = Bytes(5000, 1), b = Bytes(7000, 2);
  ASSERT_NO_FATAL_FAILURE(StoreAll(1 << 20, {a, b}));
  FlipByte(b, 4321, 1);
  std::vector<StoreDir::Dropped> dropped;
  auto store = Open(1 << 20, &dropped);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(dir_->bytes_read(), 0);
  EXPECT_TRUE(dropped.empty());
  EXPECT_EQ(store->stats().tensors, 2);
  EXPECT_EQ(store->stats().unread, 2);
  // Present until read: a request then finds it missing, as if evicted.
  EXPECT_TRUE(store->FindMissing({DigestOf(a), DigestOf(b)}).empty());
  EXPECT_THAT(store->Get(DigestOf(b)),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("not in the store")));
  EXPECT_FALSE(OnDisk(DigestOf(b)));
  ASSERT_EQ(later_.size(), 1u);
  EXPECT_THAT(later_[0].path, HasSubstr(DigestOf(b).hash));
  EXPECT_THAT(later_[0].reason, HasSubstr("corrupt"));
  EXPECT_THAT(store->FindMissing({DigestOf(a), DigestOf(b)}), ElementsAre(DigestOf(b)));
  EXPECT_EQ(store->stats().bytes_used, 5000);
  // The good one is read once, at its first Get.
  for (int n = 0; n < 2; ++n) {
    auto got = store->Get(DigestOf(a));
    ASSERT_THAT(got, IsOk());
    EXPECT_EQ(**got, a);
  }
  EXPECT_EQ(dir_->bytes_read(), 5000 + 7000);
  EXPECT_EQ(store->stats().unread, 0);
}

TEST_F(RestartTest, ConcurrentFirstGetsReadOnceAndNeverServeACorruptFile) {
  const std::string good = Bytes(1 << 20, 3), bad = Bytes(1 << 20, 4);
  ASSERT_NO_FATAL_FAILURE(StoreAll(8 << 20, {good, bad}));
  FlipByte(bad, 777777, 0x40);
  auto store = Open(8 << 20);
  ASSERT_NE(store, nullptr);
  std::atomic<int> served_bad{0}, wrong_good{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int n = 0; n < 4; ++n) {
        if (store->Get(DigestOf(bad)).ok()) ++served_bad;
        auto g = store->Get(DigestOf(good));
        if (!g.ok() || **g != good) ++wrong_good;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(served_bad.load(), 0);
  EXPECT_EQ(wrong_good.load(), 0);
  EXPECT_EQ(dir_->bytes_read(), 2 << 20);  // each file read once
  EXPECT_EQ(later_.size(), 1u);
  EXPECT_EQ(store->stats().hits, 32);
  EXPECT_EQ(store->stats().misses, 32);
}

TEST_F(RestartTest, StoringATensorNotReadYetServesTheBytesStored) {
  const std::string a = Bytes(3000, 5);
  {
    auto store = Open(1 << 20);
    ASSERT_NE(store, nullptr);
    ASSERT_THAT(store->Put(DigestOf(a), a), IsOk());
  }
  {
    std::fstream f(path_ + "/" + StoreDir::FileName(DigestOf(a)),
                   std::ios::in | std::ios::out | std::ios::binary);
    f.put(static_cast<char>(a[0] ^ 1));
  }
  auto store = Open(1 << 20);
  ASSERT_NE(store, nullptr);
  // As a tenant storing it does (tenant_store.h): every byte, verified.
  bool present = false;
  auto up =
      store->StartUpload(DigestOf(a), "again", &present, TensorStore::IfPresent::kUploadAnyway);
  ASSERT_THAT(up, IsOk());
  ASSERT_NE(*up, nullptr);
  ASSERT_THAT((*up)->Write(0, a), IsOk());
  ASSERT_THAT((*up)->Finish(), IsOk());
  auto got = store->Get(DigestOf(a));
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(**got, a);
  EXPECT_EQ(dir_->bytes_read(), 0);
  EXPECT_EQ(store->stats().bytes_used, 3000);
}

}  // namespace
}  // namespace tensorcheck
