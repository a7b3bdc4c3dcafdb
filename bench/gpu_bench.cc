// GPU benchmark, at the candle case's size: 1921x4096 -> 3072,
// bf16 x, W, b and output.
//
//  1. Server-side time of a `cublaslt:bf16:fused` configuration in a
//     verification, statistics on the device included (upload x, W, b, the
//     matmul, upload the observed output and the reference, both
//     comparisons, statistics back), against the bare cuBLASLt call in this
//     process with the same uploads and the output's download. Target: at
//     most 2x. The same against the matmul alone, for the record.
//  2. The whole Engine::Verify of that configuration on the device (the
//     default reference cublaslt:fp64, W and b resident by digest) against
//     the bare pipeline with W on the device (upload x, cublasLtMatmul,
//     download y); target at most 3x. The same the host way, for the
//     record; Diagnose with the default candidates against the
//     verification, target at most 4x.
//  3. Bandwidth of the statistics kernels against a device-to-device copy
//     (bytes read / time against bytes read and written / time). Target: at
//     least 0.5.
//
//   build/bench/gpu_bench [iterations] [stats]   # default 20; `stats`: part 3 only
//
// Without a device it says so and exits 0.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/status_macros.h"
#include "server/backends/cuda/cuda_bench.h"
#include "server/backends/device_session.h"
#include "server/backends/linear_backend.h"
#include "server/engine/engine.h"
#include "server/stats/tolerance.h"

