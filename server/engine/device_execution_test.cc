// The engine's device plan, in-process with the stand-in device
// (tests/testing/stand_in_device.h): what runs where, what is uploaded
// once, what stays resident, what comes back, and that a request on the
// device computes what the host execution computes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/float_formats.h"
#include "server/engine/engine.h"
#include "tests/testing/stand_in_device.h"
#include "tests/testing/stats_testing.h"
#include "tests/testing/status_matchers.h"

namespace tensorcheck {
namespace {

using ::tensorcheck::testing::IsOk;
using ::tensorcheck::testing::RandomNormal;
using ::tensorcheck::testing::StandInBackend;
using ::tensorcheck::testing::StandInDevice;
using ::tensorcheck::testing::StatusIs;
using ::testing::HasSubstr;

constexpr int64_t kBudget = int64_t{64} << 20;

class DeviceExecutionTest : public ::testing::Test {
 protected:
  void SetUp() override { MakeEngine(kBudget); }

  void MakeEngine(int64_t budget, bool device_sessions = true, int lanes = 0) {
    registry_ = std::make_unique<BackendRegistry>();
    ASSERT_THAT(RegisterBuiltinBackends(registry_.get()), IsOk());
    device_ = std::make_shared<StandInDevice>(budget, lanes);
    ASSERT_THAT(registry_->Register(std::make_unique<StandInBackend>(device_)), IsOk());
    EngineOptions options;
    options.device_sessions = device_sessions;
    auto engine = Engine::Create(options, registry_.get());
    ASSERT_THAT(engine, IsOk());
    engine_ = std::move(engine).value();
  }

  // A bf16 layer with a bias, and an observed output: the fp32 emulation
  // of it with every 7th element nudged by one bf16 ULP (so that the
  // comparisons have something to count).
  static LinearRequest Request(int64_t m = 24, int64_t k = 96, int64_t n = 40) {
    LinearRequest r;
    r.input = RandomNormal({m, k}, 1.0, 11, DType::kBFloat16);
    r.weight = RandomNormal({n, k}, 1.0 / std::sqrt(double(k)), 12, DType::kBFloat16);
    r.bias = RandomNormal({n}, 0.5, 13, DType::kBFloat16);
    Tensor observed = RandomNormal({m, n}, 1.0, 14, DType::kBFloat16);
    r.observed = std::move(observed);
    r.configs = {"standin:fp32", "standin:bf16:unfused", "standin:tf32rna", "standin:fp16acc"};
    return r;
  }

  // The observed output as a configuration computes it, so a diagnosis
  // has a right answer.
  LinearRequest RequestObservingBf16() {
    LinearRequest r = Request();
    LinearProblem p;
    p.input = &r.input;
    p.weight = &r.weight;
    p.bias = &*r.bias;
    p.output_dtype = DType::kBFloat16;
    p.m = r.input.dim(0);
    p.k = r.input.dim(1);
    p.n = r.weight.dim(0);
    Config c{"cpu", Precision::kBf16, BiasMode::kUnfused};
    r.observed = std::move(device_->cpu()->Run(p, c, RunOptions{})->output);
    return r;
  }

  static std::map<std::string, std::string> SessionDetails(const VerifyOutcome& out) {
    return out.reference.details;
  }

