// Reading .npy files (declared in tensor_io.h): the header dict parsed and
// validated strictly, the data size checked against the file size.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cli/internal/tensor_file.h"
#include "client/cli/tensor_io.h"
#include "core/status_macros.h"

namespace tensorcheck::cli {

using internal::CheckFileSize;
using internal::File;
using internal::kNpyMagic;
using internal::kNpyV1Preamble;
using internal::kNpyV2Preamble;
using internal::LoadLe;
using internal::NumelFor;
using internal::Quote;

namespace {

// numpy itself refuses headers over 10 KiB by default; a generous bound
// that still keeps a hostile length from driving an allocation.
constexpr uint32_t kMaxNpyHeaderBytes = 1u << 20;

// The parts of a .npy header the reader needs.
struct NpyLayout {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  uint64_t data_offset = 0;
  uint64_t data_bytes = 0;
};

// Recursive-descent parser for the header of a .npy file: a Python dict
// literal with exactly the keys 'descr' (a string), 'fortran_order' (True
// or False) and 'shape' (a tuple of ints), padded with spaces and ending in
// a newline. Anything else is rejected.
class NpyHeaderParser {
 public:
  NpyHeaderParser(absl::string_view text, absl::string_view file) : s_(text), file_(file) {}

  absl::Status Parse(std::string* descr, bool* fortran_order, std::vector<int64_t>* shape) {
    SkipSpace();
    if (!Consume('{')) return Error("a Python dict literal '{...}'");
    bool have_descr = false, have_fortran = false, have_shape = false;
    SkipSpace();
    while (!Consume('}')) {
      std::string key;
      TC_RETURN_IF_ERROR(ParseString(&key, "a quoted key"));
      SkipSpace();
      if (!Consume(':')) return Error("':' after a key");
      SkipSpace();
      if (key == "descr") {
        if (have_descr) return Duplicate(key);
        have_descr = true;
        if (Peek() == '[' || Peek() == '(' || Peek() == '{') {
          return absl::InvalidArgumentError(
              absl::StrCat(file_,
                           ": a simple dtype string ('<f8', '<f4', '<f2') expected, "
                           "found a structured dtype"));
        }
        TC_RETURN_IF_ERROR(ParseString(descr, "a dtype string for 'descr'"));
      } else if (key == "fortran_order") {
        if (have_fortran) return Duplicate(key);
        have_fortran = true;
        if (ConsumeWord("True")) {
          *fortran_order = true;
        } else if (ConsumeWord("False")) {
          *fortran_order = false;
        } else {
          return Error("True or False for 'fortran_order'");
        }
      } else if (key == "shape") {
        if (have_shape) return Duplicate(key);
        have_shape = true;
        TC_RETURN_IF_ERROR(ParseShape(shape));
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat(file_,
                         ": header keys 'descr', 'fortran_order', 'shape' expected, "
                         "found ",
                         Quote(key)));
      }
      SkipSpace();
      if (Consume(',')) {
        SkipSpace();
        continue;
      }
      if (Peek() != '}') return Error("',' or '}' after a value");
    }
    // Only padding may follow the dict.
    while (pos_ < s_.size()) {
      const char c = s_[pos_];
      if (c != ' ' && c != '\n' && c != '\t' && c != '\r' && c != '\0') {
        return Error("only padding after the header dict");
      }
      ++pos_;
    }
    if (!have_descr || !have_fortran || !have_shape) {
      std::vector<std::string> missing;
      if (!have_descr) missing.push_back("'descr'");
      if (!have_fortran) missing.push_back("'fortran_order'");
      if (!have_shape) missing.push_back("'shape'");
      return absl::InvalidArgumentError(
          absl::StrCat(file_, ": header is missing required keys: ", absl::StrJoin(missing, ", ")));
    }
    return absl::OkStatus();
  }

 private:
  char Peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  bool Consume(char c) {
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool ConsumeWord(absl::string_view w) {
    if (absl::StartsWith(s_.substr(pos_), w)) {
      pos_ += w.size();
      return true;
    }
    return false;
  }
  void SkipSpace() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) {
      ++pos_;
    }
  }

