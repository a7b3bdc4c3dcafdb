#include "server/stats/tolerance.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace tensorcheck {

absl::string_view TolerancePresetName(TolerancePreset p) {
  switch (p) {
    case TolerancePreset::kTorch:
      return "torch";
    case TolerancePreset::kNumpy:
      return "numpy";
    case TolerancePreset::kPolygraphy:
      return "polygraphy";
    case TolerancePreset::kExplicit:
      return "explicit";
    case TolerancePreset::kUlp:
      return "ulp";
    case TolerancePreset::kBound:
      return "bound";
  }
  return "unknown";
}

absl::StatusOr<TolerancePreset> ParseTolerancePreset(absl::string_view name) {
  for (TolerancePreset p : kAllTolerancePresets) {
    if (name == TolerancePresetName(p)) return p;
  }
  // Bounded echo: the name comes from a client.
  constexpr size_t kMaxEcho = 32;
  const bool cut = name.size() > kMaxEcho;
  return absl::InvalidArgumentError(
      absl::StrCat("tolerance: expected one of torch, numpy, polygraphy, explicit, ulp, "
                   "bound; got \"",
                   name.substr(0, kMaxEcho), cut ? "...\"" : "\""));
}

Tolerance ResolveTolerance(TolerancePreset preset, DType dtype, std::optional<double> atol,
                           std::optional<double> rtol, uint64_t max_ulp, double bound_factor,
                           bool nan_equal) {
  Tolerance t;
  t.preset = preset;
  switch (preset) {
    case TolerancePreset::kTorch:
      // torch.testing.assert_close defaults.
      switch (dtype) {
        case DType::kFloat64:
          t.atol = 1e-7;
          t.rtol = 1e-7;
          break;
        case DType::kFloat32:
          t.atol = 1e-5;
          t.rtol = 1.3e-6;
          break;
        case DType::kFloat16:
          t.atol = 1e-5;
          t.rtol = 1e-3;
          break;
        case DType::kBFloat16:
        case DType::kFloat8E4M3Fn:  // never compared: no narrow dtype is an output one
        case DType::kFloat8E5M2:
        case DType::kFloat4E2M1Fn:
        case DType::kFloat8E8M0Fnu:
          t.atol = 1e-5;
          t.rtol = 1.6e-2;
          break;
      }
      break;
    case TolerancePreset::kNumpy:
      t.atol = 0;
      t.rtol = 1e-7;
      break;
    case TolerancePreset::kPolygraphy:
      t.atol = 1e-5;
      t.rtol = 1e-5;
      break;
    case TolerancePreset::kExplicit:
    case TolerancePreset::kUlp:
    case TolerancePreset::kBound:
      t.atol = 0;
      t.rtol = 0;
      break;
  }
  if (atol.has_value()) t.atol = *atol;
  if (rtol.has_value()) t.rtol = *rtol;
  t.max_ulp = max_ulp;
  t.bound_factor = bound_factor;
  t.nan_equal = nan_equal;
  return t;
}

bool ElementPasses(const Tolerance& t, double actual, double expected, double bound, uint64_t ulp) {
  const bool nan_a = std::isnan(actual);
  const bool nan_e = std::isnan(expected);
  if (nan_a || nan_e) return nan_a && nan_e && t.nan_equal;
  if (std::isinf(actual) || std::isinf(expected)) return actual == expected;
  return FinitePairPasses(t, std::fabs(actual - expected), std::fabs(expected), bound, ulp);
}

}  // namespace tensorcheck