  // The stand-in runs the host's passes, so a diagnosis on it equals the
  // host's in every field, the explanation included.
  static void ExpectSameDiagnosis(const DiagnosisOutcome& device, const DiagnosisOutcome& host) {
    EXPECT_EQ(device.best, host.best);
    EXPECT_EQ(device.confidence, host.confidence);
    EXPECT_EQ(device.explanation, host.explanation);
    ASSERT_EQ(device.ranking.size(), host.ranking.size());
    for (size_t i = 0; i < host.ranking.size(); ++i) {
      SCOPED_TRACE(host.ranking[i].config);
      EXPECT_EQ(device.ranking[i].bitwise_equal_fraction, host.ranking[i].bitwise_equal_fraction);
      EXPECT_EQ(device.ranking[i].max_ulp, host.ranking[i].max_ulp);
      EXPECT_EQ(device.ranking[i].mean_ulp, host.ranking[i].mean_ulp);
      EXPECT_EQ(device.ranking[i].bound_ratio, host.ranking[i].bound_ratio);
      EXPECT_EQ(device.ranking[i].expected_disagreements, host.ranking[i].expected_disagreements);
      EXPECT_EQ(device.ranking[i].ruled_out, host.ranking[i].ruled_out);
    }
    ASSERT_EQ(device.outliers.size(), host.outliers.size());
    for (size_t i = 0; i < host.outliers.size(); ++i) {
      EXPECT_EQ(device.outliers[i].flat_index, host.outliers[i].flat_index);
      EXPECT_EQ(device.outliers[i].ulp, host.outliers[i].ulp);
    }
    ::tensorcheck::testing::ExpectSameGroups(device.columns, host.columns);
    ::tensorcheck::testing::ExpectSameGroups(device.rows, host.rows);
  }

