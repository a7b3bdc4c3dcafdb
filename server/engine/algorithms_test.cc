// Algorithm sweeps and batch invariance through the engine, with a
// stand-in backend whose kernels differ only in summation order and whose
// "heuristic" picks a kernel by the number of rows, as cuBLASLt's does
// (docs/numerics.md, "Algorithms" and "Batch invariance"). The expected
// bits come from the sums written out in this file, not from the backend.
#include <cblas.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/backends/cpu/cpu_backend.h"
#include "server/engine/engine.h"
#include "tests/testing/stats_testing.h"
#include "tests/testing/status_matchers.h"

namespace tensorcheck {
namespace {

using ::tensorcheck::testing::IsOk;
using ::tensorcheck::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// The three summation orders of one output element, in fp32, each product
// rounded to fp32 before it is added.
enum class Order { kForward, kReverse, kSplitK2 };

const char* OrderName(Order o) {
  return o == Order::kForward ? "forward" : o == Order::kReverse ? "reverse" : "splitk2";
}

float Dot(const float* x, const float* w, int64_t k, Order order) {
  auto sum = [&](int64_t lo, int64_t hi, bool reverse) {
    float acc = 0.0f;
    for (int64_t i = 0; i < hi - lo; ++i) {
      const int64_t j = reverse ? hi - 1 - i : lo + i;
      const float product = x[j] * w[j];
      acc += product;
    }
    return acc;
  };
  switch (order) {
    case Order::kForward:
      return sum(0, k, false);
    case Order::kReverse:
      return sum(0, k, true);
    case Order::kSplitK2:
      return sum(0, k / 2, false) + sum(k / 2, k, false);
  }
  return 0.0f;
}

// y[m, n] = x[m, k] W[n, k]^T in `order`.
std::vector<float> Linear(const std::vector<float>& x, const std::vector<float>& w, int64_t m,
                          int64_t n, int64_t k, Order order) {
  std::vector<float> y(static_cast<size_t>(m * n));
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t c = 0; c < n; ++c) y[r * n + c] = Dot(&x[r * k], &w[c * k], k, order);
  }
  return y;
}

// A GPU library in miniature: three kernels, and a heuristic whose first
// choice depends on M (reverse for four rows or more, forward below).
class StandInBackend final : public LinearBackend {
 public:
  // `k_multiple`: a layer rule as cuBLASLt's FP8 ones (k a multiple of 16),
  // answered by SupportsProblem.
  explicit StandInBackend(std::string name = "standin",
                          BackendKind kind = BackendKind::kHostEmulation, int64_t k_multiple = 1)
      : name_(std::move(name)), kind_(kind), k_multiple_(k_multiple) {}

  absl::string_view name() const override { return name_; }
  BackendKind kind() const override { return kind_; }
  absl::Status SupportsProblem(const LinearProblem& problem, const Config& config) const override {
    if (problem.k % k_multiple_ != 0) {
      return absl::FailedPreconditionError(absl::StrCat("configuration ", config.ToString(),
                                                        ": k must be a multiple of ", k_multiple_));
    }
    return absl::OkStatus();
  }
  absl::Status Available() const override { return absl::OkStatus(); }
  std::vector<Precision> precisions() const override { return {Precision::kFp32}; }
  std::vector<BiasMode> bias_modes() const override { return {BiasMode::kNone}; }
  BiasMode default_bias_mode() const override { return BiasMode::kNone; }
  std::vector<DType> storage_dtypes() const override { return {DType::kFloat32}; }
  bool selects_algorithms() const override { return true; }

  static std::vector<Order> Heuristic(int64_t m) {
    return m >= 4 ? std::vector<Order>{Order::kReverse, Order::kForward, Order::kSplitK2}
                  : std::vector<Order>{Order::kForward, Order::kReverse, Order::kSplitK2};
  }

  using LinearBackend::Algorithms;
  absl::StatusOr<std::vector<AlgorithmInfo>> Algorithms(const LinearProblem& problem,
                                                        const PreparedRun& /*prepared*/,
                                                        const RunOptions& /*options*/,
                                                        int limit) override {
    std::vector<AlgorithmInfo> out;
    const std::vector<Order> orders = Heuristic(problem.m);
    for (int i = 0; i < limit && i < static_cast<int>(orders.size()); ++i) {
      out.push_back({i, {{"algo", OrderName(orders[static_cast<size_t>(i)])}}});
    }
    return out;
  }

