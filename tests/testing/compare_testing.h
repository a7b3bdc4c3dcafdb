// Helpers of the statistics suites (diff_stats_test, compare_kernels_test):
// small tensors, torch-preset options, a Compare that must succeed, one
// shared executor per size, and fp32 neighbours k ULPs away.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "core/executor.h"
#include "core/float_formats.h"
#include "core/tensor.h"
#include "server/stats/diff_stats.h"
#include "tests/testing/status_matchers.h"

namespace tensorcheck::testing {

inline Tensor F32(const std::vector<float>& v) {
  auto t = FromFloats(DType::kFloat32, {static_cast<int64_t>(v.size())}, v);
  EXPECT_THAT(t, IsOk());
  return std::move(t).value();
}

inline CompareOptions Opts(DType compared = DType::kFloat32) {
  CompareOptions o;
  o.tolerance = ResolveTolerance(TolerancePreset::kTorch, compared);
  o.compared_dtype = compared;
  return o;
}

inline DiffStats Cmp(const Tensor& a, const Tensor& e, const CompareOptions& o) {
  auto s = Compare(a, e, o);
  EXPECT_THAT(s, IsOk());
  return s.ok() ? std::move(s).value() : DiffStats{};
}

// An executor of `threads` threads, made once per size and shared by the
// tests, as the server shares one between requests.
inline Executor* Pool(int threads) {
  static auto* pools = new std::map<int, std::unique_ptr<Executor>>();
  std::unique_ptr<Executor>& pool = (*pools)[threads];
  if (pool == nullptr) {
    auto created = Executor::Create({threads});
    EXPECT_THAT(created, IsOk());
    pool = std::move(created).value();
  }
  return pool.get();
}

inline float Fp32Ulps(float base, int32_t k) {
  return BitsToFloat(static_cast<uint32_t>(static_cast<int64_t>(FloatBits(base)) + k));
}

}  // namespace tensorcheck::testing
