#include "server/service/metrics.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstring>
#include <exception>
#include <sstream>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "httplib.h"
#include "prometheus/client_metric.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"

namespace tensorcheck {

namespace {

prometheus::MetricFamily OneValue(const char* name, const char* help, prometheus::MetricType type,
                                  int64_t value) {
  prometheus::MetricFamily family;
  family.name = name;
  family.help = help;
  family.type = type;
  prometheus::ClientMetric m;
  if (type == prometheus::MetricType::Counter) {
    m.counter.value = static_cast<double>(value);
  } else {
    m.gauge.value = static_cast<double>(value);
  }
  family.metric.push_back(std::move(m));
  return family;
}

// One value per credential file kind: {credentials="tls"} and
// {credentials="tokens"}.
prometheus::MetricFamily PerCredentials(const char* name, const char* help,
                                        prometheus::MetricType type, int64_t tls, int64_t tokens) {
  prometheus::MetricFamily family = OneValue(name, help, type, tls);
  family.metric.front().label = {{"credentials", "tls"}};
  family.metric.push_back(family.metric.front());
  prometheus::ClientMetric& m = family.metric.back();
  m.label = {{"credentials", "tokens"}};
  m.counter.value = m.gauge.value = static_cast<double>(tokens);
  return family;
}

}  // namespace

// Reads the gauge source when scraped.
class ServiceMetrics::Gauges final : public prometheus::Collectable {
 public:
  void SetSource(std::function<ServiceGauges()> source) {
    std::lock_guard<std::mutex> lock(mu_);
    source_ = std::move(source);
  }

  std::vector<prometheus::MetricFamily> Collect() const override {
    ServiceGauges g;
    {
      // Held while reading, so that a source being replaced (the server
      // going away) is not called after its replacement returns.
      std::lock_guard<std::mutex> lock(mu_);
      if (source_) g = source_();
    }
    using prometheus::MetricType;
    constexpr MetricType kGauge = MetricType::Gauge;
    constexpr MetricType kCounter = MetricType::Counter;
    return {
        OneValue("tensorcheck_requests_in_flight",
                 "Verify and Diagnose requests accepted (queued or running) and not finished.",
                 kGauge, g.requests_in_flight),
        OneValue("tensorcheck_requests_queued", "Requests waiting for a worker.", kGauge,
                 g.requests_queued),
        OneValue("tensorcheck_store_bytes",
                 "Bytes the tensor store holds: stored tensors and uploads in progress.", kGauge,
                 g.store_bytes),
        OneValue("tensorcheck_store_tensors", "Tensors in the tensor store.", kGauge,
                 g.store_tensors),
        OneValue("tensorcheck_store_hits_total",
                 "Tensor store lookups by digest that found the tensor.", kCounter, g.store_hits),
        OneValue("tensorcheck_store_misses_total",
                 "Tensor store lookups by digest that did not find the tensor.", kCounter,
                 g.store_misses),
        OneValue("tensorcheck_store_evictions_total",
                 "Tensors the tensor store evicted to make room.", kCounter, g.store_evictions),
        OneValue("tensorcheck_gpu_memory_used_bytes",
                 "GPU memory held under the budget: running requests' arrays, workspaces and "
                 "resident tensors.",
                 kGauge, g.gpu_memory_used_bytes),
        OneValue("tensorcheck_gpu_memory_budget_bytes",
                 "The GPU memory budget (--gpu-memory-budget-mb).", kGauge,
                 g.gpu_memory_budget_bytes),
        OneValue("tensorcheck_gpu_resident_bytes",
                 "GPU memory held by resident tensors (kept between requests).", kGauge,
                 g.gpu_resident_bytes),
        OneValue("tensorcheck_gpu_cache_hits_total",
                 "Resident tensor lookups that found the tensor on the GPU.", kCounter,
                 g.gpu_cache_hits),
        OneValue("tensorcheck_gpu_cache_misses_total",
                 "Resident tensor lookups that had to copy the tensor to the GPU.", kCounter,
                 g.gpu_cache_misses),
        OneValue("tensorcheck_gpu_cache_evictions_total",
                 "Resident tensors evicted from the GPU to make room.", kCounter,
                 g.gpu_cache_evictions),
        PerCredentials("tensorcheck_credential_reloads_refused_total",
                       "Credential files whose new contents a reload refused (a TLS set that "
                       "fails the check, a tokens file that does not parse), each once; what "
                       "was in force stayed.",
                       kCounter, g.tls_sets_refused, g.tokens_files_refused),
        PerCredentials("tensorcheck_credentials_stale",
                       "1 while the credential files hold contents a reload refused: the "
                       "server serves older ones.",
                       kGauge, g.tls_refusing ? 1 : 0, g.tokens_refusing ? 1 : 0),
    };
  }

