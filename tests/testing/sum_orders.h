// x.W^T accumulated in a chosen summation order, written independently of
// the server (no BLAS): what another framework's or a GPU's GEMM computes
// when its products are exact (bf16 or fp16 operands, fp32 accumulator).
//
//   std::vector<float> acc(m * n);
//   AccumulateInOrder<float>(x, w, m, k, n, SumOrder::kPairwise, acc.data());
//
// Rows are split over two threads and columns are processed in panels; the
// order in which each element's k terms are added is the one named, and
// only that (no -ffast-math: the compiler keeps each element's additions in
// program order, vectorising across elements).
#pragma once

#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

namespace tensorcheck::testing {

enum class SumOrder {
  kSequential,  // k = 0, 1, ..., K-1 into one accumulator
  kTiles32,     // a GPU kernel's K loop: each tile of 32 summed from 0,
                // then added to the accumulator
  kPairwise,    // a balanced binary tree over k (split-K and tree reductions)
};

namespace internal {

constexpr int64_t kPanel = 128;  // columns per panel (wt is padded to them)
constexpr int64_t kRows = 32;    // rows per block
constexpr int kLevels = 40;      // pairwise tree levels

// Rows [row_begin, row_end) of acc for the column panel at j0; x [m, k]
// row-major, wt = W^T [k, np] with np a multiple of kPanel. Each order has
// its own loops, with constant-length inner loops the compiler vectorises
// across columns (never across k).
template <typename Acc>
void PanelRows(const std::vector<float>& x, const std::vector<float>& wt, int64_t k, int64_t np,
               int64_t j0, SumOrder order, int64_t i0, int64_t rows,
               Acc* acc /* [kRows][kPanel] */) {
  std::fill(acc, acc + kRows * kPanel, Acc(0));
  auto x_at = [&](int64_t r, int64_t kk) {
    return static_cast<Acc>(x[static_cast<size_t>((i0 + r) * k + kk)]);
  };
  if (order == SumOrder::kSequential) {
    for (int64_t kk = 0; kk < k; ++kk) {
      const float* w = &wt[static_cast<size_t>(kk * np + j0)];
      for (int64_t r = 0; r < rows; ++r) {
        const Acc xv = x_at(r, kk);
        Acc* a = acc + r * kPanel;
        for (int64_t c = 0; c < kPanel; ++c) a[c] += xv * static_cast<Acc>(w[c]);
      }
    }
    return;
  }
  if (order == SumOrder::kTiles32) {
    std::vector<Acc> tile(kRows * kPanel);
    for (int64_t t0 = 0; t0 < k; t0 += 32) {
      std::fill(tile.begin(), tile.end(), Acc(0));
      for (int64_t kk = t0; kk < std::min(k, t0 + 32); ++kk) {
        const float* w = &wt[static_cast<size_t>(kk * np + j0)];
        for (int64_t r = 0; r < rows; ++r) {
          const Acc xv = x_at(r, kk);
          Acc* t = &tile[static_cast<size_t>(r * kPanel)];
          for (int64_t c = 0; c < kPanel; ++c) t[c] += xv * static_cast<Acc>(w[c]);
        }
      }
      for (size_t e = 0; e < tile.size(); ++e) acc[e] += tile[e];
    }
    return;
  }
  // Pairwise: a binary counter of partial sums, one per tree level; the
  // k-th product enters at level 0 and carries up while its level is full.
  std::vector<Acc> stack(static_cast<size_t>(kLevels) * kRows * kPanel);
  std::vector<Acc> node(kRows * kPanel);
  std::vector<char> filled(kLevels, 0);
  for (int64_t kk = 0; kk < k; ++kk) {
    const float* w = &wt[static_cast<size_t>(kk * np + j0)];
    for (int64_t r = 0; r < rows; ++r) {
      const Acc xv = x_at(r, kk);
      Acc* t = &node[static_cast<size_t>(r * kPanel)];
      for (int64_t c = 0; c < kPanel; ++c) t[c] = xv * static_cast<Acc>(w[c]);
    }
    int level = 0;
    while (filled[level]) {
      const Acc* left = &stack[static_cast<size_t>(level) * kRows * kPanel];
      for (size_t e = 0; e < node.size(); ++e) node[e] = left[e] + node[e];
      filled[level] = 0;
      ++level;
    }
    std::copy(node.begin(), node.end(), &stack[static_cast<size_t>(level) * kRows * kPanel]);
    filled[level] = 1;
  }
  // K not a power of two: the partial sums left, the lowest (rightmost)
  // level first, each added on the left of what is summed so far.
  bool any = false;
  for (int level = 0; level < kLevels; ++level) {
    if (!filled[level]) continue;
    const Acc* left = &stack[static_cast<size_t>(level) * kRows * kPanel];
    for (int64_t e = 0; e < kRows * kPanel; ++e) acc[e] = any ? left[e] + acc[e] : left[e];
    any = true;
  }
}

}  // namespace internal

// acc[i*n + j] = sum_k x[i*k + kk] * w[j*k + kk] in `order`, accumulated in
// Acc (float or double); x [m, k], w [n, k] (torch layout).
template <typename Acc>
void AccumulateInOrder(const std::vector<float>& x, const std::vector<float>& w, int64_t m,
                       int64_t k, int64_t n, SumOrder order, Acc* out) {
  using internal::kPanel;
  using internal::kRows;
  const int64_t np = (n + kPanel - 1) / kPanel * kPanel;
  std::vector<float> wt(static_cast<size_t>(k * np), 0.0f);
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t kk = 0; kk < k; ++kk) {
      wt[static_cast<size_t>(kk * np + j)] = w[static_cast<size_t>(j * k + kk)];
    }
  }
  // Two threads take alternate column panels; each panel of W^T is read
  // once from memory and reused by every block of rows.
  auto work = [&](int64_t first_panel) {
    std::vector<Acc> acc(kRows * kPanel);
    for (int64_t j0 = first_panel * kPanel; j0 < n; j0 += 2 * kPanel) {
      const int64_t cols = std::min(kPanel, n - j0);
      for (int64_t i0 = 0; i0 < m; i0 += kRows) {
        const int64_t rows = std::min(kRows, m - i0);
        internal::PanelRows(x, wt, k, np, j0, order, i0, rows, acc.data());
        for (int64_t r = 0; r < rows; ++r) {
          std::copy(&acc[static_cast<size_t>(r * kPanel)],
                    &acc[static_cast<size_t>(r * kPanel + cols)], out + (i0 + r) * n + j0);
        }
      }
    }
  };
  std::thread other(work, 1);
  work(0);
  other.join();
}

}  // namespace tensorcheck::testing
