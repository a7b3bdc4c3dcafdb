// Engine::DeviceExecution: every request, as one session of one device
// (server/backends/device_session.h; docs/architecture.md, "The life of a
// request"): the device that runs the reference and every configuration
// whole (a GPU's: "A request on the device"), else the host's
// (server/backends/cpu/host_device.h), where each configuration runs on
// its own backend. The request's tensors are uploaded once (a host
// session reads them in place; a device serves a stored weight from its
// resident cache); the reference, every configuration, the error model's
// magnitude sums and arrays, the flip grid and every comparison run on the
// session; only the statistics come back, and the outputs the client
// asked for. A diagnosis keeps the session open after the run: its
// per-element passes run there too (SessionEvidence), and only their sums
// come back.
//
// Work that several configurations have in common is done once when
// EngineOptions::share_computations is on (the default):
//   - error-model arrays are computed once per set of parameters that
//     determine them (bf16 tensors under fp32, tf32 and bf16 have equal
//     ones; internal/model_key.h);
//   - where the session batches runs (SessionCapabilities::batched_runs,
//     the host's), the reference and the configurations run as one batch:
//     the CPU backend runs one GEMM per arithmetic (docs/numerics.md,
//     "Shared computations");
//   - where its comparisons may be cached (cached_comparisons, the
//     host's), outputs known to be bitwise equal (same GEMM, same
//     epilogue) are compared once per error-model array and the
//     statistics copied.
// With it off, every configuration runs and is compared on its own, as
// diagnose_bench's baseline does.
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "server/backends/device_session.h"
#include "server/engine/internal/diagnosis_evidence.h"
#include "server/engine/internal/model_key.h"
#include "server/engine/internal/plan.h"

namespace tensorcheck {

namespace {

using Clock = std::chrono::steady_clock;
using internal::ModelKey;

double MillisSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

SessionModelSpec::Kind SpecKind(ModelKey::Kind kind) {
  switch (kind) {
    case ModelKey::kSigma:
      return SessionModelSpec::kSigma;
    case ModelKey::kBound:
      return SessionModelSpec::kBound;
    case ModelKey::kPairSigma:
      return SessionModelSpec::kPairSigma;
    case ModelKey::kPairAccumulation:
      return SessionModelSpec::kPairAccumulation;
  }
  return SessionModelSpec::kSigma;
}

// A candidate's arrays on the device, for a diagnosis.
struct CandidateArrays {
  ArrayRef output, pair_sigma, pair_accumulation_sigma, sigma_vs_reference, flip_grid;
};

// DiagnosisEvidence over the arrays a device execution left on its
// session (which it owns from then on): each pass is one of the session's
// diagnosis calls; the explained set is a mask on the device. Only
// Unexplained copies arrays back (the mask and one output), and only when
// some element is unexplained.
class SessionEvidence final : public DiagnosisEvidence {
 public:
  SessionEvidence(std::unique_ptr<DeviceSession> session, const Tensor& observed_host,
                  ArrayRef observed, ArrayRef reference, std::vector<CandidateArrays> candidates,
                  DType compared, int64_t cols)
      : session_(std::move(session)),
        observed_host_(observed_host),
        observed_(observed),
        reference_(reference),
        candidates_(std::move(candidates)),
        compared_(compared),
        cols_(cols) {}

  absl::StatusOr<bool> SameBits(size_t a, size_t b) override {
    return session_->SameBits(candidates_[a].output, candidates_[b].output);
  }

  absl::StatusOr<int64_t> Explain(size_t c) override {
    TC_ASSIGN_OR_RETURN(const ArrayRef mask, Mask());
    return session_->MarkConsistent(mask, observed_, candidates_[c].output,
                                    candidates_[c].pair_sigma, compared_);
  }

  absl::StatusOr<std::vector<rules::ScoreSums>> Score(const std::vector<size_t>& candidates,
                                                      bool every_element) override {
    TC_ASSIGN_OR_RETURN(const ArrayRef mask, Mask());
    std::vector<SessionScoreSpec> specs;
    for (size_t c : candidates) {
      const CandidateArrays& a = candidates_[c];
      SessionScoreSpec spec;
      spec.observed = observed_;
      spec.candidate = a.output;
      spec.pair_sigma = a.pair_sigma;
      spec.pair_accumulation_sigma = a.pair_accumulation_sigma;
      spec.flip_grid = a.flip_grid;
      spec.mask = every_element ? ArrayRef{} : mask;
      spec.compared = compared_;
      specs.push_back(spec);
    }
    return session_->ScoreAll(specs);
  }

