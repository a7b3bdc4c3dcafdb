// ServiceMetrics: the server's Prometheus metrics (docs/operations.md,
// "Metrics" lists every name). Calls are recorded as they finish: a count
// by method, tenant and status code, their queue, compute and total
// seconds, and their bytes in and out. Gauges (requests in flight and
// queued, the tensor store, the GPU's memory and resident tensors) are
// read when a scrape asks, through one callback, so no thread polls.
//
//   ServiceMetrics metrics;
//   metrics.SetGaugeSource([&] { ServiceGauges g; g.requests_queued = ...; return g; });
//   CallRecord call;
//   call.method = "Verify";
//   call.code = absl::StatusCode::kOk;
//   call.total_seconds = 0.25;
//   metrics.Record(call);
//   TC_ASSIGN_OR_RETURN(auto endpoint, MetricsEndpoint::Start("0.0.0.0:9464", &metrics));
//   // curl http://HOST:9464/metrics
//
// Thread-safe: Record, SetGaugeSource and scrapes may run on any threads
// at once. The gauge source is called on the scraping thread: it must be
// cheap and must not call back into the metrics.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace prometheus {
class Collectable;
class Counter;
class Histogram;
class Registry;
struct MetricFamily;
template <typename T>
class Family;
}  // namespace prometheus

namespace tensorcheck {

// One finished call, as the metrics count it.
struct CallRecord {
  absl::string_view method;  // "Verify", "UploadTensor", ...
  absl::string_view tenant;  // empty: no tenant
  // The code the client got (its gRPC name is the `code` label).
  absl::StatusCode code = absl::StatusCode::kOk;
  // From receiving the call to answering it.
  double total_seconds = 0;
  // Waiting for a worker, and running on it; unset for calls that never
  // reached a worker (refused at once, or the store's, which have none).
  std::optional<double> queue_seconds;
  std::optional<double> compute_seconds;
  // Request and response message bytes (UploadTensor: the tensor bytes
  // received; ReadTensor: the tensor bytes sent).
  int64_t received_bytes = 0;
  int64_t sent_bytes = 0;
};

// What the gauges read at scrape time. Zeros where there is no such thing
// (no tensor store, no GPU).
struct ServiceGauges {
  int64_t requests_in_flight = 0;  // accepted (queued or running), not finished
  int64_t requests_queued = 0;     // waiting for a worker
  int64_t store_bytes = 0;         // stored tensors and uploads in progress
  int64_t store_tensors = 0;
  int64_t store_hits = 0;  // lookups by digest (TensorStore::Stats)
  int64_t store_misses = 0;
  int64_t store_evictions = 0;
  // Every device together: memory held under the budget (requests'
  // arrays, workspaces, resident tensors), the budget, the resident
  // tensors and their cache's lookups.
  int64_t gpu_memory_used_bytes = 0;
  int64_t gpu_memory_budget_bytes = 0;
  int64_t gpu_resident_bytes = 0;
  int64_t gpu_cache_hits = 0;
  int64_t gpu_cache_misses = 0;
  int64_t gpu_cache_evictions = 0;
  // Credential files (docs/operations.md, "Rotating tokens and
  // certificates"): contents refused by a reload (each distinct one once),
  // and whether the files hold refused contents now (what is in force is
  // then older than the files).
  int64_t tls_sets_refused = 0;
  bool tls_refusing = false;
  int64_t tokens_files_refused = 0;
  bool tokens_refusing = false;
};

class ServiceMetrics {
 public:
  // Upper bounds of the seconds histograms: 1 ms to 10 min, three per
  // decade (1, 2.5, 5), the last one 600.
  static const std::vector<double>& SecondsBuckets();

  ServiceMetrics();
  ~ServiceMetrics();
  ServiceMetrics(const ServiceMetrics&) = delete;
  ServiceMetrics& operator=(const ServiceMetrics&) = delete;

  // Counts one finished call.
  void Record(const CallRecord& call);

