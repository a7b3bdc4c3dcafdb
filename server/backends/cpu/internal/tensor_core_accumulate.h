// A GPU kernel's tensor-core accumulation replayed on the CPU: every output
// element's dot product as KernelOrderDot (core/tensor_core_model.h)
// computes it, bit for bit, fast enough for a whole layer.
//
//   TC_ASSIGN_OR_RETURN(TensorCoreModel model,
//                       TensorCoreModelFor(TensorCoreGpu::kSm90, TensorCoreInput::kBf16));
//   KernelOrder order;
//   order.model = model;
//   TC_RETURN_IF_ERROR(internal::TensorCoreAccumulate(x, w, WeightLayout::kOutIn, m, nb, k,
//                                                     /*ldw=*/0, order, threads, c + j0,
//                                                     /*ldc=*/n, stop));
//
// x [m, k] and w ([nb, k] or [k, ldw]) hold values of the model's input
// formats (bf16, fp16, TF32 or FP8 values, already rounded) as floats;
// acc[i * ldc + j] gets KernelOrderDot(row i of x, column j of w, k,
// order). A vector kernel (sixteen output columns per tile row, each
// block's alignment and truncation done with exact fp32, int16 and int32
// operations) runs where the CPU has AVX2 and FMA, with AVX-512 where it
// also has AVX-512F (TENSORCHECK_TCACC_AVX2=1 keeps AVX2), for the models
// with truncated block sums (every preset); an element whose row of x or
// column of w holds inf, NaN, values wider than 12 significant bits or
// magnitudes far enough apart that a step could round, and every element
// under other models, goes through KernelOrderDot, which
// TENSORCHECK_TCACC_SCALAR=1 forces for everything. Rows are split over
// `threads` threads and worked through in slices, checking `stop` before
// each; a stop returns its status. RESOURCE_EXHAUSTED when the packed
// weight (6 bytes per element of w) cannot be allocated.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "core/linear_config.h"
#include "core/stop_signal.h"
#include "core/tensor_core_model.h"

namespace tensorcheck::internal {

// `ldw`: the distance between w's rows for kInOut ([k, ldw], columns
// 0..nb-1 used); ignored for kOutIn ([nb, k]).
absl::Status TensorCoreAccumulate(const float* x, const float* w, WeightLayout layout, int64_t m,
                                  int64_t nb, int64_t k, int64_t ldw, const KernelOrder& order,
                                  int threads, float* acc, int64_t ldc, const StopSignal* stop);

}  // namespace tensorcheck::internal
