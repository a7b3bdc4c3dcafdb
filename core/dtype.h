// Storage dtypes of tensors.
//
//   DType d = DType::kBFloat16;
//   ItemSize(d) == 2;  DTypeName(d) == "bfloat16";
//   ParseDType("bf16") -> DType::kBFloat16
//   IsFp8(DType::kFloat8E4M3Fn) == true;  ItemSize(DType::kFloat8E4M3Fn) == 1
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/float_formats.h"

namespace tensorcheck {

enum class DType { kFloat64, kFloat32, kFloat16, kBFloat16, kFloat8E4M3Fn, kFloat8E5M2 };

// The dtypes any tensor may have: outputs, biases and observed outputs
// too. Arithmetic and comparisons happen in these.
inline constexpr DType kWideDTypes[] = {DType::kFloat64, DType::kFloat32, DType::kFloat16,
                                        DType::kBFloat16};
// Storage of the inputs and weights of the fp8 precisions only
// (docs/numerics.md, "FP8").
inline constexpr DType kFp8DTypes[] = {DType::kFloat8E4M3Fn, DType::kFloat8E5M2};
inline constexpr DType kAllDTypes[] = {DType::kFloat64,  DType::kFloat32,      DType::kFloat16,
                                       DType::kBFloat16, DType::kFloat8E4M3Fn, DType::kFloat8E5M2};

inline bool IsFp8(DType dtype) {
  return dtype == DType::kFloat8E4M3Fn || dtype == DType::kFloat8E5M2;
}

// The FP8 format of an FP8 dtype; nullopt for the others.
std::optional<Fp8Format> Fp8FormatOf(DType dtype);

// Bytes per element.
size_t ItemSize(DType dtype);

// Canonical name: "float64", "float32", "float16", "bfloat16",
// "float8_e4m3fn", "float8_e5m2" (torch's and ml_dtypes' names).
absl::string_view DTypeName(DType dtype);

// Short name used in configurations and logs: "fp64", "fp32", "fp16", "bf16",
// "fp8e4m3", "fp8e5m2".
absl::string_view DTypeShortName(DType dtype);

// Accepts canonical and short names, and numpy/torch/safetensors
// spellings ("f4", "float", "half", "bfloat16", "F8_E4M3", "e5m2", ...). INVALID_ARGUMENT names
// what came.
absl::StatusOr<DType> ParseDType(absl::string_view name);

}  // namespace tensorcheck
