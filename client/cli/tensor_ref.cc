// Digest arguments (tensor_ref.h).
#include "client/cli/tensor_ref.h"

#include <cstdlib>
#include <limits>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace tensorcheck::cli {
namespace {

constexpr size_t kHexDigits = 64;
constexpr absl::string_view kForm =
    "sha256:<64 lowercase hex digits>:<dtype>:<d0>x<d1>... expected (as `tensorcheck upload` "
    "prints it)";

absl::Status RefError(absl::string_view arg, absl::string_view why) {
  const absl::string_view shown = arg.substr(0, 120);
  return absl::InvalidArgumentError(
      absl::StrCat("'", shown, arg.size() > shown.size() ? "..." : "", "': ", why, "; ", kForm));
}

}  // namespace

int64_t TensorRef::size_bytes() const {
  int64_t n = static_cast<int64_t>(ItemSize(dtype));
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorRef::digest() const { return absl::StrCat(kDigestPrefix, hash_hex); }

bool IsDigestArg(absl::string_view arg) { return absl::StartsWith(arg, kDigestPrefix); }

absl::StatusOr<TensorRef> ParseTensorRef(absl::string_view arg) {
  if (!IsDigestArg(arg)) return RefError(arg, "no sha256: prefix");
  const std::vector<absl::string_view> parts =
      absl::StrSplit(arg.substr(kDigestPrefix.size()), ':');
  if (parts.size() < 3) {
    return RefError(arg, parts.size() == 1 ? "the dtype and shape are missing (a digest alone "
                                             "does not say them)"
                                           : "the shape is missing");
  }
  if (parts.size() > 3) return RefError(arg, "more than four ':'-separated parts");
  TensorRef ref;
  const absl::string_view hex = parts[0];
  if (hex.size() != kHexDigits) {
    return RefError(arg, absl::StrCat("the hash has ", hex.size(), " digits, not 64"));
  }
  for (char c : hex) {
    if (!absl::ascii_isdigit(c) && !(c >= 'a' && c <= 'f')) {
      return RefError(arg, "the hash is not lowercase hex");
    }
  }
  ref.hash_hex = std::string(hex);
  auto dtype = ParseDType(parts[1]);
  if (!dtype.ok()) {
    return RefError(arg, absl::StrCat("dtype: ", dtype.status().message()));
  }
  ref.dtype = *dtype;
  // numel * itemsize must fit in int64 (the size the store checks).
  const int64_t limit = std::numeric_limits<int64_t>::max() / 8;
  int64_t numel = 1;
  if (!parts[2].empty()) {
    for (absl::string_view d : absl::StrSplit(parts[2], 'x')) {
      int64_t v;
      if (d.empty() || !absl::ascii_isdigit(d[0]) || !absl::SimpleAtoi(d, &v) || v < 0) {
        return RefError(
            arg, absl::StrCat("shape: dimension '", d.substr(0, 24), d.size() > 24 ? "..." : "",
                              "' is not a non-negative integer"));
      }
      if (v != 0 && numel > limit / v) return RefError(arg, "shape: too many elements");
      numel *= v;
      ref.shape.push_back(v);
    }
  }
  return ref;
}

std::string FormatTensorRef(const TensorRef& ref) {
  return absl::StrCat(kDigestPrefix, ref.hash_hex, ":", DTypeShortName(ref.dtype), ":",
                      absl::StrJoin(ref.shape, "x"));
}

}  // namespace tensorcheck::cli
