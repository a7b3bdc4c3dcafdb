// The lean path of the device comparison's totals pass (internal to this
// folder): both arrays stored in the compared type, and that type narrow
// (fp32, fp16, bf16), the common case of a verification. A 16-byte vector
// with no NaN or infinity in either array (one add per 32-bit word tells)
// goes through LeanVector: Accumulate's finite branch (compare_thread.h) on
// 32-bit patterns (narrow_patterns.h), without a branch per element. Any
// other vector goes through Accumulate. The pass is bound by instruction
// issue, not by memory: the fewer instructions per element, the nearer a
// copy's speed. Host and device alike; CompareThreadTest checks it on the
// host against stats' Compare.
//
//   // In ForEachVector's on_vector (compare_iteration.h), for a narrow kType:
//   if (TryLeanVector<ElemType::kBF16>(args, first, ra, re, t, hist, cols, rows)) {
//     return true;  // taken: its elements are in t and hist
//   }
//   return false;   // a NaN or an infinity: Accumulate takes each element
#pragma once

#include <cstdint>

#include "core/host_device.h"
#include "server/backends/cuda/internal/compare_thread.h"
#include "server/backends/cuda/internal/device_intrinsics.h"
#include "server/backends/cuda/internal/elem_type.h"
#include "server/backends/cuda/internal/kernel_args.h"
#include "server/backends/cuda/internal/narrow_patterns.h"
#include "server/stats/element_rules.h"