  absl::StatusOr<rules::PairedSums> Paired(size_t best, size_t runner) override {
    TC_ASSIGN_OR_RETURN(const ArrayRef mask, Mask());
    return session_->Paired(observed_, candidates_[best].output, candidates_[runner].output,
                            candidates_[best].pair_sigma, mask, compared_);
  }

  absl::StatusOr<DifferingCounts> Differing(size_t c, bool every_element) override {
    TC_ASSIGN_OR_RETURN(const ArrayRef mask, Mask());
    return session_->Differing(observed_, candidates_[c].output, every_element ? ArrayRef{} : mask,
                               cols_, compared_);
  }

  absl::StatusOr<std::optional<rules::ErrorSums>> ErrorVsReference(size_t c) override {
    TC_ASSIGN_OR_RETURN(const ArrayRef mask, Mask());
    TC_ASSIGN_OR_RETURN(
        rules::ErrorSums s,
        session_->ErrorVsReference(observed_, reference_, candidates_[c].sigma_vs_reference, mask));
    return std::optional<rules::ErrorSums>(s);
  }

  absl::StatusOr<std::vector<ElementDiff>> Unexplained(size_t c) override {
    TC_ASSIGN_OR_RETURN(const ArrayRef mask, Mask());
    TC_ASSIGN_OR_RETURN(const std::vector<uint8_t> explained, session_->DownloadMask(mask));
    TC_ASSIGN_OR_RETURN(const Tensor output, session_->Download(candidates_[c].output));
    if (static_cast<int64_t>(explained.size()) != observed_host_.numel() ||
        output.numel() != observed_host_.numel()) {
      return absl::InternalError("device diagnosis arrays of the wrong size");
    }
    return internal::UnexplainedDiffs(observed_host_, output, explained, compared_);
  }

  // The scan runs on the host, over the candidate's output and two of
  // its arrays brought back: it keeps per-column and per-row sums, which
  // a device would add with floating atomics in no fixed order.
  absl::StatusOr<DefectScan> ScanDefects(size_t c, const DefectScanInput& scan) override {
    const CandidateArrays& a = candidates_[c];
    TC_ASSIGN_OR_RETURN(const Tensor output, session_->Download(a.output));
    TC_ASSIGN_OR_RETURN(const Tensor acc, session_->Download(a.pair_accumulation_sigma));
    TC_ASSIGN_OR_RETURN(const Tensor grid, session_->Download(a.flip_grid));
    const int64_t count = observed_host_.numel();
    if (output.numel() != count || acc.numel() != count || grid.numel() != count ||
        acc.dtype() != DType::kFloat32 || grid.dtype() != DType::kFloat32) {
      return absl::InternalError("device diagnosis arrays of the wrong size");
    }
    DefectScanInput s = scan;
    s.observed = &observed_host_;
    s.candidate = &output;
    s.pair_accumulation_sigma = static_cast<const float*>(acc.raw());
    s.flip_grid = static_cast<const float*>(grid.raw());
    s.compared = compared_;
    s.cols = cols_;
    return DefectScanPass(s);
  }

  void Describe(std::map<std::string, std::string>* details) const override {
    if (!session_->capabilities().host_memory) DescribeCounters(session_->counters(), details);
  }

  // The session's counters as a result's details (session_*).
  static void DescribeCounters(const SessionCounters& c,
                               std::map<std::string, std::string>* details) {
    std::map<std::string, std::string>& d = *details;
    d["session"] = "device";
    d["session_uploads"] = absl::StrCat(c.uploads);
    d["session_upload_bytes"] = absl::StrCat(c.upload_bytes);
    d["session_resident_hits"] = absl::StrCat(c.resident_hits);
    d["session_resident_hit_bytes"] = absl::StrCat(c.resident_hit_bytes);
    d["session_downloads"] = absl::StrCat(c.downloads);
    d["session_download_bytes"] = absl::StrCat(c.download_bytes);
    d["session_runs"] = absl::StrCat(c.runs);
    d["session_comparisons"] = absl::StrCat(c.comparisons);
    d["session_model_arrays"] = absl::StrCat(c.model_arrays);
    d["session_diagnosis_passes"] = absl::StrCat(c.diagnosis_passes);
  }

