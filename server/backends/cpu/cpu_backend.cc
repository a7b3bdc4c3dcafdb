#include "server/backends/cpu/cpu_backend.h"

#include <cblas.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <new>
#include <system_error>
#include <thread>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/core/float_formats.h"
#include "server/core/status_macros.h"

namespace tensorcheck {

namespace {

// OpenBLAS's cblas interface takes `blasint` (int in the LP64 build Debian
// ships) for every dimension and leading dimension.
constexpr int64_t kMaxBlasDim = std::numeric_limits<int>::max();

absl::Status CheckDim(int64_t v, absl::string_view name) {
  if (v < 0 || v > kMaxBlasDim) {
    return absl::InvalidArgumentError(
        absl::StrCat("problem.", name, ": a dimension in [0, ", kMaxBlasDim,
                     "] expected, got ", v));
  }
  return absl::OkStatus();
}

// Sanity checks only: the engine validates requests. These keep a caller
// that skipped validation from reading out of bounds.
absl::Status CheckProblem(const LinearProblem& p) {
  if (p.input == nullptr)
    return absl::InvalidArgumentError(
        "problem.input: tensor expected, got null");
  if (p.weight == nullptr)
    return absl::InvalidArgumentError(
        "problem.weight: tensor expected, got null");
  TC_RETURN_IF_ERROR(CheckDim(p.m, "m"));
  TC_RETURN_IF_ERROR(CheckDim(p.n, "n"));
  TC_RETURN_IF_ERROR(CheckDim(p.k, "k"));
  // m, n, k < 2^31, so their pairwise products fit in int64.
  if (p.input->numel() != p.m * p.k) {
    return absl::InvalidArgumentError(absl::StrCat(
        "input: m*k = ", p.m * p.k, " elements expected, got shape ",
        ShapeString(p.input->shape())));
  }
  const int64_t rows = p.layout == WeightLayout::kOutIn ? p.n : p.k;
  const int64_t cols = p.layout == WeightLayout::kOutIn ? p.k : p.n;
  if (p.weight->rank() != 2 || p.weight->dim(0) != rows ||
      p.weight->dim(1) != cols) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weight: shape [", rows, ", ", cols, "] expected for layout ",
        WeightLayoutName(p.layout), ", got ", ShapeString(p.weight->shape())));
  }
  if (p.bias != nullptr && p.bias->numel() != p.n) {
    return absl::InvalidArgumentError(
        absl::StrCat("bias: ", p.n, " elements expected, got shape ",
                     ShapeString(p.bias->shape())));
  }
  return absl::OkStatus();
}

template <typename T>
absl::StatusOr<std::unique_ptr<T[]>> Allocate(int64_t count) {
  std::unique_ptr<T[]> p(
      new (std::nothrow) T[static_cast<size_t>(std::max<int64_t>(count, 1))]);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot allocate ", count * static_cast<int64_t>(sizeof(T)),
        " bytes of CPU working memory"));
  }
  return p;
}

template <typename Round>
void RoundAll(float* v, int64_t count, Round round) {
  for (int64_t i = 0; i < count; ++i) v[i] = round(v[i]);
}

// Applies RoundInput(p, .) to every element, with the switch outside the loop.
void RoundInputs(Precision p, float* v, int64_t count) {
  switch (p) {
    case Precision::kFp64:
    case Precision::kFp32:
      return;
    case Precision::kTf32:
      return RoundAll(v, count, [](float f) {
        return RoundToTf32(f, Tf32Rounding::kNearestEven);
      });
    case Precision::kTf32Rna:
      return RoundAll(v, count, [](float f) {
        return RoundToTf32(f, Tf32Rounding::kTiesAway);
      });
    case Precision::kTf32Trunc:
      return RoundAll(v, count, [](float f) {
        return RoundToTf32(f, Tf32Rounding::kTruncate);
      });
    case Precision::kBf16:
      return RoundAll(v, count, [](float f) { return RoundToBf16(f); });
    case Precision::kFp16:
    case Precision::kFp16Acc:
      return RoundAll(v, count, [](float f) { return RoundToFp16(f); });
  }
}