  absl::Status Error(absl::string_view expected) const {
    return absl::InvalidArgumentError(
        absl::StrCat(file_, ": unparseable .npy header: ", expected, " expected at offset ", pos_,
                     ", found ", pos_ < s_.size() ? Quote(s_.substr(pos_, 12)) : "the end"));
  }
  absl::Status Duplicate(absl::string_view key) const {
    return absl::InvalidArgumentError(
        absl::StrCat(file_, ": header key '", key, "' appears twice"));
  }

  absl::Status ParseString(std::string* out, absl::string_view what) {
    const char q = Peek();
    if (q != '\'' && q != '"') return Error(what);
    ++pos_;
    const size_t start = pos_;
    while (pos_ < s_.size() && s_[pos_] != q) {
      // Escapes never occur in a header numpy writes.
      if (s_[pos_] == '\\' || s_[pos_] == '\n') return Error(what);
      ++pos_;
    }
    if (pos_ >= s_.size()) return Error(absl::StrCat(what, " (closing quote)"));
    *out = std::string(s_.substr(start, pos_ - start));
    ++pos_;
    return absl::OkStatus();
  }

  absl::Status ParseShape(std::vector<int64_t>* shape) {
    if (!Consume('(')) return Error("a tuple '(...)' for 'shape'");
    shape->clear();
    SkipSpace();
    while (!Consume(')')) {
      if (shape->size() >= static_cast<size_t>(kMaxRank)) {
        return absl::InvalidArgumentError(
            absl::StrCat(file_, ": shape of rank at most ", kMaxRank, " expected"));
      }
      bool negative = Consume('-');
      if (!absl::ascii_isdigit(static_cast<unsigned char>(Peek()))) {
        return Error("an integer dimension");
      }
      uint64_t v = 0;
      bool overflow = false;
      while (absl::ascii_isdigit(static_cast<unsigned char>(Peek()))) {
        const uint64_t digit = static_cast<uint64_t>(s_[pos_] - '0');
        if (v > (static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) - digit) / 10) {
          overflow = true;
        } else {
          v = v * 10 + digit;
        }
        ++pos_;
      }
      if (overflow) {
        return absl::InvalidArgumentError(
            absl::StrCat(file_, ": shape dimension ", shape->size(), " does not fit in int64"));
      }
      if (negative && v != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(file_, ": non-negative shape dimensions expected, found -", v,
                         " at dimension ", shape->size()));
      }
      shape->push_back(static_cast<int64_t>(v));
      SkipSpace();
      if (Consume(',')) {
        SkipSpace();
        continue;
      }
      if (Peek() != ')') return Error("',' or ')' in 'shape'");
    }
    return absl::OkStatus();
  }

  absl::string_view s_;
  size_t pos_ = 0;
  absl::string_view file_;
};

// How to say, in a message, what the file holds for a bit-pattern descr.
std::string BitsFound(const std::string& descr, absl::string_view holds) {
  return absl::StrCat(Quote(descr), " (", holds, ")");
}

