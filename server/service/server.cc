#include "server/service/server.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/resource_quota.h"
#include "server/backends/device_session.h"
#include "core/status_macros.h"
#include "server/service/idle_trim.h"
#include "server/service/logging.h"
#include "server/service/reflection.h"

namespace tensorcheck {

namespace {
constexpr char kServiceName[] = "tensorcheck.v1.TensorCheck";

// Why host:port cannot be bound, as the system says when asked directly:
// gRPC's builder only reports that it failed. Binds each of the host's
// addresses the way gRPC does (SO_REUSEADDR, no SO_REUSEPORT) and names the
// first error; "" when every bind succeeds now.
std::string WhyNotBindable(std::string host, int port) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);  // "[::]": an IPv6 literal
  }
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc =
          getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found);
      rc != 0) {
    return absl::StrCat("cannot resolve '", host, "': ", gai_strerror(rc));
  }
  std::string why;
  for (const addrinfo* a = found; a != nullptr && why.empty(); a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0) {
      why = errno == EADDRINUSE
                ? absl::StrCat("port ", port, " is already in use (another process listens there)")
                : std::strerror(errno);
    }
    close(fd);
  }
  freeaddrinfo(found);
  return why;
}

// The error of a port that did not bind, naming the address, what it was
// for and the reason.
absl::Status CannotListen(const std::string& host, int port, absl::string_view what) {
  std::string why = WhyNotBindable(host, port);
  if (why.empty()) why = "the address is in use or not this host's";
  return absl::UnavailableError(
      absl::StrCat("cannot listen on ", host, ":", port, " (", what, "): ", why));
}
}  // namespace

int64_t TensorCheckServer::DefaultStoreBytes() {
  int64_t memory = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  std::ifstream cgroup("/sys/fs/cgroup/memory.max");
  int64_t limit = 0;
  if (cgroup >> limit && limit > 0) memory = std::min(memory, limit);  // "max": no limit
  return std::max<int64_t>(memory / 4, int64_t{64} << 20);
}

