// Request ids: every call gets one, the client's `x-request-id` metadata
// when it sent a usable one, else a new random one; it goes back to the
// client in the response's initial metadata under the same key and into
// every log line of the call (docs/api.md, "Request ids").
//
//   const std::string id = AttachRequestId(context);  // first thing a handler does
//   fields["request_id"] = id;
#pragma once

#include <string>

#include "absl/strings/string_view.h"
#include "grpcpp/grpcpp.h"

namespace tensorcheck {

inline constexpr char kRequestIdKey[] = "x-request-id";
inline constexpr size_t kMaxRequestIdLength = 128;

// Whether `id` is kept as the client sent it: 1 to kMaxRequestIdLength
// characters of [A-Za-z0-9._:/-] (safe in a log line and in metadata).
bool UsableRequestId(absl::string_view id);

// 32 lowercase hex digits (128 random bits).
std::string NewRequestId();

// The call's id (the client's when usable, else a new one), added to the
// response's initial metadata; call before anything is sent.
std::string AttachRequestId(grpc::CallbackServerContext* context);

}  // namespace tensorcheck
