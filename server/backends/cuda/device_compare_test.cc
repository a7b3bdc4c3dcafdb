// Statistics on the device against stats' Compare on the host: a GPU
// session's Compare of a configuration's output must report what Compare
// reports for the same output and tensor (Compare itself is tested against
// hand-derived values in diff_stats_test.cc). Gpu* tests skip without a
// device.
#include "server/backends/cuda/internal/device_compare.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/status_macros.h"
#include "core/tensor.h"
#include "server/backends/cuda/cuda_context.h"
#include "server/backends/device_session.h"
#include "server/stats/diff_stats.h"
#include "server/stats/tolerance.h"
#include "tests/testing/cuda_test_backends.h"
#include "tests/testing/stats_testing.h"
#include "tests/testing/status_matchers.h"

namespace tensorcheck {
namespace {

using ::tensorcheck::testing::ExpectSameStats;
using ::tensorcheck::testing::IsOk;
using ::tensorcheck::testing::StatusIs;
using ::tensorcheck::testing::TestBackend;

struct Layer {
  Tensor x, w, b;
  LinearProblem problem;
};

std::unique_ptr<Layer> MakeLayer(int64_t m, int64_t n, int64_t k, DType out, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  auto values = [&](int64_t count) {
    std::vector<double> v(static_cast<size_t>(count));
    for (double& e : v) e = u(rng);
    return v;
  };
  auto l = std::make_unique<Layer>();
  l->x = *FromDoubles(DType::kFloat32, {m, k}, values(m * k));
  l->w = *FromDoubles(DType::kFloat32, {n, k}, values(n * k));
  l->b = *FromDoubles(DType::kFloat32, {n}, values(n));
  LinearProblem& p = l->problem;
  p.input = &l->x;
  p.weight = &l->w;
  p.bias = &l->b;
  p.output_dtype = out;
  p.m = m;
  p.n = n;
  p.k = k;
  return l;
}

Config LtConfig(Precision p) { return Config{"cublaslt", p, BiasMode::kFused}; }

// One comparison of a run's output on the device: Compare(output, other)
// when output_is_actual, else Compare(other, output); the options'
// predicted_sigma and error_bound are host arrays, uploaded.
struct OutputComparison {
  const Tensor* other = nullptr;
  bool output_is_actual = true;
  CompareOptions options;
};

struct ComparedRun {
  Tensor output;  // empty unless asked for
  std::vector<DiffStats> stats;
  SessionCounters counters;
};

// `config` run on a session of cuBLASLt's device, its output compared
// there as the engine's device execution compares it.
absl::StatusOr<ComparedRun> RunAndCompare(LinearBackend* lt, const LinearProblem& problem,
                                          const Config& config,
                                          const std::vector<OutputComparison>& comparisons,
                                          bool return_output) {
  ComputeDevice* device = lt->compute_device();
  if (device == nullptr) return absl::FailedPreconditionError("no device");
  TC_ASSIGN_OR_RETURN(std::unique_ptr<DeviceSession> session, device->OpenSession(nullptr));
  SessionOperands op;
  TC_ASSIGN_OR_RETURN(op.input, session->Upload(*problem.input));
  TC_ASSIGN_OR_RETURN(op.weight, session->Upload(*problem.weight));
  if (problem.bias != nullptr) {
    TC_ASSIGN_OR_RETURN(op.bias, session->Upload(*problem.bias));
  }
  op.shape() = problem.shape();
  TC_ASSIGN_OR_RETURN(SessionRun run, session->Run(op, lt->Prepare(problem, config), {}));
  const int64_t mn = problem.m * problem.n;
  ComparedRun out;
  for (const OutputComparison& c : comparisons) {
    TC_ASSIGN_OR_RETURN(ArrayRef other, session->Upload(*c.other));
    TC_ASSIGN_OR_RETURN(const SessionCompare sc, UploadCompare(*session, c.options, mn));
    TC_ASSIGN_OR_RETURN(DiffStats s, session->Compare(c.output_is_actual ? run.output : other,
                                                      c.output_is_actual ? other : run.output, sc));
    out.stats.push_back(std::move(s));
  }
  out.counters = session->counters();
  if (return_output) {
    TC_ASSIGN_OR_RETURN(out.output, session->Download(run.output));
    TC_RETURN_IF_ERROR(out.output.Reshape({problem.m, problem.n}));
  }
  return out;
}

// What one scenario does to the GPU output to make the other tensor.
struct Scenario {
  std::string name;
  int64_t m, n;
  DType out;    // the layer's output dtype
  DType other;  // the other tensor's dtype
  TolerancePreset preset;
  uint64_t max_ulp = 0;
  bool nan_equal = false;
  int nans = 0;            // NaNs put into the other tensor
  int infs = 0;            // +/-inf put into the other tensor
  double noise = 1e-3;     // relative perturbation of the others
  double untouched = 0.3;  // share of elements left equal
  bool sigma = true;
  int sigma_nans = 0;  // non-finite sigma entries (device upload path)
  int top_k = 10;
  int top_groups = 5;
  bool relu = false;    // the layer's activation: many exact zeros in both
  int zeros_moved = 0;  // zeros of the output made nonzero in the other
};

Tensor MakeOther(const Tensor& output, const Scenario& sc, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(0, 1);
  std::normal_distribution<double> g;
  const int64_t total = output.numel();
  std::vector<double> v(static_cast<size_t>(total));
  for (int64_t i = 0; i < total; ++i) {
    const double o = output.GetDouble(i);
    v[static_cast<size_t>(i)] = u(rng) < sc.untouched ? o : o * (1 + sc.noise * g(rng));
  }
  std::uniform_int_distribution<int64_t> at(0, total - 1);
  for (int j = 0; j < sc.nans; ++j) {
    v[static_cast<size_t>(at(rng))] = std::numeric_limits<double>::quiet_NaN();
  }
  for (int j = 0; j < sc.infs; ++j) {
    v[static_cast<size_t>(at(rng))] = (j % 2 ? -1 : 1) * std::numeric_limits<double>::infinity();
  }
  for (int64_t i = 0, moved = 0; i < total && moved < sc.zeros_moved; ++i) {
    if (output.GetDouble(i) == 0) {  // |e| = 0 against a difference: rel = inf
      v[static_cast<size_t>(i)] = 1e-3 * static_cast<double>(++moved);
    }
  }
  if (sc.noise > 0) v[0] = -0.0;  // a signed zero against the output's value
  auto t = FromDoubles(sc.other, output.shape(), v);
  EXPECT_THAT(t, IsOk());
  return std::move(t).value();
}

TEST(DeviceStatsTest, GpuDeviceStatisticsEqualHostCompare) {
  LinearBackend* lt = TestBackend("cublaslt");
  ASSERT_NE(lt, nullptr);
  if (!lt->Available().ok()) GTEST_SKIP() << lt->Available().message();

  const std::vector<Scenario> scenarios = {
      {"fp32 torch, NaN and inf", 96, 80, DType::kFloat32, DType::kFloat32, TolerancePreset::kTorch,
       0, false, 20, 10},
      {"fp32 torch, 1M elements", 1024, 1024, DType::kFloat32, DType::kFloat32,
       TolerancePreset::kTorch, 0, false, 50, 50, 1e-5},
      {"bf16 ulp, NaN equal", 96, 80, DType::kBFloat16, DType::kBFloat16, TolerancePreset::kUlp, 1,
       true, 15, 0, 1e-2, 0.6, true, 0, 1000, 7},
      {"bf16 out vs fp32, bound, sigma with NaN", 96, 80, DType::kBFloat16, DType::kFloat32,
       TolerancePreset::kBound, 0, false, 0, 4, 1e-3, 0.3, true, 9},
      // More NaN pairs than DeviceCompare keeps indices of: bound_ratio's
      // sums still exclude every one (the kernel reads the session's sigma
      // on the device and skips them itself).
      {"fp32 polygraphy, more NaN pairs than indices kept", 128, 96, DType::kFloat32,
       DType::kFloat32, TolerancePreset::kPolygraphy, 0, false, 6000, 0},
      {"fp32 explicit, equal tensors (ties everywhere)", 64, 48, DType::kFloat32, DType::kFloat32,
       TolerancePreset::kExplicit, 0, false, 0, 0, 0, 1.0, false, 0, 7},
      {"fp16 out, numpy, no worst and no groups", 64, 48, DType::kFloat16, DType::kFloat16,
       TolerancePreset::kNumpy, 0, false, 3, 3, 1e-3, 0.3, true, 0, 0, 0},
      // Same-type pairs take the lean path of the totals pass; these cover
      // what the ones above leave to the general path there.
      {"bf16 same type, bound, sigma with NaN", 96, 80, DType::kBFloat16, DType::kBFloat16,
       TolerancePreset::kBound, 0, false, 0, 2, 1e-2, 0.3, true, 11},
      {"fp16 relu, torch: zeros in both, rel = inf", 128, 64, DType::kFloat16, DType::kFloat16,
       TolerancePreset::kTorch, 0, false, 0, 0, 1e-2, 0.5, false, 0, 10, 5, true, 7},
      {"fp32 relu, polygraphy, no NaN anywhere", 64, 256, DType::kFloat32, DType::kFloat32,
       TolerancePreset::kPolygraphy, 0, false, 0, 0, 1e-6, 0.2, false, 0, 10, 5, true, 0},
  };
  uint32_t seed = 100;
  for (const Scenario& sc : scenarios) {
    SCOPED_TRACE(sc.name);
    ++seed;
    auto layer = MakeLayer(sc.m, sc.n, 32, sc.out, seed);
    if (sc.relu) layer->problem.activation = Activation::kRelu;
    const Precision precision = sc.out == DType::kBFloat16  ? Precision::kBf16
                                : sc.out == DType::kFloat16 ? Precision::kFp16
                                                            : Precision::kFp32;
    auto base = lt->Run(layer->problem, LtConfig(precision), {});
    ASSERT_THAT(base, IsOk());
    const Tensor other = MakeOther(base->output, sc, seed);
    const int64_t total = other.numel();

    std::vector<float> sigma(static_cast<size_t>(total)), bound(sigma.size());
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(1e-4f, 1e-2f);
    for (size_t i = 0; i < sigma.size(); ++i) {
      sigma[i] = u(rng);
      bound[i] = 4 * sigma[i];
    }
    for (int j = 0; j < sc.sigma_nans; ++j) {
      sigma[static_cast<size_t>(j * 7 % total)] = std::numeric_limits<float>::quiet_NaN();
    }
    CompareOptions opts;
    opts.tolerance = ResolveTolerance(sc.preset, sc.out, std::nullopt, std::nullopt, sc.max_ulp,
                                      1.0, sc.nan_equal);
    if (sc.preset == TolerancePreset::kExplicit) opts.tolerance.atol = 1e-6;
    opts.compared_dtype = sc.out;
    opts.cols = sc.n;
    opts.top_k = sc.top_k;
    opts.top_groups = sc.top_groups;
    opts.predicted_sigma = sc.sigma ? sigma.data() : nullptr;
    if (seed % 2 == 0) {  // the caller's sum of squares (NaN with a NaN sigma)
      double sum = 0;
      for (float v : sigma) sum += double(v) * v;
      opts.predicted_sigma_sum_sq = sum;
    }
    opts.error_bound = bound.data();

    auto run = RunAndCompare(lt, layer->problem, LtConfig(precision),
                             {{&other, true, opts}, {&other, false, opts}},
                             /*return_output=*/true);
    ASSERT_THAT(run, IsOk());
    ASSERT_EQ(run->stats.size(), 2u);
    // The session's run is the same computation as the first: bit for bit.
    ASSERT_EQ(run->output.nbytes(), base->output.nbytes());
    ASSERT_EQ(std::memcmp(run->output.raw(), base->output.raw(), base->output.nbytes()), 0);

    auto host_forward = Compare(run->output, other, opts);
    auto host_backward = Compare(other, run->output, opts);
    ASSERT_THAT(host_forward, IsOk());
    ASSERT_THAT(host_backward, IsOk());
    {
      SCOPED_TRACE("output vs other");
      ExpectSameStats(run->stats[0], *host_forward);
    }
    {
      SCOPED_TRACE("other vs output");
      ExpectSameStats(run->stats[1], *host_backward);
    }
    // The scenarios do what they say.
    if (sc.top_k > 0 && sc.nans + sc.infs > 0) {
      EXPECT_FALSE(run->stats[0].worst.empty());
    }
    if (sc.noise == 0) {
      EXPECT_TRUE(run->stats[0].bitwise_equal);
    }
  }
}

TEST(DeviceStatsTest, GpuOutputIsLeftOnTheDeviceUnlessAsked) {
  LinearBackend* lt = TestBackend("cublaslt");
  ASSERT_NE(lt, nullptr);
  if (!lt->Available().ok()) GTEST_SKIP() << lt->Available().message();
  auto layer = MakeLayer(8, 16, 32, DType::kFloat32, 7);
  auto base = lt->Run(layer->problem, LtConfig(Precision::kFp32), {});
  ASSERT_THAT(base, IsOk());
  CompareOptions opts;
  opts.cols = 16;
  auto run = RunAndCompare(lt, layer->problem, LtConfig(Precision::kFp32),
                           {{&base->output, true, opts}}, /*return_output=*/false);
  ASSERT_THAT(run, IsOk());
  EXPECT_EQ(run->output.numel(), 0);
  EXPECT_EQ(run->counters.downloads, 0);
  ASSERT_EQ(run->stats.size(), 1u);
  EXPECT_TRUE(run->stats[0].bitwise_equal);
  EXPECT_EQ(run->stats[0].total, 8 * 16);
}

// |a-e| <= atol + rtol|e| is rounded twice, as tolerance.h writes it and
// the host computes it; a fused multiply-add rounds once and moves the
// limit. Hand-derived: with e = 1 + 2^-52, rtol = 1 + 2^-52 and
// atol = 2^-53, rtol*e = 1 + 2^-51 + 2^-104 rounds to 1 + 2^-51, and
// adding atol is a tie that rounds to even: the limit is 1 + 2^-51. Fused,
// the 2^-104 breaks the tie upwards: 1 + 3*2^-52. a = 2 + 2^-50 puts
// |a-e| = 1 + 3*2^-52 between the two: it fails the tolerance.
TEST(DeviceStatsTest, GpuToleranceLimitIsRoundedAsOnTheHost) {
  const double e = 0x1.0000000000001p+0, rtol = 0x1.0000000000001p+0, atol = 0x1p-53;
  const double a = 0x1.0000000000002p+1;
  ASSERT_EQ(a - e, 0x1.0000000000003p+0);                    // exact
  ASSERT_EQ(std::fma(rtol, e, atol), 0x1.0000000000003p+0);  // the fused limit
  const Tensor actual = *FromDoubles(DType::kFloat64, {3}, {a, 1.5, -0.25});
  const Tensor expected = *FromDoubles(DType::kFloat64, {3}, {e, 1.5, -0.25});

  CompareOptions opts;
  opts.tolerance = ResolveTolerance(TolerancePreset::kExplicit, DType::kFloat64, atol, rtol);
  opts.compared_dtype = DType::kFloat64;
  auto host = Compare(actual, expected, opts);
  ASSERT_THAT(host, IsOk());
  EXPECT_EQ(host->mismatched, 1);

  LinearBackend* lt = TestBackend("cublaslt");
  ASSERT_NE(lt, nullptr);
  if (!lt->Available().ok()) GTEST_SKIP() << lt->Available().message();
  cuda::DeviceBuffer da, de, memory;
  cuda::DeviceCompare device(3, opts);
  ASSERT_THAT(device.Validate(), IsOk());
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, actual.nbytes()), cudaSuccess);
  da.reset(p);
  ASSERT_EQ(cudaMalloc(&p, expected.nbytes()), cudaSuccess);
  de.reset(p);
  ASSERT_EQ(cudaMalloc(&p, static_cast<size_t>(device.bytes())), cudaSuccess);
  memory.reset(p);
  ASSERT_EQ(cudaMemcpy(da.get(), actual.raw(), actual.nbytes(), cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(de.get(), expected.raw(), expected.nbytes(), cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_THAT(device.Enqueue({da.get(), DType::kFloat64, 3}, {de.get(), DType::kFloat64, 3},
                             static_cast<char*>(memory.get()), nullptr),
              IsOk());
  ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
  auto on_device = device.Finish();
  ASSERT_THAT(on_device, IsOk());
  EXPECT_EQ(on_device->mismatched, 1);
  ExpectSameStats(*on_device, *host);
}

TEST(DeviceStatsTest, GpuBadComparisonIsInvalidArgument) {
  LinearBackend* lt = TestBackend("cublaslt");
  ASSERT_NE(lt, nullptr);
  if (!lt->Available().ok()) GTEST_SKIP() << lt->Available().message();
  auto layer = MakeLayer(4, 6, 8, DType::kFloat32, 3);
  Tensor wrong = *FromDoubles(DType::kFloat32, {5}, {1, 2, 3, 4, 5});
  CompareOptions opts;
  auto run = RunAndCompare(lt, layer->problem, LtConfig(Precision::kFp32), {{&wrong, true, opts}},
                           /*return_output=*/false);
  EXPECT_THAT(run.status(), StatusIs(absl::StatusCode::kInvalidArgument,
                                     ::testing::HasSubstr("same number of elements")));
}

}  // namespace
}  // namespace tensorcheck
