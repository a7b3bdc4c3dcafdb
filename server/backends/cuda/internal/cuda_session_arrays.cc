// CudaSession (internal/cuda_session.h): a session's arrays on its lane
// (allocation under the device's budget, staged copies both ways, resident
// tensors and their forms), the error model's arrays, the flip grid and
// the comparisons. A session's calls enqueue on its lane's stream; the
// ones that return host values (a comparison's statistics, an error-model
// array's sum of squares, a download) synchronise it.
#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status_macros.h"
#include "server/backends/cuda/cuda_backends.h"
#include "server/backends/cuda/cuda_status.h"
#include "server/backends/cuda/internal/cuda_kernels.h"
#include "server/backends/cuda/internal/cuda_session.h"
#include "server/backends/cuda/internal/device_compare.h"
#include "server/backends/cuda/internal/diagnosis_kernels.h"
#include "server/backends/cuda/internal/error_model_kernels.h"
#include "server/backends/cuda/internal/gemm_call.h"
#include "server/backends/cuda/internal/gemm_plan.h"
#include "server/stats/error_model.h"

namespace tensorcheck::cuda {
namespace {

int64_t Padded(int64_t bytes) {
  return (std::max<int64_t>(bytes, 1) + kDeviceAlign - 1) / kDeviceAlign * kDeviceAlign;
}

// A resident array, the cache's payload: from the same stream-ordered pool
// as the sessions' arrays (so that one budget covers both), freed when the
// cache lets it go, which is only when no session pins it, i.e. after the
// last stream that used it has synchronised.
struct ResidentArray {
  void* data = nullptr;
  cudaEvent_t ready = nullptr;  // recorded after the copy or conversion that filled it
  // The free is enqueued on the legacy stream, which is not ordered after
  // the lane stream that filled the block: a copy that lost the insert race
  // (CudaSession::Resident) may still be filling it. Waiting for `ready`
  // first keeps the block out of the pool until that fill is done; for a
  // block the cache evicts, the fill finished long ago and this returns at
  // once.
  ~ResidentArray() {
    if (ready != nullptr) {
      (void)cudaEventSynchronize(ready);
      cudaEventDestroy(ready);
    }
    if (data != nullptr) cudaFreeAsync(data, nullptr);
  }
};

}  // namespace

CudaSession::CudaSession(CudaComputeDevice* device, CudaComputeDevice::Lane* lane,
                         const StopSignal* stop)
    : device_(device), lane_(lane), stop_(stop), stream_(lane->ctx->stream()) {}

CudaSession::~CudaSession() {
  // Stream-ordered frees: the memory returns to the pool once the work
  // queued before them is done; then the session's share of the budget.
  for (size_t i = 0; i < arrays_.size(); ++i) {
    if (arrays_[i].owned && arrays_[i].data != nullptr) cudaFreeAsync(arrays_[i].data, stream_);
  }
  // Resident tensors are unpinned only after our last use of them.
  device_->Note(ToStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize")).IgnoreError();
  arrays_.clear();
  device_->Release(reserved_);
  device_->ReleaseLane(lane_);
}

ArrayRef CudaSession::Add(Array a) {
  arrays_.push_back(std::move(a));
  padded_.push_back(0);
  return ArrayRef{static_cast<int>(arrays_.size()) - 1};
}

absl::StatusOr<const CudaSession::Array*> CudaSession::Get(ArrayRef a,
                                                           absl::string_view what) const {
  if (!a.valid() || a.id >= static_cast<int>(arrays_.size())) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": no such device array"));
  }
  return &arrays_[static_cast<size_t>(a.id)];
}

