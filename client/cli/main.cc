// tensorcheck: command-line client of the tensorcheck service.
//
//   tensorcheck [--server HOST:PORT] verify --input x.npy --weight w.npy
//       --observed y.npy --config cpu:fp32 --config cpu:tf32 --json
//   tensorcheck diagnose --input x.npy --weight m.safetensors:fc.weight
//       --observed y.npy --accept tf32
//   tensorcheck compare --input x.npy --weight w.npy --observed torch_y.npy
//       --observed flax_y.npy
//   tensorcheck capabilities
//   tensorcheck upload w.npy m.safetensors:fc.weight
//   tensorcheck sweep --weights model.safetensors --captures captures.safetensors
//   tensorcheck render report.json --junit report.xml --html report.html
//   tensorcheck health --service tensorcheck.v1.TensorCheck
//   TENSORCHECK_TOKEN=... tensorcheck --server tc.example:443 --tls-ca ca.pem
//       capabilities
//
// Talks to the server only through the generated API stubs. Flags are parsed
// by hand (a subcommand plus its flags, `--config` repeatable) because the
// flag set depends on the subcommand.
//
// main.cc holds the usage texts and dispatches to a command:
// command_line.cc parses the flags, internal/connection.h turns the
// connection flags (--server, --tls-*, --token) and the environment into a
// channel, verify_request.cc builds the request,
// commands.cc makes the RPCs and prints the report, output_files.cc writes
// --junit, --save-outputs and --html; tensors above 1 MiB go by digest
// through the server's store (internal/tensor_transfer.h,
// internal/store_client.h), `sha256:` arguments are tensor_ref.h; sweep.cc
// runs `sweep` (internal/sweep_plan.h, internal/sweep_report.h) and
// `render`, which draws a sweep's reports from its JSON report with the
// renderer sweep uses (internal/sweep_render.h).
#include <grpc/grpc.h>

#include <iostream>
#include <string>

#include "client/cli/internal/command_line.h"
#include "client/cli/internal/commands.h"
#include "client/cli/internal/connection.h"

namespace tensorcheck::cli {

using internal::ConnectionFromFlags;
using internal::kExitPass;
using internal::kExitUsage;
using internal::ParseCommandLine;
using internal::ParseDoubleFlag;
using internal::RunCapabilities;
using internal::RunCompare;
using internal::RunHealth;
using internal::RunRender;
using internal::RunSweep;
using internal::RunUpload;
using internal::RunVerifyOrDiagnose;

namespace {

constexpr double kDefaultTimeoutSeconds = 300;

constexpr const char kVersion[] = "tensorcheck 0.1.0";

constexpr const char kMainUsage[] =
    R"(Usage: tensorcheck [CONNECTION FLAGS] COMMAND [FLAGS]

Commands:
  verify        run a linear layer under backend configurations and compare
  diagnose      tell which configuration produced an observed output: bug or
                rounding?
  compare       two outputs of one layer (e.g. PyTorch's and Flax's): which
                configuration each is, and whether they differ by rounding
  capabilities  what the server can run, its device and limits
  upload        put tensors into the server's store; print their digests
  sweep         check every linear layer of a model from a captures file
  render        a sweep's table, JUnit, GitHub summary and HTML page from its
                JSON report (no server)
  health        the server's status from the gRPC health service

Global flags:
  --help               this text; `tensorcheck COMMAND --help` for a command
  --version            print the version
  --timeout SECONDS    deadline of the command (default 300)

)";

constexpr const char kConnectionFlags[] =
    R"(Connection (every command; also before the command):
  --server HOST:PORT     the server (default: $TENSORCHECK_SERVER, else
                         localhost:50051); --target and $TENSORCHECK_TARGET
                         are deprecated names of the same (a warning)
  --tls-ca FILE          connect over TLS; the server's certificate must chain
                         to a PEM certificate in FILE
  --tls-cert FILE        with --tls-key: the PEM client certificate (chain)
  --tls-key FILE         and its private key, for a server that requires
                         mutual TLS; TLS with the system's roots when there
                         is no --tls-ca
  --token TOKEN          sent as `authorization: Bearer TOKEN` on every call,
                         over TLS or plaintext (default: $TENSORCHECK_TOKEN,
                         which keeps it out of the process list; an empty
                         --token sends none)

)";

