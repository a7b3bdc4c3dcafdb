// `cpu:fp32` through CpuBackend::Run against the bare OpenBLAS sgemm on the
// same data, in one run: M=1024, K=4096, N=4096, fp32 storage, fused bias.
// Prints the ratio backend time / bare sgemm time (target <= 1.1).
//
//   build-cpu/bench/gemm_bench
//
// The ratio comes from BM_PairedBackendVsBare, which alternates the two so
// that a shared machine's load falls on both alike.
//
// `cpu:fp16acc` (fp16 accumulation, rounded after every multiply-add):
// BM_Fp16AccFast (the AVX2 path where the CPU has it) and BM_Fp16AccScalar
// (the portable path, forced with TENSORCHECK_FP16ACC_SCALAR=1), one run
// each at M=1921, K=4096, N=3072, fp16 storage; prints scalar/fast. The
// scalar run takes minutes; select with
//   build-cpu/bench/gemm_bench --benchmark_filter=Fp16Acc
//
// FP8 (`cpu:fp8e4m3` with row-wise scaling, bf16 operands quantised by the
// recipe, M=256, K=4096, N=1024): BM_Fp8Split (split accumulation, an
// fp32 GEMM of the exact products), BM_Fp8Fast (fast accumulation, the
// AVX2 kernel where the CPU has it) and BM_Fp8FastScalar (fast
// accumulation by FastAccumDot per element, forced with
// TENSORCHECK_FP8ACC_SCALAR=1); prints fast/split and scalar/fast (best
// of each benchmark's iterations) and whether the fast outputs agree bit
// for bit. The scalar run takes tens of seconds; select with
//   build-cpu/bench/gemm_bench --benchmark_filter=Fp8
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "server/backends/cpu/cpu_backend.h"

namespace tensorcheck {
namespace {

constexpr int64_t kM = 1024;
constexpr int64_t kK = 4096;
constexpr int64_t kN = 4096;

struct Data {
  Tensor x, w, b;
};

const Data& GetData() {
  static const Data* data = [] {
    std::mt19937 rng(1);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    auto fill = [&](int64_t count) {
      std::vector<float> v(static_cast<size_t>(count));
      for (float& f : v) f = normal(rng);
      return v;
    };
    auto* d = new Data;
    d->x = *FromFloats(DType::kFloat32, {kM, kK}, fill(kM * kK));
    d->w = *FromFloats(DType::kFloat32, {kN, kK}, fill(kN * kK));
    d->b = *FromFloats(DType::kFloat32, {kN}, fill(kN));
    return d;
  }();
  return *data;
}

double g_best_bare = std::numeric_limits<double>::infinity();
double g_best_backend = std::numeric_limits<double>::infinity();
std::vector<double> g_pair_ratios;  // backend / bare, one per paired iteration

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

void SetFlops(benchmark::State& state) {
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * kM * kN * kK * static_cast<double>(state.iterations()) * 1e-9,
                         benchmark::Counter::kIsRate);
}

// The baseline: y = x W^T, nothing else (no bias, no output allocation).
void BareSgemm(const Data& d, std::vector<float>& y) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, kM, kN, kK, 1.0f, d.x.data<float>(), kK,
              d.w.data<float>(), kK, 0.0f, y.data(), kN);
  benchmark::DoNotOptimize(y.data());
}

// The `cpu:fp32:fused` layer on the shared data.
LinearProblem Fp32Problem(const Data& d) {
  LinearProblem p;
  p.input = &d.x;
  p.weight = &d.w;
  p.bias = &d.b;
  p.output_dtype = DType::kFloat32;
  p.m = kM;
  p.n = kN;
  p.k = kK;
  return p;
}

void BM_BareSgemm(benchmark::State& state) {
  const Data& d = GetData();
  std::vector<float> y(static_cast<size_t>(kM * kN));
  for (auto _ : state) BareSgemm(d, y);
  SetFlops(state);
}

// `cpu:fp32:fused`: output allocation, sgemm, bias epilogue.
void BM_CpuBackendFp32(benchmark::State& state) {
  const Data& d = GetData();
  auto backend = CpuBackend::Create({});
  if (!backend.ok()) {
    state.SkipWithError(std::string(backend.status().message()).c_str());
    return;
  }
  const LinearProblem p = Fp32Problem(d);
  const Config config{"cpu", Precision::kFp32, BiasMode::kFused};
  for (auto _ : state) {
    auto r = (*backend)->Run(p, config, RunOptions{});
    if (!r.ok()) {
      state.SkipWithError(std::string(r.status().message()).c_str());
      return;
    }
    benchmark::DoNotOptimize(r->output.raw());
  }
  SetFlops(state);
}

