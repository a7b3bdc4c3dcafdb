// Statistics pass vs memcpy, in one run.
//
// Compare() over 2^24 fp32 pairs (actual = expected moved by a few ULPs, as
// two runs of one GEMM differ) against std::memcpy of the same two arrays.
// Bandwidth is input bytes (both arrays, 128 MiB) over the best wall time
// of several repetitions; the target is Compare >= 0.5 x memcpy. "ratio"
// is Compare's bandwidth over memcpy's (best times), "med ratio" the same
// with median times; cpu/wall is process CPU time over wall time (about
// the number of threads that really ran at once). Compare runs on an
// Executor of T threads (0: one per core), made once as the server does.
// "+ near zero" is Compare again after one pair is made a sign flip near
// zero: a billion-ULP figure, which adds the passes that find the elements
// near zero (docs/numerics.md, "ULP figures and elements near zero").
//
//   stats_bench [--n=LOG2_ELEMENTS] [--reps=R] [--threads=T]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <thread>
#include <vector>

#include "benchmark/benchmark.h"
#include "core/executor.h"
#include "core/float_formats.h"
#include "core/tensor.h"
#include "server/stats/diff_stats.h"

namespace tensorcheck {
namespace {

using Clock = std::chrono::steady_clock;

// Wall times of `reps` runs, and the process CPU time over their sum: ~1
// for one thread; ~T when T threads really ran at once (less when other
// processes hold the cores).
struct Timing {
  double best = 0;
  double median = 0;
  double cpu_per_wall = 0;
};

double ProcessCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

template <typename F>
Timing Time(int reps, F&& f) {
  std::vector<double> walls;
  const double cpu0 = ProcessCpuSeconds();
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    f();
    walls.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  const double cpu = ProcessCpuSeconds() - cpu0;
  Timing t;
  double sum = 0;
  for (double w : walls) sum += w;
  t.cpu_per_wall = cpu / sum;
  std::sort(walls.begin(), walls.end());
  t.best = walls.front();
  t.median = walls[walls.size() / 2];
  return t;
}

int Main(int argc, char** argv) {
  int log2n = 24;
  int reps = 7;
  int threads = 0;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--n=", 4) == 0)
      log2n = std::atoi(argv[i] + 4);
    else if (std::strncmp(argv[i], "--reps=", 7) == 0)
      reps = std::atoi(argv[i] + 7);
    else if (std::strncmp(argv[i], "--threads=", 10) == 0)
      threads = std::atoi(argv[i] + 10);
    else {
      std::fprintf(stderr, "usage: %s [--n=LOG2] [--reps=R] [--threads=T]\n", argv[0]);
      return 2;
    }
  }
  if (log2n < 10 || log2n > 30 || reps < 1 || threads < 0) {
    std::fprintf(stderr, "--n in [10, 30], --reps >= 1, --threads >= 0\n");
    return 2;
  }
  const int64_t n = int64_t{1} << log2n;
  const int64_t cols = 4096 < n ? 4096 : n;

  auto expected = Tensor::Create(DType::kFloat32, {n / cols, cols});
  auto actual = Tensor::Create(DType::kFloat32, {n / cols, cols});
  auto dst_a = Tensor::Create(DType::kFloat32, {n});
  auto dst_e = Tensor::Create(DType::kFloat32, {n});
  if (!expected.ok() || !actual.ok() || !dst_a.ok() || !dst_e.ok()) {
    std::fprintf(stderr, "allocation failed\n");
    return 1;
  }
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> ulps(-3, 3);
  float* e = expected->data<float>();
  float* a = actual->data<float>();
  for (int64_t i = 0; i < n; ++i) {
    e[i] = normal(rng);
    a[i] = BitsToFloat(FloatBits(e[i]) + ulps(rng));
  }
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  // Touch the destinations once so page faults are not timed.
  std::memset(dst_a->raw(), 0, bytes);
  std::memset(dst_e->raw(), 0, bytes);

  auto pool = Executor::Create({threads});
  if (!pool.ok()) {
    std::fprintf(stderr, "%s\n", pool.status().ToString().c_str());
    return 1;
  }
  Executor* const executor = pool->get();

