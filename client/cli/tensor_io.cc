#include "client/cli/tensor_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <tuple>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "server/core/float_formats.h"
#include "server/core/status_macros.h"

// Tensor bytes are copied as they lie in the file (little-endian).
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "tensor_io assumes a little-endian host");

namespace tensorcheck::cli {
namespace {

constexpr absl::string_view kNpyMagic("\x93NUMPY", 6);
// Magic (6) + version (2) + header length (2 in v1, 4 in v2/v3).
constexpr size_t kNpyV1Preamble = 10;
constexpr size_t kNpyV2Preamble = 12;
// numpy itself refuses headers over 10 KiB by default; a generous bound
// that still keeps a hostile length from driving an allocation.
constexpr uint32_t kMaxNpyHeaderBytes = 1u << 20;
// A safetensors header needs depth 3 ({name: {shape: [..]}}).
constexpr int kMaxJsonDepth = 16;

// Printable rendering of untrusted bytes for messages (bounded length).
std::string Quote(absl::string_view s, size_t max_len = 40) {
  std::string out = "'";
  for (size_t i = 0; i < s.size() && i < max_len; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\'' && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    }
  }
  if (s.size() > max_len) out += "...";
  out += "'";
  return out;
}

// A name from a file, cut to a readable length for messages.
std::string Short(absl::string_view s) {
  constexpr size_t kMax = 80;
  if (s.size() <= kMax) return std::string(s);
  return absl::StrCat(s.substr(0, kMax), "...");
}

uint64_t LoadLe(absl::string_view bytes, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) {
    v |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  }
  return v;
}

// Product of dims, each already non-negative, with overflow of
// numel * itemsize detected. `what` labels the message.
absl::StatusOr<int64_t> NumelFor(const std::vector<int64_t>& shape,
                                 size_t itemsize, const std::string& what) {
  if (shape.size() > static_cast<size_t>(kMaxRank)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": rank at most ", kMaxRank, " expected, found ", shape.size(),
        " (shape ", ShapeString(shape), ")"));
  }
  const int64_t limit =
      std::numeric_limits<int64_t>::max() / static_cast<int64_t>(itemsize);
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": non-negative dimensions expected, found shape ",
                       ShapeString(shape)));
    }
    if (d != 0 && n > limit / d) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": shape ", ShapeString(shape), " overflows the element count"));
    }
    n *= d;
  }
  return n;
}

// ---------------------------------------------------------------- files

// An open file descriptor, closed on destruction.
class File {
 public:
  static absl::StatusOr<File> Open(const std::string& path,
                                   int64_t max_bytes) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      const std::string msg =
          absl::StrCat("cannot open '", path, "': ", std::strerror(err));
      if (err == ENOENT) return absl::NotFoundError(msg);
      return absl::InvalidArgumentError(msg);
    }
    File f(fd, path);
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot stat '", path, "': ", std::strerror(errno)));
    }
    if (!S_ISREG(st.st_mode)) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", path, "': a regular file expected"));
    }
    if (st.st_size > max_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", path, "': file of at most ", max_bytes,
                       " bytes expected, found ", st.st_size, " bytes"));
    }
    f.size_ = static_cast<uint64_t>(st.st_size);
    return f;
  }

  File(File&& o) noexcept
      : fd_(std::exchange(o.fd_, -1)), path_(std::move(o.path_)), size_(o.size_) {}
  File& operator=(File&&) = delete;
  File(const File&) = delete;
  ~File() {
    if (fd_ >= 0) ::close(fd_);
  }

  uint64_t size() const { return size_; }

  // Reads exactly `n` bytes at `offset` into `dst`.
  absl::Status ReadAt(uint64_t offset, size_t n, char* dst) const {
    size_t done = 0;
    while (done < n) {
      const ssize_t r = ::pread(fd_, dst + done, n - done,
                                static_cast<off_t>(offset + done));
      if (r < 0) {
        if (errno == EINTR) continue;
        return absl::InvalidArgumentError(
            absl::StrCat("'", path_, "': read failed: ", std::strerror(errno)));
      }
      if (r == 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "'", path_, "': file ended early (", n, " bytes expected at offset ",
            offset, ", got ", done, "); was it modified while being read?"));
      }
      done += static_cast<size_t>(r);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> ReadString(uint64_t offset, size_t n) const {
    std::string s(n, '\0');
    TC_RETURN_IF_ERROR(ReadAt(offset, n, s.data()));
    return s;
  }

 private:
  File(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_;
  std::string path_;
  uint64_t size_ = 0;
};