// An operand as fp32 values rounded for `p`. fp32 storage read at fp32
// precision is used in place (no copy); anything else is converted once
// into `owned`.
absl::StatusOr<const float*> FloatOperand(const Tensor& t, Precision p,
                                          std::unique_ptr<float[]>* owned) {
  const bool needs_rounding = p != Precision::kFp32 && p != Precision::kFp64;
  if (t.dtype() == DType::kFloat32 && !needs_rounding) return t.data<float>();
  TC_ASSIGN_OR_RETURN(*owned, Allocate<float>(t.numel()));
  ToFloat(t, owned->get());
  RoundInputs(p, owned->get(), t.numel());
  return static_cast<const float*>(owned->get());
}

absl::StatusOr<const double*> DoubleOperand(const Tensor& t,
                                            std::unique_ptr<double[]>* owned) {
  if (t.dtype() == DType::kFloat64) return t.data<double>();
  TC_ASSIGN_OR_RETURN(*owned, Allocate<double>(t.numel()));
  ToDouble(t, owned->get());
  return static_cast<const double*>(owned->get());
}

// c[m, n] = x[m, k] * w^T, w stored [n, k] (OUT_IN) or [k, n] (IN_OUT); the
// layout becomes BLAS's transpose flag, never a copy.
void Gemm(const float* x, const float* w, WeightLayout layout, int64_t m,
          int64_t n, int64_t k, float* c) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    std::fill(c, c + m * n, 0.0f);
    return;
  }
  const bool out_in = layout == WeightLayout::kOutIn;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, out_in ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
              1.0f, x, static_cast<int>(k), w, static_cast<int>(out_in ? k : n),
              0.0f, c, static_cast<int>(n));
}

void Gemm(const double* x, const double* w, WeightLayout layout, int64_t m,
          int64_t n, int64_t k, double* c) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    std::fill(c, c + m * n, 0.0);
    return;
  }
  const bool out_in = layout == WeightLayout::kOutIn;
  cblas_dgemm(CblasRowMajor, CblasNoTrans, out_in ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
              1.0, x, static_cast<int>(k), w, static_cast<int>(out_in ? k : n),
              0.0, c, static_cast<int>(n));
}

// ---- Epilogue: bias, activation and the output rounding, in one pass.

template <DType kOut>
struct OutStorage {
  using type = uint16_t;
};
template <>
struct OutStorage<DType::kFloat64> {
  using type = double;
};
template <>
struct OutStorage<DType::kFloat32> {
  using type = float;
};

// Rounds `v` to the output dtype and widens it back to T, once.
template <DType kOut, typename T>
inline T RoundOut(T v) {
  if constexpr (kOut == DType::kFloat64) {
    return v;
  } else if constexpr (kOut == DType::kFloat32) {
    return static_cast<T>(static_cast<float>(v));
  } else if constexpr (kOut == DType::kFloat16) {
    if constexpr (std::is_same_v<T, float>) {
      return RoundToFp16(v);
    } else {
      return Fp16BitsToFloat(DoubleToFp16Bits(v));
    }
  } else {
    if constexpr (std::is_same_v<T, float>) {
      return RoundToBf16(v);
    } else {
      return Bf16BitsToFloat(DoubleToBf16Bits(v));
    }
  }
}

// Rounds `v` once to the output dtype and stores it.
template <DType kOut, typename T>
inline typename OutStorage<kOut>::type Store(T v) {
  if constexpr (kOut == DType::kFloat64) {
    return static_cast<double>(v);
  } else if constexpr (kOut == DType::kFloat32) {
    return static_cast<float>(v);
  } else if constexpr (kOut == DType::kFloat16) {
    if constexpr (std::is_same_v<T, float>) {
      return FloatToFp16Bits(v);
    } else {
      return DoubleToFp16Bits(v);
    }
  } else {
    if constexpr (std::is_same_v<T, float>) {
      return FloatToBf16Bits(v);
    } else {
      return DoubleToBf16Bits(v);
    }
  }
}

