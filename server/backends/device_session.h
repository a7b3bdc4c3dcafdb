// DeviceSession: one request's whole verification where it is computed
// (docs/architecture.md, "A request on the device"): a GPU's, or the
// host's (HostDevice, server/backends/cpu/host_device.h), which runs every
// request no one device runs whole. The engine uploads the request's
// tensors once, then asks for runs, the error model's magnitude sums and
// arrays, comparisons and the flip grid on arrays that stay on the device;
// only statistics come back unless it downloads an array.
//
//   ComputeDevice* device = backend->compute_device();   // null: host only
//   TC_ASSIGN_OR_RETURN(auto session, device->OpenSession(stop));
//   TC_ASSIGN_OR_RETURN(ArrayRef x, session->Upload(input));
//   TC_ASSIGN_OR_RETURN(ArrayRef w, session->Upload(weight));  // resident when it has a content id
//   SessionOperands op{LayerShape{m, n, k}, x, w, {}};
//   TC_ASSIGN_OR_RETURN(SessionRun ref, session->Run(op, fp64_prepared, run_options));
//   TC_ASSIGN_OR_RETURN(SessionRun y, session->Run(op, bf16_prepared, run_options));
//   TC_ASSIGN_OR_RETURN(DiffStats s, session->Compare(y.output, ref.output, {options}));
//
// Every array is a device array of the session, named by an ArrayRef and
// freed with the session. Tensors with a content id (Tensor::content_id,
// a stored tensor's digest) are served from and kept in the device's
// resident cache (server/backends/resident_cache.h): the second request
// with the same weight uploads only its input and observed output.
// Results never depend on whether a tensor came from the cache.
//
// The semantics of each call are the host's: Run is LinearBackend::Run of
// the configuration's backend, MagnitudeSums is ComputeMagnitudeSums,
// ErrorModel the PredictSigma family and HardBound, FlipGrid stats'
// FlipGrid, Compare stats' Compare, and the diagnosis calls stats'
// diagnosis passes (diagnosis_passes.h); a device computes the sums in
// another order, which is the only difference (docs/numerics.md, "The
// work on the device").
//
// A session is used by one thread at a time. Errors: as the host's
// functions, RESOURCE_EXHAUSTED over the device memory budget (the device
// keeps serving), CANCELLED/DEADLINE_EXCEEDED when the session's stop
// signal fires (checked between calls and between launches), INTERNAL on
// a device fault.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/fp8_scaling.h"
#include "core/layer_shape.h"
#include "core/linear_config.h"
#include "core/stop_signal.h"
#include "core/tensor.h"
#include "server/backends/linear_backend.h"
#include "server/stats/diagnosis_passes.h"
#include "server/stats/diagnosis_rules.h"
#include "server/stats/diff_stats.h"
#include "server/stats/error_model.h"

