// Error model of a linear layer: how far a precision's output may stray from
// the exact result, per output element.
//
// For y = sum_k x_k w_k (+ b), the caller supplies per output element
//   abs_dot = sum_k |x_k||w_k|          sq_dot = sqrt(sum_k (x_k w_k)^2)
// and the reference value y (e.g. the fp64 result). Then
//
//   ErrorModelInput in{Precision::kBf16, /*k=*/4096, DType::kFloat32,
//                      /*unfused_bias=*/false, abs_dot, sq_dot, y, n};
//   std::vector<float> sigma(n), bound(n);
//   PredictSigma(in, sigma.data());            // expected size of the error
//   HardBound(in, /*c=*/1.0, bound.data());    // what it should never exceed
//   opts.predicted_sigma = sigma.data();       // -> DiffStats::bound_ratio
//   opts.error_bound = bound.data();           // -> TolerancePreset::kBound
//
// PredictSigma: the standard deviation of the error, under the usual
// probabilistic model of rounding (Higham & Mary 2019): every rounding
// multiplies by (1 + d), d independent, mean 0, uniform on [-u, u] so
// E[d^2] = u^2/3. Three sources add in variance:
//   input rounding (x and w each rounded to the precision's input format,
//   u_in; products then exact):      s_in^2  = (2/3) u_in^2 sq_dot^2
//   accumulation, one rounding per add in a sequential order over K terms
//   (partial sums s_j: sum_j E[s_j^2] ~ K sq_dot^2/2 + K y^2/3):
//                                    s_acc^2 = (u_acc^2/3) K (sq_dot^2/2 + y^2/3)
//   fp16acc also rounds each product to fp16: + (u_acc^2/3) sq_dot^2
//   output rounding to output_dtype: s_out^2 = (u_out^2/3) y^2, and when
//   the bias is unfused the GEMM result a = x.w is rounded first:
//   + (u_out^2/3) a^2 (with `pre_bias`; without it |y| stands in for |a|).
// u_in and u_acc come from GetPrecisionInfo. tf32trunc's u_in (2^-10) makes
// u_in^2/3 the mean square of a one-sided truncation error, which is what
// matters when product signs are mixed. Blocked or tree orders (GPU GEMMs)
// accumulate less error than the sequential order assumed here, so the
// accumulation term is an upper estimate for them; so it is when products
// are short (bf16 x bf16 products have at most 16 significant bits, and
// many fp32 additions of them are exact). sigma is never 0: it is
// at least u_out times the smallest normal of the output dtype (half the
// spacing of its subnormals; the rounding error an exact 0 result can
// still carry), and at least the smallest positive float.
//
// HardBound: c * u_p * sqrt(K) * abs_dot + 2 u_out * |y| (+ u_out * |a|
// when the bias is unfused; 3 u_out |y| without `pre_bias`), u_p the
// largest unit roundoff of the precision (BoundUnitRoundoff), or its
// accumulation's alone when `inputs_exact` (inputs already in its format
// are not rounded again). Two output roundings: the output's own and the
// reference's, which is rounded once to the output dtype too (two correct
// roundings of one value may be an ULP apart, and 2 u_out |y| is at least
// an ULP). With c of a few units this is the probabilistic bound of Higham
// & Mary: exceeded with very small probability.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/executor.h"
#include "core/linear_config.h"
#include "server/stats/error_model_rules.h"

