// tensorcheck-server: the tensorcheck gRPC service.
//
//   tensorcheck-server --port 0       # prints "listening on HOST:PORT"
//   tensorcheck-server --metrics-port 9464   # and "metrics on HOST:9464"
//
// SIGINT/SIGTERM: health goes NOT_SERVING, new requests are refused,
// in-flight ones get --shutdown-grace-seconds to finish, those still
// running are then cancelled, and the process exits 0 within the grace
// period plus a few seconds (3 if it had to be forced). A sticky device
// error exits 1 so the orchestrator restarts the process. SIGHUP re-reads
// the tokens file (--tokens-file).
//
// --help lists the flags below, --helpfull Abseil's as well, --version the
// version and build; both exit 0. A usage error (an unknown flag, a value
// that does not parse or is out of range) exits 2, as the CLI's do; a port
// that cannot be bound (taken by another process) exits 1.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <thread>
#include <vector>

#include "absl/base/config.h"
#include "absl/flags/flag.h"
#include "absl/flags/internal/usage.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "server/service/logging.h"
#include "server/service/server.h"

ABSL_FLAG(std::string, host, "0.0.0.0", "Address to listen on.");
ABSL_FLAG(int, port, 50051, "Port to listen on; 0 picks a free port.");
ABSL_FLAG(int, metrics_port, 0,
          "Port of the Prometheus metrics endpoint (http://HOST:PORT/metrics, on --host; "
          "docs/operations.md lists the metrics); 0: no endpoint.");
ABSL_FLAG(int, max_message_mb, 256, "Largest request or response, in MiB.");
ABSL_FLAG(int, max_tensor_mb, 0,
          "Largest single tensor, in MiB, at most --max-message-mb (a tensor travels inside one "
          "message); 0: 256 or --max-message-mb if smaller.");
ABSL_FLAG(int64_t, max_inflight_bytes, int64_t{4} << 30,
          "Host memory all requests in flight may hold together, in bytes (requests beyond it "
          "get RESOURCE_EXHAUSTED with a retry hint); 0: unlimited.");
ABSL_FLAG(double, max_request_seconds, 300,
          "The longest one request may run when its client set no shorter deadline.");
ABSL_FLAG(int64_t, max_work_gmacs, int64_t{1} << 10,
          "Largest work per request in 2^30 multiply-adds: M*N*K x configurations (with the "
          "reference) x repeats.");
ABSL_FLAG(double, max_connection_idle_seconds, 300,
          "Close a connection with no call for this long; 0: never.");
ABSL_FLAG(double, keepalive_seconds, 60,
          "Ping an idle connection this often and drop it when no answer comes within 20 s; 0: "
          "never.");
ABSL_FLAG(int64_t, store_bytes, -1,
          "Byte budget of the tensor store (stored tensors and uploads in progress); 0 turns the "
          "store off; -1: a quarter of the host's (or container's) memory.");
ABSL_FLAG(std::string, store_dir, "",
          "Directory that keeps stored tensors across restarts; empty: memory only.");
ABSL_FLAG(int64_t, max_tensor_bytes, int64_t{16} << 30,
          "Largest tensor the store takes, in bytes (capped at --store-bytes).");
ABSL_FLAG(double, partial_upload_seconds, 600,
          "How long an interrupted upload keeps its bytes for resuming.");
ABSL_FLAG(double, upload_idle_seconds, 60,
          "An upload stream that sends nothing for this long is cancelled (what it sent is kept "
          "for resuming).");
ABSL_FLAG(int64_t, inline_output_bytes, int64_t{4} << 20,
          "Returned outputs larger than this come back by digest (read with ReadTensor); at "
          "most half of --max-message-mb.");
ABSL_FLAG(int, threads, 0, "Worker threads running requests; 0: one per core.");
ABSL_FLAG(int, stats_threads, 0,
          "Threads of the one statistics pool all requests share (a request's worker "
          "counts as one of them); 0: one per core.");
ABSL_FLAG(int, max_queue, 64, "Requests waiting for a worker before UNAVAILABLE.");
ABSL_FLAG(std::string, log_level, "info", "trace, debug, info, warn, error, critical, off.");
ABSL_FLAG(std::string, log_format, "text", "text or json.");
ABSL_FLAG(double, shutdown_grace_seconds, 30, "Time in-flight requests get on SIGTERM.");
ABSL_FLAG(int, cpu_threads, -1,
          "BLAS threads of the cpu backend; -1: one per GEMM when --threads runs several "
          "requests side by side, all cores with one worker; 0: all cores.");
ABSL_FLAG(int64_t, gpu_memory_budget_mb, 0,
          "Device memory of the CUDA backends in MiB, for everything together: running "
          "requests, the lanes' workspaces and resident tensors; 0: 90% of free memory.");
ABSL_FLAG(int, gpu_lanes, 4,
          "Requests on the GPU at once, each on its own stream with its own cuBLAS handles "
          "and workspace (their copies and kernels overlap).");