absl::StatusOr<std::unique_ptr<TensorCheckServer>> TensorCheckServer::Start(
    const ServerOptions& options) {
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("port: 0..65535 expected, got ", options.port));
  }
  if (options.metrics_port < 0 || options.metrics_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics_port: 0 (none) or 1..65535 expected, got ", options.metrics_port));
  }
  if (options.engine.stats_threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("stats_threads: 0 (one per core) or a positive count expected, got ",
                     options.engine.stats_threads));
  }
  // How many threads this process runs, decided here and nowhere else.
  // Requests run on `workers` threads (--threads; 0: one per core). Their
  // statistics (Compare, the error model's per-element passes, the
  // diagnosis scoring) fan out on ONE pool of `stats` threads shared by all
  // requests (--stats-threads; 0: one per core), whose size counts the
  // requesting worker: a worker works on its own statistics while the pool
  // helps, so at most workers + stats - 1 threads are runnable at once,
  // about 2 x cores with the defaults (3 on a 2-core host). When every
  // request started its own threads, concurrent requests reached
  // workers x cores (4 on that host, 64 on an 8-core one). Results do not
  // depend on either size. (The cpu backend's OpenBLAS threads,
  // --cpu-threads, run the GEMMs and are sized apart.)
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int workers = options.workers > 0 ? options.workers : hw;
  const int stats = options.engine.stats_threads > 0 ? options.engine.stats_threads : hw;

  auto server = std::unique_ptr<TensorCheckServer>(new TensorCheckServer());
  server->options_ = options;
  ServeLargeBlocksFromTheirOwnMappings();  // memory back at once (idle_trim.h)
  // --cpu-threads -1 (the default): OpenBLAS runs each GEMM on the calling
  // worker alone when several workers run requests side by side. Its own
  // threads would otherwise take every core for one request's GEMM and
  // spin between GEMMs against the other requests' statistics: a
  // pipelined whole-model check of 17 small layers took 1.5x as long
  // (docs/performance.md, "Whole-model checks"). One worker keeps them all.
  if (server->options_.backends.cpu_threads == -1) {
    server->options_.backends.cpu_threads = workers > 1 ? 1 : 0;
  }
  server->registry_ = std::make_unique<BackendRegistry>();
  TC_RETURN_IF_ERROR(RegisterBuiltinBackends(server->registry_.get(), server->options_.backends));
  TC_ASSIGN_OR_RETURN(server->stats_executor_, Executor::Create({/*threads=*/stats}));
  EngineOptions engine_options = options.engine;
  engine_options.executor = server->stats_executor_.get();
  RequestLimits& limits = engine_options.limits;
  limits.max_tensor_bytes = std::min(limits.max_tensor_bytes, limits.max_message_bytes);
  TC_ASSIGN_OR_RETURN(server->engine_, Engine::Create(engine_options, server->registry_.get()));

  if (options.max_inflight_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_inflight_bytes: 0 (unlimited) or a positive count expected, got ",
                     options.max_inflight_bytes));
  }
  if (options.max_request_time <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_request_time: a positive duration expected, got ",
                     absl::FormatDuration(options.max_request_time)));
  }
  if (options.store_bytes != 0) {
    TensorStore::Options store_options;
    store_options.budget_bytes =
        options.store_bytes < 0 ? DefaultStoreBytes() : options.store_bytes;
    if (options.max_stored_tensor_bytes <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("max_stored_tensor_bytes: a positive count expected, got ",
                       options.max_stored_tensor_bytes));
    }
    store_options.max_tensor_bytes =
        std::min(options.max_stored_tensor_bytes, store_options.budget_bytes);
    store_options.partial_upload_ttl = options.partial_upload_ttl;
    std::unique_ptr<StoreDir> dir;
    if (!options.store_dir.empty()) {
      TC_ASSIGN_OR_RETURN(dir, StoreDir::Open(options.store_dir));
    }
    // At start (evicted, misnamed, wrong size) and at a tensor's first
    // use (corrupt) alike.
    store_options.on_dropped = [](const StoreDir::Dropped& d) {
      LogEvent(spdlog::level::warn, "store file dropped", {{"path", d.path}, {"reason", d.reason}});
    };
    TC_ASSIGN_OR_RETURN(server->store_, TensorStore::Create(store_options, std::move(dir)));
    const TensorStore::Stats st = server->store_->stats();
    LogEvent(spdlog::level::info, "tensor store",
             {{"budget_bytes", store_options.budget_bytes},
              {"max_tensor_bytes", store_options.max_tensor_bytes},
              {"dir", options.store_dir},
              {"loaded_tensors", st.tensors},
              {"loaded_bytes", st.bytes_used}});
  }
  if (!options.tokens_file.empty()) {
    TC_ASSIGN_OR_RETURN(server->tokens_, TokensFile::Open(options.tokens_file));
    LogEvent(
        spdlog::level::info, "tokens file",
        {{"path", options.tokens_file}, {"tenants", server->tokens_->current()->all().size()}});
  }
  ServiceOptions service_options;
  service_options.store = server->store_.get();
  service_options.tokens = server->tokens_.get();
  service_options.inline_output_bytes = options.inline_output_bytes;
  if (options.upload_idle <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("upload_idle: a positive duration expected, got ",
                     absl::FormatDuration(options.upload_idle)));
  }
  service_options.upload_idle = options.upload_idle;
  service_options.workers = workers;
  service_options.max_queue = options.max_queue;
  service_options.max_inflight_bytes = options.max_inflight_bytes;
  service_options.max_request_time = options.max_request_time;
  service_options.server_version = kServerVersion;
  TensorCheckServer* raw = server.get();
  service_options.on_fatal = [raw, cb = options.on_fatal](const absl::Status& s) {
    LogEvent(spdlog::level::critical, "fatal device error, going NOT_SERVING",
             {{"error", std::string(s.message())}});
    raw->SetNotServing();
    if (cb) cb(s);
  };
  service_options.on_saturation = [raw](bool saturated) {
    LogEvent(spdlog::level::warn,
             saturated ? "queue full, readiness NOT_SERVING" : "queue has room, readiness SERVING");
    raw->SetHealth(!saturated);
  };
  if (options.metrics_port != 0) {
    server->metrics_ = std::make_unique<ServiceMetrics>();
    service_options.metrics = server->metrics_.get();
  }
  server->service_ =
      std::make_unique<TensorCheckServiceImpl>(server->engine_.get(), std::move(service_options));
  if (server->metrics_ != nullptr) {
    server->metrics_->SetGaugeSource([raw] { return raw->ReadGauges(); });
    const std::string host = options.metrics_host.empty() ? options.host : options.metrics_host;
    auto endpoint = MetricsEndpoint::Start(absl::StrCat(host, ":", options.metrics_port),
                                           server->metrics_.get());
    if (!endpoint.ok()) {
      // The bind's own reason when there is one (a port taken).
      const std::string why = WhyNotBindable(host, options.metrics_port);
      if (why.empty()) return endpoint.status();
      return absl::UnavailableError(absl::StrCat(
          "cannot listen on ", host, ":", options.metrics_port, " (the metrics endpoint): ", why));
    }
    server->metrics_endpoint_ = std::move(*endpoint);
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  const std::string address = absl::StrCat(options.host, ":", options.port);
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials();
  if (options.tls.enabled()) {
    // Checked here: gRPC's watcher would only log a bad file, and every
    // handshake would then fail.
    TC_ASSIGN_OR_RETURN(server->tls_, ServedTls::Start(options.tls));
    LogEvent(spdlog::level::info, "TLS",
             {{"files", server->tls_->about()},
              {"client_certificates", !options.tls.client_ca.empty()}});
    credentials = server->tls_->Credentials(options.credentials_reload);
  }
  builder.AddListeningPort(address, credentials, &server->port_);
  // gRPC sets SO_REUSEPORT by default: a second server on a taken port
  // would then start and share the port's connections with the first.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // No flow-control window grown ahead of the reads: a request the byte
  // budget has not admitted yet is not read (TensorCheckServiceImpl's
  // linear_methods), and with BDP probing gRPC's windows grew to tens of
  // MiB per stream on a fast link, buffered for requests refused anyway.
  // A read in progress still gets a window as large as its message.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  const int max_message = static_cast<int>(std::min<int64_t>(limits.max_message_bytes, INT32_MAX));
  builder.SetMaxReceiveMessageSize(max_message);
  builder.SetMaxSendMessageSize(max_message);
  // The in-flight budget bounds what requests receive: each is admitted
  // before its message is read (docs/api.md, "Request size"). gRPC's own
  // memory quota is only a backstop, kept well above what admitted
  // requests hold: past it gRPC 1.51 cancels streams being received
  // (RESOURCE_EXHAUSTED without a retry hint) rather than pausing reads.
  grpc::ResourceQuota quota("tensorcheck");
  if (options.max_inflight_bytes > 0) {
    quota.Resize(static_cast<size_t>(
        std::max(2 * options.max_inflight_bytes, 3 * limits.max_message_bytes)));
    builder.SetResourceQuota(quota);
  }
  auto millis = [](absl::Duration d) {
    return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(d), INT32_MAX));
  };
  if (options.max_connection_idle > absl::ZeroDuration()) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS,
                               millis(options.max_connection_idle));
  }
  if (options.keepalive_time > absl::ZeroDuration()) {
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, millis(options.keepalive_time));
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, millis(options.keepalive_timeout));
  }
  if (options.min_client_ping_interval > absl::ZeroDuration()) {
    builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                               millis(options.min_client_ping_interval));
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  }
  builder.RegisterService(server->service_.get());
  builder.RegisterCallbackGenericService(server->service_->linear_methods());
  server->reflection_ = std::make_unique<ReflectionService>(
      std::vector<std::string>{kServiceName, "grpc.health.v1.Health",
                               "grpc.reflection.v1alpha.ServerReflection"},
      [raw](const ReflectionService::Metadata& metadata) {
        if (raw->tokens_ == nullptr) return absl::OkStatus();
        return AuthenticateCall(*raw->tokens_, metadata, Right::kReflection, "ServerReflectionInfo")
            .status();
      });
  builder.RegisterService(server->reflection_.get());
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return CannotListen(options.host, options.port, "the API");
  }
  if (options.health_port != 0) {
    if (options.health_port < 0 || options.health_port > 65535) {
      return absl::InvalidArgumentError(
          absl::StrCat("health_port: 0..65535 expected, got ", options.health_port));
    }
    // gRPC's default health service alone; every other method is
    // UNIMPLEMENTED there (the generic service's default), which also gives
    // the server the callback queue it needs to serve at all.
    grpc::ServerBuilder health_builder;
    server->health_unimplemented_ = std::make_unique<grpc::CallbackGenericService>();
    health_builder.RegisterCallbackGenericService(server->health_unimplemented_.get());
    const std::string health_address = absl::StrCat(options.host, ":", options.health_port);
    health_builder.AddListeningPort(health_address, grpc::InsecureServerCredentials(),
                                    &server->health_port_);
    health_builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    // A probe connects, asks once and goes, so connections here are kept
    // short (docs/operations.md, "Probes and shutdown"): closed when idle for
    // max_connection_idle or 30 s, the shorter; closed when they have not
    // spoken HTTP/2 (sent SETTINGS) within that or 10 s, the shorter;
    // pinged as on the API port; at most 4 calls at once on one (a Watch
    // holds one for ever), ended by a 5-minute age (+10 s grace); 4 KiB
    // messages. gRPC 1.51 has no cap on connections, and the health
    // service runs on callbacks, not on the threads SetMaxThreads bounds.
    absl::Duration health_idle = absl::Seconds(30);
    if (options.max_connection_idle > absl::ZeroDuration()) {
      health_idle = std::min(health_idle, options.max_connection_idle);
    }
    health_builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, millis(health_idle));
    health_builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                                      millis(std::min(health_idle, absl::Seconds(10))));
    health_builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS, millis(absl::Minutes(5)));
    health_builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS,
                                      millis(absl::Seconds(10)));
    health_builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, 4);
    health_builder.SetMaxReceiveMessageSize(4 << 10);
    if (options.keepalive_time > absl::ZeroDuration()) {
      health_builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, millis(options.keepalive_time));
      health_builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                                        millis(options.keepalive_timeout));
    }
    if (options.min_client_ping_interval > absl::ZeroDuration()) {
      health_builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                                        millis(options.min_client_ping_interval));
      health_builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    }
    server->health_server_ = health_builder.BuildAndStart();
    if (server->health_server_ == nullptr || server->health_port_ == 0) {
      return CannotListen(options.host, options.health_port, "the health port");
    }
  }
  for (grpc::Server* s : {server->server_.get(), server->health_server_.get()}) {
    if (s == nullptr) continue;
    s->GetHealthCheckService()->SetServingStatus("", true);
    s->GetHealthCheckService()->SetServingStatus(kServiceName, true);
  }
  if ((server->tokens_ != nullptr || server->tls_ != nullptr) &&
      options.credentials_reload > absl::ZeroDuration()) {
    // A Kubernetes Secret update swaps the mounted file; a poll sees it
    // whatever the way it was replaced.
    server->reloader_ = std::thread([raw, every = options.credentials_reload] {
      std::unique_lock<std::mutex> lock(raw->reload_mu_);
      while (!raw->reload_cv_.wait_for(lock, absl::ToChronoMilliseconds(every),
                                       [raw] { return raw->reload_stop_; })) {
        lock.unlock();
        raw->ReloadCredentials();
        lock.lock();
      }
    });
  }
  return server;
}

