#include "server/engine/diagnosis.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/share_format.h"
#include "core/status_macros.h"
#include "server/engine/internal/diagnosis_evidence.h"
#include "server/stats/error_model.h"

namespace tensorcheck {
namespace {

using internal::ClassScore;
using internal::ClearlyMoreInconsistent;
using internal::Columns;
using internal::ConcentratedGroups;
using internal::ErrorRatioMeaning;
using internal::GroupList;
using internal::PairedZ;
using internal::Preference;
using internal::RuledOut;
using internal::SameAccumulator;
using internal::TopGroups;

// Above this bitwise-equal share with best, localization looks at the
// runner-up instead (the handful of elements left say little).
constexpr double kLocalizeAgainstRunnerUp = 0.99;

// The same arithmetic up to the kernel: precision, bias mode and FP8
// options equal; backend and algorithm free.
bool SameArithmetic(const Config& a, const Config& b) {
  return a.precision == b.precision && a.bias == b.bias && a.scaling == b.scaling &&
         a.fast_accum == b.fast_accum;
}

// The steepest slope of the tanh form of GELU (at v near 1.5): a
// difference of accumulators grows by at most this much through it.
constexpr double kGeluMaxSlope = 1.13;

// At most this share of the columns, and of the rows, may be set aside as
// holding gathered differences (SetAsideGatheredDifferences), and only a
// column or row holding at least kGatheredMin of them: a more precise
// accumulation (fp64 against an fp32-accumulated output) disagrees in one
// or two elements of many columns, each beyond its tiny expected flips,
// and must stay implausible.
constexpr double kGatheredShare = 0.1;
constexpr int64_t kGatheredMin = 4;

// Localisation names a column or row only when it holds more of the
// differing elements than an even spread gives by chance: the Poisson
// tail of its count against total / groups, times the groups (Bonferroni),
// below this.
constexpr double kConcentrationAlpha = 1e-3;

}  // namespace

std::vector<GroupCount> internal::ConcentratedGroups(const std::vector<GroupCount>& top,
                                                     int64_t total, int64_t groups) {
  std::vector<GroupCount> kept;
  if (groups <= 1 || total <= 0) return kept;
  const double even = static_cast<double>(total) / static_cast<double>(groups);
  for (const GroupCount& g : top) {
    if (PoissonUpperTail(g.mismatched, even) * static_cast<double>(groups) < kConcentrationAlpha) {
      kept.push_back(g);
    }
  }
  return kept;
}

std::string internal::ErrorRatioMeaning(double ratio) {
  if (ratio < 0.05) {
    return "far below what that precision predicts: the output is more precise than it";
  }
  if (ratio <= kUnexplainedBoundRatio) return "within what that precision predicts";
  return "more than that precision predicts";
}

namespace {

// The families (precisions) of the candidates, in the order offered.
// Elements of `t` that are inf or NaN.
int64_t CountNonFinite(const Tensor& t) {
  constexpr int64_t kChunk = int64_t{1} << 16;
  std::vector<double> chunk(static_cast<size_t>(std::min(t.numel(), kChunk)));
  int64_t count = 0;
  for (int64_t begin = 0; begin < t.numel(); begin += kChunk) {
    const int64_t n = std::min(kChunk, t.numel() - begin);
    WidenRange(t, begin, n, chunk.data());
    count +=
        std::count_if(chunk.begin(), chunk.begin() + n, [](double v) { return !std::isfinite(v); });
  }
  return count;
}

std::string FamiliesTried(const DiagnosisInput& in) {
  std::vector<std::string> names;
  for (const DiagnosisCandidate& c : in.candidates) {
    const std::string name(PrecisionName(c.config.precision));
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  }
  return absl::StrJoin(names, ", ");
}

// "2, 17 and 40" of the first `limit` groups, "... and 3 more" past them.
std::string IndexList(const std::vector<DefectGroup>& groups, size_t limit) {
  std::vector<std::string> parts;
  for (size_t j = 0; j < groups.size() && j < limit; ++j) {
    parts.push_back(absl::StrCat(groups[j].index));
  }
  std::string list = absl::StrJoin(parts, ", ");
  if (groups.size() > limit) absl::StrAppend(&list, " and ", groups.size() - limit, " more");
  return list;
}

// The scan's groups that are not rounding: a Poisson tail of their bit
// differences below `alpha` once multiplied by the number of groups, or
// an element beyond the threshold. Most surprising first.
// The shift test reads a group only when this many of its elements differ
// (fewer make the self-normalised sum far from normal: n equal terms
// give sqrt(n)).
constexpr int64_t kShiftMinDiffering = 16;

// The groups a test flags at `alpha` (after the Bonferroni correction),
// and those holding an element beyond the threshold; `shift_test`: the
// shift test too (columns). Most significant first.
std::vector<DefectGroup> FlaggedGroups(const std::vector<GroupScan>& groups, double alpha,
                                       bool shift_test) {
  std::vector<DefectGroup> flagged;
  const double tested = static_cast<double>(groups.size());
  for (size_t j = 0; j < groups.size(); ++j) {
    const GroupScan& g = groups[j];
    if (g.differing == 0) continue;
    const double p = std::min(1.0, PoissonUpperTail(g.differing, g.expected) * tested);
    double shift_t = 0, shift_p = 1;
    if (shift_test && g.differing >= kShiftMinDiffering && g.squared_sum > 0) {
      shift_t = g.signed_sum / std::sqrt(g.squared_sum);
      shift_p = std::min(1.0, std::erfc(std::fabs(shift_t) / std::sqrt(2.0)) * tested);
    }
    if (!(p < alpha) && !(shift_p < alpha) && g.beyond == 0) continue;
    DefectGroup d;
    d.index = static_cast<int64_t>(j);
    d.disagreements = g.differing;
    d.expected_disagreements = g.expected;
    d.p_value = p;
    d.beyond_threshold = g.beyond;
    d.max_ulp = g.max_ulp;
    d.max_sigma = g.max_sigma;
    d.shift_t = shift_t;
    d.shift_p_value = shift_p;
    flagged.push_back(d);
  }
  std::stable_sort(flagged.begin(), flagged.end(), [](const DefectGroup& a, const DefectGroup& b) {
    const double pa = std::min(a.p_value, a.shift_p_value);
    const double pb = std::min(b.p_value, b.shift_p_value);
    if (pa != pb) return pa < pb;
    return a.beyond_threshold > b.beyond_threshold;
  });
  return flagged;
}

// The elements beyond the threshold that the groups of one axis gather:
// those of the groups holding at least kGatheredMin each and at least a
// quarter of their `group_size` elements (a wrong weight, bias or input
// value moves most of its column or row), when such groups are at most
// kGatheredShare of the `axis` groups (else 0: a misfit spread over the
// output, perhaps heavier where the weights are, not a defect in a few
// places).
int64_t GatheredBeyond(const std::vector<DefectGroup>& groups, size_t axis, int64_t group_size) {
  int64_t held = 0, holding = 0;
  for (const DefectGroup& g : groups) {
    if (g.beyond_threshold < kGatheredMin || 4 * g.beyond_threshold < group_size) continue;
    held += g.beyond_threshold;
    ++holding;
  }
  return static_cast<double>(holding) <= kGatheredShare * static_cast<double>(axis) ? held : 0;
}

}  // namespace

double ElementThresholdSigma(int64_t count) {
  // Two-sided: P(|Z| > t) = erfc(t / sqrt(2)).
  const double tail = kVerdictFalseAlarm / 3.0 / static_cast<double>(std::max<int64_t>(count, 1));
  double lo = kConsistentZ, hi = 40;
  if (std::erfc(lo / std::sqrt(2.0)) <= tail) return lo;
  for (int i = 0; i < 200 && hi - lo > 1e-9; ++i) {
    const double mid = 0.5 * (lo + hi);
    (std::erfc(mid / std::sqrt(2.0)) > tail ? lo : hi) = mid;
  }
  return hi;
}

namespace {

// One diagnosis, step by step (RankCandidates below reads as the list of
// steps). Shared state between the steps is the struct's data; what is
// read element by element comes from `evidence`.
struct Ranking {
  Ranking(const DiagnosisInput& input, DiagnosisEvidence& evidence)
      : in(input), evidence(evidence), total(input.observed->numel()), dtype(input.output_dtype) {
    out.compared_dtype = input.output_dtype;
  }

