// The gRPC service end to end in-process: a TensorCheckServer on a free
// loopback port, driven through the generated stub. Every row of the error
// table (docs/architecture.md) that applies to a CPU host, and the server
// still serving after each.
#include "server/service/service.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "server/backends/linear_backend.h"
#include "server/engine/engine.h"
#include "server/service/request_id.h"
#include "server/service/server.h"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"
#include "tensorcheck/v1/tensorcheck.grpc.pb.h"

namespace tensorcheck {
namespace {

using ::testing::HasSubstr;

v1::Tensor Fp32(std::vector<int64_t> shape, const std::vector<float>& values) {
  v1::Tensor t;
  t.set_dtype(v1::DTYPE_FLOAT32);
  for (int64_t d : shape) t.add_shape(d);
  t.set_data(
      std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float)));
  return t;
}

std::vector<float> RandomValues(size_t n, uint32_t seed, double stddev = 1.0) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, static_cast<float>(stddev));
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

class ServiceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ServerOptions options;
    options.host = "127.0.0.1";
    options.port = 0;
    options.engine.limits.max_message_bytes = 8 << 20;
    options.workers = 2;
    auto server = TensorCheckServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(server).value().release();
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);
    args.SetMaxSendMessageSize(64 << 20);
    channel_ =
        grpc::CreateCustomChannel(server_->address(), grpc::InsecureChannelCredentials(), args);
  }
  static void TearDownTestSuite() {
    channel_.reset();
    server_->Shutdown(absl::Seconds(5));
    server_->Wait();
    delete server_;
  }

  std::shared_ptr<grpc::Channel> Channel() { return channel_; }

  // A valid 2x8 -> 3 request with bias.
  v1::VerifyRequest Valid() {
    v1::VerifyRequest r;
    *r.mutable_op()->mutable_input() = Fp32({2, 8}, RandomValues(16, 1));
    *r.mutable_op()->mutable_weight() = Fp32({3, 8}, RandomValues(24, 2, 0.35));
    *r.mutable_op()->mutable_bias() = Fp32({3}, RandomValues(3, 3));
    r.add_configs("cpu:fp32");
    return r;
  }

  grpc::Status Verify(const v1::VerifyRequest& request, v1::VerifyResponse* response) {
    auto stub = v1::TensorCheck::NewStub(Channel());
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    return stub->Verify(&context, request, response);
  }

  // The error, then proof the server still answers a good request.
  void ExpectError(const v1::VerifyRequest& request, grpc::StatusCode code,
                   const std::string& field) {
    v1::VerifyResponse response;
    const grpc::Status status = Verify(request, &response);
    EXPECT_EQ(status.error_code(), code) << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr(field));
    v1::VerifyResponse ok;
    ASSERT_TRUE(Verify(Valid(), &ok).ok());
    EXPECT_EQ(ok.verdict(), v1::VERDICT_PASS);
  }

  static TensorCheckServer* server_;
  static std::shared_ptr<grpc::Channel> channel_;
};

TensorCheckServer* ServiceTest::server_ = nullptr;
std::shared_ptr<grpc::Channel> ServiceTest::channel_;

