// Element-wise device kernels of the GPU backends (internal to this folder).
//
// Every store rounds once, to nearest even, from the exact value: a double
// is narrowed to bf16/fp16 through fp32 with round-to-odd, which is exact
// single rounding because fp32 carries more than two extra bits.
//
// Each launcher enqueues on `stream` and returns the launch status
// (cudaGetLastError); execution errors surface at the next synchronisation.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "server/backends/cuda/internal/elem_type.h"

namespace tensorcheck::cuda {

enum class ActKind : int { kNone = 0, kRelu = 1, kGeluTanh = 2 };

// dst[i] = round_to(dst_type, src[i]) for i < count.
cudaError_t LaunchConvert(const void* src, ElemType src_type, void* dst, ElemType dst_type,
                          int64_t count, cudaStream_t stream);

// y is row-major [rows, n] of y_type; y[r, j] = round(y[r, j] + bias[j]),
// the sum taken in the output's opmath type (fp32 for fp32/fp16/bf16
// outputs, fp64 for fp64), as PyTorch and candle add.
cudaError_t LaunchBiasAdd(void* y, ElemType y_type, const void* bias, ElemType bias_type,
                          int64_t rows, int64_t n, cudaStream_t stream);

// y[i] = round(act(y[i])) in the opmath type; GELU is the tanh
// approximation written as PyTorch's CUDA kernel writes it.
cudaError_t LaunchActivation(void* y, ElemType y_type, ActKind act, int64_t count,
                             cudaStream_t stream);

// dst = src^T for one-byte elements (FP8): src is [rows, cols] row-major,
// dst [cols, rows] row-major. Moves bytes only; no rounding.
cudaError_t LaunchTransposeBytes(const void* src, void* dst, int64_t rows, int64_t cols,
                                 cudaStream_t stream);

// Part `which` (0 the highest) of each of `count` fp32 values split into
// `parts` (2 or 3) parts as a multi-pass precision splits them
// (core/multi_pass_split.h): bf16 parts into a bf16 array, TF32 parts
// (`tf32`) into an fp32 one. cudaErrorInvalidValue for parts or which out
// of range.
cudaError_t LaunchSplitMultiPass(const float* src, void* dst, int parts, bool tf32, int which,
                                 int64_t count, cudaStream_t stream);

// sum[i] = AddPartial(sum[i], partial[i], guard) (core/multi_pass_split.h):
// one step of a multi-pass precision's partial sums, in fp32; `guard`
// (before the high x high partial) replaces a NaN sum by zero first.
cudaError_t LaunchAddPartial(float* sum, const float* partial, bool guard, int64_t count,
                             cudaStream_t stream);

// Sets *flag to 1 when the first `nbytes` bytes of a and b differ (nbytes
// even, both 2-byte aligned). *flag is not cleared.
cudaError_t LaunchCompareBits(const void* a, const void* b, int64_t nbytes, int* flag,
                              cudaStream_t stream);

}  // namespace tensorcheck::cuda