  const DiagnosisInput& in;
  DiagnosisEvidence& evidence;
  DiagnosisOutcome out;
  const int64_t total;
  const DType dtype;

  std::vector<ClassScore> classes;  // in rank order once Order() ran
  int64_t explained_count = 0;      // elements some candidate explains
  double unexplained_share = 0;
  // Against best: the runner-up (first plausible class it separates, else
  // the first implausible one), its z, every class's z, and the ties.
  const ClassScore* runner = nullptr;
  double z_runner = std::numeric_limits<double>::infinity();
  // The runner-up is told from best by best's exact reproduction
  // (SeparatedByExactness), not by the sign test.
  bool runner_separated_by_exactness = false;
  // Why best does not explain the bulk (an unexplained verdict's reason).
  std::string unexplained_why;
  std::vector<double> z_vs_best;
  std::vector<const Config*> tied_configs;
  // What localisation compared the observed output with.
  std::string against_name;
  // Elements that differ from `against` in bits: the whole the column and
  // row shares are of.
  int64_t localized_count = 0;
  // Paired sign tests run so far, by (best, runner-up) candidate: choosing
  // the preferred class and separating it from the others ask for the
  // same pairs when the top class stays on top.
  std::map<std::pair<size_t, size_t>, double> paired_z;
  // ...and how many elements each counted.
  std::map<std::pair<size_t, size_t>, int64_t> paired_counted;

  // Bitwise equal to the observed output in every element: an exact
  // reproduction (an algorithm sweep looks for the kernel that made it).
  bool exact(const ClassScore& c) const { return c.counted == total && c.bitwise == total; }

  int preference_of(const ClassScore& c) const {
    return Preference(in.candidates[c.members[0]], in.storage_dtype);
  }

  // The paired sign test's z of `runner` against `best`, once per pair.
  absl::StatusOr<double> ZAgainst(const ClassScore& best, const ClassScore& runner) {
    const std::pair<size_t, size_t> key(best.members[0], runner.members[0]);
    auto it = paired_z.find(key);
    if (it != paired_z.end()) return it->second;
    TC_ASSIGN_OR_RETURN(const rules::PairedSums counts, evidence.Paired(key.first, key.second));
    paired_counted[key] = counts.further + counts.closer;
    return paired_z.emplace(key, PairedZ(counts)).first->second;
  }

  // Whether `best` reproduces every bit of the observed output where
  // `other` does not, in elements where the two differ by less than the
  // sign test counts (half of best's predicted standard error): the
  // output was summed in best's order and arithmetic, and `other` in that
  // order would not have produced it. Only where the sign test counted
  // nothing: with a coarse output (fp16) a wider accumulation often
  // matches exactly by chance, and the test decides there.
  absl::StatusOr<bool> SeparatedByExactness(const ClassScore& best, const ClassScore& other) {
    if (!exact(best) || exact(other) || other.disagreements() < kMinImplausibleDisagreements) {
      return false;
    }
    TC_RETURN_IF_ERROR(ZAgainst(best, other).status());
    return paired_counted[{best.members[0], other.members[0]}] == 0;
  }

  // Classes of bitwise-identical candidates that accumulate alike.
  absl::Status Classify() {
    std::vector<size_t> order(in.candidates.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return Preference(in.candidates[a], in.storage_dtype) <
             Preference(in.candidates[b], in.storage_dtype);
    });
    for (size_t idx : order) {
      bool merged = false;
      for (ClassScore& cls : classes) {
        if (!SameAccumulator(in.candidates[cls.members[0]].config, in.candidates[idx].config)) {
          continue;
        }
        TC_ASSIGN_OR_RETURN(const bool same, evidence.SameBits(cls.members[0], idx));
        if (same) {
          cls.members.push_back(idx);
          merged = true;
          break;
        }
      }
      if (!merged) {
        classes.emplace_back();
        classes.back().members = {idx};
      }
    }
    return absl::OkStatus();
  }

  // Which elements some candidate explains (bitwise equal or within
  // kConsistentZ pair sigmas); the others are outliers.
  absl::Status MarkExplained() {
    for (const ClassScore& cls : classes) {
      TC_ASSIGN_OR_RETURN(explained_count, evidence.Explain(cls.members[0]));
    }
    unexplained_share = 1.0 - static_cast<double>(explained_count) / static_cast<double>(total);
    return absl::OkStatus();
  }

  // Each class's evidence over the explained elements (all of them when
  // none is).
  absl::Status Score() {
    std::vector<size_t> first;
    for (const ClassScore& cls : classes) first.push_back(cls.members[0]);
    TC_ASSIGN_OR_RETURN(std::vector<rules::ScoreSums> sums,
                        evidence.Score(first, /*every_element=*/explained_count == 0));
    for (size_t j = 0; j < classes.size(); ++j) {
      ClassScore& cls = classes[j];
      static_cast<rules::ScoreSums&>(cls) = sums[j];
      cls.plausibility_p = PoissonUpperTail(cls.disagreements(), cls.expected_disagreements);
    }
    return absl::OkStatus();
  }

