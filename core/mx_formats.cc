#include "core/mx_formats.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace tensorcheck {

// ---- FP4 E2M1.

float Fp4E2M1BitsToFloat(uint8_t code) {
  static constexpr float kMagnitude[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float m = kMagnitude[code & 0x7u];
  return (code & 0x8u) ? -m : m;
}

uint8_t DoubleToFp4E2M1Bits(double d) {
  if (std::isnan(d)) return 0x7;  // CUDA's satfinite: positive MAX_NORM
  const uint8_t sign = std::signbit(d) ? 0x8u : 0u;
  const double a = std::fabs(d);
  // 5 is the tie between 4 (0x6, even) and 6 (0x7): above it, and every
  // infinity, saturates.
  if (a > 5.0) return sign | 0x7u;
  if (a == 0) return sign;
  // The quantum at a's exponent (no smaller than the subnormal one, 0.5:
  // the least normal is 1), and a rounded to a multiple of it, once.
  const int e = std::max(std::ilogb(a), 0);
  const double quantum = std::ldexp(1.0, e - 1);
  const double r = std::nearbyint(a / quantum) * quantum;
  if (r < 1.0) return sign | static_cast<uint8_t>(r * 2);  // 0 or 0.5 (subnormal)
  const int r_exp = std::ilogb(r);                         // e, or e + 1 on a carry
  const int mantissa = static_cast<int>(std::ldexp(r, 1 - r_exp)) - 2;
  return sign | static_cast<uint8_t>(((r_exp + 1) << 1) | mantissa);
}

// ---- UE8M0.

float E8M0BitsToFloat(uint8_t bits) {
  if (bits == 0xff) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, static_cast<int>(bits) - 127);  // 2^-127 is an fp32 subnormal
}

uint8_t DoubleToE8M0Bits(double v) {
  if (!(v > 0) || std::isinf(v)) return 0xff;
  int e = 0;
  const double m = std::frexp(v, &e);  // v = m * 2^e, m in [0.5, 1)
  // v = (2m) * 2^(e-1), 2m in [1, 2): up when 2m > 1.5, ties to even code.
  int exponent = e - 1;
  const double frac = 2 * m;
  const int code_down = exponent + 127;
  if (frac > 1.5 || (frac == 1.5 && (code_down & 1) == 1)) ++exponent;
  return static_cast<uint8_t>(std::clamp(exponent, -127, 127) + 127);
}

// ---- Block-scaled tensors.

int BlockSize(BlockFormat format) { return format == BlockFormat::kNvFp4 ? 16 : 32; }

namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

absl::Status CheckView(absl::Span<const float> values, int64_t outer, int64_t inner,
                       const char* what) {
  if (outer < 0 || inner < 0 || (inner != 0 && outer > INT64_MAX / inner) ||
      static_cast<int64_t>(values.size()) != outer * inner) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": [", outer, ", ", inner,
                                                   "] does not match ", values.size(), " values"));
  }
  return absl::OkStatus();
}

// The result's shape fields and the blocks: block b (its scale index)
// holds `count` elements from `start`, `stride` apart.
struct Block {
  int64_t start;
  int64_t count;
  int64_t stride;
};

BlockScaled Shaped(BlockFormat format, int64_t outer, int64_t inner, bool per_column) {
  BlockScaled q;
  q.format = format;
  q.outer = outer;
  q.inner = inner;
  q.per_column = per_column;
  const int64_t b = BlockSize(format);
  q.scale_rows = per_column ? CeilDiv(outer, b) : outer;
  q.scale_cols = per_column ? inner : CeilDiv(inner, b);
  q.codes.resize(static_cast<size_t>(outer * inner));
  q.scales.resize(static_cast<size_t>(q.scale_rows * q.scale_cols));
  return q;
}

Block BlockAt(const BlockScaled& q, int64_t scale_row, int64_t scale_col) {
  const int64_t b = BlockSize(q.format);
  if (q.per_column) {
    const int64_t first = scale_row * b;
    return {first * q.inner + scale_col, std::min(b, q.outer - first), q.inner};
  }
  const int64_t first = scale_col * b;
  return {scale_row * q.inner + first, std::min(b, q.inner - first), 1};
}

