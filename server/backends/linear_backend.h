// LinearBackend: the one interface every linear-layer implementation (CPU
// emulation, cuBLAS, cuBLASLt) provides, and the registry that holds them.
//
//   BackendRegistry registry;
//   RegisterBuiltinBackends(&registry);        // cpu, and cuda ones if built
//   TC_ASSIGN_OR_RETURN(LinearBackend* cpu, registry.Find("cpu"));
//   TC_ASSIGN_OR_RETURN(RunResult r, cpu->Run(problem, config, RunOptions{}));
//
// Contract: Run is thread-safe and may be called concurrently; the backend
// owns whatever it created once (handles, workspaces) for its lifetime.
// Construction is cheap; expensive initialisation happens in the backend's
// static Create. A backend that cannot run on this host stays registered and
// answers Available() with the reason.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/fp8_scaling.h"
#include "core/layer_shape.h"
#include "core/linear_config.h"
#include "core/stop_signal.h"
#include "core/tensor.h"

namespace tensorcheck {

// y = act(x W^T + b) for x viewed as [m, k]: the layer's shape
// (core/layer_shape.h) and its tensors.
struct LinearProblem : LayerShape {
  const Tensor* input = nullptr;   // m*k elements, any leading shape
  const Tensor* weight = nullptr;  // [n, k] (kOutIn) or [k, n] (kInOut)
  const Tensor* bias = nullptr;    // nullptr or [n]
  // FP8 operands' dequantisation scales, float32: 1 element (per tensor),
  // m and n (row-wise), or block-wise as `scale_blocks` says; null with
  // wide operands.
  const Tensor* input_scale = nullptr;
  const Tensor* weight_scale = nullptr;
  // How block-wise scales tile the layer (docs/numerics.md, "Block-wise
  // FP8"; MXFP8 and NVFP4's plain [M, K/B] and [N, K/B] or [K/B, N]
  // scales); not block-wise for per-tensor and row-wise scales.
  ScaleBlocks scale_blocks = {};
  // NVFP4 operands' per-tensor fp32 scales (1 element each); null
  // otherwise.
  const Tensor* input_global_scale = nullptr;
  const Tensor* weight_global_scale = nullptr;
};

// A problem's block-scaled operands (scale_blocks block-wise), each value
// times its block's scale (DequantizeBlocks) as `dtype`: exact in float64;
// float32 rounds FP8 times fp32 scales once. NVFP4's per-tensor scales are
// not applied (they scale the accumulator).
struct DequantizedOperands {
  Tensor input;
  Tensor weight;
};
absl::StatusOr<DequantizedOperands> DequantizeOperands(const LinearProblem& p, DType dtype);

struct RunOptions {
  // Run this many times and compare the outputs bit for bit.
  int repeat = 1;
  // GPU backends: forbid reduced-precision reductions.
  bool disallow_reduced_precision_reduction = false;
  // The request's stop signal (null: never stops). Backends check it
  // between bounded pieces of work (GEMM tiles, repeats, kernel launches)
  // and return its status (CANCELLED or DEADLINE_EXCEEDED) when it fires.
  const StopSignal* stop = nullptr;
};

struct RunResult {
  Tensor output;  // [m, n] in problem.output_dtype
  // Backend detail reported to the client (algorithm id, workspace, ...).
  std::map<std::string, std::string> details;
  bool deterministic = true;
  int runs = 1;
  // Set by RunBatch when this configuration reused the GEMM of the one
  // named here (canonical form) and ran only its own epilogue.
  std::string shared_computation;
};

// One algorithm (kernel) a backend can run a problem with.
struct AlgorithmInfo {
  int index = 0;  // what a configuration's `algo=N` names
  // What the library tells of it, in RunResult::details' keys: "algo" (the
  // library's algorithm id), "algo_tile", "algo_splitk",
  // "algo_reduction_scheme", "algo_workspace_bytes", ...
  std::map<std::string, std::string> details;
};

// `status` with "configuration <config>: " before its message (code and
// payloads kept): how a failure names the configuration it came from.
absl::Status WithConfigContext(const absl::Status& status, const Config& config);

// Receives RunBatch's results one at a time: `index` into its `configs`.
// A non-OK status stops the batch and is returned by RunBatch.
using BatchConsumer = std::function<absl::Status(size_t index, RunResult result)>;

// What a device-backed backend runs on.
struct DeviceDescription {
  std::string name;
  std::string compute_capability;
  int64_t memory_bytes = 0;
  std::string driver_version;
  std::string runtime_version;
  std::string cublas_version;
};

// A configuration prepared for one layer (LinearBackend::Prepare): every
// rule of its backend asked once (the lists, SupportsProblem's layer
// rules, cuBLASLt's FP8 rules and its heuristic), with what they decided
// kept for the run. The plan prepares each configuration once and hands
// the PreparedRun to Run, RunBatch, Algorithms and a device session's Run,
// which do not ask again. A copy shares the backend's state.
//
//   PreparedRun run = backend->Prepare(problem, config);
//   if (!run.ok()) return run.status();         // FAILED_PRECONDITION, naming the rule
//   TC_ASSIGN_OR_RETURN(RunResult r, backend->Run(problem, run, options));
class PreparedRun {
 public:
  // What a backend keeps of its rules' answers (the CUDA backends: the
  // FP8 GEMM they decided on).
  struct State {
    virtual ~State() = default;
  };

