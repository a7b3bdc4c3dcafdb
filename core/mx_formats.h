// Block-scaled formats: MXFP8 (OCP Microscaling, 32-element blocks with
// UE8M0 power-of-two scales) and NVFP4 (FP4 E2M1 values, 16-element blocks
// with UE4M3 scales and one fp32 per-tensor scale), their quantisation
// recipes, dequantisation, and cuBLASLt's swizzled scale layout
// (docs/numerics.md, "MXFP8 and NVFP4").
//
// Everything works on plain arrays: fp32 values in, one code byte per
// element out (unpacked; an FP4 code in the low nibble), scale codes as
// bytes, so that it stands apart from how tensors pack them.
//
//   // x [m, k] fp32, k a multiple of 32; blocks of 32 along k:
//   TC_ASSIGN_OR_RETURN(BlockScaled q,
//                       QuantizeMxFp8(x, m, k, Fp8Format::kE4M3Fn, MxScaleRounding::kFloor));
//   q.codes: m * k float8_e4m3fn bytes; q.scales: [m, k / 32] UE8M0 bytes
//   std::vector<float> back = DequantizeBlockScaled(q);
//   back[i * k + j] == Fp8BitsToFloat(q.codes[i * k + j], Fp8Format::kE4M3Fn) *
//                      E8M0BitsToFloat(q.scales[i * (k / 32) + j / 32])   // ~= x[i, j]
//
//   TC_ASSIGN_OR_RETURN(BlockScaled w4, QuantizeNvFp4(w, n, k));  // TransformerEngine's
//   w[i, j] ~= DequantizeBlockScaled(w4)[i * k + j] * w4.global_scale
//
// The recipes' arithmetic follows their sources bit for bit where the
// sources say it (each function names them); tests redo each from the
// documented definition. All functions are pure and thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/float_formats.h"

