// Default diagnoses of one layer shape in one run (docs/performance.md,
// "Diagnosis: FP8 operands and the second tier"): the in-process Engine on the CPU
// backend, best of `--repeat` runs each.
//
//   fp8_diagnose_bench [--m=256 --k=4096 --n=1024] [--repeat=3] [--case=NAME]
//
// Cases (x [M, K], W [N, K], b [N], bias fused, bf16 output):
//   bf16        bf16 operands; the observed output an fp32 accumulation in
//               K tiles of 32: explained by the first tier (the baseline);
//   fp8         x and W quantised by the row-wise recipe and sent as
//               float8_e4m3fn with their scales; the observed output the
//               split accumulation (an fp32 sum of the exact products,
//               in K tiles of 32), then the scales, the bias;
//   bf16_fp8row the bf16 operands of `bf16`, the observed output of `fp8`:
//               no wide precision explains it, so the second tier runs
//               and names cpu:fp8e4m3:fused@scaling=row;
//   fp32_bf16x3 fp32 operands; the observed output XLA's bf16x3 (three
//               bf16 passes, each in K tiles of 32): the second tier runs;
//   mxfp8       x and W quantised by torchao's MX recipe (floor, 32-element
//               blocks) and sent as float8_e4m3fn with float8_e8m0fnu
//               scales; the observed output an fp32 accumulation of the
//               dequantised values in K tiles of 32, then the bias;
//   bf16_mxfp8  the bf16 operands of `bf16`, the observed output of
//               `mxfp8`: the second tier runs and names
//               cpu:mxfp8e4m3:fused@scaling=floor.
//   bf16_splitk the bf16 operands of `bf16`, the observed output split-K
//               in 4 slices, each an fp32 accumulation in K tiles of 32,
//               the partials rounded to bf16 and added in bf16, then the
//               bias: the second tier runs and names
//               cpu:bf16:fused@splitk=4,reduce=output.
// Prints per case the time, which tiers ran, how many candidates were
// ranked, best and the verdict, then each case's ratio to `bf16`.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "bench/bench_support.h"
#include "core/executor.h"
#include "core/float_formats.h"
#include "core/fp8_scaling.h"
#include "core/linear_config.h"
#include "core/mx_formats.h"
#include "server/backends/linear_backend.h"
#include "server/engine/engine.h"

