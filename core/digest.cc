#include "core/digest.h"

#include <openssl/evp.h>

#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace tensorcheck {

namespace {
constexpr absl::string_view kPrefix = "sha256:";
constexpr size_t kHexDigits = 64;
}  // namespace

absl::StatusOr<Digest> ParseDigest(absl::string_view text, int64_t size, absl::string_view field) {
  const auto error = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": \"sha256:\" and 64 lowercase hex digits expected (", why, "), got '",
                     text.substr(0, 80), text.size() > 80 ? "...'" : "'"));
  };
  if (!absl::StartsWith(text, kPrefix)) return error("no sha256: prefix");
  const absl::string_view hex = text.substr(kPrefix.size());
  if (hex.size() != kHexDigits) return error(absl::StrCat(hex.size(), " digits"));
  for (char c : hex) {
    if (!absl::ascii_isdigit(c) && !(c >= 'a' && c <= 'f')) return error("not lowercase hex");
  }
  if (size < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": a size of 0 bytes or more expected, got ", size));
  }
  return Digest{std::string(hex), size};
}

struct Sha256::Context {
  EVP_MD_CTX* md = nullptr;
};

Sha256::Sha256() : ctx_(std::make_unique<Context>()) {
  ctx_->md = EVP_MD_CTX_new();
  // Allocation or initialisation failing here leaves the process unable to
  // hash at all: there is no meaningful way to continue.
  if (ctx_->md == nullptr || EVP_DigestInit_ex(ctx_->md, EVP_sha256(), nullptr) != 1) std::abort();
}

Sha256::~Sha256() { EVP_MD_CTX_free(ctx_->md); }

void Sha256::Update(absl::string_view bytes) {
  if (!bytes.empty() && EVP_DigestUpdate(ctx_->md, bytes.data(), bytes.size()) != 1) std::abort();
  bytes_ += static_cast<int64_t>(bytes.size());
}

std::string Sha256::HexDigest() {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_DigestFinal_ex(ctx_->md, out, &len) != 1) std::abort();
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * len);
  for (unsigned int i = 0; i < len; ++i) {
    hex.push_back(kHex[out[i] >> 4]);
    hex.push_back(kHex[out[i] & 15]);
  }
  return hex;
}

Digest DigestOf(absl::string_view bytes) {
  Sha256 h;
  h.Update(bytes);
  return Digest{h.HexDigest(), static_cast<int64_t>(bytes.size())};
}

}  // namespace tensorcheck
