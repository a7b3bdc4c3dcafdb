// Test helpers shared by the suites that compare statistics or need random
// tensors.
//
//   Tensor x = RandomNormal({4, 64}, 1.0, /*seed=*/1);
//   ExpectSameStats(device_stats, host_stats);   // sums to 1e-9 relative
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/tensor.h"
#include "server/stats/diff_stats.h"

namespace tensorcheck::testing {

// Normal(0, stddev) values of `dtype` (rounded to it), reproducible by seed.
inline Tensor RandomNormal(const std::vector<int64_t>& shape, double stddev, uint32_t seed,
                           DType dtype = DType::kFloat32) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> dist(0.0, stddev);
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = dist(rng);
  return *FromDoubles(dtype, shape, v);
}

// The same groups (index and count) in the same order.
inline void ExpectSameGroups(const std::vector<GroupCount>& d, const std::vector<GroupCount>& h) {
  ASSERT_EQ(d.size(), h.size());
  for (size_t j = 0; j < d.size(); ++j) {
    EXPECT_EQ(d[j].index, h[j].index);
    EXPECT_EQ(d[j].mismatched, h[j].mismatched);
  }
}

// Two DiffStats of the same comparison made by two implementations: every
// count, maximum, index, histogram bucket, worst element and group exactly;
// the sums (mean_abs, rms, rel_l2, cosine, mean_ulp, bound_ratio) within
// 1e-9 relative, as they may be added in another order.
inline void ExpectSameStats(const DiffStats& d, const DiffStats& h) {
  EXPECT_EQ(d.total, h.total);
  EXPECT_EQ(d.finite, h.finite);
  EXPECT_EQ(d.mismatched, h.mismatched);
  EXPECT_EQ(d.passed, h.passed);
  EXPECT_EQ(d.max_abs, h.max_abs);
  EXPECT_EQ(d.max_abs_index, h.max_abs_index);
  EXPECT_EQ(d.max_rel, h.max_rel);
  EXPECT_EQ(d.max_rel_index, h.max_rel_index);
  EXPECT_EQ(d.max_ulp, h.max_ulp);
  EXPECT_EQ(d.bitwise_equal, h.bitwise_equal);
  EXPECT_EQ(d.bitwise_equal_count, h.bitwise_equal_count);
  EXPECT_EQ(d.nan_actual, h.nan_actual);
  EXPECT_EQ(d.nan_expected, h.nan_expected);
  EXPECT_EQ(d.inf_actual, h.inf_actual);
  EXPECT_EQ(d.inf_expected, h.inf_expected);
  EXPECT_EQ(d.nan_mismatch, h.nan_mismatch);
  ASSERT_EQ(d.ulp_histogram.size(), h.ulp_histogram.size());
  for (size_t b = 0; b < d.ulp_histogram.size(); ++b) {
    EXPECT_EQ(d.ulp_histogram[b].lo, h.ulp_histogram[b].lo);
    EXPECT_EQ(d.ulp_histogram[b].count, h.ulp_histogram[b].count);
  }
  auto near = [](double a, double b) {
    if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
    if (std::isinf(a) || std::isinf(b)) return a == b;
    return std::fabs(a - b) <= 1e-9 * std::max(std::fabs(a), std::fabs(b)) + 1e-300;
  };
  EXPECT_PRED2(near, d.mean_abs, h.mean_abs);
  EXPECT_PRED2(near, d.rms, h.rms);
  EXPECT_PRED2(near, d.rel_l2, h.rel_l2);
  EXPECT_PRED2(near, d.cosine, h.cosine);
  EXPECT_PRED2(near, d.mean_ulp, h.mean_ulp);
  ASSERT_EQ(d.bound_ratio.has_value(), h.bound_ratio.has_value());
  if (h.bound_ratio) {
    EXPECT_PRED2(near, *d.bound_ratio, *h.bound_ratio);
  }
  ASSERT_EQ(d.worst.size(), h.worst.size());
  for (size_t j = 0; j < d.worst.size(); ++j) {
    SCOPED_TRACE(::testing::Message() << "worst[" << j << "]");
    EXPECT_EQ(d.worst[j].flat_index, h.worst[j].flat_index);
    EXPECT_EQ(d.worst[j].actual_bits, h.worst[j].actual_bits);
    EXPECT_EQ(d.worst[j].expected_bits, h.worst[j].expected_bits);
    EXPECT_EQ(d.worst[j].ulp, h.worst[j].ulp);
  }
  ExpectSameGroups(d.top_columns, h.top_columns);
  ExpectSameGroups(d.top_rows, h.top_rows);
}

}  // namespace tensorcheck::testing
