// The per-element rules of the error model (error_model.h), written once
// for host and device: the predicted sigma of one output, its hard bound,
// the spacing of an output grid, the activation's value and slope, and the
// flip grid of one output. error_model.cc runs them over whole arrays on
// the host; the device kernels (server/backends/cuda/error_model_kernels.cu)
// run the very same functions per thread, with the per-request constants
// the host computed once (error_model.h's SigmaConstantsOf,
// BoundConstantsOf and FlipConstantsOf). What the host tests check is what
// the kernels run.
//
//   const rules::SigmaConstants c = SigmaConstantsOf(in, SigmaKind::kSingle);
//   for (int64_t i = 0; i < in.count; ++i) {
//     sigma[i] = rules::ElementSigma(c, in.sq_dot[i], in.value[i],
//                                    c.has_pre_bias ? in.pre_bias[i] : 0.0f);
//   }
//   rules::OutputSpacing(1.0, rules::ElemType::kBF16);  // 2^-7
//
// Every function is TC_HOST_DEVICE (core/host_device.h): inline for a
// host compiler, __host__ __device__ for nvcc. nvcc's device pass compiles
// this header, so it includes nothing that pass cannot take (no Abseil, no
// <string>) and keys types by rules::ElemType (element_rules.h) and
// activations by int, not by DType and Activation. Pure functions, safe
// from any thread.
//
// Bitwise agreement. The products and sums are written with AddRn/MulRn,
// each rounded on its own in the host's order of operations: nvcc's device
// pass would otherwise fuse a product into the following add (one FMA, one
// rounding). Divisions and sqrt are correctly rounded on both sides, so
// ElementSigma, ElementHardBound and OutputSpacing give the same bits on
// host and device. ActivationAndSlope's GELU calls tanh, which neither the
// host's libm nor CUDA's rounds correctly; under GELU the flip grid of host
// and device may differ in the last bits of that term (ReLU and none are
// bitwise the same).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/host_device.h"
#include "server/stats/element_rules.h"

