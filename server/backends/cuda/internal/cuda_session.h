// CudaSession: one request on a lane of the CudaComputeDevice (internal to
// this folder; cuda_device.h says what a session holds).
// cuda_session_arrays.cc has the arrays, copies, the error model and the
// comparisons; cuda_session_diagnosis.cc a diagnosis's passes
// (diagnosis_kernels.h); session_run.cc the runs of a configuration and
// the magnitude sums. The device (lanes, budget) is cuda_device.cc.
//
// Arrays are the session's own (stream-ordered allocations, freed with
// the session or by Free) or resident (pinned in the device's cache for
// the session's life). A tensor with a content id is resident under
// "<id>|<dtype>", and so is every form made of it (Form): "<id>|<dtype>|
// bfloat16", "...|tf32rna", "...|mag_abs", and an FP8 configuration's
// quantised operand and its scales, "...|float8_e4m3fn|row" and
// "...|float8_e4m3fn|row|scales".
//
// FP8 operands come with their dequantisation scales, which
// SessionOperands does not carry: RunWithScales takes them (the backends'
// own Run does); Run, the engine's call, has none, and refuses FP8
// operands (an fp8 configuration of wide operands quantises them itself).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/backends/cuda/cuda_device.h"
#include "server/backends/cuda/internal/fp8_rules.h"
#include "server/backends/device_session.h"

namespace tensorcheck::cuda {

// The alignment of a session's arrays and of the halves of a lane's
// staging buffer, in bytes.
inline constexpr int64_t kDeviceAlign = 256;

// FP8 operands' dequantisation scales on a session, in the layout the
// GEMM's scale mode reads (block_scale_layout.h's LtScaleSpecOf: float32 1
// element each per tensor, m and n row-wise; block-wise and MXFP8/NVFP4
// scales already rearranged for cuBLASLt). Invalid: none.
struct SessionScales {
  ArrayRef input;
  ArrayRef weight;
};

class CudaSession final : public DeviceSession {
 public:
  CudaSession(CudaComputeDevice* device, CudaComputeDevice::Lane* lane, const StopSignal* stop);
  ~CudaSession() override;

  absl::StatusOr<ArrayRef> Upload(const Tensor& t) override;
  absl::StatusOr<SessionRun> Run(const SessionOperands& op, const PreparedRun& prepared,
                                 const RunOptions& options) override;
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
  absl::StatusOr<rules::PairedSums> Paired(ArrayRef observed, ArrayRef best, ArrayRef runner,
                                           ArrayRef sigma, ArrayRef mask, DType compared) override;
  absl::StatusOr<DifferingCounts> Differing(ArrayRef a, ArrayRef b, ArrayRef mask, int64_t cols,
                                            DType compared) override;
  absl::StatusOr<rules::ErrorSums> ErrorVsReference(ArrayRef observed, ArrayRef reference,
                                                    ArrayRef sigma_vs_reference,
                                                    ArrayRef mask) override;
  absl::StatusOr<std::vector<uint8_t>> DownloadMask(ArrayRef mask) override;
  SessionCounters counters() const override { return counters_; }

  // Run, with FP8 operands' scales (uploaded to this session).
  absl::StatusOr<SessionRun> RunWithScales(const SessionOperands& op, const SessionScales& scales,
                                           const PreparedRun& prepared, const RunOptions& options);

  // ---- for session_run.cc

  struct Array {
    void* data = nullptr;
    DType dtype = DType::kFloat32;
    int64_t count = 0;
    bool owned = false;            // the session's: freed with it (or by Free)
    const Tensor* host = nullptr;  // the request's tensor it was uploaded from
    std::string content_id;        // non-empty: its forms are resident too
    std::optional<ResidentCache::Handle> pin;
    // A mask (NewMask): its element count, one byte each (the array is
    // allocated as `count` float32 words holding them); -1 for any other
    // array.
    int64_t mask_count = -1;
  };

  // INVALID_ARGUMENT naming `what` for a reference the session never made.
  // The pointer stays valid for the session's life.
  absl::StatusOr<const Array*> Get(ArrayRef a, absl::string_view what) const;
  void* data(ArrayRef a) const { return arrays_.at(static_cast<size_t>(a.id)).data; }

  // A new array of `count` elements of `dtype`: RESOURCE_EXHAUSTED over
  // the budget (after resident tensors gave way) or when the device is out
  // of memory.
  absl::StatusOr<ArrayRef> Allocate(DType dtype, int64_t count);
  // Gives an owned array's memory back before the session ends.
  void Free(ArrayRef a);

  // `source` in another form of `count` elements (-1: as many as
  // `source`), made once per session (or once per resident tensor, and
  // kept with it): make(dst) enqueues what fills it.
  using MakeForm = std::function<absl::Status(void* dst)>;
  absl::StatusOr<ArrayRef> Form(ArrayRef source, absl::string_view form, DType dtype,
                                const MakeForm& make, int64_t count = -1);