constexpr const char kTensorFlags[] =
    R"(Tensors (FILE.npy v1-v3 with dtype <f8 <f4 <f2, or FILE.safetensors:TENSOR
with dtype F64 F32 F16 BF16 F8_E4M3 F8_E5M2 F4 F8_E8M0; a bfloat16 .npy holds
<u2 bit patterns, or <V2 raw values from ml_dtypes, and needs --dtype
NAME=bf16, an FP8 .npy holds <u1 (|u1) bit patterns and needs --dtype
NAME=fp8e4m3 or --dtype NAME=fp8e5m2, a float8_e8m0fnu one too, with --dtype
NAME=e8m0, and a float4_e2m1fn one its bytes packed two elements each (element
2i in the low nibble, its last dimension half the tensor's), with --dtype
NAME=fp4e2m1; or
sha256:<64 hex>:<dtype>:<d0>x<d1>..., a tensor in the server's store, as
`tensorcheck upload` prints it):
  --input X              [..., K]
  --weight W             [N, K] (out_in) or [K, N] (in_out)
  --input-scale S        with FP8 input and weight (both required then): the
                         input's float32 dequantisation scale, scale_a of
                         torch._scaled_mm; S is a number (one per-tensor scale,
                         sent as float32 []) or a float32 tensor as above:
                         [] or [1] per tensor, [M] or [M, 1] row-wise
  --weight-scale S       the weight's, scale_b: a number, [] or [1] per tensor;
                         [N], [N, 1] or [1, N] row-wise (both scales per
                         tensor, or both row-wise); every value of either
                         scale finite and positive. Block-wise scales as
                         docs/numerics.md gives them: float32 for
                         scaling=block128, float8_e8m0fnu for MXFP8 and
                         float8_e4m3fn for NVFP4 (name the dtype of a <u1
                         .npy with --dtype input-scale=e8m0, ...)
  --input-global-scale G, --weight-global-scale G
                         with FP4 (nvfp4) input and weight: NVFP4's float32
                         per-tensor scales, a number or a [] or [1] tensor
  --bias B               [N], optional
  --observed Y           [..., N], the output your framework produced
  --dtype NAME=DTYPE     require argument NAME (input, weight, bias, observed,
                         input-scale, weight-scale) to hold DTYPE; bf16 reads
                         a <u2 .npy as bf16 bits, and a <V2 one (np.save of
                         an ml_dtypes bfloat16 array), fp8e4m3, fp8e5m2 and
                         e8m0 a <u1 .npy as their bits, fp4e2m1 as packed
                         FP4 bytes
  --weight-layout out_in|in_out   (default out_in: torch/candle; in_out: flax)
  --activation none|relu|gelu     (default none; gelu is the tanh form)
  --output-dtype DTYPE   round every configuration's output to DTYPE
                         (default: the input's dtype; bf16 for FP8 inputs)

Comparison:
  --reference SPEC       the configuration everything is compared with
                         (default, or empty: the server's default, the fp64
                         configuration of its fastest backend: cublaslt:fp64
                         on a GPU host, cpu:fp64 elsewhere; the report names
                         the one used)
  --tolerance torch|numpy|polygraphy|explicit|ulp|bound   (default torch)
  --atol A, --rtol R     override the preset's values (explicit: the values)
  --max-ulp N            for --tolerance ulp (implies it when no preset given)
  --bound-factor C       the constant of --tolerance bound (default 1)
  --bound-precision P    --tolerance bound: the precision whose bound the
                         observed output is held to (default: its dtype's)
  --nan-equal            NaN compares equal to NaN
  --top-k N              worst elements listed per comparison (default 10)

Output:
  --verbose              the full report: every ranked candidate, the
                         tolerance's comparison, every configuration's
                         statistics, shared GEMMs, notes (without it a
                         diagnosis is short: the server's headline, what to
                         change, the best match, the top ranking rows)
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

Deadline and progress:
  --timeout SECONDS      deadline of the command, uploads included
                         (default 300)
  --no-progress          no progress line on stderr (the phase: hashing,
                         uploading, waiting for the server's diagnosis, and
                         how long it has lasted; shown only when stderr is a
                         terminal)

Tensors above 1 MiB are hashed (SHA-256) and sent by digest: those the
server's store lacks are uploaded first, the others not at all. A server
without a store gets them inline.

SPEC is backend:precision[:bias][@options], e.g. cpu:fp32, cpu:tf32:fused,
cublaslt:bf16:unfused, cpu:fp8e4m3:fused@scaling=row,fast_accum; precisions
fp64 fp32 tf32 tf32rna tf32trunc bf16 fp16 fp16acc, the multi-pass bf16x3
bf16x6 bf16x9 tf32x3, and fp8e4m3 fp8e5m2 fp8e4m3e5m2 fp8e5m2e4m3 (FP8
operands with their scales, or wide ones the server quantises; options
scaling=tensor|row, fast_accum); or a JAX dot-algorithm preset as jax=NAME,
e.g. cpu:jax=BF16_BF16_F32_X3 (read as cpu:bf16x3); bias modes fused unfused
none (docs/numerics.md, "Multi-pass precisions" and "FP8").

)";

constexpr const char kExitCodes[] =
    R"(Exit codes:
  0  pass (diagnose: a candidate explains the observed output; with --accept,
     verify and diagnose: the server accepted it, its verdict is PASS)
  1  parity failure (diagnose: no candidate explains it; with --accept: the
     server did not accept it)
  2  usage or input error: bad flags, unreadable or malformed tensor files or
     --tls-* files, and requests the server rejects as invalid:
     INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION, OUT_OF_RANGE,
     RESOURCE_EXHAUSTED (a size limit), UNIMPLEMENTED (configuration not
     available on this server/device)
  3  server unreachable or server-side error: UNAVAILABLE (also a failed TLS
     handshake), DEADLINE_EXCEEDED, INTERNAL, UNKNOWN, UNAUTHENTICATED (no
     token or an unknown one), PERMISSION_DENIED (the token lacks the right),
     ABORTED, CANCELLED, DATA_LOSS, or a response without a verdict
)";

