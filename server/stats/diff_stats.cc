#include "server/stats/diff_stats.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/core/float_formats.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#endif

namespace tensorcheck {
namespace {

// Elements per summation block. Sums are taken per block in element order
// and the block sums added in block order, so the result is the same for
// every thread count (threads own whole blocks).
constexpr int64_t kBlock = 1024;
constexpr int64_t kMinElementsPerThread = int64_t{1} << 15;
constexpr int kMaxThreads = 256;

// ULP histogram: index 0 holds distance 0, index i >= 1 holds
// (2^(i-2), 2^(i-1)] (1, 2, 3-4, 5-8, ...). Distances stay below 2^64, so
// index 65 is the last.
constexpr int kHistBuckets = kUlpHistogramBuckets;

inline int BucketIndex(uint64_t d) {
  // Branch-free for the common range: ceil(log2(d)) + 1 == bit length of
  // 2(d-1)+1; d == 0 selects 0.
  if (d > (uint64_t{1} << 62)) return 1 + (64 - __builtin_clzll(d - 1));
  const int b = 64 - __builtin_clzll(((d - 1) << 1) | 1);
  return d == 0 ? 0 : b;
}

UlpBucket BucketBounds(int i) {
  UlpBucket b;
  if (i <= 1) {
    b.lo = b.hi = static_cast<uint64_t>(i);
  } else {
    b.lo = (uint64_t{1} << (i - 2)) + 1;
    b.hi = i - 1 < 64 ? uint64_t{1} << (i - 1) : kUlpInfinite - 1;
  }
  return b;
}

// Bit layout of the compared dtype, for ordered-integer ULP distances.
struct BitLayout {
  uint64_t sign;
  uint64_t magnitude;  // ~sign within the width
  uint64_t inf;        // magnitude bits of +inf; larger is NaN
};

BitLayout LayoutOf(DType d) {
  switch (d) {
    case DType::kFloat64:
      return {uint64_t{1} << 63, ~(uint64_t{1} << 63), 0x7ff0000000000000ull};
    case DType::kFloat32:
      return {0x80000000ull, 0x7fffffffull, 0x7f800000ull};
    case DType::kFloat16:
      return {0x8000ull, 0x7fffull, 0x7c00ull};
    case DType::kBFloat16:
      return {0x8000ull, 0x7fffull, 0x7f80ull};
  }
  return {0x80000000ull, 0x7fffffffull, 0x7f800000ull};
}

// Distance between two non-NaN bit patterns: values ordered as integers,
// negative ones mirrored, so +0 and -0 coincide.
inline uint64_t OrderedDistance(uint64_t a, uint64_t b, const BitLayout& l) {
  const uint64_t ma = a & l.magnitude;
  const uint64_t mb = b & l.magnitude;
  if ((a & l.sign) == (b & l.sign)) return ma > mb ? ma - mb : mb - ma;
  return ma + mb;
}

inline uint64_t DistanceFromBits(uint64_t a, uint64_t b, const BitLayout& l) {
  const bool nan_a = (a & l.magnitude) > l.inf;
  const bool nan_b = (b & l.magnitude) > l.inf;
  if (nan_a || nan_b) return nan_a && nan_b ? 0 : kUlpInfinite;
  return OrderedDistance(a, b, l);
}

// Widens elements [start, start + n) of `t` to double.
void Decode(const Tensor& t, int64_t start, int64_t n, double* out) {
  switch (t.dtype()) {
    case DType::kFloat64:
      std::memcpy(out, t.data<double>() + start, n * sizeof(double));
      return;
    case DType::kFloat32: {
      const float* p = t.data<float>() + start;
      for (int64_t j = 0; j < n; ++j) out[j] = p[j];
      return;
    }
    case DType::kFloat16: {
      const uint16_t* p = t.data<uint16_t>() + start;
      for (int64_t j = 0; j < n; ++j) out[j] = Fp16BitsToFloat(p[j]);
      return;
    }
    case DType::kBFloat16: {
      const uint16_t* p = t.data<uint16_t>() + start;
      for (int64_t j = 0; j < n; ++j) out[j] = Bf16BitsToFloat(p[j]);
      return;
    }
  }
}

// Bit patterns in `cmp` of elements [start, start + n) of `t`, whose
// widened values are `v`. Storage in `cmp` itself is read as is.
void ToBits(const Tensor& t, int64_t start, int64_t n, const double* v,
            DType cmp, uint64_t* out) {
  if (t.dtype() == cmp) {
    switch (cmp) {
      case DType::kFloat64:
        std::memcpy(out, t.data<uint64_t>() + start, n * sizeof(uint64_t));
        return;
      case DType::kFloat32: {
        const uint32_t* p = t.data<uint32_t>() + start;
        for (int64_t j = 0; j < n; ++j) out[j] = p[j];
        return;
      }
      case DType::kFloat16:
      case DType::kBFloat16: {
        const uint16_t* p = t.data<uint16_t>() + start;
        for (int64_t j = 0; j < n; ++j) out[j] = p[j];
        return;
      }
    }
  }
  // Values of fp32/fp16/bf16 tensors are floats, where the fast float
  // roundings are single roundings of the exact value.
  const bool is_float = t.dtype() != DType::kFloat64;
  switch (cmp) {
    case DType::kFloat64:
      for (int64_t j = 0; j < n; ++j) out[j] = DoubleBits(v[j]);
      return;
    case DType::kFloat32:
      for (int64_t j = 0; j < n; ++j) {
        out[j] = FloatBits(static_cast<float>(v[j]));
      }
      return;
    case DType::kBFloat16:
      if (is_float) {
        for (int64_t j = 0; j < n; ++j) {
          out[j] = FloatToBf16Bits(static_cast<float>(v[j]));
        }
      } else {
        for (int64_t j = 0; j < n; ++j) out[j] = DoubleToBf16Bits(v[j]);
      }
      return;
    case DType::kFloat16:
      for (int64_t j = 0; j < n; ++j) out[j] = DoubleToFp16Bits(v[j]);
      return;
  }
}

// Ranking of an element for `worst`: higher ranks first.
struct RankKey {
  int tier = 0;  // 1: NaN against a number
  double r = 0;  // abs diff, NaN pairs mapped to 0 or +inf
  uint64_t ulp = 0;
  int64_t index = 0;
};

inline bool RanksAbove(const RankKey& x, const RankKey& y) {
  if (x.tier != y.tier) return x.tier > y.tier;
  if (x.r != y.r) return x.r > y.r;
  if (x.ulp != y.ulp) return x.ulp > y.ulp;
  return x.index < y.index;
}

struct Candidate {
  RankKey key;
  ElementDiff diff;
};

// Keeps the `limit` highest-ranked candidates. The heap's front is the
// lowest ranked of them.
class WorstHeap {
 public:
  explicit WorstHeap(int limit) : limit_(static_cast<size_t>(limit)) {}

  // Cheap pre-check on the hot path: false when (tier, r) cannot enter.
  bool MayEnter(int tier, double r) const {
    if (limit_ == 0) return false;
    if (items_.size() < limit_) return true;
    const RankKey& low = items_.front().key;
    return tier > low.tier || (tier == low.tier && r >= low.r);
  }

  // Which tier-0 (no NaN) candidates can still enter, for a thread that
  // offers its elements in index order (so a later element never wins an
  // exact tie): abs diff above r, or equal to r with more ULPs.
  struct Gate {
    double r;
    uint64_t ulp;
    bool Admits(double abs_diff, uint64_t u) const {
      return abs_diff > r || (abs_diff == r && u > ulp);
    }
  };
  Gate TierZeroGate() const {
    constexpr double kInf = std::numeric_limits<double>::infinity();
    if (limit_ == 0) return {kInf, kUlpInfinite};
    if (items_.size() < limit_) return {-kInf, 0};
    const RankKey& low = items_.front().key;
    if (low.tier > 0) return {kInf, kUlpInfinite};
    return {low.r, low.ulp};
  }

