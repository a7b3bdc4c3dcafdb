#include "server/stats/error_model.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/parallel.h"
#include "server/stats/diagnosis_rules.h"
#include "server/stats/ulp.h"

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
    case DType::kFloat8E5M2:
      return 0x1p-14;
    case DType::kFloat8E4M3Fn:
      return 0x1p-6;
    case DType::kFloat4E2M1Fn:
      return 1.0;
    case DType::kFloat8E8M0Fnu:
      return 0x1p-127;
  }
  return 0x1p-126;
}

// The rules take activations and types as plain values in these orders.
static_assert(static_cast<int>(Activation::kNone) == rules::kActivationNone &&
                  static_cast<int>(Activation::kRelu) == rules::kActivationRelu &&
                  static_cast<int>(Activation::kGeluTanh) == rules::kActivationGeluTanh,
              "rules::kActivation* follow Activation");

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
    case DType::kFloat8E4M3Fn:
      return 0x1p-4;
    case DType::kFloat8E5M2:
      return 0x1p-3;
    case DType::kFloat4E2M1Fn:
      return 0x1p-2;
    case DType::kFloat8E8M0Fnu:  // powers of two: a scale, never an output
      return 0.5;
  }
  return 0x1p-24;
}

double BoundUnitRoundoff(Precision p) {
  const PrecisionInfo info = GetPrecisionInfo(p);
  return std::max(info.u_input, info.u_accumulate);
}

namespace {

// Shared by the Predict* functions: the per-element rule
// (rules::ElementSigma) over the whole array, with the constants of the
// weights (SigmaConstantsOf). Returns the sum of the squares of what it
// wrote (not finite when some sigma is not), which comparisons on a device
// use instead of another pass.
double Predict(const ErrorModelInput& in, const rules::SigmaConstants& c, float* sigma) {
  ParallelChunks(in.count, in.executor, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      sigma[i] =
          rules::ElementSigma(c, in.sq_dot[i], in.value[i], c.has_pre_bias ? in.pre_bias[i] : 0.0f);
    }
  });
  // Summed in element order, whatever ran the pass.
  double sum_sq = 0;
  for (int64_t i = 0; i < in.count; ++i) sum_sq += static_cast<double>(sigma[i]) * sigma[i];
  return sum_sq;
}

}  // namespace

double PredictSigma(const ErrorModelInput& in, float* sigma) {
  return Predict(in, SigmaConstantsOf(in, SigmaKind::kSingle), sigma);
}

double PredictPairSigma(const ErrorModelInput& in, float* sigma) {
  return Predict(in, SigmaConstantsOf(in, SigmaKind::kPair), sigma);
}

void PredictPairAccumulationSigma(const ErrorModelInput& in, float* sigma) {
  Predict(in, SigmaConstantsOf(in, SigmaKind::kPairAccumulation), sigma);
}

void HardBound(const ErrorModelInput& in, double c, float* bound) {
  const rules::BoundConstants b = BoundConstantsOf(in, c);
  for (int64_t i = 0; i < in.count; ++i) {
    bound[i] = rules::ElementHardBound(b, in.abs_dot[i], in.value[i],
                                       b.has_pre_bias ? in.pre_bias[i] : 0.0f);
  }
}

double ShortProductAccumulationScale(int product_bits) {
  if (product_bits <= 16) return 0.36;
  if (product_bits <= 22) return 0.56;
  return 1.0;
}

double OutputSpacing(double v, DType dtype) { return rules::OutputSpacing(v, ElemTypeOf(dtype)); }

