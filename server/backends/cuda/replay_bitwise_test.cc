// cuBLASLt's own kernel against its CPU replay, on the GPU: for bf16, fp16,
// tf32 and fp8e4m3 (per-tensor scaling) at README's two seed sizes and
// three more shapes, the layer runs as `cublaslt:P:fused` (the heuristic's
// first kernel, what algo=0 runs), then on the CPU as the configuration
// the run's "replay" detail names (internal/replay_rules.h: that kernel's
// tensor-core model and K tile) and as the plain emulation `cpu:P:fused`,
// and the bitwise-equal share of each against the GPU's output is logged
// as one markdown row per case:
//
//   | precision | m x k -> n | kernel (algo, tile, stages, splitk, scheme) | replay string |
//   replay bitwise % | plain CPU bitwise % |
//
// The test logs the shares and does not judge them: the replay has never
// run against hardware, and one run must give the whole table (the goal
// recorded for it: 100.000% for bf16 and fp16 at 1921x4096->3072). It
// fails only on errors: a run that fails, a replay that does not parse.
//
// With TENSORCHECK_REPLAY_OUT=DIR (tests/gpu/run.sh's `replay_bitwise`
// step), it also writes DIR/replay_bitwise.md (the table) and
// DIR/kernel_orders/<gen>.json, the default kernels' K orders a CPU host
// looks up by (precision, m, n, k) when a user names this GPU:
//
//   {"gpu": "sm90", "device": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0",
//    "cublaslt_version": 130100, "recorded": "2026-12-08",
//    "kernels": [{"precision": "bf16", "m": 1921, "n": 3072, "k": 4096,
//                 "options": "mma=sm90,tile_k=64", "algo": "66", "algo_tile": "13",
//                 "algo_stages": "15"}, ...]}
//
// ("options": the replay's part after `@`; kernels without a replay are
// left out). Both files are rewritten after every case. The CPU replay
// walks every product through the tensor-core model (core's
// KernelOrderDot), far slower than the plain emulation's sgemm, so with
// TENSORCHECK_REPLAY_BUDGET_S=SECONDS the test skips (logging it) each case
// whose estimated time, at the rate of the cases before it, would take it
// past the budget: the step ends within its limit with the cases it had
// time for, in the order of what they are worth (the goal's two first).
#include <cublasLt.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "core/status_macros.h"
#include "core/tensor.h"
#include "nlohmann/json.hpp"
#include "server/backends/cuda/internal/replay_rules.h"
#include "tests/testing/cuda_test_backends.h"

