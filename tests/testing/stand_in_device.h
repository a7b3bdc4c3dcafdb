// A stand-in compute device for testing the engine's device plan without a
// GPU: a LinearBackend of kind kDevice ("standin") whose ComputeDevice is
// the production host session (server/backends/cpu/host_device.h) with
// the books of a device kept around it, so its results equal the host's
// bit for bit. What it records is the plan: what was uploaded, what came
// from the resident cache, what was downloaded, against a byte budget like
// a GPU's. Like a GPU's session it has no capabilities beyond every
// session's: each configuration runs and is compared on its own.
//
//   BackendRegistry registry;
//   auto device = std::make_shared<testing::StandInDevice>(/*budget_bytes=*/64 << 20);
//   registry.Register(std::make_unique<testing::StandInBackend>(device));
//   ... engine->Verify(request) ...
//   device->resident().hits, device->last_counters().uploads
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "server/backends/cpu/cpu_backend.h"
#include "server/backends/cpu/host_device.h"
#include "server/backends/device_session.h"
#include "server/backends/resident_cache.h"
#include "server/stats/diff_stats.h"

namespace tensorcheck::testing {

class StandInDevice : public ComputeDevice {
 public:
  // `budget_bytes`: what sessions and resident tensors may hold together.
  // `lanes` > 0: at most that many sessions open at once, as a GPU's lanes
  // (CudaComputeDevice): OpenSession waits for one to close, checking the
  // stop signal, and each StandInBackend::Run holds a session of its own.
  explicit StandInDevice(int64_t budget_bytes, int lanes = 0)
      : budget_(budget_bytes),
        lanes_(lanes),
        cache_(budget_bytes),
        cpu_(*CpuBackend::Create({})),
        host_(HostDevice::Options{
            [this](absl::string_view) -> absl::StatusOr<LinearBackend*> { return cpu_.get(); },
            nullptr}) {}

  absl::StatusOr<std::unique_ptr<DeviceSession>> OpenSession(const StopSignal* stop) override;

  ResidentStats resident() const override { return cache_.stats(); }

  // The counters of the last session closed.
  SessionCounters last_counters() const {
    std::lock_guard<std::mutex> lock(mu_);
    return last_;
  }
  int64_t sessions() const {
    std::lock_guard<std::mutex> lock(mu_);
    return sessions_;
  }
  int64_t in_use_bytes() const {
    std::lock_guard<std::mutex> lock(mu_);
    return in_use_;
  }
  // The most that sessions held at once, resident tensors not counted.
  int64_t peak_in_use_bytes() const {
    std::lock_guard<std::mutex> lock(mu_);
    return peak_;
  }

  CpuBackend* cpu() { return cpu_.get(); }
  int lanes() const { return lanes_; }

 private:
  friend class StandInSession;

  // A session's array memory: RESOURCE_EXHAUSTED when it and the resident
  // tensors would pass the budget after evicting unpinned ones.
  absl::Status Reserve(int64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    cache_.SetCapacity(budget_ - in_use_ - bytes);
    if (in_use_ + bytes + cache_.stats().bytes > budget_) {
      cache_.SetCapacity(budget_ - in_use_);
      return absl::ResourceExhaustedError(absl::StrCat(
          "device memory: ", bytes, " bytes more would pass the budget of ", budget_, " bytes"));
    }
    in_use_ += bytes;
    peak_ = std::max(peak_, in_use_);
    cache_.SetCapacity(budget_ - in_use_);
    return absl::OkStatus();
  }
  void Release(int64_t bytes, const SessionCounters& counters) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      in_use_ -= bytes;
      cache_.SetCapacity(budget_ - in_use_);
      last_ = counters;
      --open_;
    }
    lane_free_.notify_one();
  }

  const int64_t budget_;
  const int lanes_;
  std::condition_variable lane_free_;
  int open_ = 0;  // sessions open now
  ResidentCache cache_;
  std::unique_ptr<CpuBackend> cpu_;
  // Runs every configuration on cpu_ (whatever backend it names).
  HostDevice host_;
  mutable std::mutex mu_;
  int64_t in_use_ = 0;
  int64_t peak_ = 0;
  int64_t sessions_ = 0;
  SessionCounters last_;
};

class StandInSession : public DeviceSession {
 public:
  StandInSession(StandInDevice* device, const StopSignal* stop)
      : device_(device), stop_(stop), host_(device->host_.OpenHostSession(stop)) {}
  ~StandInSession() override {
    host_.reset();
    handles_.clear();  // unpins before the budget is given back
    device_->Release(reserved_, counters_);
  }