  // A consistent class made implausible only by bit differences gathered
  // in a few columns or rows is judged without them: a defect there (one
  // wrong weight flips a column far more often than rounding) must not
  // hand `best` to a coarser accumulation whose noise absorbs the flips.
  // A column or row is set aside when its count is beyond a Poisson tail
  // of kVerdictFalseAlarm / 3 (corrected for the number of columns or
  // rows) around the class's expected flips spread evenly; the test is
  // then redone on what is left, its expected flips scaled down by the
  // share set aside. The verdict's scan names those columns and rows.
  absl::Status SetAsideGatheredDifferences() {
    const double alpha = kVerdictFalseAlarm / 3.0;
    for (ClassScore& cls : classes) {
      if (!cls.is_consistent() || cls.is_plausible()) continue;
      TC_ASSIGN_OR_RETURN(const DifferingCounts d,
                          evidence.Differing(cls.members[0], explained_count == 0));
      int64_t removed = 0;
      double kept_share = 1.0;
      for (const std::vector<int64_t>* groups : {&d.columns, &d.rows}) {
        if (groups->empty()) continue;
        const double n = static_cast<double>(groups->size());
        const double mu = cls.expected_disagreements / n;
        int64_t flagged = 0;
        for (int64_t count : *groups) {
          if (count >= kGatheredMin && PoissonUpperTail(count, mu) * n < alpha) {
            removed += count;
            ++flagged;
          }
        }
        kept_share *= 1.0 - static_cast<double>(flagged) / n;
        // Differences in more than a tenth of the columns or rows are not
        // gathered: nothing is set aside.
        if (static_cast<double>(flagged) > kGatheredShare * n) removed = -1;
        if (removed < 0) break;
      }
      if (removed <= 0) continue;
      const int64_t left = std::max<int64_t>(0, cls.disagreements() - removed);
      const double p = PoissonUpperTail(left, cls.expected_disagreements * kept_share);
      if (p >= kPlausibilityAlpha) cls.plausibility_p = p;
    }
    return absl::OkStatus();
  }

  // The ranking rules (diagnosis.h; docs/numerics.md, "Diagnosis").
  void Order() {
    // Elements outside kConsistentZ sigma are the clearest evidence when the
    // summation orders differ (fp32 outputs, where few elements agree in bits
    // with any candidate): a candidate with the wrong input rounding leaves
    // the elements its rounding touches tens of sigma away, the right one
    // almost none. Bitwise agreement alone would favour a wrong candidate
    // whose kernel happens to sum in nearly the observed order. Seen on an
    // H200: Flax's fp32 Dense (XLA's Triton GEMM rounds inputs to TF32 ties
    // away) shared more bits with cuBLAS's fp16 and TF32 kernels (ties to
    // even) than with cpu:tf32rna, which alone left no element unexplained.
    int64_t fewest = -1;
    for (const ClassScore& cls : classes) {
      if (cls.is_consistent() && (fewest < 0 || cls.inconsistent() < fewest)) {
        fewest = cls.inconsistent();
      }
    }
    for (ClassScore& cls : classes) {
      cls.near_fewest_inconsistent =
          fewest < 0 || !ClearlyMoreInconsistent(cls.inconsistent(), fewest, cls.counted);
    }
    std::stable_sort(classes.begin(), classes.end(), [](const ClassScore& a, const ClassScore& b) {
      if (a.is_consistent() != b.is_consistent()) return a.is_consistent();
      if (a.is_plausible() != b.is_plausible()) return a.is_plausible();
      if (a.plausible_by_floor_only() != b.plausible_by_floor_only()) {
        return b.plausible_by_floor_only();
      }
      if (a.near_fewest_inconsistent != b.near_fewest_inconsistent) {
        return a.near_fewest_inconsistent;
      }
      if (a.bitwise != b.bitwise) return a.bitwise > b.bitwise;
      if (a.ulp_sum != b.ulp_sum) return a.ulp_sum < b.ulp_sum;
      return a.bound_ratio() < b.bound_ratio();
    });
  }

  // Among the candidates the data cannot separate from the top one, the
  // preferred configuration is named (and ranked) first.
  absl::Status NamePreferredFirst() {
    if (classes[0].is_plausible()) {
      size_t chosen = 0;
      for (size_t j = 1; j < classes.size() && classes[j].is_plausible(); ++j) {
        // Never a class plausible only by the floor over one plausible on
        // the evidence (see plausible_by_floor_only).
        if (classes[j].plausible_by_floor_only() && !classes[0].plausible_by_floor_only()) break;
        // Never another kernel of the same arithmetic (another algorithm
        // or backend) that only resembles the output over one that
        // reproduces it. Across precisions the evidence decides: a coarse
        // output (fp16) often matches a wider accumulation exactly by
        // chance.
        if (exact(classes[0]) && !exact(classes[j]) &&
            SameArithmetic(in.candidates[classes[0].members[0]].config,
                           in.candidates[classes[j].members[0]].config)) {
          continue;
        }
        TC_ASSIGN_OR_RETURN(const bool separated, SeparatedByExactness(classes[0], classes[j]));
        if (separated) continue;
        TC_ASSIGN_OR_RETURN(const double z, ZAgainst(classes[0], classes[j]));
        if (z < kTieZ && preference_of(classes[j]) < preference_of(classes[chosen])) {
          chosen = j;
        }
      }
      std::rotate(classes.begin(), classes.begin() + static_cast<std::ptrdiff_t>(chosen),
                  classes.begin() + static_cast<std::ptrdiff_t>(chosen) + 1);
    }
    return absl::OkStatus();
  }

  // Elements no candidate explains, largest first.
  absl::Status ListOutliers() {
    if (explained_count == total) return absl::OkStatus();
    TC_ASSIGN_OR_RETURN(std::vector<ElementDiff> outliers,
                        evidence.Unexplained(classes[0].members[0]));
    const size_t k = std::min<size_t>(static_cast<size_t>(in.top_k), outliers.size());
    std::partial_sort(outliers.begin(), outliers.begin() + static_cast<std::ptrdiff_t>(k),
                      outliers.end(), [](const ElementDiff& a, const ElementDiff& b) {
                        const double x = std::isnan(a.abs_diff) ? INFINITY : a.abs_diff;
                        const double y = std::isnan(b.abs_diff) ? INFINITY : b.abs_diff;
                        return x > y;
                      });
    outliers.resize(k);
    out.outliers = std::move(outliers);
    return absl::OkStatus();
  }

  bool NothingExplains() const {
    return unexplained_share > kMaxUnexplainedShare || !classes[0].is_consistent();
  }

  // The explanation when no candidate explains the output.
  absl::Status ExplainNothing() {
    const ClassScore& top = classes[0];
    const DiagnosisCandidate& top_c = in.candidates[top.members[0]];
    const DiffStats* closest = top_c.vs_observed;
    out.explanation = absl::StrFormat(
        "No candidate explains the observed output: %s of its elements differ "
        "from every candidate by more than %.0f predicted standard errors (closest: "
        "%s, with %s of all elements within them, max abs difference %.3g, error %.3g "
        "times what that precision predicts). This is not a precision or "
        "bias-placement difference. Check the weight layout (a transposed or "
        "mis-shaped W), whether the bias was added (and which one), the activation, "
        "and that the same input was used.",
        FormatShare(total - explained_count, total), kConsistentZ, top_c.config.ToString(),
        FormatShare(top.consistent, total), closest ? closest->max_abs : 0.0, top.bound_ratio());
    TC_ASSIGN_OR_RETURN(const DifferingCounts d,
                        evidence.Differing(top.members[0], /*every_element=*/true));
    out.columns = ConcentratedGroups(TopGroups(d.columns, d.total, in.top_groups), d.total,
                                     static_cast<int64_t>(d.columns.size()));
    out.rows = ConcentratedGroups(TopGroups(d.rows, d.total, in.top_groups), d.total,
                                  static_cast<int64_t>(d.rows.size()));
    return absl::OkStatus();
  }

