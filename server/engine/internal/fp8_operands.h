// The FP8 rules of a request (docs/numerics.md, "FP8"), checked before
// anything runs: which operands are FP8, what their scales say, and which
// configurations can multiply them.
//
//   TC_ASSIGN_OR_RETURN(Fp8Request fp8, CheckFp8Operands(req, m, n));
//   ... ResolveConfig(spec, ..., fp8.scaling) ...
//   TC_RETURN_IF_ERROR(CheckFp8Config(config, fp8, req, "configs[0]", spec_text));
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/fp8_scaling.h"
#include "core/layer_shape.h"
#include "core/linear_config.h"
#include "server/engine/engine.h"

namespace tensorcheck {

struct Fp8Request {
  // Input and weight are FP8 (with scales); otherwise both are wide.
  bool fp8_operands = false;
  // What the scales' shapes say; kTensor without scales.
  Fp8Scaling scaling = Fp8Scaling::kTensor;
  // Every scaling the shapes fit, `scaling` first: a 1 x 1 layer's single
  // scales fit per tensor and row-wise, a layer with K <= 128 and N <= 128
  // may fit row-wise and block-wise; a configuration's `scaling` option
  // decides among them.
  std::vector<Fp8Scaling> fitting;
  // Block-wise scales' tiling (scaling kBlock128, MXFP8, NVFP4).
  ScaleBlocks scale_blocks;
  // MXFP8 or NVFP4 operands: their precision, and their block scales in
  // the plain row-major layout (converted from cuBLASLt's swizzled one
  // when they came so), which the layer takes instead of the request's.
  std::optional<Precision> block_precision;
  std::optional<Tensor> input_scale, weight_scale;
};

// INVALID_ARGUMENT naming the field: one operand FP8 and the other not;
// wide operands of different dtypes; scales missing with FP8 operands or
// present without them, not float32, or shaped for no recipe (both per
// tensor, [] or [1]; both row-wise, input [M] or [M, 1] and weight [N],
// [N, 1] or [1, N]; or both block-wise, input [M, ceil(K/128)] and weight
// [ceil(N/128), ceil(K/128)] or, IN_OUT, [ceil(K/128), ceil(N/128)]), or
// holding an element that is NaN, infinite,
// zero or negative (named with its index: "op.weight_scale[17]: a finite,
// positive float32 scale expected, got NaN"); an FP8 bias, observed or
// output dtype.
absl::StatusOr<Fp8Request> CheckFp8Operands(const LinearRequest& req, const LayerShape& shape);

// INVALID_ARGUMENT naming `field`: with FP8 operands, a configuration
// other than fp64 or the fp8 precision of their formats, or one whose
// scaling the scales do not have.
absl::Status CheckFp8Config(const Config& config, const Fp8Request& fp8, const LinearRequest& req,
                            absl::string_view field, absl::string_view spec_text);

// The fp8 precision that multiplies these FP8 dtypes (none for a pair no
// precision has).
std::optional<Precision> Fp8PrecisionOf(DType input, DType weight);

}  // namespace tensorcheck
