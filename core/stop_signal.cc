#include "core/stop_signal.h"

#include "absl/strings/cord.h"

namespace tensorcheck {

namespace {
// Payload marking a status as Check's, so that IsStopStatus does not take
// a backend's own DEADLINE_EXCEEDED or CANCELLED for one.
constexpr absl::string_view kStopPayload = "type.googleapis.com/tensorcheck.Stopped";
}  // namespace

absl::Status StopSignal::Check() const {
  absl::Status s;
  switch (static_cast<Reason>(reason_.load(std::memory_order_relaxed))) {
    case Reason::kClientCancelled:
      s = absl::CancelledError("the client cancelled the request");
      break;
    case Reason::kShutdown:
      s = absl::CancelledError(
          "the server is shutting down and the request did not finish within the grace period");
      break;
    case Reason::kNone:
      if (deadline_ == absl::InfiniteFuture() || absl::Now() < deadline_) return absl::OkStatus();
      [[fallthrough]];
    case Reason::kDeadline:
      s = absl::DeadlineExceededError("the request's deadline passed before it finished");
      break;
  }
  s.SetPayload(kStopPayload, absl::Cord("stopped"));
  return s;
}

bool IsStopStatus(const absl::Status& status) {
  return status.GetPayload(kStopPayload).has_value();
}

}  // namespace tensorcheck
