// TensorCheckServer: builds the gRPC server (TensorCheck, health checking,
// reflection) around an engine and its backends, and stops it gracefully.
// Its options (server_options.h) are checked by Validate, before Start.
//
//   ServerOptions options;  options.port = 0;   // 0: pick a free port
//   TC_RETURN_IF_ERROR(Validate(options));
//   TC_ASSIGN_OR_RETURN(auto server, TensorCheckServer::Start(options));
//   std::cout << "listening on " << server->address() << "\n";
//   ...                                         // on SIGTERM:
//   server->Shutdown(absl::Seconds(30));        // NOT_SERVING, drain, stop
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/executor.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/grpcpp.h"
#include "server/backends/linear_backend.h"
#include "server/engine/engine.h"
#include "server/service/metrics.h"
#include "server/service/reflection.h"
#include "server/service/server_options.h"
#include "server/service/service.h"
#include "server/service/tls.h"

namespace tensorcheck {

// The CMake project version (TENSORCHECK_VERSION, set on tc_service by
// server/service/CMakeLists.txt): what Capabilities reports and
// `tensorcheck-server --version` prints.
inline constexpr char kServerVersion[] = TENSORCHECK_VERSION;

class TensorCheckServer {
 public:
  // Build, then Listen. `options` are taken as Validate passed them
  // (main.cc validates before it starts; tests set valid ones): Start does
  // not check them again.
  static absl::StatusOr<std::unique_ptr<TensorCheckServer>> Start(const ServerOptions& options);

  // Start's steps, apart so that all but the last can run (and be tested)
  // without a port. Build makes everything from the options but the
  // ports: the backends, the statistics pool and the engine (PlanThreads,
  // EffectiveLimits), the tensor store and its directory, the tokens, the
  // TLS credentials (files read and checked), the metrics and the service
  // with its workers. An error here (a TLS file that does not load, a
  // store directory it cannot use, an unknown default reference) comes
  // before anything listens. Listen then binds the metrics endpoint, the
  // API port (ApiChannel) and the health port (HealthChannel), in that
  // order, marks health SERVING and starts the credential poll; once it
  // failed, the server is only good for destruction.
  static absl::StatusOr<std::unique_ptr<TensorCheckServer>> Build(const ServerOptions& options);
  absl::Status Listen();

  // How a port's gRPC server is set up: channel arguments (GRPC_ARG_*
  // names and values, in the order they are set), message limits and the
  // memory quota.
  struct ChannelSettings {
    std::vector<std::pair<std::string, int>> arguments;
    std::optional<int> max_receive_message_bytes;  // none: gRPC's default
    std::optional<int> max_send_message_bytes;
    int64_t resource_quota_bytes = 0;  // 0: no quota
  };
  // The API port's: messages up to max_message_bytes, the quota above what
  // the in-flight budget admits, the connection limits of the options.
  static ChannelSettings ApiChannel(const ServerOptions& options);
  // The health port's: short connections for probes (see server.cc).
  static ChannelSettings HealthChannel(const ServerOptions& options);

  ~TensorCheckServer();

  // "HOST:PORT" with the port actually bound.
  std::string address() const;
  int port() const { return port_; }
  // The same for the metrics endpoint; 0 and "" when it is off.
  int metrics_port() const;
  std::string metrics_address() const;
  // Null when metrics are off.
  ServiceMetrics* metrics() const { return metrics_.get(); }

  // Reads the tokens file and the TLS files again now (SIGHUP; the poll
  // calls it every credentials_reload). A new TLS set that passes the
  // check is served from the next handshake; a tokens file that does not
  // parse, or a TLS set that fails the check (tls.h), keeps what is in
  // force, and the error is logged and counted in the metrics.
  void ReloadCredentials();
  // The health-only port actually bound; 0 when off (or before Listen).
  int health_port() const { return health_port_; }
  // Whether the API port serves TLS (Build loaded the files).
  bool tls() const { return tls_ != nullptr; }

