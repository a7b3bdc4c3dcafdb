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
// INVALID_ARGUMENT when numel != outer * inner or t is already FP8;
// RESOURCE_EXHAUSTED when the FP8 tensor cannot be allocated.
absl::StatusOr<Fp8Quantized> QuantizeFp8(const Tensor& t, int64_t outer, int64_t inner,
                                         Fp8Format format, Fp8Scaling scaling,
                                         bool per_column = false);

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
