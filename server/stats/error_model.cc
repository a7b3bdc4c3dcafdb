#include "server/stats/error_model.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace tensorcheck {
namespace {

double SmallestNormal(DType d) {
  switch (d) {
    case DType::kFloat64:
      return 0x1p-1022;
    case DType::kFloat32:
    case DType::kBFloat16:
      return 0x1p-126;
    case DType::kFloat16:
      return 0x1p-14;
  }
  return 0x1p-126;
}

// Stores a non-negative double as float, saturating at the largest finite
// float (NaN and +inf pass through).
float ToFloatSaturated(double v) {
  if (v > std::numeric_limits<float>::max() && std::isfinite(v)) {
    return std::numeric_limits<float>::max();
  }
  return static_cast<float>(v);
}

}  // namespace

double OutputUnitRoundoff(DType d) {
  switch (d) {
    case DType::kFloat64:
      return 0x1p-53;
    case DType::kFloat32:
      return 0x1p-24;
    case DType::kFloat16:
      return 0x1p-11;
    case DType::kBFloat16:
      return 0x1p-8;
  }
  return 0x1p-24;
}

double BoundUnitRoundoff(Precision p) {
  const PrecisionInfo info = GetPrecisionInfo(p);
  return std::max(info.u_input, info.u_accumulate);
}

namespace {

// Shared by the Predict* functions: `input_weight` scales the
// input-rounding variance, `other_weight` the accumulation terms and
// `output_weight` times `other_weight` the output rounding.
// Returns the sum of the squares of what it wrote (not finite when some
// sigma is not), which comparisons on a device use instead of another pass.
double Predict(const ErrorModelInput& in, double input_weight,
               double other_weight, float* sigma, double output_weight = 1.0) {
  const PrecisionInfo info = GetPrecisionInfo(in.precision);
  const double u_in2 = info.u_input * info.u_input;
  const double u_acc2 = info.u_accumulate * info.u_accumulate;
  const double u_out = OutputUnitRoundoff(in.output_dtype);
  const double u_out2 = u_out * u_out;
  const double k = static_cast<double>(std::max<int64_t>(in.k, 0));
  const double out_roundings = in.unfused_bias ? 2.0 : 1.0;
  // Products rounded to fp16 one by one under fp16acc.
  const double product_term = info.fp16_accumulate ? u_acc2 / 3.0 : 0.0;
  const double floor = std::max<double>(
      u_out * SmallestNormal(in.output_dtype),
      std::numeric_limits<float>::denorm_min());
  double sum_sq = 0;
  for (int64_t i = 0; i < in.count; ++i) {
    const double sq = static_cast<double>(in.sq_dot[i]) * in.sq_dot[i];
    const double y2 = in.value[i] * in.value[i];
    const double var =
        input_weight * (2.0 / 3.0) * u_in2 * sq +
        other_weight * ((u_acc2 / 3.0) * k * (sq / 2.0 + y2 / 3.0) +
                        product_term * sq +
                        output_weight * out_roundings * (u_out2 / 3.0) * y2);
    const double s = std::sqrt(var);
    // std::max would turn a NaN into the floor; keep it visible.
    sigma[i] = ToFloatSaturated(std::isnan(s) ? s : std::max(s, floor));
    sum_sq += static_cast<double>(sigma[i]) * sigma[i];
  }
  return sum_sq;
}

}  // namespace

double PredictSigma(const ErrorModelInput& in, float* sigma) {
  return Predict(in, /*input_weight=*/in.inputs_exact ? 0.0 : 1.0, /*other_weight=*/1.0, sigma);
}

double PredictPairSigma(const ErrorModelInput& in, float* sigma) {
  return Predict(in, /*input_weight=*/0.0, /*other_weight=*/2.0, sigma);
}

void PredictPairAccumulationSigma(const ErrorModelInput& in, float* sigma) {
  Predict(in, /*input_weight=*/0.0, /*other_weight=*/2.0, sigma, /*output_weight=*/0.0);
}

void HardBound(const ErrorModelInput& in, double c, float* bound) {
  const double u_p = BoundUnitRoundoff(in.precision);
  const double u_out = OutputUnitRoundoff(in.output_dtype);
  const double scale =
      c * u_p * std::sqrt(static_cast<double>(std::max<int64_t>(in.k, 0)));
  const double out = (in.unfused_bias ? 2.0 : 1.0) * u_out;
  for (int64_t i = 0; i < in.count; ++i) {
    bound[i] = ToFloatSaturated(scale * in.abs_dot[i] +
                                out * std::fabs(in.value[i]));
  }
}

}  // namespace tensorcheck
