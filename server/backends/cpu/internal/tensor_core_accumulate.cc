#include "server/backends/cpu/internal/tensor_core_accumulate.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>

#include "core/float_formats.h"
#include "core/status_macros.h"
#include "server/backends/cpu/internal/allocate.h"
#include "server/backends/cpu/internal/avx2_dispatch.h"
#include "server/backends/cpu/internal/split_rows.h"

namespace tensorcheck::internal {

namespace {

// KernelOrderDot costs tens of nanoseconds per product: slices of a few
// tens of milliseconds.
constexpr int64_t kTcAccScalarSliceMacs = int64_t{1} << 20;

// Row xi of x against column j of w, by KernelOrderDot, the definition.
float TcAccElement(const float* xi, const float* w, bool out_in, int64_t j, int64_t k, int64_t ldw,
                   const KernelOrder& order) {
  return out_in ? KernelOrderDot(xi, w + j * k, 1, k, order)
                : KernelOrderDot(xi, w + j, ldw, k, order);
}

// Every element by TcAccElement: the portable path.
void TcAccRowsScalar(const float* x, const float* w, bool out_in, int64_t row_begin,
                     int64_t row_end, int64_t nb, int64_t k, int64_t ldw, const KernelOrder& order,
                     float* acc, int64_t ldc) {
  for (int64_t i = row_begin; i < row_end; ++i) {
    for (int64_t j = 0; j < nb; ++j) {
      acc[i * ldc + j] = TcAccElement(x + i * k, w, out_in, j, k, ldw, order);
    }
  }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define TC_TCACC_AVX2 1

// ---- The kernel order, AVX2 (selected at run time: UseAvx2Kernel), and
// the same steps with AVX-512 where the CPU has AVX-512F
// (TENSORCHECK_TCACC_AVX2=1 keeps AVX2).
//
// KernelOrderDot's blocks for sixteen output columns per row (two AVX2
// registers of eight lanes, or one AVX-512 register), each step done with
// fp32, int16 and int32 operations that are exact under the conditions
// below, so every lane computes the model's numbers.
//
// Notation: for a nonzero input v, e(v) its exponent (ilogb) and n(v) its
// nominal exponent max(e(v), the operand's input_min_exponent); for the
// accumulator the floor is -126. bits = align_bits, rb = result_bits,
// low = max(bits - 126, min_align_exponent).
// One block of the walk, per accumulator `acc` (a lane), products p_t =
// x_t w_t:
//   E   = max(low, n(x_t) + n(w_t) over the nonzero products, n(acc) if
//         acc is nonzero). Inputs are packed with their nominal exponents
//         as int16 (x's biased by 127, so a sum is a float's exponent
//         field; a zero gets -2^14, so a sum with it is negative and loses
//         every max), the accumulator's is its exponent field (a nonzero
//         acc is a normal float, below). Where the block has a nonzero
//         product this is the model's e_max (>= low, below). Where it has
//         none the model gives acc back unchanged (below); so does this
//         block: acc is a multiple of 2^(low - bits) (every block result
//         is a multiple of its 2^(E - bits), a promoted sum of such
//         multiples rounds to one) with at most rb <= bits + 1 significant
//         bits, so every step below is exact on it (+0 stays +0).
//   inv = 2^(bits - E), q = 2^(E - bits), built in the exponent field.
//   u_t = trunc((x_t * w_t) * inv), a = trunc(acc * inv)  (cvttps2dq)
//         x_t w_t is exact in fp32 (at most 12 + 12 significant bits and,
//         with e(x) + e(w) >= -126 below, a normal result); times the
//         power of two inv it is exactly p_t / 2^(E - bits) when normal,
//         and when not it is below 2^-126 in magnitude, so both truncate
//         to 0. So u_t and a are the model's units(): the terms truncated
//         toward zero to multiples of 2^(E - bits). |u_t| < 2^(bits + 2)
//         (|x| < 2^(n(x) + 1), |w| < 2^(n(w) + 1), n(x) + n(w) <= E) and
//         |a| < 2^(bits + 1).
//   S   = the model's int64 sum of a and the u_t. In int32 when the block
//         fits one run of `run` terms, run (2^(bits + 2) - 1) <= 2^31 - 1
//         (all 16 of a 16-product block at bits = 25): n = sum u_t, S = n
//         + a, unless that addition overflows in some lane of the tile
//         (it can when the model's bounds allow it: n and a of one sign,
//         S of the other); then, and for longer blocks, each run's sum
//         converted to double and added there with a: integers below 2^38
//         in magnitude, exact. A zero sum is +0 either way, as the model's.
//   S'  = S truncated toward zero to rb significant bits: from int32,
//         cvtdq2ps (to nearest) stepped one unit toward zero where it went
//         away from zero (TcTowardZero; AVX-512 converts toward zero
//         itself, {rz-sae}), then the fraction bits below rb cleared; from
//         double, the low 53 - rb significand bits cleared.
//         Either is the model's RoundBlockSum toward zero, as the result
//         is normal (below), and exact in fp32 (rb <= 24); S' q (exact) is
//         the model's new accumulator.
// The walk: blocks from the start of each segment of KernelOrderDot
// ([0, offset), then the rest or `promote`-long pieces); with promotion
// a second accumulator per lane takes `main += acc` (one fp32 addition,
// round to nearest even, as the model's) at the end of each piece, and
// acc restarts at +0.
// Ranges: a (row, column) pair runs here when both lines are finite with
// at most 12 significant bits per value and, over their nonzero values,
//   e(x) + e(w)       >= -126                      (products normal),
//   n(x) + n(w)       >= low,
//   n(x) + n(w)       <= high = 123 - G            (k < 2^G, k < 2^24).
// Then every block with a nonzero product has E >= low: the model's
// min_align clamp changes nothing, inv and q are normal, and a nonzero
// block result, a multiple of 2^(E - bits) >= 2^-126, is normal, as is a
// promoted sum of two such multiples (or +0). Every block result has
// magnitude <= |acc| + sum |p_t| (truncations only shrink), every main
// <= (1 + 2^-24)^(k) sum |p| < 4 sum |p| < 2^(high + 4 + G) <= 2^127, so
// E <= 126 + bits: inv is normal and nothing overflows.
// Other pairs (inf, NaN, wider values, extreme magnitudes), models that
// round to nearest or keep more bits than the above allows, and k >=
// 2^24 go to KernelOrderDot.

#define TC_AVX2_TARGET __attribute__((target("avx2,fma")))
#define TC_AVX2_INLINE __attribute__((target("avx2,fma"), always_inline)) inline
#define TC_AVX512_TARGET __attribute__((target("avx512f,avx2,fma")))
#define TC_AVX512_INLINE __attribute__((target("avx512f,avx2,fma"), always_inline)) inline

// Register tile: kMr rows x 16 columns (AVX2: kNv registers of 8 lanes;
// one int16 register holds the 16 columns' exponent sums). 4 x 16 ran
// 5-10% faster than 2 x 16 with either instruction set, which with int32
// exponents had run a few percent faster than 4 x 8, 3 x 8 and 1 x 24 and
// 1.2x faster than 6 x 8 (one thread, 128 x 4096 -> 768, sm90 bf16).
constexpr int kTcAccMr = 4;
constexpr int kTcAccNv = 2;
constexpr int64_t kTcAccLanes = 8;
// A packed weight panel: 16 columns, per k their values (64 bytes) in one
// array and their nominal exponents minus 127 as int16 (32 bytes) in
// another.
constexpr int64_t kTcAccPanelColumns = kTcAccNv * kTcAccLanes;
// Rows per row block and the K extent of a chunk (rounded up to the walk's
// block boundaries): a panel's chunk (24 KiB) stays in L1 while the
// block's row tiles pass over it, the block's packed rows (128 KiB) in L2;
// the weight streams from L3 or memory once per row block.
constexpr int64_t kTcAccRowBlock = 64;
constexpr int64_t kTcAccChunkK = 256;
// The vector kernel's slices: a few tens of milliseconds on one core (at
// least a row block; TcAccRowsVector checks the stop signal within them).
constexpr int64_t kTcAccSliceMacs = int64_t{1} << 27;

// The packed exponent of a zero: a sum with any other packed exponent
// (x's in [1, 254], w's in [-126, 127]) is negative, and the sum of two
// zeros' still fits int16.
constexpr int16_t kTcZeroExponent = -(1 << 14);

// The model's conditions for the vector path (see above).
bool TcVectorModelOk(const KernelOrder& order, int64_t k) {
  const TensorCoreModel& m = order.model;
  return m.rounding == TensorCoreRounding::kTowardZero && m.align_bits >= 0 && m.align_bits <= 29 &&
         m.result_bits >= 1 && m.result_bits <= 24 && m.result_bits <= m.align_bits + 1 &&
         m.input_min_exponent >= -126 && m.input_min_exponent <= 127 && m.b_min_exponent >= -126 &&
         m.b_min_exponent <= 127 && k < (int64_t{1} << 24);
}

// KernelOrderDot's walk over K: segments (each starting its blocks
// afresh) and where the promotions happen.
struct TcWalk {
  int64_t k = 0;
  int64_t offset = 0;  // the first segment is [0, offset) when nonzero
  int64_t piece = 0;   // promote, at most k: segments from offset on; 0: one
  int64_t block = 1;

  int64_t SegmentStart(int64_t p) const {
    if (p < offset) return 0;
    if (piece == 0) return offset;
    return offset + (p - offset) / piece * piece;
  }
  // The end of the segment that holds p (< k).
  int64_t SegmentEnd(int64_t p) const {
    if (p < offset) return offset;
    if (piece == 0) return k;
    return std::min(k, SegmentStart(p) + piece);
  }
  // The first block boundary at or after p.
  int64_t BlockBoundary(int64_t p) const {
    if (p >= k) return k;
    const int64_t start = SegmentStart(p);
    return std::min(start + (p - start + block - 1) / block * block, SegmentEnd(p));
  }
  int64_t ChunkEnd(int64_t k0) const { return BlockBoundary(std::min(k, k0 + kTcAccChunkK)); }
};

TcWalk WalkOf(const KernelOrder& order, int64_t k) {
  TcWalk w;
  w.k = k;
  w.offset = std::min(order.Offset(k), k);
  w.piece = order.promote > 0 ? std::min(order.promote, std::max<int64_t>(k, 1)) : 0;
  w.block = std::clamp(order.model.block, 1, kMaxTensorCoreBlock);
  return w;
}

// What the vector path needs to know of a row of x or a column of w.
struct TcLine {
  bool ok = true;  // finite values of at most 12 significant bits
  // Exponents (ilogb) of the nonzero values; amin > amax: none.
  int amin = INT_MAX / 4;
  int amax = INT_MIN / 4;
  bool Empty() const { return amin > amax; }
};

inline void TcLineAdd(TcLine* line, float v) {
  const uint32_t u = FloatBits(v) & 0x7FFFFFFFu;
  if (u == 0) return;
  const int field = static_cast<int>(u >> 23);
  if (field == 255 || (u & 0xFFFu) != 0) {
    line->ok = false;
    return;
  }
  const int e = field != 0 ? field - 127 : std::ilogb(v);
  line->amin = std::min(line->amin, e);
  line->amax = std::max(line->amax, e);
}

// The range conditions on a (row, column) pair (see above).
struct TcBounds {
  int x_floor = 0;  // the operands' nominal exponent floors
  int w_floor = 0;
  int low = 0;
  int high = 0;
};

TcBounds BoundsOf(const KernelOrder& order, int64_t k) {
  TcBounds b;
  b.x_floor = order.model.input_min_exponent;
  b.w_floor = order.model.b_min_exponent;
  b.low = std::max(order.model.align_bits - 126, order.model.min_align_exponent);
  int g = 0;
  while (g < 62 && (int64_t{1} << g) <= k) ++g;  // k < 2^g
  b.high = 123 - g;
  return b;
}

bool TcPairOk(const TcLine& r, const TcLine& c, const TcBounds& b) {
  if (!r.ok || !c.ok) return false;
  if (r.Empty() || c.Empty()) return true;  // every product is zero
  return r.amin + c.amin >= -126 &&
         std::max(r.amin, b.x_floor) + std::max(c.amin, b.w_floor) >= b.low &&
         std::max(r.amax, b.x_floor) + std::max(c.amax, b.w_floor) <= b.high;
}

// The columns summed up, so that most rows need no per-pair check.
struct TcColumns {
  bool all_ok = true;
  TcLine hull;             // amin: the least amin, amax: the largest amax
  int nmin = INT_MAX / 4;  // the least nominal minimum exponent
};

// Whether every pair of row r is TcPairOk.
bool TcRowAllOk(const TcLine& r, const TcColumns& cols, const TcBounds& b) {
  if (!r.ok || !cols.all_ok) return false;
  if (r.Empty() || cols.hull.Empty()) return true;
  return r.amin + cols.hull.amin >= -126 && std::max(r.amin, b.x_floor) + cols.nmin >= b.low &&
         std::max(r.amax, b.x_floor) + std::max(cols.hull.amax, b.w_floor) <= b.high;
}

// A nonzero value's biased nominal exponent: its exponent field, at least
// 127 + floor (an fp32 subnormal's field, 0, is below every floor).
inline int16_t TcPackedExponent(float v, int floor) {
  const uint32_t u = FloatBits(v) & 0x7FFFFFFFu;
  if (u == 0) return kTcZeroExponent;
  return static_cast<int16_t>(std::max(static_cast<int>(u >> 23), 127 + floor));
}

// x's packed exponent in both halves of a float's bits: a broadcast of
// the float is the exponent in all 16 int16 lanes.
inline float TcPairBits(int16_t e) {
  const uint32_t u = static_cast<uint16_t>(e);
  return BitsToFloat(u | (u << 16));
}

// The model's numbers for the vector path.
struct TcVecModel {
  int bits = 25;
  int64_t run = 16;          // terms per int32 run
  bool run_and_acc = false;  // a full block's terms and a always fit one int32
  int16_t low_field = 0;     // low + 127: E's floor as an exponent field
  uint32_t float_mask = 0;   // clears the fraction bits below rb of a float
  uint64_t sum_mask = 0;     // clears the significand bits below rb of a double
};

TcVecModel VecModelOf(const TensorCoreModel& model, const TcBounds& bounds) {
  TcVecModel vm;
  vm.bits = model.align_bits;
  const int64_t term = (int64_t{1} << (vm.bits + 2)) - 1;  // |u_t| <= term
  const int64_t int32_max = (int64_t{1} << 31) - 1;
  vm.run = std::max<int64_t>(1, int32_max / term);
  const int64_t block = std::clamp(model.block, 1, kMaxTensorCoreBlock);
  vm.run_and_acc = block * term + ((int64_t{1} << (vm.bits + 1)) - 1) <= int32_max;
  vm.low_field = static_cast<int16_t>(bounds.low + 127);
  vm.float_mask = ~((uint32_t{1} << (24 - model.result_bits)) - 1);
  vm.sum_mask = ~((uint64_t{1} << (53 - model.result_bits)) - 1);
  return vm;
}

// Adds the block's terms [t0, t1) into n. xb: the row tile's packed
// values at the block's start ([t][kMr values, kMr exponents]); wv: the
// panel's values at the block's start.
template <int kMr>
TC_AVX2_INLINE void TcAccTerms(const float* xb, const float* wv, int64_t t0, int64_t t1,
                               const __m256 (&inv)[kMr][kTcAccNv], __m256i (&n)[kMr][kTcAccNv]) {
#pragma GCC unroll 2
  for (int64_t t = t0; t < t1; ++t) {
    __m256 w[kTcAccNv];
#pragma GCC unroll 8
    for (int v = 0; v < kTcAccNv; ++v) {
      w[v] = _mm256_load_ps(wv + t * kTcAccPanelColumns + v * kTcAccLanes);
    }
#pragma GCC unroll 8
    for (int r = 0; r < kMr; ++r) {
      const __m256 xv = _mm256_broadcast_ss(xb + t * 2 * kMr + r);
#pragma GCC unroll 8
      for (int v = 0; v < kTcAccNv; ++v) {
        const __m256 scaled = _mm256_mul_ps(_mm256_mul_ps(xv, w[v]), inv[r][v]);
        n[r][v] = _mm256_add_epi32(n[r][v], _mm256_cvttps_epi32(scaled));
      }
    }
  }
}

// Pass 1 for both instruction sets: per row of the tile, the largest
// exponent sum of the block's nonzero products and low, for the 16
// columns at once in int16. we: the panel's exponents at the block's
// start.
template <int kMr>
TC_AVX2_INLINE void TcAccExponents(const float* xb, const int16_t* we, int64_t count,
                                   const TcVecModel& vm, __m256i (&e16)[kMr]) {
#pragma GCC unroll 8
  for (int r = 0; r < kMr; ++r) e16[r] = _mm256_set1_epi16(vm.low_field);
#pragma GCC unroll 4
  for (int64_t t = 0; t < count; ++t) {
    const __m256i ew =
        _mm256_load_si256(reinterpret_cast<const __m256i*>(we + t * kTcAccPanelColumns));
#pragma GCC unroll 8
    for (int r = 0; r < kMr; ++r) {
      const __m256i ex = _mm256_castps_si256(_mm256_broadcast_ss(xb + t * 2 * kMr + kMr + r));
      e16[r] = _mm256_max_epi16(e16[r], _mm256_add_epi16(ex, ew));
    }
  }
}

// The low and high four lanes of n as doubles.
TC_AVX2_INLINE __m256d TcLow(__m256i n) { return _mm256_cvtepi32_pd(_mm256_castsi256_si128(n)); }
TC_AVX2_INLINE __m256d TcHigh(__m256i n) {
  return _mm256_cvtepi32_pd(_mm256_extracti128_si256(n, 1));
}

// An int32 as a float rounded toward zero to 24 significant bits:
// cvtdq2ps rounds to nearest; where that went away from zero (f - s, exact
// in wrapping int32 arithmetic as |f - s| <= 64 even for f = 2^31, has s's
// sign), one unit less in the last place.
TC_AVX2_INLINE __m256i TcTowardZero(__m256i s) {
  const __m256 f = _mm256_cvtepi32_ps(s);
  const __m256i diff = _mm256_sub_epi32(_mm256_cvttps_epi32(f), s);
  const __m256i same_sign = _mm256_cmpgt_epi32(_mm256_xor_si256(diff, s), _mm256_set1_epi32(-1));
  const __m256i away =
      _mm256_andnot_si256(_mm256_cmpeq_epi32(diff, _mm256_setzero_si256()), same_sign);
  return _mm256_add_epi32(_mm256_castps_si256(f), away);
}

// q = 2^(E - bits) from E's exponent field.
TC_AVX2_INLINE __m256 TcQuantum(__m256i e, const TcVecModel& vm) {
  return _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(vm.bits)), 23));
}

