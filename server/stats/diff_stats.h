// Difference statistics between two tensors, in one pass that runs on an
// executor the caller hands in (core/executor.h).
//
//   CompareOptions opts;
//   opts.tolerance = ResolveTolerance(TolerancePreset::kTorch, DType::kFloat32);
//   opts.compared_dtype = DType::kFloat32;
//   opts.cols = n;                        // rows = numel / cols
//   opts.executor = stats_pool;           // null: on the calling thread
//   TC_ASSIGN_OR_RETURN(DiffStats s, Compare(actual, expected, opts));
//   s.mismatched, s.max_abs, s.max_ulp, s.worst, s.top_columns, ...
//
// `actual` and `expected` may have different storage dtypes; both are read
// exactly as doubles. Absolute/relative differences use the exact values;
// ULP distances and bit equality are taken after rounding both to
// `compared_dtype` (a no-op when it is their own dtype).
//
// Definitions (a = actual, e = expected, per element):
//   abs = |a-e|; rel = |a-e|/|e|, and at e == 0: 0 if a == 0 else +inf.
//   max_abs / max_rel and their first flat index are taken over pairs with
//   no NaN; an infinity against a different value counts as +inf there.
//   mean_abs, rms, rel_l2, cosine and bound_ratio are sums over the pairs
//   where both values are finite (`finite` of them); NaN/Inf are counted in
//   the nan_/inf_ fields instead.
//   ULP distances are taken in `compared_dtype`; max_ulp is kUlpInfinite
//   when some pair is NaN against a number; mean_ulp averages the pairs
//   with a finite distance.
//
// The result does not depend on the executor (nor on its size): sums are
// taken per fixed block of elements and the block sums added in order
// (compensated), maxima keep the first occurrence, and ties in `worst` and
// the group lists go to the lower index.
//
// Thread safety: Compare may be called from many threads at once, sharing
// one executor. The implementation lives in several files: diff_stats.cc
// orchestrates, internal/block_kernels.h describes the per-block kernels,
// chunk_merge.cc merges, worst.cc ranks, ulp.cc measures.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/dtype.h"
#include "core/executor.h"
#include "core/stop_signal.h"
#include "core/tensor.h"
#include "server/stats/tolerance.h"
#include "server/stats/ulp.h"  // BitsIn, UlpDistance, UlpHistogramBucket