namespace tensorcheck {
namespace {

using Clock = std::chrono::steady_clock;
using bench::FlagText;
using bench::FlagValue;

struct Layer {
  int64_t m, k, n;
  std::vector<float> x, w, b;  // the wide operands' values
};

// acc[m, n] = x [m, k] . w [n, k]^T in fp32, in K tiles of 32 (each tile
// an sgemm added into the accumulator).
std::vector<float> TiledGemm(const std::vector<float>& x, const std::vector<float>& w, int64_t m,
                             int64_t k, int64_t n) {
  std::vector<float> acc(static_cast<size_t>(m * n), 0.0f);
  constexpr int64_t kTile = 32;
  for (int64_t t = 0; t < k; t += kTile) {
    const int64_t kt = std::min(kTile, k - t);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(kt), 1.0f, x.data() + t, static_cast<int>(k), w.data() + t,
                static_cast<int>(k), 1.0f, acc.data(), static_cast<int>(n));
  }
  return acc;
}

Layer MakeLayer(int64_t m, int64_t k, int64_t n, bool bf16_values) {
  Layer l{m, k, n, {}, {}, {}};
  std::mt19937 rng(42);
  std::normal_distribution<double> normal(0.0, 1.0);
  auto value = [&](double v) {
    return bf16_values ? RoundToBf16(static_cast<float>(v)) : static_cast<float>(v);
  };
  l.x.resize(static_cast<size_t>(m * k));
  l.w.resize(static_cast<size_t>(n * k));
  l.b.resize(static_cast<size_t>(n));
  for (float& v : l.x) v = value(normal(rng));
  for (float& v : l.w) v = value(normal(rng) / std::sqrt(double(k)));
  for (float& v : l.b) v = value(normal(rng));
  return l;
}

Tensor Wide(DType dtype, std::vector<int64_t> shape, const std::vector<float>& v) {
  return *FromDoubles(dtype, std::move(shape), std::vector<double>(v.begin(), v.end()));
}

// The fused epilogue: fl32(acc + b) rounded once to bf16.
std::vector<double> FusedBf16(const std::vector<float>& acc, const std::vector<float>& b,
                              int64_t n) {
  std::vector<double> out(acc.size());
  for (size_t i = 0; i < acc.size(); ++i) {
    out[i] = RoundToBf16(acc[i] + b[i % static_cast<size_t>(n)]);
  }
  return out;
}

struct Case {
  std::string name;
  LinearRequest request;
};

// The bf16 layer explained by bf16 with a fused bias.
Case Bf16Case(const Layer& l) {
  Case c{"bf16", {}};
  c.request.input = Wide(DType::kBFloat16, {l.m, l.k}, l.x);
  c.request.weight = Wide(DType::kBFloat16, {l.n, l.k}, l.w);
  c.request.bias = Wide(DType::kBFloat16, {l.n}, l.b);
  c.request.observed = *FromDoubles(DType::kBFloat16, {l.m, l.n},
                                    FusedBf16(TiledGemm(l.x, l.w, l.m, l.k, l.n), l.b, l.n));
  return c;
}

// The row-wise recipe's operands and the output of its split
// accumulation: (acc * sx[i]) * sw[j] in fp32, then the fused bias.
struct Fp8Layer {
  Fp8Quantized x, w;
  std::vector<double> observed;
};

Fp8Layer QuantisedLayer(const Layer& l) {
  Fp8Layer q;
  q.x = *QuantizeFp8(Wide(DType::kBFloat16, {l.m, l.k}, l.x), l.m, l.k, Fp8Format::kE4M3Fn,
                     Fp8Scaling::kRow);
  q.w = *QuantizeFp8(Wide(DType::kBFloat16, {l.n, l.k}, l.w), l.n, l.k, Fp8Format::kE4M3Fn,
                     Fp8Scaling::kRow);
  std::vector<float> xq(static_cast<size_t>(l.m * l.k)), wq(static_cast<size_t>(l.n * l.k));
  for (size_t i = 0; i < xq.size(); ++i) xq[i] = static_cast<float>(q.x.values.GetDouble(i));
  for (size_t i = 0; i < wq.size(); ++i) wq[i] = static_cast<float>(q.w.values.GetDouble(i));
  std::vector<float> acc = TiledGemm(xq, wq, l.m, l.k, l.n);
  for (int64_t i = 0; i < l.m; ++i) {
    for (int64_t j = 0; j < l.n; ++j) {
      float& a = acc[static_cast<size_t>(i * l.n + j)];
      a = (a * q.x.scales[static_cast<size_t>(i)]) * q.w.scales[static_cast<size_t>(j)];
    }
  }
  q.observed = FusedBf16(acc, l.b, l.n);
  return q;
}

Case Fp8Case(const Layer& l, const Fp8Layer& q) {
  Case c{"fp8", {}};
  c.request.input = q.x.values.Clone();
  c.request.weight = q.w.values.Clone();
  c.request.input_scale = *FromFloats(DType::kFloat32, {l.m}, q.x.scales);
  c.request.weight_scale = *FromFloats(DType::kFloat32, {l.n}, q.w.scales);
  c.request.bias = Wide(DType::kBFloat16, {l.n}, l.b);
  c.request.observed = *FromDoubles(DType::kBFloat16, {l.m, l.n}, q.observed);
  return c;
}

// The bf16 layer of `bf16` with another observed output.
Case WideCase(const Layer& l, std::string name, const std::vector<double>& observed) {
  Case c = Bf16Case(l);
  c.name = std::move(name);
  c.request.observed = *FromDoubles(DType::kBFloat16, {l.m, l.n}, observed);
  return c;
}

// fp32 operands, XLA's bf16x3: hi = the value cut to bf16, lo = the
// remainder rounded to bf16; (lo.hi + hi.lo) + hi.hi, each pass an fp32
// GEMM in K tiles of 32; the fused bias; an fp32 output.
Case Fp32Bf16x3Case(const Layer& l) {
  Case c{"fp32_bf16x3", {}};
  const MultiPassScheme scheme = MultiPassSchemeOf(Precision::kBf16x3);
  auto split = [&](const std::vector<float>& v, std::vector<float>* hi, std::vector<float>* lo) {
    hi->resize(v.size());
    lo->resize(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      float parts[3] = {0, 0, 0};
      SplitMultiPass(scheme, v[i], parts);
      (*hi)[i] = parts[0];
      (*lo)[i] = parts[1];
    }
  };
  std::vector<float> xh, xl, wh, wl;
  split(l.x, &xh, &xl);
  split(l.w, &wh, &wl);
  const std::vector<float> lh = TiledGemm(xl, wh, l.m, l.k, l.n);
  const std::vector<float> hl = TiledGemm(xh, wl, l.m, l.k, l.n);
  const std::vector<float> hh = TiledGemm(xh, wh, l.m, l.k, l.n);
  std::vector<double> out(hh.size());
  for (size_t i = 0; i < hh.size(); ++i) {
    out[i] = (lh[i] + hl[i]) + hh[i] + l.b[i % static_cast<size_t>(l.n)];
  }
  c.request.input = Wide(DType::kFloat32, {l.m, l.k}, l.x);
  c.request.weight = Wide(DType::kFloat32, {l.n, l.k}, l.w);
  c.request.bias = Wide(DType::kFloat32, {l.n}, l.b);
  c.request.observed = *FromDoubles(DType::kFloat32, {l.m, l.n}, out);
  return c;
}

// torchao's MX recipe (floor) on the bf16 layer, its operands and the
// output of an fp32 accumulation of the dequantised values.
struct MxLayer {
  BlockScaled x, w;
  std::vector<double> observed;
};

MxLayer MxQuantisedLayer(const Layer& l) {
  MxLayer q;
  q.x = *QuantizeMxFp8(l.x, l.m, l.k, Fp8Format::kE4M3Fn, MxScaleRounding::kFloor);
  q.w = *QuantizeMxFp8(l.w, l.n, l.k, Fp8Format::kE4M3Fn, MxScaleRounding::kFloor);
  q.observed = FusedBf16(
      TiledGemm(DequantizeBlockScaled(q.x), DequantizeBlockScaled(q.w), l.m, l.k, l.n), l.b, l.n);
  return q;
}

Case MxCase(const Layer& l, const MxLayer& q) {
  Case c{"mxfp8", {}};
  auto bytes = [](const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); };
  c.request.input = *Tensor::FromBytes(DType::kFloat8E4M3Fn, {l.m, l.k}, bytes(q.x.codes));
  c.request.weight = *Tensor::FromBytes(DType::kFloat8E4M3Fn, {l.n, l.k}, bytes(q.w.codes));
  c.request.input_scale = *Tensor::FromBytes(DType::kFloat8E8M0Fnu,
                                             {q.x.scale_rows, q.x.scale_cols}, bytes(q.x.scales));
  c.request.weight_scale = *Tensor::FromBytes(DType::kFloat8E8M0Fnu,
                                              {q.w.scale_rows, q.w.scale_cols}, bytes(q.w.scales));
  c.request.bias = Wide(DType::kBFloat16, {l.n}, l.b);
  c.request.observed = *FromDoubles(DType::kBFloat16, {l.m, l.n}, q.observed);
  return c;
}

