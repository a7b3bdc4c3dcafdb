#include "server/engine/internal/diagnosis_evidence.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/parallel.h"
#include "core/share_format.h"
#include "server/stats/diagnosis_passes.h"
#include "server/stats/error_model.h"
#include "server/stats/ulp.h"

namespace tensorcheck::internal {
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
      case DType::kFloat8E4M3Fn:
      case DType::kFloat8E5M2:
        return IsFp8(p) || IsBlockScaled(p);
      case DType::kFloat4E2M1Fn:
        return p == Precision::kNvFp4;
      case DType::kFloat8E8M0Fnu:  // a scale dtype, never an operand's
        return false;
    }
    return false;
  };
  int order = 0;
  for (Precision p : kAllPrecisions) {
    if (p == c.precision) break;
    ++order;
  }
  // Framework priors for configurations the data cannot tell apart: TF32 and
  // the multi-pass precisions (XLA's dot algorithms) are mostly JAX/Flax
  // (bias unfused), the others mostly PyTorch (fused).
  const bool jax = c.precision == Precision::kTf32 || c.precision == Precision::kTf32Rna ||
                   c.precision == Precision::kTf32Trunc || IsMultiPass(c.precision);
  const BiasMode preferred = jax ? BiasMode::kUnfused : BiasMode::kFused;
  const int bias = c.bias == preferred || c.bias == BiasMode::kNone ? 0 : 1;
  const int backend = candidate.backend_kind == BackendKind::kHostEmulation ? 1 : 0;
  // Split-K after every unsplit configuration, fewer slices first: a
  // kernel's choice, named only where the data asks for it.
  const int split = c.splitk >= 2 ? 200 + c.splitk : 0;
  return (input_format_matches(c.precision) ? 0 : 100) + split + order * 4 + bias * 2 + backend;
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

