// CudaComputeDevice and its sessions (cuda_device.h). A session's calls
// enqueue on its lane's stream; the ones that return host values (a
// comparison's statistics, an error-model array's sum of squares, a
// diagnosis pass's sums, a download) synchronise it.
#include "server/backends/cuda/cuda_device.h"

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
#include "server/backends/cuda/cuda_backends.h"
#include "server/backends/cuda/cuda_kernels.h"
#include "server/backends/cuda/cuda_status.h"
#include "server/backends/cuda/device_compare.h"
#include "server/backends/cuda/diagnosis_kernels.h"
#include "server/backends/cuda/error_model_kernels.h"
#include "server/backends/cuda/internal/cuda_session.h"
#include "server/backends/cuda/internal/gemm_call.h"
#include "server/backends/cuda/internal/gemm_plan.h"
#include "core/status_macros.h"
#include "server/stats/error_model.h"

namespace tensorcheck::cuda {
namespace {

constexpr int64_t kAlign = 256;

int64_t Padded(int64_t bytes) {
  return (std::max<int64_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
}

}  // namespace

// A memory budget and what is drawn on it: the session arrays and lane
// workspaces of its devices (in_use) and their resident tensors (each
// device's cache). A device with its own budget has its own account;
// devices that take the default share one, so that two of them in one
// process (two registries, as tests make) budget one GPU's memory once.
struct MemoryAccount {
  int64_t budget = 0;
  std::mutex mu;
  int64_t in_use = 0;
  std::vector<const ResidentCache*> caches;