  std::unique_ptr<BackendRegistry> registry_;
  std::shared_ptr<StandInDevice> device_;
  std::unique_ptr<Engine> engine_;
};

TEST_F(DeviceExecutionTest, DefaultReferenceIsTheFastestBackendsFp64) {
  EXPECT_EQ(engine_->options().default_reference, "standin:fp64");
  BackendRegistry host_only;
  ASSERT_THAT(RegisterBuiltinBackends(&host_only), IsOk());
  auto host = Engine::Create(EngineOptions{}, &host_only);
  ASSERT_THAT(host, IsOk());
  EXPECT_EQ((*host)->options().default_reference, "cpu:fp64");
  EngineOptions named;
  named.default_reference = "cpu:fp64";
  auto explicit_engine = Engine::Create(named, registry_.get());
  ASSERT_THAT(explicit_engine, IsOk());
  EXPECT_EQ((*explicit_engine)->options().default_reference, "cpu:fp64");
}

TEST_F(DeviceExecutionTest, RequestWithoutReferenceRunsItOnTheDevice) {
  auto out = engine_->Verify(Request());
  ASSERT_THAT(out, IsOk());
  EXPECT_EQ(out->reference.config, "standin:fp64:fused");
  EXPECT_EQ(out->reference.details.at("session"), "device");
  EXPECT_EQ(device_->sessions(), 1);
}

TEST_F(DeviceExecutionTest, EachTensorIsUploadedOnceAndOnlyStatisticsComeBack) {
  auto out = engine_->Verify(Request());
  ASSERT_THAT(out, IsOk());
  const SessionCounters c = device_->last_counters();
  // x, W, b and the observed output: once each, for 4 configurations and
  // the reference.
  EXPECT_EQ(c.uploads, 4);
  EXPECT_EQ(c.runs, 5);
  EXPECT_EQ(c.downloads, 0);
  EXPECT_EQ(c.download_bytes, 0);
  // Each configuration against the reference and the observed output, the
  // reference against itself and the observed output against it twice
  // (under its dtype's bound and the reference's own arrays).
  EXPECT_EQ(c.comparisons, 2 * 4 + 2 + 1);
  EXPECT_EQ(out->reference.details.at("session_uploads"), "4");
  EXPECT_EQ(out->reference.details.at("session_downloads"), "0");
}

TEST_F(DeviceExecutionTest, ReturnedOutputsAreTheOnlyDownloads) {
  LinearRequest r = Request();
  r.return_outputs = true;
  auto out = engine_->Verify(r);
  ASSERT_THAT(out, IsOk());
  const SessionCounters c = device_->last_counters();
  EXPECT_EQ(c.downloads, 5);
  EXPECT_EQ(c.download_bytes, 5 * 24 * 40 * 2);
  ASSERT_TRUE(out->reference.output.has_value());
  EXPECT_EQ(out->reference.output->shape(), (std::vector<int64_t>{24, 40}));
  for (const ConfigOutcome& o : out->results) ASSERT_TRUE(o.output.has_value()) << o.config;
}

TEST_F(DeviceExecutionTest, ErrorModelArraysAreSharedByKeyAsOnTheHost) {
  LinearRequest r = Request();
  r.tolerance.preset = TolerancePreset::kBound;
  ASSERT_THAT(engine_->Verify(r), IsOk());
  const SessionCounters c = device_->last_counters();
  // Counted from docs/numerics.md's table. bf16 storage is exact under
  // fp32, tf32rna and bf16 (u_in 0), which all accumulate in fp32: the
  // observed output's bf16 sigma, fp32's and tf32rna's are one array
  // (fused), bf16:unfused's another; then fp16acc and the fp64 reference:
  // 4 sigma arrays. Bounds (u_p = u_acc where the inputs are exact, else
  // max(u_in, u_acc)): 2^-24 unfused (the observed output's, which allows
  // an unfused bias, and bf16:unfused's), 2^-24 fused (fp32, tf32rna),
  // 2^-11 (fp16acc), 2^-53: 4. Pair sigmas (no input term):
  // fp32-accumulate fused (fp32, tf32rna), unfused (bf16), fp16acc, fp64: 4.
  EXPECT_EQ(c.model_arrays, 4 + 4 + 4);
}

// The device plan computes what the host execution computes: the same
// statistics for every configuration, the reference and the observed
// output, and the same verdict.
TEST_F(DeviceExecutionTest, VerifyMatchesTheHostExecution) {
  for (TolerancePreset preset : {TolerancePreset::kTorch, TolerancePreset::kBound}) {
    LinearRequest r = Request();
    r.tolerance.preset = preset;
    auto device = engine_->Verify(r);
    ASSERT_THAT(device, IsOk());
    MakeEngine(kBudget, /*device_sessions=*/false);
    auto host = engine_->Verify(r);
    ASSERT_THAT(host, IsOk());
    EXPECT_EQ(host->reference.details.count("session"), 0u);
    EXPECT_EQ(device->passed, host->passed);
    ASSERT_TRUE(device->observed_vs_reference.has_value());
    ::tensorcheck::testing::ExpectSameStats(*device->observed_vs_reference,
                                            *host->observed_vs_reference);
    ::tensorcheck::testing::ExpectSameStats(device->reference.vs_reference,
                                            host->reference.vs_reference);
    ASSERT_EQ(device->results.size(), host->results.size());
    for (size_t i = 0; i < host->results.size(); ++i) {
      SCOPED_TRACE(host->results[i].config);
      EXPECT_EQ(device->results[i].config, host->results[i].config);
      ::tensorcheck::testing::ExpectSameStats(device->results[i].vs_reference,
                                              host->results[i].vs_reference);
      ::tensorcheck::testing::ExpectSameStats(*device->results[i].vs_observed,
                                              *host->results[i].vs_observed);
    }
    MakeEngine(kBudget);
  }
}

TEST_F(DeviceExecutionTest, DiagnoseMatchesTheHostExecution) {
  LinearRequest r = RequestObservingBf16();
  r.configs.clear();  // the default candidates: every one on the device
  auto device = engine_->Diagnose(r);
  ASSERT_THAT(device, IsOk());
  for (const ConfigOutcome& o : device->results) {
    EXPECT_THAT(o.config, ::testing::StartsWith("standin:"));
  }
  MakeEngine(kBudget, /*device_sessions=*/false);
  auto host = engine_->Diagnose(r);
  ASSERT_THAT(host, IsOk());
  ASSERT_TRUE(device->diagnosis.has_value() && host->diagnosis.has_value());
  EXPECT_EQ(device->diagnosis->best, host->diagnosis->best);
  ASSERT_TRUE(device->diagnosis->best.has_value());
  EXPECT_EQ(*device->diagnosis->best, "standin:bf16:unfused");
  EXPECT_EQ(device->diagnosis->equivalent, host->diagnosis->equivalent);
  EXPECT_EQ(device->diagnosis->tied, host->diagnosis->tied);
  ASSERT_EQ(device->diagnosis->ranking.size(), host->diagnosis->ranking.size());
  for (size_t i = 0; i < host->diagnosis->ranking.size(); ++i) {
    EXPECT_EQ(device->diagnosis->ranking[i].config, host->diagnosis->ranking[i].config);
    EXPECT_EQ(device->diagnosis->ranking[i].disagreements,
              host->diagnosis->ranking[i].disagreements);
    EXPECT_EQ(device->diagnosis->ranking[i].plausible, host->diagnosis->ranking[i].plausible);
  }
  ExpectSameDiagnosis(*device->diagnosis, *host->diagnosis);
}

// The ranking reads its per-element evidence on the device: with every
// element explained and no outputs asked for, nothing comes back but sums
// and the verdict's scan of best (its output, its pair accumulation sigma
// and its flip grid), which runs on the host.
TEST_F(DeviceExecutionTest, DiagnosisScoresOnTheDeviceAndBringsBackOnlyBestForTheVerdict) {
  LinearRequest r = RequestObservingBf16();
  r.configs.clear();
  const int64_t count = r.observed->numel();
  auto out = engine_->Diagnose(r);
  ASSERT_THAT(out, IsOk());
  ASSERT_TRUE(out->diagnosis.has_value() && out->diagnosis->best.has_value());
  EXPECT_TRUE(out->diagnosis->outliers.empty());
  const SessionCounters c = device_->last_counters();
  EXPECT_EQ(c.downloads, 3);
  EXPECT_EQ(c.download_bytes, count * 2 + 2 * count * 4);  // bf16 output, two float arrays
  // At least: one explain pass and one score per class, and the error
  // against the reference.
  EXPECT_GE(c.diagnosis_passes, 3);
  EXPECT_EQ(SessionDetails(*out)["session_downloads"], "3");
  EXPECT_EQ(SessionDetails(*out)["session_diagnosis_passes"], std::to_string(c.diagnosis_passes));
}

// Outliers bring back the explained mask (a byte per element) and the one
// output they are listed against, besides the verdict's scan.
TEST_F(DeviceExecutionTest, OutliersBringBackTheMaskAndOneOutput) {
  LinearRequest r = RequestObservingBf16();
  r.configs.clear();
  const int64_t count = r.observed->numel();
  for (int64_t i : {3, 101, 517}) {
    r.observed->data<uint16_t>()[i] = DoubleToBf16Bits(64.0 + static_cast<double>(i));
  }
  auto device = engine_->Diagnose(r);
  ASSERT_THAT(device, IsOk());
  const SessionCounters c = device_->last_counters();
  EXPECT_EQ(c.downloads, 2 + 3);
  // The mask and one bf16 output; the scan's bf16 output and two float arrays.
  EXPECT_EQ(c.download_bytes, count * 1 + count * 2 + count * 2 + 2 * count * 4);
  MakeEngine(kBudget, /*device_sessions=*/false);
  auto host = engine_->Diagnose(r);
  ASSERT_THAT(host, IsOk());
  ASSERT_EQ(device->diagnosis->outliers.size(), 3u);
  std::vector<int64_t> flat;
  for (const ElementDiff& e : device->diagnosis->outliers) flat.push_back(e.flat_index);
  EXPECT_THAT(flat, ::testing::UnorderedElementsAre(3, 101, 517));
  ExpectSameDiagnosis(*device->diagnosis, *host->diagnosis);
}

TEST_F(DeviceExecutionTest, AStoredWeightStaysResidentForTheNextRequest) {
  LinearRequest r = Request();
  r.weight.set_content_id("sha256:weight");
  ASSERT_THAT(engine_->Verify(r), IsOk());
  SessionCounters first = device_->last_counters();
  EXPECT_EQ(first.uploads, 4);
  EXPECT_EQ(first.resident_hits, 0);
  ASSERT_THAT(engine_->Verify(r), IsOk());
  SessionCounters second = device_->last_counters();
  // Only the input, the bias and the observed output travel.
  EXPECT_EQ(second.uploads, 3);
  EXPECT_EQ(second.resident_hits, 1);
  EXPECT_EQ(second.resident_hit_bytes, static_cast<int64_t>(r.weight.nbytes()));
  EXPECT_EQ(device_->resident().hits, 1);
  EXPECT_EQ(device_->resident().entries, 1);
  // Nothing of a finished request stays reserved.
  EXPECT_EQ(device_->in_use_bytes(), 0);
}

TEST_F(DeviceExecutionTest, ResidentWeightsGiveWayLeastRecentlyUsedFirst) {
  LinearRequest a = Request(16, 512, 512);
  LinearRequest b = Request(16, 512, 512);
  // What one request holds with its weight uploaded for it alone.
  ASSERT_THAT(engine_->Verify(a), IsOk());
  const int64_t peak = device_->peak_in_use_bytes();
  const int64_t weight_bytes = static_cast<int64_t>(a.weight.nbytes());
  // Room for a request and one resident weight, not two.
  MakeEngine(peak + weight_bytes / 2);
  a.weight.set_content_id("sha256:a");
  b.weight.set_content_id("sha256:b");
  ASSERT_THAT(engine_->Verify(a), IsOk());
  ASSERT_THAT(engine_->Verify(b), IsOk());
  EXPECT_EQ(device_->resident().evictions, 1);
  ASSERT_THAT(engine_->Verify(b), IsOk());
  EXPECT_EQ(device_->last_counters().resident_hits, 1);
  ASSERT_THAT(engine_->Verify(a), IsOk());
  EXPECT_EQ(device_->last_counters().resident_hits, 0);
  EXPECT_LE(device_->resident().bytes, device_->resident().capacity_bytes);
}

TEST_F(DeviceExecutionTest, OverTheBudgetIsResourceExhaustedAndTheDeviceKeepsServing) {
  MakeEngine(int64_t{64} << 10);
  EXPECT_THAT(engine_->Verify(Request(64, 256, 256)),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(device_->in_use_bytes(), 0);
  EXPECT_THAT(engine_->Verify(Request(4, 16, 8)), IsOk());
}

TEST_F(DeviceExecutionTest, AStoppedRequestStopsOnTheDevice) {
  StopSignal stop;
  stop.Cancel(StopSignal::Reason::kClientCancelled);
  EXPECT_THAT(engine_->Verify(Request(), &stop), StatusIs(absl::StatusCode::kCancelled));
  EXPECT_EQ(device_->last_counters().runs, 0);
  EXPECT_EQ(device_->in_use_bytes(), 0);
}

// A diagnosis keeps its session (and lane) while it ranks; the batch
// runs after it each need a lane. On a one-lane device they get it only
// if the diagnosis has let its own go. The deadline turns a wait for
// itself into a failure instead of a hung test.
TEST_F(DeviceExecutionTest, DiagnoseWithBatchInvarianceOnOneLaneDoesNotWaitForItself) {
  MakeEngine(kBudget, /*device_sessions=*/true, /*lanes=*/1);
  LinearRequest r = RequestObservingBf16();
  r.batch_invariance = true;
  r.batch_sizes = {8};
  StopSignal stop(absl::Now() + absl::Seconds(120));
  auto out = engine_->Diagnose(r, &stop);
  ASSERT_THAT(out, IsOk());
  ASSERT_TRUE(out->diagnosis.has_value());
  EXPECT_EQ(out->reference.details.at("session"), "device");
  for (const ConfigOutcome& c : out->results) {
    SCOPED_TRACE(c.config);
    ASSERT_TRUE(c.batch_invariance.has_value());
    EXPECT_FALSE(c.batch_invariance->sub_batches.empty());
  }
}

TEST_F(DeviceExecutionTest, AHostConfigurationKeepsTheRequestOnTheHost) {
  LinearRequest r = Request();
  r.configs = {"standin:fp32", "cpu:bf16"};
  auto out = engine_->Verify(r);
  ASSERT_THAT(out, IsOk());
  EXPECT_EQ(out->reference.details.count("session"), 0u);
  EXPECT_EQ(device_->sessions(), 0);
}

TEST_F(DeviceExecutionTest, WithoutAnObservedOutputOnlyTheOperandsTravel) {
  LinearRequest r = Request();
  r.configs = {"standin:fp32"};
  r.repeat = 0;
  r.observed.reset();
  r.input = RandomNormal({2, 96}, 1.0, 1, DType::kBFloat16);
  auto out = engine_->Verify(r);
  ASSERT_THAT(out, IsOk());
  EXPECT_FALSE(out->observed_vs_reference.has_value());
  EXPECT_EQ(device_->last_counters().uploads, 3);
  EXPECT_THAT(out->results[0].config, HasSubstr("standin:fp32"));
}

// A device configuration with a host reference: the request runs on the
// host device, the device configuration through its backend's Run, and
// its output is compared on the host, as the same configuration of the
// CPU backend is.
TEST_F(DeviceExecutionTest, ADeviceConfigurationWithAHostReferenceIsComparedOnTheHost) {
  LinearRequest r = Request();
  r.reference = "cpu:fp64";
  r.configs = {"standin:tf32:unfused"};
  r.return_outputs = true;
  auto mixed = engine_->Verify(r);
  ASSERT_THAT(mixed, IsOk());
  EXPECT_EQ(device_->sessions(), 0);
  EXPECT_EQ(mixed->reference.details.count("session"), 0u);
  r.configs = {"cpu:tf32:unfused"};
  auto host = engine_->Verify(r);
  ASSERT_THAT(host, IsOk());
  ASSERT_EQ(mixed->results.size(), 1u);
  const ConfigOutcome& m = mixed->results[0];
  const ConfigOutcome& h = host->results[0];
  EXPECT_EQ(m.details.count("statistics"), 0u);
  ::tensorcheck::testing::ExpectSameStats(m.vs_reference, h.vs_reference);
  ASSERT_TRUE(m.vs_observed.has_value() && h.vs_observed.has_value());
  ::tensorcheck::testing::ExpectSameStats(*m.vs_observed, *h.vs_observed);
  ASSERT_TRUE(m.output.has_value() && h.output.has_value());
  EXPECT_EQ(m.output->shape(), (std::vector<int64_t>{24, 40}));
  ASSERT_EQ(m.output->nbytes(), h.output->nbytes());
  EXPECT_EQ(std::memcmp(m.output->raw(), h.output->raw(), h.output->nbytes()), 0);
  EXPECT_EQ(mixed->passed, host->passed);
}

TEST_F(DeviceExecutionTest, ADiagnosisMixingDeviceAndHostRanksOnTheHost) {
  LinearRequest r = RequestObservingBf16();
  r.reference = "cpu:fp64";
  r.configs = {"standin:fp32", "standin:bf16:unfused", "cpu:fp16acc"};
  auto out = engine_->Diagnose(r);
  ASSERT_THAT(out, IsOk());
  EXPECT_EQ(device_->sessions(), 0);
  ASSERT_TRUE(out->diagnosis.has_value() && out->diagnosis->best.has_value());
  EXPECT_EQ(*out->diagnosis->best, "standin:bf16:unfused");
  EXPECT_EQ(out->reference.details.count("session_diagnosis_passes"), 0u);
}

}  // namespace
}  // namespace tensorcheck