// ---------------------------------------------------------------- .npy

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
  NpyHeaderParser(absl::string_view text, absl::string_view file)
      : s_(text), file_(file) {}

  absl::Status Parse(std::string* descr, bool* fortran_order,
                     std::vector<int64_t>* shape) {
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
          return absl::InvalidArgumentError(absl::StrCat(
              file_, ": a simple dtype string ('<f8', '<f4', '<f2') expected, "
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
        return absl::InvalidArgumentError(absl::StrCat(
            file_, ": header keys 'descr', 'fortran_order', 'shape' expected, "
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
          absl::StrCat(file_, ": header is missing required keys: ",
                       absl::StrJoin(missing, ", ")));
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
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' ||
                                s_[pos_] == '\n' || s_[pos_] == '\r')) {
      ++pos_;
    }
  }

  absl::Status Error(absl::string_view expected) const {
    return absl::InvalidArgumentError(absl::StrCat(
        file_, ": unparseable .npy header: ", expected, " expected at offset ",
        pos_, ", found ",
        pos_ < s_.size() ? Quote(s_.substr(pos_, 12)) : "the end"));
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
        return absl::InvalidArgumentError(absl::StrCat(
            file_, ": shape of rank at most ", kMaxRank, " expected"));
      }
      bool negative = Consume('-');
      if (!absl::ascii_isdigit(static_cast<unsigned char>(Peek()))) {
        return Error("an integer dimension");
      }
      uint64_t v = 0;
      bool overflow = false;
      while (absl::ascii_isdigit(static_cast<unsigned char>(Peek()))) {
        const uint64_t digit = static_cast<uint64_t>(s_[pos_] - '0');
        if (v > (static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) -
                 digit) / 10) {
          overflow = true;
        } else {
          v = v * 10 + digit;
        }
        ++pos_;
      }
      if (overflow) {
        return absl::InvalidArgumentError(absl::StrCat(
            file_, ": shape dimension ", shape->size(),
            " does not fit in int64"));
      }
      if (negative && v != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            file_, ": non-negative shape dimensions expected, found -", v,
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

absl::StatusOr<DType> NpyDescrToDType(const std::string& descr,
                                      absl::string_view file,
                                      const TensorReadOptions& options) {
  const bool want_bf16 = options.expected_dtype.has_value() &&
                         *options.expected_dtype == DType::kBFloat16;
  DType d;
  if (descr == "<f8") {
    d = DType::kFloat64;
  } else if (descr == "<f4") {
    d = DType::kFloat32;
  } else if (descr == "<f2") {
    d = DType::kFloat16;
  } else if (descr == "<u2") {
    if (!want_bf16) {
      return absl::InvalidArgumentError(absl::StrCat(
          file, ": dtype '<u2' (uint16) is read only as bfloat16 bit patterns; "
                "say so with --dtype NAME=bf16, or save float data as '<f8', "
                "'<f4' or '<f2'"));
    }
    return DType::kBFloat16;
  } else if (!descr.empty() && descr[0] == '>') {
    return absl::InvalidArgumentError(absl::StrCat(
        file, ": big-endian dtype ", Quote(descr),
        " is not supported; little-endian '<f8', '<f4' or '<f2' expected "
        "(numpy: arr.astype(arr.dtype.newbyteorder('<')))"));
  } else if (descr == "|O" || descr == "O" || descr == "<O" ||
             descr == ">O") {
    return absl::InvalidArgumentError(absl::StrCat(
        file, ": object arrays (dtype '|O') are not supported; a float array "
              "('<f8', '<f4', '<f2') expected"));
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": unsupported dtype ", Quote(descr),
                     "; '<f8', '<f4', '<f2' (or '<u2' with --dtype NAME=bf16) "
                     "expected"));
  }
  if (options.expected_dtype.has_value() && *options.expected_dtype != d) {
    return absl::InvalidArgumentError(absl::StrCat(
        file, ": dtype ", DTypeName(*options.expected_dtype),
        " expected (--dtype), found ", Quote(descr), " (", DTypeName(d), ")",
        want_bf16 ? "; bfloat16 .npy files hold '<u2' bit patterns" : ""));
  }
  return d;
}

