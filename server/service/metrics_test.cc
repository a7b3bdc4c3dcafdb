// The metrics as a scrape sees them: the text exposition parsed back into
// samples, after recording calls whose counts, bucket placements and sums
// are worked out by hand here. Then the endpoint over HTTP, with slow,
// silent and too many clients (metrics.h, docs/operations.md "Metrics").
#include "server/service/metrics.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "tests/testing/status_matchers.h"

namespace tensorcheck {
namespace {

using ::tensorcheck::testing::IsOk;
using ::tensorcheck::testing::StatusIs;
using ::testing::HasSubstr;

struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

// The samples of a text exposition (comments skipped). Label values here
// hold no quotes, commas or escapes.
std::vector<Sample> Parse(const std::string& text) {
  std::vector<Sample> samples;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    if (line.front() == '#') continue;
    Sample s;
    const size_t space = line.rfind(' ');
    std::string value(line.substr(space + 1));
    absl::string_view series = line.substr(0, space);
    if (value == "+Inf") {
      s.value = std::numeric_limits<double>::infinity();
    } else {
      EXPECT_TRUE(absl::SimpleAtod(value, &s.value)) << line;
    }
    const size_t brace = series.find('{');
    s.name = std::string(series.substr(0, brace));
    if (brace != absl::string_view::npos) {
      absl::string_view labels = series.substr(brace + 1, series.size() - brace - 2);
      for (absl::string_view kv : absl::StrSplit(labels, ',', absl::SkipEmpty())) {
        const size_t eq = kv.find('=');
        s.labels[std::string(kv.substr(0, eq))] =
            std::string(kv.substr(eq + 2, kv.size() - eq - 3));
      }
    }
    samples.push_back(std::move(s));
  }
  return samples;
}

// The value of the one sample named `name` with exactly `labels`; -1 (no
// metric here is negative) when there is none.
double ValueOf(const std::vector<Sample>& samples, const std::string& name,
               const std::map<std::string, std::string>& labels = {}) {
  double found = -1;
  int matches = 0;
  for (const Sample& s : samples) {
    if (s.name == name && s.labels == labels) {
      found = s.value;
      ++matches;
    }
  }
  EXPECT_LE(matches, 1) << name;
  return found;
}

CallRecord Call(absl::string_view method, absl::string_view tenant, absl::StatusCode code,
                double total_seconds) {
  CallRecord c;
  c.method = method;
  c.tenant = tenant;
  c.code = code;
  c.total_seconds = total_seconds;
  return c;
}

TEST(ServiceMetricsTest, RequestsAreCountedByMethodTenantAndCode) {
  ServiceMetrics metrics;
  for (int i = 0; i < 3; ++i) metrics.Record(Call("Verify", "team-a", absl::StatusCode::kOk, 0.1));
  metrics.Record(Call("Verify", "team-a", absl::StatusCode::kInvalidArgument, 0.1));
  metrics.Record(Call("Verify", "team-b", absl::StatusCode::kOk, 0.1));
  metrics.Record(Call("Diagnose", "team-a", absl::StatusCode::kResourceExhausted, 0.1));
  metrics.Record(Call("UploadTensor", "", absl::StatusCode::kOk, 0.1));
  metrics.Record(Call("UploadTensor", "", absl::StatusCode::kOk, 0.1));

  const std::vector<Sample> s = Parse(metrics.Text());
  const std::string name = "tensorcheck_requests_total";
  EXPECT_EQ(ValueOf(s, name, {{"method", "Verify"}, {"tenant", "team-a"}, {"code", "OK"}}), 3);
  EXPECT_EQ(
      ValueOf(s, name, {{"method", "Verify"}, {"tenant", "team-a"}, {"code", "INVALID_ARGUMENT"}}),
      1);
  EXPECT_EQ(ValueOf(s, name, {{"method", "Verify"}, {"tenant", "team-b"}, {"code", "OK"}}), 1);
  EXPECT_EQ(ValueOf(s, name,
                    {{"method", "Diagnose"}, {"tenant", "team-a"}, {"code", "RESOURCE_EXHAUSTED"}}),
            1);
  EXPECT_EQ(ValueOf(s, name, {{"method", "UploadTensor"}, {"tenant", ""}, {"code", "OK"}}), 2);
  int series = 0;
  for (const Sample& x : s) series += x.name == name;
  EXPECT_EQ(series, 5);
}

TEST(ServiceMetricsTest, DurationsLandInTheirBucketsWithCountAndSum) {
  ServiceMetrics metrics;
  // 3 ms: first under 5 ms. 200 ms: under 250 ms. Exactly 1 s: the bound
  // is inclusive (le). 700 s: past the last bound (600), +Inf only.
  for (double seconds : {0.003, 0.2, 1.0, 700.0}) {
    metrics.Record(Call("Verify", "", absl::StatusCode::kOk, seconds));
  }
  metrics.Record(Call("Diagnose", "", absl::StatusCode::kOk, 0.0005));

  const std::vector<Sample> s = Parse(metrics.Text());
  const std::string bucket = "tensorcheck_request_duration_seconds_bucket";
  const std::map<std::string, double> expected = {
      {"0.001", 0}, {"0.0025", 0}, {"0.005", 1}, {"0.01", 1}, {"0.025", 1}, {"0.05", 1}, {"0.1", 1},
      {"0.25", 2},  {"0.5", 2},    {"1", 3},     {"2.5", 3},  {"5", 3},     {"10", 3},   {"25", 3},
      {"50", 3},    {"100", 3},    {"250", 3},   {"600", 3},  {"+Inf", 4}};
  for (const auto& [le, count] : expected) {
    EXPECT_EQ(ValueOf(s, bucket, {{"method", "Verify"}, {"le", le}}), count) << "le=" << le;
  }
  int buckets = 0;
  for (const Sample& x : s) buckets += x.name == bucket && x.labels.at("method") == "Verify";
  EXPECT_EQ(buckets, 19);  // 18 bounds and +Inf
  EXPECT_EQ(ValueOf(s, "tensorcheck_request_duration_seconds_count", {{"method", "Verify"}}), 4);
  EXPECT_DOUBLE_EQ(ValueOf(s, "tensorcheck_request_duration_seconds_sum", {{"method", "Verify"}}),
                   701.203);
  // Another method is its own series: half a millisecond, in every bucket.
  EXPECT_EQ(ValueOf(s, bucket, {{"method", "Diagnose"}, {"le", "0.001"}}), 1);
  EXPECT_EQ(ValueOf(s, "tensorcheck_request_duration_seconds_count", {{"method", "Diagnose"}}), 1);
}

TEST(ServiceMetricsTest, QueueAndComputeCountOnlyCallsThatReachedAWorker) {
  ServiceMetrics metrics;
  CallRecord ran = Call("Verify", "", absl::StatusCode::kOk, 2.5);
  ran.queue_seconds = 0.5;
  ran.compute_seconds = 2.0;
  metrics.Record(ran);
  ran.queue_seconds = 0.02;
  ran.compute_seconds = 0.03;
  metrics.Record(ran);
  // Refused before reaching a worker (a full queue): counted, never timed
  // in a worker.
  metrics.Record(Call("Verify", "", absl::StatusCode::kUnavailable, 0.001));

  const std::vector<Sample> s = Parse(metrics.Text());
  const std::map<std::string, std::string> verify = {{"method", "Verify"}};
  EXPECT_EQ(ValueOf(s, "tensorcheck_request_queue_seconds_count", verify), 2);
  EXPECT_DOUBLE_EQ(ValueOf(s, "tensorcheck_request_queue_seconds_sum", verify), 0.52);
  EXPECT_EQ(ValueOf(s, "tensorcheck_request_queue_seconds_bucket",
                    {{"method", "Verify"}, {"le", "0.025"}}),
            1);
  EXPECT_EQ(ValueOf(s, "tensorcheck_request_compute_seconds_count", verify), 2);
  EXPECT_DOUBLE_EQ(ValueOf(s, "tensorcheck_request_compute_seconds_sum", verify), 2.03);
  EXPECT_EQ(
      ValueOf(s, "tensorcheck_request_compute_seconds_bucket", {{"method", "Verify"}, {"le", "1"}}),
      1);
  EXPECT_EQ(ValueOf(s, "tensorcheck_request_duration_seconds_count", verify), 3);
}

TEST(ServiceMetricsTest, BytesAddUpByMethod) {
  ServiceMetrics metrics;
  CallRecord c = Call("Verify", "", absl::StatusCode::kOk, 0.1);
  c.received_bytes = 1000;
  c.sent_bytes = 300;
  metrics.Record(c);
  c.received_bytes = 24;
  c.sent_bytes = 0;
  metrics.Record(c);
  c = Call("ReadTensor", "", absl::StatusCode::kOk, 0.1);
  c.received_bytes = 80;
  c.sent_bytes = 1 << 20;
  metrics.Record(c);

  const std::vector<Sample> s = Parse(metrics.Text());
  EXPECT_EQ(ValueOf(s, "tensorcheck_received_bytes_total", {{"method", "Verify"}}), 1024);
  EXPECT_EQ(ValueOf(s, "tensorcheck_sent_bytes_total", {{"method", "Verify"}}), 300);
  EXPECT_EQ(ValueOf(s, "tensorcheck_received_bytes_total", {{"method", "ReadTensor"}}), 80);
  EXPECT_EQ(ValueOf(s, "tensorcheck_sent_bytes_total", {{"method", "ReadTensor"}}), 1048576);
}

TEST(ServiceMetricsTest, GaugesAreReadWhenScraped) {
  ServiceMetrics metrics;
  // No source yet: every gauge reads 0.
  std::vector<Sample> s = Parse(metrics.Text());
  EXPECT_EQ(ValueOf(s, "tensorcheck_requests_in_flight"), 0);
  EXPECT_EQ(ValueOf(s, "tensorcheck_gpu_memory_used_bytes"), 0);

  ServiceGauges now;
  int reads = 0;
  metrics.SetGaugeSource([&] {
    ++reads;
    return now;
  });
  now.requests_in_flight = 3;
  now.requests_queued = 1;
  now.store_bytes = 4096;
  now.store_tensors = 2;
  now.store_hits = 7;
  now.store_misses = 5;
  now.store_evictions = 1;
  now.gpu_memory_used_bytes = 1 << 30;
  now.gpu_memory_budget_bytes = int64_t{8} << 30;
  now.gpu_resident_bytes = 1 << 20;
  now.gpu_cache_hits = 11;
  now.gpu_cache_misses = 13;
  now.gpu_cache_evictions = 2;
  EXPECT_EQ(reads, 0);  // nothing polls
  s = Parse(metrics.Text());
  EXPECT_EQ(reads, 1);
  EXPECT_EQ(ValueOf(s, "tensorcheck_requests_in_flight"), 3);
  EXPECT_EQ(ValueOf(s, "tensorcheck_requests_queued"), 1);
  EXPECT_EQ(ValueOf(s, "tensorcheck_store_bytes"), 4096);
  EXPECT_EQ(ValueOf(s, "tensorcheck_store_tensors"), 2);
  EXPECT_EQ(ValueOf(s, "tensorcheck_store_hits_total"), 7);
  EXPECT_EQ(ValueOf(s, "tensorcheck_store_misses_total"), 5);
  EXPECT_EQ(ValueOf(s, "tensorcheck_store_evictions_total"), 1);
  EXPECT_EQ(ValueOf(s, "tensorcheck_gpu_memory_used_bytes"), 1073741824);
  EXPECT_EQ(ValueOf(s, "tensorcheck_gpu_memory_budget_bytes"), 8589934592.0);
  EXPECT_EQ(ValueOf(s, "tensorcheck_gpu_resident_bytes"), 1048576);
  EXPECT_EQ(ValueOf(s, "tensorcheck_gpu_cache_hits_total"), 11);
  EXPECT_EQ(ValueOf(s, "tensorcheck_gpu_cache_misses_total"), 13);
  EXPECT_EQ(ValueOf(s, "tensorcheck_gpu_cache_evictions_total"), 2);
  const std::string text = metrics.Text();
  EXPECT_THAT(text, HasSubstr("# TYPE tensorcheck_requests_in_flight gauge"));
  EXPECT_THAT(text, HasSubstr("# TYPE tensorcheck_store_hits_total counter"));

  now.requests_in_flight = 0;
  EXPECT_EQ(ValueOf(Parse(metrics.Text()), "tensorcheck_requests_in_flight"), 0);
  metrics.SetGaugeSource(nullptr);  // the server going away
  EXPECT_EQ(ValueOf(Parse(metrics.Text()), "tensorcheck_store_bytes"), 0);
  EXPECT_EQ(reads, 3);
}

// A TCP connection to 127.0.0.1:`port` whose reads give up after
// `read_timeout` (the test's own guard against a hang); -1 when refused.
int Connect(int port, absl::Duration read_timeout = absl::Seconds(60)) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  timeval tv = absl::ToTimeval(read_timeout);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

bool SendAll(int fd, absl::string_view bytes) {
  return send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size());
}