// Split-K in 4 slices of the bf16 layer, reduced in bf16 (docs/numerics.md,
// "Split-K"): each slice's partial rounded to bf16, added left to right in
// bf16, then the fused bias.
Case SplitKCase(const Layer& l) {
  const int64_t slice = SplitKSlice(l.k, 4);
  std::vector<float> r(static_cast<size_t>(l.m * l.n), 0.0f);
  for (int64_t k0 = 0; k0 < l.k; k0 += slice) {
    const int64_t ks = std::min(slice, l.k - k0);
    std::vector<float> xs(static_cast<size_t>(l.m * ks)), ws(static_cast<size_t>(l.n * ks));
    for (int64_t i = 0; i < l.m; ++i) {
      std::copy_n(l.x.begin() + i * l.k + k0, ks, xs.begin() + i * ks);
    }
    for (int64_t j = 0; j < l.n; ++j) {
      std::copy_n(l.w.begin() + j * l.k + k0, ks, ws.begin() + j * ks);
    }
    const std::vector<float> p = TiledGemm(xs, ws, l.m, ks, l.n);
    for (size_t e = 0; e < r.size(); ++e) {
      r[e] = k0 == 0 ? RoundToBf16(p[e]) : RoundToBf16(r[e] + RoundToBf16(p[e]));
    }
  }
  return WideCase(l, "bf16_splitk", FusedBf16(r, l.b, l.n));
}