 private:
  mutable std::mutex mu_;
  std::function<ServiceGauges()> source_;  // guarded by mu_
};

const std::vector<double>& ServiceMetrics::SecondsBuckets() {
  static const std::vector<double> buckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                              0.1,   0.25,   0.5,   1,    2.5,   5,
                                              10,    25,     50,    100,  250,   600};
  return buckets;
}

ServiceMetrics::ServiceMetrics()
    : registry_(std::make_shared<prometheus::Registry>()), gauges_(std::make_shared<Gauges>()) {
  requests_ = &prometheus::BuildCounter()
                   .Name("tensorcheck_requests_total")
                   .Help("Calls finished, by method, tenant and the gRPC status code answered.")
                   .Register(*registry_);
  queue_seconds_ = &prometheus::BuildHistogram()
                        .Name("tensorcheck_request_queue_seconds")
                        .Help("Seconds Verify and Diagnose requests waited for a worker.")
                        .Register(*registry_);
  compute_seconds_ = &prometheus::BuildHistogram()
                          .Name("tensorcheck_request_compute_seconds")
                          .Help("Seconds Verify and Diagnose requests ran on a worker.")
                          .Register(*registry_);
  duration_seconds_ = &prometheus::BuildHistogram()
                           .Name("tensorcheck_request_duration_seconds")
                           .Help("Seconds from receiving a call to answering it.")
                           .Register(*registry_);
  received_bytes_ = &prometheus::BuildCounter()
                         .Name("tensorcheck_received_bytes_total")
                         .Help("Request message bytes received (UploadTensor: tensor bytes).")
                         .Register(*registry_);
  sent_bytes_ = &prometheus::BuildCounter()
                     .Name("tensorcheck_sent_bytes_total")
                     .Help("Response message bytes sent (ReadTensor: tensor bytes).")
                     .Register(*registry_);
}

ServiceMetrics::~ServiceMetrics() = default;

void ServiceMetrics::Record(const CallRecord& call) {
  const std::string method(call.method);
  requests_
      ->Add({{"method", method},
             {"tenant", std::string(call.tenant)},
             {"code", absl::StatusCodeToString(call.code)}})
      .Increment();
  const prometheus::Labels by_method = {{"method", method}};
  duration_seconds_->Add(by_method, SecondsBuckets()).Observe(call.total_seconds);
  if (call.queue_seconds)
    queue_seconds_->Add(by_method, SecondsBuckets()).Observe(*call.queue_seconds);
  if (call.compute_seconds) {
    compute_seconds_->Add(by_method, SecondsBuckets()).Observe(*call.compute_seconds);
  }
  received_bytes_->Add(by_method).Increment(static_cast<double>(call.received_bytes));
  sent_bytes_->Add(by_method).Increment(static_cast<double>(call.sent_bytes));
}

void ServiceMetrics::SetGaugeSource(std::function<ServiceGauges()> source) {
  gauges_->SetSource(std::move(source));
}

std::vector<prometheus::MetricFamily> ServiceMetrics::Collect() const {
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  for (prometheus::MetricFamily& f : gauges_->Collect()) families.push_back(std::move(f));
  return families;
}

std::string ServiceMetrics::Text() const {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, Collect());
  return out.str();
}

namespace {

// The numeric host and port of a socket address ("" and 0 when unknown).
void NumericAddress(const sockaddr_storage& addr, socklen_t len, std::string& ip, int& port) {
  char host[NI_MAXHOST];
  char service[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, host, sizeof(host), service,
                  sizeof(service), NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return;
  }
  ip = host;
  if (!absl::SimpleAtoi(service, &port)) port = 0;
}

// One request as cpp-httplib reads it: from the bytes already received (a
// whole header and whatever followed it), never from the socket, so it
// never waits; what it writes is kept for the loop to send.
class BufferedStream final : public httplib::Stream {
 public:
  BufferedStream(int fd, absl::string_view received) : fd_(fd), in_(received) {}

