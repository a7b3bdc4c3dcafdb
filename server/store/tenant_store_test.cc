#include "server/store/tenant_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/status_macros.h"
#include "server/store/internal/store_testing.h"
#include "tests/testing/status_matchers.h"

namespace tensorcheck {
namespace {

using ::tensorcheck::testing::IsOk;
using ::tensorcheck::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

using ::tensorcheck::internal::Bytes;
using ::tensorcheck::internal::Store;

// Uploads `bytes` in one chunk; whether the namespace had it already.
absl::StatusOr<bool> Upload(TenantStore* tenants, const StoreNamespace& ns,
                            const std::string& bytes, const std::string& id = "id") {
  const Digest d = DigestOf(bytes);
  bool present = false;
  TC_ASSIGN_OR_RETURN(auto up, tenants->StartUpload(ns, d, id, &present));
  if (present) return true;
  TC_RETURN_IF_ERROR(up->Write(0, bytes));
  TC_RETURN_IF_ERROR(up->Finish().status());
  tenants->Adopt(ns, d);
  return false;
}

const StoreNamespace kA{"team-a", 0};
const StoreNamespace kB{"team-b", 0};

TEST(TenantStoreTest, ATenantSeesOnlyWhatItStored) {
  auto store = Store(1 << 20);
  TenantStore tenants(store.get());
  const std::string w = Bytes(1000, 1);
  const Digest d = DigestOf(w);
  ASSERT_THAT(Upload(&tenants, kA, w), IsOk());

  EXPECT_THAT(tenants.FindMissing(kA, {d}), IsEmpty());
  EXPECT_THAT(tenants.FindMissing(kB, {d}), ElementsAre(d));
  ASSERT_THAT(tenants.Get(kA, d), IsOk());
  EXPECT_EQ(**tenants.Get(kA, d), w);
  // B is told what a digest no one stored is told, word for word.
  const Digest never = DigestOf(Bytes(1000, 2));
  const absl::Status b_status = tenants.Get(kB, d).status();
  std::string never_message(store->Get(never).status().message());
  never_message.replace(never_message.find(never.ToString()), never.ToString().size(),
                        d.ToString());
  EXPECT_THAT(b_status, StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(b_status.message(), never_message);
  // The whole-store namespace (no tenants) sees everything.
  EXPECT_THAT(tenants.FindMissing(StoreNamespace{}, {d}), IsEmpty());
}

TEST(TenantStoreTest, UploadingAnotherTenantsTensorTakesEveryByteAndSharesTheCopy) {
  auto store = Store(1 << 20);
  TenantStore tenants(store.get());
  const std::string w = Bytes(5000, 3);
  const Digest d = DigestOf(w);
  ASSERT_THAT(Upload(&tenants, kA, w), IsOk());
  // A again: present at once. B: not present (it must send the bytes).
  absl::StatusOr<bool> again = Upload(&tenants, kA, w);
  ASSERT_THAT(again, IsOk());
  EXPECT_TRUE(*again);
  bool present = true;
  auto up = tenants.StartUpload(kB, d, "id", &present);
  ASSERT_THAT(up, IsOk());
  EXPECT_FALSE(present);
  EXPECT_EQ(tenants.QueryUpload(kB, d, "id").complete, false);
  // A digest alone does not give B the tensor: wrong bytes fail.
  ASSERT_THAT((*up)->Write(0, Bytes(5000, 4)), IsOk());
  EXPECT_THAT((*up)->Finish(), StatusIs(absl::StatusCode::kInvalidArgument));
  up->reset();
  EXPECT_THAT(tenants.FindMissing(kB, {d}), ElementsAre(d));
  // The right bytes: B holds it, and the store keeps one copy.
  absl::StatusOr<bool> b_upload = Upload(&tenants, kB, w, "id2");
  ASSERT_THAT(b_upload, IsOk());
  EXPECT_FALSE(*b_upload);
  EXPECT_THAT(tenants.FindMissing(kB, {d}), IsEmpty());
  EXPECT_EQ(store->stats().tensors, 1);
  EXPECT_EQ(store->stats().bytes_used, 5000);
}

TEST(TenantStoreTest, UploadIdsArePerTenant) {
  auto store = Store(1 << 20);
  TenantStore tenants(store.get());
  const std::string w = Bytes(4000, 5);
  const Digest d = DigestOf(w);
  {
    bool present = false;
    auto up = tenants.StartUpload(kA, d, "shared-id", &present);
    ASSERT_THAT(up, IsOk());
    ASSERT_THAT((*up)->Write(0, w.substr(0, 1000)), IsOk());
  }  // interrupted: kept for A to resume
  EXPECT_EQ(tenants.QueryUpload(kA, d, "shared-id").committed, 1000);
  EXPECT_EQ(tenants.QueryUpload(kB, d, "shared-id").committed, 0);
  bool present = false;
  auto b = tenants.StartUpload(kB, d, "shared-id", &present);
  ASSERT_THAT(b, IsOk());
  EXPECT_EQ((*b)->committed(), 0);
}

TEST(TenantStoreTest, AQuotaDropsTheTenantsOwnOldestAndRefusesATensorOverIt) {
  auto store = Store(1 << 20);
  TenantStore tenants(store.get());
  const StoreNamespace a{"team-a", 2500};
  const std::string w1 = Bytes(1000, 6), w2 = Bytes(1000, 7), w3 = Bytes(1000, 8);
  ASSERT_THAT(Upload(&tenants, a, w1), IsOk());
  ASSERT_THAT(Upload(&tenants, a, w2), IsOk());
  ASSERT_THAT(Upload(&tenants, kB, w1), IsOk());  // B holds w1 too
  EXPECT_EQ(tenants.bytes_held(a), 2000);
  ASSERT_THAT(tenants.Get(a, DigestOf(w1)), IsOk());  // w1 now A's most recent
  ASSERT_THAT(Upload(&tenants, a, w3), IsOk());
  // 3000 > 2500: A's least recently used (w2) went; it was no one else's,
  // so it left the store; w1 stays, for A and for B.
  EXPECT_THAT(tenants.FindMissing(a, {DigestOf(w1), DigestOf(w2), DigestOf(w3)}),
              ElementsAre(DigestOf(w2)));
  EXPECT_EQ(tenants.bytes_held(a), 2000);
  EXPECT_EQ(tenants.usage(a).tensors, 2);
  EXPECT_EQ(tenants.usage(a).largest, 1000);
  EXPECT_EQ(tenants.usage(kB).tensors, 1);
  EXPECT_FALSE(store->Holds(DigestOf(w2)));
  EXPECT_THAT(tenants.FindMissing(kB, {DigestOf(w1)}), IsEmpty());
  // A tensor over the quota by itself.
  bool present = false;
  const std::string big = Bytes(3000, 9);
  EXPECT_THAT(tenants.StartUpload(a, DigestOf(big), "id", &present),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(tenants.Put(a, DigestOf(big), std::string(big), /*persist=*/false),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(tenants.max_tensor_bytes(a), 2500);
}

TEST(TenantStoreTest, AnEvictedTensorIsMissingForItsTenantAndNoLongerCharged) {
  auto store = Store(2000);  // room for two of these
  TenantStore tenants(store.get());
  const std::string w1 = Bytes(1000, 10), w2 = Bytes(1000, 11), w3 = Bytes(1000, 12);
  ASSERT_THAT(Upload(&tenants, kA, w1), IsOk());
  ASSERT_THAT(Upload(&tenants, kA, w2), IsOk());
  ASSERT_THAT(Upload(&tenants, kB, w3), IsOk());  // evicts w1 (the store's oldest)
  EXPECT_THAT(tenants.FindMissing(kA, {DigestOf(w1), DigestOf(w2)}), ElementsAre(DigestOf(w1)));
  EXPECT_THAT(tenants.Get(kA, DigestOf(w1)), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(tenants.bytes_held(kA), 1000);
}

TEST(TenantStoreTest, OutputsPutForATenantAreItsAlone) {
  auto store = Store(1 << 20);
  TenantStore tenants(store.get());
  const std::string out = Bytes(3000, 13);
  ASSERT_THAT(tenants.Put(kA, DigestOf(out), std::string(out), /*persist=*/false), IsOk());
  EXPECT_THAT(tenants.Get(kA, DigestOf(out)), IsOk());
  EXPECT_THAT(tenants.Get(kB, DigestOf(out)), StatusIs(absl::StatusCode::kNotFound));
}

// What the probe did: a tenant with a small quota starts uploads and
// abandons them half way, again and again.
TEST(TenantStoreTest, AbandonedUploadsCountAgainstTheQuotaAndEvictNoOneElse) {
  constexpr int64_t kMiB = 1 << 20;
  auto store = Store(32 * kMiB);
  TenantStore tenants(store.get());
  const StoreNamespace a{"team-a", 4 * kMiB};
  // Another tenant's 20 MiB.
  std::vector<Digest> others;
  for (int i = 0; i < 5; ++i) {
    const std::string t = Bytes(4 * kMiB, 100 + i);
    ASSERT_THAT(Upload(&tenants, kB, t, "b" + std::to_string(i)), IsOk());
    others.push_back(DigestOf(t));
  }
  int started = 0;
  int refused = 0;
  for (int i = 0; i < 16; ++i) {
    const std::string t = Bytes(2 * kMiB, 200 + i);
    bool present = false;
    auto up = tenants.StartUpload(a, DigestOf(t), "a" + std::to_string(i), &present);
    if (!up.ok()) {
      EXPECT_THAT(up.status(),
                  StatusIs(absl::StatusCode::kResourceExhausted,
                           ::testing::HasSubstr("uploads in progress or interrupted")));
      // Its own share, never the store's.
      EXPECT_THAT(std::string(up.status().message()),
                  ::testing::Not(::testing::HasSubstr(std::to_string(32 * kMiB))));
      ++refused;
      continue;
    }
    ++started;
    ASSERT_THAT((*up)->Write(0, absl::string_view(t).substr(0, kMiB)), IsOk());
    // Dropped unfinished: kept for resuming, holding the 1 MiB it received.
  }
  // 1 MiB each, and a new one reserves its 2 MiB: three fit 4 MiB.
  EXPECT_EQ(started, 3);
  EXPECT_EQ(refused, 13);
  EXPECT_EQ(store->stats().partial_bytes, 3 * kMiB);
  EXPECT_THAT(tenants.FindMissing(kB, others), IsEmpty());  // nothing of B's evicted
  // B still uploads: the store has room.
  EXPECT_THAT(Upload(&tenants, kB, Bytes(4 * kMiB, 300), "b-more"), IsOk());
  // Resuming one of A's own is no new charge.
  const std::string first = Bytes(2 * kMiB, 200);
  bool present = false;
  auto resumed = tenants.StartUpload(a, DigestOf(first), "a0", &present);
  ASSERT_THAT(resumed, IsOk());
  EXPECT_EQ((*resumed)->committed(), kMiB);
  ASSERT_THAT((*resumed)->Write(kMiB, absl::string_view(first).substr(kMiB)), IsOk());
  ASSERT_THAT((*resumed)->Finish(), IsOk());
  tenants.Adopt(a, DigestOf(first));
  EXPECT_EQ(tenants.bytes_held(a), 2 * kMiB);
}

TEST(TenantStoreTest, AnUploadDropsTheTenantsOwnOldestTensorsToFitBesideItsOtherUploads) {
  constexpr int64_t kMiB = 1 << 20;
  auto store = Store(32 * kMiB);
  TenantStore tenants(store.get());
  const StoreNamespace a{"team-a", 4 * kMiB};
  const std::string old1 = Bytes(kMiB, 1), old2 = Bytes(kMiB, 2);
  ASSERT_THAT(Upload(&tenants, a, old1, "o1"), IsOk());
  ASSERT_THAT(Upload(&tenants, a, old2, "o2"), IsOk());
  // An upload in progress of 2 MiB: 4 MiB charged, the quota.
  const std::string writing = Bytes(2 * kMiB, 3);
  bool present = false;
  auto up = tenants.StartUpload(a, DigestOf(writing), "w", &present);
  ASSERT_THAT(up, IsOk());
  // One more MiB: the oldest stored tensor makes room, not the upload.
  ASSERT_THAT(Upload(&tenants, a, Bytes(kMiB, 4), "n"), IsOk());
  EXPECT_THAT(tenants.FindMissing(a, {DigestOf(old1), DigestOf(old2)}),
              ElementsAre(DigestOf(old1)));
  ASSERT_THAT((*up)->Write(0, writing), IsOk());
  ASSERT_THAT((*up)->Finish(), IsOk());
  tenants.Adopt(a, DigestOf(writing));
  EXPECT_LE(tenants.bytes_held(a), 4 * kMiB);
}

}  // namespace
}  // namespace tensorcheck
