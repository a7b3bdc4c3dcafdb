// Device comparison kernels: one pass for the totals (block partials,
// reduced in a fixed order by the pass's last block, so the sums are the
// same on every run), and a radix selection of the worst elements.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math_constants.h>

#include <algorithm>
#include <cstdint>

#include "server/backends/cuda/device_compare_kernels.h"
#include "server/backends/cuda/narrow_patterns.h"

namespace tensorcheck::cuda {
namespace {

using ull = unsigned long long;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int64_t kMaxBlocks = 1024;
constexpr int kDigits = 24;  // 3 key words of 8 bytes
constexpr ull kUlpInfinite = ~0ull;

int Blocks(int64_t total) {
  const int64_t per_block = int64_t{kThreads} * 4;
  return static_cast<int>(std::clamp<int64_t>((total + per_block - 1) / per_block, 1, kMaxBlocks));
}

// Radix selection state, in the scratch after the block partials. Digits
// (bytes of the 192-bit rank key) are selected from the most significant.
// Digits that every remaining candidate has as 0 are skipped (the low bytes
// of a 16-bit output's abs diff, the high bytes of small ULP distances).
// Once at most kListCapacity elements match the selected prefix, the next
// full pass also lists their keys and one block finishes on that list.
constexpr unsigned int kListCapacity = 1u << 14;

struct SelectState {
  ull prefix[3];   // the selected digits so far; the rest 0
  long long need;  // elements still to take among those matching prefix
  int done;        // every element matching prefix is taken
  int build_list;  // the next full pass lists the elements matching prefix
  int use_list;    // `list` holds the keys of every element matching prefix
  int next_digit;  // the next digit to select; passes for others do nothing
  unsigned int list_count;
  unsigned int pad;
  ull hist[256];
  ull word_or[3];  // OR of the keys matching the prefix, this pass
  ull list[kListCapacity][3];
};

size_t PartialsBytes() { return sizeof(CompareTotals) * kMaxBlocks; }

// ---- element access

__device__ __forceinline__ double Load(const void* p, ElemType t, int64_t i) {
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

__device__ __forceinline__ ull RawBits(const void* p, ElemType t, int64_t i) {
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
__device__ __forceinline__ ull BitsOf(double v, ElemType cmp) {
  switch (cmp) {
    case ElemType::kF64:
      return static_cast<ull>(__double_as_longlong(v));
    case ElemType::kF32:
      return __float_as_uint(__double2float_rn(v));
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

__device__ __forceinline__ Layout LayoutOf(ElemType t) {
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
__device__ __forceinline__ ull Distance(ull a, ull b, const Layout& l) {
  const ull ma = a & l.magnitude, mb = b & l.magnitude;
  const bool nan_a = ma > l.inf, nan_b = mb > l.inf;
  if (nan_a || nan_b) return nan_a && nan_b ? 0 : kUlpInfinite;
  if ((a & l.sign) == (b & l.sign)) return ma > mb ? ma - mb : mb - ma;
  return ma + mb;
}

__device__ __forceinline__ int Bucket(ull d) {
  if (d == 0) return 0;
  if (d > (1ull << 62)) return 1 + (64 - __clzll(static_cast<long long>(d - 1)));
  return 64 - __clzll(static_cast<long long>(((d - 1) << 1) | 1));
}

struct Element {
  double a, e;
  ull ba, be;
};

__device__ __forceinline__ Element LoadElement(const CompareArgs& args, int64_t i) {
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
__device__ __forceinline__ bool FinitePassesBy(const CompareArgs& args, double abs_diff,
                                               double abs_e, int64_t i, ull ulp) {
  if constexpr (kRule == ToleranceRule::kAbsPlusRel) {
    return abs_diff <= __dadd_rn(args.atol, __dmul_rn(args.rtol, abs_e));
  } else if constexpr (kRule == ToleranceRule::kAbsOrRel) {
    return abs_diff <= args.atol || abs_diff <= args.rtol * abs_e;
  } else if constexpr (kRule == ToleranceRule::kUlp) {
    return ulp <= args.max_ulp;
  } else {
    return abs_diff <=
           args.bound_factor * (args.bound != nullptr ? static_cast<double>(args.bound[i]) : 0.0);
  }
}

__device__ __forceinline__ bool FinitePasses(const CompareArgs& args, double abs_diff, double abs_e,
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

// ---- totals

__device__ __forceinline__ CompareTotals EmptyTotals() {
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

// Larger value wins; equal values: the lower index (first occurrence).
__device__ __forceinline__ void TakeMax(double& v, long long& idx, double ov, long long oi) {
  if (ov > v || (ov == v && oi >= 0 && (idx < 0 || oi < idx))) {
    v = ov;
    idx = oi;
  }
}

__device__ __forceinline__ void Combine(CompareTotals& x, const CompareTotals& y) {
  x.sum_abs += y.sum_abs;
  x.sum_sq += y.sum_sq;
  x.sum_aa += y.sum_aa;
  x.sum_ee += y.sum_ee;
  x.sum_ae += y.sum_ae;
  x.sum_ulp += y.sum_ulp;
  x.sum_sigma2 += y.sum_sigma2;
  x.sum_sq_sigma += y.sum_sq_sigma;
  TakeMax(x.max_abs, x.max_abs_index, y.max_abs, y.max_abs_index);
  TakeMax(x.max_rel, x.max_rel_index, y.max_rel, y.max_rel_index);
  x.max_ulp = x.max_ulp > y.max_ulp ? x.max_ulp : y.max_ulp;
  x.finite += y.finite;
  x.mismatched += y.mismatched;
  x.bit_equal += y.bit_equal;
  x.nan_actual += y.nan_actual;
  x.nan_expected += y.nan_expected;
  x.inf_actual += y.inf_actual;
  x.inf_expected += y.inf_expected;
  x.nan_mismatch += y.nan_mismatch;
  x.ulp_infinite += y.ulp_infinite;
}

// Warp reductions one field at a time (a whole-struct shuffle would hold
// two copies of the struct in registers).
template <typename T>
__device__ __forceinline__ T WarpSum(T v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ void WarpMax(double& v, long long& idx) {
  for (int offset = 16; offset > 0; offset /= 2) {
    const double ov = __shfl_down_sync(0xffffffffu, v, offset);
    const long long oi = __shfl_down_sync(0xffffffffu, idx, offset);
    TakeMax(v, idx, ov, oi);
  }
}

// Reduces every thread's `t` into the block's thread 0 (fixed order).
__device__ CompareTotals BlockReduce(CompareTotals t) {
  __shared__ CompareTotals warp_totals[kWarps];
  t.sum_abs = WarpSum(t.sum_abs);
  t.sum_sq = WarpSum(t.sum_sq);
  t.sum_aa = WarpSum(t.sum_aa);
  t.sum_ee = WarpSum(t.sum_ee);
  t.sum_ae = WarpSum(t.sum_ae);
  t.sum_ulp = WarpSum(t.sum_ulp);
  t.sum_sigma2 = WarpSum(t.sum_sigma2);
  t.sum_sq_sigma = WarpSum(t.sum_sq_sigma);
  WarpMax(t.max_abs, t.max_abs_index);
  WarpMax(t.max_rel, t.max_rel_index);
  for (int offset = 16; offset > 0; offset /= 2) {
    const ull o = __shfl_down_sync(0xffffffffu, t.max_ulp, offset);
    t.max_ulp = t.max_ulp > o ? t.max_ulp : o;
  }
  t.finite = WarpSum(t.finite);
  t.mismatched = WarpSum(t.mismatched);
  t.bit_equal = WarpSum(t.bit_equal);
  t.nan_actual = WarpSum(t.nan_actual);
  t.nan_expected = WarpSum(t.nan_expected);
  t.inf_actual = WarpSum(t.inf_actual);
  t.inf_expected = WarpSum(t.inf_expected);
  t.nan_mismatch = WarpSum(t.nan_mismatch);
  t.ulp_infinite = WarpSum(t.ulp_infinite);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_totals[warp] = t;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kWarps; ++w) Combine(t, warp_totals[w]);
  }
  return t;
}

// ULP histogram of one thread: the buckets where close outputs put nearly
// every element in registers, the rest by shared-memory atomics.
// Same-address atomics from every thread of a block would serialise the
// pass.
constexpr double kShrink = 1.0 - 0x1p-50;

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

  __device__ __forceinline__ void Add(int bucket) {
    if (bucket < 4) {
      const ull one = 1ull << (32 * (bucket & 1));
      if (bucket < 2) {
        low += one;
      } else {
        high += one;
      }
    } else {
      atomicAdd(&shared[bucket], 1u);
    }
  }
  // A lean vector's buckets 0-3 as four 8-bit counters (byte b: bucket b).
  __device__ __forceinline__ void AddVector(unsigned int bytes) {
    even += bytes & 0x00ff00ffu;
    odd += (bytes >> 8) & 0x00ff00ffu;
    if (++vectors == kLeanSpill) Spill();
  }
  __device__ __forceinline__ void Spill() {
    low += ull{even & 0xffffu} | (ull{odd & 0xffffu} << 32);
    high += ull{even >> 16} | (ull{odd >> 16} << 32);
    even = odd = vectors = 0;
  }
  // Adds the registers into the shared histogram (a warp sum per bucket).
  __device__ __forceinline__ void Flush() {
    Spill();
    const unsigned int count[4] = {
        static_cast<unsigned int>(low), static_cast<unsigned int>(low >> 32),
        static_cast<unsigned int>(high), static_cast<unsigned int>(high >> 32)};
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const unsigned int sum = __reduce_add_sync(0xffffffffu, count[b]);
      if (threadIdx.x % 32 == 0 && sum != 0) atomicAdd(&shared[b], sum);
    }
  }
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

__device__ __forceinline__ CompareTotals ToTotals(const ThreadTotals& x) {
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

__device__ __forceinline__ void AddUlp(ThreadTotals& t, ull ulp) {
  if (ulp < (1ull << 32)) {
    t.sum_ulp_small += ulp;
  } else {
    t.sum_ulp_large += static_cast<double>(ulp);
  }
}

// Element i failed the tolerance: its row's and column's counts, when
// kept. One atomic per distinct row (and column) among the warp's lanes
// here: a warp's elements are mostly in one row.
__device__ __forceinline__ void CountGroups(const CompareArgs& args, int64_t i, ull* col_counts,
                                            ull* row_counts) {
  if (col_counts == nullptr) return;
  const unsigned int active = __activemask();
  const int lane = threadIdx.x % 32;
  const ull row = static_cast<ull>(i / args.cols), col = static_cast<ull>(i % args.cols);
  const unsigned int same_row = __match_any_sync(active, row);
  if (lane == __ffs(same_row) - 1) atomicAdd(&row_counts[row], ull(__popc(same_row)));
  const unsigned int same_col = __match_any_sync(active, col);
  if (lane == __ffs(same_col) - 1) atomicAdd(&col_counts[col], ull(__popc(same_col)));
}

__device__ __forceinline__ void CountMismatch(const CompareArgs& args, int64_t i, ThreadTotals& t,
                                              ull* col_counts, ull* row_counts) {
  ++t.mismatched;
  CountGroups(args, i, col_counts, row_counts);
}

// One element into `t` (diff_stats.cc's SlowBlock and NonFiniteElement).
__device__ __forceinline__ void Accumulate(const CompareArgs& args, const Layout& layout, int64_t i,
                                           const Element& x, ThreadTotals& t, RareCounts* rare,
                                           LocalHistogram& hist, ull* col_counts, ull* row_counts,
                                           unsigned int* nonfinite_count) {
  t.bit_equal += x.ba == x.be;
  bool passes;
  if (isfinite(x.a) && isfinite(x.e)) {
    ++t.finite;
    const double d = x.a - x.e;
    const double abs_diff = fabs(d);
    const double abs_e = fabs(x.e);
    t.sum_abs += abs_diff;
    t.sum_sq += d * d;
    t.sum_aa += x.a * x.a;
    t.sum_ee += x.e * x.e;
    t.sum_ae += x.a * x.e;
    if (args.sigma != nullptr) {
      const float s = args.sigma[i];
      if (isfinite(s)) {
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
      const double rel = abs_diff > 0 ? CUDART_INF : 0.0;
      if (rel > t.max_rel) {
        t.max_rel = rel;
        t.max_rel_index = i;
      }
    }
    passes = FinitePasses(args, abs_diff, abs_e, i, ulp);
  } else {
    const unsigned int slot = atomicAdd(nonfinite_count, 1u);
    if (slot < args.nonfinite_capacity) args.nonfinite_indices[slot] = i;
    const bool nan_a = isnan(x.a), nan_e = isnan(x.e);
    if (nan_a) atomicAdd(&rare->nan_actual, 1ull);
    if (nan_e) atomicAdd(&rare->nan_expected, 1ull);
    if (isinf(x.a)) atomicAdd(&rare->inf_actual, 1ull);
    if (isinf(x.e)) atomicAdd(&rare->inf_expected, 1ull);
    if (nan_a != nan_e) atomicAdd(&rare->nan_mismatch, 1ull);
    const ull ulp = Distance(x.ba, x.be, layout);
    if (ulp == kUlpInfinite) {
      atomicAdd(&rare->ulp_infinite, 1ull);
    } else {
      hist.Add(Bucket(ulp));
      AddUlp(t, ulp);
    }
    t.max_ulp = t.max_ulp > ulp ? t.max_ulp : ulp;
    if (nan_a || nan_e) {
      passes = nan_a && nan_e && args.nan_equal;
    } else {
      const double v = x.a == x.e ? 0.0 : CUDART_INF;
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
__device__ __forceinline__ void Decode(const uint4& raw, int j, double* v, ull* bits) {
  if constexpr (kType == ElemType::kF64) {
    *bits = (ull{narrow::Word(raw, 2 * j + 1)} << 32) | narrow::Word(raw, 2 * j);
    *v = __longlong_as_double(static_cast<long long>(*bits));
  } else if constexpr (kType == ElemType::kF32) {
    *bits = narrow::Word(raw, j);
    *v = static_cast<double>(__uint_as_float(*bits));
  } else {
    const unsigned int h = (narrow::Word(raw, j / 2) >> (16 * (j % 2))) & 0xffffu;
    *bits = h;
    *v = kType == ElemType::kBF16
             ? static_cast<double>(__uint_as_float(h << 16))
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
__device__ __forceinline__ void LeanDecode(const uint4& raw, int j, unsigned int* p, float* v) {
  *p = narrow::Widened<kType>(raw, j);
  if constexpr (kType == ElemType::kF16) {
    *v = __half2float(__ushort_as_half(static_cast<unsigned short>(*p >> 16)));
  } else {
    *v = __uint_as_float(*p);  // fp32, and bf16 shifted up: the same bits
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
  __device__ __forceinline__ LeanPair(const uint4& ra, const uint4& re, int j) {
    float fa, fe;
    LeanDecode<kType>(ra, j, &pa, &fa);
    LeanDecode<kType>(re, j, &pe, &fe);
    a = fa;
    e = fe;
  }
  __device__ __forceinline__ double abs_diff() const { return fabs(a - e); }
};

// Element j of a lean vector: Accumulate's finite branch, its rare parts
// left to LeanVector.
template <ElemType kType, ToleranceRule kRule>
__device__ __forceinline__ void LeanElement(const CompareArgs& args, int64_t first, int j,
                                            const LeanPair<kType>& x, ThreadTotals& t,
                                            LeanVectorState& v) {
  const double d = x.a - x.e;
  const double abs_diff = fabs(d);
  const double abs_e = fabs(x.e);
  v.bit_equal |= static_cast<unsigned int>(x.pa == x.pe) << j;
  t.sum_abs += abs_diff;
  t.sum_sq += d * d;
  t.sum_aa += x.a * x.a;
  t.sum_ee += x.e * x.e;
  t.sum_ae += x.a * x.e;
  const unsigned int u = narrow::Distance<kType>(x.pa, x.pe);
  v.hist_bytes += 1u << (8 * min(u, 3u));  // 3 and 4, and above 4 until LeanVector
  if constexpr (kType == ElemType::kF32) {
    t.sum_ulp_small += u;
  } else {
    v.ulp_sum += u;
  }
  v.max_ulp = max(v.max_ulp, u);
  if (abs_diff > t.max_abs) v.abs_candidates |= 1u << j;
  // With |e| = 0: rel_limit * 0 is 0 (or NaN once max_rel is infinite), so
  // a nonzero difference is a candidate, with the quotient +inf.
  if (abs_diff > v.rel_limit * abs_e) v.rel_candidates |= 1u << j;
  if (!FinitePassesBy<kRule>(args, abs_diff, abs_e, first + j, u)) v.fails |= 1u << j;
}

// A vector of finite pairs whose first element is `first`.
template <ElemType kType, ToleranceRule kRule>
__device__ __forceinline__ void LeanVector(const CompareArgs& args, int64_t first, const uint4& ra,
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
#pragma unroll
  for (int j = 0; j < per; ++j) {
    LeanElement<kType, kRule>(args, first, j, LeanPair<kType>(ra, re, j), t, v);
  }
  t.finite += per;
  t.bit_equal += __popc(v.bit_equal);
  t.sum_ulp_small += v.ulp_sum;
  t.max_ulp = max(t.max_ulp, ull{v.max_ulp});
  if (v.max_ulp > 4) {  // buckets 4 and above: counted in bucket 3 so far
#pragma unroll 1
    for (int j = 0; j < per; ++j) {
      const LeanPair<kType> x(ra, re, j);
      const unsigned int u = narrow::Distance<kType>(x.pa, x.pe);
      if (u > 4) {
        v.hist_bytes -= 1u << 24;
        atomicAdd(&hist.shared[Bucket(u)], 1u);
      }
    }
  }
  hist.AddVector(v.hist_bytes);
  for (unsigned int c = v.abs_candidates; c != 0; c &= c - 1) {  // in element order
    const int j = __ffs(c) - 1;
    const double abs_diff = LeanPair<kType>(ra, re, j).abs_diff();
    if (abs_diff > t.max_abs) {
      t.max_abs = abs_diff;
      t.max_abs_index = first + j;
    }
  }
  for (unsigned int c = v.rel_candidates; c != 0; c &= c - 1) {  // in element order
    const int j = __ffs(c) - 1;
    const LeanPair<kType> x(ra, re, j);
    const double abs_e = fabs(x.e);
    const double rel = abs_e > 0 ? x.abs_diff() / abs_e : CUDART_INF;
    if (rel > t.max_rel) {
      t.max_rel = rel;
      t.max_rel_index = first + j;
    }
  }
  t.mismatched += __popc(v.fails);
  if (col_counts != nullptr) {
    for (unsigned int f = v.fails; f != 0; f &= f - 1) {
      CountGroups(args, first + __ffs(f) - 1, col_counts, row_counts);
    }
  }
  if (args.sigma != nullptr) {  // bound_ratio's sums over the finite sigma
#pragma unroll 1
    for (int j = 0; j < per; ++j) {
      const float s = args.sigma[first + j];
      if (isfinite(s)) {
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
__device__ __forceinline__ bool TryLeanVector(const CompareArgs& args, int64_t first,
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

// Kernel instances: an ElemType value when both arrays are stored in the
// compared type (16-byte vectors), kAnyTypes otherwise (element by element).
constexpr int kAnyTypes = -1;

// Calls f(i, element) for each element this thread owns, in increasing
// index order: 16-byte vectors when both arrays are stored in the compared
// type (kType), the next vectors loaded before the current ones are used.
// Each vector goes first to on_vector(its first index, actual, expected);
// when that returns false, f takes its elements.
// kRareFallback: on_vector takes nearly every vector, so f's loop is kept
// rolled (registers for the common path, not for eight inlined copies of f).
template <int kType, bool kRareFallback, typename V, typename F>
__device__ __forceinline__ void ForEachVector(const CompareArgs& args, V&& on_vector, F&& f) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t first = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
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
#pragma unroll(kRareFallback ? 1 : per)
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

template <int kType, typename F>
__device__ __forceinline__ void ForEachElement(const CompareArgs& args, F&& f) {
  ForEachVector<kType, false>(
      args, [](int64_t, const uint4&, const uint4&) { return false; }, f);
}

// A partial written by another block: read past this multiprocessor's L1.
__device__ __forceinline__ CompareTotals LoadPartial(const CompareTotals* p) {
  static_assert(sizeof(CompareTotals) % sizeof(ull) == 0, "8-byte fields");
  CompareTotals t;
  const ull* from = reinterpret_cast<const ull*>(p);
  ull* to = reinterpret_cast<ull*>(&t);
  for (size_t k = 0; k < sizeof(CompareTotals) / sizeof(ull); ++k) to[k] = __ldcg(from + k);
  return t;
}

template <int kType>
constexpr bool kLean = kType == static_cast<int>(ElemType::kF32) ||
                       kType == static_cast<int>(ElemType::kF16) ||
                       kType == static_cast<int>(ElemType::kBF16);

// The totals pass. Each block writes its partial; the last block to finish
// reduces them in block order (the same sums on every run) into
// result->totals, which saves the launch of a kernel for it. Blocks of 256
// threads, three per multiprocessor (at most 85 registers), two for the
// lean kernels, whose common path needs about 110 registers and would
// otherwise spill to local memory.
template <int kType>
__global__ void __launch_bounds__(kThreads, kLean<kType> ? 2 : 3)
    TotalsKernel(CompareArgs args, CompareTotals* partials, CompareResult* result, ull* col_counts,
                 ull* row_counts) {
  __shared__ unsigned int block_hist[kCompareHistBuckets];
  __shared__ RareCounts rare;
  __shared__ bool last_block;
  for (int b = threadIdx.x; b < kCompareHistBuckets; b += blockDim.x) block_hist[b] = 0;
  if (threadIdx.x == 0) rare = RareCounts{0, 0, 0, 0, 0, 0};
  __syncthreads();
  const Layout layout = LayoutOf(args.compared);
  ThreadTotals mine;
  LocalHistogram hist;
  hist.shared = block_hist;
  ForEachVector<kType, kLean<kType>>(
      args,
      [&](int64_t first, const uint4& ra, const uint4& re) {
        if constexpr (kLean<kType>) {
          return TryLeanVector<static_cast<ElemType>(kType)>(args, first, ra, re, mine, hist,
                                                              col_counts, row_counts);
        } else {
          return false;
        }
      },
      [&](int64_t i, const Element& x) {
        Accumulate(args, layout, i, x, mine, &rare, hist, col_counts, row_counts,
                   &result->nonfinite_count);
      });
  hist.Flush();                                   // every thread of the block reaches it
  CompareTotals t = BlockReduce(ToTotals(mine));  // its __syncthreads orders `rare`
  if (threadIdx.x == 0) {
    t.nan_actual += rare.nan_actual;
    t.nan_expected += rare.nan_expected;
    t.inf_actual += rare.inf_actual;
    t.inf_expected += rare.inf_expected;
    t.nan_mismatch += rare.nan_mismatch;
    t.ulp_infinite += rare.ulp_infinite;
    partials[blockIdx.x] = t;
  }
  __syncthreads();
  for (int b = threadIdx.x; b < kCompareHistBuckets; b += blockDim.x) {
    if (block_hist[b] != 0) atomicAdd(&result->ulp_histogram[b], ull{block_hist[b]});
  }
  if (threadIdx.x == 0) {
    __threadfence();  // the partial before the ticket
    last_block = atomicAdd(&result->blocks_done, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last_block) return;
  __threadfence();
  CompareTotals total = EmptyTotals();
  for (int j = threadIdx.x; j < static_cast<int>(gridDim.x); j += blockDim.x) {
    Combine(total, LoadPartial(&partials[j]));
  }
  total = BlockReduce(total);
  if (threadIdx.x == 0) result->totals = total;
}

// ---- worst elements

struct Key {
  ull w[3];
};

// Compare's ranking as one 192-bit unsigned key, higher ranks first:
// (NaN against a number ? all ones : bits of the abs diff, which order
// like the values for r >= 0), then the ULP distance, then ~index.
__device__ __forceinline__ Key RankKey(const CompareArgs& args, const Layout& layout, int64_t i,
                                       const Element& x) {
  const bool nan_a = isnan(x.a), nan_e = isnan(x.e);
  double r;
  if (nan_a || nan_e) {
    r = (nan_a && nan_e && args.nan_equal) ? 0.0 : CUDART_INF;
  } else if (!isfinite(x.a) || !isfinite(x.e)) {
    r = x.a == x.e ? 0.0 : CUDART_INF;
  } else {
    r = fabs(x.a - x.e);
  }
  Key k;
  k.w[0] = nan_a != nan_e ? ~0ull : static_cast<ull>(__double_as_longlong(r));
  k.w[1] = Distance(x.ba, x.be, layout);
  k.w[2] = ~static_cast<ull>(i);
  return k;
}

__device__ __forceinline__ int Digit(const Key& k, int p) {
  return static_cast<int>((k.w[p / 8] >> (56 - 8 * (p % 8))) & 0xff);
}

// Whether the first p digits of k are those of prefix.
__device__ __forceinline__ bool MatchesPrefix(const Key& k, const ull* prefix, int p) {
  const int full = p / 8;
  for (int j = 0; j < full; ++j) {
    if (k.w[j] != prefix[j]) return false;
  }
  const int rest = p % 8;
  if (rest == 0) return true;
  const ull mask = ~0ull << (64 - 8 * rest);
  return (k.w[full] & mask) == (prefix[full] & mask);
}

// Digits of ~index above the bytes that can differ are constant and skipped.
__device__ __forceinline__ int NextDigit(int p, int first_index_digit) {
  ++p;
  return (p >= 16 && p < first_index_digit) ? first_index_digit : p;
}

// Selects digit p from its histogram (thread 0 of one block): the bin
// holding the need-th highest element among those matching prefix. Then
// skips the digits that `word_or` shows to be 0 for every such element.
template <typename Count>
__device__ void PickDigit(SelectState* s, int p, const Count* hist, const ull* word_or,
                          int first_index_digit) {
  long long above = 0;
  int d = 255;
  for (; d > 0; --d) {
    const long long h = static_cast<long long>(hist[d]);
    if (above + h >= s->need) break;
    above += h;
  }
  s->need -= above;
  const int word = p / 8, shift = 56 - 8 * (p % 8);
  s->prefix[word] = (s->prefix[word] & ~(0xffull << shift)) | (ull(d) << shift);
  const long long in_bin = static_cast<long long>(hist[d]);
  if (in_bin == s->need) s->done = 1;
  if (!s->use_list && in_bin <= static_cast<long long>(kListCapacity)) s->build_list = 1;
  int q = NextDigit(p, first_index_digit);
  while (q < kDigits && ((word_or[q / 8] >> (56 - 8 * (q % 8))) & 0xff) == 0) {
    q = NextDigit(q, first_index_digit);
  }
  s->next_digit = q;
}

__global__ void SelectInitKernel(SelectState* s, long long need, ull index_prefix,
                                 CompareResult* result) {
  s->prefix[0] = s->prefix[1] = 0;
  s->prefix[2] = index_prefix;
  s->need = need;
  s->done = s->build_list = s->use_list = 0;
  s->next_digit = 0;
  s->list_count = 0;
  for (int b = 0; b < 256; ++b) s->hist[b] = 0;
  s->word_or[0] = s->word_or[1] = s->word_or[2] = 0;
  result->worst_count = 0;
}

// Histogram of digit p over every element matching the prefix, the OR of
// their keys and, when asked, the list of their keys.
template <int kType>
__global__ void __launch_bounds__(kThreads)
    SelectHistogramKernel(CompareArgs args, SelectState* s, int p) {
  if (s->done || s->use_list || s->next_digit != p) return;  // the same for every thread
  __shared__ unsigned int block_hist[256];
  block_hist[threadIdx.x] = 0;  // blockDim.x == 256
  __syncthreads();
  const Layout layout = LayoutOf(args.compared);
  const ull prefix[3] = {s->prefix[0], s->prefix[1], s->prefix[2]};
  const bool build = s->build_list != 0;
  ull word_or[3] = {0, 0, 0};
  ForEachElement<kType>(args, [&](int64_t i, const Element& x) {
    const Key k = RankKey(args, layout, i, x);
    if (!MatchesPrefix(k, prefix, p)) return;
    // One atomic per distinct digit in the warp: the first digits of close
    // outputs are mostly the same.
    const int digit = Digit(k, p);
    const unsigned int peers = __match_any_sync(__activemask(), digit);
    if ((threadIdx.x % 32) == static_cast<unsigned int>(__ffs(peers) - 1)) {
      atomicAdd(&block_hist[digit], static_cast<unsigned int>(__popc(peers)));
    }
    word_or[0] |= k.w[0];
    word_or[1] |= k.w[1];
    word_or[2] |= k.w[2];
    if (build) {
      const unsigned int slot = atomicAdd(&s->list_count, 1u);
      if (slot < kListCapacity) {
        s->list[slot][0] = k.w[0];
        s->list[slot][1] = k.w[1];
        s->list[slot][2] = k.w[2];
      }
    }
  });
  __syncthreads();
  if (block_hist[threadIdx.x] != 0) atomicAdd(&s->hist[threadIdx.x], ull{block_hist[threadIdx.x]});
  for (int w = 0; w < 3; ++w) {
    // OR across the warp, as two 32-bit halves; then one atomic per warp.
    const unsigned int hi =
        __reduce_or_sync(0xffffffffu, static_cast<unsigned int>(word_or[w] >> 32));
    const unsigned int lo = __reduce_or_sync(0xffffffffu, static_cast<unsigned int>(word_or[w]));
    const ull v = (ull{hi} << 32) | lo;
    if (threadIdx.x % 32 == 0 && v != 0) atomicOr(&s->word_or[w], v);
  }
}

__global__ void SelectPickKernel(SelectState* s, int p, int first_index_digit) {
  if (s->done || s->use_list || s->next_digit != p) return;
  if (s->build_list) {  // the pass just run listed the matching elements
    s->use_list = 1;
    s->build_list = 0;
  }
  PickDigit(s, p, s->hist, s->word_or, first_index_digit);
  for (int b = 0; b < 256; ++b) s->hist[b] = 0;
  s->word_or[0] = s->word_or[1] = s->word_or[2] = 0;
}

// Once the list holds the keys of every element matching the prefix: the
// remaining digits, in one block, over the list alone.
__global__ void __launch_bounds__(kThreads)
    SelectListKernel(SelectState* s, int first_index_digit) {
  if (s->done || !s->use_list) return;
  __shared__ unsigned int block_hist[256];
  __shared__ ull block_or[3];
  __shared__ int finished;
  const unsigned int count = min(s->list_count, kListCapacity);
  for (int p = s->next_digit; p < kDigits; p = s->next_digit) {
    block_hist[threadIdx.x] = 0;
    if (threadIdx.x < 3) block_or[threadIdx.x] = 0;
    __syncthreads();
    const ull prefix[3] = {s->prefix[0], s->prefix[1], s->prefix[2]};
    for (unsigned int j = threadIdx.x; j < count; j += blockDim.x) {
      const Key k{{s->list[j][0], s->list[j][1], s->list[j][2]}};
      if (!MatchesPrefix(k, prefix, p)) continue;
      atomicAdd(&block_hist[Digit(k, p)], 1u);
      atomicOr(&block_or[0], k.w[0]);
      atomicOr(&block_or[1], k.w[1]);
      atomicOr(&block_or[2], k.w[2]);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      PickDigit(s, p, block_hist, block_or, first_index_digit);
      finished = s->done;
    }
    __syncthreads();
    if (finished) break;
  }
}

template <int kType>
__global__ void __launch_bounds__(kThreads)
    SelectGatherKernel(CompareArgs args, const SelectState* s, int k, WorstEntry* out,
                       CompareResult* result) {
  const Layout layout = LayoutOf(args.compared);
  const ull t0 = s->prefix[0], t1 = s->prefix[1], t2 = s->prefix[2];
  ForEachElement<kType>(args, [&](int64_t i, const Element& x) {
    const Key key = RankKey(args, layout, i, x);
    const bool at_least = key.w[0] != t0   ? key.w[0] > t0
                          : key.w[1] != t1 ? key.w[1] > t1
                                           : key.w[2] >= t2;
    if (!at_least) return;
    const unsigned int pos = atomicAdd(&result->worst_count, 1u);
    if (pos < static_cast<unsigned int>(k)) {
      out[pos] = WorstEntry{static_cast<long long>(i), x.a, x.e, x.ba, x.be};
    }
  });
}

// The kernel instance for `args`: vectorised when both arrays are stored
// in the compared type.
int KernelType(const CompareArgs& args) {
  const bool same = args.actual_type == args.compared && args.expected_type == args.compared;
  return same ? static_cast<int>(args.compared) : kAnyTypes;
}

// Calls Launch<type>::Run(args...) for the instance KernelType picked.
template <template <int> class Launch, typename... Args>
cudaError_t Dispatch(int type, Args&&... args) {
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

template <int kType>
struct TotalsLaunch {
  static cudaError_t Run(int blocks, cudaStream_t stream, const CompareArgs& args,
                         CompareTotals* partials, CompareResult* result, ull* cols,
                         ull* rows) {
    TotalsKernel<kType><<<blocks, kThreads, 0, stream>>>(args, partials, result, cols, rows);
    return cudaGetLastError();
  }
};

template <int kType>
struct HistogramLaunch {
  static cudaError_t Run(int blocks, cudaStream_t stream, const CompareArgs& args, SelectState* s,
                         int p) {
    SelectHistogramKernel<kType><<<blocks, kThreads, 0, stream>>>(args, s, p);
    return cudaGetLastError();
  }
};

template <int kType>
struct GatherLaunch {
  static cudaError_t Run(int blocks, cudaStream_t stream, const CompareArgs& args,
                         const SelectState* s, int k, WorstEntry* out, CompareResult* result) {
    SelectGatherKernel<kType><<<blocks, kThreads, 0, stream>>>(args, s, k, out, result);
    return cudaGetLastError();
  }
};

}  // namespace

size_t CompareScratchBytes(int64_t /*total*/) { return PartialsBytes() + sizeof(SelectState); }

cudaError_t LaunchCompareTotals(const CompareArgs& args, void* scratch, CompareResult* result,
                                ull* col_counts, ull* row_counts, cudaStream_t stream) {
  cudaError_t e = cudaMemsetAsync(result, 0, sizeof(*result), stream);
  if (e != cudaSuccess) return e;
  if (col_counts != nullptr) {
    e = cudaMemsetAsync(col_counts, 0, sizeof(ull) * static_cast<size_t>(args.cols), stream);
    if (e != cudaSuccess) return e;
    e = cudaMemsetAsync(row_counts, 0, sizeof(ull) * static_cast<size_t>(args.total / args.cols),
                        stream);
    if (e != cudaSuccess) return e;
  }
  auto* partials = static_cast<CompareTotals*>(scratch);
  const int blocks = Blocks(args.total);
  return Dispatch<TotalsLaunch>(KernelType(args), blocks, stream, args, partials, result,
                                col_counts, row_counts);
}

cudaError_t LaunchSelectWorst(const CompareArgs& args, int k, void* scratch, WorstEntry* out,
                              CompareResult* result, cudaStream_t stream) {
  auto* state = reinterpret_cast<SelectState*>(static_cast<char*>(scratch) + PartialsBytes());
  const long long need = std::min<long long>(k, args.total);
  // ~index: above the bytes that hold total-1, every key has all ones, so
  // those digits are set here and not selected.
  int index_bytes = 1;
  while (index_bytes < 8 && (static_cast<ull>(args.total - 1) >> (8 * index_bytes)) != 0) {
    ++index_bytes;
  }
  const ull index_prefix = index_bytes == 8 ? 0 : ~0ull << (8 * index_bytes);
  const int first_index_digit = 16 + (8 - index_bytes);
  SelectInitKernel<<<1, 1, 0, stream>>>(state, need, index_prefix, result);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  const int blocks = Blocks(args.total);
  const int type = KernelType(args);
  // Full passes until the list takes over (usually two or three); after
  // every third, ask the device whether it is done before launching more.
  int passes = 0;
  for (int p = 0; p < kDigits; p = p + 1 == 16 ? first_index_digit : p + 1) {
    if ((e = Dispatch<HistogramLaunch>(type, blocks, stream, args, state, p)) != cudaSuccess) {
      return e;
    }
    SelectPickKernel<<<1, 1, 0, stream>>>(state, p, first_index_digit);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    SelectListKernel<<<1, kThreads, 0, stream>>>(state, first_index_digit);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    if (++passes % 3 == 0) {
      int done = 0;
      if ((e = cudaMemcpyAsync(&done, &state->done, sizeof(done), cudaMemcpyDeviceToHost,
                               stream)) != cudaSuccess ||
          (e = cudaStreamSynchronize(stream)) != cudaSuccess) {
        return e;
      }
      if (done) break;
    }
  }
  return Dispatch<GatherLaunch>(type, blocks, stream, args, state, k, out, result);
}

}  // namespace tensorcheck::cuda
