#include "server/stats/diagnosis_passes.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "server/stats/error_model.h"
#include "server/stats/ulp.h"

namespace tensorcheck {
namespace {

bool Reads(const uint8_t* mask, int64_t i) { return mask == nullptr || mask[i] != 0; }

}  // namespace

uint64_t DiagnosisUlp(double a, double b, DType dtype) {
  return a == b ? 0 : UlpDistance(a, b, dtype);
}

bool SameBitsPass(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.nbytes() == b.nbytes() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

int64_t MarkConsistentPass(const Tensor& observed, const Tensor& candidate, const float* pair_sigma,
                           DType compared, std::vector<uint8_t>* mask) {
  const int64_t total = observed.numel();
  mask->resize(static_cast<size_t>(total), 0);
  int64_t set = 0;
  for (int64_t i = 0; i < total; ++i) {
    uint8_t& m = (*mask)[static_cast<size_t>(i)];
    if (m == 0) {
      const double o = observed.GetDouble(i);
      const double v = candidate.GetDouble(i);
      if (rules::ElementConsistent(o, v, DiagnosisUlp(o, v, compared), pair_sigma[i])) m = 1;
    }
    set += m != 0 ? 1 : 0;
  }
  return set;
}

rules::ScoreSums ScorePass(const ScorePassInput& in) {
  rules::ScoreSums s;
  const int64_t total = in.observed->numel();
  for (int64_t i = 0; i < total; ++i) {
    if (!Reads(in.mask, i)) continue;
    const double o = in.observed->GetDouble(i);
    const double v = in.candidate->GetDouble(i);
    const float grid = in.flip_grid != nullptr ? in.flip_grid[i]
                                               : static_cast<float>(OutputSpacing(v, in.compared));
    rules::AddToScore(s, o, v, DiagnosisUlp(o, v, in.compared), in.pair_sigma[i],
                      in.pair_accumulation_sigma[i], grid);
  }
  return s;
}

rules::PairedSums PairedPass(const Tensor& observed, const Tensor& best, const Tensor& runner,
                             const float* sigma, const uint8_t* mask, DType compared) {
  rules::PairedSums s;
  for (int64_t i = 0; i < observed.numel(); ++i) {
    if (!Reads(mask, i)) continue;
    const double bv = best.GetDouble(i), rv = runner.GetDouble(i);
    if (!rules::PairedElementCounts(bv, rv, sigma[i])) continue;
    const double o = observed.GetDouble(i);
    rules::AddToPaired(s, DiagnosisUlp(o, bv, compared), DiagnosisUlp(o, rv, compared));
  }
  return s;
}

DifferingCounts DifferingPass(const Tensor& a, const Tensor& b, const uint8_t* mask, int64_t cols,
                              DType compared) {
  const int64_t total = a.numel();
  DifferingCounts d;
  if (cols <= 0) return d;
  d.columns.assign(static_cast<size_t>(cols), 0);
  d.rows.assign(static_cast<size_t>(total / cols), 0);
  for (int64_t i = 0; i < total; ++i) {
    if (!Reads(mask, i)) continue;
    if (DiagnosisUlp(a.GetDouble(i), b.GetDouble(i), compared) == 0) continue;
    ++d.columns[static_cast<size_t>(i % cols)];
    // A partial last row (count not a multiple of cols) is not a row.
    if (i / cols < static_cast<int64_t>(d.rows.size())) ++d.rows[static_cast<size_t>(i / cols)];
    ++d.total;
  }
  return d;
}

double BeyondRoundingSigma(double o, double v, uint64_t ulp, float pair_accumulation_sigma,
                           float grid, bool unfused_bias, double slope, DType compared) {
  if (ulp == 0) return 0;
  if (!std::isfinite(o) || !std::isfinite(v)) return std::numeric_limits<double>::infinity();
  double slack = std::max(OutputSpacing(o, compared), OutputSpacing(v, compared));
  // An unfused bias rounds x.w first: another spacing, of x.w (the flip
  // grid holds the coarsest of the grids the accumulator passes).
  if (unfused_bias && std::isfinite(grid)) slack += static_cast<double>(grid);
  const double excess = std::fabs(o - v) - slack;
  if (excess <= 0) return 0;
  return excess / (static_cast<double>(pair_accumulation_sigma) * slope);
}

DefectScan DefectScanPass(const DefectScanInput& in) {
  DefectScan d;
  const int64_t total = in.observed->numel();
  const int64_t cols = std::max<int64_t>(in.cols, 1);
  d.columns.assign(static_cast<size_t>(cols), GroupScan{});
  d.rows.assign(static_cast<size_t>(total / cols), GroupScan{});
  auto add = [&in](GroupScan& g, uint64_t ulp, double flip, double z, bool beyond, double e) {
    g.expected += flip;
    if (ulp == 0) return;
    ++g.differing;
    if (z > in.band_low && !beyond) ++g.band;
    if (std::isfinite(e)) {
      g.signed_sum += e;
      g.squared_sum += e * e;
    }
    if (beyond) ++g.beyond;
    g.max_ulp = std::max(g.max_ulp, ulp);
    if (!(z <= g.max_sigma)) g.max_sigma = z;  // NaN-free: z is never NaN
  };
  // The largest z beyond the threshold, kept as a min-heap of top_k.
  auto smaller = [](const SigmaElement& a, const SigmaElement& b) { return a.sigma > b.sigma; };
  const size_t keep = static_cast<size_t>(std::max(in.top_k, 0));
  for (int64_t i = 0; i < total; ++i) {
    const double o = in.observed->GetDouble(i);
    const double v = in.candidate->GetDouble(i);
    const uint64_t ulp = DiagnosisUlp(o, v, in.compared);
    const float grid = in.flip_grid != nullptr ? in.flip_grid[i]
                                               : static_cast<float>(OutputSpacing(v, in.compared));
    const double flip = rules::FlipChance(in.pair_accumulation_sigma[i], grid);
    const double z = BeyondRoundingSigma(o, v, ulp, in.pair_accumulation_sigma[i], grid,
                                         in.unfused_bias, in.slope, in.compared);
    const bool beyond = z > in.threshold;
    const double shift = (o - v) / static_cast<double>(in.pair_accumulation_sigma[i]);
    add(d.columns[static_cast<size_t>(i % cols)], ulp, flip, z, beyond, shift);
    if (i / cols < static_cast<int64_t>(d.rows.size())) {
      add(d.rows[static_cast<size_t>(i / cols)], ulp, flip, z, beyond, shift);
    }
    add(d.all, ulp, flip, z, beyond, shift);
    if (!beyond || keep == 0) continue;
    if (d.largest.size() == keep && !(z > d.largest.front().sigma)) continue;
    SigmaElement e;
    e.sigma = z;
    e.diff.flat_index = i;
    e.diff.actual = o;
    e.diff.expected = v;
    e.diff.actual_bits = BitsIn(o, in.compared);
    e.diff.expected_bits = BitsIn(v, in.compared);
    e.diff.abs_diff = std::fabs(o - v);
    e.diff.rel_diff = v != 0 ? e.diff.abs_diff / std::fabs(v)
                             : (e.diff.abs_diff == 0 ? 0 : std::numeric_limits<double>::infinity());
    e.diff.ulp = ulp;
    if (d.largest.size() == keep) {
      std::pop_heap(d.largest.begin(), d.largest.end(), smaller);
      d.largest.back() = e;
    } else {
      d.largest.push_back(e);
    }
    std::push_heap(d.largest.begin(), d.largest.end(), smaller);
  }
  std::sort_heap(d.largest.begin(), d.largest.end(), smaller);
  return d;
}

rules::ErrorSums ErrorPass(const Tensor& observed, const Tensor& reference,
                           const float* sigma_vs_reference, const uint8_t* mask) {
  rules::ErrorSums s;
  for (int64_t i = 0; i < observed.numel(); ++i) {
    if (!Reads(mask, i)) continue;
    rules::AddToError(s, observed.GetDouble(i), reference.GetDouble(i), sigma_vs_reference[i]);
  }
  return s;
}

}  // namespace tensorcheck
