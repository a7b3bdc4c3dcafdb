// ParallelChunks: a per-element pass split into contiguous chunks that run
// on an Executor (core/executor.h).
//
//   ParallelChunks(count, executor, [&](int64_t begin, int64_t end) {
//     for (int64_t i = begin; i < end; ++i) out[i] = f(in[i]);
//   });
//
// [0, count) is cut into chunks of at least `min_chunk` items (at most
// kMaxParallelChunks of them). The cut depends on `count` and `min_chunk`
// only, never on the executor: a null executor (or one of size 1) runs the
// same chunks in order on the caller's thread. The call returns when all
// are done. Bodies must write disjoint data; whatever they sum should be
// added up by the caller in chunk order (or per item), so that results do
// not depend on the executor.
//
// The overload that takes a thread count starts its own threads on every
// call; it remains for the callers that have not moved to an executor yet
// (server/engine) and goes away once they have.
#pragma once

#include <algorithm>
#include <cstdint>
#include <system_error>
#include <thread>
#include <vector>

#include "core/executor.h"

namespace tensorcheck {

// Most chunks one ParallelChunks call makes: enough to balance any pool
// this server runs, few enough that tiny `min_chunk`s stay cheap.
inline constexpr int64_t kMaxParallelChunks = 256;

template <typename Body>
void ParallelChunks(int64_t count, Executor* executor, Body body, int64_t min_chunk = 1 << 16) {
  if (count <= 0) return;
  const int64_t by_size = std::max<int64_t>(1, count / std::max<int64_t>(min_chunk, 1));
  const int64_t parts = std::min(by_size, kMaxParallelChunks);
  ParallelFor(executor, parts,
              [&](int64_t part) { body(count * part / parts, count * (part + 1) / parts); });
}

}  // namespace tensorcheck
