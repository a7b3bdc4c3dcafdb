// tensorcheck-server: the tensorcheck gRPC service.
//
//   tensorcheck-server --port 0       # prints "listening on HOST:PORT"
//   tensorcheck-server --metrics-port 9464   # and "metrics on HOST:9464"
//
// SIGINT/SIGTERM: health goes NOT_SERVING, new requests are refused,
// in-flight ones get --shutdown-grace to finish, those still
// running are then cancelled, and the process exits 0 within the grace
// period plus a few seconds (3 if it had to be forced). A sticky device
// error exits 1 so the orchestrator restarts the process. SIGHUP re-reads
// the tokens file (--tokens-file).
//
// --help lists the flags below, --helpfull Abseil's as well, --version the
// version and build; both exit 0. This file parses the flags and copies
// them into ServerOptions; Validate (server/service/server_options.h)
// checks them, before anything starts. A usage error (an unknown flag, a
// value that does not parse or is out of range, an old flag name and its
// new one given different values) exits 2, as the CLI's do; a port that
// cannot be bound (taken by another process) exits 1.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/config.h"
#include "absl/flags/flag.h"
#include "absl/flags/internal/parse.h"
#include "absl/flags/internal/usage.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "core/status_macros.h"
#include "server/engine/kernel_orders.h"
#include "server/service/logging.h"
#include "server/service/server.h"
#include "server/service/server_options.h"

// The flags. Sizes take bytes with a suffix and durations a unit
// (server_options.h, ParseByteSize; Abseil's duration syntax); a flag
// renamed keeps its old name, in its old unit, listed after it
// (docs/operations.md, "Flags: names, units, old names").
//
// Where it listens.
ABSL_FLAG(std::string, host, "0.0.0.0", "Address to listen on.");
ABSL_FLAG(int, port, 50051, "Port to listen on; 0 picks a free port.");
ABSL_FLAG(int, metrics_port, 0,
          "Port of the Prometheus metrics endpoint (http://HOST:PORT/metrics, on --host; "
          "docs/operations.md lists the metrics); 0: no endpoint.");
ABSL_FLAG(int, health_port, 0,
          "A plaintext port serving only the gRPC health service, for probes that cannot "
          "speak TLS; 0: none (health is also served on --port).");

// Requests.
ABSL_FLAG(tensorcheck::ByteSize, max_message, {int64_t{256} << 20},
          "Largest request or response, 1MiB..2047MiB. Old name: --max-message-mb (MiB).");
ABSL_FLAG(int, max_message_mb, 256, "Old name of --max-message, in MiB.");
ABSL_FLAG(tensorcheck::ByteSize, max_inline_tensor, {0},
          "Largest tensor a request carries inline, at most --max-message (such a tensor "
          "travels inside one message; tensors by digest are the store's, --max-stored-tensor); "
          "0: 256MiB or --max-message if smaller. Old name: --max-tensor-mb (MiB).");
ABSL_FLAG(int, max_tensor_mb, 0, "Old name of --max-inline-tensor, in MiB.");
ABSL_FLAG(tensorcheck::ByteSize, max_inflight, {int64_t{4} << 30},
          "Host memory all requests in flight may hold together (requests beyond it get "
          "RESOURCE_EXHAUSTED with a retry hint); 0: unlimited. Old name: --max-inflight-bytes "
          "(bytes).");
ABSL_FLAG(int64_t, max_inflight_bytes, int64_t{4} << 30, "Old name of --max-inflight, in bytes.");
ABSL_FLAG(absl::Duration, max_request_time, absl::Seconds(300),
          "The longest one request may run when its client set no shorter deadline, at most "
          "24h. Old name: --max-request-seconds (seconds).");
ABSL_FLAG(double, max_request_seconds, 300, "Old name of --max-request-time, in seconds.");
ABSL_FLAG(int64_t, max_work_gmacs, int64_t{1} << 10,
          "Largest work per request in 2^30 multiply-adds: M*N*K x configurations (with the "
          "reference) x repeats.");
