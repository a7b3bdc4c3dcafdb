// tensorcheck: command-line client of the tensorcheck service.
//
//   tensorcheck [--server HOST:PORT] verify --input x.npy --weight w.npy
//       --observed y.npy --config cpu:fp32 --config cpu:tf32 --json
//   tensorcheck diagnose --input x.npy --weight m.safetensors:fc.weight
//       --observed y.npy
//   tensorcheck capabilities
//
// Talks to the server only through the generated API stubs. Flags are parsed
// by hand (a subcommand plus its flags, `--config` repeatable) because the
// flag set depends on the subcommand.
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "client/cli/html_report.h"
#include "client/cli/report.h"
#include "client/cli/tensor_io.h"
#include "grpcpp/grpcpp.h"
#include "server/core/linear_config.h"
#include "server/core/dtype.h"
#include "server/core/status_macros.h"
#include "server/core/tensor.h"
#include "proto/dtype_proto.h"
#include "tensorcheck/v1/tensorcheck.grpc.pb.h"

namespace tensorcheck::cli {
namespace {

constexpr int kExitPass = 0;
constexpr int kExitUsage = 2;
constexpr int kExitServer = 3;
constexpr int kMaxMessageBytes = 1 << 30;  // the server's limit governs
constexpr double kDefaultTimeoutSeconds = 300;

constexpr const char kVersion[] = "tensorcheck 0.1.0";

constexpr const char kMainUsage[] =
    R"(Usage: tensorcheck [--server HOST:PORT] COMMAND [FLAGS]

Commands:
  verify        run a linear layer under backend configurations and compare
  diagnose      tell which configuration produced an observed output
  capabilities  what the server can run, its device and limits

Global flags:
  --server HOST:PORT   the tensorcheck server (default localhost:50051)
  --help               this text; `tensorcheck COMMAND --help` for a command
  --version            print the version

)";

constexpr const char kTensorFlags[] =
    R"(Tensors (FILE.npy v1-v3 with dtype <f8 <f4 <f2, or FILE.safetensors:TENSOR
with dtype F64 F32 F16 BF16; a bfloat16 .npy holds <u2 bit patterns and needs
--dtype NAME=bf16):
  --input X              [..., K]
  --weight W             [N, K] (out_in) or [K, N] (in_out)
  --bias B               [N], optional
  --observed Y           [..., N], the output your framework produced
  --dtype NAME=DTYPE     require argument NAME (input, weight, bias, observed)
                         to hold DTYPE; bf16 reads a <u2 .npy as bf16 bits
  --weight-layout out_in|in_out   (default out_in: torch/candle; in_out: flax)
  --activation none|relu|gelu     (default none; gelu is the tanh form)
  --output-dtype DTYPE   round every configuration's output to DTYPE
                         (default: the input's dtype)

Comparison:
  --reference SPEC       (default cpu:fp64)
  --tolerance torch|numpy|polygraphy|explicit|ulp|bound   (default torch)
  --atol A, --rtol R     override the preset's values (explicit: the values)
  --max-ulp N            for --tolerance ulp (implies it when no preset given)
  --bound-factor C       the constant of --tolerance bound (default 1)
  --bound-precision P    --tolerance bound: the precision whose bound the
                         observed output is held to (default: its dtype's)
  --nan-equal            NaN compares equal to NaN
  --top-k N              worst elements listed per comparison (default 10)

Output:
  --json                 print the JSON report (docs/json-report.md)
  --junit FILE           write JUnit XML, one test case per configuration
  --github               print GitHub Actions annotations (to stderr with
                         --json) and append a Markdown summary to the file
                         named by $GITHUB_STEP_SUMMARY when it is set
  --save-outputs DIR     write DIR/<config, ':' -> '_'>.npy for every
                         configuration and the reference (bf16 outputs are
                         written as float32, exactly)
  --html FILE            write a self-contained HTML page: summary, ranking,
                         ULP histograms, heatmaps of the differences (asks
                         the server for every output)

Connection:
  --server HOST:PORT     (default localhost:50051)
  --timeout SECONDS      deadline of the call (default 300)

SPEC is backend:precision[:bias], e.g. cpu:fp32, cpu:tf32:fused,
cublaslt:bf16:unfused; precisions fp64 fp32 tf32 tf32rna tf32trunc bf16 fp16
fp16acc; bias modes fused unfused none.

)";

constexpr const char kExitCodes[] =
    R"(Exit codes:
  0  pass (diagnose: a candidate explains the observed output)
  1  parity failure (diagnose: no candidate explains it)
  2  usage or input error: bad flags, unreadable or malformed tensor files,
     and requests the server rejects as invalid: INVALID_ARGUMENT, NOT_FOUND,
     FAILED_PRECONDITION, OUT_OF_RANGE, RESOURCE_EXHAUSTED (a size limit),
     UNIMPLEMENTED (configuration not available on this server/device)
  3  server unreachable or server-side error: UNAVAILABLE, DEADLINE_EXCEEDED,
     INTERNAL, UNKNOWN, UNAUTHENTICATED, PERMISSION_DENIED, ABORTED,
     CANCELLED, DATA_LOSS, or a response without a verdict
)";

