// A diagnosis's passes over whole tensors on the host: the per-element
// rules of diagnosis_rules.h run element by element, in element order.
// The engine's host diagnosis runs them over the candidates' outputs
// (server/engine/internal/diagnosis_evidence.h); a device runs the same
// rules in its kernels (DeviceSession's diagnosis calls).
//
//   std::vector<uint8_t> explained(count, 0);
//   MarkConsistentPass(observed, candidate, pair_sigma, DType::kBFloat16, &explained);
//   rules::ScoreSums s = ScorePass({&observed, &candidate, pair_sigma, acc_sigma, grid,
//                                   explained.data(), DType::kBFloat16});
//
// Values are read widened to double (Tensor::GetDouble) and ULP distances
// counted in the compared dtype. A `mask` selects the elements a pass
// reads (non-zero: read); null reads every element. Every array holds
// observed.numel() elements. Pure functions, safe from any thread.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "server/stats/diagnosis_rules.h"
#include "server/stats/diff_stats.h"

namespace tensorcheck {

// UlpDistance in `dtype`, without its conversions where the values are
// equal (most elements of the closest candidates): +0 and -0 are 0 apart.
uint64_t DiagnosisUlp(double a, double b, DType dtype);

// Whether two tensors hold the same bytes.
bool SameBitsPass(const Tensor& a, const Tensor& b);

// Sets mask[i] where element i of `observed` is consistent with
// `candidate` (rules::ElementConsistent with `pair_sigma`); returns how
// many elements the mask holds set afterwards.
int64_t MarkConsistentPass(const Tensor& observed, const Tensor& candidate, const float* pair_sigma,
                           DType compared, std::vector<uint8_t>* mask);

struct ScorePassInput {
  const Tensor* observed = nullptr;
  const Tensor* candidate = nullptr;
  const float* pair_sigma = nullptr;
  const float* pair_accumulation_sigma = nullptr;
  // The flip grid; null: the output spacing at the candidate's value.
  const float* flip_grid = nullptr;
  const uint8_t* mask = nullptr;
  DType compared = DType::kFloat32;
};
rules::ScoreSums ScorePass(const ScorePassInput& in);

// The paired sign test's counts of `runner` against `best` (sigma: best's
// pair sigma).
rules::PairedSums PairedPass(const Tensor& observed, const Tensor& best, const Tensor& runner,
                             const float* sigma, const uint8_t* mask, DType compared);

// Elements where `a` and `b` differ in bits (ULP distance above 0), by
// column and by row of a [count / cols, cols] matrix.
struct DifferingCounts {
  std::vector<int64_t> columns;  // cols entries
  std::vector<int64_t> rows;     // count / cols entries
  int64_t total = 0;
};
DifferingCounts DifferingPass(const Tensor& a, const Tensor& b, const uint8_t* mask, int64_t cols,
                              DType compared);

// ---- The verdict's scan: where the observed output is not rounding of a
// candidate (docs/numerics.md, "Verdict").
//
// Under "the observed output is this candidate computed in another
// summation order", observed and candidate are two roundings of
// accumulators d ~ N(0, s^2) apart (s: the candidate's pair accumulation
// sigma): they differ by at most |d| plus the rounding slack (one output
// spacing at the larger of the two, and with an unfused bias the flip
// grid's spacing of x.w too). An element's distance in sigma is
//   z = max(0, |o - v| - slack) / (s * slope)
// (slope: the activation's steepest, 1 but for GELU), 0 where bitwise
// equal and infinite where exactly one is not finite or both differ
// while not finite. Per column and per row the scan counts the elements
// that differ in bits against the rounding flips predicted there (the sum
// of FlipChance, as ScorePass), the elements beyond `threshold`, and the
// sums of a test for a shift to one side (GroupScan).
struct DefectScanInput {
  const Tensor* observed = nullptr;
  const Tensor* candidate = nullptr;
  const float* pair_accumulation_sigma = nullptr;
  const float* flip_grid = nullptr;  // null: the output spacing at v
  DType compared = DType::kFloat32;
  int64_t cols = 1;
  bool unfused_bias = false;
  double slope = 1.0;      // the activation's steepest slope
  double threshold = 6.0;  // z beyond which an element is not rounding
  double band_low = 4.0;   // the band (band_low, threshold] of GroupScan::band
  int top_k = 10;          // elements listed, largest z first
};

struct GroupScan {
  int64_t differing = 0;  // elements that differ in bits
  double expected = 0;    // rounding flips predicted there
  int64_t beyond = 0;     // elements with z > threshold
  // Elements with band_low < z <= threshold: under rounding a Gaussian
  // tail's few; a spread wider than the model's fills it, a handful of
  // corrupted values (far beyond) does not.
  int64_t band = 0;
  uint64_t max_ulp = 0;
  double max_sigma = 0;
  // Over the finite elements that differ, e = (o - v) / s: the sum of e
  // and of e^2. Under rounding, e is symmetric about 0 and independent
  // from element to element, so signed_sum / sqrt(squared_sum) (a
  // self-normalised sum) is about standard normal; a group shifted to one
  // side (a bias element a few ULP off) is not.
  double signed_sum = 0;
  double squared_sum = 0;
};

struct SigmaElement {
  ElementDiff diff;
  double sigma = 0;  // z
};

struct DefectScan {
  std::vector<GroupScan> columns;  // cols entries
  std::vector<GroupScan> rows;     // count / cols entries (a partial last row is none)
  GroupScan all;
  std::vector<SigmaElement> largest;  // up to top_k beyond the threshold, largest z first
};

// The distance in sigma of one element (above); `grid` the flip grid there.
double BeyondRoundingSigma(double o, double v, uint64_t ulp, float pair_accumulation_sigma,
                           float grid, bool unfused_bias, double slope, DType compared);

DefectScan DefectScanPass(const DefectScanInput& in);

// The observed output against the reference with the sigma against the
// exact result.
rules::ErrorSums ErrorPass(const Tensor& observed, const Tensor& reference,
                           const float* sigma_vs_reference, const uint8_t* mask);

}  // namespace tensorcheck
