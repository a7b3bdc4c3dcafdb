// CudaComputeDevice: the GPU the `cublaslt` and `cublas` backends share,
// as a ComputeDevice (server/backends/device_session.h): a whole request
// runs there as one session (internal to this folder; docs/architecture.md,
// "A request on the device").
//
//   TC_ASSIGN_OR_RETURN(auto device, CudaComputeDevice::Create(options, probe));
//   TC_ASSIGN_OR_RETURN(auto session, device->OpenSession(stop));
//   TC_ASSIGN_OR_RETURN(ArrayRef w, session->Upload(weight));   // resident by digest
//
// What it holds:
//   - a pool of lanes (CudaContext: a stream, cuBLAS and cuBLASLt handles,
//     a workspace) with pinned staging buffers; a session holds one lane
//     for its life, so up to `lanes` requests overlap their copies and
//     kernels, each on its own stream. A request's results do not depend
//     on its lane or on what runs beside it: every lane runs the same
//     kernels with the same handles' settings and its own workspace.
//   - one memory budget for everything on the device: the sessions'
//     arrays, the lanes' workspaces and the resident tensors. A session's
//     allocation evicts resident tensors no request is using (least
//     recently used first) before it is refused RESOURCE_EXHAUSTED.
//   - the resident cache (server/backends/resident_cache.h): stored
//     tensors by digest, and the forms configurations convert them to
//     (bf16/fp16/fp32 copies, TF32-rounded copies, |W| and W^2 for the
//     error model), each with an event that says when it is ready.
//
// After a sticky CUDA error (cuda_backends.h) every session is refused
// with it.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/statusor.h"
#include "server/backends/cuda/cuda_context.h"
#include "server/backends/device_session.h"
#include "server/backends/resident_cache.h"

namespace tensorcheck::cuda {

class CudaSession;
struct MemoryAccount;

class CudaComputeDevice final : public ComputeDevice {
 public:
  struct Options {
    // Everything on the device together; 0: 90% of the free memory when
    // the first such device of this process was made, one budget shared by
    // every device of the process that takes it (two do not each claim 90%).
    int64_t memory_budget_bytes = 0;
    int64_t workspace_bytes = int64_t{32} << 20;
    // Concurrent sessions (streams); at least 1.
    int lanes = 4;
    // Pinned host memory per lane for copies (two halves, alternating).
    int64_t staging_bytes = int64_t{16} << 20;
    // NVIDIA_TF32_OVERRIDE=0: cuBLAS computes FAST_TF32 in plain fp32.
    bool tf32_disabled = false;
  };

  // FAILED_PRECONDITION without a usable device; RESOURCE_EXHAUSTED when
  // the lanes' workspaces do not fit.
  static absl::StatusOr<std::unique_ptr<CudaComputeDevice>> Create(const Options& options,
                                                                   const DeviceProbe& probe);
  ~CudaComputeDevice() override;

  absl::StatusOr<std::unique_ptr<DeviceSession>> OpenSession(const StopSignal* stop) override;
  // OpenSession, as the session's own type (for the backends' runs, which
  // pass FP8 scales: internal/cuda_session.h).
  absl::StatusOr<std::unique_ptr<CudaSession>> OpenCudaSession(const StopSignal* stop);

  ResidentStats resident() const override { return cache_.stats(); }
  Memory memory() const override;

  // OK, or the sticky error that poisoned the device.
  absl::Status health() const;
  // Records `s` when it is a sticky error; returns `s`.
  absl::Status Note(absl::Status s);

  const DeviceProbe& probe() const { return probe_; }
  bool tf32_disabled() const { return options_.tf32_disabled; }
  int64_t budget_bytes() const;

 private:
  friend class CudaSession;

  // One lane: its context and pinned staging.
  struct Lane {
    std::unique_ptr<CudaContext> ctx;
    void* staging = nullptr;  // pinned, options_.staging_bytes
    cudaEvent_t staged[2] = {nullptr, nullptr};
    bool busy = false;
  };

  CudaComputeDevice(const Options& options, const DeviceProbe& probe);

  // A free lane, waiting for one (and checking `stop`) while all are busy.
  absl::StatusOr<Lane*> AcquireLane(const StopSignal* stop);
  void ReleaseLane(Lane* lane);

  // `bytes` more of the budget for a session's arrays: evicts unpinned
  // resident tensors first; RESOURCE_EXHAUSTED when they cannot fit.
  absl::Status Reserve(int64_t bytes);
  void Release(int64_t bytes);

  Options options_;
  DeviceProbe probe_;
  // The budget this device draws on (MemoryAccount, cuda_device.cc): its
  // own when Options gave one, else the one every default-budget device
  // of this process shares.
  std::shared_ptr<MemoryAccount> account_;
  int64_t workspaces_ = 0;        // the lanes' share of account_
  cudaMemPool_t pool_ = nullptr;  // the process's (cuda_device.cc), never destroyed
  ResidentCache cache_;

  std::mutex lanes_mu_;
  std::condition_variable lane_free_;
  std::vector<std::unique_ptr<Lane>> lanes_;

  mutable std::mutex health_mu_;
  absl::Status sticky_;
};

}  // namespace tensorcheck::cuda