// Everything `fd` receives until the server closes it, or until a read
// gives up (the socket's SO_RCVTIMEO); `closed` says which.
std::string ReadToEnd(int fd, bool* closed = nullptr) {
  std::string answer;
  char buffer[4096];
  ssize_t n;
  while ((n = read(fd, buffer, sizeof(buffer))) > 0) answer.append(buffer, static_cast<size_t>(n));
  if (closed != nullptr) *closed = n == 0 || (n < 0 && errno == ECONNRESET);
  return answer;
}

// Whether the server has closed `fd` (a read now would not block).
bool ClosedByServer(int fd) {
  char byte;
  const ssize_t n = recv(fd, &byte, 1, MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

// An HTTP/1.0 GET of `path` on 127.0.0.1:`port`; the whole answer, or
// what came before the client gave up waiting (`client_timeout`).
std::string HttpGet(int port, const std::string& path,
                    absl::Duration client_timeout = absl::Seconds(60)) {
  const int fd = Connect(port, client_timeout);
  if (fd < 0) return "";
  EXPECT_TRUE(SendAll(fd, absl::StrCat("GET ", path, " HTTP/1.0\r\n\r\n")));
  std::string answer = ReadToEnd(fd);
  close(fd);
  return answer;
}

// Connections that send the start of a request and then one more byte of
// a header every `every`, never finishing it: a slowloris. Each byte
// comes well within cpp-httplib's default read timeout (5 s), which
// alone never ends such a connection.
class SlowClients {
 public:
  SlowClients(int port, int count, absl::Duration every) {
    for (int i = 0; i < count; ++i) {
      const int fd = Connect(port);
      EXPECT_GE(fd, 0);
      EXPECT_TRUE(SendAll(fd, "GET /metrics HTTP/1.1\r\nHost: tensorcheck\r\nX-Slow: "));
      fds_.push_back(fd);
    }
    trickle_ = std::thread([this, every] {
      absl::MutexLock lock(&mu_);
      while (!mu_.AwaitWithTimeout(absl::Condition(&stop_), every)) {
        for (int fd : fds_) SendAll(fd, "a");  // fails once the server closed it
      }
    });
  }
  ~SlowClients() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    trickle_.join();
    for (int fd : fds_) close(fd);
  }
  const std::vector<int>& fds() const { return fds_; }

 private:
  std::vector<int> fds_;
  absl::Mutex mu_;
  bool stop_ = false;  // guarded by mu_
  std::thread trickle_;
};

std::unique_ptr<MetricsEndpoint> StartEndpoint(ServiceMetrics* metrics,
                                               const MetricsEndpointOptions& options) {
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> started =
      MetricsEndpoint::Start("127.0.0.1:0", metrics, options);
  EXPECT_THAT(started, IsOk());
  return started.ok() ? *std::move(started) : nullptr;
}

TEST(MetricsEndpointTest, ServesTheTextOverHttp) {
  ServiceMetrics metrics;
  metrics.SetGaugeSource([] {
    ServiceGauges g;
    g.store_tensors = 42;
    return g;
  });
  metrics.Record(Call("Verify", "", absl::StatusCode::kOk, 0.1));
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> started =
      MetricsEndpoint::Start("127.0.0.1:0", &metrics);
  ASSERT_THAT(started, IsOk());
  std::unique_ptr<MetricsEndpoint> endpoint = *std::move(started);
  ASSERT_GT(endpoint->port(), 0);
  const std::string answer = HttpGet(endpoint->port(), "/metrics");
  EXPECT_THAT(answer, HasSubstr("200 OK"));
  const size_t body = answer.find("\r\n\r\n");
  ASSERT_NE(body, std::string::npos);
  const std::vector<Sample> s = Parse(answer.substr(body + 4));
  EXPECT_EQ(ValueOf(s, "tensorcheck_requests_total",
                    {{"method", "Verify"}, {"tenant", ""}, {"code", "OK"}}),
            1);
  EXPECT_EQ(ValueOf(s, "tensorcheck_store_tensors"), 42);
}

TEST(MetricsEndpointTest, APortInUseIsUnavailable) {
  ServiceMetrics metrics;
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> first =
      MetricsEndpoint::Start("127.0.0.1:0", &metrics);
  ASSERT_THAT(first, IsOk());
  EXPECT_THAT(MetricsEndpoint::Start(absl::StrCat("127.0.0.1:", (*first)->port()), &metrics),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("cannot serve metrics")));
}