namespace tensorcheck {

// ---- FP4 E2M1 (OCP MX spec v1.0, torch.float4_e2m1fn_x2's elements,
// ml_dtypes.float4_e2m1fn): 1 sign, 2 exponent (bias 1), 1 mantissa bit;
// magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6; no infinities or NaN.
//
//   Fp4E2M1BitsToFloat(0x7) == 6.0f;   Fp4E2M1BitsToFloat(0xb) == -1.5f;
//   DoubleToFp4E2M1Bits(2.5) == 0x4;   // tie between 2 (0x4) and 3 (0x5): even
//   DoubleToFp4E2M1Bits(-100.0) == 0xf;   // saturates to -6

inline constexpr double kFp4E2M1Max = 6.0;

// Exact. Only the low 4 bits are read.
float Fp4E2M1BitsToFloat(uint8_t code);

// Rounds to nearest, ties to even, once; beyond ±6 (infinities included)
// saturates to ±6, the sign of zero is kept. NaN becomes +6 (0x7), what
// CUDA's cvt.rn.satfinite.e2m1x2.f32 and __nv_cvt_double_to_fp4 give and
// so what TransformerEngine's NVFP4 kernels store (ml_dtypes gives 0x8,
// -0; torchao's software cast ±1.5). The result is in the low nibble.
uint8_t DoubleToFp4E2M1Bits(double d);

// ---- UE8M0 (OCP MX spec's E8M0 scale; ml_dtypes / torch.float8_e8m0fnu):
// 2^(bits - 127), 0x00 is 2^-127 (an fp32 subnormal), 0xff is NaN. Exact.
float E8M0BitsToFloat(uint8_t bits);

// The nearest UE8M0 value of v > 0: 2^round(log2 v) with ties (v = 1.5 *
// 2^e, in the linear sense of a rounding to 0 mantissa bits) to the even
// code; clamped to 2^-127 .. 2^127. NaN, infinities, zero and negative
// values (which UE8M0 cannot hold) give 0xff, NaN.
uint8_t DoubleToE8M0Bits(double v);

// ---- FP4 packing (torch.float4_e2m1fn_x2, cuBLASLt CUDA_R_4F_E2M1):
// element 2i in the low nibble of byte i, element 2i + 1 in the high one.
inline uint8_t Fp4Code(const uint8_t* packed, int64_t i) {
  return static_cast<uint8_t>((packed[i / 2] >> (4 * (i % 2))) & 0xf);
}
inline void SetFp4Code(uint8_t* packed, int64_t i, uint8_t code) {
  const int shift = 4 * static_cast<int>(i % 2);
  packed[i / 2] = static_cast<uint8_t>((packed[i / 2] & ~(0xf << shift)) | ((code & 0xf) << shift));
}

// NVFP4's UE4M3 block scales are float8_e4m3fn bytes (positive values):
// Fp8BitsToFloat / DoubleToFp8Bits with Fp8Format::kE4M3Fn.

// ---- Block-scaled tensors.

enum class BlockFormat {
  kMxFp8E4M3,  // float8_e4m3fn codes, 32-element blocks, UE8M0 scales
  kMxFp8E5M2,  // float8_e5m2 codes, 32-element blocks, UE8M0 scales
  kNvFp4,      // E2M1 codes, 16-element blocks, UE4M3 scales, fp32 global scale
};

// 32 for MXFP8, 16 for NVFP4.
int BlockSize(BlockFormat format);

// How an MXFP8 block's power-of-two scale is chosen from its amax.
enum class MxScaleRounding {
  // OCP MX spec v1.0 section 6.3, torchao's ScaleCalculationMode.FLOOR (its
  // default): 2^(floor(log2(amax)) - emax_elem), emax_elem 8 for E4M3, 15
  // for E5M2. Values in (fp8_max, 2^(emax_elem + 1)) after scaling saturate.
  kFloor,
  // TransformerEngine, cuBLAS and cuDNN ("quantize_round_up"), torchao's
  // RCEIL: the fp32 descale fl32(amax * fl32(1 / fp8_max)) rounded up to a
  // power of two (never saturates but for that rounding).
  kRceil,
};

// Codes and scale codes of a tensor viewed as [outer, inner] row-major.
// Blocks run along `inner` (a row's K), or with `per_column` along `outer`
// (an IN_OUT [K, N] weight's K). The scales are shaped by the scale-shape
// rule: [outer, ceil(inner / B)], or [ceil(outer / B), inner] per column,
// row-major. A last, partial block counts the elements it has (as zero
// padding would).
struct BlockScaled {
  BlockFormat format = BlockFormat::kMxFp8E4M3;
  int64_t outer = 0;
  int64_t inner = 0;
  bool per_column = false;
  std::vector<uint8_t> codes;  // outer * inner, row-major
  int64_t scale_rows = 0;
  int64_t scale_cols = 0;
  std::vector<uint8_t> scales;  // scale_rows * scale_cols, row-major
  // NVFP4 (1 and unused for MXFP8): the tensor's amax (NaN ignored), the
  // fp32 encode scale 448 * 6 / amax, and the per-tensor dequantisation
  // scale fl32(1 / global_encode_scale), the request's global scale.
  float global_amax = 0.0f;
  float global_encode_scale = 1.0f;
  float global_scale = 1.0f;
};

// MXFP8 (`format` E4M3 or E5M2). Per block: amax = max |v| (NaN if any v
// is; an infinity gives infinity); scale exponent e by `rounding`, clamped
// to [-127, 127] (an all-zero block takes 2^-127, code 0x00); a NaN or
// infinite amax gives the NaN scale 0xff and NaN codes (torchao's to_mx);
// codes = the saturating round-to-nearest-even cast of v / 2^e (exact in
// fp32, as torchao's v * 2^-e and TransformerEngine's multiply by
// exp2f_rcp). INVALID_ARGUMENT when values.size() != outer * inner.
absl::StatusOr<BlockScaled> QuantizeMxFp8(absl::Span<const float> values, int64_t outer,
                                          int64_t inner, Fp8Format format, MxScaleRounding rounding,
                                          bool per_column = false);

// NVFP4, TransformerEngine's NVFP4BlockScaling recipe without random
// Hadamard transform or stochastic rounding (quantize_transpose_nvfp4.cuh,
// core_nvfp4.cuh), all in fp32:
//   amax   = max |v| over the tensor, NaN ignored (fmaxf);
//   S_enc  = min(2688 / amax, FLT_MAX), or 1 when amax is 0 or infinite;
//   S_dec  = fl32(1 / S_enc)                          -> global_scale;
//   block  = e4m3_satfinite(block_amax * (S_enc * fl32(1 / 6)))  -> scale code;
//   inv    = min(1 / (float(block) * S_dec), FLT_MAX);
//   code   = e2m1_satfinite(v * inv)  (a NaN v gives +6: see DoubleToFp4E2M1Bits).
// INVALID_ARGUMENT when values.size() != outer * inner.
absl::StatusOr<BlockScaled> QuantizeNvFp4(absl::Span<const float> values, int64_t outer,
                                          int64_t inner, bool per_column = false);

// A block scale code's value: E8M0BitsToFloat for MXFP8, the e4m3 value
// for NVFP4.
float BlockScaleValue(BlockFormat format, uint8_t scale_code);

// Every element's code value times its block's scale, in fp32 (the NVFP4
// global scale is not applied: it scales the GEMM's accumulator, like
// alpha). Exact for NVFP4 (at most 6 significant bits, magnitudes within
// [2^-10, 2688]); exact for MXFP8 unless the product exceeds FLT_MAX
// (infinity then; fp8 x 2^k never falls below fp32's subnormals). A NaN
// scale gives NaN. `q` must be consistent (as the Quantize functions
// return it).
std::vector<float> DequantizeBlockScaled(const BlockScaled& q);

// ---- cuBLASLt's swizzled block-scale layout (cuBLAS documentation, "1D
// Block Scaling Factors Layout"; torchao's to_blocked; TransformerEngine's
// gemm_swizzled_scale_idx). A [rows, cols] scale (rows: the operand's M or
// N, cols: K / block) is padded to rows multiple of 128 and cols multiple
// of 4, cut into 128x4 tiles of 512 bytes stored tile-row-major, and within
// a tile element (r, c) sits at (r % 32) * 16 + (r / 32) * 4 + c.
//
//   SwizzledScaleOffset(33, 5, 6) == 512 + 1 * 16 + 1 * 4 + 1   // tile (0, 1)

// The padded length: roundup(rows, 128) * roundup(cols, 4).
int64_t SwizzledScaleLength(int64_t rows, int64_t cols);

// Where plain element (r, c) of a [rows, cols] scale lies in the swizzled
// array (needs 0 <= r < rows, 0 <= c < cols).
int64_t SwizzledScaleOffset(int64_t r, int64_t c, int64_t cols);

// Plain row-major [rows, cols] -> swizzled, padding with zero bytes.
// INVALID_ARGUMENT when plain.size() != rows * cols.
absl::StatusOr<std::vector<uint8_t>> SwizzleScales(absl::Span<const uint8_t> plain, int64_t rows,
                                                   int64_t cols);

// Swizzled -> plain row-major [rows, cols] (the padding dropped).
// INVALID_ARGUMENT when blocked.size() != SwizzledScaleLength(rows, cols).
absl::StatusOr<std::vector<uint8_t>> UnswizzleScales(absl::Span<const uint8_t> blocked,
                                                     int64_t rows, int64_t cols);

}  // namespace tensorcheck
