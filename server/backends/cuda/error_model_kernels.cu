#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "core/tf32_rounding.h"
#include "server/backends/cuda/internal/error_model_kernels.h"
#include "server/stats/error_model_rules.h"

namespace tensorcheck::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int64_t kMaxBlocks = 8192;

int Blocks(int64_t count) {
  const int64_t b = (count + kThreads - 1) / kThreads;
  return static_cast<int>(std::max<int64_t>(1, std::min(b, kMaxBlocks)));
}

__device__ __forceinline__ int64_t FirstIndex() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t Stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

// Element i of `p`, of type t, widened exactly to double.
__device__ __forceinline__ double LoadDouble(const void* p, ElemType t, int64_t i) {
  switch (t) {
    case ElemType::kF64:
      return static_cast<const double*>(p)[i];
    case ElemType::kF32:
      return static_cast<double>(static_cast<const float*>(p)[i]);
    case ElemType::kF16:
      return static_cast<double>(__half2float(static_cast<const __half*>(p)[i]));
    case ElemType::kBF16:
      return static_cast<double>(__bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]));
  }
  return 0.0;
}

// Element i of `p` as fp32, as core's ToFloat: exact for fp32, fp16 and
// bf16; fp64 rounded to nearest even.
__device__ __forceinline__ float LoadFloat(const void* p, ElemType t, int64_t i) {
  switch (t) {
    case ElemType::kF64:
      return __double2float_rn(static_cast<const double*>(p)[i]);
    case ElemType::kF32:
      return static_cast<const float*>(p)[i];
    case ElemType::kF16:
      return __half2float(static_cast<const __half*>(p)[i]);
    case ElemType::kBF16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  }
  return 0.0f;
}

bool ValidType(ElemType t) {
  return t == ElemType::kF64 || t == ElemType::kF32 || t == ElemType::kF16 || t == ElemType::kBF16;
}

// ---- kernels

// The sum over the block of every thread's `v`, in thread 0 (the others
// return garbage). Every thread of the block must call it.
__device__ __forceinline__ double BlockSum(double v) {
  __shared__ double warp_sums[kWarps];
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  v = threadIdx.x < kWarps ? warp_sums[threadIdx.x] : 0.0;
  if (warp == 0) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
  }
  return v;
}

template <bool kSumSquares>
__global__ void __launch_bounds__(kThreads) PredictSigmaKernel(DeviceSigmaArgs a) {
  double sum_sq = 0;
  for (int64_t i = FirstIndex(); i < a.count; i += Stride()) {
    const float s = rules::ElementSigma(a.c, a.sq_dot[i], LoadDouble(a.value, a.value_type, i),
                                        a.c.has_pre_bias ? a.pre_bias[i] : 0.0f);
    a.sigma[i] = s;
    // Exact: a float's square fits in a double.
    if constexpr (kSumSquares) sum_sq += static_cast<double>(s) * s;
  }
  if constexpr (kSumSquares) {
    sum_sq = BlockSum(sum_sq);
    if (threadIdx.x == 0) atomicAdd(a.sum_sq, sum_sq);
  }
}

__global__ void __launch_bounds__(kThreads) HardBoundKernel(DeviceBoundArgs a) {
  for (int64_t i = FirstIndex(); i < a.count; i += Stride()) {
    a.bound[i] = rules::ElementHardBound(a.c, a.abs_dot[i], LoadDouble(a.value, a.value_type, i),
                                         a.c.has_pre_bias ? a.pre_bias[i] : 0.0f);
  }
}

__global__ void __launch_bounds__(kThreads) FlipGridKernel(DeviceFlipGridArgs a) {
  const bool has_bias = a.bias != nullptr && a.cols > 0;
  for (int64_t i = FirstIndex(); i < a.count; i += Stride()) {
    a.grid[i] =
        rules::ElementFlipGrid(a.c, a.pre_bias[i], has_bias, has_bias ? a.bias[i % a.cols] : 0.0);
  }
}

