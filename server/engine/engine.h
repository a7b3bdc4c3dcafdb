// Engine: turns a validated linear-layer request into backend runs,
// statistics and a verdict. No gRPC types: it is driven in-process by the
// service and by tests.
//
//   BackendRegistry registry;
//   TC_RETURN_IF_ERROR(RegisterBuiltinBackends(&registry));
//   TC_ASSIGN_OR_RETURN(auto engine, Engine::Create(EngineOptions{}, &registry));
//   LinearRequest req;
//   req.input = std::move(x);  req.weight = std::move(w);
//   req.configs = {"cpu:fp32", "cpu:tf32:fused"};
//   TC_ASSIGN_OR_RETURN(VerifyOutcome out, engine->Verify(req));
//   out.passed, out.results[1].vs_reference.max_abs, ...
//
// Thread safety: Verify and Diagnose may be called concurrently.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/linear_config.h"
#include "core/request_progress.h"
#include "core/stop_signal.h"
#include "core/tensor.h"
#include "server/backends/device_session.h"
#include "server/backends/linear_backend.h"
#include "server/engine/batch_invariance.h"
#include "server/engine/kernel_orders.h"
#include "server/stats/diff_stats.h"
#include "server/stats/tolerance.h"

namespace tensorcheck {

// Every bound on what one request may ask for, in one place: the engine
// enforces them, the service's wire decoding and GetCapabilities read the
// same struct (through Engine::options()).
struct RequestLimits {
  // A whole request or response on the wire (gRPC's message size).
  int64_t max_message_bytes = int64_t{256} << 20;
  // Largest single tensor sent inline; TensorCheckServer keeps it at most
  // max_message_bytes (such a tensor travels inside one message). Tensors
  // from the tensor store (borrowed) are bounded by the store instead.
  int64_t max_tensor_bytes = int64_t{256} << 20;
  // Largest output, in elements (each configuration holds one).
  int64_t max_output_elements = int64_t{64} << 20;
  // Largest problem, in multiply-adds M*N*K.
  int64_t max_macs = int64_t{1} << 37;
  // Largest work per request, in multiply-adds: M*N*K times the
  // configurations run (the reference included) times the repeats. About
  // 5-10 minutes of the CPU backend on two cores; checked before running.
  int64_t max_work_macs = int64_t{1} << 40;
  int max_configs = 64;
  int max_top_k = 1000;
  int max_top_groups = 100;
  int max_repeat = 100;
  // Algorithms tried per configuration by a sweep, and configurations run
  // once the sweep has expanded them.
  int max_algorithm_sweep = 16;
  int max_swept_configs = 256;
  // Batch invariance: sub-batch sizes a request may list, and runs of
  // sub-batches over all its configurations.
  int max_batch_sizes = 8;
  int64_t max_sub_batch_runs = int64_t{1} << 16;
};

struct EngineOptions {
  RequestLimits limits;
  // Statistics worker threads; 0: hardware concurrency.
  int stats_threads = 0;
  // Runs the statistics of every request (Compare, the error model's
  // per-element passes, the candidates' scoring); null: each request's own
  // thread. Not owned: TensorCheckServer makes one for all requests and
  // keeps it alive longer than the engine.
  Executor* executor = nullptr;
  // The reference of a request that names none. Empty: the fp64
  // configuration of the fastest available backend that adds the bias in
  // one rounding (cublaslt:fp64 on a GPU host, cpu:fp64 elsewhere;
  // docs/numerics.md, "The reference"), resolved by Create; options()
  // then holds the resolved one.
  std::string default_reference;
  // Do work that configurations have in common once: one error-model
  // array per set of parameters, and where the session can
  // (SessionCapabilities: the host's) one GEMM for the configurations that
  // multiply the same operands in the same arithmetic (RunBatch) and one
  // comparison per bitwise-equal output. Off: every configuration runs and
  // is compared on its own (a baseline for diagnose_bench).
  bool share_computations = true;
  // Run a request whose reference and configurations are all on one
  // device as one session there (device_session.h): operands uploaded
  // once, weights resident, the error model and every comparison on the
  // device. Off, and for a request that mixes devices: a session of the
  // host device (server/backends/cpu/host_device.h), where each device
  // configuration runs on its own session of its device through its
  // backend's Run, and its output is compared on the host (the baseline
  // of gpu_bench).
  bool device_sessions = true;
  // Kernels recorded on GPUs (kernel_orders.h): the orders a diagnosis
  // replays when a request names a GPU; none: each generation's model
  // from k = 0.
  std::vector<KernelOrderTable> kernel_orders;
};

// What the client asked for, already decoded into core types.
struct ToleranceRequest {
  TolerancePreset preset = TolerancePreset::kTorch;
  std::optional<double> atol;
  std::optional<double> rtol;
  uint64_t max_ulp = 0;
  double bound_factor = 0;  // 0: 1
  bool nan_equal = false;
  std::string bound_precision;  // empty: natural precision of the dtype
};

// The bound_ratio above which a layer call diverges when the request
// names none (docs/model-checks.md, "The rules"): three times the error its
// output precision's model predicts.
inline constexpr double kDefaultBoundThreshold = 3.0;

struct LinearRequest {
  Tensor input;
  Tensor weight;
  WeightLayout layout = WeightLayout::kOutIn;
  std::optional<Tensor> bias;
  Activation activation = Activation::kNone;
  std::optional<DType> output_dtype;
  // Dequantisation scales of FP8 and FP4 input and weight, as
  // torch._scaled_mm's scale_a and scale_b: float32 per tensor ([] or
  // [1]), row-wise ([M] and [N]) or block-wise; float8_e8m0fnu (MXFP8) or
  // float8_e4m3fn (NVFP4) block scales, plain or swizzled; required with
  // narrow operands, refused without (docs/numerics.md, "FP8").
  std::optional<Tensor> input_scale;
  std::optional<Tensor> weight_scale;
  // NVFP4's per-tensor fp32 scales, required with FP4 operands only.
  std::optional<Tensor> input_global_scale;
  std::optional<Tensor> weight_global_scale;
  std::optional<Tensor> observed;
  std::vector<std::string> configs;
  std::string reference;  // empty: options.default_reference
  ToleranceRequest tolerance;
  bool return_outputs = false;
  int top_k = 0;       // 0: 10
  int top_groups = 0;  // 0: 5
  int repeat = 0;      // 0: 1
  bool disallow_reduced_precision_reduction = false;
  // Run each configuration that names no algorithm with each of the first
  // `algorithm_sweep` algorithms its backend offers for this problem
  // (LinearBackend::Algorithms), as `...@algo=N` configurations; backends
  // with one algorithm run theirs. 0: no sweep (docs/numerics.md,
  // "Algorithms").
  int algorithm_sweep = 0;
  // Run every configuration (the reference's included) on the whole batch
  // and on sub-batches of single rows and of each listed size (1..M), and
  // report whether each row keeps its bits (batch_invariance.h).
  bool batch_invariance = false;
  std::vector<int64_t> batch_sizes;
  // Configurations the user accepts (ParseConfigPattern's forms): the
  // observed output passes when its diagnosis is rounding of one. Verify
  // then diagnoses too; a pattern no configuration of the request matches
  // adds its configuration (both bias placements when it names none).
  std::vector<std::string> accept;
  // The bound_ratio above which the call diverges (CallDecision); unset:
  // kDefaultBoundThreshold.
  std::optional<double> bound_threshold;
  // A GPU (ParseGpuName's names): a diagnosis over default candidates adds
  // the CPU replays of that GPU's default kernels (docs/numerics.md,
  // "Kernel K order") to its first tier. Empty: none.
  std::string gpu;
};

struct ConfigOutcome {
  std::string config;  // canonical
  DiffStats vs_reference;
  std::optional<DiffStats> vs_observed;
  double elapsed_ms = 0;
  std::optional<Tensor> output;  // when return_outputs, shaped [..., N]
  std::map<std::string, std::string> details;
  bool deterministic = true;
  int runs = 1;
  // The configuration whose GEMM this one reused (RunResult's).
  std::string shared_computation;
  // When the request asked for batch invariance.
  std::optional<BatchInvarianceOutcome> batch_invariance;
};

struct RankedCandidate {
  std::string config;
  double bitwise_equal_fraction = 0;
  uint64_t max_ulp = 0;
  double mean_ulp = 0;
  std::optional<double> bound_ratio;
  std::vector<std::string> equivalent;
  // The plausibility test (docs/numerics.md): elements that differ from
  // the observed output in bits, how many the candidate's own summation
  // noise predicts, and the Poisson probability of at least that many.
  int64_t disagreements = 0;
  double expected_disagreements = 0;
  double plausibility_p = 1;
  bool plausible = false;
  double consistent_fraction = 0;
  int64_t compared_elements = 0;
  // Why it cannot be best, in one sentence; empty when it could.
  std::string ruled_out;
  std::string shared_computation;
  // Every element bitwise equal to the observed output: ranked before
  // any candidate that is only consistent with it.
  bool exact = false;
  // The kernel, as its backend reports it (ConfigOutcome::details without
  // timings): the algorithm a sweep ran.
  std::map<std::string, std::string> details;
  // Which frameworks compute it by default for the storage dtype
  // (FrameworkDefault); empty when none does.
  std::string framework_default;
  // It matches a configuration the request accepts.
  bool accepted = false;
};

// Bug or rounding (docs/numerics.md, "Verdict").
enum class DiagnosisVerdict {
  kUnspecified,
  kRounding,     // every element, column and row consistent with best
  kDefect,       // best explains the bulk; `defect` lists what it does not
  kUnexplained,  // no candidate explains the bulk
};

// A column or row of the verdict's scan against best.
struct DefectGroup {
  int64_t index = 0;
  int64_t disagreements = 0;  // elements differing from best in bits
  double expected_disagreements = 0;
  double p_value = 1;  // Poisson tail times the groups tested, capped at 1
  int64_t beyond_threshold = 0;
  uint64_t max_ulp = 0;
  double max_sigma = 0;
  // The shift test (columns only): t = sum(e) / sqrt(sum(e^2)) over the
  // elements that differ, e = (o - v) / pair accumulation sigma, and its
  // two-sided Gaussian tail times the columns tested, capped at 1.
  double shift_t = 0;
  double shift_p_value = 1;
};

struct DefectElement {
  ElementDiff element;
  double sigma = 0;  // distance beyond rounding, in pair accumulation sigmas
};

// What is not rounding of best.
struct DefectReport {
  double element_threshold_sigma = 0;
  double false_alarm_rate = 0;
  int64_t element_count = 0;
  std::vector<DefectElement> elements;
  std::vector<DefectGroup> columns;
  std::vector<DefectGroup> rows;
  uint64_t max_ulp = 0;
  double max_sigma = 0;
  std::string where_to_look;
};

struct DiagnosisOutcome {
  DiagnosisVerdict verdict = DiagnosisVerdict::kUnspecified;
  std::string verdict_reason;
  std::optional<DefectReport> defect;
  std::optional<std::string> best;
  std::vector<std::string> equivalent;
  std::vector<std::string> tied;
  double confidence = 0;
  std::vector<RankedCandidate> ranking;
  std::string framework_hint;
  std::vector<GroupCount> columns;
  std::vector<GroupCount> rows;
  std::vector<ElementDiff> outliers;
  std::string explanation;
  DType compared_dtype = DType::kFloat32;
  // The answer in words, first (docs/numerics.md, "Verdict").
  std::string headline;
  // What to change (docs/numerics.md, "What to change"); may be empty.
  std::string advice;
  // With accepted configurations: whether the output is rounding of one
  // (best, or one equivalent or tied to it), and which.
  bool accepted = false;
  std::string accepted_as;
  // The tiers of default candidates that ran (docs/numerics.md,
  // "Diagnosis"): {1}, or {1, 2} when the first left the output
  // unexplained and the second ran; empty when the request named its
  // candidates.
  std::vector<int> candidate_tiers;
};

// The decisions about one layer call that a whole-model check rests on
// (docs/model-checks.md, "The rules"), made here so that every client
// reads the same ones; clients keep only what spans calls (the consensus,
// the first divergence). Filled by DecideCall (call_decision.h).
struct CallDecision {
  // Diagnose: some configuration explains the output; Verify: it passed.
  bool explained = false;
  // Every configuration that explains the output, best first: best, the
  // equivalent and the tied ones, and without a bias `b:p:none` followed
  // by `b:p:fused` and `b:p:unfused` (which compute the same then).
  std::vector<std::string> explaining;
  // Why the call diverges whatever the other calls say (a non-finite
  // observed output, a "defect" or "unexplained" verdict, no explaining
  // configuration); empty when none of these holds.
  std::string divergence;
  // The threshold applied, whether bound_ratio exceeds it (a NaN ratio
  // does), and the sentence saying so.
  double bound_threshold = 0;
  bool bound_exceeded = false;
  std::string bound_reason;
};

struct VerifyOutcome {
  bool passed = false;
  Tolerance tolerance;  // as applied to the output dtype
  std::optional<DiffStats> observed_vs_reference;
  // The precision whose error model observed_vs_reference is judged by.
  Precision observed_bound_precision = Precision::kFp32;
  ConfigOutcome reference;
  std::vector<ConfigOutcome> results;
  std::vector<int64_t> output_shape;
  std::vector<std::string> notes;
  std::optional<DiagnosisOutcome> diagnosis;
  // What a whole-model check needs of this call (call_decision.h).
  CallDecision call;
};

// A configuration the engine can run here, with its backend.
struct ComparedOutcome {
  std::string name;
  // The output against the reference, and its diagnosis.
  DiffStats vs_reference;
  // The precision whose error model vs_reference is judged by.
  Precision bound_precision = Precision::kFp32;
  DiagnosisOutcome diagnosis;
};

struct OutputPairOutcome {
  std::string a, b;
  DiffStats stats;  // a vs b
  bool rounding = false;
  double configs_max_abs = 0;
  double expected_max_abs = 0;
  std::string advice_b_to_a, advice_a_to_b;
};

struct CompareOutcome {
  std::string headline;
  std::vector<ComparedOutcome> outputs;
  OutputPairOutcome pair;
  std::string reference;
  std::vector<int64_t> output_shape;
  std::vector<std::string> notes;
  // With request.accept (verdict_set): every output accepted.
  bool passed = false;
  bool verdict_set = false;
};

struct AvailableConfig {
  std::string config;
  std::string backend;
};

class Engine {
 public:
  // `registry` must outlive the engine.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const EngineOptions& options,
                                                        const BackendRegistry* registry);