TensorCheckServer::~TensorCheckServer() {
  {
    std::lock_guard<std::mutex> lock(reload_mu_);
    reload_stop_ = true;
  }
  reload_cv_.notify_all();
  if (reloader_.joinable()) reloader_.join();
  Shutdown(absl::ZeroDuration());
}

void TensorCheckServer::ReloadCredentials() {
  if (tls_ != nullptr) {
    const ServedTls::ReloadResult r = tls_->Reload();
    if (r.outcome == ServedTls::Outcome::kReplaced) {
      LogEvent(spdlog::level::info, "TLS files reloaded, served from the next handshake",
               {{"files", r.about}});
    } else if (r.outcome == ServedTls::Outcome::kRefused && r.new_error) {
      // Once per refused set, not once per poll.
      LogEvent(spdlog::level::err, "TLS files refused, the set in force stays",
               {{"error", std::string(r.error.message())}});
    }
  }
  if (tokens_ == nullptr) return;
  bool changed = false;
  const absl::Status s = tokens_->Reload(&changed);
  std::lock_guard<std::mutex> lock(reload_error_mu_);
  if (!s.ok()) {
    // Once per distinct error, not once per poll.
    if (s.ToString() != last_reload_error_) {
      LogEvent(spdlog::level::err, "tokens file not reloaded, the tokens in force stay",
               {{"error", std::string(s.message())}});
      last_reload_error_ = s.ToString();
      ++tokens_files_refused_;
    }
    return;
  }
  last_reload_error_.clear();
  if (changed) {
    LogEvent(spdlog::level::info, "tokens file reloaded",
             {{"path", tokens_->path()}, {"tenants", tokens_->current()->all().size()}});
  }
}

