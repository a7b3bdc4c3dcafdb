// Working memory of the CPU backend: an allocation failure is a status
// (RESOURCE_EXHAUSTED), never an exception or a crash.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <new>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace tensorcheck::internal {

// `count` elements of T (at least one), uninitialised.
template <typename T>
absl::StatusOr<std::unique_ptr<T[]>> Allocate(int64_t count) {
  std::unique_ptr<T[]> p(new (std::nothrow) T[static_cast<size_t>(std::max<int64_t>(count, 1))]);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ",
                                                     count * static_cast<int64_t>(sizeof(T)),
                                                     " bytes of CPU working memory"));
  }
  return p;
}

}  // namespace tensorcheck::internal
