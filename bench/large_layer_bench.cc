// Peak memory of a verification with a large weight: the CPU backend and the
// magnitude sums convert the weight block by block along N (stats/blas_gemm.h,
// docs/architecture.md "Large weights: blocks along N") instead of whole.
//
//   large_layer_bench [--m=4 --k=8192 --n=128256] [--dtype=bf16]
//                     [--configs=cpu:bf16:fused] [--modes=blocked,unblocked]
//                     [--diagnose]
//
// Llama-3-70B's lm_head by default: x [4, 8192], W [128256, 8192], b [128256]
// in bf16 (W: 2.1 GB), Verify against the default reference (cpu:fp64) with
// the given configurations, in process, one child process per mode so that
// each mode's peak resident memory (VmHWM) is its own:
//   blocked:   CpuBackend::Options::weight_block_columns = 0, the default
//              blocks of stats' kWeightBlockBytes;
//   unblocked: blocks wider than the weight, so that the CPU backend
//              converts the whole weight at once, as before the blocks (the
//              magnitude sums stay blocked: their whole-weight fp32 copy
//              came after the backend's fp64 one was freed, and was smaller).
// Prints per mode the seconds, VmHWM after the inputs were made and after
// the verification, both divided by the weight's bytes, the engine's
// admission estimate (Engine::EstimateWorkingBytes), and a hash of the
// returned outputs (equal hashes: the same bits blocked or not).
// --diagnose runs Diagnose instead, over the default candidates unless
// --configs is given, against a random observed output (the answer means
// nothing; the work and the memory are a diagnosis's).
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "bench/bench_support.h"
#include "core/executor.h"
#include "core/float_formats.h"
#include "server/backends/cpu/cpu_backend.h"
#include "server/backends/linear_backend.h"
#include "server/engine/engine.h"

namespace tensorcheck {
namespace {

using Clock = std::chrono::steady_clock;

using bench::FlagText;
using bench::FlagValue;
using bench::VmHwmBytes;

// A tensor of `dtype` (bf16 or fp16) with values uniform in [-scale, scale),
// written element by element (no fp64 staging copy of a 2 GB weight).
Tensor Uniform(DType dtype, std::vector<int64_t> shape, double scale, uint64_t seed) {
  Tensor t = *Tensor::Create(dtype, std::move(shape));
  uint16_t* p = t.data<uint16_t>();
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < t.numel(); ++i) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    const double u = static_cast<double>(s >> 11) * 0x1p-53;  // [0, 1)
    const float v = static_cast<float>((2.0 * u - 1.0) * scale);
    p[i] = dtype == DType::kBFloat16 ? FloatToBf16Bits(v) : FloatToFp16Bits(v);
  }
  return t;
}