absl::StatusOr<DType> NpyDescrToDType(const std::string& descr, absl::string_view file,
                                      const TensorReadOptions& options) {
  const std::optional<DType> want = options.expected_dtype;
  const bool want_bf16 = want.has_value() && *want == DType::kBFloat16;
  // One-byte bit patterns ('|u1'): FP8, the UE8M0 scale format, and FP4
  // packed two per byte.
  const bool want_fp8 = want.has_value() && IsFp8(*want);
  const bool want_bytes = want.has_value() && (want_fp8 || *want == DType::kFloat8E8M0Fnu ||
                                               *want == DType::kFloat4E2M1Fn);
  // A tensor of another dtype than the one expected; `found` says what the
  // file holds.
  auto mismatch = [&](absl::string_view found) {
    return absl::InvalidArgumentError(absl::StrCat(
        file, ": dtype ", DTypeName(*want), " expected (", options.expected_by, "), found ", found,
        want_bf16  ? "; bfloat16 .npy files hold '<u2' bit patterns"
        : want_fp8 ? "; FP8 .npy files hold '|u1' bit patterns"
        : want.has_value() && *want == DType::kFloat8E8M0Fnu
            ? "; float8_e8m0fnu .npy files hold '|u1' bit patterns"
        : want.has_value() && *want == DType::kFloat4E2M1Fn
            ? "; float4_e2m1fn .npy files hold '|u1' bytes, two elements each"
            : ""));
  };
  DType d;
  if (descr == "<f8") {
    d = DType::kFloat64;
  } else if (descr == "<f4") {
    d = DType::kFloat32;
  } else if (descr == "<f2") {
    d = DType::kFloat16;
  } else if (descr == "<u2") {
    if (want_bf16) return DType::kBFloat16;
    if (want.has_value()) return mismatch(BitsFound(descr, "uint16, bfloat16 bit patterns"));
    return absl::InvalidArgumentError(
        absl::StrCat(file,
                     ": dtype '<u2' (uint16) is read only as bfloat16 bit patterns; "
                     "say so with ",
                     options.dtype_flag, "bf16, or save float data as '<f8', '<f4' or '<f2'"));
  } else if (descr == "<V2" || descr == "|V2") {
    // np.save of an ml_dtypes bfloat16 array: numpy has no name for the
    // dtype and writes raw 2-byte values ('<V2'; '|V2' from older numpy).
    if (want_bf16) return DType::kBFloat16;
    if (want.has_value()) {
      return mismatch(BitsFound(descr, "raw 2-byte values, e.g. ml_dtypes bfloat16"));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        file, ": dtype ", descr, " (raw 2-byte values, e.g. ml_dtypes bfloat16): pass ",
        options.dtype_flag, "bf16"));
  } else if (descr == "|u1" || descr == "<u1") {
    // One byte has no byte order: numpy writes '|u1'.
    if (want_bytes) return *want;
    if (want.has_value()) return mismatch(BitsFound(descr, "uint8, FP8 bit patterns"));
    return absl::InvalidArgumentError(absl::StrCat(
        file, ": dtype ", Quote(descr),
        " (uint8) is read only as FP8 bit patterns, and the bits do not say which format; "
        "say so with ",
        options.dtype_flag, "fp8e4m3 (float8_e4m3fn) or ", options.dtype_flag,
        "fp8e5m2 (float8_e5m2) (", options.dtype_flag,
        "fp4e2m1 for float4_e2m1fn packed two per "
        "byte, ",
        options.dtype_flag,
        "e8m0 for float8_e8m0fnu), or save float data as '<f8', "
        "'<f4' or '<f2'"));
  } else if (!descr.empty() && descr[0] == '>') {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": big-endian dtype ", Quote(descr),
                     " is not supported; little-endian '<f8', '<f4' or '<f2' expected "
                     "(numpy: arr.astype(arr.dtype.newbyteorder('<')))"));
  } else if (descr == "|O" || descr == "O" || descr == "<O" || descr == ">O") {
    return absl::InvalidArgumentError(
        absl::StrCat(file,
                     ": object arrays (dtype '|O') are not supported; a float array "
                     "('<f8', '<f4', '<f2') expected"));
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": unsupported dtype ", Quote(descr),
                     "; '<f8', '<f4', '<f2' (or '<u2' with ", options.dtype_flag,
                     "bf16, '|u1' with ", options.dtype_flag, "fp8e4m3 or fp8e5m2) expected"));
  }
  if (want.has_value() && *want != d) {
    return mismatch(absl::StrCat(Quote(descr), " (", DTypeName(d), ")"));
  }
  return d;
}