// One block of `count` products into acc (see the proof above).
template <int kMr>
TC_AVX2_INLINE void TcAccBlock(const float* xb, const float* wv, const int16_t* we, int64_t count,
                               const TcVecModel& vm, __m256 (&acc)[kMr][kTcAccNv]) {
  constexpr int kNv = kTcAccNv;
  const __m256i zero = _mm256_setzero_si256();
  __m256i e16[kMr];
  TcAccExponents<kMr>(xb, we, count, vm, e16);
  // E with the accumulator's exponent field; inv = 2^(bits - E).
  const __m256i field_mask = _mm256_set1_epi32(0xFF);
  const __m256i inv_base = _mm256_set1_epi32(254 + vm.bits);
  __m256i e[kMr][kNv];
  __m256 inv[kMr][kNv];
#pragma GCC unroll 8
  for (int r = 0; r < kMr; ++r) {
    e[r][0] = _mm256_cvtepi16_epi32(_mm256_castsi256_si128(e16[r]));
    e[r][1] = _mm256_cvtepi16_epi32(_mm256_extracti128_si256(e16[r], 1));
#pragma GCC unroll 8
    for (int v = 0; v < kNv; ++v) {
      const __m256i acc_field =
          _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(acc[r][v]), 23), field_mask);
      e[r][v] = _mm256_max_epi32(e[r][v], acc_field);
      inv[r][v] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_sub_epi32(inv_base, e[r][v]), 23));
    }
  }
  // Pass 2: the terms, in one int32 run when they fit.
  __m256i n[kMr][kNv];
  __m256d lo[kMr][kNv], hi[kMr][kNv];  // the earlier runs' sums
