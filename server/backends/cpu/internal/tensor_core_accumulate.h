// Kernel replays on the CPU: every output element's dot product as
// KernelOrderDot (core/tensor_core_model.h) computes it.
//
//   TC_RETURN_IF_ERROR(internal::TensorCoreAccumulate(x, w, WeightLayout::kOutIn, m, nb, k,
//                                                     /*ldw=*/nb, order, threads, c + j0,
//                                                     /*ldc=*/n, stop));
//
// x [m, k] and w ([nb, k] or [k, ldw]) hold values of the order's input
// formats as floats; acc[i * ldc + j] gets KernelOrderDot's sums, bit for
// bit. `stop` is checked between rows; a stop returns its status.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "core/linear_config.h"
#include "core/stop_signal.h"
#include "core/tensor_core_model.h"

namespace tensorcheck::internal {

absl::Status TensorCoreAccumulate(const float* x, const float* w, WeightLayout layout, int64_t m,
                                  int64_t nb, int64_t k, int64_t ldw, const KernelOrder& order,
                                  int threads, float* acc, int64_t ldc, const StopSignal* stop);

}  // namespace tensorcheck::internal