  // best, what is equivalent to it, and what it means in framework terms.
  void NameBest() {
    const ClassScore& top = classes[0];
    const DiagnosisCandidate& top_c = in.candidates[top.members[0]];
    out.best = top_c.config.ToString();
    for (size_t j = 1; j < top.members.size(); ++j) {
      out.equivalent.push_back(in.candidates[top.members[j]].config.ToString());
    }
    out.framework_hint = FrameworkHint(top_c.config, in.storage_dtype, in.has_bias);
  }

  // Ties and the runner-up, by paired sign tests against best.
  absl::Status Separate() {
    const ClassScore& top = classes[0];
    // Plausible candidates the data cannot separate from best (|z| of a
    // paired sign test below kTieZ), and the runner-up: the first plausible
    // candidate it can separate, else the first implausible one (ruled out).
    z_vs_best.assign(classes.size(), NAN);
    for (size_t j = 1; j < classes.size(); ++j) {
      if (!classes[j].is_plausible()) {
        if (runner == nullptr) runner = &classes[j];
        break;
      }
      TC_ASSIGN_OR_RETURN(const bool separated, SeparatedByExactness(top, classes[j]));
      if (separated) {
        if (runner == nullptr) {
          runner = &classes[j];
          runner_separated_by_exactness = true;
        }
        continue;
      }
      TC_ASSIGN_OR_RETURN(const double z, ZAgainst(top, classes[j]));
      z_vs_best[j] = z;
      // A class plausible only by the floor, below one plausible on the
      // evidence, is tied whatever the sign test says (it favours the
      // exact result over any other order).
      if (std::fabs(z) < kTieZ ||
          (classes[j].plausible_by_floor_only() && !top.plausible_by_floor_only())) {
        for (size_t member : classes[j].members) {
          out.tied.push_back(in.candidates[member].config.ToString());
          tied_configs.push_back(&in.candidates[member].config);
        }
      } else if (runner == nullptr) {
        runner = &classes[j];
        z_runner = z;
      }
    }
    return absl::OkStatus();
  }

  // Confidence that the output came from best or a configuration listed
  // with it (equivalent, tied): the share of elements consistent with it,
  // times how far the runner-up is ruled out, times the explained share.
  void Confidence() {
    const ClassScore& top = classes[0];
    const double separation =
        std::isinf(z_runner) ? 1.0
                             : 1.0 - std::exp(-std::pow(std::max(0.0, z_runner - 1.0), 2) / 4.0);
    out.confidence =
        top.within() * separation * (1.0 - unexplained_share) * (top.is_plausible() ? 1.0 : 0.5);
  }

  absl::Status LocalizeDifferences() {
    const ClassScore& top = classes[0];
    const DiagnosisCandidate& top_c = in.candidates[top.members[0]];
    // Where the differences sit: against best, or when it matches (nearly)
    // bit for bit, against the closest alternative (most bitwise-equal
    // elements among the candidates not tied with best, and of the other
    // bias mode when best has one, since that is the confusion a bias
    // placement causes): where the observed output parts from the
    // configuration it would be mistaken for.
    size_t against = top.members[0];
    against_name = top_c.config.ToString();
    if (top.bitwise_fraction() >= kLocalizeAgainstRunnerUp) {
      const ClassScore* closest = nullptr;
      for (size_t j = 1; j < classes.size(); ++j) {
        const Config& config = in.candidates[classes[j].members[0]].config;
        const std::string name = config.ToString();
        if (std::find(out.tied.begin(), out.tied.end(), name) != out.tied.end()) continue;
        if (closest == nullptr || classes[j].bitwise > closest->bitwise) closest = &classes[j];
      }
      // The other bias placement of best's precision comes first: the
      // confusion a bias placement causes (candle's unfused bf16 against
      // PyTorch's fused).
      const ClassScore* other_bias = nullptr;
      for (size_t j = 1; j < classes.size() && other_bias == nullptr; ++j) {
        for (size_t member : classes[j].members) {
          const Config& config = in.candidates[member].config;
          if (config.precision != top_c.config.precision || config.bias == top_c.config.bias ||
              top_c.config.bias == BiasMode::kNone ||
              std::find(out.tied.begin(), out.tied.end(), config.ToString()) != out.tied.end()) {
            continue;
          }
          other_bias = &classes[j];
          break;
        }
      }
      if (other_bias != nullptr) closest = other_bias;
      if (closest != nullptr) {
        against = closest->members[0];
        against_name = in.candidates[against].config.ToString();
        for (size_t member : closest->members) {
          const Config& config = in.candidates[member].config;
          if (config.precision == top_c.config.precision) against_name = config.ToString();
        }
      }
    }
    TC_ASSIGN_OR_RETURN(const DifferingCounts d,
                        evidence.Differing(against, /*every_element=*/false));
    localized_count = d.total;
    out.columns = ConcentratedGroups(TopGroups(d.columns, d.total, in.top_groups), d.total,
                                     static_cast<int64_t>(d.columns.size()));
    out.rows = ConcentratedGroups(TopGroups(d.rows, d.total, in.top_groups), d.total,
                                  static_cast<int64_t>(d.rows.size()));
    return absl::OkStatus();
  }