  void Offer(const Candidate& c) {
    static constexpr auto kCmp = [](const Candidate& x, const Candidate& y) {
      return RanksAbove(x.key, y.key);
    };
    if (items_.size() < limit_) {
      items_.push_back(c);
      std::push_heap(items_.begin(), items_.end(), kCmp);
      return;
    }
    if (limit_ == 0 || !RanksAbove(c.key, items_.front().key)) return;
    std::pop_heap(items_.begin(), items_.end(), kCmp);
    items_.back() = c;
    std::push_heap(items_.begin(), items_.end(), kCmp);
  }

  std::vector<Candidate>& items() { return items_; }

 private:
  size_t limit_;
  std::vector<Candidate> items_;
};

// Keeps the `limit` groups with the most mismatches (ties: lower index).
class TopGroups {
 public:
  explicit TopGroups(int limit) : limit_(static_cast<size_t>(limit)) {}

  void Offer(int64_t index, int64_t count) {
    if (count <= 0 || limit_ == 0) return;
    GroupCount g;
    g.index = index;
    g.mismatched = count;
    if (items_.size() < limit_) {
      items_.push_back(g);
      std::push_heap(items_.begin(), items_.end(), Above);
      return;
    }
    if (!Above(g, items_.front())) return;
    std::pop_heap(items_.begin(), items_.end(), Above);
    items_.back() = g;
    std::push_heap(items_.begin(), items_.end(), Above);
  }

  std::vector<GroupCount> Take(int64_t total_mismatched) {
    std::sort(items_.begin(), items_.end(), Above);
    for (GroupCount& g : items_) {
      g.share = static_cast<double>(g.mismatched) /
                static_cast<double>(total_mismatched);
    }
    return std::move(items_);
  }

 private:
  static bool Above(const GroupCount& x, const GroupCount& y) {
    if (x.mismatched != y.mismatched) return x.mismatched > y.mismatched;
    return x.index < y.index;
  }
  size_t limit_;
  std::vector<GroupCount> items_;
};

// Per-block sums, added in block order at the end.
struct BlockSums {
  double abs = 0;      // |a-e|
  double sq = 0;       // (a-e)^2
  double aa = 0;       // a^2
  double ee = 0;       // e^2
  double ae = 0;       // a*e
  double ulp = 0;      // finite ULP distances
  double sigma2 = 0;   // predicted sigma^2
  double sq_sigma = 0; // (a-e)^2 where sigma is finite
};

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

struct Shared {
  const Tensor* actual;
  const Tensor* expected;
  const CompareOptions* options;
  BitLayout layout;
  int64_t total;
  int64_t cols;
  std::vector<BlockSums>* blocks;
};

// Everything one thread accumulates over its contiguous range.
struct ThreadAcc {
  explicit ThreadAcc(int top_k) : worst(top_k) {}

  int64_t start = 0;
  int64_t end = 0;
  int64_t finite = 0;
  int64_t mismatched = 0;
  int64_t bit_equal = 0;
  int64_t nan_actual = 0;
  int64_t nan_expected = 0;
  int64_t inf_actual = 0;
  int64_t inf_expected = 0;
  int64_t nan_mismatch = 0;
  int64_t ulp_infinite = 0;
  uint64_t max_ulp = 0;
  // Four interleaved copies, so that runs of equal distances do not chain
  // every element through one counter in memory.
  std::array<std::array<int64_t, kHistBuckets>, 4> hist{};
  double max_abs = -1;
  int64_t max_abs_index = -1;
  double max_rel = -1;
  int64_t max_rel_index = -1;
  WorstHeap worst;

