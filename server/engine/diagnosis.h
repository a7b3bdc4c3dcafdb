// Diagnosis: which candidate configuration produced the client's output.
//
// Each candidate is a hypothesis "the observed output was computed by this
// configuration, in some other summation order". Under it, the difference
// observed - candidate has a predicted standard error per element (the
// candidate's `pair_sigma`, from the error model). An element is consistent
// with the hypothesis when it is bitwise equal to the candidate or within
// kConsistentZ predicted standard errors of it. Ranking:
//
//   1. consistent candidates (>= kConsistentShare of elements consistent)
//      before the others;
//   1b. plausible ones (below) before implausible ones: closeness never
//      outranks plausibility;
//   2. then those with no clearly more inconsistent elements than the
//      consistent candidate with the fewest (a 3-sigma Poisson slack plus
//      0.1% of the elements) before those with clearly more;
//   3. then by the share of bitwise-equal elements (descending);
//   4. then by mean ULP distance (ascending);
//   5. then by bound_ratio = rms(observed - candidate) / rms(pair_sigma);
//   6. among the plausible candidates the evidence cannot separate from the
//      top one (|z| of a paired sign test below kTieZ), a fixed preference
//      names best: the precision matching the storage dtype first, then
//      the order of docs/numerics.md's table; TF32 unfused before fused, others fused
//      before unfused. Plausible: the observed output disagrees with the
//      candidate in bits on no more elements than the candidate's own
//      accumulation noise explains (each element differs with chance
//      ~ accumulation sigma / output grid; a Poisson test at
//      kPlausibilityAlpha). With a 16-bit output this is what tells fused
//      from unfused on a handful of elements, rules out fp64 accumulation
//      for an output that carries fp32 accumulation's rounding flips, and
//      lets fp32 and fp64 accumulation stay a tie when no rounding depends
//      on which.
//
// Rule 1 is what lets an fp32 output be told from an fp64 one: a correctly
// rounded (fp64-accumulated) result would agree bit for bit, so an output
// carrying fp32 accumulation error is inconsistent with fp64 although it is
// closer to it in ULPs.
//
// Elements consistent with no candidate at all are outliers: they are left
// out of every score and listed, so a handful of corrupted elements do not
// change the verdict on the bulk. When more than kMaxUnexplainedShare of the
// elements are outliers, or the top candidate is not consistent, nothing
// explains the output and `best` is empty.
//
// Candidates that accumulate alike and whose outputs are bitwise identical
// on this request compute the same function for these inputs (bf16
// storage makes bf16/TF32/fp32 input rounding the same; a zero bias makes
// fused and unfused the same) and are merged: `best` names one,
// `equivalent` the others. fp32 and fp64 accumulation giving the same bits
// are a coincidence of the data, not one function: they stay apart and
// come out `tied`. The runner-up is
// compared with `best` by a paired sign test on per-element ULP distances;
// with |z| below kTieZ the evidence cannot separate them and `tied` lists
// them. Confidence is documented in docs/numerics.md.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/linear_config.h"
#include "core/tensor.h"
#include "server/engine/engine.h"
#include "server/stats/diagnosis_passes.h"
#include "server/stats/diagnosis_rules.h"
#include "server/stats/diff_stats.h"