  // Resident bytes of the devices other than the one whose cache is `self`.
  int64_t OthersCached(const ResidentCache* self) const {
    int64_t bytes = 0;
    for (const ResidentCache* c : caches) {
      if (c != self) bytes += c->stats().bytes;
    }
    return bytes;
  }
};

namespace {

std::mutex& DefaultAccountMu() {
  static std::mutex mu;
  return mu;
}
// The default-budget devices' account while one of them lives.
std::weak_ptr<MemoryAccount>& DefaultAccount() {
  static std::weak_ptr<MemoryAccount> account;
  return account;
}

// The stream-ordered pool every device of this process allocates its
// arrays from: its own, so that the process's default pool and its settings
// stay the other code's. It keeps what is freed for the next request
// instead of returning it to the driver at every synchronisation (the
// devices' budgets bound what is allocated). Made once and never destroyed:
// a device's resident arrays are freed after its destructor has run, and a
// pool destroyed with allocations still out crashed the next device's first
// allocation on an H200 (docs/gpu-validation.md, 2026-12-04).
absl::StatusOr<cudaMemPool_t> ProcessPool() {
  static std::mutex mu;
  static cudaMemPool_t pool = nullptr;
  std::lock_guard<std::mutex> lock(mu);
  if (pool != nullptr) return pool;
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = 0;
  cudaMemPool_t made = nullptr;
  TC_CUDA_RETURN_IF_ERROR(cudaMemPoolCreate(&made, &props));
  uint64_t keep_all = std::numeric_limits<uint64_t>::max();
  const cudaError_t set = cudaMemPoolSetAttribute(made, cudaMemPoolAttrReleaseThreshold, &keep_all);
  if (set != cudaSuccess) {
    cudaMemPoolDestroy(made);
    return ToStatus(set, "cudaMemPoolSetAttribute");
  }
  pool = made;
  return pool;
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

// ---- the device

CudaComputeDevice::CudaComputeDevice(const Options& options, const DeviceProbe& probe)
    : options_(options), probe_(probe), cache_(0) {}

CudaComputeDevice::~CudaComputeDevice() {
  for (std::unique_ptr<Lane>& lane : lanes_) {
    if (lane->ctx != nullptr && health().ok()) cudaStreamSynchronize(lane->ctx->stream());
    for (cudaEvent_t e : lane->staged) {
      if (e != nullptr) cudaEventDestroy(e);
    }
    if (lane->staging != nullptr) cudaFreeHost(lane->staging);
  }
  if (account_ != nullptr) {
    std::lock_guard<std::mutex> lock(account_->mu);
    account_->in_use -= workspaces_;
    auto& caches = account_->caches;
    caches.erase(std::remove(caches.begin(), caches.end(), &cache_), caches.end());
  }
}

absl::StatusOr<std::unique_ptr<CudaComputeDevice>> CudaComputeDevice::Create(
    const Options& options, const DeviceProbe& probe) {
  if (!probe.available.ok()) return probe.available;
  if (options.memory_budget_bytes < 0 || options.workspace_bytes < 0 || options.lanes < 1 ||
      options.staging_bytes < 2 * kAlign) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GPU memory budget and cuBLASLt workspace must be >= 0, lanes >= 1 and staging >= ",
        2 * kAlign, " bytes; got ", options.memory_budget_bytes, ", ", options.workspace_bytes,
        ", ", options.lanes, ", ", options.staging_bytes));
  }
  std::unique_ptr<CudaComputeDevice> device(new CudaComputeDevice(options, probe));
  TC_CUDA_RETURN_IF_ERROR(cudaSetDevice(0));
  if (options.memory_budget_bytes > 0) {
    device->account_ = std::make_shared<MemoryAccount>();
    device->account_->budget = options.memory_budget_bytes;
  } else {
    std::lock_guard<std::mutex> lock(DefaultAccountMu());
    device->account_ = DefaultAccount().lock();
    if (device->account_ == nullptr) {
      size_t free_bytes = 0, total_bytes = 0;
      TC_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
      device->account_ = std::make_shared<MemoryAccount>();
      device->account_->budget = static_cast<int64_t>(static_cast<double>(free_bytes) * 0.9);
      DefaultAccount() = device->account_;
    }
  }
  MemoryAccount& account = *device->account_;
  const int64_t workspaces = options.workspace_bytes * options.lanes;
  {
    std::lock_guard<std::mutex> lock(account.mu);
    if (account.in_use + workspaces >= account.budget) {
      return absl::ResourceExhaustedError(
          absl::StrCat(options.lanes, " lanes' cuBLAS workspaces (", workspaces,
                       " bytes) do not fit the GPU memory budget of ", account.budget, " bytes (",
                       account.in_use, " already drawn by this process's devices)"));
    }
    account.in_use += workspaces;
    device->workspaces_ = workspaces;
    account.caches.push_back(&device->cache_);
    device->cache_.SetCapacity(account.budget - account.in_use -
                               account.OthersCached(&device->cache_));
  }
  TC_ASSIGN_OR_RETURN(device->pool_, ProcessPool());
  CudaContext::Options ctx_options;
  ctx_options.workspace_bytes = options.workspace_bytes;
  for (int i = 0; i < options.lanes; ++i) {
    auto lane = std::make_unique<Lane>();
    TC_ASSIGN_OR_RETURN(lane->ctx, CudaContext::Create(ctx_options, probe));
    TC_CUDA_RETURN_IF_ERROR(cudaHostAlloc(
        &lane->staging, static_cast<size_t>(options.staging_bytes), cudaHostAllocDefault));
    for (cudaEvent_t& e : lane->staged) {
      TC_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
    device->lanes_.push_back(std::move(lane));
  }
  return device;
}

absl::Status CudaComputeDevice::health() const {
  std::lock_guard<std::mutex> lock(health_mu_);
  return sticky_;
}

absl::Status CudaComputeDevice::Note(absl::Status s) {
  if (IsStickyCudaError(s)) {
    std::lock_guard<std::mutex> lock(health_mu_);
    if (sticky_.ok()) sticky_ = s;
  }
  return s;
}

absl::StatusOr<CudaComputeDevice::Lane*> CudaComputeDevice::AcquireLane(const StopSignal* stop) {
  std::unique_lock<std::mutex> lock(lanes_mu_);
  while (true) {
    for (std::unique_ptr<Lane>& lane : lanes_) {
      if (!lane->busy) {
        lane->busy = true;
        return lane.get();
      }
    }
    // Waits in slices so that a stopped request stops waiting too.
    lane_free_.wait_for(lock, std::chrono::milliseconds(20));
    TC_RETURN_IF_ERROR(CheckStop(stop));
  }
}

void CudaComputeDevice::ReleaseLane(Lane* lane) {
  {
    std::lock_guard<std::mutex> lock(lanes_mu_);
    lane->busy = false;
  }
  lane_free_.notify_one();
}

absl::Status CudaComputeDevice::Reserve(int64_t bytes) {
  MemoryAccount& a = *account_;
  std::lock_guard<std::mutex> lock(a.mu);
  const int64_t others = a.OthersCached(&cache_);
  if (bytes < 0 || a.in_use + others + bytes > a.budget) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "GPU memory: ", bytes, " bytes more would pass the budget (--gpu-memory-budget-mb) of ",
        a.budget, " bytes (", a.in_use, " in use by running requests)"));
  }
  // Resident tensors no request is using give way first.
  cache_.SetCapacity(a.budget - a.in_use - others - bytes);
  if (a.in_use + others + bytes + cache_.stats().bytes > a.budget) {
    cache_.SetCapacity(a.budget - a.in_use - others);
    return absl::ResourceExhaustedError(absl::StrCat(
        "GPU memory: ", bytes, " bytes more would pass the budget of ", a.budget,
        " bytes; resident tensors in use by running requests hold ", cache_.stats().bytes));
  }
  a.in_use += bytes;
  return absl::OkStatus();
}