  // Mismatch counts, allocated at the first mismatch. Columns are indexed
  // by column when the range spans at least `cols` elements, else by
  // offset from `start` (distinct offsets are then distinct columns).
  bool col_by_offset = false;
  std::vector<int64_t> col_counts;
  int64_t first_row = 0;
  std::vector<int64_t> row_counts;  // indexed by row - first_row
};

void RecordMismatch(ThreadAcc& acc, const Shared& sh, int64_t i, int64_t col,
                    int64_t row) {
  ++acc.mismatched;
  if (sh.options->top_groups == 0) return;
  if (acc.row_counts.empty()) {
    const int64_t len = acc.end - acc.start;
    acc.col_by_offset = len < sh.cols;
    acc.col_counts.assign(
        static_cast<size_t>(acc.col_by_offset ? len : sh.cols), 0);
    acc.first_row = acc.start / sh.cols;
    const int64_t last_row = (acc.end - 1) / sh.cols;
    acc.row_counts.assign(static_cast<size_t>(last_row - acc.first_row + 1),
                          0);
  }
  ++acc.col_counts[static_cast<size_t>(acc.col_by_offset ? i - acc.start
                                                         : col)];
  ++acc.row_counts[static_cast<size_t>(row - acc.first_row)];
}

ElementDiff MakeDiff(int64_t i, double a, double e, uint64_t ba, uint64_t be,
                     double abs_diff, double rel, uint64_t ulp) {
  ElementDiff d;
  d.flat_index = i;
  d.actual = a;
  d.expected = e;
  d.actual_bits = ba;
  d.expected_bits = be;
  d.abs_diff = abs_diff;
  d.rel_diff = rel;
  d.ulp = ulp;
  return d;
}

// A pair where at least one value is NaN or infinite. Returns the ULP
// distance to add to the block's sum (0 for an infinite one).
double NonFiniteElement(ThreadAcc& acc, const Shared& sh, int64_t i, double a,
                        double e, uint64_t ba, uint64_t be, int64_t col,
                        int64_t row) {
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
    acc.worst.Offer(
        {{tier, rank, ulp, i}, MakeDiff(i, a, e, ba, be, abs_diff, rel, ulp)});
  }
  return ulp_sum;
}

inline double RelDiff(double abs_diff, double abs_e) {
  if (abs_e > 0) return abs_diff / abs_e;
  return abs_diff > 0 ? std::numeric_limits<double>::infinity() : 0.0;
}

// One block of elements [start, start + n): the widened values and the
// compared-dtype bits of both sides.
struct BlockView {
  int64_t start;
  int64_t n;
  const double* a;
  const double* e;
  const uint64_t* ba;
  const uint64_t* be;
};

// bound_ratio's block sums: sigma^2 and (a-e)^2 over the elements with a
// finite sigma, from the block's |a-e|.
void SigmaSums(const float* sigma, const double* abs_diff, int64_t n, BlockSums& bs) {
  double s2 = 0, d2 = 0;
  for (int64_t k = 0; k < n; ++k) {
    if (!std::isfinite(sigma[k])) continue;
    s2 += static_cast<double>(sigma[k]) * sigma[k];
    d2 += abs_diff[k] * abs_diff[k];
  }
  bs.sigma2 = s2;
  bs.sq_sigma = d2;
}

// Just below 1: the max_rel pre-check multiplies instead of dividing and
// must never reject an element whose quotient would win.
constexpr double kShrink = 1.0 - 0x1p-50;

// Any block, element by element, with every special case. Used for blocks
// holding a NaN or infinity (or sums that overflow).
void SlowBlock(ThreadAcc& acc, const Shared& sh, const BlockView& v,
               int64_t& col, int64_t& row, BlockSums& bs) {
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
      if (!FinitePairPasses(opt.tolerance, abs_diff, abs_e,
                            bound != nullptr ? bound[i] : 0.0, ulp)) {
        RecordMismatch(acc, sh, i, col, row);
      }
      if (acc.worst.MayEnter(0, abs_diff)) {
        acc.worst.Offer({{0, abs_diff, ulp, i},
                         MakeDiff(i, a, e, ba, be, abs_diff, rel, ulp)});
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

// Ordered integer of a bit pattern `width` <= 32 bits wide: negative
// values mirrored, so +0 and -0 both map to 0.
inline int64_t OrderedInt(uint64_t bits, int width) {
  // Sign-extend, then map sign-magnitude to two's complement.
  const int64_t x = static_cast<int64_t>(bits << (64 - width)) >> (64 - width);
  const int64_t min = -(int64_t{1} << (width - 1));
  return x < 0 ? min - x : x;
}

// Pass 2 of FastBlock for fp32 tensors compared in fp32, four lanes at a
// time (n a multiple of 4): ULP distances into `ulp_buf`, their sum into
// bs.ulp, the histogram (vector counts when the block's distances are all
// <= 4, the common case of close outputs; per element otherwise).
void FloatUlpPass(const float* a, const float* e, int64_t n, uint64_t* ulp_buf,
                  ThreadAcc& acc, BlockSums& bs, int64_t& bit_equal,
                  uint64_t& max_ulp) {
  typedef int32_t I4 __attribute__((vector_size(16)));
  typedef uint32_t U4 __attribute__((vector_size(16)));
  typedef uint64_t W4 __attribute__((vector_size(32)));
  const I4 zero = {0, 0, 0, 0};
  const I4 min = {INT32_MIN, INT32_MIN, INT32_MIN, INT32_MIN};
  const U4 one = {1, 1, 1, 1}, two = {2, 2, 2, 2}, three = {3, 3, 3, 3};
  U4 vmax = {0, 0, 0, 0};
  W4 vsum = {0, 0, 0, 0};
  I4 eq = zero, c0 = zero, c1 = zero, c2 = zero, c34 = zero;
  for (int64_t k = 0; k < n; k += 4) {
    I4 xa, xe;
    std::memcpy(&xa, a + k, sizeof(xa));
    std::memcpy(&xe, e + k, sizeof(xe));
    // Sign-magnitude to ordered two's complement. A vector ?: evaluates
    // both sides in every lane, so subtract in unsigned arithmetic (the
    // lanes that keep it have x < 0 and do not wrap).
    const I4 oa = xa < zero ? reinterpret_cast<I4>(reinterpret_cast<U4>(min) -
                                                   reinterpret_cast<U4>(xa))
                            : xa;
    const I4 oe = xe < zero ? reinterpret_cast<I4>(reinterpret_cast<U4>(min) -
                                                   reinterpret_cast<U4>(xe))
                            : xe;
    const U4 d = reinterpret_cast<U4>(oa) - reinterpret_cast<U4>(oe);
    const U4 u = oa >= oe ? d : -d;  // distances stay below 2^32
    eq -= xa == xe;
    vmax = u > vmax ? u : vmax;
    const W4 w = __builtin_convertvector(u, W4);
    std::memcpy(ulp_buf + k, &w, sizeof(w));
    vsum += w;
    c0 -= u == U4{0, 0, 0, 0};
    c1 -= u == one;
    c2 -= u == two;
    c34 -= (u - three) <= one;  // 3 or 4; smaller values wrap high
  }
  auto sum4 = [](const I4& x) {
    return int64_t{x[0]} + x[1] + x[2] + x[3];
  };
  bit_equal += sum4(eq);
  const uint32_t block_max = std::max(std::max(vmax[0], vmax[1]),
                                      std::max(vmax[2], vmax[3]));
  max_ulp = std::max<uint64_t>(max_ulp, block_max);
  bs.ulp = static_cast<double>(vsum[0] + vsum[1] + vsum[2] + vsum[3]);
  if (block_max <= 4) {
    acc.hist[0][0] += sum4(c0);
    acc.hist[0][1] += sum4(c1);
    acc.hist[0][2] += sum4(c2);
    acc.hist[0][3] += sum4(c34);
    return;
  }
  int64_t hist[4][kHistBuckets] = {};
  for (int64_t k = 0; k < n; ++k) {
    const uint64_t u = ulp_buf[k];
    const int bucket = 64 - __builtin_clzll(((u - 1) << 1) | 1);
    ++hist[k & 3][u == 0 ? 0 : bucket];
  }
  for (int lane = 0; lane < 4; ++lane) {
    for (int q = 0; q < kHistBuckets; ++q) acc.hist[lane][q] += hist[lane][q];
  }
}

// A block whose values are all finite, in three simple passes (sums, ULP
// distances, then the order-dependent maxima, tolerance and worst list).
// Returns false, having changed nothing, when the block holds a non-finite
// value or its sums overflow; SlowBlock then takes it.
//
// T is the element type read: double (values widened by Decode, bits from
// ToBits) or float (fp32 tensors compared in fp32, read in place: the bits
// are the float's own).
template <typename T>
struct FastView {
  int64_t start;
  int64_t n;
  const T* a;
  const T* e;
  const uint64_t* ba;  // T == double only
  const uint64_t* be;
};

template <typename T>
inline uint64_t BitsAt(const FastView<T>& v, const T* values,
                       const uint64_t* bits, int64_t k) {
  if constexpr (std::is_same_v<T, float>) {
    return FloatBits(values[k]);
  } else {
    return bits[k];
  }
}

// |a-e| and ULP distances of a finite block, element by element: the same
// values the vector passes produce. Either output may be null.
template <typename T>
void FillFastBuffers(const FastView<T>& v, const BitLayout& l,
                     double* abs_buf, uint64_t* ulp_buf) {
  if (abs_buf != nullptr) {
    for (int64_t k = 0; k < v.n; ++k) {
      abs_buf[k] = std::fabs(static_cast<double>(v.a[k]) -
                             static_cast<double>(v.e[k]));
    }
  }
  if (ulp_buf != nullptr) {
    for (int64_t k = 0; k < v.n; ++k) {
      ulp_buf[k] = OrderedDistance(BitsAt(v, v.a, v.ba, k),
                                   BitsAt(v, v.e, v.be, k), l);
    }
  }
}

// Pass 3 of FastBlock, shared by its portable and fused fp32 forms: in
// element order, everything that depends on it (maxima and their indices,
// the tolerance, the worst list); skipped when the block's summary shows
// that nothing in it can change them. `may_fail_or_raise_rel` must be true
// when some element may fail an atol/rtol rule or raise max_rel above
// `rel0` (it may be true when none does: the scan then changes nothing).
// abs_buf/ulp_buf hold |a-e| and the ULP distances when *_ready; else they
// are filled here when the scan needs them.
template <typename T>
void FinishFastBlock(ThreadAcc& acc, const Shared& sh, const FastView<T>& v,
                     int64_t& col, int64_t& row, double* abs_buf,
                     uint64_t* ulp_buf, double rel0, bool may_fail_or_raise_rel,
                     double bmax, uint64_t block_max_ulp, bool abs_ready,
                     bool ulp_ready) {
  const CompareOptions& opt = *sh.options;
  const Tolerance& tol = opt.tolerance;
  const int64_t n = v.n;
  // Pass 3: in element order, everything that depends on it; skipped when
  // pass 1 showed that nothing in the block can change it.
  const bool sum_rule_preset = tol.preset == TolerancePreset::kTorch ||
                               tol.preset == TolerancePreset::kNumpy ||
                               tol.preset == TolerancePreset::kExplicit;
  const bool scan = !sum_rule_preset || rel0 < 0 || may_fail_or_raise_rel ||
                    bmax > acc.max_abs ||
                    acc.worst.TierZeroGate().Admits(bmax, block_max_ulp);
  if (!scan) {
    col += n;
    if (col >= sh.cols) {
      row += col / sh.cols;
      col %= sh.cols;
    }
    return;
  }
  if (sum_rule_preset && rel0 >= 0 && !may_fail_or_raise_rel) {
    // The common scan: no element fails or raises max_rel, so only max_abs
    // and the worst list can change; elements below both thresholds are
    // passed over. The same updates, in the same order, as the full loop.
    double max_abs = acc.max_abs;
    int64_t max_abs_index = acc.max_abs_index;
    WorstHeap::Gate gate = acc.worst.TierZeroGate();
    for (int64_t k = 0; k < n; ++k) {
      const double ad =
          abs_ready ? abs_buf[k]
                    : std::fabs(static_cast<double>(v.a[k]) -
                                static_cast<double>(v.e[k]));
      if (!(ad > max_abs) && ad < gate.r) continue;
      const int64_t i = v.start + k;
      if (ad > max_abs) {
        max_abs = ad;
        max_abs_index = i;
      }
      const uint64_t ba = BitsAt(v, v.a, v.ba, k);
      const uint64_t be = BitsAt(v, v.e, v.be, k);
      const uint64_t u =
          ulp_ready ? ulp_buf[k] : OrderedDistance(ba, be, sh.layout);
      if (gate.Admits(ad, u)) {
        const double abs_e = std::fabs(static_cast<double>(v.e[k]));
        acc.worst.Offer({{0, ad, u, i},
                         MakeDiff(i, v.a[k], v.e[k], ba, be, ad,
                                  RelDiff(ad, abs_e), u)});
        gate = acc.worst.TierZeroGate();
      }
    }
    acc.max_abs = max_abs;
    acc.max_abs_index = max_abs_index;
    col += n;
    if (col >= sh.cols) {
      row += col / sh.cols;
      col %= sh.cols;
    }
    return;
  }
  if (!abs_ready || !ulp_ready) {
    FillFastBuffers(v, sh.layout, abs_ready ? nullptr : abs_buf,
                    ulp_ready ? nullptr : ulp_buf);
  }
  double max_abs = acc.max_abs;
  int64_t max_abs_index = acc.max_abs_index;
  double max_rel = acc.max_rel;
  int64_t max_rel_index = acc.max_rel_index;
  const float* const bound = opt.error_bound;
  const bool sum_rule = tol.preset == TolerancePreset::kTorch ||
                        tol.preset == TolerancePreset::kNumpy ||
                        tol.preset == TolerancePreset::kExplicit;
  const int64_t cols = sh.cols;
  WorstHeap::Gate gate = acc.worst.TierZeroGate();
  for (int64_t k = 0; k < n; ++k) {
    const double ad = abs_buf[k];
    const double abs_e = std::fabs(static_cast<double>(v.e[k]));
    const int64_t i = v.start + k;
    if (ad > max_abs) {
      max_abs = ad;
      max_abs_index = i;
    }
    const double rel_floor = max_rel * abs_e;
    if (ad > rel_floor * kShrink || max_rel < 0 ||
        (rel_floor < 0x1p-1000 && rel_floor > 0)) {
      const double rel = RelDiff(ad, abs_e);
      if (rel > max_rel) {
        max_rel = rel;
        max_rel_index = i;
      }
    }
    const bool pass =
        sum_rule ? ad <= tol.atol + tol.rtol * abs_e
                 : FinitePairPasses(tol, ad, abs_e,
                                    bound != nullptr ? bound[i] : 0.0,
                                    ulp_buf[k]);
    if (!pass) RecordMismatch(acc, sh, i, col, row);
    if (gate.Admits(ad, ulp_buf[k])) {
      const uint64_t u = ulp_buf[k];
      acc.worst.Offer({{0, ad, u, i},
                       MakeDiff(i, v.a[k], v.e[k], BitsAt(v, v.a, v.ba, k),
                                BitsAt(v, v.e, v.be, k), ad,
                                RelDiff(ad, abs_e), u)});
      gate = acc.worst.TierZeroGate();
    }
    if (++col == cols) {
      col = 0;
      ++row;
    }
  }
  acc.max_abs = max_abs;
  acc.max_abs_index = max_abs_index;
  acc.max_rel = max_rel;
  acc.max_rel_index = max_rel_index;
}

// Which FastBlock form runs; see SetCompareKernelForTesting below.
std::atomic<int> g_kernel_mode{0};

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define TC_STATS_FUSED_AVX2 1

bool CpuHasAvx2() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return has;
}

// What the fused fp32 kernel reports for one block.
struct FusedF32Summary {
  double abs, sq, aa, ee, ae;  // the block sums, as pass 1 adds them
  double bmax;                 // largest |a-e|
  // Some element fails an atol/rtol rule or may raise max_rel.
  bool may_fail_or_raise_rel;
  int64_t bit_equal;
  uint32_t max_ulp;
  uint64_t ulp_sum;            // exact when max_ulp < 2^24
  int64_t c0, c1, c2;          // distances 0, 1 and 2
};

// (l0 + l1) + (l2 + l3): pass 1's final reduction.
__attribute__((target("avx2"))) inline double HSumAvx(__m256d x) {
  alignas(32) double t[4];
  _mm256_store_pd(t, x);
  return (t[0] + t[1]) + (t[2] + t[3]);
}

__attribute__((target("avx2"))) inline uint64_t LaneSumAvx2(__m256i x) {
  alignas(32) uint32_t w[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(w), x);
  uint64_t sum = 0;
  for (uint32_t q : w) sum += q;
  return sum;
}

// Passes 1 and 2 of FastBlock for fp32 tensors compared in fp32, fused so
// each block is read from memory once; n a multiple of 8. The double sums
// keep pass 1's lanes and order exactly (one 4-wide accumulator per sum
// whose lanes are pass 1's [s[0][0], s[0][1], s[1][0], s[1][1]], fed four
// consecutive elements at a time), so they are bitwise the same; no FMA.
// ULP distances use 32-bit lanes: d = |ma - mb| for equal signs, ma + mb
// otherwise (< 2^32 for finite values); each lane sums n/8 of them, exact
// while they stay below 2^24.
__attribute__((target("avx2"))) void FusedF32Avx2(
    const float* a, const float* e, int64_t n, double atol, double rtol,
    double rel0_shrunk, FusedF32Summary* out) {
  const __m256d abs_mask = _mm256_castsi256_pd(_mm256_set1_epi64x(INT64_MAX));
  const __m256d vatol = _mm256_set1_pd(atol);
  const __m256d vrtol = _mm256_set1_pd(rtol);
  const __m256d vrel = _mm256_set1_pd(rel0_shrunk);
  __m256d s_abs = _mm256_setzero_pd(), s_sq = s_abs, s_aa = s_abs,
          s_ee = s_abs, s_ae = s_abs, vmax = s_abs, flag = s_abs;
  const __m256i mag = _mm256_set1_epi32(0x7fffffff);
  const __m256i zero = _mm256_setzero_si256();
  const __m256i one = _mm256_set1_epi32(1), two = _mm256_set1_epi32(2);
  __m256i eq = zero, umax = zero, usum = zero, c0 = zero, c1 = zero,
          c2 = zero;
  for (int64_t k = 0; k < n; k += 8) {
    const __m256i xa =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + k));
    const __m256i xe =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(e + k));
    const __m256i ma = _mm256_and_si256(xa, mag);
    const __m256i mb = _mm256_and_si256(xe, mag);
    const __m256i same = _mm256_abs_epi32(_mm256_sub_epi32(ma, mb));
    const __m256i across = _mm256_add_epi32(ma, mb);
    // Selected by the sign bit of a ^ e: signs differ.
    const __m256i u = _mm256_castps_si256(_mm256_blendv_ps(
        _mm256_castsi256_ps(same), _mm256_castsi256_ps(across),
        _mm256_castsi256_ps(_mm256_xor_si256(xa, xe))));
    eq = _mm256_sub_epi32(eq, _mm256_cmpeq_epi32(xa, xe));
    umax = _mm256_max_epu32(umax, u);
    usum = _mm256_add_epi32(usum, u);
    c0 = _mm256_sub_epi32(c0, _mm256_cmpeq_epi32(u, zero));
    c1 = _mm256_sub_epi32(c1, _mm256_cmpeq_epi32(u, one));
    c2 = _mm256_sub_epi32(c2, _mm256_cmpeq_epi32(u, two));
    for (int h = 0; h < 8; h += 4) {
      const __m256d da = _mm256_cvtps_pd(_mm_loadu_ps(a + k + h));
      const __m256d de = _mm256_cvtps_pd(_mm_loadu_ps(e + k + h));
      const __m256d d = _mm256_sub_pd(da, de);
      const __m256d ad = _mm256_and_pd(d, abs_mask);
      const __m256d abs_e = _mm256_and_pd(de, abs_mask);
      s_abs = _mm256_add_pd(s_abs, ad);
      s_sq = _mm256_add_pd(s_sq, _mm256_mul_pd(d, d));
      s_aa = _mm256_add_pd(s_aa, _mm256_mul_pd(da, da));
      s_ee = _mm256_add_pd(s_ee, _mm256_mul_pd(de, de));
      s_ae = _mm256_add_pd(s_ae, _mm256_mul_pd(da, de));
      vmax = _mm256_max_pd(ad, vmax);
      // !(ad <= atol + rtol|e|), true on NaN like pass 1's test.
      const __m256d thr = _mm256_add_pd(vatol, _mm256_mul_pd(vrtol, abs_e));
      flag = _mm256_or_pd(flag, _mm256_cmp_pd(ad, thr, _CMP_NLE_UQ));
      flag = _mm256_or_pd(
          flag, _mm256_cmp_pd(ad, _mm256_mul_pd(vrel, abs_e), _CMP_GT_OQ));
    }
  }
  alignas(32) double t[4];
  // "+ 0.0": pass 1 adds its (here empty) scalar tail the same way.
  out->abs = HSumAvx(s_abs) + 0.0;
  out->sq = HSumAvx(s_sq) + 0.0;
  out->aa = HSumAvx(s_aa) + 0.0;
  out->ee = HSumAvx(s_ee) + 0.0;
  out->ae = HSumAvx(s_ae) + 0.0;
  _mm256_store_pd(t, vmax);
  out->bmax = std::max({t[0], t[1], t[2], t[3], 0.0});
  out->may_fail_or_raise_rel = _mm256_movemask_pd(flag) != 0;
  alignas(32) uint32_t w[8];
  out->bit_equal = static_cast<int64_t>(LaneSumAvx2(eq));
  out->ulp_sum = LaneSumAvx2(usum);
  out->c0 = static_cast<int64_t>(LaneSumAvx2(c0));
  out->c1 = static_cast<int64_t>(LaneSumAvx2(c1));
  out->c2 = static_cast<int64_t>(LaneSumAvx2(c2));
  _mm256_store_si256(reinterpret_cast<__m256i*>(w), umax);
  out->max_ulp = *std::max_element(w, w + 8);
}
#endif  // x86-64