TEST_F(ServiceTest, ValidRequestReturnsStatisticsAgainstFp64) {
  v1::VerifyRequest request = Valid();
  // Observed: the fp64 result of the same tensors, rounded to fp32.
  const auto& x = request.op().input().data();
  const auto& w = request.op().weight().data();
  const auto& b = request.op().bias().data();
  auto at = [](const std::string& bytes, int i) {
    float f;
    std::memcpy(&f, bytes.data() + 4 * i, 4);
    return static_cast<double>(f);
  };
  std::vector<float> y(6);
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 3; ++j) {
      double acc = at(b, j);
      for (int k = 0; k < 8; ++k) acc += at(x, i * 8 + k) * at(w, j * 8 + k);
      y[i * 3 + j] = static_cast<float>(acc);
    }
  }
  *request.mutable_observed() = Fp32({2, 3}, y);
  request.add_configs("cpu:tf32:unfused");
  v1::VerifyResponse response;
  ASSERT_TRUE(Verify(request, &response).ok());
  EXPECT_EQ(response.verdict(), v1::VERDICT_PASS);
  ASSERT_EQ(response.results_size(), 2);
  EXPECT_EQ(response.results(0).config(), "cpu:fp32:fused");
  EXPECT_EQ(response.results(1).config(), "cpu:tf32:unfused");
  EXPECT_EQ(response.reference().config(), "cpu:fp64:fused");
  EXPECT_TRUE(response.observed_vs_reference().bitwise_equal());
  EXPECT_EQ(response.observed_vs_reference().total(), 6);
  EXPECT_EQ(response.tolerance().preset(), v1::Tolerance::PRESET_TORCH);
  EXPECT_DOUBLE_EQ(response.tolerance().atol().value(), 1e-5);
  EXPECT_DOUBLE_EQ(response.tolerance().rtol().value(), 1.3e-6);
  EXPECT_THAT(response.output_shape(), ::testing::ElementsAre(2, 3));
  EXPECT_TRUE(response.results(0).has_vs_observed());
}

TEST_F(ServiceTest, ReturnOutputsSendsTensorsBack) {
  v1::VerifyRequest request = Valid();
  request.mutable_output()->set_return_outputs(true);
  v1::VerifyResponse response;
  ASSERT_TRUE(Verify(request, &response).ok());
  const v1::Tensor& out = response.results(0).output();
  EXPECT_EQ(out.dtype(), v1::DTYPE_FLOAT32);
  EXPECT_THAT(out.shape(), ::testing::ElementsAre(2, 3));
  EXPECT_EQ(out.data().size(), 6 * sizeof(float));
}

TEST_F(ServiceTest, MissingOpIsInvalidArgument) {
  v1::VerifyRequest r;
  ExpectError(r, grpc::StatusCode::INVALID_ARGUMENT, "op");
}

TEST_F(ServiceTest, UnknownDtypeIsInvalidArgument) {
  v1::VerifyRequest r = Valid();
  r.mutable_op()->mutable_input()->set_dtype(static_cast<v1::DType>(42));
  ExpectError(r, grpc::StatusCode::INVALID_ARGUMENT, "op.input.dtype");
  r = Valid();
  r.mutable_op()->mutable_weight()->set_dtype(v1::DTYPE_UNSPECIFIED);
  ExpectError(r, grpc::StatusCode::INVALID_ARGUMENT, "op.weight.dtype");
}

TEST_F(ServiceTest, UnknownEnumValuesAreInvalidArgument) {
  v1::VerifyRequest r = Valid();
  r.mutable_op()->set_activation(static_cast<v1::Activation>(9));
  ExpectError(r, grpc::StatusCode::INVALID_ARGUMENT, "op.activation");
  r = Valid();
  r.mutable_op()->set_weight_layout(static_cast<v1::WeightLayout>(7));
  ExpectError(r, grpc::StatusCode::INVALID_ARGUMENT, "op.weight_layout");
  r = Valid();
  r.mutable_tolerance()->set_preset(static_cast<v1::Tolerance::Preset>(99));
  ExpectError(r, grpc::StatusCode::INVALID_ARGUMENT, "tolerance.preset");
}

TEST_F(ServiceTest, DataLengthNotNumelTimesItemsizeIsInvalidArgument) {
  v1::VerifyRequest r = Valid();
  r.mutable_op()->mutable_input()->mutable_data()->pop_back();
  ExpectError(r, grpc::StatusCode::INVALID_ARGUMENT, "op.input.data: 64 bytes expected");
}

TEST_F(ServiceTest, KMismatchIsInvalidArgument) {
  v1::VerifyRequest r = Valid();
  *r.mutable_op()->mutable_weight() = Fp32({3, 7}, RandomValues(21, 2));
  ExpectError(r, grpc::StatusCode::INVALID_ARGUMENT, "op.weight.shape");
}

