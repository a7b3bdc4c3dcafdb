// SlowBlock: Compare's element-by-element kernel, for any block, with every
// special case (NaN, infinities, overflowing sums). The fast kernels give
// the same results on the blocks they take.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "server/stats/internal/block_kernels.h"
#include "server/stats/tolerance.h"

namespace tensorcheck::internal {
namespace {

// A pair where at least one value is NaN or infinite. Returns the ULP
// distance to add to the block's sum (0 for an infinite one).
double NonFiniteElement(ChunkAcc& acc, const CompareContext& sh, int64_t i, double a, double e,
                        uint64_t ba, uint64_t be, int64_t col, int64_t row) {
  const Tolerance& tol = sh.options->tolerance;
  const bool nan_a = std::isnan(a);
  const bool nan_e = std::isnan(e);
  acc.nan_actual += nan_a;
  acc.nan_expected += nan_e;
  acc.inf_actual += std::isinf(a);
  acc.inf_expected += std::isinf(e);
  const bool nan_mismatch = nan_a != nan_e;
  acc.nan_mismatch += nan_mismatch;

  const uint64_t ulp = DistanceFromBits(ba, be, sh.layout);
  double ulp_sum = 0;
  if (ulp == kUlpInfinite) {
    ++acc.ulp_infinite;
  } else {
    ++acc.hist[0][BucketIndex(ulp)];
    ulp_sum = static_cast<double>(ulp);
  }
  acc.max_ulp = std::max(acc.max_ulp, ulp);

  double abs_diff;
  double rel;
  double rank;
  const double inf = std::numeric_limits<double>::infinity();
  if (nan_a || nan_e) {
    abs_diff = rel = std::numeric_limits<double>::quiet_NaN();
    rank = (nan_a && nan_e && tol.nan_equal) ? 0.0 : inf;
  } else {
    abs_diff = rel = rank = (a == e) ? 0.0 : inf;
    if (abs_diff > acc.max_abs) {
      acc.max_abs = abs_diff;
      acc.max_abs_index = i;
    }
    if (rel > acc.max_rel) {
      acc.max_rel = rel;
      acc.max_rel_index = i;
    }
  }
  const float* bound = sh.options->error_bound;
  if (!ElementPasses(tol, a, e, bound != nullptr ? bound[i] : 0.0, ulp)) {
    RecordMismatch(acc, sh, i, col, row);
  }
  const int tier = nan_mismatch ? 1 : 0;
  if (acc.worst.MayEnter(tier, rank)) {
    acc.worst.Offer({{tier, rank, ulp, i}, MakeDiff(i, a, e, ba, be, abs_diff, rel, ulp)});
  }
  return ulp_sum;
}

}  // namespace

void SlowBlock(ChunkAcc& acc, const CompareContext& sh, const BlockView& v, int64_t& col,
               int64_t& row, BlockSums& bs) {
  const CompareOptions& opt = *sh.options;
  const float* const sigma = opt.predicted_sigma;
  const float* const bound = opt.error_bound;
  bs = BlockSums();
  for (int64_t j = 0; j < v.n; ++j) {
    const int64_t i = v.start + j;
    const double a = v.a[j];
    const double e = v.e[j];
    const uint64_t ba = v.ba[j];
    const uint64_t be = v.be[j];
    acc.bit_equal += ba == be;
    if (std::isfinite(a) && std::isfinite(e)) {
      ++acc.finite;
      const double d = a - e;
      const double abs_diff = std::fabs(d);
      const double abs_e = std::fabs(e);
      bs.abs += abs_diff;
      bs.sq += d * d;
      bs.aa += a * a;
      bs.ee += e * e;
      bs.ae += a * e;
      if (sigma != nullptr && std::isfinite(sigma[i])) {
        const double s = sigma[i];
        bs.sigma2 += s * s;
        bs.sq_sigma += d * d;
      }
      const uint64_t ulp = OrderedDistance(ba, be, sh.layout);
      ++acc.hist[0][BucketIndex(ulp)];
      bs.ulp += static_cast<double>(ulp);
      acc.max_ulp = std::max(acc.max_ulp, ulp);
      if (abs_diff > acc.max_abs) {
        acc.max_abs = abs_diff;
        acc.max_abs_index = i;
      }
      const double rel = RelDiff(abs_diff, abs_e);
      if (rel > acc.max_rel) {
        acc.max_rel = rel;
        acc.max_rel_index = i;
      }
      if (!FinitePairPasses(opt.tolerance, abs_diff, abs_e, bound != nullptr ? bound[i] : 0.0,
                            ulp)) {
        RecordMismatch(acc, sh, i, col, row);
      }
      if (acc.worst.MayEnter(0, abs_diff)) {
        acc.worst.Offer({{0, abs_diff, ulp, i}, MakeDiff(i, a, e, ba, be, abs_diff, rel, ulp)});
      }
    } else {
      bs.ulp += NonFiniteElement(acc, sh, i, a, e, ba, be, col, row);
    }
    if (++col == sh.cols) {
      col = 0;
      ++row;
    }
  }
}

}  // namespace tensorcheck::internal