// Passes 1 and 2 of FastBlock through FusedF32Avx2 for a finite block, and
// the commit of their results. Returns false, having changed nothing, when
// the kernel does not apply (no AVX2, a partial block, a tiny max_rel)
// or the block is not all finite / its sums overflow; *handled tells which.
bool FusedF32Block(ThreadAcc& acc, const Shared& sh,
                   const FastView<float>& v, int64_t& col, int64_t& row,
                   BlockSums& bs, double* abs_buf, uint64_t* ulp_buf,
                   bool* handled) {
  *handled = false;
#if defined(TC_STATS_FUSED_AVX2)
  const CompareOptions& opt = *sh.options;
  const int64_t n = v.n;
  const double rel0 = acc.max_rel;
  // The portable pass 1 keeps a tiny-product fallback for max_rel below
  // 2^-800; that rare case stays there.
  if (g_kernel_mode.load(std::memory_order_relaxed) != 0 || n % 8 != 0 ||
      (rel0 > 0 && rel0 < 0x1p-800) || !CpuHasAvx2()) {
    return false;
  }
  *handled = true;
  FusedF32Summary f;
  // rel0 * kShrink * |e| <= rel0 * |e| * (1 - 2^-51) with the two
  // roundings (no underflow: |e| >= 2^-149 or 0, rel0 >= 2^-800), so an
  // element whose quotient beats rel0 is still flagged.
  FusedF32Avx2(v.a, v.e, n, opt.tolerance.atol, opt.tolerance.rtol,
               rel0 * kShrink, &f);
  if (!std::isfinite(f.aa + f.ee + f.sq + f.abs)) return false;
  bs.abs = f.abs;
  bs.sq = f.sq;
  bs.aa = f.aa;
  bs.ee = f.ee;
  bs.ae = f.ae;
  bs.sigma2 = bs.sq_sigma = 0;
  bool abs_ready = false;
  if (opt.predicted_sigma != nullptr) {
    FillFastBuffers(v, sh.layout, abs_buf, nullptr);
    abs_ready = true;
    SigmaSums(opt.predicted_sigma + v.start, abs_buf, n, bs);
  }
  bool ulp_ready = false;
  if (f.max_ulp <= 4) {
    acc.hist[0][0] += f.c0;
    acc.hist[0][1] += f.c1;
    acc.hist[0][2] += f.c2;
    acc.hist[0][3] += n - f.c0 - f.c1 - f.c2;
    bs.ulp = static_cast<double>(f.ulp_sum);
  } else {
    // As FloatUlpPass: the distances, then their buckets, per element.
    FillFastBuffers(v, sh.layout, nullptr, ulp_buf);
    ulp_ready = true;
    int64_t hist[4][kHistBuckets] = {};
    uint64_t ulp_sum = 0;
    for (int64_t k = 0; k < n; ++k) {
      const uint64_t u = ulp_buf[k];
      ulp_sum += u;
      const int bucket = 64 - __builtin_clzll(((u - 1) << 1) | 1);
      ++hist[k & 3][u == 0 ? 0 : bucket];
    }
    for (int lane = 0; lane < 4; ++lane) {
      for (int q = 0; q < kHistBuckets; ++q) acc.hist[lane][q] += hist[lane][q];
    }
    bs.ulp = static_cast<double>(ulp_sum);
  }
  acc.max_ulp = std::max<uint64_t>(acc.max_ulp, f.max_ulp);
  acc.bit_equal += f.bit_equal;
  acc.finite += n;
  FinishFastBlock(acc, sh, v, col, row, abs_buf, ulp_buf, rel0,
                  f.may_fail_or_raise_rel, f.bmax, f.max_ulp, abs_ready,
                  ulp_ready);
  return true;
#else
  return false;
#endif
}