constexpr const char kVerifyUsage[] =
    R"(Usage: tensorcheck [--server HOST:PORT] verify --input X --weight W [--bias B]
    [--observed Y] [--config SPEC]... [--reference SPEC] [--tolerance PRESET]
    [--atol A] [--rtol R] [--json] [--junit FILE] [--github]
    [--save-outputs DIR] [--html FILE] [--repeat N] [--timeout SECONDS] ...

Runs y = act(x W^T + b) under each --config (repeatable; none: the reference
alone) and compares every output with the reference and with --observed.
With --observed the verdict is "observed within tolerance of the reference";
without, "every configuration within tolerance of the reference".

  --config SPEC          a configuration to run (repeatable; also SPEC,SPEC)
  --repeat N             run each configuration N times, report determinism
  --disallow-reduced-precision-reduction   (cuBLAS) forbid it on GPU backends

)";

constexpr const char kDiagnoseUsage[] =
    R"(Usage: tensorcheck [--server HOST:PORT] diagnose --input X --weight W [--bias B]
    --observed Y [--candidates SPEC,SPEC...] [--json] [--junit FILE] [--github]
    [--html FILE] ...

Ranks candidate configurations by how well they reproduce --observed and
explains the best match in framework terms.

  --candidates SPEC,...  candidates to rank (default: every precision and
                         bias mode the server supports); --config SPEC adds one

)";

constexpr const char kCapabilitiesUsage[] =
    R"(Usage: tensorcheck [--server HOST:PORT] capabilities [--json] [--timeout SECONDS]

)";

// ---------------------------------------------------------------- flags

enum Cmd : unsigned { kVerify = 1, kDiagnose = 2, kCaps = 4 };
constexpr unsigned kRun = kVerify | kDiagnose;
constexpr unsigned kAll = kRun | kCaps;

struct FlagSpec {
  const char* name;
  bool has_value;
  unsigned commands;
};

constexpr FlagSpec kFlags[] = {
    {"server", true, kAll},
    {"timeout", true, kAll},
    {"json", false, kAll},
    {"help", false, kAll},
    {"input", true, kRun},
    {"weight", true, kRun},
    {"bias", true, kRun},
    {"observed", true, kRun},
    {"dtype", true, kRun},
    {"weight-layout", true, kRun},
    {"activation", true, kRun},
    {"output-dtype", true, kRun},
    {"config", true, kRun},
    {"candidates", true, kDiagnose},
    {"reference", true, kRun},
    {"tolerance", true, kRun},
    {"atol", true, kRun},
    {"rtol", true, kRun},
    {"max-ulp", true, kRun},
    {"bound-factor", true, kRun},
    {"bound-precision", true, kRun},
    {"nan-equal", false, kRun},
    {"top-k", true, kRun},
    {"repeat", true, kVerify},
    {"disallow-reduced-precision-reduction", false, kVerify},
    {"junit", true, kRun},
    {"github", false, kRun},
    {"save-outputs", true, kRun},
    // --html FILE: client/cli/html_report.h.
    {"html", true, kRun},
};

