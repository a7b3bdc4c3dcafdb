// What one thread of the device comparison's totals pass does with its
// elements (device_compare_kernels.cu runs it in every thread, then reduces
// across the warp, the block and the grid). It compiles for host and device:
// compare_thread_test.cc runs it on the host over whole tensors, one
// "thread", against stats' Compare, so that the per-element definitions and
// the lean path's bookkeeping are tested on every machine, not only on a GPU
// (internal to this folder).
//
// Per element, the definitions are Compare's (diff_stats.h): values widened
// exactly to double, bits in the compared type, ULP distances on ordered
// integers, the tolerance rules of tolerance.h. The few device intrinsics
// are behind dev::, with their host equivalents.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math_constants.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "server/backends/cuda/device_compare_kernels.h"
#include "server/backends/cuda/host_device.h"
#include "server/backends/cuda/narrow_patterns.h"

namespace tensorcheck::cuda::cmp {

using ull = unsigned long long;

inline constexpr ull kUlpInfinite = ~0ull;

// ---- device intrinsics and their host equivalents (a host "thread" runs
// alone, so its atomics are plain adds)

namespace dev {

TC_INLINE double AddRn(double a, double b) {  // never fused with a product
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
TC_INLINE double MulRn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
TC_INLINE ull DoubleBits(double v) {
#if defined(__CUDA_ARCH__)
  return static_cast<ull>(__double_as_longlong(v));
#else
  ull b;
  std::memcpy(&b, &v, sizeof b);
  return b;
#endif
}
TC_INLINE double DoubleOf(ull b) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(b));
#else
  double v;
  std::memcpy(&v, &b, sizeof v);
  return v;
#endif
}
TC_INLINE unsigned int FloatBits(float v) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(v);
#else
  unsigned int b;
  std::memcpy(&b, &v, sizeof b);
  return b;
#endif
}
TC_INLINE float FloatOf(unsigned int b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  float v;
  std::memcpy(&v, &b, sizeof v);
  return v;
#endif
}
TC_INLINE float ToFloat(double v) {  // to nearest even
#if defined(__CUDA_ARCH__)
  return __double2float_rn(v);
#else
  return static_cast<float>(v);
#endif
}
TC_INLINE double Inf() {
#if defined(__CUDA_ARCH__)
  return CUDART_INF;
#else
  return std::numeric_limits<double>::infinity();
#endif
}
TC_INLINE int Clz64(ull v) {  // v != 0
#if defined(__CUDA_ARCH__)
  return __clzll(static_cast<long long>(v));
#else
  return __builtin_clzll(v);
#endif
}
TC_INLINE int Popc(unsigned int v) {
#if defined(__CUDA_ARCH__)
  return __popc(v);
#else
  return __builtin_popcount(v);
#endif
}
TC_INLINE int Ffs(unsigned int v) {  // 1 + the lowest set bit; 0 for 0
#if defined(__CUDA_ARCH__)
  return __ffs(static_cast<int>(v));
#else
  return __builtin_ffs(static_cast<int>(v));
#endif
}
template <typename T>
TC_INLINE T AtomicAdd(T* p, T v) {  // returns the old value
#if defined(__CUDA_ARCH__)
  return atomicAdd(p, v);
#else
  const T old = *p;
  *p += v;
  return old;
#endif
}
#if defined(__CUDA_ARCH__)
TC_INLINE unsigned int Min(unsigned int a, unsigned int b) { return min(a, b); }
TC_INLINE unsigned int Max(unsigned int a, unsigned int b) { return max(a, b); }
TC_INLINE ull Max(ull a, ull b) { return max(a, b); }
TC_INLINE bool IsFinite(double v) { return isfinite(v); }
TC_INLINE bool IsFinite(float v) { return isfinite(v); }
TC_INLINE bool IsNan(double v) { return isnan(v); }
TC_INLINE bool IsInf(double v) { return isinf(v); }
TC_INLINE double Abs(double v) { return fabs(v); }
#else
TC_INLINE unsigned int Min(unsigned int a, unsigned int b) { return a < b ? a : b; }
TC_INLINE unsigned int Max(unsigned int a, unsigned int b) { return a > b ? a : b; }
TC_INLINE ull Max(ull a, ull b) { return a > b ? a : b; }
TC_INLINE bool IsFinite(double v) { return std::isfinite(v); }
TC_INLINE bool IsFinite(float v) { return std::isfinite(v); }
TC_INLINE bool IsNan(double v) { return std::isnan(v); }
TC_INLINE bool IsInf(double v) { return std::isinf(v); }
TC_INLINE double Abs(double v) { return std::fabs(v); }
#endif

}  // namespace dev

