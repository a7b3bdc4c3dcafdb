// Compare: validation, the split into chunks on the caller's executor, and
// the finish. The kernels are in block_kernels_*.cc and compare_chunk.cc,
// the merge in chunk_merge.cc, the ranking in worst.cc, ULPs in ulp.cc.
#include "server/stats/diff_stats.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/float_formats.h"
#include "core/status_macros.h"
#include "server/stats/internal/block_kernels.h"
#include "server/stats/internal/chunk_merge.h"
#include "server/stats/internal/worst.h"

namespace tensorcheck {
namespace {

using internal::kBlock;

// Chunks are at least this long, so that small inputs use few threads.
constexpr int64_t kMinElementsPerThread = int64_t{1} << 15;
constexpr int kMaxThreads = 256;

// Bounds of ULP histogram bucket i (UlpHistogramBucket).
UlpBucket BucketBounds(int i) {
  UlpBucket b;
  if (i <= 1) {
    b.lo = b.hi = static_cast<uint64_t>(i);
  } else {
    b.lo = (uint64_t{1} << (i - 2)) + 1;
    b.hi = i - 1 < 64 ? uint64_t{1} << (i - 1) : kUlpInfinite - 1;
  }
  return b;
}

absl::Status Validate(const Tensor& actual, const Tensor& expected, const CompareOptions& o) {
  if (actual.numel() != expected.numel()) {
    return absl::InvalidArgumentError(
        absl::StrCat("compare: actual and expected must have the same number of "
                     "elements; actual has ",
                     actual.numel(), " ", ShapeString(actual.shape()), ", expected has ",
                     expected.numel(), " ", ShapeString(expected.shape())));
  }
  return ValidateCompare(actual.numel(), expected.numel(), o);
}

// Per chunk of the negligible-element pass.
struct NegligiblePart {
  double scale = 0;  // largest finite |e|
  int64_t differing = 0;
  double max_abs = 0;
  uint64_t significant_max_ulp = 0;
};

// Runs part(begin, end, &acc) over [0, total) in chunks on the executor,
// each at most kCompareStopChunk long, and returns the chunks' results in
// order; the stop signal's status when it fires.
template <typename Part>
absl::StatusOr<std::vector<NegligiblePart>> InChunks(int64_t total, const CompareOptions& o,
                                                     int64_t threads, Part part) {
  const int64_t chunks =
      std::max<int64_t>({1, std::min<int64_t>(threads * 4, total / kMinElementsPerThread),
                         (total + kCompareStopChunk - 1) / kCompareStopChunk});
  std::vector<NegligiblePart> parts(static_cast<size_t>(chunks));
  std::atomic<bool> stopped{false};
  ParallelFor(o.executor, chunks, [&](int64_t c) {
    if (stopped.load(std::memory_order_relaxed)) return;
    if (o.stop != nullptr && o.stop->stop_requested()) {
      stopped = true;
      return;
    }
    part(total * c / chunks, total * (c + 1) / chunks, parts[static_cast<size_t>(c)]);
  });
  if (stopped) return o.stop->Check();
  return parts;
}

// The two passes of FindNegligible over `total` pairs read by
// get_actual(i) and get_expected(i) (values in double), with ULP distances
// from ulp(a, e): one for the largest finite |e|, one over the pairs with a
// nonzero ULP distance.
template <typename GetA, typename GetE, typename Ulp>
absl::Status NegligiblePasses(int64_t total, GetA get_actual, GetE get_expected, Ulp ulp,
                              const CompareOptions& o, int64_t threads, DiffStats* s) {
  TC_ASSIGN_OR_RETURN(
      std::vector<NegligiblePart> scales,
      InChunks(total, o, threads, [&](int64_t begin, int64_t end, NegligiblePart& p) {
        double m = 0;
        for (int64_t i = begin; i < end; ++i) {
          const double e = std::fabs(get_expected(i));
          if (e > m && e <= std::numeric_limits<double>::max()) m = e;
        }
        p.scale = m;
      }));
  double scale = 0;
  for (const NegligiblePart& p : scales) scale = std::max(scale, p.scale);
  const double below = scale * kNegligibleBelowScale;
  if (!(below > 0)) return absl::OkStatus();
  TC_ASSIGN_OR_RETURN(
      std::vector<NegligiblePart> parts,
      InChunks(total, o, threads, [&](int64_t begin, int64_t end, NegligiblePart& p) {
        // Without branches on the data: which elements are near zero, and
        // which differ, is as random as the rounding.
        int64_t differing = 0;
        double max_abs = 0;
        uint64_t significant = 0;
        for (int64_t i = begin; i < end; ++i) {
          const double a = get_actual(i);
          const double e = get_expected(i);
          const uint64_t d = ulp(a, e);
          const bool near = (d != 0) & (std::fabs(e) < below) & std::isfinite(a);
          differing += near;
          max_abs = near ? std::max(max_abs, std::fabs(a - e)) : max_abs;
          significant = near ? significant : std::max(significant, d);
        }
        p.differing = differing;
        p.max_abs = max_abs;
        p.significant_max_ulp = significant;
      }));
  NegligibleElements n;
  n.below = below;
  for (const NegligiblePart& p : parts) {
    n.differing += p.differing;
    n.max_abs = std::max(n.max_abs, p.max_abs);
    n.significant_max_ulp = std::max(n.significant_max_ulp, p.significant_max_ulp);
  }
  if (n.differing > 0) s->negligible = n;
  return absl::OkStatus();
}

// The differing elements of `s` whose expected value is negligible against
// the output's scale (kNegligibleBelowScale). Only when the main pass found
// a ULP distance of kNegligibleFromUlp or more: a smaller figure is read as
// it is, and the common cases (bitwise equal, a few ULP) pay nothing.
absl::Status FindNegligible(const Tensor& actual, const Tensor& expected, const CompareOptions& o,
                            int64_t threads, DiffStats* s) {
  if (s->max_ulp < kNegligibleFromUlp) return absl::OkStatus();
  const int64_t total = actual.numel();
  if (actual.dtype() == DType::kFloat32 && expected.dtype() == DType::kFloat32 &&
      o.compared_dtype == DType::kFloat32) {
    // fp32 read in place, the distance from the bits by the shared rule
    // (element_rules.h), without rounding through UlpDistance's double.
    const float* pa = actual.data<float>();
    const float* pe = expected.data<float>();
    const rules::BitLayout fp32 = rules::LayoutOf(rules::ElemType::kF32);
    return NegligiblePasses(
        total, [pa](int64_t i) { return static_cast<double>(pa[i]); },
        [pe](int64_t i) { return static_cast<double>(pe[i]); },
        [&fp32](double a, double e) {
          return rules::DistanceFromBits(FloatBits(static_cast<float>(a)),
                                         FloatBits(static_cast<float>(e)), fp32);
        },
        o, threads, s);
  }
  return NegligiblePasses(
      total, [&actual](int64_t i) { return actual.GetDouble(i); },
      [&expected](int64_t i) { return expected.GetDouble(i); },
      [&o](double a, double e) { return UlpDistance(a, e, o.compared_dtype); }, o, threads, s);
}

}  // namespace

std::string NegligibleNote(const NegligibleElements& n) {
  const bool one = n.differing == 1;
  return absl::StrFormat(
      "leaving out %d element%s near zero (|expected| < %.1e, 2^-10 of the largest), which "
      "differ%s by at most %.1e",
      n.differing, one ? "" : "s", n.below, one ? "s" : "", n.max_abs);
}

absl::Status ValidateCompare(int64_t actual_numel, int64_t expected_numel,
                             const CompareOptions& o) {
  if (actual_numel != expected_numel) {
    return absl::InvalidArgumentError(
        absl::StrCat("compare: actual and expected must have the same number of "
                     "elements; actual has ",
                     actual_numel, ", expected has ", expected_numel));
  }
  if (o.cols < 0 || (o.cols > 0 && actual_numel % o.cols != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "compare: cols must be 0 or divide the element count ", actual_numel, "; got ", o.cols));
  }
  if (o.top_k < 0 || o.top_k > kMaxTopK) {
    return absl::InvalidArgumentError(
        absl::StrCat("compare: top_k must be in [0, ", kMaxTopK, "]; got ", o.top_k));
  }
  if (o.top_groups < 0 || o.top_groups > kMaxTopK) {
    return absl::InvalidArgumentError(
        absl::StrCat("compare: top_groups must be in [0, ", kMaxTopK, "]; got ", o.top_groups));
  }
  if (o.tolerance.preset == TolerancePreset::kBound && o.error_bound == nullptr) {
    return absl::InvalidArgumentError(
        "compare: the bound tolerance needs a per-element error bound; none "
        "was given");
  }
  return absl::OkStatus();
}

