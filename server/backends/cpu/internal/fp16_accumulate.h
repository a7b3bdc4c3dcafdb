// fp16 accumulation (the `fp16acc` precision, CUBLAS_COMPUTE_16F): every
// multiply-add rounds the running sum to fp16, k ascending.
//
//   std::vector<float> acc(m * n);
//   TC_RETURN_IF_ERROR(internal::Fp16Accumulate(x, w, WeightLayout::kOutIn, m, n, k,
//                                               /*threads=*/2, acc.data()));
//
// x [m, k] and w ([n, k] or [k, n]) hold fp16 values as floats; acc gets
// the fp16 sums as floats. An AVX2+FMA kernel (exact fma in double, one
// round-to-nearest-even to fp16 per step) runs where the CPU has one, bit
// for bit the scalar loop, which TENSORCHECK_FP16ACC_SCALAR=1 forces.
// Rows are split over `threads` threads, each working through its rows in
// slices of bounded work and checking `stop` (null: never stops) before
// each; a stop returns its status. RESOURCE_EXHAUSTED when the packed
// weight cannot be allocated.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "core/linear_config.h"
#include "core/stop_signal.h"

namespace tensorcheck::internal {

absl::Status Fp16Accumulate(const float* x, const float* w, WeightLayout layout, int64_t m,
                            int64_t n, int64_t k, int threads, float* acc,
                            const StopSignal* stop = nullptr);

// The same with acc's rows ldc >= n floats apart (acc[i * ldc + j]): the
// CPU backend writes a block of columns of the whole accumulator. w is
// still [n, k] or [k, n] with rows n apart.
absl::Status Fp16Accumulate(const float* x, const float* w, WeightLayout layout, int64_t m,
                            int64_t n, int64_t k, int threads, float* acc, int64_t ldc,
                            const StopSignal* stop);

}  // namespace tensorcheck::internal