  // Runs the reference and every configuration; compares. Errors:
  // INVALID_ARGUMENT (names the field), RESOURCE_EXHAUSTED (limits, checked
  // before anything runs: sizes, work, a response over the message limit),
  // NOT_FOUND (backend), FAILED_PRECONDITION (backend not on this host or
  // configuration unsupported), INTERNAL (device failure), and CANCELLED or
  // DEADLINE_EXCEEDED when `stop` fires (checked between configurations,
  // repeats, GEMM tiles, statistics chunks; null: never stops). `progress`
  // (null: nobody asks) is told each phase and counts the reference and
  // each configuration as it is run and compared.
  absl::StatusOr<VerifyOutcome> Verify(const LinearRequest& request,
                                       const StopSignal* stop = nullptr,
                                       RequestProgress* progress = nullptr) const;

  // Verify over the candidate set (request.configs, or the default set when
  // empty) and rank the candidates against the observed output, which is
  // required.
  absl::StatusOr<VerifyOutcome> Diagnose(const LinearRequest& request,
                                         const StopSignal* stop = nullptr,
                                         RequestProgress* progress = nullptr) const;

  // Two outputs of one layer (`observed`, by name; request.observed is
  // ignored), each diagnosed against the same candidates, and the two
  // against each other (docs/numerics.md, "Comparing two outputs").
  // Errors as Diagnose's, naming `observed[i]`.
  absl::StatusOr<CompareOutcome> CompareOutputs(
      const LinearRequest& request, const std::vector<std::pair<std::string, Tensor>>& observed,
      const StopSignal* stop = nullptr, RequestProgress* progress = nullptr) const;