#pragma GCC unroll 8
  for (int r = 0; r < kMr; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < kNv; ++v) {
      n[r][v] = zero;
      lo[r][v] = hi[r][v] = _mm256_setzero_pd();
    }
  }
  if (count <= vm.run) {
    TcAccTerms<kMr>(xb, wv, 0, count, inv, n);
    // S = n + a in int32 unless that overflows in some lane.
    __m256i sum[kMr][kNv];
    __m256i overflow = zero;
#pragma GCC unroll 8
    for (int r = 0; r < kMr; ++r) {
#pragma GCC unroll 8
      for (int v = 0; v < kNv; ++v) {
        const __m256i a = _mm256_cvttps_epi32(_mm256_mul_ps(acc[r][v], inv[r][v]));
        sum[r][v] = _mm256_add_epi32(n[r][v], a);
        if (!vm.run_and_acc) {
          overflow =
              _mm256_or_si256(overflow, _mm256_and_si256(_mm256_xor_si256(n[r][v], sum[r][v]),
                                                         _mm256_xor_si256(a, sum[r][v])));
        }
      }
    }
    if (_mm256_movemask_ps(_mm256_castsi256_ps(overflow)) == 0) {
      const __m256i float_mask = _mm256_set1_epi32(static_cast<int>(vm.float_mask));
#pragma GCC unroll 8
      for (int r = 0; r < kMr; ++r) {
#pragma GCC unroll 8
        for (int v = 0; v < kNv; ++v) {
          const __m256 s =
              _mm256_castsi256_ps(_mm256_and_si256(TcTowardZero(sum[r][v]), float_mask));
          acc[r][v] = _mm256_mul_ps(s, TcQuantum(e[r][v], vm));
        }
      }
      return;
    }
  } else {
    for (int64_t t0 = 0;; t0 += vm.run) {
      TcAccTerms<kMr>(xb, wv, t0, std::min(count, t0 + vm.run), inv, n);
      if (t0 + vm.run >= count) break;
#pragma GCC unroll 8
      for (int r = 0; r < kMr; ++r) {
#pragma GCC unroll 8
        for (int v = 0; v < kNv; ++v) {
          lo[r][v] = _mm256_add_pd(lo[r][v], TcLow(n[r][v]));
          hi[r][v] = _mm256_add_pd(hi[r][v], TcHigh(n[r][v]));
          n[r][v] = zero;
        }
      }
    }
  }
  // S = the runs' sums + a in double, truncated to rb significant bits.
  const __m256d sum_mask =
      _mm256_castsi256_pd(_mm256_set1_epi64x(static_cast<int64_t>(vm.sum_mask)));
