#include "server/engine/internal/fp8_operands.h"

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
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

absl::Status CheckScale(const std::optional<Tensor>& scale, absl::string_view field, int64_t rows,
                        absl::string_view rows_name) {
  if (!scale) {
    return InvalidFieldError(field,
                             absl::StrCat("a float32 dequantisation scale with FP8 operands: [] "
                                          "or [1] per tensor, [",
                                          rows_name, "] row-wise"),
                             "none");
  }
  if (scale->dtype() != DType::kFloat32) {
    return InvalidFieldError(absl::StrCat(field, ".dtype"), "float32", DTypeName(scale->dtype()));
  }
  if (!IsVectorOf(*scale, 1) && !IsVectorOf(*scale, rows)) {
    return InvalidFieldError(
        absl::StrCat(field, ".shape"),
        absl::StrCat("[] or [1] (per tensor), or [", rows, "] (", rows_name, ", row-wise)"),
        ShapeString(scale->shape()));
  }
  return CheckScaleValues(*scale, field);
}

}  // namespace

std::optional<Precision> Fp8PrecisionOf(DType input, DType weight) {
  for (Precision p : kFp8Precisions) {
    const Fp8Operands o = Fp8OperandsOf(p);
    if (o.input == input && o.weight == weight) return p;
  }
  return std::nullopt;
}

absl::StatusOr<Fp8Request> CheckFp8Operands(const LinearRequest& req, int64_t m, int64_t n) {
  const DType x = req.input.dtype(), w = req.weight.dtype();
  Fp8Request out;
  for (const auto& [tensor, field] :
       {std::pair<const std::optional<Tensor>*, const char*>{&req.bias, "op.bias.dtype"},
        {&req.observed, "observed.dtype"}}) {
    if (*tensor && IsFp8((*tensor)->dtype())) {
      return InvalidFieldError(field,
                               "float64, float32, float16 or bfloat16 (FP8 is for "
                               "inputs and weights)",
                               DTypeName((*tensor)->dtype()));
    }
  }
  if (req.output_dtype && IsFp8(*req.output_dtype)) {
    return InvalidFieldError("op.output_dtype",
                             "float64, float32, float16 or bfloat16 (FP8 is for inputs and "
                             "weights)",
                             DTypeName(*req.output_dtype));
  }
  if (IsFp8(x) != IsFp8(w) || (!IsFp8(x) && x != w)) {
    return InvalidFieldError(
        "op.weight.dtype",
        IsFp8(x) ? absl::StrCat("float8_e4m3fn or float8_e5m2 (the input is ", DTypeName(x), ")")
                 : absl::StrCat(DTypeName(x), " (the input's dtype)"),
        DTypeName(w));
  }
  if (!IsFp8(x)) {
    for (const auto& [scale, field] :
         {std::pair<const std::optional<Tensor>*, const char*>{&req.input_scale, "op.input_scale"},
          {&req.weight_scale, "op.weight_scale"}}) {
      if (*scale) {
        return InvalidFieldError(
            field,
            absl::StrCat("none: scales go with FP8 input and weight; ", DTypeName(x),
                         " operands under an fp8 precision are quantised "
                         "by the configuration's scaling recipe"),
            ShapeString((*scale)->shape()));
      }
    }
    return out;
  }
  if (!Fp8PrecisionOf(x, w)) {
    return InvalidFieldError("op.weight.dtype",
                             "a pair an fp8 precision multiplies (fp8e4m3, fp8e5m2, "
                             "fp8e4m3e5m2, fp8e5m2e4m3)",
                             absl::StrCat(DTypeName(x), " x ", DTypeName(w)));
  }
  out.fp8_operands = true;
  TC_RETURN_IF_ERROR(CheckScale(req.input_scale, "op.input_scale", m, "M"));
  TC_RETURN_IF_ERROR(CheckScale(req.weight_scale, "op.weight_scale", n, "N"));
  const bool x_scalar = req.input_scale->numel() == 1;
  const bool w_scalar = req.weight_scale->numel() == 1;
  out.either_scaling = x_scalar && w_scalar && m == 1 && n == 1;
  // torch._scaled_mm's rule: both per tensor or both row-wise. A single
  // value is row-wise too when there is a single row.
  if (x_scalar && w_scalar) {
    out.scaling = Fp8Scaling::kTensor;
  } else if ((!x_scalar || m == 1) && (!w_scalar || n == 1)) {
    out.scaling = Fp8Scaling::kRow;
  } else {
    return InvalidFieldError(
        x_scalar ? "op.input_scale.shape" : "op.weight_scale.shape",
        absl::StrCat("row-wise like the other scale: [", x_scalar ? m : n, "]"),
        ShapeString((x_scalar ? req.input_scale : req.weight_scale)->shape()));
  }
  return out;
}

absl::Status CheckFp8Config(const Config& config, const Fp8Request& fp8, const LinearRequest& req,
                            absl::string_view field, absl::string_view spec_text) {
  if (!fp8.fp8_operands) return absl::OkStatus();
  const DType x = req.input.dtype(), w = req.weight.dtype();
  const Precision wanted = *Fp8PrecisionOf(x, w);
  if (config.precision != Precision::kFp64 && config.precision != wanted) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " '", spec_text, "': ", DTypeName(x), " x ", DTypeName(w),
                     " operands are multiplied by precision ", PrecisionName(wanted),
                     " (or fp64, the dequantised layer), not ", PrecisionName(config.precision)));
  }
  const bool fits = config.scaling == fp8.scaling || fp8.either_scaling;
  if (IsFp8(config.precision) && !fits) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " '", spec_text, "': scaling=", Fp8ScalingName(config.scaling),
                     " but op.input_scale and op.weight_scale are ",
                     fp8.scaling == Fp8Scaling::kRow ? "row-wise" : "per tensor"));
  }
  return absl::OkStatus();
}

}  // namespace tensorcheck
