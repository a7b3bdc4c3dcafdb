// A GPU kernel's tensor-core accumulation replayed on the CPU
// (internal::TensorCoreAccumulate) against one fp32 sgemm of the same
// shape, in one run: the candle case's size by default, x [M, K] and
// W [N, K] (OUT_IN) random normal values rounded to the input format.
//
//   tensor_core_replay_bench [--m=1921 --k=4096 --n=3072] [--repeat=3] [--threads=0]
//                            [--scalar_rows=2 --scalar_cols=64]
//
// Prints the sgemm's time (OpenBLAS, best of `--repeat`, with the core
// OpenBLAS chose; OPENBLAS_CORETYPE=... picks another), then per kernel
// order (sm90 bf16, sm80 bf16, sm90 fp16, and sm90 bf16 again with the
// AVX2 kernel where the CPU has AVX-512) the replay's time (best of
// `--repeat`, all threads) and its ratio to the sgemm; then the portable
// path's time per product on a small slice (`--scalar_rows` x
// `--scalar_cols` of the same problem), and the process's peak resident
// memory (VmHWM). --threads=0: every core. Nothing is asserted on time.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_support.h"
#include "core/float_formats.h"
#include "core/linear_config.h"
#include "core/tensor_core_model.h"
#include "server/backends/cpu/internal/tensor_core_accumulate.h"

