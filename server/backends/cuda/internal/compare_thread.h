// What one thread of the device comparison's totals pass does with each
// of its elements (device_compare_kernels.cu runs it in every thread, then
// reduces across the warp, the block and the grid): the element access, the
// tolerance rules, and Accumulate into the thread's totals. It compiles for
// host and device: compare_thread_test.cc runs it on the host over whole
// tensors, one "thread", against stats' Compare, so that the per-element
// definitions and the lean path's bookkeeping are tested on every machine,
// not only on a GPU, and in a build without CUDA too (internal to this
// folder).
//
//   const rules::BitLayout layout = rules::LayoutOf(args.compared);
//   ThreadTotals t;
//   LocalHistogram hist;
//   hist.shared = block_hist;  // the block's [kCompareHistBuckets]
//   for (int64_t i = first; i < args.total; i += stride) {
//     Accumulate(args, layout, i, LoadElement(args, i), t, &rare, hist, cols, rows, &count);
//   }
//   CompareTotals partial = ToTotals(t);  // then reduced across threads
//
// Per element, the definitions are Compare's (diff_stats.h): values widened
// exactly to double, bits in the compared type, and the rules stats and the
// device share, written once in server/stats/element_rules.h: the bit
// layouts, ULP distances on ordered integers and their buckets, the
// tolerance rules. Built on it: the lean path
// for vectors of finite narrow values (internal/compare_lean_path.h) and the
// iteration over a thread's elements (internal/compare_iteration.h). The few
// device intrinsics are behind dev::, with their host equivalents
// (internal/device_intrinsics.h).
#pragma once

#include <cstdint>

#include "core/host_device.h"
#include "server/backends/cuda/internal/device_intrinsics.h"
#include "server/backends/cuda/internal/elem_type.h"
#include "server/backends/cuda/internal/kernel_args.h"
#include "server/backends/cuda/internal/narrow_patterns.h"
#include "server/stats/element_rules.h"

