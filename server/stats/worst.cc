// The public entry points of top-k selection (DescribeElement,
// TopGroupCounts) and the final ranking of `worst`.
#include "server/stats/internal/worst.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "server/stats/diff_stats.h"
#include "server/stats/internal/ulp_bits.h"

namespace tensorcheck {

namespace internal {

void RankWorst(std::vector<ElementDiff>& candidates, int top_k, bool nan_equal) {
  const double inf = std::numeric_limits<double>::infinity();
  auto key_of = [&](const ElementDiff& d) {
    const bool nan_a = std::isnan(d.actual), nan_e = std::isnan(d.expected);
    RankKey k;
    k.tier = nan_a != nan_e ? 1 : 0;
    k.r = (nan_a || nan_e) ? ((nan_a && nan_e && nan_equal) ? 0.0 : inf) : d.abs_diff;
    k.ulp = d.ulp;
    k.index = d.flat_index;
    return k;
  };
  std::sort(candidates.begin(), candidates.end(), [&](const ElementDiff& x, const ElementDiff& y) {
    return RanksAbove(key_of(x), key_of(y));
  });
  if (candidates.size() > static_cast<size_t>(top_k)) {
    candidates.resize(static_cast<size_t>(top_k));
  }
}

}  // namespace internal

ElementDiff DescribeElement(int64_t flat_index, double actual, double expected,
                            DType compared_dtype) {
  const uint64_t ba = BitsIn(actual, compared_dtype);
  const uint64_t be = BitsIn(expected, compared_dtype);
  const uint64_t ulp = internal::DistanceFromBits(ba, be, internal::LayoutOf(compared_dtype));
  double abs_diff, rel;
  if (std::isnan(actual) || std::isnan(expected)) {
    abs_diff = rel = std::numeric_limits<double>::quiet_NaN();
  } else if (!std::isfinite(actual) || !std::isfinite(expected)) {
    abs_diff = rel = actual == expected ? 0.0 : std::numeric_limits<double>::infinity();
  } else {
    abs_diff = std::fabs(actual - expected);
    rel = internal::RelDiff(abs_diff, std::fabs(expected));
  }
  return internal::MakeDiff(flat_index, actual, expected, ba, be, abs_diff, rel, ulp);
}

std::vector<GroupCount> TopGroupCounts(const std::vector<int64_t>& counts, int limit,
                                       int64_t mismatched) {
  internal::TopGroups top(limit);
  for (size_t i = 0; i < counts.size(); ++i) {
    top.Offer(static_cast<int64_t>(i), counts[i]);
  }
  return top.Take(mismatched);
}

}  // namespace tensorcheck
