#include "server/engine/internal/fp8_operands.h"

#include <cmath>
#include <string>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "core/fp8_scaling.h"
#include "core/mx_formats.h"
#include "core/status_macros.h"

namespace tensorcheck {

namespace {

// What every element of op.input_scale and op.weight_scale must be; the
// CLI and the Python client word their own checks of a scale the same way.
constexpr absl::string_view kScaleRule = "a finite, positive float32 scale";

// Dims other than the one of length `count` are 1, at most two dims.
bool IsVectorOf(const Tensor& t, int64_t count) {
  if (t.numel() != count || t.rank() > 2) return false;
  int long_dims = 0;
  for (int64_t d : t.shape()) long_dims += d != 1 ? 1 : 0;
  return long_dims <= 1;
}

// A dequantisation scale that is NaN, infinite, zero or negative has no
// meaning (torch._scaled_mm would multiply by it regardless), and a
// diagnosis of its output would blame the column or row it scales: every
// element must be finite and positive (docs/numerics.md, "FP8"). Scales
// are checked here, after the service has resolved a stored one from its
// digest, so inline and stored scales meet the same rule.
absl::Status CheckScaleValues(const Tensor& scale, absl::string_view field) {
  const float* v = scale.data<float>();
  for (int64_t i = 0; i < scale.numel(); ++i) {
    if (std::isfinite(v[i]) && v[i] > 0) continue;
    // The element's index is its row of x or output feature of W in every
    // shape a scale may have; a 0-d scale has none.
    const std::string element =
        scale.rank() == 0 ? std::string(field) : absl::StrCat(field, "[", i, "]");
    const std::string got = std::isnan(v[i])   ? "NaN"
                            : std::isinf(v[i]) ? (v[i] > 0 ? "+Inf" : "-Inf")
                                               : absl::StrCat(v[i]);
    return InvalidFieldError(element, kScaleRule, got);
  }
  return absl::OkStatus();
}

// Which scalings a scale's shape fits (docs/numerics.md, "FP8"): per
// tensor [] or [1]; row-wise a vector of `rows` ([rows], [rows, 1],
// [1, rows]); block-wise exactly `block_shape`.
struct ScaleForms {
  bool tensor = false, row = false, block = false;
  bool fits(Fp8Scaling s) const {
    return s == Fp8Scaling::kTensor ? tensor : s == Fp8Scaling::kRow ? row : block;
  }
};

absl::StatusOr<ScaleForms> CheckScale(const std::optional<Tensor>& scale, absl::string_view field,
                                      int64_t rows, absl::string_view rows_name,
                                      const std::vector<int64_t>& block_shape,
                                      absl::string_view block_name) {
  const std::string forms =
      absl::StrCat("[] or [1] (per tensor), [", rows, "] (", rows_name, ", row-wise) or ",
                   ShapeString(block_shape), " (", block_name, ", block-wise)");
  if (!scale) {
    return InvalidFieldError(
        field, absl::StrCat("a float32 dequantisation scale with FP8 operands: ", forms), "none");
  }
  if (scale->dtype() != DType::kFloat32) {
    return InvalidFieldError(absl::StrCat(field, ".dtype"), "float32", DTypeName(scale->dtype()));
  }
  ScaleForms f;
  f.tensor = IsVectorOf(*scale, 1);
  f.row = IsVectorOf(*scale, rows);
  f.block = scale->shape() == block_shape;
  if (!f.tensor && !f.row && !f.block) {
    return InvalidFieldError(absl::StrCat(field, ".shape"), forms, ShapeString(scale->shape()));
  }
  TC_RETURN_IF_ERROR(CheckScaleValues(*scale, field));
  return f;
}

}  // namespace

std::optional<Precision> Fp8PrecisionOf(DType input, DType weight) {
  for (Precision p : kFp8Precisions) {
    const Fp8Operands o = Fp8OperandsOf(p);
    if (o.input == input && o.weight == weight) return p;
  }
  return std::nullopt;
}

namespace {

// A block scale's plain [rows, cols] layout from what came: the 2-D plain
// layout as it is, or cuBLASLt's 1-D swizzled one converted (it always
// tiles [N or M, K / block]; an IN_OUT weight's plain scale is its
// transpose).
absl::StatusOr<Tensor> PlainBlockScale(const Tensor& scale, absl::string_view field, DType dtype,
                                       std::vector<int64_t> plain, bool transposed,
                                       absl::string_view plain_name) {
  if (scale.dtype() != dtype) {
    return InvalidFieldError(absl::StrCat(field, ".dtype"), DTypeName(dtype),
                             DTypeName(scale.dtype()));
  }
  if (scale.shape() == plain) return scale.Clone();
  const int64_t rows = transposed ? plain[1] : plain[0];
  const int64_t cols = transposed ? plain[0] : plain[1];
  if (scale.rank() != 1 || scale.numel() != SwizzledScaleLength(rows, cols)) {
    return InvalidFieldError(
        absl::StrCat(field, ".shape"),
        absl::StrCat(ShapeString(plain), " (", plain_name, ") or [",
                     SwizzledScaleLength(rows, cols), "] (cuBLASLt's swizzled layout of [", rows,
                     ", ", cols, "])"),
        ShapeString(scale.shape()));
  }
  TC_ASSIGN_OR_RETURN(std::vector<uint8_t> codes,
                      UnswizzleScales(absl::MakeConstSpan(scale.data<uint8_t>(),
                                                          static_cast<size_t>(scale.numel())),
                                      rows, cols));
  TC_ASSIGN_OR_RETURN(Tensor t, Tensor::Create(dtype, plain));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      t.data<uint8_t>()[transposed ? c * rows + r : r * cols + c] =
          codes[static_cast<size_t>(r * cols + c)];
    }
  }
  return t;
}