ABSL_FLAG(int, max_queue, 64, "Requests waiting for a worker before UNAVAILABLE.");

// Connections.
ABSL_FLAG(absl::Duration, max_connection_idle, absl::Minutes(5),
          "Close a connection with no call for this long, at most 24h; 0: never. Old name: "
          "--max-connection-idle-seconds (seconds).");
ABSL_FLAG(double, max_connection_idle_seconds, 300,
          "Old name of --max-connection-idle, in seconds.");
ABSL_FLAG(absl::Duration, keepalive_time, absl::Minutes(1),
          "Ping an idle connection this often and drop it when no answer comes within 20s, at "
          "most 24h; 0: never. Old name: --keepalive-seconds (seconds).");
ABSL_FLAG(double, keepalive_seconds, 60, "Old name of --keepalive-time, in seconds.");

// The tensor store.
ABSL_FLAG(tensorcheck::ByteSizeOrAuto, store_size, {},
          "Byte budget of the tensor store (stored tensors and uploads in progress); 0 turns the "
          "store off; auto: a quarter of the host's (or container's) memory. Old name: "
          "--store-bytes (bytes; -1: auto).");
ABSL_FLAG(int64_t, store_bytes, -1, "Old name of --store-size, in bytes; -1: auto.");
ABSL_FLAG(std::string, store_dir, "",
          "Directory that keeps stored tensors across restarts; empty: memory only.");
ABSL_FLAG(tensorcheck::ByteSize, max_stored_tensor, {int64_t{16} << 30},
          "Largest tensor the store takes (capped at --store-size). Old name: "
          "--max-tensor-bytes (bytes).");
ABSL_FLAG(int64_t, max_tensor_bytes, int64_t{16} << 30,
          "Old name of --max-stored-tensor, in bytes.");
ABSL_FLAG(absl::Duration, partial_upload_ttl, absl::Minutes(10),
          "How long an interrupted upload keeps its bytes for resuming, at most 168h. Old name: "
          "--partial-upload-seconds (seconds).");
ABSL_FLAG(double, partial_upload_seconds, 600, "Old name of --partial-upload-ttl, in seconds.");
ABSL_FLAG(absl::Duration, upload_idle, absl::Seconds(60),
          "An upload stream that sends nothing for this long is cancelled (what it sent is kept "
          "for resuming), at most 24h. Old name: --upload-idle-seconds (seconds).");
ABSL_FLAG(double, upload_idle_seconds, 60, "Old name of --upload-idle, in seconds.");
ABSL_FLAG(tensorcheck::ByteSize, max_inline_output, {int64_t{4} << 20},
          "Returned outputs larger than this come back by digest (read with ReadTensor); at "
          "most half of --max-message. Old name: --inline-output-bytes (bytes).");
ABSL_FLAG(int64_t, inline_output_bytes, int64_t{4} << 20,
          "Old name of --max-inline-output, in bytes.");

// Threads.
ABSL_FLAG(int, threads, 0, "Worker threads running requests; 0: one per core.");
ABSL_FLAG(int, stats_threads, 0,
          "Threads of the one statistics pool all requests share (a request's worker "
          "counts as one of them); 0: one per core.");
ABSL_FLAG(int, cpu_threads, -1,
          "BLAS threads of the cpu backend; -1: one per GEMM when --threads runs several "
          "requests side by side, all cores with one worker; 0: all cores.");

// The GPU.
ABSL_FLAG(tensorcheck::ByteSize, gpu_memory_budget, {0},
          "Device memory of the CUDA backends, for everything together: running requests, the "
          "lanes' workspaces and resident tensors; 0: 90% of free memory. Old name: "
          "--gpu-memory-budget-mb (MiB).");