std::string TensorCheckServer::address() const { return absl::StrCat(options_.host, ":", port_); }

int TensorCheckServer::metrics_port() const {
  return metrics_endpoint_ != nullptr ? metrics_endpoint_->port() : 0;
}

std::string TensorCheckServer::metrics_address() const {
  if (metrics_endpoint_ == nullptr) return "";
  const std::string& host = options_.metrics_host.empty() ? options_.host : options_.metrics_host;
  return absl::StrCat(host, ":", metrics_endpoint_->port());
}

ServiceGauges TensorCheckServer::ReadGauges() const {
  ServiceGauges g;
  g.requests_in_flight = service_->requests_in_flight();
  g.requests_queued = static_cast<int64_t>(service_->requests_queued());
  if (store_ != nullptr) {
    const TensorStore::Stats st = store_->stats();
    g.store_bytes = st.bytes_used;
    g.store_tensors = st.tensors;
    g.store_hits = st.hits;
    g.store_misses = st.misses;
    g.store_evictions = st.evictions;
  }
  if (tls_ != nullptr) {
    g.tls_sets_refused = tls_->refused_sets();
    g.tls_refusing = tls_->refusing();
  }
  if (tokens_ != nullptr) {
    std::lock_guard<std::mutex> lock(reload_error_mu_);
    g.tokens_files_refused = tokens_files_refused_;
    g.tokens_refusing = !last_reload_error_.empty();
  }
  // Backends on one device share it: each device counts once.
  std::set<const ComputeDevice*> devices;
  for (LinearBackend* backend : registry_->backends()) {
    const ComputeDevice* device = backend->compute_device();
    if (device == nullptr || !devices.insert(device).second) continue;
    const ComputeDevice::Memory memory = device->memory();
    const ResidentStats resident = device->resident();
    g.gpu_memory_used_bytes += memory.used_bytes;
    g.gpu_memory_budget_bytes += memory.budget_bytes;
    g.gpu_resident_bytes += resident.bytes;
    g.gpu_cache_hits += resident.hits;
    g.gpu_cache_misses += resident.misses;
    g.gpu_cache_evictions += resident.evictions;
  }
  return g;
}

