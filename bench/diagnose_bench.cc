// Diagnosis cost: shared computations against every candidate on its own,
// on the same request in the same run, and against one plain verification.
//
//   diagnose_bench [--m=1921 --k=4096 --n=3072] [--dtype=bf16] [--bias=unfused]
//                  [--mode=shared|separate]   (one mode alone, in process)
//
// The candle case by default: bf16 x [M, K], W [N, K], b [N]. The observed
// output is computed here, not by the server: fp32 accumulation over K in
// tiles of 32 (each tile an sgemm added into the accumulator, as a GPU
// kernel's K loop adds its tiles), rounded to the storage dtype, then the
// bias added and rounded again (`--bias=unfused`, candle) or the bias added
// to the accumulator and rounded once (`--bias=fused`, PyTorch).
//
// Each mode runs in a child process of its own, so that its peak resident
// memory (VmHWM) is its own:
//   separate: EngineOptions::share_computations = false, every candidate
//             runs and is compared on its own (the way before sharing);
//   shared:   the default.
// Prints per mode the time of Diagnose over the default candidate set, the
// backend runs' share of it, VmHWM and the answer, then the ratio
// shared / separate.
#include <cblas.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>

#include "bench/bench_support.h"
#include "core/executor.h"
#include "core/float_formats.h"
#include "server/backends/linear_backend.h"
#include "server/engine/engine.h"

namespace tensorcheck {
namespace {

using Clock = std::chrono::steady_clock;

using bench::FlagText;
using bench::FlagValue;

// Peak resident memory of this process, in MiB.
double VmHwmMiB() { return static_cast<double>(bench::VmHwmBytes()) / (1 << 20); }

// A value rounded to `dtype` (bf16 or fp16), as float.
float RoundTo(DType dtype, double v) {
  return dtype == DType::kBFloat16 ? RoundToBf16(static_cast<float>(v))
                                   : RoundToFp16(static_cast<float>(v));
}

struct Problem {
  int64_t m, k, n;
  DType dtype;
  std::vector<double> x, w, b;  // values already in `dtype`
  std::vector<double> observed;
};

// x, W, b rounded to the storage dtype; the observed output by a K-tile
// loop of fp32 sgemms.
Problem MakeProblem(int64_t m, int64_t k, int64_t n, DType dtype, bool unfused) {
  Problem p{m, k, n, dtype, {}, {}, {}, {}};
  std::mt19937 rng(42);
  std::normal_distribution<double> normal(0.0, 1.0);
  p.x.resize(static_cast<size_t>(m * k));
  p.w.resize(static_cast<size_t>(n * k));
  p.b.resize(static_cast<size_t>(n));
  for (double& v : p.x) v = RoundTo(dtype, normal(rng));
  for (double& v : p.w) v = RoundTo(dtype, normal(rng) / std::sqrt(double(k)));
  for (double& v : p.b) v = RoundTo(dtype, normal(rng));
  std::vector<float> xf(p.x.begin(), p.x.end()), wf(p.w.begin(), p.w.end());
  std::vector<float> acc(static_cast<size_t>(m * n), 0.0f);
  constexpr int64_t kTile = 32;
  for (int64_t t = 0; t < k; t += kTile) {
    const int64_t kt = std::min(kTile, k - t);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(kt), 1.0f, xf.data() + t, static_cast<int>(k), wf.data() + t,
                static_cast<int>(k), 1.0f, acc.data(), static_cast<int>(n));
  }
  p.observed.resize(acc.size());
  for (int64_t i = 0; i < m * n; ++i) {
    const float bias = static_cast<float>(p.b[static_cast<size_t>(i % n)]);
    const float a = acc[static_cast<size_t>(i)];
    p.observed[static_cast<size_t>(i)] =
        unfused ? RoundTo(dtype, RoundTo(dtype, a) + bias) : RoundTo(dtype, a + bias);
  }
  return p;
}

LinearRequest Request(const Problem& p) {
  LinearRequest r;
  r.input = *FromDoubles(p.dtype, {p.m, p.k}, p.x);
  r.weight = *FromDoubles(p.dtype, {p.n, p.k}, p.w);
  r.bias = *FromDoubles(p.dtype, {p.n}, p.b);
  r.observed = *FromDoubles(p.dtype, {p.m, p.n}, p.observed);
  return r;
}

// One mode, in this (child) process: prints its line, returns the seconds.
int RunMode(const Problem& p, bool share, int out_fd) {
  BackendRegistry registry;
  if (!RegisterBuiltinBackends(&registry).ok()) return 1;
  // One statistics pool, as the server makes (one thread per core).
  auto executor = Executor::Create({});
  if (!executor.ok()) return 1;
  EngineOptions options;
  options.executor = executor->get();
  options.share_computations = share;
  auto engine = Engine::Create(options, &registry);
  if (!engine.ok()) return 1;
  const LinearRequest request = Request(p);
  const double before_mib = VmHwmMiB();
  const auto t0 = Clock::now();
  auto diagnosed = (*engine)->Diagnose(request);
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!diagnosed.ok()) {
    std::fprintf(stderr, "%s\n", diagnosed.status().ToString().c_str());
    return 1;
  }
  double runs_ms = diagnosed->reference.elapsed_ms;
  int shared = 0;
  for (const ConfigOutcome& r : diagnosed->results) {
    runs_ms += r.elapsed_ms;
    shared += r.shared_computation.empty() ? 0 : 1;
  }
  const DiagnosisOutcome& d = *diagnosed->diagnosis;
  std::printf("| %s | %.2f s | %.2f s | %d of %zu | %.0f MiB (inputs %.0f) | %s %.2f |\n",
              share ? "shared" : "separate", seconds, runs_ms / 1e3, shared,
              diagnosed->results.size(), VmHwmMiB(), before_mib, d.best.value_or("null").c_str(),
              d.confidence);
  std::fflush(stdout);
  if (out_fd >= 0 && write(out_fd, &seconds, sizeof seconds) != sizeof seconds) return 1;
  return 0;
}

