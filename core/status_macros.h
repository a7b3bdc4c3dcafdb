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
//
// and the typed signals other layers react to, carried as status payloads
// (never as phrases to search a message for):
//
//   return MarkFatalDeviceError(absl::InternalError("cudaMemcpy: ..."));
//   if (IsFatalDeviceError(status)) { /* NOT_SERVING, exit */ }
//   return WithContext(status, "configuration cpu:fp32:fused");  // keeps them
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace tensorcheck {

inline absl::Status InvalidFieldError(absl::string_view field, absl::string_view expected,
                                      absl::string_view got) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", expected, " expected, got ", got));
}

// Payload type URL of a fatal device error: the device context is
// corrupted (a sticky CUDA error), every later request would fail the same
// way, and only a new process recovers.
inline constexpr absl::string_view kFatalDeviceErrorPayload =
    "type.googleapis.com/tensorcheck.FatalDeviceError";

// `status` marked as a fatal device error.
inline absl::Status MarkFatalDeviceError(absl::Status status) {
  status.SetPayload(kFatalDeviceErrorPayload, absl::Cord("fatal"));
  return status;
}

// Whether `status` carries the fatal-device-error mark (however it was
// wrapped by WithContext on its way up).
inline bool IsFatalDeviceError(const absl::Status& status) {
  return status.GetPayload(kFatalDeviceErrorPayload).has_value();
}

// Payload type URL of "the library has no kernel for this configuration
// on this layer" (cuBLASLt's heuristic returned nothing): a property of the
// layer and the device, not of the request's data, so a default candidate
// can go to another backend instead of failing the request.
inline constexpr absl::string_view kNoKernelPayload = "type.googleapis.com/tensorcheck.NoKernel";

inline absl::Status MarkNoKernel(absl::Status status) {
  status.SetPayload(kNoKernelPayload, absl::Cord("no kernel"));
  return status;
}

inline bool IsNoKernel(const absl::Status& status) {
  return status.GetPayload(kNoKernelPayload).has_value();
}

// `status` with "context: " before its message; code and payloads kept.
inline absl::Status WithContext(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  absl::Status out(status.code(), absl::StrCat(context, ": ", status.message()));
  status.ForEachPayload([&](absl::string_view type_url, const absl::Cord& payload) {
    out.SetPayload(type_url, payload);
  });
  return out;
}

}  // namespace tensorcheck

#define TC_STATUS_CONCAT_INNER_(a, b) a##b
#define TC_STATUS_CONCAT_(a, b) TC_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function when `expr` yields a non-OK status.
#define TC_RETURN_IF_ERROR(expr)              \
  do {                                        \
    const ::absl::Status tc_status_ = (expr); \
    if (!tc_status_.ok()) return tc_status_;  \
  } while (0)

// Evaluates `rexpr` (an absl::StatusOr<T>), returns its status on error,
// otherwise moves its value into `lhs` (which may be a declaration).
#define TC_ASSIGN_OR_RETURN(lhs, rexpr) \
  TC_ASSIGN_OR_RETURN_IMPL_(TC_STATUS_CONCAT_(tc_statusor_, __LINE__), lhs, rexpr)

#define TC_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                              \
  if (!statusor.ok()) return statusor.status();         \
  lhs = std::move(statusor).value()
