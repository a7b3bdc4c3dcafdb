#include "core/tensor_core_model.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace tensorcheck {

namespace {

int InputMinExponent(TensorCoreInput input) {
  switch (input) {
    case TensorCoreInput::kFp16:
    case TensorCoreInput::kE5M2:
      return -14;
    case TensorCoreInput::kBf16:
    case TensorCoreInput::kTf32:
      return -126;
    case TensorCoreInput::kE4M3:
      return -6;
  }
  return -126;
}

// fp32's smallest normal exponent: the accumulator's subnormals sit on
// the grid of 2^(kFp32MinExponent - (result_bits - 1)).
constexpr int kFp32MinExponent = -126;

// The exponent of a term's leading position as the hardware sees it: a
// value below the format's normal range counts as having its smallest
// normal exponent (a significand below 1).
int NominalExponent(double v, int min_exponent) { return std::max(std::ilogb(v), min_exponent); }

// S * 2^scale (S != 0) rounded to `bits` significant bits, with fp32's
// subnormal grid below 2^-126 (a sum below it may become a zero of its
// sign); an infinity beyond fp32's range.
float RoundBlockSum(int64_t s, int scale, int bits, TensorCoreRounding rounding) {
  const bool negative = s < 0;
  uint64_t m = negative ? 0 - static_cast<uint64_t>(s) : static_cast<uint64_t>(s);
  int length = 0;
  for (uint64_t t = m; t != 0; t >>= 1) ++length;
  const int exponent = scale + length - 1;
  const int quantum = std::max(exponent, kFp32MinExponent) - (bits - 1);
  const int shift = quantum - scale;
  int result_scale = scale;
  if (shift > 0) {
    const uint64_t kept = shift >= 64 ? 0 : m >> shift;
    if (rounding == TensorCoreRounding::kNearestEven && shift < 64) {
      // The dropped bits against half a unit of the kept ones.
      const uint64_t half = uint64_t{1} << (shift - 1);
      const uint64_t dropped = m & ((half << 1) - 1);
      m = kept + ((dropped > half || (dropped == half && (kept & 1))) ? 1 : 0);
    } else {
      m = kept;  // toward zero; or shift >= 64, where m is below half a unit
    }
    result_scale = quantum;
  }
  // m has at most bits + 1 significant bits: exact in double and, once
  // within fp32's range, in float.
  const double v = std::ldexp(static_cast<double>(m), result_scale);
  if (v >= 0x1p128) {
    return negative ? -std::numeric_limits<float>::infinity()
                    : std::numeric_limits<float>::infinity();
  }
  return static_cast<float>(negative ? -v : v);
}

}  // namespace

absl::StatusOr<TensorCoreModel> TensorCoreModelFor(TensorCoreGpu gpu, TensorCoreInput input) {
  const bool fp8 = input == TensorCoreInput::kE4M3 || input == TensorCoreInput::kE5M2;
  TensorCoreModel m;
  m.input_min_exponent = InputMinExponent(input);
  m.b_min_exponent = m.input_min_exponent;
  switch (gpu) {
    case TensorCoreGpu::kSm80:
      if (fp8) return absl::InvalidArgumentError("tensor core model: sm_80 has no FP8 inputs");
      // A100TC.m: FMA size 8 (4 for TF32), one extra alignment bit.
      m.block = input == TensorCoreInput::kTf32 ? 4 : 8;
      m.align_bits = 23 + 1;
      m.min_align_exponent = -132;
      break;
    case TensorCoreGpu::kSm90:
      // H100TC.m: FMA size 16 (8 for TF32), two extra alignment bits; FP8
      // 32 products and 13 fraction bits, the result truncated to 14
      // significant bits (neab = -10).
      m.block = input == TensorCoreInput::kTf32 ? 8 : 16;
      m.align_bits = 23 + 2;
      m.min_align_exponent = -133;
      if (fp8) {
        m.block = 32;
        m.align_bits = 13;
        m.result_bits = 14;
      }
      break;
    case TensorCoreGpu::kSm100:
      // B200TC.m: as sm_90 for 16- and 19-bit inputs; FP8 32 products at
      // full fp32 width.
      m.block = input == TensorCoreInput::kTf32 ? 8 : 16;
      m.align_bits = 23 + 2;
      m.min_align_exponent = -133;
      if (fp8) m.block = 32;
      break;
  }
  return m;
}

absl::StatusOr<TensorCoreModel> TensorCoreModelFor(TensorCoreGpu gpu, TensorCoreInput a_input,
                                                   TensorCoreInput b_input) {
  const bool a_fp8 = a_input == TensorCoreInput::kE4M3 || a_input == TensorCoreInput::kE5M2;
  const bool b_fp8 = b_input == TensorCoreInput::kE4M3 || b_input == TensorCoreInput::kE5M2;
  if (a_input != b_input && !(a_fp8 && b_fp8)) {
    return absl::InvalidArgumentError("tensor core model: only the FP8 formats mix (E4M3 x E5M2)");
  }
  TC_ASSIGN_OR_RETURN(TensorCoreModel m, TensorCoreModelFor(gpu, a_input));
  m.b_min_exponent = InputMinExponent(b_input);
  return m;
}

