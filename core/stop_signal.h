// StopSignal: when the work of one request must stop. The service makes one
// per request (the client's deadline, or the server's cap on work per
// request, and cancellation by the client or by a draining server); every
// layer below checks it between bounded pieces of work (configurations,
// repeats, GEMM tiles, statistics chunks, kernel launches) and returns its
// status, so a cancelled request frees its worker and its memory soon
// after (docs/architecture.md, "Cancellation").
//
//   StopSignal stop(absl::Now() + absl::Seconds(300));
//   ...                                  // another thread, on cancel:
//   stop.Cancel(StopSignal::Reason::kClientCancelled);
//   ...                                  // the worker, between pieces:
//   TC_RETURN_IF_ERROR(stop.Check());    // CANCELLED / DEADLINE_EXCEEDED
//
// A null `const StopSignal*` means "never stops": CheckStop(nullptr) is OK.
// Thread safety: Cancel and Check may be called from any thread at once.
#pragma once

#include <atomic>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace tensorcheck {

class StopSignal {
 public:
  enum class Reason {
    kNone,
    kClientCancelled,  // the client cancelled, or its connection went away
    kShutdown,         // the server is draining and the grace period ended
    kDeadline,         // gRPC cancelled the call at (or just before) its deadline
  };

  // Stops only when cancelled.
  StopSignal() = default;
  // Also stops once `deadline` has passed.
  explicit StopSignal(absl::Time deadline) : deadline_(deadline) {}
  StopSignal(const StopSignal&) = delete;
  StopSignal& operator=(const StopSignal&) = delete;

  // Asks the work to stop; the first reason given is kept.
  void Cancel(Reason reason) {
    int expected = static_cast<int>(Reason::kNone);
    reason_.compare_exchange_strong(expected, static_cast<int>(reason));
  }

  // OK while the work may go on; otherwise CANCELLED (naming who
  // cancelled) or DEADLINE_EXCEEDED. Costs an atomic load and, with a
  // deadline, a clock read: call it between pieces of work of about a
  // millisecond or more, not per element.
  absl::Status Check() const;

  bool stop_requested() const { return !Check().ok(); }
  absl::Time deadline() const { return deadline_; }

 private:
  const absl::Time deadline_ = absl::InfiniteFuture();
  std::atomic<int> reason_{static_cast<int>(Reason::kNone)};
};

// stop->Check(), or OK for a null signal.
inline absl::Status CheckStop(const StopSignal* stop) {
  return stop == nullptr ? absl::OkStatus() : stop->Check();
}

// Whether `status` is what Check returns when the work was stopped: an
// outcome of the request's life, not a failure of the computation.
bool IsStopStatus(const absl::Status& status);

}  // namespace tensorcheck
