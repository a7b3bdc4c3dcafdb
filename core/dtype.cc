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
    case DType::kFloat4E2M1Fn:
    case DType::kFloat8E8M0Fnu:
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
    case DType::kFloat4E2M1Fn:
      return "float4_e2m1fn";
    case DType::kFloat8E8M0Fnu:
      return "float8_e8m0fnu";
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
    case DType::kFloat4E2M1Fn:
      return "fp4e2m1";
    case DType::kFloat8E8M0Fnu:
      return "e8m0";
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
  // safetensors writes E8M0 for torch's float8_e8m0fnu.
  if (n == "float4_e2m1fn" || n == "fp4e2m1" || n == "float4_e2m1fn_x2" || n == "e2m1") {
    return DType::kFloat4E2M1Fn;
  }
  if (n == "float8_e8m0fnu" || n == "e8m0" || n == "ue8m0" || n == "f8_e8m0") {
    return DType::kFloat8E8M0Fnu;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype '", name,
                   "': expected one of float64, float32, float16, bfloat16, float8_e4m3fn, "
                   "float8_e5m2, float4_e2m1fn, float8_e8m0fnu"));
}

}  // namespace tensorcheck