ABSL_FLAG(int64_t, gpu_memory_budget_mb, 0, "Old name of --gpu-memory-budget, in MiB.");
ABSL_FLAG(int, gpu_lanes, 4,
          "Requests on the GPU at once, each on its own stream with its own cuBLAS handles "
          "and workspace (their copies and kernels overlap).");
ABSL_FLAG(tensorcheck::ByteSize, cublaslt_workspace, {int64_t{32} << 20},
          "cuBLASLt workspace of each lane. Old name: --cublaslt-workspace-mb (MiB).");
ABSL_FLAG(int64_t, cublaslt_workspace_mb, 32, "Old name of --cublaslt-workspace, in MiB.");
ABSL_FLAG(std::string, default_reference, "",
          "Reference configuration of requests that name none; empty: the fp64 "
          "configuration of the fastest available backend (cublaslt:fp64 on a GPU host, "
          "cpu:fp64 elsewhere).");

ABSL_FLAG(std::string, kernel_orders, "",
          "Directory of kernel-order tables (*.json) a GPU run recorded (the GPU pack's "
          "kernel_orders/): the orders a diagnosis replays when a request names a GPU; empty: "
          "each generation's model from k = 0 (docs/numerics.md, \"Kernel K order\").");

// Credentials.
ABSL_FLAG(std::string, tokens_file, "",
          "JSON file of bearer tokens (as SHA-256) to tenants with rights and quotas "
          "(docs/operations.md, \"Tenants and tokens\"); every call but health checks then "
          "needs a token. Re-read on SIGHUP and when it changes. Empty: no authentication.");
ABSL_FLAG(absl::Duration, credentials_reload, absl::Seconds(5),
          "How often the tokens file (0: only on SIGHUP) and the TLS files (at least every "
          "second) are checked for changes, at most 24h. Old name: --credentials-reload-seconds "
          "(seconds).");
ABSL_FLAG(double, credentials_reload_seconds, 5, "Old name of --credentials-reload, in seconds.");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate (chain) the server presents: TLS on --port; with --tls-key.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls-cert.");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA certificate: clients must present a certificate it issued (mutual TLS).");

// The process.
ABSL_FLAG(std::string, log_level, "info", "trace, debug, info, warn, error, critical, off.");
ABSL_FLAG(std::string, log_format, "text", "text or json.");
ABSL_FLAG(absl::Duration, shutdown_grace, absl::Seconds(30),
          "Time in-flight requests get on SIGTERM, at most 24h. Old name: "
          "--shutdown-grace-seconds (seconds).");
ABSL_FLAG(double, shutdown_grace_seconds, 30, "Old name of --shutdown-grace, in seconds.");

