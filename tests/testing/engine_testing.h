// An Engine over the built-in backends (the CPU emulation, and the CUDA
// backends where built), made fresh for each test of a fixture:
//
//   class MyTest : public ::tensorcheck::testing::BuiltinEngineTest {};
//   TEST_F(MyTest, X) { auto out = engine_->Verify(request); ... }
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>

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

}  // namespace tensorcheck::testing
