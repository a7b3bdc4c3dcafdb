// Whether this machine's OpenBLAS, at its current thread count, sums each
// column of an fp32 product alike whatever the call's width: calls of 64
// columns against one over all n (rounded up to 64 columns), for
// [m, k] x [k, n].
//
//   if (BlasIsBlockInvariant(16, 229, 8192)) EXPECT_EQ(differ, 0);
//
// The blocked GEMMs (server/stats/blas_gemm.h, "Large weights: blocks
// along N" in docs/architecture.md) change no output bit only where it
// does. Not on every CPU: on an AMD EPYC without AVX-512 (OpenBLAS
// 0.3.21's Zen kernels) columns near the calls' boundaries differ,
// single-threaded at m = 16, k = 8192 and with two threads at m = 33,
// k = 2048; on SkylakeX they agreed.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "server/stats/blas_gemm.h"

namespace tensorcheck::testing {

inline bool BlasIsBlockInvariant(int64_t m, int64_t n, int64_t k) {
  constexpr int64_t width = 64;
  const int64_t padded = PaddedColumns(n);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  std::vector<float> x(m * k), w(padded * k), full(m * padded), block(m * width);
  for (float& v : x) v = normal(rng);
  for (float& v : w) v = normal(rng);
  if (!BlasGemm(x.data(), w.data(), WeightLayout::kOutIn, m, padded, k, full.data(), nullptr)
           .ok()) {
    return false;
  }
  for (int64_t j0 = 0; j0 < padded; j0 += width) {
    if (!BlasGemm(x.data(), w.data() + j0 * k, WeightLayout::kOutIn, m, width, k, block.data(),
                  nullptr)
             .ok()) {
      return false;
    }
    for (int64_t i = 0; i < m; ++i) {
      if (std::memcmp(&block[i * width], &full[i * padded + j0], width * sizeof(float)) != 0) {
        return false;
      }
    }
  }
  return true;
}

}  // namespace tensorcheck::testing
