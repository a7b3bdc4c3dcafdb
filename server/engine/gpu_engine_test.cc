// A whole request on the GPU (docs/architecture.md, "A request on the
// device"), through the engine with the built-in backends. Tests named
// Gpu* need a CUDA device and skip without one; tests/gpu/run.sh runs
// this binary beside cuda_backends_test.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "server/engine/engine.h"
#include "tests/testing/stats_testing.h"
#include "tests/testing/status_matchers.h"

namespace tensorcheck {
namespace {

using ::tensorcheck::testing::IsOk;
using ::tensorcheck::testing::RandomNormal;

class GpuEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_THAT(RegisterBuiltinBackends(&registry_), IsOk());
    auto lt = registry_.Find("cublaslt");
    if (!lt.ok() || !(*lt)->Available().ok()) {
      GTEST_SKIP() << "no CUDA device: " << (lt.ok() ? (*lt)->Available().message() : "no build");
    }
    engine_ = MakeEngine(/*device_sessions=*/true);
  }

  std::unique_ptr<Engine> MakeEngine(bool device_sessions) {
    EngineOptions options;
    options.device_sessions = device_sessions;
    auto engine = Engine::Create(options, &registry_);
    EXPECT_THAT(engine, IsOk());
    return engine.ok() ? *std::move(engine) : nullptr;
  }

  // A bf16 layer with a bias and an observed output (PyTorch's semantics,
  // computed by cublaslt), the shape of a transformer's projection.
  LinearRequest Request(int64_t m = 128, int64_t k = 1024, int64_t n = 768) {
    LinearRequest r;
    r.input = RandomNormal({m, k}, 1.0, 71, DType::kBFloat16);
    r.weight = RandomNormal({n, k}, 1.0 / std::sqrt(double(k)), 72, DType::kBFloat16);
    r.bias = RandomNormal({n}, 0.5, 73, DType::kBFloat16);
    LinearProblem p;
    p.input = &r.input;
    p.weight = &r.weight;
    p.bias = &*r.bias;
    p.output_dtype = DType::kBFloat16;
    p.m = m;
    p.k = k;
    p.n = n;
    auto observed = (*registry_.Find("cublas"))
                        ->Run(p, Config{"cublas", Precision::kBf16, BiasMode::kUnfused}, {});
    EXPECT_THAT(observed, IsOk());
    if (observed.ok()) {
      r.observed = std::move(observed->output);
      EXPECT_THAT(r.observed->Reshape({m, n}), IsOk());
    }
    r.configs = {"cublaslt:bf16", "cublas:bf16", "cublaslt:fp32", "cublas:tf32rna"};
    return r;
  }

  BackendRegistry registry_;
  std::unique_ptr<Engine> engine_;
};

TEST_F(GpuEngineTest, GpuDefaultReferenceIsTheDevicesFp64) {
  EXPECT_EQ(engine_->options().default_reference, "cublaslt:fp64");
  auto out = engine_->Verify(Request());
  ASSERT_THAT(out, IsOk());
  EXPECT_EQ(out->reference.config, "cublaslt:fp64:fused");
  EXPECT_EQ(out->reference.details.at("session"), "device");
  EXPECT_EQ(out->reference.details.at("session_uploads"), "4");
  EXPECT_EQ(out->reference.details.at("session_downloads"), "0");
}

