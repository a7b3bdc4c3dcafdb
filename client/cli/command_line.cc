// The flags of each command and their parsing (internal/command_line.h).
#include "client/cli/internal/command_line.h"

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tensorcheck::cli::internal {
namespace {

enum Cmd : unsigned {
  kVerify = 1,
  kDiagnose = 2,
  kCaps = 4,
  kUpload = 8,
  kSweep = 16,
  kHealth = 32,
  kCompare = 64,
  kRender = 128
};
constexpr unsigned kRun = kVerify | kDiagnose;
constexpr unsigned kAll = kRun | kCaps | kUpload | kSweep | kHealth | kCompare | kRender;
// The flags sweep shares with verify and diagnose.
constexpr unsigned kCheck = kRun | kSweep;
// The layer's flags (tensors and op options), which compare shares too.
constexpr unsigned kLayer = kRun | kCompare;

struct FlagSpec {
  const char* name;
  bool has_value;
  unsigned commands;
};

constexpr FlagSpec kFlags[] = {
    // The connection (internal/connection.h) and the deadline: every
    // command, and before the command too.
    {"server", true, kAll},
    // The deprecated name of --server (a warning on stderr).
    {"target", true, kAll},
    {"tls-ca", true, kAll},
    {"tls-cert", true, kAll},
    {"tls-key", true, kAll},
    {"token", true, kAll},
    {"timeout", true, kAll},
    {"json", false, kCheck | kCaps | kCompare | kRender},
    // render: the table on stdout (the default when no output is named).
    {"text", false, kRender},
    {"help", false, kAll},
    {"input", true, kLayer},
    {"weight", true, kLayer},
    {"bias", true, kLayer},
    {"observed", true, kLayer},
    // FP8 dequantisation scales: a number or a tensor argument.
    {"input-scale", true, kLayer},
    {"weight-scale", true, kLayer},
    // NVFP4's per-tensor (global) scales, with FP4 input and weight.
    {"input-global-scale", true, kLayer},
    {"weight-global-scale", true, kLayer},
    // verify, diagnose: NAME=DTYPE; upload: DTYPE, for every tensor.
    {"dtype", true, kLayer | kUpload},
    {"no-progress", false, kCheck | kUpload | kCompare},
    {"weight-layout", true, kLayer},
    {"activation", true, kLayer},
    {"output-dtype", true, kLayer},
    // diagnose and compare: the candidates; --candidates is diagnose's
    // older name for the same list.
    {"config", true, kCheck | kCompare},
    {"candidates", true, kDiagnose},
    {"reference", true, kCheck | kCompare},
    // VerifyRequest.accept / CompareRequest.accept (repeatable).
    {"accept", true, kLayer},
    // The full tables instead of the short answer.
    {"verbose", false, kLayer},
    {"tolerance", true, kCheck},
    {"atol", true, kCheck},
    {"rtol", true, kCheck},
    {"max-ulp", true, kCheck},
    {"bound-factor", true, kCheck},
    {"bound-precision", true, kCheck},
    {"nan-equal", false, kCheck},
    {"top-k", true, kCheck | kCompare},
    {"repeat", true, kVerify},
    {"disallow-reduced-precision-reduction", false, kVerify},
    // VerifyRequest.algorithm_sweep and batch_invariance.
    {"algorithm-sweep", true, kRun},
    // VerifyRequest.gpu: the server checks the name and adds the replays of
    // that GPU's kernels to a diagnosis (verify's with --accept too).
    {"gpu", true, kRun},
    {"batch-invariance", false, kRun},
    {"batch-sizes", true, kRun},
    // The reports of a check; render draws a sweep's from its JSON.
    {"junit", true, kCheck | kRender},
    {"github", false, kCheck | kRender},
    {"save-outputs", true, kRun},
    // --html FILE: client/cli/html_report.h.
    {"html", true, kCheck | kRender},
    // sweep (client/cli/internal/sweep_plan.h).
    {"weights", true, kSweep},
    // render: the observed outputs of --html's heatmaps.
    {"captures", true, kSweep | kRender},
    {"map", true, kSweep},
    {"bound-threshold", true, kSweep},
    {"jobs", true, kSweep},
    {"no-diagnose", false, kSweep},
    // health: the service whose status to ask for (empty: the server's).
    {"service", true, kHealth},
};

unsigned CommandBit(const std::string& c) {
  if (c == "verify") return kVerify;
  if (c == "diagnose") return kDiagnose;
  if (c == "capabilities") return kCaps;
  if (c == "upload") return kUpload;
  if (c == "sweep") return kSweep;
  if (c == "health") return kHealth;
  if (c == "compare") return kCompare;
  if (c == "render") return kRender;
  return 0;
}

}  // namespace

absl::Status Usage(absl::string_view msg) { return absl::InvalidArgumentError(msg); }

absl::StatusOr<CommandLine> ParseCommandLine(int argc, char** argv) {
  CommandLine cl;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h") {
      cl.flags.emplace("help", "");
      continue;
    }
    if (arg.rfind("--", 0) != 0) {
      if (cl.command.empty()) {
        if (arg == "help") {
          cl.flags.emplace("help", "");
          continue;
        }
        if (CommandBit(arg) == 0) {
          return Usage(
              absl::StrCat("unknown command '", arg,
                           "': verify, diagnose, compare, sweep, render, upload, capabilities or "
                           "health expected"));
        }
        cl.command = arg;
        continue;
      }
      if (cl.command == "upload" || cl.command == "render") {
        cl.args.push_back(arg);
        continue;
      }
      return Usage(absl::StrCat("unexpected argument '", arg, "' (flags are --name VALUE)"));
    }
    std::string name = arg.substr(2);
    std::optional<std::string> value;
    const size_t eq = name.find('=');
    if (eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    if (name == "version" && cl.command.empty()) {
      cl.flags.emplace("version", "");
      continue;
    }
    const FlagSpec* spec = nullptr;
    for (const FlagSpec& f : kFlags) {
      if (name == f.name) spec = &f;
    }
    const unsigned bit = cl.command.empty() ? 0 : CommandBit(cl.command);
    // Before the command: the flags every command takes.
    if (spec == nullptr || (bit != 0 && (spec->commands & bit) == 0) ||
        (bit == 0 && spec->commands != kAll)) {
      return Usage(absl::StrCat("unknown flag --", name,
                                cl.command.empty() ? "" : absl::StrCat(" for '", cl.command, "'")));
    }
    if (spec->has_value) {
      if (!value.has_value()) {
        if (i + 1 >= argc) return Usage(absl::StrCat("--", name, " needs a value"));
        value = argv[++i];
      }
      cl.flags.emplace(name, *value);
    } else {
      if (value.has_value()) {
        return Usage(absl::StrCat("--", name, " takes no value"));
      }
      cl.flags.emplace(name, "");
    }
  }
  return cl;
}

absl::StatusOr<double> ParseDoubleFlag(const CommandLine& cl, const std::string& f, bool positive) {
  double v;
  const std::string s = cl.Get(f);
  if (!absl::SimpleAtod(s, &v) || !std::isfinite(v) || v < 0 || (positive && v == 0)) {
    return Usage(absl::StrCat("--", f, ": a ", positive ? "positive" : "non-negative",
                              " number expected, got '", s, "'"));
  }
  return v;
}

absl::StatusOr<int64_t> ParseIntFlag(const CommandLine& cl, const std::string& f, int64_t lo,
                                     int64_t hi) {
  int64_t v;
  const std::string s = cl.Get(f);
  if (!absl::SimpleAtoi(s, &v) || v < lo || v > hi) {
    return Usage(
        absl::StrCat("--", f, ": an integer in [", lo, ", ", hi, "] expected, got '", s, "'"));
  }
  return v;
}

}  // namespace tensorcheck::cli::internal
