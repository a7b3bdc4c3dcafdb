// What an algorithm sweep costs per candidate: one Diagnose over the given
// configurations without a sweep, then the same request with
// `algorithm_sweep`, in the same process and run.
//
//   sweep_bench [--configs=cublaslt:fp32:fused,cublaslt:bf16:fused] [--sweep=8]
//               [--m=1024 --k=4096 --n=4096] [--repeat=3]
//
// Prints, per mode, the median time of Diagnose, the configurations run
// and the time per configuration, then the ratio swept / plain and the
// added time per added configuration. The default configurations are the
// cuBLASLt ones (a GPU host); on a host without them it says so and exits
// 0 after measuring `cpu:fp32:fused` (one algorithm: a sweep runs it once,
// so the ratio is the sweep's bookkeeping alone).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/bench_support.h"
#include "core/float_formats.h"
#include "server/backends/linear_backend.h"
#include "server/engine/engine.h"

namespace tensorcheck {
namespace {

using Clock = std::chrono::steady_clock;

struct Timed {
  double median_ms = 0;
  size_t configs = 0;
  std::string best;
};

int Main(int argc, char** argv) {
  const int64_t m = bench::FlagValue(argc, argv, "m", 1024);
  const int64_t k = bench::FlagValue(argc, argv, "k", 4096);
  const int64_t n = bench::FlagValue(argc, argv, "n", 4096);
  const int sweep = static_cast<int>(bench::FlagValue(argc, argv, "sweep", 8));
  const int repeat = static_cast<int>(bench::FlagValue(argc, argv, "repeat", 3));
  std::vector<std::string> configs = absl::StrSplit(
      bench::FlagText(argc, argv, "configs", "cublaslt:fp32:fused,cublaslt:bf16:fused"), ',');

  BackendRegistry registry;
  if (absl::Status s = RegisterBuiltinBackends(&registry); !s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return 1;
  }
  auto engine = Engine::Create(EngineOptions{}, &registry);
  if (!engine.ok()) {
    std::fprintf(stderr, "%s\n", std::string(engine.status().message()).c_str());
    return 1;
  }
  for (const std::string& c : configs) {
    auto spec = ParseConfigSpec(c);
    auto backend = spec.ok() ? registry.Find(spec->backend) : absl::StatusOr<LinearBackend*>();
    if (!spec.ok() || !backend.ok() || !(*backend)->Available().ok()) {
      std::printf("%s is not available here; measuring cpu:fp32:fused instead\n", c.c_str());
      configs = {"cpu:fp32:fused"};
      break;
    }
  }

  // bf16-exact fp32 operands and bias: every precision reads them alike.
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto values = [&](int64_t count) {
    std::vector<float> v(static_cast<size_t>(count));
    for (float& f : v) f = RoundToBf16(normal(rng));
    return v;
  };
  LinearRequest request;
  request.input = *FromFloats(DType::kFloat32, {m, k}, values(m * k));
  request.weight = *FromFloats(DType::kFloat32, {n, k}, values(n * k));
  request.bias = *FromFloats(DType::kFloat32, {n}, values(n));
  request.configs = configs;
  // The observed output: the first configuration's own, so that the sweep
  // has something to reproduce.
  {
    LinearRequest first;
    first.input = request.input.Clone();
    first.weight = request.weight.Clone();
    first.bias = request.bias->Clone();
    first.configs = {configs.front()};
    first.return_outputs = true;
    auto out = (*engine)->Verify(first);
    if (!out.ok()) {
      std::fprintf(stderr, "%s\n", std::string(out.status().message()).c_str());
      return 1;
    }
    request.observed = std::move(*out->results.front().output);
  }

  auto measure = [&](int algorithm_sweep) -> absl::StatusOr<Timed> {
    request.algorithm_sweep = algorithm_sweep;
    std::vector<double> ms;
    Timed t;
    for (int r = 0; r < repeat; ++r) {
      const auto start = Clock::now();
      auto out = (*engine)->Diagnose(request);
      if (!out.ok()) return out.status();
      ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
      t.configs = out->results.size();
      t.best = out->diagnosis->best.value_or("(none)");
    }
    std::sort(ms.begin(), ms.end());
    t.median_ms = ms[ms.size() / 2];
    return t;
  };
  auto plain = measure(0);
  auto swept = measure(sweep);
  if (!plain.ok() || !swept.ok()) {
    std::fprintf(stderr, "%s\n",
                 std::string((plain.ok() ? swept.status() : plain.status()).message()).c_str());
    return 1;
  }
  std::printf("%ldx%ld->%ld, configurations %s, median of %d\n", static_cast<long>(m),
              static_cast<long>(k), static_cast<long>(n), absl::StrJoin(configs, ",").c_str(),
              repeat);
  for (const auto& [name, t] :
       {std::pair<const char*, const Timed&>{"plain", *plain}, {"swept", *swept}}) {
    std::printf("  %-6s %9.1f ms  %3zu configurations  %7.1f ms each  best %s\n", name, t.median_ms,
                t.configs, t.median_ms / static_cast<double>(t.configs), t.best.c_str());
  }
  const double added = static_cast<double>(swept->configs) - static_cast<double>(plain->configs);
  std::printf("  ratio swept/plain %.2f", swept->median_ms / plain->median_ms);
  if (added > 0) {
    std::printf(", %.1f ms per added configuration", (swept->median_ms - plain->median_ms) / added);
  }
  std::printf("\n");
  return 0;
}

}  // namespace
}  // namespace tensorcheck

int main(int argc, char** argv) { return tensorcheck::Main(argc, argv); }
