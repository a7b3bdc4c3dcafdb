// The files verify and diagnose write (internal/output_files.h).
#include "client/cli/internal/output_files.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cli/html_report.h"
#include "client/cli/tensor_io.h"
#include "core/dtype.h"
#include "core/status_macros.h"
#include "core/tensor.h"
#include "proto/dtype_proto.h"

namespace tensorcheck::cli::internal {
namespace {

// A file name for a configuration: ':' and anything unusual become '_', so
// a server-sent name can never leave DIR.
std::string OutputFileName(const std::string& config) {
  std::string s;
  for (char c : config) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '_';
    s.push_back(ok ? c : '_');
  }
  if (s.empty()) s = "unnamed";
  return s + ".npy";
}

}  // namespace

absl::Status WriteTextFile(const std::string& path, const std::string& text, bool append) {
  std::ofstream f(path, append ? std::ios::app : std::ios::trunc);
  if (!f) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot write '", path, "': ", std::strerror(errno)));
  }
  f << text;
  f.close();
  if (!f) {
    return absl::InvalidArgumentError(absl::StrCat("cannot write '", path, "'"));
  }
  return absl::OkStatus();
}

absl::Status SaveOutputs(const pb::VerifyResponse& r, const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("--save-outputs: cannot create '", dir, "': ", ec.message()));
  }
  std::vector<const pb::ConfigResult*> all;
  if (r.has_reference()) all.push_back(&r.reference());
  for (const pb::ConfigResult& c : r.results()) all.push_back(&c);
  for (const pb::ConfigResult* c : all) {
    if (!c->has_output() || c->output().source_case() != pb::Tensor::kData) {
      std::cerr << "tensorcheck: warning: the server returned no output for " << c->config()
                << "\n";
      continue;
    }
    const std::optional<DType> d = DTypeFromProto(c->output().dtype());
    if (!d.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("output of ", c->config(), ": unknown dtype from the server"));
    }
    std::vector<int64_t> shape(c->output().shape().begin(), c->output().shape().end());
    auto t = Tensor::FromBytes(*d, shape, c->output().data());
    if (!t.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("output of ", c->config(), ": ", t.status().message()));
    }
    const std::string path = (std::filesystem::path(dir) / OutputFileName(c->config())).string();
    TC_RETURN_IF_ERROR(WriteNpyFile(path, *t));
  }
  return absl::OkStatus();
}

absl::Status WriteHtml(const pb::VerifyResponse& r, const ReportContext& ctx,
                       const pb::VerifyRequest& req, const std::string& path) {
  std::optional<Tensor> observed;
  if (req.has_observed() && req.observed().source_case() == pb::Tensor::kData) {
    if (const std::optional<DType> d = DTypeFromProto(req.observed().dtype()); d.has_value()) {
      auto t = Tensor::FromBytes(*d, {req.observed().shape().begin(), req.observed().shape().end()},
                                 req.observed().data());
      if (t.ok()) observed = *std::move(t);
    }
  }
  return WriteTextFile(path, FormatHtml(r, ctx, observed ? &*observed : nullptr),
                       /*append=*/false);
}

}  // namespace tensorcheck::cli::internal
