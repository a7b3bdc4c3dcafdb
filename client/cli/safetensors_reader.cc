// Reading .safetensors files (declared in tensor_io.h): the JSON header
// validated whole (offsets in range, no overlaps, sizes that match dtype
// and shape), then only the requested tensor's bytes read.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cli/internal/tensor_file.h"
#include "client/cli/tensor_io.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"

namespace tensorcheck::cli {

using internal::CheckFileSize;
using internal::File;
using internal::LoadLe;
using internal::NumelFor;
using internal::Quote;
using internal::Short;

namespace {

// A safetensors header needs depth 3 ({name: {shape: [..]}}).
constexpr int kMaxJsonDepth = 16;

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
  if (d == "BOOL" || d == "U8" || d == "I8" || d == "F8_E5M2" || d == "F8_E4M3" || d == "F8_E8M0" ||
      d == "E8M0") {
    return 1;
  }
  return 0;
}

// safetensors' F4 (torch.float4_e2m1fn_x2): its shape counts elements, two
// to a byte (the format's 4-bit dtype). Not numpy's "f4", which is float32.
bool IsSafetensorsF4(absl::string_view d) { return d == "F4"; }

std::optional<DType> SafetensorsDType(absl::string_view d) {
  if (d == "F64") return DType::kFloat64;
  if (d == "F32") return DType::kFloat32;
  if (d == "F16") return DType::kFloat16;
  if (d == "BF16") return DType::kBFloat16;
  // safetensors' F8_E4M3 is torch's float8_e4m3fn (no infinities).
  if (d == "F8_E4M3") return DType::kFloat8E4M3Fn;
  if (d == "F8_E5M2") return DType::kFloat8E5M2;
  if (IsSafetensorsF4(d)) return DType::kFloat4E2M1Fn;
  // F8_E8M0 is the format's name for torch.float8_e8m0fnu (what
  // safetensors writes, and DeepSeek's block scales use); E8M0 is read too.
  if (d == "F8_E8M0" || d == "E8M0") return DType::kFloat8E8M0Fnu;
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
            file, ": safetensors header nested deeper than ", kMaxJsonDepth, " levels"));
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
    absl::string_view header, uint64_t data_size, absl::string_view file,
    std::map<std::string, std::string>* metadata);

// Parses and validates a whole safetensors header. `data_size` is the size
// of the byte buffer after the header.
absl::StatusOr<std::vector<StEntry>> ParseSafetensorsHeader(
    absl::string_view header, uint64_t data_size, absl::string_view file,
    std::map<std::string, std::string>* metadata = nullptr) {
  // The checks below test types before every access; this is a backstop
  // so that no nlohmann exception can escape.
  try {
    return ParseSafetensorsHeaderImpl(header, data_size, file, metadata);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": malformed safetensors header: ", e.what()));
  }
}

