// A request's StopSignal through the engine and the CPU backend: work stops
// soon after a cancel or a deadline, measured in CPU time (every thread of
// the process: OpenBLAS's, the statistics pool's, the request's) spent
// between the cancel and Verify's return; and requests too costly to run
// or to answer are refused before anything runs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <thread>
#include <vector>

#include "core/executor.h"
#include "server/engine/engine.h"
#include "server/stats/blas_gemm.h"
#include "tests/testing/stats_testing.h"
#include "tests/testing/status_matchers.h"

namespace tensorcheck {
namespace {

using ::tensorcheck::testing::IsOk;
using ::tensorcheck::testing::StatusIs;
using ::testing::HasSubstr;

double ProcessCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

// The bound the cancellation contract promises on the CPU backend
// (architecture.md, "Admission and cancellation"): at most the GEMM tile
// in progress (stats/blas_gemm.cc: 2^32 fp32 or 2^31 fp64 multiply-adds)
// and a statistics chunk. A tile's CPU time depends on the host and on
// its load (OpenBLAS's threads spin while a busy core keeps their partner
// waiting), so the bound is not a number of seconds: it is measured in the
// same process, under the same load, as the CPU time of one such tile run
// by itself, the slower of the fp32 and the fp64 one. The test allows two
// of them (one in progress at the cancel, one's worth of slack for the
// stages between tiles) plus a statistics chunk's 0.05 s.
// Instrumented statistics run several times slower under a sanitizer
// (scripts/sanitize.sh): that part of the bound scales with them.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr double kSanitizerSlowdown = 10;
#else
constexpr double kSanitizerSlowdown = 1;
#endif

// CPU seconds, all threads, of one tile-sized product of each precision:
// [1024, 4096] x [4096, 1024]^T (2^32 multiply-adds, one fp32 tile) and
// [1024, 2048] x [2048, 1024]^T (2^31, one fp64 tile).
double OneTileCpuSeconds() {
  auto time = [](auto zero, int64_t k) {
    using T = decltype(zero);
    const int64_t m = 1024, n = 1024;
    std::vector<T> x(static_cast<size_t>(m * k), T(0.5)), w(static_cast<size_t>(n * k), T(0.25));
    std::vector<T> c(static_cast<size_t>(m * n));
    const double before = ProcessCpuSeconds();
    EXPECT_THAT(BlasGemm(x.data(), w.data(), WeightLayout::kOutIn, m, n, k, c.data(), nullptr),
                IsOk());
    return ProcessCpuSeconds() - before;
  };
  time(0.0f, 4096);  // OpenBLAS starts its threads
  const double f = time(0.0f, 4096), d = time(0.0, 2048);
  std::printf("one tile: fp32 %.3f s, fp64 %.3f s of CPU\n", f, d);
  return std::max(f, d);
}

double MaxCpuSecondsAfterStop() {
  static const double bound = 2 * OneTileCpuSeconds() + 0.05 * kSanitizerSlowdown;
  return bound;
}

class CancellationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_THAT(RegisterBuiltinBackends(&registry_), IsOk());
    auto pool = Executor::Create({/*threads=*/2});
    ASSERT_THAT(pool, IsOk());
    pool_ = std::move(pool).value();
    EngineOptions options;
    options.executor = pool_.get();
    auto engine = Engine::Create(options, &registry_);
    ASSERT_THAT(engine, IsOk());
    engine_ = std::move(engine).value();
  }

  // The size of the case that used to compute for 9 s after its client's
  // deadline: 1024x4096 -> 4096 with eight configurations.
  static LinearRequest Large() {
    LinearRequest r;
    r.input = ::tensorcheck::testing::RandomNormal({1024, 4096}, 1.0, 1, DType::kFloat32);
    r.weight = ::tensorcheck::testing::RandomNormal({4096, 4096}, 1.0 / 64, 2, DType::kFloat32);
    r.bias = ::tensorcheck::testing::RandomNormal({4096}, 0.5, 3, DType::kFloat32);
    r.configs = {"cpu:fp32",       "cpu:tf32:fused",   "cpu:bf16:fused",    "cpu:bf16:unfused",
                 "cpu:fp16:fused", "cpu:fp16:unfused", "cpu:fp16acc:fused", "cpu:fp64:unfused"};
    return r;
  }

  BackendRegistry registry_;
  std::unique_ptr<Executor> pool_;
  std::unique_ptr<Engine> engine_;
};