namespace {

// A flag's name as operators write it: "--max-message".
template <typename T>
std::string Dashed(const absl::Flag<T>& flag) {
  std::string name = absl::StrCat("--", absl::GetFlagReflectionHandle(flag).Name());
  std::replace(name.begin(), name.end(), '_', '-');
  return name;
}

// Whether the command line (or a --flagfile) set the flag.
template <typename T>
bool Given(const absl::Flag<T>& flag) {
  return absl::flags_internal::WasPresentOnCommandLine(absl::GetFlagReflectionHandle(flag).Name());
}

// A renamed option from its two flags (server_options.h, ResolveFlag): a
// size, the old flag in bytes or (shift 20) MiB.
// The old flag is an int64_t or an int.
template <typename Old>
absl::StatusOr<int64_t> Size(const absl::Flag<tensorcheck::ByteSize>& flag,
                             const absl::Flag<Old>& old_flag, int shift,
                             std::set<std::string>* old_names) {
  const std::string name = Dashed(flag);
  const std::string old_name = Dashed(old_flag);
  TC_ASSIGN_OR_RETURN(const int64_t old_bytes,
                      tensorcheck::ScaleFlagValue(old_name, absl::GetFlag(old_flag), shift));
  return tensorcheck::ResolveFlag(
      tensorcheck::FlagValue<int64_t>{name, absl::GetFlag(flag).bytes, Given(flag)},
      tensorcheck::FlagValue<int64_t>{old_name, old_bytes, Given(old_flag)}, old_names);
}

// A duration, the old flag in seconds.
absl::StatusOr<absl::Duration> Time(const absl::Flag<absl::Duration>& flag,
                                    const absl::Flag<double>& old_flag,
                                    std::set<std::string>* old_names) {
  const std::string name = Dashed(flag);
  const std::string old_name = Dashed(old_flag);
  TC_ASSIGN_OR_RETURN(const absl::Duration old_time,
                      tensorcheck::SecondsFlagValue(old_name, absl::GetFlag(old_flag)));
  return tensorcheck::ResolveFlag(
      tensorcheck::FlagValue<absl::Duration>{name, absl::GetFlag(flag), Given(flag)},
      tensorcheck::FlagValue<absl::Duration>{old_name, old_time, Given(old_flag)}, old_names);
}

// The flags copied into ServerOptions, each renamed option from whichever
// of its names the command line gave (both with different values: an
// error naming both). Checking the values is Validate's.
absl::StatusOr<tensorcheck::ServerOptions> OptionsFromFlags() {
  tensorcheck::ServerOptions o;
  std::set<std::string>* old = &o.old_flag_names;
  o.host = absl::GetFlag(FLAGS_host);
  o.port = absl::GetFlag(FLAGS_port);
  o.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  o.health_port = absl::GetFlag(FLAGS_health_port);

  tensorcheck::RequestLimits& limits = o.engine.limits;
  TC_ASSIGN_OR_RETURN(limits.max_message_bytes,
                      Size(FLAGS_max_message, FLAGS_max_message_mb, 20, old));
  TC_ASSIGN_OR_RETURN(limits.max_tensor_bytes,
                      Size(FLAGS_max_inline_tensor, FLAGS_max_tensor_mb, 20, old));
  TC_ASSIGN_OR_RETURN(o.max_inflight_bytes,
                      Size(FLAGS_max_inflight, FLAGS_max_inflight_bytes, 0, old));
  TC_ASSIGN_OR_RETURN(o.max_request_time,
                      Time(FLAGS_max_request_time, FLAGS_max_request_seconds, old));
  TC_ASSIGN_OR_RETURN(limits.max_work_macs,
                      tensorcheck::ScaleFlagValue(Dashed(FLAGS_max_work_gmacs),
                                                  absl::GetFlag(FLAGS_max_work_gmacs), 30));
  o.max_queue = absl::GetFlag(FLAGS_max_queue);

  TC_ASSIGN_OR_RETURN(o.max_connection_idle,
                      Time(FLAGS_max_connection_idle, FLAGS_max_connection_idle_seconds, old));
  TC_ASSIGN_OR_RETURN(o.keepalive_time, Time(FLAGS_keepalive_time, FLAGS_keepalive_seconds, old));

  // --store-size's auto is --store-bytes' -1, and ServerOptions'.
  const int64_t store_bytes = absl::GetFlag(FLAGS_store_bytes);
  TC_ASSIGN_OR_RETURN(
      const std::optional<int64_t> store,
      tensorcheck::ResolveFlag(
          tensorcheck::FlagValue<std::optional<int64_t>>{Dashed(FLAGS_store_size),
                                                         absl::GetFlag(FLAGS_store_size).bytes,
                                                         Given(FLAGS_store_size)},
          tensorcheck::FlagValue<std::optional<int64_t>>{
              Dashed(FLAGS_store_bytes),
              store_bytes == -1 ? std::nullopt : std::optional<int64_t>(store_bytes),
              Given(FLAGS_store_bytes)},
          old));
  o.store_bytes = store.value_or(-1);
  o.store_dir = absl::GetFlag(FLAGS_store_dir);
  TC_ASSIGN_OR_RETURN(o.max_stored_tensor_bytes,
                      Size(FLAGS_max_stored_tensor, FLAGS_max_tensor_bytes, 0, old));
  TC_ASSIGN_OR_RETURN(o.partial_upload_ttl,
                      Time(FLAGS_partial_upload_ttl, FLAGS_partial_upload_seconds, old));
  TC_ASSIGN_OR_RETURN(o.upload_idle, Time(FLAGS_upload_idle, FLAGS_upload_idle_seconds, old));
  TC_ASSIGN_OR_RETURN(o.inline_output_bytes,
                      Size(FLAGS_max_inline_output, FLAGS_inline_output_bytes, 0, old));

  // PlanThreads sizes the workers, the statistics pool and the BLAS
  // threads together.
  o.workers = absl::GetFlag(FLAGS_threads);
  o.engine.stats_threads = absl::GetFlag(FLAGS_stats_threads);
  o.backends.cpu_threads = absl::GetFlag(FLAGS_cpu_threads);

  TC_ASSIGN_OR_RETURN(o.backends.gpu_memory_budget_bytes,
                      Size(FLAGS_gpu_memory_budget, FLAGS_gpu_memory_budget_mb, 20, old));
  o.backends.gpu_lanes = absl::GetFlag(FLAGS_gpu_lanes);
  TC_ASSIGN_OR_RETURN(o.backends.cublaslt_workspace_bytes,
                      Size(FLAGS_cublaslt_workspace, FLAGS_cublaslt_workspace_mb, 20, old));
  o.engine.default_reference = absl::GetFlag(FLAGS_default_reference);
  if (const std::string dir = absl::GetFlag(FLAGS_kernel_orders); !dir.empty()) {
    TC_ASSIGN_OR_RETURN(o.engine.kernel_orders, tensorcheck::LoadKernelOrderTables(dir));
  }

  o.tokens_file = absl::GetFlag(FLAGS_tokens_file);
  TC_ASSIGN_OR_RETURN(o.credentials_reload,
                      Time(FLAGS_credentials_reload, FLAGS_credentials_reload_seconds, old));
  o.tls = {absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key),
           absl::GetFlag(FLAGS_tls_client_ca)};