namespace tensorcheck {
namespace {

using Clock = std::chrono::steady_clock;
using bench::FlagValue;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

struct Operands {
  std::vector<float> x, w;
};

// x ~ N(0, 1), w ~ N(0, 1/k), both rounded to `input` (bf16 or fp16).
Operands MakeOperands(int64_t m, int64_t k, int64_t n, TensorCoreInput input) {
  Operands o;
  std::mt19937 rng(42);
  std::normal_distribution<double> normal(0.0, 1.0);
  auto value = [&](double v) {
    return input == TensorCoreInput::kFp16 ? RoundToFp16(static_cast<float>(v))
                                           : RoundToBf16(static_cast<float>(v));
  };
  o.x.resize(static_cast<size_t>(m * k));
  o.w.resize(static_cast<size_t>(n * k));
  for (float& v : o.x) v = value(normal(rng));
  for (float& v : o.w) v = value(normal(rng) / std::sqrt(static_cast<double>(k)));
  return o;
}

double BestSgemm(const Operands& o, int64_t m, int64_t k, int64_t n, int repeat,
                 std::vector<float>* c) {
  double best = 1e30;
  for (int r = 0; r < repeat; ++r) {
    const Clock::time_point t0 = Clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(k), 1.0f, o.x.data(), static_cast<int>(k), o.w.data(),
                static_cast<int>(k), 0.0f, c->data(), static_cast<int>(n));
    best = std::min(best, Seconds(t0));
  }
  return best;
}

int Main(int argc, char** argv) {
  const int64_t m = FlagValue(argc, argv, "m", 1921);
  const int64_t k = FlagValue(argc, argv, "k", 4096);
  const int64_t n = FlagValue(argc, argv, "n", 3072);
  const int repeat = static_cast<int>(std::max<int64_t>(1, FlagValue(argc, argv, "repeat", 3)));
  int threads = static_cast<int>(FlagValue(argc, argv, "threads", 0));
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int64_t scalar_rows = std::min(m, FlagValue(argc, argv, "scalar_rows", 2));
  const int64_t scalar_cols = std::min(n, FlagValue(argc, argv, "scalar_cols", 64));
  openblas_set_num_threads(threads);
  std::printf("x [%lld, %lld] . W [%lld, %lld]^T, %d threads, OpenBLAS core %s\n",
              static_cast<long long>(m), static_cast<long long>(k), static_cast<long long>(n),
              static_cast<long long>(k), threads, openblas_get_corename());

  const Operands bf16 = MakeOperands(m, k, n, TensorCoreInput::kBf16);
  std::vector<float> c(static_cast<size_t>(m * n));
  const double sgemm = BestSgemm(bf16, m, k, n, repeat, &c);
  const double products = static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  std::printf("%-27s %8.3f s  %7.1f GFLOP/s\n", "sgemm (fp32)", sgemm,
              2.0 * products / sgemm / 1e9);

  // The kernel TensorCoreAccumulate picks (avx2_dispatch.h and
  // tensor_core_accumulate.cc).
  bool avx512 = false;
  const char* isa = "portable";
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  avx512 = __builtin_cpu_supports("avx512f") != 0;
  isa = avx512 ? "AVX-512" : "AVX2";
#endif
  struct Row {
    const char* name;
    TensorCoreGpu gpu;
    TensorCoreInput input;
    bool avx2;  // TENSORCHECK_TCACC_AVX2=1
  };
  const Row rows[] = {{"replay sm90 bf16", TensorCoreGpu::kSm90, TensorCoreInput::kBf16, false},
                      {"replay sm80 bf16", TensorCoreGpu::kSm80, TensorCoreInput::kBf16, false},
                      {"replay sm90 fp16", TensorCoreGpu::kSm90, TensorCoreInput::kFp16, false},
                      {"replay sm90 bf16", TensorCoreGpu::kSm90, TensorCoreInput::kBf16, true}};
  for (const Row& row : rows) {
    if (row.avx2 && !avx512) continue;  // the first row's kernel
    if (row.avx2) setenv("TENSORCHECK_TCACC_AVX2", "1", 1);
    const Operands fp16 = row.input == TensorCoreInput::kFp16
                              ? MakeOperands(m, k, n, TensorCoreInput::kFp16)
                              : Operands{};
    const Operands& o = row.input == TensorCoreInput::kFp16 ? fp16 : bf16;
    KernelOrder order;
    order.model = *TensorCoreModelFor(row.gpu, row.input);
    double best = 1e30;
    for (int r = 0; r < repeat; ++r) {
      const Clock::time_point t0 = Clock::now();
      const absl::Status s =
          internal::TensorCoreAccumulate(o.x.data(), o.w.data(), WeightLayout::kOutIn, m, n, k, 0,
                                         order, threads, c.data(), n, /*stop=*/nullptr);
      best = std::min(best, Seconds(t0));
      if (!s.ok()) {
        std::fprintf(stderr, "%s: %s\n", row.name, s.ToString().c_str());
        return 1;
      }
    }
    if (row.avx2) unsetenv("TENSORCHECK_TCACC_AVX2");
    const std::string name = std::string(row.name) + " (" + (row.avx2 ? "AVX2" : isa) + ")";
    std::printf("%-27s %8.3f s  %7.2f ns/product/core  %5.2fx sgemm\n", name.c_str(), best,
                best * threads / products * 1e9, best / sgemm);
  }

  // The portable path (KernelOrderDot per element) on a few elements.
  if (scalar_rows > 0 && scalar_cols > 0) {
    setenv("TENSORCHECK_TCACC_SCALAR", "1", 1);
    KernelOrder order;
    order.model = *TensorCoreModelFor(TensorCoreGpu::kSm90, TensorCoreInput::kBf16);
    std::vector<float> cs(static_cast<size_t>(scalar_rows * scalar_cols));
    const Clock::time_point t0 = Clock::now();
    const absl::Status s = internal::TensorCoreAccumulate(
        bf16.x.data(), bf16.w.data(), WeightLayout::kOutIn, scalar_rows, scalar_cols, k, 0, order,
        /*threads=*/1, cs.data(), scalar_cols, /*stop=*/nullptr);
    const double t = Seconds(t0);
    unsetenv("TENSORCHECK_TCACC_SCALAR");
    if (!s.ok()) {
      std::fprintf(stderr, "scalar: %s\n", s.ToString().c_str());
      return 1;
    }
    const double sp = static_cast<double>(scalar_rows * scalar_cols) * static_cast<double>(k);
    std::printf("%-27s %8.3f s  %7.2f ns/product (one thread, %lld x %lld), whole layer ~%.0f s\n",
                "portable sm90 bf16", t, t / sp * 1e9, static_cast<long long>(scalar_rows),
                static_cast<long long>(scalar_cols), t / sp * products / threads);
  }
  std::printf("VmHWM %.1f MiB\n", static_cast<double>(bench::VmHwmBytes()) / (1 << 20));
  return 0;
}

}  // namespace
}  // namespace tensorcheck

int main(int argc, char** argv) { return tensorcheck::Main(argc, argv); }