  // Not prepared: FAILED_PRECONDITION.
  PreparedRun();
  PreparedRun(Config config, const LayerShape& shape, absl::Status status,
              std::shared_ptr<const State> state = nullptr);

  // OK when the configuration runs the layer; else why not.
  const absl::Status& status() const { return status_; }
  bool ok() const { return status_.ok(); }
  const Config& config() const { return config_; }
  // The layer it was prepared for.
  const LayerShape& shape() const { return shape_; }
  // The backend's state as its own type; null when there is none or it is
  // of another type (prepared by another backend).
  template <typename T>
  const T* state() const {
    return dynamic_cast<const T*>(state_.get());
  }

 private:
  Config config_;
  LayerShape shape_;
  absl::Status status_;
  std::shared_ptr<const State> state_;
};

class ComputeDevice;  // device_session.h

// Where a backend computes. A host emulation (the CPU backend) reproduces a
// precision exactly up to summation order; a device backend runs the real
// library (cuBLAS, cuBLASLt). The engine prefers a device backend for a
// configuration both can run, and names device candidates first when the
// data cannot separate them.
enum class BackendKind { kHostEmulation, kDevice };

class LinearBackend {
 public:
  virtual ~LinearBackend() = default;

  // "cpu", "cublas", "cublaslt".
  virtual absl::string_view name() const = 0;

  virtual BackendKind kind() const = 0;

  // OK when the backend can run here; otherwise FAILED_PRECONDITION with
  // the reason (no device, driver too old, ...).
  virtual absl::Status Available() const = 0;

  // Precisions and bias modes this backend runs on this host.
  virtual std::vector<Precision> precisions() const = 0;
  virtual std::vector<BiasMode> bias_modes() const = 0;

  // Bias mode for a spec that names none.
  virtual BiasMode default_bias_mode() const = 0;

  // Storage dtypes it accepts for input and weight.
  virtual std::vector<DType> storage_dtypes() const = 0;

  // The device, for GPU backends.
  virtual DeviceDescription device() const { return {}; }

  // Non-null for a backend on a device that runs a whole request there
  // (device_session.h); backends on one device return the same one.
  virtual ComputeDevice* compute_device() { return nullptr; }

  // OK when `config` with inputs stored as `storage` can run; otherwise
  // FAILED_PRECONDITION (unsupported here) naming the configuration. The
  // default refuses an `algo` other than 0 unless selects_algorithms().
  // The question without a layer (which configurations a host lists);
  // for a layer, Prepare answers it.
  virtual absl::Status Supports(const Config& config, DType storage) const;

  // `config` prepared for `layer` (its shape and its tensors' dtypes; no
  // data is read): every rule asked once, the answer in the PreparedRun's
  // status (FAILED_PRECONDITION naming the configuration and the rule).
  // The default asks Supports for the input's and the weight's dtypes,
  // then SupportsProblem. Thread-safe.
  virtual PreparedRun Prepare(const LinearProblem& layer, const Config& config) const;

  // OK when `config` (which Supports accepts) can run this layer: the
  // rules on shapes, alignment and operand types that Supports cannot see
  // without the layer (cuBLASLt's FP8 rules: k a multiple of 16, the bias
  // type for the output). Otherwise FAILED_PRECONDITION naming the
  // configuration and the rule. The engine asks before running anything,
  // so a refusal costs no device work and a default candidate set picks
  // another backend instead. The default accepts every layer.
  virtual absl::Status SupportsProblem(const LinearProblem& /*problem*/,
                                       const Config& /*config*/) const {
    return absl::OkStatus();
  }