  o.log_level = absl::GetFlag(FLAGS_log_level);
  o.log_format = absl::GetFlag(FLAGS_log_format);
  TC_ASSIGN_OR_RETURN(o.shutdown_grace,
                      Time(FLAGS_shutdown_grace, FLAGS_shutdown_grace_seconds, old));
  return o;
}

// Written by the signal handler, read by the waiter thread.
int signal_pipe[2] = {-1, -1};
// Not a signal: a request hit an error that leaves the device unusable.
constexpr int kFatalDeviceError = 0;

void OnSignal(int sig) {
  const unsigned char byte = static_cast<unsigned char>(sig);
  // Async-signal-safe; nothing to do if the pipe is full.
  [[maybe_unused]] ssize_t n = write(signal_pipe[1], &byte, 1);
}

int Run() {
  absl::StatusOr<tensorcheck::ServerOptions> parsed = OptionsFromFlags();
  const absl::Status valid = parsed.ok() ? tensorcheck::Validate(*parsed) : parsed.status();
  if (!valid.ok()) {
    std::cerr << valid.message() << "\n";
    return 2;
  }
  tensorcheck::ServerOptions& options = *parsed;
  tensorcheck::ConfigureLogging(options.log_format == "json",
                                spdlog::level::from_str(options.log_level));

  // SIGINT/SIGTERM go through a self-pipe to one waiter thread. (Blocking
  // them and calling sigwait is not enough: OpenBLAS starts its threads
  // before main, with the signals unblocked, and one of them would take the
  // default action.)
  if (pipe(signal_pipe) != 0) {
    std::cerr << "cannot create the signal pipe\n";
    return 1;
  }
  struct sigaction action = {};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGHUP, &action, nullptr);  // reload the credentials
  std::atomic<int> exit_code{0};
  options.on_fatal = [&exit_code](const absl::Status&) {
    exit_code = 1;
    OnSignal(kFatalDeviceError);
  };

  auto server = tensorcheck::TensorCheckServer::Start(options);
  if (!server.ok()) {
    tensorcheck::LogEvent(spdlog::level::critical, "cannot start",
                          {{"error", server.status().ToString()}});
    return 1;
  }
  std::cout << "listening on " << (*server)->address() << std::endl;
  // Second: scripts and tests read the first line for the address.
  if ((*server)->metrics_port() != 0) {
    std::cout << "metrics on " << (*server)->metrics_address() << std::endl;
  }
  if ((*server)->health_port() != 0) {
    std::cout << "health on " << options.host << ":" << (*server)->health_port() << std::endl;
  }
  tensorcheck::LogEvent(
      spdlog::level::info, "serving",
      {{"version", tensorcheck::kServerVersion}, {"address", (*server)->address()}});

  std::thread waiter([&] {
    unsigned char sig = 0;
    for (;;) {
      if (read(signal_pipe[0], &sig, 1) < 0) {
        if (errno == EINTR) continue;
        break;
      }
      if (sig != SIGHUP) break;
      tensorcheck::LogEvent(spdlog::level::info, "SIGHUP: reloading credentials");
      (*server)->ReloadCredentials();
    }
    const absl::Duration grace = options.shutdown_grace;
    tensorcheck::LogEvent(spdlog::level::info, "draining",
                          {{"signal", sig}, {"grace_seconds", absl::ToDoubleSeconds(grace)}});
    // The last resort: Shutdown cancels what runs past the grace period
    // and returns within a few seconds of it; should anything still hold
    // the process (a device call that never returns), it exits anyway
    // before the orchestrator's SIGKILL (terminationGracePeriodSeconds in
    // deploy/ is kept above grace + this margin).
    std::thread([grace] {
      absl::SleepFor(grace + tensorcheck::TensorCheckServer::kCancelGrace + absl::Seconds(5));
      tensorcheck::LogEvent(spdlog::level::critical, "shutdown overran its deadline, exiting");
      std::_Exit(3);
    }).detach();
    (*server)->Shutdown(grace);
  });
  (*server)->Wait();
  waiter.join();
  tensorcheck::LogEvent(spdlog::level::info, "stopped", {{"exit_code", exit_code.load()}});
  return exit_code.load();
}