  // The paragraph.
  absl::Status WriteParagraph() {
    const ClassScore& top = classes[0];
    const DiagnosisCandidate& top_c = in.candidates[top.members[0]];
    const int64_t outlier_count = total - explained_count;
    std::string text = absl::StrFormat(
        "The observed output matches %s: %s of elements bitwise equal (%d of %d), max %d ULP, "
        "mean %.3g ULP in %s; its differences are %.2g times what that configuration "
        "predicts for another summation order. That is: %s.",
        *out.best, FormatShare(top.bitwise, top.counted), top.bitwise, top.counted, top.max_ulp,
        top.mean_ulp(), DTypeName(dtype), top.bound_ratio(), out.framework_hint);
    if (!top.is_plausible()) {
      absl::StrAppend(&text,
                      absl::StrFormat(" Caution: it differs from the observed output in %d "
                                      "elements where summation order alone would explain about "
                                      "%.1f; another placement of a rounding (e.g. a split-K "
                                      "reduction at output precision) may be involved.",
                                      top.counted - top.bitwise, top.expected_disagreements));
    }
    if (!out.equivalent.empty()) {
      absl::StrAppend(&text, " Equivalent on these inputs (same bits): ",
                      absl::StrJoin(out.equivalent, ", "), ".");
    }
    if (!out.tied.empty()) {
      absl::StrAppend(&text, " The data cannot separate it from ", absl::StrJoin(out.tied, ", "),
                      " (paired sign test z below ", kTieZ,
                      "); the first is named by preference, not evidence.");
      // fp32 against fp64 accumulation of the same inputs: a tie means no
      // rounding of this output depends on which.
      const double u_best = GetPrecisionInfo(top_c.config.precision).u_accumulate;
      for (const Config* t : tied_configs) {
        const double u_tied = GetPrecisionInfo(t->precision).u_accumulate;
        const bool wide_vs_fp32 =
            (u_best == 0x1p-53 && u_tied == 0x1p-24) || (u_best == 0x1p-24 && u_tied == 0x1p-53);
        if (!wide_vs_fp32 || t->bias != top_c.config.bias) continue;
        absl::StrAppend(
            &text,
            absl::StrFormat(" Accumulation fp32 or wider; these inputs cannot tell: no element "
                            "here rounds differently under fp32 and fp64 accumulation beyond "
                            "what chance gives, so %s names what frameworks use for %s tensors "
                            "and %s is listed as tied.",
                            *out.best, DTypeName(in.storage_dtype), t->ToString()));
        break;
      }
    } else if (runner != nullptr) {
      const std::string runner_name = in.candidates[runner->members[0]].config.ToString();
      if (runner_separated_by_exactness) {
        absl::StrAppend(&text,
                        absl::StrFormat(" Runner-up %s is ruled out: %s reproduces every bit of "
                                        "the observed output, %s differs from it in %d elements.",
                                        runner_name, *out.best, runner_name,
                                        runner->counted - runner->bitwise));
      } else if (runner->is_consistent() && !runner->is_plausible()) {
        absl::StrAppend(&text,
                        absl::StrFormat(" Runner-up %s is ruled out: the observed output differs "
                                        "from it in %d elements where summation order alone would "
                                        "explain about %.1f.",
                                        runner_name, runner->counted - runner->bitwise,
                                        runner->expected_disagreements));
      } else if (runner->is_consistent()) {
        absl::StrAppend(
            &text,
            absl::StrFormat(" Runner-up %s is less likely (paired sign test z = %.1f; "
                            "%s bitwise equal).",
                            runner_name, z_runner, FormatShare(runner->bitwise, runner->counted)));
      } else {
        absl::StrAppend(
            &text, absl::StrFormat(" Runner-up %s is ruled out (only %s of elements "
                                   "consistent with it).",
                                   runner_name, FormatShare(runner->consistent, runner->counted)));
      }
    }
    // Candidates closer in bits than best that the plausibility test ruled
    // out: the reason a reader would otherwise look for.
    std::vector<std::string> closer;
    for (size_t j = 1; j < classes.size(); ++j) {
      const ClassScore& c = classes[j];
      if (&c == runner || !c.is_consistent() || c.is_plausible() || c.bitwise <= top.bitwise) {
        continue;
      }
      closer.push_back(absl::StrFormat(
          "%s (%d elements differ where its own summation-order noise predicts about %.3g)",
          in.candidates[c.members[0]].config.ToString(), c.disagreements(),
          c.expected_disagreements));
    }
    if (!closer.empty()) {
      absl::StrAppend(&text,
                      " Closer in bits but ruled out, their accumulation being more "
                      "precise than the observed output's: ",
                      absl::StrJoin(closer, "; "), ".");
    }
    // Error against the exact result, in the best precision's own terms.
    TC_ASSIGN_OR_RETURN(const std::optional<rules::ErrorSums> error,
                        evidence.ErrorVsReference(top.members[0]));
    if (error.has_value()) {
      const double err_sq = error->err_sq, sigma_sq = error->sigma_sq, max_abs = error->max_abs;
      if (sigma_sq > 0) {
        const double ratio = std::sqrt(err_sq / sigma_sq);
        absl::StrAppend(
            &text,
            absl::StrFormat(" Against the %s reference its error (max abs %.3g) is "
                            "%.2g times what %s predicts (%s).",
                            in.reference_config, max_abs, ratio,
                            PrecisionName(top_c.config.precision), ErrorRatioMeaning(ratio)));
      }
      for (const DiagnosisCandidate& c : in.candidates) {
        if (c.config.precision == Precision::kFp32 && c.vs_reference != nullptr &&
            top_c.config.precision != Precision::kFp32) {
          absl::StrAppend(&text,
                          absl::StrFormat(" Strict fp32 (%s) would differ from the reference "
                                          "by at most %.2g.",
                                          c.config.ToString(), c.vs_reference->max_abs));
          break;
        }
      }
    }
    if (!out.columns.empty() || !out.rows.empty()) {
      std::vector<std::string> where;
      if (!out.columns.empty()) {
        where.push_back(absl::StrCat("columns ", GroupList(out.columns, localized_count)));
      }
      if (!out.rows.empty()) {
        where.push_back(absl::StrCat("rows ", GroupList(out.rows, localized_count)));
      }
      absl::StrAppend(
          &text, absl::StrFormat(" The %d elements that differ from %s concentrate "
                                 "in %s.",
                                 localized_count, against_name, absl::StrJoin(where, " and ")));
    } else if (localized_count > 0) {
      absl::StrAppend(&text, absl::StrFormat(" The %d elements that differ from %s are spread "
                                             "over the output: no column or row holds more "
                                             "of them than chance does.",
                                             localized_count, against_name));
    }
    if (outlier_count > 0) {
      absl::StrAppend(&text,
                      absl::StrFormat(" %d element(s) fit no candidate at all and are listed as "
                                      "outliers (corrupted values, or a different computation "
                                      "there).",
                                      outlier_count));
    }
    out.explanation = std::move(text);
    return absl::OkStatus();
  }

  // ---- The verdict (docs/numerics.md, "Verdict").

  // No candidate explains the output at all (NothingExplains).
  void DecideNothingExplains() {
    const ClassScore& top = classes[0];
    out.verdict = DiagnosisVerdict::kUnexplained;
    out.confidence = std::min(out.confidence, kUnexplainedConfidence);
    out.verdict_reason = absl::StrFormat(
        "Unexplained: no candidate explains the output: %s of its elements lie more than %.0f "
        "predicted standard errors from every candidate (closest: %s, with %s of all elements "
        "within them). The computation is probably one that was not offered (families tried: "
        "%s), or the weights, input or bias differ throughout.",
        FormatShare(total - explained_count, total), kConsistentZ,
        in.candidates[top.members[0]].config.ToString(), FormatShare(top.consistent, total),
        FamiliesTried(in));
    out.explanation = absl::StrCat(out.verdict_reason, " ", out.explanation);
  }

  // Where a defect's columns, rows and elements point in the operands.
  std::string WhereToLook(const DefectReport& d) const {
    const std::string w_part =
        in.weight_layout == WeightLayout::kInOut ? "weight column" : "weight row";
    const std::string layout(WeightLayoutName(in.weight_layout));
    std::vector<std::string> parts;
    if (!d.columns.empty()) {
      const std::string list = IndexList(d.columns, 5);
      std::string part =
          absl::StrFormat("output column %s ↔ %s %s (%s layout)", list, w_part, list, layout);
      if (in.has_bias) absl::StrAppend(&part, " and bias element ", list);
      parts.push_back(std::move(part));
    }
    if (!d.rows.empty()) {
      const std::string list = IndexList(d.rows, 5);
      parts.push_back(absl::StrFormat("output row %s ↔ input row %s (leading dimensions flattened)",
                                      list, list));
    }
    return absl::StrJoin(parts, "; ");
  }