TEST_F(ServiceTest, RankMismatchIsInvalidArgument) {
  v1::VerifyRequest r = Valid();
  *r.mutable_op()->mutable_weight() = Fp32({3, 8, 1}, RandomValues(24, 2));
  ExpectError(r, grpc::StatusCode::INVALID_ARGUMENT, "op.weight.shape");
}

TEST_F(ServiceTest, BiasLengthNotNIsInvalidArgument) {
  v1::VerifyRequest r = Valid();
  *r.mutable_op()->mutable_bias() = Fp32({4}, RandomValues(4, 3));
  ExpectError(r, grpc::StatusCode::INVALID_ARGUMENT, "op.bias.shape");
}

TEST_F(ServiceTest, NegativeDimensionIsInvalidArgument) {
  v1::VerifyRequest r = Valid();
  r.mutable_op()->mutable_input()->set_shape(0, -2);
  ExpectError(r, grpc::StatusCode::INVALID_ARGUMENT, "op.input.shape[0]");
}

TEST_F(ServiceTest, OverflowingDimensionsAreRejectedBeforeAllocating) {
  v1::VerifyRequest r = Valid();
  v1::Tensor* x = r.mutable_op()->mutable_input();
  x->clear_shape();
  x->add_shape(int64_t{1} << 40);
  x->add_shape(int64_t{1} << 40);
  v1::VerifyResponse response;
  const grpc::Status status = Verify(r, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("op.input.shape"));
  ExpectError(Valid(), grpc::StatusCode::OK, "");
}

// A declared shape that does not describe the bytes sent is
// INVALID_ARGUMENT however large it is (it used to be RESOURCE_EXHAUSTED
// past the size limit and INVALID_ARGUMENT under it).
TEST_F(ServiceTest, HugeDeclaredShapeWithLittleDataIsInvalidArgumentWhateverItsSize) {
  for (std::vector<int64_t> shape : std::vector<std::vector<int64_t>>{
           {2, 9}, {1 << 20, 8}, {int64_t{1} << 20, int64_t{1} << 20}, {int64_t{1} << 40, 8}}) {
    v1::VerifyRequest r = Valid();
    v1::Tensor* x = r.mutable_op()->mutable_input();
    x->clear_shape();
    for (int64_t d : shape) x->add_shape(d);
    ExpectError(r, grpc::StatusCode::INVALID_ARGUMENT, "op.input.data");
  }
}

TEST_F(ServiceTest, RankAboveLimitIsInvalidArgument) {
  v1::VerifyRequest r = Valid();
  v1::Tensor* x = r.mutable_op()->mutable_input();
  x->clear_shape();
  for (int i = 0; i < 9; ++i) x->add_shape(1);
  ExpectError(r, grpc::StatusCode::INVALID_ARGUMENT, "op.input.shape");
}

TEST_F(ServiceTest, TooManyConfigurationsIsInvalidArgument) {
  v1::VerifyRequest r = Valid();
  for (int i = 0; i < 100; ++i) r.add_configs("cpu:fp32");
  ExpectError(r, grpc::StatusCode::INVALID_ARGUMENT, "configs");
}

TEST_F(ServiceTest, MalformedConfigurationIsInvalidArgument) {
  v1::VerifyRequest r = Valid();
  r.add_configs("cpu");
  ExpectError(r, grpc::StatusCode::INVALID_ARGUMENT, "configs[1]");
}

TEST_F(ServiceTest, UnknownBackendIsNotFound) {
  v1::VerifyRequest r = Valid();
  r.set_reference("tpu:fp64");
  ExpectError(r, grpc::StatusCode::NOT_FOUND, "tpu");
}

TEST_F(ServiceTest, AMalformedDigestIsInvalidArgumentNamingTheField) {
  v1::VerifyRequest r = Valid();
  r.mutable_op()->mutable_weight()->set_digest("sha256:abcd");
  ExpectError(r, grpc::StatusCode::INVALID_ARGUMENT, "op.weight.digest");
}

