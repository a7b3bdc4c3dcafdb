// HostDevice: the host as a ComputeDevice (device_session.h), so that the
// engine runs every request through one execution, whatever computes it
// (docs/architecture.md, "The life of a request"). A HostSession's arrays
// are host tensors: the request's own, read in place (Upload copies
// nothing), and what its calls make; each call is the host function the
// DeviceSession contract names (the backend's Run and RunBatch,
// ComputeMagnitudeSums, the error model, FlipGrid, Compare, stats'
// diagnosis passes), with the statistics on the executor it was given.
//
//   HostDevice device({[&](absl::string_view name) { return registry.Find(name); },
//                      executor});
//   TC_ASSIGN_OR_RETURN(auto session, device.OpenSession(stop));
//   TC_ASSIGN_OR_RETURN(ArrayRef x, session->Upload(input));   // a view of `input`
//   ...  as any DeviceSession
//
// A configuration runs on the backend its name gives (the resolver): the
// CPU emulation, or a device backend's own Run, whose output comes back to
// the host (a request that mixes backends runs here). Its capabilities:
// batched runs (one LinearBackend::RunBatch per backend, so the CPU
// backend runs one GEMM per arithmetic), cached comparisons, host memory.
//
// Thread safety: the device is; a session is used by one thread at a time.
// Lifetime: a tensor given to Upload must outlive the session (the session
// keeps a view of it); the resolver's backends and the executor outlive the
// device. Errors: as the host functions', CANCELLED/DEADLINE_EXCEEDED when
// the session's stop signal fires (checked at each call), INVALID_ARGUMENT
// for an array the session never made.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/executor.h"
#include "core/stop_signal.h"
#include "core/tensor.h"
#include "server/backends/device_session.h"
#include "server/backends/linear_backend.h"

namespace tensorcheck {

class HostSession;

class HostDevice final : public ComputeDevice {
 public:
  // The backend that runs a configuration of this name (NOT_FOUND when
  // none does).
  using BackendResolver = std::function<absl::StatusOr<LinearBackend*>(absl::string_view name)>;

  struct Options {
    BackendResolver resolve;
    // The statistics' executor (Compare's comes with its options); null:
    // the calling thread.
    Executor* executor = nullptr;
  };

  explicit HostDevice(Options options) : options_(std::move(options)) {}

  absl::StatusOr<std::unique_ptr<DeviceSession>> OpenSession(const StopSignal* stop) override;
  // OpenSession, as the session's own type (a wrapper's, tests' stand-in).
  std::unique_ptr<HostSession> OpenHostSession(const StopSignal* stop);

  // Nothing is kept between requests: the host has the tensors already.
  ResidentStats resident() const override { return {}; }

 private:
  const Options options_;
};

class HostSession final : public DeviceSession {
 public:
  HostSession(const HostDevice::Options* options, const StopSignal* stop)
      : options_(options), stop_(stop) {}

  absl::StatusOr<ArrayRef> Upload(const Tensor& t) override;
  absl::StatusOr<SessionRun> Run(const SessionOperands& op, const PreparedRun& prepared,
                                 const RunOptions& options) override;
  absl::Status RunBatch(const SessionOperands& op, const std::vector<PreparedRun>& runs,
                        const RunOptions& options, const SessionBatchConsumer& consume) override;
  absl::StatusOr<SessionMagnitudes> MagnitudeSums(const SessionOperands& op, bool abs_dot,
                                                  bool sq_dot, bool dot) override;
  absl::StatusOr<SessionModel> ErrorModel(const SessionModelSpec& spec) override;
  absl::StatusOr<ArrayRef> FlipGrid(const SessionFlipSpec& spec) override;
  absl::StatusOr<DiffStats> Compare(ArrayRef actual, ArrayRef expected,
                                    const SessionCompare& compare) override;
  absl::StatusOr<Tensor> Download(ArrayRef array) override;
  absl::StatusOr<bool> SameBits(ArrayRef a, ArrayRef b) override;
  absl::StatusOr<ArrayRef> NewMask(int64_t count) override;
  absl::StatusOr<int64_t> MarkConsistent(ArrayRef mask, ArrayRef observed, ArrayRef candidate,
                                         ArrayRef pair_sigma, DType compared) override;
  absl::StatusOr<rules::ScoreSums> Score(const SessionScoreSpec& spec) override;
  absl::StatusOr<std::vector<rules::ScoreSums>> ScoreAll(
      const std::vector<SessionScoreSpec>& specs) override;
  absl::StatusOr<rules::PairedSums> Paired(ArrayRef observed, ArrayRef best, ArrayRef runner,
                                           ArrayRef sigma, ArrayRef mask, DType compared) override;
  absl::StatusOr<DifferingCounts> Differing(ArrayRef a, ArrayRef b, ArrayRef mask, int64_t cols,
                                            DType compared) override;
  absl::StatusOr<rules::ErrorSums> ErrorVsReference(ArrayRef observed, ArrayRef reference,
                                                    ArrayRef sigma_vs_reference,
                                                    ArrayRef mask) override;
  absl::StatusOr<std::vector<uint8_t>> DownloadMask(ArrayRef mask) override;
  void Release(ArrayRef array) override;
  SessionCapabilities capabilities() const override {
    SessionCapabilities c;
    c.batched_runs = true;
    c.cached_comparisons = true;
    c.host_memory = true;
    return c;
  }
  SessionCounters counters() const override { return counters_; }

  // ---- For a wrapper that keeps its own books (tests' stand-in device).

  // `t` as an array the session owns.
  ArrayRef Adopt(Tensor t);
  // An array of the session; INVALID_ARGUMENT for one it never made (or
  // released).
  absl::StatusOr<const Tensor*> Get(ArrayRef a) const;

 private:
  const uint8_t* MaskData(ArrayRef mask) const;
  absl::StatusOr<const float*> Floats(ArrayRef a, const char* what) const;
  // Each element of `a` widened to double, made once per array.
  absl::StatusOr<const double*> Doubles(ArrayRef a);
  absl::StatusOr<LinearProblem> Problem(const SessionOperands& op) const;
  absl::StatusOr<SessionRun> Adopted(RunResult run);

  const HostDevice::Options* const options_;
  const StopSignal* const stop_;
  // Released arrays stay as empty slots, so that ids are never reused.
  std::vector<std::unique_ptr<Tensor>> arrays_;
  std::map<int, std::vector<double>> doubles_;
  std::map<int, std::vector<uint8_t>> masks_;
  SessionCounters counters_;
};

}  // namespace tensorcheck
