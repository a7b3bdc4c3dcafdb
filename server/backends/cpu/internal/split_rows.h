// Row-parallel loops of the CPU backend's own accumulation kernels
// (fp16acc, FP8 fast accumulation): rows are independent, so splitting
// them over threads or into slices changes no bit.
//
//   SplitRows(m, n, k, threads, [&](int64_t begin, int64_t end) {
//     RowsInSlices(begin, end, n, k, kSliceMacs, stop, [&](int64_t b, int64_t e) {
//       for (int64_t i = b; i < e; ++i) ...;   // rows b..e-1
//     });
//   });
#pragma once

#include <algorithm>
#include <cstdint>
#include <system_error>
#include <thread>
#include <vector>

#include "core/stop_signal.h"

namespace tensorcheck::internal {

// Runs rows(begin, end) over [0, m), split across up to `threads` threads
// by rows (one thread below about 2^20 multiply-adds).
template <typename Rows>
void SplitRows(int64_t m, int64_t n, int64_t k, int threads, Rows rows) {
  const int64_t work = m * n * std::max<int64_t>(k, 1);
  int64_t parts = std::min<int64_t>(threads, m);
  if (work < (int64_t{1} << 20)) parts = 1;
  if (parts <= 1) {
    rows(int64_t{0}, m);
    return;
  }
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(parts));
  int64_t next = 0;
  for (int64_t t = 0; t < parts; ++t) {
    const int64_t begin = m * t / parts;
    const int64_t end = m * (t + 1) / parts;
    try {
      pool.emplace_back(rows, begin, end);
    } catch (const std::system_error&) {
      break;  // No thread to be had: the rest runs on this one.
    }
    next = end;
  }
  rows(next, m);
  for (auto& th : pool) th.join();
}

// Rows [begin, end) in slices of about `slice_macs` multiply-adds,
// checking `stop` before each. False when it fired.
template <typename Rows>
bool RowsInSlices(int64_t begin, int64_t end, int64_t n, int64_t k, int64_t slice_macs,
                  const StopSignal* stop, Rows rows) {
  const int64_t per_row = std::max<int64_t>(1, n * std::max<int64_t>(k, 1));
  const int64_t slice = std::max<int64_t>(1, slice_macs / per_row);
  for (int64_t r = begin; r < end; r += slice) {
    if (stop != nullptr && stop->stop_requested()) return false;
    rows(r, std::min(end, r + slice));
  }
  return true;
}

}  // namespace tensorcheck::internal