namespace tensorcheck {
namespace {

Tensor Random(DType dtype, std::vector<int64_t> shape, double lo, double hi, uint32_t seed) {
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> v(static_cast<size_t>(count));
  for (double& e : v) e = u(rng);
  return *FromDoubles(dtype, shape, v);
}

// A configuration's share of a verification the way a request that mixes
// devices would run it if its statistics stayed on the device: a session
// of its own, x, W and b uploaded, the run, the reference and the
// observed output uploaded with their error-model arrays, the two
// comparisons there, statistics back.
absl::Status VerificationShare(LinearBackend* lt, const LinearProblem& problem,
                               const PreparedRun& run, const Tensor& reference,
                               const CompareOptions& vs_ref, const Tensor& observed,
                               const CompareOptions& vs_obs) {
  ComputeDevice* device = lt->compute_device();
  if (device == nullptr) return absl::FailedPreconditionError("no device");
  TC_ASSIGN_OR_RETURN(std::unique_ptr<DeviceSession> session, device->OpenSession(nullptr));
  SessionOperands op;
  TC_ASSIGN_OR_RETURN(op.input, session->Upload(*problem.input));
  TC_ASSIGN_OR_RETURN(op.weight, session->Upload(*problem.weight));
  TC_ASSIGN_OR_RETURN(op.bias, session->Upload(*problem.bias));
  op.shape() = problem.shape();
  TC_ASSIGN_OR_RETURN(SessionRun y, session->Run(op, run, {}));
  const int64_t count = problem.m * problem.n;
  const struct {
    const Tensor* other;
    bool output_is_actual;
    const CompareOptions* options;
  } comparisons[] = {{&reference, true, &vs_ref}, {&observed, false, &vs_obs}};
  for (const auto& c : comparisons) {
    TC_ASSIGN_OR_RETURN(ArrayRef other, session->Upload(*c.other));
    TC_ASSIGN_OR_RETURN(const SessionCompare sc, UploadCompare(*session, *c.options, count));
    TC_RETURN_IF_ERROR(session
                           ->Compare(c.output_is_actual ? y.output : other,
                                     c.output_is_actual ? other : y.output, sc)
                           .status());
  }
  return absl::OkStatus();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <typename F>
double MedianWallMs(int iterations, F&& work) {
  std::vector<double> ms;
  for (int i = 0; i < 2 + iterations; ++i) {
    const auto start = std::chrono::steady_clock::now();
    work();
    const double t =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (i >= 2) ms.push_back(t);
  }
  return Median(ms);
}

int Fail(const absl::Status& s, const char* what) {
  std::fprintf(stderr, "gpu_bench: %s: %s\n", what, s.ToString().c_str());
  return 1;
}

int Main(int iterations, bool stats_only) {
  BackendRegistry registry;
  absl::Status s = RegisterBuiltinBackends(&registry);
  if (!s.ok()) return Fail(s, "backends");
  LinearBackend* lt = *registry.Find("cublaslt");
  LinearBackend* gemm_ex = *registry.Find("cublas");
  if (!lt->Available().ok()) {
    std::printf("gpu_bench: no GPU here (%s); nothing measured\n",
                std::string(lt->Available().message()).c_str());
    return 0;
  }
  const DeviceDescription dev = lt->device();
  std::printf("device: %s (cc %s), driver %s, cuBLAS %s; %d iterations, medians\n\n",
              dev.name.c_str(), dev.compute_capability.c_str(), dev.driver_version.c_str(),
              dev.cublas_version.c_str(), iterations);

  const int64_t m = 1921, k = 4096, n = 3072;
  const DType bf16 = DType::kBFloat16;
  Tensor x = Random(bf16, {m, k}, -1, 1, 1);
  Tensor w = Random(bf16, {n, k}, -1.0 / 64, 1.0 / 64, 2);
  Tensor b = Random(bf16, {n}, -2, 2, 3);
  LinearProblem problem;
  problem.input = &x;
  problem.weight = &w;
  problem.bias = &b;
  problem.output_dtype = bf16;
  problem.m = m;
  problem.n = n;
  problem.k = k;
  const Config fused{"cublaslt", Precision::kBf16, BiasMode::kFused};
  const PreparedRun fused_run = lt->Prepare(problem, fused);

  // The observed output (candle-style, two roundings) and a reference.
  auto observed = gemm_ex->Run(problem, {"cublas", Precision::kBf16, BiasMode::kUnfused}, {});
  if (!observed.ok()) return Fail(observed.status(), "observed output");
  auto reference = gemm_ex->Run(problem, {"cublas", Precision::kFp64, BiasMode::kUnfused}, {});
  if (!reference.ok()) return Fail(reference.status(), "reference output");

  const int64_t count = m * n;
  if (!stats_only) {
    // ---- 1. one configuration of a verification vs the bare call.
    auto bare = TimeBareCublasLt(problem, iterations);
    if (!bare.ok()) return Fail(bare.status(), "bare cuBLASLt");
    std::vector<float> sigma(static_cast<size_t>(count), 0.01f), pair_sigma(sigma.size(), 0.001f),
        bound(sigma.size(), 0.05f);
    CompareOptions base;
    base.tolerance = ResolveTolerance(TolerancePreset::kTorch, bf16);
    base.compared_dtype = bf16;
    base.cols = n;
    CompareOptions vs_ref = base, vs_obs = base;
    vs_ref.predicted_sigma = sigma.data();
    vs_ref.predicted_sigma_sum_sq =
        0.01 * 0.01 * static_cast<double>(count);  // as PredictSigma returns
    vs_ref.error_bound = bound.data();
    vs_obs.predicted_sigma = pair_sigma.data();
    vs_obs.predicted_sigma_sum_sq = 0.001 * 0.001 * static_cast<double>(count);
    vs_obs.error_bound = bound.data();
    absl::Status run_status;
    const double config_ms = MedianWallMs(iterations, [&] {
      absl::Status s = VerificationShare(lt, problem, fused_run, reference->output, vs_ref,
                                         observed->output, vs_obs);
      if (!s.ok()) run_status = s;
    });
    if (!run_status.ok()) return Fail(run_status, "cublaslt:bf16:fused with device statistics");
    const double run_only_ms = MedianWallMs(iterations, [&] {
      auto r = lt->Run(problem, fused, {});
      if (!r.ok()) run_status = r.status();
    });

    std::printf("## 1. cublaslt:bf16:fused, %lldx%lld -> %lld, bf16\n\n", (long long)m,
                (long long)k, (long long)n);
    std::printf("| what | ms | ratio |\n|---|---|---|\n");
    std::printf("| bare cublasLtMatmul, data on the device (algo %s) | %.3f | |\n",
                bare->algo.c_str(), bare->matmul_ms);
    std::printf("| bare: upload x, W, b + matmul + download y | %.3f | 1.00 (baseline) |\n",
                bare->with_transfers_ms);
    std::printf("| backend Run (upload, matmul, download y) | %.3f | %.2f |\n", run_only_ms,
                run_only_ms / bare->with_transfers_ms);
    std::printf(
        "| verification share: upload x, W, b, observed, reference + matmul + "
        "2 comparisons on the device, statistics back | %.3f | **%.2f** (target <= 2) |\n",
        config_ms, config_ms / bare->with_transfers_ms);
    std::printf("| the same against the matmul alone | | %.1f |\n", config_ms / bare->matmul_ms);
    // Where the verification share goes: the two uploads beyond the bare
    // call's (pageable host memory, as the request's tensors are).
    auto upload_ref = TimeUploadMs(reference->output, iterations);
    auto upload_obs = TimeUploadMs(observed->output, iterations);
    if (upload_ref.ok() && upload_obs.ok()) {
      std::printf("| of which: uploading the reference and the observed output | %.3f | |\n",
                  *upload_ref + *upload_obs);
    }
    std::printf("\n");

    // ---- 2. the whole verification on the device, the weight resident.
    std::printf(
        "## 2. Engine::Verify of cublaslt:bf16:fused with the observed output, default "
        "reference; W and b sent by digest (resident after the first request)\n\n");
    const int runs = std::max(3, iterations / 5);
    auto request = [&](bool diagnose) {
      LinearRequest req;
      req.input = x.Clone();
      req.weight = w.Clone();
      req.weight.set_content_id("sha256:gpu-bench-candle-weight");
      req.bias = b.Clone();
      req.bias->set_content_id("sha256:gpu-bench-candle-bias");
      req.observed = observed->output.Clone();
      (void)req.observed->Reshape({m, n});
      if (!diagnose) req.configs = {"cublaslt:bf16:fused"};
      return req;
    };
    // Median wall time of `runs` calls after one warm-up (which also makes
    // the weight resident); the last outcome in `last`.
    auto time_engine = [&](const Engine& engine, bool diagnose, VerifyOutcome* last,
                           int count) -> absl::StatusOr<double> {
      const LinearRequest req = request(diagnose);
      std::vector<double> wall;
      for (int i = 0; i < count + 1; ++i) {
        const auto start = std::chrono::steady_clock::now();
        auto out = diagnose ? engine.Diagnose(req) : engine.Verify(req);
        const double t =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                .count();
        if (!out.ok()) return out.status();
        if (i > 0) wall.push_back(t);
        *last = *std::move(out);
      }
      return Median(wall);
    };
    EngineOptions on_device;
    auto engine = Engine::Create(on_device, &registry);
    if (!engine.ok()) return Fail(engine.status(), "engine");
    EngineOptions host_way = on_device;
    host_way.device_sessions = false;
    auto host_engine = Engine::Create(host_way, &registry);
    if (!host_engine.ok()) return Fail(host_engine.status(), "engine");
    VerifyOutcome last;
    auto verify_ms = time_engine(**engine, false, &last, runs);
    if (!verify_ms.ok()) return Fail(verify_ms.status(), "verify on the device");
    const VerifyOutcome verified = std::move(last);
    auto host_ms = time_engine(**host_engine, false, &last, 3);
    if (!host_ms.ok()) return Fail(host_ms.status(), "verify the host way");
    auto diagnose_ms = time_engine(**engine, true, &last, runs);
    if (!diagnose_ms.ok()) return Fail(diagnose_ms.status(), "diagnose on the device");
    // A session counter of an outcome's reference ("-" when absent).
    auto detail_of = [](const VerifyOutcome& o, const char* key) {
      auto it = o.reference.details.find(key);
      return it == o.reference.details.end() ? std::string("-") : it->second;
    };
    auto detail = [&](const char* key) { return detail_of(verified, key); };
    std::printf("| what | ms | ratio |\n|---|---|---|\n");
    std::printf(
        "| bare: upload x + cublasLtMatmul + download y (W, b on the device) | %.3f | "
        "1.00 (baseline) |\n",
        bare->input_only_ms);
    std::printf(
        "| verification on the device (reference %s; uploads %s, resident hits %s, "
        "downloads %s) | %.2f | **%.2f** (target <= 3) |\n",
        verified.reference.config.c_str(), detail("session_uploads").c_str(),
        detail("session_resident_hits").c_str(), detail("session_downloads").c_str(), *verify_ms,
        *verify_ms / bare->input_only_ms);
    std::printf(
        "| the same the host way (device_sessions off: a host session, the "
        "configurations' outputs downloaded, magnitude sums and statistics on the CPU) "
        "| %.1f | %.1f |\n",
        *host_ms, *host_ms / bare->input_only_ms);
    auto diagnosis_detail = [&](const char* key) { return detail_of(last, key); };
    std::printf(
        "| Diagnose, default candidates (%zu, all on the device; diagnosis passes %s, "
        "downloads %s, %s bytes) | %.2f | **%.2f** of the verification (target <= 4) |\n\n",
        last.results.size(), diagnosis_detail("session_diagnosis_passes").c_str(),
        diagnosis_detail("session_downloads").c_str(),
        diagnosis_detail("session_download_bytes").c_str(), *diagnose_ms,
        *diagnose_ms / *verify_ms);
  }  // !stats_only

  // ---- 3. statistics kernels vs a device-to-device copy.
  std::printf("## 3. Statistics kernels vs device-to-device copy\n\n");
  std::printf(
      "| pairs | dtype | copy of one array ms | totals pass ms | ratio (totals) | "
      "full comparison (with worst elements) ms | ratio (full) | host set-up "
      "ms |\n"
      "|---|---|---|---|---|---|---|---|\n");
  struct Size {
    DType dtype;
    int64_t pairs;
  };
  for (const Size& size : {Size{bf16, count}, Size{DType::kFloat32, int64_t{1} << 24}}) {
    Tensor a =
        size.dtype == bf16 ? observed->output.Clone() : Random(size.dtype, {size.pairs}, -1, 1, 4);
    Tensor e =
        size.dtype == bf16 ? reference->output.Clone() : Random(size.dtype, {size.pairs}, -1, 1, 5);
    CompareOptions o;
    o.tolerance = ResolveTolerance(TolerancePreset::kTorch, size.dtype);
    o.compared_dtype = size.dtype;
    o.cols = size.dtype == bf16 ? n : 0;
    std::vector<float> sizes_sigma(static_cast<size_t>(size.pairs), 0.01f);
    o.predicted_sigma = sizes_sigma.data();
    auto stats = TimeDeviceStatistics(a, e, o, iterations);
    if (!stats.ok()) return Fail(stats.status(), "statistics kernels");
    // Bandwidth: the statistics read both arrays (2B bytes); a copy of one
    // array reads and writes B bytes each (2B bytes). Equal bytes, so the
    // ratio of bandwidths is the inverse ratio of times.
    auto copy = TimeDeviceCopyMs(static_cast<int64_t>(a.nbytes()), iterations);
    if (!copy.ok()) return Fail(copy.status(), "device copy");
    std::printf("| %lld | %s | %.4f | %.4f | **%.2f** (target >= 0.5) | %.4f | %.2f | %.2f |\n",
                (long long)size.pairs, std::string(DTypeName(size.dtype)).c_str(), *copy,
                stats->totals_ms, *copy / stats->totals_ms, stats->full_ms, *copy / stats->full_ms,
                stats->host_ms);
  }
  return 0;
}

}  // namespace
}  // namespace tensorcheck

int main(int argc, char** argv) {
  const int iterations = argc > 1 ? std::max(3, std::atoi(argv[1])) : 20;
  const bool stats_only = argc > 2 && std::string(argv[2]) == "stats";
  return tensorcheck::Main(iterations, stats_only);
}