namespace tensorcheck::cuda::cmp {

// ---- element access

TC_HOST_DEVICE double Load(const void* p, ElemType t, int64_t i) {
  switch (t) {
    case ElemType::kF64:
      return static_cast<const double*>(p)[i];
    case ElemType::kF32:
      return static_cast<double>(static_cast<const float*>(p)[i]);
    case ElemType::kF16:
      return static_cast<double>(dev::LoadHalf(p, i));
    case ElemType::kBF16:
      return static_cast<double>(dev::LoadBFloat16(p, i));
  }
  return 0.0;
}

TC_HOST_DEVICE ull RawBits(const void* p, ElemType t, int64_t i) {
  switch (t) {
    case ElemType::kF64:
      return static_cast<const ull*>(p)[i];
    case ElemType::kF32:
      return static_cast<const unsigned int*>(p)[i];
    case ElemType::kF16:
    case ElemType::kBF16:
      return static_cast<const unsigned short*>(p)[i];
  }
  return 0;
}

// Bits of v rounded to nearest even in `cmp`.
TC_HOST_DEVICE ull BitsOf(double v, ElemType cmp) {
  switch (cmp) {
    case ElemType::kF64:
      return static_cast<ull>(dev::DoubleBits(v));
    case ElemType::kF32:
      return dev::FloatBits(dev::ToFloat(v));
    case ElemType::kF16:
      return dev::HalfBits(v);
    case ElemType::kBF16:
      return dev::BFloat16Bits(v);
  }
  return 0;
}

struct Element {
  double a, e;
  ull ba, be;
};

TC_HOST_DEVICE Element LoadElement(const CompareArgs& args, int64_t i) {
  Element x;
  x.a = Load(args.actual, args.actual_type, i);
  x.e = Load(args.expected, args.expected_type, i);
  x.ba = args.actual_type == args.compared ? RawBits(args.actual, args.actual_type, i)
                                           : BitsOf(x.a, args.compared);
  x.be = args.expected_type == args.compared ? RawBits(args.expected, args.expected_type, i)
                                             : BitsOf(x.e, args.compared);
  return x;
}

// Element i's unscaled hard bound (the kBound rule's), 0 without one.
TC_HOST_DEVICE double BoundOf(const CompareArgs& args, int64_t i) {
  return args.bound != nullptr ? static_cast<double>(args.bound[i]) : 0.0;
}

// tolerance.h's FinitePairPasses: the shared rule of args.rule
// (element_rules.h). The lean path calls the shared rule of its own
// kRule directly.
TC_HOST_DEVICE bool FinitePasses(const CompareArgs& args, double abs_diff, double abs_e, int64_t i,
                                 ull ulp) {
  switch (args.rule) {
    case ToleranceRule::kAbsPlusRel:
      return rules::FinitePairPasses<ToleranceRule::kAbsPlusRel>(args, abs_diff, abs_e,
                                                                 BoundOf(args, i), ulp);
    case ToleranceRule::kAbsOrRel:
      return rules::FinitePairPasses<ToleranceRule::kAbsOrRel>(args, abs_diff, abs_e,
                                                               BoundOf(args, i), ulp);
    case ToleranceRule::kUlp:
      return rules::FinitePairPasses<ToleranceRule::kUlp>(args, abs_diff, abs_e, BoundOf(args, i),
                                                          ulp);
    case ToleranceRule::kBound:
      return rules::FinitePairPasses<ToleranceRule::kBound>(args, abs_diff, abs_e, BoundOf(args, i),
                                                            ulp);
  }
  return false;
}

// ---- one thread's totals

TC_HOST_DEVICE CompareTotals EmptyTotals() {
  CompareTotals t;
  t.sum_abs = t.sum_sq = t.sum_aa = t.sum_ee = t.sum_ae = t.sum_ulp = 0;
  t.sum_sigma2 = t.sum_sq_sigma = 0;
  t.max_abs = t.max_rel = -1;
  t.max_abs_index = t.max_rel_index = -1;
  t.max_ulp = 0;
  t.finite = t.mismatched = t.bit_equal = t.nan_actual = t.nan_expected = 0;
  t.inf_actual = t.inf_expected = t.nan_mismatch = t.ulp_infinite = 0;
  return t;
}

// max_rel is found by multiplying first (as diff_stats.cc): a quotient is
// computed only when |a-e| > max_rel * kShrink * |e|, a factor just below 1
// so that no winner is missed to rounding.
inline constexpr double kShrink = 1.0 - 0x1p-50;

// ULP histogram of one thread: the buckets where close outputs put nearly
// every element in registers, the rest by shared-memory atomics.
// Same-address atomics from every thread of a block would serialise the
// pass.
struct LocalHistogram {
  // Buckets 0-3 (distances 0, 1, 2, 3-4) as 32-bit counters packed two to
  // a register: one shift and one add per element. A thread owns fewer
  // than 2^32 elements.
  ull low = 0, high = 0;
  // The lean path's: buckets 0 and 2 (`even`), 1 and 3 (`odd`) as 16-bit
  // counters, emptied into low/high every kLeanSpill vectors (of at most 8
  // elements, so that they cannot overflow).
  static constexpr unsigned int kLeanSpill = 8191;
  unsigned int even = 0, odd = 0, vectors = 0;
  unsigned int* shared;  // the block's [kCompareHistBuckets]

