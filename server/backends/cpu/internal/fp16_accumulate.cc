#include "server/backends/cpu/internal/fp16_accumulate.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <system_error>
#include <thread>
#include <vector>

#include "core/float_formats.h"
#include "core/status_macros.h"
#include "server/backends/cpu/internal/allocate.h"
#include "server/backends/cpu/internal/avx2_dispatch.h"
#include "server/backends/cpu/internal/split_rows.h"

namespace tensorcheck::internal {
namespace {

// fp16acc's slices: about 30 ms of the AVX2 kernel on one core.
constexpr int64_t kFp16AccSliceMacs = int64_t{1} << 27;

// ---- fp16acc

// Rounds a double to the nearest fp16 value (ties to even; overflow to
// infinity; NaN stays NaN), kept as a double. A bit-level version of
// DoubleToFp16Bits for the O(mnk) inner loop.
inline double RoundToHalfValue(double s) {
  uint64_t a = DoubleBits(s);
  const uint64_t sign = a & 0x8000000000000000ull;
  a ^= sign;
  double r;
  if (a >= 0x40EFFE0000000000ull) {           // |s| >= 65520 (the tie above 65504)
    if (a > 0x7FF0000000000000ull) return s;  // NaN
    r = std::numeric_limits<double>::infinity();
  } else if (a < 0x3F10000000000000ull) {  // |s| < 2^-14: quantum 2^-24
    // ulp(2^28) is 2^-24, so adding and removing 2^28 rounds to a multiple
    // of 2^-24 in the current (nearest-even) rounding mode.
    r = (BitsToDouble(a) + 0x1p28) - 0x1p28;
  } else {
    // Keep 10 of the 52 mantissa bits, ties to even; a carry into the
    // exponent is the correct result.
    a += (uint64_t{1} << 41) - 1 + ((a >> 42) & 1);
    a &= ~((uint64_t{1} << 42) - 1);
    r = BitsToDouble(a);
  }
  return sign != 0 ? -r : r;
}

// acc[i, j] = fp16(... fp16(fp16(0 + x_i0 w_j0) + x_i1 w_j1) ...), k
// ascending, each multiply-add exact in double and rounded once to fp16.
// Each element is one serial chain of roundings; several columns advance
// together so that the chains overlap in the pipeline.
//
// The portable path, and the definition the vectorised path below is
// checked against bit for bit.
void Fp16AccumulateRowsScalar(const float* x, const float* w, WeightLayout layout,
                              int64_t row_begin, int64_t row_end, int64_t n, int64_t k, float* acc,
                              int64_t ldc) {
  constexpr int64_t kCols = 8;
  for (int64_t i = row_begin; i < row_end; ++i) {
    const float* xi = x + i * k;
    float* ci = acc + i * ldc;
    if (layout == WeightLayout::kOutIn) {
      for (int64_t j0 = 0; j0 < n; j0 += kCols) {
        const int64_t cols = std::min(kCols, n - j0);
        double s[kCols] = {};
        for (int64_t kk = 0; kk < k; ++kk) {
          const double xv = xi[kk];
          for (int64_t c = 0; c < cols; ++c) {
            s[c] = RoundToHalfValue(s[c] + xv * static_cast<double>(w[(j0 + c) * k + kk]));
          }
        }
        for (int64_t c = 0; c < cols; ++c) ci[j0 + c] = static_cast<float>(s[c]);
      }
    } else {
      // IN_OUT: sweep k outside so the weight rows are read contiguously;
      // each element still accumulates in k-ascending order.
      std::fill(ci, ci + n, 0.0f);
      for (int64_t kk = 0; kk < k; ++kk) {
        const double xv = xi[kk];
        const float* wk = w + kk * n;
        for (int64_t j = 0; j < n; ++j) {
          ci[j] = static_cast<float>(
              RoundToHalfValue(static_cast<double>(ci[j]) + xv * static_cast<double>(wk[j])));
        }
      }
    }
  }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define TC_FP16ACC_AVX2 1

// ---- fp16acc, AVX2 + FMA (selected at run time: UseAvx2Kernel).
//
// Bitwise the scalar path's results, four output columns per register, a
// 4 x 12 tile of accumulators per register block, the weight packed once
// into 12-column panels and blocked for the caches (k in blocks of 256
// steps; every accumulator still sees k ascending). Per step:
//
//   s = fma(x, w, acc)   x*w is exact in double (two 11-bit significands
//                        give 22 bits, magnitudes >= 2^-48), so the fused
//                        multiply-add rounds exactly as `acc + x*w` does.
//   r = fp16(s)          RNE to fp16, below, branch-free.
//
// Why a double sum is enough (the scalar path and the tests' reference sum
// in double too, so this only backs the claim that the result is the
// exactly-rounded fp16(acc + x*w)): let p = x*w, an integer times 2^e with
// under 22 bits, so its last bit is > |p| 2^-22; acc is an fp16 value, last
// bit >= 2^-24 and > |acc| 2^-11. Two multiples of q whose sum is below
// 2^53 q add exactly. If |p| >= |acc|, that fails only for |p| >= 2^28,
// where both the exact and the double sum exceed 65520 and give infinity.
// If |acc| > |p|, it fails only for |p| < 2^-30 |acc|: the exact sum and its
// double rounding are then both within 2^-29 |acc| of the fp16 value acc,
// while the nearest fp16 midpoint is at least 2^-12 |acc| away, so both
// round to acc. No tie is ever created or broken by the double sum.
//
// fp16(s), RNE:
//   E = max(exponent(s), -14); C = 1.5 * 2^(E+42);  r = (s + C) - C
// For |s| < 2^(E+1), s + C lies inside [2^(E+42), 2^(E+43)), whose ulp is
// 2^(E-10), whatever the sign of s: one RNE rounding of s to 11 significant
// bits (to the 2^-24 quantum in fp16's subnormal range, E = -14), carries
// included; C is an even multiple of that ulp (3 * 2^51 of them), so ties
// go to even as for s itself. The subtraction is exact. C is built from
// the exponent field of s (a power of two) clamped below by a max, then
// one integer add: +42 in the exponent field and the top fraction bit. For
// s = inf/NaN the add wraps into a tiny negative C, which leaves inf and NaN
// as they are (NaN keeps its bits). x - x is +0, so r is +0 where
// RoundToHalfValue gives -0 (s in [-2^-25, -0]): ORing the sign of s back
// in fixes that (a no-op for every other r, whose sign is already that of
// s); see Fp16AccStep for when that is needed.
// Overflow: every r on the fp16 grid is <= 65504 = (2 - 2^-10) 2^15, and
// anything that rounds past it is >= 2^16; r * 2^1008 is then finite iff
// |r| <= 65504, and * 2^-1008 undoes the scaling exactly. Result: +-inf for
// |s| >= 65520 (the tie above 65504 goes to even, 2^16).

#define TC_AVX2_TARGET __attribute__((target("avx2,fma")))

struct Fp16AccConsts {
  __m256d sign, exp, min_normal, big, small;
  __m256i magic;
};

TC_AVX2_TARGET inline Fp16AccConsts MakeFp16AccConsts() {
  Fp16AccConsts c;
  c.sign = _mm256_castsi256_pd(_mm256_set1_epi64x(static_cast<long long>(0x8000000000000000ull)));
  c.exp = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7FF0000000000000ll));
  c.min_normal = _mm256_set1_pd(0x1p-14);
  c.big = _mm256_set1_pd(0x1p1008);
  c.small = _mm256_set1_pd(0x1p-1008);
  // Exponent + 42, and the top fraction bit: 2^E -> 1.5 * 2^(E+42).
  c.magic = _mm256_set1_epi64x((int64_t{42} << 52) | (int64_t{1} << 51));
  return c;
}

// fp16(acc + x*w), RNE, as above. kOverflow = false leaves out the two
// multiplies that turn |s| >= 65520 into infinity: only for steps where
// |s| < 65520 is known (see Fp16AccNoOverflow). kSignedZero = false leaves
// out the two operations that give -0 where the sum rounds to zero from
// below: the result then differs from RoundToHalfValue's only in the sign
// of a zero, which changes no later nonzero sum (+-0 + p is p for p != 0,
// and a zero sum rounds to zero either way), so only accumulators that end
// at zero can differ; Fp16AccTile redoes a tile that ends with any.
template <bool kOverflow, bool kSignedZero>
TC_AVX2_TARGET __attribute__((always_inline)) inline __m256d Fp16AccStep(__m256d x, __m256d w,
                                                                         __m256d acc,
                                                                         const Fp16AccConsts& k) {
  const __m256d s = _mm256_fmadd_pd(x, w, acc);
  const __m256d e = _mm256_max_pd(_mm256_and_pd(s, k.exp), k.min_normal);
  const __m256d c = _mm256_castsi256_pd(_mm256_add_epi64(_mm256_castpd_si256(e), k.magic));
  __m256d r = _mm256_sub_pd(_mm256_add_pd(s, c), c);
  if (kOverflow) r = _mm256_mul_pd(_mm256_mul_pd(r, k.big), k.small);
  if (kSignedZero) r = _mm256_or_pd(r, _mm256_and_pd(s, k.sign));
  return r;
}

// Register tile: kMr rows x kNv*4 columns.
constexpr int kFp16AccMr = 4;
constexpr int kFp16AccNv = 3;
constexpr int64_t kFp16AccNr = 4 * kFp16AccNv;
// Cache blocks: kKc steps of a kNc-column slice of the packed weight
// (kKc * kNc * 4 bytes = 288 KiB) stay in L2 while a thread's rows sweep
// over them; the row tile's inputs (kMr * kKc doubles) stay in L1.
constexpr int64_t kFp16AccKc = 256;
constexpr int64_t kFp16AccNc = 24 * kFp16AccNr;

// One register tile over steps [pc, pc + kc): xp is the packed input
// (xp[kk * kMr + r]), wp the packed weight panel at step pc
// (wp[kk * kNr + c]), c the tile's top-left accumulator in acc (row stride
// n), rows x cols of it valid. first: start from zero, else continue from
// the values in acc (fp16 values, exact in fp32). Without kSignedZero,
// returns false and leaves acc as it was if any accumulator ends at +-0
// (whose sign may then be wrong; see Fp16AccStep).
template <bool kOverflow, bool kSignedZero>
TC_AVX2_TARGET bool Fp16AccTile(const double* xp, const float* wp, int64_t kc, float* c, int64_t n,
                                int64_t rows, int64_t cols, bool first) {
  constexpr int kMr = kFp16AccMr;
  constexpr int kNv = kFp16AccNv;
  const Fp16AccConsts k = MakeFp16AccConsts();
  const bool full = rows == kMr && cols == kFp16AccNr;
  float tmp[kMr][kFp16AccNr] = {};
  __m256d t[kMr][kNv];
#pragma GCC unroll 8
  for (int r = 0; r < kMr; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < kNv; ++v) {
      if (first) {
        t[r][v] = _mm256_setzero_pd();
      } else if (full) {
        t[r][v] = _mm256_cvtps_pd(_mm_loadu_ps(c + r * n + 4 * v));
      } else {
        for (int64_t j = 0; j < 4; ++j) {
          if (r < rows && 4 * v + j < cols) tmp[r][4 * v + j] = c[r * n + 4 * v + j];
        }
        t[r][v] = _mm256_cvtps_pd(_mm_loadu_ps(&tmp[r][4 * v]));
      }
    }
  }
  // The r and v loops unroll fully, so that the tile stays in registers.
  for (int64_t kk = 0; kk < kc; ++kk) {
    __m256d w[kNv];
#pragma GCC unroll 8
    for (int v = 0; v < kNv; ++v)
      w[v] = _mm256_cvtps_pd(_mm_loadu_ps(wp + kk * kFp16AccNr + 4 * v));
#pragma GCC unroll 8
    for (int r = 0; r < kMr; ++r) {
      const __m256d xb = _mm256_broadcast_sd(xp + kk * kMr + r);
#pragma GCC unroll 8
      for (int v = 0; v < kNv; ++v)
        t[r][v] = Fp16AccStep<kOverflow, kSignedZero>(xb, w[v], t[r][v], k);
    }
  }
  if (!kSignedZero) {
    // Padding lanes hold 0 * 0 sums: only valid rows and columns count.
    __m256d zero = _mm256_setzero_pd();
    const __m256i lane = _mm256_setr_epi64x(0, 1, 2, 3);
#pragma GCC unroll 8
    for (int r = 0; r < kMr; ++r) {
      if (r >= rows) break;
#pragma GCC unroll 8
      for (int v = 0; v < kNv; ++v) {
        const __m256d valid =
            _mm256_castsi256_pd(_mm256_cmpgt_epi64(_mm256_set1_epi64x(cols - 4 * v), lane));
        zero = _mm256_or_pd(
            zero, _mm256_and_pd(valid, _mm256_cmp_pd(t[r][v], _mm256_setzero_pd(), _CMP_EQ_OQ)));
      }
    }
    if (_mm256_movemask_pd(zero) != 0) return false;
  }
  // Values are fp16 (or inf/NaN): the narrowing is exact.
#pragma GCC unroll 8
  for (int r = 0; r < kMr; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < kNv; ++v) {
      if (full) {
        _mm_storeu_ps(c + r * n + 4 * v, _mm256_cvtpd_ps(t[r][v]));
      } else {
        _mm_storeu_ps(&tmp[r][4 * v], _mm256_cvtpd_ps(t[r][v]));
        for (int64_t j = 0; j < 4; ++j) {
          if (r < rows && 4 * v + j < cols) c[r * n + 4 * v + j] = tmp[r][4 * v + j];
        }
      }
    }
  }
  return true;
}