// Parsed command line: every flag's values in order of appearance.
struct CommandLine {
  std::string command;
  std::multimap<std::string, std::string> flags;

  bool Has(const std::string& f) const { return flags.count(f) > 0; }
  // The last value given.
  std::string Get(const std::string& f, const std::string& def = "") const {
    auto range = flags.equal_range(f);
    std::string v = def;
    for (auto it = range.first; it != range.second; ++it) v = it->second;
    return v;
  }
  std::vector<std::string> All(const std::string& f) const {
    std::vector<std::string> out;
    auto range = flags.equal_range(f);
    for (auto it = range.first; it != range.second; ++it) out.push_back(it->second);
    return out;
  }
};

// A usage error: printed with a pointer to --help, exit 2.
absl::Status Usage(absl::string_view msg) {
  return absl::InvalidArgumentError(msg);
}

unsigned CommandBit(const std::string& c) {
  if (c == "verify") return kVerify;
  if (c == "diagnose") return kDiagnose;
  if (c == "capabilities") return kCaps;
  return 0;
}

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
          return Usage(absl::StrCat("unknown command '", arg,
                                    "': verify, diagnose or capabilities expected"));
        }
        cl.command = arg;
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
    if (spec == nullptr ||
        (bit != 0 && (spec->commands & bit) == 0) ||
        (bit == 0 && name != "server" && name != "help" && name != "timeout")) {
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

absl::StatusOr<double> ParseDoubleFlag(const CommandLine& cl, const std::string& f,
                                       bool positive) {
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
    return Usage(absl::StrCat("--", f, ": an integer in [", lo, ", ", hi, "] expected, got '",
                              s, "'"));
  }
  return v;
}

// Reads a tensor argument into `out`, moving its bytes into the proto.
absl::Status LoadTensor(const CommandLine& cl, const std::string& flag,
                        const std::map<std::string, DType>& dtypes, pb::Tensor* out) {
  TensorReadOptions opts;
  auto it = dtypes.find(flag);
  if (it != dtypes.end()) opts.expected_dtype = it->second;
  const std::string arg = cl.Get(flag);
  auto t = ReadTensorArg(arg, opts);
  if (!t.ok()) {
    return absl::Status(t.status().code(),
                        absl::StrCat("--", flag, ": ", t.status().message()));
  }
  out->set_dtype(DTypeToProto(t->dtype()));
  for (int64_t d : t->shape()) out->add_shape(d);
  out->set_data(t->bytes().data(), t->bytes().size());
  return absl::OkStatus();
}

