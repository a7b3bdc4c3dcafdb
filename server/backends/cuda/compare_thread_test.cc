// What one thread of the device totals pass does (internal/compare_thread.h), run on
// the host as a single thread over whole tensors, against stats' Compare
// (itself tested against hand-derived values in diff_stats_test.cc). The
// kernels add only the reductions across threads, which DeviceStatsTest
// checks on a GPU; this suite checks the per-element definitions and the
// lean path's bookkeeping (bitmasks, packed histogram, maxima found per
// vector, the switch between the lean and the general path) on any host,
// in a build without CUDA too.
#include "server/backends/cuda/internal/compare_thread.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "server/backends/cuda/internal/compare_args.h"
#include "server/backends/cuda/internal/compare_iteration.h"
#include "server/backends/cuda/internal/compare_lean_path.h"
#include "server/stats/diff_stats.h"
#include "server/stats/tolerance.h"
#include "tests/testing/stats_testing.h"
#include "tests/testing/status_matchers.h"

namespace tensorcheck::cuda {
namespace {

using ::tensorcheck::testing::ExpectSameStats;
using ::tensorcheck::testing::IsOk;

// One thread owning every element (first 0, stride 1), taking them as a
// device thread takes its own: the lean path where it applies.
template <int kType>
struct OneThread {
  static void Run(const CompareArgs& args, cmp::ThreadTotals& t, cmp::RareCounts& rare,
                  cmp::LocalHistogram& hist, unsigned long long* cols, unsigned long long* rows,
                  unsigned int* nonfinite_count) {
    const rules::BitLayout layout = rules::LayoutOf(args.compared);
    cmp::ForEachVector<kType, cmp::kLean<kType>>(
        args, 0, 1,
        [&](int64_t first, const Vec16& ra, const Vec16& re) {
          if constexpr (cmp::kLean<kType>) {
            return cmp::TryLeanVector<static_cast<ElemType>(kType)>(args, first, ra, re, t, hist,
                                                                    cols, rows);
          } else {
            return false;
          }
        },
        [&](int64_t i, const cmp::Element& x) {
          cmp::Accumulate(args, layout, i, x, t, &rare, hist, cols, rows, nonfinite_count);
        });
  }
};

// Compare's statistics computed the way the device computes them, with
// one thread: MakeCompareArgs, the thread's totals, ToDiffTotals,
// FinishDiffStats; the sigma and the bound read from host arrays.
DiffStats OneThreadStats(const Tensor& actual, const Tensor& expected,
                         const CompareOptions& options) {
  const int64_t total = actual.numel();
  CompareArgs args = MakeCompareArgs({actual.raw(), actual.dtype(), total},
                                     {expected.raw(), expected.dtype(), total}, options);
  args.sigma = options.predicted_sigma;
  if (options.tolerance.preset == TolerancePreset::kBound) args.bound = options.error_bound;
  std::vector<long long> nonfinite(static_cast<size_t>(total));
  args.nonfinite_indices = nonfinite.data();
  args.nonfinite_capacity = static_cast<unsigned int>(total);
  std::vector<unsigned long long> cols(static_cast<size_t>(args.cols));
  std::vector<unsigned long long> rows(static_cast<size_t>(total / args.cols));

  cmp::ThreadTotals t;
  cmp::RareCounts rare{0, 0, 0, 0, 0, 0};
  unsigned int shared[kCompareHistBuckets] = {};
  cmp::LocalHistogram hist;
  hist.shared = shared;
  unsigned int nonfinite_count = 0;
  cmp::Dispatch<OneThread>(cmp::KernelType(args), args, t, rare, hist, cols.data(), rows.data(),
                           &nonfinite_count);
  hist.Spill();

  CompareResult result{};
  result.totals = cmp::ToTotals(t);
  result.totals.nan_actual = static_cast<long long>(rare.nan_actual);
  result.totals.nan_expected = static_cast<long long>(rare.nan_expected);
  result.totals.inf_actual = static_cast<long long>(rare.inf_actual);
  result.totals.inf_expected = static_cast<long long>(rare.inf_expected);
  result.totals.nan_mismatch = static_cast<long long>(rare.nan_mismatch);
  result.totals.ulp_infinite = static_cast<long long>(rare.ulp_infinite);
  for (int b = 0; b < kCompareHistBuckets; ++b) result.ulp_histogram[b] = shared[b];
  result.ulp_histogram[0] += hist.low & 0xffffffffu;
  result.ulp_histogram[1] += hist.low >> 32;
  result.ulp_histogram[2] += hist.high & 0xffffffffu;
  result.ulp_histogram[3] += hist.high >> 32;
  // The pairs with a NaN or an infinity, listed in order (one thread).
  std::vector<long long> expected_nonfinite;
  for (int64_t i = 0; i < total; ++i) {
    if (!std::isfinite(actual.GetDouble(i)) || !std::isfinite(expected.GetDouble(i))) {
      expected_nonfinite.push_back(i);
    }
  }
  nonfinite.resize(nonfinite_count);
  EXPECT_EQ(nonfinite, expected_nonfinite);

  DiffStats s = FinishDiffStats(total, ToDiffTotals(result), {}, options);
  auto counts = [](const std::vector<unsigned long long>& v) {
    return std::vector<int64_t>(v.begin(), v.end());
  };
  if (s.mismatched > 0) {
    s.top_columns = TopGroupCounts(counts(cols), options.top_groups, s.mismatched);
    s.top_rows = TopGroupCounts(counts(rows), options.top_groups, s.mismatched);
  }
  return s;
}

struct Case {
  std::string name;
  DType dtype;        // of the actual tensor and the compared type
  DType other_dtype;  // of the expected tensor
  TolerancePreset preset;
  int64_t rows, cols;
  double noise = 1e-3;     // relative perturbation of the expected values
  double untouched = 0.3;  // share of elements left equal
  int nans = 0, infs = 0;  // put into the expected tensor
  double zeros = 0;        // share of elements 0 in both (ReLU outputs)
  int zeros_moved = 0;     // of those, made nonzero in the expected tensor
  bool sigma = false;
  int sigma_nans = 0;
  uint64_t max_ulp = 1;
  bool nan_equal = false;
};

void CheckCase(const Case& c, uint32_t seed) {
  SCOPED_TRACE(c.name);
  std::mt19937 rng(seed);
  std::normal_distribution<double> g;
  std::uniform_real_distribution<double> u(0, 1);
  const int64_t total = c.rows * c.cols;
  std::vector<double> a(static_cast<size_t>(total)), e(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = i == 0 || u(rng) < c.zeros ? 0.0 : g(rng);  // element 0: |e| = 0
  }
  const Tensor actual = *FromDoubles(c.dtype, {c.rows, c.cols}, a);
  int moved = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double v = actual.GetDouble(static_cast<int64_t>(i));
    e[i] = u(rng) < c.untouched ? v : v * (1 + c.noise * g(rng));
    if (v == 0 && moved < c.zeros_moved) e[i] = 1e-3 * ++moved;
  }
  std::uniform_int_distribution<size_t> at(0, a.size() - 1);
  for (int k = 0; k < c.nans; ++k) e[at(rng)] = std::numeric_limits<double>::quiet_NaN();
  for (int k = 0; k < c.infs; ++k) {
    e[at(rng)] = (k % 2 ? -1 : 1) * std::numeric_limits<double>::infinity();
  }
  if (c.noise > 0) e[1] = -0.0;
  const Tensor expected = *FromDoubles(c.other_dtype, {c.rows, c.cols}, e);