// Runs one mode in a child process; returns its seconds, or < 0.
double InChild(const Problem& p, bool share) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    _exit(RunMode(p, share, fds[1]));
  }
  close(fds[1]);
  double seconds = -1;
  if (read(fds[0], &seconds, sizeof seconds) != sizeof seconds) seconds = -1;
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "mode %s: child ended with status %d\n", share ? "shared" : "separate",
                 status);
    return -1;
  }
  return seconds;
}

int Main(int argc, char** argv) {
  const int64_t m = FlagValue(argc, argv, "m", 1921);
  const int64_t k = FlagValue(argc, argv, "k", 4096);
  const int64_t n = FlagValue(argc, argv, "n", 3072);
  auto dtype = ParseDType(FlagText(argc, argv, "dtype", "bf16"));
  if (!dtype.ok() || (*dtype != DType::kBFloat16 && *dtype != DType::kFloat16)) {
    std::fprintf(stderr, "--dtype: bf16 or fp16\n");
    return 2;
  }
  const bool unfused = std::strcmp(FlagText(argc, argv, "bias", "unfused"), "fused") != 0;
  const Problem p = MakeProblem(m, k, n, *dtype, unfused);
  std::printf(
      "problem: %lld x %lld -> %lld, %s, observed: fp32 accumulation in K tiles "
      "of 32, bias %s\n\n",
      static_cast<long long>(m), static_cast<long long>(k), static_cast<long long>(n),
      std::string(DTypeName(*dtype)).c_str(), unfused ? "unfused" : "fused");
  std::printf(
      "| mode | diagnose | of which backend runs | shared GEMMs | VmHWM | best |\n"
      "|---|---|---|---|---|---|\n");
  // --mode=shared or --mode=separate runs that mode alone, in this
  // process (for a profiler).
  const std::string mode = FlagText(argc, argv, "mode", "");
  if (!mode.empty()) return RunMode(p, mode == "shared", /*out_fd=*/-1);
  const double separate = InChild(p, /*share=*/false);
  const double shared = InChild(p, /*share=*/true);
  if (separate <= 0 || shared <= 0) return 1;
  std::printf("\nratio shared / separate: %.2f\n", shared / separate);
  return 0;
}

}  // namespace
}  // namespace tensorcheck

int main(int argc, char** argv) { return tensorcheck::Main(argc, argv); }
