// The fused fp32 kernel of Compare: passes 1 and 2 of FastBlock in one read
// of each block. This file alone is compiled with -mavx2 (CMakeLists.txt)
// and must only run where the CPU has AVX2; block_kernels_portable.cc
// checks that at run time and otherwise keeps to the portable passes.
//
// It includes nothing inline from elsewhere and uses no standard library
// templates (std::max and friends would be instantiated here with AVX2
// code, and the linker may keep that copy for the portable files too); its
// helpers are file-local.
#include <immintrin.h>

#include <cstdint>

#include "server/stats/internal/fused_f32_avx2.h"

namespace tensorcheck::internal {
namespace {

// (l0 + l1) + (l2 + l3): pass 1's final reduction.
inline double HSumAvx(__m256d x) {
  alignas(32) double t[4];
  _mm256_store_pd(t, x);
  return (t[0] + t[1]) + (t[2] + t[3]);
}

inline uint64_t LaneSumAvx2(__m256i x) {
  alignas(32) uint32_t w[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(w), x);
  uint64_t sum = 0;
  for (uint32_t q : w) sum += q;
  return sum;
}

}  // namespace

// The double sums keep pass 1's lanes and order exactly (one 4-wide
// accumulator per sum whose lanes are pass 1's [s[0][0], s[0][1], s[1][0],
// s[1][1]], fed four consecutive elements at a time), so they are bitwise
// the same; no FMA (hence -ffp-contract=off for this file). ULP distances
// use 32-bit lanes: d = |ma - mb| for equal signs, ma + mb otherwise
// (< 2^32 for finite values); each lane sums n/8 of them, exact while they
// stay below 2^24.
void FusedF32Avx2(const float* a, const float* e, int64_t n, double atol, double rtol,
                  double rel0_shrunk, FusedF32Summary* out) {
  const __m256d abs_mask = _mm256_castsi256_pd(_mm256_set1_epi64x(INT64_MAX));
  const __m256d vatol = _mm256_set1_pd(atol);
  const __m256d vrtol = _mm256_set1_pd(rtol);
  const __m256d vrel = _mm256_set1_pd(rel0_shrunk);
  __m256d s_abs = _mm256_setzero_pd(), s_sq = s_abs, s_aa = s_abs, s_ee = s_abs, s_ae = s_abs,
          vmax = s_abs, flag = s_abs;
  const __m256i mag = _mm256_set1_epi32(0x7fffffff);
  const __m256i zero = _mm256_setzero_si256();
  const __m256i one = _mm256_set1_epi32(1), two = _mm256_set1_epi32(2);
  __m256i eq = zero, umax = zero, usum = zero, c0 = zero, c1 = zero, c2 = zero;
  for (int64_t k = 0; k < n; k += 8) {
    const __m256i xa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + k));
    const __m256i xe = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(e + k));
    const __m256i ma = _mm256_and_si256(xa, mag);
    const __m256i mb = _mm256_and_si256(xe, mag);
    const __m256i same = _mm256_abs_epi32(_mm256_sub_epi32(ma, mb));
    const __m256i across = _mm256_add_epi32(ma, mb);
    // Selected by the sign bit of a ^ e: signs differ.
    const __m256i u =
        _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(same), _mm256_castsi256_ps(across),
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
      flag = _mm256_or_pd(flag, _mm256_cmp_pd(ad, _mm256_mul_pd(vrel, abs_e), _CMP_GT_OQ));
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
  // The first largest of {t[0..3], 0.0}, as std::max({...}) picks it.
  const double candidates[5] = {t[0], t[1], t[2], t[3], 0.0};
  double bmax = candidates[0];
  for (int q = 1; q < 5; ++q) {
    if (bmax < candidates[q]) bmax = candidates[q];
  }
  out->bmax = bmax;
  out->may_fail_or_raise_rel = _mm256_movemask_pd(flag) != 0;
  alignas(32) uint32_t w[8];
  out->bit_equal = static_cast<int64_t>(LaneSumAvx2(eq));
  out->ulp_sum = LaneSumAvx2(usum);
  out->c0 = static_cast<int64_t>(LaneSumAvx2(c0));
  out->c1 = static_cast<int64_t>(LaneSumAvx2(c1));
  out->c2 = static_cast<int64_t>(LaneSumAvx2(c2));
  _mm256_store_si256(reinterpret_cast<__m256i*>(w), umax);
  uint32_t max_ulp = w[0];
  for (int q = 1; q < 8; ++q) {
    if (max_ulp < w[q]) max_ulp = w[q];
  }
  out->max_ulp = max_ulp;
}

}  // namespace tensorcheck::internal
