// FP8 scaling: the current-scaling recipe that turns a wide tensor into
// FP8 values and dequantisation scales (what torch._scaled_mm takes), and
// the arithmetic of an FP8 GEMM's accumulation (docs/numerics.md, "FP8").
//
//   // x [m, k] in bf16, one scale per row (row-wise recipe):
//   TC_ASSIGN_OR_RETURN(Fp8Quantized q,
//                       QuantizeFp8(x, m, k, Fp8Format::kE4M3Fn, Fp8Scaling::kRow));
//   q.values: [m, k] float8_e4m3fn; q.scales: m floats, x ~= q.values * q.scales[row]
//
// The recipe (torchao's Float8Linear "dynamic" scaling, written out in
// docs/numerics.md, "Scaling recipes"): amax = max |v| over the tensor or
// the row, in fp64; s = fp8_max / max(amax, 1e-12), rounded to fp32;
// q = the saturating cast of fl32(v * s); the dequantisation scale is
// fl32(1 / s).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/float_formats.h"
#include "core/linear_config.h"
#include "core/tensor.h"

namespace tensorcheck {

// amax below this counts as this (torchao's EPS): an all-zero row gets a
// finite scale.
inline constexpr double kFp8AmaxFloor = 1e-12;

struct Fp8Quantized {
  Tensor values;              // the FP8 tensor, shaped like the input
  std::vector<float> scales;  // dequantisation: 1 (per tensor) or one per group
};

// Quantises `t`, viewed as [outer, inner] row-major. kRow scales each of
// the `outer` rows, or with `per_column` each of the `inner` columns (a
// flax [K, N] kernel's output features); kTensor one scale for all.
// kBlock128 quantises through QuantizeFp8Blocks with Fp8BlockOf's blocks
// (INVALID_ARGUMENT here: whether t is x or W decides them).
// INVALID_ARGUMENT when numel != outer * inner or t is already FP8;
// RESOURCE_EXHAUSTED when the FP8 tensor cannot be allocated.
absl::StatusOr<Fp8Quantized> QuantizeFp8(const Tensor& t, int64_t outer, int64_t inner,
                                         Fp8Format format, Fp8Scaling scaling,
                                         bool per_column = false);

// The rectangle of [outer, inner] one scale covers.
struct Fp8Block {
  int64_t rows;
  int64_t cols;
};

// Block-wise scaling: one scale per `block` of t's [outer, inner] view
// (the last blocks of a row or column may be partial); q.scales holds
// them row-major, [ceil(outer / rows), ceil(inner / cols)], the shape
// docs/numerics.md ("Block-wise FP8") gives a block-wise scale tensor.
absl::StatusOr<Fp8Quantized> QuantizeFp8Blocks(const Tensor& t, int64_t outer, int64_t inner,
                                               Fp8Format format, Fp8Block block);

// The block-wise (kBlock128) blocks: 1 x 128 of x [M, K]; 128 x 128 of a
// weight in either layout.
inline Fp8Block Fp8BlockOf(bool weight) {
  return weight ? Fp8Block{kFp8BlockSize, kFp8BlockSize} : Fp8Block{1, kFp8BlockSize};
}

// ceil(a / b) for a >= 0, b > 0.
inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// How block-wise scales tile a layer (block128; the MX formats): each
// scale of x covers 1 x `k` elements of a row, each of W `n` output
// features x `k`. `k` == 0: the scales are per tensor or row-wise.
struct ScaleBlocks {
  int64_t k = 0;
  int64_t n = 1;
  bool block_wise() const { return k > 0; }
  // The blocks of x [M, K], and of W in its layout ([N, K] or [K, N]).
  Fp8Block input() const { return {1, k}; }
  Fp8Block weight(bool out_in) const { return out_in ? Fp8Block{n, k} : Fp8Block{k, n}; }
};

// `values` ([outer, inner] row-major, any dtype) times their block's
// scale from `scales` ([ceil(outer / block.rows), ceil(inner /
// block.cols)] row-major), as `out` (float64: exact for FP8 values and
// fp32 scales; float32: rounded once). INVALID_ARGUMENT on sizes that do
// not match; RESOURCE_EXHAUSTED when `out` cannot be allocated.
absl::StatusOr<Tensor> DequantizeBlocks(const Tensor& values, const Tensor& scales, int64_t outer,
                                        int64_t inner, Fp8Block block, DType out);

// The scale of one group of values whose largest magnitude is `amax`:
// {quantisation s, dequantisation 1/s}, both fp32.
struct Fp8ScalePair {
  float quantise;
  float dequantise;
};
Fp8ScalePair Fp8ScaleForAmax(double amax, Fp8Format format);

// ---- Accumulation.

// A parametrised model of fast accumulation (CUBLASLT_MATMUL_DESC_FAST_ACCUM
// on Hopper): partial sums stay in the tensor core's accumulator, which
// keeps `accumulator_bits` fraction bits. Every `group` products are added
// to it at once: the accumulator and the products are each truncated
// toward zero to a multiple of 2^(E - accumulator_bits), E the largest
// exponent among them, summed exactly, and the sum truncated toward zero
// to accumulator_bits + 1 significant bits. No promotion to fp32.
// docs/numerics.md, "Fast accumulation", says where the defaults come
// from and that the GPU validation fits them.
struct FastAccumModel {
  int accumulator_bits = 13;
  int group = 32;  // at most kMaxFastAccumGroup
};
inline constexpr int kMaxFastAccumGroup = 256;

// One dot product of `k` exact products a[i] * b[i * b_stride] under the
// model, summed in index order. The products of two FP8 values are exact
// in fp32 (at most 8 significant bits, exponents within fp32's range).
float FastAccumDot(const float* a, const float* b, int64_t b_stride, int64_t k,
                   const FastAccumModel& model);

}  // namespace tensorcheck