// Every block scale a number a scale can be: finite and not negative (an
// all-zero block has a zero NVFP4 scale).
absl::Status CheckBlockScaleValues(const Tensor& scale, absl::string_view field) {
  for (int64_t i = 0; i < scale.numel(); ++i) {
    const double v = scale.GetDouble(i);
    if (std::isfinite(v) && v >= 0) continue;
    return InvalidFieldError(absl::StrCat(field, "[", i, "]"),
                             absl::StrCat("a finite ", DTypeName(scale.dtype()), " block scale"),
                             std::isnan(v) ? "NaN" : absl::StrCat(v));
  }
  return absl::OkStatus();
}

// MXFP8 (FP8 operands with float8_e8m0fnu scales) and NVFP4 (FP4 operands
// with float8_e4m3fn scales and fp32 global scales): docs/numerics.md,
// "MXFP8 and NVFP4".
absl::StatusOr<Fp8Request> CheckBlockScaledOperands(const LinearRequest& req,
                                                    const LayerShape& shape) {
  const DType x = req.input.dtype(), w = req.weight.dtype();
  const bool fp4 = x == DType::kFloat4E2M1Fn;
  Fp8Request out;
  out.fp8_operands = true;
  out.block_precision = fp4                       ? Precision::kNvFp4
                        : x == DType::kFloat8E5M2 ? Precision::kMxFp8E5M2
                                                  : Precision::kMxFp8E4M3;
  if (!fp4 && x != w) {
    return InvalidFieldError("op.weight.dtype",
                             absl::StrCat(DTypeName(x), " (MXFP8 operands share their format)"),
                             DTypeName(w));
  }
  const BlockScaledOperands b = BlockScaledOperandsOf(*out.block_precision);
  if (shape.k % b.block != 0) {
    return InvalidFieldError(
        "op.input.shape",
        absl::StrCat("K a multiple of ", b.block, " (",
                     fp4 ? "NVFP4's 16-element blocks" : "MXFP8's 32-element blocks", ")"),
        ShapeString(req.input.shape()));
  }
  const int64_t kb = shape.k / b.block;
  const bool out_in = shape.layout == WeightLayout::kOutIn;
  for (const auto& [scale, field] :
       {std::pair<const std::optional<Tensor>*, const char*>{&req.input_scale, "op.input_scale"},
        {&req.weight_scale, "op.weight_scale"}}) {
    if (!*scale) {
      return InvalidFieldError(
          field,
          absl::StrCat("a ", DTypeName(b.scales), " block scale with ", DTypeName(x), " operands"),
          "none");
    }
  }
  const std::string kb_name = absl::StrCat("K/", b.block);
  TC_ASSIGN_OR_RETURN(out.input_scale,
                      PlainBlockScale(*req.input_scale, "op.input_scale", b.scales, {shape.m, kb},
                                      false, absl::StrCat("[M, ", kb_name, "]")));
  TC_ASSIGN_OR_RETURN(
      out.weight_scale,
      PlainBlockScale(
          *req.weight_scale, "op.weight_scale", b.scales,
          out_in ? std::vector<int64_t>{shape.n, kb} : std::vector<int64_t>{kb, shape.n}, !out_in,
          out_in ? absl::StrCat("[N, ", kb_name, "]") : absl::StrCat("[", kb_name, ", N]")));
  TC_RETURN_IF_ERROR(CheckBlockScaleValues(*out.input_scale, "op.input_scale"));
  TC_RETURN_IF_ERROR(CheckBlockScaleValues(*out.weight_scale, "op.weight_scale"));
  out.scale_blocks = ScaleBlocks{b.block, 1};
  for (const auto& [scale, field] : {std::pair<const std::optional<Tensor>*, const char*>{
                                         &req.input_global_scale, "op.input_global_scale"},
                                     {&req.weight_global_scale, "op.weight_global_scale"}}) {
    if (!fp4 && *scale) {
      return InvalidFieldError(field, "none: a global scale goes with FP4 (nvfp4) operands",
                               ShapeString((*scale)->shape()));
    }
    if (!fp4) continue;
    if (!*scale) {
      return InvalidFieldError(field, "a float32 per-tensor scale ([] or [1]) with FP4 operands",
                               "none");
    }
    if ((*scale)->dtype() != DType::kFloat32) {
      return InvalidFieldError(absl::StrCat(field, ".dtype"), "float32",
                               DTypeName((*scale)->dtype()));
    }
    if (!IsVectorOf(**scale, 1)) {
      return InvalidFieldError(absl::StrCat(field, ".shape"), "[] or [1]",
                               ShapeString((*scale)->shape()));
    }
    TC_RETURN_IF_ERROR(CheckScaleValues(**scale, field));
  }
  return out;
}

}  // namespace