TEST_F(ServiceTest, ADigestTheStoreLacksIsFailedPreconditionNamingIt) {
  // (store_calls_test.cc checks the machine-readable detail.)
  v1::VerifyRequest r = Valid();
  const std::string hash(64, 'a');
  r.mutable_op()->mutable_weight()->set_digest(hash);  // the prefix may be left out
  ExpectError(r, grpc::StatusCode::FAILED_PRECONDITION, "op.weight sha256:" + hash + " (96 bytes)");
}

TEST_F(ServiceTest, TensorOverTheLimitIsResourceExhausted) {
  // 8 MiB server limit: a 3 MiB-element fp32 input (12 MiB) cannot fit in
  // a message, and a tensor just under the message size but over the
  // per-tensor limit is refused by shape before its bytes are read.
  v1::VerifyRequest r = Valid();
  v1::Tensor* x = r.mutable_op()->mutable_input();
  x->clear_shape();
  x->add_shape(1024);
  x->add_shape(3 * 1024);
  x->set_data(std::string(12 << 20, '\0'));
  v1::VerifyResponse response;
  const grpc::Status status = Verify(r, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  ExpectError(Valid(), grpc::StatusCode::OK, "");
}

TEST_F(ServiceTest, DiagnoseNamesTheConfigurationThatProducedTheOutput) {
  v1::VerifyRequest r = Valid();
  r.clear_configs();
  // Observed: what the server's own cpu:bf16:unfused computes is not
  // independent; instead ask for the strict fp32 run and send it back as
  // the observed output with the candidates listed explicitly.
  r.mutable_output()->set_return_outputs(true);
  r.add_configs("cpu:fp32:unfused");
  v1::VerifyResponse first;
  ASSERT_TRUE(Verify(r, &first).ok());
  v1::VerifyRequest d = Valid();
  d.clear_configs();
  *d.mutable_observed() = first.results(0).output();
  auto stub = v1::TensorCheck::NewStub(Channel());
  grpc::ClientContext context;
  v1::VerifyResponse response;
  ASSERT_TRUE(stub->Diagnose(&context, d, &response).ok());
  ASSERT_TRUE(response.has_diagnosis());
  EXPECT_FALSE(response.diagnosis().best().empty());
  EXPECT_GT(response.diagnosis().ranking_size(), 4);
  EXPECT_FALSE(response.diagnosis().explanation().empty());
}

// Compare over the wire: the same output of one layer (summed in fp64,
// rounded once: rounding of either candidate) under two names; the
// headline carries what the two diagnoses say, and bad requests name
// their field while the server keeps serving.
TEST_F(ServiceTest, CompareAnswersTwoNamedOutputsAndNamesBadFields) {
  const v1::VerifyRequest layer = Valid();
  const std::vector<float> x = RandomValues(16, 1), w = RandomValues(24, 2, 0.35),
                           b = RandomValues(3, 3);
  std::vector<float> y(6);
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 3; ++j) {
      double acc = b[j];
      for (int k = 0; k < 8; ++k) acc += double(x[i * 8 + k]) * double(w[j * 8 + k]);
      y[i * 3 + j] = static_cast<float>(acc);
    }
  }
  v1::CompareRequest r;
  *r.mutable_op() = layer.op();
  r.add_configs("cpu:fp32:fused");
  r.add_configs("cpu:fp64:fused");
  v1::NamedTensor* a = r.add_observed();
  a->set_name("torch");
  *a->mutable_tensor() = Fp32({2, 3}, y);
  v1::NamedTensor* c = r.add_observed();
  c->set_name("candle");
  *c->mutable_tensor() = Fp32({2, 3}, y);
  auto stub = v1::TensorCheck::NewStub(Channel());
  {
    grpc::ClientContext context;
    v1::CompareResponse response;
    const grpc::Status status = stub->Compare(&context, r, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    ASSERT_EQ(response.outputs_size(), 2);
    EXPECT_EQ(response.outputs(0).name(), "torch");
    EXPECT_EQ(response.pair().a(), "torch");
    EXPECT_EQ(response.pair().stats().max_abs(), 0.0);  // the same bytes
    EXPECT_TRUE(response.pair().rounding());
    EXPECT_THAT(response.headline(), HasSubstr("torch and candle are both"));
    EXPECT_FALSE(response.outputs(1).diagnosis().headline().empty());
    EXPECT_EQ(response.reference(), "cpu:fp64:fused");
  }
  r.mutable_observed(1)->set_name("torch");
  {
    grpc::ClientContext context;
    v1::CompareResponse response;
    const grpc::Status status = stub->Compare(&context, r, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(status.error_message(), HasSubstr("observed[1].name"));
  }
  r.mutable_observed(1)->set_name("candle");
  *r.mutable_observed(1)->mutable_tensor() = Fp32({3, 2}, y);
  {
    grpc::ClientContext context;
    v1::CompareResponse response;
    const grpc::Status status = stub->Compare(&context, r, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(status.error_message(), HasSubstr("observed[1] (candle): observed.shape"));
  }
  v1::VerifyResponse ok;
  ASSERT_TRUE(Verify(Valid(), &ok).ok());
}

// The response's x-request-id (initial metadata), "" when absent.
std::string RequestIdOf(const grpc::ClientContext& context) {
  const auto& md = context.GetServerInitialMetadata();
  auto it = md.find(kRequestIdKey);
  return it == md.end() ? std::string() : std::string(it->second.data(), it->second.size());
}

bool IsNewRequestId(const std::string& id) {
  return id.size() == 32 && id.find_first_not_of("0123456789abcdef") == std::string::npos;
}

TEST(RequestIdTest, UsableIdsAreShortAndSafe) {
  EXPECT_TRUE(UsableRequestId("ci-job-42/step.3:a_b"));
  EXPECT_FALSE(UsableRequestId(""));
  EXPECT_FALSE(UsableRequestId("has space"));
  EXPECT_FALSE(UsableRequestId("quote\""));
  EXPECT_FALSE(UsableRequestId(std::string(kMaxRequestIdLength + 1, 'a')));
  EXPECT_TRUE(UsableRequestId(std::string(kMaxRequestIdLength, 'a')));
  const std::string a = NewRequestId(), b = NewRequestId();
  EXPECT_TRUE(IsNewRequestId(a)) << a;
  EXPECT_NE(a, b);
}

TEST_F(ServiceTest, RequestIdIsTheClientsOrANewOneAndComesBack) {
  auto stub = v1::TensorCheck::NewStub(Channel());
  v1::VerifyResponse response;
  {
    grpc::ClientContext context;
    context.AddMetadata(kRequestIdKey, "ci-job-42/step.3");
    ASSERT_TRUE(stub->Verify(&context, Valid(), &response).ok());
    EXPECT_EQ(RequestIdOf(context), "ci-job-42/step.3");
  }
  std::string first;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub->Verify(&context, Valid(), &response).ok());
    first = RequestIdOf(context);
    EXPECT_TRUE(IsNewRequestId(first)) << first;
  }
  {
    // An unusable id is replaced, and a failed call has one too.
    grpc::ClientContext context;
    context.AddMetadata(kRequestIdKey, "not usable");
    v1::VerifyRequest bad = Valid();
    bad.clear_op();
    EXPECT_EQ(stub->Verify(&context, bad, &response).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
    const std::string id = RequestIdOf(context);
    EXPECT_TRUE(IsNewRequestId(id)) << id;
    EXPECT_NE(id, first);
  }
  {
    grpc::ClientContext context;
    context.AddMetadata(kRequestIdKey, "caps-1");
    v1::GetCapabilitiesResponse caps;
    ASSERT_TRUE(stub->GetCapabilities(&context, v1::GetCapabilitiesRequest(), &caps).ok());
    EXPECT_EQ(RequestIdOf(context), "caps-1");
  }
}

// The call's log line carries its id.
TEST_F(ServiceTest, TheRequestsLogLineCarriesItsId) {
  auto stream = std::make_shared<std::ostringstream>();
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(*stream);
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("capture", sink));
  auto stub = v1::TensorCheck::NewStub(Channel());
  grpc::ClientContext context;
  context.AddMetadata(kRequestIdKey, "log-line-id-7");
  v1::VerifyResponse response;
  ASSERT_TRUE(stub->Verify(&context, Valid(), &response).ok());
  // The line is written when gRPC is done with the call, just after the
  // client has its response: wait for it (up to 10 s).
  bool found = false;
  for (int i = 0; i < 1000 && !found; ++i) {
    sink->flush();
    found = stream->str().find("log-line-id-7") != std::string::npos;
    if (!found) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  spdlog::set_default_logger(previous);
  EXPECT_TRUE(found) << stream->str();
  EXPECT_THAT(stream->str(), HasSubstr("request_id"));
}

TEST_F(ServiceTest, CapabilitiesListTheCpuBackendAndLimits) {
  auto stub = v1::TensorCheck::NewStub(Channel());
  grpc::ClientContext context;
  v1::GetCapabilitiesResponse response;
  ASSERT_TRUE(stub->GetCapabilities(&context, v1::GetCapabilitiesRequest(), &response).ok());
  EXPECT_EQ(response.server_version(), kServerVersion);
  EXPECT_EQ(response.default_reference(), "cpu:fp64");
  ASSERT_GE(response.backends_size(), 1);
  const v1::BackendInfo& cpu = response.backends(0);
  EXPECT_EQ(cpu.name(), "cpu");
  EXPECT_TRUE(cpu.available());
  EXPECT_THAT(cpu.precisions(),
              ::testing::UnorderedElementsAre(
                  "fp64", "fp32", "tf32", "tf32rna", "tf32trunc", "bf16", "fp16", "fp16acc",
                  "fp8e4m3", "fp8e5m2", "fp8e4m3e5m2", "fp8e5m2e4m3", "bf16x3", "bf16x6", "bf16x9",
                  "tf32x3", "mxfp8e4m3", "mxfp8e5m2", "nvfp4"));
  EXPECT_THAT(cpu.configs(), ::testing::Contains("cpu:tf32:unfused"));
  for (const char* c : {"cpu:fp8e4m3:fused@scaling=block128,fast_accum",
                        "cpu:mxfp8e4m3:unfused@scaling=rceil", "cpu:nvfp4:fused"}) {
    EXPECT_THAT(cpu.configs(), ::testing::Contains(c));
  }
  EXPECT_EQ(response.limits().max_tensor_bytes(), 8 << 20);
  for (const v1::BackendInfo& b : response.backends()) {
    if (b.name() != "cpu" && !b.available()) {
      EXPECT_FALSE(b.unavailable_reason().empty()) << b.name();
    }
  }
}

TEST_F(ServiceTest, UnavailableGpuBackendIsFailedPreconditionWithTheReason) {
  auto stub = v1::TensorCheck::NewStub(Channel());
  grpc::ClientContext context;
  v1::GetCapabilitiesResponse caps;
  ASSERT_TRUE(stub->GetCapabilities(&context, v1::GetCapabilitiesRequest(), &caps).ok());
  for (const v1::BackendInfo& b : caps.backends()) {
    if (b.available()) continue;
    v1::VerifyRequest r = Valid();
    r.add_configs(b.name() + ":fp32");
    ExpectError(r, grpc::StatusCode::FAILED_PRECONDITION, "not available on this host");
  }
}

TEST_F(ServiceTest, HealthIsServing) {
  auto stub = grpc::health::v1::Health::NewStub(Channel());
  for (const char* service : {"", "tensorcheck.v1.TensorCheck"}) {
    grpc::ClientContext context;
    grpc::health::v1::HealthCheckRequest request;
    request.set_service(service);
    grpc::health::v1::HealthCheckResponse response;
    ASSERT_TRUE(stub->Check(&context, request, &response).ok());
    EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  }
}

}  // namespace
}  // namespace tensorcheck