// The scale index of element i.
int64_t ScaleIndexOf(const BlockScaled& q, int64_t i) {
  const int64_t b = BlockSize(q.format);
  const int64_t row = i / q.inner;
  const int64_t col = i % q.inner;
  return q.per_column ? (row / b) * q.scale_cols + col : row * q.scale_cols + col / b;
}

// The largest exponent of an element format's values (floor(log2(max))):
// the OCP spec's emax_elem.
int EmaxElem(Fp8Format format) { return format == Fp8Format::kE4M3Fn ? 8 : 15; }

uint8_t MxScaleCode(float amax, Fp8Format format, MxScaleRounding rounding) {
  // torchao's to_mx: a NaN or infinite amax is the NaN scale (both modes).
  if (!std::isfinite(amax)) return 0xff;
  if (rounding == MxScaleRounding::kRceil) {
    // TransformerEngine: float_to_e8m0(amax * Quantized_Limits<T>::max_norm_rcp)
    // (util/ptx_arch_spec.cuh; cvt.rp.satfinite.ue8m0x2.f32 on Blackwell),
    // torchao's _f32_to_e8m0_rceil: the fp32 descale's biased exponent,
    // plus one when any mantissa bit is set. An fp32 subnormal descale
    // rounds to 2^-127 (byte 0) up to 2^-127 itself, above it to 2^-126.
    const float rcp = static_cast<float>(1.0 / Fp8MaxFinite(format));
    const uint32_t bits = FloatBits(amax * rcp);
    const uint32_t biased = bits >> 23;  // amax >= 0: sign clear
    const uint32_t mantissa = bits & 0x7fffffu;
    uint32_t code = biased == 0 ? (mantissa > 0x400000u ? 1u : 0u) : biased + (mantissa != 0);
    return static_cast<uint8_t>(std::min(code, 0xfeu));  // satfinite (unreachable here)
  }
  // OCP MX v1.0 section 6.3 / torchao FLOOR: floor(log2(amax)) - emax_elem,
  // clamped to E8M0's range; a zero amax takes the least, 2^-127 (torchao
  // reads the fp32 exponent field: 0 for zeros and subnormals, so any such
  // amax clamps to -127 as here).
  const int e = amax == 0 ? -127 : std::ilogb(amax) - EmaxElem(format);
  return static_cast<uint8_t>(std::clamp(e, -127, 127) + 127);
}

}  // namespace

absl::StatusOr<BlockScaled> QuantizeMxFp8(absl::Span<const float> values, int64_t outer,
                                          int64_t inner, Fp8Format format, MxScaleRounding rounding,
                                          bool per_column) {
  if (absl::Status s = CheckView(values, outer, inner, "MXFP8 quantise"); !s.ok()) return s;
  BlockScaled q =
      Shaped(format == Fp8Format::kE4M3Fn ? BlockFormat::kMxFp8E4M3 : BlockFormat::kMxFp8E5M2,
             outer, inner, per_column);
  for (int64_t sr = 0; sr < q.scale_rows; ++sr) {
    for (int64_t sc = 0; sc < q.scale_cols; ++sc) {
      const Block b = BlockAt(q, sr, sc);
      // torch.amax: NaN if any element is.
      float amax = 0.0f;
      for (int64_t t = 0; t < b.count; ++t) {
        const float a = std::fabs(values[static_cast<size_t>(b.start + t * b.stride)]);
        if (std::isnan(a) || a > amax) amax = std::isnan(amax) ? amax : a;
      }
      const uint8_t scale = MxScaleCode(amax, format, rounding);
      q.scales[static_cast<size_t>(sr * q.scale_cols + sc)] = scale;
      // v / 2^e is exact in double (and in fp32 but where it rounds to
      // zero in FP8 anyway); NaN when the scale is (0xff).
      const int e = static_cast<int>(scale) - 127;
      for (int64_t t = 0; t < b.count; ++t) {
        const size_t i = static_cast<size_t>(b.start + t * b.stride);
        const double scaled = scale == 0xff ? std::numeric_limits<double>::quiet_NaN()
                                            : std::ldexp(static_cast<double>(values[i]), -e);
        q.codes[i] = DoubleToFp8Bits(scaled, format, Fp8Overflow::kSaturate);
      }
    }
  }
  return q;
}