double PairedZ(const rules::PairedSums& counts) {
  const int64_t further = counts.further, closer = counts.closer;
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

std::vector<GroupCount> TopGroups(const std::vector<int64_t>& counts, int64_t total, int top) {
  std::vector<int64_t> idx(counts.size());
  std::iota(idx.begin(), idx.end(), 0);
  const size_t k = std::min<size_t>(static_cast<size_t>(std::max(top, 0)), idx.size());
  std::partial_sort(
      idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(k), idx.end(),
      [&](int64_t x, int64_t y) {
        return counts[static_cast<size_t>(x)] > counts[static_cast<size_t>(y)] ||
               (counts[static_cast<size_t>(x)] == counts[static_cast<size_t>(y)] && x < y);
      });
  std::vector<GroupCount> groups;
  for (size_t j = 0; j < k; ++j) {
    const int64_t c = counts[static_cast<size_t>(idx[j])];
    if (c == 0) break;
    groups.push_back({idx[j], c, static_cast<double>(c) / static_cast<double>(total)});
  }
  return groups;
}

std::vector<ElementDiff> UnexplainedDiffs(const Tensor& observed, const Tensor& candidate,
                                          const std::vector<uint8_t>& explained, DType dtype) {
  std::vector<ElementDiff> diffs;
  for (int64_t i = 0; i < observed.numel(); ++i) {
    if (explained[static_cast<size_t>(i)]) continue;
    ElementDiff e;
    e.flat_index = i;
    e.actual = observed.GetDouble(i);
    e.expected = candidate.GetDouble(i);
    e.actual_bits = BitsIn(e.actual, dtype);
    e.expected_bits = BitsIn(e.expected, dtype);
    e.abs_diff = std::fabs(e.actual - e.expected);
    e.rel_diff = e.expected != 0 ? e.abs_diff / std::fabs(e.expected)
                                 : (e.abs_diff == 0 ? 0 : std::numeric_limits<double>::infinity());
    e.ulp = UlpDistance(e.actual, e.expected, dtype);
    diffs.push_back(e);
  }
  return diffs;
}

// Why a class cannot be best, in one sentence; empty when it could.
std::string RuledOut(const ClassScore& cls, bool is_best, bool tied, double z,
                     const std::string& best_name) {
  if (!cls.is_consistent()) {
    return absl::StrFormat(
        "only %s of the compared elements within %.0f predicted standard errors (%.0f%% "
        "needed): not a summation-order difference",
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
  if (std::isnan(z)) {
    // Told apart by best's exact reproduction (SeparatedByExactness).
    return absl::StrFormat("%s reproduces every bit; this differs in %d elements", best_name,
                           cls.disagreements());
  }
  return absl::StrFormat(
      "the observed output is closer to %s where the two differ (paired sign test "
      "z = %.1f)",
      best_name, z);
}

namespace {

// The passes over the candidates' host arrays (DiagnosisCandidate's
// pointers), with the explained set as a byte per element.
class HostPasses final : public DiagnosisEvidence {
 public:
  explicit HostPasses(const DiagnosisInput& in)
      : in_(in), explained_(static_cast<size_t>(in.observed->numel()), 0) {}

  absl::StatusOr<bool> SameBits(size_t a, size_t b) override {
    return SameBitsPass(*in_.candidates[a].output, *in_.candidates[b].output);
  }

  absl::StatusOr<int64_t> Explain(size_t c) override {
    const DiagnosisCandidate& cand = in_.candidates[c];
    return MarkConsistentPass(*in_.observed, *cand.output, cand.pair_sigma, in_.output_dtype,
                              &explained_);
  }

  absl::StatusOr<std::vector<rules::ScoreSums>> Score(const std::vector<size_t>& candidates,
                                                      bool every_element) override {
    std::vector<rules::ScoreSums> sums(candidates.size());
    // One candidate per task, its sums in element order.
    ParallelChunks(
        static_cast<int64_t>(candidates.size()), in_.executor,
        [&](int64_t begin, int64_t end) {
          for (int64_t j = begin; j < end; ++j) {
            const DiagnosisCandidate& c = in_.candidates[candidates[static_cast<size_t>(j)]];
            sums[static_cast<size_t>(j)] = ScorePass(
                {in_.observed, c.output, c.pair_sigma, c.pair_accumulation_sigma, c.flip_grid,
                 every_element ? nullptr : explained_.data(), in_.output_dtype});
          }
        },
        /*min_chunk=*/1);
    return sums;
  }

  absl::StatusOr<rules::PairedSums> Paired(size_t best, size_t runner) override {
    const DiagnosisCandidate& b = in_.candidates[best];
    return PairedPass(*in_.observed, *b.output, *in_.candidates[runner].output, b.pair_sigma,
                      explained_.data(), in_.output_dtype);
  }

  absl::StatusOr<DifferingCounts> Differing(size_t c, bool every_element) override {
    return DifferingPass(*in_.observed, *in_.candidates[c].output,
                         every_element ? nullptr : explained_.data(), Columns(in_),
                         in_.output_dtype);
  }

  absl::StatusOr<std::optional<rules::ErrorSums>> ErrorVsReference(size_t c) override {
    const float* sigma = in_.candidates[c].sigma_vs_reference;
    if (sigma == nullptr || in_.reference == nullptr) return std::nullopt;
    return ErrorPass(*in_.observed, *in_.reference, sigma, explained_.data());
  }

  absl::StatusOr<std::vector<ElementDiff>> Unexplained(size_t c) override {
    return UnexplainedDiffs(*in_.observed, *in_.candidates[c].output, explained_, in_.output_dtype);
  }

  absl::StatusOr<DefectScan> ScanDefects(size_t c, const DefectScanInput& scan) override {
    const DiagnosisCandidate& cand = in_.candidates[c];
    DefectScanInput s = scan;
    s.observed = in_.observed;
    s.candidate = cand.output;
    s.pair_accumulation_sigma = cand.pair_accumulation_sigma;
    s.flip_grid = cand.flip_grid;
    s.compared = in_.output_dtype;
    return DefectScanPass(s);
  }

 private:
  const DiagnosisInput& in_;
  std::vector<uint8_t> explained_;
};

}  // namespace

int64_t Columns(const DiagnosisInput& in) {
  return in.output_shape.empty() ? in.observed->numel() : in.output_shape.back();
}

}  // namespace tensorcheck::internal

namespace tensorcheck {

std::unique_ptr<DiagnosisEvidence> HostEvidence(const DiagnosisInput& input) {
  return std::make_unique<internal::HostPasses>(input);
}

}  // namespace tensorcheck
