// How block-scaled operands reach cuBLASLt (internal to this folder; pure
// host code, no CUDA, tested on the host): the request's plain row-major
// scales rearranged into the layout each scale mode reads, the wide
// operands quantised by the CPU backend's recipes and laid out the same
// way, and an FP4 weight transposed to TN.
//
//   // x [m, k] wide, cublaslt:fp8e4m3@scaling=block128 (fp8_rules.h):
//   TC_ASSIGN_OR_RETURN(LtOperand x, QuantiseForLt(input, /*weight=*/false, shape, config, gemm));
//   // x.values: [m, k] float8_e4m3fn; x.scales: ceil(k/128) * m floats, m fastest
//
// Layouts (fp8_rules.h and block_scale_rules.h say where each is written):
//   - VEC128_32F (block128's input, B): ceil(k/128) columns of m floats, m
//     fastest: plain [m, s] element (i, c) at c * m + i (NVIDIA's samples
//     size it ceil(k/128) * m; torch._scaled_mm's "outer-dim-major").
//   - BLK128x128_32F (block128's weight, A): ceil(n/128) columns of L4 =
//     roundup(ceil(k/128), 4) floats, k blocks fastest, zero padded: block
//     (jb, c) at jb * L4 + c (NVIDIA's samples: roundoff(ceil(k/128), 4) *
//     ceil(n/128); torch's "L4"). An IN_OUT weight's plain scale [s, nb] is
//     read transposed.
//   - VEC32_UE8M0 / VEC16_UE4M3 (MXFP8, NVFP4): core/mx_formats.h's
//     SwizzleScales of the [rows, k / block] scale, rows m for the input
//     and n for the weight (an IN_OUT weight's plain [k / block, n]
//     transposed first).
//
// Thread-safe (pure). Errors: INVALID_ARGUMENT on sizes that do not match.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/layer_shape.h"
#include "core/linear_config.h"
#include "core/tensor.h"
#include "server/backends/cuda/internal/fp8_rules.h"

namespace tensorcheck::cuda::internal {

// roundup(ceil(k / 128), 4): the k blocks of one BLK128x128 column.
int64_t Blk128x128Stride(int64_t k);

// Plain [m, s] row-major -> VEC128_32F's s columns of m.
std::vector<float> Vec128Scales(const float* plain, int64_t m, int64_t s);

// Plain [nb, s] (or, `transposed`, [s, nb]) row-major -> BLK128x128_32F's
// nb columns of roundup(s, 4), zero padded.
std::vector<float> Blk128x128Scales(const float* plain, int64_t nb, int64_t s, bool transposed);

// Plain [rows, cols] (or, `transposed`, [cols, rows]) scale codes ->
// cuBLASLt's swizzled layout of [rows, cols].
absl::StatusOr<std::vector<uint8_t>> SwizzledBlockScales(const uint8_t* plain, int64_t rows,
                                                         int64_t cols, bool transposed);

// A packed FP4 [rows, cols] matrix (element 2i in the low nibble of byte
// i) as packed [cols, rows]. rows * cols even.
std::vector<uint8_t> TransposeFp4(const uint8_t* packed, int64_t rows, int64_t cols);

// What one scale array holds for cuBLASLt: its dtype and element count.
struct LtScaleSpec {
  DType dtype = DType::kFloat32;
  int64_t count = 1;
};
// The scales of the input (`weight` false) or of the weight under `mode`
// for a layer of `shape`: per tensor 1 float; outer vector m or n floats;
// block128 ceil(k/128) * m and ceil(n/128) * Blk128x128Stride(k) floats;
// MXFP8 and NVFP4 the swizzled length of [m or n, k / block] codes
// (float8_e8m0fnu and float8_e4m3fn).
LtScaleSpec LtScaleSpecOf(Fp8ScaleMode mode, bool weight, const LayerShape& shape);

// The request's plain block-wise scale of the input or the weight (fp32
// for block128: [m, s], [nb, s] or IN_OUT [s, nb]; codes for MXFP8 and
// NVFP4: [m, k/B], [n, k/B] or IN_OUT [k/B, n]) in the layout of `mode`
// (kBlock128, kMxVec32 or kNvVec16), as a 1-D tensor of
// LtScaleSpecOf's dtype and count.
absl::StatusOr<Tensor> LtBlockScales(const Tensor& plain, Fp8ScaleMode mode, bool weight,
                                     const LayerShape& shape);

// A wide operand as cuBLASLt multiplies it under a block-wise `gemm`
// (kBlock128, kMxVec32, kNvVec16): the values TN (x [m, k]; W [n, k], an
// IN_OUT weight transposed) in gemm's A/B dtype (FP4 packed), the scales
// in the layout of the mode, and the NVFP4 per-tensor scale (1 otherwise).
struct LtOperand {
  Tensor values;
  Tensor scales;
  float global_scale = 1.0f;
};
// Quantised by the configuration's recipe with the CPU backend's very calls
// (QuantizeFp8Blocks with Fp8BlockOf; QuantizeMxFp8 with config.mx_rounding;
// QuantizeNvFp4), so cuBLASLt multiplies what the CPU emulation does.
absl::StatusOr<LtOperand> QuantiseForLt(const Tensor& t, bool weight, const LayerShape& shape,
                                        const Config& config, const Fp8Gemm& gemm);

}  // namespace tensorcheck::cuda::internal