 private:
  // The explained set, made on first use.
  absl::StatusOr<ArrayRef> Mask() {
    if (!mask_.valid()) {
      TC_ASSIGN_OR_RETURN(mask_, session_->NewMask(observed_host_.numel()));
    }
    return mask_;
  }

  std::unique_ptr<DeviceSession> session_;
  const Tensor& observed_host_;
  const ArrayRef observed_, reference_;
  const std::vector<CandidateArrays> candidates_;
  const DType compared_;
  const int64_t cols_;
  ArrayRef mask_;
};

}  // namespace

class Engine::DeviceExecution {
 public:
  DeviceExecution(const EngineOptions& options, const LinearRequest& req, const Engine::Plan& plan,
                  Engine::Artifacts* artifacts, ComputeDevice* device)
      : bound_used_(plan.tolerance.preset == TolerancePreset::kBound),
        share_(options.share_computations),
        req_(req),
        plan_(plan),
        artifacts_(artifacts),
        device_(device) {
    count_ = plan.shape.m * plan.shape.n;
  }

  absl::StatusOr<VerifyOutcome> Run() {
    outcome_.tolerance = plan_.tolerance;
    outcome_.output_shape = plan_.output_shape;
    outcome_.observed_bound_precision = plan_.observed_bound_precision;
    TC_ASSIGN_OR_RETURN(session_, device_->OpenSession(plan_.run.stop));
    caps_ = session_->capabilities();
    results_.resize(plan_.configs.size());
    TC_RETURN_IF_ERROR(UploadOperands());
    if (share_ && caps_.batched_runs) {
      TC_RETURN_IF_ERROR(RunBatched());
    } else {
      TC_RETURN_IF_ERROR(RunOneByOne());
    }
    TC_RETURN_IF_ERROR(FinishReference());
    bool all_pass = true;
    for (std::optional<ConfigOutcome>& r : results_) {
      all_pass = all_pass && r->vs_reference.passed;
      outcome_.results.push_back(*std::move(r));
    }
    outcome_.passed =
        outcome_.observed_vs_reference ? outcome_.observed_vs_reference->passed : all_pass;
    outcome_.notes = Engine::Notes(req_, plan_);
    if (!caps_.host_memory) {
      SessionEvidence::DescribeCounters(session_->counters(), &outcome_.reference.details);
    }
    if (artifacts_ != nullptr && req_.observed) {
      // The diagnosis's passes run on this session, over what it holds.
      artifacts_->evidence = std::make_unique<SessionEvidence>(
          std::move(session_), *req_.observed, observed_, reference_.output, std::move(candidates_),
          plan_.shape.output_dtype, plan_.shape.n);
    }
    return std::move(outcome_);
  }

 private:
  struct ModelArray {
    ArrayRef values;
    double sum_sq = -1;
  };
  struct Options {
    ModelArray sigma, bound, pair;
    SessionCompare vs_reference, vs_observed;
  };
  // Statistics of one comparison, keyed by what determines them: the
  // output's class (outputs of one class are bitwise equal), which side of
  // which comparison, and the error-model arrays it reads.
  struct StatsKey {
    std::string output_class;
    bool vs_observed = false;
    int sigma = -1;
    int bound = -1;
    bool operator<(const StatsKey& o) const {
      return std::tie(output_class, vs_observed, sigma, bound) <
             std::tie(o.output_class, o.vs_observed, o.sigma, o.bound);
    }
  };

  // ---- Steps.

  // The operands, their scales and the observed output, each copied once
  // (a host session reads them in place).
  absl::Status UploadOperands() {
    TC_ASSIGN_OR_RETURN(op_.input, session_->Upload(req_.input));
    TC_ASSIGN_OR_RETURN(op_.weight, session_->Upload(req_.weight));
    if (req_.bias) {
      TC_ASSIGN_OR_RETURN(op_.bias, session_->Upload(*req_.bias));
    }
    // Block scales as the plan converted them, else as they came.
    const std::optional<Tensor>& input_scale =
        plan_.input_scale ? plan_.input_scale : req_.input_scale;
    const std::optional<Tensor>& weight_scale =
        plan_.weight_scale ? plan_.weight_scale : req_.weight_scale;
    if (input_scale) {
      TC_ASSIGN_OR_RETURN(op_.input_scale, session_->Upload(*input_scale));
    }
    if (weight_scale) {
      TC_ASSIGN_OR_RETURN(op_.weight_scale, session_->Upload(*weight_scale));
    }
    if (req_.input_global_scale) {
      TC_ASSIGN_OR_RETURN(op_.input_global_scale, session_->Upload(*req_.input_global_scale));
    }
    if (req_.weight_global_scale) {
      TC_ASSIGN_OR_RETURN(op_.weight_global_scale, session_->Upload(*req_.weight_global_scale));
    }
    if (req_.observed) {
      TC_ASSIGN_OR_RETURN(observed_, session_->Upload(*req_.observed));
    }
    op_.shape() = plan_.shape;
    op_.scale_blocks = plan_.scale_blocks;
    return absl::OkStatus();
  }

