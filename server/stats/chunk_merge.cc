#include "server/stats/internal/chunk_merge.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "server/stats/internal/worst.h"

namespace tensorcheck::internal {
namespace {

// Neumaier-compensated running sum.
struct CompensatedSum {
  double sum = 0;
  double c = 0;
  void Add(double x) {
    const double t = sum + x;
    if (std::fabs(sum) >= std::fabs(x)) {
      c += (sum - t) + x;
    } else {
      c += (x - t) + sum;
    }
    sum = t;
  }
  double Value() const { return sum + c; }
};

}  // namespace

DiffTotals MergeChunks(std::vector<ChunkAcc>& accs, const std::vector<BlockSums>& blocks, int top_k,
                       std::vector<ElementDiff>* worst_diffs) {
  DiffTotals totals;
  WorstHeap worst(top_k);
  for (ChunkAcc& a : accs) {
    totals.finite += a.finite;
    totals.mismatched += a.mismatched;
    totals.bitwise_equal += a.bit_equal;
    totals.nan_actual += a.nan_actual;
    totals.nan_expected += a.nan_expected;
    totals.inf_actual += a.inf_actual;
    totals.inf_expected += a.inf_expected;
    totals.nan_mismatch += a.nan_mismatch;
    totals.ulp_infinite += a.ulp_infinite;
    totals.max_ulp = std::max(totals.max_ulp, a.max_ulp);
    for (const auto& lane : a.hist) {
      for (int k = 0; k < kHistBuckets; ++k) totals.ulp_histogram[k] += lane[k];
    }
    if (a.max_abs > totals.max_abs) {
      totals.max_abs = a.max_abs;
      totals.max_abs_index = a.max_abs_index;
    }
    if (a.max_rel > totals.max_rel) {
      totals.max_rel = a.max_rel;
      totals.max_rel_index = a.max_rel_index;
    }
    for (const Candidate& c : a.worst.items()) worst.Offer(c);
  }
  CompensatedSum sum_abs, sum_sq, sum_aa, sum_ee, sum_ae, sum_ulp, sum_sigma2, sum_sq_sigma;
  for (const BlockSums& b : blocks) {
    sum_abs.Add(b.abs);
    sum_sq.Add(b.sq);
    sum_aa.Add(b.aa);
    sum_ee.Add(b.ee);
    sum_ae.Add(b.ae);
    sum_ulp.Add(b.ulp);
    sum_sigma2.Add(b.sigma2);
    sum_sq_sigma.Add(b.sq_sigma);
  }
  totals.sum_abs = sum_abs.Value();
  totals.sum_sq = sum_sq.Value();
  totals.sum_aa = sum_aa.Value();
  totals.sum_ee = sum_ee.Value();
  totals.sum_ae = sum_ae.Value();
  totals.sum_ulp = sum_ulp.Value();
  totals.sum_sigma2 = sum_sigma2.Value();
  totals.sum_sq_sigma = sum_sq_sigma.Value();
  worst_diffs->clear();
  worst_diffs->reserve(worst.items().size());
  for (const Candidate& c : worst.items()) worst_diffs->push_back(c.diff);
  return totals;
}

void MergeGroups(const std::vector<ChunkAcc>& accs, int64_t cols, int top_groups, DiffStats* s) {
  // Columns: sum every chunk's counts into one array.
  std::vector<int64_t> col_counts(static_cast<size_t>(cols), 0);
  for (const ChunkAcc& a : accs) {
    if (a.row_counts.empty()) continue;
    if (!a.col_by_offset) {
      for (int64_t c = 0; c < cols; ++c) {
        col_counts[static_cast<size_t>(c)] += a.col_counts[static_cast<size_t>(c)];
      }
      continue;
    }
    int64_t c = a.start % cols;
    for (int64_t off = 0; off < a.end - a.start; ++off) {
      col_counts[static_cast<size_t>(c)] += a.col_counts[static_cast<size_t>(off)];
      if (++c == cols) c = 0;
    }
  }
  s->top_columns = TopGroupCounts(col_counts, top_groups, s->mismatched);

  // Rows: chunks hold ascending, contiguous row ranges that overlap at
  // most in one boundary row, so a row is complete once a later chunk
  // starts past it.
  TopGroups top_rows(top_groups);
  int64_t pending_row = -1;
  int64_t pending_count = 0;
  for (const ChunkAcc& a : accs) {
    if (a.row_counts.empty()) continue;
    for (size_t k = 0; k < a.row_counts.size(); ++k) {
      const int64_t r = a.first_row + static_cast<int64_t>(k);
      if (r == pending_row) {
        pending_count += a.row_counts[k];
        continue;
      }
      if (pending_row >= 0) top_rows.Offer(pending_row, pending_count);
      pending_row = r;
      pending_count = a.row_counts[k];
    }
  }
  if (pending_row >= 0) top_rows.Offer(pending_row, pending_count);
  s->top_rows = top_rows.Take(s->mismatched);
}

}  // namespace tensorcheck::internal
