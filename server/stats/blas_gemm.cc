#include "server/stats/blas_gemm.h"

#include <cblas.h>

#include <algorithm>

#include "server/core/gemm_tiles.h"

namespace tensorcheck {
namespace {

// Tiles of about 30-70 ms on two cores: fp32 OpenBLAS runs about twice as
// many multiply-adds a second as fp64. Smaller tiles stop sooner but cost
// more calls: at 2^29 multiply-adds an fp32 1024x4096x4096 product took
// 1.4-1.5x the single call on a loaded 2-core host, at 2^31 1.2-1.35x
// (bench/gemm_bench, docs/performance.md).
constexpr int64_t kFloatTileMacs = int64_t{1} << 31;
constexpr int64_t kDoubleTileMacs = int64_t{1} << 30;

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