absl::StatusOr<BlockScaled> QuantizeNvFp4(absl::Span<const float> values, int64_t outer,
                                          int64_t inner, bool per_column) {
  if (absl::Status s = CheckView(values, outer, inner, "NVFP4 quantise"); !s.ok()) return s;
  BlockScaled q = Shaped(BlockFormat::kNvFp4, outer, inner, per_column);
  constexpr float kFloatMax = FLT_MAX;
  // TE's amax kernels (recipe/current_scaling.cu) and block amaxes use
  // fmaxf, which ignores a NaN operand.
  float amax = 0.0f;
  for (float v : values) amax = std::fmax(amax, std::fabs(v));
  // compute_global_encode_scaling_factor_FP4 (cast/nvfp4/core_nvfp4.cuh):
  // fp8_max * fp4_max / amax in fp32, at most FLT_MAX, 1 for an amax of 0
  // (and for an infinite one, whose quotient is 0).
  float s_enc = 1.0f;
  if (amax != 0.0f) {
    s_enc = std::fmin(448.0f * 6.0f / amax, kFloatMax);
    if (s_enc == 0.0f) s_enc = 1.0f;
  }
  // quantize_transpose_nvfp4.cuh: `const float S_dec_rowwise = 1.0 / S_enc`
  // (a double quotient rounded to fp32: the correctly rounded fp32 one).
  const float s_dec = static_cast<float>(1.0 / static_cast<double>(s_enc));
  q.global_amax = amax;
  q.global_encode_scale = s_enc;
  q.global_scale = s_dec;
  // compute_decoding_scaling_factor: block_amax * (S_enc * fl32(1 / 6)).
  const float multiplier = s_enc * (1.0f / 6.0f);
  for (int64_t sr = 0; sr < q.scale_rows; ++sr) {
    for (int64_t sc = 0; sc < q.scale_cols; ++sc) {
      const Block b = BlockAt(q, sr, sc);
      float block_amax = 0.0f;
      for (int64_t t = 0; t < b.count; ++t) {
        block_amax =
            std::fmax(block_amax, std::fabs(values[static_cast<size_t>(b.start + t * b.stride)]));
      }
      // The e4m3 cast is RN and satfinite (__nv_fp8_e4m3's constructor):
      // an infinity gives 448, as the kernel's fminf(., FLT_MAX) first.
      const float decode = std::fmin(block_amax * multiplier, kFloatMax);
      const uint8_t scale = DoubleToFp8Bits(decode, Fp8Format::kE4M3Fn, Fp8Overflow::kSaturate);
      q.scales[static_cast<size_t>(sr * q.scale_cols + sc)] = scale;
      // fminf(1.0f / (float(S_dec_b_fp8) * S_dec), FLT_MAX): a zero block
      // scale (1 / 0) gives FLT_MAX.
      const float denominator = Fp8BitsToFloat(scale, Fp8Format::kE4M3Fn) * s_dec;
      const float encode =
          denominator == 0.0f ? kFloatMax : std::fmin(1.0f / denominator, kFloatMax);
      for (int64_t t = 0; t < b.count; ++t) {
        const size_t i = static_cast<size_t>(b.start + t * b.stride);
        // mul.f32x2 then cvt.rn.satfinite.e2m1x2.f32 (util/ptx_arch_spec.cuh).
        const float scaled = values[i] * encode;
        q.codes[i] = DoubleToFp4E2M1Bits(scaled);
      }
    }
  }
  return q;
}