absl::StatusOr<ArrayRef> CudaSession::Allocate(DType dtype, int64_t count) {
  int64_t bytes = 0;
  if (count < 0 || __builtin_mul_overflow(count, static_cast<int64_t>(ItemSize(dtype)), &bytes)) {
    return absl::ResourceExhaustedError("device array size overflows");
  }
  const int64_t padded = Padded(bytes);
  TC_RETURN_IF_ERROR(device_->Reserve(padded));
  // Stream-ordered: no device-wide synchronisation, so other lanes keep
  // running; the pool keeps freed memory for the next request.
  void* p = nullptr;
  cudaError_t e = cudaMallocFromPoolAsync(&p, static_cast<size_t>(padded), device_->pool_, stream_);
  if (e == cudaErrorMemoryAllocation) {
    // The budget allowed it but the device is full (other processes, or
    // fragmentation): resident tensors no request uses give way, once.
    (void)cudaGetLastError();  // out of memory is not sticky
    device_->cache_.EvictUnpinned();
    // Their frees are ordered on the null stream: done once it is, and
    // then the pool may hand the memory to this stream.
    (void)cudaStreamSynchronize(nullptr);
    e = cudaMallocFromPoolAsync(&p, static_cast<size_t>(padded), device_->pool_, stream_);
  }
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    device_->Release(padded);
    return Checked(ToStatus(e, "cudaMallocFromPoolAsync"));
  }
  reserved_ += padded;
  Array a;
  a.data = p;
  a.dtype = dtype;
  a.count = count;
  a.owned = true;
  const ArrayRef ref = Add(std::move(a));
  padded_[static_cast<size_t>(ref.id)] = padded;
  return ref;
}

void CudaSession::Free(ArrayRef a) {
  Array& array = arrays_.at(static_cast<size_t>(a.id));
  if (!array.owned || array.data == nullptr) return;
  cudaFreeAsync(array.data, stream_);
  array.data = nullptr;
  const int64_t padded = padded_[static_cast<size_t>(a.id)];
  reserved_ -= padded;
  device_->Release(padded);
}

absl::Status CudaSession::StagedUpload(const void* src, void* dst, int64_t bytes) {
  const int64_t half =
      device_->options_.staging_bytes / 2 / kDeviceAlign * kDeviceAlign;  // >= kDeviceAlign
  char* staging = static_cast<char*>(lane_->staging);
  for (int64_t off = 0, chunk = 0; off < bytes; off += half, ++chunk) {
    TC_RETURN_IF_ERROR(CheckStop(stop_));
    const int b = static_cast<int>(chunk % 2);
    const int64_t n = std::min(half, bytes - off);
    // The half is free once its previous copy has run.
    TC_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(lane_->staged[b]));
    std::memcpy(staging + b * half, static_cast<const char*>(src) + off, static_cast<size_t>(n));
    TC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(static_cast<char*>(dst) + off, staging + b * half,
                                            static_cast<size_t>(n), cudaMemcpyHostToDevice,
                                            stream_));
    TC_CUDA_RETURN_IF_ERROR(cudaEventRecord(lane_->staged[b], stream_));
  }
  return absl::OkStatus();
}

absl::Status CudaSession::StagedDownload(const void* src, void* dst, int64_t bytes) {
  const int64_t half =
      device_->options_.staging_bytes / 2 / kDeviceAlign * kDeviceAlign;  // >= kDeviceAlign
  char* staging = static_cast<char*>(lane_->staging);
  const int64_t chunks = (bytes + half - 1) / half;
  auto enqueue = [&](int64_t chunk) -> absl::Status {
    const int b = static_cast<int>(chunk % 2);
    const int64_t off = chunk * half, n = std::min(half, bytes - chunk * half);
    TC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(staging + b * half, static_cast<const char*>(src) + off,
                                            static_cast<size_t>(n), cudaMemcpyDeviceToHost,
                                            stream_));
    TC_CUDA_RETURN_IF_ERROR(cudaEventRecord(lane_->staged[b], stream_));
    return absl::OkStatus();
  };
  if (chunks > 0) TC_RETURN_IF_ERROR(enqueue(0));
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    // The next half copies while this one is read out.
    if (chunk + 1 < chunks) TC_RETURN_IF_ERROR(enqueue(chunk + 1));
    const int b = static_cast<int>(chunk % 2);
    TC_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(lane_->staged[b]));
    const int64_t off = chunk * half, n = std::min(half, bytes - chunk * half);
    std::memcpy(static_cast<char*>(dst) + off, staging + b * half, static_cast<size_t>(n));
    TC_RETURN_IF_ERROR(CheckStop(stop_));
  }
  return absl::OkStatus();
}