  std::vector<float> sigma(a.size()), bound(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    sigma[i] = static_cast<float>(1e-3 + 1e-2 * u(rng));
    bound[i] = 4 * sigma[i];
  }
  for (int k = 0; k < c.sigma_nans; ++k) {
    sigma[at(rng)] = std::numeric_limits<float>::quiet_NaN();
  }
  CompareOptions o;
  o.tolerance =
      ResolveTolerance(c.preset, c.dtype, std::nullopt, std::nullopt, c.max_ulp, 1.0, c.nan_equal);
  o.compared_dtype = c.dtype;
  o.cols = c.cols;
  o.top_k = 0;  // `worst` is the radix selection's, not this pass's
  o.top_groups = 5;
  o.predicted_sigma = c.sigma ? sigma.data() : nullptr;
  o.error_bound = bound.data();

  auto host = Compare(actual, expected, o);
  ASSERT_THAT(host, IsOk());
  const DiffStats one_thread = OneThreadStats(actual, expected, o);
  ExpectSameStats(one_thread, *host);
}

TEST(CompareThreadTest, OneThreadEqualsCompare) {
  const std::vector<Case> cases = {
      {"bf16 torch, close", DType::kBFloat16, DType::kBFloat16, TolerancePreset::kTorch, 64, 96},
      {"bf16 torch, NaN and inf in some vectors", DType::kBFloat16, DType::kBFloat16,
       TolerancePreset::kTorch, 64, 96, 1e-2, 0.3, 9, 6},
      {"fp16 polygraphy, relu zeros, rel = inf", DType::kFloat16, DType::kFloat16,
       TolerancePreset::kPolygraphy, 48, 40, 1e-3, 0.5, 0, 0, 0.5, 7},
      {"fp32 numpy, every element fails", DType::kFloat32, DType::kFloat32, TolerancePreset::kNumpy,
       33, 31, 1e-2, 0.0},
      {"fp32 ulp, NaN equal", DType::kFloat32, DType::kFloat32, TolerancePreset::kUlp, 40, 50, 1e-6,
       0.3, 5, 0, 0, 0, false, 0, 3, true},
      {"bf16 bound, sigma with NaN", DType::kBFloat16, DType::kBFloat16, TolerancePreset::kBound,
       30, 64, 1e-2, 0.3, 2, 2, 0, 0, true, 5},
      {"fp16 explicit, far apart (large ULP buckets)", DType::kFloat16, DType::kFloat16,
       TolerancePreset::kExplicit, 16, 100, 0.5, 0.1},
      {"bf16 equal tensors (ties everywhere)", DType::kBFloat16, DType::kBFloat16,
       TolerancePreset::kTorch, 20, 24, 0, 1.0},
      {"fp16 equal relu outputs (every quotient 0, the first with |e| = 0)", DType::kFloat16,
       DType::kFloat16, TolerancePreset::kTorch, 20, 24, 0, 1.0, 0, 0, 0.5},
      {"fp64, general path", DType::kFloat64, DType::kFloat64, TolerancePreset::kTorch, 20, 30,
       1e-9, 0.3, 3, 3},
      {"bf16 against fp32, general path", DType::kBFloat16, DType::kFloat32,
       TolerancePreset::kTorch, 20, 30, 1e-2, 0.3, 2, 2, 0.2, 3},
  };
  uint32_t seed = 40;
  for (const Case& c : cases) CheckCase(c, ++seed);
}

// Long enough for the lean path's 16-bit histogram counters to be emptied
// mid-pass (every 8191 vectors of one thread).
TEST(CompareThreadTest, OneThreadEqualsCompareOverManyVectors) {
  CheckCase({"bf16 torch, 300k elements", DType::kBFloat16, DType::kBFloat16,
             TolerancePreset::kTorch, 300, 1000, 1e-2, 0.4},
            7);
}

}  // namespace
}  // namespace tensorcheck::cuda