namespace tensorcheck {

// An array of a session; invalid (id -1) where none is meant.
struct ArrayRef {
  int id = -1;
  bool valid() const { return id >= 0; }
};

// A linear layer over arrays of the session: its shape and its arrays
// (LinearProblem's, on the device).
struct SessionOperands : LayerShape {
  ArrayRef input;   // m*k elements
  ArrayRef weight;  // [n, k] (kOutIn) or [k, n] (kInOut)
  ArrayRef bias;    // [n], or invalid
  // FP8 operands' dequantisation scales (LinearProblem's), float32; invalid
  // with wide operands. A device session that takes FP8 operands by
  // another call (CudaSession::RunWithScales) ignores them.
  ArrayRef input_scale;
  ArrayRef weight_scale;
  // How block-wise scales tile the layer (LinearProblem's).
  ScaleBlocks scale_blocks = {};
  // NVFP4's per-tensor scales (float32, 1 element); invalid otherwise.
  ArrayRef input_global_scale;
  ArrayRef weight_global_scale;
};

// A run whose output stays on the device.
struct SessionRun {
  RunResult run;  // run.output empty
  ArrayRef output;
};

// MagnitudeSums (stats/magnitude_sums.h) on the device: each array is
// m*n floats, computed only when asked.
struct SessionMagnitudes {
  ArrayRef abs_dot, sq_dot, dot;
};

// One error-model array (stats/error_model.h) over the session's arrays.
struct SessionModelSpec {
  enum Kind { kSigma, kPairSigma, kPairAccumulation, kBound };
  Kind kind = kSigma;
  Precision precision = Precision::kFp32;
  int64_t k = 0;
  DType output_dtype = DType::kFloat32;
  bool unfused_bias = false;
  bool inputs_exact = false;      // kSigma and kBound
  double accumulation_scale = 1;  // kPairAccumulation only
  int reduce_terms = 0;           // split-K reduced in the output type (ErrorModelInput's)
  ArrayRef abs_dot;               // kBound
  ArrayRef sq_dot;                // the others
  ArrayRef value;                 // the reference output (any dtype), m*n
  ArrayRef pre_bias;              // x.w, or invalid
  int64_t count = 0;
};

// The scalars of `spec` as stats' ErrorModelInput: what a session's
// ErrorModel hands to stats' functions (host arrays) or to the constants
// of its kernels (SigmaConstantsOf and the like), after filling in the
// arrays it keeps.
inline ErrorModelInput ModelInputOf(const SessionModelSpec& spec) {
  ErrorModelInput in;
  in.precision = spec.precision;
  in.k = spec.k;
  in.output_dtype = spec.output_dtype;
  in.unfused_bias = spec.unfused_bias;
  in.inputs_exact = spec.inputs_exact;
  in.accumulation_scale = spec.accumulation_scale;
  in.reduce_terms = spec.reduce_terms;
  in.count = spec.count;
  return in;
}

struct SessionModel {
  ArrayRef values;  // count floats
  // Sum of the squares of the values (the sigma kinds; -1 for kBound):
  // CompareOptions::predicted_sigma_sum_sq.
  double sum_sq = -1;
};

// FlipGrid (stats/error_model.h) over the session's arrays.
struct SessionFlipSpec {
  DType output_dtype = DType::kFloat32;
  bool unfused_bias = false;
  Activation activation = Activation::kNone;
  ArrayRef pre_bias;  // x.w, required
  ArrayRef bias;      // the layer's bias (any dtype), or invalid
  int64_t cols = 0;
  int64_t count = 0;
};

// The scalars of `spec` as stats' FlipGridInput (as ModelInputOf).
inline FlipGridInput FlipInputOf(const SessionFlipSpec& spec) {
  FlipGridInput in;
  in.output_dtype = spec.output_dtype;
  in.unfused_bias = spec.unfused_bias;
  in.activation = spec.activation;
  in.cols = spec.cols;
  in.count = spec.count;
  return in;
}

// Compare(actual, expected, options) with the error-model arrays on the
// device: options.predicted_sigma and options.error_bound are ignored in
// favour of `sigma` and `bound` (invalid: none), and
// options.predicted_sigma_sum_sq is `sigma`'s sum of squares.
struct SessionCompare {
  CompareOptions options;
  ArrayRef sigma;
  ArrayRef bound;
};

// A candidate's score for a diagnosis (stats' ScorePass) over arrays of
// the session.
struct SessionScoreSpec {
  ArrayRef observed;
  ArrayRef candidate;
  ArrayRef pair_sigma;               // count floats
  ArrayRef pair_accumulation_sigma;  // count floats
  ArrayRef flip_grid;                // count floats, or invalid: the output spacing
  ArrayRef mask;                     // a mask (NewMask), or invalid: every element
  DType compared = DType::kFloat32;  // the dtype ULPs are counted in
};

// What a session does beyond the calls every session answers; the engine
// asks before it shares work (docs/architecture.md, "The life of a
// request").
struct SessionCapabilities {
  // RunBatch runs one GEMM for the configurations that multiply the same
  // operands in the same arithmetic (LinearBackend::RunBatch of their
  // backend), marking the results that reused it in shared_computation.
  bool batched_runs = false;
  // Compare is a function of its arrays' bytes alone, so that the
  // statistics of bitwise-equal outputs against the same arrays may be
  // answered from an earlier comparison instead of a second pass.
  bool cached_comparisons = false;
  // The arrays are in host memory (HostDevice, server/backends/cpu/
  // host_device.h): nothing travels, and a run's details say nothing of a
  // device.
  bool host_memory = false;
};

// Receives RunBatch's runs one at a time: `index` into its `runs`. A non-OK
// status stops the batch and is returned by RunBatch.
using SessionBatchConsumer = std::function<absl::Status(size_t index, SessionRun run)>;

// What a session did, for the run's details and the tests of the plan.
struct SessionCounters {
  int64_t uploads = 0;  // tensors copied to the device
  int64_t upload_bytes = 0;
  int64_t resident_hits = 0;  // tensors served by the resident cache
  int64_t resident_hit_bytes = 0;
  int64_t downloads = 0;  // arrays copied back whole
  int64_t download_bytes = 0;
  int64_t runs = 0;
  int64_t comparisons = 0;
  int64_t model_arrays = 0;
  int64_t diagnosis_passes = 0;  // the diagnosis calls below
};

class DeviceSession {
 public:
  virtual ~DeviceSession() = default;

