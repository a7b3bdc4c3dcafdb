#include "server/backends/cpu/internal/fp8_accumulate.h"

#include "server/backends/cpu/internal/split_rows.h"

namespace tensorcheck::internal {

namespace {

// The model costs a few nanoseconds per product: slices of about 20 ms.
constexpr int64_t kFastAccumSliceMacs = int64_t{1} << 22;

}  // namespace

absl::Status Fp8FastAccumulate(const float* x, const float* w, WeightLayout layout, int64_t m,
                               int64_t nb, int64_t k, int64_t ldw, const FastAccumModel& model,
                               int threads, float* acc, int64_t ldc, const StopSignal* stop) {
  const bool out_in = layout == WeightLayout::kOutIn;
  SplitRows(m, nb, k, threads, [=](int64_t begin, int64_t end) {
    RowsInSlices(begin, end, nb, k, kFastAccumSliceMacs, stop, [=](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const float* xi = x + i * k;
        for (int64_t j = 0; j < nb; ++j) {
          acc[i * ldc + j] = out_in ? FastAccumDot(xi, w + j * k, 1, k, model)
                                    : FastAccumDot(xi, w + j, ldw, k, model);
        }
      }
    });
  });
  return CheckStop(stop);
}

}  // namespace tensorcheck::internal
