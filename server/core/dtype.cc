#include "server/core/dtype.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace tensorcheck {

size_t ItemSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat64:
      return 8;
    case DType::kFloat32:
      return 4;
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
  }
  return 0;
}

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat64:
      return "float64";
    case DType::kFloat32:
      return "float32";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
  }
  return "unknown";
}

absl::string_view DTypeShortName(DType dtype) {
  switch (dtype) {
    case DType::kFloat64:
      return "fp64";
    case DType::kFloat32:
      return "fp32";
    case DType::kFloat16:
      return "fp16";
    case DType::kBFloat16:
      return "bf16";
  }
  return "unknown";
}

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  const std::string n = absl::AsciiStrToLower(name);
  if (n == "float64" || n == "fp64" || n == "f64" || n == "f8" || n == "double") {
    return DType::kFloat64;
  }
  if (n == "float32" || n == "fp32" || n == "f32" || n == "f4" || n == "float") {
    return DType::kFloat32;
  }
  if (n == "float16" || n == "fp16" || n == "f16" || n == "f2" || n == "half") {
    return DType::kFloat16;
  }
  if (n == "bfloat16" || n == "bf16") return DType::kBFloat16;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown dtype '", name, "': expected one of float64, float32, float16, bfloat16"));
}

}  // namespace tensorcheck