  CompareOptions opts;
  opts.tolerance = ResolveTolerance(TolerancePreset::kTorch, DType::kFloat32);
  opts.compared_dtype = DType::kFloat32;
  opts.cols = cols;

  DiffStats last;
  // On `e`; null: on this thread alone.
  auto run_compare = [&](Executor* e) {
    CompareOptions o = opts;
    o.executor = e;
    auto s = Compare(*actual, *expected, o);
    if (!s.ok()) {
      std::fprintf(stderr, "%s\n", s.status().ToString().c_str());
      std::exit(1);
    }
    last = std::move(s).value();
    benchmark::DoNotOptimize(last);
  };
  auto run_memcpy = [&] {
    std::memcpy(dst_a->raw(), actual->raw(), bytes);
    std::memcpy(dst_e->raw(), expected->raw(), bytes);
    benchmark::DoNotOptimize(dst_a->raw());
    benchmark::DoNotOptimize(dst_e->raw());
    benchmark::ClobberMemory();
  };

  // Warm up both, then time them interleaved-free but back to back.
  run_memcpy();
  run_compare(executor);
  const Timing t_memcpy = Time(reps, run_memcpy);
  const Timing t_compare = Time(reps, [&] { run_compare(executor); });
  const Timing t_compare1 = Time(reps, [&] { run_compare(nullptr); });
  // One sign flip near zero: a ULP distance in the billions, so Compare
  // also looks for the elements near zero (diff_stats.h, NegligibleElements).
  const DiffStats few_ulp = last;
  e[0] = 1e-30f;
  a[0] = -1e-30f;
  run_compare(executor);
  const Timing t_near = Time(reps, [&] { run_compare(executor); });

  const double in_bytes = 2.0 * static_cast<double>(bytes);
  const double gib = 1024.0 * 1024.0 * 1024.0;
  const double bw_memcpy = in_bytes / t_memcpy.best / gib;
  const double bw_compare = in_bytes / t_compare.best / gib;
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  double load1 = -1;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &load1) != 1) load1 = -1;
    std::fclose(f);
  }

  std::printf(
      "stats_bench: %lld fp32 pairs (%.0f MiB in), %d reps, "
      "%u hardware threads, load average %.2f\n",
      static_cast<long long>(n), in_bytes / (1024.0 * 1024.0), reps, hw, load1);
  std::printf("%-24s %9s %9s %9s %8s %9s %8s\n", "case", "best ms", "median ms", "GiB/s", "ratio",
              "med ratio", "cpu/wall");
  auto row = [&](const char* label, const Timing& t) {
    std::printf("%-24s %9.2f %9.2f %9.2f %8.2f %9.2f %8.2f\n", label, t.best * 1e3, t.median * 1e3,
                in_bytes / t.best / gib, t_memcpy.best / t.best, t_memcpy.median / t.median,
                t.cpu_per_wall);
  };
  row("memcpy (baseline)", t_memcpy);
  char label[64];
  std::snprintf(label, sizeof(label), "Compare threads=%d%s", executor->size(),
                threads == 0 ? " (auto)" : "");
  row(label, t_compare);
  row("Compare threads=1", t_compare1);
  std::snprintf(label, sizeof(label), "+ near zero threads=%d", executor->size());
  row(label, t_near);
  std::printf("target: Compare/memcpy >= 0.50 -> %s\n",
              bw_compare / bw_memcpy >= 0.5 ? "met" : "NOT met");
  std::printf(
      "(check: mismatched=%lld max_ulp=%llu; near zero: %lld element(s), %llu ULP besides)\n",
      static_cast<long long>(few_ulp.mismatched), static_cast<unsigned long long>(few_ulp.max_ulp),
      static_cast<long long>(last.negligible ? last.negligible->differing : 0),
      static_cast<unsigned long long>(last.negligible ? last.negligible->significant_max_ulp
                                                      : last.max_ulp));
  return 0;
}

}  // namespace
}  // namespace tensorcheck

int main(int argc, char** argv) { return tensorcheck::Main(argc, argv); }
