// Tolerance rules: when does an actual value pass against an expected one.
//
//   Tolerance t = ResolveTolerance(TolerancePreset::kTorch, DType::kBFloat16);
//   t.atol == 1e-5, t.rtol == 1.6e-2       // torch.testing.assert_close
//   ElementPasses(t, actual, expected, /*bound=*/0, /*ulp=*/3)
#pragma once

#include <cstdint>
#include <optional>

#include "absl/strings/string_view.h"
#include "absl/status/statusor.h"
#include "server/core/dtype.h"

namespace tensorcheck {

enum class TolerancePreset {
  kTorch,       // |a-e| <= atol + rtol|e|, assert_close defaults per dtype
  kNumpy,       // assert_allclose: rtol 1e-7, atol 0
  kPolygraphy,  // |a-e| <= atol OR |a-e|/|e| <= rtol
  kExplicit,    // |a-e| <= atol + rtol|e| with the given values
  kUlp,         // ULP distance <= max_ulp
  kBound,       // |a-e| <= bound_factor * per-element bound
};

// "torch", "numpy", "polygraphy", "explicit", "ulp", "bound".
absl::string_view TolerancePresetName(TolerancePreset p);
absl::StatusOr<TolerancePreset> ParseTolerancePreset(absl::string_view name);

struct Tolerance {
  TolerancePreset preset = TolerancePreset::kTorch;
  double atol = 1e-5;
  double rtol = 1.3e-6;
  uint64_t max_ulp = 0;
  double bound_factor = 1.0;
  bool nan_equal = false;
};

// Fills atol/rtol from the preset's defaults for `dtype`, then applies the
// overrides.
Tolerance ResolveTolerance(TolerancePreset preset, DType dtype,
                           std::optional<double> atol = std::nullopt,
                           std::optional<double> rtol = std::nullopt,
                           uint64_t max_ulp = 0, double bound_factor = 1.0,
                           bool nan_equal = false);

// Whether one element passes. `bound` is the element's hard bound (kBound),
// `ulp` its ULP distance (kUlp). NaN/Inf: equal infinities pass; NaN passes
// only against NaN with nan_equal.
bool ElementPasses(const Tolerance& t, double actual, double expected,
                   double bound, uint64_t ulp);

}  // namespace tensorcheck
