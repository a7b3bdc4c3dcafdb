// A stand-in compute device for testing the engine's device plan without a
// GPU: a LinearBackend of kind kDevice ("standin") whose ComputeDevice
// keeps a session's arrays in host memory and computes with the host's
// own functions (the CPU emulation, ComputeMagnitudeSums, the error model,
// Compare), so its results equal the host execution's bit for bit. What
// it records is the plan: what was uploaded, what came from the resident
// cache, what was downloaded, against a byte budget like a GPU's.
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
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "server/backends/cpu/cpu_backend.h"
#include "server/backends/device_session.h"
#include "server/backends/resident_cache.h"
#include "server/stats/diagnosis_passes.h"
#include "server/stats/diff_stats.h"
#include "server/stats/error_model.h"
#include "server/stats/magnitude_sums.h"

namespace tensorcheck::testing {

class StandInDevice : public ComputeDevice {
 public:
  // `budget_bytes`: what sessions and resident tensors may hold together.
  // `lanes` > 0: at most that many sessions open at once, as a GPU's lanes
  // (CudaComputeDevice): OpenSession waits for one to close, checking the
  // stop signal, and each StandInBackend::Run holds a session of its own.
  explicit StandInDevice(int64_t budget_bytes, int lanes = 0)
      : budget_(budget_bytes), lanes_(lanes), cache_(budget_bytes), cpu_(*CpuBackend::Create({})) {}

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
  mutable std::mutex mu_;
  int64_t in_use_ = 0;
  int64_t peak_ = 0;
  int64_t sessions_ = 0;
  SessionCounters last_;
};

class StandInSession : public DeviceSession {
 public:
  StandInSession(StandInDevice* device, const StopSignal* stop) : device_(device), stop_(stop) {}
  ~StandInSession() override {
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
        return Add(std::move(view), /*reserve=*/false);
      }
      return Add(t.Clone(), /*reserve=*/true);
    }
    ++counters_.uploads;
    counters_.upload_bytes += bytes;
    return Add(t.Clone(), /*reserve=*/true);
  }

  absl::StatusOr<SessionRun> Run(const SessionOperands& op, const PreparedRun& prepared,
                                 const RunOptions& options) override {
    TC_RETURN_IF_ERROR(CheckStop(stop_));
    TC_RETURN_IF_ERROR(prepared.status());
    TC_ASSIGN_OR_RETURN(LinearProblem problem, Problem(op));
    TC_ASSIGN_OR_RETURN(RunResult run, device_->cpu()->Run(problem, prepared.config(), options));
    ++counters_.runs;
    SessionRun out;
    TC_ASSIGN_OR_RETURN(out.output, Add(std::move(run.output), /*reserve=*/true));
    run.output = Tensor();
    out.run = std::move(run);
    return out;
  }

  absl::StatusOr<SessionMagnitudes> MagnitudeSums(const SessionOperands& op, bool abs_dot,
                                                  bool sq_dot, bool dot) override {
    TC_RETURN_IF_ERROR(CheckStop(stop_));
    const int64_t mn = op.m * op.n;
    SessionMagnitudes out;
    ::tensorcheck::MagnitudeSums sums;
    auto make = [&](bool wanted, ArrayRef* ref, float** data) -> absl::Status {
      if (!wanted) return absl::OkStatus();
      TC_ASSIGN_OR_RETURN(Tensor t, Tensor::Create(DType::kFloat32, {mn}));
      TC_ASSIGN_OR_RETURN(*ref, Add(std::move(t), /*reserve=*/true));
      *data = arrays_[static_cast<size_t>(ref->id)].data<float>();
      return absl::OkStatus();
    };
    TC_RETURN_IF_ERROR(make(abs_dot, &out.abs_dot, &sums.abs_dot));
    TC_RETURN_IF_ERROR(make(sq_dot, &out.sq_dot, &sums.sq_dot));
    TC_RETURN_IF_ERROR(make(dot, &out.dot, &sums.dot));
    const MagnitudeOperands operands{op.shape(), &At(op.input), &At(op.weight), stop_};
    TC_RETURN_IF_ERROR(ComputeMagnitudeSums(operands, sums));
    return out;
  }

  absl::StatusOr<SessionModel> ErrorModel(const SessionModelSpec& spec) override {
    TC_RETURN_IF_ERROR(CheckStop(stop_));
    ErrorModelInput in = ModelInputOf(spec);
    in.abs_dot = spec.abs_dot.valid() ? At(spec.abs_dot).data<float>() : nullptr;
    in.sq_dot = spec.sq_dot.valid() ? At(spec.sq_dot).data<float>() : nullptr;
    in.pre_bias = spec.pre_bias.valid() ? At(spec.pre_bias).data<float>() : nullptr;
    in.value = Doubles(spec.value);
    TC_ASSIGN_OR_RETURN(Tensor t, Tensor::Create(DType::kFloat32, {spec.count}));
    float* v = t.data<float>();
    SessionModel m;
    switch (spec.kind) {
      case SessionModelSpec::kSigma:
        m.sum_sq = PredictSigma(in, v);
        break;
      case SessionModelSpec::kPairSigma:
        m.sum_sq = PredictPairSigma(in, v);
        break;
      case SessionModelSpec::kPairAccumulation:
        PredictPairAccumulationSigma(in, v);
        break;
      case SessionModelSpec::kBound:
        HardBound(in, 1.0, v);
        break;
    }
    ++counters_.model_arrays;
    TC_ASSIGN_OR_RETURN(m.values, Add(std::move(t), /*reserve=*/true));
    return m;
  }

  absl::StatusOr<ArrayRef> FlipGrid(const SessionFlipSpec& spec) override {
    TC_RETURN_IF_ERROR(CheckStop(stop_));
    FlipGridInput in = FlipInputOf(spec);
    in.pre_bias = At(spec.pre_bias).data<float>();
    in.bias = spec.bias.valid() ? Doubles(spec.bias) : nullptr;
    TC_ASSIGN_OR_RETURN(Tensor t, Tensor::Create(DType::kFloat32, {spec.count}));
    ::tensorcheck::FlipGrid(in, t.data<float>());
    return Add(std::move(t), /*reserve=*/true);
  }

  absl::StatusOr<DiffStats> Compare(ArrayRef actual, ArrayRef expected,
                                    const SessionCompare& compare) override {
    TC_RETURN_IF_ERROR(CheckStop(stop_));
    CompareOptions options = compare.options;
    options.predicted_sigma = compare.sigma.valid() ? At(compare.sigma).data<float>() : nullptr;
    options.error_bound = compare.bound.valid() ? At(compare.bound).data<float>() : nullptr;
    ++counters_.comparisons;
    return ::tensorcheck::Compare(At(actual), At(expected), options);
  }

  absl::StatusOr<Tensor> Download(ArrayRef array) override {
    TC_RETURN_IF_ERROR(CheckStop(stop_));
    ++counters_.downloads;
    counters_.download_bytes += static_cast<int64_t>(At(array).nbytes());
    Tensor t = At(array).Clone();
    TC_RETURN_IF_ERROR(t.Reshape({t.numel()}));
    return t;
  }

  // The diagnosis's passes: stats' host passes over the session's arrays.

  absl::StatusOr<bool> SameBits(ArrayRef a, ArrayRef b) override {
    TC_RETURN_IF_ERROR(CheckStop(stop_));
    ++counters_.diagnosis_passes;
    return SameBitsPass(At(a), At(b));
  }

  absl::StatusOr<ArrayRef> NewMask(int64_t count) override {
    TC_RETURN_IF_ERROR(CheckStop(stop_));
    // Accounted as a float array of a quarter the elements; the bytes
    // themselves live in masks_.
    TC_ASSIGN_OR_RETURN(Tensor t, Tensor::Create(DType::kFloat32, {(count + 3) / 4}));
    TC_ASSIGN_OR_RETURN(ArrayRef ref, Add(std::move(t), /*reserve=*/true));
    masks_[ref.id].assign(static_cast<size_t>(count), 0);
    return ref;
  }

  absl::StatusOr<int64_t> MarkConsistent(ArrayRef mask, ArrayRef observed, ArrayRef candidate,
                                         ArrayRef pair_sigma, DType compared) override {
    TC_RETURN_IF_ERROR(CheckStop(stop_));
    ++counters_.diagnosis_passes;
    return MarkConsistentPass(At(observed), At(candidate), At(pair_sigma).data<float>(), compared,
                              &masks_.at(mask.id));
  }

  absl::StatusOr<rules::ScoreSums> Score(const SessionScoreSpec& spec) override {
    TC_RETURN_IF_ERROR(CheckStop(stop_));
    ++counters_.diagnosis_passes;
    return ScorePass({&At(spec.observed), &At(spec.candidate), At(spec.pair_sigma).data<float>(),
                      At(spec.pair_accumulation_sigma).data<float>(),
                      spec.flip_grid.valid() ? At(spec.flip_grid).data<float>() : nullptr,
                      MaskData(spec.mask), spec.compared});
  }

  absl::StatusOr<rules::PairedSums> Paired(ArrayRef observed, ArrayRef best, ArrayRef runner,
                                           ArrayRef sigma, ArrayRef mask, DType compared) override {
    TC_RETURN_IF_ERROR(CheckStop(stop_));
    ++counters_.diagnosis_passes;
    return PairedPass(At(observed), At(best), At(runner), At(sigma).data<float>(), MaskData(mask),
                      compared);
  }

  absl::StatusOr<DifferingCounts> Differing(ArrayRef a, ArrayRef b, ArrayRef mask, int64_t cols,
                                            DType compared) override {
    TC_RETURN_IF_ERROR(CheckStop(stop_));
    ++counters_.diagnosis_passes;
    return DifferingPass(At(a), At(b), MaskData(mask), cols, compared);
  }

  absl::StatusOr<rules::ErrorSums> ErrorVsReference(ArrayRef observed, ArrayRef reference,
                                                    ArrayRef sigma_vs_reference,
                                                    ArrayRef mask) override {
    TC_RETURN_IF_ERROR(CheckStop(stop_));
    ++counters_.diagnosis_passes;
    return ErrorPass(At(observed), At(reference), At(sigma_vs_reference).data<float>(),
                     MaskData(mask));
  }

  absl::StatusOr<std::vector<uint8_t>> DownloadMask(ArrayRef mask) override {
    TC_RETURN_IF_ERROR(CheckStop(stop_));
    const std::vector<uint8_t>& m = masks_.at(mask.id);
    ++counters_.downloads;
    counters_.download_bytes += static_cast<int64_t>(m.size());
    return m;
  }

  SessionCounters counters() const override { return counters_; }

 private:
  const uint8_t* MaskData(ArrayRef mask) const {
    return mask.valid() ? masks_.at(mask.id).data() : nullptr;
  }
  absl::StatusOr<ArrayRef> Add(Tensor t, bool reserve) {
    if (reserve) {
      const int64_t bytes = static_cast<int64_t>(t.nbytes());
      TC_RETURN_IF_ERROR(device_->Reserve(bytes));
      reserved_ += bytes;
    }
    arrays_.push_back(std::move(t));
    return ArrayRef{static_cast<int>(arrays_.size()) - 1};
  }
  const Tensor& At(ArrayRef a) const { return arrays_.at(static_cast<size_t>(a.id)); }
  const double* Doubles(ArrayRef a) {
    std::vector<double>& d = doubles_[a.id];
    if (d.empty()) {
      d.resize(static_cast<size_t>(At(a).numel()));
      ToDouble(At(a), d.data());
    }
    return d.data();
  }
  absl::StatusOr<LinearProblem> Problem(const SessionOperands& op) const {
    LinearProblem p;
    p.shape() = op.shape();
    p.input = &At(op.input);
    p.weight = &At(op.weight);
    p.bias = op.bias.valid() ? &At(op.bias) : nullptr;
    return p;
  }

  StandInDevice* device_;
  const StopSignal* stop_;
  std::vector<Tensor> arrays_;
  std::map<int, std::vector<double>> doubles_;
  std::map<int, std::vector<uint8_t>> masks_;
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