#pragma GCC unroll 8
  for (int r = 0; r < kMr; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < kNv; ++v) {
      const __m256i a = _mm256_cvttps_epi32(_mm256_mul_ps(acc[r][v], inv[r][v]));
      const __m256d s_lo =
          _mm256_and_pd(_mm256_add_pd(_mm256_add_pd(lo[r][v], TcLow(n[r][v])), TcLow(a)), sum_mask);
      const __m256d s_hi = _mm256_and_pd(
          _mm256_add_pd(_mm256_add_pd(hi[r][v], TcHigh(n[r][v])), TcHigh(a)), sum_mask);
      const __m256 s = _mm256_set_m128(_mm256_cvtpd_ps(s_hi), _mm256_cvtpd_ps(s_lo));
      acc[r][v] = _mm256_mul_ps(s, TcQuantum(e[r][v], vm));
    }
  }
}

// Where a register tile's rows keep their accumulators between chunks of
// K: state[r]: the chain's (or with promotion the main) accumulators of
// row r's 16 columns, partial[r]: with promotion, the piece's partial
// sums; `lanes` of the 16 columns are real (the others neither read nor
// written).
template <int kMr>
struct TcTileState {
  float* state[kMr];
  float* partial[kMr];
  int lanes;
};

// One register tile over the chunk [k0, k1) of the walk: the accumulators
// read from `st` (zeros when `first`), the blocks, the promotions, the
// accumulators written back. xp: the row tile's packed chunk; wv, we: the
// panel's chunk.
template <int kMr>
TC_AVX2_TARGET void TcAccTileAvx2(const TcWalk& walk, int64_t k0, int64_t k1, const float* xp,
                                  const float* wv, const int16_t* we, const TcVecModel& vm,
                                  const TcTileState<kMr>& st, bool first) {
  constexpr int kNv = kTcAccNv;
  const bool promote = walk.piece > 0;
  __m256i lane_mask[kNv];
#pragma GCC unroll 8
  for (int v = 0; v < kNv; ++v) {
    lane_mask[v] = _mm256_cmpgt_epi32(_mm256_set1_epi32(st.lanes - v * 8),
                                      _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  __m256 acc[kMr][kNv], main[kMr][kNv];
#pragma GCC unroll 8
  for (int r = 0; r < kMr; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < kNv; ++v) {
      acc[r][v] = main[r][v] = _mm256_setzero_ps();
      if (first) continue;
      const __m256 s = _mm256_maskload_ps(st.state[r] + 8 * v, lane_mask[v]);
      if (promote) {
        main[r][v] = s;
        acc[r][v] = _mm256_maskload_ps(st.partial[r] + 8 * v, lane_mask[v]);
      } else {
        acc[r][v] = s;
      }
    }
  }
  int64_t pos = k0;
  int64_t segment_end = walk.SegmentEnd(k0);
  while (pos < k1) {
    const int64_t count = std::min(walk.block, segment_end - pos);
    TcAccBlock<kMr>(xp + (pos - k0) * 2 * kMr, wv + (pos - k0) * kTcAccPanelColumns,
                    we + (pos - k0) * kTcAccPanelColumns, count, vm, acc);
    pos += count;
    if (pos < segment_end) continue;
    if (promote) {
#pragma GCC unroll 8
      for (int r = 0; r < kMr; ++r) {
#pragma GCC unroll 8
        for (int v = 0; v < kNv; ++v) {
          main[r][v] = _mm256_add_ps(main[r][v], acc[r][v]);
          acc[r][v] = _mm256_setzero_ps();
        }
      }
    }
    if (pos < walk.k) segment_end = walk.SegmentEnd(pos);
  }
#pragma GCC unroll 8
  for (int r = 0; r < kMr; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < kNv; ++v) {
      _mm256_maskstore_ps(st.state[r] + 8 * v, lane_mask[v], promote ? main[r][v] : acc[r][v]);
      if (promote) _mm256_maskstore_ps(st.partial[r] + 8 * v, lane_mask[v], acc[r][v]);
    }
  }
}

