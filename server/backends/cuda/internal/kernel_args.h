// The arguments and results of the device comparison's kernels
// (internal to this folder): plain types, without CUDA, shared by nvcc, the
// host compiler and a build without CUDA, whose tests run the kernels'
// per-thread code on the host (compare_thread.h).
//
//   CompareArgs args = MakeCompareArgs(actual, expected, options);  // internal/compare_args.h
//   args.nonfinite_indices = indices;  // device memory, as DeviceCompare::Enqueue sets it
//   LaunchCompareTotals(args, scratch, result, cols, rows, stream);  // fills a CompareResult
//
// Per element, the definitions are Compare's (diff_stats.h): values widened
// exactly to double, bits in the compared type (read as stored when the
// storage is that type, else rounded to nearest even), and the rules of
// server/stats/element_rules.h, which stats shares: ULP distances on
// ordered integers, their buckets, the tolerance rules.
#pragma once

#include <cstdint>

#include "server/backends/cuda/internal/elem_type.h"
#include "server/stats/element_rules.h"

namespace tensorcheck::cuda {

// Tolerance rules (element_rules.h's, where each formula is).
using ToleranceRule = rules::ToleranceRule;

struct CompareArgs {
  const void* actual = nullptr;
  ElemType actual_type = ElemType::kF32;
  const void* expected = nullptr;
  ElemType expected_type = ElemType::kF32;
  ElemType compared = ElemType::kF32;
  int64_t total = 0;
  int64_t cols = 1;  // rows = total / cols
  // Device arrays of `total` elements, or null. `sigma`: the predicted
  // standard error (bound_ratio sums); `bound`: kBound's per-element bound.
  const float* sigma = nullptr;
  const float* bound = nullptr;
  // Indices of the pairs with a NaN or infinity (bound_ratio's sums leave
  // them out): up to `nonfinite_capacity` of them, in no particular order;
  // CompareResult::nonfinite_count counts them all.
  long long* nonfinite_indices = nullptr;
  unsigned int nonfinite_capacity = 0;
  ToleranceRule rule = ToleranceRule::kAbsPlusRel;
  double atol = 0;
  double rtol = 0;
  double bound_factor = 1;
  unsigned long long max_ulp = 0;
  bool nan_equal = false;
};

// Totals of a range of elements; the same fields as stats' DiffTotals.
struct CompareTotals {
  double sum_abs, sum_sq, sum_aa, sum_ee, sum_ae, sum_ulp, sum_sigma2, sum_sq_sigma;
  double max_abs, max_rel;  // -1: none yet
  long long max_abs_index, max_rel_index;
  unsigned long long max_ulp;
  long long finite, mismatched, bit_equal, nan_actual, nan_expected, inf_actual, inf_expected,
      nan_mismatch, ulp_infinite;
};

// The ULP histogram's buckets (element_rules.h's BucketIndex).
inline constexpr int kCompareHistBuckets = rules::kUlpBuckets;

// What the totals pass leaves in device memory for the host to copy back.
struct CompareResult {
  CompareTotals totals;
  unsigned long long ulp_histogram[kCompareHistBuckets];
  unsigned int worst_count;  // entries written by the worst-element gather
  unsigned int nonfinite_count;
  unsigned int blocks_done;  // blocks of the totals pass that have written their partial
};

}  // namespace tensorcheck::cuda
