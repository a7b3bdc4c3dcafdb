#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "core/multi_pass_split.h"
#include "server/backends/cuda/internal/cuda_kernels.h"

namespace tensorcheck::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 8192;

int Blocks(int64_t count) {
  const int64_t b = (count + kThreads - 1) / kThreads;
  return static_cast<int>(std::max<int64_t>(1, std::min(b, kMaxBlocks)));
}

// ---- loads: every element type widens exactly to double (and to float,
// except fp64).

template <typename T>
__device__ __forceinline__ double LoadDouble(const T* p, int64_t i);
template <>
__device__ __forceinline__ double LoadDouble(const double* p, int64_t i) {
  return p[i];
}
template <>
__device__ __forceinline__ double LoadDouble(const float* p, int64_t i) {
  return static_cast<double>(p[i]);
}
template <>
__device__ __forceinline__ double LoadDouble(const __half* p, int64_t i) {
  return static_cast<double>(__half2float(p[i]));
}
template <>
__device__ __forceinline__ double LoadDouble(const __nv_bfloat16* p, int64_t i) {
  return static_cast<double>(__bfloat162float(p[i]));
}

__device__ __forceinline__ double LoadAny(const void* p, ElemType t, int64_t i) {
  switch (t) {
    case ElemType::kF64:
      return LoadDouble(static_cast<const double*>(p), i);
    case ElemType::kF32:
      return LoadDouble(static_cast<const float*>(p), i);
    case ElemType::kF16:
      return LoadDouble(static_cast<const __half*>(p), i);
    case ElemType::kBF16:
      return LoadDouble(static_cast<const __nv_bfloat16*>(p), i);
  }
  return 0.0;
}

// ---- stores: one rounding, to nearest even.

// fp32 nearest to d with round-to-odd: truncate, then set the last bit when
// inexact. Rounding this to a format with at most 22 significand bits gives
// the correctly rounded result of d.
__device__ __forceinline__ float DoubleToFloatRoundToOdd(double d) {
  float f = __double2float_rz(d);
  if (static_cast<double>(f) != d) {
    f = __uint_as_float(__float_as_uint(f) | 1u);
  }
  return f;
}

template <typename T>
__device__ __forceinline__ T FromDouble(double d);
template <>
__device__ __forceinline__ double FromDouble<double>(double d) {
  return d;
}
template <>
__device__ __forceinline__ float FromDouble<float>(double d) {
  return __double2float_rn(d);
}
template <>
__device__ __forceinline__ __half FromDouble<__half>(double d) {
  return __float2half_rn(DoubleToFloatRoundToOdd(d));
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromDouble<__nv_bfloat16>(double d) {
  return __float2bfloat16_rn(DoubleToFloatRoundToOdd(d));
}

// ---- opmath: fp32 for fp32/fp16/bf16 outputs, fp64 for fp64.

template <typename T>
struct OpMath {
  using type = float;
};
template <>
struct OpMath<double> {
  using type = double;
};

template <typename T>
__device__ __forceinline__ T FromOp(float v);
template <>
__device__ __forceinline__ float FromOp<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half FromOp<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromOp<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
__device__ __forceinline__ double FromOpDouble(double v) { return v; }

template <typename T>
__device__ __forceinline__ void StoreOp(T* p, int64_t i, typename OpMath<T>::type v) {
  p[i] = FromOp<T>(v);
}
template <>
__device__ __forceinline__ void StoreOp<double>(double* p, int64_t i, double v) {
  p[i] = FromOpDouble(v);
}

__device__ __forceinline__ float Relu(float x) { return isnan(x) ? x : (x > 0.0f ? x : 0.0f); }
__device__ __forceinline__ double Relu(double x) { return isnan(x) ? x : (x > 0.0 ? x : 0.0); }

// PyTorch's GeluCUDAKernelImpl, approximate="tanh":
// kBeta = sqrt(2) * (2/sqrt(pi)) * 0.5, kKappa = 0.044715.
__device__ __forceinline__ float GeluTanh(float x) {
  constexpr float kBeta = static_cast<float>(1.41421356237309504880 * 1.12837916709551257390 * 0.5);
  constexpr float kKappa = 0.044715f;
  const float x_cube = x * x * x;
  const float inner = kBeta * (x + kKappa * x_cube);
  return 0.5f * x * (1.0f + tanhf(inner));
}
__device__ __forceinline__ double GeluTanh(double x) {
  constexpr double kBeta = 1.41421356237309504880 * 1.12837916709551257390 * 0.5;
  constexpr double kKappa = 0.044715;
  const double x_cube = x * x * x;
  const double inner = kBeta * (x + kKappa * x_cube);
  return 0.5 * x * (1.0 + tanh(inner));
}

// ---- kernels

template <typename Dst>
__global__ void ConvertKernel(const void* src, ElemType src_type, Dst* dst, int64_t count) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    dst[i] = FromDouble<Dst>(LoadAny(src, src_type, i));
  }
}

