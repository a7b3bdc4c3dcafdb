// FP8 fast accumulation on the CPU: every output element's dot product
// under FastAccumModel (core/fp8_scaling.h), k ascending.
//
//   TC_RETURN_IF_ERROR(internal::Fp8FastAccumulate(x, w, WeightLayout::kOutIn, m, nb, k,
//                                                  FastAccumModel{}, threads, c + j0,
//                                                  /*ldc=*/n, stop));
//
// x [m, k] and w ([nb, k] or [k, ldw]) hold FP8 values (unscaled) as
// floats; acc[i * ldc + j] gets the model's sums, bit for bit
// FastAccumDot's. An AVX2 kernel (eight output columns per register, the
// model's operations in fp32 where they are exact) runs where the CPU has
// AVX2, for models of up to 23 accumulator bits whose group sums fit fp32
// (the default 13/32 does); rows of x and columns of w that hold inf, NaN
// or values no FP8 format has, and other models, go through FastAccumDot
// per element, which TENSORCHECK_FP8ACC_SCALAR=1 forces for everything.
// Rows are split over `threads` threads and worked through in slices,
// checking `stop` before each; a stop returns its status.
// RESOURCE_EXHAUSTED when the packed weight cannot be allocated.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "core/fp8_scaling.h"
#include "core/linear_config.h"
#include "core/stop_signal.h"

namespace tensorcheck::internal {

// `ldw`: the distance between w's rows for kInOut ([k, ldw], columns
// 0..nb-1 used); ignored for kOutIn ([nb, k]).
absl::Status Fp8FastAccumulate(const float* x, const float* w, WeightLayout layout, int64_t m,
                               int64_t nb, int64_t k, int64_t ldw, const FastAccumModel& model,
                               int threads, float* acc, int64_t ldc, const StopSignal* stop);

}  // namespace tensorcheck::internal
