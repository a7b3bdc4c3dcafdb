#include "server/stats/blas_gemm.h"

#include <cblas.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "core/float_formats.h"
#include "core/gemm_tiles.h"

namespace tensorcheck {
namespace {

// Tiles of about 0.1 s on two idle cores of a fast host (fp32 OpenBLAS
// runs about twice as many multiply-adds a second as fp64), 0.3 CPU-s on a
// core of 15.6 GMAC/s: a stop waits for the tile in progress. Each BLAS
// call packs its operands again, so smaller tiles cost more: a
// 1024x4096x4096 fp32 product (2^34) took 1.4-1.5x the single call in
// tiles of 2^29 multiply-adds, 1.25x in 2^31, 1.07-1.1x in 2^32 (the size
// kept: 2^33, 1.02-1.06x, took 0.55 CPU-s a tile on a slow host) (bench/gemm_bench,
// docs/performance.md).
constexpr int64_t kFloatTileMacs = int64_t{1} << 32;
constexpr int64_t kDoubleTileMacs = int64_t{1} << 31;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

template <typename T, typename Blas>
absl::Status TiledGemm(const T* x, const T* w, WeightLayout layout, int64_t m, int64_t n, int64_t k,
                       T* c, const StopSignal* stop, Blas blas, int64_t tile_macs) {
  if (m == 0 || n == 0) return CheckStop(stop);
  if (k == 0) {
    std::fill(c, c + m * n, T{0});
    return CheckStop(stop);
  }
  const bool out_in = layout == WeightLayout::kOutIn;
  auto tile = [&](const GemmTile& t) {
    // The tile's columns are rows t.col.. of w [n, k], or columns of w [k, n].
    const T* w_tile = out_in ? w + t.col * k : w + t.col;
    blas(CblasRowMajor, CblasNoTrans, out_in ? CblasTrans : CblasNoTrans, static_cast<int>(t.rows),
         static_cast<int>(t.cols), static_cast<int>(k), T{1}, x + t.row * k, static_cast<int>(k),
         w_tile, static_cast<int>(out_in ? k : n), T{0}, c + t.row * n + t.col,
         static_cast<int>(n));
  };
  return ForEachGemmTile(m, n, k, stop, tile, tile_macs);
}

template <typename T>
absl::Status GemmBlock(const T* x, const T* w_block, WeightLayout layout, int64_t m, int64_t n,
                       int64_t k, int64_t j0, int64_t nb, int64_t padded, T* scratch, T* c,
                       const StopSignal* stop) {
  if (absl::Status s = BlasGemm(x, w_block, layout, m, padded, k, scratch, stop); !s.ok()) {
    return s;
  }
  for (int64_t i = 0; i < m; ++i) {
    std::copy(scratch + i * padded, scratch + i * padded + nb, c + i * n + j0);
  }
  return absl::OkStatus();
}

template <typename T>
void WidenBlock(const Tensor& weight, WeightLayout layout, int64_t j0, int64_t nb, int64_t padded,
                T* out) {
  if (weight.rank() != 2) return;
  if (layout == WeightLayout::kOutIn) {
    const int64_t k = weight.dim(1);
    WidenRange(weight, j0 * k, nb * k, out);
    std::fill(out + nb * k, out + padded * k, T{0});
    return;
  }
  const int64_t k = weight.dim(0), n = weight.dim(1);
  for (int64_t kk = 0; kk < k; ++kk) {
    T* row = out + kk * padded;
    WidenRange(weight, kk * n + j0, nb, row);
    std::fill(row + nb, row + padded, T{0});
  }
}

}  // namespace

absl::Status BlasGemm(const float* x, const float* w, WeightLayout layout, int64_t m, int64_t n,
                      int64_t k, float* c, const StopSignal* stop) {
  return TiledGemm(x, w, layout, m, n, k, c, stop, cblas_sgemm, kFloatTileMacs);
}

absl::Status BlasGemm(const double* x, const double* w, WeightLayout layout, int64_t m, int64_t n,
                      int64_t k, double* c, const StopSignal* stop) {
  return TiledGemm(x, w, layout, m, n, k, c, stop, cblas_dgemm, kDoubleTileMacs);
}

absl::Status BlasGemmBlock(const float* x, const float* w_block, WeightLayout layout, int64_t m,
                           int64_t n, int64_t k, int64_t j0, int64_t nb, int64_t padded,
                           float* scratch, float* c, const StopSignal* stop) {
  return GemmBlock(x, w_block, layout, m, n, k, j0, nb, padded, scratch, c, stop);
}

absl::Status BlasGemmBlock(const double* x, const double* w_block, WeightLayout layout, int64_t m,
                           int64_t n, int64_t k, int64_t j0, int64_t nb, int64_t padded,
                           double* scratch, double* c, const StopSignal* stop) {
  return GemmBlock(x, w_block, layout, m, n, k, j0, nb, padded, scratch, c, stop);
}

WeightBlocks PlanWeightBlocks(int64_t m, int64_t n, int64_t k, int64_t element_bytes,
                              int64_t columns, bool blas) {
  WeightBlocks blocks;
  blocks.n = n;
  if (n <= 0) return blocks;
  const int64_t depth = std::max<int64_t>(k, 1);
  const int64_t rows = std::max<int64_t>(m, 1);
  const int64_t bytes = std::max<int64_t>(element_bytes, 1);
  // The converted block, and its product, within kWeightBlockBytes.
  int64_t width = columns > 0
                      ? columns
                      : std::max<int64_t>(1, kWeightBlockBytes / (std::max(depth, rows) * bytes));
  if (blas) {
    width = std::max(width, CeilDiv(kWeightBlockMinMacs, rows * depth));
    width = PaddedColumns(width);
  }
  if (width >= n) width = n;
  blocks.columns = width;
  blocks.count = n / width;  // the last block takes the remainder
  const int64_t widest = n - (blocks.count - 1) * width;
  blocks.padded_columns = blas ? PaddedColumns(widest) : widest;
  return blocks;
}

void WidenWeightBlock(const Tensor& weight, WeightLayout layout, int64_t j0, int64_t nb,
                      int64_t padded, float* out) {
  WidenBlock(weight, layout, j0, nb, padded, out);
}

void WidenWeightBlock(const Tensor& weight, WeightLayout layout, int64_t j0, int64_t nb,
                      int64_t padded, double* out) {
  WidenBlock(weight, layout, j0, nb, padded, out);
}

}  // namespace tensorcheck