TEST_F(CancellationTest, CancelledVerifyStopsWithinTheBoundAtEveryStage) {
  const LinearRequest request = Large();
  // Cancels early (the reference's fp64 GEMM), in the middle (the
  // candidates' GEMMs and comparisons) and late (fp16 accumulation).
  MaxCpuSecondsAfterStop();  // measured before anything else runs
  for (double after_seconds : {0.05, 0.6, 2.5}) {
    StopSignal stop;
    double cpu_at_cancel = 0;
    std::thread canceller([&] {
      absl::SleepFor(absl::Seconds(after_seconds));
      cpu_at_cancel = ProcessCpuSeconds();
      stop.Cancel(StopSignal::Reason::kClientCancelled);
    });
    absl::StatusOr<VerifyOutcome> outcome = engine_->Verify(request, &stop);
    const double cpu_at_return = ProcessCpuSeconds();
    canceller.join();
    ASSERT_THAT(outcome, StatusIs(absl::StatusCode::kCancelled)) << "after " << after_seconds;
    EXPECT_TRUE(IsStopStatus(outcome.status()));
    const double after_stop = cpu_at_return - cpu_at_cancel;
    std::printf("cancel after %.2f s: %.3f s of CPU after the cancel (bound %.3f s)\n",
                after_seconds, after_stop, MaxCpuSecondsAfterStop());
    EXPECT_LE(after_stop, MaxCpuSecondsAfterStop()) << "cancel after " << after_seconds << " s";
  }
}

TEST_F(CancellationTest, DeadlineStopsDiagnoseWithDeadlineExceeded) {
  LinearRequest request = Large();
  request.configs.clear();  // the default candidate set
  request.observed = ::tensorcheck::testing::RandomNormal({1024, 4096}, 1.0, 4, DType::kFloat32);
  StopSignal stop(absl::Now() + absl::Milliseconds(400));
  absl::StatusOr<VerifyOutcome> outcome = engine_->Diagnose(request, &stop);
  EXPECT_THAT(outcome, StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_TRUE(IsStopStatus(outcome.status()));
}

TEST_F(CancellationTest, ARequestAlreadyStoppedRunsNothing) {
  StopSignal stop;
  stop.Cancel(StopSignal::Reason::kShutdown);
  const LinearRequest request = Large();
  const double bound = MaxCpuSecondsAfterStop();
  const double before = ProcessCpuSeconds();
  EXPECT_THAT(engine_->Verify(request, &stop), StatusIs(absl::StatusCode::kCancelled));
  EXPECT_LE(ProcessCpuSeconds() - before, bound);
}

TEST(CostLimitsTest, WorkOverTheLimitIsRefusedBeforeRunning) {
  BackendRegistry registry;
  ASSERT_THAT(RegisterBuiltinBackends(&registry), IsOk());
  EngineOptions options;
  // 64x64 -> 64 is 2^18 multiply-adds; four runs (3 configs and the
  // reference) of 4 repeats exceed 2^21.
  options.limits.max_work_macs = int64_t{1} << 21;
  auto engine = Engine::Create(options, &registry);
  ASSERT_THAT(engine, IsOk());
  LinearRequest r;
  r.input = ::tensorcheck::testing::RandomNormal({64, 64}, 1.0, 1, DType::kFloat32);
  r.weight = ::tensorcheck::testing::RandomNormal({64, 64}, 0.1, 2, DType::kFloat32);
  r.configs = {"cpu:fp32", "cpu:bf16", "cpu:tf32"};
  r.repeat = 4;
  EXPECT_THAT((*engine)->Verify(r),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("work: M*N*K = 262144")));
  r.repeat = 1;  // 4 runs x 2^18 = 2^20: within
  EXPECT_THAT((*engine)->Verify(r), IsOk());
}

TEST(CostLimitsTest, AResponseOverTheMessageLimitIsRefusedBeforeRunning) {
  BackendRegistry registry;
  ASSERT_THAT(RegisterBuiltinBackends(&registry), IsOk());
  EngineOptions options;
  options.limits.max_message_bytes = 1 << 20;
  auto engine = Engine::Create(options, &registry);
  ASSERT_THAT(engine, IsOk());
  LinearRequest r;
  // Outputs of 256x512 fp32 = 512 KiB: the reference's and two configs'
  // are 1.5 MiB, over 1 MiB; without return_outputs the response is small.
  r.input = ::tensorcheck::testing::RandomNormal({256, 32}, 1.0, 1, DType::kFloat32);
  r.weight = ::tensorcheck::testing::RandomNormal({512, 32}, 0.1, 2, DType::kFloat32);
  r.configs = {"cpu:fp32", "cpu:bf16"};
  r.return_outputs = true;
  EXPECT_THAT((*engine)->Verify(r),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("output.return_outputs")));
  r.return_outputs = false;
  EXPECT_THAT((*engine)->Verify(r), IsOk());
  // One configuration and the reference: 1 MiB of outputs plus statistics,
  // still over; a diagnosis returns two outputs as well.
  r.return_outputs = true;
  r.configs = {"cpu:fp32"};
  EXPECT_THAT((*engine)->Verify(r), StatusIs(absl::StatusCode::kResourceExhausted));
}

}  // namespace
}  // namespace tensorcheck
