// Magnitude sums of a linear layer: what its error bounds scale with.
//
// For x viewed as [m, k] and w stored [n, k] (OUT_IN) or [k, n] (IN_OUT),
// per output element (i, j):
//   abs_dot[i*n + j] = sum_k |x_ik| |w_jk|      (the hard bound's A)
//   sq_dot[i*n + j]  = sqrt(sum_k (x_ik w_jk)^2) (the error model's S)
//   dot[i*n + j]     = sum_k x_ik w_jk           (x.w before the bias)
// each computed in fp32 by OpenBLAS sgemm, and only when its pointer is
// not null. The weight is converted to fp32 one block of output columns at
// a time (stats/blas_gemm.h, PlanWeightBlocks: at most about 64 MiB), never
// whole; the sums are bit for bit those of one sgemm over the whole weight:
//
//   MagnitudeOperands op{LayerShape{m, n, k, WeightLayout::kOutIn}, &x, &w};
//   std::vector<float> sq(m * n);
//   TC_RETURN_IF_ERROR(ComputeMagnitudeSums(op, MagnitudeSums{nullptr, sq.data()}));
//
// Thread-safe (the caller owns the outputs). INVALID_ARGUMENT when the
// operands' shapes do not match m, n, k; RESOURCE_EXHAUSTED when the fp32
// copies of x (three: x, |x|, x^2) and of a block of w cannot be allocated.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "core/layer_shape.h"
#include "core/linear_config.h"
#include "core/stop_signal.h"
#include "core/tensor.h"

namespace tensorcheck {

// The layer's shape (its m, n, k and layout are read; activation and
// output dtype play no part in the sums) and its operands.
struct MagnitudeOperands : LayerShape {
  const Tensor* input = nullptr;   // m*k elements, any leading shape
  const Tensor* weight = nullptr;  // [n, k] (kOutIn) or [k, n] (kInOut)
  // Checked between weight blocks and GEMM tiles; a stop returns its
  // status (null: never).
  const StopSignal* stop = nullptr;
  // Weight blocks of about this many output columns (tests); 0: sized by
  // kWeightBlockBytes. The sums are the same bit for bit either way.
  int64_t block_columns = 0;
  // FP8 operands' dequantisation scales (float32, 1 or m and n values):
  // the sums are of the dequantised values, each element's sums scaled by
  // |s_x[i] s_w[j]| (x.w by s_x[i] s_w[j]). Null: none.
  const Tensor* input_scale = nullptr;
  const Tensor* weight_scale = nullptr;
};

// Outputs of m*n floats each, allocated by the caller; null: not computed.
struct MagnitudeSums {
  float* abs_dot = nullptr;
  float* sq_dot = nullptr;
  float* dot = nullptr;
};

absl::Status ComputeMagnitudeSums(const MagnitudeOperands& op, const MagnitudeSums& out);

// The same with abs_dot and sq_dot required: INVALID_ARGUMENT when null.
absl::Status ComputeMagnitudeSums(const MagnitudeOperands& op, float* abs_dot, float* sq_dot,
                                  float* dot = nullptr);

}  // namespace tensorcheck
