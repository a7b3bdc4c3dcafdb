#include "server/backends/cpu/internal/fp8_accumulate.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdint>
#include <memory>

#include "core/float_formats.h"
#include "core/status_macros.h"
#include "server/backends/cpu/internal/allocate.h"
#include "server/backends/cpu/internal/avx2_dispatch.h"
#include "server/backends/cpu/internal/split_rows.h"

namespace tensorcheck::internal {

namespace {

// The scalar model costs a few nanoseconds per product: slices of about
// 20 ms.
constexpr int64_t kFastAccumSliceMacs = int64_t{1} << 22;

// Row xi of x against column j of w, by FastAccumDot, the model's
// definition.
float FastAccumElement(const float* xi, const float* w, bool out_in, int64_t j, int64_t k,
                       int64_t ldw, const FastAccumModel& model) {
  return out_in ? FastAccumDot(xi, w + j * k, 1, k, model) : FastAccumDot(xi, w + j, ldw, k, model);
}

// Every element by FastAccumElement: the portable path, and the vectorised
// path's fallback for rows it does not cover.
void FastAccumRowsScalar(const float* x, const float* w, bool out_in, int64_t row_begin,
                         int64_t row_end, int64_t nb, int64_t k, int64_t ldw,
                         const FastAccumModel& model, float* acc, int64_t ldc) {
  for (int64_t i = row_begin; i < row_end; ++i) {
    for (int64_t j = 0; j < nb; ++j) {
      acc[i * ldc + j] = FastAccumElement(x + i * k, w, out_in, j, k, ldw, model);
    }
  }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define TC_FP8ACC_AVX2 1

// ---- Fast accumulation, AVX2 (selected at run time: UseAvx2Kernel).
//
// The same floats as FastAccumDot, eight output columns per register, in
// fp32 instead of fp64: where the conditions below hold, every operation
// of the model is exact in both, so both compute the same real numbers.
//
// Inputs ("narrow" values, IsNarrowFp8): 0, or finite with |v| in
// [2^-16, 2^16) and at most 4 significant bits (every e4m3fn and e5m2
// value but inf/NaN). Products then have at most 8 significant bits and
// |p| in [2^-32, 2^32): exact in fp32.
// Model: 0 <= bits <= 23 and (group + 1) 2^(bits + 1) <= 2^24 (bits = 13
// with group <= 1023; the default 13/32 uses 2^19.1). k < 2^40.
//
// One group, per accumulator (a lane):
//   E      = exponent of max(|acc|, |p_i|) (the model's e_max: nonzero
//            values are normal fp32, so the exponent field orders them;
//            all zero gives field 0, where the model skips the group and
//            so does the blend at the end).
//   inv    = 2^(bits - E), q = 2^(E - bits), built in the exponent field.
//   n      = trunc(acc * inv) + sum_i trunc(p_i * inv)
//            v * inv is v / q exactly (powers of two, in range: below),
//            so trunc(v * inv) q is the model's TruncateTo(v, q). Each
//            term is an integer below 2^(bits + 1) in magnitude, so every
//            partial sum of the group + 1 terms is an integer below 2^24:
//            exact in fp32 in any order, as the model's fp64 sum is. Its
//            sign when zero: -0 only if every term is -0, in any order.
//   s      = n * q (exact), then truncated toward zero to bits + 1
//            significant bits by clearing the low 23 - bits fraction bits
//            (the model's normalisation; a zero stays as it is).
// Ranges: |acc| <= sum |p_i| < 2^72; a nonzero acc is a multiple of a
// quantum of a group with a nonzero product, >= 2^(-32 - bits), so
// -55 <= E <= 72: q, inv and n q are normal fp32 values. trunc of a
// v * inv that falls below the normal range is still +-0 with v's sign.
// The result is then acc itself (at most 24 significant bits), as the
// model's static_cast<float>.
// Rows of x or columns of w holding other values (inf, NaN, fp32
// subnormals, wider values) and models outside the range above go to
// FastAccumDot.

#define TC_AVX2_TARGET __attribute__((target("avx2,fma")))

// Register tile: kMr rows x kNv * 8 columns. 4 x 8 ran about 20% faster
// than 2 x 16 and 1.6x faster than 1 x 32 at 256x4096->1024 (one thread).
constexpr int kFp8AccMr = 4;
constexpr int kFp8AccNv = 1;
constexpr int64_t kFp8AccNr = 8 * kFp8AccNv;

// The vector kernel's slices: a few tens of milliseconds on one core.
constexpr int64_t kFp8AccSliceMacs = int64_t{1} << 26;

inline bool IsNarrowFp8(float v) {
  const uint32_t u = FloatBits(v) & 0x7FFFFFFFu;
  if (u == 0) return true;
  if ((u & 0xFFFFFu) != 0) return false;  // more than 4 significant bits
  const uint32_t e = u >> 23;
  return e >= 127 - 16 && e < 127 + 16;
}

bool VectorModelOk(const FastAccumModel& model, int64_t k) {
  const int64_t group = std::clamp<int64_t>(model.group, 1, kMaxFastAccumGroup);
  const int bits = model.accumulator_bits;
  return bits >= 0 && bits <= 23 && ((group + 1) << (bits + 1)) <= (int64_t{1} << 24) &&
         k < (int64_t{1} << 40);
}

// rows (<= kMr) rows of x (xr[r], k values each) against one packed panel
// (wp[kk * kNr + c]); out[r][c] gets the model's sums. pbuf: scratch for a
// group's products.
template <int kMr>
TC_AVX2_TARGET void Fp8AccTile(const float* const* xr, const float* wp, int64_t k, int64_t group,
                               int bits, float (*out)[kFp8AccNr], float* pbuf) {
  constexpr int kNv = kFp8AccNv;
  constexpr int64_t kNr = kFp8AccNr;
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256i inv_base = _mm256_set1_epi32(254 + bits);
  const __m256i bits_v = _mm256_set1_epi32(bits);
  const __m256 norm_mask =
      _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(~((1u << (23 - bits)) - 1u))));
  __m256 acc[kMr][kNv];
#pragma GCC unroll 8
  for (int r = 0; r < kMr; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < kNv; ++v) acc[r][v] = _mm256_setzero_ps();
  }
  for (int64_t start = 0; start < k; start += group) {
    const int64_t count = std::min(group, k - start);
    __m256 amax[kMr][kNv];
#pragma GCC unroll 8
    for (int r = 0; r < kMr; ++r) {
#pragma GCC unroll 8
      for (int v = 0; v < kNv; ++v) amax[r][v] = _mm256_and_ps(acc[r][v], abs_mask);
    }
    // Pass 1: the products (exact), kept for pass 2, and their largest
    // magnitude.
    const float* wg = wp + start * kNr;
    for (int64_t t = 0; t < count; ++t) {
      __m256 w[kNv];
#pragma GCC unroll 8
      for (int v = 0; v < kNv; ++v) w[v] = _mm256_loadu_ps(wg + t * kNr + 8 * v);
#pragma GCC unroll 8
      for (int r = 0; r < kMr; ++r) {
        const __m256 xb = _mm256_broadcast_ss(xr[r] + start + t);
#pragma GCC unroll 8
        for (int v = 0; v < kNv; ++v) {
          const __m256 p = _mm256_mul_ps(xb, w[v]);
          _mm256_store_ps(pbuf + ((t * kMr + r) * kNv + v) * 8, p);
          amax[r][v] = _mm256_max_ps(amax[r][v], _mm256_and_ps(p, abs_mask));
        }
      }
    }
    // Pass 2: the terms, truncated to multiples of q, summed as integers.
    __m256i ef[kMr][kNv];
    __m256 inv[kMr][kNv], n[kMr][kNv];
#pragma GCC unroll 8
    for (int r = 0; r < kMr; ++r) {
#pragma GCC unroll 8
      for (int v = 0; v < kNv; ++v) {
        ef[r][v] = _mm256_srli_epi32(_mm256_castps_si256(amax[r][v]), 23);
        inv[r][v] =
            _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_sub_epi32(inv_base, ef[r][v]), 23));
        n[r][v] = _mm256_round_ps(_mm256_mul_ps(acc[r][v], inv[r][v]),
                                  _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
      }
    }
    for (int64_t t = 0; t < count; ++t) {
#pragma GCC unroll 8
      for (int r = 0; r < kMr; ++r) {
#pragma GCC unroll 8
        for (int v = 0; v < kNv; ++v) {
          const __m256 p = _mm256_load_ps(pbuf + ((t * kMr + r) * kNv + v) * 8);
          n[r][v] = _mm256_add_ps(n[r][v], _mm256_round_ps(_mm256_mul_ps(p, inv[r][v]),
                                                           _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC));
        }
      }
    }
    // Back to the accumulator: n q, bits + 1 significant bits; an all-zero
    // group leaves it as it was.
#pragma GCC unroll 8
    for (int r = 0; r < kMr; ++r) {
#pragma GCC unroll 8
      for (int v = 0; v < kNv; ++v) {
        const __m256 q =
            _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_sub_epi32(ef[r][v], bits_v), 23));
        const __m256 s = _mm256_and_ps(_mm256_mul_ps(n[r][v], q), norm_mask);
        const __m256 zero = _mm256_cmp_ps(amax[r][v], _mm256_setzero_ps(), _CMP_EQ_OQ);
        acc[r][v] = _mm256_blendv_ps(s, acc[r][v], zero);
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < kMr; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < kNv; ++v) _mm256_storeu_ps(&out[r][8 * v], acc[r][v]);
  }
}

