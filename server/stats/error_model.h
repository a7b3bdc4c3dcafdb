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
//   output rounding to output_dtype: s_out^2 = (u_out^2/3) y^2, counted
//   twice when the bias is unfused (the GEMM result and the sum are each
//   rounded; the first is approximated by |y| too).
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
// HardBound: c * u_p * sqrt(K) * abs_dot + u_out * |y| (2 u_out |y| when
// the bias is unfused), u_p the largest unit roundoff of the precision
// (BoundUnitRoundoff). With c of a few units this is the probabilistic
// bound of Higham & Mary: exceeded with very small probability.
#pragma once

#include <cstdint>

#include "server/backends/config.h"
#include "server/core/dtype.h"

namespace tensorcheck {

struct ErrorModelInput {
  Precision precision = Precision::kFp32;
  int64_t k = 0;                       // reduction length
  DType output_dtype = DType::kFloat32;
  bool unfused_bias = false;           // output rounded twice
  const float* abs_dot = nullptr;      // per output element sum_k |x_k||w_k|
  const float* sq_dot = nullptr;       // per output element sqrt(sum_k (x_k w_k)^2)
  const double* value = nullptr;       // per output element, the reference y
  int64_t count = 0;                   // output elements
  // The stored inputs are already in the precision's input format (bf16
  // tensors under bf16/tf32/fp32, fp16 under fp16...): no input rounding.
  bool inputs_exact = false;
};

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
// spacing it gives the chance that the two rounded outputs differ.
void PredictPairAccumulationSigma(const ErrorModelInput& in, float* sigma);

// Writes the hard bound c*u_p*sqrt(K)*abs_dot + u_out*|y| of each output
// to `bound` (see the header comment).
void HardBound(const ErrorModelInput& in, double c, float* bound);

}  // namespace tensorcheck
