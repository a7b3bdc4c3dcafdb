// The one OpenBLAS product of the project, c[m, n] = x[m, k] * w^T, in
// fp32 or fp64, run tile by tile (core/gemm_tiles.h) so that a request's
// StopSignal can stop it between tiles. The CPU backend's accumulations
// and the error model's magnitude sums both use it.
//
//   TC_RETURN_IF_ERROR(BlasGemm(x, w, WeightLayout::kOutIn, m, n, k, c, stop));
//
// w is stored [n, k] (OUT_IN) or [k, n] (IN_OUT); the layout becomes BLAS's
// transpose flag, never a copy. k == 0 gives zeros. Returns the stop status
// when `stop` (null: never stops) fired before the last tile; c is then
// partly written. Thread-safe (OpenBLAS's own threads run each tile).
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "server/core/linear_config.h"
#include "server/core/stop_signal.h"

namespace tensorcheck {

absl::Status BlasGemm(const float* x, const float* w, WeightLayout layout, int64_t m, int64_t n,
                      int64_t k, float* c, const StopSignal* stop);

absl::Status BlasGemm(const double* x, const double* w, WeightLayout layout, int64_t m, int64_t n,
                      int64_t k, double* c, const StopSignal* stop);

}  // namespace tensorcheck