// ---- element access

TC_INLINE double Load(const void* p, ElemType t, int64_t i) {
  switch (t) {
    case ElemType::kF64:
      return static_cast<const double*>(p)[i];
    case ElemType::kF32:
      return static_cast<double>(static_cast<const float*>(p)[i]);
    case ElemType::kF16:
      return static_cast<double>(__half2float(static_cast<const __half*>(p)[i]));
    case ElemType::kBF16:
      return static_cast<double>(__bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]));
  }
  return 0.0;
}

TC_INLINE ull RawBits(const void* p, ElemType t, int64_t i) {
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
TC_INLINE ull BitsOf(double v, ElemType cmp) {
  switch (cmp) {
    case ElemType::kF64:
      return static_cast<ull>(dev::DoubleBits(v));
    case ElemType::kF32:
      return dev::FloatBits(dev::ToFloat(v));
    case ElemType::kF16:
      return __half_as_ushort(__double2half(v));
    case ElemType::kBF16:
      return __bfloat16_as_ushort(__double2bfloat16(v));
  }
  return 0;
}

struct Layout {
  ull sign, magnitude, inf;
};

TC_INLINE Layout LayoutOf(ElemType t) {
  switch (t) {
    case ElemType::kF64:
      return {1ull << 63, ~(1ull << 63), 0x7ff0000000000000ull};
    case ElemType::kF32:
      return {0x80000000ull, 0x7fffffffull, 0x7f800000ull};
    case ElemType::kF16:
      return {0x8000ull, 0x7fffull, 0x7c00ull};
    case ElemType::kBF16:
      return {0x8000ull, 0x7fffull, 0x7f80ull};
  }
  return {0x80000000ull, 0x7fffffffull, 0x7f800000ull};
}

// As diff_stats.cc: ordered integers, negative values mirrored; NaN
// against a number is infinitely far, NaN against NaN 0.
TC_INLINE ull Distance(ull a, ull b, const Layout& l) {
  const ull ma = a & l.magnitude, mb = b & l.magnitude;
  const bool nan_a = ma > l.inf, nan_b = mb > l.inf;
  if (nan_a || nan_b) return nan_a && nan_b ? 0 : kUlpInfinite;
  if ((a & l.sign) == (b & l.sign)) return ma > mb ? ma - mb : mb - ma;
  return ma + mb;
}

TC_INLINE int Bucket(ull d) {
  if (d == 0) return 0;
  if (d > (1ull << 62)) return 1 + (64 - dev::Clz64(static_cast<long long>(d - 1)));
  return 64 - dev::Clz64(static_cast<long long>(((d - 1) << 1) | 1));
}

struct Element {
  double a, e;
  ull ba, be;
};

TC_INLINE Element LoadElement(const CompareArgs& args, int64_t i) {
  Element x;
  x.a = Load(args.actual, args.actual_type, i);
  x.e = Load(args.expected, args.expected_type, i);
  x.ba = args.actual_type == args.compared ? RawBits(args.actual, args.actual_type, i)
                                           : BitsOf(x.a, args.compared);
  x.be = args.expected_type == args.compared ? RawBits(args.expected, args.expected_type, i)
                                             : BitsOf(x.e, args.compared);
  return x;
}

// tolerance.h's FinitePairPasses. atol + rtol|e| is rounded twice, as on
// the host: nvcc would fuse it into one FMA, whose single rounding can put
// an element exactly at the limit on the other side of it.
template <ToleranceRule kRule>
TC_INLINE bool FinitePassesBy(const CompareArgs& args, double abs_diff,
                                               double abs_e, int64_t i, ull ulp) {
  if constexpr (kRule == ToleranceRule::kAbsPlusRel) {
    return abs_diff <= dev::AddRn(args.atol, dev::MulRn(args.rtol, abs_e));
  } else if constexpr (kRule == ToleranceRule::kAbsOrRel) {
    return abs_diff <= args.atol || abs_diff <= args.rtol * abs_e;
  } else if constexpr (kRule == ToleranceRule::kUlp) {
    return ulp <= args.max_ulp;
  } else {
    return abs_diff <=
           args.bound_factor * (args.bound != nullptr ? static_cast<double>(args.bound[i]) : 0.0);
  }
}

TC_INLINE bool FinitePasses(const CompareArgs& args, double abs_diff, double abs_e,
                                             int64_t i, ull ulp) {
  switch (args.rule) {
    case ToleranceRule::kAbsPlusRel:
      return FinitePassesBy<ToleranceRule::kAbsPlusRel>(args, abs_diff, abs_e, i, ulp);
    case ToleranceRule::kAbsOrRel:
      return FinitePassesBy<ToleranceRule::kAbsOrRel>(args, abs_diff, abs_e, i, ulp);
    case ToleranceRule::kUlp:
      return FinitePassesBy<ToleranceRule::kUlp>(args, abs_diff, abs_e, i, ulp);
    case ToleranceRule::kBound:
      return FinitePassesBy<ToleranceRule::kBound>(args, abs_diff, abs_e, i, ulp);
  }
  return false;
}

// ---- one thread's totals

TC_INLINE CompareTotals EmptyTotals() {
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

  TC_INLINE void Add(int bucket) {
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
  TC_INLINE void AddVector(unsigned int bytes) {
    even += bytes & 0x00ff00ffu;
    odd += (bytes >> 8) & 0x00ff00ffu;
    if (++vectors == kLeanSpill) Spill();
  }
  TC_INLINE void Spill() {
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

TC_INLINE CompareTotals ToTotals(const ThreadTotals& x) {
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

TC_INLINE void AddUlp(ThreadTotals& t, ull ulp) {
  if (ulp < (1ull << 32)) {
    t.sum_ulp_small += ulp;
  } else {
    t.sum_ulp_large += static_cast<double>(ulp);
  }
}

// Element i failed the tolerance: its row's and column's counts, when
// kept. One atomic per distinct row (and column) among the warp's lanes
// here: a warp's elements are mostly in one row.
TC_INLINE void CountGroups(const CompareArgs& args, int64_t i, ull* col_counts, ull* row_counts) {
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

TC_INLINE void CountMismatch(const CompareArgs& args, int64_t i, ThreadTotals& t,
                                              ull* col_counts, ull* row_counts) {
  ++t.mismatched;
  CountGroups(args, i, col_counts, row_counts);
}

// One element into `t` (diff_stats.cc's SlowBlock and NonFiniteElement).
TC_INLINE void Accumulate(const CompareArgs& args, const Layout& layout, int64_t i,
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
    const ull ulp = Distance(x.ba, x.be, layout);
    hist.Add(Bucket(ulp));
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
    const ull ulp = Distance(x.ba, x.be, layout);
    if (ulp == kUlpInfinite) {
      dev::AtomicAdd(&rare->ulp_infinite, 1ull);
    } else {
      hist.Add(Bucket(ulp));
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
TC_INLINE void Decode(const uint4& raw, int j, double* v, ull* bits) {
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
             : static_cast<double>(__half2float(__ushort_as_half(static_cast<unsigned short>(h))));
  }
}

// ---- the lean path
//
// Both arrays stored in the compared type, and that type narrow (fp32,
// fp16, bf16): the common case of a verification. A 16-byte vector with
// no NaN or infinity in either array (one add per 32-bit word tells) goes
// through LeanVector: Accumulate's finite branch on 32-bit patterns
// (narrow_patterns.h), without a branch per element. Any other vector goes
// through Accumulate. The pass is bound by instruction issue, not by
// memory: the fewer instructions per element, the nearer a copy's speed.

// Element j of a vector: its widened pattern (narrow_patterns.h) and value.
template <ElemType kType>
TC_INLINE void LeanDecode(const uint4& raw, int j, unsigned int* p, float* v) {
  *p = narrow::Widened<kType>(raw, j);
  if constexpr (kType == ElemType::kF16) {
    *v = __half2float(__ushort_as_half(static_cast<unsigned short>(*p >> 16)));
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
  TC_INLINE LeanPair(const uint4& ra, const uint4& re, int j) {
    float fa, fe;
    LeanDecode<kType>(ra, j, &pa, &fa);
    LeanDecode<kType>(re, j, &pe, &fe);
    a = fa;
    e = fe;
  }
  TC_INLINE double abs_diff() const { return dev::Abs(a - e); }
};

// Element j of a lean vector: Accumulate's finite branch, its rare parts
// left to LeanVector.
template <ElemType kType, ToleranceRule kRule>
TC_INLINE void LeanElement(const CompareArgs& args, int64_t first, int j,
                                            const LeanPair<kType>& x, ThreadTotals& t,
                                            LeanVectorState& v) {
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
  if (!FinitePassesBy<kRule>(args, abs_diff, abs_e, first + j, u)) v.fails |= 1u << j;
}

// A vector of finite pairs whose first element is `first`.
template <ElemType kType, ToleranceRule kRule>
TC_INLINE void LeanVector(const CompareArgs& args, int64_t first, const uint4& ra,
                                           const uint4& re, ThreadTotals& t, LocalHistogram& hist,
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
        dev::AtomicAdd(&hist.shared[Bucket(u)], 1u);
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
TC_INLINE bool TryLeanVector(const CompareArgs& args, int64_t first,
                                              const uint4& ra, const uint4& re, ThreadTotals& t,
                                              LocalHistogram& hist, ull* col_counts,
                                              ull* row_counts) {
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


// ---- iteration

// Kernel instances: an ElemType value when both arrays are stored in the
// compared type (16-byte vectors), kAnyTypes otherwise (element by element).
inline constexpr int kAnyTypes = -1;

// Calls f(i, element) for each element a thread owns (first, first +
// stride, ...; the host model: 0 and 1), in increasing index order: 16-byte
// vectors when both arrays are stored in the compared type (kType), the
// next vectors loaded before the current ones are used.
// Each vector goes first to on_vector(its first index, actual, expected);
// when that returns false, f takes its elements.
// kRareFallback: on_vector takes nearly every vector, so f's loop is kept
// rolled (registers for the common path, not for eight inlined copies of f).
TC_EXEC_CHECK_DISABLE  // on the device, on_vector and f are device lambdas
template <int kType, bool kRareFallback, typename V, typename F>
TC_INLINE void ForEachVector(const CompareArgs& args, int64_t first, int64_t stride,
                             V&& on_vector, F&& f) {
  int64_t vectorised = 0;
  if constexpr (kType != kAnyTypes) {
    constexpr ElemType type = static_cast<ElemType>(kType);
    constexpr int per = kPerVector<type>;
    const int64_t vectors = args.total / per;
    vectorised = vectors * per;
    const uint4* a4 = static_cast<const uint4*>(args.actual);
    const uint4* e4 = static_cast<const uint4*>(args.expected);
    uint4 ra{}, re{};
    if (first < vectors) {
      ra = a4[first];
      re = e4[first];
    }
    for (int64_t q = first; q < vectors; q += stride) {
      uint4 na{}, ne{};
      if (q + stride < vectors) {
        na = a4[q + stride];
        ne = e4[q + stride];
      }
      if (!on_vector(q * per, ra, re)) {
TC_PRAGMA(unroll(kRareFallback ? 1 : per))
        for (int j = 0; j < per; ++j) {
          Element x;
          Decode<type>(ra, j, &x.a, &x.ba);
          Decode<type>(re, j, &x.e, &x.be);
          f(q * per + j, x);
        }
      }
      ra = na;
      re = ne;
    }
  }
  for (int64_t i = vectorised + first; i < args.total; i += stride) f(i, LoadElement(args, i));
}

// Instances whose vectors can take the lean path.
template <int kType>
inline constexpr bool kLean = kType == static_cast<int>(ElemType::kF32) ||
                       kType == static_cast<int>(ElemType::kF16) ||
                       kType == static_cast<int>(ElemType::kBF16);

// The instance for these arrays: the compared type when both are stored
// in it, else kAnyTypes.
inline int KernelType(const CompareArgs& args) {
  const bool same = args.actual_type == args.compared && args.expected_type == args.compared;
  return same ? static_cast<int>(args.compared) : kAnyTypes;
}

// Calls Launch<type>::Run(args...) for the instance KernelType picked.
template <template <int> class Launch, typename... Args>
decltype(auto) Dispatch(int type, Args&&... args) {
  switch (type) {
    case static_cast<int>(ElemType::kF64):
      return Launch<static_cast<int>(ElemType::kF64)>::Run(args...);
    case static_cast<int>(ElemType::kF32):
      return Launch<static_cast<int>(ElemType::kF32)>::Run(args...);
    case static_cast<int>(ElemType::kF16):
      return Launch<static_cast<int>(ElemType::kF16)>::Run(args...);
    case static_cast<int>(ElemType::kBF16):
      return Launch<static_cast<int>(ElemType::kBF16)>::Run(args...);
    default:
      return Launch<kAnyTypes>::Run(args...);
  }
}

// Blocks of TotalsKernel<kType> the device holds at once: its
// multiprocessors times the kernel's occupancy (kMaxBlocks when the device
// cannot say). The totals pass runs as at most one wave of these, each
// thread taking many vectors, so that the per-block epilogue (reductions,
// histogram, partial) is paid by few blocks: with 1024 blocks a thread of
// the 1921x3072 bf16 case takes under 3 vectors, and the epilogue's
// instructions (warp and block reductions of 20 fields) are of the order
// of theirs.

}  // namespace tensorcheck::cuda::cmp