  // Health NOT_SERVING, new requests UNAVAILABLE, in-flight ones get until
  // `grace` to finish; those still running are then cancelled (they stop
  // at their next check, well within kCancelGrace) and the server stops.
  // Returns within grace + kCancelGrace + about a second. Idempotent.
  void Shutdown(absl::Duration grace);
  static constexpr absl::Duration kCancelGrace = absl::Seconds(5);
  // Marks health NOT_SERVING for good (a sticky device error, shutdown).
  void SetNotServing();
  // Blocks until Shutdown has completed.
  void Wait();

  const Engine& engine() const { return *engine_; }
  // Null when the server has no store.
  TensorStore* store() const { return store_.get(); }
  // The worker pool's size, and the options as Build took them (with
  // backends.cpu_threads resolved by PlanThreads).
  int workers() const { return workers_; }
  const ServerOptions& options() const { return options_; }

  // A quarter of the memory this process may use: the host's, or the
  // container's limit (cgroup v2 memory.max) when lower.
  static int64_t DefaultStoreBytes();

 private:
  TensorCheckServer() = default;

  // Build's steps, in order.
  absl::Status MakeEngine(const ThreadPlan& threads);
  absl::Status OpenStore();
  absl::Status OpenTokens();
  absl::Status MakeCredentials();
  void MakeService();
  // Listen's.
  absl::Status ListenMetrics();
  absl::Status ListenApi();
  absl::Status ListenHealth();
  void StartReloader();

  ServerOptions options_;
  int workers_ = 0;
  int port_ = 0;
  std::unique_ptr<BackendRegistry> registry_;
  // The statistics pool of every request; declared before engine_ and
  // service_ so that it outlives them (members are destroyed in reverse).
  std::unique_ptr<Executor> stats_executor_;
  std::unique_ptr<Engine> engine_;
  // Outlives the service and the gRPC server (uploads in flight hold it).
  std::unique_ptr<TensorStore> store_;
  // Null without --tokens-file; outlives the service.
  std::unique_ptr<TokensFile> tokens_;
  // The TLS set in force (null without TLS); outlives server_, whose
  // credentials read its files.
  std::unique_ptr<ServedTls> tls_;
  // The API port's (TLS or plaintext), made by Build.
  std::shared_ptr<grpc::ServerCredentials> credentials_;
  // Polls the credential files for changes until Shutdown.
  std::thread reloader_;
  std::mutex reload_mu_;
  std::condition_variable reload_cv_;
  bool reload_stop_ = false;  // guarded by reload_mu_
  mutable std::mutex reload_error_mu_;
  std::string last_reload_error_;     // guarded by reload_error_mu_; "": the file is in force
  int64_t tokens_files_refused_ = 0;  // guarded by reload_error_mu_
  // Outlives the service, which records calls in it.
  std::unique_ptr<ServiceMetrics> metrics_;
  std::unique_ptr<TensorCheckServiceImpl> service_;
  std::unique_ptr<ReflectionService> reflection_;
  std::unique_ptr<grpc::Server> server_;
  // Serves health alone on --health-port (null: none); its statuses
  // follow server_'s.
  std::unique_ptr<grpc::CallbackGenericService> health_unimplemented_;
  std::unique_ptr<grpc::Server> health_server_;
  int health_port_ = 0;
  std::once_flag shutdown_once_;
  // Readiness: NOT_SERVING for good once set; otherwise it follows the
  // queue (NOT_SERVING while full).
  std::mutex health_mu_;
  bool not_serving_latched_ = false;
  void SetHealth(bool serving);
  // What the metrics' gauges read when scraped.
  ServiceGauges ReadGauges() const;
  // Declared last, so destroyed first: no scrape reads the service, the
  // store or the backends while they go.
  std::unique_ptr<MetricsEndpoint> metrics_endpoint_;
};

}  // namespace tensorcheck