// --help and --version (absl/flags/usage_config.h).
//
// A flag's file as Abseil reports it: relative to the source tree
// ("server/main.cc"). __FILE__ is absolute in a plain build ("/src/...")
// and relative to the compiling directory under ccache's CCACHE_BASEDIR
// ("../server/main.cc", "../../../server/service/x.cc").
std::string NormalizeFilename(absl::string_view file) {
  static const absl::string_view kRoot = [] {
    absl::string_view self = __FILE__;
    return absl::ConsumeSuffix(&self, "server/main.cc") ? self : absl::string_view();
  }();
  if (!kRoot.empty()) absl::ConsumePrefix(&file, kRoot);
  while (absl::ConsumePrefix(&file, "./") || absl::ConsumePrefix(&file, "../")) {
  }
  while (absl::ConsumePrefix(&file, "/")) {
  }
  return std::string(file);
}

// --help (and --helpshort) lists the flags the server's own sources define,
// whichever file under server/ that is; --helpfull adds Abseil's.
bool IsServerFlagFile(absl::string_view normalized) {
  return absl::StartsWith(normalized, "server/");
}

// "tensorcheck-server 0.1.0 (Release, CUDA on)": the CMake project version,
// CMAKE_BUILD_TYPE, and whether the cuBLAS/cuBLASLt backends are built in
// (whether a GPU is present is `tensorcheck capabilities`' to say).
std::string VersionString() {
#ifdef TENSORCHECK_HAVE_CUDA
  constexpr bool kCuda = true;
#else
  constexpr bool kCuda = false;
#endif
  return absl::StrCat("tensorcheck-server ", tensorcheck::kServerVersion, " (",
                      TENSORCHECK_BUILD_TYPE, ", CUDA ", kCuda ? "on" : "off", ")\n");
}

