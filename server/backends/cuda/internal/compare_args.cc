#include "server/backends/cuda/internal/compare_args.h"

#include "server/stats/tolerance.h"

namespace tensorcheck::cuda {
namespace {

ToleranceRule RuleOf(TolerancePreset p) {
  switch (p) {
    case TolerancePreset::kTorch:
    case TolerancePreset::kNumpy:
    case TolerancePreset::kExplicit:
      return ToleranceRule::kAbsPlusRel;
    case TolerancePreset::kPolygraphy:
      return ToleranceRule::kAbsOrRel;
    case TolerancePreset::kUlp:
      return ToleranceRule::kUlp;
    case TolerancePreset::kBound:
      return ToleranceRule::kBound;
  }
  return ToleranceRule::kAbsPlusRel;
}

}  // namespace

CompareArgs MakeCompareArgs(const DeviceArray& actual, const DeviceArray& expected,
                            const CompareOptions& options) {
  CompareArgs args;
  args.actual = actual.data;
  args.actual_type = ToElem(actual.dtype);
  args.expected = expected.data;
  args.expected_type = ToElem(expected.dtype);
  args.compared = ToElem(options.compared_dtype);
  args.total = actual.numel;
  args.cols = options.cols == 0 ? actual.numel : options.cols;
  const Tolerance& tol = options.tolerance;
  args.rule = RuleOf(tol.preset);
  args.atol = tol.atol;
  args.rtol = tol.rtol;
  args.bound_factor = tol.bound_factor;
  args.max_ulp = tol.max_ulp;
  args.nan_equal = tol.nan_equal;
  return args;
}

DiffTotals ToDiffTotals(const CompareResult& result) {
  const CompareTotals& r = result.totals;
  DiffTotals t;
  t.finite = r.finite;
  t.mismatched = r.mismatched;
  t.bitwise_equal = r.bit_equal;
  t.nan_actual = r.nan_actual;
  t.nan_expected = r.nan_expected;
  t.inf_actual = r.inf_actual;
  t.inf_expected = r.inf_expected;
  t.nan_mismatch = r.nan_mismatch;
  t.ulp_infinite = r.ulp_infinite;
  t.max_ulp = r.max_ulp;
  for (int b = 0; b < kCompareHistBuckets && b < kUlpHistogramBuckets; ++b) {
    t.ulp_histogram[static_cast<size_t>(b)] = static_cast<int64_t>(result.ulp_histogram[b]);
  }
  t.max_abs = r.max_abs;
  t.max_abs_index = r.max_abs_index;
  t.max_rel = r.max_rel;
  t.max_rel_index = r.max_rel_index;
  t.sum_abs = r.sum_abs;
  t.sum_sq = r.sum_sq;
  t.sum_aa = r.sum_aa;
  t.sum_ee = r.sum_ee;
  t.sum_ae = r.sum_ae;
  t.sum_ulp = r.sum_ulp;
  t.sum_sigma2 = r.sum_sigma2;
  t.sum_sq_sigma = r.sum_sq_sigma;
  return t;
}

}  // namespace tensorcheck::cuda