  // Rounding, defect or unexplained, from a scan of every element against
  // best: an element test whose threshold grows with the element count,
  // and Poisson tests of each column's and row's bit differences.
  absl::Status Decide() {
    const ClassScore& top = classes[0];
    const DiagnosisCandidate& top_c = in.candidates[top.members[0]];
    // The false-alarm budget: a third to the element test (its threshold),
    // a sixth each to the column counts, the row counts, the column shifts
    // and the band.
    const double alpha = kVerdictFalseAlarm / 6.0;
    DefectScanInput spec;
    spec.cols = Columns(in);
    spec.unfused_bias = in.has_bias && top_c.config.bias == BiasMode::kUnfused;
    spec.slope = in.activation == Activation::kGeluTanh ? kGeluMaxSlope : 1.0;
    spec.threshold = ElementThresholdSigma(total);
    spec.top_k = in.top_k;
    TC_ASSIGN_OR_RETURN(const DefectScan scan, evidence.ScanDefects(top.members[0], spec));
    std::vector<DefectGroup> columns = FlaggedGroups(scan.columns, alpha, /*shift_test=*/true);
    std::vector<DefectGroup> rows = FlaggedGroups(scan.rows, alpha, /*shift_test=*/false);
    int64_t shifted = 0;
    for (const DefectGroup& g : columns) shifted += g.shift_p_value < alpha ? 1 : 0;

    // Elements beyond the threshold gathered in a few columns (a weight
    // row, a bias element) or rows (an input row): at least 90% of them.
    // Then they are the defect, whatever else they inflate (best's
    // bound_ratio), and the other axis's groups that hold only one or two
    // of them each and are not flagged by their own test say nothing more
    // (a wrong column's elements lie in every row).
    const int64_t columns_gathered =
        GatheredBeyond(columns, scan.columns.size(), static_cast<int64_t>(scan.rows.size()));
    const int64_t rows_gathered =
        GatheredBeyond(rows, scan.rows.size(), static_cast<int64_t>(scan.columns.size()));
    const int64_t gathered_beyond = std::max(columns_gathered, rows_gathered);
    const bool beyond_gathered =
        scan.all.beyond > 0 &&
        static_cast<double>(gathered_beyond) >= 0.9 * static_cast<double>(scan.all.beyond);
    if (beyond_gathered) {
      std::vector<DefectGroup>& other = columns_gathered >= rows_gathered ? rows : columns;
      other.erase(std::remove_if(other.begin(), other.end(),
                                 [&](const DefectGroup& g) {
                                   return !(g.p_value < alpha) && !(g.shift_p_value < alpha) &&
                                          g.beyond_threshold < kGatheredMin;
                                 }),
                  other.end());
    }

    // What the columns and rows flagged by their Poisson tests hold: the
    // elements beyond the threshold and the bit differences beyond the
    // expected ones (an element in both counts twice; a lower bound of
    // what is spread elsewhere).
    int64_t held_beyond = 0;
    double held_excess = 0;
    int64_t columns_beyond = 0, rows_beyond = 0;
    for (const std::vector<DefectGroup>* groups : {&columns, &rows}) {
      for (const DefectGroup& g : *groups) {
        if (g.beyond_threshold > 0) ++(groups == &columns ? columns_beyond : rows_beyond);
        if (!(g.p_value < alpha)) continue;
        held_beyond += g.beyond_threshold;
        held_excess += static_cast<double>(g.disagreements) - g.expected_disagreements;
      }
    }
    held_beyond = std::max(held_beyond, gathered_beyond);
    const int64_t diffuse = std::max<int64_t>(0, scan.all.beyond - held_beyond);

    // The band just inside the threshold, outside the groups a test flags
    // or that gather a defect: under rounding at most a Gaussian tail's
    // share of the elements lies there (fewer, as the model overstates);
    // a spread wider than best's fills it all over the output.
    auto band_held = [&](const std::vector<DefectGroup>& groups,
                         const std::vector<GroupScan>& scanned, int64_t group_size,
                         bool gathering) {
      int64_t held = 0;
      for (const DefectGroup& g : groups) {
        const bool gathers =
            gathering && g.beyond_threshold >= kGatheredMin && 4 * g.beyond_threshold >= group_size;
        if (g.p_value < alpha || g.shift_p_value < alpha || gathers) {
          held += scanned[static_cast<size_t>(g.index)].band;
        }
      }
      return held;
    };
    const int64_t band_outside =
        scan.all.band -
        std::max(band_held(columns, scan.columns, static_cast<int64_t>(scan.rows.size()),
                           columns_gathered > 0),
                 band_held(rows, scan.rows, static_cast<int64_t>(scan.columns.size()),
                           rows_gathered > 0));
    const double band_expected =
        static_cast<double>(total) *
        (std::erfc(spec.band_low / std::sqrt(2.0)) - std::erfc(spec.threshold / std::sqrt(2.0)));
    const double band_p = PoissonUpperTail(band_outside, band_expected);
    const double excess = static_cast<double>(scan.all.differing) - scan.all.expected;

    // An fp16 accumulation leaves at least its own rounding error behind.
    std::optional<double> fp16acc_error_ratio;
    if (GetPrecisionInfo(top_c.config.precision).fp16_accumulate) {
      TC_ASSIGN_OR_RETURN(const std::optional<rules::ErrorSums> error,
                          evidence.ErrorVsReference(top.members[0]));
      if (error.has_value() && error->sigma_sq > 0) {
        fp16acc_error_ratio = std::sqrt(error->err_sq / error->sigma_sq);
      }
    }

    std::string unexplained;
    if (top.bound_ratio() > kUnexplainedBoundRatio && !beyond_gathered) {
      unexplained = absl::StrFormat(
          "its differences from the observed output are %.2g times what its error model "
          "predicts for another summation order",
          top.bound_ratio());
    } else if (fp16acc_error_ratio.has_value() &&
               *fp16acc_error_ratio < kFp16AccumulationMinErrorRatio) {
      unexplained = absl::StrFormat(
          "the observed output's error against the %s reference is %.2g times what fp16 "
          "accumulation's own rounding leaves (an fp16 accumulation leaves about half of it): "
          "the output is more precise than that configuration can be",
          in.reference_config, *fp16acc_error_ratio);
    } else if (band_p < alpha) {
      unexplained = absl::StrFormat(
          "%d elements lie between %.0f and %.1f predicted standard errors of it, spread over the "
          "output, where rounding leaves at most about %.3g (p = %.2g): its differences are "
          "wider than another summation order's",
          band_outside, spec.band_low, spec.threshold, band_expected, band_p);
    } else if (static_cast<double>(diffuse) > kUnexplainedDiffuseShare * total) {
      unexplained = absl::StrFormat(
          "%s of the elements lie beyond %.1f predicted standard errors of it, spread over "
          "%d columns and %d rows rather than gathered in a few",
          FormatShare(diffuse, total), spec.threshold, columns_beyond, rows_beyond);
    } else if (static_cast<double>(shifted) > kGatheredShare * static_cast<double>(spec.cols)) {
      unexplained = absl::StrFormat(
          "%d of its %d columns are shifted to one side of it, a systematic difference over the "
          "output rather than a defect in a few columns (another rounding mode, or a bias in "
          "another precision?)",
          shifted, spec.cols);
    } else if (!top.is_plausible() && held_excess < 0.5 * excess) {
      unexplained = absl::StrFormat(
          "the observed output differs from it in %d elements where its rounding flips explain "
          "about %.3g, spread over the output rather than gathered in a few columns or rows",
          scan.all.differing, scan.all.expected);
    }
    unexplained_why = unexplained;
    if (!unexplained.empty()) {
      out.verdict = DiagnosisVerdict::kUnexplained;
      out.confidence = std::min(out.confidence, kUnexplainedConfidence);
      out.verdict_reason = absl::StrFormat(
          "Unexplained: no candidate explains the bulk of the output: the closest, %s, does not "
          "(%s). The computation is probably one that was not offered (families tried: %s).",
          *out.best, unexplained, FamiliesTried(in));
    } else if (scan.all.beyond > 0 || !columns.empty() || !rows.empty()) {
      DefectReport d;
      d.element_threshold_sigma = spec.threshold;
      d.false_alarm_rate = kVerdictFalseAlarm;
      d.element_count = scan.all.beyond;
      for (const SigmaElement& e : scan.largest) d.elements.push_back({e.diff, e.sigma});
      const size_t groups = static_cast<size_t>(std::max(in.top_groups, 0));
      d.columns.assign(columns.begin(), columns.begin() + std::min(groups, columns.size()));
      d.rows.assign(rows.begin(), rows.begin() + std::min(groups, rows.size()));
      d.max_ulp = scan.all.max_ulp;
      d.max_sigma = scan.all.max_sigma;
      d.where_to_look = WhereToLook(d);
      std::vector<std::string> parts;
      if (scan.all.beyond > 0) {
        parts.push_back(absl::StrFormat(
            "%d element(s) lie beyond %.1f predicted standard errors of it (largest %d ULP, "
            "%.3g sigma)",
            scan.all.beyond, spec.threshold, scan.all.max_ulp, scan.all.max_sigma));
      }
      for (const auto& [name, flagged] :
           {std::pair<const char*, const std::vector<DefectGroup>*>{"column", &columns},
            std::pair<const char*, const std::vector<DefectGroup>*>{"row", &rows}}) {
        for (size_t j = 0; j < flagged->size() && j < 3; ++j) {
          const DefectGroup& g = (*flagged)[j];
          if (!(g.p_value < alpha)) {
            if (g.shift_p_value < alpha) {
              // Where rounding flips hide a small shift (an fp32 output
              // flips almost everywhere), its sign gives it away.
              parts.push_back(absl::StrFormat(
                  "%s %d is shifted %s it (t = %.1f over %d differing elements, p = %.2g)", name,
                  g.index, g.shift_t > 0 ? "above" : "below", g.shift_t, g.disagreements,
                  g.shift_p_value));
            } else if (g.beyond_threshold >= kGatheredMin) {
              // Gathered elements where every element differs anyway: no
              // count test there.
              parts.push_back(absl::StrFormat("%s %d holds %d of those elements", name, g.index,
                                              g.beyond_threshold));
            }
            continue;
          }
          parts.push_back(absl::StrFormat(
              "%s %d holds %d bit differences where rounding flips explain about %.3g "
              "(p = %.2g)",
              name, g.index, g.disagreements, g.expected_disagreements, g.p_value));
        }
      }
      out.verdict = DiagnosisVerdict::kDefect;
      out.verdict_reason = absl::StrFormat(
          "Defect: %s explains the bulk of the output, but not all of it: %s. Look at %s.",
          *out.best, absl::StrJoin(parts, "; "), d.where_to_look);
      out.defect = std::move(d);
    } else {
      out.verdict = DiagnosisVerdict::kRounding;
      out.verdict_reason = absl::StrFormat(
          "Rounding: every element is within %.1f predicted standard errors of %s beyond one "
          "output rounding (largest %.2g), and no column or row holds more bit differences "
          "than its rounding flips explain (%d differ, about %.3g expected).",
          spec.threshold, *out.best, scan.all.max_sigma, scan.all.differing, scan.all.expected);
    }
    out.explanation = absl::StrCat(out.verdict_reason, " ", out.explanation);
    return absl::OkStatus();
  }