// Validates the preamble and header of a .npy file whose first bytes are
// `head` (at least min(file_size, 12) of them) and whose header text is
// fetched by `read_header(offset, length)` once its length is known to fit.
template <typename ReadHeader>
absl::StatusOr<NpyLayout> ParseNpyLayout(absl::string_view head,
                                         uint64_t file_size,
                                         absl::string_view file,
                                         const TensorReadOptions& options,
                                         ReadHeader read_header) {
  if (!absl::StartsWith(head, kNpyMagic)) {
    return absl::InvalidArgumentError(absl::StrCat(
        file, ": not a .npy file: magic '\\x93NUMPY' expected, found ",
        Quote(head.substr(0, kNpyMagic.size()))));
  }
  if (file_size < kNpyV1Preamble || head.size() < kNpyV1Preamble) {
    return absl::InvalidArgumentError(absl::StrCat(
        file, ": truncated .npy file: at least ", kNpyV1Preamble,
        " bytes expected, found ", file_size));
  }
  const int major = static_cast<unsigned char>(head[6]);
  const int minor = static_cast<unsigned char>(head[7]);
  if ((major != 1 && major != 2 && major != 3) || minor != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": .npy format version 1.0, 2.0 or 3.0 expected, "
                           "found ",
                     major, ".", minor));
  }
  size_t preamble = kNpyV1Preamble;
  uint64_t header_len = 0;
  if (major == 1) {
    header_len = LoadLe(head.substr(8), 2);
  } else {
    if (file_size < kNpyV2Preamble || head.size() < kNpyV2Preamble) {
      return absl::InvalidArgumentError(absl::StrCat(
          file, ": truncated .npy file: ", kNpyV2Preamble,
          " bytes of preamble expected, found ", file_size));
    }
    preamble = kNpyV2Preamble;
    header_len = LoadLe(head.substr(8), 4);
  }
  if (header_len > file_size - preamble) {
    return absl::InvalidArgumentError(absl::StrCat(
        file, ": header length ", header_len, " runs past the end of the file (",
        file_size - preamble, " bytes after the preamble)"));
  }
  if (header_len > kMaxNpyHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": header of at most ", kMaxNpyHeaderBytes,
                     " bytes expected, found ", header_len));
  }
  TC_ASSIGN_OR_RETURN(std::string header,
                      read_header(preamble, static_cast<size_t>(header_len)));
  std::string descr;
  bool fortran_order = false;
  NpyLayout layout;
  NpyHeaderParser parser(header, file);
  TC_RETURN_IF_ERROR(parser.Parse(&descr, &fortran_order, &layout.shape));
  TC_ASSIGN_OR_RETURN(layout.dtype, NpyDescrToDType(descr, file, options));
  TC_ASSIGN_OR_RETURN(
      const int64_t numel,
      NumelFor(layout.shape, ItemSize(layout.dtype), std::string(file)));
  if (fortran_order) {
    return absl::InvalidArgumentError(absl::StrCat(
        file, ": fortran_order: True is not supported; a C-order array "
              "expected (numpy: np.ascontiguousarray(a))"));
  }
  layout.data_offset = preamble + header_len;
  layout.data_bytes =
      static_cast<uint64_t>(numel) * static_cast<uint64_t>(ItemSize(layout.dtype));
  const uint64_t available = file_size - layout.data_offset;
  if (available != layout.data_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        file, ": ", layout.data_bytes, " bytes of data expected for shape ",
        ShapeString(layout.shape), " of ", DTypeName(layout.dtype), " (",
        numel, " x ", ItemSize(layout.dtype), "), found ", available,
        available < layout.data_bytes ? " (truncated file)"
                                      : " (trailing bytes)"));
  }
  return layout;
}