// The device session computes what the host way computes with the same
// GPU runs: statistics of the outputs exactly, those that read the error
// model (computed from fp32 GEMMs in another order) within 1e-4.
TEST_F(GpuEngineTest, GpuRequestOnTheDeviceMatchesTheHostWay) {
  const LinearRequest r = Request();
  auto device = engine_->Verify(r);
  ASSERT_THAT(device, IsOk());
  auto host = MakeEngine(/*device_sessions=*/false)->Verify(r);
  ASSERT_THAT(host, IsOk());
  ASSERT_EQ(device->results.size(), host->results.size());
  std::printf("| configuration | bitwise vs observed | bound_ratio device | host |\n");
  for (size_t i = 0; i < host->results.size(); ++i) {
    const ConfigOutcome& d = device->results[i];
    const ConfigOutcome& h = host->results[i];
    SCOPED_TRACE(h.config);
    EXPECT_EQ(d.vs_reference.bitwise_equal_count, h.vs_reference.bitwise_equal_count);
    EXPECT_EQ(d.vs_reference.max_ulp, h.vs_reference.max_ulp);
    EXPECT_EQ(d.vs_reference.max_abs, h.vs_reference.max_abs);
    EXPECT_EQ(d.vs_observed->bitwise_equal_count, h.vs_observed->bitwise_equal_count);
    ASSERT_TRUE(d.vs_reference.bound_ratio && h.vs_reference.bound_ratio);
    EXPECT_NEAR(*d.vs_reference.bound_ratio, *h.vs_reference.bound_ratio,
                1e-4 * *h.vs_reference.bound_ratio);
    std::printf("| %s | %lld | %.6g | %.6g |\n", h.config.c_str(),
                static_cast<long long>(d.vs_observed->bitwise_equal_count),
                *d.vs_reference.bound_ratio, *h.vs_reference.bound_ratio);
  }
}

TEST_F(GpuEngineTest, GpuSecondRequestFindsTheWeightResident) {
  LinearRequest r = Request();
  r.weight.set_content_id("sha256:gpu-engine-test-weight");
  auto first = engine_->Verify(r);
  ASSERT_THAT(first, IsOk());
  auto second = engine_->Verify(r);
  ASSERT_THAT(second, IsOk());
  EXPECT_EQ(second->reference.details.at("session_resident_hits"), "1");
  EXPECT_EQ(second->reference.details.at("session_uploads"), "3");
  for (size_t i = 0; i < first->results.size(); ++i) {
    EXPECT_EQ(first->results[i].vs_observed->bitwise_equal_count,
              second->results[i].vs_observed->bitwise_equal_count);
  }
}

// Eight requests at once, then the same request alone: the same bits. The
// weight has a content id and every thread is started before any request
// has run, so they all miss the resident key together, each fills its own
// copy and all but one lose the insert race (CudaSession::Resident): the
// loser's copy must not be freed while it is still being written. Each
// configuration runs three times, so `deterministic` compares real repeats.
TEST_F(GpuEngineTest, GpuResultsDoNotDependOnConcurrency) {
  LinearRequest r = Request();
  r.return_outputs = true;
  r.repeat = 3;
  r.weight.set_content_id("sha256:gpu-engine-test-concurrency-weight");
  std::vector<std::optional<absl::StatusOr<VerifyOutcome>>> outs(8);
  std::mutex mu;
  std::condition_variable go_cv;
  bool go = false;
  std::vector<std::thread> threads;
  for (size_t t = 0; t < outs.size(); ++t) {
    threads.emplace_back([&, t] {
      {
        std::unique_lock<std::mutex> lock(mu);
        go_cv.wait(lock, [&] { return go; });
      }
      outs[t].emplace(engine_->Verify(r));
    });
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    go = true;
  }
  go_cv.notify_all();
  for (std::thread& t : threads) t.join();
  auto alone = engine_->Verify(r);
  ASSERT_THAT(alone, IsOk());
  EXPECT_EQ(alone->reference.details.at("session_resident_hits"), "1");
  for (const auto& maybe : outs) {
    ASSERT_TRUE(maybe.has_value());
    const absl::StatusOr<VerifyOutcome>& out = *maybe;
    ASSERT_THAT(out, IsOk());
    for (size_t i = 0; i < alone->results.size(); ++i) {
      const Tensor& a = *alone->results[i].output;
      const Tensor& b = *out->results[i].output;
      ASSERT_EQ(a.nbytes(), b.nbytes());
      EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0) << alone->results[i].config;
      EXPECT_TRUE(out->results[i].deterministic) << alone->results[i].config;
      EXPECT_EQ(out->results[i].vs_observed->bitwise_equal_count,
                alone->results[i].vs_observed->bitwise_equal_count);
    }
  }
}