// Builds the request from the flags; every client-side check happens here,
// before anything is sent.
absl::StatusOr<pb::VerifyRequest> BuildRequest(const CommandLine& cl) {
  const bool diagnose = cl.command == "diagnose";
  for (const char* required : {"input", "weight"}) {
    if (!cl.Has(required)) return Usage(absl::StrCat("--", required, " is required"));
  }
  if (diagnose && !cl.Has("observed")) return Usage("diagnose needs --observed");

  pb::VerifyRequest req;
  pb::LinearOp* op = req.mutable_op();

  // Validate cheap flags before reading (possibly large) files.
  if (cl.Has("weight-layout")) {
    auto l = ParseWeightLayout(cl.Get("weight-layout"));
    if (!l.ok()) return Usage(absl::StrCat("--weight-layout: ", l.status().message()));
    op->set_weight_layout(*l == WeightLayout::kInOut ? pb::WEIGHT_LAYOUT_IN_OUT
                                                     : pb::WEIGHT_LAYOUT_OUT_IN);
  }
  if (cl.Has("activation")) {
    auto a = ParseActivation(cl.Get("activation"));
    if (!a.ok()) return Usage(absl::StrCat("--activation: ", a.status().message()));
    switch (*a) {
      case Activation::kNone:
        op->set_activation(pb::ACTIVATION_NONE);
        break;
      case Activation::kRelu:
        op->set_activation(pb::ACTIVATION_RELU);
        break;
      case Activation::kGeluTanh:
        op->set_activation(pb::ACTIVATION_GELU_TANH);
        break;
    }
  }
  if (cl.Has("output-dtype")) {
    auto d = ParseDType(cl.Get("output-dtype"));
    if (!d.ok()) return Usage(absl::StrCat("--output-dtype: ", d.status().message()));
    op->set_output_dtype(DTypeToProto(*d));
  }

  std::vector<std::string> specs;
  for (const std::string& v : cl.All("config")) {
    for (absl::string_view s : absl::StrSplit(v, ',', absl::SkipWhitespace())) {
      specs.emplace_back(s);
    }
  }
  for (const std::string& v : cl.All("candidates")) {
    for (absl::string_view s : absl::StrSplit(v, ',', absl::SkipWhitespace())) {
      specs.emplace_back(s);
    }
  }
  for (const std::string& s : specs) {
    auto spec = ParseConfigSpec(s, diagnose ? "--candidates" : "--config");
    if (!spec.ok()) return Usage(spec.status().message());
    req.add_configs(s);
  }
  if (cl.Has("reference")) {
    auto spec = ParseConfigSpec(cl.Get("reference"), "--reference");
    if (!spec.ok()) return Usage(spec.status().message());
    req.set_reference(cl.Get("reference"));
  }

  pb::Tolerance* tol = req.mutable_tolerance();
  std::string preset = cl.Get("tolerance");
  if (preset.empty() && cl.Has("max-ulp")) preset = "ulp";
  if (preset.empty() || preset == "torch") {
    tol->set_preset(pb::Tolerance::PRESET_TORCH);
  } else if (preset == "numpy") {
    tol->set_preset(pb::Tolerance::PRESET_NUMPY);
  } else if (preset == "polygraphy") {
    tol->set_preset(pb::Tolerance::PRESET_POLYGRAPHY);
  } else if (preset == "explicit") {
    tol->set_preset(pb::Tolerance::PRESET_EXPLICIT);
    if (!cl.Has("atol") && !cl.Has("rtol")) {
      return Usage("--tolerance explicit needs --atol and/or --rtol");
    }
  } else if (preset == "ulp") {
    tol->set_preset(pb::Tolerance::PRESET_ULP);
    if (!cl.Has("max-ulp")) return Usage("--tolerance ulp needs --max-ulp N");
  } else if (preset == "bound") {
    tol->set_preset(pb::Tolerance::PRESET_BOUND);
  } else {
    return Usage(absl::StrCat("--tolerance: torch, numpy, polygraphy, explicit, ulp or bound "
                              "expected, got '",
                              preset, "'"));
  }
  if (cl.Has("max-ulp") && preset != "ulp") {
    return Usage(absl::StrCat("--max-ulp applies to --tolerance ulp, not '", preset, "'"));
  }
  if ((cl.Has("atol") || cl.Has("rtol")) && (preset == "ulp" || preset == "bound")) {
    return Usage(absl::StrCat("--atol/--rtol do not apply to --tolerance ", preset));
  }
  if ((cl.Has("bound-factor") || cl.Has("bound-precision")) && preset != "bound") {
    return Usage("--bound-factor and --bound-precision apply to --tolerance bound");
  }
  if (cl.Has("bound-precision")) {
    auto p = ParsePrecision(cl.Get("bound-precision"));
    if (!p.ok()) return Usage(absl::StrCat("--bound-precision: ", p.status().message()));
    tol->set_bound_precision(std::string(PrecisionName(*p)));
  }
  if (cl.Has("atol")) {
    TC_ASSIGN_OR_RETURN(double v, ParseDoubleFlag(cl, "atol", /*positive=*/false));
    tol->mutable_atol()->set_value(v);
  }
  if (cl.Has("rtol")) {
    TC_ASSIGN_OR_RETURN(double v, ParseDoubleFlag(cl, "rtol", /*positive=*/false));
    tol->mutable_rtol()->set_value(v);
  }
  if (cl.Has("max-ulp")) {
    uint64_t v;
    if (!absl::SimpleAtoi(cl.Get("max-ulp"), &v)) {
      return Usage(absl::StrCat("--max-ulp: a non-negative integer expected, got '",
                                cl.Get("max-ulp"), "'"));
    }
    tol->set_max_ulp(v);
  }
  if (cl.Has("bound-factor")) {
    TC_ASSIGN_OR_RETURN(double v, ParseDoubleFlag(cl, "bound-factor", /*positive=*/true));
    tol->set_bound_factor(v);
  }
  tol->set_nan_equal(cl.Has("nan-equal"));

  if (cl.Has("top-k")) {
    TC_ASSIGN_OR_RETURN(int64_t k, ParseIntFlag(cl, "top-k", 0, 1'000'000));
    req.mutable_output()->set_top_k(static_cast<int32_t>(k));
  }
  if (cl.Has("repeat")) {
    TC_ASSIGN_OR_RETURN(int64_t n, ParseIntFlag(cl, "repeat", 1, 1'000'000));
    req.set_repeat(static_cast<int32_t>(n));
  }
  req.set_disallow_reduced_precision_reduction(
      cl.Has("disallow-reduced-precision-reduction"));
  if (cl.Has("save-outputs")) req.mutable_output()->set_return_outputs(true);
  // The heatmaps of --html need every output.
  if (cl.Has("html")) req.mutable_output()->set_return_outputs(true);

  std::map<std::string, DType> dtypes;
  for (const std::string& v : cl.All("dtype")) {
    const size_t eq = v.find('=');
    const std::string name = v.substr(0, eq == std::string::npos ? v.size() : eq);
    if (eq == std::string::npos ||
        (name != "input" && name != "weight" && name != "bias" && name != "observed")) {
      return Usage(absl::StrCat(
          "--dtype: NAME=DTYPE with NAME one of input, weight, bias, observed expected, got '",
          v, "'"));
    }
    auto d = ParseDType(v.substr(eq + 1));
    if (!d.ok()) return Usage(absl::StrCat("--dtype ", name, ": ", d.status().message()));
    if (name == "bias" && !cl.Has("bias")) return Usage("--dtype bias=... without --bias");
    if (name == "observed" && !cl.Has("observed")) {
      return Usage("--dtype observed=... without --observed");
    }
    dtypes[name] = *d;
  }

  TC_RETURN_IF_ERROR(LoadTensor(cl, "input", dtypes, op->mutable_input()));
  TC_RETURN_IF_ERROR(LoadTensor(cl, "weight", dtypes, op->mutable_weight()));
  if (cl.Has("bias")) TC_RETURN_IF_ERROR(LoadTensor(cl, "bias", dtypes, op->mutable_bias()));
  if (cl.Has("observed")) {
    TC_RETURN_IF_ERROR(LoadTensor(cl, "observed", dtypes, req.mutable_observed()));
  }
  return req;
}