absl::StatusOr<std::vector<StEntry>> ParseSafetensorsHeaderImpl(
    absl::string_view header, uint64_t data_size, absl::string_view file,
    std::map<std::string, std::string>* metadata) {
  TC_RETURN_IF_ERROR(CheckJsonDepth(header, file));
  Json j = Json::parse(header.begin(), header.end(), /*cb=*/nullptr,
                       /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": safetensors header is not valid JSON"));
  }
  if (!j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": safetensors header: a JSON object expected, found ", j.type_name()));
  }
  std::vector<StEntry> entries;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const Json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) {
        return absl::InvalidArgumentError(
            absl::StrCat(file, ": '__metadata__': a JSON object expected, found ", v.type_name()));
      }
      if (metadata != nullptr) {
        for (auto m = v.begin(); m != v.end(); ++m) {
          (*metadata)[m.key()] =
              m.value().is_string() ? m.value().get<std::string>() : m.value().dump(-1, ' ', true);
        }
      }
      continue;
    }
    const std::string what = absl::StrCat(file, ": tensor '", Short(name), "'");
    if (!v.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": a JSON object expected, found ", v.type_name()));
    }
    StEntry e;
    e.name = name;
    auto dt = v.find("dtype");
    if (dt == v.end() || !dt->is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": a string 'dtype' expected"));
    }
    e.dtype = dt->get<std::string>();
    auto sh = v.find("shape");
    if (sh == v.end() || !sh->is_array()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": an array 'shape' expected"));
    }
    if (sh->size() > static_cast<size_t>(kMaxRank)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": rank at most ", kMaxRank, " expected, found ", sh->size()));
    }
    for (const Json& d : *sh) {
      if (d.is_number_unsigned() &&
          d.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        e.shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
      } else {
        return absl::InvalidArgumentError(absl::StrCat(
            what, ": shape: non-negative integer dimensions expected, found ", DumpShort(d)));
      }
    }
    auto off = v.find("data_offsets");
    if (off == v.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
        !(*off)[1].is_number_unsigned()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what,
                       ": 'data_offsets' [begin, end] of two non-negative integers "
                       "expected, found ",
                       off == v.end() ? std::string("nothing") : DumpShort(*off)));
    }
    e.begin = (*off)[0].get<uint64_t>();
    e.end = (*off)[1].get<uint64_t>();
    if (e.end < e.begin) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": data_offsets [", e.begin, ", ", e.end, "]: end >= begin expected"));
    }
    if (e.end > data_size) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": data_offsets [", e.begin, ", ", e.end,
                                                     "] out of range: the data section holds ",
                                                     data_size, " bytes"));
    }
    const size_t itemsize = SafetensorsItemSize(e.dtype);
    if (IsSafetensorsF4(e.dtype)) {
      TC_ASSIGN_OR_RETURN(const int64_t numel, NumelFor(e.shape, 1, what));
      if (numel % 2 != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": shape ", ShapeString(e.shape), " of F4 holds ", numel,
                         " elements; an even count expected (two to a byte)"));
      }
      const uint64_t expected = static_cast<uint64_t>(numel) / 2;
      if (expected != e.end - e.begin) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": ", expected, " bytes expected for shape ", ShapeString(e.shape),
                         " of F4 (two elements to a byte), data_offsets [", e.begin, ", ", e.end,
                         "] span ", e.end - e.begin));
      }
    } else if (itemsize != 0) {
      TC_ASSIGN_OR_RETURN(const int64_t numel, NumelFor(e.shape, itemsize, what));
      const uint64_t expected = static_cast<uint64_t>(numel) * static_cast<uint64_t>(itemsize);
      if (expected != e.end - e.begin) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, ": ", expected, " bytes expected for shape ", ShapeString(e.shape), " of ",
            e.dtype, ", data_offsets [", e.begin, ", ", e.end, "] span ", e.end - e.begin));
      }
    }
    entries.push_back(std::move(e));
  }
  // No two tensors may share bytes.
  std::vector<const StEntry*> by_begin;
  for (const StEntry& e : entries) {
    if (e.end > e.begin) by_begin.push_back(&e);
  }
  std::sort(by_begin.begin(), by_begin.end(), [](const StEntry* a, const StEntry* b) {
    return std::tie(a->begin, a->end, a->name) < std::tie(b->begin, b->end, b->name);
  });
  for (size_t i = 1; i < by_begin.size(); ++i) {
    const StEntry& a = *by_begin[i - 1];
    const StEntry& b = *by_begin[i];
    if (b.begin < a.end) {
      return absl::InvalidArgumentError(absl::StrCat(file, ": tensors '", Short(a.name), "' [",
                                                     a.begin, ", ", a.end, ") and '", Short(b.name),
                                                     "' [", b.begin, ", ", b.end, ") overlap"));
    }
  }
  return entries;
}

// Validates the 8-byte length prefix; returns the header length.
absl::StatusOr<uint64_t> SafetensorsHeaderLength(absl::string_view first8, uint64_t file_size,
                                                 absl::string_view file) {
  if (file_size < 8 || first8.size() < 8) {
    return absl::InvalidArgumentError(
        absl::StrCat(file,
                     ": truncated safetensors file: an 8-byte header length "
                     "expected, found ",
                     file_size, " bytes"));
  }
  const uint64_t n = LoadLe(first8, 8);
  if (n > static_cast<uint64_t>(kMaxSafetensorsHeaderBytes)) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": safetensors header length of at most ",
                                                   kMaxSafetensorsHeaderBytes,
                                                   " bytes expected, found ", n));
  }
  if (n > file_size - 8) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": safetensors header length ", n,
                                                   " runs past the end of the file (",
                                                   file_size - 8, " bytes after the length)"));
  }
  return n;
}

// Selects `tensor_name` among validated entries and checks its dtype.
absl::StatusOr<const StEntry*> SelectEntry(const std::vector<StEntry>& entries,
                                           absl::string_view tensor_name, absl::string_view file,
                                           const TensorReadOptions& options, DType* dtype) {
  const StEntry* found = nullptr;
  for (const StEntry& e : entries) {
    if (e.name == tensor_name) found = &e;
  }
  if (found == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": no tensor named '", Short(tensor_name),
                                                   "'; available: ", ListNames(entries)));
  }
  const std::optional<DType> d = SafetensorsDType(found->dtype);
  if (!d.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": tensor '", tensor_name,
                     "': dtype F64, F32, F16, BF16, F8_E4M3, F8_E5M2, F4 or F8_E8M0 "
                     "expected, found ",
                     Quote(found->dtype),
                     SafetensorsItemSize(found->dtype) == 0 && !IsSafetensorsF4(found->dtype)
                         ? " (unknown dtype)"
                         : ""));
  }
  if (options.expected_dtype.has_value() && *options.expected_dtype != *d &&
      std::find(options.also_named.begin(), options.also_named.end(), *d) ==
          options.also_named.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        file, ": tensor '", tensor_name, "': dtype ", DTypeName(*options.expected_dtype),
        " expected (", options.expected_by, "), found ", found->dtype));
  }
  *dtype = *d;
  return found;
}

}  // namespace

