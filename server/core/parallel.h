// ParallelChunks: a per-element pass split over a few threads.
//
//   ParallelChunks(count, /*threads=*/2, [&](int64_t begin, int64_t end) {
//     for (int64_t i = begin; i < end; ++i) out[i] = f(in[i]);
//   });
//
// [0, count) is cut into up to `threads` contiguous chunks of at least
// `min_chunk` items; each runs on a thread of its own, the last on the
// caller's, and the call returns when all are done. Bodies must write
// disjoint data; whatever they sum should be added up by the caller in
// chunk order (or per item), so that results do not depend on `threads`.
// When a thread cannot be started its chunk runs on the caller's thread.
#pragma once

#include <algorithm>
#include <cstdint>
#include <system_error>
#include <thread>
#include <vector>

namespace tensorcheck {

// The number of threads a pass should use when asked for `requested` (0:
// one per hardware thread).
inline int ResolveThreads(int requested) {
  if (requested > 0) return requested;
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

template <typename Body>
void ParallelChunks(int64_t count, int threads, Body body, int64_t min_chunk = 1 << 16) {
  const int64_t by_size = std::max<int64_t>(1, count / std::max<int64_t>(min_chunk, 1));
  const int64_t parts = std::min<int64_t>(std::max(threads, 1), by_size);
  if (parts <= 1) {
    body(int64_t{0}, count);
    return;
  }
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(parts - 1));
  int64_t next = 0;
  for (int64_t t = 0; t + 1 < parts; ++t) {
    const int64_t begin = count * t / parts, end = count * (t + 1) / parts;
    try {
      pool.emplace_back(body, begin, end);
    } catch (const std::system_error&) {
      break;  // No thread to be had: the rest runs on this one.
    }
    next = end;
  }
  body(next, count);
  for (std::thread& th : pool) th.join();
}

}  // namespace tensorcheck