// ---------------------------------------------------------------- safetensors

using Json = nlohmann::json;

struct StEntry {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

// Item size of every dtype the safetensors format defines (0: unknown).
size_t SafetensorsItemSize(absl::string_view d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "BOOL" || d == "U8" || d == "I8" || d == "F8_E5M2" ||
      d == "F8_E4M3") {
    return 1;
  }
  return 0;
}

std::optional<DType> SafetensorsDType(absl::string_view d) {
  if (d == "F64") return DType::kFloat64;
  if (d == "F32") return DType::kFloat32;
  if (d == "F16") return DType::kFloat16;
  if (d == "BF16") return DType::kBFloat16;
  return std::nullopt;
}

// Rejects JSON nested deeper than kMaxJsonDepth before it is parsed, so a
// header of a million '[' cannot exhaust anything.
absl::Status CheckJsonDepth(absl::string_view s, absl::string_view file) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > kMaxJsonDepth) {
        return absl::InvalidArgumentError(absl::StrCat(
            file, ": safetensors header nested deeper than ", kMaxJsonDepth,
            " levels"));
      }
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return absl::OkStatus();
}

std::string ListNames(const std::vector<StEntry>& entries) {
  std::vector<std::string> names;
  for (const StEntry& e : entries) names.push_back(Short(e.name));
  std::sort(names.begin(), names.end());
  constexpr size_t kMaxListed = 20;
  std::string out;
  for (size_t i = 0; i < names.size() && i < kMaxListed; ++i) {
    absl::StrAppend(&out, i ? ", " : "", names[i]);
  }
  if (names.size() > kMaxListed) {
    absl::StrAppend(&out, ", ... (", names.size() - kMaxListed, " more)");
  }
  if (names.empty()) out = "(none)";
  return out;
}

// A JSON value for a message, cut to a readable length.
std::string DumpShort(const Json& j) {
  std::string s = j.dump(-1, ' ', /*ensure_ascii=*/true);
  if (s.size() > 60) s = s.substr(0, 60) + "...";
  return s;
}

absl::StatusOr<std::vector<StEntry>> ParseSafetensorsHeaderImpl(
    absl::string_view header, uint64_t data_size, absl::string_view file);

// Parses and validates a whole safetensors header. `data_size` is the size
// of the byte buffer after the header.
absl::StatusOr<std::vector<StEntry>> ParseSafetensorsHeader(
    absl::string_view header, uint64_t data_size, absl::string_view file) {
  // The checks below test types before every access; this is a backstop
  // so that no nlohmann exception can escape.
  try {
    return ParseSafetensorsHeaderImpl(header, data_size, file);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": malformed safetensors header: ", e.what()));
  }
}