// ---- The same with AVX-512: one register of 16 lanes per row, the
// overflow test in one ternary-logic operation, S' from int32 converted
// toward zero by the instruction itself. The steps and their proof are
// TcAccBlock's.

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which its
// -Wmaybe-uninitialized takes for a read of an uninitialised value (GCC
// bug 105593).
#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

template <int kMr>
TC_AVX512_INLINE void TcAccTerms512(const float* xb, const float* wv, int64_t t0, int64_t t1,
                                    const __m512 (&inv)[kMr], __m512i (&n)[kMr]) {
#pragma GCC unroll 2
  for (int64_t t = t0; t < t1; ++t) {
    const __m512 w = _mm512_load_ps(wv + t * kTcAccPanelColumns);
#pragma GCC unroll 8
    for (int r = 0; r < kMr; ++r) {
      const __m512 scaled =
          _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(xb[t * 2 * kMr + r]), w), inv[r]);
      n[r] = _mm512_add_epi32(n[r], _mm512_cvttps_epi32(scaled));
    }
  }
}

// The low and high eight lanes of n as doubles.
TC_AVX512_INLINE __m512d TcLow512(__m512i n) {
  return _mm512_cvtepi32_pd(_mm512_castsi512_si256(n));
}
TC_AVX512_INLINE __m512d TcHigh512(__m512i n) {
  return _mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(n, 1));
}

TC_AVX512_INLINE __m512 TcQuantum512(__m512i e, const TcVecModel& vm) {
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(vm.bits)), 23));
}

