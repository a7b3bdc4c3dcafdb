// The engine's side of comparing where a backend's output is
// (comparing_backend.h), with a stand-in backend: the CPU emulation, which
// compares inside RunAndCompare as the GPU backends do on the device. Runs
// on any host; the device implementation itself is tested against the
// host's Compare on a GPU (server/backends/cuda/device_compare_test.cc).
#include "server/backends/comparing_backend.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "server/backends/cpu/cpu_backend.h"
#include "server/engine/engine.h"
#include "tests/testing/stats_testing.h"
#include "tests/testing/status_matchers.h"

namespace tensorcheck {
namespace {

using ::tensorcheck::testing::ExpectSameStats;
using ::tensorcheck::testing::IsOk;
using ::tensorcheck::testing::RandomNormal;
using ::tensorcheck::testing::StatusIs;
using ::testing::HasSubstr;

class ComparingCpu final : public LinearBackend, public ComparingBackend {
 public:
  explicit ComparingCpu(std::unique_ptr<CpuBackend> cpu) : cpu_(std::move(cpu)) {}

  absl::string_view name() const override { return "comparing"; }
  BackendKind kind() const override { return BackendKind::kDevice; }  // stands in for one
  absl::Status Available() const override { return cpu_->Available(); }
  std::vector<Precision> precisions() const override { return cpu_->precisions(); }
  std::vector<BiasMode> bias_modes() const override { return cpu_->bias_modes(); }
  BiasMode default_bias_mode() const override { return cpu_->default_bias_mode(); }
  std::vector<DType> storage_dtypes() const override { return cpu_->storage_dtypes(); }
  ComparingBackend* comparing() override { return this; }

  absl::StatusOr<RunResult> Run(const LinearProblem& problem, const Config& config,
                                const RunOptions& options) override {
    ++plain_runs;
    return cpu_->Run(problem, config, options);
  }

  absl::StatusOr<ComparedRun> RunAndCompare(const LinearProblem& problem,
                                            const PreparedRun& prepared, const RunOptions& options,
                                            const std::vector<OutputComparison>& comparisons,
                                            bool return_output) override {
    ++compared_runs;
    last_return_output = return_output;
    last_comparisons = comparisons.size();
    if (fail) return absl::ResourceExhaustedError("stand-in device is full");
    if (!prepared.ok()) return prepared.status();
    auto run = cpu_->Run(problem, prepared.config(), options);
    if (!run.ok()) return run.status();
    ComparedRun out;
    for (const OutputComparison& c : comparisons) {
      auto s = c.output_is_actual ? Compare(run->output, *c.other, c.options)
                                  : Compare(*c.other, run->output, c.options);
      if (!s.ok()) return s.status();
      out.stats.push_back(*std::move(s));
    }
    if (!return_output) run->output = Tensor();
    run->details["statistics"] = "stand-in";
    out.run = *std::move(run);
    return out;
  }

  int plain_runs = 0;
  int compared_runs = 0;
  bool last_return_output = false;
  size_t last_comparisons = 0;
  bool fail = false;

 private:
  std::unique_ptr<CpuBackend> cpu_;
};

class ComparingBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_THAT(RegisterBuiltinBackends(&registry_), IsOk());
    auto cpu = CpuBackend::Create({});
    ASSERT_THAT(cpu, IsOk());
    auto stand_in = std::make_unique<ComparingCpu>(*std::move(cpu));
    stand_in_ = stand_in.get();
    ASSERT_THAT(registry_.Register(std::move(stand_in)), IsOk());
    // The reference on the host: these tests are about the configurations
    // a comparing backend runs (by default the device's fp64 would be it).
    EngineOptions options;
    options.default_reference = "cpu:fp64";
    auto engine = Engine::Create(options, &registry_);
    ASSERT_THAT(engine, IsOk());
    engine_ = *std::move(engine);
  }

  // A layer and an observed output that differs from everything a little.
  LinearRequest Request() {
    LinearRequest r;
    r.input = RandomNormal({2, 3, 64}, 1.0, 1);
    r.weight = RandomNormal({16, 64}, 0.125, 2);
    r.bias = RandomNormal({16}, 0.5, 3);
    r.observed = RandomNormal({2, 3, 16}, 1.0, 4);
    return r;
  }

