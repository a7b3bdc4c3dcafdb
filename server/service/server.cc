#include "server/service/server.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/resource_quota.h"
#include "server/backends/device_session.h"
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

// A duration as gRPC's channel arguments take it, and a size as its
// message limits do: an int, at most INT32_MAX.
int Millis(absl::Duration d) {
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(d), INT32_MAX));
}
int Int32(int64_t n) { return static_cast<int>(std::min<int64_t>(n, INT32_MAX)); }

// Keepalive pings, on the API port and the health port alike.
void AddKeepalive(const ServerOptions& options, std::vector<std::pair<std::string, int>>* args) {
  if (options.keepalive_time > absl::ZeroDuration()) {
    args->emplace_back(GRPC_ARG_KEEPALIVE_TIME_MS, Millis(options.keepalive_time));
    args->emplace_back(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, Millis(options.keepalive_timeout));
  }
  if (options.min_client_ping_interval > absl::ZeroDuration()) {
    args->emplace_back(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                       Millis(options.min_client_ping_interval));
    args->emplace_back(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  }
}

// Sets up `builder` as `settings` say.
void Apply(const TensorCheckServer::ChannelSettings& settings, grpc::ServerBuilder* builder) {
  for (const auto& [name, value] : settings.arguments) builder->AddChannelArgument(name, value);
  if (settings.max_receive_message_bytes) {
    builder->SetMaxReceiveMessageSize(*settings.max_receive_message_bytes);
  }
  if (settings.max_send_message_bytes) {
    builder->SetMaxSendMessageSize(*settings.max_send_message_bytes);
  }
  if (settings.resource_quota_bytes > 0) {
    grpc::ResourceQuota quota("tensorcheck");  // the builder keeps a reference
    quota.Resize(static_cast<size_t>(settings.resource_quota_bytes));
    builder->SetResourceQuota(quota);
  }
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
  TC_ASSIGN_OR_RETURN(std::unique_ptr<TensorCheckServer> server, Build(options));
  TC_RETURN_IF_ERROR(server->Listen());
  return server;
}

absl::StatusOr<std::unique_ptr<TensorCheckServer>> TensorCheckServer::Build(
    const ServerOptions& options) {
  const int hardware = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const ThreadPlan threads = PlanThreads(options, hardware);
  auto server = std::unique_ptr<TensorCheckServer>(new TensorCheckServer());
  server->options_ = options;
  server->options_.backends.cpu_threads = threads.cpu_threads;
  server->workers_ = threads.workers;
  ServeLargeBlocksFromTheirOwnMappings();  // memory back at once (idle_trim.h)
  TC_RETURN_IF_ERROR(server->MakeEngine(threads));
  TC_RETURN_IF_ERROR(server->OpenStore());
  TC_RETURN_IF_ERROR(server->OpenTokens());
  TC_RETURN_IF_ERROR(server->MakeCredentials());
  server->MakeService();
  return server;
}

absl::Status TensorCheckServer::MakeEngine(const ThreadPlan& threads) {
  registry_ = std::make_unique<BackendRegistry>();
  TC_RETURN_IF_ERROR(RegisterBuiltinBackends(registry_.get(), options_.backends));
  TC_ASSIGN_OR_RETURN(stats_executor_, Executor::Create({/*threads=*/threads.stats_threads}));
  EngineOptions engine_options = options_.engine;
  engine_options.executor = stats_executor_.get();
  engine_options.limits = EffectiveLimits(options_);
  TC_ASSIGN_OR_RETURN(engine_, Engine::Create(engine_options, registry_.get()));
  return absl::OkStatus();
}

absl::Status TensorCheckServer::OpenStore() {
  if (options_.store_bytes == 0) return absl::OkStatus();
  TensorStore::Options store_options;
  store_options.budget_bytes =
      options_.store_bytes < 0 ? DefaultStoreBytes() : options_.store_bytes;
  store_options.max_tensor_bytes =
      std::min(options_.max_stored_tensor_bytes, store_options.budget_bytes);
  store_options.partial_upload_ttl = options_.partial_upload_ttl;
  std::unique_ptr<StoreDir> dir;
  if (!options_.store_dir.empty()) {
    TC_ASSIGN_OR_RETURN(dir, StoreDir::Open(options_.store_dir));
  }
  // At start (evicted, misnamed, wrong size) and at a tensor's first
  // use (corrupt) alike.
  store_options.on_dropped = [](const StoreDir::Dropped& d) {
    LogEvent(spdlog::level::warn, "store file dropped", {{"path", d.path}, {"reason", d.reason}});
  };
  TC_ASSIGN_OR_RETURN(store_, TensorStore::Create(store_options, std::move(dir)));
  const TensorStore::Stats st = store_->stats();
  LogEvent(spdlog::level::info, "tensor store",
           {{"budget_bytes", store_options.budget_bytes},
            {"max_tensor_bytes", store_options.max_tensor_bytes},
            {"dir", options_.store_dir},
            {"loaded_tensors", st.tensors},
            {"loaded_bytes", st.bytes_used}});
  return absl::OkStatus();
}

absl::Status TensorCheckServer::OpenTokens() {
  if (options_.tokens_file.empty()) return absl::OkStatus();
  TC_ASSIGN_OR_RETURN(tokens_, TokensFile::Open(options_.tokens_file));
  LogEvent(spdlog::level::info, "tokens file",
           {{"path", options_.tokens_file}, {"tenants", tokens_->current()->all().size()}});
  return absl::OkStatus();
}

absl::Status TensorCheckServer::MakeCredentials() {
  if (!options_.tls.enabled()) {
    credentials_ = grpc::InsecureServerCredentials();
    return absl::OkStatus();
  }
  // Checked here: gRPC's watcher would only log a bad file, and every
  // handshake would then fail.
  TC_ASSIGN_OR_RETURN(tls_, ServedTls::Start(options_.tls));
  LogEvent(spdlog::level::info, "TLS",
           {{"files", tls_->about()}, {"client_certificates", !options_.tls.client_ca.empty()}});
  credentials_ = tls_->Credentials(options_.credentials_reload);
  return absl::OkStatus();
}

void TensorCheckServer::MakeService() {
  ServiceOptions service_options;
  service_options.store = store_.get();
  service_options.tokens = tokens_.get();
  service_options.inline_output_bytes = EffectiveInlineOutputBytes(options_);
  service_options.upload_idle = options_.upload_idle;
  service_options.workers = workers_;
  service_options.max_queue = options_.max_queue;
  service_options.max_inflight_bytes = options_.max_inflight_bytes;
  service_options.max_request_time = options_.max_request_time;
  service_options.server_version = kServerVersion;
  service_options.on_fatal = [this, cb = options_.on_fatal](const absl::Status& s) {
    LogEvent(spdlog::level::critical, "fatal device error, going NOT_SERVING",
             {{"error", std::string(s.message())}});
    SetNotServing();
    if (cb) cb(s);
  };
  service_options.on_saturation = [this](bool saturated) {
    LogEvent(spdlog::level::warn,
             saturated ? "queue full, readiness NOT_SERVING" : "queue has room, readiness SERVING");
    SetHealth(!saturated);
  };
  if (options_.metrics_port != 0) {
    metrics_ = std::make_unique<ServiceMetrics>();
    service_options.metrics = metrics_.get();
  }
  service_ = std::make_unique<TensorCheckServiceImpl>(engine_.get(), std::move(service_options));
  if (metrics_ != nullptr) metrics_->SetGaugeSource([this] { return ReadGauges(); });
}

absl::Status TensorCheckServer::Listen() {
  TC_RETURN_IF_ERROR(ListenMetrics());
  TC_RETURN_IF_ERROR(ListenApi());
  TC_RETURN_IF_ERROR(ListenHealth());
  for (grpc::Server* s : {server_.get(), health_server_.get()}) {
    if (s == nullptr) continue;
    s->GetHealthCheckService()->SetServingStatus("", true);
    s->GetHealthCheckService()->SetServingStatus(kServiceName, true);
  }
  StartReloader();
  return absl::OkStatus();
}

absl::Status TensorCheckServer::ListenMetrics() {
  if (metrics_ == nullptr) return absl::OkStatus();
  const std::string host = options_.metrics_host.empty() ? options_.host : options_.metrics_host;
  auto endpoint =
      MetricsEndpoint::Start(absl::StrCat(host, ":", options_.metrics_port), metrics_.get());
  if (!endpoint.ok()) {
    // The bind's own reason when there is one (a port taken).
    const std::string why = WhyNotBindable(host, options_.metrics_port);
    if (why.empty()) return endpoint.status();
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", host, ":", options_.metrics_port, " (the metrics endpoint): ", why));
  }
  metrics_endpoint_ = std::move(*endpoint);
  return absl::OkStatus();
}

TensorCheckServer::ChannelSettings TensorCheckServer::ApiChannel(const ServerOptions& options) {
  ChannelSettings settings;
  auto& args = settings.arguments;
  // gRPC sets SO_REUSEPORT by default: a second server on a taken port
  // would then start and share the port's connections with the first.
  args.emplace_back(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // No flow-control window grown ahead of the reads: a request the byte
  // budget has not admitted yet is not read (TensorCheckServiceImpl's
  // linear_methods), and with BDP probing gRPC's windows grew to tens of
  // MiB per stream on a fast link, buffered for requests refused anyway.
  // A read in progress still gets a window as large as its message.
  args.emplace_back(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  const int64_t message = EffectiveLimits(options).max_message_bytes;
  settings.max_receive_message_bytes = Int32(message);
  settings.max_send_message_bytes = Int32(message);
  // The in-flight budget bounds what requests receive: each is admitted
  // before its message is read (docs/api.md, "Request size"). gRPC's own
  // memory quota is only a backstop, kept well above what admitted
  // requests hold: past it gRPC 1.51 cancels streams being received
  // (RESOURCE_EXHAUSTED without a retry hint) rather than pausing reads.
  if (options.max_inflight_bytes > 0) {
    const int64_t twice = options.max_inflight_bytes > std::numeric_limits<int64_t>::max() / 2
                              ? std::numeric_limits<int64_t>::max()
                              : 2 * options.max_inflight_bytes;
    settings.resource_quota_bytes = std::max(twice, 3 * message);
  }
  if (options.max_connection_idle > absl::ZeroDuration()) {
    args.emplace_back(GRPC_ARG_MAX_CONNECTION_IDLE_MS, Millis(options.max_connection_idle));
  }
  AddKeepalive(options, &args);
  return settings;
}

absl::Status TensorCheckServer::ListenApi() {
  grpc::EnableDefaultHealthCheckService(true);  // on this port and the health port
  grpc::ServerBuilder builder;
  const std::string address = absl::StrCat(options_.host, ":", options_.port);
  builder.AddListeningPort(address, credentials_, &port_);
  Apply(ApiChannel(options_), &builder);
  builder.RegisterService(service_.get());
  builder.RegisterCallbackGenericService(service_->linear_methods());
  reflection_ = std::make_unique<ReflectionService>(
      std::vector<std::string>{kServiceName, "grpc.health.v1.Health",
                               "grpc.reflection.v1alpha.ServerReflection"},
      [this](const ReflectionService::Metadata& metadata) {
        if (tokens_ == nullptr) return absl::OkStatus();
        return AuthenticateCall(*tokens_, metadata, Right::kReflection, "ServerReflectionInfo")
            .status();
      });
  builder.RegisterService(reflection_.get());
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port_ == 0) {
    return CannotListen(options_.host, options_.port, "the API");
  }
  return absl::OkStatus();
}

// A probe connects, asks once and goes, so connections here are kept short
// (docs/operations.md, "Probes and shutdown"): closed when idle for
// max_connection_idle or 30 s, the shorter; closed when they have not
// spoken HTTP/2 (sent SETTINGS) within that or 10 s, the shorter; pinged
// as on the API port; at most 4 calls at once on one (a Watch holds one for
// ever), ended by a 5-minute age (+10 s grace); 4 KiB messages. gRPC 1.51
// has no cap on connections, and the health service runs on callbacks, not
// on the threads SetMaxThreads bounds.
TensorCheckServer::ChannelSettings TensorCheckServer::HealthChannel(const ServerOptions& options) {
  ChannelSettings settings;
  auto& args = settings.arguments;
  args.emplace_back(GRPC_ARG_ALLOW_REUSEPORT, 0);
  absl::Duration idle = absl::Seconds(30);
  if (options.max_connection_idle > absl::ZeroDuration()) {
    idle = std::min(idle, options.max_connection_idle);
  }
  args.emplace_back(GRPC_ARG_MAX_CONNECTION_IDLE_MS, Millis(idle));
  args.emplace_back(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                    Millis(std::min(idle, absl::Seconds(10))));
  args.emplace_back(GRPC_ARG_MAX_CONNECTION_AGE_MS, Millis(absl::Minutes(5)));
  args.emplace_back(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS, Millis(absl::Seconds(10)));
  args.emplace_back(GRPC_ARG_MAX_CONCURRENT_STREAMS, 4);
  settings.max_receive_message_bytes = 4 << 10;
  AddKeepalive(options, &args);
  return settings;
}

absl::Status TensorCheckServer::ListenHealth() {
  if (options_.health_port == 0) return absl::OkStatus();
  // gRPC's default health service alone; every other method is
  // UNIMPLEMENTED there (the generic service's default), which also gives
  // the server the callback queue it needs to serve at all.
  grpc::ServerBuilder builder;
  health_unimplemented_ = std::make_unique<grpc::CallbackGenericService>();
  builder.RegisterCallbackGenericService(health_unimplemented_.get());
  const std::string address = absl::StrCat(options_.host, ":", options_.health_port);
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &health_port_);
  Apply(HealthChannel(options_), &builder);
  health_server_ = builder.BuildAndStart();
  if (health_server_ == nullptr || health_port_ == 0) {
    return CannotListen(options_.host, options_.health_port, "the health port");
  }
  return absl::OkStatus();
}

void TensorCheckServer::StartReloader() {
  if ((tokens_ == nullptr && tls_ == nullptr) ||
      options_.credentials_reload <= absl::ZeroDuration()) {
    return;
  }
  // A Kubernetes Secret update swaps the mounted file; a poll sees it
  // whatever the way it was replaced.
  reloader_ = std::thread([this, every = options_.credentials_reload] {
    std::unique_lock<std::mutex> lock(reload_mu_);
    while (!reload_cv_.wait_for(lock, absl::ToChronoMilliseconds(every),
                                [this] { return reload_stop_; })) {
      lock.unlock();
      ReloadCredentials();
      lock.lock();
    }
  });
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
