// TensorCheckServer: builds the gRPC server (TensorCheck, health checking,
// reflection) around an engine and its backends, and stops it gracefully.
//
//   ServerOptions options;  options.port = 0;   // 0: pick a free port
//   TC_ASSIGN_OR_RETURN(auto server, TensorCheckServer::Start(options));
//   std::cout << "listening on " << server->address() << "\n";
//   ...                                         // on SIGTERM:
//   server->Shutdown(absl::Seconds(30));        // NOT_SERVING, drain, stop
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/grpcpp.h"
#include "server/backends/linear_backend.h"
#include "core/executor.h"
#include "server/engine/engine.h"
#include "server/service/metrics.h"
#include "server/service/reflection.h"
#include "server/service/service.h"
#include "server/service/tls.h"

namespace tensorcheck {

// The CMake project version (TENSORCHECK_VERSION, set on tc_service by
// server/service/CMakeLists.txt): what Capabilities reports and
// `tensorcheck-server --version` prints.
inline constexpr char kServerVersion[] = TENSORCHECK_VERSION;

struct ServerOptions {
  std::string host = "0.0.0.0";
  int port = 50051;
  // Worker threads running requests; 0: hardware concurrency.
  int workers = 0;
  int max_queue = 64;
  // Host bytes all requests in flight may hold (admission by bytes,
  // service/admission.h); also the size of gRPC's ResourceQuota for
  // messages being received. 0: unlimited.
  int64_t max_inflight_bytes = int64_t{4} << 30;
  // The longest one request may run when its client set no shorter
  // deadline.
  absl::Duration max_request_time = absl::Seconds(300);
  // Connections: an idle one (no call for this long) is closed; the
  // server pings an idle connection every keepalive_time and drops it if
  // no answer comes within keepalive_timeout; clients may ping as often as
  // every min_client_ping_interval. Zero: gRPC's default.
  absl::Duration max_connection_idle = absl::Minutes(5);
  absl::Duration keepalive_time = absl::Minutes(1);
  absl::Duration keepalive_timeout = absl::Seconds(20);
  absl::Duration min_client_ping_interval = absl::Seconds(10);
  // The tensor store (docs/api.md): its byte budget (0: no store; -1: a
  // quarter of the host's memory, or of the container's limit), the
  // largest tensor it takes (capped at the budget), a directory that keeps
  // it across restarts (empty: memory only), how long an interrupted
  // upload is kept, and the returned-output size above which outputs are
  // answered by digest.
  int64_t store_bytes = -1;
  int64_t max_stored_tensor_bytes = int64_t{16} << 30;
  std::string store_dir;
  absl::Duration partial_upload_ttl = absl::Minutes(10);
  int64_t inline_output_bytes = int64_t{4} << 20;
  // An upload stream silent this long is cancelled (kept for resuming).
  absl::Duration upload_idle = absl::Seconds(60);
  BuiltinBackendOptions backends;
  // Request limits (engine.limits; max_message_bytes is gRPC's message
  // size too), the reference, statistics threads (engine.stats_threads:
  // the size of the one statistics pool all requests share; 0: hardware
  // concurrency). engine.executor is ignored: the server makes its own.
  EngineOptions engine;
  // Called when a request hits an error that leaves the device unusable.
  std::function<void(const absl::Status&)> on_fatal;
  // Prometheus metrics (docs/operations.md, "Metrics") at
  // http://metrics_host:metrics_port/metrics; port 0: none. An empty host
  // is `host`.
  int metrics_port = 0;
  std::string metrics_host;
  // Bearer tokens to tenants (tenants.h, docs/operations.md "Tenants and
  // tokens"); empty: no authentication, one shared store. Read again every
  // credentials_reload when its content changed, and on
  // ReloadCredentials() (SIGHUP).
  std::string tokens_file;
  absl::Duration credentials_reload = absl::Seconds(5);
  // TLS on `port` (tls.h); off when tls.cert and tls.key are empty. The
  // files are re-read every credentials_reload (at least a second).
  TlsFiles tls;
  // A second, plaintext port that serves only the health service, for
  // probes that cannot speak TLS (Kubernetes' gRPC probes); 0: none.
  int health_port = 0;
};

class TensorCheckServer {
 public:
  static absl::StatusOr<std::unique_ptr<TensorCheckServer>> Start(const ServerOptions& options);
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
  // The health-only port actually bound; 0 when off.
  int health_port() const { return health_port_; }

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

  // A quarter of the memory this process may use: the host's, or the
  // container's limit (cgroup v2 memory.max) when lower.
  static int64_t DefaultStoreBytes();

 private:
  TensorCheckServer() = default;

  ServerOptions options_;
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