ComputeDevice::Memory CudaComputeDevice::memory() const {
  std::lock_guard<std::mutex> lock(account_->mu);
  return {account_->in_use + account_->OthersCached(&cache_) + cache_.stats().bytes,
          account_->budget};
}

int64_t CudaComputeDevice::budget_bytes() const { return account_->budget; }

void CudaComputeDevice::Release(int64_t bytes) {
  MemoryAccount& a = *account_;
  std::lock_guard<std::mutex> lock(a.mu);
  a.in_use -= bytes;
  cache_.SetCapacity(a.budget - a.in_use - a.OthersCached(&cache_));
}

// ---- a session

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

absl::StatusOr<std::unique_ptr<CudaSession>> CudaComputeDevice::OpenCudaSession(
    const StopSignal* stop) {
  TC_RETURN_IF_ERROR(health());
  TC_ASSIGN_OR_RETURN(Lane * lane, AcquireLane(stop));
  const absl::Status set = ToStatus(cudaSetDevice(0), "cudaSetDevice");
  if (!set.ok()) {
    ReleaseLane(lane);
    return Note(set);
  }
  return std::unique_ptr<CudaSession>(new CudaSession(this, lane, stop));
}

absl::StatusOr<std::unique_ptr<DeviceSession>> CudaComputeDevice::OpenSession(
    const StopSignal* stop) {
  TC_ASSIGN_OR_RETURN(std::unique_ptr<CudaSession> session, OpenCudaSession(stop));
  return std::unique_ptr<DeviceSession>(std::move(session));
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
  const int64_t half = device_->options_.staging_bytes / 2 / kAlign * kAlign;  // >= kAlign
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
  const int64_t half = device_->options_.staging_bytes / 2 / kAlign * kAlign;  // >= kAlign
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

absl::StatusOr<SessionRun> CudaSession::Run(const SessionOperands& op, const Config& config,
                                            const RunOptions& options) {
  return RunWithScales(op, SessionScales{}, config, options);
}

absl::StatusOr<SessionRun> CudaSession::RunWithScales(const SessionOperands& op,
                                                      const SessionScales& scales,
                                                      const Config& config,
                                                      const RunOptions& options) {
  TC_RETURN_IF_ERROR(CheckStop(stop_));
  auto run = internal::RunOnSession(*this, op, scales, config, options);
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

namespace {

bool KnownDType(DType d) {
  return std::find(std::begin(kWideDTypes), std::end(kWideDTypes), d) != std::end(kWideDTypes);
}

absl::Status CheckCompared(DType compared, absl::string_view what) {
  if (KnownDType(compared)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": compared dtype ", static_cast<int>(compared), " is not one of ours"));
}

// An array of values for a pass: a session array, not freed, not a mask,
// of `count` elements (any count where `count` < 0) and of float32 where
// `float32` (the error-model arrays and the flip grid, which the kernels
// read as float).
absl::StatusOr<const CudaSession::Array*> PassArray(const CudaSession& session, ArrayRef ref,
                                                    absl::string_view what, int64_t count,
                                                    bool float32) {
  TC_ASSIGN_OR_RETURN(const CudaSession::Array* a, session.Get(ref, what));
  if (a->data == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": the device array was freed"));
  }
  if (a->mask_count >= 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": a mask, not an array of values"));
  }
  if (count >= 0 && a->count != count) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", a->count, " elements where ", count, " are expected"));
  }
  if (float32 && a->dtype != DType::kFloat32) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", DTypeName(a->dtype), " where float32 is expected"));
  }
  return a;
}