template <typename T>
bool FastBlock(ThreadAcc& acc, const Shared& sh, const FastView<T>& v,
               int64_t& col, int64_t& row, BlockSums& bs, double* abs_buf,
               uint64_t* ulp_buf) {
  if constexpr (std::is_same_v<T, float>) {
    bool handled;
    const bool ok =
        FusedF32Block(acc, sh, v, col, row, bs, abs_buf, ulp_buf, &handled);
    if (handled) return ok;
  }
  const CompareOptions& opt = *sh.options;
  const int64_t n = v.n;

  // Pass 1: sums, four independent lanes. A NaN or infinity in a or e
  // makes aa or ee non-finite. Also, without branches, what decides whether
  // pass 3 must look at the block at all: the block's largest abs diff,
  // its failures under an atol/rtol rule, and whether any element could
  // raise max_rel (rel > the max_rel so far, tested by multiplication).
  const Tolerance& tol = opt.tolerance;
  const double atol = tol.atol;
  const double rtol = tol.rtol;
  const double rel0 = acc.max_rel;
  // Two-wide vectors (SSE2 on x86-64, NEON on arm64) through GCC/Clang
  // vector extensions; lanes [0,1] take elements 4q, 4q+1 and [2,3] take
  // 4q+2, 4q+3, so the summation order is fixed by the block alone.
  typedef double V2 __attribute__((vector_size(16)));
  typedef int64_t I2 __attribute__((vector_size(16)));
  typedef float F2 __attribute__((vector_size(8)));
  auto load2 = [](const T* p) __attribute__((always_inline)) {
    if constexpr (std::is_same_v<T, float>) {
      F2 f;
      std::memcpy(&f, p, sizeof(f));
      return __builtin_convertvector(f, V2);
    } else {
      V2 d;
      std::memcpy(&d, p, sizeof(d));
      return d;
    }
  };
  const V2 zero = {0.0, 0.0};
  const I2 abs_mask = {INT64_MAX, INT64_MAX};
  V2 s_abs[2] = {zero, zero}, s_sq[2] = {zero, zero}, s_aa[2] = {zero, zero},
     s_ee[2] = {zero, zero}, s_ae[2] = {zero, zero}, vmax[2] = {zero, zero};
  I2 fails[2] = {}, rel_cand[2] = {};
  const V2 atol2 = {atol, atol}, rtol2 = {rtol, rtol}, rel02 = {rel0, rel0},
           shrink2 = {kShrink, kShrink}, tiny2 = {0x1p-1000, 0x1p-1000};
  // The tiny-product fallback of the max_rel test only matters when
  // rel0 * |e| can fall below 2^-1000 while rel0 > 0; fp32 values are at
  // least 2^-149 (or 0), so for them only a max_rel below 2^-800 needs it.
  const bool tiny_check =
      !std::is_same_v<T, float> || (rel0 > 0 && rel0 < 0x1p-800);
  auto pair_step = [&](int64_t idx, int h, auto with_tiny)
                       __attribute__((always_inline)) {
    const V2 a = load2(v.a + idx);
    const V2 e = load2(v.e + idx);
    const V2 d = a - e;
    const V2 ad = reinterpret_cast<V2>(reinterpret_cast<I2>(d) & abs_mask);
    const V2 abs_e = reinterpret_cast<V2>(reinterpret_cast<I2>(e) & abs_mask);
    std::memcpy(abs_buf + idx, &ad, sizeof(ad));
    s_abs[h] += ad;
    s_sq[h] += d * d;
    s_aa[h] += a * a;
    s_ee[h] += e * e;
    s_ae[h] += a * e;
    vmax[h] = ad > vmax[h] ? ad : vmax[h];
    fails[h] -= !(ad <= atol2 + rtol2 * abs_e);
    const V2 rf = rel02 * abs_e;
    if constexpr (decltype(with_tiny)::value) {
      rel_cand[h] |= (ad > rf * shrink2) | ((rf < tiny2) & (rf > zero));
    } else {
      rel_cand[h] |= ad > rf * shrink2;
    }
  };
  int64_t j = 0;
  if (tiny_check) {
    for (; j + 4 <= n; j += 4) {
      pair_step(j, 0, std::true_type());
      pair_step(j + 2, 1, std::true_type());
    }
  } else {
    for (; j + 4 <= n; j += 4) {
      pair_step(j, 0, std::false_type());
      pair_step(j + 2, 1, std::false_type());
    }
  }
  double t_abs = 0, t_sq = 0, t_aa = 0, t_ee = 0, t_ae = 0, t_max = 0;
  int64_t t_fails = 0;
  bool t_cand = false;
  for (; j < n; ++j) {  // last partial block only
    const double a = static_cast<double>(v.a[j]);
    const double e = static_cast<double>(v.e[j]);
    const double d = a - e;
    const double ad = std::fabs(d);
    const double abs_e = std::fabs(e);
    abs_buf[j] = ad;
    t_abs += ad;
    t_sq += d * d;
    t_aa += a * a;
    t_ee += e * e;
    t_ae += a * e;
    t_max = std::max(t_max, ad);
    t_fails += !(ad <= atol + rtol * abs_e);
    const double rf = rel0 * abs_e;
    t_cand |= (ad > rf * kShrink) || (rf < 0x1p-1000 && rf > 0);
  }
  auto hsum = [](const V2* x) { return (x[0][0] + x[0][1]) + (x[1][0] + x[1][1]); };
  bs.abs = hsum(s_abs) + t_abs;
  bs.sq = hsum(s_sq) + t_sq;
  bs.aa = hsum(s_aa) + t_aa;
  bs.ee = hsum(s_ee) + t_ee;
  bs.ae = hsum(s_ae) + t_ae;
  const double bmax = std::max({vmax[0][0], vmax[0][1], vmax[1][0], vmax[1][1],
                                t_max});
  const int64_t n_fails =
      fails[0][0] + fails[0][1] + fails[1][0] + fails[1][1] + t_fails;
  const bool any_rel_cand = (rel_cand[0][0] | rel_cand[0][1] | rel_cand[1][0] |
                             rel_cand[1][1]) != 0 ||
                            t_cand;
  if (!std::isfinite(bs.aa + bs.ee + bs.sq + bs.abs)) return false;
  bs.sigma2 = bs.sq_sigma = 0;
  if (opt.predicted_sigma != nullptr) {
    SigmaSums(opt.predicted_sigma + v.start, abs_buf, n, bs);
  }

  // Pass 2: ULP distances and their histogram.
  int64_t bit_equal = 0;
  uint64_t max_ulp = 0;
  const BitLayout& l = sh.layout;
  bool ulp_done = false;
  if constexpr (std::is_same_v<T, float>) {
    if (n % 4 == 0) {
      ulp_done = true;
      FloatUlpPass(v.a, v.e, n, ulp_buf, acc, bs, bit_equal, max_ulp);
    }
  }
  if (ulp_done) {
    // Done above.
  } else if (opt.compared_dtype != DType::kFloat64) {
    // Patterns of at most 32 bits: ordered ints and their differences fit
    // in int64, and a block's sum of distances in uint64.
    const int width = __builtin_ctzll(l.sign) + 1;
    uint64_t ulp_sum = 0;
    // Local counters: stores into `acc` could alias the buffers and force
    // reloads on every element.
    int64_t hist[4][kHistBuckets] = {};
    for (int64_t k = 0; k < n; ++k) {
      const uint64_t bits_a = BitsAt(v, v.a, v.ba, k);
      const uint64_t bits_e = BitsAt(v, v.e, v.be, k);
      const int64_t oa = OrderedInt(bits_a, width);
      const int64_t oe = OrderedInt(bits_e, width);
      const int64_t diff = oa - oe;
      const uint64_t u = static_cast<uint64_t>(diff < 0 ? -diff : diff);
      ulp_buf[k] = u;
      ulp_sum += u;
      max_ulp = std::max(max_ulp, u);
      bit_equal += bits_a == bits_e;
      // u < 2^33 here, so the bucket is the bit length of 2(u-1)+1.
      const int bucket = 64 - __builtin_clzll(((u - 1) << 1) | 1);
      ++hist[k & 3][u == 0 ? 0 : bucket];
    }
    for (int lane = 0; lane < 4; ++lane) {
      for (int q = 0; q < kHistBuckets; ++q) acc.hist[lane][q] += hist[lane][q];
    }
    bs.ulp = static_cast<double>(ulp_sum);
  } else {
    double ulp_sum = 0;
    for (int64_t k = 0; k < n; ++k) {
      const uint64_t bits_a = BitsAt(v, v.a, v.ba, k);
      const uint64_t bits_e = BitsAt(v, v.e, v.be, k);
      const uint64_t u = OrderedDistance(bits_a, bits_e, l);
      ulp_buf[k] = u;
      ulp_sum += static_cast<double>(u);
      max_ulp = std::max(max_ulp, u);
      bit_equal += bits_a == bits_e;
      ++acc.hist[k & 3][BucketIndex(u)];
    }
    bs.ulp = ulp_sum;
  }
  const uint64_t block_max_ulp = max_ulp;
  acc.max_ulp = std::max(acc.max_ulp, max_ulp);
  acc.bit_equal += bit_equal;
  acc.finite += n;

  FinishFastBlock(acc, sh, v, col, row, abs_buf, ulp_buf, rel0,
                  n_fails != 0 || any_rel_cand, bmax, block_max_ulp,
                  /*abs_ready=*/true, /*ulp_ready=*/true);
  return true;
}