  absl::StatusOr<RunResult> Run(const LinearProblem& p, const Config& config,
                                const RunOptions& /*options*/) override {
    const std::vector<Order> orders = Heuristic(p.m);
    const size_t algo = static_cast<size_t>(config.algo.value_or(0));
    if (algo >= orders.size()) {
      return absl::FailedPreconditionError(absl::StrCat("algo=", algo, " out of range"));
    }
    ++runs;
    const std::vector<float> x(p.input->data<float>(), p.input->data<float>() + p.m * p.k);
    const std::vector<float> w(p.weight->data<float>(), p.weight->data<float>() + p.n * p.k);
    RunResult r;
    absl::StatusOr<Tensor> y =
        FromFloats(DType::kFloat32, {p.m, p.n}, Linear(x, w, p.m, p.n, p.k, orders[algo]));
    if (!y.ok()) return y.status();
    r.output = *std::move(y);
    r.details = {{"algo", OrderName(orders[algo])}, {"kernel_ms", "0.1"}};
    return r;
  }

  int runs = 0;

 private:
  const std::string name_;
  const BackendKind kind_;
  const int64_t k_multiple_;
};

class AlgorithmsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto standin = std::make_unique<StandInBackend>();
    standin_ = standin.get();
    auto cpu = CpuBackend::Create(CpuBackend::Options{});
    ASSERT_THAT(cpu, IsOk());
    ASSERT_THAT(registry_.Register(*std::move(cpu)), IsOk());
    ASSERT_THAT(registry_.Register(std::move(standin)), IsOk());
    auto device = std::make_unique<StandInBackend>("device", BackendKind::kDevice, 16);
    device_ = device.get();
    ASSERT_THAT(registry_.Register(std::move(device)), IsOk());
    auto engine = Engine::Create(EngineOptions{}, &registry_);
    ASSERT_THAT(engine, IsOk());
    engine_ = std::move(engine).value();
  }

  // Values of mixed signs and magnitudes, so that the orders part often.
  static std::vector<float> Random(int64_t count, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> v(static_cast<size_t>(count));
    for (float& f : v) f = normal(rng) * std::exp2(static_cast<float>(rng() % 9) - 4.0f);
    return v;
  }

  LinearRequest Request(int64_t m, int64_t n, int64_t k) {
    x_ = Random(m * k, 7);
    w_ = Random(n * k, 8);
    LinearRequest r;
    r.input = *FromFloats(DType::kFloat32, {m, k}, x_);
    r.weight = *FromFloats(DType::kFloat32, {n, k}, w_);
    return r;
  }

  // Largest ULP distance (fp32) between two outputs, counted by hand:
  // distance of the ordered integer images of the bit patterns.
  static uint64_t MaxUlp(const std::vector<float>& a, const std::vector<float>& b) {
    auto ordered = [](float f) {
      int32_t i;
      std::memcpy(&i, &f, sizeof(i));
      return i < 0 ? int64_t{INT32_MIN} - i : int64_t{i};
    };
    uint64_t most = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      most = std::max<uint64_t>(most,
                                static_cast<uint64_t>(std::llabs(ordered(a[i]) - ordered(b[i]))));
    }
    return most;
  }

  BackendRegistry registry_;
  StandInBackend* standin_ = nullptr;
  StandInBackend* device_ = nullptr;  // refuses k not a multiple of 16
  std::unique_ptr<Engine> engine_;
  std::vector<float> x_, w_;
};

TEST_F(AlgorithmsTest, SweepFindsTheKernelThatReproducesTheOutputAndRanksItFirst) {
  const int64_t m = 16, n = 24, k = 257;
  LinearRequest r = Request(m, n, k);
  // The output of the split-K kernel: the heuristic's third choice, so a
  // run without a sweep never makes it.
  const std::vector<float> observed = Linear(x_, w_, m, n, k, Order::kSplitK2);
  ASSERT_GT(MaxUlp(observed, Linear(x_, w_, m, n, k, Order::kReverse)), 0u);
  r.observed = *FromFloats(DType::kFloat32, {m, n}, observed);
  r.configs = {"standin:fp32", "cpu:fp32"};
  r.algorithm_sweep = 3;
  auto out = engine_->Diagnose(r);
  ASSERT_THAT(out, IsOk());
  std::vector<std::string> ran;
  for (const ConfigOutcome& c : out->results) ran.push_back(c.config);
  EXPECT_THAT(ran, ElementsAre("standin:fp32:none@algo=0", "standin:fp32:none@algo=1",
                               "standin:fp32:none@algo=2", "cpu:fp32:none"));
  const DiagnosisOutcome& d = *out->diagnosis;
  ASSERT_TRUE(d.best.has_value()) << d.explanation;
  EXPECT_EQ(*d.best, "standin:fp32:none@algo=2");
  ASSERT_FALSE(d.ranking.empty());
  EXPECT_EQ(d.ranking[0].config, "standin:fp32:none@algo=2");
  EXPECT_TRUE(d.ranking[0].exact);
  EXPECT_EQ(d.ranking[0].bitwise_equal_fraction, 1.0);
  EXPECT_EQ(d.ranking[0].details.at("algo"), "splitk2");
  EXPECT_EQ(d.ranking[0].details.count("kernel_ms"), 0u);  // timings are not the kernel
  for (size_t i = 1; i < d.ranking.size(); ++i) {
    EXPECT_FALSE(d.ranking[i].exact) << d.ranking[i].config;
  }
}