// ---------------------------------------------------------------- RPC

const char* GrpcCodeName(grpc::StatusCode c) {
  switch (c) {
    case grpc::StatusCode::OK:
      return "OK";
    case grpc::StatusCode::CANCELLED:
      return "CANCELLED";
    case grpc::StatusCode::UNKNOWN:
      return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND:
      return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS:
      return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED:
      return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE:
      return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL:
      return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS:
      return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    default:
      return "UNKNOWN";
  }
}

// The exit-code mapping documented in kExitCodes.
int ExitCodeForGrpc(grpc::StatusCode c) {
  switch (c) {
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::NOT_FOUND:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::OUT_OF_RANGE:
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
    case grpc::StatusCode::UNIMPLEMENTED:
      return kExitUsage;
    default:
      return kExitServer;
  }
}

int ReportGrpcError(const grpc::Status& s, const std::string& server) {
  const int code = ExitCodeForGrpc(s.error_code());
  if (code == kExitServer) {
    std::cerr << "tensorcheck: server error (" << GrpcCodeName(s.error_code())
              << "): " << s.error_message();
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
      std::cerr << " [server " << server << "]";
    }
    std::cerr << "\n";
  } else {
    std::cerr << "tensorcheck: request rejected (" << GrpcCodeName(s.error_code())
              << "): " << s.error_message() << "\n";
  }
  return code;
}