void RunRange(const Shared& sh, int64_t first_block, int64_t last_block,
              ThreadAcc& acc) {
  const CompareOptions& opt = *sh.options;
  acc.start = first_block * kBlock;
  acc.end = std::min(last_block * kBlock, sh.total);
  int64_t col = acc.start % sh.cols;
  int64_t row = acc.start / sh.cols;
  const bool fp32_in_place = sh.actual->dtype() == DType::kFloat32 &&
                             sh.expected->dtype() == DType::kFloat32 &&
                             opt.compared_dtype == DType::kFloat32;

  // Fixed-size scratch, reused per block.
  std::vector<double> va(kBlock), ve(kBlock), abs_buf(kBlock);
  std::vector<uint64_t> ba(kBlock), be(kBlock), ulp_buf(kBlock);

  // Testing only: every block element by element.
  const bool slow_only = g_kernel_mode.load(std::memory_order_relaxed) == 2;

  for (int64_t b = first_block; b < last_block; ++b) {
    const int64_t start = b * kBlock;
    const int64_t n = std::min(kBlock, sh.total - start);
    BlockSums& bs = (*sh.blocks)[static_cast<size_t>(b)];
    if (fp32_in_place && !slow_only) {
      const FastView<float> fv{start, n, sh.actual->data<float>() + start,
                               sh.expected->data<float>() + start, nullptr,
                               nullptr};
      if (FastBlock(acc, sh, fv, col, row, bs, abs_buf.data(),
                    ulp_buf.data())) {
        continue;
      }
    }
    Decode(*sh.actual, start, n, va.data());
    Decode(*sh.expected, start, n, ve.data());
    ToBits(*sh.actual, start, n, va.data(), opt.compared_dtype, ba.data());
    ToBits(*sh.expected, start, n, ve.data(), opt.compared_dtype, be.data());
    if (!fp32_in_place && !slow_only) {
      const FastView<double> dv{start,     n,         va.data(),
                                ve.data(), ba.data(), be.data()};
      if (FastBlock(acc, sh, dv, col, row, bs, abs_buf.data(),
                    ulp_buf.data())) {
        continue;
      }
    }
    const BlockView view{start, n, va.data(), ve.data(), ba.data(), be.data()};
    SlowBlock(acc, sh, view, col, row, bs);
  }
}