// A mask of the session (NewMask), not freed, of `count` elements.
absl::StatusOr<const CudaSession::Array*> PassMask(const CudaSession& session, ArrayRef ref,
                                                   absl::string_view what, int64_t count) {
  TC_ASSIGN_OR_RETURN(const CudaSession::Array* m, session.Get(ref, what));
  if (m->data == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": the device array was freed"));
  }
  if (m->mask_count < 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": not a mask (NewMask)"));
  }
  if (count >= 0 && m->mask_count != count) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": a mask of ", m->mask_count,
                                                   " elements where ", count, " are expected"));
  }
  return m;
}

// A nullable mask's bytes: null (every element) where `ref` is invalid.
absl::StatusOr<const uint8_t*> OptionalMask(const CudaSession& session, ArrayRef ref,
                                            absl::string_view what, int64_t count) {
  if (!ref.valid()) return nullptr;
  TC_ASSIGN_OR_RETURN(const CudaSession::Array* m, PassMask(session, ref, what, count));
  return static_cast<const uint8_t*>(m->data);
}

DeviceValues ValuesOf(const CudaSession::Array& a) { return {a.data, ToElem(a.dtype)}; }

// A reducing pass over `count` elements: `launch(partials)` enqueues it
// with DiagnosisBlocks(count) partial sums in a session array; they come
// back to the host and are merged there in block order with `merge`, so
// the result is the same on every run.
template <typename Sums, typename Launch, typename Merge>
absl::StatusOr<Sums> ReduceOnDevice(CudaSession& session, int64_t count, const char* name,
                                    const Launch& launch, const Merge& merge) {
  Sums total{};
  const int blocks = DiagnosisBlocks(count);
  if (blocks == 0) return total;
  const int64_t bytes = static_cast<int64_t>(sizeof(Sums)) * blocks;
  TC_ASSIGN_OR_RETURN(ArrayRef ref, session.Allocate(DType::kFloat64, (bytes + 7) / 8));
  Sums* partials = static_cast<Sums*>(session.data(ref));
  std::vector<Sums> host(static_cast<size_t>(blocks));
  absl::Status status = session.Checked(ToStatus(launch(partials), name));
  if (status.ok()) {
    status =
        session.Checked(ToStatus(cudaMemcpyAsync(host.data(), partials, static_cast<size_t>(bytes),
                                                 cudaMemcpyDeviceToHost, session.stream()),
                                 "cudaMemcpyAsync"));
  }
  if (status.ok()) {
    status =
        session.Checked(ToStatus(cudaStreamSynchronize(session.stream()), "cudaStreamSynchronize"));
  }
  session.Free(ref);
  TC_RETURN_IF_ERROR(status);
  for (const Sums& part : host) merge(total, part);
  return total;
}

void AddCount(int64_t& into, const int64_t& part) { into += part; }

}  // namespace