template <int kMr>
TC_AVX512_INLINE void TcAccBlock512(const float* xb, const float* wv, const int16_t* we,
                                    int64_t count, const TcVecModel& vm, __m512 (&acc)[kMr]) {
  const __m512i zero = _mm512_setzero_si512();
  __m256i e16[kMr];
  TcAccExponents<kMr>(xb, we, count, vm, e16);
  const __m512i field_mask = _mm512_set1_epi32(0xFF);
  const __m512i inv_base = _mm512_set1_epi32(254 + vm.bits);
  __m512i e[kMr], n[kMr];
  __m512 inv[kMr];
  __m512d lo[kMr], hi[kMr];
#pragma GCC unroll 8
  for (int r = 0; r < kMr; ++r) {
    const __m512i acc_field =
        _mm512_and_si512(_mm512_srli_epi32(_mm512_castps_si512(acc[r]), 23), field_mask);
    e[r] = _mm512_max_epi32(_mm512_cvtepi16_epi32(e16[r]), acc_field);
    inv[r] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_sub_epi32(inv_base, e[r]), 23));
    n[r] = zero;
    lo[r] = hi[r] = _mm512_setzero_pd();
  }
  if (count <= vm.run) {
    TcAccTerms512<kMr>(xb, wv, 0, count, inv, n);
    __m512i sum[kMr];
    __mmask16 overflow = 0;
#pragma GCC unroll 8
    for (int r = 0; r < kMr; ++r) {
      const __m512i a = _mm512_cvttps_epi32(_mm512_mul_ps(acc[r], inv[r]));
      sum[r] = _mm512_add_epi32(n[r], a);
      if (!vm.run_and_acc) {
        // 0x42: (n ^ sum) & (a ^ sum), negative where n + a overflowed.
        overflow |= _mm512_cmplt_epi32_mask(_mm512_ternarylogic_epi32(n[r], a, sum[r], 0x42), zero);
      }
    }
    if (overflow == 0) {
      const __m512i float_mask = _mm512_set1_epi32(static_cast<int>(vm.float_mask));
#pragma GCC unroll 8
      for (int r = 0; r < kMr; ++r) {
        const __m512 toward_zero =
            _mm512_cvt_roundepi32_ps(sum[r], _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
        const __m512 s =
            _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(toward_zero), float_mask));
        acc[r] = _mm512_mul_ps(s, TcQuantum512(e[r], vm));
      }
      return;
    }
  } else {
    for (int64_t t0 = 0;; t0 += vm.run) {
      TcAccTerms512<kMr>(xb, wv, t0, std::min(count, t0 + vm.run), inv, n);
      if (t0 + vm.run >= count) break;
#pragma GCC unroll 8
      for (int r = 0; r < kMr; ++r) {
        lo[r] = _mm512_add_pd(lo[r], TcLow512(n[r]));
        hi[r] = _mm512_add_pd(hi[r], TcHigh512(n[r]));
        n[r] = zero;
      }
    }
  }
  const __m512i sum_mask = _mm512_set1_epi64(static_cast<int64_t>(vm.sum_mask));
#pragma GCC unroll 8
  for (int r = 0; r < kMr; ++r) {
    const __m512i a = _mm512_cvttps_epi32(_mm512_mul_ps(acc[r], inv[r]));
    const __m512d s_lo = _mm512_add_pd(_mm512_add_pd(lo[r], TcLow512(n[r])), TcLow512(a));
    const __m512d s_hi = _mm512_add_pd(_mm512_add_pd(hi[r], TcHigh512(n[r])), TcHigh512(a));
    const __m256 f_lo =
        _mm512_cvtpd_ps(_mm512_castsi512_pd(_mm512_and_si512(_mm512_castpd_si512(s_lo), sum_mask)));
    const __m256 f_hi =
        _mm512_cvtpd_ps(_mm512_castsi512_pd(_mm512_and_si512(_mm512_castpd_si512(s_hi), sum_mask)));
    const __m512 s = _mm512_castpd_ps(_mm512_insertf64x4(
        _mm512_castpd256_pd512(_mm256_castps_pd(f_lo)), _mm256_castps_pd(f_hi), 1));
    acc[r] = _mm512_mul_ps(s, TcQuantum512(e[r], vm));
  }
}

// TcAccTileAvx2 with AVX-512.
template <int kMr>
TC_AVX512_TARGET void TcAccTileAvx512(const TcWalk& walk, int64_t k0, int64_t k1, const float* xp,
                                      const float* wv, const int16_t* we, const TcVecModel& vm,
                                      const TcTileState<kMr>& st, bool first) {
  const bool promote = walk.piece > 0;
  const __mmask16 lane_mask = static_cast<__mmask16>((1u << st.lanes) - 1);
  __m512 acc[kMr], main[kMr];
#pragma GCC unroll 8
  for (int r = 0; r < kMr; ++r) {
    acc[r] = main[r] = _mm512_setzero_ps();
    if (first) continue;
    const __m512 s = _mm512_maskz_loadu_ps(lane_mask, st.state[r]);
    if (promote) {
      main[r] = s;
      acc[r] = _mm512_maskz_loadu_ps(lane_mask, st.partial[r]);
    } else {
      acc[r] = s;
    }
  }
  int64_t pos = k0;
  int64_t segment_end = walk.SegmentEnd(k0);
  while (pos < k1) {
    const int64_t count = std::min(walk.block, segment_end - pos);
    TcAccBlock512<kMr>(xp + (pos - k0) * 2 * kMr, wv + (pos - k0) * kTcAccPanelColumns,
                       we + (pos - k0) * kTcAccPanelColumns, count, vm, acc);
    pos += count;
    if (pos < segment_end) continue;
    if (promote) {
#pragma GCC unroll 8
      for (int r = 0; r < kMr; ++r) {
        main[r] = _mm512_add_ps(main[r], acc[r]);
        acc[r] = _mm512_setzero_ps();
      }
    }
    if (pos < walk.k) segment_end = walk.SegmentEnd(pos);
  }
#pragma GCC unroll 8
  for (int r = 0; r < kMr; ++r) {
    _mm512_mask_storeu_ps(st.state[r], lane_mask, promote ? main[r] : acc[r]);
    if (promote) _mm512_mask_storeu_ps(st.partial[r], lane_mask, acc[r]);
  }
}

#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// The tile function of one instruction set.
template <int kMr>
using TcAccTileFn = void (*)(const TcWalk&, int64_t, int64_t, const float*, const float*,
                             const int16_t*, const TcVecModel&, const TcTileState<kMr>&, bool);

// AVX-512 where the CPU has it and TENSORCHECK_TCACC_AVX2 does not ask
// for AVX2 (for tests and benchmarks); the CPU has AVX2 (UseAvx2Kernel).
TcAccTileFn<kTcAccMr> ChooseTcAccTile() {
  static const bool avx512 = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") != 0;
  }();
  const char* avx2 = std::getenv("TENSORCHECK_TCACC_AVX2");
  const bool force_avx2 = avx2 != nullptr && avx2[0] != '\0' && std::strcmp(avx2, "0") != 0;
  return avx512 && !force_avx2 ? TcAccTileAvx512<kTcAccMr> : TcAccTileAvx2<kTcAccMr>;
}