  bool is_readable() const override { return read_ < in_.size(); }
  bool is_writable() const override { return true; }
  ssize_t read(char* ptr, size_t size) override {
    const size_t n = std::min(size, in_.size() - read_);
    std::memcpy(ptr, in_.data() + read_, n);
    read_ += n;
    return static_cast<ssize_t>(n);  // 0 at the end: what has not arrived reads as the end
  }
  ssize_t write(const char* ptr, size_t size) override {
    out_.append(ptr, size);
    return static_cast<ssize_t>(size);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage addr = {};
    socklen_t len = sizeof(addr);
    if (getpeername(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      NumericAddress(addr, len, ip, port);
    }
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage addr = {};
    socklen_t len = sizeof(addr);
    if (getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      NumericAddress(addr, len, ip, port);
    }
  }
  int socket() const override { return fd_; }

  size_t bytes_read() const { return read_; }
  std::string& written() { return out_; }

 private:
  const int fd_;
  const absl::string_view in_;
  size_t read_ = 0;
  std::string out_;
};

constexpr char kHeaderTooLarge[] =
    "HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Length: 0\r\nConnection: "
    "close\r\n\r\n";

}  // namespace

// cpp-httplib's server for its request parsing, routing and answers (a
// protected member), fed by one thread's poll loop instead of its own
// accept loop and thread pool (metrics.h says why).
class MetricsEndpoint::Http final : public httplib::Server {
 public:
  explicit Http(const MetricsEndpointOptions& options) : options_(options) {}
  ~Http() override {
    for (Connection& c : connections_) Close(c);
    const int listening = svr_sock_.exchange(INVALID_SOCKET);
    if (listening != INVALID_SOCKET) close(listening);
  }

  // The socket bind_to_port (or bind_to_any_port) opened; INVALID_SOCKET
  // before.
  int listening_socket() const { return svr_sock_; }

  // Accepts, reads, answers and sends until `wake_fd` becomes readable.
  void Serve(int wake_fd);

 private:
  enum class Phase {
    kIdle,     // no request under way; closed at idle_timeout
    kReading,  // a request's first bytes came, not yet its whole header
    kWriting,  // its answer is being sent (both: the request's deadline)
  };
  struct Connection {
    int fd = -1;  // -1: closed, dropped at the end of the loop's turn
    Phase phase = Phase::kIdle;
    // Since when it waits for an answer (its accept, or its last answer
    // sent), in the loop's order of events: the lowest idle or reading
    // connection has waited longest, and is the one closed to make room.
    uint64_t waiting_since = 0;
    absl::Time deadline;
    std::string in;      // received and not yet answered
    size_t scanned = 0;  // no header end in `in` before here
    bool eof = false;    // the client will send no more
    std::string out;     // the answer, kWriting
    size_t sent = 0;
    bool close_after = false;  // once `out` is sent
  };

  void Accept(absl::Time now);
  // Opened, or answered: waits for a request anew.
  void StartWaiting(Connection& c, absl::Time now);
  void Receive(Connection& c, absl::Time now);
  // Answers what `in` holds whole and sends what it can, until it must
  // wait for the client.
  void Advance(Connection& c, absl::Time now);
  void Answer(Connection& c);
  void Close(Connection& c);