  // Host memory the engine may hold while running `request` beyond its
  // tensors: operand copies, accumulators, reference values, error-model
  // arrays, the outputs it keeps and the serialised response. An upper
  // estimate for admission by bytes (the service reserves it before
  // running); 0 when the request is too malformed to size (MakePlan then
  // refuses it anyway).
  int64_t EstimateWorkingBytes(const LinearRequest& request, bool diagnose) const;

  // Every precision x bias mode this host runs, on the best backend for
  // each (GPU before CPU emulation), for input and weight stored as
  // `storage` and `weight_storage`. For FP8 operands: the fp8 precision of
  // their formats, with and without fast accumulation, at `scaling` (what
  // the request's scales say); MXFP8/NVFP4 operands: `block_precision`. With `layer`, only backends
  // whose SupportsProblem accepts it (cuBLASLt's FP8 shape rules, and whether its heuristic has a
  // kernel for the layer). `passed_over`, when given, receives for each candidate that went to
  // another backend that way the device configuration it replaces and the device's reason. With
  // `layer`, `prepared` (when given) receives each candidate prepared for
  // it (LinearBackend::Prepare), so that the plan asks no rule again.
  // These are the first tier of default candidates (FirstTierCandidateSpecs
  // on the best backend for each); SecondTierCandidates below the second.
  std::vector<std::string> DefaultCandidates(
      DType storage, DType weight_storage, bool has_bias, Activation activation,
      Fp8Scaling scaling = Fp8Scaling::kTensor,
      const std::optional<LinearProblem>& layer = std::nullopt,
      std::map<std::string, std::string>* passed_over = nullptr,
      std::vector<PreparedRun>* prepared = nullptr,
      std::optional<Precision> block_precision = std::nullopt) const;