// Rows [row_begin, row_end): the narrow rows in tiles against every panel,
// the others (and the elements of columns that are not narrow) by
// FastAccumDot.
TC_AVX2_TARGET void Fp8AccRowsAvx2(const float* x, const float* w, bool out_in, const float* wpack,
                                   const uint8_t* col_ok, bool all_cols_ok, int64_t row_begin,
                                   int64_t row_end, int64_t nb, int64_t k, int64_t ldw,
                                   const FastAccumModel& model, float* acc, int64_t ldc) {
  constexpr int kMr = kFp8AccMr;
  constexpr int64_t kNr = kFp8AccNr;
  const int64_t group = std::clamp<int64_t>(model.group, 1, kMaxFastAccumGroup);
  const int bits = model.accumulator_bits;
  alignas(32) float pbuf[kMaxFastAccumGroup * kMr * kFp8AccNr];
  float out[kMr][kNr];
  const float* xr[kMr];
  int64_t rows[kMr];
  int have = 0;
  auto flush = [&](int count) {
    for (int64_t jr = 0; jr < nb; jr += kNr) {
      const float* wp = wpack + (jr / kNr) * k * kNr;
      if (count == kMr) {
        Fp8AccTile<kMr>(xr, wp, k, group, bits, out, pbuf);
      } else {
        // The last rows of a slice, one at a time.
        for (int r = 0; r < count; ++r) Fp8AccTile<1>(xr + r, wp, k, group, bits, out + r, pbuf);
      }
      const int64_t cols = std::min(kNr, nb - jr);
      for (int r = 0; r < count; ++r) std::copy(out[r], out[r] + cols, acc + rows[r] * ldc + jr);
    }
    if (!all_cols_ok) {
      for (int r = 0; r < count; ++r) {
        for (int64_t j = 0; j < nb; ++j) {
          if (col_ok[j] == 0)
            acc[rows[r] * ldc + j] = FastAccumElement(xr[r], w, out_in, j, k, ldw, model);
        }
      }
    }
  };
  for (int64_t i = row_begin; i < row_end; ++i) {
    const float* xi = x + i * k;
    if (!std::all_of(xi, xi + k, IsNarrowFp8)) {
      FastAccumRowsScalar(x, w, out_in, i, i + 1, nb, k, ldw, model, acc, ldc);
      continue;
    }
    xr[have] = xi;
    rows[have] = i;
    if (++have == kMr) {
      flush(kMr);
      have = 0;
    }
  }
  if (have > 0) flush(have);
}