TEST_F(AlgorithmsTest, WithoutASweepTheOutputIsOnlyConsistentNotReproduced) {
  const int64_t m = 16, n = 24, k = 257;
  LinearRequest r = Request(m, n, k);
  r.observed = *FromFloats(DType::kFloat32, {m, n}, Linear(x_, w_, m, n, k, Order::kSplitK2));
  r.configs = {"standin:fp32"};
  auto out = engine_->Diagnose(r);
  ASSERT_THAT(out, IsOk());
  ASSERT_EQ(out->results.size(), 1u);
  EXPECT_EQ(out->results[0].config, "standin:fp32:none");
  ASSERT_FALSE(out->diagnosis->ranking.empty());
  EXPECT_FALSE(out->diagnosis->ranking[0].exact);
  EXPECT_LT(out->diagnosis->ranking[0].bitwise_equal_fraction, 1.0);
}

TEST_F(AlgorithmsTest, NamedAlgorithmRunsThatKernelAndBackendsWithOneRefuseOthers) {
  const int64_t m = 2, n = 5, k = 64;
  LinearRequest r = Request(m, n, k);
  r.configs = {"standin:fp32@algo=1"};
  r.return_outputs = true;
  auto out = engine_->Verify(r);
  ASSERT_THAT(out, IsOk());
  // Two rows: the heuristic's list is forward, reverse, split-K.
  const std::vector<float> reverse = Linear(x_, w_, m, n, k, Order::kReverse);
  const Tensor& y = *out->results[0].output;
  EXPECT_EQ(std::memcmp(y.raw(), reverse.data(), reverse.size() * sizeof(float)), 0);
  r.configs = {"cpu:fp32@algo=1"};
  EXPECT_THAT(engine_->Verify(r), StatusIs(absl::StatusCode::kFailedPrecondition,
                                           AllOf(HasSubstr("configs[0]"), HasSubstr("algo=0"))));
  // A CPU configuration in a sweep runs its one algorithm.
  r.configs = {"cpu:fp32"};
  r.algorithm_sweep = 4;
  auto swept = engine_->Verify(r);
  ASSERT_THAT(swept, IsOk());
  ASSERT_EQ(swept->results.size(), 1u);
  EXPECT_EQ(swept->results[0].config, "cpu:fp32:none");
}

TEST_F(AlgorithmsTest, SweepLimitsAreCheckedBeforeAnythingRuns) {
  LinearRequest r = Request(4, 4, 8);
  r.configs = {"standin:fp32"};
  r.algorithm_sweep = 17;
  EXPECT_THAT(engine_->Verify(r),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("algorithm_sweep")));
  r.algorithm_sweep = -1;
  EXPECT_THAT(engine_->Verify(r),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("algorithm_sweep")));
  EXPECT_EQ(standin_->runs, 0);
}

