// The one renderer of a whole-model check: from the layer calls' results
// (a sweep's, or those read back from its JSON report) to every artifact
// `tensorcheck sweep` and `tensorcheck render` write (docs/model-checks.md,
// "tensorcheck render"). Internal to client/cli.
//
//   TC_ASSIGN_OR_RETURN(SweepReport report, ParseSweepReport(text));
//   SweepRenderRequest want;
//   want.text = want.junit = true;
//   TC_ASSIGN_OR_RETURN(SweepRendering out, RenderSweep(std::move(report), want));
//   std::cout << out.stdout_text;
//   return out.exit_code;
//
// `sweep` renders the results it collected, `render` those it parsed: the
// same RenderSweep, so the JSON report renders into the very text, JUnit,
// GitHub summary and HTML page the sweep that wrote it produced.
//
// Thread-safe: no state. RenderSweep reads the captures file (HTML only);
// everything else is pure.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/cli/internal/sweep_report.h"

namespace tensorcheck::cli::internal {

// What a whole-model report holds: the layer calls in execution order, the
// run's transfers and its options.
struct SweepReport {
  std::vector<LayerResult> layers;
  SweepCounts counts;
  SweepOptions options;
};

// Reads the JSON report (SweepToJson's, docs/model-checks.md) back: per
// layer call `name`, `call`, `input_shape`, `weight_shape`,
// `weight_layout`, `dtype`, `status` (a null `response`: `error` or
// `not_checked`), `error`, `error_code`, `response` (protobuf's JSON
// mapping of the VerifyResponse; a field or enum value this CLI's API does
// not know is an error) and `report.uploaded_bytes`/`reused_bytes`; at the top
// `diagnose`, `bound_threshold`, `uploaded_bytes`, `reused_bytes`. The
// other keys are what Summarize decides, and are decided again, not read.
// INVALID_ARGUMENT naming the JSON path ("layers[3].response: ...") for
// malformed JSON, a missing key or a value of the wrong type.
absl::StatusOr<SweepReport> ParseSweepReport(absl::string_view json_text);

// What to render.
struct SweepRenderRequest {
  // The table (FormatSweepText) as `stdout_text`.
  bool text = false;
  // The JSON report as `stdout_text` (instead of the table), indented by 2,
  // ending in a newline.
  bool json = false;
  bool junit = false;
  bool html = false;
  // Annotations and the Markdown summary.
  bool github = false;
  // With `html`: the captures file whose `{layer call}.output` tensors are
  // the observed outputs the heatmaps compare; empty: pages without
  // heatmaps of the observed output.
  std::string captures;
};

// Every artifact asked for; the others empty.
struct SweepRendering {
  std::string stdout_text;
  std::string junit;
  std::string html;
  std::string github_annotations;
  std::string github_summary;
  // SweepExitCode.
  int exit_code = 0;
};

// Summarizes the report and renders what `want` asks for. HTML sections
// are made here from each layer call's response (the outputs it carries)
// and the observed output read from `want.captures`; an unreadable
// captures file, or one lacking a checked layer call's output, is
// INVALID_ARGUMENT naming the file and the tensor.
absl::StatusOr<SweepRendering> RenderSweep(SweepReport report, const SweepRenderRequest& want);

}  // namespace tensorcheck::cli::internal
