// The evidence a diagnosis weighs, per candidate class and per element
// (internal to server/engine; RankCandidates in diagnosis.cc is its user).
// The terms are defined in docs/numerics.md, "Diagnosis".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/linear_config.h"
#include "core/tensor.h"
#include "server/engine/diagnosis.h"
#include "server/stats/diagnosis_rules.h"
#include "server/stats/diff_stats.h"

namespace tensorcheck::internal {

// Position of a candidate in the fixed tie-break preference (lower first).
int Preference(const DiagnosisCandidate& candidate, DType storage);

// Whether two configurations accumulate alike (see ClassScore).
bool SameAccumulator(const Config& a, const Config& b);

// Evidence about one class of bitwise-identical candidates: the sums of
// its first member's score over the explained elements (counted), and
// what the ranking derives from them.
struct ClassScore : rules::ScoreSums {
  std::vector<size_t> members;  // indices into input.candidates; [0] names it
  // Poisson chance of the bitwise disagreements (counted - bitwise) given
  // the expected_disagreements; set after scoring.
  double plausibility_p = 1;
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

// The paired sign test's z = (n+ - n-) / sqrt(n+ + n-): n+ the elements
// where the runner-up is further from the observed output than best, n-
// where it is closer (stats' PairedPass counts them).
double PairedZ(const rules::PairedSums& counts);

// "{3, 7, 9} (40% of them)": the groups' indices and the share of the
// `differing` elements they hold, from the counts (a sum of the groups'
// shares can land a rounding away from all of them, or from all).
std::string GroupList(const std::vector<GroupCount>& groups, int64_t differing);

// The `top` largest non-zero counts (ties: the lower index first), as
// groups holding their share of the `total` differing elements.
std::vector<GroupCount> TopGroups(const std::vector<int64_t>& counts, int64_t total, int top);

// Of `top` (TopGroups of `total` differing elements over `groups`
// columns or rows), those holding more than an even spread gives by
// chance (docs/numerics.md, "Localization"); empty when the differences
// are spread.
std::vector<GroupCount> ConcentratedGroups(const std::vector<GroupCount>& top, int64_t total,
                                           int64_t groups);

// What an error against the reference of `ratio` times a precision's
// predicted error means, in words.
std::string ErrorRatioMeaning(double ratio);

// Every element outside `explained` (0 entries) as observed against
// `candidate`, in element order.
std::vector<ElementDiff> UnexplainedDiffs(const Tensor& observed, const Tensor& candidate,
                                          const std::vector<uint8_t>& explained, DType dtype);

// The columns of the output (its last dimension), as the passes' `cols`.
int64_t Columns(const DiagnosisInput& in);

// Why a class cannot be best, in one sentence; empty when it could.
std::string RuledOut(const ClassScore& cls, bool is_best, bool tied, double z,
                     const std::string& best_name);

}  // namespace tensorcheck::internal