// What every thread of one call shares.
struct TcAccJob {
  const float* x;
  const float* w;
  bool out_in;
  int64_t nb, k, ldw;
  const KernelOrder* order;
  const float* wvals;    // [panels][k][16]
  const int16_t* wexps;  // [panels][k][16]
  int64_t panels;
  const TcLine* cols;
  TcColumns col_sum;
  TcBounds bounds;
  TcWalk walk;
  TcVecModel vm;
  TcAccTileFn<kTcAccMr> tile;
  float* acc;
  int64_t ldc;
};

// Per-thread scratch: the row block's packed chunk of x and, with
// promotion, its partial sums.
struct TcAccScratch {
  float* xpack;    // [kRowBlock / kMr][chunk][2 kMr]
  float* partial;  // [kRowBlock][panels * 16]
};

// Rows [row_begin, row_end), row blocks of kTcAccRowBlock rows: per chunk
// of K, the block's rows packed, then every panel against every row tile;
// checking `stop` before each chunk (a few milliseconds); a stop leaves
// the rows unfinished.
void TcAccRowsVector(const TcAccJob& job, const TcAccScratch& scratch, int64_t row_begin,
                     int64_t row_end, const StopSignal* stop) {
  constexpr int kMr = kTcAccMr;
  constexpr int64_t kRb = kTcAccRowBlock;
  static_assert(kRb % kMr == 0, "row blocks of whole tiles");
  const int64_t k = job.k;
  const int64_t width = job.panels * kTcAccPanelColumns;
  const int x_floor = job.order->model.input_min_exponent;
  alignas(64) float dummy[kMr][kTcAccPanelColumns];
  TcLine rows_line[kRb];
  for (int64_t i0 = row_begin; i0 < row_end; i0 += kRb) {
    const int64_t rows = std::min(kRb, row_end - i0);
    const int64_t tiles = (rows + kMr - 1) / kMr;
    for (int64_t r = 0; r < rows; ++r) {
      rows_line[r] = TcLine{};
      const float* xi = job.x + (i0 + r) * k;
      for (int64_t kk = 0; kk < k; ++kk) TcLineAdd(&rows_line[r], xi[kk]);
    }
    if (k == 0) {
      for (int64_t r = 0; r < rows; ++r) {
        std::fill(job.acc + (i0 + r) * job.ldc, job.acc + (i0 + r) * job.ldc + job.nb, 0.0f);
      }
    }
    for (int64_t k0 = 0; k0 < k;) {
      if (stop != nullptr && stop->stop_requested()) return;
      const int64_t k1 = job.walk.ChunkEnd(k0);
      const int64_t kc = k1 - k0;
      // The chunk of x, row tiles padded with zero rows.
      for (int64_t tile = 0; tile < tiles; ++tile) {
        float* dst = scratch.xpack + tile * kc * 2 * kMr;
        for (int r = 0; r < kMr; ++r) {
          const int64_t row = tile * kMr + r;
          const float* src = row < rows ? job.x + (i0 + row) * k + k0 : nullptr;
          for (int64_t t = 0; t < kc; ++t) {
            const float v = src != nullptr ? src[t] : 0.0f;
            dst[t * 2 * kMr + r] = v;
            dst[t * 2 * kMr + kMr + r] = TcPairBits(TcPackedExponent(v, x_floor));
          }
        }
      }
      for (int64_t p = 0; p < job.panels; ++p) {
        const float* wv = job.wvals + (p * k + k0) * kTcAccPanelColumns;
        const int16_t* we = job.wexps + (p * k + k0) * kTcAccPanelColumns;
        TcTileState<kMr> st;
        st.lanes = static_cast<int>(
            std::clamp<int64_t>(job.nb - p * kTcAccPanelColumns, 0, kTcAccPanelColumns));
        for (int64_t tile = 0; tile < tiles; ++tile) {
          for (int r = 0; r < kMr; ++r) {
            const int64_t row = tile * kMr + r;
            if (row < rows) {
              st.state[r] = job.acc + (i0 + row) * job.ldc + p * kTcAccPanelColumns;
              st.partial[r] = scratch.partial + row * width + p * kTcAccPanelColumns;
            } else {
              st.state[r] = st.partial[r] = dummy[r];
            }
          }
          job.tile(job.walk, k0, k1, scratch.xpack + tile * kc * 2 * kMr, wv, we, job.vm, st,
                   k0 == 0);
        }
      }
      k0 = k1;
    }
    // The pairs outside the vector path's range.
    for (int64_t r = 0; r < rows; ++r) {
      if (TcRowAllOk(rows_line[r], job.col_sum, job.bounds)) continue;
      const float* xi = job.x + (i0 + r) * k;
      for (int64_t j = 0; j < job.nb; ++j) {
        if (TcPairOk(rows_line[r], job.cols[j], job.bounds)) continue;
        job.acc[(i0 + r) * job.ldc + j] =
            TcAccElement(xi, job.w, job.out_in, j, k, job.ldw, *job.order);
      }
    }
  }
}

// Panels [p_begin, p_end) of w (16 columns each, zero beyond nb): values
// and packed exponents, and the columns' lines.
void PackTcAccPanels(const float* w, bool out_in, int64_t nb, int64_t k, int64_t ldw, int w_floor,
                     int64_t p_begin, int64_t p_end, float* wvals, int16_t* wexps, TcLine* cols) {
  for (int64_t p = p_begin; p < p_end; ++p) {
    TcLine lines[kTcAccPanelColumns];
    const int64_t lanes = std::clamp<int64_t>(nb - p * kTcAccPanelColumns, 0, kTcAccPanelColumns);
    for (int64_t kk = 0; kk < k; ++kk) {
      float* dv = wvals + (p * k + kk) * kTcAccPanelColumns;
      int16_t* de = wexps + (p * k + kk) * kTcAccPanelColumns;
      for (int64_t c = 0; c < kTcAccPanelColumns; ++c) {
        const int64_t j = p * kTcAccPanelColumns + c;
        const float v = c >= lanes ? 0.0f : out_in ? w[j * k + kk] : w[kk * ldw + j];
        TcLineAdd(&lines[c], v);
        dv[c] = v;
        // Biased by 127 only once over the pair: x's packed exponent plus
        // w's is a float's biased exponent field.
        const int16_t e = TcPackedExponent(v, w_floor);
        de[c] = e == kTcZeroExponent ? e : static_cast<int16_t>(e - 127);
      }
    }
    for (int64_t c = 0; c < lanes; ++c) cols[p * kTcAccPanelColumns + c] = lines[c];
  }
}