float BlockScaleValue(BlockFormat format, uint8_t scale_code) {
  return format == BlockFormat::kNvFp4 ? Fp8BitsToFloat(scale_code, Fp8Format::kE4M3Fn)
                                       : E8M0BitsToFloat(scale_code);
}

std::vector<float> DequantizeBlockScaled(const BlockScaled& q) {
  std::vector<float> out(q.codes.size());
  for (size_t i = 0; i < q.codes.size(); ++i) {
    const float scale = BlockScaleValue(
        q.format, q.scales[static_cast<size_t>(ScaleIndexOf(q, static_cast<int64_t>(i)))]);
    float value;
    switch (q.format) {
      case BlockFormat::kMxFp8E4M3:
        value = Fp8BitsToFloat(q.codes[i], Fp8Format::kE4M3Fn);
        break;
      case BlockFormat::kMxFp8E5M2:
        value = Fp8BitsToFloat(q.codes[i], Fp8Format::kE5M2);
        break;
      case BlockFormat::kNvFp4:
      default:
        value = Fp4E2M1BitsToFloat(q.codes[i]);
        break;
    }
    out[i] = value * scale;
  }
  return out;
}

// ---- Swizzled scale layout.

namespace {

constexpr int64_t kTileRows = 128;
constexpr int64_t kTileCols = 4;
constexpr int64_t kTileBytes = kTileRows * kTileCols;  // 512

absl::Status CheckScaleShape(int64_t rows, int64_t cols) {
  // Below 2^31 each: the padded length fits easily.
  if (rows < 0 || cols < 0 || rows >= (int64_t{1} << 31) || cols >= (int64_t{1} << 31)) {
    return absl::InvalidArgumentError(
        absl::StrCat("scale layout: bad shape [", rows, ", ", cols, "]"));
  }
  return absl::OkStatus();
}

}  // namespace

int64_t SwizzledScaleLength(int64_t rows, int64_t cols) {
  return CeilDiv(rows, kTileRows) * kTileRows * CeilDiv(cols, kTileCols) * kTileCols;
}

int64_t SwizzledScaleOffset(int64_t r, int64_t c, int64_t cols) {
  const int64_t tile = (r / kTileRows) * CeilDiv(cols, kTileCols) + c / kTileCols;
  const int64_t rr = r % kTileRows;
  return tile * kTileBytes + (rr % 32) * 16 + (rr / 32) * 4 + c % kTileCols;
}

absl::StatusOr<std::vector<uint8_t>> SwizzleScales(absl::Span<const uint8_t> plain, int64_t rows,
                                                   int64_t cols) {
  if (absl::Status s = CheckScaleShape(rows, cols); !s.ok()) return s;
  if (static_cast<int64_t>(plain.size()) != rows * cols) {
    return absl::InvalidArgumentError(absl::StrCat("scale layout: [", rows, ", ", cols,
                                                   "] does not match ", plain.size(), " bytes"));
  }
  std::vector<uint8_t> blocked(static_cast<size_t>(SwizzledScaleLength(rows, cols)), 0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      blocked[static_cast<size_t>(SwizzledScaleOffset(r, c, cols))] =
          plain[static_cast<size_t>(r * cols + c)];
    }
  }
  return blocked;
}

absl::StatusOr<std::vector<uint8_t>> UnswizzleScales(absl::Span<const uint8_t> blocked,
                                                     int64_t rows, int64_t cols) {
  if (absl::Status s = CheckScaleShape(rows, cols); !s.ok()) return s;
  const int64_t length = SwizzledScaleLength(rows, cols);
  if (static_cast<int64_t>(blocked.size()) != length) {
    return absl::InvalidArgumentError(
        absl::StrCat("scale layout: a swizzled [", rows, ", ", cols, "] scale has ", length,
                     " bytes (rows padded to 128, columns to 4), got ", blocked.size()));
  }
  std::vector<uint8_t> plain(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      plain[static_cast<size_t>(r * cols + c)] =
          blocked[static_cast<size_t>(SwizzledScaleOffset(r, c, cols))];
    }
  }
  return plain;
}

}  // namespace tensorcheck