  // The second tier of default candidates (SecondTierCandidateSpecs), each
  // on the best backend for it as DefaultCandidates chooses, with the same
  // arguments. A default diagnosis runs them only when the first tier
  // leaves the output unexplained (docs/numerics.md, "Diagnosis").
  std::vector<std::string> SecondTierCandidates(
      DType storage, DType weight_storage, bool has_bias, Activation activation,
      const std::optional<LinearProblem>& layer = std::nullopt,
      std::map<std::string, std::string>* passed_over = nullptr,
      std::vector<PreparedRun>* prepared = nullptr) const;

  // The replays of `gpu`'s default kernels for this layer
  // (ReplayOrderFor): each first-tier candidate whose precision a replay
  // takes (TakesMma; FP8 from sm90, not block-wise) with the recorded
  // kernel's options, on the backend that replays kernels, with the same
  // arguments as DefaultCandidates. `sources`, when given, receives each
  // distinct ReplayOrder::source.
  std::vector<std::string> ReplayCandidates(TensorCoreGpu gpu, DType storage, DType weight_storage,
                                            bool has_bias, Activation activation,
                                            Fp8Scaling scaling, const LinearProblem& layer,
                                            std::vector<PreparedRun>* prepared = nullptr,
                                            std::optional<Precision> block_precision = std::nullopt,
                                            std::vector<std::string>* sources = nullptr) const;

