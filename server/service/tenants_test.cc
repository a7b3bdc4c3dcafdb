#include "server/service/tenants.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "tests/testing/status_matchers.h"

namespace tensorcheck {
namespace {

using ::tensorcheck::testing::IsOk;
using ::tensorcheck::testing::StatusIs;
using ::testing::HasSubstr;

// FIPS 180-2's example: SHA-256("abc").
constexpr char kAbcSha256[] = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";

std::string File(const std::string& tenants) { return "{\"tenants\": [" + tenants + "]}"; }

TEST(TenantsTest, TokensAreKeptAsTheirSha256) { EXPECT_EQ(TokenSha256Hex("abc"), kAbcSha256); }

TEST(TenantsTest, ATokenFindsItsTenantAndAnUnknownOneNone) {
  auto tenants = Tenants::Parse(
      File(std::string(R"({"name": "team-a", "token_sha256": [")") + kAbcSha256 +
           R"("], "rights": ["verify"], "quota": {"stored_bytes": 1000, "concurrent_requests": 2,
          "requests_per_minute": 60}},
         {"name": "team-b", "token_sha256": [")" +
           TokenSha256Hex("b-token") + "\", \"" + TokenSha256Hex("b-second") + "\"]}"));
  ASSERT_THAT(tenants, IsOk());
  auto a = (*tenants)->FindByToken("abc");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->name, "team-a");
  EXPECT_TRUE(a->Allows(Right::kVerify));
  EXPECT_FALSE(a->Allows(Right::kStore));
  EXPECT_EQ(a->quota.stored_bytes, 1000);
  EXPECT_EQ(a->quota.concurrent_requests, 2);
  EXPECT_EQ(a->quota.requests_per_minute, 60);
  ASSERT_NE((*tenants)->FindByToken("b-second"), nullptr);
  EXPECT_EQ((*tenants)->FindByToken("b-second")->name, "team-b");
  // No rights listed: all of them.
  EXPECT_TRUE((*tenants)->FindByToken("b-token")->Allows(Right::kReflection));
  EXPECT_EQ((*tenants)->FindByToken("abd"), nullptr);
  EXPECT_EQ((*tenants)->FindByToken(""), nullptr);
  // The hash is not a token.
  EXPECT_EQ((*tenants)->FindByToken(kAbcSha256), nullptr);
}

TEST(TenantsTest, MalformedFilesAreInvalidArgumentNamingTheField) {
  const std::string h = kAbcSha256;
  const std::pair<std::string, std::string> cases[] = {
      {"not json", "not JSON"},
      {R"({"tenant": []})", "unknown key(s) tenant"},
      {File(R"({"name": "a b", "token_sha256": [")" + h + "\"]}"), "tenants[0].name"},
      {File(R"({"name": "a", "token_sha256": ["abc"]})"), "tenants[0].token_sha256[0]"},
      {File(R"({"name": "a", "token_sha256": []})"), "tenants[0].token_sha256"},
      {File(R"({"name": "a", "token_sha256": [")" + h + R"("]}, {"name": "a", "token_sha256": [")" +
            TokenSha256Hex("x") + "\"]}"),
       "tenants[1].name: 'a' is named twice"},
      {File(R"({"name": "a", "token_sha256": [")" + h + R"("]}, {"name": "b", "token_sha256": [")" +
            h + "\"]}"),
       "tenants[1].token_sha256[0]: the same token is also tenant 'a'"},
      {File(R"({"name": "a", "token_sha256": [")" + h + R"("], "rights": ["write"]})"),
       "tenants[0].rights[0]"},
      {File(R"({"name": "a", "token_sha256": [")" + h + R"("], "quota": {"stored_bytes": -1}})"),
       "tenants[0].quota.stored_bytes"},
      {File(R"({"name": "a", "token_sha256": [")" + h + R"("], "quota": {"bytes": 1}})"),
       "tenants[0].quota: unknown key(s) bytes"},
  };
  for (const auto& [text, expected] : cases) {
    EXPECT_THAT(Tenants::Parse(text),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(expected)))
        << text;
  }
}

Tenant Limited(int concurrent, int per_minute) {
  Tenant t;
  t.name = "team-a";
  t.quota.concurrent_requests = concurrent;
  t.quota.requests_per_minute = per_minute;
  return t;
}

TEST(RequestQuotasTest, ConcurrentRequestsTripAtTheQuotaAndRecoverWhenOneEnds) {
  RequestQuotas quotas;
  const Tenant t = Limited(2, 0);
  const absl::Time now = absl::FromUnixSeconds(1000);
  int64_t retry = 0;
  auto s1 = quotas.Admit(t, now, &retry);
  auto s2 = quotas.Admit(t, now, &retry);
  ASSERT_THAT(s1, IsOk());
  ASSERT_THAT(s2, IsOk());
  EXPECT_EQ(quotas.running("team-a"), 2);
  EXPECT_THAT(quotas.Admit(t, now, &retry, /*concurrency_retry_ms=*/250),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("concurrent_requests")));
  EXPECT_EQ(retry, 250);
  // Another tenant is not held back.
  Tenant other = t;
  other.name = "team-b";
  EXPECT_THAT(quotas.Admit(other, now, &retry), IsOk());
  { RequestQuotas::Slot gone = std::move(*s1); }
  EXPECT_EQ(quotas.running("team-a"), 1);
  EXPECT_THAT(quotas.Admit(t, now, &retry), IsOk());
}

TEST(RequestQuotasTest, RequestsPerMinuteAllowAMinutesBurstThenOnePer60OverNSeconds) {
  RequestQuotas quotas;
  const Tenant t = Limited(0, 6);  // a token every 10 s
  const absl::Time start = absl::FromUnixSeconds(1000);
  int64_t retry = 0;
  for (int i = 0; i < 6; ++i) ASSERT_THAT(quotas.Admit(t, start, &retry), IsOk()) << i;
  EXPECT_THAT(quotas.Admit(t, start, &retry),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("6 requests per minute")));
  // The next token is 10 s away.
  EXPECT_EQ(retry, 10000);
  EXPECT_THAT(quotas.Admit(t, start + absl::Seconds(4), &retry),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(retry, 6000);
  EXPECT_THAT(quotas.Admit(t, start + absl::Seconds(10), &retry), IsOk());
  EXPECT_THAT(quotas.Admit(t, start + absl::Seconds(10), &retry),
              StatusIs(absl::StatusCode::kResourceExhausted));
  // A long pause refills to the burst, no more.
  for (int i = 0; i < 6; ++i) {
    ASSERT_THAT(quotas.Admit(t, start + absl::Hours(1), &retry), IsOk()) << i;
  }
  EXPECT_THAT(quotas.Admit(t, start + absl::Hours(1), &retry),
              StatusIs(absl::StatusCode::kResourceExhausted));
}

}  // namespace
}  // namespace tensorcheck
