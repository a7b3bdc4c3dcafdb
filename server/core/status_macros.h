// Status propagation macros.
//
// Debian's Abseil (20220623) ships no RETURN_IF_ERROR / ASSIGN_OR_RETURN, so
// the project keeps these two:
//
//   TC_RETURN_IF_ERROR(ValidateShape(shape));
//   TC_ASSIGN_OR_RETURN(Tensor t, Tensor::Create(DType::kFloat32, {2, 3}));
//
// and the one form of a request error that names its field:
//
//   return InvalidFieldError("tolerance.atol", "a finite value >= 0", "-1");
//   // INVALID_ARGUMENT "tolerance.atol: a finite value >= 0 expected, got -1"
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace tensorcheck {

inline absl::Status InvalidFieldError(absl::string_view field, absl::string_view expected,
                                      absl::string_view got) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", expected, " expected, got ", got));
}

}  // namespace tensorcheck

#define TC_STATUS_CONCAT_INNER_(a, b) a##b
#define TC_STATUS_CONCAT_(a, b) TC_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function when `expr` yields a non-OK status.
#define TC_RETURN_IF_ERROR(expr)                  \
  do {                                            \
    const ::absl::Status tc_status_ = (expr);     \
    if (!tc_status_.ok()) return tc_status_;      \
  } while (0)

// Evaluates `rexpr` (an absl::StatusOr<T>), returns its status on error,
// otherwise moves its value into `lhs` (which may be a declaration).
#define TC_ASSIGN_OR_RETURN(lhs, rexpr) \
  TC_ASSIGN_OR_RETURN_IMPL_(TC_STATUS_CONCAT_(tc_statusor_, __LINE__), lhs, rexpr)

#define TC_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                              \
  if (!statusor.ok()) return statusor.status();         \
  lhs = std::move(statusor).value()
