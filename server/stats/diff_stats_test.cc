#include "server/stats/diff_stats.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "core/executor.h"
#include "core/float_formats.h"
#include "tests/testing/compare_testing.h"
#include "tests/testing/status_matchers.h"

namespace tensorcheck {
namespace {

using ::tensorcheck::testing::Cmp;
using ::tensorcheck::testing::F32;
using ::tensorcheck::testing::Fp32Ulps;
using ::tensorcheck::testing::IsOk;
using ::tensorcheck::testing::Opts;
using ::tensorcheck::testing::Pool;
using ::tensorcheck::testing::StatusIs;
using ::testing::HasSubstr;

constexpr float kInfF = std::numeric_limits<float>::infinity();
constexpr float kNanF = std::numeric_limits<float>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

Tensor F64(const std::vector<double>& v) {
  auto t = FromDoubles(DType::kFloat64, {static_cast<int64_t>(v.size())}, v);
  EXPECT_THAT(t, IsOk());
  return std::move(t).value();
}

std::vector<std::pair<uint64_t, int64_t>> Buckets(const DiffStats& s) {
  std::vector<std::pair<uint64_t, int64_t>> out;
  for (const UlpBucket& b : s.ulp_histogram) out.push_back({b.hi, b.count});
  return out;
}

// ---------------------------------------------------------------- NaN / Inf

TEST(CompareTest, NanAgainstNumberIsNanMismatch) {
  DiffStats s = Cmp(F32({kNanF, 1.0f}), F32({1.0f, 1.0f}), Opts());
  EXPECT_EQ(s.total, 2);
  EXPECT_EQ(s.finite, 1);
  EXPECT_EQ(s.nan_actual, 1);
  EXPECT_EQ(s.nan_expected, 0);
  EXPECT_EQ(s.nan_mismatch, 1);
  EXPECT_EQ(s.mismatched, 1);
  EXPECT_FALSE(s.passed);
  EXPECT_EQ(s.max_ulp, kUlpInfinite);
  EXPECT_EQ(s.mean_ulp, 0.0);  // over the one finite distance
  EXPECT_EQ(s.max_abs, 0.0);   // NaN pairs are not in max_abs
  EXPECT_EQ(s.max_abs_index, 1);
  ASSERT_EQ(s.ulp_histogram.size(), 2u);
  EXPECT_EQ(s.ulp_histogram[0].hi, 0u);
  EXPECT_EQ(s.ulp_histogram[0].count, 1);
  EXPECT_EQ(s.ulp_histogram[1].lo, kUlpInfinite);
  EXPECT_EQ(s.ulp_histogram[1].hi, kUlpInfinite);
  EXPECT_EQ(s.ulp_histogram[1].count, 1);
  ASSERT_FALSE(s.worst.empty());
  EXPECT_EQ(s.worst[0].flat_index, 0);
  EXPECT_TRUE(std::isnan(s.worst[0].actual));
  EXPECT_EQ(s.worst[0].ulp, kUlpInfinite);
}

TEST(CompareTest, NanAgainstNanFailsUnlessNanEqual) {
  CompareOptions o = Opts();
  DiffStats s = Cmp(F32({kNanF}), F32({kNanF}), o);
  EXPECT_EQ(s.nan_mismatch, 0);
  EXPECT_EQ(s.mismatched, 1);
  EXPECT_EQ(s.max_ulp, 0u);
  o.tolerance.nan_equal = true;
  s = Cmp(F32({kNanF}), F32({kNanF}), o);
  EXPECT_EQ(s.mismatched, 0);
  EXPECT_TRUE(s.passed);
  EXPECT_EQ(s.nan_actual, 1);
  EXPECT_EQ(s.nan_expected, 1);
}

TEST(CompareTest, InfinitiesPassOnlyWhenEqualAndAreLeftOutOfSums) {
  DiffStats s = Cmp(F32({kInfF, -kInfF, kInfF, 1.0f, 2.0f}),
                    F32({kInfF, -kInfF, -kInfF, kInfF, 2.5f}), Opts());
  EXPECT_EQ(s.inf_actual, 3);
  EXPECT_EQ(s.inf_expected, 4);
  EXPECT_EQ(s.finite, 1);
  EXPECT_EQ(s.mismatched, 3);  // +inf/-inf, 1/+inf, 2/2.5
  EXPECT_EQ(s.max_abs, kInf);
  EXPECT_EQ(s.max_abs_index, 2);  // first infinite difference
  EXPECT_EQ(s.max_rel, kInf);
  EXPECT_EQ(s.max_rel_index, 2);
  EXPECT_EQ(s.mean_abs, 0.5);  // only the finite pair
  EXPECT_EQ(s.rms, 0.5);
  // +inf to -inf: 2 * 0x7f800000; 1.0 to +inf: 0x7f800000 - 0x3f800000.
  EXPECT_EQ(s.max_ulp, 2u * 0x7f800000u);
  ASSERT_GE(s.worst.size(), 3u);
  EXPECT_EQ(s.worst[0].flat_index, 2);
  EXPECT_EQ(s.worst[1].flat_index, 3);
  EXPECT_EQ(s.worst[2].flat_index, 4);
}

// ---------------------------------------------------------------- zeros

TEST(CompareTest, SignedZerosAreZeroUlpApartButNotBitwiseEqual) {
  DiffStats s = Cmp(F32({0.0f, -0.0f}), F32({-0.0f, -0.0f}), Opts());
  EXPECT_EQ(s.mismatched, 0);
  EXPECT_EQ(s.max_abs, 0.0);
  EXPECT_EQ(s.max_ulp, 0u);
  EXPECT_EQ(s.bitwise_equal_count, 1);
  EXPECT_FALSE(s.bitwise_equal);
  EXPECT_EQ(Buckets(s), (std::vector<std::pair<uint64_t, int64_t>>{{0, 2}}));
  EXPECT_EQ(s.cosine, 1.0);  // both zero vectors
  EXPECT_EQ(s.rel_l2, 0.0);
}

TEST(CompareTest, RelativeDifferenceAtZeroReferenceIsInfiniteUnlessBothZero) {
  DiffStats s = Cmp(F64({0.0, 1e-3, 2.0}), F64({0.0, 0.0, 1.0}), Opts());
  EXPECT_EQ(s.max_rel, kInf);
  EXPECT_EQ(s.max_rel_index, 1);
  EXPECT_EQ(s.max_abs, 1.0);
  EXPECT_EQ(s.max_abs_index, 2);

  s = Cmp(F64({0.0, 0.0}), F64({0.0, 0.0}), Opts());
  EXPECT_EQ(s.max_rel, 0.0);
  EXPECT_EQ(s.max_rel_index, 0);

  // ||e|| = 0 with a nonzero difference.
  s = Cmp(F64({1e-3}), F64({0.0}), Opts());
  EXPECT_EQ(s.rel_l2, kInf);
  EXPECT_EQ(s.cosine, 0.0);
  ASSERT_EQ(s.worst.size(), 1u);
  EXPECT_EQ(s.worst[0].rel_diff, kInf);
}

// ---------------------------------------------------------------- denormals

TEST(CompareTest, DenormalsAreComparedExactly) {
  const float tiny = std::numeric_limits<float>::denorm_min();  // 2^-149
  CompareOptions o = Opts();
  o.tolerance = ResolveTolerance(TolerancePreset::kNumpy, DType::kFloat32);
  DiffStats s = Cmp(F32({3 * tiny, -tiny}), F32({tiny, tiny}), o);
  EXPECT_EQ(s.max_abs, 0x1p-148);
  EXPECT_EQ(s.max_abs_index, 0);
  EXPECT_EQ(s.max_rel, 2.0);  // both 2^-148 / 2^-149
  EXPECT_EQ(s.max_rel_index, 0);
  EXPECT_EQ(s.max_ulp, 2u);
  EXPECT_EQ(s.mismatched, 2);  // numpy: atol 0
  EXPECT_EQ(s.finite, 2);
}

// ---------------------------------------------------------------- moments

TEST(CompareTest, MomentsMatchHandComputation) {
  // d = a - e = [0, 0, 1, -2].
  DiffStats s = Cmp(F64({1, 2, 3, 4}), F64({1, 2, 2, 6}), Opts(DType::kFloat64));
  EXPECT_EQ(s.total, 4);
  EXPECT_DOUBLE_EQ(s.mean_abs, 0.75);
  EXPECT_DOUBLE_EQ(s.rms, std::sqrt(5.0 / 4.0));
  EXPECT_DOUBLE_EQ(s.rel_l2, 1.0 / 3.0);  // sqrt(5) / sqrt(45)
  // <a,e> = 35, |a|^2 = 30, |e|^2 = 45.
  EXPECT_DOUBLE_EQ(s.cosine, 35.0 / std::sqrt(30.0 * 45.0));
  EXPECT_EQ(s.max_abs, 2.0);
  EXPECT_EQ(s.max_abs_index, 3);
  EXPECT_EQ(s.max_rel, 0.5);  // 1/2 beats 2/6
  EXPECT_EQ(s.max_rel_index, 2);
  EXPECT_EQ(s.bitwise_equal_count, 2);
  EXPECT_EQ(s.mismatched, 2);
  EXPECT_FALSE(s.bound_ratio.has_value());
}

TEST(CompareTest, MaxIndicesAreFirstOccurrence) {
  DiffStats s = Cmp(F32({1, 3, 1, 3}), F32({1, 1, 1, 1}), Opts());
  EXPECT_EQ(s.max_abs, 2.0);
  EXPECT_EQ(s.max_abs_index, 1);
  EXPECT_EQ(s.max_rel_index, 1);
}

TEST(CompareTest, MixedStorageDTypesAreReadExactly) {
  auto a = FromFloats(DType::kBFloat16, {1}, std::vector<float>{1.0f});
  ASSERT_THAT(a, IsOk());
  DiffStats s = Cmp(*a, F32({1.0f + 0x1p-20f}), Opts());
  EXPECT_EQ(s.max_abs, 0x1p-20);
  EXPECT_EQ(s.max_ulp, 8u);  // 2^-20 / 2^-23 fp32 ulps
}

TEST(CompareTest, MeanOverMoreThan2To24ElementsStaysAccurate) {
  // 2^24 + 5 differences of 0.125 and 0.375 on values near 1000, more
  // than a float running sum can hold exactly.
  const int64_t n = (int64_t{1} << 24) + 5;
  std::vector<float> a(n), e(n);
  for (int64_t i = 0; i < n; ++i) {
    e[i] = 1000.0f + static_cast<float>(i % 7);
    a[i] = e[i] + ((i % 2) ? 0.125f : 0.375f);
  }
  CompareOptions o = Opts();
  o.top_k = 0;
  o.top_groups = 0;
  DiffStats s = Cmp(F32(a), F32(e), o);
  EXPECT_EQ(s.mismatched, n);
  // 2^23 + 3 pairs of 0.375, 2^23 + 2 of 0.125 (i even gets 0.375).
  const double expected_mean =
      ((0x1p23 + 3) * 0.375 + (0x1p23 + 2) * 0.125) / static_cast<double>(n);
  EXPECT_NEAR(s.mean_abs, expected_mean, 1e-15);
}

// ---------------------------------------------------------------- histogram

TEST(CompareTest, UlpHistogramBucketsArePowersOfTwo) {
  std::vector<float> a, e;
  for (int k : {0, 0, 1, 2, 3, 4, 5, 8, 9, 16, 17, 1000}) {
    a.push_back(Fp32Ulps(1.0f, k));
    e.push_back(1.0f);
  }
  DiffStats s = Cmp(F32(a), F32(e), Opts());
  std::vector<std::pair<uint64_t, uint64_t>> lohi;
  std::vector<int64_t> counts;
  for (const UlpBucket& b : s.ulp_histogram) {
    lohi.push_back({b.lo, b.hi});
    counts.push_back(b.count);
  }
  EXPECT_EQ(lohi, (std::vector<std::pair<uint64_t, uint64_t>>{
                      {0, 0}, {1, 1}, {2, 2}, {3, 4}, {5, 8}, {9, 16}, {17, 32}, {513, 1024}}));
  EXPECT_EQ(counts, (std::vector<int64_t>{2, 1, 1, 2, 2, 2, 1, 1}));
  EXPECT_EQ(s.max_ulp, 1000u);
  EXPECT_DOUBLE_EQ(s.mean_ulp, 1065.0 / 12.0);
  EXPECT_EQ(s.bitwise_equal_count, 2);
}

TEST(CompareTest, SmallUlpDistancesAcrossSignsFillTheFirstBuckets) {
  // Element i is i % 5 ULPs away, on values of both signs; element 0 is
  // +0 against -0. Distances up to 4 take the vector counting path.
  const int64_t n = 1024;
  std::vector<float> a(n), e(n);
  for (int64_t i = 0; i < n; ++i) {
    e[i] = (i % 2 ? -1.0f : 1.0f) * (1.0f + static_cast<float>(i));
    a[i] = Fp32Ulps(e[i], static_cast<int32_t>(i % 5));
  }
  e[0] = -0.0f;
  a[0] = 0.0f;
  CompareOptions o = Opts();
  o.tolerance = ResolveTolerance(TolerancePreset::kUlp, DType::kFloat32, std::nullopt, std::nullopt,
                                 /*max_ulp=*/3);
  DiffStats s = Cmp(F32(a), F32(e), o);
  EXPECT_EQ(Buckets(s),
            (std::vector<std::pair<uint64_t, int64_t>>{{0, 205}, {1, 205}, {2, 205}, {4, 409}}));
  EXPECT_EQ(s.max_ulp, 4u);
  EXPECT_DOUBLE_EQ(s.mean_ulp, 2046.0 / 1024.0);
  EXPECT_EQ(s.bitwise_equal_count, 204);  // i % 5 == 0 except i == 0
  EXPECT_EQ(s.mismatched, 204);           // the 4-ULP ones
}

// ---------------------------------------------------------------- worst-k

TEST(CompareTest, WorstPutsNanMismatchFirstThenLargestAbsThenLowerIndex) {
  CompareOptions o = Opts();
  o.top_k = 3;
  DiffStats s = Cmp(F32({0.1f, 0.5f, kNanF, 0.5f, 0.2f}), F32({0.0f, 0.0f, 0.0f, 0.0f, 0.0f}), o);
  ASSERT_EQ(s.worst.size(), 3u);
  EXPECT_EQ(s.worst[0].flat_index, 2);
  EXPECT_EQ(s.worst[1].flat_index, 1);
  EXPECT_EQ(s.worst[2].flat_index, 3);
  EXPECT_EQ(s.worst[1].abs_diff, 0.5);
  EXPECT_EQ(s.worst[1].actual_bits, 0x3f000000u);
  EXPECT_EQ(s.worst[1].expected_bits, 0u);
  EXPECT_EQ(s.worst[1].ulp, 0x3f000000u);
}

// What another implementation of Compare (the device one) builds on:
// DescribeElement gives the entries Compare lists, and FinishDiffStats ranks
// a superset of candidates as Compare does.
TEST(FinishDiffStatsTest, DescribeElementAndRankingMatchCompare) {
  const Tensor a = F32({0.1f, 0.5f, kNanF, -kInfF, 0.2f, kNanF, 3.0f});
  const Tensor e = F32({0.0f, 0.0f, 0.0f, -kInfF, 0.2f, kNanF, kInfF});
  for (bool nan_equal : {false, true}) {
    CompareOptions o = Opts();
    o.tolerance.nan_equal = nan_equal;
    o.top_k = 4;
    const DiffStats s = Cmp(a, e, o);
    std::vector<ElementDiff> all;
    for (int64_t i = 6; i >= 0; --i) {  // any order
      all.push_back(DescribeElement(i, a.GetDouble(i), e.GetDouble(i), DType::kFloat32));
    }
    const DiffStats f = FinishDiffStats(7, DiffTotals{}, all, o);
    ASSERT_EQ(f.worst.size(), s.worst.size());
    for (size_t j = 0; j < s.worst.size(); ++j) {
      SCOPED_TRACE(j);
      EXPECT_EQ(f.worst[j].flat_index, s.worst[j].flat_index);
      EXPECT_EQ(f.worst[j].actual_bits, s.worst[j].actual_bits);
      EXPECT_EQ(f.worst[j].expected_bits, s.worst[j].expected_bits);
      EXPECT_EQ(f.worst[j].ulp, s.worst[j].ulp);
      EXPECT_EQ(std::isnan(f.worst[j].abs_diff), std::isnan(s.worst[j].abs_diff));
      if (!std::isnan(s.worst[j].abs_diff)) {
        EXPECT_EQ(f.worst[j].abs_diff, s.worst[j].abs_diff);
        EXPECT_EQ(f.worst[j].rel_diff, s.worst[j].rel_diff);
      }
    }
  }
  // Hand-checked order without nan_equal: NaN against a number (2), then
  // +inf differences (NaN against NaN 5, inf against 3 at 6: ULP decides,
  // NaN/NaN is 0 ULP apart), then the largest finite difference (1).
  CompareOptions o = Opts();
  o.top_k = 4;
  const DiffStats s = Cmp(a, e, o);
  ASSERT_EQ(s.worst.size(), 4u);
  EXPECT_EQ(s.worst[0].flat_index, 2);
  EXPECT_EQ(s.worst[1].flat_index, 6);
  EXPECT_EQ(s.worst[2].flat_index, 5);
  EXPECT_EQ(s.worst[3].flat_index, 1);
}

TEST(FinishDiffStatsTest, TopGroupCountsTakesTheLargestWithTiesToTheLowerIndex) {
  const std::vector<GroupCount> g = TopGroupCounts({0, 3, 1, 3, 2}, 3, 9);
  ASSERT_EQ(g.size(), 3u);
  EXPECT_EQ(g[0].index, 1);
  EXPECT_EQ(g[1].index, 3);
  EXPECT_EQ(g[2].index, 4);
  EXPECT_DOUBLE_EQ(g[0].share, 3.0 / 9.0);
}

TEST(CompareTest, WorstBreaksAbsTiesByUlp) {
  // Same abs diff 2^-10 in fp32, but the larger ULP count is near 0.5.
  CompareOptions o = Opts();
  o.top_k = 2;
  DiffStats s = Cmp(F32({1.0f + 0x1p-10f, 0.5f + 0x1p-10f}), F32({1.0f, 0.5f}), o);
  ASSERT_EQ(s.worst.size(), 2u);
  EXPECT_EQ(s.worst[0].flat_index, 1);
  EXPECT_EQ(s.worst[0].ulp, 1u << 14);
  EXPECT_EQ(s.worst[1].ulp, 1u << 13);
}

// ---------------------------------------------------------------- groups

TEST(CompareTest, MismatchesPlantedInTwoColumnsTopTheColumnList) {
  const int64_t rows = 64, cols = 32;
  std::vector<float> a(rows * cols, 1.0f), e(rows * cols, 1.0f);
  for (int64_t r = 0; r < 10; ++r) a[r * cols + 5] = 2.0f;
  for (int64_t r = 0; r < 30; ++r) a[r * cols + 17] = 2.0f;
  CompareOptions o = Opts();
  o.cols = cols;
  DiffStats s = Cmp(F32(a), F32(e), o);
  EXPECT_EQ(s.mismatched, 40);
  ASSERT_EQ(s.top_columns.size(), 2u);
  EXPECT_EQ(s.top_columns[0].index, 17);
  EXPECT_EQ(s.top_columns[0].mismatched, 30);
  EXPECT_DOUBLE_EQ(s.top_columns[0].share, 0.75);
  EXPECT_EQ(s.top_columns[1].index, 5);
  EXPECT_DOUBLE_EQ(s.top_columns[1].share, 0.25);
  // Rows 0-9 hold 2 each; the list keeps 5 with ties to the lower index.
  ASSERT_EQ(s.top_rows.size(), 5u);
  for (int k = 0; k < 5; ++k) {
    EXPECT_EQ(s.top_rows[k].index, k);
    EXPECT_EQ(s.top_rows[k].mismatched, 2);
    EXPECT_DOUBLE_EQ(s.top_rows[k].share, 0.05);
  }
}

TEST(CompareTest, NoMismatchesMeansNoGroups) {
  CompareOptions o = Opts();
  o.cols = 2;
  DiffStats s = Cmp(F32({1, 2, 3, 4}), F32({1, 2, 3, 4}), o);
  EXPECT_TRUE(s.passed);
  EXPECT_TRUE(s.top_columns.empty());
  EXPECT_TRUE(s.top_rows.empty());
  EXPECT_TRUE(s.bitwise_equal);
}

TEST(CompareTest, RowsSplitAcrossThreadsAreCountedOnce) {
  // 131 rows of 1000 = 128 blocks of 1024; on an executor of 4, 3 threads
  // are used (at least 2^15 elements each) over 12 chunks of blocks, two
  // of whose boundaries are blocks 42 and 85: rows 43 ([43000, 44000)) and
  // 87 straddle the elements 43008, 87040.
  const int64_t rows = 131, cols = 1000;
  std::vector<float> a(rows * cols, 1.0f), e(rows * cols, 1.0f);
  for (int64_t c = 0; c < cols; ++c) {
    a[43 * cols + c] = 3.0f;
    a[87 * cols + c] = 3.0f;
  }
  for (int64_t c = 0; c < 5; ++c) a[c] = 3.0f;
  CompareOptions o = Opts();
  o.cols = cols;
  for (int threads : {1, 4}) {
    SCOPED_TRACE(threads);
    o.executor = Pool(threads);
    DiffStats s = Cmp(F32(a), F32(e), o);
    ASSERT_EQ(s.top_rows.size(), 3u);
    EXPECT_EQ(s.top_rows[0].index, 43);
    EXPECT_EQ(s.top_rows[0].mismatched, 1000);
    EXPECT_EQ(s.top_rows[1].index, 87);
    EXPECT_EQ(s.top_rows[1].mismatched, 1000);
    EXPECT_EQ(s.top_rows[2].index, 0);
    EXPECT_EQ(s.top_rows[2].mismatched, 5);
    EXPECT_DOUBLE_EQ(s.top_rows[2].share, 5.0 / 2005.0);
    ASSERT_EQ(s.top_columns.size(), 5u);
    for (int k = 0; k < 5; ++k) {
      EXPECT_EQ(s.top_columns[k].index, k);
      EXPECT_EQ(s.top_columns[k].mismatched, 3);
    }
  }
}

TEST(CompareTest, ColsZeroTreatsTheTensorAsOneRow) {
  const int64_t n = 1 << 17;
  std::vector<float> a(n, 1.0f), e(n, 1.0f);
  a[10] = a[100000] = 2.0f;
  CompareOptions o = Opts();
  o.cols = 0;
  for (int threads : {1, 4}) {
    o.executor = Pool(threads);
    DiffStats s = Cmp(F32(a), F32(e), o);
    ASSERT_EQ(s.top_columns.size(), 2u) << threads;
    EXPECT_EQ(s.top_columns[0].index, 10);
    EXPECT_EQ(s.top_columns[1].index, 100000);
    EXPECT_DOUBLE_EQ(s.top_columns[1].share, 0.5);
    ASSERT_EQ(s.top_rows.size(), 1u);
    EXPECT_EQ(s.top_rows[0].index, 0);
    EXPECT_EQ(s.top_rows[0].mismatched, 2);
    EXPECT_DOUBLE_EQ(s.top_rows[0].share, 1.0);
  }
}

// ---------------------------------------------------------------- dtype

TEST(CompareTest, Bf16ComparedDTypeRoundsFp32TensorsBeforeUlpAndBits) {
  // 1 + 2^-10 rounds to bf16 1.0 (0 ULP, bit equal); 1 + 2^-7 is 1 bf16 ULP;
  // 1 + 2^-8 is a tie that goes to even (1.0).
  CompareOptions o = Opts(DType::kBFloat16);
  o.top_k = 3;
  DiffStats s =
      Cmp(F32({1.0f + 0x1p-10f, 1.0f + 0x1p-7f, 1.0f + 0x1p-8f}), F32({1.0f, 1.0f, 1.0f}), o);
  EXPECT_EQ(s.compared_dtype, DType::kBFloat16);
  EXPECT_EQ(s.bitwise_equal_count, 2);
  EXPECT_EQ(s.max_ulp, 1u);
  EXPECT_EQ(s.max_abs, 0x1p-7);  // abs diff uses the exact values
  ASSERT_EQ(s.worst.size(), 3u);
  EXPECT_EQ(s.worst[0].flat_index, 1);
  EXPECT_EQ(s.worst[0].actual_bits, 0x3f81u);
  EXPECT_EQ(s.worst[0].expected_bits, 0x3f80u);
  EXPECT_EQ(s.worst[0].ulp, 1u);
  EXPECT_EQ(s.worst[1].flat_index, 2);
  EXPECT_EQ(s.worst[1].actual_bits, 0x3f80u);
  EXPECT_EQ(s.worst[1].ulp, 0u);
  // torch bf16 rtol 1.6e-2 admits all three.
  EXPECT_EQ(s.mismatched, 0);
}

TEST(CompareTest, Fp16TensorsComparedInFp16UseTheirOwnBits) {
  auto a = FromFloats(DType::kFloat16, {3}, std::vector<float>{1.0f, -0.0f, 2.0f});
  auto e = FromFloats(DType::kFloat16, {3}, std::vector<float>{1.0f + 0x1p-10f, 0.0f, 2.0f});
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(e, IsOk());
  CompareOptions o = Opts(DType::kFloat16);
  DiffStats s = Cmp(*a, *e, o);
  EXPECT_EQ(s.max_ulp, 1u);
  EXPECT_EQ(s.bitwise_equal_count, 1);  // 2.0 only; -0 and +0 differ
  ASSERT_FALSE(s.worst.empty());
  EXPECT_EQ(s.worst[0].actual_bits, 0x3c00u);
  EXPECT_EQ(s.worst[0].expected_bits, 0x3c01u);
}

TEST(CompareTest, RandomFiniteDataMatchesANaiveLoop) {
  // Finite data takes the block fast path, which skips its ordered pass
  // when nothing can change; a plain loop must agree with it.
  const int64_t n = 300000;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> ulps(-200, 200);
  std::vector<float> a(n), e(n);
  for (int64_t i = 0; i < n; ++i) {
    if (i % 1000 == 0) {  // some zero references, some matched exactly
      e[i] = 0.0f;
      a[i] = (i % 2000 == 0) ? 0.0f : 1e-7f;
      continue;
    }
    e[i] = normal(rng);
    a[i] = Fp32Ulps(e[i], ulps(rng));
  }
  CompareOptions o = Opts();
  o.top_k = 5;
  o.executor = Pool(3);
  DiffStats s = Cmp(F32(a), F32(e), o);

  int64_t mismatched = 0, max_abs_i = -1, max_rel_i = -1;
  double max_abs = -1, max_rel = -1;
  std::vector<std::pair<double, int64_t>> by_abs;
  for (int64_t i = 0; i < n; ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - e[i]);
    const double ae = std::fabs(static_cast<double>(e[i]));
    const double rel = ae > 0 ? d / ae : (d > 0 ? kInf : 0.0);
    if (d > max_abs) max_abs = d, max_abs_i = i;
    if (rel > max_rel) max_rel = rel, max_rel_i = i;
    if (!(d <= 1e-5 + 1.3e-6 * ae)) ++mismatched;
    by_abs.push_back({-d, i});
  }
  std::sort(by_abs.begin(), by_abs.end());
  EXPECT_EQ(s.mismatched, mismatched);
  EXPECT_EQ(s.max_abs, max_abs);
  EXPECT_EQ(s.max_abs_index, max_abs_i);
  EXPECT_EQ(s.max_rel, max_rel);
  EXPECT_EQ(s.max_rel_index, max_rel_i);
  ASSERT_EQ(s.worst.size(), 5u);
  for (int k = 0; k < 5; ++k) {
    EXPECT_EQ(s.worst[k].abs_diff, -by_abs[k].first) << k;
  }
}

// ---------------------------------------------------------------- bounds

TEST(CompareTest, BoundRatioIsErrorNormOverSigmaNorm) {
  // d = [0.25, 0, -0.5, (NaN: skipped)], sigma = [0.5, 0.5, 1, 8].
  // sum d^2 = 0.3125, sum sigma^2 = 1.5 over the finite pairs.
  std::vector<float> sigma = {0.5f, 0.5f, 1.0f, 8.0f};
  CompareOptions o = Opts();
  o.predicted_sigma = sigma.data();
  DiffStats s = Cmp(F32({1.25f, 2.0f, 2.5f, kNanF}), F32({1.0f, 2.0f, 3.0f, 1.0f}), o);
  ASSERT_TRUE(s.bound_ratio.has_value());
  EXPECT_DOUBLE_EQ(*s.bound_ratio, std::sqrt(0.3125 / 1.5));
}

TEST(CompareTest, BoundPresetUsesEachElementsBoundTimesFactor) {
  std::vector<float> bound = {0.5f, 0.125f};
  CompareOptions o = Opts();
  o.tolerance = ResolveTolerance(TolerancePreset::kBound, DType::kFloat32);
  o.error_bound = bound.data();
  DiffStats s = Cmp(F32({1.25f, 1.25f}), F32({1.0f, 1.0f}), o);
  EXPECT_EQ(s.mismatched, 1);
  ASSERT_EQ(s.worst.size(), 2u);
  o.tolerance.bound_factor = 2.0;
  s = Cmp(F32({1.25f, 1.25f}), F32({1.0f, 1.0f}), o);
  EXPECT_EQ(s.mismatched, 0);
}

TEST(CompareTest, UlpPresetCountsDistancesAboveMaxUlp) {
  CompareOptions o = Opts();
  o.tolerance = ResolveTolerance(TolerancePreset::kUlp, DType::kFloat32, std::nullopt, std::nullopt,
                                 /*max_ulp=*/2);
  DiffStats s = Cmp(F32({Fp32Ulps(1.0f, 2), Fp32Ulps(1.0f, 3)}), F32({1.0f, 1.0f}), o);
  EXPECT_EQ(s.mismatched, 1);
}

// ---------------------------------------------------------------- errors

TEST(CompareTest, ElementCountMismatchIsInvalidArgument) {
  EXPECT_THAT(Compare(F32({1, 2}), F32({1, 2, 3}), Opts()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("same number of elements")));
}

TEST(CompareTest, ColsNotDividingTotalIsInvalidArgument) {
  CompareOptions o = Opts();
  o.cols = 4;
  EXPECT_THAT(Compare(F32({1, 2, 3, 4, 5, 6}), F32({1, 2, 3, 4, 5, 6}), o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cols")));
  o.cols = -1;
  EXPECT_THAT(Compare(F32({1}), F32({1}), o), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(CompareTest, BoundPresetWithoutBoundIsInvalidArgument) {
  CompareOptions o = Opts();
  o.tolerance = ResolveTolerance(TolerancePreset::kBound, DType::kFloat32);
  EXPECT_THAT(Compare(F32({1}), F32({1}), o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bound")));
}

TEST(CompareTest, OutOfRangeTopKIsInvalidArgument) {
  CompareOptions o = Opts();
  o.top_k = -1;
  EXPECT_THAT(Compare(F32({1}), F32({1}), o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("top_k")));
  o.top_k = kMaxTopK + 1;
  EXPECT_THAT(Compare(F32({1}), F32({1}), o), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(CompareTest, EmptyTensorsPassWithNoIndices) {
  DiffStats s = Cmp(F32({}), F32({}), Opts());
  EXPECT_TRUE(s.passed);
  EXPECT_EQ(s.total, 0);
  EXPECT_EQ(s.max_abs_index, -1);
  EXPECT_EQ(s.max_rel_index, -1);
  EXPECT_TRUE(s.bitwise_equal);
  EXPECT_TRUE(s.worst.empty());
}

// ------------------------------------------------ elements near zero

// The largest finite |expected| is 4, so "near zero" is |e| < 4 * 2^-10 =
// 2^-8. Every distance below is counted by hand from fp32 bit patterns.
TEST(NegligibleTest, ElementsNearZeroAreLeftOutOfTheSignificantUlpFigure) {
  const float below = std::ldexp(1.0f, -8);
  const std::vector<float> expected = {
      4.0f,                   // 1 ULP off: significant
      1.0f,                   // 3 ULP off: significant
      std::ldexp(1.0f, -9),   // sign flipped: near zero
      std::ldexp(1.0f, -12),  // 2^-20 off, 2^15 of its ULPs: near zero
      below,                  // equal
      0.0f,                   // equal
      below,                  // 5 ULP off, not < below: significant
      kInfF,                  // equal, and not the scale
  };
  const std::vector<float> actual = {
      Fp32Ulps(4.0f, 1),
      Fp32Ulps(1.0f, 3),
      -std::ldexp(1.0f, -9),
      std::ldexp(1.0f, -12) + std::ldexp(1.0f, -20),
      below,
      0.0f,
      Fp32Ulps(below, 5),
      kInfF,
  };
  // fp32 tensors (read in place) and the same values stored as fp64
  // (read through GetDouble), both compared in fp32.
  const std::vector<double> actual64(actual.begin(), actual.end());
  const std::vector<double> expected64(expected.begin(), expected.end());
  for (const auto& [a, e] :
       {std::pair(F32(actual), F32(expected)), std::pair(F64(actual64), F64(expected64))}) {
    SCOPED_TRACE(DTypeName(a.dtype()));
    DiffStats s = Cmp(a, e, Opts());
    // +-2^-9 are 2 * (118 << 23) apart: the biased exponent of 2^-9 is 118.
    EXPECT_EQ(s.max_ulp, 2u * (118u << 23));
    ASSERT_TRUE(s.negligible.has_value());
    EXPECT_EQ(s.negligible->below, 0x1p-8);
    EXPECT_EQ(s.negligible->differing, 2);
    EXPECT_EQ(s.negligible->max_abs, 0x1p-8);  // |-2^-9 - 2^-9|
    EXPECT_EQ(s.negligible->significant_max_ulp, 5u);
    EXPECT_EQ(NegligibleNote(*s.negligible),
              "leaving out 2 elements near zero (|expected| < 3.9e-03, 2^-10 of the largest), "
              "which differ by at most 3.9e-03");
  }
}

TEST(NegligibleTest, ANanAmongTheOthersMakesTheSignificantFigureInfinite) {
  DiffStats s = Cmp(F32({kNanF, 0x1p-20f}), F32({1.0f, 0x1p-21f}), Opts());
  ASSERT_TRUE(s.negligible.has_value());
  EXPECT_EQ(s.negligible->differing, 1);
  EXPECT_EQ(s.negligible->significant_max_ulp, kUlpInfinite);
}

TEST(NegligibleTest, NotLookedForUnderTwoToTheTenUlp) {
  // 2^-20 off by 1023 of its ULPs: near zero, but the figure is small
  // enough to be read as it is.
  DiffStats s = Cmp(F32({1.0f, Fp32Ulps(0x1p-20f, 1023)}), F32({1.0f, 0x1p-20f}), Opts());
  EXPECT_EQ(s.max_ulp, 1023u);
  EXPECT_FALSE(s.negligible.has_value());
  s = Cmp(F32({1.0f, Fp32Ulps(0x1p-20f, 1024)}), F32({1.0f, 0x1p-20f}), Opts());
  EXPECT_EQ(s.max_ulp, 1024u);
  EXPECT_TRUE(s.negligible.has_value());
}

TEST(NegligibleTest, OneElementIsWordedInTheSingular) {
  DiffStats s = Cmp(F32({1.0f, 0x1p-20f}), F32({1.0f, 0x1p-21f}), Opts());
  ASSERT_TRUE(s.negligible.has_value());
  EXPECT_EQ(s.negligible->differing, 1);
  EXPECT_EQ(s.negligible->significant_max_ulp, 0u);
  EXPECT_EQ(NegligibleNote(*s.negligible),
            "leaving out 1 element near zero (|expected| < 9.8e-04, 2^-10 of the largest), "
            "which differs by at most 4.8e-07");
}

TEST(NegligibleTest, AbsentWhenNoDifferingElementIsNearZero) {
  // Bitwise equal.
  EXPECT_FALSE(Cmp(F32({1.0f, 0x1p-20f}), F32({1.0f, 0x1p-20f}), Opts()).negligible);
  // Differences only at the output's scale, large enough to be looked at.
  EXPECT_FALSE(
      Cmp(F32({Fp32Ulps(1.0f, 2000), 0x1p-20f}), F32({1.0f, 0x1p-20f}), Opts()).negligible);
  // No scale at all: every expected value is zero (or not finite).
  EXPECT_FALSE(Cmp(F32({1e-30f, kNanF}), F32({0.0f, kInfF}), Opts()).negligible);
}

// Across chunks and threads the figures are those of one plain loop over
// the elements, written here from the definition.
TEST(NegligibleTest, ThreadsAndChunksGiveThePlainLoopsFigures) {
  std::mt19937 rng(29);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int32_t> off(-3, 3);
  constexpr int64_t kN = 300000;
  std::vector<float> e(kN), a(kN);
  for (int64_t i = 0; i < kN; ++i) {
    // One element in 64 is tiny: near zero against a scale of about 4.
    // None is zero, so that a few ULPs either way keep the sign.
    const float v = std::copysign(std::fabs(normal(rng)) + 0.01f, normal(rng));
    e[i] = i % 64 == 0 ? v * 1e-5f : v;
    a[i] = Fp32Ulps(e[i], i % 64 == 0 ? 1000 * off(rng) : off(rng));
  }
  double scale = 0;
  for (float v : e) scale = std::max(scale, std::fabs(static_cast<double>(v)));
  const double below = scale * 0x1p-10;
  int64_t differing = 0;
  double max_abs = 0;
  uint64_t significant = 0;
  for (int64_t i = 0; i < kN; ++i) {
    if (a[i] == e[i]) continue;
    const auto ulp = static_cast<uint64_t>(
        std::llabs(static_cast<int64_t>(FloatBits(a[i])) - static_cast<int64_t>(FloatBits(e[i]))));
    if (std::fabs(static_cast<double>(e[i])) < below) {
      ++differing;
      max_abs = std::max(max_abs, std::fabs(static_cast<double>(a[i]) - e[i]));
    } else {
      significant = std::max(significant, ulp);
    }
  }
  ASSERT_GT(differing, 0);
  CompareOptions o = Opts();
  o.executor = Pool(4);
  DiffStats s = Cmp(F32(a), F32(e), o);
  ASSERT_TRUE(s.negligible.has_value());
  EXPECT_EQ(s.negligible->below, below);
  EXPECT_EQ(s.negligible->differing, differing);
  EXPECT_EQ(s.negligible->max_abs, max_abs);
  EXPECT_EQ(s.negligible->significant_max_ulp, significant);
  EXPECT_LE(significant, 3u);
}

}  // namespace
}  // namespace tensorcheck