TEST(MetricsEndpointTest, AScrapeIsAnsweredWhileSlowClientsHoldConnections) {
  ServiceMetrics metrics;
  metrics.Record(Call("Verify", "", absl::StatusCode::kOk, 0.1));
  // Timeouts far away: the scrape must get through because slow clients
  // hold no thread, not because they were cut off.
  MetricsEndpointOptions options;
  options.idle_timeout = absl::Minutes(10);
  options.request_timeout = absl::Minutes(10);
  std::unique_ptr<MetricsEndpoint> endpoint = StartEndpoint(&metrics, options);
  ASSERT_NE(endpoint, nullptr);
  SlowClients slow(endpoint->port(), 32, absl::Seconds(1));
  for (int i = 0; i < 3; ++i) {
    // Starved, this would wait for ever: the client's own timeout ends it.
    const std::string answer = HttpGet(endpoint->port(), "/metrics", absl::Seconds(60));
    ASSERT_THAT(answer, HasSubstr("200 OK")) << "scrape " << i;
    EXPECT_THAT(answer, HasSubstr("tensorcheck_requests_total")) << "scrape " << i;
  }
  for (int fd : slow.fds()) EXPECT_FALSE(ClosedByServer(fd)) << "the slow clients are held";
}

TEST(MetricsEndpointTest, AnIncompleteRequestIsClosedAtItsDeadline) {
  ServiceMetrics metrics;
  MetricsEndpointOptions options;
  options.request_timeout = absl::Seconds(1);
  std::unique_ptr<MetricsEndpoint> endpoint = StartEndpoint(&metrics, options);
  ASSERT_NE(endpoint, nullptr);
  // A byte every 100 ms: no single read waits long, the whole header
  // never ends. The read's guard is 60 times the deadline.
  SlowClients slow(endpoint->port(), 1, absl::Milliseconds(100));
  bool closed = false;
  ReadToEnd(slow.fds()[0], &closed);
  EXPECT_TRUE(closed) << "still open after 60 s";
}