ABSL_FLAG(int64_t, cublaslt_workspace_mb, 32, "cuBLASLt workspace in MiB.");
ABSL_FLAG(std::string, default_reference, "",
          "Reference configuration of requests that name none; empty: the fp64 "
          "configuration of the fastest available backend (cublaslt:fp64 on a GPU host, "
          "cpu:fp64 elsewhere).");

ABSL_FLAG(std::string, tokens_file, "",
          "JSON file of bearer tokens (as SHA-256) to tenants with rights and quotas "
          "(docs/operations.md, \"Tenants and tokens\"); every call but health checks then "
          "needs a token. Re-read on SIGHUP and when it changes. Empty: no authentication.");
ABSL_FLAG(double, credentials_reload_seconds, 5,
          "How often the tokens file (0: only on SIGHUP) and the TLS files (at least every "
          "second) are checked for changes.");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate (chain) the server presents: TLS on --port; with --tls-key.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls-cert.");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA certificate: clients must present a certificate it issued (mutual TLS).");
ABSL_FLAG(int, health_port, 0,
          "A plaintext port serving only the gRPC health service, for probes that cannot "
          "speak TLS; 0: none (health is also served on --port).");

namespace {

// A duration flag in (0, max_seconds]; false, with the reason on stderr,
// when it is not.
bool PositiveSeconds(const char* flag, double seconds, double max_seconds, absl::Duration* out) {
  if (!(seconds > 0 && seconds <= max_seconds)) {
    std::cerr << flag << ": a value in (0, " << max_seconds << "] expected, got " << seconds
              << "\n";
    return false;
  }
  *out = absl::Seconds(seconds);
  return true;
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
  const std::string format = absl::GetFlag(FLAGS_log_format);
  if (format != "text" && format != "json") {
    std::cerr << "--log-format: text or json expected, got '" << format << "'\n";
    return 2;
  }
  const std::string level_name = absl::GetFlag(FLAGS_log_level);
  const auto level = spdlog::level::from_str(level_name);
  if (level == spdlog::level::off && level_name != "off") {
    std::cerr << "--log-level: trace, debug, info, warn, error, critical or off "
                 "expected, got '"
              << level_name << "'\n";
    return 2;
  }
  tensorcheck::ConfigureLogging(format == "json", level);

  tensorcheck::ServerOptions options;
  options.host = absl::GetFlag(FLAGS_host);
  options.port = absl::GetFlag(FLAGS_port);
  if (options.port < 0 || options.port > 65535) {
    std::cerr << "--port: 0 (a free port) or 1..65535 expected, got " << options.port << "\n";
    return 2;
  }
  options.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  if (options.metrics_port < 0 || options.metrics_port > 65535) {
    std::cerr << "--metrics-port: 0 (no endpoint) or 1..65535 expected, got "
              << options.metrics_port << "\n";
    return 2;
  }
  const int mb = absl::GetFlag(FLAGS_max_message_mb);
  if (mb < 1 || mb > 2047) {
    std::cerr << "--max-message-mb: 1..2047 expected, got " << mb << "\n";
    return 2;
  }
  options.engine.limits.max_message_bytes = int64_t{mb} << 20;
  int tensor_mb = absl::GetFlag(FLAGS_max_tensor_mb);
  if (tensor_mb == 0) tensor_mb = std::min(256, mb);
  if (tensor_mb < 1 || tensor_mb > mb) {
    std::cerr << "--max-tensor-mb: 1..--max-message-mb (" << mb << ") expected, got " << tensor_mb
              << "\n";
    return 2;
  }
  options.engine.limits.max_tensor_bytes = int64_t{tensor_mb} << 20;
  options.max_inflight_bytes = absl::GetFlag(FLAGS_max_inflight_bytes);
  if (options.max_inflight_bytes < 0) {
    std::cerr << "--max-inflight-bytes: 0 (unlimited) or a positive count expected, got "
              << options.max_inflight_bytes << "\n";
    return 2;
  }
  if (!PositiveSeconds("--max-request-seconds", absl::GetFlag(FLAGS_max_request_seconds), 86400,
                       &options.max_request_time)) {
    return 2;
  }
  const int64_t gmacs = absl::GetFlag(FLAGS_max_work_gmacs);
  if (gmacs < 1 || gmacs > (int64_t{1} << 32)) {
    std::cerr << "--max-work-gmacs: 1..2^32 expected, got " << gmacs << "\n";
    return 2;
  }
  options.engine.limits.max_work_macs = gmacs << 30;
  for (auto [flag, value] :
       {std::pair<const char*, double>{"--max-connection-idle-seconds",
                                       absl::GetFlag(FLAGS_max_connection_idle_seconds)},
        {"--keepalive-seconds", absl::GetFlag(FLAGS_keepalive_seconds)}}) {
    if (!(value >= 0 && value <= 86400)) {
      std::cerr << flag << ": 0..86400 expected, got " << value << "\n";
      return 2;
    }
  }
  options.max_connection_idle = absl::Seconds(absl::GetFlag(FLAGS_max_connection_idle_seconds));
  options.keepalive_time = absl::Seconds(absl::GetFlag(FLAGS_keepalive_seconds));
  options.workers = absl::GetFlag(FLAGS_threads);
  // TensorCheckServer::Start sizes the workers and the statistics pool
  // together (see there).
  options.engine.stats_threads = absl::GetFlag(FLAGS_stats_threads);
  if (options.engine.stats_threads < 0) {
    std::cerr << "--stats-threads: 0 (one per core) or a positive count expected, got "
              << options.engine.stats_threads << "\n";
    return 2;
  }
  options.store_bytes = absl::GetFlag(FLAGS_store_bytes);
  if (options.store_bytes < -1) {
    std::cerr << "--store-bytes: -1 (a quarter of memory), 0 (no store) or a byte count "
                 "expected, got "
              << options.store_bytes << "\n";
    return 2;
  }
  options.store_dir = absl::GetFlag(FLAGS_store_dir);
  options.max_stored_tensor_bytes = absl::GetFlag(FLAGS_max_tensor_bytes);
  if (options.max_stored_tensor_bytes < 1) {
    std::cerr << "--max-tensor-bytes: a positive byte count expected, got "
              << options.max_stored_tensor_bytes << "\n";
    return 2;
  }
  if (!PositiveSeconds("--partial-upload-seconds", absl::GetFlag(FLAGS_partial_upload_seconds),
                       7 * 86400, &options.partial_upload_ttl) ||
      !PositiveSeconds("--upload-idle-seconds", absl::GetFlag(FLAGS_upload_idle_seconds), 86400,
                       &options.upload_idle)) {
    return 2;
  }
  options.inline_output_bytes = absl::GetFlag(FLAGS_inline_output_bytes);
  if (options.inline_output_bytes < 0) {
    std::cerr << "--inline-output-bytes: 0 or more expected, got " << options.inline_output_bytes
              << "\n";
    return 2;
  }
  // At most half a message, so that a response of several outputs fits.
  options.inline_output_bytes =
      std::min(options.inline_output_bytes, options.engine.limits.max_message_bytes / 2);
  options.max_queue = absl::GetFlag(FLAGS_max_queue);
  options.backends.cpu_threads = absl::GetFlag(FLAGS_cpu_threads);
  options.backends.gpu_memory_budget_bytes = absl::GetFlag(FLAGS_gpu_memory_budget_mb) << 20;
  options.backends.cublaslt_workspace_bytes = absl::GetFlag(FLAGS_cublaslt_workspace_mb) << 20;
  options.backends.gpu_lanes = absl::GetFlag(FLAGS_gpu_lanes);
  options.engine.default_reference = absl::GetFlag(FLAGS_default_reference);
  options.tokens_file = absl::GetFlag(FLAGS_tokens_file);
  const double reload = absl::GetFlag(FLAGS_credentials_reload_seconds);
  if (!(reload >= 0 && reload <= 86400)) {
    std::cerr << "--credentials-reload-seconds: 0..86400 expected, got " << reload << "\n";
    return 2;
  }
  options.credentials_reload = absl::Seconds(reload);
  options.tls = {absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key),
                 absl::GetFlag(FLAGS_tls_client_ca)};
  if (!options.tls.enabled() && !options.tls.client_ca.empty()) {
    std::cerr << "--tls-client-ca: needs --tls-cert and --tls-key (mutual TLS is TLS)\n";
    return 2;
  }
  options.health_port = absl::GetFlag(FLAGS_health_port);
  if (options.health_port < 0 || options.health_port > 65535) {
    std::cerr << "--health-port: 0 (none) or 1..65535 expected, got " << options.health_port
              << "\n";
    return 2;
  }

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
    std::cout << "health on " << absl::GetFlag(FLAGS_host) << ":" << (*server)->health_port()
              << std::endl;
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
    const double grace = absl::GetFlag(FLAGS_shutdown_grace_seconds);
    tensorcheck::LogEvent(spdlog::level::info, "draining",
                          {{"signal", sig}, {"grace_seconds", grace}});
    // The last resort: Shutdown cancels what runs past the grace period
    // and returns within a few seconds of it; should anything still hold
    // the process (a device call that never returns), it exits anyway
    // before the orchestrator's SIGKILL (terminationGracePeriodSeconds in
    // deploy/ is kept above grace + this margin).
    std::thread([grace] {
      absl::SleepFor(absl::Seconds(grace) + tensorcheck::TensorCheckServer::kCancelGrace +
                     absl::Seconds(5));
      tensorcheck::LogEvent(spdlog::level::critical, "shutdown overran its deadline, exiting");
      std::_Exit(3);
    }).detach();
    (*server)->Shutdown(absl::Seconds(grace));
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

// Flags are documented with dashes (--max-message-mb); Abseil names them
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
      "Flags take dashes or underscores (--max-message-mb, --max_message_mb), as\n"
      "--flag=value or --flag value. --helpfull also lists Abseil's own flags,\n"
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
