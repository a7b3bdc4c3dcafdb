#include "server/stats/blas_gemm.h"

#include <cblas.h>

#include <algorithm>

#include "server/core/gemm_tiles.h"

namespace tensorcheck {
namespace {

template <typename T, typename Blas>
absl::Status TiledGemm(const T* x, const T* w, WeightLayout layout, int64_t m, int64_t n, int64_t k,
                       T* c, const StopSignal* stop, Blas blas) {
  if (m == 0 || n == 0) return CheckStop(stop);
  if (k == 0) {
    std::fill(c, c + m * n, T{0});
    return CheckStop(stop);
  }
  const bool out_in = layout == WeightLayout::kOutIn;
  return ForEachGemmTile(m, n, k, stop, [&](const GemmTile& t) {
    // The tile's columns are rows t.col.. of w [n, k], or columns of w [k, n].
    const T* w_tile = out_in ? w + t.col * k : w + t.col;
    blas(CblasRowMajor, CblasNoTrans, out_in ? CblasTrans : CblasNoTrans, static_cast<int>(t.rows),
         static_cast<int>(t.cols), static_cast<int>(k), T{1}, x + t.row * k, static_cast<int>(k),
         w_tile, static_cast<int>(out_in ? k : n), T{0}, c + t.row * n + t.col,
         static_cast<int>(n));
  });
}

}  // namespace

absl::Status BlasGemm(const float* x, const float* w, WeightLayout layout, int64_t m, int64_t n,
                      int64_t k, float* c, const StopSignal* stop) {
  return TiledGemm(x, w, layout, m, n, k, c, stop, cblas_sgemm);
}

absl::Status BlasGemm(const double* x, const double* w, WeightLayout layout, int64_t m, int64_t n,
                      int64_t k, double* c, const StopSignal* stop) {
  return TiledGemm(x, w, layout, m, n, k, c, stop, cblas_dgemm);
}

}  // namespace tensorcheck