absl::StatusOr<Fp8Request> CheckFp8Operands(const LinearRequest& req, const LayerShape& shape) {
  const DType x = req.input.dtype(), w = req.weight.dtype();
  Fp8Request out;
  constexpr absl::string_view kWide =
      "float64, float32, float16 or bfloat16 (FP8 and FP4 are for inputs and weights)";
  for (const auto& [tensor, field] :
       {std::pair<const std::optional<Tensor>*, const char*>{&req.bias, "op.bias.dtype"},
        {&req.observed, "observed.dtype"}}) {
    if (*tensor && (IsNarrow((*tensor)->dtype()) || (*tensor)->dtype() == DType::kFloat8E8M0Fnu)) {
      return InvalidFieldError(field, kWide, DTypeName((*tensor)->dtype()));
    }
  }
  if (req.output_dtype &&
      (IsNarrow(*req.output_dtype) || *req.output_dtype == DType::kFloat8E8M0Fnu)) {
    return InvalidFieldError("op.output_dtype", kWide, DTypeName(*req.output_dtype));
  }
  for (const auto& [dtype, field] :
       {std::pair<DType, const char*>{x, "op.input.dtype"}, {w, "op.weight.dtype"}}) {
    if (dtype == DType::kFloat8E8M0Fnu) {
      return InvalidFieldError(field, "a value dtype (float8_e8m0fnu is for MXFP8 block scales)",
                               DTypeName(dtype));
    }
  }
  if (IsNarrow(x) != IsNarrow(w) || (!IsNarrow(x) && x != w) ||
      ((x == DType::kFloat4E2M1Fn) != (w == DType::kFloat4E2M1Fn))) {
    return InvalidFieldError(
        "op.weight.dtype",
        x == DType::kFloat4E2M1Fn ? std::string("float4_e2m1fn (the input is float4_e2m1fn)")
        : IsFp8(x) ? absl::StrCat("float8_e4m3fn or float8_e5m2 (the input is ", DTypeName(x), ")")
                   : absl::StrCat(DTypeName(x), " (the input's dtype)"),
        DTypeName(w));
  }
  if (!IsNarrow(x)) {
    for (const auto& [scale, field] :
         {std::pair<const std::optional<Tensor>*, const char*>{&req.input_scale, "op.input_scale"},
          {&req.weight_scale, "op.weight_scale"},
          {&req.input_global_scale, "op.input_global_scale"},
          {&req.weight_global_scale, "op.weight_global_scale"}}) {
      if (*scale) {
        return InvalidFieldError(
            field,
            absl::StrCat("none: scales go with FP8 or FP4 input and weight; ", DTypeName(x),
                         " operands under an fp8, mxfp8 or nvfp4 precision are quantised "
                         "by the configuration's recipe"),
            ShapeString((*scale)->shape()));
      }
    }
    return out;
  }
  const bool e8m0_scales = (req.input_scale && req.input_scale->dtype() == DType::kFloat8E8M0Fnu) ||
                           (req.weight_scale && req.weight_scale->dtype() == DType::kFloat8E8M0Fnu);
  if (x == DType::kFloat4E2M1Fn || e8m0_scales) return CheckBlockScaledOperands(req, shape);
  for (const auto& [scale, field] : {std::pair<const std::optional<Tensor>*, const char*>{
                                         &req.input_global_scale, "op.input_global_scale"},
                                     {&req.weight_global_scale, "op.weight_global_scale"}}) {
    if (*scale) {
      return InvalidFieldError(field, "none: a global scale goes with FP4 (nvfp4) operands",
                               ShapeString((*scale)->shape()));
    }
  }
  if (!Fp8PrecisionOf(x, w)) {
    return InvalidFieldError("op.weight.dtype",
                             "a pair an fp8 precision multiplies (fp8e4m3, fp8e5m2, "
                             "fp8e4m3e5m2, fp8e5m2e4m3)",
                             absl::StrCat(DTypeName(x), " x ", DTypeName(w)));
  }
  out.fp8_operands = true;
  const int64_t slices = CeilDiv(shape.k, kFp8BlockSize);
  const int64_t n_blocks = CeilDiv(shape.n, kFp8BlockSize);
  TC_ASSIGN_OR_RETURN(const ScaleForms xs, CheckScale(req.input_scale, "op.input_scale", shape.m,
                                                      "M", {shape.m, slices}, "[M, ceil(K/128)]"));
  const bool out_in = shape.layout == WeightLayout::kOutIn;
  TC_ASSIGN_OR_RETURN(
      const ScaleForms ws,
      CheckScale(
          req.weight_scale, "op.weight_scale", shape.n, "N",
          out_in ? std::vector<int64_t>{n_blocks, slices} : std::vector<int64_t>{slices, n_blocks},
          out_in ? "[ceil(N/128), ceil(K/128)]" : "[ceil(K/128), ceil(N/128)]"));
  // A single value is row-wise too when there is a single row (torch's
  // rule: both per tensor or both row-wise), and block-wise when its shape
  // is the block-wise one.
  ScaleForms both;
  both.tensor = xs.tensor && ws.tensor;
  both.row = (xs.row || (xs.tensor && shape.m == 1)) && (ws.row || (ws.tensor && shape.n == 1));
  both.block = xs.block && ws.block;
  for (Fp8Scaling s : {Fp8Scaling::kTensor, Fp8Scaling::kRow, Fp8Scaling::kBlock128}) {
    if (!both.fits(s)) continue;
    if (out.fitting.empty()) out.scaling = s;
    out.fitting.push_back(s);
  }
  if (out.fitting.empty()) {
    // The weight's scale is named unless it is the only per-tensor one.
    const bool name_input = xs.tensor && !ws.tensor;
    const ScaleForms& other = name_input ? ws : xs;
    const Fp8Scaling wanted = other.block ? Fp8Scaling::kBlock128 : Fp8Scaling::kRow;
    const std::string field = name_input ? "op.input_scale.shape" : "op.weight_scale.shape";
    std::string expected;
    if (wanted == Fp8Scaling::kBlock128) {
      expected =
          name_input
              ? absl::StrCat("block-wise like the other scale: [", shape.m, ", ", slices, "]")
              : absl::StrCat("block-wise like the other scale: ",
                             ShapeString(out_in ? std::vector<int64_t>{n_blocks, slices}
                                                : std::vector<int64_t>{slices, n_blocks}));
    } else {
      expected =
          absl::StrCat("row-wise like the other scale: [", name_input ? shape.m : shape.n, "]");
    }
    return InvalidFieldError(
        field, expected, ShapeString((name_input ? req.input_scale : req.weight_scale)->shape()));
  }
  if (out.scaling == Fp8Scaling::kBlock128)
    out.scale_blocks = ScaleBlocks{kFp8BlockSize, kFp8BlockSize};
  return out;
}