TEST_F(AlgorithmsTest, BatchInvarianceReportsRowsThatChangeWithTheHeuristicsChoice) {
  const int64_t m = 8, n = 6, k = 301;
  LinearRequest r = Request(m, n, k);
  r.configs = {"standin:fp32", "standin:fp32@algo=2"};
  r.batch_invariance = true;
  r.batch_sizes = {4, 2};
  auto out = engine_->Verify(r);
  ASSERT_THAT(out, IsOk());
  // Unpinned: 8 and 4 rows run the reverse kernel, 2 and 1 the forward
  // one. Every row differs where the two orders part in some column.
  const std::vector<float> reverse = Linear(x_, w_, m, n, k, Order::kReverse);
  const std::vector<float> forward = Linear(x_, w_, m, n, k, Order::kForward);
  int64_t rows_parting = 0;
  for (int64_t row = 0; row < m; ++row) {
    rows_parting += std::memcmp(&reverse[row * n], &forward[row * n], n * sizeof(float)) != 0;
  }
  ASSERT_GT(rows_parting, 0);
  const BatchInvarianceOutcome& b = *out->results[0].batch_invariance;
  EXPECT_FALSE(b.invariant);
  EXPECT_EQ(b.rows, m);
  EXPECT_EQ(b.rows_differing, rows_parting);
  EXPECT_EQ(b.max_ulp, MaxUlp(reverse, forward));
  EXPECT_EQ(b.full_batch_details.at("algo"), "reverse");
  EXPECT_EQ(b.full_batch_details.count("kernel_ms"), 0u);
  ASSERT_EQ(b.sub_batches.size(), 3u);  // 1, 2, 4: ascending, single rows always
  EXPECT_EQ(b.sub_batches[0].batch_size, 1);
  EXPECT_EQ(b.sub_batches[0].runs, 8);
  EXPECT_EQ(b.sub_batches[0].details.at("algo"), "forward");
  EXPECT_EQ(b.sub_batches[0].rows_differing, rows_parting);
  EXPECT_EQ(b.sub_batches[1].batch_size, 2);
  EXPECT_EQ(b.sub_batches[1].runs, 4);
  EXPECT_EQ(b.sub_batches[1].rows_differing, rows_parting);
  EXPECT_EQ(b.sub_batches[2].batch_size, 4);
  EXPECT_EQ(b.sub_batches[2].details.at("algo"), "reverse");
  EXPECT_EQ(b.sub_batches[2].rows_differing, 0);
  EXPECT_EQ(b.sub_batches[2].max_ulp, 0u);
  // Pinned to the split-K kernel, which every batch size lists third: the
  // rows keep their bits.
  const BatchInvarianceOutcome& pinned = *out->results[1].batch_invariance;
  EXPECT_TRUE(pinned.invariant);
  EXPECT_EQ(pinned.rows_differing, 0);
  // The reference (cpu:fp64) is checked too.
  ASSERT_TRUE(out->reference.batch_invariance.has_value());
}

TEST_F(AlgorithmsTest, BatchSizesAreCheckedAndAShortLastRunIsReported) {
  const int64_t m = 7, n = 3, k = 40;
  LinearRequest r = Request(m, n, k);
  r.configs = {"standin:fp32"};
  r.batch_invariance = true;
  r.batch_sizes = {8};
  EXPECT_THAT(engine_->Verify(r),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("batch_invariance.batch_sizes[0]"), HasSubstr("1..7"))));
  r.batch_sizes = {0};
  EXPECT_THAT(engine_->Verify(r), StatusIs(absl::StatusCode::kInvalidArgument,
                                           HasSubstr("batch_invariance.batch_sizes[0]")));
  r.batch_sizes = {5};
  auto out = engine_->Verify(r);
  ASSERT_THAT(out, IsOk());
  const SubBatchOutcome& five = out->results[0].batch_invariance->sub_batches[1];
  EXPECT_EQ(five.batch_size, 5);
  EXPECT_EQ(five.runs, 2);
  EXPECT_EQ(five.tail_rows, 2);
  EXPECT_EQ(five.details.at("algo"), "reverse");       // 5 rows
  EXPECT_EQ(five.tail_details.at("algo"), "forward");  // the last 2
  r.batch_invariance = false;
  EXPECT_THAT(engine_->Verify(r),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("batch_invariance")));
}