const char* TensorCoreGpuName(TensorCoreGpu gpu) {
  switch (gpu) {
    case TensorCoreGpu::kSm80:
      return "sm80";
    case TensorCoreGpu::kSm90:
      return "sm90";
    case TensorCoreGpu::kSm100:
      return "sm100";
  }
  return "unknown";
}

absl::StatusOr<TensorCoreGpu> ParseTensorCoreGpu(absl::string_view name, absl::string_view field) {
  for (TensorCoreGpu g : {TensorCoreGpu::kSm80, TensorCoreGpu::kSm90, TensorCoreGpu::kSm100}) {
    if (name == TensorCoreGpuName(g)) return g;
  }
  return absl::InvalidArgumentError(absl::StrCat(field, ": unknown tensor-core generation '", name,
                                                 "'; expected sm80, sm90 or sm100"));
}

const char* KResidueName(KResidue r) { return r == KResidue::kFirst ? "first" : "last"; }

float TensorCoreDot(const float* a, const float* b, int64_t b_stride, int64_t k, float c,
                    const TensorCoreModel& model) {
  // Specials first, over the whole dot product (the models' GEMM does the
  // same): they never enter the aligned sum.
  {
    bool nan = std::isnan(c), pos_inf = c == INFINITY, neg_inf = c == -INFINITY;
    for (int64_t i = 0; i < k; ++i) {
      const double p = static_cast<double>(a[i]) * static_cast<double>(b[i * b_stride]);
      nan = nan || std::isnan(p);
      pos_inf = pos_inf || p == INFINITY;
      neg_inf = neg_inf || p == -INFINITY;
    }
    if (nan || (pos_inf && neg_inf)) return std::numeric_limits<float>::quiet_NaN();
    if (pos_inf) return std::numeric_limits<float>::infinity();
    if (neg_inf) return -std::numeric_limits<float>::infinity();
  }
  const int64_t block = std::clamp(model.block, 1, kMaxTensorCoreBlock);
  const int bits = model.align_bits;
  float acc = c;
  double products[kMaxTensorCoreBlock];
  for (int64_t start = 0; start < k; start += block) {
    if (!std::isfinite(acc)) break;  // an overflowed block: inf + finite
    const int64_t count = std::min(block, k - start);
    // The largest exponent among the nonzero products (each as its two
    // inputs' exponents summed: the product's significand, in [0, 4),
    // is not normalised) and a nonzero accumulator.
    int e_max = INT_MIN;
    int n = 0;
    for (int64_t i = 0; i < count; ++i) {
      const float x = a[start + i], y = b[(start + i) * b_stride];
      if (x == 0 || y == 0) continue;
      // Exact: two inputs of at most 11 significant bits.
      products[n] = static_cast<double>(x) * static_cast<double>(y);
      e_max = std::max(e_max, NominalExponent(x, model.input_min_exponent) +
                                  NominalExponent(y, model.b_min_exponent));
      ++n;
    }
    if (acc != 0) e_max = std::max(e_max, NominalExponent(acc, kFp32MinExponent));
    if (e_max == INT_MIN) {
      acc = 0;  // all zero: +0
      continue;
    }
    e_max = std::max(e_max, model.min_align_exponent);
    // Every term truncated toward zero to a multiple of 2^(e_max - bits),
    // counted in those units (below 2^(bits + 2) each: exact in double
    // and int64).
    const int scale = e_max - bits;
    auto units = [&](double v) -> int64_t {
      const int64_t u = static_cast<int64_t>(std::floor(std::ldexp(std::fabs(v), -scale)));
      return v < 0 ? -u : u;
    };
    int64_t sum = units(static_cast<double>(acc));
    for (int i = 0; i < n; ++i) sum += units(products[i]);
    acc = sum == 0 ? 0.0f : RoundBlockSum(sum, scale, model.result_bits, model.rounding);
  }
  return acc;
}

float KernelOrderDot(const float* a, const float* b, int64_t b_stride, int64_t k,
                     const KernelOrder& order) {
  const int64_t offset = std::min(order.Offset(k), k);
  // The walk's segments: [0, offset), then the rest, one chain or
  // `promote`-long pieces; each starts its blocks afresh.
  if (order.promote <= 0) {
    const float c = TensorCoreDot(a, b, b_stride, offset, 0.0f, order.model);
    return TensorCoreDot(a + offset, b + offset * b_stride, b_stride, k - offset, c, order.model);
  }
  // The separate accumulator starts at +0 and takes each piece's partial
  // sum with one fp32 addition.
  float acc = 0.0f;
  auto promote = [&](int64_t begin, int64_t end) {
    acc += TensorCoreDot(a + begin, b + begin * b_stride, b_stride, end - begin, 0.0f, order.model);
  };
  if (offset > 0) promote(0, offset);
  for (int64_t s = offset; s < k; s += order.promote) promote(s, std::min(k, s + order.promote));
  return acc;
}

}  // namespace tensorcheck