// 64-byte aligned storage within an allocation of 64 bytes more.
template <typename T>
T* AlignTo64(T* p) {
  const uintptr_t u = reinterpret_cast<uintptr_t>(p);
  return reinterpret_cast<T*>((u + 63) & ~uintptr_t{63});
}

#undef TC_AVX512_INLINE
#undef TC_AVX512_TARGET
#undef TC_AVX2_INLINE
#undef TC_AVX2_TARGET
#endif  // x86-64 GCC/Clang

}  // namespace

absl::Status TensorCoreAccumulate(const float* x, const float* w, WeightLayout layout, int64_t m,
                                  int64_t nb, int64_t k, int64_t ldw, const KernelOrder& order,
                                  int threads, float* acc, int64_t ldc, const StopSignal* stop) {
  const bool out_in = layout == WeightLayout::kOutIn;
  if (m == 0 || nb == 0) return CheckStop(stop);
#ifdef TC_TCACC_AVX2
  if (UseAvx2Kernel("TENSORCHECK_TCACC_SCALAR") && TcVectorModelOk(order, k)) {
    TcAccJob job;
    job.x = x;
    job.w = w;
    job.out_in = out_in;
    job.nb = nb;
    job.k = k;
    job.ldw = ldw;
    job.order = &order;
    job.panels = (nb + kTcAccPanelColumns - 1) / kTcAccPanelColumns;
    job.bounds = BoundsOf(order, k);
    job.walk = WalkOf(order, k);
    job.vm = VecModelOf(order.model, job.bounds);
    job.acc = acc;
    job.ldc = ldc;
    job.tile = ChooseTcAccTile();
    const int64_t packed = job.panels * k * kTcAccPanelColumns;
    TC_ASSIGN_OR_RETURN(std::unique_ptr<float[]> wvals, Allocate<float>(packed + 16));
    TC_ASSIGN_OR_RETURN(std::unique_ptr<int16_t[]> wexps, Allocate<int16_t>(packed + 32));
    TC_ASSIGN_OR_RETURN(std::unique_ptr<TcLine[]> cols, Allocate<TcLine>(nb));
    job.wvals = AlignTo64(wvals.get());
    job.wexps = AlignTo64(wexps.get());
    {
      float* wv = AlignTo64(wvals.get());
      int16_t* we = AlignTo64(wexps.get());
      TcLine* cl = cols.get();
      const int w_floor = order.model.b_min_exponent;
      SplitRows(job.panels, kTcAccPanelColumns, k, threads, [=](int64_t begin, int64_t end) {
        PackTcAccPanels(w, out_in, nb, k, ldw, w_floor, begin, end, wv, we, cl);
      });
    }
    job.cols = cols.get();
    for (int64_t j = 0; j < nb; ++j) {
      const TcLine& c = job.cols[j];
      job.col_sum.all_ok = job.col_sum.all_ok && c.ok;
      if (!c.ok || c.Empty()) continue;
      job.col_sum.hull.amin = std::min(job.col_sum.hull.amin, c.amin);
      job.col_sum.hull.amax = std::max(job.col_sum.hull.amax, c.amax);
      job.col_sum.nmin = std::min(job.col_sum.nmin, std::max(c.amin, job.bounds.w_floor));
    }
    // Scratch per thread, handed out as the row ranges start (SplitRows
    // runs at most min(threads, m) nonempty ones).
    const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(threads, m));
    int64_t max_chunk = 0;
    for (int64_t k0 = 0; k0 < k; k0 = job.walk.ChunkEnd(k0)) {
      max_chunk = std::max(max_chunk, job.walk.ChunkEnd(k0) - k0);
    }
    const int64_t xpack_size = kTcAccRowBlock * 2 * max_chunk;
    const int64_t partial_size =
        job.walk.piece > 0 ? kTcAccRowBlock * job.panels * kTcAccPanelColumns : 0;
    TC_ASSIGN_OR_RETURN(std::unique_ptr<float[]> scratch,
                        Allocate<float>(parts * (xpack_size + partial_size)));
    std::atomic<int64_t> next_scratch{0};
    // At least a row block per slice, whole row blocks.
    const int64_t per_row = nb * std::max<int64_t>(k, 1);
    const int64_t slice_rows =
        std::max<int64_t>(1, kTcAccSliceMacs / per_row / kTcAccRowBlock) * kTcAccRowBlock;
    const TcAccJob* jp = &job;
    float* scratch_base = scratch.get();
    SplitRows(m, nb, k, threads, [&, jp, scratch_base](int64_t begin, int64_t end) {
      if (begin >= end) return;
      const int64_t index = next_scratch.fetch_add(1);
      if (index >= parts) {  // not expected: the portable path
        RowsInSlices(begin, end, nb, k, kTcAccScalarSliceMacs, stop, [&](int64_t b, int64_t e) {
          TcAccRowsScalar(x, w, out_in, b, e, nb, k, ldw, order, acc, ldc);
        });
        return;
      }
      TcAccScratch s;
      s.xpack = scratch_base + index * (xpack_size + partial_size);
      s.partial = s.xpack + xpack_size;
      RowsInSlices(begin, end, nb, k, slice_rows * per_row, stop,
                   [&](int64_t b, int64_t e) { TcAccRowsVector(*jp, s, b, e, stop); });
    });
    return CheckStop(stop);
  }
#endif
  SplitRows(m, nb, k, threads, [=, &order](int64_t begin, int64_t end) {
    RowsInSlices(begin, end, nb, k, kTcAccScalarSliceMacs, stop, [=, &order](int64_t b, int64_t e) {
      TcAccRowsScalar(x, w, out_in, b, e, nb, k, ldw, order, acc, ldc);
    });
  });
  return CheckStop(stop);
}

}  // namespace tensorcheck::internal