DiffStats FinishDiffStats(int64_t total, const DiffTotals& t,
                          std::vector<ElementDiff> worst_candidates,
                          const CompareOptions& options) {
  DiffStats s;
  s.total = total;
  s.compared_dtype = options.compared_dtype;
  s.finite = t.finite;
  s.mismatched = t.mismatched;
  s.bitwise_equal_count = t.bitwise_equal;
  s.bitwise_equal = t.bitwise_equal == total;
  s.nan_actual = t.nan_actual;
  s.nan_expected = t.nan_expected;
  s.inf_actual = t.inf_actual;
  s.inf_expected = t.inf_expected;
  s.nan_mismatch = t.nan_mismatch;
  s.max_ulp = t.max_ulp;
  s.passed = t.mismatched == 0;
  s.max_abs = std::max(t.max_abs, 0.0);
  s.max_abs_index = t.max_abs_index;
  s.max_rel = std::max(t.max_rel, 0.0);
  s.max_rel_index = t.max_rel_index;

  const double inf = std::numeric_limits<double>::infinity();
  if (t.finite > 0) {
    s.mean_abs = t.sum_abs / static_cast<double>(t.finite);
    s.rms = std::sqrt(t.sum_sq / static_cast<double>(t.finite));
  }
  s.rel_l2 = t.sum_ee > 0 ? std::sqrt(t.sum_sq) / std::sqrt(t.sum_ee) : (t.sum_sq > 0 ? inf : 0.0);
  if (t.sum_aa == 0 && t.sum_ee == 0) {
    s.cosine = 1;
  } else if (t.sum_aa == 0 || t.sum_ee == 0) {
    s.cosine = 0;
  } else {
    s.cosine = std::clamp(t.sum_ae / (std::sqrt(t.sum_aa) * std::sqrt(t.sum_ee)), -1.0, 1.0);
  }
  const int64_t ulp_finite = total - t.ulp_infinite;
  if (ulp_finite > 0) s.mean_ulp = t.sum_ulp / static_cast<double>(ulp_finite);
  for (int k = 0; k < kUlpHistogramBuckets && k < static_cast<int>(t.ulp_histogram.size()); ++k) {
    if (t.ulp_histogram[k] == 0) continue;
    UlpBucket b = BucketBounds(k);
    b.count = t.ulp_histogram[k];
    s.ulp_histogram.push_back(b);
  }
  if (t.ulp_infinite > 0) {
    s.ulp_histogram.push_back({kUlpInfinite, kUlpInfinite, t.ulp_infinite});
  }
  if (options.predicted_sigma != nullptr) {
    s.bound_ratio = t.sum_sigma2 > 0 ? std::sqrt(t.sum_sq_sigma / t.sum_sigma2)
                                     : (t.sum_sq_sigma > 0 ? inf : 0.0);
  }
  internal::RankWorst(worst_candidates, options.top_k, options.tolerance.nan_equal);
  s.worst = std::move(worst_candidates);
  return s;
}

