// Predicted vs measured error of every precision on random data: the table
// in docs/numerics.md.
//
//   build/bench/error_model_table            # markdown table on stdout
//
// For each precision and K, x [64, K] ~ N(0, 1), W [256, K] ~ N(0, 1/K),
// b ~ N(0, 0.1), fp32 storage and output (bf16/fp16 storage for those
// precisions, as a framework would store them). "measured" is the rms of
// (cpu:<precision> - cpu:fp64); "predicted" is the rms of the error model's
// per-element sigma; their ratio is the engine's bound_ratio.
#include <cmath>
#include <cstdio>
#include <random>

#include "absl/strings/str_cat.h"
#include "server/backends/linear_backend.h"
#include "server/engine/engine.h"

using namespace tensorcheck;

int main() {
  BackendRegistry registry;
  if (!RegisterBuiltinBackends(&registry).ok()) return 1;
  auto engine = Engine::Create(EngineOptions{}, &registry);
  if (!engine.ok()) return 1;
  std::printf(
      "| precision | storage | K | measured rms error | predicted rms sigma | ratio (bound_ratio) "
      "| every element within the hard bound |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (Precision p : kAllPrecisions) {
    const DType storage = p == Precision::kBf16                               ? DType::kBFloat16
                          : p == Precision::kFp16 || p == Precision::kFp16Acc ? DType::kFloat16
                                                                              : DType::kFloat32;
    for (int64_t k : {256, 1024, 4096}) {
      std::mt19937 rng(static_cast<uint32_t>(k) * 31 + static_cast<uint32_t>(p));
      std::normal_distribution<double> normal(0.0, 1.0);
      const int64_t m = 64, n = 256;
      std::vector<double> x(m * k), w(n * k), b(n);
      for (double& v : x) v = normal(rng);
      for (double& v : w) v = normal(rng) / std::sqrt(double(k));
      for (double& v : b) v = 0.1 * normal(rng);
      LinearRequest r;
      r.input = *FromDoubles(storage, {m, k}, x);
      r.weight = *FromDoubles(storage, {n, k}, w);
      r.bias = *FromDoubles(storage, {n}, b);
      r.output_dtype = DType::kFloat32;  // keep output rounding out of the way
      r.configs = {absl::StrCat("cpu:", PrecisionName(p), ":fused")};
      r.tolerance.preset = TolerancePreset::kBound;
      auto out = (*engine)->Verify(r);
      if (!out.ok()) {
        std::fprintf(stderr, "%s\n", out.status().ToString().c_str());
        return 1;
      }
      const DiffStats& s = out->results[0].vs_reference;
      const double ratio = s.bound_ratio.value_or(NAN);
      if (s.rms == 0) {  // fp64 against the fp64 reference: nothing to model
        std::printf("| %s | %s | %lld | 0 | - | - | passes |\n",
                    std::string(PrecisionName(p)).c_str(),
                    std::string(DTypeShortName(storage)).c_str(), static_cast<long long>(k));
        continue;
      }
      std::printf("| %s | %s | %lld | %.3g | %.3g | %.2f | %s |\n",
                  std::string(PrecisionName(p)).c_str(),
                  std::string(DTypeShortName(storage)).c_str(), static_cast<long long>(k), s.rms,
                  s.rms / ratio, ratio, s.passed ? "passes" : "fails");
    }
  }
  return 0;
}