// |v| for a bound, NaN counted as infinity.
inline double BoundAbs(double v) {
  return v != v ? std::numeric_limits<double>::infinity() : std::fabs(v);
}

// Whether kc steps from accumulators bounded by a0 in magnitude, with
// products bounded by p, keep every |acc + x*w| below 65520, so that no
// step can overflow. By induction |acc_t| <= (a0 + t (p + 2^-24)) (1 +
// 2^-11)^t, and every |acc_t + x*w| is below the bound for t + 1: a step
// adds at most p, and fp16 rounding grows a magnitude by at most a factor
// 1 + 2^-11 (normal range) or by at most 2^-25 (subnormal range). For
// kc <= 256, (1 + 2^-11)^kc < 1.14, so the 1.25 margin keeps the bound
// under 65504 (also covering the rounding of this double expression).
// Infinite or NaN bounds fail the test.
inline bool Fp16AccNoOverflow(double a0, double p, int64_t kc) {
  static_assert(kFp16AccKc <= 256, "the 1.25 margin assumes kc <= 256");
  return (a0 + static_cast<double>(kc) * (p + 0x1p-24)) * 1.25 < 65504.0;
}

// One tile (see Fp16AccTile), with the overflow handling left out when
// Fp16AccNoOverflow proves it unnecessary. p bounds |x*w| over the tile's
// inputs and panel columns for these steps.
TC_AVX2_TARGET void Fp16AccTileChecked(const double* xp, const float* wp, int64_t kc, float* c,
                                       int64_t n, int64_t rows, int64_t cols, bool first,
                                       double p) {
  double a0 = 0.0;
  if (!first) {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < cols; ++j) a0 = std::max(a0, BoundAbs(c[r * n + j]));
    }
  }
  if (Fp16AccNoOverflow(a0, p, kc)) {
    if (!Fp16AccTile<false, false>(xp, wp, kc, c, n, rows, cols, first))
      Fp16AccTile<false, true>(xp, wp, kc, c, n, rows, cols, first);
  } else {
    if (!Fp16AccTile<true, false>(xp, wp, kc, c, n, rows, cols, first))
      Fp16AccTile<true, true>(xp, wp, kc, c, n, rows, cols, first);
  }
}