absl::StatusOr<bool> CudaSession::SameBits(ArrayRef a, ArrayRef b) {
  TC_RETURN_IF_ERROR(CheckStop(stop_));
  TC_ASSIGN_OR_RETURN(const Array* x, PassArray(*this, a, "same bits: a", -1, false));
  TC_ASSIGN_OR_RETURN(const Array* y, PassArray(*this, b, "same bits: b", -1, false));
  bool same = false;
  if (x->dtype == y->dtype && x->count == y->count) {
    if (x->data == y->data) {
      same = true;
    } else {
      const ElemType type = ToElem(x->dtype);
      TC_ASSIGN_OR_RETURN(const int64_t differing, ReduceOnDevice<int64_t>(
                                                       *this, x->count, "LaunchCountBitsDiffer",
                                                       [&](int64_t* partials) {
                                                         return LaunchCountBitsDiffer(
                                                             x->data, y->data, type, x->count,
                                                             partials, stream_);
                                                       },
                                                       AddCount));
      same = differing == 0;
    }
  }
  ++counters_.diagnosis_passes;
  return same;
}

absl::StatusOr<ArrayRef> CudaSession::NewMask(int64_t count) {
  TC_RETURN_IF_ERROR(CheckStop(stop_));
  if (count < 0) {
    return absl::InvalidArgumentError(absl::StrCat("new mask: ", count, " elements"));
  }
  // Four mask bytes to a float32 word.
  TC_ASSIGN_OR_RETURN(ArrayRef mask, Allocate(DType::kFloat32, count / 4 + (count % 4 != 0)));
  Array& m = arrays_[static_cast<size_t>(mask.id)];
  m.mask_count = count;
  TC_RETURN_IF_ERROR(Checked(ToStatus(
      cudaMemsetAsync(m.data, 0, static_cast<size_t>(count), stream_), "cudaMemsetAsync")));
  return mask;
}

absl::StatusOr<int64_t> CudaSession::MarkConsistent(ArrayRef mask, ArrayRef observed,
                                                    ArrayRef candidate, ArrayRef pair_sigma,
                                                    DType compared) {
  TC_RETURN_IF_ERROR(CheckStop(stop_));
  TC_ASSIGN_OR_RETURN(const Array* o,
                      PassArray(*this, observed, "mark consistent: observed", -1, false));
  const int64_t count = o->count;
  TC_ASSIGN_OR_RETURN(const Array* v,
                      PassArray(*this, candidate, "mark consistent: candidate", count, false));
  TC_ASSIGN_OR_RETURN(const Array* sigma,
                      PassArray(*this, pair_sigma, "mark consistent: pair_sigma", count, true));
  TC_ASSIGN_OR_RETURN(const Array* m, PassMask(*this, mask, "mark consistent: mask", count));
  TC_RETURN_IF_ERROR(CheckCompared(compared, "mark consistent"));
  DeviceMarkArgs args;
  args.observed = ValuesOf(*o);
  args.candidate = ValuesOf(*v);
  args.pair_sigma = static_cast<const float*>(sigma->data);
  args.compared = ToElem(compared);
  args.mask = static_cast<uint8_t*>(m->data);
  args.count = count;
  TC_ASSIGN_OR_RETURN(const int64_t set, ReduceOnDevice<int64_t>(
                                             *this, count, "LaunchMarkConsistent",
                                             [&](int64_t* partials) {
                                               return LaunchMarkConsistent(args, partials, stream_);
                                             },
                                             AddCount));
  ++counters_.diagnosis_passes;
  return set;
}