// Kernels and batches, for verify and diagnose (docs/numerics.md,
// "Algorithms", "Batch invariance", "Kernel K order").
constexpr const char kKernelFlags[] =
    R"(  --algorithm-sweep N    run each configuration that names no algorithm with
                         its backend's first N algorithms (0..16), as
                         SPEC@algo=i (a SPEC may name one: cublaslt:fp32@algo=3)
  --batch-invariance     also run every configuration on sub-batches of the
                         rows (single rows always) and report rows whose bits
                         change
  --batch-sizes N,N,...  further sub-batch sizes (with --batch-invariance)
  --gpu NAME             the GPU the observed output may come from: a100,
                         h100, h200, gh200, b200, gb200, or a generation sm80,
                         sm90, sm100; a diagnosis over the default candidates
                         (diagnose without --config) then also ranks the CPU
                         replays of its default kernels, e.g.
                         cpu:bf16:fused@mma=sm90; the notes (--verbose,
                         --json) say which ran

)";

constexpr const char kVerifyUsage[] =
    R"(Usage: tensorcheck [--server HOST:PORT] verify --input X --weight W [--bias B]
    [--observed Y] [--config SPEC]... [--accept PATTERN]... [--verbose]
    [--reference SPEC] [--tolerance PRESET]
    [--atol A] [--rtol R] [--json] [--junit FILE] [--github]
    [--save-outputs DIR] [--html FILE] [--repeat N] [--timeout SECONDS] ...

Runs y = act(x W^T + b) under each --config (repeatable; none: the reference
alone) and compares every output with the reference and with --observed.
With --observed the verdict is "observed within tolerance of the reference";
without, "every configuration within tolerance of the reference".

  --config SPEC          a configuration to run (repeatable; also SPEC,SPEC)
  --accept PATTERN       a configuration you accept (repeatable):
                         backend:precision[:bias], precision[:bias] or
                         backend:precision, e.g. tf32, cpu:bf16:unfused;
                         needs --observed; the server then diagnoses too, the
                         report opens with its headline, and the verdict is
                         whether the output is rounding of an accepted
                         configuration (exit 0) or not (exit 1)
  --repeat N             run each configuration N times, report determinism
  --disallow-reduced-precision-reduction   (cuBLAS) forbid it on GPU backends
)";