absl::StatusOr<Tensor> ParseSafetensors(absl::string_view bytes, absl::string_view tensor_name,
                                        absl::string_view file_name,
                                        const TensorReadOptions& options) {
  TC_RETURN_IF_ERROR(CheckFileSize(bytes, file_name, options));
  TC_ASSIGN_OR_RETURN(const uint64_t n,
                      SafetensorsHeaderLength(bytes.substr(0, 8), bytes.size(), file_name));
  const uint64_t data_start = 8 + n;
  TC_ASSIGN_OR_RETURN(
      std::vector<StEntry> entries,
      ParseSafetensorsHeader(bytes.substr(8, n), bytes.size() - data_start, file_name));
  DType dtype;
  TC_ASSIGN_OR_RETURN(const StEntry* e,
                      SelectEntry(entries, tensor_name, file_name, options, &dtype));
  return Tensor::FromBytes(dtype, e->shape, bytes.substr(data_start + e->begin, e->end - e->begin));
}

namespace {

absl::StatusOr<std::vector<StEntry>> ReadSafetensorsEntries(
    const File& f, const std::string& path, uint64_t* data_start,
    std::map<std::string, std::string>* metadata = nullptr) {
  TC_ASSIGN_OR_RETURN(std::string first8,
                      f.ReadString(0, static_cast<size_t>(std::min<uint64_t>(f.size(), 8))));
  TC_ASSIGN_OR_RETURN(const uint64_t n, SafetensorsHeaderLength(first8, f.size(), path));
  TC_ASSIGN_OR_RETURN(std::string header, f.ReadString(8, static_cast<size_t>(n)));
  *data_start = 8 + n;
  return ParseSafetensorsHeader(header, f.size() - *data_start, path, metadata);
}

}  // namespace

absl::StatusOr<Tensor> ReadSafetensorsFile(const std::string& path, absl::string_view tensor_name,
                                           const TensorReadOptions& options) {
  TC_ASSIGN_OR_RETURN(File f, File::Open(path, options.max_file_bytes));
  uint64_t data_start = 0;
  TC_ASSIGN_OR_RETURN(std::vector<StEntry> entries, ReadSafetensorsEntries(f, path, &data_start));
  DType dtype;
  TC_ASSIGN_OR_RETURN(const StEntry* e, SelectEntry(entries, tensor_name, path, options, &dtype));
  return f.ReadTensor(data_start + e->begin, dtype, e->shape);
}

absl::StatusOr<std::vector<std::string>> ListSafetensors(const std::string& path,
                                                         const TensorReadOptions& options) {
  TC_ASSIGN_OR_RETURN(File f, File::Open(path, options.max_file_bytes));
  uint64_t data_start = 0;
  TC_ASSIGN_OR_RETURN(std::vector<StEntry> entries, ReadSafetensorsEntries(f, path, &data_start));
  std::vector<std::string> names;
  for (const StEntry& e : entries) names.push_back(e.name);
  std::sort(names.begin(), names.end());
  return names;
}

absl::StatusOr<SafetensorsIndex> ReadSafetensorsIndex(const std::string& path,
                                                      const TensorReadOptions& options) {
  TC_ASSIGN_OR_RETURN(File f, File::Open(path, options.max_file_bytes));
  uint64_t data_start = 0;
  SafetensorsIndex index;
  TC_ASSIGN_OR_RETURN(std::vector<StEntry> entries,
                      ReadSafetensorsEntries(f, path, &data_start, &index.metadata));
  for (StEntry& e : entries) {
    index.tensors.push_back(SafetensorsTensorInfo{std::move(e.name), std::move(e.dtype),
                                                  std::move(e.shape), e.begin, e.end});
  }
  std::sort(index.tensors.begin(), index.tensors.end(),
            [](const SafetensorsTensorInfo& a, const SafetensorsTensorInfo& b) {
              return a.name < b.name;
            });
  return index;
}

std::optional<DType> SafetensorsDTypeOf(absl::string_view name) { return SafetensorsDType(name); }

}  // namespace tensorcheck::cli