namespace tensorcheck {
namespace {

// A backend whose every run fails with the error the test sets (a stand-in
// for a device). The test sets it between calls on its own thread while
// runs read it on a worker: a mutex orders them, which the gRPC round trip
// between them does too but ThreadSanitizer cannot see through Debian's
// uninstrumented gRPC.
class FailingBackend final : public LinearBackend {
 public:
  absl::string_view name() const override { return "failing"; }
  BackendKind kind() const override { return BackendKind::kDevice; }
  absl::Status Available() const override { return absl::OkStatus(); }
  std::vector<Precision> precisions() const override { return {Precision::kFp32}; }
  std::vector<BiasMode> bias_modes() const override { return {BiasMode::kNone, BiasMode::kFused}; }
  BiasMode default_bias_mode() const override { return BiasMode::kFused; }
  std::vector<DType> storage_dtypes() const override { return {DType::kFloat32}; }
  absl::StatusOr<RunResult> Run(const LinearProblem&, const Config&, const RunOptions&) override {
    std::lock_guard<std::mutex> lock(mu_);
    return error_;
  }
  void set_error(absl::Status error) {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = std::move(error);
  }

 private:
  std::mutex mu_;
  absl::Status error_;
};

// The service reacts to the typed fatal-device-error mark, carried through
// the engine's context prefixes, and never to a phrase in a message.
TEST(ServiceFatalErrorTest, OnlyAMarkedFatalDeviceErrorCallsOnFatalOnce) {
  BackendRegistry registry;
  ASSERT_TRUE(RegisterBuiltinBackends(&registry).ok());
  auto backend = std::make_unique<FailingBackend>();
  FailingBackend* failing = backend.get();
  ASSERT_TRUE(registry.Register(std::move(backend)).ok());
  auto engine = Engine::Create(EngineOptions{}, &registry);
  ASSERT_TRUE(engine.ok());
  // Written on a worker, read here once the answer came back over the
  // socket: an ordering ThreadSanitizer cannot see, hence the lock.
  std::mutex fatal_mu;
  std::vector<absl::Status> fatal_calls;
  auto fatal = [&] {
    std::lock_guard<std::mutex> lock(fatal_mu);
    return fatal_calls;
  };
  ServiceOptions options;
  options.on_fatal = [&](const absl::Status& s) {
    std::lock_guard<std::mutex> lock(fatal_mu);
    fatal_calls.push_back(s);
  };
  TensorCheckServiceImpl service(engine->get(), options);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  builder.RegisterCallbackGenericService(service.linear_methods());
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  auto stub = v1::TensorCheck::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  auto verify = [&]() {
    v1::VerifyRequest r;
    *r.mutable_op()->mutable_input() = Fp32({2, 4}, RandomValues(8, 1));
    *r.mutable_op()->mutable_weight() = Fp32({3, 4}, RandomValues(12, 2));
    r.add_configs("failing:fp32");
    v1::VerifyResponse response;
    grpc::ClientContext context;
    return stub->Verify(&context, r, &response);
  };

  // The words without the mark: an ordinary INTERNAL error.
  failing->set_error(absl::InternalError("sticky CUDA error: cudaMemcpy: made up"));
  EXPECT_EQ(verify().error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_TRUE(fatal().empty());

  failing->set_error(MarkFatalDeviceError(absl::InternalError("cudaMemcpy: illegal address")));
  const grpc::Status status = verify();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_THAT(status.error_message(), HasSubstr("configuration failing:fp32:none"));
  ASSERT_EQ(fatal().size(), 1u);
  EXPECT_TRUE(IsFatalDeviceError(fatal()[0]));
  verify();  // reported once
  EXPECT_EQ(fatal().size(), 1u);
  server->Shutdown();
}

}  // namespace
}  // namespace tensorcheck