constexpr const char kDiagnoseUsage[] =
    R"(Usage: tensorcheck [--server HOST:PORT] diagnose --input X --weight W [--bias B]
    --observed Y [--config SPEC]... [--accept PATTERN]... [--verbose] [--json]
    [--junit FILE] [--github] [--html FILE] ...

Ranks candidate configurations by how well they reproduce --observed, says
whether the difference is rounding or a bug (the server's headline, first),
what to change, and the best match in framework terms. Short by default:
the headline, the advice, the best match, the top ranking rows (and those of
--accept and of the PyTorch and JAX defaults), where to look for a defect;
--verbose prints every table.

  --config SPEC          a candidate to rank (repeatable; also SPEC,SPEC; none:
                         every precision and bias mode the server supports);
                         --candidates SPEC,... is an older name for the same
  --accept PATTERN       a configuration you accept (repeatable):
                         backend:precision[:bias], precision[:bias] or
                         backend:precision, e.g. tf32, cpu:bf16:unfused; exit
                         0 when the server calls the output rounding of one
                         (its verdict PASS), 1 otherwise
)";

constexpr const char kCompareUsage[] =
    R"(Usage: tensorcheck [--server HOST:PORT] compare --input X --weight W [--bias B]
    --observed [NAME=]Y1 --observed [NAME=]Y2 [--config SPEC]... [--accept PATTERN]...
    [--reference SPEC] [--json] [--verbose] [--timeout SECONDS] ...

Two outputs of one layer (e.g. PyTorch's and Flax's), each diagnosed against
the same candidates, and the two against each other: which configuration
each is, whether their difference is rounding, and what to change for one to
match the other. Prints the server's headline first, then each output's best
match and the pair's numbers; --verbose adds each output's diagnosis and the
advice both ways; --json the report of docs/json-report.md ("compare").

  --observed [NAME=]Y    an output, exactly twice; called NAME, else by the
                         file's stem (torch_y.npy: torch_y) or, for
                         FILE.safetensors:TENSOR, by TENSOR; names hold
                         letters, digits, '_', '-', '.'; --dtype NAME=bf16
                         (or observed=bf16 for both) as for verify
  --config SPEC          a candidate both are diagnosed against (repeatable;
                         none: every configuration the server supports)
  --accept PATTERN       a configuration you accept for each output
                         (repeatable); then exit 0 only when the server
                         accepts both (its verdict PASS)
  --reference SPEC, --top-k N, --weight-layout, --activation, --output-dtype,
  --input-scale, --weight-scale, --input-global-scale, --weight-global-scale,
  --no-progress          as for verify

--input, --weight, --bias and the tensor syntax are verify's (see
`tensorcheck verify --help`); tensors above 1 MiB go through the server's
store as there.

Exit codes:
  0  the two outputs differ by rounding (pair.rounding; with --accept, and
     both accepted)
  1  they do not (or, with --accept, one is not accepted)
  2  usage or input error, or a request the server rejects as invalid
  3  server unreachable or server-side error
)";

constexpr const char kUploadUsage[] =
    R"(Usage: tensorcheck [--server HOST:PORT] upload [--dtype DTYPE] FILE[:NAME]...

Uploads tensors (FILE.npy, FILE.safetensors:TENSOR) into the server's store,
those it lacks only, and prints for each, one per line in argument order, the
argument that names it in verify and diagnose:

  sha256:<64 hex digits of the SHA-256 of its bytes>:<dtype>:<d0>x<d1>...

  --dtype DTYPE          require every tensor to hold DTYPE; bf16 reads a <u2
                         .npy as bf16 bits, fp8e4m3 and fp8e5m2 a <u1 .npy as
                         FP8 bits
  --timeout SECONDS      deadline of the whole upload (default 300)
  --no-progress          no progress line on stderr (shown only when stderr
                         is a terminal)

)";

constexpr const char kSweepUsage[] =
    R"(Usage: tensorcheck [--server HOST:PORT] sweep --weights FILE [--weights FILE]...
    --captures FILE [--map FILE] [--config SPEC]... [--tolerance PRESET] [--atol A]
    [--rtol R] [--max-ulp N] [--bound-threshold X] [--jobs N] [--no-diagnose]
    [--json] [--junit FILE] [--html FILE] [--github] [--no-progress] ...

