// Tolerance rules: when does an actual value pass against an expected one.
//
//   Tolerance t = ResolveTolerance(TolerancePreset::kTorch, DType::kBFloat16);
//   t.atol == 1e-5, t.rtol == 1.6e-2       // torch.testing.assert_close
//   ElementPasses(t, actual, expected, /*bound=*/0, /*ulp=*/3)
//
// Presets and their rules, for finite values:
//   torch, numpy, explicit  |a-e| <= atol + rtol*|e|
//   polygraphy              |a-e| <= atol  OR  |a-e|/|e| <= rtol
//                           (evaluated as |a-e| <= rtol*|e|, so e == 0
//                           passes only when a == 0)
//   ulp                     ULP distance in the compared dtype <= max_ulp
//   bound                   |a-e| <= bound_factor * bound, where `bound` is
//                           the element's unscaled hard bound (HardBound in
//                           error_model.h); ElementPasses applies the factor.
// Non-finite values, for every preset: equal infinities pass, any other pair
// involving an infinity fails; NaN passes only against NaN and only when
// nan_equal is set.
#pragma once

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/dtype.h"
#include "server/stats/element_rules.h"

namespace tensorcheck {

enum class TolerancePreset {
  kTorch,       // |a-e| <= atol + rtol|e|, assert_close defaults per dtype
  kNumpy,       // assert_allclose: rtol 1e-7, atol 0
  kPolygraphy,  // |a-e| <= atol OR |a-e|/|e| <= rtol
  kExplicit,    // |a-e| <= atol + rtol|e| with the given values
  kUlp,         // ULP distance <= max_ulp
  kBound,       // |a-e| <= bound_factor * per-element bound
};

// Every preset, in the order above (what GetCapabilities lists).
inline constexpr TolerancePreset kAllTolerancePresets[] = {
    TolerancePreset::kTorch,    TolerancePreset::kNumpy, TolerancePreset::kPolygraphy,
    TolerancePreset::kExplicit, TolerancePreset::kUlp,   TolerancePreset::kBound};

// "torch", "numpy", "polygraphy", "explicit", "ulp", "bound".
absl::string_view TolerancePresetName(TolerancePreset p);
// INVALID_ARGUMENT naming what came and the accepted names.
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
// overrides:
//   torch       fp64 1e-7/1e-7, fp32 1e-5/1.3e-6, fp16 1e-5/1e-3,
//               bf16 1e-5/1.6e-2 (atol/rtol)
//   numpy       atol 0, rtol 1e-7
//   polygraphy  atol 1e-5, rtol 1e-5
//   explicit    the given values, 0 where absent
//   ulp, bound  atol = rtol = 0 unless given (unused by their rules)
Tolerance ResolveTolerance(TolerancePreset preset, DType dtype,
                           std::optional<double> atol = std::nullopt,
                           std::optional<double> rtol = std::nullopt, uint64_t max_ulp = 0,
                           double bound_factor = 1.0, bool nan_equal = false);

// Whether one element passes. `bound` is the element's unscaled hard bound
// (kBound; multiplied by t.bound_factor here), `ulp` its ULP distance
// (kUlp). NaN/Inf: equal infinities pass; NaN passes only against NaN with
// nan_equal.
bool ElementPasses(const Tolerance& t, double actual, double expected, double bound, uint64_t ulp);

// The preset's rule for a pair of finite values, given |a-e| and |e|: one
// of the rules of element_rules.h, which the device comparison runs too.
// The hot loop of Compare calls this directly; ElementPasses adds the
// non-finite cases on top.
inline bool FinitePairPasses(const Tolerance& t, double abs_diff, double abs_expected, double bound,
                             uint64_t ulp) {
  switch (t.preset) {
    case TolerancePreset::kTorch:
    case TolerancePreset::kNumpy:
    case TolerancePreset::kExplicit:
      return rules::FinitePairPasses<rules::ToleranceRule::kAbsPlusRel>(t, abs_diff, abs_expected,
                                                                        bound, ulp);
    case TolerancePreset::kPolygraphy:
      return rules::FinitePairPasses<rules::ToleranceRule::kAbsOrRel>(t, abs_diff, abs_expected,
                                                                      bound, ulp);
    case TolerancePreset::kUlp:
      return rules::FinitePairPasses<rules::ToleranceRule::kUlp>(t, abs_diff, abs_expected, bound,
                                                                 ulp);
    case TolerancePreset::kBound:
      return rules::FinitePairPasses<rules::ToleranceRule::kBound>(t, abs_diff, abs_expected, bound,
                                                                   ulp);
  }
  return false;
}

}  // namespace tensorcheck
