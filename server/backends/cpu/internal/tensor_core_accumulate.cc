#include "server/backends/cpu/internal/tensor_core_accumulate.h"

#include "core/status_macros.h"

namespace tensorcheck::internal {

absl::Status TensorCoreAccumulate(const float* x, const float* w, WeightLayout layout, int64_t m,
                                  int64_t nb, int64_t k, int64_t ldw, const KernelOrder& order,
                                  int /*threads*/, float* acc, int64_t ldc,
                                  const StopSignal* stop) {
  const bool out_in = layout == WeightLayout::kOutIn;
  for (int64_t i = 0; i < m; ++i) {
    TC_RETURN_IF_ERROR(CheckStop(stop));
    for (int64_t j = 0; j < nb; ++j) {
      acc[i * ldc + j] = out_in ? KernelOrderDot(x + i * k, w + j * k, 1, k, order)
                                : KernelOrderDot(x + i * k, w + j, ldw, k, order);
    }
  }
  return CheckStop(stop);
}

}  // namespace tensorcheck::internal