  // The reference, then each configuration on its own.
  absl::Status RunOneByOne() {
    const auto start = Clock::now();
    auto run = session_->Run(op_, plan_.reference_run, plan_.run);
    if (!run.ok()) return WithConfigContext(run.status(), plan_.reference);
    TC_RETURN_IF_ERROR(OnReference(*std::move(run), MillisSince(start)));
    for (size_t i = 0; i < plan_.configs.size(); ++i) {
      TC_RETURN_IF_ERROR(CheckStop(plan_.run.stop));
      const auto config_start = Clock::now();
      auto config_run = session_->Run(op_, plan_.runs[i], plan_.run);
      if (!config_run.ok()) return WithConfigContext(config_run.status(), plan_.configs[i]);
      const double run_ms = MillisSince(config_start);
      TC_ASSIGN_OR_RETURN(ConfigOutcome o, Compared(i, *std::move(config_run), run_ms));
      // On a device the time includes the statistics (docs/json-report.md).
      if (!caps_.host_memory) o.elapsed_ms = MillisSince(config_start);
      results_[i] = std::move(o);
      AdvanceProgress(plan_.progress);
    }
    return absl::OkStatus();
  }

  // The reference and every configuration as one batch of the session
  // (SessionCapabilities::batched_runs: one GEMM per arithmetic on the
  // CPU backend), each compared as it arrives, the reference first.
  absl::Status RunBatched() {
    std::vector<PreparedRun> runs;
    runs.reserve(plan_.configs.size() + 1);
    runs.push_back(plan_.reference_run);
    for (const PreparedRun& r : plan_.runs) runs.push_back(r);
    absl::Status consumer_status;
    auto last = Clock::now();
    absl::Status run = session_->RunBatch(
        op_, runs, plan_.run, [&](size_t index, SessionRun result) -> absl::Status {
          const double ms = MillisSince(last);
          consumer_status = OnBatchResult(index, std::move(result), ms);
          last = Clock::now();
          return consumer_status;  // an error ends the batch, and RunBatch returns it
        });
    if (!consumer_status.ok()) return consumer_status;
    return run;  // the backend's error names its configuration
  }

  // Result `index` of the batch: the reference (0), else configuration
  // index - 1. A stop ends the batch here.
  absl::Status OnBatchResult(size_t index, SessionRun result, double ms) {
    TC_RETURN_IF_ERROR(CheckStop(plan_.run.stop));
    if (index == 0) return OnReference(std::move(result), ms);
    TC_ASSIGN_OR_RETURN(results_[index - 1], Compared(index - 1, std::move(result), ms));
    AdvanceProgress(plan_.progress);
    return absl::OkStatus();
  }

  absl::Status OnReference(SessionRun run, double ms) {
    reference_ = std::move(run);
    reference_ms_ = ms;
    TC_RETURN_IF_ERROR(PrepareErrorModel());
    AdvanceProgress(plan_.progress);
    return absl::OkStatus();
  }

  // The magnitude sums every array is built from, then the observed
  // output against the reference.
  absl::Status PrepareErrorModel() {
    bool need_dot = artifacts_ != nullptr && req_.observed.has_value();
    for (const Config& c : plan_.configs) {
      need_dot = need_dot || (c.bias == BiasMode::kUnfused && req_.bias.has_value());
    }
    // The observed output's bound allows its bias to have been added after
    // a rounding of x.w (whichever way the producer added it).
    need_dot = need_dot || (bound_used_ && req_.observed && req_.bias);
    TC_ASSIGN_OR_RETURN(sums_,
                        session_->MagnitudeSums(op_, bound_used_, /*sq_dot=*/true, need_dot));
    if (!req_.observed) return absl::OkStatus();
    TC_ASSIGN_OR_RETURN(const ModelArray sigma,
                        Model(ModelKey::kSigma, plan_.observed_bound_precision, false));
    ModelArray bound;
    if (bound_used_) {
      TC_ASSIGN_OR_RETURN(bound, Model(ModelKey::kBound, plan_.observed_bound_precision,
                                       /*unfused=*/req_.bias.has_value()));
    }
    SessionCompare c{plan_.compare, sigma.values, bound.values};
    c.options.predicted_sigma_sum_sq = sigma.sum_sq;
    TC_ASSIGN_OR_RETURN(DiffStats s, session_->Compare(observed_, reference_.output, c));
    outcome_.observed_vs_reference = std::move(s);
    return absl::OkStatus();
  }