  // Whether configurations may pick among several algorithms (`algo=N`).
  // A backend that says no runs one algorithm per configuration (the CPU
  // emulation: one summation order per precision).
  virtual bool selects_algorithms() const { return false; }
  // Whether the backend replays GPU kernels (`mma=` configurations,
  // docs/numerics.md, "Kernel K order"): the CPU emulation does; a GPU
  // backend runs its own kernels. The default Supports refuses `mma=`
  // elsewhere.
  virtual bool replays_kernels() const { return false; }

  // The algorithms `config` (its own `algo` ignored) can run `problem`
  // with, at most `limit`, in the backend's order of preference for this
  // problem: what `algo=N` runs is entry N, and entry 0 is what the
  // backend runs when the configuration names no algorithm (so it may
  // change with the problem's shape, as a library's heuristic does). The
  // default is the one algorithm of a backend that does not select.
  // Errors as Run's; FAILED_PRECONDITION when no algorithm runs `problem`.
  // `prepared` (for `problem`'s layer) names the configuration; a
  // prepared run that is not OK answers its status.
  virtual absl::StatusOr<std::vector<AlgorithmInfo>> Algorithms(const LinearProblem& problem,
                                                                const PreparedRun& prepared,
                                                                const RunOptions& options,
                                                                int limit);
  // The same for `config`, prepared here.
  absl::StatusOr<std::vector<AlgorithmInfo>> Algorithms(const LinearProblem& problem,
                                                        const Config& config,
                                                        const RunOptions& options, int limit);

  // Runs the layer. `problem` has been validated (shapes consistent, dtypes
  // supported). Errors: RESOURCE_EXHAUSTED (memory), INTERNAL (device).
  virtual absl::StatusOr<RunResult> Run(const LinearProblem& problem, const Config& config,
                                        const RunOptions& options) = 0;

  // Runs `prepared` (prepared for `problem`'s layer by this backend): what
  // the engine calls. A prepared run that is not OK answers its status.
  // The default runs prepared.config() as above; a backend that keeps
  // state in its PreparedRun overrides it and asks no rule again.
  virtual absl::StatusOr<RunResult> Run(const LinearProblem& problem, const PreparedRun& prepared,
                                        const RunOptions& options);

  // Runs every configuration in `configs` on one problem and hands each
  // result to `consume` as soon as it is ready, so that the caller holds
  // no more outputs than it keeps. A backend may share work between
  // configurations that compute the same thing on these inputs (the CPU
  // backend runs one GEMM for every precision whose input rounding leaves
  // the stored values unchanged, and one for the fused and unfused
  // variants of a precision), marking the results that reused it in
  // `shared_computation`; each output is still exactly what Run returns.
  // The first configuration's result is always delivered first; the rest
  // may come in another order. A failure's message names the
  // configuration it came from. Each run is prepared for `problem`'s
  // layer (Prepare); this default runs them one by one.
  virtual absl::Status RunBatch(const LinearProblem& problem, const std::vector<PreparedRun>& runs,
                                const RunOptions& options, const BatchConsumer& consume);
  // The same for `configs`, each prepared here first (a refusal is
  // returned before anything runs).
  absl::Status RunBatch(const LinearProblem& problem, const std::vector<Config>& configs,
                        const RunOptions& options, const BatchConsumer& consume);
};

// Holds the backends by name; filled once at start-up, then read-only (so
// lookups need no lock).
class BackendRegistry {
 public:
  // ALREADY_EXISTS when the name is taken.
  absl::Status Register(std::unique_ptr<LinearBackend> backend);

  // NOT_FOUND naming the known backends.
  absl::StatusOr<LinearBackend*> Find(absl::string_view name) const;

  // In registration order.
  std::vector<LinearBackend*> backends() const;

 private:
  std::vector<std::unique_ptr<LinearBackend>> backends_;
};

struct BuiltinBackendOptions {
  // Worker threads of the CPU backend's BLAS; 0: all cores. (The server's
  // --cpu-threads -1 is resolved to 1 or 0 before it gets here.)
  int cpu_threads = 0;
  // CUDA backends (when built): per-request device memory budget and the
  // cuBLASLt workspace.
  int64_t gpu_memory_budget_bytes = 0;  // 0: 90% of free device memory
  int64_t cublaslt_workspace_bytes = int64_t{32} << 20;
  // Requests on the device at once, each on its own stream (lane).
  int gpu_lanes = 4;
};

// Registers `cpu`, and `cublas`/`cublaslt` when the CUDA build is on (they
// report unavailable without a device).
absl::Status RegisterBuiltinBackends(BackendRegistry* registry,
                                     const BuiltinBackendOptions& options = {});

}  // namespace tensorcheck