  // `t` on the device (from the resident cache when it has a content id
  // the cache holds; kept there after when the budget allows).
  virtual absl::StatusOr<ArrayRef> Upload(const Tensor& t) = 0;

  // LinearBackend::Run of prepared.config().backend (one of the device's
  // backends), prepared by it for this layer (LinearBackend::Prepare);
  // a prepared run that is not OK answers its status.
  virtual absl::StatusOr<SessionRun> Run(const SessionOperands& op, const PreparedRun& prepared,
                                         const RunOptions& options) = 0;

  // Run of every one of `runs`, each result handed to `consume` as it is
  // ready, the first first (LinearBackend::RunBatch's contract). With
  // capabilities().batched_runs the session shares GEMMs between them;
  // this default runs them one by one.
  virtual absl::Status RunBatch(const SessionOperands& op, const std::vector<PreparedRun>& runs,
                                const RunOptions& options, const SessionBatchConsumer& consume) {
    for (size_t i = 0; i < runs.size(); ++i) {
      absl::StatusOr<SessionRun> run = Run(op, runs[i], options);
      if (!run.ok()) return WithConfigContext(run.status(), runs[i].config());
      absl::Status s = consume(i, *std::move(run));
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

  virtual absl::StatusOr<SessionMagnitudes> MagnitudeSums(const SessionOperands& op, bool abs_dot,
                                                          bool sq_dot, bool dot) = 0;

  virtual absl::StatusOr<SessionModel> ErrorModel(const SessionModelSpec& spec) = 0;

  virtual absl::StatusOr<ArrayRef> FlipGrid(const SessionFlipSpec& spec) = 0;

  // INVALID_ARGUMENT as Compare answers.
  virtual absl::StatusOr<DiffStats> Compare(ArrayRef actual, ArrayRef expected,
                                            const SessionCompare& compare) = 0;

  // The array on the host as a flat tensor of its dtype and count (a
  // run's output in the output dtype; magnitude sums, error-model arrays
  // and the flip grid in float32).
  virtual absl::StatusOr<Tensor> Download(ArrayRef array) = 0;

  // ---- A diagnosis's passes (stats' diagnosis_passes.h, the same rules
  // per element; sums merged in the device's order). A mask is a session
  // array of one byte per element; where one is given, a pass reads the
  // elements it holds set, else every element. `compared` is the dtype
  // ULPs are counted in.

  // SameBitsPass: whether two arrays hold the same bytes.
  virtual absl::StatusOr<bool> SameBits(ArrayRef a, ArrayRef b) = 0;

  // A mask of `count` elements, none set.
  virtual absl::StatusOr<ArrayRef> NewMask(int64_t count) = 0;

  // MarkConsistentPass into `mask`; returns how many elements it holds set.
  virtual absl::StatusOr<int64_t> MarkConsistent(ArrayRef mask, ArrayRef observed,
                                                 ArrayRef candidate, ArrayRef pair_sigma,
                                                 DType compared) = 0;

  // ScorePass.
  virtual absl::StatusOr<rules::ScoreSums> Score(const SessionScoreSpec& spec) = 0;

  // Score of each spec, in order; a session may score them side by side
  // (each candidate's sums are still added in element order). This
  // default scores them one by one.
  virtual absl::StatusOr<std::vector<rules::ScoreSums>> ScoreAll(
      const std::vector<SessionScoreSpec>& specs) {
    std::vector<rules::ScoreSums> sums;
    for (const SessionScoreSpec& spec : specs) {
      absl::StatusOr<rules::ScoreSums> s = Score(spec);
      if (!s.ok()) return s.status();
      sums.push_back(*s);
    }
    return sums;
  }

  // PairedPass (`sigma`: best's pair sigma).
  virtual absl::StatusOr<rules::PairedSums> Paired(ArrayRef observed, ArrayRef best,
                                                   ArrayRef runner, ArrayRef sigma, ArrayRef mask,
                                                   DType compared) = 0;

  // DifferingPass, element i in column i % cols.
  virtual absl::StatusOr<DifferingCounts> Differing(ArrayRef a, ArrayRef b, ArrayRef mask,
                                                    int64_t cols, DType compared) = 0;

  // ErrorPass.
  virtual absl::StatusOr<rules::ErrorSums> ErrorVsReference(ArrayRef observed, ArrayRef reference,
                                                            ArrayRef sigma_vs_reference,
                                                            ArrayRef mask) = 0;

  // The mask on the host, one byte per element (counted as a download).
  virtual absl::StatusOr<std::vector<uint8_t>> DownloadMask(ArrayRef mask) = 0;

  // Gives an array's memory back before the session ends, when the
  // caller reads it no more (an output compared and not kept). The
  // default keeps it until the session ends.
  virtual void Release(ArrayRef /*array*/) {}

  virtual SessionCapabilities capabilities() const { return {}; }

  virtual SessionCounters counters() const = 0;
};

// A SessionCompare for error-model arrays held on the host
// (options.predicted_sigma, options.error_bound: `count` floats each, or
// null), uploaded to `session`: a comparison made outside the engine
// (gpu_bench, the device statistics' tests) the way the engine makes it.
inline absl::StatusOr<SessionCompare> UploadCompare(DeviceSession& session,
                                                    const CompareOptions& options, int64_t count) {
  SessionCompare out{options, {}, {}};
  for (auto [host, array] : {std::pair{options.predicted_sigma, &out.sigma},
                             std::pair{options.error_bound, &out.bound}}) {
    if (host == nullptr) continue;
    absl::StatusOr<Tensor> view =
        Tensor::Borrow(DType::kFloat32, {count}, host, static_cast<size_t>(count) * sizeof(float),
                       /*owner=*/nullptr);
    if (!view.ok()) return view.status();
    absl::StatusOr<ArrayRef> uploaded = session.Upload(*view);
    if (!uploaded.ok()) return uploaded.status();
    *array = *uploaded;
  }
  return out;
}

// The resident cache's totals (ResidentCache::Stats, for the device).
struct ResidentStats {
  int64_t entries = 0;
  int64_t bytes = 0;
  int64_t capacity_bytes = 0;
  int64_t hits = 0;
  int64_t misses = 0;
  int64_t evictions = 0;
};

// A device that one or more backends run on.
class ComputeDevice {
 public:
  virtual ~ComputeDevice() = default;

  // A session for one request; `stop` (null: never) must outlive it.
  // FAILED_PRECONDITION when the device cannot run.
  virtual absl::StatusOr<std::unique_ptr<DeviceSession>> OpenSession(const StopSignal* stop) = 0;

  virtual ResidentStats resident() const = 0;

  // Device memory held now under the device's budget (requests' arrays,
  // workspaces, resident tensors) and the budget; zeros when the device
  // keeps no budget.
  struct Memory {
    int64_t used_bytes = 0;
    int64_t budget_bytes = 0;
  };
  virtual Memory memory() const { return {}; }
};

}  // namespace tensorcheck