  // Configuration i's run, compared with the reference and the observed
  // output; kept for a diagnosis, downloaded when asked for, else given
  // back.
  absl::StatusOr<ConfigOutcome> Compared(size_t i, SessionRun run, double ms) {
    const Config& config = plan_.configs[i];
    TC_ASSIGN_OR_RETURN(Options opts, OptionsFor(config));
    ConfigOutcome o = DescribeRun(config, run.run, ms);
    const std::string output_class = OutputClass(config, run.run);
    TC_ASSIGN_OR_RETURN(o.vs_reference,
                        CachedCompare(output_class, /*vs_observed=*/false, run.output,
                                      reference_.output, opts.vs_reference));
    if (req_.observed) {
      TC_ASSIGN_OR_RETURN(DiffStats s, CachedCompare(output_class, /*vs_observed=*/true, observed_,
                                                     run.output, opts.vs_observed));
      o.vs_observed = std::move(s);
    }
    if (!caps_.host_memory) o.details["statistics"] = "device";
    if (artifacts_ != nullptr) TC_RETURN_IF_ERROR(Keep(i, opts, run.output));
    if (req_.return_outputs) {
      TC_ASSIGN_OR_RETURN(o.output, DownloadOutput(run.output));
    }
    if (artifacts_ == nullptr) session_->Release(run.output);
    return o;
  }

  // The reference's own outcome: against itself, and the observed output
  // against it, with its own precision's arrays.
  absl::Status FinishReference() {
    TC_ASSIGN_OR_RETURN(Options opts, OptionsFor(plan_.reference));
    ConfigOutcome o = DescribeRun(plan_.reference, reference_.run, reference_ms_);
    const std::string output_class = OutputClass(plan_.reference, reference_.run);
    TC_ASSIGN_OR_RETURN(o.vs_reference,
                        CachedCompare(output_class, /*vs_observed=*/false, reference_.output,
                                      reference_.output, opts.vs_reference));
    if (req_.observed) {
      TC_ASSIGN_OR_RETURN(DiffStats s, CachedCompare(output_class, /*vs_observed=*/true, observed_,
                                                     reference_.output, opts.vs_observed));
      o.vs_observed = std::move(s);
    }
    if (!caps_.host_memory) o.details["statistics"] = "device";
    if (req_.return_outputs) {
      TC_ASSIGN_OR_RETURN(o.output, DownloadOutput(reference_.output));
    }
    outcome_.reference = std::move(o);
    return absl::OkStatus();
  }

  // ---- Comparing.

  // What makes outputs bitwise equal, when the session's comparisons may
  // be cached (SessionCapabilities::cached_comparisons) and sharing is
  // on: the GEMM (the configuration's own or the one it reused) and the
  // epilogue. Empty: compare every time.
  std::string OutputClass(const Config& config, const RunResult& run) const {
    if (!share_ || !caps_.cached_comparisons) return std::string();
    return absl::StrCat(run.shared_computation.empty() ? config.ToString() : run.shared_computation,
                        "|", BiasModeName(config.bias));
  }

  // Compare, or the statistics of an earlier comparison known to give the
  // same ones.
  absl::StatusOr<DiffStats> CachedCompare(const std::string& output_class, bool vs_observed,
                                          ArrayRef actual, ArrayRef expected,
                                          const SessionCompare& compare) {
    if (output_class.empty()) return session_->Compare(actual, expected, compare);
    const StatsKey key{output_class, vs_observed, compare.sigma.id,
                       bound_used_ ? compare.bound.id : -1};
    auto it = stats_.find(key);
    if (it != stats_.end()) return it->second;
    TC_ASSIGN_OR_RETURN(DiffStats s, session_->Compare(actual, expected, compare));
    stats_.emplace(key, s);
    return s;
  }

