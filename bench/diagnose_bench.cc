// Diagnosis cost against one plain verification, in one run.
//
//   diagnose_bench [--m=1921 --k=4096 --n=3072] [--dtype=bf16]
//
// The candle case of DESIGN.md by default: bf16 x [M, K], W [N, K], b [N].
// The observed output is the cpu:bf16:unfused result (what candle
// computes). Prints one plain Verify (that configuration alone), then a
// Diagnose over the default candidate set with the time of each candidate
// run, the total, and the ratio total / verify.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

#include "server/backends/linear_backend.h"
#include "server/engine/engine.h"

namespace tensorcheck {
namespace {

using Clock = std::chrono::steady_clock;

int64_t FlagValue(int argc, char** argv, const char* name, int64_t fallback) {
  const std::string prefix = std::string("--") + name + "=";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) {
      return std::atoll(argv[i] + prefix.size());
    }
  }
  return fallback;
}

int Main(int argc, char** argv) {
  const int64_t m = FlagValue(argc, argv, "m", 1921);
  const int64_t k = FlagValue(argc, argv, "k", 4096);
  const int64_t n = FlagValue(argc, argv, "n", 3072);
  DType dtype = DType::kBFloat16;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--dtype=", 8) == 0) dtype = *ParseDType(argv[i] + 8);
  }
  BackendRegistry registry;
  if (!RegisterBuiltinBackends(&registry).ok()) return 1;
  auto engine = Engine::Create(EngineOptions{}, &registry);
  if (!engine.ok()) return 1;

  std::mt19937 rng(42);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> x(m * k), w(n * k), b(n);
  for (double& v : x) v = normal(rng);
  for (double& v : w) v = normal(rng) / std::sqrt(double(k));
  for (double& v : b) v = normal(rng);
  auto request = [&] {
    LinearRequest r;
    r.input = *FromDoubles(dtype, {m, k}, x);
    r.weight = *FromDoubles(dtype, {n, k}, w);
    r.bias = *FromDoubles(dtype, {n}, b);
    return r;
  };

  // The observed output: candle's computation.
  LinearRequest produce = request();
  produce.configs = {"cpu:bf16:unfused"};
  produce.return_outputs = true;
  auto produced = (*engine)->Verify(produce);
  if (!produced.ok()) {
    std::fprintf(stderr, "%s\n", produced.status().ToString().c_str());
    return 1;
  }

  LinearRequest verify = request();
  verify.observed = std::move(*produced->results[0].output);
  verify.configs = {"cpu:bf16:unfused"};
  LinearRequest diagnose = request();
  diagnose.observed = verify.observed->Clone();

  auto t0 = Clock::now();
  auto verified = (*engine)->Verify(verify);
  const double verify_s = std::chrono::duration<double>(Clock::now() - t0).count();
  t0 = Clock::now();
  auto diagnosed = (*engine)->Diagnose(diagnose);
  const double diagnose_s = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!verified.ok() || !diagnosed.ok()) {
    std::fprintf(stderr, "%s %s\n", verified.status().ToString().c_str(),
                 diagnosed.status().ToString().c_str());
    return 1;
  }
  std::printf("problem: %lld x %lld -> %lld, %s\n", static_cast<long long>(m),
              static_cast<long long>(k), static_cast<long long>(n),
              std::string(DTypeName(dtype)).c_str());
  std::printf("\n| candidate | run ms |\n|---|---|\n");
  double runs_ms = 0;
  for (const ConfigOutcome& r : diagnosed->results) {
    std::printf("| %s | %.0f |\n", r.config.c_str(), r.elapsed_ms);
    runs_ms += r.elapsed_ms;
  }
  std::printf("| reference %s | %.0f |\n", diagnosed->reference.config.c_str(),
              diagnosed->reference.elapsed_ms);
  const size_t c = diagnosed->results.size();
  std::printf("\nverify (1 configuration + reference): %.2f s\n", verify_s);
  std::printf("diagnose (%zu candidates + reference):  %.2f s  (backend runs %.2f s, "
              "%.2f s per candidate; statistics, error model and ranking %.2f s)\n",
              c, diagnose_s, runs_ms / 1e3, runs_ms / 1e3 / double(c),
              diagnose_s - (runs_ms + diagnosed->reference.elapsed_ms) / 1e3);
  std::printf("ratio diagnose / verify: %.1f\n", diagnose_s / verify_s);
  std::printf("best: %s (confidence %.2f)\n%s\n",
              diagnosed->diagnosis->best.value_or("null").c_str(),
              diagnosed->diagnosis->confidence, diagnosed->diagnosis->explanation.c_str());
  return 0;
}

}  // namespace
}  // namespace tensorcheck

int main(int argc, char** argv) { return tensorcheck::Main(argc, argv); }