// Exit codes of parsing: Abseil's parser reports a usage error on stderr
// and exits 1, and exits 1 after --help too (0 after --version). The
// handler below, registered for the parse alone, makes a usage error exit 2
// (as the CLI does) and any help exit 0. (Debian's Abseil, 20220623, has no
// parse that returns instead of exiting: absl::ParseAbseilFlagsOnly came
// later; hence the exit handler, Abseil's usage-error hook and its internal
// help mode.)
std::atomic<bool> parsing{false};
std::atomic<bool> usage_error{false};

void ExitCodeOfParsing() {
  if (!parsing.load()) return;
  using absl::flags_internal::HelpMode;
  const HelpMode mode = absl::flags_internal::GetFlagsHelpMode();
  // An exit without a reported error and without a help flag is not
  // Abseil's to make: call it a usage error too.
  const bool help = mode != HelpMode::kNone;
  const int code = usage_error.load() || !help ? 2 : 0;
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  std::_Exit(code);
}

// Flags are documented with dashes (--max-message); Abseil names them
// with underscores. Accept both by rewriting the name part of each flag.
std::vector<char*> NormalizeFlagNames(int argc, char** argv, std::vector<std::string>* storage) {
  storage->reserve(static_cast<size_t>(argc));
  std::vector<char*> out;
  for (int i = 0; i < argc; ++i) {
    std::string arg = argv[i];
    if (i > 0 && arg.rfind("--", 0) == 0 && arg != "--") {
      const size_t end = std::min(arg.find('='), arg.size());
      for (size_t j = 2; j < end; ++j) {
        if (arg[j] == '-') arg[j] = '_';
      }
    }
    storage->push_back(std::move(arg));
    out.push_back(storage->back().data());
  }
  return out;
}

}  // namespace

// Abseil's hook for each fatal usage error, called after the message is on
// stderr and before it exits (absl/flags/usage_config.h).
extern "C" void ABSL_INTERNAL_C_SYMBOL(AbslInternalReportFatalUsageError)(absl::string_view) {
  usage_error = true;
}

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "remote numerical verification of linear layers (a gRPC service).\n\n"
      "  tensorcheck-server [--host 0.0.0.0] [--port 50051] [FLAG...]\n\n"
      "Flags take dashes or underscores (--max-message, --max_message), as\n"
      "--flag=value or --flag value. Sizes are bytes, with an optional suffix: K, M,\n"
      "G, T and KiB, MiB, GiB, TiB are binary, KB, MB, GB, TB decimal\n"
      "(--max-inflight=4GiB). Durations take a unit (--max-request-time=300s, 5m,\n"
      "1.5s). A renamed flag keeps its old name, in its old unit, listed as \"Old\n"
      "name\" (--max-message-mb=256 is --max-message=256MiB); both names with\n"
      "different values are a usage error. --helpfull also lists Abseil's own flags,\n"
      "--version prints the version and build. Exit codes: 0 stopped by SIGTERM or\n"
      "SIGINT (or after --help, --version), 1 could not start (a port taken, a bad\n"
      "file) or a sticky device error, 2 a usage error, 3 a shutdown past its\n"
      "deadline. docs/operations.md says more.");
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = IsServerFlagFile;
  usage.contains_helpshort_flags = IsServerFlagFile;
  usage.contains_helppackage_flags = IsServerFlagFile;
  usage.version_string = VersionString;
  usage.normalize_filename = NormalizeFilename;
  absl::SetFlagsUsageConfig(usage);
  std::vector<std::string> storage;
  std::vector<char*> args = NormalizeFlagNames(argc, argv, &storage);
  parsing = true;
  std::atexit(ExitCodeOfParsing);
  absl::ParseCommandLine(static_cast<int>(args.size()), args.data());
  parsing = false;
  return Run();
}