// One bare sgemm and one backend run per iteration, in alternating order,
// so that load from other processes on a shared machine hits both alike;
// the printed ratio is the median over these pairs.
void BM_PairedBackendVsBare(benchmark::State& state) {
  const Data& d = GetData();
  auto backend = CpuBackend::Create({});
  if (!backend.ok()) {
    state.SkipWithError(std::string(backend.status().message()).c_str());
    return;
  }
  const LinearProblem p = Fp32Problem(d);
  const Config config{"cpu", Precision::kFp32, BiasMode::kFused};
  std::vector<float> y(static_cast<size_t>(kM * kN));
  bool bare_first = true;
  for (auto _ : state) {
    double bare = 0, ours = 0;
    for (int step = 0; step < 2; ++step) {
      const auto t0 = std::chrono::steady_clock::now();
      if ((step == 0) == bare_first) {
        BareSgemm(d, y);
        bare = Seconds(t0, std::chrono::steady_clock::now());
      } else {
        auto r = (*backend)->Run(p, config, RunOptions{});
        ours = Seconds(t0, std::chrono::steady_clock::now());
        if (!r.ok()) {
          state.SkipWithError(std::string(r.status().message()).c_str());
          return;
        }
        benchmark::DoNotOptimize(r->output.raw());
      }
    }
    bare_first = !bare_first;
    g_best_bare = std::min(g_best_bare, bare);
    g_best_backend = std::min(g_best_backend, ours);
    g_pair_ratios.push_back(ours / bare);
  }
}

// ---- cpu:fp16acc, fast path vs portable path.

constexpr int64_t kAccM = 1921;
constexpr int64_t kAccK = 4096;
constexpr int64_t kAccN = 3072;

struct AccData {
  Tensor x, w;
  int64_t m = 0, k = 0, n = 0;
};

// x [m, k] and w [n, k] of normal values, stored in `dtype`.
AccData* MakeAccData(uint32_t seed, DType dtype, int64_t m, int64_t k, int64_t n) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto fill = [&](int64_t count) {
    std::vector<float> v(static_cast<size_t>(count));
    for (float& f : v) f = normal(rng);
    return v;
  };
  auto* d = new AccData;
  d->x = *FromFloats(dtype, {m, k}, fill(m * k));
  d->w = *FromFloats(dtype, {n, k}, fill(n * k));
  d->m = m;
  d->k = k;
  d->n = n;
  return d;
}

const AccData& GetAccData() {
  static const AccData* data = MakeAccData(2, DType::kFloat16, kAccM, kAccK, kAccN);
  return *data;
}

// `config` on the CPU backend over `d`, output in d's dtype: the best time
// in `best`, the last output's bytes in `out` (null: not kept). With
// `scalar_env` set, that variable forces the emulation's scalar path.
void RunAccumulation(benchmark::State& state, const AccData& d, const Config& config,
                     const char* scalar_env, double* best, std::vector<uint8_t>* out) {
  auto backend = CpuBackend::Create({});
  if (!backend.ok()) {
    state.SkipWithError(std::string(backend.status().message()).c_str());
    return;
  }
  LinearProblem p;
  p.input = &d.x;
  p.weight = &d.w;
  p.output_dtype = d.x.dtype();
  p.m = d.m;
  p.n = d.n;
  p.k = d.k;
  if (scalar_env != nullptr) setenv(scalar_env, "1", 1);
  *best = std::numeric_limits<double>::infinity();
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    auto r = (*backend)->Run(p, config, RunOptions{});
    *best = std::min(*best, Seconds(t0, std::chrono::steady_clock::now()));
    if (!r.ok()) {
      state.SkipWithError(std::string(r.status().message()).c_str());
      *best = 0;
      break;
    }
    if (out != nullptr) {
      const auto* bytes = static_cast<const uint8_t*>(r->output.raw());
      out->assign(bytes, bytes + r->output.nbytes());
    }
  }
  if (scalar_env != nullptr) unsetenv(scalar_env);
}

double g_fp16acc_fast = 0, g_fp16acc_scalar = 0;
std::vector<uint8_t> g_fp16acc_fast_out, g_fp16acc_scalar_out;

void RunFp16Acc(benchmark::State& state, bool scalar, double* seconds, std::vector<uint8_t>* out) {
  RunAccumulation(state, GetAccData(), Config{"cpu", Precision::kFp16Acc, BiasMode::kNone},
                  scalar ? "TENSORCHECK_FP16ACC_SCALAR" : nullptr, seconds, out);
}

void BM_Fp16AccFast(benchmark::State& state) {
  RunFp16Acc(state, false, &g_fp16acc_fast, &g_fp16acc_fast_out);
}
void BM_Fp16AccScalar(benchmark::State& state) {
  RunFp16Acc(state, true, &g_fp16acc_scalar, &g_fp16acc_scalar_out);
}

// ---- cpu:fp8e4m3, split vs fast accumulation (vector and scalar).

constexpr int64_t kFp8M = 256;
constexpr int64_t kFp8K = 4096;
constexpr int64_t kFp8N = 1024;

const AccData& GetFp8Data() {
  static const AccData* data = MakeAccData(3, DType::kBFloat16, kFp8M, kFp8K, kFp8N);
  return *data;
}

// Best time of each FP8 benchmark, and the last output of the fast ones.
double g_fp8_split = 0, g_fp8_fast = 0, g_fp8_scalar = 0;
std::vector<uint8_t> g_fp8_fast_out, g_fp8_scalar_out;