absl::StatusOr<std::vector<StEntry>> ParseSafetensorsHeaderImpl(
    absl::string_view header, uint64_t data_size, absl::string_view file) {
  TC_RETURN_IF_ERROR(CheckJsonDepth(header, file));
  Json j = Json::parse(header.begin(), header.end(), /*cb=*/nullptr,
                       /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": safetensors header is not valid JSON"));
  }
  if (!j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        file, ": safetensors header: a JSON object expected, found ",
        j.type_name()));
  }
  std::vector<StEntry> entries;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const Json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) {
        return absl::InvalidArgumentError(absl::StrCat(
            file, ": '__metadata__': a JSON object expected, found ",
            v.type_name()));
      }
      continue;
    }
    const std::string what = absl::StrCat(file, ": tensor '", Short(name), "'");
    if (!v.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": a JSON object expected, found ", v.type_name()));
    }
    StEntry e;
    e.name = name;
    auto dt = v.find("dtype");
    if (dt == v.end() || !dt->is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": a string 'dtype' expected"));
    }
    e.dtype = dt->get<std::string>();
    auto sh = v.find("shape");
    if (sh == v.end() || !sh->is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": an array 'shape' expected"));
    }
    if (sh->size() > static_cast<size_t>(kMaxRank)) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": rank at most ", kMaxRank, " expected, found ", sh->size()));
    }
    for (const Json& d : *sh) {
      if (d.is_number_unsigned() &&
          d.get<uint64_t>() <=
              static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        e.shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
      } else {
        return absl::InvalidArgumentError(absl::StrCat(
            what, ": shape: non-negative integer dimensions expected, found ",
            DumpShort(d)));
      }
    }
    auto off = v.find("data_offsets");
    if (off == v.end() || !off->is_array() || off->size() != 2 ||
        !(*off)[0].is_number_unsigned() || !(*off)[1].is_number_unsigned()) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": 'data_offsets' [begin, end] of two non-negative integers "
                "expected, found ",
          off == v.end() ? std::string("nothing") : DumpShort(*off)));
    }
    e.begin = (*off)[0].get<uint64_t>();
    e.end = (*off)[1].get<uint64_t>();
    if (e.end < e.begin) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": data_offsets [", e.begin, ", ", e.end,
          "]: end >= begin expected"));
    }
    if (e.end > data_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": data_offsets [", e.begin, ", ", e.end,
          "] out of range: the data section holds ", data_size, " bytes"));
    }
    const size_t itemsize = SafetensorsItemSize(e.dtype);
    if (itemsize != 0) {
      TC_ASSIGN_OR_RETURN(const int64_t numel, NumelFor(e.shape, itemsize, what));
      const uint64_t expected =
          static_cast<uint64_t>(numel) * static_cast<uint64_t>(itemsize);
      if (expected != e.end - e.begin) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, ": ", expected, " bytes expected for shape ",
            ShapeString(e.shape), " of ", e.dtype, ", data_offsets [", e.begin,
            ", ", e.end, "] span ", e.end - e.begin));
      }
    }
    entries.push_back(std::move(e));
  }
  // No two tensors may share bytes.
  std::vector<const StEntry*> by_begin;
  for (const StEntry& e : entries) {
    if (e.end > e.begin) by_begin.push_back(&e);
  }
  std::sort(by_begin.begin(), by_begin.end(),
            [](const StEntry* a, const StEntry* b) {
              return std::tie(a->begin, a->end, a->name) <
                     std::tie(b->begin, b->end, b->name);
            });
  for (size_t i = 1; i < by_begin.size(); ++i) {
    const StEntry& a = *by_begin[i - 1];
    const StEntry& b = *by_begin[i];
    if (b.begin < a.end) {
      return absl::InvalidArgumentError(absl::StrCat(
          file, ": tensors '", Short(a.name), "' [", a.begin, ", ", a.end,
          ") and '", Short(b.name), "' [", b.begin, ", ", b.end, ") overlap"));
    }
  }
  return entries;
}

// Validates the 8-byte length prefix; returns the header length.
absl::StatusOr<uint64_t> SafetensorsHeaderLength(absl::string_view first8,
                                                 uint64_t file_size,
                                                 absl::string_view file) {
  if (file_size < 8 || first8.size() < 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        file, ": truncated safetensors file: an 8-byte header length "
              "expected, found ",
        file_size, " bytes"));
  }
  const uint64_t n = LoadLe(first8, 8);
  if (n > static_cast<uint64_t>(kMaxSafetensorsHeaderBytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        file, ": safetensors header length of at most ",
        kMaxSafetensorsHeaderBytes, " bytes expected, found ", n));
  }
  if (n > file_size - 8) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": safetensors header length ", n,
                     " runs past the end of the file (", file_size - 8,
                     " bytes after the length)"));
  }
  return n;
}

// Selects `tensor_name` among validated entries and checks its dtype.
absl::StatusOr<const StEntry*> SelectEntry(const std::vector<StEntry>& entries,
                                           absl::string_view tensor_name,
                                           absl::string_view file,
                                           const TensorReadOptions& options,
                                           DType* dtype) {
  const StEntry* found = nullptr;
  for (const StEntry& e : entries) {
    if (e.name == tensor_name) found = &e;
  }
  if (found == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": no tensor named '", Short(tensor_name),
                     "'; available: ", ListNames(entries)));
  }
  const std::optional<DType> d = SafetensorsDType(found->dtype);
  if (!d.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        file, ": tensor '", tensor_name, "': dtype F64, F32, F16 or BF16 "
        "expected, found ",
        Quote(found->dtype),
        SafetensorsItemSize(found->dtype) == 0 ? " (unknown dtype)" : ""));
  }
  if (options.expected_dtype.has_value() && *options.expected_dtype != *d) {
    return absl::InvalidArgumentError(absl::StrCat(
        file, ": tensor '", tensor_name, "': dtype ",
        DTypeName(*options.expected_dtype), " expected (--dtype), found ",
        found->dtype));
  }
  *dtype = *d;
  return found;
}

