// Tensor-core inner products: a parametrised model of the arithmetic one
// hardware matrix-multiply-accumulate instruction does for one output
// element, and named presets for the A100 (sm_80), H100/H200 (sm_90) and
// B200 (sm_100) after Khattak and Mikaitis, "Accurate Models of NVIDIA
// Tensor Cores" (arXiv 2512.07004) and their published MATLAB models.
// docs/numerics.md, "Tensor-core inner products", gives each feature with
// its source and what is measured or inferred.
//
//   // One output element of a bf16 GEMM on an H100: k products, fp32 C.
//   TC_ASSIGN_OR_RETURN(TensorCoreModel m,
//                       TensorCoreModelFor(TensorCoreGpu::kSm90, TensorCoreInput::kBf16));
//   float d = TensorCoreDot(a, b, /*b_stride=*/1, k, /*c=*/0.0f, m);
//
// A block of `block` products and the accumulator is added at once: every
// term is aligned to the largest exponent among them and truncated toward
// zero to `align_bits` fraction bits below it; the truncated terms are
// summed exactly (the sum never overflows the hardware's carry bits in
// the model); the sum is normalised once and rounded to `result_bits`
// significant bits into the fp32 accumulator, which feeds the next block.
//
// Pure functions of their arguments: thread-safe.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tensorcheck {

// The input format of A and B. Values travel as floats that hold a value
// of that format exactly.
enum class TensorCoreInput { kFp16, kBf16, kTf32, kE4M3, kE5M2 };

// A GPU generation (the CUDA compute capability's major version).
enum class TensorCoreGpu { kSm80, kSm90, kSm100 };

// How a block's exact sum becomes the accumulator's value.
enum class TensorCoreRounding { kTowardZero, kNearestEven };

struct TensorCoreModel {
  // Products added in one hardware inner product (Khattak and Mikaitis'
  // "FMA size"); at most kMaxTensorCoreBlock.
  int block = 16;
  // Fraction bits kept after aligning to the block's largest exponent:
  // 23 (fp32's) plus the extra alignment bits; fewer under Hopper's FP8
  // fast accumulation.
  int align_bits = 25;
  // Significant bits of the block's result (24: fp32).
  int result_bits = 24;
  TensorCoreRounding rounding = TensorCoreRounding::kTowardZero;
  // The alignment exponent is at least this (the hardware's alignment
  // window bottoms out: the models' min_exp_limit).
  int min_align_exponent = -133;
  // The input format's smallest normal exponent: a subnormal input counts
  // as having this exponent and a significand below 1 (fp16 -14, bf16 and
  // TF32 -126, E4M3 -6, E5M2 -14); `b_min_exponent` the second operand's
  // (they differ for E4M3 x E5M2).
  int input_min_exponent = -14;
  int b_min_exponent = -14;

  bool operator==(const TensorCoreModel& o) const {
    return block == o.block && align_bits == o.align_bits && result_bits == o.result_bits &&
           rounding == o.rounding && min_align_exponent == o.min_align_exponent &&
           input_min_exponent == o.input_min_exponent && b_min_exponent == o.b_min_exponent;
  }
};
inline constexpr int kMaxTensorCoreBlock = 64;

// The model of `gpu`'s tensor cores for `input` with fp32 accumulation.
// INVALID_ARGUMENT for FP8 on sm_80 (no FP8 tensor cores).
absl::StatusOr<TensorCoreModel> TensorCoreModelFor(TensorCoreGpu gpu, TensorCoreInput input);
// The same with the two operands in different formats (E4M3 x E5M2): the
// first's block shape, each operand's own smallest normal exponent.
absl::StatusOr<TensorCoreModel> TensorCoreModelFor(TensorCoreGpu gpu, TensorCoreInput a_input,
                                                   TensorCoreInput b_input);

// "sm80", "sm90", "sm100"; and back (INVALID_ARGUMENT naming `field`
// and the accepted names).
const char* TensorCoreGpuName(TensorCoreGpu gpu);
absl::StatusOr<TensorCoreGpu> ParseTensorCoreGpu(absl::string_view name, absl::string_view field);

// One dot product c + sum a[i] * b[i * b_stride], i < k, under `model`:
// blocks of model.block products in index order, the first block's
// accumulator `c`, each block's result the next one's accumulator. a and
// b hold values of the model's input format (not checked). A NaN or
// infinite product or c decides the result as IEEE addition would (NaN
// for +inf and -inf together); a finite sum beyond fp32's range gives an
// infinity of its sign. An exact zero sum is +0; a nonzero one that
// rounds to zero (below fp32's subnormals) keeps its sign.
float TensorCoreDot(const float* a, const float* b, int64_t b_stride, int64_t k, float c,
                    const TensorCoreModel& model);

// Where a kernel puts the partial tile of K (K mod tile_k elements): last,
// zero-filled past the end (TMA loads, CUTLASS 3.x), or first (CUTLASS
// 2.x's multistage mainloops take the residue in their first iteration).
enum class KResidue { kLast, kFirst };

// "last", "first".
const char* KResidueName(KResidue r);

// How a GEMM kernel walks K for one output element (docs/numerics.md,
// "Kernel K order"): the tensor-core model of each hardware inner product,
// the kernel's K tile and where its partial tile goes, and, for FP8 without
// fast accumulation, how often the MMA's partial sum is promoted.
struct KernelOrder {
  TensorCoreModel model;
  // The K extent of one tile of the kernel's mainloop; 0: no tile
  // structure (blocks from k = 0, as with a residue last).
  int64_t tile_k = 0;
  KResidue residue = KResidue::kLast;
  // FP8 split accumulation: every `promote` elements of K (a multiple of
  // the model's block) the MMA's partial sum, started from zero, is added
  // into a separate fp32 accumulator with one IEEE fp32 addition (round to
  // nearest even), as CUTLASS's GmmaFP8Accumulation does; 0: one chain of
  // inner products over all of K (fast accumulation, and every 16- and
  // 19-bit input).
  int64_t promote = 0;

  // Where the walk's grid starts: K mod tile_k with the residue first,
  // else 0. Blocks of model.block run from 0 up to it, then from it on;
  // promotions happen at it (when nonzero) and every `promote` after it.
  int64_t Offset(int64_t k) const {
    return residue == KResidue::kFirst && tile_k > 0 ? k % tile_k : 0;
  }
  bool operator==(const KernelOrder& o) const {
    return model == o.model && tile_k == o.tile_k && residue == o.residue && promote == o.promote;
  }
};

// One output element as the kernel computes it: sum a[i] * b[i * b_stride],
// i < k, from a zero accumulator, in `order`: with TensorCoreDot's blocks
// on the order's grid, and its promotions. Specials as TensorCoreDot's
// (an IEEE addition decides them across promotions).
float KernelOrderDot(const float* a, const float* b, int64_t b_stride, int64_t k,
                     const KernelOrder& order);

}  // namespace tensorcheck