Checks every linear-layer call a captures file holds, one Diagnose each
(--no-diagnose: Verify), and reports which layer call diverges first
(docs/model-checks.md).

  --captures FILE        safetensors: '{layer}.input' [..., K] and
                         '{layer}.output' [..., N] per layer call, the second
                         call of a module as '{layer}#1.input' ...; executed
                         in the order of __metadata__["tensorcheck.layers"]
                         (a JSON array of layer-call names) when present,
                         else in the order of the inputs' data offsets
  --weights FILE         safetensors with '{w}.weight' [N, K] (out_in) or
                         '{w}.kernel' [K, N] (in_out) and optional '{w}.bias'
                         [N]; repeatable (shards); '{w}' is the layer's name;
                         a file no layer call takes a tensor from is an error
  --map FILE             JSON {"capture layer name": "checkpoint prefix"} for
                         layers whose weights go by another name
  --config SPEC          a candidate (repeatable; default: all the server has)
  --bound-threshold X    a layer whose bound_ratio exceeds X diverges
                         (default 3)
  --jobs N               layer calls in flight at once (default 4)
  --no-diagnose          Verify each layer call (observed vs the reference)
                         instead of Diagnose
  --timeout SECONDS      deadline of the whole sweep, uploads included
                         (default 300)
  --no-progress          no "layers 12/24, 30 s" line on stderr (shown only
                         when stderr is a terminal)
  --tolerance PRESET     as for verify, but bound by default: every element
                         within its output precision's error bound
  --reference, --atol, --rtol, --max-ulp, --bound-factor, --bound-precision,
  --nan-equal, --top-k   as for verify

A layer call fails when the server's verdict on its diagnosis is defect or
unexplained (the reason is the server's sentence), when no candidate explains
its output, when the configurations explaining it exclude the one that
explains more than half of the layer calls, when its bound_ratio (its error
against the reference in units of its precision's error model) exceeds
--bound-threshold, or when its verdict is fail. Weights go into the server's store once each and are named
by digest; a captured output holding NaN or infinity is an input error.

Output: a table, then "First divergence: #I NAME (of N layer calls): REASON",
the layer call's index I counted from 0, as the JSON report's
first_divergence.index and the Python client's #I (--json: the report of docs/model-checks.md; --junit FILE:
one test case per layer call; --html FILE: one page with bound_ratio across
depth and every layer call's report; --github: annotations and a Markdown
summary appended to $GITHUB_STEP_SUMMARY). The JSON report carries every
layer call's response (with --html, the outputs the page draws):
`tensorcheck render` draws the other outputs from it again.

)";

constexpr const char kSweepExitCodes[] =
    R"(Exit codes:
  0  every layer call passed
  1  a layer call failed (diverged)
  2  usage or input error (bad flags, malformed or inconsistent files: the
     message names the layer and file), or a request the server rejected
  3  server unreachable or server-side error, also when the server goes away
     in the middle: the report shows what was checked, the rest not_checked;
     UNAUTHENTICATED and PERMISSION_DENIED (--token) too
)";

constexpr const char kRenderUsage[] =
    R"(Usage: tensorcheck render REPORT.json [--text] [--json] [--junit FILE] [--html FILE]
    [--github] [--captures FILE]

Renders the report of `tensorcheck sweep --json` (or of the Python client's
ModelReport.to_dict()) as sweep itself does: the same table, JSON, JUnit,
GitHub summary and HTML page, made by the same code from the layer calls'
responses the report carries (docs/model-checks.md, "tensorcheck render").
Needs no server. REPORT.json may be - for stdin.

  --text                 print the table (the default when no other output
                         is named)
  --json                 print the JSON report (the same keys, decided again
                         from the responses)
  --junit FILE           write JUnit XML, one test case per layer call
  --html FILE            write the page: bound_ratio across depth and every
                         layer call's report; heatmaps need the outputs the
                         report's responses carry (a sweep run with --html
                         keeps them) and --captures
  --github               print GitHub Actions annotations (to stderr with
                         --json) and append a Markdown summary to the file
                         named by $GITHUB_STEP_SUMMARY when it is set
  --captures FILE        with --html: the captures file the sweep read; its
                         '{layer call}.output' tensors are the observed
                         outputs the heatmaps compare