  // Where the gauges come from; until set (or when set empty) they read 0.
  // Whatever `source` reads must outlive the metrics' last scrape, or be
  // replaced before it goes.
  void SetGaugeSource(std::function<ServiceGauges()> source);

  // Every metric now, and the same in Prometheus' text format.
  std::vector<prometheus::MetricFamily> Collect() const;
  std::string Text() const;

 private:
  friend class MetricsEndpoint;
  class Gauges;  // the scrape-time collectable

  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<Gauges> gauges_;
  prometheus::Family<prometheus::Counter>* requests_;
  prometheus::Family<prometheus::Histogram>* queue_seconds_;
  prometheus::Family<prometheus::Histogram>* compute_seconds_;
  prometheus::Family<prometheus::Histogram>* duration_seconds_;
  prometheus::Family<prometheus::Counter>* received_bytes_;
  prometheus::Family<prometheus::Counter>* sent_bytes_;
};

// What the metrics endpoint allows one connection, and how many it keeps
// (docs/operations.md, "Metrics"). The defaults suit Prometheus, which
// sends a request of a few hundred bytes at once and reads the answer at
// once.
struct MetricsEndpointOptions {
  // A connection with no request under way (just opened, or between two
  // requests on a kept-alive connection) is closed after this long.
  absl::Duration idle_timeout = absl::Seconds(5);
  // From a request's first byte to the last byte of its answer sent: a
  // request whose header is still arriving then, or whose answer is not
  // taken, is dropped with its connection.
  absl::Duration request_timeout = absl::Seconds(10);
  // Connections open at once. A new one beyond it closes the open one
  // that has waited longest for an answer (idle, or its request still
  // incomplete): a scrape, whose request arrives whole and is answered at
  // once, still gets in.
  int max_connections = 64;
  // The longest request header; a longer one is answered 431 and closed.
  int max_request_bytes = 8 << 10;
};

// The HTTP endpoint: GET /metrics answers `metrics` in Prometheus' text
// format (prometheus-cpp's TextSerializer) while this lives, on its own
// thread. Served by cpp-httplib rather than prometheus-cpp's Exposer: the
// Exposer's civetweb starts its threads with a fixed 40 KiB stack, too
// small for the static TLS of a process linked with cuBLASLt (92 KiB), so
// on a CUDA build it could not start at all.
//
// Slow clients cannot starve a scrape. cpp-httplib's own loop hands each
// connection to one of 8 worker threads until the connection ends, and
// its read timeout is per read: 8 clients sending a byte every few
// seconds held every worker for ever. Here one thread polls every
// connection without blocking and buffers what arrives; only a complete
// request header goes to cpp-httplib (its request parsing and routing),
// which answers it from that buffer into another, at once; the same
// thread then sends the answer as the socket takes it. A slow or silent
// client costs a buffer and a socket, never a thread, and each is bounded
// by MetricsEndpointOptions: idle and request timeouts, a header size and
// a number of connections (beyond it the longest waiting is closed). A
// request body is not waited for: bytes not yet received with the header
// read as its end (the endpoint answers GET).
class MetricsEndpoint {
 public:
  // `address` is "HOST:PORT" (port 0: a free one); UNAVAILABLE when it
  // cannot be bound, INVALID_ARGUMENT for a malformed address or options.
  // `metrics` must outlive the endpoint.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(
      const std::string& address, ServiceMetrics* metrics,
      const MetricsEndpointOptions& options = MetricsEndpointOptions());
  ~MetricsEndpoint();

  // The port bound.
  int port() const { return port_; }

 private:
  // cpp-httplib's server (request parsing, routing, the answer) and the
  // polling loop that feeds it; metrics.cc.
  class Http;

  MetricsEndpoint() = default;
  std::unique_ptr<Http> http_;
  int wake_fd_ = -1;    // an eventfd: the destructor's "stop" to the loop
  std::thread thread_;  // runs the loop
  int port_ = 0;
};

}  // namespace tensorcheck