  const EngineOptions& options() const { return options_; }
  const BackendRegistry& registry() const { return *registry_; }

 private:
  Engine(const EngineOptions& options, const BackendRegistry* registry)
      : options_(options), registry_(registry) {}

  struct Plan;       // internal/plan.h
  struct Artifacts;  // internal/plan.h
  // device_execution.cc: a whole request as one session of a device (the
  // one that runs it whole, or the host's).
  class DeviceExecution;
  // Validates `request` and decides what runs: request.configs, or for a
  // diagnosis that names none the default candidates for this layer.
  // With `first_tier` (the plan of a diagnosis over the first tier of
  // default candidates, already run): the plan over both tiers, whose
  // cost counts the first's runs too; over max_configs it is then
  // RESOURCE_EXHAUSTED, as the cost limits are.
  absl::StatusOr<Plan> MakePlan(const LinearRequest& request, bool diagnose, const StopSignal* stop,
                                const Plan* first_tier = nullptr) const;
  // `specs` on the best backend for each, both bias placements
  // (DefaultCandidates' arguments).
  std::vector<std::string> OnBestBackends(const std::vector<ConfigSpec>& specs, DType storage,
                                          bool has_bias, Activation activation,
                                          const std::optional<LinearProblem>& layer,
                                          std::map<std::string, std::string>* passed_over,
                                          std::vector<PreparedRun>* prepared) const;
  // A compared pair's headline and advice, from the two diagnoses.
  static void CompareWords(const LinearRequest& request, CompareOutcome* out);
  // Diagnoses `request.observed` over `plan`'s configurations:
  // RankPlanned, then FinishDiagnosis.
  absl::StatusOr<VerifyOutcome> DiagnosePlanned(const LinearRequest& request, const Plan& plan,
                                                const StopSignal* stop) const;
  // Runs `plan` and ranks its configurations against the observed output.
  absl::StatusOr<VerifyOutcome> RankPlanned(const LinearRequest& request, const Plan& plan,
                                            const StopSignal* stop) const;
  // What follows the ranking: the batch-invariance runs, the accepted
  // verdict, the outputs returned.
  absl::Status FinishDiagnosis(const LinearRequest& request, const Plan& plan,
                               VerifyOutcome* outcome) const;
  // RESOURCE_EXHAUSTED when the plan's work or response is over a limit.
  absl::Status CheckCost(const Plan& plan, const LinearRequest& request, bool diagnose) const;
  // With `artifacts`, keeps what a diagnosis needs (its evidence, on the
  // session). On one device (DeviceOf) when the plan allows, else on the
  // host device.
  absl::StatusOr<VerifyOutcome> Run(const LinearRequest& request, const Plan& plan,
                                    Artifacts* artifacts) const;
  // The device that runs the reference and every configuration of `plan`,
  // when one does and device sessions are on; null otherwise.
  ComputeDevice* DeviceOf(const Plan& plan) const;
  // The layer of `request` as backends take it, sized by `plan`.
  static LinearProblem ProblemOf(const LinearRequest& request, const Plan& plan);
  // Replaces each configuration of `plan` that names no algorithm, on a
  // backend that selects algorithms, by its first `sweep` algorithms.
  absl::Status SweepAlgorithms(const LinearRequest& request, int sweep, Plan* plan) const;
  // Fills each outcome's batch_invariance.
  absl::Status CheckBatches(const LinearRequest& request, const Plan& plan,
                            VerifyOutcome* outcome) const;
  // Side facts worth knowing for this request (VerifyOutcome::notes).
  static std::vector<std::string> Notes(const LinearRequest& request, const Plan& plan);

