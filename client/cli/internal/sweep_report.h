// The reports of `tensorcheck sweep`: which layer calls passed, which
// diverged first and why, as text, JSON, JUnit, GitHub annotations and
// summary, and one HTML page (docs/model-checks.md). Internal to
// client/cli; pure functions over the responses, testable without a server.
//
// (internal/sweep_render.h's RenderSweep is the one caller that renders
// them all, for `sweep` and `render` alike.)
//
//   std::vector<LayerResult> layers = ...;   // one per layer call, in order
//   SweepSummary s = Summarize(layers, SweepOptions{});
//   std::cout << FormatSweepText(layers, s);
//   std::cout << SweepToJson(layers, s, counts).dump(2);
//   return SweepExitCode(layers, s);
//
// Each response carries the server's decisions about its call
// (CallDecision: which configurations explain it, whether it diverges on
// its own and why, whether its bound_ratio exceeds the threshold); the
// rules are docs/model-checks.md's "The rules". Summarize keeps only what
// spans calls: the consensus (the configuration explaining the most
// checked layers, when it explains more than half of them) and the first
// divergence. A call diverges by its own divergence, else by explaining
// configurations that exclude the consensus, else by its bound_ratio; the
// reason names the first that applies. A layer also fails, without
// diverging, when its verdict is fail.
//
// Thread-safe: no state.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "client/cli/report.h"
#include "core/dtype.h"
#include "nlohmann/json.hpp"
#include "tensorcheck/v1/tensorcheck.pb.h"

namespace tensorcheck::cli::internal {

// How a layer call's RPC went.
enum class LayerRpc {
  kNotChecked,  // never sent: the server went away first
  kOk,          // `response` holds the answer
  kError,       // the RPC (or its uploads) failed: `error`
};

// One layer call of the sweep, as the runner leaves it.
struct LayerResult {
  std::string layer;
  int call = 0;
  std::vector<int64_t> input_shape;
  std::vector<int64_t> weight_shape;
  bool in_out = false;
  DType dtype = DType::kFloat32;
  LayerRpc rpc = LayerRpc::kNotChecked;
  pb::VerifyResponse response;
  std::string error;
  // The gRPC code of `error` (as an int, absl and gRPC agree).
  int error_code = 0;
  // This call's tensors by digest: uploaded for it, or already stored.
  int64_t uploaded_bytes = 0;
  int64_t reused_bytes = 0;
  // Its section of the --html page (FormatHtmlSection), made by
  // RenderSweep from `response` when the page is wanted.
  std::string html_section;

  // "lm_head" or "lm_head#2".
  std::string FullName() const;
};

enum class LayerStatus { kPassed, kFailed, kError, kNotChecked };

// "passed", "failed", "error", "not_checked": the JSON's names.
const char* LayerStatusName(LayerStatus s);
// "PASS", "FAIL", "ERROR", "-": the words the tables and pages show, the
// Python client's too (docs/model-checks.md).
const char* LayerStatusWord(LayerStatus s);

struct SweepOptions {
  // Diagnose (true) or Verify (false) per layer.
  bool diagnose = true;
  // A layer whose bound_ratio exceeds this diverges; unset: the server's
  // default. Sent with each request (VerifyRequest.bound_threshold): the
  // server decides.
  std::optional<double> bound_threshold;
  // What was checked, for the page's title ("tensorcheck torch gpt2"):
  // the Python client's ModelReport sets them; the JSON carries them when
  // set, and the page says "tensorcheck sweep" without them.
  std::string framework;
  std::string model;
};

// What Summarize makes of one layer call.
struct LayerVerdict {
  LayerStatus status = LayerStatus::kNotChecked;
  // A candidate explains the output (diagnose), the verdict is pass (verify).
  bool explained = false;
  // observed_vs_reference.bound_ratio: the error against the reference in
  // units of the output precision's error model.
  std::optional<double> bound_ratio;
  // The configurations explaining it, best first (the response's
  // CallDecision.explaining: best, equivalent, tied, `b:p:none` expanded).
  std::vector<std::string> explaining;
  // Why it failed ("no candidate explains its output"); empty when it passed.
  std::string reason;
  // It failed by a rule of divergence (not by its verdict alone).
  bool diverged = false;
};

struct SweepSummary {
  std::vector<LayerVerdict> layers;
  // The consensus configuration, when one explains more than half of the
  // checked layers.
  std::optional<std::string> consensus;
  int consensus_count = 0;
  int checked = 0;
  // The bound_ratio threshold the server applied (from the responses).
  std::optional<double> bound_threshold;
  // The first layer call that diverged (index into the layers), if any.
  std::optional<size_t> first_divergence;
  // Every layer call passed.
  bool passed = false;
};

SweepSummary Summarize(const std::vector<LayerResult>& layers, const SweepOptions& options);

// Bytes the whole sweep uploaded, and bytes it named that the store held
// (each tensor counted once).
struct SweepCounts {
  int64_t uploaded_bytes = 0;
  int64_t reused_bytes = 0;
};

// The JSON report (docs/model-checks.md): keys shared with the Python
// client's ModelReport.to_dict(). Each layer call's `response` (protobuf's
// JSON mapping, map entries sorted) and `error_code`, and the top's
// `diagnose` and `bound_threshold`, are what ParseSweepReport
// (internal/sweep_render.h) rebuilds the results from.
nlohmann::ordered_json SweepToJson(const std::vector<LayerResult>& layers,
                                   const SweepSummary& summary, const SweepCounts& counts,
                                   const SweepOptions& options);

// The table, one row per layer call, then the first divergence (or that
// there is none); ends in a newline.
std::string FormatSweepText(const std::vector<LayerResult>& layers, const SweepSummary& summary,
                            const SweepOptions& options);

// JUnit XML: one test case per layer call (classname "tensorcheck.sweep").
std::string FormatSweepJUnit(const std::vector<LayerResult>& layers, const SweepSummary& summary);

// `::error` per failed layer call and one `::notice` (or `::error`) overall.
std::string FormatSweepGithubAnnotations(const std::vector<LayerResult>& layers,
                                         const SweepSummary& summary);
// Markdown for $GITHUB_STEP_SUMMARY.
std::string FormatSweepGithubSummary(const std::vector<LayerResult>& layers,
                                     const SweepSummary& summary);

// One self-contained page: bound_ratio across depth as an inline SVG, then
// each layer call's section (LayerResult::html_section).
std::string FormatSweepHtml(const std::vector<LayerResult>& layers, const SweepSummary& summary,
                            const SweepOptions& options);

// 0 every layer call passed; 1 one failed; 2 a request was rejected
// (INVALID_ARGUMENT ...); 3 a server error or a server gone (not_checked
// layers). The highest applies.
int SweepExitCode(const std::vector<LayerResult>& layers, const SweepSummary& summary);

}  // namespace tensorcheck::cli::internal