rules::SigmaConstants SigmaConstantsOf(const ErrorModelInput& in, double input_weight,
                                       double other_weight, double output_weight) {
  const PrecisionInfo info = GetPrecisionInfo(in.precision);
  rules::SigmaConstants c;
  c.u_in2 = info.u_input * info.u_input;
  c.u_acc2 = info.u_accumulate * info.u_accumulate;
  const double u_out = OutputUnitRoundoff(in.output_dtype);
  c.u_out2 = u_out * u_out;
  c.k = static_cast<double>(std::max<int64_t>(in.k, 0));
  // Products rounded to fp16 one by one under fp16acc.
  c.product_term = info.fp16_accumulate ? c.u_acc2 / 3.0 : 0.0;
  if (in.reduce_terms >= 2) {
    // Split-K reduced in the output type over s slices: each partial p_i
    // rounded (E p_i^2 ~ sq^2 / s + y^2 / s^2), and each running sum r_j,
    // j = 2..s (E r_j^2 ~ (j / s) sq^2 + (j / s)^2 y^2).
    const double s = in.reduce_terms;
    c.reduce_sq = 1.0 + (s * (s + 1) / 2.0 - 1.0) / s;
    c.reduce_y2 = 1.0 / s + (s * (s + 1) * (2 * s + 1) / 6.0 - 1.0) / (s * s);
  }
  // The output rounding's floor (an exact 0 still rounds at the output's
  // subnormal step) applies only where the output rounding is counted.
  c.floor = std::max<double>(output_weight > 0 ? u_out * SmallestNormal(in.output_dtype) : 0.0,
                             std::numeric_limits<float>::denorm_min());
  c.input_weight = input_weight;
  c.other_weight = other_weight;
  c.output_weight = output_weight;
  c.unfused_bias = in.unfused_bias;
  c.has_pre_bias = in.unfused_bias && in.pre_bias != nullptr;
  return c;
}

rules::SigmaConstants SigmaConstantsOf(const ErrorModelInput& in, SigmaKind kind) {
  switch (kind) {
    case SigmaKind::kSingle:
      return SigmaConstantsOf(in, /*input_weight=*/in.inputs_exact ? 0.0 : 1.0,
                              /*other_weight=*/1.0, /*output_weight=*/1.0);
    case SigmaKind::kPair:
      return SigmaConstantsOf(in, /*input_weight=*/0.0, /*other_weight=*/2.0,
                              /*output_weight=*/1.0);
    case SigmaKind::kPairAccumulation:
      return SigmaConstantsOf(in, /*input_weight=*/0.0,
                              /*other_weight=*/2.0 * in.accumulation_scale * in.accumulation_scale,
                              /*output_weight=*/0.0);
  }
  return SigmaConstantsOf(in, SigmaKind::kSingle);
}

rules::BoundConstants BoundConstantsOf(const ErrorModelInput& in, double c) {
  rules::BoundConstants b;
  // Inputs already in the precision's format are not rounded again: the
  // accumulation's unit alone (fp16acc's is fp16's).
  const double u_p = in.inputs_exact ? GetPrecisionInfo(in.precision).u_accumulate
                                     : BoundUnitRoundoff(in.precision);
  b.u_out = OutputUnitRoundoff(in.output_dtype);
  b.scale = c * u_p * std::sqrt(static_cast<double>(std::max<int64_t>(in.k, 0)));
  if (in.reduce_terms >= 2) {
    // Split-K in the output type: 2s - 1 more roundings, each of a value
    // no larger than sum |x||w|.
    b.scale += c * OutputUnitRoundoff(in.output_dtype) * std::sqrt(2.0 * in.reduce_terms - 1.0);
  }
  b.has_pre_bias = in.unfused_bias && in.pre_bias != nullptr;
  // Two roundings to the output dtype, the output's and the reference's
  // (it is rounded once too), and a third without x.w for an unfused bias.
  b.out = (in.unfused_bias && !b.has_pre_bias ? 3.0 : 2.0) * b.u_out;
  return b;
}

rules::FlipConstants FlipConstantsOf(const FlipGridInput& in) {
  rules::FlipConstants f;
  f.output = ElemTypeOf(in.output_dtype);
  f.unfused_bias = in.unfused_bias;
  f.activation = static_cast<int>(in.activation);
  return f;
}

void FlipGrid(const FlipGridInput& in, float* grid) {
  const rules::FlipConstants c = FlipConstantsOf(in);
  const bool has_bias = in.bias != nullptr && in.cols > 0;
  ParallelChunks(in.count, in.executor, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      grid[i] = rules::ElementFlipGrid(c, in.pre_bias[i], has_bias,
                                       has_bias ? in.bias[i % in.cols] : 0.0);
    }
  });
}

double FlipChance(float pair_accumulation_sigma, float grid) {
  return rules::FlipChance(pair_accumulation_sigma, grid);
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