__global__ void __launch_bounds__(kThreads)
    MagnitudeOperandsKernel(const void* src, ElemType src_type, int64_t count, float* raw,
                            float* abs, float* sq) {
  for (int64_t i = FirstIndex(); i < count; i += Stride()) {
    const float v = LoadFloat(src, src_type, i);
    if (raw != nullptr) raw[i] = v;
    // As magnitude_sums.cc: |v| in fp32, then its square rounded to fp32.
    const float m = fabsf(v);
    if (abs != nullptr) abs[i] = m;
    if (sq != nullptr) sq[i] = __fmul_rn(m, m);
  }
}

__global__ void __launch_bounds__(kThreads) SqrtInPlaceKernel(float* values, int64_t count) {
  for (int64_t i = FirstIndex(); i < count; i += Stride()) values[i] = __fsqrt_rn(values[i]);
}

__global__ void __launch_bounds__(kThreads)
    RoundTf32Kernel(const float* src, float* dst, int64_t count, Tf32Rounding mode) {
  for (int64_t i = FirstIndex(); i < count; i += Stride()) dst[i] = RoundToTf32(src[i], mode);
}

}  // namespace

cudaError_t LaunchPredictSigma(const DeviceSigmaArgs& args, cudaStream_t stream) {
  if (args.count > 0 &&
      (args.sq_dot == nullptr || args.value == nullptr || args.sigma == nullptr ||
       !ValidType(args.value_type) || (args.c.has_pre_bias && args.pre_bias == nullptr))) {
    return cudaErrorInvalidValue;
  }
  if (args.sum_sq != nullptr) {
    // The blocks add to it; an empty launch still reports 0.
    const cudaError_t e = cudaMemsetAsync(args.sum_sq, 0, sizeof(double), stream);
    if (e != cudaSuccess) return e;
  }
  if (args.count <= 0) return cudaSuccess;
  const int blocks = Blocks(args.count);
  if (args.sum_sq != nullptr) {
    PredictSigmaKernel<true><<<blocks, kThreads, 0, stream>>>(args);
  } else {
    PredictSigmaKernel<false><<<blocks, kThreads, 0, stream>>>(args);
  }
  return cudaGetLastError();
}

cudaError_t LaunchHardBound(const DeviceBoundArgs& args, cudaStream_t stream) {
  if (args.count <= 0) return cudaSuccess;
  if (args.abs_dot == nullptr || args.value == nullptr || args.bound == nullptr ||
      !ValidType(args.value_type) || (args.c.has_pre_bias && args.pre_bias == nullptr)) {
    return cudaErrorInvalidValue;
  }
  HardBoundKernel<<<Blocks(args.count), kThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

cudaError_t LaunchFlipGrid(const DeviceFlipGridArgs& args, cudaStream_t stream) {
  if (args.count <= 0) return cudaSuccess;
  if (args.pre_bias == nullptr || args.grid == nullptr || !ValidType(args.c.output)) {
    return cudaErrorInvalidValue;
  }
  FlipGridKernel<<<Blocks(args.count), kThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

cudaError_t LaunchMagnitudeOperands(const void* src, ElemType src_type, int64_t count, float* raw,
                                    float* abs, float* sq, cudaStream_t stream) {
  if (count <= 0 || (raw == nullptr && abs == nullptr && sq == nullptr)) return cudaSuccess;
  if (src == nullptr || !ValidType(src_type)) return cudaErrorInvalidValue;
  MagnitudeOperandsKernel<<<Blocks(count), kThreads, 0, stream>>>(src, src_type, count, raw, abs,
                                                                  sq);
  return cudaGetLastError();
}

cudaError_t LaunchSqrtInPlace(float* values, int64_t count, cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  if (values == nullptr) return cudaErrorInvalidValue;
  SqrtInPlaceKernel<<<Blocks(count), kThreads, 0, stream>>>(values, count);
  return cudaGetLastError();
}

cudaError_t LaunchRoundTf32(const float* src, float* dst, int64_t count, int mode,
                            cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  if (src == nullptr || dst == nullptr || mode < 0 || mode > 2) return cudaErrorInvalidValue;
  RoundTf32Kernel<<<Blocks(count), kThreads, 0, stream>>>(src, dst, count,
                                                          static_cast<Tf32Rounding>(mode));
  return cudaGetLastError();
}

}  // namespace tensorcheck::cuda