void TensorCheckServer::SetNotServing() {
  std::lock_guard<std::mutex> lock(health_mu_);
  not_serving_latched_ = true;
  for (grpc::Server* s : {server_.get(), health_server_.get()}) {
    if (s == nullptr) continue;
    s->GetHealthCheckService()->SetServingStatus("", false);
    s->GetHealthCheckService()->SetServingStatus(kServiceName, false);
  }
}

// Readiness only: the service's own name follows the queue, while the
// server as a whole ("", what a liveness probe asks) stays SERVING, so a
// busy replica is taken out of rotation, not restarted.
void TensorCheckServer::SetHealth(bool serving) {
  std::lock_guard<std::mutex> lock(health_mu_);
  if (not_serving_latched_) return;
  for (grpc::Server* s : {server_.get(), health_server_.get()}) {
    if (s != nullptr) s->GetHealthCheckService()->SetServingStatus(kServiceName, serving);
  }
}

void TensorCheckServer::Shutdown(absl::Duration grace) {
  std::call_once(shutdown_once_, [&] {
    if (server_ == nullptr) return;
    SetNotServing();
    // Refuse new work with UNAVAILABLE while in-flight requests finish;
    // cancel what is still running when the grace period ends; only then
    // stop gRPC (which would answer new calls CANCELLED).
    const absl::Time deadline = absl::Now() + grace;
    service_->StartDraining();
    if (!service_->WaitForIdle(deadline)) {
      LogEvent(spdlog::level::warn, "grace period over, cancelling requests in flight",
               {{"grace_seconds", absl::ToDoubleSeconds(grace)}});
      service_->CancelAll();
      if (!service_->WaitForIdle(absl::Now() + kCancelGrace)) {
        LogEvent(spdlog::level::err, "requests still running after cancellation");
      }
    }
    server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
    if (health_server_ != nullptr) health_server_->Shutdown(absl::ToChronoTime(absl::Now()));
  });
}

void TensorCheckServer::Wait() {
  if (server_ != nullptr) server_->Wait();
}

}  // namespace tensorcheck