namespace tensorcheck {
namespace {

using ::tensorcheck::testing::TestBackend;
using ::tensorcheck::testing::TestCpuBackend;

struct Shape {
  int64_t m, k, n;
};

struct Case {
  Precision precision;
  Shape shape;
};

// The cases in the order of what they are worth: the goal's two (bf16 and
// fp16 at candle's 1921x4096->3072), every precision at the other shapes
// (README's 2x768->512; K = 1000, not a multiple of 64, so a partial tile;
// a tall-skinny layer where the heuristic may split K; a mid one), then
// tf32 and fp8 at 1921x4096->3072.
std::vector<Case> Cases() {
  const Shape candle{1921, 4096, 3072};
  const Precision all[] = {Precision::kBf16, Precision::kFp16, Precision::kTf32,
                           Precision::kFp8E4M3};
  std::vector<Case> out = {{Precision::kBf16, candle}, {Precision::kFp16, candle}};
  for (Shape s :
       {Shape{2, 768, 512}, Shape{64, 1000, 768}, Shape{16, 8192, 1024}, Shape{512, 2048, 2048}}) {
    for (Precision p : all) out.push_back({p, s});
  }
  out.push_back({Precision::kTf32, candle});
  out.push_back({Precision::kFp8E4M3, candle});
  return out;
}

// Storage and output of a precision's layer: its own 16-bit type for bf16
// and fp16, fp32 for tf32, bf16 for fp8 (wide operands the per-tensor
// recipe quantises, on the GPU's side and the CPU's alike, and a bf16
// output as torch._scaled_mm's).
DType StorageOf(Precision p) {
  switch (p) {
    case Precision::kFp16:
      return DType::kFloat16;
    case Precision::kTf32:
      return DType::kFloat32;
    default:
      return DType::kBFloat16;
  }
}

// Random normal values for one shape (x ~ N(0, 1), W ~ N(0, 1/k) so that
// the outputs are of order one, the bias ~ N(0, 1)), made once per shape
// and rounded to each precision's storage.
struct Values {
  std::vector<double> x, w, b;
};

const Values& ValuesOf(Shape s) {
  static std::map<std::tuple<int64_t, int64_t, int64_t>, Values> cache;
  auto key = std::make_tuple(s.m, s.k, s.n);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  std::mt19937_64 rng(static_cast<uint64_t>(s.m * 1000003 + s.k * 1009 + s.n));
  std::normal_distribution<double> normal(0.0, 1.0);
  Values v;
  v.x.resize(static_cast<size_t>(s.m * s.k));
  v.w.resize(static_cast<size_t>(s.n * s.k));
  v.b.resize(static_cast<size_t>(s.n));
  const double w_scale = 1.0 / std::sqrt(static_cast<double>(s.k));
  for (double& e : v.x) e = normal(rng);
  for (double& e : v.w) e = normal(rng) * w_scale;
  for (double& e : v.b) e = normal(rng);
  return cache.emplace(key, std::move(v)).first->second;
}

struct Layer {
  Tensor x, w, b;
  LinearProblem problem;
};

std::unique_ptr<Layer> MakeLayer(Shape s, Precision p) {
  const Values& v = ValuesOf(s);
  const DType storage = StorageOf(p);
  auto l = std::make_unique<Layer>();
  l->x = *FromDoubles(storage, {s.m, s.k}, v.x);
  l->w = *FromDoubles(storage, {s.n, s.k}, v.w);
  l->b = *FromDoubles(storage, {s.n}, v.b);
  LinearProblem& pr = l->problem;
  pr.input = &l->x;
  pr.weight = &l->w;
  pr.bias = &l->b;
  pr.layout = WeightLayout::kOutIn;
  pr.activation = Activation::kNone;
  pr.output_dtype = storage;
  pr.m = s.m;
  pr.n = s.n;
  pr.k = s.k;
  return l;
}

// `backend:P:fused`, per-tensor scaling for FP8.
Config ConfigOf(absl::string_view backend, Precision p) {
  ConfigSpec spec;
  spec.backend = std::string(backend);
  spec.precision = p;
  spec.bias = BiasMode::kFused;
  return ResolveConfig(spec, /*has_bias=*/true, Activation::kNone, BiasMode::kFused,
                       Fp8Scaling::kTensor);
}

// The share of elements whose bits are equal (the outputs share a dtype).
struct Share {
  int64_t equal = 0, count = 0;
};
Share Bitwise(const Tensor& a, const Tensor& b) {
  Share s;
  s.count = a.numel();
  if (b.numel() != s.count || a.dtype() != b.dtype()) return s;
  const size_t item = a.nbytes() / static_cast<size_t>(std::max<int64_t>(s.count, 1));
  const char* pa = static_cast<const char*>(a.raw());
  const char* pb = static_cast<const char*>(b.raw());
  for (int64_t e = 0; e < s.count; ++e) {
    s.equal += std::memcmp(pa + e * item, pb + e * item, item) == 0;
  }
  return s;
}

// "100.000%" only when every element is equal.
std::string Percent(Share s) {
  if (s.count == 0) return "-";
  if (s.equal == s.count) return "100.000%";
  double pct = 100.0 * static_cast<double>(s.equal) / static_cast<double>(s.count);
  if (pct > 99.999) pct = 99.999;
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3f%%", pct);
  return buf;
}

std::string Detail(const std::map<std::string, std::string>& d, const std::string& key) {
  auto it = d.find(key);
  return it == d.end() ? "?" : it->second;
}

// "algo 66, tile 13, stages 15 (64x3), splitk 1, scheme 0".
std::string Kernel(const std::map<std::string, std::string>& d) {
  std::string stages = Detail(d, "algo_stages");
  uint32_t id = 0;
  if (absl::SimpleAtoi(stages, &id)) {
    absl::StrAppend(&stages, " (", cuda::internal::LtStagesName(id), ")");
  }
  return absl::StrCat("algo ", Detail(d, "algo"), ", tile ", Detail(d, "algo_tile"), ", stages ",
                      stages, ", splitk ", Detail(d, "algo_splitk"), ", scheme ",
                      Detail(d, "algo_reduction_scheme"));
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

std::string TodayUtc() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[16];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d", &tm);
  return buf;
}

// The device's compute capability ("9.0") as numbers.
cuda::internal::ComputeCapability CapabilityOf(const std::string& text) {
  cuda::internal::ComputeCapability cc;
  const std::vector<std::string> parts = absl::StrSplit(text, '.');
  if (parts.size() == 2) {
    (void)absl::SimpleAtoi(parts[0], &cc.major);
    (void)absl::SimpleAtoi(parts[1], &cc.minor);
  }
  return cc;
}

// Writes `text` to `path` (the folder made first); a failure is an error.
void WriteFile(const std::filesystem::path& path, const std::string& text) {
  std::error_code ec;
  std::filesystem::create_directories(path.parent_path(), ec);
  std::ofstream f(path, std::ios::trunc);
  f << text;
  f.close();
  if (!f) ADD_FAILURE() << "cannot write " << path;
}

class CudaReplayBitwise : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(TestBackend("cublaslt"), nullptr);
    const absl::Status s = TestBackend("cublaslt")->Available();
    if (!s.ok()) GTEST_SKIP() << s.message();
    ASSERT_NE(TestCpuBackend(), nullptr);
  }
};