// What the CPU emulation does, measured rather than assumed. Its fp32
// accumulation is OpenBLAS's sgemm, whose kernels (edge tiles, thread
// splits) depend on the shape, so a row's bits may change with the batch:
// the report must agree with sgemm called directly on the whole batch and
// on the sub-batches. fp16acc runs this project's own loops, one dot
// product per element in one order, so it keeps every row's bits
// (docs/numerics.md, "Batch invariance").
TEST_F(AlgorithmsTest, CpuEmulationReportsWhatOpenBlasDoesAndFp16AccIsInvariant) {
  const int64_t m = 37, n = 19, k = 300;
  LinearRequest r = Request(m, n, k);
  r.configs = {"cpu:fp32", "cpu:fp16acc"};
  r.batch_invariance = true;
  r.batch_sizes = {3, 16};
  auto out = engine_->Verify(r);
  ASSERT_THAT(out, IsOk());
  auto sgemm = [&](int64_t first, int64_t rows) {
    std::vector<float> y(static_cast<size_t>(rows * n));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows),
                static_cast<int>(n), static_cast<int>(k), 1.0f, &x_[first * k], static_cast<int>(k),
                w_.data(), static_cast<int>(k), 0.0f, y.data(), static_cast<int>(n));
    return y;
  };
  const std::vector<float> whole = sgemm(0, m);
  const BatchInvarianceOutcome& fp32 = *out->results[0].batch_invariance;
  ASSERT_EQ(fp32.sub_batches.size(), 3u);
  for (const SubBatchOutcome& sub : fp32.sub_batches) {
    int64_t differing = 0;
    for (int64_t first = 0; first < m; first += sub.batch_size) {
      const int64_t rows = std::min(sub.batch_size, m - first);
      const std::vector<float> part = sgemm(first, rows);
      for (int64_t row = 0; row < rows; ++row) {
        differing += std::memcmp(&part[row * n], &whole[(first + row) * n], n * sizeof(float)) != 0;
      }
    }
    EXPECT_EQ(sub.rows_differing, differing) << "batch size " << sub.batch_size;
  }
  const BatchInvarianceOutcome& fp16acc = *out->results[1].batch_invariance;
  EXPECT_TRUE(fp16acc.invariant) << fp16acc.rows_differing << " rows differ";
}

TEST_F(AlgorithmsTest, LayerRulesAreCheckedBeforeRunningAndDefaultCandidatesAvoidThem) {
  // k = 300: the device stand-in refuses the layer. Named, it is an error
  // before anything runs; in a default candidate set, fp32 goes to the CPU.
  LinearRequest r = Request(4, 8, 300);
  r.configs = {"device:fp32"};
  EXPECT_THAT(engine_->Verify(r),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("configs[0]"), HasSubstr("multiple of 16"))));
  EXPECT_EQ(device_->runs, 0);
  r.configs.clear();
  r.observed = *FromFloats(DType::kFloat32, {4, 8}, Linear(x_, w_, 4, 8, 300, Order::kForward));
  auto refused = engine_->Diagnose(r);
  ASSERT_THAT(refused, IsOk());
  std::vector<std::string> ran;
  for (const ConfigOutcome& c : refused->results) ran.push_back(c.config);
  EXPECT_THAT(ran, ::testing::Contains("cpu:fp32:none"));
  EXPECT_THAT(ran, ::testing::Not(::testing::Contains("device:fp32:none")));
  EXPECT_EQ(device_->runs, 0);
  // The ranking says which device configuration the CPU one stands in for,
  // and why: the device's own refusal.
  ASSERT_TRUE(refused->diagnosis.has_value());
  bool noted = false;
  for (const RankedCandidate& c : refused->diagnosis->ranking) {
    if (c.config != "cpu:fp32:none") continue;
    ASSERT_EQ(c.details.count("passed_over"), 1u);
    EXPECT_THAT(c.details.at("passed_over"),
                AllOf(::testing::StartsWith("device:fp32:none: "), HasSubstr("multiple of 16")));
    noted = true;
  }
  EXPECT_TRUE(noted) << "cpu:fp32:none is not in the ranking";
  // k = 304: the device runs fp32 (a device backend before the CPU).
  LinearRequest ok = Request(4, 8, 304);
  ok.observed = *FromFloats(DType::kFloat32, {4, 8}, Linear(x_, w_, 4, 8, 304, Order::kForward));
  auto accepted = engine_->Diagnose(ok);
  ASSERT_THAT(accepted, IsOk());
  ran.clear();
  for (const ConfigOutcome& c : accepted->results) ran.push_back(c.config);
  EXPECT_THAT(ran, ::testing::Contains("device:fp32:none"));
  EXPECT_THAT(ran, ::testing::Not(::testing::Contains("cpu:fp32:none")));
  for (const RankedCandidate& c : accepted->diagnosis->ranking) {
    EXPECT_EQ(c.details.count("passed_over"), 0u) << c.config;
  }
}

TEST(SupportsTest, AMultiPassPrecisionOnABackendWithoutItSaysWhereItRuns) {
  // As the cuda backends, which do not list the multi-pass precisions.
  const StandInBackend backend;
  EXPECT_THAT(
      backend.Supports(Config{"standin", Precision::kBf16x3, BiasMode::kNone}, DType::kFloat32),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               HasSubstr("does not run precision bf16x3 on this host (the multi-pass "
                         "precisions run on the cpu backend only, for now)")));
}

}  // namespace
}  // namespace tensorcheck