TEST(MetricsEndpointTest, ASilentConnectionIsClosedWhenIdle) {
  ServiceMetrics metrics;
  MetricsEndpointOptions options;
  options.idle_timeout = absl::Seconds(1);
  std::unique_ptr<MetricsEndpoint> endpoint = StartEndpoint(&metrics, options);
  ASSERT_NE(endpoint, nullptr);
  const int fd = Connect(endpoint->port());
  ASSERT_GE(fd, 0);
  bool closed = false;
  EXPECT_EQ(ReadToEnd(fd, &closed), "");
  EXPECT_TRUE(closed) << "still open after 60 s";
  close(fd);
}

TEST(MetricsEndpointTest, PastTheConnectionCapTheLongestWaitingIsClosed) {
  ServiceMetrics metrics;
  MetricsEndpointOptions options;
  options.max_connections = 4;
  options.idle_timeout = absl::Minutes(10);
  options.request_timeout = absl::Minutes(10);
  std::unique_ptr<MetricsEndpoint> endpoint = StartEndpoint(&metrics, options);
  ASSERT_NE(endpoint, nullptr);
  SlowClients slow(endpoint->port(), 4, absl::Seconds(1));
  // The scrape is the fifth connection: the first slow one, waiting
  // longest, makes room.
  EXPECT_THAT(HttpGet(endpoint->port(), "/metrics"), HasSubstr("200 OK"));
  bool closed = false;
  ReadToEnd(slow.fds()[0], &closed);
  EXPECT_TRUE(closed) << "the first slow client still open after 60 s";
  for (size_t i = 1; i < slow.fds().size(); ++i) {
    EXPECT_FALSE(ClosedByServer(slow.fds()[i])) << "slow client " << i;
  }
}