absl::StatusOr<ArrayRef> CudaSession::Resident(const std::string& key, DType dtype, int64_t count,
                                               const Tensor* host, const std::string& content_id,
                                               const MakeForm& make, bool* hit) {
  const int64_t bytes = count * static_cast<int64_t>(ItemSize(dtype));
  Array a;
  a.dtype = dtype;
  a.count = count;
  a.host = host;
  a.content_id = content_id;
  if (std::optional<ResidentCache::Handle> h = device_->cache_.Find(key)) {
    auto* r = static_cast<ResidentArray*>(h->payload());
    // Another lane may still be filling it.
    TC_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, r->ready, 0));
    a.data = r->data;
    a.pin = std::move(h);
    *hit = true;
    return Add(std::move(a));
  }
  *hit = false;
  const int64_t padded = Padded(bytes);
  if (device_->cache_.MakeRoom(padded)) {
    auto r = std::make_shared<ResidentArray>();
    if (cudaMallocFromPoolAsync(&r->data, static_cast<size_t>(padded), device_->pool_, stream_) ==
            cudaSuccess &&
        cudaEventCreateWithFlags(&r->ready, cudaEventDisableTiming) == cudaSuccess) {
      absl::Status made = make(r->data);
      if (made.ok()) made = ToStatus(cudaEventRecord(r->ready, stream_), "cudaEventRecord");
      if (!made.ok()) {
        // `r` frees its memory on another stream: ours must be done with it.
        (void)cudaStreamSynchronize(stream_);
        return made;
      }
      void* data = r->data;
      if (std::optional<ResidentCache::Handle> h = device_->cache_.Insert(key, r, padded)) {
        auto* kept = static_cast<ResidentArray*>(h->payload());
        if (kept->data != data) {
          // Another request inserted it meanwhile: use theirs once ready.
          TC_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, kept->ready, 0));
        }
        a.data = kept->data;
        a.pin = std::move(h);
        return Add(std::move(a));
      }
      // Did not fit after all: ours goes with `r` once the copy is done.
      TC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    } else {
      (void)cudaGetLastError();
    }
  }
  // No room to keep it: the session's own copy.
  TC_ASSIGN_OR_RETURN(ArrayRef own, Allocate(dtype, count));
  Array& mine = arrays_[static_cast<size_t>(own.id)];
  mine.host = host;
  mine.content_id = content_id;
  TC_RETURN_IF_ERROR(make(mine.data));
  return own;
}

absl::StatusOr<ArrayRef> CudaSession::Upload(const Tensor& t) {
  TC_RETURN_IF_ERROR(CheckStop(stop_));
  const int64_t bytes = static_cast<int64_t>(t.nbytes());
  auto copy = [&](void* dst) { return StagedUpload(t.raw(), dst, bytes); };
  if (!t.content_id().empty()) {
    bool hit = false;
    const std::string key = absl::StrCat(t.content_id(), "|", DTypeName(t.dtype()));
    auto a = Resident(key, t.dtype(), t.numel(), &t, t.content_id(), copy, &hit);
    if (!a.ok()) return Checked(a.status());
    if (hit) {
      ++counters_.resident_hits;
      counters_.resident_hit_bytes += bytes;
    } else {
      ++counters_.uploads;
      counters_.upload_bytes += bytes;
    }
    return a;
  }
  TC_ASSIGN_OR_RETURN(ArrayRef a, Allocate(t.dtype(), t.numel()));
  arrays_[static_cast<size_t>(a.id)].host = &t;
  TC_RETURN_IF_ERROR(Checked(copy(arrays_[static_cast<size_t>(a.id)].data)));
  ++counters_.uploads;
  counters_.upload_bytes += bytes;
  return a;
}

absl::StatusOr<ArrayRef> CudaSession::Form(ArrayRef source, absl::string_view form, DType dtype,
                                           const MakeForm& make, int64_t count) {
  TC_ASSIGN_OR_RETURN(const Array* src, Get(source, "form"));
  const int64_t n = count < 0 ? src->count : count;
  const std::string local = absl::StrCat(source.id, "|", form);
  auto it = forms_.find(local);
  if (it != forms_.end()) return it->second;
  ArrayRef out;
  if (!src->content_id.empty()) {
    bool hit = false;
    const std::string key = absl::StrCat(src->content_id, "|", DTypeName(src->dtype), "|", form);
    absl::StatusOr<ArrayRef> kept = Resident(key, dtype, n, src->host, std::string(), make, &hit);
    if (!kept.ok()) return Checked(kept.status());
    out = *kept;
  } else {
    TC_ASSIGN_OR_RETURN(out, Allocate(dtype, n));
    TC_RETURN_IF_ERROR(Checked(make(data(out))));
  }
  forms_.emplace(local, out);
  return out;
}

