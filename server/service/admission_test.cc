// Admission, cancellation and truthful statuses at the gRPC boundary: the
// byte budget on its own, then a service whose one backend ("gated") runs
// until the test releases it or the request's stop signal fires, so that
// full queues, busy budgets, cancels, deadlines and shutdown can be staged
// without timing assumptions.
#include "server/service/admission.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <mutex>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "server/backends/linear_backend.h"
#include "server/engine/engine.h"
#include "server/service/service.h"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"
#include "tensorcheck/v1/tensorcheck.grpc.pb.h"

namespace tensorcheck {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(ByteBudgetTest, AdmitsWithinTheLimitAndReturnsOnRelease) {
  ByteBudget budget(100);
  {
    ByteBudget::Reservation a, b, c;
    EXPECT_EQ(budget.TryReserve(60, &a), ByteBudget::Outcome::kAdmitted);
    EXPECT_EQ(budget.TryReserve(50, &b), ByteBudget::Outcome::kBusy);
    EXPECT_EQ(budget.TryReserve(101, &c), ByteBudget::Outcome::kOverBudget);
    EXPECT_EQ(budget.TryReserve(40, &b), ByteBudget::Outcome::kAdmitted);
    EXPECT_EQ(budget.in_use(), 100);
    EXPECT_EQ(budget.TryResize(&a, 70), ByteBudget::Outcome::kBusy);
    EXPECT_EQ(a.bytes(), 60);
    EXPECT_EQ(budget.TryResize(&a, 10), ByteBudget::Outcome::kAdmitted);
    EXPECT_EQ(budget.in_use(), 50);
    EXPECT_EQ(budget.TryResize(&a, 200), ByteBudget::Outcome::kOverBudget);
    ByteBudget::Reservation moved(std::move(b));
    EXPECT_EQ(budget.in_use(), 50);
  }
  EXPECT_EQ(budget.in_use(), 0);
}

TEST(ByteBudgetTest, ConcurrentReservationsNeverExceedTheLimit) {
  ByteBudget budget(1000);
  std::atomic<int64_t> peak{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20000; ++i) {
        ByteBudget::Reservation r;
        if (budget.TryReserve(100 + 37 * ((i + t) % 7), &r) == ByteBudget::Outcome::kAdmitted) {
          int64_t seen = budget.in_use();
          int64_t p = peak.load();
          while (seen > p && !peak.compare_exchange_weak(p, seen)) {
          }
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_LE(peak.load(), 1000);
  EXPECT_EQ(budget.in_use(), 0);
}

// Runs until released (all runs, or the first `pass` of them) or stopped;
// counts what it saw.
class GatedBackend final : public LinearBackend {
 public:
  absl::string_view name() const override { return "gated"; }
  BackendKind kind() const override { return BackendKind::kHostEmulation; }
  absl::Status Available() const override { return absl::OkStatus(); }
  std::vector<Precision> precisions() const override { return {Precision::kFp32}; }
  std::vector<BiasMode> bias_modes() const override { return {BiasMode::kNone, BiasMode::kFused}; }
  BiasMode default_bias_mode() const override { return BiasMode::kFused; }
  std::vector<DType> storage_dtypes() const override { return {DType::kFloat32}; }
  absl::StatusOr<RunResult> Run(const LinearProblem& p, const Config&,
                                const RunOptions& options) override {
    const int me = ++started;
    while (!released && me > pass) {
      if (absl::Status s = CheckStop(options.stop); !s.ok()) {
        ++stopped;
        return s;
      }
      absl::SleepFor(absl::Milliseconds(2));
    }
    RunResult r;
    auto out = Tensor::Create(p.output_dtype, {p.m, p.n});
    if (!out.ok()) return out.status();
    r.output = *std::move(out);
    return r;
  }
  std::atomic<bool> released{false};
  std::atomic<int> pass{0};
  std::atomic<int> started{0}, stopped{0};
};

v1::Tensor Zeros(std::vector<int64_t> shape) {
  v1::Tensor t;
  t.set_dtype(v1::DTYPE_FLOAT32);
  int64_t n = 1;
  for (int64_t d : shape) {
    t.add_shape(d);
    n *= d;
  }
  t.set_data(std::string(static_cast<size_t>(n) * 4, '\0'));
  return t;
}

v1::VerifyRequest GatedRequest(int64_t k = 4) {
  v1::VerifyRequest r;
  *r.mutable_op()->mutable_input() = Zeros({2, k});
  *r.mutable_op()->mutable_weight() = Zeros({3, k});
  r.set_reference("gated:fp32");
  return r;
}

class GatedServiceTest : public ::testing::Test {
 protected:
  void Start(ServiceOptions options, bool share_computations = true) {
    auto backend = std::make_unique<GatedBackend>();
    gated_ = backend.get();
    ASSERT_TRUE(registry_.Register(std::move(backend)).ok());
    EngineOptions engine_options;
    engine_options.default_reference = "gated:fp32";
    engine_options.share_computations = share_computations;
    auto engine = Engine::Create(engine_options, &registry_);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(engine).value();
    options.on_saturation = [this](bool full) {
      std::lock_guard<std::mutex> lock(saturation_mu_);
      saturation_.push_back(full);
    };
    service_ = std::make_unique<TensorCheckServiceImpl>(engine_.get(), std::move(options));
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.SetMaxReceiveMessageSize(64 << 20);
    builder.RegisterService(service_.get());
    builder.RegisterCallbackGenericService(service_->linear_methods());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    channel_ =
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
  }

  void TearDown() override {
    if (gated_ != nullptr) gated_->released = true;
    if (server_ != nullptr) server_->Shutdown();
  }

  struct Answer {
    grpc::Status status;
    std::string pushback;  // the retry hint, "" when absent
  };

  // As the clients send it: with its size declared
  // (TensorCheckServiceImpl::kRequestBytesKey) unless `declare` is false.
  Answer Verify(const v1::VerifyRequest& r, absl::Duration timeout = absl::Seconds(60),
                grpc::ClientContext* context = nullptr, bool declare = true) {
    grpc::ClientContext own;
    grpc::ClientContext* ctx = context != nullptr ? context : &own;
    ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    if (declare) {
      ctx->AddMetadata(TensorCheckServiceImpl::kRequestBytesKey, std::to_string(r.ByteSizeLong()));
    }
    v1::VerifyResponse response;
    Answer a;
    a.status = v1::TensorCheck::NewStub(channel_)->Verify(ctx, r, &response);
    auto it = ctx->GetServerTrailingMetadata().find(kRetryPushbackKey);
    if (it != ctx->GetServerTrailingMetadata().end()) {
      a.pushback = std::string(it->second.data(), it->second.size());
    }
    return a;
  }

  // Blocks until `count` runs have started on the gated backend.
  void WaitForStarted(int count) {
    while (gated_->started < count) absl::SleepFor(absl::Milliseconds(2));
  }

  BackendRegistry registry_;
  GatedBackend* gated_ = nullptr;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<TensorCheckServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  // What on_saturation said, in order (called on gRPC's and the workers'
  // threads).
  std::vector<bool> Saturation() {
    std::lock_guard<std::mutex> lock(saturation_mu_);
    return saturation_;
  }
  std::mutex saturation_mu_;
  std::vector<bool> saturation_;
};

TEST_F(GatedServiceTest, FullQueueIsUnavailableWithARetryHintAndSaturationRecovers) {
  ServiceOptions options;
  options.workers = 1;
  options.max_queue = 1;
  Start(options);
  auto running = std::async(std::launch::async, [&] { return Verify(GatedRequest()); });
  WaitForStarted(1);
  auto queued = std::async(std::launch::async, [&] { return Verify(GatedRequest()); });
  // The queue holds one; wait until the second is in it.
  while (service_->requests_in_flight() < 2) absl::SleepFor(absl::Milliseconds(2));
  // Full: readiness says so already, before any refusal (it is said just
  // after the second is queued: wait for it).
  while (Saturation().empty() || !Saturation().back()) absl::SleepFor(absl::Milliseconds(2));
  const Answer refused = Verify(GatedRequest());
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(refused.status.error_message(), HasSubstr("queued"));
  ASSERT_FALSE(refused.pushback.empty());
  EXPECT_GE(std::stoll(refused.pushback), 100);
  ASSERT_FALSE(Saturation().empty());
  EXPECT_TRUE(Saturation().front());
  gated_->released = true;
  EXPECT_TRUE(running.get().status.ok());
  EXPECT_TRUE(queued.get().status.ok());
  EXPECT_FALSE(Saturation().back()) << "readiness must recover once the queue has room";
  EXPECT_TRUE(Verify(GatedRequest()).status.ok());
}

TEST_F(GatedServiceTest, GetProgressCountsTheCallersRunsByItsRequestId) {
  // Without sharing, the reference and the configuration run one by one.
  Start(ServiceOptions{}, /*share_computations=*/false);
  auto progress = [&](const std::string& id, v1::GetProgressResponse* out) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    v1::GetProgressRequest req;
    req.set_request_id(id);
    return v1::TensorCheck::NewStub(channel_)->GetProgress(&ctx, req, out);
  };
  v1::VerifyRequest r = GatedRequest();
  r.add_configs("gated:fp32");
  grpc::ClientContext context;
  context.AddMetadata("x-request-id", "ci:job/7");
  auto call =
      std::async(std::launch::async, [&] { return Verify(r, absl::Seconds(60), &context); });
  WaitForStarted(1);  // the reference runs
  v1::GetProgressResponse p;
  ASSERT_TRUE(progress("ci:job/7", &p).ok());
  EXPECT_EQ(p.method(), "Verify");
  EXPECT_EQ(p.phase(), "running the configurations");
  EXPECT_EQ(p.done(), 0);
  EXPECT_EQ(p.total(), 2);  // the reference and gated:fp32
  EXPECT_GE(p.elapsed_seconds(), 0);
  gated_->pass = 1;
  WaitForStarted(2);  // the reference compared, the configuration runs
  ASSERT_TRUE(progress("ci:job/7", &p).ok());
  EXPECT_EQ(p.done(), 1);
  EXPECT_EQ(p.total(), 2);
  // Another id, and one no call could have.
  EXPECT_EQ(progress("ci:job/8", &p).error_code(), grpc::StatusCode::NOT_FOUND);
  const grpc::Status bad = progress("", &p);
  EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(bad.error_message(), HasSubstr("request_id"));
  gated_->released = true;
  EXPECT_TRUE(call.get().status.ok());
  // Finished: no longer in flight.
  EXPECT_EQ(progress("ci:job/7", &p).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(GatedServiceTest, AnExpiredDeadlineIsLoggedAsTheDeadlineNotAsACancel) {
  auto stream = std::make_shared<std::ostringstream>();
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(*stream);
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("capture", sink));
  Start(ServiceOptions{});
  grpc::ClientContext context;
  context.AddMetadata("x-request-id", "expires-7");
  EXPECT_EQ(Verify(GatedRequest(), absl::Milliseconds(300), &context).status.error_code(),
            grpc::StatusCode::DEADLINE_EXCEEDED);
  // The backend saw the stop; the line is written once gRPC is done.
  while (gated_->stopped < 1) absl::SleepFor(absl::Milliseconds(2));
  std::string log;
  while (log.find("expires-7") == std::string::npos) {
    absl::SleepFor(absl::Milliseconds(2));
    sink->flush();
    log = stream->str();
  }
  spdlog::set_default_logger(previous);
  EXPECT_THAT(log, HasSubstr("deadline passed"));
  EXPECT_THAT(log, Not(HasSubstr("cancelled")));
}

TEST_F(GatedServiceTest, ClientCancelStopsTheRunningWork) {
  Start(ServiceOptions{});
  grpc::ClientContext context;
  auto call = std::async(std::launch::async,
                         [&] { return Verify(GatedRequest(), absl::Seconds(60), &context); });
  WaitForStarted(1);
  context.TryCancel();
  EXPECT_EQ(call.get().status.error_code(), grpc::StatusCode::CANCELLED);
  while (gated_->stopped < 1) absl::SleepFor(absl::Milliseconds(2));
  EXPECT_TRUE(service_->WaitForIdle(absl::Now() + absl::Seconds(30)));
  EXPECT_EQ(service_->inflight_bytes(), 0);
}

TEST_F(GatedServiceTest, ClientDeadlineStopsTheRunningWork) {
  Start(ServiceOptions{});
  const Answer a = Verify(GatedRequest(), absl::Milliseconds(300));
  EXPECT_EQ(a.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  while (gated_->stopped < 1) absl::SleepFor(absl::Milliseconds(2));
}

TEST_F(GatedServiceTest, ServerCapStopsRequestsWithoutADeadline) {
  ServiceOptions options;
  options.max_request_time = absl::Milliseconds(200);
  Start(options);
  const Answer a = Verify(GatedRequest(), absl::Hours(1));
  EXPECT_EQ(a.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_THAT(a.status.error_message(), HasSubstr("--max-request-seconds"));
  // The client's answer can come before the run sees its stop (a
  // sanitizer's slowdown showed it): wait for the run, then check that
  // it stopped once.
  while (gated_->stopped < 1) absl::SleepFor(absl::Milliseconds(2));
  EXPECT_TRUE(service_->WaitForIdle(absl::Now() + absl::Seconds(30)));
  EXPECT_EQ(gated_->stopped, 1);
}

TEST_F(GatedServiceTest, ShutdownCancelsWhatOutlivesTheGracePeriod) {
  Start(ServiceOptions{});
  auto call = std::async(std::launch::async, [&] { return Verify(GatedRequest()); });
  WaitForStarted(1);
  service_->StartDraining();
  const Answer refused = Verify(GatedRequest());
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_FALSE(refused.pushback.empty());
  EXPECT_FALSE(service_->WaitForIdle(absl::Now() + absl::Milliseconds(100)));
  service_->CancelAll();
  EXPECT_TRUE(service_->WaitForIdle(absl::Now() + absl::Seconds(30)));
  const Answer cancelled = call.get();
  EXPECT_EQ(cancelled.status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_THAT(cancelled.status.error_message(), HasSubstr("shutting down"));
}

TEST_F(GatedServiceTest, BusyByteBudgetIsResourceExhaustedWithAHintAndOverBudgetWithout) {
  ServiceOptions options;
  options.workers = 2;
  options.max_inflight_bytes = 8 << 20;
  Start(options);
  // A request of 2 x 65536 and 3 x 65536 fp32 zeros (1.25 MiB on the wire,
  // about 6 MiB reserved) runs and holds its reservation.
  auto running = std::async(std::launch::async, [&] { return Verify(GatedRequest(65536)); });
  WaitForStarted(1);
  const Answer busy = Verify(GatedRequest(65536));
  EXPECT_EQ(busy.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(busy.status.error_message(), HasSubstr("retry later"));
  // Not what the running request holds: another tenant's, perhaps.
  EXPECT_THAT(busy.status.error_message(),
              Not(HasSubstr(std::to_string(service_->inflight_bytes()))));
  EXPECT_FALSE(busy.pushback.empty());
  // 5 MiB on the wire needs more than the whole budget: permanent.
  const Answer over = Verify(GatedRequest(262144));
  EXPECT_EQ(over.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(over.status.error_message(), HasSubstr("--max-inflight-bytes"));
  EXPECT_TRUE(over.pushback.empty());
  gated_->released = true;
  EXPECT_TRUE(running.get().status.ok());
  EXPECT_TRUE(service_->WaitForIdle(absl::Now() + absl::Seconds(30)));
  EXPECT_EQ(service_->inflight_bytes(), 0);
  EXPECT_TRUE(Verify(GatedRequest(65536)).status.ok());
}

// Requests are received only once admitted: one that declares its size is
// refused before a byte of it is read when the budget has no room for it
// now, and one that does not is admitted for as much as the message limit
// (within the budget) while it is received, then for what it is.
TEST_F(GatedServiceTest, ARequestIsReceivedOnlyOnceTheBudgetHoldsRoomForIt) {
  ServiceOptions options;
  options.workers = 2;
  options.max_inflight_bytes = 8 << 20;
  Start(options);
  // Without a declared size and nothing in flight: read, then found over
  // the whole budget (permanent), and a small one passes.
  const Answer over = Verify(GatedRequest(262144), absl::Seconds(60), nullptr, /*declare=*/false);
  EXPECT_EQ(over.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(over.status.error_message(), HasSubstr("--max-inflight-bytes"));
  EXPECT_TRUE(over.pushback.empty());
  EXPECT_EQ(service_->inflight_bytes(), 0);
  auto running = std::async(std::launch::async, [&] { return Verify(GatedRequest(65536)); });
  WaitForStarted(1);
  // While it runs, an undeclared request would need the whole budget to be
  // received: busy, with the hint; nothing of it is held.
  const int64_t held = service_->inflight_bytes();
  const Answer undeclared = Verify(GatedRequest(16), absl::Seconds(60), nullptr, /*declare=*/false);
  EXPECT_EQ(undeclared.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_FALSE(undeclared.pushback.empty());
  EXPECT_EQ(service_->inflight_bytes(), held);
  // A small declared one fits beside it.
  gated_->released = true;
  EXPECT_TRUE(running.get().status.ok());
  EXPECT_TRUE(Verify(GatedRequest(16)).status.ok());
  EXPECT_TRUE(Verify(GatedRequest(16), absl::Seconds(60), nullptr, /*declare=*/false).status.ok());
  EXPECT_TRUE(service_->WaitForIdle(absl::Now() + absl::Seconds(30)));
  EXPECT_EQ(service_->inflight_bytes(), 0);
}

// Bytes that are not a VerifyRequest: INVALID_ARGUMENT with a reason (gRPC's
// own deserialisation answered UNIMPLEMENTED with no message).
TEST_F(GatedServiceTest, UnparseableBytesAreInvalidArgument) {
  Start(ServiceOptions{});
  v1::VerifyRequest valid = GatedRequest();
  std::string truncated = valid.SerializeAsString();
  truncated.resize(truncated.size() - 3);
  v1::VerifyRequest bad_utf8 = GatedRequest();
  bad_utf8.set_reference(std::string("gated:\xff\xfe", 8));
  std::string corrupt = std::string("\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 11);
  grpc::GenericStub stub(channel_);
  for (const std::string& bytes : {truncated, bad_utf8.SerializeAsString(), corrupt}) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    grpc::Slice slice(bytes);
    grpc::ByteBuffer request(&slice, 1), response;
    std::promise<grpc::Status> done;
    stub.UnaryCall(&context, "/tensorcheck.v1.TensorCheck/Verify", grpc::StubOptions(), &request,
                   &response, [&](grpc::Status s) { done.set_value(s); });
    const grpc::Status s = done.get_future().get();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("not a valid tensorcheck.v1.VerifyRequest"));
  }
  gated_->released = true;
  EXPECT_TRUE(Verify(valid).status.ok());
}

TEST_F(GatedServiceTest, UnparseableBytesAreInvalidArgumentOnEveryOtherMethodToo) {
  // Not gRPC's bare UNIMPLEMENTED, which a client would read as "no such
  // RPC" (or, from FindMissingTensors, as "no store").
  Start(ServiceOptions{});
  v1::FindMissingTensorsRequest find;
  find.add_digests()->set_hash(std::string(64, 'a'));
  std::string truncated = find.SerializeAsString();
  truncated.resize(truncated.size() - 3);
  const std::string corrupt("\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 11);
  grpc::GenericStub stub(channel_);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"GetCapabilities", "GetCapabilitiesRequest"},
      {"GetProgress", "GetProgressRequest"},
      {"FindMissingTensors", "FindMissingTensorsRequest"},
      {"QueryUploadStatus", "QueryUploadStatusRequest"},
      {"ReadTensor", "ReadTensorRequest"}};
  for (const auto& [method, message] : cases) {
    for (const std::string& bytes : {corrupt, truncated}) {
      if (bytes == truncated && method != "FindMissingTensors") continue;
      SCOPED_TRACE(method);
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
      grpc::Slice slice(bytes);
      grpc::ByteBuffer request(&slice, 1), response;
      std::promise<grpc::Status> done;
      stub.UnaryCall(&context, "/tensorcheck.v1.TensorCheck/" + method, grpc::StubOptions(),
                     &request, &response, [&](grpc::Status s) { done.set_value(s); });
      const grpc::Status s = done.get_future().get();
      EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
      EXPECT_THAT(s.error_message(), HasSubstr("not a valid tensorcheck.v1." + message));
    }
  }
  // And the server serves the well-formed.
  grpc::ClientContext context;
  v1::GetCapabilitiesResponse caps;
  EXPECT_TRUE(v1::TensorCheck::NewStub(channel_)
                  ->GetCapabilities(&context, v1::GetCapabilitiesRequest(), &caps)
                  .ok());
}

}  // namespace
}  // namespace tensorcheck