  // ---- Keeping what a diagnosis reads.

  absl::StatusOr<Tensor> DownloadOutput(ArrayRef array) {
    TC_ASSIGN_OR_RETURN(Tensor t, session_->Download(array));
    if (t.numel() != count_) {
      return absl::InternalError(
          absl::StrCat("output of ", t.numel(), " elements, expected ", count_));
    }
    TC_RETURN_IF_ERROR(t.Reshape(plan_.output_shape));
    return t;
  }

  // What a diagnosis reads of configuration i, kept on the session.
  absl::Status Keep(size_t i, const Options& opts, ArrayRef output) {
    if (!req_.observed) return absl::OkStatus();
    const Config& config = plan_.configs[i];
    const bool unfused = config.bias == BiasMode::kUnfused;
    CandidateArrays& c = candidates_[i];
    c.output = output;
    c.pair_sigma = opts.pair.values;
    TC_ASSIGN_OR_RETURN(ModelArray acc, Model(ModelKey::kPairAccumulation, config.precision,
                                              unfused, internal::ReduceTermsOf(config)));
    c.pair_accumulation_sigma = acc.values;
    c.sigma_vs_reference = opts.sigma.values;
    TC_ASSIGN_OR_RETURN(c.flip_grid, FlipGridFor(unfused));
    return absl::OkStatus();
  }

  // ---- The error model.

  // Precision `p`'s array of `kind`: once per key when sharing (equal keys
  // give equal arrays, whichever precision asked), every time otherwise.
  absl::StatusOr<ModelArray> Model(ModelKey::Kind kind, Precision p, bool unfused,
                                   int reduce_terms = 0) {
    const ModelKey key = keys_.Of(kind, p, unfused, reduce_terms);
    if (share_) {
      auto it = models_.find(key);
      if (it != models_.end()) return it->second;
    }
    SessionModelSpec spec;
    spec.kind = SpecKind(kind);
    spec.precision = p;
    spec.k = plan_.shape.k;
    spec.output_dtype = plan_.shape.output_dtype;
    spec.unfused_bias = key.unfused;
    spec.inputs_exact =
        key.u_input == 0 && (key.kind == ModelKey::kSigma || key.kind == ModelKey::kBound);
    spec.accumulation_scale = key.accumulation_scale;
    spec.reduce_terms = key.reduce_terms;
    spec.abs_dot = sums_.abs_dot;
    spec.sq_dot = sums_.sq_dot;
    spec.value = reference_.output;
    spec.pre_bias = sums_.dot;
    spec.count = count_;
    TC_ASSIGN_OR_RETURN(SessionModel m, session_->ErrorModel(spec));
    const ModelArray array{m.values, m.sum_sq};
    if (share_) models_.emplace(key, array);
    return array;
  }

  // Compare options of a configuration, against the reference and for the
  // observed output against it.
  absl::StatusOr<Options> OptionsFor(const Config& config) {
    const bool unfused = config.bias == BiasMode::kUnfused;
    Options o;
    TC_ASSIGN_OR_RETURN(o.sigma, Model(ModelKey::kSigma, config.precision, unfused,
                                       internal::ReduceTermsOf(config)));
    if (bound_used_) {
      TC_ASSIGN_OR_RETURN(o.bound, Model(ModelKey::kBound, config.precision, unfused,
                                         internal::ReduceTermsOf(config)));
    }
    if (req_.observed) {
      TC_ASSIGN_OR_RETURN(o.pair, Model(ModelKey::kPairSigma, config.precision, unfused,
                                        internal::ReduceTermsOf(config)));
    }
    o.vs_reference = SessionCompare{plan_.compare, o.sigma.values, o.bound.values};
    o.vs_reference.options.predicted_sigma_sum_sq = o.sigma.sum_sq;
    // Between two runs of one configuration in different summation
    // orders: only the sigma differs; the hard bound is the
    // configuration's own.
    o.vs_observed = SessionCompare{plan_.compare, o.pair.values, o.bound.values};
    o.vs_observed.options.predicted_sigma_sum_sq = o.pair.sum_sq;
    return o;
  }