  BackendRegistry registry_;
  ComparingCpu* stand_in_ = nullptr;
  std::unique_ptr<Engine> engine_;
};

TEST_F(ComparingBackendTest, VerifyHandsBothComparisonsToTheBackend) {
  LinearRequest r = Request();
  r.configs = {"comparing:tf32:unfused"};
  auto compared = engine_->Verify(r);
  ASSERT_THAT(compared, IsOk());
  EXPECT_EQ(stand_in_->compared_runs, 1);
  EXPECT_EQ(stand_in_->plain_runs, 0);
  EXPECT_EQ(stand_in_->last_comparisons, 2u);   // vs the reference, vs the observed
  EXPECT_FALSE(stand_in_->last_return_output);  // statistics only
  ASSERT_EQ(compared->results.size(), 1u);
  const ConfigOutcome& c = compared->results[0];
  EXPECT_EQ(c.details.at("statistics"), "stand-in");
  EXPECT_FALSE(c.output.has_value());

  // The same configuration compared on the host by the engine.
  r.configs = {"cpu:tf32:unfused"};
  auto host = engine_->Verify(r);
  ASSERT_THAT(host, IsOk());
  const ConfigOutcome& h = host->results[0];
  ExpectSameStats(c.vs_reference, h.vs_reference);
  ASSERT_TRUE(c.vs_observed.has_value());
  ASSERT_TRUE(h.vs_observed.has_value());
  ExpectSameStats(*c.vs_observed, *h.vs_observed);
  EXPECT_EQ(compared->passed, host->passed);
}

TEST_F(ComparingBackendTest, OutputsComeBackWhenAskedAndShaped) {
  LinearRequest r = Request();
  r.configs = {"comparing:fp32"};
  r.return_outputs = true;
  auto out = engine_->Verify(r);
  ASSERT_THAT(out, IsOk());
  EXPECT_TRUE(stand_in_->last_return_output);
  ASSERT_TRUE(out->results[0].output.has_value());
  const Tensor& y = *out->results[0].output;
  EXPECT_EQ(y.shape(), (std::vector<int64_t>{2, 3, 16}));

  r.configs = {"cpu:fp32"};
  auto host = engine_->Verify(r);
  ASSERT_THAT(host, IsOk());
  const Tensor& hy = *host->results[0].output;
  ASSERT_EQ(y.nbytes(), hy.nbytes());
  EXPECT_EQ(std::memcmp(y.raw(), hy.raw(), y.nbytes()), 0);
}

TEST_F(ComparingBackendTest, DiagnoseGetsTheOutputsItRanks) {
  LinearRequest r = Request();
  // The observed output is the stand-in's own tf32 result.
  r.configs = {"cpu:tf32:unfused"};
  r.return_outputs = true;
  auto truth = engine_->Verify(r);
  ASSERT_THAT(truth, IsOk());
  r.observed = truth->results[0].output->Clone();
  r.return_outputs = false;
  r.configs = {"comparing:fp32:fused", "comparing:tf32:unfused", "comparing:bf16:fused"};
  auto out = engine_->Diagnose(r);
  ASSERT_THAT(out, IsOk());
  EXPECT_EQ(stand_in_->compared_runs, 3);
  EXPECT_TRUE(stand_in_->last_return_output);  // the ranking needs them
  ASSERT_TRUE(out->diagnosis.has_value());
  ASSERT_TRUE(out->diagnosis->best.has_value()) << out->diagnosis->explanation;
  EXPECT_EQ(*out->diagnosis->best, "comparing:tf32:unfused");
}

TEST_F(ComparingBackendTest, BackendErrorsNameTheConfiguration) {
  stand_in_->fail = true;
  LinearRequest r = Request();
  r.configs = {"comparing:fp32"};
  EXPECT_THAT(engine_->Verify(r).status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("configuration comparing:fp32:fused: stand-in device is full")));
}

}  // namespace
}  // namespace tensorcheck
