// A tensor named by its digest on the command line (docs/api.md,
// "Digests"); the SHA-256 that names it is core/digest.h's.
//
// A digest carries no dtype or shape, so the argument carries both:
//
//   sha256:<64 lowercase hex digits>:<dtype>:<d0>x<d1>x...
//   sha256:f3ae939bfe8dd5d00cb5acc191fd33b1a8c456d6af1341923d47b08db0719406:bf16:2x2
//
// which is exactly what `tensorcheck upload` prints. The dtype is any
// name ParseDType accepts (bf16, fp32, float16, f8 (numpy's float64),
// fp8e4m3, float8_e5m2, F8_E4M3, ...; printed as the short name); a rank-0
// tensor has an empty shape (`...:fp32:`).
//
//   TC_ASSIGN_OR_RETURN(TensorRef r, ParseTensorRef(arg));
//   std::cout << FormatTensorRef(r) << "\n";
//   std::string hex = DigestOf(tensor.bytes()).hash;      // core/digest.h
//
// Errors (ParseTensorRef): INVALID_ARGUMENT saying which part is wrong and
// what the form is; the caller prefixes the flag it came from.
//
// Thread safety: every function is safe to call concurrently. No gRPC
// dependency.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/digest.h"
#include "core/dtype.h"

namespace tensorcheck::cli {

// The prefix that marks a tensor argument as a digest instead of a file.
inline constexpr absl::string_view kDigestPrefix = "sha256:";

// A tensor in the server's store, as a request references it.
struct TensorRef {
  // 64 lowercase hex digits, without the prefix.
  std::string hash_hex;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;

  // numel(shape) * itemsize(dtype): the blob's size.
  int64_t size_bytes() const;
  // "sha256:<hex>", as Tensor.digest and TensorDigest.hash carry it.
  std::string digest() const;
};

// Whether a tensor argument names a digest (starts with "sha256:").
bool IsDigestArg(absl::string_view arg);

// Parses `sha256:<hex>:<dtype>:<shape>`.
absl::StatusOr<TensorRef> ParseTensorRef(absl::string_view arg);

// The argument form of `ref`, which ParseTensorRef reads back.
std::string FormatTensorRef(const TensorRef& ref);

}  // namespace tensorcheck::cli