std::unique_ptr<pb::TensorCheck::Stub> MakeStub(const std::string& server) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  return pb::TensorCheck::NewStub(
      grpc::CreateCustomChannel(server, grpc::InsecureChannelCredentials(), args));
}

void SetDeadline(grpc::ClientContext* ctx, double seconds) {
  seconds = std::min(seconds, 1e7);  // keeps the microsecond count in range
  ctx->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6)));
}

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

// A file name for a configuration: ':' and anything unusual become '_', so
// a server-sent name can never leave DIR.
std::string OutputFileName(const std::string& config) {
  std::string s;
  for (char c : config) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    (c >= '0' && c <= '9') || c == '-' || c == '_';
    s.push_back(ok ? c : '_');
  }
  if (s.empty()) s = "unnamed";
  return s + ".npy";
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

// --html FILE: the observed tensor is rebuilt from the request's bytes
// (BuildRequest moved them there); without it the page has no heatmaps.
absl::Status WriteHtml(const pb::VerifyResponse& r, const ReportContext& ctx,
                       const pb::VerifyRequest& req, const std::string& path) {
  std::optional<Tensor> observed;
  if (req.has_observed() && req.observed().source_case() == pb::Tensor::kData) {
    if (const std::optional<DType> d = DTypeFromProto(req.observed().dtype()); d.has_value()) {
      auto t = Tensor::FromBytes(
          *d, {req.observed().shape().begin(), req.observed().shape().end()},
          req.observed().data());
      if (t.ok()) observed = *std::move(t);
    }
  }
  return WriteTextFile(path, FormatHtml(r, ctx, observed ? &*observed : nullptr),
                       /*append=*/false);
}