uint64_t Fnv1a(const Tensor& t, uint64_t h = 1469598103934665603ull) {
  const auto* b = static_cast<const unsigned char*>(t.raw());
  for (size_t i = 0; i < t.nbytes(); ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

struct Shape {
  int64_t m, k, n;
  DType dtype;
  std::vector<std::string> configs;
  bool diagnose = false;
};

// One mode, in this (child) process: prints its table row.
int RunMode(const Shape& s, const std::string& mode) {
  BackendRegistry registry;
  CpuBackend::Options cpu_options;
  if (mode == "unblocked") {
    cpu_options.weight_block_columns = int64_t{1} << 40;
  } else if (mode != "blocked") {
    std::fprintf(stderr, "--modes: blocked or unblocked, got %s\n", mode.c_str());
    return 2;
  }
  auto cpu = CpuBackend::Create(cpu_options);
  if (!cpu.ok() || !registry.Register(std::move(*cpu)).ok()) return 1;
  auto executor = Executor::Create({});
  if (!executor.ok()) return 1;
  EngineOptions options;
  options.executor = executor->get();
  // In process, past the wire's limits (a gRPC message holds at most 2 GiB;
  // such a weight reaches a server through the tensor store).
  options.limits.max_message_bytes = int64_t{16} << 30;
  options.limits.max_tensor_bytes = int64_t{16} << 30;
  auto engine = Engine::Create(options, &registry);
  if (!engine.ok()) {
    std::fprintf(stderr, "%s\n", engine.status().ToString().c_str());
    return 1;
  }
  LinearRequest r;
  r.input = Uniform(s.dtype, {s.m, s.k}, 1.0, 1);
  r.weight = Uniform(s.dtype, {s.n, s.k}, 1.0 / std::sqrt(static_cast<double>(s.k)), 2);
  r.bias = Uniform(s.dtype, {s.n}, 0.5, 3);
  r.configs = s.configs;
  r.return_outputs = true;
  if (s.diagnose) r.observed = Uniform(s.dtype, {s.m, s.n}, 1.0, 4);
  const double weight_bytes = static_cast<double>(r.weight.nbytes());
  const int64_t estimate = (*engine)->EstimateWorkingBytes(r, s.diagnose);
  const int64_t inputs_hwm = VmHwmBytes();
  const auto t0 = Clock::now();
  auto verified = s.diagnose ? (*engine)->Diagnose(r) : (*engine)->Verify(r);
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  const int64_t hwm = VmHwmBytes();
  if (!verified.ok()) {
    std::fprintf(stderr, "%s: %s\n", mode.c_str(), verified.status().ToString().c_str());
    return 1;
  }
  uint64_t hash = 1469598103934665603ull;
  if (verified->reference.output) hash = Fnv1a(*verified->reference.output, hash);
  for (const ConfigOutcome& c : verified->results) {
    if (c.output) hash = Fnv1a(*c.output, hash);
  }
  std::printf("| %s | %.1f s | %.2f GiB (%.2fx) | %.2f GiB (%.2fx) | %.2f GiB | %016llx |\n",
              mode.c_str(), seconds, inputs_hwm / 1073741824.0, inputs_hwm / weight_bytes,
              hwm / 1073741824.0, hwm / weight_bytes, estimate / 1073741824.0,
              static_cast<unsigned long long>(hash));
  std::fflush(stdout);
  return 0;
}

// Runs one mode in a child process; false when it failed.
bool InChild(const Shape& s, const std::string& mode) {
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid == 0) _exit(RunMode(s, mode));
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "mode %s: child ended with status %d\n", mode.c_str(), status);
    return false;
  }
  return true;
}

int Main(int argc, char** argv) {
  Shape s;
  s.m = FlagValue(argc, argv, "m", 4);
  s.k = FlagValue(argc, argv, "k", 8192);
  s.n = FlagValue(argc, argv, "n", 128256);
  auto dtype = ParseDType(FlagText(argc, argv, "dtype", "bf16"));
  if (!dtype.ok() || (*dtype != DType::kBFloat16 && *dtype != DType::kFloat16)) {
    std::fprintf(stderr, "--dtype: bf16 or fp16\n");
    return 2;
  }
  s.dtype = *dtype;
  s.diagnose = FlagText(argc, argv, "diagnose", nullptr) != nullptr ||
               std::find(argv + 1, argv + argc, std::string("--diagnose")) != argv + argc;
  const char* configs = FlagText(argc, argv, "configs", s.diagnose ? "" : "cpu:bf16:fused");
  s.configs = absl::StrSplit(configs, ',', absl::SkipEmpty());
  const std::vector<std::string> modes =
      absl::StrSplit(FlagText(argc, argv, "modes", "blocked,unblocked"), ',', absl::SkipEmpty());
  const double weight_gb = static_cast<double>(s.n * s.k * 2) / 1e9;
  std::printf("problem: x [%lld, %lld], W [%lld, %lld] %s (%.2f GB), b [%lld]; %s %s\n\n",
              static_cast<long long>(s.m), static_cast<long long>(s.k), static_cast<long long>(s.n),
              static_cast<long long>(s.k), std::string(DTypeName(s.dtype)).c_str(), weight_gb,
              static_cast<long long>(s.n), s.diagnose ? "Diagnose" : "Verify",
              *configs ? configs : "(default candidates)");
  std::printf(
      "| mode | seconds | VmHWM inputs (/ W bytes) | VmHWM peak (/ W bytes) | admission "
      "estimate | outputs hash |\n|---|---|---|---|---|---|\n");
  bool ok = true;
  for (const std::string& mode : modes) ok = InChild(s, mode) && ok;
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace tensorcheck

int main(int argc, char** argv) { return tensorcheck::Main(argc, argv); }
