#include "server/service/metrics.h"

#include <sys/socket.h>

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

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(const std::string& address,
                                                                        ServiceMetrics* metrics) {
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
  endpoint->http_ = std::make_unique<httplib::Server>();
  // SO_REUSEADDR alone: cpp-httplib's default adds SO_REUSEPORT, with which
  // a second server would share a port in use instead of failing.
  endpoint->http_->set_socket_options([](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  endpoint->http_->Get("/metrics", [metrics](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics->Text(), "text/plain; version=0.0.4; charset=utf-8");
  });
  endpoint->port_ = port == 0 ? endpoint->http_->bind_to_any_port(host)
                              : (endpoint->http_->bind_to_port(host, port) ? port : -1);
  if (endpoint->port_ <= 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", address, " (address in use?)"));
  }
  httplib::Server* http = endpoint->http_.get();
  endpoint->thread_ = std::thread([http] { http->listen_after_bind(); });
  // Until the loop runs, stop() would not end it (and the destructor's
  // join would wait for ever).
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!http->is_running() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  return endpoint;
}

MetricsEndpoint::~MetricsEndpoint() {
  if (http_ != nullptr) http_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace tensorcheck
