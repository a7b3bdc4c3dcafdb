// The per-element rules of a diagnosis, written once for host and device:
// whether an observed element is consistent with a candidate, its chance
// of a rounding flip, and what one element adds to a candidate's score, to
// a paired sign test and to the error against the reference. The host's
// passes (diagnosis_passes.h) run them over whole tensors; the device's
// kernels (server/backends/cuda/diagnosis_kernels.cu) run the very same
// functions per thread and merge the per-thread sums with the Merge
// functions below. What the ranking does with the sums is in
// server/engine/diagnosis.h; what they mean is docs/numerics.md,
// "Diagnosis".
//
//   rules::ScoreSums s;
//   for (int64_t i = 0; i < count; ++i) {
//     rules::AddToScore(s, observed[i], candidate[i], ulp[i], pair_sigma[i],
//                       pair_accumulation_sigma[i], flip_grid[i]);
//   }
//
// Every function is TC_HOST_DEVICE (core/host_device.h), as in
// error_model_rules.h, and includes nothing nvcc's device pass cannot
// take. The integer sums (counts, ULP sums of capped distances, the
// largest distance) are exact in any order; the floating ones
// (expected_disagreements, err_sq, sigma_sq) are the same sums in the
// order of the merge, equal to the host's up to rounding.
#pragma once

#include <cstdint>

#include "core/host_device.h"
#include "server/stats/error_model_rules.h"

namespace tensorcheck::rules {

// An element is consistent with a candidate within this many predicted
// standard errors.
inline constexpr double kConsistentZ = 4.0;

// ULP distances above this count as this much in sums, so a few wild
// elements cannot dominate.
inline constexpr uint64_t kUlpCap = uint64_t{1} << 10;

TC_HOST_DEVICE double CappedUlp(uint64_t ulp) {
  return static_cast<double>(ulp < kUlpCap ? ulp : kUlpCap);
}

// Bitwise equal (ULP distance 0; +0 and -0 too), or both finite and within
// kConsistentZ predicted standard errors `sigma`.
TC_HOST_DEVICE bool ElementConsistent(double o, double v, uint64_t ulp, float sigma) {
  if (ulp == 0) return true;
  if (!error_math::IsFinite(o) || !error_math::IsFinite(v)) return false;
  return error_math::Fabs(o - v) <= kConsistentZ * static_cast<double>(sigma);
}

// Chance that two accumulators `pair_accumulation_sigma` apart round to
// different values on a grid of spacing `grid` (error_model.h's
// FlipChance): sqrt(2/pi) s / g, at most 1; 1 where the grid is not
// positive (or NaN), 0 where it is infinite.
TC_HOST_DEVICE double FlipChance(float pair_accumulation_sigma, float grid) {
  constexpr double kMeanAbsOverSigma = 0.7978845608028654;  // sqrt(2/pi)
  if (!(grid > 0)) return 1.0;
  if (!error_math::IsFinite(grid)) return 0.0;
  const double p =
      kMeanAbsOverSigma * static_cast<double>(pair_accumulation_sigma) / static_cast<double>(grid);
  return p < 1.0 ? p : 1.0;
}

// ---- A candidate's score: its evidence over the elements it is scored on.
struct ScoreSums {
  int64_t counted = 0;     // elements scored
  int64_t bitwise = 0;     // of them, bitwise equal to the candidate
  int64_t consistent = 0;  // ElementConsistent
  double ulp_sum = 0;      // of CappedUlp (integers: exact in any order)
  uint64_t max_ulp = 0;
  // Sum of FlipChance: the bitwise disagreements the candidate's own
  // accumulation noise predicts.
  double expected_disagreements = 0;
  // Over the elements where both are finite: (o - v)^2 and pair_sigma^2.
  double err_sq = 0;
  double sigma_sq = 0;
};

// Element (o, v) of observed and candidate, `ulp` apart in the compared
// type; `grid` the flip grid there (OutputSpacing at v where there is
// none).
TC_HOST_DEVICE void AddToScore(ScoreSums& s, double o, double v, uint64_t ulp, float pair_sigma,
                               float pair_accumulation_sigma, float grid) {
  ++s.counted;
  if (ulp == 0) ++s.bitwise;
  if (ElementConsistent(o, v, ulp, pair_sigma)) ++s.consistent;
  s.ulp_sum += CappedUlp(ulp);
  s.expected_disagreements =
      AddRn(s.expected_disagreements, FlipChance(pair_accumulation_sigma, grid));
  if (ulp > s.max_ulp) s.max_ulp = ulp;
  if (error_math::IsFinite(o) && error_math::IsFinite(v)) {
    const double d = o - v;
    const double sigma = static_cast<double>(pair_sigma);
    s.err_sq = AddRn(s.err_sq, MulRn(d, d));
    s.sigma_sq = AddRn(s.sigma_sq, MulRn(sigma, sigma));
  }
}

TC_HOST_DEVICE void MergeScore(ScoreSums& into, const ScoreSums& part) {
  into.counted += part.counted;
  into.bitwise += part.bitwise;
  into.consistent += part.consistent;
  into.ulp_sum += part.ulp_sum;
  if (part.max_ulp > into.max_ulp) into.max_ulp = part.max_ulp;
  into.expected_disagreements += part.expected_disagreements;
  into.err_sq += part.err_sq;
  into.sigma_sq += part.sigma_sq;
}

// ---- The paired sign test of a runner-up against best (PairedZ).
struct PairedSums {
  int64_t further = 0;  // elements where the runner-up is further from the observed output
  int64_t closer = 0;   // ... and closer
};

// Whether an element counts in the test: best's and the runner-up's values
// `bv`, `rv` differ by more than half of best's pair sigma there (elsewhere
// summation noise decides which is closer), or their difference is not
// finite.
TC_HOST_DEVICE bool PairedElementCounts(double bv, double rv, float sigma) {
  const double d = bv - rv;
  return error_math::Fabs(d) > 0.5 * static_cast<double>(sigma) || !error_math::IsFinite(d);
}

// A counted element: the observed output's ULP distances from best and
// from the runner-up.
TC_HOST_DEVICE void AddToPaired(PairedSums& s, uint64_t ulp_best, uint64_t ulp_runner) {
  if (ulp_runner > ulp_best) ++s.further;
  if (ulp_runner < ulp_best) ++s.closer;
}

TC_HOST_DEVICE void MergePaired(PairedSums& into, const PairedSums& part) {
  into.further += part.further;
  into.closer += part.closer;
}

// ---- The observed output against the reference, in best's terms.
struct ErrorSums {
  double err_sq = 0;    // sum of (o - r)^2 where the difference is finite
  double sigma_sq = 0;  // sum of best's sigma against the exact result, squared, there
  double max_abs = 0;   // largest |o - r| there
};

TC_HOST_DEVICE void AddToError(ErrorSums& s, double o, double r, float sigma_vs_reference) {
  const double d = o - r;
  if (!error_math::IsFinite(d)) return;
  const double sigma = static_cast<double>(sigma_vs_reference);
  s.err_sq = AddRn(s.err_sq, MulRn(d, d));
  s.sigma_sq = AddRn(s.sigma_sq, MulRn(sigma, sigma));
  const double a = error_math::Fabs(d);
  if (a > s.max_abs) s.max_abs = a;
}

TC_HOST_DEVICE void MergeError(ErrorSums& into, const ErrorSums& part) {
  into.err_sq += part.err_sq;
  into.sigma_sq += part.sigma_sq;
  if (part.max_abs > into.max_abs) into.max_abs = part.max_abs;
}

}  // namespace tensorcheck::rules
