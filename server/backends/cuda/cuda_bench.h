// Baselines for bench/gpu_bench.cc, measured in the same process as the
// backends: the bare cuBLASLt call the `cublaslt` backend wraps, a
// device-to-device copy, and the device statistics kernels alone. They live
// here because only this folder includes CUDA headers.
//
// Times are medians over `iterations` after warm-up runs. Without a device
// every function answers FAILED_PRECONDITION.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "server/backends/linear_backend.h"
#include "server/stats/diff_stats.h"

namespace tensorcheck {

struct BareLtTimes {
  // One cublasLtMatmul with the bias epilogue (PyTorch's addmm), inputs and
  // output already on the device; timed with CUDA events.
  double matmul_ms = 0;
  // Upload x, W, b from host memory, the matmul, download y: wall clock.
  double with_transfers_ms = 0;
  // The same with W and b already on the device (a resident weight):
  // upload x, the matmul, download y.
  double input_only_ms = 0;
  std::string algo;  // the heuristic's algorithm id
};

// x, W ([n, k], OUT_IN) and b of one 16-bit type, y of the same type, fp32
// compute and scale (the `cublaslt:bf16:fused` / `:fp16:fused` plan).
absl::StatusOr<BareLtTimes> TimeBareCublasLt(const LinearProblem& problem, int iterations);

// Wall clock of copying `tensor` from (pageable) host memory to the device.
absl::StatusOr<double> TimeUploadMs(const Tensor& tensor, int iterations);

// cudaMemcpyAsync device to device of `bytes` (CUDA events).
absl::StatusOr<double> TimeDeviceCopyMs(int64_t bytes, int iterations);

struct DeviceStatsTimes {
  double totals_ms = 0;  // the one-pass totals (counts, sums, maxima, histogram, groups)
  double full_ms = 0;    // everything a comparison enqueues, worst elements included
  double host_ms = 0;    // host work of a comparison: preparing it (wall clock)
};

// The statistics kernels on `actual` and `expected` once both are on the
// device (CUDA events; uploads excluded). options.predicted_sigma, if set,
// is a host array of `actual`'s size: it is uploaded first, as a session's
// error model lives on the device.
absl::StatusOr<DeviceStatsTimes> TimeDeviceStatistics(const Tensor& actual, const Tensor& expected,
                                                      const CompareOptions& options,
                                                      int iterations);

}  // namespace tensorcheck