// Validates the preamble and header of a .npy file whose first bytes are
// `head` (at least min(file_size, 12) of them) and whose header text is
// fetched by `read_header(offset, length)` once its length is known to fit.
template <typename ReadHeader>
absl::StatusOr<NpyLayout> ParseNpyLayout(absl::string_view head, uint64_t file_size,
                                         absl::string_view file, const TensorReadOptions& options,
                                         ReadHeader read_header) {
  if (!absl::StartsWith(head, kNpyMagic)) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": not a .npy file: magic '\\x93NUMPY' expected, found ",
                     Quote(head.substr(0, kNpyMagic.size()))));
  }
  if (file_size < kNpyV1Preamble || head.size() < kNpyV1Preamble) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": truncated .npy file: at least ",
                                                   kNpyV1Preamble, " bytes expected, found ",
                                                   file_size));
  }
  const int major = static_cast<unsigned char>(head[6]);
  const int minor = static_cast<unsigned char>(head[7]);
  if ((major != 1 && major != 2 && major != 3) || minor != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(file,
                     ": .npy format version 1.0, 2.0 or 3.0 expected, "
                     "found ",
                     major, ".", minor));
  }
  size_t preamble = kNpyV1Preamble;
  uint64_t header_len = 0;
  if (major == 1) {
    header_len = LoadLe(head.substr(8), 2);
  } else {
    if (file_size < kNpyV2Preamble || head.size() < kNpyV2Preamble) {
      return absl::InvalidArgumentError(
          absl::StrCat(file, ": truncated .npy file: ", kNpyV2Preamble,
                       " bytes of preamble expected, found ", file_size));
    }
    preamble = kNpyV2Preamble;
    header_len = LoadLe(head.substr(8), 4);
  }
  if (header_len > file_size - preamble) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": header length ", header_len, " runs past the end of the file (",
                     file_size - preamble, " bytes after the preamble)"));
  }
  if (header_len > kMaxNpyHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": header of at most ", kMaxNpyHeaderBytes,
                                                   " bytes expected, found ", header_len));
  }
  TC_ASSIGN_OR_RETURN(std::string header, read_header(preamble, static_cast<size_t>(header_len)));
  std::string descr;
  bool fortran_order = false;
  NpyLayout layout;
  NpyHeaderParser parser(header, file);
  TC_RETURN_IF_ERROR(parser.Parse(&descr, &fortran_order, &layout.shape));
  TC_ASSIGN_OR_RETURN(layout.dtype, NpyDescrToDType(descr, file, options));
  TC_ASSIGN_OR_RETURN(const int64_t numel,
                      NumelFor(layout.shape, ItemSize(layout.dtype), std::string(file)));
  if (layout.dtype == DType::kFloat4E2M1Fn) {
    // The file's bytes hold two elements each (element 2i in the low
    // nibble, as torch.float4_e2m1fn_x2): the tensor's last dimension is
    // twice the file's.
    if (layout.shape.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(file,
                       ": a float4_e2m1fn .npy holds its packed bytes, two elements each, "
                       "in at least one dimension; found shape ()"));
    }
    layout.shape.back() *= 2;
  }
  if (fortran_order) {
    return absl::InvalidArgumentError(
        absl::StrCat(file,
                     ": fortran_order: True is not supported; a C-order array "
                     "expected (numpy: np.ascontiguousarray(a))"));
  }
  layout.data_offset = preamble + header_len;
  // `numel` counts the file's items (FP4: its bytes).
  layout.data_bytes = static_cast<uint64_t>(numel) * static_cast<uint64_t>(ItemSize(layout.dtype));
  const uint64_t available = file_size - layout.data_offset;
  if (available != layout.data_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": ", layout.data_bytes, " bytes of data expected for shape ",
                     ShapeString(layout.shape), " of ", DTypeName(layout.dtype), " (", numel, " x ",
                     ItemSize(layout.dtype), "), found ", available,
                     available < layout.data_bytes ? " (truncated file)" : " (trailing bytes)"));
  }
  return layout;
}

}  // namespace

absl::StatusOr<Tensor> ParseNpy(absl::string_view bytes, absl::string_view file_name,
                                const TensorReadOptions& options) {
  TC_RETURN_IF_ERROR(CheckFileSize(bytes, file_name, options));
  auto read_header = [&](size_t offset, size_t n) -> absl::StatusOr<std::string> {
    return std::string(bytes.substr(offset, n));
  };
  TC_ASSIGN_OR_RETURN(NpyLayout layout,
                      ParseNpyLayout(bytes.substr(0, kNpyV2Preamble), bytes.size(), file_name,
                                     options, read_header));
  return Tensor::FromBytes(layout.dtype, layout.shape, bytes.substr(layout.data_offset));
}

absl::StatusOr<Tensor> ReadNpyFile(const std::string& path, const TensorReadOptions& options) {
  TC_ASSIGN_OR_RETURN(File f, File::Open(path, options.max_file_bytes));
  TC_ASSIGN_OR_RETURN(
      std::string head,
      f.ReadString(0, static_cast<size_t>(std::min<uint64_t>(f.size(), kNpyV2Preamble))));
  auto read_header = [&](size_t offset, size_t n) -> absl::StatusOr<std::string> {
    return f.ReadString(offset, n);
  };
  TC_ASSIGN_OR_RETURN(NpyLayout layout, ParseNpyLayout(head, f.size(), path, options, read_header));
  return f.ReadTensor(layout.data_offset, layout.dtype, layout.shape);
}

}  // namespace tensorcheck::cli