namespace tensorcheck::cuda::cmp {

// Element j of a vector: its widened pattern (narrow_patterns.h) and value.
template <ElemType kType>
TC_HOST_DEVICE void LeanDecode(const Vec16& raw, int j, unsigned int* p, float* v) {
  *p = narrow::Widened<kType>(raw, j);
  if constexpr (kType == ElemType::kF16) {
    *v = dev::HalfToFloat(static_cast<unsigned short>(*p >> 16));
  } else {
    *v = dev::FloatOf(*p);  // fp32, and bf16 shifted up: the same bits
  }
}

// What a lean vector keeps besides the thread's totals. Per element, the
// common path has no branch: what is rarely needed (a large ULP distance,
// a new maximum, a quotient that may win, a mismatch) is noted in these
// and handled once per vector, in element order; the maxima are compared
// with the thread's as they stood before the vector.
struct LeanVectorState {
  double rel_limit;             // max_rel * kShrink: no smaller quotient can win
  unsigned int hist_bytes;      // buckets 0-3 as 8-bit counters
  unsigned int ulp_sum;         // 16-bit types: at most 8 distances below 2^16
  unsigned int max_ulp;         // > 4: some distance is in bucket 4 or above
  unsigned int bit_equal;       // bit j: element j's patterns are equal
  unsigned int abs_candidates;  // bit j: element j's |a-e| beats max_abs
  unsigned int rel_candidates;  // bit j: element j's quotient may beat max_rel
  unsigned int fails;           // bit j: element j fails the tolerance
};

// Element j of a lean vector: its patterns and values.
template <ElemType kType>
struct LeanPair {
  unsigned int pa, pe;
  double a, e;
  TC_HOST_DEVICE LeanPair(const Vec16& ra, const Vec16& re, int j) {
    float fa, fe;
    LeanDecode<kType>(ra, j, &pa, &fa);
    LeanDecode<kType>(re, j, &pe, &fe);
    a = fa;
    e = fe;
  }
  TC_HOST_DEVICE double abs_diff() const { return dev::Abs(a - e); }
};

// Element j of a lean vector: Accumulate's finite branch, its rare parts
// left to LeanVector.
template <ElemType kType, ToleranceRule kRule>
TC_HOST_DEVICE void LeanElement(const CompareArgs& args, int64_t first, int j,
                                const LeanPair<kType>& x, ThreadTotals& t, LeanVectorState& v) {
  const double d = x.a - x.e;
  const double abs_diff = dev::Abs(d);
  const double abs_e = dev::Abs(x.e);
  v.bit_equal |= static_cast<unsigned int>(x.pa == x.pe) << j;
  t.sum_abs += abs_diff;
  t.sum_sq += d * d;
  t.sum_aa += x.a * x.a;
  t.sum_ee += x.e * x.e;
  t.sum_ae += x.a * x.e;
  const unsigned int u = narrow::Distance<kType>(x.pa, x.pe);
  v.hist_bytes += 1u << (8 * dev::Min(u, 3u));  // 3 and 4, and above 4 until LeanVector
  if constexpr (kType == ElemType::kF32) {
    t.sum_ulp_small += u;
  } else {
    v.ulp_sum += u;
  }
  v.max_ulp = dev::Max(v.max_ulp, u);
  if (abs_diff > t.max_abs) v.abs_candidates |= 1u << j;
  // With |e| = 0: rel_limit * 0 is 0 (or NaN once max_rel is infinite), so
  // a nonzero difference is a candidate, with the quotient +inf.
  if (abs_diff > v.rel_limit * abs_e) v.rel_candidates |= 1u << j;
  if (!rules::FinitePairPasses<kRule>(args, abs_diff, abs_e, BoundOf(args, first + j), u)) {
    v.fails |= 1u << j;
  }
}

// A vector of finite pairs whose first element is `first`.
template <ElemType kType, ToleranceRule kRule>
TC_HOST_DEVICE void LeanVector(const CompareArgs& args, int64_t first, const Vec16& ra,
                               const Vec16& re, ThreadTotals& t, LocalHistogram& hist,
                               ull* col_counts, ull* row_counts) {
  constexpr int per = kPerVector<kType>;
  // Every pair here has a quotient of at least 0: the first of them is
  // where max_rel stands until a larger one comes (rel_limit * |e| could
  // not let a 0 in when |e| = 0).
  if (t.max_rel < 0) {
    t.max_rel = 0;
    t.max_rel_index = first;
  }
  LeanVectorState v{t.max_rel * kShrink, 0, 0, 0, 0, 0, 0, 0};
  TC_UNROLL
  for (int j = 0; j < per; ++j) {
    LeanElement<kType, kRule>(args, first, j, LeanPair<kType>(ra, re, j), t, v);
  }
  t.finite += per;
  t.bit_equal += dev::Popc(v.bit_equal);
  t.sum_ulp_small += v.ulp_sum;
  t.max_ulp = dev::Max(t.max_ulp, ull{v.max_ulp});
  if (v.max_ulp > 4) {  // buckets 4 and above: counted in bucket 3 so far
    TC_NO_UNROLL
    for (int j = 0; j < per; ++j) {
      const LeanPair<kType> x(ra, re, j);
      const unsigned int u = narrow::Distance<kType>(x.pa, x.pe);
      if (u > 4) {
        v.hist_bytes -= 1u << 24;
        dev::AtomicAdd(&hist.shared[rules::BucketIndex(u)], 1u);
      }
    }
  }
  hist.AddVector(v.hist_bytes);
  for (unsigned int c = v.abs_candidates; c != 0; c &= c - 1) {  // in element order
    const int j = dev::Ffs(c) - 1;
    const double abs_diff = LeanPair<kType>(ra, re, j).abs_diff();
    if (abs_diff > t.max_abs) {
      t.max_abs = abs_diff;
      t.max_abs_index = first + j;
    }
  }
  for (unsigned int c = v.rel_candidates; c != 0; c &= c - 1) {  // in element order
    const int j = dev::Ffs(c) - 1;
    const LeanPair<kType> x(ra, re, j);
    const double abs_e = dev::Abs(x.e);
    const double rel = abs_e > 0 ? x.abs_diff() / abs_e : dev::Inf();
    if (rel > t.max_rel) {
      t.max_rel = rel;
      t.max_rel_index = first + j;
    }
  }
  t.mismatched += dev::Popc(v.fails);
  if (col_counts != nullptr) {
    for (unsigned int f = v.fails; f != 0; f &= f - 1) {
      CountGroups(args, first + dev::Ffs(f) - 1, col_counts, row_counts);
    }
  }
  if (args.sigma != nullptr) {  // bound_ratio's sums over the finite sigma
    TC_NO_UNROLL
    for (int j = 0; j < per; ++j) {
      const float s = args.sigma[first + j];
      if (dev::IsFinite(s)) {
        const LeanPair<kType> x(ra, re, j);
        const double d = x.a - x.e;
        t.sum_sigma2 += static_cast<double>(s) * s;
        t.sum_sq_sigma += d * d;
      }
    }
  }
}

// The vector at `first` through the lean path if it can take it.
template <ElemType kType>
TC_HOST_DEVICE bool TryLeanVector(const CompareArgs& args, int64_t first, const Vec16& ra,
                                  const Vec16& re, ThreadTotals& t, LocalHistogram& hist,
                                  ull* col_counts, ull* row_counts) {
  if (!narrow::AllFinite<kType>(ra, re)) return false;
  switch (args.rule) {
    case ToleranceRule::kAbsPlusRel:
      LeanVector<kType, ToleranceRule::kAbsPlusRel>(args, first, ra, re, t, hist, col_counts,
                                                    row_counts);
      return true;
    case ToleranceRule::kAbsOrRel:
      LeanVector<kType, ToleranceRule::kAbsOrRel>(args, first, ra, re, t, hist, col_counts,
                                                  row_counts);
      return true;
    case ToleranceRule::kUlp:
      LeanVector<kType, ToleranceRule::kUlp>(args, first, ra, re, t, hist, col_counts, row_counts);
      return true;
    case ToleranceRule::kBound:
      LeanVector<kType, ToleranceRule::kBound>(args, first, ra, re, t, hist, col_counts,
                                               row_counts);
      return true;
  }
  return false;
}

}  // namespace tensorcheck::cuda::cmp