// The activation evaluated in T (fp32, or fp64 for the fp64 precision).
template <Activation kAct, typename T>
inline T Activate(T v) {
  if constexpr (kAct == Activation::kNone) {
    return v;
  } else if constexpr (kAct == Activation::kRelu) {
    return v < T(0) ? T(0) : v;  // NaN passes through
  } else {
    // GELU, tanh form (cuBLASLt's and PyTorch's approximate='tanh').
    const T kSqrt2OverPi = static_cast<T>(0.79788456080286535588);
    const T kCoeff = static_cast<T>(0.044715);
    return T(0.5) * v *
           (T(1) + std::tanh(kSqrt2OverPi * (v + kCoeff * v * v * v)));
  }
}

// `acc` and `out` may alias (fp32 accumulator written in place as fp32
// output): each element is read before it is written.
template <typename T, DType kOut, Activation kAct>
void EpilogueLoop(const T* acc, const T* bias, bool unfused, int64_t m,
                  int64_t n, typename OutStorage<kOut>::type* out) {
  for (int64_t i = 0; i < m; ++i) {
    const T* a = acc + i * n;
    auto* y = out + i * n;
    if (!unfused) {
      // fused: round_out(act(acc + b)), one rounding.
      if (bias != nullptr) {
        for (int64_t j = 0; j < n; ++j)
          y[j] = Store<kOut>(Activate<kAct>(a[j] + bias[j]));
      } else {
        for (int64_t j = 0; j < n; ++j)
          y[j] = Store<kOut>(Activate<kAct>(a[j]));
      }
    } else {
      // unfused: t = round_out(acc); u = round_out(t + b); round_out(act(u)).
      for (int64_t j = 0; j < n; ++j) {
        T u = RoundOut<kOut>(a[j]);
        if (bias != nullptr) u = RoundOut<kOut>(u + bias[j]);
        y[j] = Store<kOut>(Activate<kAct>(u));
      }
    }
  }
}

template <typename T, DType kOut>
void EpilogueForAct(const T* acc, const T* bias, bool unfused, Activation act,
                    int64_t m, int64_t n, Tensor* out) {
  auto* y = out->data<typename OutStorage<kOut>::type>();
  switch (act) {
    case Activation::kNone:
      return EpilogueLoop<T, kOut, Activation::kNone>(acc, bias, unfused, m, n,
                                                      y);
    case Activation::kRelu:
      return EpilogueLoop<T, kOut, Activation::kRelu>(acc, bias, unfused, m, n,
                                                      y);
    case Activation::kGeluTanh:
      return EpilogueLoop<T, kOut, Activation::kGeluTanh>(acc, bias, unfused, m,
                                                          n, y);
  }
}

template <typename T>
void Epilogue(const T* acc, const T* bias, bool unfused, Activation act,
              int64_t m, int64_t n, Tensor* out) {
  switch (out->dtype()) {
    case DType::kFloat64:
      return EpilogueForAct<T, DType::kFloat64>(acc, bias, unfused, act, m, n,
                                                out);
    case DType::kFloat32:
      return EpilogueForAct<T, DType::kFloat32>(acc, bias, unfused, act, m, n,
                                                out);
    case DType::kFloat16:
      return EpilogueForAct<T, DType::kFloat16>(acc, bias, unfused, act, m, n,
                                                out);
    case DType::kBFloat16:
      return EpilogueForAct<T, DType::kBFloat16>(acc, bias, unfused, act, m, n,
                                                 out);
  }
}


// ---- fp16acc