absl::Status CheckFp8Config(const Config& config, const Fp8Request& fp8, const LinearRequest& req,
                            absl::string_view field, absl::string_view spec_text) {
  if (!fp8.fp8_operands) return absl::OkStatus();
  const DType x = req.input.dtype(), w = req.weight.dtype();
  const Precision wanted = fp8.block_precision ? *fp8.block_precision : *Fp8PrecisionOf(x, w);
  if (config.precision != Precision::kFp64 && config.precision != wanted) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " '", spec_text, "': ", DTypeName(x), " x ", DTypeName(w),
        fp8.block_precision
            ? absl::StrCat(" operands with ", DTypeName(fp8.input_scale->dtype()), " block scales")
            : std::string(" operands"),
        " are multiplied by precision ", PrecisionName(wanted),
        " (or fp64, the dequantised layer), not ", PrecisionName(config.precision)));
  }
  const bool fits = absl::c_linear_search(fp8.fitting, config.scaling);
  if (IsFp8(config.precision) && !fits) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " '", spec_text, "': scaling=", Fp8ScalingName(config.scaling),
                     " but op.input_scale and op.weight_scale are ",
                     fp8.scaling == Fp8Scaling::kRow        ? "row-wise"
                     : fp8.scaling == Fp8Scaling::kBlock128 ? "block-wise (scaling=block128)"
                                                            : "per tensor"));
  }
  return absl::OkStatus();
}

}  // namespace tensorcheck