absl::StatusOr<rules::ScoreSums> CudaSession::Score(const SessionScoreSpec& spec) {
  TC_RETURN_IF_ERROR(CheckStop(stop_));
  TC_ASSIGN_OR_RETURN(const Array* o,
                      PassArray(*this, spec.observed, "score: observed", -1, false));
  const int64_t count = o->count;
  TC_ASSIGN_OR_RETURN(const Array* v,
                      PassArray(*this, spec.candidate, "score: candidate", count, false));
  TC_ASSIGN_OR_RETURN(const Array* pair,
                      PassArray(*this, spec.pair_sigma, "score: pair_sigma", count, true));
  TC_ASSIGN_OR_RETURN(const Array* acc, PassArray(*this, spec.pair_accumulation_sigma,
                                                  "score: pair_accumulation_sigma", count, true));
  const float* grid = nullptr;
  if (spec.flip_grid.valid()) {
    TC_ASSIGN_OR_RETURN(const Array* g,
                        PassArray(*this, spec.flip_grid, "score: flip_grid", count, true));
    grid = static_cast<const float*>(g->data);
  }
  TC_ASSIGN_OR_RETURN(const uint8_t* mask, OptionalMask(*this, spec.mask, "score: mask", count));
  TC_RETURN_IF_ERROR(CheckCompared(spec.compared, "score"));
  DeviceScoreArgs args;
  args.observed = ValuesOf(*o);
  args.candidate = ValuesOf(*v);
  args.pair_sigma = static_cast<const float*>(pair->data);
  args.pair_accumulation_sigma = static_cast<const float*>(acc->data);
  args.flip_grid = grid;
  args.mask = mask;
  args.compared = ToElem(spec.compared);
  args.count = count;
  TC_ASSIGN_OR_RETURN(rules::ScoreSums sums, ReduceOnDevice<rules::ScoreSums>(
                                                 *this, count, "LaunchScore",
                                                 [&](rules::ScoreSums* partials) {
                                                   return LaunchScore(args, partials, stream_);
                                                 },
                                                 rules::MergeScore));
  ++counters_.diagnosis_passes;
  return sums;
}

absl::StatusOr<rules::PairedSums> CudaSession::Paired(ArrayRef observed, ArrayRef best,
                                                      ArrayRef runner, ArrayRef sigma,
                                                      ArrayRef mask, DType compared) {
  TC_RETURN_IF_ERROR(CheckStop(stop_));
  TC_ASSIGN_OR_RETURN(const Array* o, PassArray(*this, observed, "paired: observed", -1, false));
  const int64_t count = o->count;
  TC_ASSIGN_OR_RETURN(const Array* b, PassArray(*this, best, "paired: best", count, false));
  TC_ASSIGN_OR_RETURN(const Array* r, PassArray(*this, runner, "paired: runner", count, false));
  TC_ASSIGN_OR_RETURN(const Array* s, PassArray(*this, sigma, "paired: sigma", count, true));
  TC_ASSIGN_OR_RETURN(const uint8_t* m, OptionalMask(*this, mask, "paired: mask", count));
  TC_RETURN_IF_ERROR(CheckCompared(compared, "paired"));
  DevicePairedArgs args;
  args.observed = ValuesOf(*o);
  args.best = ValuesOf(*b);
  args.runner = ValuesOf(*r);
  args.sigma = static_cast<const float*>(s->data);
  args.mask = m;
  args.compared = ToElem(compared);
  args.count = count;
  TC_ASSIGN_OR_RETURN(rules::PairedSums sums, ReduceOnDevice<rules::PairedSums>(
                                                  *this, count, "LaunchPaired",
                                                  [&](rules::PairedSums* partials) {
                                                    return LaunchPaired(args, partials, stream_);
                                                  },
                                                  rules::MergePaired));
  ++counters_.diagnosis_passes;
  return sums;
}