// Rows [row_begin, row_end) with the packed weight (see
// PackFp16AccWeight).
TC_AVX2_TARGET void Fp16AccumulateRowsAvx2(const float* x, const float* wpack, const double* wmax,
                                           int64_t row_begin, int64_t row_end, int64_t n, int64_t k,
                                           float* acc, int64_t ldc, const StopSignal* stop) {
  constexpr int64_t kMr = kFp16AccMr;
  constexpr int64_t kNr = kFp16AccNr;
  if (k == 0) {
    for (int64_t i = row_begin; i < row_end; ++i) std::fill(acc + i * ldc, acc + i * ldc + n, 0.0f);
    return;
  }
  const int64_t chunks = (k + kFp16AccKc - 1) / kFp16AccKc;
  alignas(32) double xp[kFp16AccKc * kMr];
  for (int64_t jc = 0; jc < n; jc += kFp16AccNc) {
    // A column block of the slice's rows: a few milliseconds of work.
    if (stop != nullptr && stop->stop_requested()) return;
    const int64_t jc_end = std::min(n, jc + kFp16AccNc);
    for (int64_t pc = 0; pc < k; pc += kFp16AccKc) {
      const int64_t kc = std::min(kFp16AccKc, k - pc);
      for (int64_t ic = row_begin; ic < row_end; ic += kMr) {
        const int64_t rows = std::min(kMr, row_end - ic);
        double xmax = 0.0;
        for (int64_t kk = 0; kk < kc; ++kk) {
          for (int64_t r = 0; r < kMr; ++r) {
            const double v = r < rows ? static_cast<double>(x[(ic + r) * k + pc + kk]) : 0.0;
            xp[kk * kMr + r] = v;
            xmax = std::max(xmax, BoundAbs(v));
          }
        }
        for (int64_t jr = jc; jr < jc_end; jr += kNr) {
          const int64_t panel = jr / kNr;
          Fp16AccTileChecked(xp, wpack + panel * k * kNr + pc * kNr, kc, acc + ic * ldc + jr, ldc,
                             rows, std::min(kNr, n - jr), pc == 0,
                             xmax * wmax[panel * chunks + pc / kFp16AccKc]);
        }
      }
    }
  }
}