const char* VerdictName(DiagnosisVerdict v) {
  switch (v) {
    case DiagnosisVerdict::kRounding:
      return "rounding";
    case DiagnosisVerdict::kDefect:
      return "defect";
    case DiagnosisVerdict::kUnexplained:
      return "unexplained";
    default:
      return "unspecified";
  }
}

int Main(int argc, char** argv) {
  const int64_t m = FlagValue(argc, argv, "m", 256);
  const int64_t k = FlagValue(argc, argv, "k", 4096);
  const int64_t n = FlagValue(argc, argv, "n", 1024);
  const int repeat = static_cast<int>(FlagValue(argc, argv, "repeat", 3));
  const std::string only = FlagText(argc, argv, "case", "");

  BackendRegistry registry;
  if (!RegisterBuiltinBackends(&registry).ok()) return 1;
  auto executor = Executor::Create({});  // one pool, as the server makes
  if (!executor.ok()) return 1;
  EngineOptions options;
  options.executor = executor->get();
  options.default_reference = "cpu:fp64";
  auto engine = Engine::Create(options, &registry);
  if (!engine.ok()) {
    std::fprintf(stderr, "%s\n", engine.status().ToString().c_str());
    return 1;
  }

  const Layer bf16 = MakeLayer(m, k, n, /*bf16_values=*/true);
  const Fp8Layer q = QuantisedLayer(bf16);
  std::vector<Case> cases;
  cases.push_back(Bf16Case(bf16));
  cases.push_back(Fp8Case(bf16, q));
  cases.push_back(WideCase(bf16, "bf16_fp8row", q.observed));
  cases.push_back(Fp32Bf16x3Case(MakeLayer(m, k, n, /*bf16_values=*/false)));
  const MxLayer mx = MxQuantisedLayer(bf16);
  cases.push_back(MxCase(bf16, mx));
  cases.push_back(WideCase(bf16, "bf16_mxfp8", mx.observed));
  cases.push_back(SplitKCase(bf16));

  std::printf("layer: %lld x %lld -> %lld, bias fused, CPU backend, best of %d\n\n",
              static_cast<long long>(m), static_cast<long long>(k), static_cast<long long>(n),
              repeat);
  std::printf(
      "| case | diagnose | of which backend runs | tiers | candidates | best | verdict |\n"
      "|---|---|---|---|---|---|---|\n");
  std::vector<std::pair<std::string, double>> times;
  for (const Case& c : cases) {
    if (!only.empty() && c.name != only && c.name != "bf16") continue;
    double best_s = 0, runs_ms = 0;
    absl::StatusOr<VerifyOutcome> out;
    for (int r = 0; r < repeat; ++r) {
      const auto t0 = Clock::now();
      out = (*engine)->Diagnose(c.request);
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      if (!out.ok()) {
        std::fprintf(stderr, "%s: %s\n", c.name.c_str(), out.status().ToString().c_str());
        return 1;
      }
      if (r == 0 || s < best_s) {
        best_s = s;
        runs_ms = out->reference.elapsed_ms;
        for (const ConfigOutcome& o : out->results) runs_ms += o.elapsed_ms;
      }
    }
    const DiagnosisOutcome& d = *out->diagnosis;
    std::printf("| %s | %.3f s | %.3f s | %s | %zu | %s | %s |\n", c.name.c_str(), best_s,
                runs_ms / 1e3, absl::StrJoin(d.candidate_tiers, "+").c_str(), d.ranking.size(),
                d.best.value_or("null").c_str(), VerdictName(d.verdict));
    std::fflush(stdout);
    times.emplace_back(c.name, best_s);
  }
  std::printf("\n");
  for (size_t i = 1; i < times.size(); ++i) {
    std::printf("%s / bf16: %.2f\n", times[i].first.c_str(), times[i].second / times[0].second);
  }
  return 0;
}

}  // namespace
}  // namespace tensorcheck

int main(int argc, char** argv) { return tensorcheck::Main(argc, argv); }