namespace tensorcheck::rules {

// The activations of the flip grid, as the int FlipConstants carries: the
// values of tensorcheck::Activation (core/linear_config.h).
inline constexpr int kActivationNone = 0;
inline constexpr int kActivationRelu = 1;
inline constexpr int kActivationGeluTanh = 2;

// The portable math these rules use (core/host_device.h).
namespace error_math = ::tensorcheck::hd_math;

// The largest finite float, and the smallest positive one.
inline constexpr double kFloatMax = 0x1.fffffep127;
inline constexpr double kFloatDenormMin = 0x1p-149;

// A non-negative double stored as float, saturating at the largest finite
// float (NaN and +inf pass through).
TC_HOST_DEVICE float ToFloatSaturated(double v) {
  if (v > kFloatMax && error_math::IsFinite(v)) return static_cast<float>(kFloatMax);
  return static_cast<float>(v);
}

// ---- PredictSigma, PredictPairSigma, PredictPairAccumulationSigma

// The per-request constants of the sigma of one output (error_model.h's
// header comment has the model), computed once on the host
// (SigmaConstantsOf). `input_weight` scales the input-rounding variance,
// `other_weight` the accumulation terms and `output_weight` times
// `other_weight` the output rounding.
struct SigmaConstants {
  double u_in2 = 0;         // u_input^2 of the precision
  double u_acc2 = 0;        // u_accumulate^2
  double u_out2 = 0;        // u_out^2 of the output dtype
  double k = 0;             // the reduction length, >= 0
  double product_term = 0;  // u_acc2 / 3 under fp16acc (products rounded), else 0
  // Split-K reduced in the output type: the variance of its roundings is
  // (u_out2 / 3) (reduce_sq sq + reduce_y2 y2); 0 without it.
  double reduce_sq = 0;
  double reduce_y2 = 0;
  // The least sigma written (not finite values aside): u_out times the
  // output's smallest normal where the output rounding counts, and at
  // least the smallest positive float.
  double floor = kFloatDenormMin;
  double input_weight = 1;
  double other_weight = 1;
  double output_weight = 1;
  bool unfused_bias = false;  // the output rounded twice
  // With an unfused bias, x.w before the bias is known per element (the
  // `pre_bias` argument of ElementSigma is read); implies unfused_bias.
  bool has_pre_bias = false;
};

// The predicted sigma of one output: `sq_dot` = sqrt(sum_k (x_k w_k)^2),
// `value` the reference y, `pre_bias` x.w (read only when c.has_pre_bias).
// NaN stays NaN (never raised to the floor); a finite sigma beyond the
// largest float saturates there.
TC_HOST_DEVICE float ElementSigma(const SigmaConstants& c, float sq_dot, double value,
                                  float pre_bias) {
  const double sq = MulRn(static_cast<double>(sq_dot), static_cast<double>(sq_dot));
  const double y2 = MulRn(value, value);
  // Output roundings: of y, and with an unfused bias first of x.w.
  const double rounded2 =
      c.has_pre_bias
          ? AddRn(y2, MulRn(static_cast<double>(pre_bias), static_cast<double>(pre_bias)))
          : MulRn(c.unfused_bias ? 2.0 : 1.0, y2);
  // input_weight (2/3) u_in2 sq + other_weight ((u_acc2/3) k (sq/2 + y2/3)
  //   + product_term sq + output_weight (u_out2/3) rounded2
  //   + (u_out2/3) (reduce_sq sq + reduce_y2 y2)), left to right.
  const double input = MulRn(MulRn(MulRn(c.input_weight, 2.0 / 3.0), c.u_in2), sq);
  const double accumulation = MulRn(MulRn(c.u_acc2 / 3.0, c.k), AddRn(sq / 2.0, y2 / 3.0));
  const double output = MulRn(MulRn(c.output_weight, c.u_out2 / 3.0), rounded2);
  const double reduction =
      MulRn(c.u_out2 / 3.0, AddRn(MulRn(c.reduce_sq, sq), MulRn(c.reduce_y2, y2)));
  const double var =
      AddRn(input,
            MulRn(c.other_weight,
                  AddRn(AddRn(AddRn(accumulation, MulRn(c.product_term, sq)), output), reduction)));
  const double s = error_math::Sqrt(var);
  // max(s, floor) would turn a NaN into the floor; keep it visible.
  return ToFloatSaturated(error_math::IsNan(s) ? s : (s < c.floor ? c.floor : s));
}

// ---- HardBound

// The per-request constants of the hard bound (BoundConstantsOf).
struct BoundConstants {
  double scale = 0;  // c * u_p * sqrt(K)
  double out = 0;    // u_out, or 2 u_out for an unfused bias without x.w
  double u_out = 0;  // the output dtype's unit roundoff
  // With an unfused bias, x.w before the bias is known per element (the
  // `pre_bias` argument of ElementHardBound is read).
  bool has_pre_bias = false;
};

// The hard bound of one output: scale * abs_dot (+ u_out |x.w|) + out |y|.
TC_HOST_DEVICE float ElementHardBound(const BoundConstants& c, float abs_dot, double value,
                                      float pre_bias) {
  const double first =
      c.has_pre_bias ? MulRn(c.u_out, error_math::Fabs(static_cast<double>(pre_bias))) : 0.0;
  return ToFloatSaturated(AddRn(AddRn(MulRn(c.scale, static_cast<double>(abs_dot)), first),
                                MulRn(c.out, error_math::Fabs(value))));
}

// ---- OutputSpacing

// Spacing of the values of type `t` at v: 2^(e - mantissa bits), e the
// binade of v in `t` (the subnormals share the least normal binade's); at
// 0, at infinities and NaN: the smallest subnormal step. v outside `t`'s
// range is taken as if the exponent went on (fp16 at 1e300: 2^986).
TC_HOST_DEVICE double OutputSpacing(double v, ElemType t) {
  int mantissa_bits = 23, min_exponent = -126;
  switch (t) {
    case ElemType::kF64:
      mantissa_bits = 52;
      min_exponent = -1022;
      break;
    case ElemType::kF32:
      break;
    case ElemType::kF16:
      mantissa_bits = 10;
      min_exponent = -14;
      break;
    case ElemType::kBF16:
      mantissa_bits = 7;
      break;
  }
  // The exponent straight from the bits. Infinities, NaN, zero and the
  // subnormal doubles (below 2^-1022, so below every type's least normal
  // binade) take the smallest step.
  const int biased = static_cast<int>((BitsOfDouble(v) >> 52) & 0x7ff);
  int e = min_exponent;
  if (biased != 0x7ff && biased != 0 && biased - 1023 > min_exponent) e = biased - 1023;
  const int step = e - mantissa_bits;  // >= -1074 (fp64's subnormal step)
  // Steps below fp64's normal range are subnormal doubles: bit step + 1074.
  if (step < -1022) return DoubleOfBits(uint64_t{1} << (step + 1074));
  return DoubleOfBits(static_cast<uint64_t>(step + 1023) << 52);
}

// ---- the flip grid

// act(v) and |act'(v)|.
struct ActivationSlope {
  double value;
  double slope;
};

// act(v) and |act'(v)| for the flip grid; `activation` one of
// kActivation*, GELU in its tanh form.
TC_HOST_DEVICE ActivationSlope ActivationAndSlope(int activation, double v) {
  switch (activation) {
    case kActivationRelu:
      return v > 0 ? ActivationSlope{v, 1.0} : ActivationSlope{0.0, 0.0};
    case kActivationGeluTanh: {
      constexpr double kC = 0.79788456080286535588;  // sqrt(2/pi)
      constexpr double kA = 0.044715;
      // t = tanh(kC (v + kA v^3)); slope = (1 + t)/2 + v/2 (1 - t^2) kC (1 + 3 kA v^2).
      const double t = error_math::Tanh(MulRn(kC, AddRn(v, MulRn(MulRn(MulRn(kA, v), v), v))));
      const double one_minus_t2 = AddRn(1.0, -MulRn(t, t));
      const double slope =
          AddRn(MulRn(0.5, AddRn(1.0, t)), MulRn(MulRn(MulRn(MulRn(0.5, v), one_minus_t2), kC),
                                                 AddRn(1.0, MulRn(MulRn(3 * kA, v), v))));
      return {MulRn(MulRn(0.5, v), AddRn(1.0, t)), error_math::Fabs(slope)};
    }
    default:  // kActivationNone
      return {v, 1.0};
  }
}

// The per-request constants of the flip grid (FlipConstantsOf).
struct FlipConstants {
  ElemType output = ElemType::kF32;  // the output dtype
  bool unfused_bias = false;
  int activation = kActivationNone;  // one of kActivation*
};

// The flip grid of one output (error_model.h's FlipGrid): `pre_bias` = x.w,
// `bias` its column's bias, read only when `has_bias`. +inf where no flip
// can show.
TC_HOST_DEVICE float ElementFlipGrid(const FlipConstants& c, float pre_bias, bool has_bias,
                                     double bias) {
  const double a = pre_bias;
  const double u = has_bias ? AddRn(a, bias) : a;
  const ActivationSlope act = ActivationAndSlope(c.activation, u);
  double g =
      act.slope > 0 ? OutputSpacing(act.value, c.output) / act.slope : error_math::Infinity();
  if (c.unfused_bias) {
    // The largest of the three, the first of equals (std::max's order).
    const double ga = OutputSpacing(a, c.output), gu = OutputSpacing(u, c.output);
    if (g < ga) g = ga;
    if (g < gu) g = gu;
  }
  return static_cast<float>(g);  // +inf stays +inf
}

}  // namespace tensorcheck::rules