TEST_F(GpuEngineTest, GpuDiagnoseRunsEveryDefaultCandidateOnTheDevice) {
  LinearRequest r = Request(64, 512, 256);
  r.configs.clear();
  auto out = engine_->Diagnose(r);
  ASSERT_THAT(out, IsOk());
  for (const ConfigOutcome& o : out->results) {
    EXPECT_THAT(o.config, ::testing::StartsWith("cublas")) << o.config;
  }
  EXPECT_EQ(out->reference.details.at("session"), "device");
  ASSERT_TRUE(out->diagnosis.has_value());
  ASSERT_TRUE(out->diagnosis->best.has_value()) << out->diagnosis->explanation;
  EXPECT_EQ(*out->diagnosis->best, "cublas:bf16:unfused") << out->diagnosis->explanation;
}

// The diagnosis's passes on the device (diagnosis_kernels.cu) against the
// host's over the same GPU outputs (the host way downloads them): the
// integer evidence exactly, the floating sums to rounding, and nothing
// downloaded on the device.
TEST_F(GpuEngineTest, GpuDiagnosisPassesOnTheDeviceMatchTheHosts) {
  LinearRequest r = Request(64, 512, 256);
  r.configs.clear();
  auto device = engine_->Diagnose(r);
  ASSERT_THAT(device, IsOk());
  EXPECT_EQ(device->reference.details.at("session_downloads"), "0");
  EXPECT_NE(device->reference.details.at("session_diagnosis_passes"), "0");
  auto host = MakeEngine(/*device_sessions=*/false)->Diagnose(r);
  ASSERT_THAT(host, IsOk());
  ASSERT_TRUE(device->diagnosis.has_value() && host->diagnosis.has_value());
  EXPECT_EQ(device->diagnosis->best, host->diagnosis->best);
  ASSERT_EQ(device->diagnosis->ranking.size(), host->diagnosis->ranking.size());
  for (size_t i = 0; i < host->diagnosis->ranking.size(); ++i) {
    const RankedCandidate& d = device->diagnosis->ranking[i];
    const RankedCandidate& h = host->diagnosis->ranking[i];
    SCOPED_TRACE(h.config);
    EXPECT_EQ(d.config, h.config);
    EXPECT_EQ(d.bitwise_equal_fraction, h.bitwise_equal_fraction);
    EXPECT_EQ(d.max_ulp, h.max_ulp);
    EXPECT_EQ(d.mean_ulp, h.mean_ulp);
    EXPECT_EQ(d.disagreements, h.disagreements);
    // The error model from device GEMMs in another order (as in
    // GpuRequestOnTheDeviceMatchesTheHostWay), and sums in another order.
    EXPECT_NEAR(d.expected_disagreements, h.expected_disagreements,
                1e-4 * h.expected_disagreements + 1e-9);
    ASSERT_EQ(d.bound_ratio.has_value(), h.bound_ratio.has_value());
    if (h.bound_ratio.has_value()) {
      EXPECT_NEAR(*d.bound_ratio, *h.bound_ratio, 1e-4 * *h.bound_ratio);
    }
    // An element at 4 sigmas may fall either side with sigmas 1e-7 apart.
    EXPECT_NEAR(d.consistent_fraction, h.consistent_fraction, 1e-3);
  }
  EXPECT_EQ(device->diagnosis->tied, host->diagnosis->tied);
  EXPECT_EQ(device->diagnosis->outliers.size(), host->diagnosis->outliers.size());
}

TEST_F(GpuEngineTest, GpuOverTheBudgetIsResourceExhaustedAndTheDeviceKeepsServing) {
  BackendRegistry small;
  BuiltinBackendOptions options;
  options.gpu_memory_budget_bytes = int64_t{4} << 20;
  options.cublaslt_workspace_bytes = 0;
  options.gpu_lanes = 1;
  ASSERT_THAT(RegisterBuiltinBackends(&small, options), IsOk());
  auto engine = Engine::Create(EngineOptions{}, &small);
  ASSERT_THAT(engine, IsOk());
  EXPECT_THAT((*engine)->Verify(Request()),
              ::tensorcheck::testing::StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT((*engine)->Verify(Request(4, 32, 16)), IsOk());
}

}  // namespace
}  // namespace tensorcheck
