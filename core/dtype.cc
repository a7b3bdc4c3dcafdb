#include "core/dtype.h"

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
    case DType::kFloat8E4M3Fn:
    case DType::kFloat8E5M2:
      return 1;
  }
  return 0;
}

std::optional<Fp8Format> Fp8FormatOf(DType dtype) {
  if (dtype == DType::kFloat8E4M3Fn) return Fp8Format::kE4M3Fn;
  if (dtype == DType::kFloat8E5M2) return Fp8Format::kE5M2;
  return std::nullopt;
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
    case DType::kFloat8E4M3Fn:
      return "float8_e4m3fn";
    case DType::kFloat8E5M2:
      return "float8_e5m2";
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
    case DType::kFloat8E4M3Fn:
      return "fp8e4m3";
    case DType::kFloat8E5M2:
      return "fp8e5m2";
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
  // safetensors writes F8_E4M3 for torch's float8_e4m3fn.
  if (n == "float8_e4m3fn" || n == "fp8e4m3" || n == "f8e4m3fn" || n == "f8_e4m3" || n == "e4m3" ||
      n == "e4m3fn") {
    return DType::kFloat8E4M3Fn;
  }
  if (n == "float8_e5m2" || n == "fp8e5m2" || n == "f8e5m2" || n == "f8_e5m2" || n == "e5m2") {
    return DType::kFloat8E5M2;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype '", name,
                   "': expected one of float64, float32, float16, bfloat16, float8_e4m3fn, "
                   "float8_e5m2"));
}

}  // namespace tensorcheck
