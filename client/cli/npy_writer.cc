// Writing .npy files (declared in tensor_io.h): format v1.0, C order, the
// header padded to 64 bytes; bfloat16 widened to float32 or kept as bits,
// FP8 kept as bits.
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/cli/internal/tensor_file.h"
#include "client/cli/tensor_io.h"
#include "core/float_formats.h"

namespace tensorcheck::cli {

using internal::kNpyMagic;
using internal::kNpyV1Preamble;

std::string EncodeNpy(const Tensor& t, Bf16NpyEncoding bf16) {
  const bool widen_bf16 = t.dtype() == DType::kBFloat16 && bf16 == Bf16NpyEncoding::kFloat32;
  absl::string_view descr;
  switch (t.dtype()) {
    case DType::kFloat64:
      descr = "<f8";
      break;
    case DType::kFloat32:
      descr = "<f4";
      break;
    case DType::kFloat16:
      descr = "<f2";
      break;
    case DType::kBFloat16:
      descr = widen_bf16 ? "<f4" : "<u2";
      break;
    case DType::kFloat8E4M3Fn:
    case DType::kFloat8E5M2:
    case DType::kFloat8E8M0Fnu:
    case DType::kFloat4E2M1Fn:
      // Bit patterns, as numpy writes uint8 (tensor_io.h says why); FP4
      // packed two per byte, its last dimension halved below.
      descr = "|u1";
      break;
  }
  std::string shape = "(";
  for (size_t i = 0; i < t.shape().size(); ++i) {
    const bool packed = t.dtype() == DType::kFloat4E2M1Fn && i + 1 == t.shape().size();
    absl::StrAppend(&shape, i ? ", " : "", packed ? (t.shape()[i] + 1) / 2 : t.shape()[i]);
  }
  if (t.shape().size() == 1) shape += ",";
  shape += ")";
  std::string dict =
      absl::StrCat("{'descr': '", descr, "', 'fortran_order': False, 'shape': ", shape, ", }");
  // Pad with spaces so that the data starts on a 64-byte boundary; the
  // header ends with a newline.
  const size_t unpadded = kNpyV1Preamble + dict.size() + 1;
  const size_t padded = (unpadded + 63) / 64 * 64;
  dict.append(padded - unpadded, ' ');
  dict.push_back('\n');
  const size_t header_len = dict.size();  // < 65536: rank <= 8

  std::string out(kNpyMagic);
  out.push_back('\x01');
  out.push_back('\x00');
  out.push_back(static_cast<char>(header_len & 0xff));
  out.push_back(static_cast<char>((header_len >> 8) & 0xff));
  out += dict;
  if (widen_bf16) {
    const uint16_t* src = t.data<uint16_t>();
    const size_t start = out.size();
    out.resize(start + static_cast<size_t>(t.numel()) * sizeof(float));
    for (int64_t i = 0; i < t.numel(); ++i) {
      const float f = Bf16BitsToFloat(src[i]);
      std::memcpy(&out[start + static_cast<size_t>(i) * sizeof(float)], &f, sizeof(float));
    }
  } else {
    out.append(t.bytes().data(), t.bytes().size());
  }
  return out;
}

absl::Status WriteNpyFile(const std::string& path, const Tensor& t, Bf16NpyEncoding bf16) {
  const std::string bytes = EncodeNpy(t, bf16);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot write '", path, "': ", std::strerror(errno)));
  }
  const size_t written = std::fwrite(bytes.data(), 1, bytes.size(), f);
  const bool close_ok = std::fclose(f) == 0;
  if (written != bytes.size() || !close_ok) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot write '", path, "': ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace tensorcheck::cli
