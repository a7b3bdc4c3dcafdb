// The error model on the device (internal to this folder): stats'
// PredictSigma / PredictPairSigma / PredictPairAccumulationSigma, HardBound
// and FlipGrid over device arrays, and the element-wise operands of the
// magnitude sums and of TF32 inputs. Each thread runs the very per-element
// rules the host runs (server/stats/error_model_rules.h), with the
// per-request constants the host computes (error_model.h's
// SigmaConstantsOf, BoundConstantsOf, FlipConstantsOf), so the host tests
// (error_model_rules_test.cc) check what the kernels compute.
//
//   DeviceSigmaArgs a;
//   a.c = SigmaConstantsOf(in, SigmaKind::kSingle);  // in: the host's ErrorModelInput
//   a.sq_dot = d_sq_dot;  a.value = d_y;  a.value_type = ElemType::kF32;
//   a.pre_bias = a.c.has_pre_bias ? d_pre_bias : nullptr;
//   a.sigma = d_sigma;  a.count = m * n;  a.sum_sq = d_sum_sq;
//   TC_CUDA_RETURN_IF_ERROR(LaunchPredictSigma(a, stream));
//
// Results: sigma, bound and the magnitude operands are bitwise the host's
// (the rules round every operation on its own, as the host does; double
// division and sqrt are correctly rounded on both). The flip grid is too
// for no activation and ReLU; under GELU it calls CUDA's tanh, which may
// differ from the host libm's in the last bit, and so may the grid.
// sum_sq is the sum of the same squares in another order (per-thread,
// per-block partial sums added atomically): equal to the host's up to
// rounding, and not reproducible from run to run in its last bits.
//
// Each launcher enqueues on `stream` and returns the launch status
// (cudaGetLastError): cudaErrorInvalidValue for arguments it can see are
// wrong (a null array that `count` > 0 needs, a mode out of range);
// execution errors surface at the next synchronisation. All pointers are
// device pointers; count <= 0 launches nothing.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "server/backends/cuda/internal/elem_type.h"
#include "server/stats/error_model_rules.h"

namespace tensorcheck::cuda {

// The predicted sigma of `count` outputs (PredictSigma and its pair forms:
// which one is c's choice, SigmaConstantsOf).
struct DeviceSigmaArgs {
  rules::SigmaConstants c;
  const float* sq_dot = nullptr;  // sqrt(sum_k (x_k w_k)^2) per output
  // The reference output, of element type value_type, widened exactly to
  // double per element.
  const void* value = nullptr;
  ElemType value_type = ElemType::kF64;
  const float* pre_bias = nullptr;  // x.w per output; read (and required) when c.has_pre_bias
  float* sigma = nullptr;           // out: count floats
  int64_t count = 0;
  // Nullable. When set, receives the sum of sigma^2 over all elements:
  // zeroed on `stream` first, then per-block partial sums (in double) added
  // with atomicAdd, so the order differs from the host's element-order
  // sum (and from run to run). Not finite when some sigma is not.
  double* sum_sq = nullptr;
};
cudaError_t LaunchPredictSigma(const DeviceSigmaArgs& args, cudaStream_t stream);

// The hard bound of `count` outputs (HardBound; c from BoundConstantsOf).
struct DeviceBoundArgs {
  rules::BoundConstants c;
  const float* abs_dot = nullptr;  // sum_k |x_k||w_k| per output
  const void* value = nullptr;     // the reference output, of value_type
  ElemType value_type = ElemType::kF64;
  const float* pre_bias = nullptr;  // read (and required) when c.has_pre_bias
  float* bound = nullptr;           // out: count floats
  int64_t count = 0;
};
cudaError_t LaunchHardBound(const DeviceBoundArgs& args, cudaStream_t stream);

// The flip grid of `count` outputs (FlipGrid; c from FlipConstantsOf):
// element i is in column i % cols.
struct DeviceFlipGridArgs {
  rules::FlipConstants c;           // output type, unfused bias, activation (an int)
  const float* pre_bias = nullptr;  // x.w per output (required)
  const double* bias = nullptr;     // per column; null: no bias
  int64_t cols = 0;                 // N; the bias is read only when cols > 0
  float* grid = nullptr;            // out: count floats, +inf where no flip can show
  int64_t count = 0;
};
cudaError_t LaunchFlipGrid(const DeviceFlipGridArgs& args, cudaStream_t stream);

// The operands of the magnitude sums (stats' magnitude_sums.cc) from
// `count` elements of `src`: raw[i] = src[i] as fp32 (exact for fp32, fp16
// and bf16; fp64 rounded to nearest even, as core's ToFloat), abs[i] =
// |raw[i]|, sq[i] = abs[i] * abs[i] rounded in fp32. Each output is
// nullable; all null launches nothing.
cudaError_t LaunchMagnitudeOperands(const void* src, ElemType src_type, int64_t count, float* raw,
                                    float* abs, float* sq, cudaStream_t stream);

// values[i] = sqrtf(values[i]) in place (correctly rounded, as the host's
// std::sqrt on float): sq_dot from the GEMM of the squares.
cudaError_t LaunchSqrtInPlace(float* values, int64_t count, cudaStream_t stream);

// dst[i] = RoundToTf32(src[i], mode) (core/tf32_rounding.h), `mode`
// a Tf32Rounding as int (0 nearest even, 1 ties away, 2 truncate). dst may
// be src.
cudaError_t LaunchRoundTf32(const float* src, float* dst, int64_t count, int mode,
                            cudaStream_t stream);

}  // namespace tensorcheck::cuda