  // ---- The answer in words (docs/numerics.md, "Verdict" and "What to
  // change"): the headline, acceptance and advice.

  bool Accepts(const Config& c) const {
    return absl::c_any_of(in.accept, [&](const ConfigPattern& p) { return p.Matches(c); });
  }

  const Config* CandidateNamed(const std::string& name) const {
    for (const DiagnosisCandidate& c : in.candidates) {
      if (c.config.ToString() == name) return &c.config;
    }
    return nullptr;
  }

  // best's name, with what it means ("cpu:fp32:fused, PyTorch's default
  // for fp32 tensors").
  std::string Described(const Config& c) const {
    const std::string by_default = FrameworkDefault(c, in.storage_dtype, in.has_bias);
    return by_default.empty() ? c.ToString() : absl::StrCat(c.ToString(), " (", by_default, ")");
  }

  std::string AcceptList() const {
    std::vector<std::string> names;
    for (const ConfigPattern& p : in.accept) names.push_back(p.ToString());
    return absl::StrJoin(names, ", ");
  }

  // The configuration the advice leads to: the best-ranked candidate the
  // request accepts, else PyTorch's default for the storage dtype.
  const Config* Wanted() const {
    if (!in.accept.empty()) {
      for (const RankedCandidate& r : out.ranking) {
        if (r.accepted) return CandidateNamed(r.config);
      }
      return nullptr;
    }
    const Config* best = CandidateNamed(*out.best);
    const Config want = PyTorchDefault(best->backend, in.storage_dtype, in.has_bias);
    for (const DiagnosisCandidate& c : in.candidates) {
      if (c.config.precision == want.precision && c.config.bias == want.bias &&
          c.config.splitk == want.splitk) {
        return &c.config;
      }
    }
    return nullptr;
  }