namespace tensorcheck {

// One element of a comparison.
struct ElementDiff {
  int64_t flat_index = 0;
  double actual = 0;
  double expected = 0;
  uint64_t actual_bits = 0;  // bit pattern in the compared dtype
  uint64_t expected_bits = 0;
  double abs_diff = 0;
  double rel_diff = 0;
  uint64_t ulp = 0;
};

// Mismatches held by one column or row.
struct GroupCount {
  int64_t index = 0;
  int64_t mismatched = 0;
  double share = 0;  // of all mismatched elements
};

// ULP histogram bucket [lo, hi]: 0, 1, 2, 3-4, 5-8, 9-16, ...
struct UlpBucket {
  uint64_t lo = 0;
  uint64_t hi = 0;
  int64_t count = 0;
};

// The differing elements whose expected value is negligible against the
// output's scale: |e| < below = kNegligibleBelowScale * (largest finite
// |e|). Their ULP distances measure cancellation, not rounding, and are
// left out of the headline figure (docs/numerics.md, "ULP figures and
// elements near zero").
// Looked for only when the largest ULP distance is kNegligibleFromUlp or
// more: one ULP at the output's scale is that many at the threshold, and a
// smaller figure is read as it is.
inline constexpr double kNegligibleBelowScale = 0x1p-10;
inline constexpr uint64_t kNegligibleFromUlp = uint64_t{1} << 10;
struct NegligibleElements {
  double below = 0;
  int64_t differing = 0;             // below `below` with differing bits
  double max_abs = 0;                // their largest |a - e|
  uint64_t significant_max_ulp = 0;  // the largest distance over the others
};

// "leaving out 3 elements near zero (|expected| < 2.4e-04, 2^-10 of the
// largest), which differ by at most 6.0e-08": what a client prints after
// significant_max_ulp.
std::string NegligibleNote(const NegligibleElements& n);

struct DiffStats {
  int64_t total = 0;
  int64_t finite = 0;      // pairs with both values finite
  int64_t mismatched = 0;  // failing the tolerance
  double max_abs = 0;
  int64_t max_abs_index = -1;  // flat; -1 when total == 0
  double max_rel = 0;
  int64_t max_rel_index = -1;
  double mean_abs = 0;
  double rms = 0;
  double rel_l2 = 0;  // ||a - e|| / ||e||; 0 when both are zero, inf when only e is
  double cosine = 0;  // 1 when both are zero vectors
  uint64_t max_ulp = 0;
  double mean_ulp = 0;
  // Non-empty buckets only, ascending; NaN against a number lands in a
  // last bucket with lo == hi == kUlpInfinite.
  std::vector<UlpBucket> ulp_histogram;
  bool bitwise_equal = false;
  int64_t bitwise_equal_count = 0;
  int64_t nan_actual = 0;
  int64_t nan_expected = 0;
  int64_t inf_actual = 0;
  int64_t inf_expected = 0;
  int64_t nan_mismatch = 0;  // exactly one side NaN
  // top_k elements: NaN against a number first, then by abs diff, then
  // ULP, descending; ties to the lower index. NaN against NaN ranks as
  // abs diff 0 when nan_equal, +inf otherwise.
  std::vector<ElementDiff> worst;
  std::vector<GroupCount> top_columns;
  std::vector<GroupCount> top_rows;
  // sqrt(sum (a-e)^2 / sum sigma^2) over the finite pairs with a finite
  // sigma, when predicted_sigma was given: ~1 when the error is what the
  // precision predicts. 0 when both sums are 0, +inf when only sigma's is.
  std::optional<double> bound_ratio;
  DType compared_dtype = DType::kFloat32;
  bool passed = true;  // mismatched == 0
  // Set by Compare when some differing element is negligible; never by
  // FinishDiffStats (the device comparison does not compute it yet).
  std::optional<NegligibleElements> negligible;
};

struct CompareOptions {
  Tolerance tolerance;
  DType compared_dtype = DType::kFloat32;
  // The tensors are viewed as [rows, cols] for column/row concentration;
  // rows = total / cols. 0 means a single row (cols = total).
  int64_t cols = 0;
  int top_k = 10;      // at most kMaxTopK
  int top_groups = 5;  // at most kMaxTopK
  // Per element, the standard error the precision predicts (error model);
  // gives bound_ratio. May be null.
  const float* predicted_sigma = nullptr;
  // The sum over all elements of predicted_sigma^2 when the caller has it
  // (PredictSigma returns it; not finite when some sigma is not), or < 0.
  // Compare ignores it; the device comparison then skips a pass over the
  // sigma on the host.
  double predicted_sigma_sum_sq = -1;
  // Per element, the unscaled hard bound of TolerancePreset::kBound (the
  // tolerance's bound_factor is applied by the rule). Required for that
  // preset.
  const float* error_bound = nullptr;
  // Runs the pass; null: on the calling thread. Not owned; shared with
  // other callers. Small inputs use fewer of its threads (at least 2^15
  // elements each); the result is the same for any executor.
  Executor* executor = nullptr;
  // The request's stop signal (null: never stops): checked before each
  // chunk of at most kCompareStopChunk elements; when it fires, Compare
  // returns its status (CANCELLED or DEADLINE_EXCEEDED).
  const StopSignal* stop = nullptr;
  // Deprecated and ignored: Compare starts no threads of its own any more
  // (use `executor`). Kept until the engine stops setting it.
  int threads = 0;
};

inline constexpr int kMaxTopK = 1 << 16;

// Elements per chunk at most, so that a stop is seen within a few tens of
// milliseconds of one thread's work.
inline constexpr int64_t kCompareStopChunk = int64_t{1} << 22;

// INVALID_ARGUMENT when the element counts differ, `cols` is negative or
// does not divide the element count, top_k/top_groups are out of range, or
// the bound preset has no `error_bound`.
absl::StatusOr<DiffStats> Compare(const Tensor& actual, const Tensor& expected,
                                  const CompareOptions& options);

// ---- For implementations of Compare that run elsewhere (the GPU backends
// compare on the device, where their outputs are). They accumulate
// DiffTotals in one pass, pick candidates for `worst` and count mismatches
// per column and row; FinishDiffStats turns that into the DiffStats that
// Compare returns for the same tensors (sums may differ in the last bits,
// being added in another order).

// INVALID_ARGUMENT as Compare answers for these element counts and options.
absl::Status ValidateCompare(int64_t actual_numel, int64_t expected_numel,
                             const CompareOptions& options);

struct DiffTotals {
  int64_t finite = 0;
  int64_t mismatched = 0;
  int64_t bitwise_equal = 0;
  int64_t nan_actual = 0;
  int64_t nan_expected = 0;
  int64_t inf_actual = 0;
  int64_t inf_expected = 0;
  int64_t nan_mismatch = 0;
  int64_t ulp_infinite = 0;  // NaN against a number
  uint64_t max_ulp = 0;
  std::vector<int64_t> ulp_histogram =
      std::vector<int64_t>(kUlpHistogramBuckets, 0);  // finite distances
  // First occurrence of the largest; -1 for none.
  double max_abs = -1;
  int64_t max_abs_index = -1;
  double max_rel = -1;
  int64_t max_rel_index = -1;
  // Over the finite pairs; sigma2/sq_sigma over those with a finite sigma.
  double sum_abs = 0, sum_sq = 0, sum_aa = 0, sum_ee = 0, sum_ae = 0;
  double sum_ulp = 0;  // finite distances, every pair
  double sum_sigma2 = 0, sum_sq_sigma = 0;
};

// The DiffStats of `total` pairs. `worst_candidates` holds any superset of
// the top_k worst elements (as DescribeElement makes them); they are ranked
// and cut to top_k here. The group lists are left empty (TopGroupCounts).
DiffStats FinishDiffStats(int64_t total, const DiffTotals& totals,
                          std::vector<ElementDiff> worst_candidates, const CompareOptions& options);

// One element as `worst` lists it.
ElementDiff DescribeElement(int64_t flat_index, double actual, double expected,
                            DType compared_dtype);

// The `limit` largest of `counts` (mismatches per column or row; ties to
// the lower index), with their share of `mismatched`.
std::vector<GroupCount> TopGroupCounts(const std::vector<int64_t>& counts, int limit,
                                       int64_t mismatched);

}  // namespace tensorcheck