template <typename T>
__global__ void BiasAddKernel(T* y, const void* bias, ElemType bias_type, int64_t count,
                              int64_t n) {
  using Op = typename OpMath<T>::type;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    const Op t = static_cast<Op>(LoadDouble(static_cast<const T*>(y), i));
    const Op b = static_cast<Op>(LoadAny(bias, bias_type, i % n));
    StoreOp<T>(y, i, t + b);
  }
}

template <typename T>
__global__ void ActivationKernel(T* y, ActKind act, int64_t count) {
  using Op = typename OpMath<T>::type;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    const Op x = static_cast<Op>(LoadDouble(static_cast<const T*>(y), i));
    StoreOp<T>(y, i, act == ActKind::kRelu ? Relu(x) : GeluTanh(x));
  }
}

// Part `which` of every fp32 value (core/multi_pass_split.h, the CPU's
// split): bf16 parts stored as bf16 (exactly: they are bf16 values), TF32
// parts as fp32.
__global__ void SplitMultiPassKernel(const float* src, void* dst, int parts, bool tf32, int which,
                                     int64_t count) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    float split[3];
    SplitMultiPassValue(parts, tf32, src[i], split);
    if (tf32) {
      static_cast<float*>(dst)[i] = split[which];
    } else {
      static_cast<uint16_t*>(dst)[i] = static_cast<uint16_t>(__float_as_uint(split[which]) >> 16);
    }
  }
}

__global__ void AddPartialKernel(float* sum, const float* partial, bool guard, int64_t count) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    sum[i] = AddPartial(sum[i], partial[i], guard);
  }
}

__global__ void CompareBitsKernel(const uint16_t* a, const uint16_t* b, int64_t count, int* flag) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  bool differ = false;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    differ |= a[i] != b[i];
  }
  if (differ) *flag = 1;  // every writer stores the same value
}

// dst[c, r] = src[r, c] through a 32 x 33 tile (the extra column keeps the
// transposed reads off one shared-memory bank); blocks walk the tiles.
constexpr int kTile = 32;
constexpr int kTileRows = 8;

__global__ void TransposeBytesKernel(const uint8_t* __restrict__ src, uint8_t* __restrict__ dst,
                                     int64_t rows, int64_t cols) {
  __shared__ uint8_t tile[kTile][kTile + 1];
  const int64_t tiles_c = (cols + kTile - 1) / kTile;
  const int64_t tiles = (rows + kTile - 1) / kTile * tiles_c;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t r0 = t / tiles_c * kTile, c0 = t % tiles_c * kTile;
    for (int i = threadIdx.y; i < kTile; i += kTileRows) {
      const int64_t r = r0 + i, c = c0 + threadIdx.x;
      if (r < rows && c < cols) tile[i][threadIdx.x] = src[r * cols + c];
    }
    __syncthreads();
    for (int i = threadIdx.y; i < kTile; i += kTileRows) {
      const int64_t c = c0 + i, r = r0 + threadIdx.x;
      if (c < cols && r < rows) dst[c * rows + r] = tile[threadIdx.x][i];
    }
    __syncthreads();
  }
}

}  // namespace

cudaError_t LaunchConvert(const void* src, ElemType src_type, void* dst, ElemType dst_type,
                          int64_t count, cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  const int blocks = Blocks(count);
  switch (dst_type) {
    case ElemType::kF64:
      ConvertKernel<<<blocks, kThreads, 0, stream>>>(src, src_type, static_cast<double*>(dst),
                                                     count);
      break;
    case ElemType::kF32:
      ConvertKernel<<<blocks, kThreads, 0, stream>>>(src, src_type, static_cast<float*>(dst),
                                                     count);
      break;
    case ElemType::kF16:
      ConvertKernel<<<blocks, kThreads, 0, stream>>>(src, src_type, static_cast<__half*>(dst),
                                                     count);
      break;
    case ElemType::kBF16:
      ConvertKernel<<<blocks, kThreads, 0, stream>>>(src, src_type,
                                                     static_cast<__nv_bfloat16*>(dst), count);
      break;
  }
  return cudaGetLastError();
}