  const MetricsEndpointOptions options_;
  // The loop's alone, as is everything below.
  std::vector<Connection> connections_;
  int open_ = 0;  // connections_ with fd >= 0
  uint64_t events_ = 0;
  absl::Time accept_paused_until_ = absl::InfinitePast();  // out of descriptors
};

void MetricsEndpoint::Http::Serve(int wake_fd) {
  std::vector<pollfd> fds;
  while (true) {
    absl::Time now = absl::Now();
    const bool accepting = now >= accept_paused_until_;
    absl::Time wake_at = accepting ? absl::InfiniteFuture() : accept_paused_until_;
    fds.clear();
    fds.push_back({wake_fd, POLLIN, 0});
    fds.push_back({accepting ? listening_socket() : -1, POLLIN, 0});  // poll skips -1
    for (const Connection& c : connections_) {
      const short events = c.phase == Phase::kWriting ? POLLOUT : POLLIN;
      fds.push_back({c.fd, events, 0});
      wake_at = std::min(wake_at, c.deadline);
    }
    int timeout_ms = -1;
    if (wake_at != absl::InfiniteFuture()) {
      const double ms = std::ceil(absl::ToDoubleMilliseconds(wake_at - now));
      timeout_ms = static_cast<int>(std::clamp<double>(ms, 0, INT_MAX));
    }
    if (poll(fds.data(), fds.size(), timeout_ms) < 0) {
      if (errno != EINTR) absl::SleepFor(absl::Milliseconds(10));  // not expected; no spin
      continue;
    }
    if (fds[0].revents != 0) return;
    now = absl::Now();
    const size_t polled = connections_.size();
    for (size_t i = 0; i < polled; ++i) {
      Connection& c = connections_[i];
      if (c.fd < 0 || fds[i + 2].revents == 0) continue;
      if (c.phase == Phase::kWriting) {
        Advance(c, now);
      } else {
        Receive(c, now);
      }
    }
    for (Connection& c : connections_) {
      if (c.fd >= 0 && c.deadline <= now) Close(c);
    }
    if (fds[1].revents != 0) Accept(now);
    connections_.erase(std::remove_if(connections_.begin(), connections_.end(),
                                      [](const Connection& c) { return c.fd < 0; }),
                       connections_.end());
  }
}

void MetricsEndpoint::Http::Accept(absl::Time now) {
  // A bounded batch, so that a flood of connections still lets the loop
  // serve the open ones.
  for (int i = 0; i < 64; ++i) {
    const int fd = accept4(listening_socket(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        accept_paused_until_ = now + absl::Milliseconds(100);
      }
      return;  // EAGAIN: none left
    }
    if (open_ >= options_.max_connections) {
      // Make room by closing the connection that has waited longest for
      // an answer; when every one is being answered, the new one is
      // refused.
      Connection* oldest = nullptr;
      for (Connection& c : connections_) {
        if (c.fd >= 0 && c.phase != Phase::kWriting &&
            (oldest == nullptr || c.waiting_since < oldest->waiting_since)) {
          oldest = &c;
        }
      }
      if (oldest == nullptr) {
        close(fd);
        continue;
      }
      Close(*oldest);
    }
    Connection& c = connections_.emplace_back();
    c.fd = fd;
    ++open_;
    StartWaiting(c, now);
  }
}

void MetricsEndpoint::Http::StartWaiting(Connection& c, absl::Time now) {
  c.waiting_since = ++events_;
  // Bytes left after the last request are the next one's start.
  c.phase = c.in.empty() ? Phase::kIdle : Phase::kReading;
  c.deadline = now + (c.in.empty() ? options_.idle_timeout : options_.request_timeout);
}

void MetricsEndpoint::Http::Receive(Connection& c, absl::Time now) {
  char buffer[4096];
  while (c.in.size() <= static_cast<size_t>(options_.max_request_bytes)) {
    const ssize_t n = recv(c.fd, buffer, sizeof(buffer), 0);
    if (n > 0) {
      if (c.phase == Phase::kIdle) {
        c.phase = Phase::kReading;
        c.deadline = now + options_.request_timeout;
      }
      c.in.append(buffer, static_cast<size_t>(n));
    } else if (n == 0) {
      c.eof = true;  // what came may still be answered
      break;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      break;
    } else if (errno != EINTR) {
      Close(c);
      return;
    }
  }
  Advance(c, now);
}

void MetricsEndpoint::Http::Advance(Connection& c, absl::Time now) {
  const size_t max_header = static_cast<size_t>(options_.max_request_bytes);
  while (c.fd >= 0) {
    if (c.phase == Phase::kWriting) {
      while (c.sent < c.out.size()) {
        const ssize_t n = send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
        if (n > 0) {
          c.sent += static_cast<size_t>(n);
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
          return;  // the loop polls for room
        } else if (n == 0 || errno != EINTR) {
          Close(c);
          return;
        }
      }
      if (c.close_after || (c.eof && c.in.empty())) {
        Close(c);
        return;
      }
      c.out.clear();
      c.sent = 0;
      StartWaiting(c, now);
      continue;  // a request that followed may be whole already
    }
    const size_t end = c.in.find("\r\n\r\n", c.scanned >= 3 ? c.scanned - 3 : 0);
    if (end == std::string::npos ? c.in.size() > max_header : end + 4 > max_header) {
      c.in.clear();
      c.out = kHeaderTooLarge;
      c.sent = 0;
      c.close_after = true;
      c.phase = Phase::kWriting;
      continue;
    }
    if (end == std::string::npos) {
      c.scanned = c.in.size();
      if (c.eof) Close(c);
      return;
    }
    Answer(c);
  }
}

void MetricsEndpoint::Http::Answer(Connection& c) {
  BufferedStream stream(c.fd, c.in);
  bool connection_closed = false;
  const bool answered =
      process_request(stream, /*close_connection=*/false, connection_closed, nullptr);
  c.in.erase(0, stream.bytes_read());
  c.scanned = 0;
  c.out = std::move(stream.written());
  c.sent = 0;
  // Nothing read would answer the same bytes again.
  c.close_after = !answered || connection_closed || stream.bytes_read() == 0;
  c.phase = Phase::kWriting;  // the request's deadline holds until the answer is sent
}

void MetricsEndpoint::Http::Close(Connection& c) {
  if (c.fd < 0) return;
  close(c.fd);
  c.fd = -1;
  --open_;
  c.in = std::string();
  c.out = std::string();
}

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const std::string& address, ServiceMetrics* metrics, const MetricsEndpointOptions& options) {
  if (options.idle_timeout <= absl::ZeroDuration() ||
      options.request_timeout <= absl::ZeroDuration() || options.max_connections < 1 ||
      options.max_request_bytes < 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics endpoint: positive timeouts, max_connections >= 1 and max_request_bytes >= 64 "
        "expected, got idle_timeout ",
        absl::FormatDuration(options.idle_timeout), ", request_timeout ",
        absl::FormatDuration(options.request_timeout), ", max_connections ",
        options.max_connections, ", max_request_bytes ", options.max_request_bytes));
  }
  const size_t colon = address.rfind(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address: HOST:PORT expected, got '", address, "'"));
  }
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);  // [::1]
  }
  auto endpoint = std::unique_ptr<MetricsEndpoint>(new MetricsEndpoint());
  endpoint->http_ = std::make_unique<Http>(options);
  Http* http = endpoint->http_.get();
  // SO_REUSEADDR alone: cpp-httplib's default adds SO_REUSEPORT, with which
  // a second server would share a port in use instead of failing.
  http->set_socket_options([](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  http->set_payload_max_length(static_cast<size_t>(options.max_request_bytes));
  http->Get("/metrics", [metrics](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics->Text(), "text/plain; version=0.0.4; charset=utf-8");
  });
  endpoint->port_ =
      port == 0 ? http->bind_to_any_port(host) : (http->bind_to_port(host, port) ? port : -1);
  if (endpoint->port_ <= 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", address, " (address in use?)"));
  }
  const int listening = http->listening_socket();
  // cpp-httplib listens with a backlog of 5; the loop accepts without
  // blocking.
  if (listen(listening, SOMAXCONN) != 0 ||
      fcntl(listening, F_SETFL, fcntl(listening, F_GETFL) | O_NONBLOCK) != 0) {
    return absl::InternalError(
        absl::StrCat("metrics endpoint: cannot set up its socket: ", std::strerror(errno)));
  }
  endpoint->wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (endpoint->wake_fd_ < 0) {
    return absl::InternalError(absl::StrCat("metrics endpoint: eventfd: ", std::strerror(errno)));
  }
  endpoint->thread_ = std::thread([http, wake = endpoint->wake_fd_] { http->Serve(wake); });
  return endpoint;
}

MetricsEndpoint::~MetricsEndpoint() {
  if (thread_.joinable()) {
    const uint64_t one = 1;
    while (write(wake_fd_, &one, sizeof(one)) < 0 && errno == EINTR) {
    }
    thread_.join();
  }
  http_.reset();
  if (wake_fd_ >= 0) close(wake_fd_);
}

}  // namespace tensorcheck