  TC_HOST_DEVICE void Add(int bucket) {
    if (bucket < 4) {
      const ull one = 1ull << (32 * (bucket & 1));
      if (bucket < 2) {
        low += one;
      } else {
        high += one;
      }
    } else {
      dev::AtomicAdd(&shared[bucket], 1u);
    }
  }
  // A lean vector's buckets 0-3 as four 8-bit counters (byte b: bucket b).
  TC_HOST_DEVICE void AddVector(unsigned int bytes) {
    even += bytes & 0x00ff00ffu;
    odd += (bytes >> 8) & 0x00ff00ffu;
    if (++vectors == kLeanSpill) Spill();
  }
  TC_HOST_DEVICE void Spill() {
    low += ull{even & 0xffffu} | (ull{odd & 0xffffu} << 32);
    high += ull{even >> 16} | (ull{odd >> 16} << 32);
    even = odd = vectors = 0;
  }
#if defined(__CUDACC__)
  // Adds the registers into the shared histogram (a warp sum per bucket;
  // every lane of the warp must call it).
  __device__ __forceinline__ void Flush() {
    Spill();
    const unsigned int count[4] = {
        static_cast<unsigned int>(low), static_cast<unsigned int>(low >> 32),
        static_cast<unsigned int>(high), static_cast<unsigned int>(high >> 32)};
    TC_UNROLL
    for (int b = 0; b < 4; ++b) {
      const unsigned int sum = __reduce_add_sync(0xffffffffu, count[b]);
      if (threadIdx.x % 32 == 0 && sum != 0) atomicAdd(&shared[b], sum);
    }
  }
#endif
};

// What one thread accumulates, kept small (registers bound the pass): the
// counts of NaN/Inf pairs, which are rare, go to the block's shared
// RareCounts; ULP distances below 2^32 are summed exactly as integers.
struct ThreadTotals {
  double sum_abs = 0, sum_sq = 0, sum_aa = 0, sum_ee = 0, sum_ae = 0;
  double sum_sigma2 = 0, sum_sq_sigma = 0;
  double sum_ulp_large = 0;  // distances >= 2^32
  ull sum_ulp_small = 0;     // distances < 2^32 (a thread owns < 2^32 elements)
  double max_abs = -1, max_rel = -1;
  long long max_abs_index = -1, max_rel_index = -1;
  ull max_ulp = 0;
  unsigned int finite = 0, mismatched = 0, bit_equal = 0;
};

struct RareCounts {
  ull nan_actual, nan_expected, inf_actual, inf_expected, nan_mismatch, ulp_infinite;
};

TC_HOST_DEVICE CompareTotals ToTotals(const ThreadTotals& x) {
  CompareTotals t = EmptyTotals();
  t.sum_abs = x.sum_abs;
  t.sum_sq = x.sum_sq;
  t.sum_aa = x.sum_aa;
  t.sum_ee = x.sum_ee;
  t.sum_ae = x.sum_ae;
  t.sum_sigma2 = x.sum_sigma2;
  t.sum_sq_sigma = x.sum_sq_sigma;
  t.sum_ulp = static_cast<double>(x.sum_ulp_small) + x.sum_ulp_large;
  t.max_abs = x.max_abs;
  t.max_rel = x.max_rel;
  t.max_abs_index = x.max_abs_index;
  t.max_rel_index = x.max_rel_index;
  t.max_ulp = x.max_ulp;
  t.finite = x.finite;
  t.mismatched = x.mismatched;
  t.bit_equal = x.bit_equal;
  return t;
}

TC_HOST_DEVICE void AddUlp(ThreadTotals& t, ull ulp) {
  if (ulp < (1ull << 32)) {
    t.sum_ulp_small += ulp;
  } else {
    t.sum_ulp_large += static_cast<double>(ulp);
  }
}

// Element i failed the tolerance: its row's and column's counts, when
// kept. One atomic per distinct row (and column) among the warp's lanes
// here: a warp's elements are mostly in one row.
TC_HOST_DEVICE void CountGroups(const CompareArgs& args, int64_t i, ull* col_counts,
                                ull* row_counts) {
  if (col_counts == nullptr) return;
#if defined(__CUDA_ARCH__)
  const unsigned int active = __activemask();
  const int lane = threadIdx.x % 32;
  const ull row = static_cast<ull>(i / args.cols), col = static_cast<ull>(i % args.cols);
  const unsigned int same_row = __match_any_sync(active, row);
  if (lane == __ffs(same_row) - 1) atomicAdd(&row_counts[row], ull(__popc(same_row)));
  const unsigned int same_col = __match_any_sync(active, col);
  if (lane == __ffs(same_col) - 1) atomicAdd(&col_counts[col], ull(__popc(same_col)));
#else
  ++row_counts[i / args.cols];
  ++col_counts[i % args.cols];
#endif
}

TC_HOST_DEVICE void CountMismatch(const CompareArgs& args, int64_t i, ThreadTotals& t,
                                  ull* col_counts, ull* row_counts) {
  ++t.mismatched;
  CountGroups(args, i, col_counts, row_counts);
}

// One element into `t` (diff_stats.cc's SlowBlock and NonFiniteElement).
TC_HOST_DEVICE void Accumulate(const CompareArgs& args, const rules::BitLayout& layout, int64_t i,
                               const Element& x, ThreadTotals& t, RareCounts* rare,
                               LocalHistogram& hist, ull* col_counts, ull* row_counts,
                               unsigned int* nonfinite_count) {
  t.bit_equal += x.ba == x.be;
  bool passes;
  if (dev::IsFinite(x.a) && dev::IsFinite(x.e)) {
    ++t.finite;
    const double d = x.a - x.e;
    const double abs_diff = dev::Abs(d);
    const double abs_e = dev::Abs(x.e);
    t.sum_abs += abs_diff;
    t.sum_sq += d * d;
    t.sum_aa += x.a * x.a;
    t.sum_ee += x.e * x.e;
    t.sum_ae += x.a * x.e;
    if (args.sigma != nullptr) {
      const float s = args.sigma[i];
      if (dev::IsFinite(s)) {
        t.sum_sigma2 += static_cast<double>(s) * s;
        t.sum_sq_sigma += d * d;
      }
    }
    const ull ulp = rules::DistanceFromBits(x.ba, x.be, layout);
    hist.Add(rules::BucketIndex(ulp));
    AddUlp(t, ulp);
    t.max_ulp = t.max_ulp > ulp ? t.max_ulp : ulp;
    if (abs_diff > t.max_abs) {
      t.max_abs = abs_diff;
      t.max_abs_index = i;
    }
    // Divides only when the quotient may win (as diff_stats.cc: multiply
    // first, with a factor just below 1 so that no winner is missed).
    if (abs_e > 0) {
      if (abs_diff > t.max_rel * abs_e * kShrink) {
        const double rel = abs_diff / abs_e;
        if (rel > t.max_rel) {
          t.max_rel = rel;
          t.max_rel_index = i;
        }
      }
    } else {
      const double rel = abs_diff > 0 ? dev::Inf() : 0.0;
      if (rel > t.max_rel) {
        t.max_rel = rel;
        t.max_rel_index = i;
      }
    }
    passes = FinitePasses(args, abs_diff, abs_e, i, ulp);
  } else {
    const unsigned int slot = dev::AtomicAdd(nonfinite_count, 1u);
    if (slot < args.nonfinite_capacity) args.nonfinite_indices[slot] = i;
    const bool nan_a = dev::IsNan(x.a), nan_e = dev::IsNan(x.e);
    if (nan_a) dev::AtomicAdd(&rare->nan_actual, 1ull);
    if (nan_e) dev::AtomicAdd(&rare->nan_expected, 1ull);
    if (dev::IsInf(x.a)) dev::AtomicAdd(&rare->inf_actual, 1ull);
    if (dev::IsInf(x.e)) dev::AtomicAdd(&rare->inf_expected, 1ull);
    if (nan_a != nan_e) dev::AtomicAdd(&rare->nan_mismatch, 1ull);
    const ull ulp = rules::DistanceFromBits(x.ba, x.be, layout);
    if (ulp == rules::kUlpInfinite) {
      dev::AtomicAdd(&rare->ulp_infinite, 1ull);
    } else {
      hist.Add(rules::BucketIndex(ulp));
      AddUlp(t, ulp);
    }
    t.max_ulp = t.max_ulp > ulp ? t.max_ulp : ulp;
    if (nan_a || nan_e) {
      passes = nan_a && nan_e && args.nan_equal;
    } else {
      const double v = x.a == x.e ? 0.0 : dev::Inf();
      if (v > t.max_abs) {
        t.max_abs = v;
        t.max_abs_index = i;
      }
      if (v > t.max_rel) {
        t.max_rel = v;
        t.max_rel_index = i;
      }
      passes = x.a == x.e;
    }
  }
  if (!passes) CountMismatch(args, i, t, col_counts, row_counts);
}

// Elements of one storage type in 16-byte vectors (the arrays are 256-byte
// aligned): kPerVector of them per load, decoded from the raw bits.
template <ElemType kType>
constexpr int kPerVector = kType == ElemType::kF64   ? 2
                           : kType == ElemType::kF32 ? 4
                                                     : 8;

template <ElemType kType>
TC_HOST_DEVICE void Decode(const Vec16& raw, int j, double* v, ull* bits) {
  if constexpr (kType == ElemType::kF64) {
    *bits = (ull{narrow::Word(raw, 2 * j + 1)} << 32) | narrow::Word(raw, 2 * j);
    *v = dev::DoubleOf(static_cast<long long>(*bits));
  } else if constexpr (kType == ElemType::kF32) {
    *bits = narrow::Word(raw, j);
    *v = static_cast<double>(dev::FloatOf(*bits));
  } else {
    const unsigned int h = (narrow::Word(raw, j / 2) >> (16 * (j % 2))) & 0xffffu;
    *bits = h;
    *v = kType == ElemType::kBF16
             ? static_cast<double>(dev::FloatOf(h << 16))
             : static_cast<double>(dev::HalfToFloat(static_cast<unsigned short>(h)));
  }
}

}  // namespace tensorcheck::cuda::cmp