namespace tensorcheck {

inline constexpr double kConsistentZ = rules::kConsistentZ;
inline constexpr double kConsistentShare = 0.9;
inline constexpr double kMaxUnexplainedShare = 0.1;
inline constexpr double kTieZ = 3.0;
// A candidate is implausible when the observed output disagrees with it
// (in bits) on more elements than its accumulation noise explains: when
// P(X >= disagreements) for X ~ Poisson(expected) is below this.
inline constexpr double kPlausibilityAlpha = 1e-6;
// ...and only on at least this many disagreeing elements, so that one or
// two boundary coincidences, double roundings or corrupted values never
// decide an accumulation's width. A candidate plausible only by this floor
// ranks below those plausible on the evidence and is at most tied with
// best (ClassScore::plausible_by_floor_only).
inline constexpr int64_t kMinImplausibleDisagreements = 3;

// ---- The verdict (docs/numerics.md, "Verdict").
// The chance that a clean output (rounding of best) is called anything
// else, per layer: a third to the element test, a sixth each to the column
// counts, the row counts, the column shifts and the band just inside the
// element threshold (docs/numerics.md, "Verdict").
inline constexpr double kVerdictFalseAlarm = 1e-3;
// Unexplained when best's differences are more than this many times what
// its error model predicts for another summation order (its bound_ratio)...
inline constexpr double kUnexplainedBoundRatio = 1.5;
// ...or when more than this share of the elements lie beyond the element
// threshold outside the columns and rows the scan flags (a misfit spread
// over the whole output, not a defect in one place).
inline constexpr double kUnexplainedDiffuseShare = 1e-3;
// ...or when best accumulates in fp16 (fp16acc) and the observed output's
// error against the exact result is less than this share of what fp16
// accumulation's own rounding leaves (rms over its predicted sigma; a
// sequential fp16 accumulation measures 0.56, docs/numerics.md's table):
// fp16acc's noise is wide enough to hold any output closer to the exact
// result, so its consistency alone says nothing there.
inline constexpr double kFp16AccumulationMinErrorRatio = 0.05;
// The confidence of an unexplained verdict is at most this.
inline constexpr double kUnexplainedConfidence = 0.5;

// The element test's threshold for `count` elements: the z whose two-sided
// Gaussian tail is kVerdictFalseAlarm / 3 / count (at least kConsistentZ).
double ElementThresholdSigma(int64_t count);

// A candidate. Its per-element arrays (output, pair_sigma and the others)
// are read only by HostEvidence; a diagnosis whose evidence is elsewhere
// (on the run's session: the engine's) leaves them null.
struct DiagnosisCandidate {
  Config config;
  const Tensor* output = nullptr;           // shaped like the observed output
  const DiffStats* vs_observed = nullptr;   // observed vs this candidate
  const DiffStats* vs_reference = nullptr;  // this candidate vs the reference
  // Per element: predicted standard error of observed - candidate if the
  // observed output came from this configuration in another order.
  const float* pair_sigma = nullptr;
  // Per element: the accumulation part of pair_sigma (before rounding).
  const float* pair_accumulation_sigma = nullptr;
  // Per element: predicted standard error of this precision vs the exact
  // result (for "error/bound" of the observed output against the reference).
  const float* sigma_vs_reference = nullptr;
  // Per element: the output grid where two summation orders part
  // (FlipGrid in error_model.h), for this candidate's bias mode. Null:
  // the spacing at the candidate's own output value.
  const float* flip_grid = nullptr;
  // The configuration whose GEMM this candidate reused, if any.
  std::string shared_computation;
  // Where it ran: among candidates the data cannot separate, device runs
  // are named before host emulations.
  BackendKind backend_kind = BackendKind::kHostEmulation;
};

struct DiagnosisInput {
  const Tensor* observed = nullptr;
  const Tensor* reference = nullptr;
  std::string reference_config;
  DType storage_dtype = DType::kFloat32;
  DType output_dtype = DType::kFloat32;
  bool has_bias = false;
  Activation activation = Activation::kNone;
  // Where a defect's column points in W (docs/numerics.md, "Verdict").
  WeightLayout weight_layout = WeightLayout::kOutIn;
  std::vector<int64_t> output_shape;  // [..., N]
  std::vector<DiagnosisCandidate> candidates;
  int top_k = 10;
  int top_groups = 5;
  // Scores the candidates, one class per task; null: on the calling
  // thread (results do not depend on it). Not owned.
  Executor* executor = nullptr;
  // The configurations the user accepts (VerifyRequest.accept).
  std::vector<ConfigPattern> accept;
};

// The per-element passes a ranking reads (stats' diagnosis_passes.h, one
// rule per element from stats' diagnosis_rules.h), over the candidates'
// outputs and arrays wherever they are: in arrays the caller holds
// (HostEvidence) or on the session that computed them (the engine's
// execution, on a device or the host), so that only sums come back. Candidates are indices into
// DiagnosisInput::candidates. The explained set starts empty and grows
// with Explain; the passes that say so read only its elements. Errors:
// the device's (RESOURCE_EXHAUSTED, CANCELLED, ...).
class DiagnosisEvidence {
 public:
  virtual ~DiagnosisEvidence() = default;
  // Whether candidates a and b produced the same bytes.
  virtual absl::StatusOr<bool> SameBits(size_t a, size_t b) = 0;
  // Adds the elements consistent with candidate c (bitwise equal, or
  // within kConsistentZ of its pair sigmas) to the explained set; returns
  // the set's size.
  virtual absl::StatusOr<int64_t> Explain(size_t c) = 0;
  // Each candidate's score over the explained set (every element when
  // `every_element`), in the order given.
  virtual absl::StatusOr<std::vector<rules::ScoreSums>> Score(const std::vector<size_t>& candidates,
                                                              bool every_element) = 0;
  // The paired sign test's counts of `runner` against `best` over the
  // explained set.
  virtual absl::StatusOr<rules::PairedSums> Paired(size_t best, size_t runner) = 0;
  // Where the observed output and candidate c differ in bits, by column
  // and row, over the explained set (every element when `every_element`).
  virtual absl::StatusOr<DifferingCounts> Differing(size_t c, bool every_element) = 0;
  // The observed output against the reference over the explained set,
  // with candidate c's sigma against the exact result; nullopt without
  // a reference or that sigma.
  virtual absl::StatusOr<std::optional<rules::ErrorSums>> ErrorVsReference(size_t c) = 0;
  // Every element outside the explained set, observed against candidate
  // c, in element order.
  virtual absl::StatusOr<std::vector<ElementDiff>> Unexplained(size_t c) = 0;
  // The verdict's scan of every element against candidate c
  // (DefectScanPass, with `scan`'s threshold and the rest; its observed,
  // candidate and arrays are c's).
  virtual absl::StatusOr<DefectScan> ScanDefects(size_t c, const DefectScanInput& scan) = 0;
  // What the passes cost where that is worth reporting (a device's
  // transfer counters), into a result's details; nothing by default.
  virtual void Describe(std::map<std::string, std::string>* details) const { (void)details; }
};

// The passes over the host arrays of `input`'s candidates; `input` must
// outlive it.
std::unique_ptr<DiagnosisEvidence> HostEvidence(const DiagnosisInput& input);

// Ranks over HostEvidence(input).
DiagnosisOutcome RankCandidates(const DiagnosisInput& input);
// Ranks over `evidence`, which holds the per-element arrays of `input`'s
// candidates; the result does not depend on where they are, up to the
// order of floating sums.
absl::StatusOr<DiagnosisOutcome> RankCandidates(const DiagnosisInput& input,
                                                DiagnosisEvidence& evidence);

// What a configuration means in framework terms, e.g. "JAX/Flax default on
// Ampere+: fp32 matmul in TF32, bias added separately".
// Says where it ran: "(emulated on the CPU)" for the cpu backend.
std::string FrameworkHint(const Config& config, DType storage, bool has_bias);

// Which frameworks compute `config` by default for `storage` tensors
// ("PyTorch's default for fp32 tensors"); empty when none does.
std::string FrameworkDefault(const Config& config, DType storage, bool has_bias);

// PyTorch's default configuration for `storage` tensors on `backend`
// (fp32 -> fp32, bf16 -> bf16, fused bias): what a diagnosis advises
// towards when the request accepts nothing.
Config PyTorchDefault(const std::string& backend, DType storage, bool has_bias);

// What to change so that a framework computing `from` computes `to`
// (docs/numerics.md, "What to change"): one sentence, or empty when the
// two agree or no switch is known (FP8, tf32rna/tf32trunc kernels).
std::string HowToMatch(const Config& from, const Config& to, DType storage, bool has_bias);

}  // namespace tensorcheck
