// Test helpers of the store's tests: distinct bytes and a store.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>

#include "server/store/tensor_store.h"
#include "tests/testing/status_matchers.h"

namespace tensorcheck::internal {

// `n` bytes, different for each seed.
inline std::string Bytes(size_t n, int seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 2654435761u + seed * 97u) >> 7);
  return s;
}

// An in-memory store of `budget` bytes.
inline std::unique_ptr<TensorStore> Store(int64_t budget) {
  auto store = TensorStore::Create({budget, 0});
  EXPECT_THAT(store, ::tensorcheck::testing::IsOk());
  return std::move(store).value();
}

}  // namespace tensorcheck::internal