// w as panels of kNr columns, [ceil(nb / kNr)][k][kNr], the last padded
// with zeros; col_ok[j]: whether column j holds narrow values only.
// Returns whether all do.
bool PackFp8AccWeight(const float* w, bool out_in, int64_t nb, int64_t k, int64_t ldw, float* wpack,
                      uint8_t* col_ok) {
  constexpr int64_t kNr = kFp8AccNr;
  const int64_t panels = (nb + kNr - 1) / kNr;
  std::fill(col_ok, col_ok + nb, uint8_t{1});
  for (int64_t p = 0; p < panels; ++p) {
    float* dst = wpack + p * k * kNr;
    for (int64_t kk = 0; kk < k; ++kk) {
      for (int64_t c = 0; c < kNr; ++c) {
        const int64_t j = p * kNr + c;
        float v = 0.0f;
        if (j < nb) {
          v = out_in ? w[j * k + kk] : w[kk * ldw + j];
          if (!IsNarrowFp8(v)) col_ok[j] = 0;
        }
        dst[kk * kNr + c] = v;
      }
    }
  }
  return std::all_of(col_ok, col_ok + nb, [](uint8_t ok) { return ok != 0; });
}

#undef TC_AVX2_TARGET
#endif  // x86-64 GCC/Clang

}  // namespace