  EngineOptions options_;
  const BackendRegistry* registry_;
  // The host as a device (server/backends/cpu/host_device.h): where a
  // request runs that no one device runs whole.
  std::unique_ptr<ComputeDevice> host_device_;
};

// The first tier of a diagnosis's default candidates, before bias modes
// and backends (docs/numerics.md, "Diagnosis"): for wide operands the wide
// precisions (fp64 .. fp16acc); for FP8 operands the fp8 precision of
// their formats at `scaling` (what the request's scales say), with and
// without fast accumulation.
// MXFP8/NVFP4 operands: `block_precision`, the precision their scales say.
std::vector<ConfigSpec> FirstTierCandidateSpecs(
    DType storage, DType weight_storage, Fp8Scaling scaling,
    std::optional<Precision> block_precision = std::nullopt);

// The second tier: emulations that cost more than the first tier's and
// run only when it leaves the output unexplained. For wide operands
// (fp32, bf16, fp16): the FP8 recipes the server quantises with (torchao's
// Float8Linear tensorwise and rowwise: fp8e4m3 at scaling=tensor and
// scaling=row; DeepSeek-V3's blocks, scaling=block128; each with and
// without fast_accum), the block-scaled ones (mxfp8e4m3 with torchao's
// floor and TransformerEngine's rceil scale rounding, nvfp4), then the
// multi-pass
// precisions that differ from one pass over this storage dtype (those
// whose parts do not hold all its values, StorageExactIn: bf16x3, bf16x6
// and tf32x3 for fp32, bf16x3 for fp16, none for bf16). None for FP8 or
// fp64 operands. The one list of them: a recipe the server learns to
// quantise with is appended here.
// Then, for bf16 and fp16 storage, split-K reduced in the output type at
// each count of kScannedSplitK whose slices all hold some of `k` (0: K
// unknown, every count).
std::vector<ConfigSpec> SecondTierCandidateSpecs(DType storage, DType weight_storage,
                                                 int64_t k = 0);

// Multi-dimensional index of flat element `flat` in `shape` (row-major).
std::vector<int64_t> UnflattenIndex(int64_t flat, const std::vector<int64_t>& shape);

}  // namespace tensorcheck
