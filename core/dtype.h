// Storage dtypes of tensors.
//
//   DType d = DType::kBFloat16;
//   ItemSize(d) == 2;  DTypeName(d) == "bfloat16";
//   ParseDType("bf16") -> DType::kBFloat16
//   IsFp8(DType::kFloat8E4M3Fn) == true;  ItemSize(DType::kFloat8E4M3Fn) == 1
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/float_formats.h"

namespace tensorcheck {

enum class DType {
  kFloat64,
  kFloat32,
  kFloat16,
  kBFloat16,
  kFloat8E4M3Fn,
  kFloat8E5M2,
  // OCP FP4 E2M1 (torch.float4_e2m1fn_x2's elements, ml_dtypes
  // float4_e2m1fn), packed two per byte, element 2i in the low nibble:
  // NVFP4's values (docs/numerics.md, "MXFP8 and NVFP4").
  kFloat4E2M1Fn,
  // UE8M0 (torch.float8_e8m0fnu): 2^(bits - 127), 0xff NaN. MXFP8's block
  // scales only.
  kFloat8E8M0Fnu,
};

// The dtypes any tensor may have: outputs, biases and observed outputs
// too. Arithmetic and comparisons happen in these.
inline constexpr DType kWideDTypes[] = {DType::kFloat64, DType::kFloat32, DType::kFloat16,
                                        DType::kBFloat16};
// Storage of the inputs and weights of the fp8 precisions only
// (docs/numerics.md, "FP8").
inline constexpr DType kFp8DTypes[] = {DType::kFloat8E4M3Fn, DType::kFloat8E5M2};
// Storage of inputs and weights: the wide dtypes, FP8 and FP4 (the scale
// dtype float8_e8m0fnu is not one).
inline constexpr DType kAllDTypes[] = {
    DType::kFloat64,      DType::kFloat32,    DType::kFloat16,     DType::kBFloat16,
    DType::kFloat8E4M3Fn, DType::kFloat8E5M2, DType::kFloat4E2M1Fn};

inline bool IsFp8(DType dtype) {
  return dtype == DType::kFloat8E4M3Fn || dtype == DType::kFloat8E5M2;
}

// The FP8 format of an FP8 dtype; nullopt for the others.
std::optional<Fp8Format> Fp8FormatOf(DType dtype);

// Bytes per element; 1 for FP4, whose bytes hold two (StorageBytes).
size_t ItemSize(DType dtype);

// Bytes of `numel` elements: numel * ItemSize, or ceil(numel / 2) for FP4.
inline int64_t StorageBytes(DType dtype, int64_t numel) {
  return dtype == DType::kFloat4E2M1Fn ? (numel + 1) / 2
                                       : numel * static_cast<int64_t>(ItemSize(dtype));
}

// The narrow operands' dtypes: FP8 and FP4 (never an output, bias or
// observed dtype).
inline bool IsNarrow(DType dtype) { return IsFp8(dtype) || dtype == DType::kFloat4E2M1Fn; }

// Canonical name: "float64", "float32", "float16", "bfloat16",
// "float8_e4m3fn", "float8_e5m2", "float4_e2m1fn", "float8_e8m0fnu"
// (torch's and ml_dtypes' names).
absl::string_view DTypeName(DType dtype);

// Short name used in configurations and logs: "fp64", "fp32", "fp16", "bf16",
// "fp8e4m3", "fp8e5m2", "fp4e2m1", "e8m0".
absl::string_view DTypeShortName(DType dtype);

// Accepts canonical and short names, and numpy/torch/safetensors
// spellings ("f4", "float", "half", "bfloat16", "F8_E4M3", "e5m2", ...). INVALID_ARGUMENT names
// what came.
absl::StatusOr<DType> ParseDType(absl::string_view name);

}  // namespace tensorcheck