absl::Status Fp8FastAccumulate(const float* x, const float* w, WeightLayout layout, int64_t m,
                               int64_t nb, int64_t k, int64_t ldw, const FastAccumModel& model,
                               int threads, float* acc, int64_t ldc, const StopSignal* stop) {
  const bool out_in = layout == WeightLayout::kOutIn;
  if (m == 0 || nb == 0) return CheckStop(stop);
#ifdef TC_FP8ACC_AVX2
  if (UseAvx2Kernel("TENSORCHECK_FP8ACC_SCALAR") && VectorModelOk(model, k)) {
    const int64_t panels = (nb + kFp8AccNr - 1) / kFp8AccNr;
    TC_ASSIGN_OR_RETURN(std::unique_ptr<float[]> wpack, Allocate<float>(panels * kFp8AccNr * k));
    TC_ASSIGN_OR_RETURN(std::unique_ptr<uint8_t[]> col_ok, Allocate<uint8_t>(nb));
    const bool all_ok = PackFp8AccWeight(w, out_in, nb, k, ldw, wpack.get(), col_ok.get());
    const float* wp = wpack.get();
    const uint8_t* ok = col_ok.get();
    SplitRows(m, nb, k, threads, [=, &model](int64_t begin, int64_t end) {
      RowsInSlices(begin, end, nb, k, kFp8AccSliceMacs, stop, [=, &model](int64_t b, int64_t e) {
        Fp8AccRowsAvx2(x, w, out_in, wp, ok, all_ok, b, e, nb, k, ldw, model, acc, ldc);
      });
    });
    return CheckStop(stop);
  }
#endif
  SplitRows(m, nb, k, threads, [=, &model](int64_t begin, int64_t end) {
    RowsInSlices(begin, end, nb, k, kFastAccumSliceMacs, stop, [=, &model](int64_t b, int64_t e) {
      FastAccumRowsScalar(x, w, out_in, b, e, nb, k, ldw, model, acc, ldc);
    });
  });
  return CheckStop(stop);
}

}  // namespace tensorcheck::internal