  absl::StatusOr<ArrayRef> Upload(const Tensor& t) override {
    TC_RETURN_IF_ERROR(CheckStop(stop_));
    const int64_t bytes = static_cast<int64_t>(t.nbytes());
    if (!t.content_id().empty()) {
      const std::string key = absl::StrCat(t.content_id(), "|", DTypeName(t.dtype()));
      std::optional<ResidentCache::Handle> h = device_->cache_.Find(key);
      if (h) {
        ++counters_.resident_hits;
        counters_.resident_hit_bytes += bytes;
      } else {
        ++counters_.uploads;
        counters_.upload_bytes += bytes;
        if (device_->cache_.MakeRoom(bytes)) {
          h = device_->cache_.Insert(key, std::make_shared<Tensor>(t.Clone()), bytes);
        }
      }
      if (h) {
        // A view of the resident copy, pinned for the session.
        const auto* resident = static_cast<const Tensor*>(h->payload());
        TC_ASSIGN_OR_RETURN(Tensor view,
                            Tensor::Borrow(resident->dtype(), t.shape(), resident->raw(),
                                           resident->nbytes(), nullptr));
        handles_.push_back(*std::move(h));
        return host_->Adopt(std::move(view));
      }
      TC_RETURN_IF_ERROR(Reserve(bytes));
      return host_->Upload(t);
    }
    ++counters_.uploads;
    counters_.upload_bytes += bytes;
    TC_RETURN_IF_ERROR(Reserve(bytes));
    return host_->Upload(t);
  }

  absl::StatusOr<SessionRun> Run(const SessionOperands& op, const PreparedRun& prepared,
                                 const RunOptions& options) override {
    TC_RETURN_IF_ERROR(CheckStop(stop_));
    TC_ASSIGN_OR_RETURN(SessionRun run, host_->Run(op, prepared, options));
    ++counters_.runs;
    TC_RETURN_IF_ERROR(ReserveArray(run.output));
    return run;
  }

  absl::StatusOr<SessionMagnitudes> MagnitudeSums(const SessionOperands& op, bool abs_dot,
                                                  bool sq_dot, bool dot) override {
    TC_RETURN_IF_ERROR(CheckStop(stop_));
    TC_ASSIGN_OR_RETURN(SessionMagnitudes out, host_->MagnitudeSums(op, abs_dot, sq_dot, dot));
    for (ArrayRef a : {out.abs_dot, out.sq_dot, out.dot}) TC_RETURN_IF_ERROR(ReserveArray(a));
    return out;
  }

  absl::StatusOr<SessionModel> ErrorModel(const SessionModelSpec& spec) override {
    TC_RETURN_IF_ERROR(CheckStop(stop_));
    TC_ASSIGN_OR_RETURN(SessionModel m, host_->ErrorModel(spec));
    ++counters_.model_arrays;
    TC_RETURN_IF_ERROR(ReserveArray(m.values));
    return m;
  }

  absl::StatusOr<ArrayRef> FlipGrid(const SessionFlipSpec& spec) override {
    TC_RETURN_IF_ERROR(CheckStop(stop_));
    TC_ASSIGN_OR_RETURN(ArrayRef grid, host_->FlipGrid(spec));
    TC_RETURN_IF_ERROR(ReserveArray(grid));
    return grid;
  }

  absl::StatusOr<DiffStats> Compare(ArrayRef actual, ArrayRef expected,
                                    const SessionCompare& compare) override {
    TC_RETURN_IF_ERROR(CheckStop(stop_));
    ++counters_.comparisons;
    return host_->Compare(actual, expected, compare);
  }

  absl::StatusOr<Tensor> Download(ArrayRef array) override {
    TC_ASSIGN_OR_RETURN(Tensor t, host_->Download(array));
    ++counters_.downloads;
    counters_.download_bytes += static_cast<int64_t>(t.nbytes());
    return t;
  }

  // The diagnosis's passes: the host session's, counted.

  absl::StatusOr<bool> SameBits(ArrayRef a, ArrayRef b) override {
    ++counters_.diagnosis_passes;
    return host_->SameBits(a, b);
  }

  absl::StatusOr<ArrayRef> NewMask(int64_t count) override {
    TC_RETURN_IF_ERROR(CheckStop(stop_));
    // Accounted as a float array of a quarter the elements.
    TC_RETURN_IF_ERROR(Reserve((count + 3) / 4 * 4));
    return host_->NewMask(count);
  }

  absl::StatusOr<int64_t> MarkConsistent(ArrayRef mask, ArrayRef observed, ArrayRef candidate,
                                         ArrayRef pair_sigma, DType compared) override {
    ++counters_.diagnosis_passes;
    return host_->MarkConsistent(mask, observed, candidate, pair_sigma, compared);
  }