int RunVerifyOrDiagnose(const CommandLine& cl, const std::string& server, double timeout) {
  auto req = BuildRequest(cl);
  if (!req.ok()) {
    std::cerr << "tensorcheck: " << req.status().message() << "\n";
    if (absl::IsInvalidArgument(req.status()) &&
        absl::string_view(req.status().message()).rfind("--", 0) == 0) {
      std::cerr << "(see tensorcheck " << cl.command << " --help)\n";
    }
    return kExitUsage;
  }
  const ReportContext ctx{cl.command};
  auto stub = MakeStub(server);
  grpc::ClientContext grpc_ctx;
  SetDeadline(&grpc_ctx, timeout);
  pb::VerifyResponse resp;
  const grpc::Status s = cl.command == "diagnose" ? stub->Diagnose(&grpc_ctx, *req, &resp)
                                                  : stub->Verify(&grpc_ctx, *req, &resp);
  if (!s.ok()) return ReportGrpcError(s, server);

  const bool json = cl.Has("json");
  if (json) {
    std::cout << VerifyResponseToJson(resp).dump(2) << "\n";
  } else {
    std::cout << FormatHuman(resp, ctx);
  }
  int code = ExitCodeFor(resp, ctx);
  if (code == kExitServer) {
    std::cerr << "tensorcheck: server error: the response carries no "
              << (cl.command == "diagnose" ? "diagnosis" : "verdict") << "\n";
  }
  if (cl.Has("github")) {
    (json ? std::cerr : std::cout) << FormatGithubAnnotations(resp, ctx);
    if (const char* summary = std::getenv("GITHUB_STEP_SUMMARY");
        summary != nullptr && summary[0] != '\0') {
      const absl::Status w = WriteTextFile(summary, FormatGithubSummary(resp, ctx),
                                           /*append=*/true);
      if (!w.ok()) std::cerr << "tensorcheck: warning: " << w.message() << "\n";
    }
  }
  absl::Status out_status;
  if (cl.Has("junit")) {
    out_status.Update(WriteTextFile(cl.Get("junit"), FormatJUnit(resp, ctx), /*append=*/false));
  }
  if (cl.Has("save-outputs")) out_status.Update(SaveOutputs(resp, cl.Get("save-outputs")));
  if (cl.Has("html")) out_status.Update(WriteHtml(resp, ctx, *req, cl.Get("html")));
  if (!out_status.ok()) {
    std::cerr << "tensorcheck: " << out_status.message() << "\n";
    if (code == kExitPass) code = kExitUsage;
  }
  return code;
}

int RunCapabilities(const CommandLine& cl, const std::string& server, double timeout) {
  auto stub = MakeStub(server);
  grpc::ClientContext grpc_ctx;
  SetDeadline(&grpc_ctx, timeout);
  pb::GetCapabilitiesResponse resp;
  const grpc::Status s = stub->GetCapabilities(&grpc_ctx, pb::GetCapabilitiesRequest(), &resp);
  if (!s.ok()) return ReportGrpcError(s, server);
  if (cl.Has("json")) {
    std::cout << CapabilitiesToJson(resp).dump(2) << "\n";
  } else {
    std::cout << FormatCapabilities(resp);
  }
  return kExitPass;
}

int Main(int argc, char** argv) {
  auto cl = ParseCommandLine(argc, argv);
  if (!cl.ok()) {
    std::cerr << "tensorcheck: " << cl.status().message() << "\n"
              << "(see tensorcheck --help)\n";
    return kExitUsage;
  }
  if (cl->Has("version")) {
    std::cout << kVersion << "\n";
    return kExitPass;
  }
  if (cl->Has("help")) {
    if (cl->command == "verify") {
      std::cout << kVerifyUsage << kTensorFlags << kExitCodes;
    } else if (cl->command == "diagnose") {
      std::cout << kDiagnoseUsage << kTensorFlags << kExitCodes;
    } else if (cl->command == "capabilities") {
      std::cout << kCapabilitiesUsage << kExitCodes;
    } else {
      std::cout << kMainUsage << kExitCodes;
    }
    return kExitPass;
  }
  if (cl->command.empty()) {
    std::cerr << kMainUsage << kExitCodes;
    return kExitUsage;
  }
  const std::string server = cl->Get("server", "localhost:50051");
  if (server.empty()) {
    std::cerr << "tensorcheck: --server: HOST:PORT expected\n";
    return kExitUsage;
  }
  double timeout = kDefaultTimeoutSeconds;
  if (cl->Has("timeout")) {
    auto t = ParseDoubleFlag(*cl, "timeout", /*positive=*/true);
    if (!t.ok()) {
      std::cerr << "tensorcheck: " << t.status().message() << "\n";
      return kExitUsage;
    }
    timeout = *t;
  }
  if (cl->command == "capabilities") return RunCapabilities(*cl, server, timeout);
  return RunVerifyOrDiagnose(*cl, server, timeout);
}

}  // namespace
}  // namespace tensorcheck::cli

int main(int argc, char** argv) { return tensorcheck::cli::Main(argc, argv); }
