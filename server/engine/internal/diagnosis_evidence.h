// The evidence a diagnosis weighs, per candidate class and per element
// (internal to server/engine; RankCandidates in diagnosis.cc is its user).
// The terms are defined in docs/numerics.md, "Diagnosis".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "server/core/linear_config.h"
#include "server/core/tensor.h"
#include "server/engine/diagnosis.h"
#include "server/stats/diff_stats.h"

namespace tensorcheck::internal {

// UlpDistance, without its conversions where the values are equal (most
// elements of the closest candidates): +0 and -0 are 0 apart too.
uint64_t Ulp(double a, double b, DType dtype);

// A ULP distance capped for sums, so a few wild elements cannot dominate.
double Capped(uint64_t ulp);

// Position of a candidate in the fixed tie-break preference (lower first).
int Preference(const DiagnosisCandidate& candidate, DType storage);

// Whether two configurations accumulate alike (see ClassScore).
bool SameAccumulator(const Config& a, const Config& b);

// Evidence about one class of bitwise-identical candidates.
struct ClassScore {
  std::vector<size_t> members;  // indices into input.candidates; [0] names it
  int64_t consistent = 0;       // over explained elements
  int64_t bitwise = 0;
  double ulp_sum = 0;
  uint64_t max_ulp = 0;
  double err_sq = 0;
  double sigma_sq = 0;
  int64_t counted = 0;  // explained elements
  // Bitwise disagreements with the observed output, and how many the
  // candidate's accumulation noise alone would produce.
  double expected_disagreements = 0;
  double plausibility_p = 1;  // set after scoring
  double within() const { return counted ? double(consistent) / counted : 0; }
  double bitwise_fraction() const { return counted ? double(bitwise) / counted : 0; }
  double mean_ulp() const { return counted ? ulp_sum / counted : 0; }
  double bound_ratio() const {
    return sigma_sq > 0 ? std::sqrt(err_sq / sigma_sq)
                        : (err_sq > 0 ? std::numeric_limits<double>::infinity() : 0);
  }
  bool is_consistent() const { return within() >= kConsistentShare; }
  int64_t disagreements() const { return counted - bitwise; }
  bool is_plausible() const {
    return is_consistent() &&
           (disagreements() < kMinImplausibleDisagreements || plausibility_p >= kPlausibilityAlpha);
  }
  // Plausible only because too few elements disagree to rule it out
  // (kMinImplausibleDisagreements), although its own noise predicts fewer
  // still: fp64 accumulation against an fp32-accumulated output that
  // happens to flip only one or two roundings. Such a class can be tied
  // with best but never beat a class plausible on the evidence: the paired
  // sign test favours the exact result over any other fp32 order.
  bool plausible_by_floor_only() const {
    return is_plausible() && disagreements() > 0 && plausibility_p < kPlausibilityAlpha;
  }
  int64_t inconsistent() const { return counted - consistent; }
  // Set after scoring: no clearly more inconsistent elements than the
  // consistent class with the fewest (see RankCandidates).
  bool near_fewest_inconsistent = true;
};

// No clearly more inconsistent elements than the fewest (a 3-sigma Poisson
// slack plus 0.1% of the elements for error-model misfit)?
bool ClearlyMoreInconsistent(int64_t count, int64_t fewest, int64_t counted);

// Bitwise equal, or within kConsistentZ predicted standard errors.
bool ElementConsistent(double o, double v, uint64_t ulp, float sigma);

// Paired sign test of `runner` against `best` on the explained elements
// where the two differ by more than half a pair sigma: z = (n+ - n-) /
// sqrt(n+ + n-).
double PairedZ(const Tensor& observed, const Tensor& best, const Tensor& runner, const float* sigma,
               const std::vector<uint8_t>& explained, DType dtype);

// "{3, 7, 9} (40% of them)": the groups' indices and the share of the
// `differing` elements they hold, from the counts (a sum of the groups'
// shares can land a rounding away from all of them, or from all).
std::string GroupList(const std::vector<GroupCount>& groups, int64_t differing);

// Counts elements that differ (in bits) between `a` and `b` by column and
// row; returns how many differ in all.
int64_t Localize(const Tensor& a, const Tensor& b, const std::vector<uint8_t>& explained, int64_t n,
                 DType dtype, int top, std::vector<GroupCount>* columns,
                 std::vector<GroupCount>* rows);

// Why a class cannot be best, in one sentence; empty when it could.
std::string RuledOut(const ClassScore& cls, bool is_best, bool tied, double z,
                     const std::string& best_name);

}  // namespace tensorcheck::internal
