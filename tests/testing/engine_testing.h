// An Engine over the built-in backends (the CPU emulation, and the CUDA
// backends where built), made fresh for each test of a fixture:
//
//   class MyTest : public ::tensorcheck::testing::BuiltinEngineTest {};
//   TEST_F(MyTest, X) { auto out = engine_->Verify(request); ... }
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "core/float_formats.h"
#include "server/engine/engine.h"
#include "tests/testing/status_matchers.h"

namespace tensorcheck::testing {

class BuiltinEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_THAT(RegisterBuiltinBackends(&registry_), IsOk());
    auto engine = Engine::Create(EngineOptions{}, &registry_);
    ASSERT_THAT(engine, IsOk());
    engine_ = std::move(engine).value();
  }

  BackendRegistry registry_;
  std::unique_ptr<Engine> engine_;
};

// A layer's output, before its storage as bf16, from dequantised operands
// x [m, k] and w [n, k] (a recipe's values, redone by a test): each dot
// product summed in fp64, the bias b [n] added fused (to the sum, rounded
// once when stored) or unfused (the sum rounded to bf16 first).
inline std::vector<float> Bf16LayerOutput(const std::vector<double>& x,
                                          const std::vector<double>& w, const std::vector<float>& b,
                                          int64_t m, int64_t n, int64_t k, bool fused) {
  std::vector<float> y(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t t = 0; t < k; ++t) {
        acc += x[static_cast<size_t>(i * k + t)] * w[static_cast<size_t>(j * k + t)];
      }
      const float bj = b[static_cast<size_t>(j)];
      y[static_cast<size_t>(i * n + j)] =
          fused ? static_cast<float>(acc + bj) : RoundToBf16(static_cast<float>(acc)) + bj;
    }
  }
  return y;
}

}  // namespace tensorcheck::testing
