// GEMM tiles of bounded work, so that a long product can stop between
// them: the CPU backend's GEMMs and the error model's magnitude sums run
// their [m, n] output tile by tile and check the request's StopSignal
// before each (docs/architecture.md, "Cancellation").
//
//   TC_RETURN_IF_ERROR(ForEachGemmTile(m, n, k, stop, [&](const GemmTile& t) {
//     cblas_sgemm(..., t.rows, t.cols, k, ..., x + t.row * k, ..., c + t.row * n + t.col, n);
//   }, /*max_macs=*/int64_t{1} << 33));
//
// A product of at most max_macs multiply-adds is one tile, the whole
// output (the same BLAS call as without tiling). Larger ones are cut into
// near-square tiles of about max_macs each, which keeps the operand panels
// a BLAS call packs again, (rows + cols) * k values, small against the
// tile's multiply-adds. The caller chooses max_macs by how fast its
// product runs (stats/blas_gemm.cc). Every output element is computed by
// exactly one tile, over the whole of k.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "absl/status/status.h"
#include "core/stop_signal.h"

namespace tensorcheck {

struct GemmTile {
  int64_t row = 0, rows = 0;  // output rows [row, row + rows)
  int64_t col = 0, cols = 0;  // output columns [col, col + cols)
};

// The tile shape for an [m, n] output of depth k: {rows, cols} per tile.
inline GemmTile GemmTileShape(int64_t m, int64_t n, int64_t k, int64_t max_macs) {
  k = std::max<int64_t>(k, 1);
  if (m <= 0 || n <= 0 || m * n <= max_macs / k) return {0, m, 0, n};
  const int64_t outputs = std::max<int64_t>(1, max_macs / k);  // elements per tile
  const auto side = static_cast<int64_t>(std::sqrt(static_cast<double>(outputs)));
  int64_t rows = std::clamp<int64_t>(side, 1, m);
  int64_t cols = std::clamp<int64_t>(outputs / rows, 1, n);
  rows = std::clamp<int64_t>(outputs / cols, 1, m);  // a narrow output gives rows the rest
  return {0, rows, 0, cols};
}

// Calls tile(const GemmTile&) for each tile of the [m, n] output, row
// band by row band, after checking `stop` (null: never stops); returns
// the stop status if it fired, OK after the last tile.
template <typename Tile>
absl::Status ForEachGemmTile(int64_t m, int64_t n, int64_t k, const StopSignal* stop, Tile&& tile,
                             int64_t max_macs) {
  const GemmTile shape = GemmTileShape(m, n, k, max_macs);
  for (int64_t row = 0; row < m; row += shape.rows) {
    for (int64_t col = 0; col < n; col += shape.cols) {
      if (absl::Status s = CheckStop(stop); !s.ok()) return s;
      tile(GemmTile{row, std::min(shape.rows, m - row), col, std::min(shape.cols, n - col)});
    }
  }
  return absl::OkStatus();
}

}  // namespace tensorcheck