  // `bytes` host bytes to the device array at `dst`, through the lane's
  // staging (the host bytes may go once this returns).
  absl::Status CopyToDevice(const void* src, void* dst, int64_t bytes);

  CudaContext& ctx() { return *lane_->ctx; }
  cudaStream_t stream() const { return stream_; }
  const StopSignal* stop() const { return stop_; }
  const CudaComputeDevice& device() const { return *device_; }

  // Records a sticky error on the device; returns `s`.
  absl::Status Checked(absl::Status s) { return device_->Note(std::move(s)); }

 private:
  ArrayRef Add(Array a);
  // Host bytes to the device (and back) through the lane's two pinned
  // halves, one filling while the other copies.
  absl::Status StagedUpload(const void* src, void* dst, int64_t bytes);
  absl::Status StagedDownload(const void* src, void* dst, int64_t bytes);
  // The resident array under `key` (waited for on this stream), or a new
  // one filled by `make` and kept under `key` when the budget allows,
  // else the session's own.
  absl::StatusOr<ArrayRef> Resident(const std::string& key, DType dtype, int64_t count,
                                    const Tensor* host, const std::string& content_id,
                                    const MakeForm& make, bool* hit);

  CudaComputeDevice* device_;
  CudaComputeDevice::Lane* lane_;
  const StopSignal* stop_;
  cudaStream_t stream_;
  // A deque: adding an array never moves the others, so an Array* from
  // Get stays valid for the session's life.
  std::deque<Array> arrays_;
  std::deque<int64_t> padded_;             // each owned array's reserved bytes
  std::map<std::string, ArrayRef> forms_;  // "<array id>|<form>"
  int64_t reserved_ = 0;
  SessionCounters counters_;
};

namespace internal {

// What a CUDA backend's Prepare decided (PreparedRun's state): the FP8 or
// block-scaled GEMM (fp8_rules.h, block_scale_rules.h), asked once, when
// the configuration or an operand involves them; nullopt otherwise.
struct CudaPrepared final : PreparedRun::State {
  std::optional<Fp8Gemm> fp8;
};

// CudaSession::Run: the prepared configuration's GEMM (and epilogue) over
// the session's operands, `options.repeat` times compared bit for bit.
// FP8 operands need `scales`. INVALID_ARGUMENT when `prepared` is not a
// CUDA backend's; its status when it is not OK.
absl::StatusOr<SessionRun> RunOnSession(CudaSession& session, const SessionOperands& op,
                                        const SessionScales& scales, const PreparedRun& prepared,
                                        const RunOptions& options);

// A layer by its shape and its operands' dtypes: what a configuration's
// algorithms depend on.
struct LayerTypes : LayerShape {
  DType input = DType::kFloat32;
  DType weight = DType::kFloat32;
  std::optional<DType> bias;
};

// `problem`'s layer.
LayerTypes LayerOf(const LinearProblem& problem);

// What the FP8 rules (fp8_rules.h) are asked about `config` on `layer`.
Fp8Query Fp8QueryOf(const Config& config, const LayerTypes& layer,
                    std::optional<ComputeCapability> device);

// Whether the narrow rules apply (fp8_rules.h, block_scale_rules.h): an
// fp8 or block-scaled precision, or an FP8 or FP4 operand.
bool InvolvesNarrowGemm(const Config& config, const LayerTypes& layer);

// Every cuBLASLt descriptor a run of `config` on `layer` builds, on a
// device of capability `cc` with a `workspace_bytes` workspace, built and
// destroyed without a device: OK, or the first attribute the installed
// libcublasLt refused (or the configuration's own set-up error). A `cublas`
// configuration builds none.
absl::Status BuildDescriptors(const Config& config, const LayerTypes& layer,
                              const RunOptions& options, ComputeCapability cc,
                              int64_t workspace_bytes, std::map<std::string, std::string>* details);

// LinearBackend::Algorithms of config.backend (its `algo` ignored): the
// GEMM RunOnSession would prepare, asked for its algorithms only, on the
// session's lane; no operand needs to be on the device.
// `fp8` is the FP8 GEMM the configuration's Prepare decided (nullopt
// when it involves no FP8).
absl::StatusOr<std::vector<AlgorithmInfo>> AlgorithmsOnSession(
    CudaSession& session, const LayerTypes& layer, const Config& config,
    const std::optional<Fp8Gemm>& fp8, const RunOptions& options, int limit);

// CudaSession::MagnitudeSums: fp32 GEMMs (CUBLAS_COMPUTE_32F_PEDANTIC) of
// x, |x| and x^2 with W, |W| and W^2.
absl::StatusOr<SessionMagnitudes> MagnitudeSumsOnSession(CudaSession& session,
                                                         const SessionOperands& op, bool abs_dot,
                                                         bool sq_dot, bool dot);

}  // namespace internal
}  // namespace tensorcheck::cuda
