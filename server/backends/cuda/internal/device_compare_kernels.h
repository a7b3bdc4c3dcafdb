// Device kernels that compare two arrays as stats' Compare does (internal to
// this folder; device_compare.h drives them). Plain types only: this header
// is shared by nvcc and the host compiler; the arguments and results are
// declared in internal/kernel_args.h (with the per-element definitions),
// which a build without CUDA has too.
//
// Each launcher enqueues on `stream` and returns the launch status.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "server/backends/cuda/internal/cuda_kernels.h"
#include "server/backends/cuda/internal/kernel_args.h"

namespace tensorcheck::cuda {

// Device scratch of one comparison: CompareScratchBytes(total) bytes.
size_t CompareScratchBytes(int64_t total);

// The totals pass: result->totals and ->ulp_histogram; with `col_counts`
// ([cols]) and `row_counts` ([total / cols]) non-null, the mismatches per
// column and row too (both zeroed here first).
cudaError_t LaunchCompareTotals(const CompareArgs& args, void* scratch, CompareResult* result,
                                unsigned long long* col_counts, unsigned long long* row_counts,
                                cudaStream_t stream);

// One of the `k` highest-ranked elements for `worst` (Compare's order: NaN
// against a number, then abs diff, NaN against NaN as 0 with nan_equal and
// +inf otherwise, then ULP, then the lower index).
struct WorstEntry {
  long long index;
  double actual;
  double expected;
  unsigned long long actual_bits;
  unsigned long long expected_bits;
};

// Selects those k elements by a radix selection on their rank keys, all on
// the device, and writes them (in no particular order) to `out` (capacity
// k), their number to result->worst_count. k >= 1.
cudaError_t LaunchSelectWorst(const CompareArgs& args, int k, void* scratch, WorstEntry* out,
                              CompareResult* result, cudaStream_t stream);

}  // namespace tensorcheck::cuda
