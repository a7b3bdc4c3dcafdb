#include "server/stats/error_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "server/core/parallel.h"

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
double Predict(const ErrorModelInput& in, double input_weight, double other_weight, float* sigma,
               double output_weight = 1.0) {
  const PrecisionInfo info = GetPrecisionInfo(in.precision);
  const double u_in2 = info.u_input * info.u_input;
  const double u_acc2 = info.u_accumulate * info.u_accumulate;
  const double u_out = OutputUnitRoundoff(in.output_dtype);
  const double u_out2 = u_out * u_out;
  const double k = static_cast<double>(std::max<int64_t>(in.k, 0));
  const double out_roundings = in.unfused_bias ? 2.0 : 1.0;
  // Products rounded to fp16 one by one under fp16acc.
  const double product_term = info.fp16_accumulate ? u_acc2 / 3.0 : 0.0;
  // The output rounding's floor (an exact 0 still rounds at the output's
  // subnormal step) applies only where the output rounding is counted.
  const double floor =
      std::max<double>(output_weight > 0 ? u_out * SmallestNormal(in.output_dtype) : 0.0,
                       std::numeric_limits<float>::denorm_min());
  ParallelChunks(in.count, in.executor, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const double sq = static_cast<double>(in.sq_dot[i]) * in.sq_dot[i];
      const double y2 = in.value[i] * in.value[i];
      // Output roundings: of y, and with an unfused bias first of x.w.
      const double rounded2 = in.unfused_bias && in.pre_bias != nullptr
                                  ? y2 + static_cast<double>(in.pre_bias[i]) * in.pre_bias[i]
                                  : out_roundings * y2;
      const double var =
          input_weight * (2.0 / 3.0) * u_in2 * sq +
          other_weight * ((u_acc2 / 3.0) * k * (sq / 2.0 + y2 / 3.0) + product_term * sq +
                          output_weight * (u_out2 / 3.0) * rounded2);
      const double s = std::sqrt(var);
      // std::max would turn a NaN into the floor; keep it visible.
      sigma[i] = ToFloatSaturated(std::isnan(s) ? s : std::max(s, floor));
    }
  });
  // Summed in element order, whatever ran the pass.
  double sum_sq = 0;
  for (int64_t i = 0; i < in.count; ++i) sum_sq += static_cast<double>(sigma[i]) * sigma[i];
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
  const double scale = c * u_p * std::sqrt(static_cast<double>(std::max<int64_t>(in.k, 0)));
  const bool pre_bias = in.unfused_bias && in.pre_bias != nullptr;
  const double out = (in.unfused_bias && !pre_bias ? 2.0 : 1.0) * u_out;
  for (int64_t i = 0; i < in.count; ++i) {
    const double first = pre_bias ? u_out * std::fabs(in.pre_bias[i]) : 0.0;
    bound[i] = ToFloatSaturated(scale * in.abs_dot[i] + first + out * std::fabs(in.value[i]));
  }
}

double OutputSpacing(double v, DType dtype) {
  int mantissa_bits = 23, min_exponent = -126;
  switch (dtype) {
    case DType::kFloat64:
      mantissa_bits = 52;
      min_exponent = -1022;
      break;
    case DType::kFloat32:
      break;
    case DType::kFloat16:
      mantissa_bits = 10;
      min_exponent = -14;
      break;
    case DType::kBFloat16:
      mantissa_bits = 7;
      break;
  }
  // The exponent straight from the bits (this runs once per element and
  // grid); subnormal doubles and steps below fp64's normal range take the
  // library route.
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  const int biased = static_cast<int>((bits >> 52) & 0x7ff);
  int e = min_exponent;
  if (biased == 0x7ff || v == 0) {
    e = min_exponent;  // infinities and NaN: the smallest step
  } else if (biased == 0) {
    e = std::max(std::ilogb(v), min_exponent);
  } else {
    e = std::max(biased - 1023, min_exponent);
  }
  const int step = e - mantissa_bits;
  if (step < -1022) return std::ldexp(1.0, step);
  const uint64_t step_bits = static_cast<uint64_t>(step + 1023) << 52;
  double spacing;
  std::memcpy(&spacing, &step_bits, sizeof spacing);
  return spacing;
}

namespace {

// act(v) and |act'(v)| for the flip grid; GELU in its tanh form.
std::pair<double, double> ActivationAndSlope(Activation act, double v) {
  switch (act) {
    case Activation::kNone:
      return {v, 1.0};
    case Activation::kRelu:
      return v > 0 ? std::pair<double, double>{v, 1.0} : std::pair<double, double>{0.0, 0.0};
    case Activation::kGeluTanh: {
      constexpr double kC = 0.79788456080286535588;  // sqrt(2/pi)
      constexpr double kA = 0.044715;
      const double t = std::tanh(kC * (v + kA * v * v * v));
      const double slope = 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * kC * (1 + 3 * kA * v * v);
      return {0.5 * v * (1 + t), std::fabs(slope)};
    }
  }
  return {v, 1.0};
}

}  // namespace

void FlipGrid(const FlipGridInput& in, float* grid) {
  const DType out = in.output_dtype;
  ParallelChunks(in.count, in.executor, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const double a = in.pre_bias[i];
      const double u = in.bias != nullptr && in.cols > 0 ? a + in.bias[i % in.cols] : a;
      const auto [y, slope] = ActivationAndSlope(in.activation, u);
      double g =
          slope > 0 ? OutputSpacing(y, out) / slope : std::numeric_limits<double>::infinity();
      if (in.unfused_bias) {
        g = std::max({g, OutputSpacing(a, out), OutputSpacing(u, out)});
      }
      grid[i] = static_cast<float>(g);  // +inf stays +inf
    }
  });
}

double FlipChance(float pair_accumulation_sigma, float grid) {
  constexpr double kMeanAbsOverSigma = 0.7978845608028654;  // sqrt(2/pi)
  if (!(grid > 0)) return 1.0;
  if (std::isinf(grid)) return 0.0;
  return std::min(1.0, kMeanAbsOverSigma * static_cast<double>(pair_accumulation_sigma) /
                           static_cast<double>(grid));
}

double PoissonUpperTail(int64_t observed, double expected) {
  if (observed <= 0) return 1.0;
  if (!(expected > 0)) return 0.0;
  // sum_{j >= observed} e^-l l^j / j!, from its first term on; past the
  // mode (j > l) the terms shrink, before it they grow, so below the mode
  // use the complement 1 - sum_{j < observed}.
  const double l = expected;
  auto log_term = [&](double j) { return -l + j * std::log(l) - std::lgamma(j + 1); };
  if (static_cast<double>(observed) > l) {
    double term = std::exp(log_term(static_cast<double>(observed)));
    double sum = 0;
    for (int64_t j = observed; term > 0 && term > 1e-17 * sum; ++j) {
      sum += term;
      term *= l / static_cast<double>(j + 1);
    }
    return std::min(1.0, sum);
  }
  double term = std::exp(log_term(static_cast<double>(observed - 1)));
  double below = 0;
  for (int64_t j = observed - 1; j >= 0 && term > 1e-17 * below; --j) {
    below += term;
    term *= static_cast<double>(j) / l;
  }
  return std::max(0.0, 1.0 - below);
}

}  // namespace tensorcheck
