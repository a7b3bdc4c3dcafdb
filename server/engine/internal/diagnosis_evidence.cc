#include "server/engine/internal/diagnosis_evidence.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "server/core/share_format.h"
#include "server/stats/error_model.h"

namespace tensorcheck::internal {
namespace {

// ULP distances above this count as this much in means and t-statistics, so
// a few wild elements cannot dominate.
constexpr uint64_t kUlpCap = 1 << 10;

}  // namespace

// UlpDistance, without its conversions where the values are equal (most
// elements of the closest candidates): +0 and -0 are 0 apart too.
uint64_t Ulp(double a, double b, DType dtype) { return a == b ? 0 : UlpDistance(a, b, dtype); }

double Capped(uint64_t ulp) { return static_cast<double>(std::min<uint64_t>(ulp, kUlpCap)); }

// Position of a candidate in the fixed tie-break preference.
int Preference(const DiagnosisCandidate& candidate, DType storage) {
  const Config& c = candidate.config;
  auto input_format_matches = [&](Precision p) {
    switch (storage) {
      case DType::kFloat64:
        return p == Precision::kFp64;
      case DType::kFloat32:
        return p == Precision::kFp32;
      case DType::kFloat16:
        return p == Precision::kFp16;
      case DType::kBFloat16:
        return p == Precision::kBf16;
    }
    return false;
  };
  int order = 0;
  for (Precision p : kAllPrecisions) {
    if (p == c.precision) break;
    ++order;
  }
  // Framework priors for configurations the data cannot tell apart: TF32 is
  // mostly JAX/Flax (bias unfused), the others mostly PyTorch (fused).
  const bool tf32 = c.precision == Precision::kTf32 || c.precision == Precision::kTf32Rna ||
                    c.precision == Precision::kTf32Trunc;
  const BiasMode preferred = tf32 ? BiasMode::kUnfused : BiasMode::kFused;
  const int bias = c.bias == preferred || c.bias == BiasMode::kNone ? 0 : 1;
  const int backend = candidate.backend_kind == BackendKind::kHostEmulation ? 1 : 0;
  return (input_format_matches(c.precision) ? 0 : 100) + order * 4 + bias * 2 + backend;
}

// Whether two configurations accumulate alike. Bitwise-equal outputs of
// configurations that do are one computation on these inputs
// (`equivalent`); of ones that do not (fp32 and fp64 accumulation rounding
// to the same bf16 values), a coincidence of this data: they stay apart
// and end up `tied`.
bool SameAccumulator(const Config& a, const Config& b) {
  const PrecisionInfo x = GetPrecisionInfo(a.precision);
  const PrecisionInfo y = GetPrecisionInfo(b.precision);
  return x.u_accumulate == y.u_accumulate && x.fp16_accumulate == y.fp16_accumulate;
}

// Slack on "clearly more inconsistent elements": a Poisson-like 3 sigma on
// the fewest, plus 0.1% of the elements for error-model misfit.
bool ClearlyMoreInconsistent(int64_t count, int64_t fewest, int64_t counted) {
  const double slack =
      3.0 * std::sqrt(static_cast<double>(fewest) + 1.0) + 1e-3 * static_cast<double>(counted);
  return static_cast<double>(count) > static_cast<double>(fewest) + slack;
}

bool ElementConsistent(double o, double v, uint64_t ulp, float sigma) {
  if (ulp == 0) return true;
  if (!std::isfinite(o) || !std::isfinite(v)) return false;
  return std::fabs(o - v) <= kConsistentZ * static_cast<double>(sigma);
}

// Paired sign test of per-element ULP distances: z = (n+ - n-) /
// sqrt(n+ + n-), n+ the elements where `runner` is further from the
// observed output than `best`, n- where it is closer. Only elements where
// the two candidates differ by more than half a pair sigma (`sigma`, best's)
// count: elsewhere summation noise decides which is closer. Robust to the
// heavy tail of ULP distances near zero, where a cancelling sum makes one
// ULP tiny.
double PairedZ(const Tensor& observed, const Tensor& best, const Tensor& runner, const float* sigma,
               const std::vector<uint8_t>& explained, DType dtype) {
  int64_t further = 0, closer = 0;
  for (int64_t i = 0; i < observed.numel(); ++i) {
    if (!explained[static_cast<size_t>(i)]) continue;
    const double bv = best.GetDouble(i), rv = runner.GetDouble(i);
    if (!(std::fabs(bv - rv) > 0.5 * static_cast<double>(sigma[i])) && std::isfinite(bv - rv)) {
      continue;
    }
    const double o = observed.GetDouble(i);
    const uint64_t r = Ulp(o, rv, dtype);
    const uint64_t b = Ulp(o, bv, dtype);
    if (r > b) ++further;
    if (r < b) ++closer;
  }
  if (further + closer == 0) return 0;
  return static_cast<double>(further - closer) / std::sqrt(static_cast<double>(further + closer));
}

std::string GroupList(const std::vector<GroupCount>& groups, int64_t differing) {
  std::vector<std::string> parts;
  int64_t held = 0;
  for (const auto& g : groups) {
    parts.push_back(absl::StrCat(g.index));
    held += g.mismatched;
  }
  return absl::StrFormat("{%s} (%s of them)", absl::StrJoin(parts, ", "),
                         FormatShare(std::min(held, differing), differing));
}

// Counts elements that differ (in bits) between `a` and `b` by column and row.
int64_t Localize(const Tensor& a, const Tensor& b, const std::vector<uint8_t>& explained, int64_t n,
                 DType dtype, int top, std::vector<GroupCount>* columns,
                 std::vector<GroupCount>* rows) {
  const int64_t total = a.numel();
  const int64_t m = n > 0 ? total / n : 0;
  std::vector<int64_t> col(static_cast<size_t>(n), 0), row(static_cast<size_t>(m), 0);
  int64_t differing = 0;
  for (int64_t i = 0; i < total; ++i) {
    if (!explained[static_cast<size_t>(i)]) continue;
    if (Ulp(a.GetDouble(i), b.GetDouble(i), dtype) == 0) continue;
    ++col[static_cast<size_t>(i % n)];
    ++row[static_cast<size_t>(i / n)];
    ++differing;
  }
  auto top_of = [&](const std::vector<int64_t>& counts, std::vector<GroupCount>* out) {
    std::vector<int64_t> idx(counts.size());
    std::iota(idx.begin(), idx.end(), 0);
    const size_t k = std::min<size_t>(static_cast<size_t>(top), idx.size());
    std::partial_sort(
        idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(k), idx.end(),
        [&](int64_t x, int64_t y) {
          return counts[static_cast<size_t>(x)] > counts[static_cast<size_t>(y)] ||
                 (counts[static_cast<size_t>(x)] == counts[static_cast<size_t>(y)] && x < y);
        });
    for (size_t j = 0; j < k; ++j) {
      const int64_t c = counts[static_cast<size_t>(idx[j])];
      if (c == 0) break;
      out->push_back({idx[j], c, static_cast<double>(c) / static_cast<double>(differing)});
    }
  };
  top_of(col, columns);
  top_of(row, rows);
  return differing;
}

// Why a class cannot be best, in one sentence; empty when it could.
std::string RuledOut(const ClassScore& cls, bool is_best, bool tied, double z,
                     const std::string& best_name) {
  if (!cls.is_consistent()) {
    return absl::StrFormat(
        "only %s of the compared elements lie within %.0f predicted standard errors "
        "of it (%.0f%% needed): not a summation-order difference",
        FormatShare(cls.consistent, cls.counted), kConsistentZ, 100 * kConsistentShare);
  }
  if (!cls.is_plausible()) {
    return absl::StrFormat(
        "it differs from the observed output in %d elements where its own "
        "summation-order noise predicts about %.3g (Poisson p = %.2g < %.0e): its "
        "accumulation is more precise than the observed output's, or a rounding sits "
        "elsewhere",
        cls.disagreements(), cls.expected_disagreements, cls.plausibility_p, kPlausibilityAlpha);
  }
  if (is_best || tied || best_name.empty()) return "";
  return absl::StrFormat(
      "the observed output is closer to %s where the two differ (paired sign test "
      "z = %.1f)",
      best_name, z);
}

}  // namespace tensorcheck::internal