// In-memory contents are held to the same size limit as files.
absl::Status CheckFileSize(absl::string_view bytes, absl::string_view file_name,
                           const TensorReadOptions& options) {
  if (bytes.size() > static_cast<uint64_t>(options.max_file_bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat(file_name, ": file of at most ", options.max_file_bytes,
                     " bytes expected, found ", bytes.size()));
  }
  return absl::OkStatus();
}

}  // namespace

// ---------------------------------------------------------------- public

absl::StatusOr<Tensor> ParseNpy(absl::string_view bytes,
                                absl::string_view file_name,
                                const TensorReadOptions& options) {
  TC_RETURN_IF_ERROR(CheckFileSize(bytes, file_name, options));
  auto read_header = [&](size_t offset,
                         size_t n) -> absl::StatusOr<std::string> {
    return std::string(bytes.substr(offset, n));
  };
  TC_ASSIGN_OR_RETURN(
      NpyLayout layout,
      ParseNpyLayout(bytes.substr(0, kNpyV2Preamble), bytes.size(), file_name,
                     options, read_header));
  return Tensor::FromBytes(layout.dtype, layout.shape,
                           bytes.substr(layout.data_offset));
}

absl::StatusOr<Tensor> ReadNpyFile(const std::string& path,
                                   const TensorReadOptions& options) {
  TC_ASSIGN_OR_RETURN(File f, File::Open(path, options.max_file_bytes));
  TC_ASSIGN_OR_RETURN(
      std::string head,
      f.ReadString(0, static_cast<size_t>(std::min<uint64_t>(f.size(),
                                                             kNpyV2Preamble))));
  auto read_header = [&](size_t offset,
                         size_t n) -> absl::StatusOr<std::string> {
    return f.ReadString(offset, n);
  };
  TC_ASSIGN_OR_RETURN(NpyLayout layout, ParseNpyLayout(head, f.size(), path,
                                                       options, read_header));
  TC_ASSIGN_OR_RETURN(Tensor t, Tensor::Create(layout.dtype, layout.shape));
  TC_RETURN_IF_ERROR(f.ReadAt(layout.data_offset, t.nbytes(),
                              static_cast<char*>(t.raw())));
  return t;
}

absl::StatusOr<Tensor> ParseSafetensors(absl::string_view bytes,
                                        absl::string_view tensor_name,
                                        absl::string_view file_name,
                                        const TensorReadOptions& options) {
  TC_RETURN_IF_ERROR(CheckFileSize(bytes, file_name, options));
  TC_ASSIGN_OR_RETURN(
      const uint64_t n,
      SafetensorsHeaderLength(bytes.substr(0, 8), bytes.size(), file_name));
  const uint64_t data_start = 8 + n;
  TC_ASSIGN_OR_RETURN(
      std::vector<StEntry> entries,
      ParseSafetensorsHeader(bytes.substr(8, n), bytes.size() - data_start,
                             file_name));
  DType dtype;
  TC_ASSIGN_OR_RETURN(const StEntry* e, SelectEntry(entries, tensor_name,
                                                    file_name, options, &dtype));
  return Tensor::FromBytes(
      dtype, e->shape, bytes.substr(data_start + e->begin, e->end - e->begin));
}

namespace {

absl::StatusOr<std::vector<StEntry>> ReadSafetensorsEntries(
    const File& f, const std::string& path, uint64_t* data_start) {
  TC_ASSIGN_OR_RETURN(
      std::string first8,
      f.ReadString(0, static_cast<size_t>(std::min<uint64_t>(f.size(), 8))));
  TC_ASSIGN_OR_RETURN(const uint64_t n,
                      SafetensorsHeaderLength(first8, f.size(), path));
  TC_ASSIGN_OR_RETURN(std::string header,
                      f.ReadString(8, static_cast<size_t>(n)));
  *data_start = 8 + n;
  return ParseSafetensorsHeader(header, f.size() - *data_start, path);
}

}  // namespace