  void Conclude() {
    if (!out.best.has_value()) {
      out.headline = absl::StrFormat(
          "Unexplained: no offered configuration explains the output: %s of its elements lie "
          "beyond %.0f predicted standard errors of every candidate (families tried: %s). "
          "Check the weight layout, the bias and the input, or offer the computation that made "
          "it.",
          FormatShare(total - explained_count, total), kConsistentZ, FamiliesTried(in));
      return;
    }
    const Config* best = CandidateNamed(*out.best);
    // best, or a configuration the evidence cannot tell from it.
    std::vector<const Config*> same = {best};
    for (const std::vector<std::string>* names : {&out.equivalent, &out.tied}) {
      for (const std::string& name : *names) {
        if (const Config* c = CandidateNamed(name)) same.push_back(c);
      }
    }
    if (out.verdict == DiagnosisVerdict::kRounding) {
      for (const Config* c : same) {
        if (Accepts(*c)) {
          out.accepted = true;
          out.accepted_as = c->ToString();
          break;
        }
      }
    }
    switch (out.verdict) {
      case DiagnosisVerdict::kRounding: {
        const ClassScore& top = classes[0];
        std::string what =
            exact(top) ? absl::StrCat("the output is ", Described(*best), " bit for bit")
                       : absl::StrFormat(
                             "the output is %s in another summation order: every element lies "
                             "within %.1f predicted standard errors of it",
                             Described(*best), ElementThresholdSigma(total));
        out.headline = absl::StrCat("Rounding, not a bug: ", what, ".");
        // Rounding of inputs that already hold an inf or NaN, or of a sum
        // that overflows the output precision, is still rounding; said so,
        // so that the sentence does not hide the non-finite values a
        // whole-model check counts as a divergence (docs/model-checks.md).
        if (const int64_t nonfinite = CountNonFinite(*in.observed); nonfinite > 0) {
          absl::StrAppend(&out.headline, " But ", nonfinite, " of its ", total,
                          " elements are inf or NaN, and ", best->ToString(),
                          " computes them so too: look for an inf or NaN in the input, weight "
                          "or bias, or a value beyond ",
                          DTypeName(in.output_dtype), "'s range.");
        }
        if (out.accepted) {
          absl::StrAppend(&out.headline, " Accepted (", AcceptList(), ").");
        } else if (!in.accept.empty()) {
          absl::StrAppend(&out.headline, " Not accepted: it is not ", AcceptList(), ".");
        }
        break;
      }
      case DiagnosisVerdict::kDefect: {
        const DefectReport& d = *out.defect;
        std::vector<std::string> where;
        if (!d.columns.empty()) {
          where.push_back(absl::StrCat(d.columns.size() == 1 ? "column " : "columns ",
                                       IndexList(d.columns, 5)));
        }
        if (!d.rows.empty()) {
          where.push_back(
              absl::StrCat(d.rows.size() == 1 ? "row " : "rows ", IndexList(d.rows, 5)));
        }
        const std::string place = where.empty() ? absl::StrFormat("%d element(s)", d.element_count)
                                                : absl::StrJoin(where, " and ");
        out.headline = absl::StrFormat(
            "Not rounding: %s explains the output except %s (%d element(s) beyond %.1f "
            "predicted standard errors, largest %d ULP). Look at %s.",
            best->ToString(), place, d.element_count, d.element_threshold_sigma, d.max_ulp,
            d.where_to_look.empty() ? "the operands there" : d.where_to_look);
        break;
      }
      default:
        out.headline = absl::StrFormat(
            "Unexplained: no offered configuration explains the output; the closest, %s, does "
            "not (%s). Offer the computation that made it, or check the operands.",
            best->ToString(), unexplained_why);
        break;
    }
    // What to change: only for an output that is rounding (a defect or an
    // unexplained output needs its operands fixed, not a switch).
    if (out.verdict != DiagnosisVerdict::kRounding || out.accepted) return;
    const Config* wanted = Wanted();
    if (wanted == nullptr) return;
    for (const Config* c : same) {
      if (c->precision == wanted->precision && c->bias == wanted->bias &&
          c->splitk == wanted->splitk) {
        return;
      }
    }
    const std::string how = HowToMatch(*best, *wanted, in.storage_dtype, in.has_bias);
    if (how.empty()) return;
    std::string step = how;
    step[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(step[0])));
    out.advice = absl::StrCat("To get ", Described(*wanted), ": ", step);
  }

  // Every candidate, class by class in rank order, with the evidence on
  // it. `z[j]`: class j's paired sign test against best (NaN when not run).
  void EmitRanking(const std::string& best_name, const std::vector<double>& z) {
    for (size_t j = 0; j < classes.size(); ++j) {
      const ClassScore& cls = classes[j];
      const std::string name = in.candidates[cls.members[0]].config.ToString();
      const bool tied = std::find(out.tied.begin(), out.tied.end(), name) != out.tied.end();
      const std::string why = RuledOut(cls, /*is_best=*/j == 0 && !best_name.empty(), tied,
                                       j < z.size() ? z[j] : NAN, best_name);
      for (size_t m = 0; m < cls.members.size(); ++m) {
        const DiagnosisCandidate& c = in.candidates[cls.members[m]];
        RankedCandidate r;
        r.config = c.config.ToString();
        r.bitwise_equal_fraction = cls.bitwise_fraction();
        r.max_ulp = cls.max_ulp;
        r.mean_ulp = cls.mean_ulp();
        r.bound_ratio = cls.bound_ratio();
        for (size_t k = 0; k < cls.members.size(); ++k) {
          if (k != m) r.equivalent.push_back(in.candidates[cls.members[k]].config.ToString());
        }
        r.disagreements = cls.disagreements();
        r.expected_disagreements = cls.expected_disagreements;
        r.plausibility_p = cls.plausibility_p;
        r.plausible = cls.is_plausible();
        r.consistent_fraction = cls.within();
        r.compared_elements = cls.counted;
        r.ruled_out = why;
        r.shared_computation = c.shared_computation;
        r.exact = exact(cls);
        r.framework_default = FrameworkDefault(c.config, in.storage_dtype, in.has_bias);
        r.accepted = Accepts(c.config);
        out.ranking.push_back(std::move(r));
      }
    }
  }
};

}  // namespace

DiagnosisOutcome RankCandidates(const DiagnosisInput& in) {
  // The host's passes cannot fail.
  return *RankCandidates(in, *HostEvidence(in));
}

absl::StatusOr<DiagnosisOutcome> RankCandidates(const DiagnosisInput& in,
                                                DiagnosisEvidence& evidence) {
  if (in.candidates.empty() || in.observed->numel() == 0) {
    DiagnosisOutcome out;
    out.compared_dtype = in.output_dtype;
    out.explanation = "No candidates to compare the observed output with.";
    return out;
  }
  Ranking r(in, evidence);
  TC_RETURN_IF_ERROR(r.Classify());
  TC_RETURN_IF_ERROR(r.MarkExplained());
  TC_RETURN_IF_ERROR(r.Score());
  TC_RETURN_IF_ERROR(r.SetAsideGatheredDifferences());
  r.Order();
  TC_RETURN_IF_ERROR(r.NamePreferredFirst());
  TC_RETURN_IF_ERROR(r.ListOutliers());
  if (r.NothingExplains()) {
    TC_RETURN_IF_ERROR(r.ExplainNothing());
    r.EmitRanking("", {});
    r.DecideNothingExplains();
    r.Conclude();
    return std::move(r.out);
  }
  r.NameBest();
  TC_RETURN_IF_ERROR(r.Separate());
  r.EmitRanking(*r.out.best, r.z_vs_best);
  r.Confidence();
  TC_RETURN_IF_ERROR(r.LocalizeDifferences());
  TC_RETURN_IF_ERROR(r.WriteParagraph());
  TC_RETURN_IF_ERROR(r.Decide());
  r.Conclude();
  return std::move(r.out);
}

}  // namespace tensorcheck
