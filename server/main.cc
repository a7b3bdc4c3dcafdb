// tensorcheck-server: the tensorcheck gRPC service.
//
//   tensorcheck-server --port 0       # prints "listening on HOST:PORT"
//
// SIGINT/SIGTERM: health goes NOT_SERVING, new requests are refused,
// in-flight ones get --shutdown-grace-seconds to finish, then exit 0. A
// sticky device error exits 1 so the orchestrator restarts the process.
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "server/service/logging.h"
#include "server/service/server.h"

ABSL_FLAG(std::string, host, "0.0.0.0", "Address to listen on.");
ABSL_FLAG(int, port, 50051, "Port to listen on; 0 picks a free port.");
ABSL_FLAG(int, max_message_mb, 256, "Largest request or response, in MiB.");
ABSL_FLAG(int, threads, 0, "Worker threads running requests; 0: one per core.");
ABSL_FLAG(int, stats_threads, 0,
          "Threads of the one statistics pool all requests share (a request's worker "
          "counts as one of them); 0: one per core.");
ABSL_FLAG(int, max_queue, 64, "Requests waiting for a worker before UNAVAILABLE.");
ABSL_FLAG(std::string, log_level, "info", "trace, debug, info, warn, error, critical, off.");
ABSL_FLAG(std::string, log_format, "text", "text or json.");
ABSL_FLAG(double, shutdown_grace_seconds, 30, "Time in-flight requests get on SIGTERM.");
ABSL_FLAG(int, cpu_threads, 0, "BLAS threads of the cpu backend; 0: all cores.");
ABSL_FLAG(int64_t, gpu_memory_budget_mb, 0,
          "Per-device memory budget of the CUDA backends in MiB; 0: 90% of free memory.");
ABSL_FLAG(int64_t, cublaslt_workspace_mb, 32, "cuBLASLt workspace in MiB.");
ABSL_FLAG(std::string, default_reference, "cpu:fp64", "Reference configuration.");

namespace {

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
  const int mb = absl::GetFlag(FLAGS_max_message_mb);
  if (mb < 1 || mb > 2047) {
    std::cerr << "--max-message-mb: 1..2047 expected, got " << mb << "\n";
    return 2;
  }
  options.engine.limits.max_message_bytes = int64_t{mb} << 20;
  options.workers = absl::GetFlag(FLAGS_threads);
  // TensorCheckServer::Start sizes the workers and the statistics pool
  // together (see there).
  options.engine.stats_threads = absl::GetFlag(FLAGS_stats_threads);
  if (options.engine.stats_threads < 0) {
    std::cerr << "--stats-threads: 0 (one per core) or a positive count expected, got "
              << options.engine.stats_threads << "\n";
    return 2;
  }
  options.max_queue = absl::GetFlag(FLAGS_max_queue);
  options.backends.cpu_threads = absl::GetFlag(FLAGS_cpu_threads);
  options.backends.gpu_memory_budget_bytes = absl::GetFlag(FLAGS_gpu_memory_budget_mb) << 20;
  options.backends.cublaslt_workspace_bytes = absl::GetFlag(FLAGS_cublaslt_workspace_mb) << 20;
  options.engine.default_reference = absl::GetFlag(FLAGS_default_reference);

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
  tensorcheck::LogEvent(
      spdlog::level::info, "serving",
      {{"version", tensorcheck::kServerVersion}, {"address", (*server)->address()}});

  std::thread waiter([&] {
    unsigned char sig = 0;
    while (read(signal_pipe[0], &sig, 1) < 0 && errno == EINTR) {
    }
    tensorcheck::LogEvent(
        spdlog::level::info, "draining",
        {{"signal", sig}, {"grace_seconds", absl::GetFlag(FLAGS_shutdown_grace_seconds)}});
    (*server)->Shutdown(absl::Seconds(absl::GetFlag(FLAGS_shutdown_grace_seconds)));
  });
  (*server)->Wait();
  waiter.join();
  tensorcheck::LogEvent(spdlog::level::info, "stopped", {{"exit_code", exit_code.load()}});
  return exit_code.load();
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

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "tensorcheck-server: remote numerical verification of linear layers");
  std::vector<std::string> storage;
  std::vector<char*> args = NormalizeFlagNames(argc, argv, &storage);
  absl::ParseCommandLine(static_cast<int>(args.size()), args.data());
  return Run();
}