absl::Status Validate(const Tensor& actual, const Tensor& expected,
                      const CompareOptions& o) {
  if (actual.numel() != expected.numel()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "compare: actual and expected must have the same number of "
        "elements; actual has ",
        actual.numel(), " ", ShapeString(actual.shape()), ", expected has ",
        expected.numel(), " ", ShapeString(expected.shape())));
  }
  return ValidateCompare(actual.numel(), expected.numel(), o);
}

}  // namespace

namespace stats_internal {
// Testing only, declared by the tests rather than the header. 0: Compare
// as in production; 1: without the fused AVX2 fp32 kernel (the portable
// vector passes run); 2: every block element by element (SlowBlock).
void SetCompareKernelForTesting(int mode) { g_kernel_mode.store(mode); }
}  // namespace stats_internal

uint64_t BitsIn(double v, DType dtype) {
  switch (dtype) {
    case DType::kFloat64:
      return DoubleBits(v);
    case DType::kFloat32:
      return FloatBits(static_cast<float>(v));
    case DType::kFloat16:
      return DoubleToFp16Bits(v);
    case DType::kBFloat16:
      return DoubleToBf16Bits(v);
  }
  return 0;
}

uint64_t UlpDistance(double a, double b, DType dtype) {
  return DistanceFromBits(BitsIn(a, dtype), BitsIn(b, dtype), LayoutOf(dtype));
}

absl::Status ValidateCompare(int64_t actual_numel, int64_t expected_numel,
                             const CompareOptions& o) {
  if (actual_numel != expected_numel) {
    return absl::InvalidArgumentError(absl::StrCat(
        "compare: actual and expected must have the same number of "
        "elements; actual has ",
        actual_numel, ", expected has ", expected_numel));
  }
  if (o.cols < 0 || (o.cols > 0 && actual_numel % o.cols != 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("compare: cols must be 0 or divide the element count ",
                     actual_numel, "; got ", o.cols));
  }
  if (o.top_k < 0 || o.top_k > kMaxTopK) {
    return absl::InvalidArgumentError(absl::StrCat(
        "compare: top_k must be in [0, ", kMaxTopK, "]; got ", o.top_k));
  }
  if (o.top_groups < 0 || o.top_groups > kMaxTopK) {
    return absl::InvalidArgumentError(
        absl::StrCat("compare: top_groups must be in [0, ", kMaxTopK,
                     "]; got ", o.top_groups));
  }
  if (o.threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "compare: threads must be >= 0 (0: one per core); got ", o.threads));
  }
  if (o.tolerance.preset == TolerancePreset::kBound &&
      o.error_bound == nullptr) {
    return absl::InvalidArgumentError(
        "compare: the bound tolerance needs a per-element error bound; none "
        "was given");
  }
  return absl::OkStatus();
}

int UlpHistogramBucket(uint64_t ulp) { return BucketIndex(ulp); }

ElementDiff DescribeElement(int64_t flat_index, double actual,
                            double expected, DType compared_dtype) {
  const uint64_t ba = BitsIn(actual, compared_dtype);
  const uint64_t be = BitsIn(expected, compared_dtype);
  const uint64_t ulp = DistanceFromBits(ba, be, LayoutOf(compared_dtype));
  double abs_diff, rel;
  if (std::isnan(actual) || std::isnan(expected)) {
    abs_diff = rel = std::numeric_limits<double>::quiet_NaN();
  } else if (!std::isfinite(actual) || !std::isfinite(expected)) {
    abs_diff = rel = actual == expected
                         ? 0.0
                         : std::numeric_limits<double>::infinity();
  } else {
    abs_diff = std::fabs(actual - expected);
    rel = RelDiff(abs_diff, std::fabs(expected));
  }
  return MakeDiff(flat_index, actual, expected, ba, be, abs_diff, rel, ulp);
}

std::vector<GroupCount> TopGroupCounts(const std::vector<int64_t>& counts,
                                       int limit, int64_t mismatched) {
  TopGroups top(limit);
  for (size_t i = 0; i < counts.size(); ++i) {
    top.Offer(static_cast<int64_t>(i), counts[i]);
  }
  return top.Take(mismatched);
}

