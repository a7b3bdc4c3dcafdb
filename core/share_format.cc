#include "core/share_format.h"

#include <cmath>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"

namespace tensorcheck {
namespace {

constexpr int kMaxDecimals = 6;

}  // namespace

std::string FormatShare(double fraction) {
  if (std::isnan(fraction)) return "nan%";
  if (fraction == 1) return "100%";
  if (fraction == 0) return "0%";
  const double percent = 100 * fraction;
  if (fraction < 0 || fraction > 1) return absl::StrFormat("%.1f%%", percent);
  for (int decimals = 1; decimals <= kMaxDecimals; ++decimals) {
    // Decide on the printed text, not on the value: the question is
    // whether the reader would see 100.0... or 0.0....
    const std::string text = absl::StrFormat("%.*f", decimals, percent);
    double printed = 0;
    if (!absl::SimpleAtod(text, &printed)) break;
    if (printed != 100 && printed != 0) return text + "%";
  }
  return percent < 50 ? "<0.000001%" : ">99.999999%";
}

std::string FormatShare(int64_t part, int64_t whole) {
  if (whole <= 0 || part == 0) return "0%";
  if (part == whole) return "100%";
  const double fraction = static_cast<double>(part) / static_cast<double>(whole);
  // A count short of the whole (or above zero) is never shown as the whole
  // (or as none), even where the division rounds to 1 (or 0).
  if (fraction >= 1 && part < whole) return ">99.999999%";
  if (fraction <= 0 && part > 0) return "<0.000001%";
  return FormatShare(fraction);
}

}  // namespace tensorcheck