  absl::StatusOr<rules::ScoreSums> Score(const SessionScoreSpec& spec) override {
    ++counters_.diagnosis_passes;
    return host_->Score(spec);
  }

  absl::StatusOr<rules::PairedSums> Paired(ArrayRef observed, ArrayRef best, ArrayRef runner,
                                           ArrayRef sigma, ArrayRef mask, DType compared) override {
    ++counters_.diagnosis_passes;
    return host_->Paired(observed, best, runner, sigma, mask, compared);
  }

  absl::StatusOr<DifferingCounts> Differing(ArrayRef a, ArrayRef b, ArrayRef mask, int64_t cols,
                                            DType compared) override {
    ++counters_.diagnosis_passes;
    return host_->Differing(a, b, mask, cols, compared);
  }

  absl::StatusOr<rules::ErrorSums> ErrorVsReference(ArrayRef observed, ArrayRef reference,
                                                    ArrayRef sigma_vs_reference,
                                                    ArrayRef mask) override {
    ++counters_.diagnosis_passes;
    return host_->ErrorVsReference(observed, reference, sigma_vs_reference, mask);
  }

  absl::StatusOr<std::vector<uint8_t>> DownloadMask(ArrayRef mask) override {
    TC_ASSIGN_OR_RETURN(std::vector<uint8_t> m, host_->DownloadMask(mask));
    ++counters_.downloads;
    counters_.download_bytes += static_cast<int64_t>(m.size());
    return m;
  }

  // Capabilities: none beyond every session's, as a GPU's (each
  // configuration runs and is compared on its own); arrays kept until the
  // session ends.
  SessionCounters counters() const override { return counters_; }

 private:
  absl::Status Reserve(int64_t bytes) {
    TC_RETURN_IF_ERROR(device_->Reserve(bytes));
    reserved_ += bytes;
    return absl::OkStatus();
  }
  // A new array of the host session, counted against the budget.
  absl::Status ReserveArray(ArrayRef a) {
    if (!a.valid()) return absl::OkStatus();
    TC_ASSIGN_OR_RETURN(const Tensor* t, host_->Get(a));
    return Reserve(static_cast<int64_t>(t->nbytes()));
  }

  StandInDevice* device_;
  const StopSignal* stop_;
  std::unique_ptr<HostSession> host_;
  std::vector<ResidentCache::Handle> handles_;
  int64_t reserved_ = 0;
  SessionCounters counters_;
};

inline absl::StatusOr<std::unique_ptr<DeviceSession>> StandInDevice::OpenSession(
    const StopSignal* stop) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    // Waits in slices, as CudaComputeDevice::AcquireLane does, so that a
    // stopped request stops waiting.
    while (lanes_ > 0 && open_ >= lanes_) {
      lane_free_.wait_for(lock, std::chrono::milliseconds(20));
      TC_RETURN_IF_ERROR(CheckStop(stop));
    }
    ++open_;
    ++sessions_;
  }
  return std::unique_ptr<DeviceSession>(new StandInSession(this, stop));
}

// The backend on the stand-in device: every precision and bias mode of
// the CPU emulation, of kind kDevice.
class StandInBackend : public LinearBackend {
 public:
  explicit StandInBackend(std::shared_ptr<StandInDevice> device, std::string name = "standin")
      : device_(std::move(device)), name_(std::move(name)) {}
  absl::string_view name() const override { return name_; }
  BackendKind kind() const override { return BackendKind::kDevice; }
  absl::Status Available() const override { return absl::OkStatus(); }
  std::vector<Precision> precisions() const override { return device_->cpu()->precisions(); }
  std::vector<BiasMode> bias_modes() const override { return device_->cpu()->bias_modes(); }
  BiasMode default_bias_mode() const override { return BiasMode::kFused; }
  std::vector<DType> storage_dtypes() const override { return device_->cpu()->storage_dtypes(); }
  ComputeDevice* compute_device() override { return device_.get(); }
  absl::StatusOr<RunResult> Run(const LinearProblem& problem, const Config& config,
                                const RunOptions& options) override {
    // A run outside a request's session holds a lane of its own, as the
    // CUDA backends' runs do.
    std::unique_ptr<DeviceSession> lane;
    if (device_->lanes() > 0) {
      TC_ASSIGN_OR_RETURN(lane, device_->OpenSession(options.stop));
    }
    return device_->cpu()->Run(problem, config, options);
  }

 private:
  std::shared_ptr<StandInDevice> device_;
  std::string name_;
};

}  // namespace tensorcheck::testing