absl::StatusOr<DiffStats> Compare(const Tensor& actual, const Tensor& expected,
                                  const CompareOptions& options) {
  absl::Status valid = Validate(actual, expected, options);
  if (!valid.ok()) return valid;

  const int64_t total = actual.numel();
  DiffStats s;
  s.total = total;
  s.compared_dtype = options.compared_dtype;
  s.bitwise_equal = true;
  s.cosine = 1;
  if (options.predicted_sigma != nullptr) s.bound_ratio = 0.0;
  if (total == 0) return s;

  const int64_t cols = options.cols == 0 ? total : options.cols;
  const int64_t num_blocks = (total + kBlock - 1) / kBlock;
  Executor* const executor = options.executor;
  const int64_t threads =
      std::min<int64_t>({executor != nullptr ? executor->size() : 1, kMaxThreads,
                         std::max<int64_t>(1, total / kMinElementsPerThread), num_blocks});

  std::vector<internal::BlockSums> blocks(static_cast<size_t>(num_blocks));
  const internal::CompareContext sh{
      &actual, &expected, &options, internal::LayoutOf(options.compared_dtype),
      total,   cols,      &blocks};
  // The executor's threads (and this one) take contiguous chunks of blocks
  // in order as they come free, rather than one fixed share each: a thread
  // that is busy with another request's work, or shares its core, then
  // does less instead of the others waiting for its share. Each chunk has
  // its own accumulator and they merge in chunk (= element) order, which
  // gives the same result for any split, hence for any executor. Fewer,
  // larger chunks for large top_k, whose lists each chunk keeps.
  const int64_t chunks_per_thread = options.top_k <= 4096 ? 4 : 1;
  int64_t chunks = threads == 1 ? 1 : std::min(num_blocks, threads * chunks_per_thread);
  if (options.stop != nullptr) {
    chunks =
        std::min(num_blocks, std::max(chunks, (total + kCompareStopChunk - 1) / kCompareStopChunk));
  }
  std::vector<internal::ChunkAcc> accs;
  accs.reserve(static_cast<size_t>(chunks));
  for (int64_t c = 0; c < chunks; ++c) accs.emplace_back(options.top_k);
  std::atomic<bool> stopped{false};
  ParallelFor(executor, chunks, [&](int64_t c) {
    if (stopped.load(std::memory_order_relaxed)) return;
    if (options.stop != nullptr && options.stop->stop_requested()) {
      stopped = true;
      return;
    }
    internal::RunChunk(sh, num_blocks * c / chunks, num_blocks * (c + 1) / chunks,
                       accs[static_cast<size_t>(c)]);
  });
  if (stopped) return options.stop->Check();

  std::vector<ElementDiff> worst;
  const DiffTotals totals = internal::MergeChunks(accs, blocks, options.top_k, &worst);
  s = FinishDiffStats(total, totals, std::move(worst), options);
  if (s.mismatched > 0 && options.top_groups > 0) {
    internal::MergeGroups(accs, cols, options.top_groups, &s);
  }
  if (!s.bitwise_equal) {
    TC_RETURN_IF_ERROR(FindNegligible(actual, expected, options, threads, &s));
  }
  return s;
}

}  // namespace tensorcheck
