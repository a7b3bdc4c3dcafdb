// CudaComputeDevice (cuda_device.h): its lanes, the memory budget it
// shares and the resident cache, and opening a session on a lane. The
// sessions themselves are internal/cuda_session_*.cc: arrays, copies,
// the error model and comparisons (cuda_session_arrays.cc), a diagnosis's
// passes (cuda_session_diagnosis.cc), the runs (session_run.cc).
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
      options.staging_bytes < 2 * kDeviceAlign) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GPU memory budget and cuBLASLt workspace must be >= 0, lanes >= 1 and staging >= ",
        2 * kDeviceAlign, " bytes; got ", options.memory_budget_bytes, ", ",
        options.workspace_bytes, ", ", options.lanes, ", ", options.staging_bytes));
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

// ---- opening a session

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

}  // namespace tensorcheck::cuda
