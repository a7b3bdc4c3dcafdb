// The portable kernels of Compare for all-finite blocks (FastBlock) and
// the run-time dispatch to the AVX2 kernel (block_kernels_avx2.cc).
//
// FastBlock runs three passes over a block: sums (two-wide vectors through
// GCC/Clang vector extensions: SSE2 on x86-64, NEON on arm64), ULP
// distances and their histogram, then in element order what depends on the
// order (maxima, tolerance, the worst list), skipped when the first passes
// show that nothing in the block can change it. For fp32 compared in fp32
// on a CPU with AVX2, FusedF32Avx2 does the first two passes in one read
// with bitwise the same results; on any other CPU (or when the build has no
// AVX2 file) the portable passes run.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "core/float_formats.h"
#include "server/stats/internal/block_kernels.h"
#include "server/stats/tolerance.h"

#if defined(TC_STATS_AVX2_KERNEL)
#include "server/stats/internal/fused_f32_avx2.h"
#endif

namespace tensorcheck::internal {
namespace {

// Which kernels run; see SetCompareKernelForTesting.
std::atomic<int> g_kernel_mode{0};

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

// Pass 2 of FastBlock for fp32 tensors compared in fp32, four lanes at a
// time (n a multiple of 4): ULP distances into `ulp_buf`, their sum into
// bs.ulp, the histogram (vector counts when the block's distances are all
// <= 4, the common case of close outputs; per element otherwise).
void FloatUlpPass(const float* a, const float* e, int64_t n, uint64_t* ulp_buf, ChunkAcc& acc,
                  BlockSums& bs, int64_t& bit_equal, uint64_t& max_ulp) {
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
    const I4 oa =
        xa < zero ? reinterpret_cast<I4>(reinterpret_cast<U4>(min) - reinterpret_cast<U4>(xa)) : xa;
    const I4 oe =
        xe < zero ? reinterpret_cast<I4>(reinterpret_cast<U4>(min) - reinterpret_cast<U4>(xe)) : xe;
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
  auto sum4 = [](const I4& x) { return int64_t{x[0]} + x[1] + x[2] + x[3]; };
  bit_equal += sum4(eq);
  const uint32_t block_max = std::max(std::max(vmax[0], vmax[1]), std::max(vmax[2], vmax[3]));
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

template <typename T>
inline uint64_t BitsAt(const FastView<T>& v, const T* values, const uint64_t* bits, int64_t k) {
  if constexpr (std::is_same_v<T, float>) {
    return FloatBits(values[k]);
  } else {
    return bits[k];
  }
}

// |a-e| and ULP distances of a finite block, element by element: the same
// values the vector passes produce. Either output may be null.
template <typename T>
void FillFastBuffers(const FastView<T>& v, const BitLayout& l, double* abs_buf, uint64_t* ulp_buf) {
  if (abs_buf != nullptr) {
    for (int64_t k = 0; k < v.n; ++k) {
      abs_buf[k] = std::fabs(static_cast<double>(v.a[k]) - static_cast<double>(v.e[k]));
    }
  }
  if (ulp_buf != nullptr) {
    for (int64_t k = 0; k < v.n; ++k) {
      ulp_buf[k] = OrderedDistance(BitsAt(v, v.a, v.ba, k), BitsAt(v, v.e, v.be, k), l);
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
void FinishFastBlock(ChunkAcc& acc, const CompareContext& sh, const FastView<T>& v, int64_t& col,
                     int64_t& row, double* abs_buf, uint64_t* ulp_buf, double rel0,
                     bool may_fail_or_raise_rel, double bmax, uint64_t block_max_ulp,
                     bool abs_ready, bool ulp_ready) {
  const CompareOptions& opt = *sh.options;
  const Tolerance& tol = opt.tolerance;
  const int64_t n = v.n;
  // Pass 3: in element order, everything that depends on it; skipped when
  // pass 1 showed that nothing in the block can change it.
  const bool sum_rule_preset = tol.preset == TolerancePreset::kTorch ||
                               tol.preset == TolerancePreset::kNumpy ||
                               tol.preset == TolerancePreset::kExplicit;
  const bool scan = !sum_rule_preset || rel0 < 0 || may_fail_or_raise_rel || bmax > acc.max_abs ||
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
      const double ad = abs_ready
                            ? abs_buf[k]
                            : std::fabs(static_cast<double>(v.a[k]) - static_cast<double>(v.e[k]));
      if (!(ad > max_abs) && ad < gate.r) continue;
      const int64_t i = v.start + k;
      if (ad > max_abs) {
        max_abs = ad;
        max_abs_index = i;
      }
      const uint64_t ba = BitsAt(v, v.a, v.ba, k);
      const uint64_t be = BitsAt(v, v.e, v.be, k);
      const uint64_t u = ulp_ready ? ulp_buf[k] : OrderedDistance(ba, be, sh.layout);
      if (gate.Admits(ad, u)) {
        const double abs_e = std::fabs(static_cast<double>(v.e[k]));
        acc.worst.Offer(
            {{0, ad, u, i}, MakeDiff(i, v.a[k], v.e[k], ba, be, ad, RelDiff(ad, abs_e), u)});
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
    FillFastBuffers(v, sh.layout, abs_ready ? nullptr : abs_buf, ulp_ready ? nullptr : ulp_buf);
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
    if (ad > rel_floor * kShrink || max_rel < 0 || (rel_floor < 0x1p-1000 && rel_floor > 0)) {
      const double rel = RelDiff(ad, abs_e);
      if (rel > max_rel) {
        max_rel = rel;
        max_rel_index = i;
      }
    }
    const bool pass =
        sum_rule ? ad <= tol.atol + tol.rtol * abs_e
                 : FinitePairPasses(tol, ad, abs_e, bound != nullptr ? bound[i] : 0.0, ulp_buf[k]);
    if (!pass) RecordMismatch(acc, sh, i, col, row);
    if (gate.Admits(ad, ulp_buf[k])) {
      const uint64_t u = ulp_buf[k];
      acc.worst.Offer({{0, ad, u, i},
                       MakeDiff(i, v.a[k], v.e[k], BitsAt(v, v.a, v.ba, k), BitsAt(v, v.e, v.be, k),
                                ad, RelDiff(ad, abs_e), u)});
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

#if defined(TC_STATS_AVX2_KERNEL)
// Whether this CPU runs block_kernels_avx2.cc, asked once.
bool CpuHasAvx2() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return has;
}
#endif

// Passes 1 and 2 of FastBlock through FusedF32Avx2 for a finite block, and
// the commit of their results. Returns false, having changed nothing, when
// the kernel does not apply (no AVX2, a partial block, a tiny max_rel)
// or the block is not all finite / its sums overflow; *handled tells which.
bool FusedF32Block(ChunkAcc& acc, const CompareContext& sh, const FastView<float>& v, int64_t& col,
                   int64_t& row, BlockSums& bs, double* abs_buf, uint64_t* ulp_buf, bool* handled) {
  *handled = false;
#if defined(TC_STATS_AVX2_KERNEL)
  const CompareOptions& opt = *sh.options;
  const int64_t n = v.n;
  const double rel0 = acc.max_rel;
  // The portable pass 1 keeps a tiny-product fallback for max_rel below
  // 2^-800; that rare case stays there.
  if (CompareKernelMode() != 0 || n % 8 != 0 || (rel0 > 0 && rel0 < 0x1p-800) || !CpuHasAvx2()) {
    return false;
  }
  *handled = true;
  FusedF32Summary f;
  // rel0 * kShrink * |e| <= rel0 * |e| * (1 - 2^-51) with the two
  // roundings (no underflow: |e| >= 2^-149 or 0, rel0 >= 2^-800), so an
  // element whose quotient beats rel0 is still flagged.
  FusedF32Avx2(v.a, v.e, n, opt.tolerance.atol, opt.tolerance.rtol, rel0 * kShrink, &f);
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
  FinishFastBlock(acc, sh, v, col, row, abs_buf, ulp_buf, rel0, f.may_fail_or_raise_rel, f.bmax,
                  f.max_ulp, abs_ready, ulp_ready);
  return true;
#else
  return false;
#endif
}

}  // namespace

template <typename T>
bool FastBlock(ChunkAcc& acc, const CompareContext& sh, const FastView<T>& v, int64_t& col,
               int64_t& row, BlockSums& bs, double* abs_buf, uint64_t* ulp_buf) {
  if constexpr (std::is_same_v<T, float>) {
    bool handled;
    const bool ok = FusedF32Block(acc, sh, v, col, row, bs, abs_buf, ulp_buf, &handled);
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
  const bool tiny_check = !std::is_same_v<T, float> || (rel0 > 0 && rel0 < 0x1p-800);
  auto pair_step = [&](int64_t idx, int h, auto with_tiny) __attribute__((always_inline)) {
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
  const double bmax = std::max({vmax[0][0], vmax[0][1], vmax[1][0], vmax[1][1], t_max});
  const int64_t n_fails = fails[0][0] + fails[0][1] + fails[1][0] + fails[1][1] + t_fails;
  const bool any_rel_cand =
      (rel_cand[0][0] | rel_cand[0][1] | rel_cand[1][0] | rel_cand[1][1]) != 0 || t_cand;
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

  FinishFastBlock(acc, sh, v, col, row, abs_buf, ulp_buf, rel0, n_fails != 0 || any_rel_cand, bmax,
                  block_max_ulp,
                  /*abs_ready=*/true, /*ulp_ready=*/true);
  return true;
}

template bool FastBlock<float>(ChunkAcc&, const CompareContext&, const FastView<float>&, int64_t&,
                               int64_t&, BlockSums&, double*, uint64_t*);
template bool FastBlock<double>(ChunkAcc&, const CompareContext&, const FastView<double>&, int64_t&,
                                int64_t&, BlockSums&, double*, uint64_t*);

int CompareKernelMode() { return g_kernel_mode.load(std::memory_order_relaxed); }

void SetCompareKernelForTesting(int mode) { g_kernel_mode.store(mode); }

}  // namespace tensorcheck::internal
