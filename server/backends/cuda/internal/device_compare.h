// Statistics on the device: compares a device array with another, as stats'
// Compare does, so that only the statistics travel back to the host.
//
//   DeviceCompare cmp(total, options);            // options as for Compare
//   regions: cmp.bytes() of device memory, 256-byte aligned
//   TC_RETURN_IF_ERROR(cmp.Enqueue(actual, expected, device_memory, stream));
//   ... cudaStreamSynchronize(stream) ...
//   TC_ASSIGN_OR_RETURN(DiffStats s, cmp.Finish());
//
// The result equals Compare's on the same values: counts, maxima and their
// indices, the ULP histogram, `worst` and the group lists exactly; the sums
// (mean_abs, rms, rel_l2, cosine, mean_ulp, bound_ratio) up to the rounding
// of adding in another order. Options' predicted_sigma and error_bound are
// device arrays (a session's error model, where it stays): the kernels
// read them there, the bound under the bound preset only, and the host
// never does.
//
// Internal to this folder.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "server/backends/cuda/internal/compare_args.h"  // DeviceArray, ToElem
#include "server/backends/cuda/internal/device_compare_kernels.h"
#include "server/stats/diff_stats.h"

namespace tensorcheck::cuda {

class DeviceCompare {
 public:
  // How many NaN/Inf pair indices the totals pass records (it counts them
  // all). Nothing reads the indices since the sigma stays on the device:
  // the kernel's sums skip those pairs themselves.
  static constexpr unsigned int kNonFiniteCapacity = 4096;

  // `options` (and the device arrays it points to) must outlive Finish.
  DeviceCompare(int64_t total, const CompareOptions& options);

  // INVALID_ARGUMENT as Compare would answer.
  absl::Status Validate() const;

  // Device memory Enqueue needs, in one 256-byte aligned region.
  int64_t bytes() const;

  // Uploads what the device needs of the options and enqueues the kernels
  // and the copy of their totals to the host. `memory` holds bytes() and
  // stays untouched until Finish.
  absl::Status Enqueue(const DeviceArray& actual, const DeviceArray& expected, char* memory,
                       cudaStream_t stream);

  // The statistics, after the stream has synchronised; copies back what
  // they need of the device memory (the worst elements, the group counts).
  absl::StatusOr<DiffStats> Finish();

 private:
  struct Layout {
    int64_t scratch = 0, result = 0, worst = 0, cols = 0, rows = 0, nonfinite = 0, total = 0;
  };

  int64_t total_;
  const CompareOptions& options_;
  int64_t cols_;
  bool count_groups_ = false;
  Layout layout_;
  char* memory_ = nullptr;
  cudaStream_t stream_ = nullptr;
  CompareResult result_{};  // copied back by Enqueue's last copy
};

}  // namespace tensorcheck::cuda