// w as panels of kNr output columns, [ceil(n / kNr)][k][kNr], the last
// one padded with zeros: a step's columns are contiguous whatever the
// layout. wmax[panel * chunks + chunk]: the largest |w| (NaN counted as
// infinity) of the panel over steps [chunk * kKc, (chunk + 1) * kKc).
void PackFp16AccWeight(const float* w, WeightLayout layout, int64_t n, int64_t k, float* wpack,
                       double* wmax) {
  constexpr int64_t kNr = kFp16AccNr;
  const int64_t panels = (n + kNr - 1) / kNr;
  const int64_t chunks = (k + kFp16AccKc - 1) / kFp16AccKc;
  for (int64_t p = 0; p < panels; ++p) {
    float* dst = wpack + p * k * kNr;
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      double m = 0.0;
      const int64_t end = std::min(k, (chunk + 1) * kFp16AccKc);
      for (int64_t kk = chunk * kFp16AccKc; kk < end; ++kk) {
        for (int64_t c = 0; c < kNr; ++c) {
          const int64_t j = p * kNr + c;
          float v = 0.0f;
          if (j < n) v = layout == WeightLayout::kOutIn ? w[j * k + kk] : w[kk * n + j];
          dst[kk * kNr + c] = v;
          m = std::max(m, BoundAbs(v));
        }
      }
      wmax[p * chunks + chunk] = m;
    }
  }
}