  // The output grid where two summation orders part, for a bias mode.
  absl::StatusOr<ArrayRef> FlipGridFor(bool unfused) {
    const bool with_bias = req_.bias.has_value();
    unfused = unfused && with_bias;
    ArrayRef& grid = unfused ? unfused_grid_ : fused_grid_;
    if (grid.valid()) return grid;
    SessionFlipSpec spec;
    spec.output_dtype = plan_.shape.output_dtype;
    spec.unfused_bias = unfused;
    spec.activation = req_.activation;
    spec.pre_bias = sums_.dot;
    spec.bias = op_.bias;
    spec.cols = plan_.shape.n;
    spec.count = count_;
    TC_ASSIGN_OR_RETURN(grid, session_->FlipGrid(spec));
    return grid;
  }

  // Only the bound preset reads the hard bound; other presets skip its
  // arrays.
  const bool bound_used_;
  const bool share_;
  const LinearRequest& req_;
  const Engine::Plan& plan_;
  Engine::Artifacts* const artifacts_;
  ComputeDevice* const device_;
  int64_t count_ = 0;

  std::unique_ptr<DeviceSession> session_;
  SessionCapabilities caps_;
  SessionOperands op_;
  ArrayRef observed_;
  SessionRun reference_;
  double reference_ms_ = 0;
  std::vector<std::optional<ConfigOutcome>> results_;  // plan order
  SessionMagnitudes sums_;
  internal::ModelKeys keys_{req_.input, req_.weight};
  std::map<ModelKey, ModelArray> models_;
  std::map<StatsKey, DiffStats> stats_;
  std::vector<CandidateArrays> candidates_{plan_.configs.size()};
  ArrayRef fused_grid_, unfused_grid_;
  VerifyOutcome outcome_;
};

ConfigOutcome DescribeRun(const Config& config, const RunResult& run, double ms) {
  ConfigOutcome o;
  o.config = config.ToString();
  o.elapsed_ms = ms;
  o.details = run.details;
  o.deterministic = run.deterministic;
  o.runs = run.runs;
  o.shared_computation = run.shared_computation;
  return o;
}

std::vector<std::string> Engine::Notes(const LinearRequest& req, const Plan& plan) {
  std::vector<std::string> notes;
  bool sixteen_bit_fused = false, gpu = false;
  for (LinearBackend* backend : plan.backends) {
    gpu = gpu || backend->kind() == BackendKind::kDevice;
  }
  gpu = gpu || plan.reference_backend->kind() == BackendKind::kDevice;
  for (const Config& c : plan.configs) {
    if ((c.precision == Precision::kBf16 || c.precision == Precision::kFp16) &&
        c.bias == BiasMode::kFused) {
      sixteen_bit_fused = true;
    }
  }
  if (sixteen_bit_fused) {
    notes.push_back(
        "PyTorch may add the bias at output precision (not in the fp32 "
        "epilogue) in split-K kernels with 16-bit inputs.");
  }
  if (gpu) {
    notes.push_back(
        "cuBLAS is bitwise reproducible run to run only for one stream and "
        "one architecture/SM count.");
  }
  if (req.activation == Activation::kGeluTanh) {
    notes.push_back(
        "GELU is the tanh approximation (as cuBLASLt's epilogue); the erf "
        "form differs by up to ~1e-3 relative.");
  }
  if (req.observed && req.observed->dtype() != plan.shape.output_dtype) {
    notes.push_back(absl::StrCat("observed is ", DTypeName(req.observed->dtype()),
                                 " but configurations round their outputs to ",
                                 DTypeName(plan.shape.output_dtype),
                                 "; set output_dtype to compare like with like."));
  }
  return notes;
}

ComputeDevice* Engine::DeviceOf(const Plan& plan) const {
  if (!options_.device_sessions) return nullptr;
  ComputeDevice* device = plan.reference_backend->compute_device();
  if (device == nullptr) return nullptr;
  for (LinearBackend* backend : plan.backends) {
    if (backend->compute_device() != device) return nullptr;
  }
  return device;
}

absl::StatusOr<VerifyOutcome> Engine::Run(const LinearRequest& req, const Plan& plan,
                                          Artifacts* artifacts) const {
  // The reference and each configuration, counted as each is compared.
  BeginProgress(plan.progress,
                artifacts != nullptr ? "running the candidates" : "running the configurations",
                static_cast<int64_t>(plan.configs.size()) + 1);
  // On the one device that runs it whole, else on the host.
  ComputeDevice* device = DeviceOf(plan);
  return DeviceExecution(options_, req, plan, artifacts,
                         device != nullptr ? device : host_device_.get())
      .Run();
}

}  // namespace tensorcheck
