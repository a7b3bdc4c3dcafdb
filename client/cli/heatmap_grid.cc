// The heatmaps' data (declared in html_report.h): the output as a matrix,
// and its absolute differences max-pooled into a grid of cells.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cli/html_report.h"

namespace tensorcheck::cli {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

}  // namespace

int64_t GridIndex(int64_t i, int64_t n, int64_t grid_n) {
  if (n <= 0 || i <= 0) return 0;
  if (grid_n <= std::numeric_limits<int64_t>::max() / i) return i * grid_n / n;
  // Beyond 63 bits (never for a real output): quotient and remainder parts.
  return (i / n) * grid_n +
         static_cast<int64_t>(static_cast<long double>(i % n) * static_cast<long double>(grid_n) /
                              static_cast<long double>(n));
}

std::pair<int64_t, int64_t> CellSourceRange(int64_t cell, int64_t n, int64_t grid_n) {
  // The first i with floor(i * grid_n / n) >= cell is ceil(cell * n / grid_n).
  auto first = [n, grid_n](int64_t c) { return (c * n + grid_n - 1) / grid_n; };
  return {first(cell), std::min(n, first(cell + 1)) - 1};
}

absl::StatusOr<AbsDiffGrid> MaxPoolAbsDiff(absl::Span<const double> a, absl::Span<const double> b,
                                           int64_t rows, int64_t cols, int64_t max_cells) {
  if (max_cells < 1) return absl::InvalidArgumentError("max_cells must be at least 1");
  if (rows < 0 || cols < 0) return absl::InvalidArgumentError("negative matrix size");
  const uint64_t n = static_cast<uint64_t>(rows) * static_cast<uint64_t>(cols);
  if (a.size() != n || b.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat("a ", rows, " x ", cols, " matrix needs ", n,
                                                   " values; got ", a.size(), " and ", b.size()));
  }
  AbsDiffGrid g;
  g.rows = rows;
  g.cols = cols;
  g.grid_rows = std::min(rows, max_cells);
  g.grid_cols = std::min(cols, max_cells);
  g.cells.assign(static_cast<size_t>(g.grid_rows * g.grid_cols), 0.0);
  std::vector<int64_t> col_cell(static_cast<size_t>(cols));
  for (int64_t j = 0; j < cols; ++j)
    col_cell[static_cast<size_t>(j)] = GridIndex(j, cols, g.grid_cols);
  for (int64_t i = 0; i < rows; ++i) {
    double* cell_row = g.cells.data() + GridIndex(i, rows, g.grid_rows) * g.grid_cols;
    const double* pa = a.data() + i * cols;
    const double* pb = b.data() + i * cols;
    for (int64_t j = 0; j < cols; ++j) {
      const double x = pa[j], y = pb[j];
      double d;
      if (std::isnan(x) || std::isnan(y)) {
        d = std::isnan(x) && std::isnan(y) ? 0.0 : kInf;
      } else if (x == y) {
        d = 0.0;
      } else {
        d = std::fabs(x - y);  // inf when one side is infinite, or on overflow
      }
      double& c = cell_row[col_cell[static_cast<size_t>(j)]];
      if (d > c) c = d;
    }
  }
  return g;
}

std::pair<int64_t, int64_t> MatrixView(absl::Span<const int64_t> shape) {
  if (shape.empty()) return {1, 1};
  int64_t m = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) m *= shape[i];
  return {m, shape.back()};
}

}  // namespace tensorcheck::cli