#undef TC_AVX2_TARGET
#endif  // x86-64 GCC/Clang

}  // namespace

absl::Status Fp16Accumulate(const float* x, const float* w, WeightLayout layout, int64_t m,
                            int64_t n, int64_t k, int threads, float* acc, const StopSignal* stop) {
  return Fp16Accumulate(x, w, layout, m, n, k, threads, acc, /*ldc=*/n, stop);
}

absl::Status Fp16Accumulate(const float* x, const float* w, WeightLayout layout, int64_t m,
                            int64_t n, int64_t k, int threads, float* acc, int64_t ldc,
                            const StopSignal* stop) {
  if (m == 0 || n == 0) return CheckStop(stop);
#ifdef TC_FP16ACC_AVX2
  if (UseAvx2Kernel("TENSORCHECK_FP16ACC_SCALAR")) {
    const int64_t panels = (n + kFp16AccNr - 1) / kFp16AccNr;
    const int64_t chunks = (k + kFp16AccKc - 1) / kFp16AccKc;
    TC_ASSIGN_OR_RETURN(std::unique_ptr<float[]> wpack, Allocate<float>(panels * kFp16AccNr * k));
    TC_ASSIGN_OR_RETURN(std::unique_ptr<double[]> wmax, Allocate<double>(panels * chunks));
    PackFp16AccWeight(w, layout, n, k, wpack.get(), wmax.get());
    const float* wp = wpack.get();
    const double* wm = wmax.get();
    SplitRows(m, n, k, threads, [=](int64_t begin, int64_t end) {
      RowsInSlices(begin, end, n, k, kFp16AccSliceMacs, stop, [=](int64_t b, int64_t e) {
        Fp16AccumulateRowsAvx2(x, wp, wm, b, e, n, k, acc, ldc, stop);
      });
    });
    return CheckStop(stop);
  }
#endif
  SplitRows(m, n, k, threads, [=](int64_t begin, int64_t end) {
    RowsInSlices(begin, end, n, k, kFp16AccSliceMacs, stop, [=](int64_t b, int64_t e) {
      Fp16AccumulateRowsScalar(x, w, layout, b, e, n, k, acc, ldc);
    });
  });
  return CheckStop(stop);
}

}  // namespace tensorcheck::internal