cudaError_t LaunchBiasAdd(void* y, ElemType y_type, const void* bias, ElemType bias_type,
                          int64_t rows, int64_t n, cudaStream_t stream) {
  const int64_t count = rows * n;
  if (count <= 0) return cudaSuccess;
  const int blocks = Blocks(count);
  switch (y_type) {
    case ElemType::kF64:
      BiasAddKernel<<<blocks, kThreads, 0, stream>>>(static_cast<double*>(y), bias, bias_type,
                                                     count, n);
      break;
    case ElemType::kF32:
      BiasAddKernel<<<blocks, kThreads, 0, stream>>>(static_cast<float*>(y), bias, bias_type, count,
                                                     n);
      break;
    case ElemType::kF16:
      BiasAddKernel<<<blocks, kThreads, 0, stream>>>(static_cast<__half*>(y), bias, bias_type,
                                                     count, n);
      break;
    case ElemType::kBF16:
      BiasAddKernel<<<blocks, kThreads, 0, stream>>>(static_cast<__nv_bfloat16*>(y), bias,
                                                     bias_type, count, n);
      break;
  }
  return cudaGetLastError();
}

cudaError_t LaunchActivation(void* y, ElemType y_type, ActKind act, int64_t count,
                             cudaStream_t stream) {
  if (count <= 0 || act == ActKind::kNone) return cudaSuccess;
  const int blocks = Blocks(count);
  switch (y_type) {
    case ElemType::kF64:
      ActivationKernel<<<blocks, kThreads, 0, stream>>>(static_cast<double*>(y), act, count);
      break;
    case ElemType::kF32:
      ActivationKernel<<<blocks, kThreads, 0, stream>>>(static_cast<float*>(y), act, count);
      break;
    case ElemType::kF16:
      ActivationKernel<<<blocks, kThreads, 0, stream>>>(static_cast<__half*>(y), act, count);
      break;
    case ElemType::kBF16:
      ActivationKernel<<<blocks, kThreads, 0, stream>>>(static_cast<__nv_bfloat16*>(y), act, count);
      break;
  }
  return cudaGetLastError();
}

cudaError_t LaunchTransposeBytes(const void* src, void* dst, int64_t rows, int64_t cols,
                                 cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  const int64_t tiles = (rows + kTile - 1) / kTile * ((cols + kTile - 1) / kTile);
  const int blocks = static_cast<int>(std::min(tiles, kMaxBlocks));
  TransposeBytesKernel<<<blocks, dim3(kTile, kTileRows), 0, stream>>>(
      static_cast<const uint8_t*>(src), static_cast<uint8_t*>(dst), rows, cols);
  return cudaGetLastError();
}

cudaError_t LaunchCompareBits(const void* a, const void* b, int64_t nbytes, int* flag,
                              cudaStream_t stream) {
  const int64_t count = nbytes / 2;
  if (count <= 0) return cudaSuccess;
  CompareBitsKernel<<<Blocks(count), kThreads, 0, stream>>>(
      static_cast<const uint16_t*>(a), static_cast<const uint16_t*>(b), count, flag);
  return cudaGetLastError();
}

cudaError_t LaunchSplitMultiPass(const float* src, void* dst, int parts, bool tf32, int which,
                                 int64_t count, cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  if (parts < 2 || parts > 3 || which < 0 || which >= parts) return cudaErrorInvalidValue;
  SplitMultiPassKernel<<<Blocks(count), kThreads, 0, stream>>>(src, dst, parts, tf32, which, count);
  return cudaGetLastError();
}

cudaError_t LaunchAddPartial(float* sum, const float* partial, bool guard, int64_t count,
                             cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  AddPartialKernel<<<Blocks(count), kThreads, 0, stream>>>(sum, partial, guard, count);
  return cudaGetLastError();
}

}  // namespace tensorcheck::cuda