absl::StatusOr<Tensor> ReadSafetensorsFile(const std::string& path,
                                           absl::string_view tensor_name,
                                           const TensorReadOptions& options) {
  TC_ASSIGN_OR_RETURN(File f, File::Open(path, options.max_file_bytes));
  uint64_t data_start = 0;
  TC_ASSIGN_OR_RETURN(std::vector<StEntry> entries,
                      ReadSafetensorsEntries(f, path, &data_start));
  DType dtype;
  TC_ASSIGN_OR_RETURN(const StEntry* e,
                      SelectEntry(entries, tensor_name, path, options, &dtype));
  TC_ASSIGN_OR_RETURN(Tensor t, Tensor::Create(dtype, e->shape));
  TC_RETURN_IF_ERROR(
      f.ReadAt(data_start + e->begin, t.nbytes(), static_cast<char*>(t.raw())));
  return t;
}

absl::StatusOr<std::vector<std::string>> ListSafetensors(
    const std::string& path, const TensorReadOptions& options) {
  TC_ASSIGN_OR_RETURN(File f, File::Open(path, options.max_file_bytes));
  uint64_t data_start = 0;
  TC_ASSIGN_OR_RETURN(std::vector<StEntry> entries,
                      ReadSafetensorsEntries(f, path, &data_start));
  std::vector<std::string> names;
  for (const StEntry& e : entries) names.push_back(e.name);
  std::sort(names.begin(), names.end());
  return names;
}

absl::StatusOr<Tensor> ReadTensorArg(absl::string_view arg,
                                     const TensorReadOptions& options) {
  constexpr absl::string_view kSt = ".safetensors";
  if (absl::EndsWith(arg, ".npy")) return ReadNpyFile(std::string(arg), options);
  const size_t pos = arg.rfind(absl::StrCat(kSt, ":"));
  if (pos != absl::string_view::npos) {
    const std::string path(arg.substr(0, pos + kSt.size()));
    const absl::string_view name = arg.substr(pos + kSt.size() + 1);
    if (name.empty()) {
      auto names = ListSafetensors(path, options);
      if (!names.ok()) return names.status();
      return absl::InvalidArgumentError(absl::StrCat(
          "'", arg, "': a tensor name expected after ':'; available: ",
          names->empty() ? "(none)" : absl::StrJoin(*names, ", ")));
    }
    return ReadSafetensorsFile(path, name, options);
  }
  if (absl::EndsWith(arg, kSt)) {
    auto names = ListSafetensors(std::string(arg), options);
    if (!names.ok()) return names.status();
    return absl::InvalidArgumentError(absl::StrCat(
        "'", arg, "': name the tensor as FILE.safetensors:TENSOR; available: ",
        names->empty() ? "(none)" : absl::StrJoin(*names, ", ")));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "'", arg, "': a tensor argument FILE.npy or FILE.safetensors:TENSOR "
                "expected"));
}

std::string EncodeNpy(const Tensor& t, Bf16NpyEncoding bf16) {
  const bool widen_bf16 =
      t.dtype() == DType::kBFloat16 && bf16 == Bf16NpyEncoding::kFloat32;
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
  }
  std::string shape = "(";
  for (size_t i = 0; i < t.shape().size(); ++i) {
    absl::StrAppend(&shape, i ? ", " : "", t.shape()[i]);
  }
  if (t.shape().size() == 1) shape += ",";
  shape += ")";
  std::string dict = absl::StrCat("{'descr': '", descr,
                                  "', 'fortran_order': False, 'shape': ",
                                  shape, ", }");
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
      std::memcpy(&out[start + static_cast<size_t>(i) * sizeof(float)], &f,
                  sizeof(float));
    }
  } else {
    out.append(t.bytes().data(), t.bytes().size());
  }
  return out;
}

absl::Status WriteNpyFile(const std::string& path, const Tensor& t,
                          Bf16NpyEncoding bf16) {
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
