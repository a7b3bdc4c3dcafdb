#include "server/stats/magnitude_sums.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "tests/testing/status_matchers.h"

namespace tensorcheck {
namespace {

using ::tensorcheck::testing::IsOk;
using ::tensorcheck::testing::StatusIs;

// [rows, cols] normal values, stored as fp32, and as doubles for the loops.
struct Values {
  std::vector<double> v;
  Tensor t;
};
Values Normal(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  Values out;
  for (int64_t i = 0; i < rows * cols; ++i) {
    out.v.push_back(static_cast<float>(normal(rng)));
  }
  out.t = *FromDoubles(DType::kFloat32, {rows, cols}, out.v);
  return out;
}

TEST(ComputeMagnitudeSumsTest, MatchesNaiveLoopInBothLayouts) {
  const int64_t m = 4, n = 6, k = 50;
  const Values x = Normal(m, k, 9), w = Normal(n, k, 10);
  // The same weight stored [k, n] for IN_OUT.
  std::vector<double> wt(static_cast<size_t>(k * n));
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t kk = 0; kk < k; ++kk) wt[kk * n + j] = w.v[j * k + kk];
  }
  const Tensor w_in_out = *FromDoubles(DType::kFloat32, {k, n}, wt);
  for (WeightLayout layout : {WeightLayout::kOutIn, WeightLayout::kInOut}) {
    SCOPED_TRACE(WeightLayoutName(layout));
    const MagnitudeOperands op{
        &x.t, layout == WeightLayout::kOutIn ? &w.t : &w_in_out, layout, m, n, k};
    std::vector<float> abs_dot(static_cast<size_t>(m * n));
    std::vector<float> sq_dot(abs_dot.size()), dot(abs_dot.size());
    ASSERT_THAT(ComputeMagnitudeSums(op, abs_dot.data(), sq_dot.data(), dot.data()), IsOk());
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double a = 0.0, s = 0.0, d = 0.0;
        for (int64_t kk = 0; kk < k; ++kk) {
          const double p = x.v[i * k + kk] * w.v[j * k + kk];
          a += std::fabs(p);
          s += p * p;
          d += p;
        }
        EXPECT_NEAR(abs_dot[i * n + j], a, 1e-5 * a);
        EXPECT_NEAR(sq_dot[i * n + j], std::sqrt(s), 1e-5 * std::sqrt(s));
        EXPECT_NEAR(dot[i * n + j], d, 1e-5 * a);
      }
    }
  }
}

TEST(ComputeMagnitudeSumsTest, NullOutputIsInvalidArgument) {
  const Values x = Normal(1, 1, 1), w = Normal(1, 1, 2);
  float one = 0.0f;
  EXPECT_THAT(ComputeMagnitudeSums(MagnitudeOperands{&x.t, &w.t, WeightLayout::kOutIn, 1, 1, 1},
                                   nullptr, &one),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(ComputeMagnitudeSumsTest, OnlyTheAskedSumsAreWritten) {
  const Values x = Normal(2, 3, 3), w = Normal(2, 3, 4);
  std::vector<float> sq(4, -1.0f);
  ASSERT_THAT(ComputeMagnitudeSums(MagnitudeOperands{&x.t, &w.t, WeightLayout::kOutIn, 2, 2, 3},
                                   MagnitudeSums{nullptr, sq.data(), nullptr}),
              IsOk());
  for (float v : sq) EXPECT_GT(v, 0.0f);
}

TEST(ComputeMagnitudeSumsTest, MismatchedShapesAreInvalidArgument) {
  const Values x = Normal(2, 3, 5), w = Normal(2, 4, 6);
  std::vector<float> a(4), s(4);
  EXPECT_THAT(ComputeMagnitudeSums(MagnitudeOperands{&x.t, &w.t, WeightLayout::kOutIn, 2, 2, 3},
                                   a.data(), s.data()),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace tensorcheck