// Rounds a double to the nearest fp16 value (ties to even; overflow to
// infinity; NaN stays NaN), kept as a double. A bit-level version of
// DoubleToFp16Bits for the O(mnk) inner loop.
inline double RoundToHalfValue(double s) {
  uint64_t a = DoubleBits(s);
  const uint64_t sign = a & 0x8000000000000000ull;
  a ^= sign;
  double r;
  if (a >= 0x40EFFE0000000000ull) {  // |s| >= 65520 (the tie above 65504)
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
void Fp16AccumulateRowsScalar(const float* x, const float* w,
                              WeightLayout layout, int64_t row_begin,
                              int64_t row_end, int64_t n, int64_t k,
                              float* acc) {
  constexpr int64_t kCols = 8;
  for (int64_t i = row_begin; i < row_end; ++i) {
    const float* xi = x + i * k;
    float* ci = acc + i * n;
    if (layout == WeightLayout::kOutIn) {
      for (int64_t j0 = 0; j0 < n; j0 += kCols) {
        const int64_t cols = std::min(kCols, n - j0);
        double s[kCols] = {};
        for (int64_t kk = 0; kk < k; ++kk) {
          const double xv = xi[kk];
          for (int64_t c = 0; c < cols; ++c) {
            s[c] = RoundToHalfValue(
                s[c] + xv * static_cast<double>(w[(j0 + c) * k + kk]));
          }
        }
        for (int64_t c = 0; c < cols; ++c)
          ci[j0 + c] = static_cast<float>(s[c]);
      }
    } else {
      // IN_OUT: sweep k outside so the weight rows are read contiguously;
      // each element still accumulates in k-ascending order.
      std::fill(ci, ci + n, 0.0f);
      for (int64_t kk = 0; kk < k; ++kk) {
        const double xv = xi[kk];
        const float* wk = w + kk * n;
        for (int64_t j = 0; j < n; ++j) {
          ci[j] = static_cast<float>(RoundToHalfValue(
              static_cast<double>(ci[j]) + xv * static_cast<double>(wk[j])));
        }
      }
    }
  }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define TC_FP16ACC_AVX2 1

// ---- fp16acc, AVX2 + FMA (selected at run time; see UseFp16AccAvx2).
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
  c.sign = _mm256_castsi256_pd(
      _mm256_set1_epi64x(static_cast<long long>(0x8000000000000000ull)));
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
TC_AVX2_TARGET __attribute__((always_inline)) inline __m256d Fp16AccStep(
    __m256d x, __m256d w, __m256d acc, const Fp16AccConsts& k) {
  const __m256d s = _mm256_fmadd_pd(x, w, acc);
  const __m256d e = _mm256_max_pd(_mm256_and_pd(s, k.exp), k.min_normal);
  const __m256d c =
      _mm256_castsi256_pd(_mm256_add_epi64(_mm256_castpd_si256(e), k.magic));
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
TC_AVX2_TARGET bool Fp16AccTile(const double* xp, const float* wp, int64_t kc,
                                float* c, int64_t n, int64_t rows, int64_t cols,
                                bool first) {
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
          if (r < rows && 4 * v + j < cols)
            tmp[r][4 * v + j] = c[r * n + 4 * v + j];
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
        const __m256d valid = _mm256_castsi256_pd(
            _mm256_cmpgt_epi64(_mm256_set1_epi64x(cols - 4 * v), lane));
        zero = _mm256_or_pd(
            zero,
            _mm256_and_pd(valid, _mm256_cmp_pd(t[r][v], _mm256_setzero_pd(),
                                               _CMP_EQ_OQ)));
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
          if (r < rows && 4 * v + j < cols)
            c[r * n + 4 * v + j] = tmp[r][4 * v + j];
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
TC_AVX2_TARGET void Fp16AccTileChecked(const double* xp, const float* wp,
                                       int64_t kc, float* c, int64_t n,
                                       int64_t rows, int64_t cols, bool first,
                                       double p) {
  double a0 = 0.0;
  if (!first) {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < cols; ++j)
        a0 = std::max(a0, BoundAbs(c[r * n + j]));
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
TC_AVX2_TARGET void Fp16AccumulateRowsAvx2(const float* x, const float* wpack,
                                           const double* wmax,
                                           int64_t row_begin, int64_t row_end,
                                           int64_t n, int64_t k, float* acc) {
  constexpr int64_t kMr = kFp16AccMr;
  constexpr int64_t kNr = kFp16AccNr;
  if (k == 0) {
    std::fill(acc + row_begin * n, acc + row_end * n, 0.0f);
    return;
  }
  const int64_t chunks = (k + kFp16AccKc - 1) / kFp16AccKc;
  alignas(32) double xp[kFp16AccKc * kMr];
  for (int64_t jc = 0; jc < n; jc += kFp16AccNc) {
    const int64_t jc_end = std::min(n, jc + kFp16AccNc);
    for (int64_t pc = 0; pc < k; pc += kFp16AccKc) {
      const int64_t kc = std::min(kFp16AccKc, k - pc);
      for (int64_t ic = row_begin; ic < row_end; ic += kMr) {
        const int64_t rows = std::min(kMr, row_end - ic);
        double xmax = 0.0;
        for (int64_t kk = 0; kk < kc; ++kk) {
          for (int64_t r = 0; r < kMr; ++r) {
            const double v =
                r < rows ? static_cast<double>(x[(ic + r) * k + pc + kk]) : 0.0;
            xp[kk * kMr + r] = v;
            xmax = std::max(xmax, BoundAbs(v));
          }
        }
        for (int64_t jr = jc; jr < jc_end; jr += kNr) {
          const int64_t panel = jr / kNr;
          Fp16AccTileChecked(xp, wpack + panel * k * kNr + pc * kNr, kc,
                             acc + ic * n + jr, n, rows, std::min(kNr, n - jr),
                             pc == 0,
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
void PackFp16AccWeight(const float* w, WeightLayout layout, int64_t n,
                       int64_t k, float* wpack, double* wmax) {
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
          if (j < n)
            v = layout == WeightLayout::kOutIn ? w[j * k + kk] : w[kk * n + j];
          dst[kk * kNr + c] = v;
          m = std::max(m, BoundAbs(v));
        }
      }
      wmax[p * chunks + chunk] = m;
    }
  }
}

// The AVX2 path when the CPU has AVX2 and FMA, unless the environment sets
// TENSORCHECK_FP16ACC_SCALAR to a non-empty value other than "0" (tests and
// benchmarks use it to exercise and time the portable path).
bool UseFp16AccAvx2() {
  static const bool supported = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  const char* force_scalar = std::getenv("TENSORCHECK_FP16ACC_SCALAR");
  if (force_scalar != nullptr && force_scalar[0] != '\0' &&
      std::strcmp(force_scalar, "0") != 0) {
    return false;
  }
  return supported;
}

#undef TC_AVX2_TARGET
#endif  // x86-64 GCC/Clang

// Runs rows(begin, end) over [0, m), split across up to `threads` threads
// by rows.
template <typename Rows>
void SplitRows(int64_t m, int64_t n, int64_t k, int threads, Rows rows) {
  const int64_t work = m * n * std::max<int64_t>(k, 1);
  int64_t parts = std::min<int64_t>(threads, m);
  if (work < (int64_t{1} << 20)) parts = 1;
  if (parts <= 1) {
    rows(int64_t{0}, m);
    return;
  }
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(parts));
  int64_t next = 0;
  for (int64_t t = 0; t < parts; ++t) {
    const int64_t begin = m * t / parts;
    const int64_t end = m * (t + 1) / parts;
    try {
      pool.emplace_back(rows, begin, end);
    } catch (const std::system_error&) {
      break;  // No thread to be had: the rest runs on this one.
    }
    next = end;
  }
  rows(next, m);
  for (auto& th : pool) th.join();
}

absl::Status Fp16Accumulate(const float* x, const float* w, WeightLayout layout,
                            int64_t m, int64_t n, int64_t k, int threads,
                            float* acc) {
  if (m == 0 || n == 0) return absl::OkStatus();
#ifdef TC_FP16ACC_AVX2
  if (UseFp16AccAvx2()) {
    const int64_t panels = (n + kFp16AccNr - 1) / kFp16AccNr;
    const int64_t chunks = (k + kFp16AccKc - 1) / kFp16AccKc;
    TC_ASSIGN_OR_RETURN(std::unique_ptr<float[]> wpack,
                        Allocate<float>(panels * kFp16AccNr * k));
    TC_ASSIGN_OR_RETURN(std::unique_ptr<double[]> wmax,
                        Allocate<double>(panels * chunks));
    PackFp16AccWeight(w, layout, n, k, wpack.get(), wmax.get());
    const float* wp = wpack.get();
    const double* wm = wmax.get();
    SplitRows(m, n, k, threads, [=](int64_t begin, int64_t end) {
      Fp16AccumulateRowsAvx2(x, wp, wm, begin, end, n, k, acc);
    });
    return absl::OkStatus();
  }
#endif
  SplitRows(m, n, k, threads, [=](int64_t begin, int64_t end) {
    Fp16AccumulateRowsScalar(x, w, layout, begin, end, n, k, acc);
  });
  return absl::OkStatus();
}

absl::string_view Tf32RoundingName(Tf32Rounding r) {
  switch (r) {
    case Tf32Rounding::kNearestEven:
      return "nearest_even";
    case Tf32Rounding::kTiesAway:
      return "ties_away";
    case Tf32Rounding::kTruncate:
      return "truncate";
  }
  return "unknown";
}

}  // namespace

absl::StatusOr<std::unique_ptr<CpuBackend>> CpuBackend::Create(
    const Options& options) {
  if (options.threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "threads: 0 (all cores) or a positive count expected, got ",
        options.threads));
  }
  // OpenBLAS's thread count is process-wide; the CPU backend is its only
  // user in the server.
  if (options.threads > 0) openblas_set_num_threads(options.threads);
  return std::unique_ptr<CpuBackend>(new CpuBackend(options));
}

std::vector<Precision> CpuBackend::precisions() const {
  return std::vector<Precision>(std::begin(kAllPrecisions),
                                std::end(kAllPrecisions));
}

std::vector<BiasMode> CpuBackend::bias_modes() const {
  return {BiasMode::kNone, BiasMode::kFused, BiasMode::kUnfused};
}

std::vector<DType> CpuBackend::storage_dtypes() const {
  return std::vector<DType>(std::begin(kAllDTypes), std::end(kAllDTypes));
}

namespace {

// How a configuration multiplies, on one problem: configurations with
// equal Arithmetic compute the same accumulator x.W^T bit for bit, and
// differ at most in their epilogues.
struct Arithmetic {
  enum Kind { kFp64, kFp32, kFp16Acc };
  Kind kind = kFp32;
  // kFp32: the input rounding the multiply applies; kFp32 when it leaves
  // both stored operands unchanged (bf16 tensors under fp32, tf32 or
  // bf16: one GEMM).
  Precision rounding = Precision::kFp32;
  bool operator==(const Arithmetic& o) const {
    return kind == o.kind && rounding == o.rounding;
  }
};

Arithmetic ArithmeticOf(const LinearProblem& p, Precision precision) {
  switch (precision) {
    case Precision::kFp64:
      return {Arithmetic::kFp64, Precision::kFp64};
    case Precision::kFp16Acc:
      return {Arithmetic::kFp16Acc, Precision::kFp16Acc};
    default:
      break;
  }
  const bool exact = ValuesExactIn(precision, *p.input) &&
                     ValuesExactIn(precision, *p.weight);
  if (exact) {
    // Rounding changes nothing: the stored values, read as fp32, are the
    // operands (fp32 precision reads fp64 storage exactly only when the
    // values are fp32 ones, which ValuesExactIn checked).
    return {Arithmetic::kFp32, Precision::kFp32};
  }
  return {Arithmetic::kFp32, precision};
}

// x.W^T of one Arithmetic before any epilogue: [m, n] in fp32, or fp64
// for kFp64.
absl::StatusOr<Tensor> Accumulate(const LinearProblem& p, Arithmetic a,
                                  int threads) {
  switch (a.kind) {
    case Arithmetic::kFp64: {
      std::unique_ptr<double[]> x_owned, w_owned;
      TC_ASSIGN_OR_RETURN(const double* x, DoubleOperand(*p.input, &x_owned));
      TC_ASSIGN_OR_RETURN(const double* w, DoubleOperand(*p.weight, &w_owned));
      TC_ASSIGN_OR_RETURN(Tensor acc,
                          Tensor::Create(DType::kFloat64, {p.m, p.n}));
      Gemm(x, w, p.layout, p.m, p.n, p.k, acc.data<double>());
      return acc;
    }
    case Arithmetic::kFp32:
    case Arithmetic::kFp16Acc: {
      std::unique_ptr<float[]> x_owned, w_owned;
      TC_ASSIGN_OR_RETURN(const float* x,
                          FloatOperand(*p.input, a.rounding, &x_owned));
      TC_ASSIGN_OR_RETURN(const float* w,
                          FloatOperand(*p.weight, a.rounding, &w_owned));
      TC_ASSIGN_OR_RETURN(Tensor acc,
                          Tensor::Create(DType::kFloat32, {p.m, p.n}));
      if (a.kind == Arithmetic::kFp16Acc) {
        TC_RETURN_IF_ERROR(Fp16Accumulate(x, w, p.layout, p.m, p.n, p.k,
                                          threads, acc.data<float>()));
      } else {
        Gemm(x, w, p.layout, p.m, p.n, p.k, acc.data<float>());
      }
      return acc;
    }
  }
  return absl::InternalError("unknown arithmetic");
}

// The bias, activation and output rounding of `config` applied to `acc`.
// With `in_place` and an output stored like the accumulator, the
// epilogue overwrites `acc` and returns it (no second buffer).
template <typename T>
absl::StatusOr<Tensor> FinishAs(const LinearProblem& p, const Config& config,
                                Tensor& acc, bool in_place) {
  std::vector<T> bias;
  if (p.bias != nullptr) {
    bias.resize(static_cast<size_t>(p.n));
    // Exact unless the bias is stored in fp64 and T is float.
    if constexpr (std::is_same_v<T, float>) {
      ToFloat(*p.bias, bias.data());
    } else {
      ToDouble(*p.bias, bias.data());
    }
  }
  const T* b = p.bias != nullptr ? bias.data() : nullptr;
  // kNone with a bias present cannot come out of ResolveConfig; it is run
  // as fused, the single-rounding form.
  const bool unfused = config.bias == BiasMode::kUnfused;
  if (in_place && acc.dtype() == p.output_dtype) {
    Epilogue<T>(acc.data<T>(), b, unfused, p.activation, p.m, p.n, &acc);
    return std::move(acc);
  }
  TC_ASSIGN_OR_RETURN(Tensor out, Tensor::Create(p.output_dtype, {p.m, p.n}));
  Epilogue<T>(acc.data<T>(), b, unfused, p.activation, p.m, p.n, &out);
  return out;
}

absl::StatusOr<Tensor> Finish(const LinearProblem& p, const Config& config,
                              Tensor& acc, bool in_place) {
  if (acc.dtype() == DType::kFloat64) {
    return FinishAs<double>(p, config, acc, in_place);
  }
  return FinishAs<float>(p, config, acc, in_place);
}

std::map<std::string, std::string> DetailsOf(const Config& config) {
  std::map<std::string, std::string> details{{"blas", "openblas"}};
  const PrecisionInfo info = GetPrecisionInfo(config.precision);
  if (info.tf32_rounding.has_value()) {
    details["tf32_rounding"] = std::string(Tf32RoundingName(*info.tf32_rounding));
  }
  return details;
}

}  // namespace

int CpuBackend::threads() const {
  if (options_.threads > 0) return options_.threads;
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

absl::StatusOr<RunResult> CpuBackend::Run(const LinearProblem& problem,
                                          const Config& config,
                                          const RunOptions& options) {
  TC_RETURN_IF_ERROR(CheckProblem(problem));
  const Arithmetic arithmetic = ArithmeticOf(problem, config.precision);
  auto run_once = [&]() -> absl::StatusOr<Tensor> {
    TC_ASSIGN_OR_RETURN(Tensor acc, Accumulate(problem, arithmetic, threads()));
    return Finish(problem, config, acc, /*in_place=*/true);
  };
  RunResult result;
  TC_ASSIGN_OR_RETURN(result.output, run_once());
  const int repeat = std::max(1, options.repeat);
  for (int r = 1; r < repeat; ++r) {
    TC_ASSIGN_OR_RETURN(Tensor again, run_once());
    if (again.bytes() != result.output.bytes()) result.deterministic = false;
  }
  result.runs = repeat;
  result.details = DetailsOf(config);
  return result;
}

absl::Status CpuBackend::RunBatch(const LinearProblem& problem,
                                  const std::vector<Config>& configs,
                                  const RunOptions& options,
                                  const BatchConsumer& consume) {
  // Repeated runs check each configuration's own determinism.
  if (options.repeat > 1) {
    return LinearBackend::RunBatch(problem, configs, options, consume);
  }
  TC_RETURN_IF_ERROR(CheckProblem(problem));
  // Configurations grouped by arithmetic, groups in the order of their
  // first member (so configs[0] comes first).
  struct Group {
    Arithmetic arithmetic;
    std::vector<size_t> members;
  };
  std::vector<Group> groups;
  for (size_t i = 0; i < configs.size(); ++i) {
    const Arithmetic a = ArithmeticOf(problem, configs[i].precision);
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const Group& g) { return g.arithmetic == a; });
    if (it == groups.end()) {
      groups.push_back({a, {i}});
    } else {
      it->members.push_back(i);
    }
  }
  for (const Group& group : groups) {
    const std::vector<size_t>& members = group.members;
    const Config& first = configs[members.front()];
    absl::StatusOr<Tensor> accumulated = Accumulate(problem, group.arithmetic, threads());
    if (!accumulated.ok()) {
      return WithContext(accumulated.status(), absl::StrCat("configuration ", first.ToString()));
    }
    Tensor& acc = *accumulated;
    for (size_t j = 0; j < members.size();) {
      // Members j..same-1 name the same configuration (a reference that is
      // also a candidate): one epilogue, copies of its output.
      const Config& config = configs[members[j]];
      size_t same = j + 1;
      while (same < members.size() && configs[members[same]] == config) ++same;
      absl::StatusOr<Tensor> finished =
          Finish(problem, config, acc, /*in_place=*/same == members.size());
      if (!finished.ok()) {
        return WithContext(finished.status(), absl::StrCat("configuration ", config.ToString()));
      }
      Tensor output = *std::move(finished);
      for (size_t d = j; d < same; ++d) {
        RunResult result;
        result.output = d + 1 < same ? output.Clone() : std::move(output);
        result.details = DetailsOf(config);
        if (d > 0) result.shared_computation = first.ToString();
        TC_RETURN_IF_ERROR(consume(members[d], std::move(result)));
      }
      j = same;
    }
  }
  return absl::OkStatus();
}

}  // namespace tensorcheck
