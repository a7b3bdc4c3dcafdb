// The one OpenBLAS product of the project, c[m, n] = x[m, k] * w^T, in
// fp32 or fp64, run tile by tile (core/gemm_tiles.h) so that a request's
// StopSignal can stop it between tiles. The CPU backend's accumulations
// and the error model's magnitude sums both use it.
//
//   TC_RETURN_IF_ERROR(BlasGemm(x, w, WeightLayout::kOutIn, m, n, k, c, stop));
//
// w is stored [n, k] (OUT_IN) or [k, n] (IN_OUT); the layout becomes BLAS's
// transpose flag, never a copy. k == 0 gives zeros. Returns the stop status
// when `stop` (null: never stops) fired before the last tile; c is then
// partly written. Thread-safe (OpenBLAS's own threads run each tile).
//
// A weight stored in another dtype than the GEMM's is converted block by
// block along N, never whole (docs/architecture.md, "Large weights: blocks
// along N"): PlanWeightBlocks cuts the output columns, WidenWeightBlock
// converts one block into a bounded buffer, and BlasGemmBlock computes the
// block's columns of the whole output:
//
//   const WeightBlocks blocks = PlanWeightBlocks(m, n, k, sizeof(float));
//   // wb: blocks.padded_columns * k floats; scratch: m * blocks.padded_columns
//   for (int64_t b = 0; b < blocks.count; ++b) {
//     const int64_t j0 = blocks.begin(b), nb = blocks.columns_of(b);
//     const int64_t padded = PaddedColumns(nb);
//     WidenWeightBlock(weight, layout, j0, nb, padded, wb);
//     TC_RETURN_IF_ERROR(
//         BlasGemmBlock(x, wb, layout, m, n, k, j0, nb, padded, scratch, c, stop));
//   }
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "core/linear_config.h"
#include "core/stop_signal.h"
#include "core/tensor.h"

namespace tensorcheck {

absl::Status BlasGemm(const float* x, const float* w, WeightLayout layout, int64_t m, int64_t n,
                      int64_t k, float* c, const StopSignal* stop);

absl::Status BlasGemm(const double* x, const double* w, WeightLayout layout, int64_t m, int64_t n,
                      int64_t k, double* c, const StopSignal* stop);

// ---- Weights converted block by block along N.

// Converted weight per regular block: 32 MiB, so that no block, the last
// included (up to twice a regular one), holds more than about 64 MiB; a
// block's [m, columns] product buffer is held to the same. Large enough
// that a BLAS call per block costs little against its multiply-adds (a
// bf16 Llama-3-70B lm_head, [128256, 8192], at m = 4 runs 125 fp32 blocks
// of 1024 columns, or 250 fp64 ones of 512), and small against the weights
// it is for (that lm_head: 2.1 GB in bf16, 8.4 GB converted to fp64 whole).
inline constexpr int64_t kWeightBlockBytes = int64_t{32} << 20;

// A BLAS block's width is a multiple of this many columns, and its buffer
// is padded with zero columns to one: OpenBLAS runs the last (columns mod
// unroll) columns of a call through edge kernels that sum in another order
// than its full ones (measured on SkylakeX, 1 and 2 threads), so no column
// of a block, or of an unblocked product, may fall in them. 64 is a
// multiple of the x86 kernels' unrolls.
inline constexpr int64_t kWeightBlockAlign = 64;

// nb rounded up to a multiple of kWeightBlockAlign: a BLAS block's buffer width.
inline int64_t PaddedColumns(int64_t nb) {
  return (nb + kWeightBlockAlign - 1) / kWeightBlockAlign * kWeightBlockAlign;
}

// The least multiply-adds of a block's product. OpenBLAS routes small
// products to other kernels (its "small matrix" kernels up to 10^6
// multiply-adds, SkylakeX's direct sgemm below 28 * 512^2 ~ 7.3e6), which
// also sum in other orders than its general GEMM, the one a large
// unblocked product runs: 2^23 keeps every block on the general kernels.
inline constexpr int64_t kWeightBlockMinMacs = int64_t{1} << 23;

// The output columns [0, n) cut into `count` blocks: block b starts at
// b * columns and has `columns` columns, but the last, which runs to n
// (between `columns` and 2 * columns - 1 of them). Each output element is
// computed in one block, over the whole of k.
struct WeightBlocks {
  int64_t n = 0;
  int64_t columns = 0;  // a regular block's width
  int64_t count = 0;    // 0 only when n == 0
  // The widest block's width (the last one's), padded to a multiple of
  // kWeightBlockAlign for BLAS: the buffers' width.
  int64_t padded_columns = 0;

  int64_t begin(int64_t b) const { return b * columns; }
  int64_t columns_of(int64_t b) const { return b + 1 == count ? n - b * columns : columns; }
};

// The blocks for an [m, n] output of depth k whose weight is widened to
// element_bytes per value (4: fp32, 8: fp64): kWeightBlockBytes of converted
// weight, and of product, per regular block, or `columns` columns when
// positive (tests ask for a few). With `blas` (a BLAS product, not fp16
// accumulation), the width is then raised to kWeightBlockMinMacs and
// rounded up to a multiple of kWeightBlockAlign; one block when that
// covers n.
WeightBlocks PlanWeightBlocks(int64_t m, int64_t n, int64_t k, int64_t element_bytes,
                              int64_t columns = 0, bool blas = true);

// Widens output columns [j0, j0 + nb) of a weight exactly as ToFloat /
// ToDouble widen each element, into a block `padded` >= nb columns wide
// whose columns past nb are zeros: rows j0.. of w [n, k] (OUT_IN) into
// out[padded, k], or columns j0.. of w [k, n] (IN_OUT) into out[k, padded].
void WidenWeightBlock(const Tensor& weight, WeightLayout layout, int64_t j0, int64_t nb,
                      int64_t padded, float* out);
void WidenWeightBlock(const Tensor& weight, WeightLayout layout, int64_t j0, int64_t nb,
                      int64_t padded, double* out);

// Output columns [j0, j0 + nb) of c[m, n] = x w^T from a block widened by
// WidenWeightBlock, padded to `padded` = nb rounded up to kWeightBlockAlign:
// one BlasGemm into scratch[m, padded], whose first nb columns are then
// copied into c. With the blocks of PlanWeightBlocks, every element comes
// out bit for bit as from a single block of all n columns (cpu_backend_test
// and magnitude_sums_test check it with the narrowest blocks the plan
// allows) while that single block's product is one BLAS call: under
// BlasGemm's tiles of 2^32 (fp32) or 2^31 (fp64) multiply-adds, which a
// Llama-3-70B lm_head at m = 4 is (8192 x 128256 x 4 = 2^32 x 0.98). Larger products are cut into
// tiles, as before blocks, and a tile's columns then depend on its block's width.
absl::Status BlasGemmBlock(const float* x, const float* w_block, WeightLayout layout, int64_t m,
                           int64_t n, int64_t k, int64_t j0, int64_t nb, int64_t padded,
                           float* scratch, float* c, const StopSignal* stop);
absl::Status BlasGemmBlock(const double* x, const double* w_block, WeightLayout layout, int64_t m,
                           int64_t n, int64_t k, int64_t j0, int64_t nb, int64_t padded,
                           double* scratch, double* c, const StopSignal* stop);

}  // namespace tensorcheck
