// Digests of stored tensors: the SHA-256 of a tensor's bytes (exactly what
// `Tensor.data` would carry) plus their size, as the content-addressable
// storage of Bazel's Remote Execution API names its blobs.
//
//   TC_ASSIGN_OR_RETURN(Digest d, ParseDigest("sha256:ba7816bf...", 3, "op.weight.digest"));
//   Digest mine = DigestOf("abc");            // {"ba7816bf...", 3}
//   mine == d;  mine.ToString();              // "sha256:ba7816bf..."
//
//   Sha256 h;                                 // over chunks as they arrive
//   h.Update(chunk1);  h.Update(chunk2);
//   std::string hex = h.HexDigest();
//
// The hash is OpenSSL's (libcrypto). Thread safety: Digest is a value; one
// Sha256 object per stream.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tensorcheck {

struct Digest {
  std::string hash;  // 64 lowercase hex digits
  int64_t size = 0;  // bytes

  // "sha256:<hash>" (the size travels beside it, as numel x itemsize).
  std::string ToString() const { return "sha256:" + hash; }
  bool operator==(const Digest& o) const { return size == o.size && hash == o.hash; }
  bool operator!=(const Digest& o) const { return !(*this == o); }
  bool operator<(const Digest& o) const { return hash != o.hash ? hash < o.hash : size < o.size; }
};

// The SHA-256 of no bytes: the empty blob, which a store always holds.
inline constexpr char kEmptySha256[] =
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

// `text` as "sha256:" and 64 lowercase hex digits, of `size` >= 0 bytes;
// INVALID_ARGUMENT naming `field` otherwise.
absl::StatusOr<Digest> ParseDigest(absl::string_view text, int64_t size,
                                   absl::string_view field = "digest");

// Incremental SHA-256.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void Update(absl::string_view bytes);
  // The hash of everything given so far, as 64 lowercase hex digits. The
  // object may not be updated afterwards.
  std::string HexDigest();
  int64_t bytes() const { return bytes_; }

 private:
  struct Context;
  std::unique_ptr<Context> ctx_;
  int64_t bytes_ = 0;
};

// The digest of `bytes` in one call.
Digest DigestOf(absl::string_view bytes);

}  // namespace tensorcheck
