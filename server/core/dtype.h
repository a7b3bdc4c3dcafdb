// Storage dtypes of tensors.
//
//   DType d = DType::kBFloat16;
//   ItemSize(d) == 2;  DTypeName(d) == "bfloat16";
//   ParseDType("bf16") -> DType::kBFloat16
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tensorcheck {

enum class DType { kFloat64, kFloat32, kFloat16, kBFloat16 };

inline constexpr DType kAllDTypes[] = {DType::kFloat64, DType::kFloat32, DType::kFloat16,
                                       DType::kBFloat16};

// Bytes per element.
size_t ItemSize(DType dtype);

// Canonical name: "float64", "float32", "float16", "bfloat16".
absl::string_view DTypeName(DType dtype);

// Short name used in configurations and logs: "fp64", "fp32", "fp16", "bf16".
absl::string_view DTypeShortName(DType dtype);

// Accepts canonical and short names, and numpy/torch spellings ("f4",
// "float", "half", "bfloat16", ...). INVALID_ARGUMENT names what came.
absl::StatusOr<DType> ParseDType(absl::string_view name);

}  // namespace tensorcheck