absl::Status CudaSession::CopyToDevice(const void* src, void* dst, int64_t bytes) {
  return Checked(StagedUpload(src, dst, bytes));
}

absl::StatusOr<SessionRun> CudaSession::Run(const SessionOperands& op, const PreparedRun& prepared,
                                            const RunOptions& options) {
  return RunWithScales(op, SessionScales{}, prepared, options);
}

absl::StatusOr<SessionRun> CudaSession::RunWithScales(const SessionOperands& op,
                                                      const SessionScales& scales,
                                                      const PreparedRun& prepared,
                                                      const RunOptions& options) {
  TC_RETURN_IF_ERROR(CheckStop(stop_));
  auto run = internal::RunOnSession(*this, op, scales, prepared, options);
  if (!run.ok()) return Checked(run.status());
  ++counters_.runs;
  return run;
}

absl::StatusOr<SessionMagnitudes> CudaSession::MagnitudeSums(const SessionOperands& op,
                                                             bool abs_dot, bool sq_dot, bool dot) {
  TC_RETURN_IF_ERROR(CheckStop(stop_));
  auto sums = internal::MagnitudeSumsOnSession(*this, op, abs_dot, sq_dot, dot);
  if (!sums.ok()) return Checked(sums.status());
  return sums;
}

absl::StatusOr<SessionModel> CudaSession::ErrorModel(const SessionModelSpec& spec) {
  TC_RETURN_IF_ERROR(CheckStop(stop_));
  TC_ASSIGN_OR_RETURN(const Array* value, Get(spec.value, "error model: value"));
  ErrorModelInput in = ModelInputOf(spec);
  const float* pre_bias = nullptr;
  if (spec.pre_bias.valid()) {
    TC_ASSIGN_OR_RETURN(const Array* p, Get(spec.pre_bias, "error model: pre_bias"));
    pre_bias = static_cast<const float*>(p->data);
    // A device pointer: the constants only ask whether it is there.
    in.pre_bias = pre_bias;
  }
  TC_ASSIGN_OR_RETURN(ArrayRef out, Allocate(DType::kFloat32, spec.count));
  float* values = static_cast<float*>(data(out));
  SessionModel model;
  model.values = out;
  if (spec.kind == SessionModelSpec::kBound) {
    TC_ASSIGN_OR_RETURN(const Array* abs, Get(spec.abs_dot, "error model: abs_dot"));
    DeviceBoundArgs a;
    a.c = BoundConstantsOf(in, /*c=*/1.0);  // Compare applies bound_factor
    a.abs_dot = static_cast<const float*>(abs->data);
    a.value = value->data;
    a.value_type = ToElem(value->dtype);
    a.pre_bias = pre_bias;
    a.bound = values;
    a.count = spec.count;
    TC_RETURN_IF_ERROR(Checked(ToStatus(LaunchHardBound(a, stream_), "LaunchHardBound")));
  } else {
    TC_ASSIGN_OR_RETURN(const Array* sq, Get(spec.sq_dot, "error model: sq_dot"));
    TC_ASSIGN_OR_RETURN(ArrayRef sum_ref, Allocate(DType::kFloat64, 1));
    double* sum = static_cast<double*>(arrays_[static_cast<size_t>(sum_ref.id)].data);
    const SigmaKind kind = spec.kind == SessionModelSpec::kSigma ? SigmaKind::kSingle
                           : spec.kind == SessionModelSpec::kPairSigma
                               ? SigmaKind::kPair
                               : SigmaKind::kPairAccumulation;
    DeviceSigmaArgs a;
    a.c = SigmaConstantsOf(in, kind);
    a.sq_dot = static_cast<const float*>(sq->data);
    a.value = value->data;
    a.value_type = ToElem(value->dtype);
    a.pre_bias = pre_bias;
    a.sigma = values;
    a.count = spec.count;
    a.sum_sq = spec.kind == SessionModelSpec::kPairAccumulation ? nullptr : sum;
    TC_RETURN_IF_ERROR(Checked(ToStatus(LaunchPredictSigma(a, stream_), "LaunchPredictSigma")));
    if (a.sum_sq != nullptr) {
      double host_sum = 0;
      TC_RETURN_IF_ERROR(Checked(
          ToStatus(cudaMemcpyAsync(&host_sum, sum, sizeof(double), cudaMemcpyDeviceToHost, stream_),
                   "cudaMemcpyAsync")));
      TC_RETURN_IF_ERROR(
          Checked(ToStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize")));
      model.sum_sq = host_sum;
    }
    Free(sum_ref);
  }
  ++counters_.model_arrays;
  return model;
}

absl::StatusOr<ArrayRef> CudaSession::FlipGrid(const SessionFlipSpec& spec) {
  TC_RETURN_IF_ERROR(CheckStop(stop_));
  TC_ASSIGN_OR_RETURN(const Array* pre, Get(spec.pre_bias, "flip grid: pre_bias"));
  const double* bias = nullptr;
  if (spec.bias.valid()) {
    TC_ASSIGN_OR_RETURN(const Array* b, Get(spec.bias, "flip grid: bias"));
    const void* b_data = b->data;
    const DType b_type = b->dtype;
    const int64_t n = b->count;
    TC_ASSIGN_OR_RETURN(
        ArrayRef wide, Form(spec.bias, "float64", DType::kFloat64, [&](void* dst) {
          return ToStatus(LaunchConvert(b_data, ToElem(b_type), dst, ElemType::kF64, n, stream_),
                          "LaunchConvert");
        }));
    bias = static_cast<const double*>(data(wide));
  }
  TC_ASSIGN_OR_RETURN(ArrayRef out, Allocate(DType::kFloat32, spec.count));
  DeviceFlipGridArgs a;
  a.c = FlipConstantsOf(FlipInputOf(spec));
  a.pre_bias = static_cast<const float*>(pre->data);
  a.bias = bias;
  a.cols = bias != nullptr ? spec.cols : 0;
  a.grid = static_cast<float*>(data(out));
  a.count = spec.count;
  TC_RETURN_IF_ERROR(Checked(ToStatus(LaunchFlipGrid(a, stream_), "LaunchFlipGrid")));
  ++counters_.model_arrays;
  return out;
}

absl::StatusOr<DiffStats> CudaSession::Compare(ArrayRef actual, ArrayRef expected,
                                               const SessionCompare& compare) {
  TC_RETURN_IF_ERROR(CheckStop(stop_));
  TC_ASSIGN_OR_RETURN(const Array* a, Get(actual, "compare: actual"));
  TC_ASSIGN_OR_RETURN(const Array* e, Get(expected, "compare: expected"));
  // The error-model arrays are the device's: DeviceCompare hands them to
  // the kernels and never reads them on the host.
  CompareOptions options = compare.options;
  options.predicted_sigma =
      compare.sigma.valid() ? static_cast<const float*>(data(compare.sigma)) : nullptr;
  options.error_bound =
      compare.bound.valid() ? static_cast<const float*>(data(compare.bound)) : nullptr;
  TC_RETURN_IF_ERROR(ValidateCompare(a->count, e->count, options));
  DeviceCompare cmp(a->count, options);
  TC_ASSIGN_OR_RETURN(ArrayRef scratch, Allocate(DType::kFloat32, (cmp.bytes() + 3) / 4));
  char* memory = static_cast<char*>(data(scratch));
  TC_RETURN_IF_ERROR(Checked(
      cmp.Enqueue({a->data, a->dtype, a->count}, {e->data, e->dtype, e->count}, memory, stream_)));
  TC_RETURN_IF_ERROR(Checked(ToStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize")));
  auto stats = cmp.Finish();
  Free(scratch);
  if (!stats.ok()) return Checked(stats.status());
  ++counters_.comparisons;
  return stats;
}

absl::StatusOr<Tensor> CudaSession::Download(ArrayRef array) {
  TC_RETURN_IF_ERROR(CheckStop(stop_));
  TC_ASSIGN_OR_RETURN(const Array* a, Get(array, "download"));
  TC_ASSIGN_OR_RETURN(Tensor t, Tensor::Create(a->dtype, {a->count}));
  TC_RETURN_IF_ERROR(Checked(StagedDownload(a->data, t.raw(), static_cast<int64_t>(t.nbytes()))));
  ++counters_.downloads;
  counters_.download_bytes += static_cast<int64_t>(t.nbytes());
  return t;
}

// ---- a diagnosis's passes

}  // namespace tensorcheck::cuda