absl::StatusOr<DifferingCounts> CudaSession::Differing(ArrayRef a, ArrayRef b, ArrayRef mask,
                                                       int64_t cols, DType compared) {
  TC_RETURN_IF_ERROR(CheckStop(stop_));
  TC_ASSIGN_OR_RETURN(const Array* x, PassArray(*this, a, "differing: a", -1, false));
  const int64_t count = x->count;
  TC_ASSIGN_OR_RETURN(const Array* y, PassArray(*this, b, "differing: b", count, false));
  TC_ASSIGN_OR_RETURN(const uint8_t* m, OptionalMask(*this, mask, "differing: mask", count));
  TC_RETURN_IF_ERROR(CheckCompared(compared, "differing"));
  DifferingCounts d;
  if (cols <= 0) {
    ++counters_.diagnosis_passes;
    return d;
  }
  const int64_t rows = count / cols;
  if (cols > std::numeric_limits<int64_t>::max() - 1 - rows) {
    return absl::ResourceExhaustedError("differing: counter array size overflows");
  }
  // The counters in one array: columns, then rows, then the total.
  const int64_t counters = cols + rows + 1;
  TC_ASSIGN_OR_RETURN(ArrayRef ref, Allocate(DType::kFloat64, counters));
  auto* device_counts = static_cast<unsigned long long*>(data(ref));
  DeviceDifferingArgs args;
  args.a = ValuesOf(*x);
  args.b = ValuesOf(*y);
  args.mask = m;
  args.compared = ToElem(compared);
  args.count = count;
  args.cols = cols;
  args.columns = device_counts;
  args.rows = rows > 0 ? device_counts + cols : nullptr;
  args.total = device_counts + cols + rows;
  std::vector<unsigned long long> host(static_cast<size_t>(counters));
  absl::Status status = Checked(ToStatus(LaunchDiffering(args, stream_), "LaunchDiffering"));
  if (status.ok()) {
    status =
        Checked(ToStatus(cudaMemcpyAsync(host.data(), device_counts,
                                         static_cast<size_t>(counters) * sizeof(unsigned long long),
                                         cudaMemcpyDeviceToHost, stream_),
                         "cudaMemcpyAsync"));
  }
  if (status.ok()) {
    status = Checked(ToStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"));
  }
  Free(ref);
  TC_RETURN_IF_ERROR(status);
  d.columns.assign(host.begin(), host.begin() + cols);
  d.rows.assign(host.begin() + cols, host.begin() + cols + rows);
  d.total = static_cast<int64_t>(host[static_cast<size_t>(cols + rows)]);
  ++counters_.diagnosis_passes;
  return d;
}

absl::StatusOr<rules::ErrorSums> CudaSession::ErrorVsReference(ArrayRef observed,
                                                               ArrayRef reference,
                                                               ArrayRef sigma_vs_reference,
                                                               ArrayRef mask) {
  TC_RETURN_IF_ERROR(CheckStop(stop_));
  TC_ASSIGN_OR_RETURN(const Array* o,
                      PassArray(*this, observed, "error vs reference: observed", -1, false));
  const int64_t count = o->count;
  TC_ASSIGN_OR_RETURN(const Array* r,
                      PassArray(*this, reference, "error vs reference: reference", count, false));
  TC_ASSIGN_OR_RETURN(
      const Array* s,
      PassArray(*this, sigma_vs_reference, "error vs reference: sigma_vs_reference", count, true));
  TC_ASSIGN_OR_RETURN(const uint8_t* m,
                      OptionalMask(*this, mask, "error vs reference: mask", count));
  DeviceErrorArgs args;
  args.observed = ValuesOf(*o);
  args.reference = ValuesOf(*r);
  args.sigma_vs_reference = static_cast<const float*>(s->data);
  args.mask = m;
  args.count = count;
  TC_ASSIGN_OR_RETURN(rules::ErrorSums sums, ReduceOnDevice<rules::ErrorSums>(
                                                 *this, count, "LaunchErrorVsReference",
                                                 [&](rules::ErrorSums* partials) {
                                                   return LaunchErrorVsReference(args, partials,
                                                                                 stream_);
                                                 },
                                                 rules::MergeError));
  ++counters_.diagnosis_passes;
  return sums;
}

absl::StatusOr<std::vector<uint8_t>> CudaSession::DownloadMask(ArrayRef mask) {
  TC_RETURN_IF_ERROR(CheckStop(stop_));
  TC_ASSIGN_OR_RETURN(const Array* m, PassMask(*this, mask, "download mask", -1));
  std::vector<uint8_t> bytes(static_cast<size_t>(m->mask_count));
  TC_RETURN_IF_ERROR(Checked(StagedDownload(m->data, bytes.data(), m->mask_count)));
  ++counters_.downloads;
  counters_.download_bytes += m->mask_count;
  return bytes;
}

}  // namespace tensorcheck::cuda