TEST(MetricsEndpointTest, AKeptAliveConnectionIsAnsweredRequestAfterRequest) {
  ServiceMetrics metrics;
  std::unique_ptr<MetricsEndpoint> endpoint = StartEndpoint(&metrics, MetricsEndpointOptions());
  ASSERT_NE(endpoint, nullptr);
  const int fd = Connect(endpoint->port());
  ASSERT_GE(fd, 0);
  // Two requests in one write (pipelined), a third after the first
  // answers; the last one asks to close.
  ASSERT_TRUE(SendAll(fd,
                      "GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n"
                      "GET /nothing HTTP/1.1\r\nHost: a\r\n\r\n"));
  std::string answers;
  char buffer[4096];
  while (answers.find("404 Not Found") == std::string::npos) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    ASSERT_GT(n, 0) << answers;
    answers.append(buffer, static_cast<size_t>(n));
  }
  ASSERT_TRUE(SendAll(fd, "GET /metrics HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"));
  bool closed = false;
  answers += ReadToEnd(fd, &closed);
  EXPECT_TRUE(closed);
  close(fd);
  const std::vector<std::string> statuses = absl::StrSplit(answers, "HTTP/1.1 ");
  ASSERT_EQ(statuses.size(), 4u) << answers;  // before the first, and three answers
  EXPECT_THAT(statuses[1], ::testing::StartsWith("200 OK"));
  EXPECT_THAT(statuses[2], ::testing::StartsWith("404 Not Found"));
  EXPECT_THAT(statuses[3], ::testing::StartsWith("200 OK"));
}

TEST(MetricsEndpointTest, AnOversizedHeaderIsRefused) {
  ServiceMetrics metrics;
  MetricsEndpointOptions options;
  options.max_request_bytes = 1024;
  std::unique_ptr<MetricsEndpoint> endpoint = StartEndpoint(&metrics, options);
  ASSERT_NE(endpoint, nullptr);
  const int fd = Connect(endpoint->port());
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(
      SendAll(fd, absl::StrCat("GET /metrics HTTP/1.1\r\nX-Big: ", std::string(2000, 'a'))));
  bool closed = false;
  EXPECT_THAT(ReadToEnd(fd, &closed), HasSubstr("431"));
  EXPECT_TRUE(closed);
  close(fd);
}

TEST(MetricsEndpointTest, BadOptionsAreInvalidArgument) {
  ServiceMetrics metrics;
  MetricsEndpointOptions options;
  options.max_connections = 0;
  EXPECT_THAT(MetricsEndpoint::Start("127.0.0.1:0", &metrics, options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_connections")));
}

}  // namespace
}  // namespace tensorcheck
