#include "core/digest.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/testing/status_matchers.h"

namespace tensorcheck {
namespace {

using ::tensorcheck::testing::IsOk;
using ::tensorcheck::testing::StatusIs;
using ::testing::HasSubstr;

// FIPS 180-2's examples (appendix B) and the empty message.
TEST(DigestTest, Sha256MatchesThePublishedVectors) {
  EXPECT_EQ(DigestOf("").hash, kEmptySha256);
  EXPECT_EQ(DigestOf("abc").hash,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(DigestOf("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq").hash,
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(DigestOf(std::string(1000000, 'a')),
            (Digest{"cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0", 1000000}));
}

TEST(DigestTest, ChunkedHashEqualsOneShot) {
  std::string bytes;
  for (int i = 0; i < 100000; ++i) bytes.push_back(static_cast<char>(i * 131 % 251));
  for (size_t chunk : {1u, 7u, 4096u, 65536u}) {
    Sha256 h;
    for (size_t at = 0; at < bytes.size(); at += chunk) {
      h.Update(absl::string_view(bytes).substr(at, chunk));
    }
    EXPECT_EQ(h.bytes(), static_cast<int64_t>(bytes.size()));
    EXPECT_EQ(h.HexDigest(), DigestOf(bytes).hash) << chunk;
  }
}

TEST(DigestTest, ParseAcceptsOnlyLowercaseSha256WithASize) {
  const std::string hex(kEmptySha256);
  ASSERT_THAT(ParseDigest("sha256:" + hex, 0), IsOk());
  EXPECT_EQ(ParseDigest("sha256:" + hex, 0)->ToString(), "sha256:" + hex);
  for (const std::string& bad : std::vector<std::string>{
           hex, "sha1:" + hex, "sha256:" + hex.substr(1), "sha256:" + hex + "0",
           std::string("sha256:E3B0C44298FC1C149AFBF4C8996FB92427AE41E4649B934CA495991B7852B855"),
           "sha256:" + hex.substr(0, 63) + "g", std::string("sha256:")}) {
    EXPECT_THAT(ParseDigest(bad, 0, "op.weight.digest"),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("op.weight.digest")))
        << bad;
  }
  EXPECT_THAT(ParseDigest("sha256:" + hex, -1), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace tensorcheck