DiffStats FinishDiffStats(int64_t total, const DiffTotals& t,
                          std::vector<ElementDiff> worst_candidates,
                          const CompareOptions& options) {
  DiffStats s;
  s.total = total;
  s.compared_dtype = options.compared_dtype;
  s.finite = t.finite;
  s.mismatched = t.mismatched;
  s.bitwise_equal_count = t.bitwise_equal;
  s.bitwise_equal = t.bitwise_equal == total;
  s.nan_actual = t.nan_actual;
  s.nan_expected = t.nan_expected;
  s.inf_actual = t.inf_actual;
  s.inf_expected = t.inf_expected;
  s.nan_mismatch = t.nan_mismatch;
  s.max_ulp = t.max_ulp;
  s.passed = t.mismatched == 0;
  s.max_abs = std::max(t.max_abs, 0.0);
  s.max_abs_index = t.max_abs_index;
  s.max_rel = std::max(t.max_rel, 0.0);
  s.max_rel_index = t.max_rel_index;

  const double inf = std::numeric_limits<double>::infinity();
  if (t.finite > 0) {
    s.mean_abs = t.sum_abs / static_cast<double>(t.finite);
    s.rms = std::sqrt(t.sum_sq / static_cast<double>(t.finite));
  }
  s.rel_l2 = t.sum_ee > 0 ? std::sqrt(t.sum_sq) / std::sqrt(t.sum_ee)
                          : (t.sum_sq > 0 ? inf : 0.0);
  if (t.sum_aa == 0 && t.sum_ee == 0) {
    s.cosine = 1;
  } else if (t.sum_aa == 0 || t.sum_ee == 0) {
    s.cosine = 0;
  } else {
    s.cosine = std::clamp(
        t.sum_ae / (std::sqrt(t.sum_aa) * std::sqrt(t.sum_ee)), -1.0, 1.0);
  }
  const int64_t ulp_finite = total - t.ulp_infinite;
  if (ulp_finite > 0) s.mean_ulp = t.sum_ulp / static_cast<double>(ulp_finite);
  for (int k = 0; k < kHistBuckets && k < static_cast<int>(t.ulp_histogram.size());
       ++k) {
    if (t.ulp_histogram[k] == 0) continue;
    UlpBucket b = BucketBounds(k);
    b.count = t.ulp_histogram[k];
    s.ulp_histogram.push_back(b);
  }
  if (t.ulp_infinite > 0) {
    s.ulp_histogram.push_back({kUlpInfinite, kUlpInfinite, t.ulp_infinite});
  }
  if (options.predicted_sigma != nullptr) {
    s.bound_ratio = t.sum_sigma2 > 0 ? std::sqrt(t.sum_sq_sigma / t.sum_sigma2)
                                     : (t.sum_sq_sigma > 0 ? inf : 0.0);
  }

  // `worst`: NaN against a number first, then by abs diff (NaN against NaN
  // as 0 with nan_equal, else +inf), ULP, lower index.
  auto key_of = [&](const ElementDiff& d) {
    const bool nan_a = std::isnan(d.actual), nan_e = std::isnan(d.expected);
    RankKey k;
    k.tier = nan_a != nan_e ? 1 : 0;
    k.r = (nan_a || nan_e) ? ((nan_a && nan_e && options.tolerance.nan_equal) ? 0.0 : inf)
                           : d.abs_diff;
    k.ulp = d.ulp;
    k.index = d.flat_index;
    return k;
  };
  std::sort(worst_candidates.begin(), worst_candidates.end(),
            [&](const ElementDiff& x, const ElementDiff& y) {
              return RanksAbove(key_of(x), key_of(y));
            });
  if (worst_candidates.size() > static_cast<size_t>(options.top_k)) {
    worst_candidates.resize(static_cast<size_t>(options.top_k));
  }
  s.worst = std::move(worst_candidates);
  return s;
}

absl::StatusOr<DiffStats> Compare(const Tensor& actual, const Tensor& expected,
                                  const CompareOptions& options) {
  absl::Status valid = Validate(actual, expected, options);
  if (!valid.ok()) return valid;

  const int64_t total = actual.numel();
  DiffStats s;
  s.total = total;
  s.compared_dtype = options.compared_dtype;
  s.bitwise_equal = true;
  s.cosine = 1;
  if (options.predicted_sigma != nullptr) s.bound_ratio = 0.0;
  if (total == 0) return s;

  const int64_t cols = options.cols == 0 ? total : options.cols;
  const int64_t num_blocks = (total + kBlock - 1) / kBlock;
  int64_t threads = options.threads;
  if (threads == 0) {
    threads = std::max(1u, std::thread::hardware_concurrency());
  }
  threads = std::min<int64_t>(
      {threads, kMaxThreads, std::max<int64_t>(1, total / kMinElementsPerThread),
       num_blocks});

  std::vector<BlockSums> blocks(static_cast<size_t>(num_blocks));
  Shared sh{&actual,      &expected, &options, LayoutOf(options.compared_dtype),
            total,        cols,      &blocks};
  // Threads take contiguous chunks of blocks, in order, from a shared
  // counter rather than one fixed share each: a thread that starts late or
  // shares its core with other work then does less, instead of the others
  // waiting for its share. Each chunk has its own accumulator and they
  // merge in chunk (= element) order, which gives the same result for any
  // split. Fewer, larger chunks for large top_k, whose lists each chunk
  // keeps.
  const int64_t chunks_per_thread = options.top_k <= 4096 ? 4 : 1;
  const int64_t chunks =
      threads == 1 ? 1 : std::min(num_blocks, threads * chunks_per_thread);
  std::vector<ThreadAcc> accs;
  accs.reserve(static_cast<size_t>(chunks));
  for (int64_t c = 0; c < chunks; ++c) accs.emplace_back(options.top_k);
  //
  // The caller waits for the chunks, not for the threads: a worker that
  // the scheduler starts late (both cores busy) would otherwise hold up
  // join() after the caller has done all the work. Workers are detached;
  // the queue is shared with them, and a worker touches the tensors and
  // accumulators only for a chunk it claimed, which the caller waits for.
  struct ChunkQueue {
    std::atomic<int64_t> next{0};
    std::mutex mu;
    std::condition_variable all_done;
    int64_t done = 0;  // guarded by mu
  };
  auto queue = std::make_shared<ChunkQueue>();
  const Shared* const shp = &sh;
  ThreadAcc* const acc_of = accs.data();
  auto work = [queue, shp, acc_of, num_blocks, chunks] {
    int64_t ran = 0;
    for (int64_t c = queue->next.fetch_add(1, std::memory_order_relaxed);
         c < chunks;
         c = queue->next.fetch_add(1, std::memory_order_relaxed)) {
      RunRange(*shp, num_blocks * c / chunks, num_blocks * (c + 1) / chunks,
               acc_of[c]);
      ++ran;
    }
    if (ran == 0) return;
    std::lock_guard<std::mutex> lock(queue->mu);
    queue->done += ran;
    if (queue->done == chunks) queue->all_done.notify_all();
  };
  for (int64_t t = 1; t < threads; ++t) {
    try {
      std::thread(work).detach();
    } catch (const std::system_error&) {
      break;  // no thread to be had: the caller takes the chunks
    }
  }
  work();
  {
    std::unique_lock<std::mutex> lock(queue->mu);
    queue->all_done.wait(lock, [&] { return queue->done == chunks; });
  }

  // Merge, in chunk (= element) order.
  DiffTotals totals;
  WorstHeap worst(options.top_k);
  for (ThreadAcc& a : accs) {
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
  CompensatedSum sum_abs, sum_sq, sum_aa, sum_ee, sum_ae, sum_ulp, sum_sigma2,
      sum_sq_sigma;
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
  std::vector<ElementDiff> worst_diffs;
  worst_diffs.reserve(worst.items().size());
  for (const Candidate& c : worst.items()) worst_diffs.push_back(c.diff);
  s = FinishDiffStats(total, totals, std::move(worst_diffs), options);

  if (s.mismatched > 0 && options.top_groups > 0) {
    // Columns: sum every thread's counts into one array.
    std::vector<int64_t> col_counts(static_cast<size_t>(cols), 0);
    for (const ThreadAcc& a : accs) {
      if (a.row_counts.empty()) continue;
      if (!a.col_by_offset) {
        for (int64_t c = 0; c < cols; ++c) {
          col_counts[static_cast<size_t>(c)] +=
              a.col_counts[static_cast<size_t>(c)];
        }
        continue;
      }
      int64_t c = a.start % cols;
      for (int64_t off = 0; off < a.end - a.start; ++off) {
        col_counts[static_cast<size_t>(c)] +=
            a.col_counts[static_cast<size_t>(off)];
        if (++c == cols) c = 0;
      }
    }
    s.top_columns = TopGroupCounts(col_counts, options.top_groups, s.mismatched);

    // Rows: chunks hold ascending, contiguous row ranges that overlap at
    // most in one boundary row, so a row is complete once a later chunk
    // starts past it.
    TopGroups top_rows(options.top_groups);
    int64_t pending_row = -1;
    int64_t pending_count = 0;
    for (const ThreadAcc& a : accs) {
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
    s.top_rows = top_rows.Take(s.mismatched);
  }
  return s;
}

}  // namespace tensorcheck