TEST_F(CudaReplayBitwise, GpuHeuristicKernelAgainstItsCpuReplayAndThePlainEmulation) {
  const DeviceDescription device = TestBackend("cublaslt")->device();
  const cuda::internal::ComputeCapability cc = CapabilityOf(device.compute_capability);
  const std::optional<TensorCoreGpu> gen = cuda::internal::ReplayGeneration(cc);
  const char* out_env = std::getenv("TENSORCHECK_REPLAY_OUT");
  const std::string out_dir = out_env != nullptr ? out_env : "";
  const char* budget_env = std::getenv("TENSORCHECK_REPLAY_BUDGET_S");
  double budget_s = 0;  // 0: no budget
  if (budget_env != nullptr && !absl::SimpleAtod(budget_env, &budget_s)) {
    ADD_FAILURE() << "TENSORCHECK_REPLAY_BUDGET_S: seconds expected, got '" << budget_env << "'";
  }
  const auto start = std::chrono::steady_clock::now();
  // Seconds per multiply-add of the cases run so far (layer, GPU run and
  // both CPU runs), for the budget's estimates.
  double done_s = 0, done_products = 0;

  const std::string header =
      "| precision | m x k -> n | kernel (algo, tile, stages, splitk, scheme) | replay string | "
      "replay bitwise % | plain CPU bitwise % |\n|---|---|---|---|---|---|\n";
  std::string table = header;
  std::printf("%s", header.c_str());
  std::fflush(stdout);

  nlohmann::ordered_json orders;
  orders["gpu"] = gen.has_value() ? TensorCoreGpuName(*gen) : "";
  orders["device"] = device.name;
  orders["compute_capability"] = device.compute_capability;
  orders["cublaslt_version"] = static_cast<int64_t>(cublasLtGetVersion());
  orders["recorded"] = TodayUtc();
  orders["kernels"] = nlohmann::ordered_json::array();
  if (!gen.has_value()) {
    std::printf("compute capability %s has no tensor-core model: no kernel_orders file\n",
                device.compute_capability.c_str());
  }

  int cases = 0, replayed = 0, exact = 0, unavailable = 0, errors = 0, skipped = 0, over_budget = 0;
  for (const Case& c : Cases()) {
    const Shape s = c.shape;
    const std::string name(PrecisionName(c.precision));
    const std::string dims = absl::StrCat(s.m, " x ", s.k, " -> ", s.n);
    SCOPED_TRACE(absl::StrCat(name, " ", dims));
    ++cases;
    auto row = [&](const std::string& kernel, const std::string& replay,
                   const std::string& replay_pct, const std::string& plain_pct) {
      const std::string line = absl::StrCat("| ", name, " | ", dims, " | ", kernel, " | ", replay,
                                            " | ", replay_pct, " | ", plain_pct, " |\n");
      std::printf("%s", line.c_str());
      std::fflush(stdout);
      table += line;
      if (!out_dir.empty()) {
        WriteFile(std::filesystem::path(out_dir) / "replay_bitwise.md", table);
      }
    };
    const double products =
        static_cast<double>(s.m) * static_cast<double>(s.n) * static_cast<double>(s.k);
    if (budget_s > 0 && done_products > 0) {
      const double estimate = products * done_s / done_products;
      const double left = std::max(budget_s - Seconds(start), 0.0);
      if (estimate > left) {
        ++over_budget;
        row(absl::StrFormat("skipped: about %.0f s at the rate so far, %.0f s of the budget left",
                            estimate, left),
            "-", "-", "-");
        continue;
      }
    }
    const auto t_case = std::chrono::steady_clock::now();
    const Config gpu_config = ConfigOf("cublaslt", c.precision);
    const absl::Status supported =
        TestBackend("cublaslt")->Supports(gpu_config, StorageOf(c.precision));
    if (!supported.ok()) {
      // FP8 before compute capability 8.9: not an error of the device.
      ++skipped;
      row(absl::StrCat("not on this device: ", supported.message()), "-", "-", "-");
      continue;
    }
    auto layer = MakeLayer(s, c.precision);
    const auto t_gpu = std::chrono::steady_clock::now();
    absl::StatusOr<RunResult> gpu = TestBackend("cublaslt")->Run(layer->problem, gpu_config, {});
    const double gpu_s = Seconds(t_gpu);
    if (!gpu.ok()) {
      ++errors;
      ADD_FAILURE() << gpu_config.ToString() << ": " << gpu.status();
      row(absl::StrCat("error: ", gpu.status().message()), "-", "-", "-");
      continue;
    }
    const std::map<std::string, std::string>& d = gpu->details;
    const std::string kernel = Kernel(d);

    // The plain emulation, for comparison.
    const auto t_plain = std::chrono::steady_clock::now();
    absl::StatusOr<RunResult> plain =
        TestCpuBackend()->Run(layer->problem, ConfigOf("cpu", c.precision), {});
    const double plain_s = Seconds(t_plain);
    std::string plain_pct = "-";
    if (plain.ok()) {
      plain_pct = Percent(Bitwise(gpu->output, plain->output));
    } else {
      ++errors;
      ADD_FAILURE() << "cpu:" << name << ": " << plain.status();
      plain_pct = absl::StrCat("error: ", plain.status().message());
    }

    // The replay of the kernel the GPU ran.
    std::string replay_cell, replay_pct = "-";
    double replay_s = 0;
    auto replay_it = d.find("replay");
    if (replay_it == d.end()) {
      ++unavailable;
      auto why = d.find("replay_unavailable");
      replay_cell =
          absl::StrCat("none: ", why == d.end() ? std::string("no replay detail") : why->second);
    } else {
      const std::string& replay = replay_it->second;
      replay_cell = replay;
      absl::StatusOr<ConfigSpec> spec = ParseConfigSpec(replay, "replay");
      if (!spec.ok()) {
        ++errors;
        ADD_FAILURE() << "replay '" << replay << "': " << spec.status();
        replay_pct = "error: does not parse";
      } else {
        const Config cpu_config = ResolveConfig(*spec, /*has_bias=*/true, Activation::kNone,
                                                BiasMode::kFused, Fp8Scaling::kTensor);
        EXPECT_EQ(cpu_config.ToString(), replay) << "not canonical";
        const auto t_replay = std::chrono::steady_clock::now();
        absl::StatusOr<RunResult> cpu = TestCpuBackend()->Run(layer->problem, cpu_config, {});
        replay_s = Seconds(t_replay);
        if (cpu.ok()) {
          ++replayed;
          const Share share = Bitwise(gpu->output, cpu->output);
          exact += share.count > 0 && share.equal == share.count;
          replay_pct = Percent(share);
        } else {
          ++errors;
          ADD_FAILURE() << replay << ": " << cpu.status();
          replay_pct = absl::StrCat("error: ", cpu.status().message());
        }
        if (gen.has_value()) {
          const std::pair<std::string, std::string> at =
              absl::StrSplit(replay, absl::MaxSplits('@', 1));
          orders["kernels"].push_back({{"precision", name},
                                       {"m", s.m},
                                       {"n", s.n},
                                       {"k", s.k},
                                       {"options", at.second},
                                       {"algo", Detail(d, "algo")},
                                       {"algo_tile", Detail(d, "algo_tile")},
                                       {"algo_stages", Detail(d, "algo_stages")}});
          if (!out_dir.empty()) {
            WriteFile(std::filesystem::path(out_dir) / "kernel_orders" /
                          absl::StrCat(TensorCoreGpuName(*gen), ".json"),
                      orders.dump(2) + "\n");
          }
        }
      }
    }
    row(kernel, replay_cell, replay_pct, plain_pct);
    done_s += Seconds(t_case);
    done_products += products;
    // How long each part took, for the step's limit in run.sh.
    std::printf("time %s %s: gpu %.2f s, replay %.2f s, plain %.2f s\n", name.c_str(), dims.c_str(),
                gpu_s, replay_s, plain_s);
  }
  if (gen.has_value() && !out_dir.empty()) {
    WriteFile(std::filesystem::path(out_dir) / "kernel_orders" /
                  absl::StrCat(TensorCoreGpuName(*gen), ".json"),
              orders.dump(2) + "\n");
  }
  std::printf(
      "replay_bitwise: %d cases, %d replayed, %d at 100.000%% bitwise, %d without a replay, %d "
      "not on this device, %d skipped for time, %d errors\n",
      cases, replayed, exact, unavailable, skipped, over_budget, errors);
}

}  // namespace
}  // namespace tensorcheck