namespace tensorcheck {

struct ErrorModelInput {
  Precision precision = Precision::kFp32;
  int64_t k = 0;  // reduction length
  DType output_dtype = DType::kFloat32;
  bool unfused_bias = false;       // output rounded twice
  const float* abs_dot = nullptr;  // per output element sum_k |x_k||w_k|
  const float* sq_dot = nullptr;   // per output element sqrt(sum_k (x_k w_k)^2)
  const double* value = nullptr;   // per output element, the reference y
  int64_t count = 0;               // output elements
  // The stored inputs are already in the precision's input format (bf16
  // tensors under bf16/tf32/fp32, fp16 under fp16...): no input rounding
  // (PredictSigma and HardBound read it).
  bool inputs_exact = false;
  // Per output element, x.w before the bias, or null. With an unfused
  // bias the GEMM result is rounded at its own magnitude before the bias
  // is added; where x.w and the bias nearly cancel, |y| understates that
  // rounding by orders of magnitude. Null: |y| stands in for it.
  const float* pre_bias = nullptr;
  // Runs the per-element pass; null: on the calling thread (results do not
  // depend on it). Not owned.
  Executor* executor = nullptr;
  // PredictPairAccumulationSigma only: the standard deviation of one fp32
  // accumulation's rounding error, as a share of the sequential model's
  // above (ShortProductAccumulationScale). 1 keeps the model as it is.
  double accumulation_scale = 1;
  // Split-K reduced in the output type over this many slices (0: none):
  // each partial result rounded to the output dtype, and each of their
  // additions (docs/numerics.md, "Split-K").
  int reduce_terms = 0;
};

// ---- Short products: how much of the sequential model an fp32
// accumulation really rounds.
//
// The model above charges every add of a sequential sum a rounding error
// uniform on [-u|s_j|, u|s_j|]. Two things make the true error smaller:
// the error of an add is uniform on half the spacing of s_j's binade,
// which is u|s_j| only at the top of the binade (over a binade the mean
// square is 1/2.16 of the model's); and a product of two short
// significands (bf16 x bf16: at most 16 bits, fp16 or TF32: 22) added to
// a 24-bit partial sum rounds nothing when its last bit is not below the
// sum's, and little when it is only a bit or two below. Measured against
// the exact (fp64) sum over 32x128 outputs, K = 128 to 8192, Gaussian,
// GELU-like, Student-t and shifted inputs (docs/numerics.md, "Calibration
// of the flip model"), the rms error of a sequential fp32 sum, over the
// model's sigma, reaches 0.36 with 16-bit products (it grows with K: 0.19
// at K = 128, 0.30 to 0.36 at 8192) and 0.55 with 22-bit ones; blocked
// and tree orders (OpenBLAS, K-tiled, pairwise) stay below. The scale is
// that envelope, so that even two sequential orders (the most error any
// order makes) flip no more than the model says:
//   product_bits <= 16: 0.36     product_bits <= 22: 0.56     else: 1
// (wider products keep the model: their adds are never exact, and an fp32
// output's flips are near certain anyway).
double ShortProductAccumulationScale(int product_bits);

// Unit roundoff of `d`: fp64 2^-53, fp32 2^-24, fp16 2^-11, bf16 2^-8.
double OutputUnitRoundoff(DType d);

// u_p of the hard bound: the largest of the precision's input and
// accumulation unit roundoffs (fp64 2^-53, fp32 2^-24, tf32/tf32rna/fp16/
// fp16acc 2^-11, tf32trunc 2^-10, bf16 2^-8).
double BoundUnitRoundoff(Precision p);

// Writes the predicted standard error of each of the `in.count` outputs to
// `sigma`. Non-finite inputs give a non-finite sigma. Returns the sum of
// the squares of the written values (CompareOptions::predicted_sigma_sum_sq).
double PredictSigma(const ErrorModelInput& in, float* sigma);

// Writes the predicted standard deviation of the difference between two
// runs of the same precision that differ only in summation order (say, the
// CPU emulation and a GPU kernel). Both see the same rounded inputs, so the
// input-rounding term cancels; their accumulation (and fp16acc product)
// and output roundings are taken as independent, so those variances
// double. Same floor as PredictSigma.
double PredictPairSigma(const ErrorModelInput& in, float* sigma);  // as PredictSigma

// The accumulation part of PredictPairSigma alone: how far apart the two
// accumulators are before the output rounding. Against the output grid's
// spacing it gives the chance that the two rounded outputs differ. Its
// floor is the smallest positive float, not the output's subnormal step
// (fp64 accumulators stay fp64-close even where the output is fp16). The
// accumulation variance is scaled by in.accumulation_scale^2.
void PredictPairAccumulationSigma(const ErrorModelInput& in, float* sigma);

// Writes the hard bound c*u_p*sqrt(K)*abs_dot + 2*u_out*|y| of each
// output to `bound` (see the header comment).
void HardBound(const ErrorModelInput& in, double c, float* bound);

// Spacing of `dtype`'s representable values at v (at 0: the smallest
// subnormal step).
double OutputSpacing(double v, DType dtype);

// ---- Rounding flips: when two summation orders give different outputs.
//
// Two accumulators that differ by d ~ N(0, s^2) round to different output
// values with chance E|d| / g = sqrt(2/pi) s / g (for s << g; capped at 1),
// g the spacing of the output grid where they are rounded, averaged over
// where the exact value falls in its rounding cell. The grid is the
// coarsest one the accumulator passes on its way to the output, measured
// on the accumulator's axis:
//   fused or no bias:  g = spacing(act(a + b)) / |act'(a + b)|
//   unfused:           g = max(spacing(a), spacing(a + b),
//                              spacing(act(a + b)) / |act'(a + b)|)
// with a = x.w before the bias. A flip of the first rounding of an
// unfused bias survives the second only with chance spacing(a) /
// spacing(a + b), hence the max; where ReLU cuts (a + b <= 0) no flip
// shows (g = inf). Evaluating g at |y| instead would make every output
// that an unfused bias cancels to (nearly) zero look certain to flip.
struct FlipGridInput {
  DType output_dtype = DType::kFloat32;
  bool unfused_bias = false;
  Activation activation = Activation::kNone;
  const float* pre_bias = nullptr;  // per element, x.w (required)
  const double* bias = nullptr;     // per column, or null
  int64_t cols = 0;                 // N; element i is in column i % cols
  int64_t count = 0;
  Executor* executor = nullptr;  // as ErrorModelInput::executor
};

// Writes g (above) for each of `in.count` elements to `grid` (+inf where
// no flip can show).
void FlipGrid(const FlipGridInput& in, float* grid);

// ---- The per-request constants of the per-element rules
// (error_model_rules.h). The functions above run those rules on the host
// with these constants; the device kernels
// (server/backends/cuda/internal/error_model_kernels.h) run the same rules per
// thread with the same constants, so that their results are the host's.
//
//   DeviceSigmaArgs args;                              // a device launch
//   args.c = SigmaConstantsOf(in, SigmaKind::kPair);   // as PredictPairSigma
//   DeviceBoundArgs bound_args;
//   bound_args.c = BoundConstantsOf(in, /*c=*/4.0);    // as HardBound(in, 4.0, ...)

// Which of the Predict* functions the constants are for.
enum class SigmaKind {
  kSingle,            // PredictSigma (in.inputs_exact drops the input term)
  kPair,              // PredictPairSigma
  kPairAccumulation,  // PredictPairAccumulationSigma
};

// The constants of `kind` for `in` (its precision, k, output dtype,
// unfused_bias, inputs_exact and whether pre_bias is set; not its arrays).
rules::SigmaConstants SigmaConstantsOf(const ErrorModelInput& in, SigmaKind kind);

// The same with the weights given: `input_weight` scales the
// input-rounding variance, `other_weight` the accumulation terms and
// `output_weight` times `other_weight` the output rounding. PredictSigma
// uses (inputs_exact ? 0 : 1, 1, 1), PredictPairSigma (0, 2, 1),
// PredictPairAccumulationSigma (0, 2 accumulation_scale^2, 0).
rules::SigmaConstants SigmaConstantsOf(const ErrorModelInput& in, double input_weight,
                                       double other_weight, double output_weight);

// The constants of HardBound(in, c, ...).
rules::BoundConstants BoundConstantsOf(const ErrorModelInput& in, double c);

// The constants of FlipGrid(in, ...).
rules::FlipConstants FlipConstantsOf(const FlipGridInput& in);

// Chance that two accumulators `pair_accumulation_sigma` apart round to
// different values on a grid of spacing `grid` (FlipGrid).
double FlipChance(float pair_accumulation_sigma, float grid);

// P(X >= observed) for X ~ Poisson(expected): how surprising `observed`
// rounding flips are when `expected` are predicted. 1 when observed <=
// 0; exact to double precision (series in log space).
double PoissonUpperTail(int64_t observed, double expected);

}  // namespace tensorcheck