void RunFp8(benchmark::State& state, bool fast, bool scalar, double* best,
            std::vector<uint8_t>* out) {
  Config config{"cpu", Precision::kFp8E4M3, BiasMode::kNone};
  config.scaling = Fp8Scaling::kRow;
  config.fast_accum = fast;
  RunAccumulation(state, GetFp8Data(), config, scalar ? "TENSORCHECK_FP8ACC_SCALAR" : nullptr, best,
                  out);
}

void BM_Fp8Split(benchmark::State& state) { RunFp8(state, false, false, &g_fp8_split, nullptr); }
void BM_Fp8Fast(benchmark::State& state) {
  RunFp8(state, true, false, &g_fp8_fast, &g_fp8_fast_out);
}
void BM_Fp8FastScalar(benchmark::State& state) {
  RunFp8(state, true, true, &g_fp8_scalar, &g_fp8_scalar_out);
}

// Fixed iterations (~0.2-0.7 s per GEMM on 2 cores; ~15 s in all).
BENCHMARK(BM_BareSgemm)->Unit(benchmark::kMillisecond)->Iterations(3)->UseRealTime();
BENCHMARK(BM_CpuBackendFp32)->Unit(benchmark::kMillisecond)->Iterations(3)->UseRealTime();
BENCHMARK(BM_PairedBackendVsBare)->Unit(benchmark::kMillisecond)->Iterations(10)->UseRealTime();
// One run each: the scalar path takes minutes on 2 cores.
BENCHMARK(BM_Fp16AccFast)->Unit(benchmark::kMillisecond)->Iterations(1)->UseRealTime();
BENCHMARK(BM_Fp16AccScalar)->Unit(benchmark::kMillisecond)->Iterations(1)->UseRealTime();
BENCHMARK(BM_Fp8Split)->Unit(benchmark::kMillisecond)->Iterations(5)->UseRealTime();
BENCHMARK(BM_Fp8Fast)->Unit(benchmark::kMillisecond)->Iterations(5)->UseRealTime();
// One run: the scalar model takes tens of seconds.
BENCHMARK(BM_Fp8FastScalar)->Unit(benchmark::kMillisecond)->Iterations(1)->UseRealTime();

}  // namespace
}  // namespace tensorcheck

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  using tensorcheck::g_best_backend;
  using tensorcheck::g_best_bare;
  std::vector<double> ratios = tensorcheck::g_pair_ratios;
  if (!ratios.empty()) {
    std::sort(ratios.begin(), ratios.end());
    const size_t n = ratios.size();
    const double median = n % 2 == 1 ? ratios[n / 2] : (ratios[n / 2 - 1] + ratios[n / 2]) / 2;
    std::printf(
        "cpu:fp32:fused 1024x4096->4096 vs bare cblas_sgemm, %zu alternating "
        "pairs: "
        "ratio backend/bare = %.3f (median of pairs; min/min %.3f: backend "
        "%.1f ms, "
        "bare %.1f ms); target <= 1.1\n",
        n, median, g_best_backend / g_best_bare, g_best_backend * 1e3, g_best_bare * 1e3);
  }
  if (tensorcheck::g_fp16acc_fast > 0 && tensorcheck::g_fp16acc_scalar > 0) {
    std::printf(
        "cpu:fp16acc 1921x4096->3072: fast %.2f s, scalar %.2f s, "
        "speed-up scalar/fast = %.1fx, outputs %s\n",
        tensorcheck::g_fp16acc_fast, tensorcheck::g_fp16acc_scalar,
        tensorcheck::g_fp16acc_scalar / tensorcheck::g_fp16acc_fast,
        tensorcheck::g_fp16acc_fast_out == tensorcheck::g_fp16acc_scalar_out ? "bitwise identical"
                                                                             : "DIFFER");
  } else if (tensorcheck::g_fp16acc_fast > 0) {
    std::printf("cpu:fp16acc 1921x4096->3072: fast %.2f s\n", tensorcheck::g_fp16acc_fast);
  }
  using tensorcheck::g_fp8_fast;
  using tensorcheck::g_fp8_scalar;
  using tensorcheck::g_fp8_split;
  if (g_fp8_split > 0 && g_fp8_fast > 0) {
    std::printf(
        "cpu:fp8e4m3 (row scaling) 256x4096->1024: split %.3f s, fast %.3f s, "
        "ratio fast/split = %.1fx (target <= 5)\n",
        g_fp8_split, g_fp8_fast, g_fp8_fast / g_fp8_split);
  }
  if (g_fp8_fast > 0 && g_fp8_scalar > 0) {
    std::printf(
        "cpu:fp8e4m3 fast accumulation 256x4096->1024: new %.3f s, old (scalar) %.2f s, "
        "new/old = %.4f (speed-up %.0fx), outputs %s\n",
        g_fp8_fast, g_fp8_scalar, g_fp8_fast / g_fp8_scalar, g_fp8_scalar / g_fp8_fast,
        tensorcheck::g_fp8_fast_out == tensorcheck::g_fp8_scalar_out ? "bitwise identical"
                                                                     : "DIFFER");
  }
  return 0;
}
