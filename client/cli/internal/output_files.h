// The files verify and diagnose write besides their report on stdout:
// `--junit`, `$GITHUB_STEP_SUMMARY`, `--save-outputs DIR`, `--html`.
// Internal to client/cli.
//
//   TC_RETURN_IF_ERROR(WriteTextFile("report.xml", FormatJUnit(r, ctx),
//                                    /*append=*/false));
//
// Errors are INVALID_ARGUMENT naming the file.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "client/cli/report.h"
#include "tensorcheck/v1/tensorcheck.pb.h"

namespace tensorcheck::cli::internal {

// Writes (or, with `append`, appends) `text` to `path`.
absl::Status WriteTextFile(const std::string& path, const std::string& text, bool append);

// --save-outputs DIR: DIR/<config, ':' -> '_'>.npy for the reference and
// every configuration whose output the server returned (a warning on
// stderr for each it did not).
absl::Status SaveOutputs(const pb::VerifyResponse& r, const std::string& dir);

// --html FILE: the observed tensor is rebuilt from the request's bytes
// (BuildRequest moved them there); without it the page has no heatmaps.
absl::Status WriteHtml(const pb::VerifyResponse& r, const ReportContext& ctx,
                       const pb::VerifyRequest& req, const std::string& path);

}  // namespace tensorcheck::cli::internal