Exit codes: those the sweep gave for these results
  0  every layer call passed
  1  a layer call failed (diverged)
  2  a request the server rejected; or a bad report file (the message names
     the JSON path, e.g. layers[3].response), a bad --captures file, a file
     that could not be written, bad flags
  3  a server-side error, or layer calls not checked
)";

constexpr const char kHealthUsage[] =
    R"(Usage: tensorcheck [--server HOST:PORT] health [--service NAME] [--timeout SECONDS]

Asks the server's standard gRPC health service (grpc.health.v1.Health/Check)
and prints the status: SERVING (exit 0), NOT_SERVING (exit 1: the server is
draining), or an error (an unknown --service is NOT_FOUND, exit 2; an
unreachable server exit 3). Without --service: the whole server; the API's
own status is --service tensorcheck.v1.TensorCheck. Containers run it as
their health check (docker/Dockerfile, docker/Dockerfile.cuda).

)";

constexpr const char kCapabilitiesUsage[] =
    R"(Usage: tensorcheck [--server HOST:PORT] capabilities [--json] [--timeout SECONDS]

)";

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
      std::cout << kVerifyUsage << kKernelFlags << kTensorFlags << kConnectionFlags << kExitCodes;
    } else if (cl->command == "diagnose") {
      std::cout << kDiagnoseUsage << kKernelFlags << kTensorFlags << kConnectionFlags << kExitCodes;
    } else if (cl->command == "compare") {
      std::cout << kCompareUsage << kConnectionFlags;
    } else if (cl->command == "capabilities") {
      std::cout << kCapabilitiesUsage << kConnectionFlags << kExitCodes;
    } else if (cl->command == "upload") {
      std::cout << kUploadUsage << kConnectionFlags << kExitCodes;
    } else if (cl->command == "sweep") {
      std::cout << kSweepUsage << kConnectionFlags << kSweepExitCodes;
    } else if (cl->command == "render") {
      std::cout << kRenderUsage;
    } else if (cl->command == "health") {
      std::cout << kHealthUsage << kConnectionFlags << kExitCodes;
    } else {
      std::cout << kMainUsage << kConnectionFlags << kExitCodes;
    }
    return kExitPass;
  }
  if (cl->command.empty()) {
    std::cerr << kMainUsage << kConnectionFlags << kExitCodes;
    return kExitUsage;
  }
  // render reads a file: no server, no deadline.
  if (cl->command == "render") return RunRender(*cl);
  const auto server = ConnectionFromFlags(*cl);
  if (!server.ok()) {
    std::cerr << "tensorcheck: " << server.status().message() << "\n"
              << "(see tensorcheck " << cl->command << " --help)\n";
    return kExitUsage;
  }
  for (const std::string& w : server->warnings) std::cerr << "tensorcheck: warning: " << w << "\n";
  double timeout = kDefaultTimeoutSeconds;
  if (cl->Has("timeout")) {
    auto t = ParseDoubleFlag(*cl, "timeout", /*positive=*/true);
    if (!t.ok()) {
      std::cerr << "tensorcheck: " << t.status().message() << "\n";
      return kExitUsage;
    }
    timeout = *t;
  }
  if (cl->command == "capabilities") return RunCapabilities(*cl, *server, timeout);
  if (cl->command == "upload") return RunUpload(*cl, *server, timeout);
  if (cl->command == "sweep") return RunSweep(*cl, *server, timeout);
  if (cl->command == "health") return RunHealth(*cl, *server, timeout);
  if (cl->command == "compare") return RunCompare(*cl, *server, timeout);
  return RunVerifyOrDiagnose(*cl, *server, timeout);
}

}  // namespace
}  // namespace tensorcheck::cli

// gRPC is held for the whole run and shut down before the process exits,
// once Main has dropped every channel: the shutdown joins gRPC's executor
// threads while OpenSSL still stands. Left to the exit path, one of them
// could still be finishing a TLS handshake when OpenSSL's atexit cleanup
// deleted its thread-local keys, and that thread's error state (904 bytes)
// was then lost: LeakSanitizer reported it in about 1 run in 75
// (docs/reliability.md, "Sanitizers").
int main(int argc, char** argv) {
  grpc_init();
  const int code = tensorcheck::cli::Main(argc, argv);
  grpc_shutdown_blocking();
  return code;
}
