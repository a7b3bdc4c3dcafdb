#include "server/stats/blas_gemm.h"

#include <cblas.h>

#include <algorithm>

#include "server/core/gemm_tiles.h"

namespace tensorcheck {
namespace {

// Tiles of about 0.1 s on two idle cores (fp32 OpenBLAS runs about twice
// as many multiply-adds a second as fp64): a stop waits for the tile in
// progress. Each BLAS call packs its operands again, so smaller tiles cost
// more: a 1024x4096x4096 fp32 product (2^34) took 1.4-1.5x the single
// call in tiles of 2^29 multiply-adds, 1.25x in 2^31, 1.07-1.1x in 2^32
// and 1.02-1.06x in 2^33, the size kept (bench/gemm_bench,
// docs/performance.md).
constexpr int64_t kFloatTileMacs = int64_t{1} << 33;
constexpr int64_t kDoubleTileMacs = int64_t{1} << 32;

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

}  // namespace

absl::Status BlasGemm(const float* x, const float* w, WeightLayout layout, int64_t m, int64_t n,
                      int64_t k, float* c, const StopSignal* stop) {
  return TiledGemm(x, w, layout, m, n, k, c, stop, cblas_sgemm, kFloatTileMacs);
}

absl::Status BlasGemm(const double* x, const double* w, WeightLayout layout, int64_t m, int64_t n,
                      int64_t k, double* c, const StopSignal* stop) {
  return TiledGemm(x, w, layout, m, n, k, c, stop, cblas_dgemm, kDoubleTileMacs);
}

}  // namespace tensorcheck
