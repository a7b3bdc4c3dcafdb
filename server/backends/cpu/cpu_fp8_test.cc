// The CPU backend's FP8 precisions against independent computations:
// exact sums of exact FP8 products (fp64), the recipe written out from
// its definition (docs/numerics.md, "Scaling recipes") with brute-force
// FP8 rounding (tests/testing/ref_round.h), and hand-derived fast
// accumulation.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/backends/cpu/cpu_backend.h"
#include "tests/testing/ref_round.h"
#include "tests/testing/status_matchers.h"

namespace tensorcheck {
namespace {

using ::tensorcheck::testing::IsOk;
using ::tensorcheck::testing::kBf16Format;
using ::tensorcheck::testing::RefFp8Nearest;
using ::tensorcheck::testing::RefFp8Value;
using ::tensorcheck::testing::RefRound;
using ::tensorcheck::testing::StatusIs;
using ::testing::HasSubstr;

std::unique_ptr<CpuBackend> NewBackend() { return std::move(*CpuBackend::Create({})); }

Config Fp8Cfg(Precision p, BiasMode bias, Fp8Scaling scaling, bool fast) {
  Config c{"cpu", p, bias};
  c.scaling = scaling;
  c.fast_accum = fast;
  return c;
}

Tensor Bytes(DType dtype, std::vector<int64_t> shape, const std::vector<uint8_t>& bits) {
  return *Tensor::FromBytes(
      dtype, std::move(shape),
      absl::string_view(reinterpret_cast<const char*>(bits.data()), bits.size()));
}

Tensor Scale(const std::vector<float>& v) {
  return *FromFloats(DType::kFloat32, {static_cast<int64_t>(v.size())}, v);
}

struct Fp8Layer {
  int64_t m, n, k;
  Tensor x, w, sx, sw;
  std::optional<Tensor> bias;
  LinearProblem problem(DType out) const {
    LinearProblem p;
    p.input = &x;
    p.weight = &w;
    p.input_scale = &sx;
    p.weight_scale = &sw;
    p.bias = bias ? &*bias : nullptr;
    p.output_dtype = out;
    p.m = m;
    p.n = n;
    p.k = k;
    return p;
  }
};

// e4m3fn values in [1, 2) (patterns 0x38-0x3f, multiples of 1/8) with
// random signs: every product is a multiple of 1/64 below 4 and every
// partial sum of K <= 256 of them a multiple of 1/64 below 1024, exact in
// fp32 (16 significant bits): any summation order gives the exact sum.
Fp8Layer ExactLayer(int64_t m, int64_t n, int64_t k, bool row_wise, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> mantissa(0, 7), sign(0, 1);
  auto draw = [&](int64_t count) {
    std::vector<uint8_t> v(static_cast<size_t>(count));
    for (uint8_t& b : v) b = static_cast<uint8_t>(0x38 + mantissa(rng) + (sign(rng) ? 0x80 : 0));
    return v;
  };
  Fp8Layer l{m,
             n,
             k,
             Bytes(DType::kFloat8E4M3Fn, {m, k}, draw(m * k)),
             Bytes(DType::kFloat8E4M3Fn, {n, k}, draw(n * k)),
             Scale({}),
             Scale({}),
             {}};
  std::uniform_real_distribution<float> scale(0.001f, 0.01f);
  std::vector<float> sx(row_wise ? m : 1), sw(row_wise ? n : 1);
  for (float& s : sx) s = scale(rng);
  for (float& s : sw) s = scale(rng);
  l.sx = Scale(sx);
  l.sw = Scale(sw);
  return l;
}

double ExactDot(const Fp8Layer& l, int64_t i, int64_t j) {
  double s = 0;
  for (int64_t t = 0; t < l.k; ++t) {
    s += RefFp8Value(l.x.data<uint8_t>()[i * l.k + t], true) *
         RefFp8Value(l.w.data<uint8_t>()[j * l.k + t], true);
  }
  return s;
}

float ScaleAt(const Tensor& s, int64_t i) { return s.data<float>()[s.numel() == 1 ? 0 : i]; }

// The split accumulator is the exact sum here; the dequantisation follows
// docs/numerics.md: per tensor acc * fl32(sx sw), row-wise (acc sx) sw,
// each in fp32; then the fused bias in fp32 and one rounding to bf16.
TEST(CpuFp8Test, SplitAccumulatorIsExactAndScalesFollowTheRecipeOrder) {
  auto cpu = NewBackend();
  for (bool row_wise : {false, true}) {
    SCOPED_TRACE(row_wise ? "row-wise" : "per tensor");
    Fp8Layer l = ExactLayer(6, 10, 256, row_wise, 5);
    std::vector<float> b(10);
    for (int j = 0; j < 10; ++j) b[static_cast<size_t>(j)] = 0.25f * static_cast<float>(j - 4);
    l.bias = *FromFloats(DType::kBFloat16, {10}, b);
    const Fp8Scaling scaling = row_wise ? Fp8Scaling::kRow : Fp8Scaling::kTensor;
    auto r = cpu->Run(l.problem(DType::kBFloat16),
                      Fp8Cfg(Precision::kFp8E4M3, BiasMode::kFused, scaling, false), {});
    ASSERT_THAT(r, IsOk());
    ASSERT_EQ(r->output.dtype(), DType::kBFloat16);
    for (int64_t i = 0; i < l.m; ++i) {
      for (int64_t j = 0; j < l.n; ++j) {
        const float acc = static_cast<float>(ExactDot(l, i, j));  // exact in fp32
        const float sx = ScaleAt(l.sx, i), sw = ScaleAt(l.sw, j);
        const float scaled = row_wise ? (acc * sx) * sw : acc * (sx * sw);
        const double want = RefRound(scaled + b[static_cast<size_t>(j)], kBf16Format);
        ASSERT_EQ(r->output.GetDouble(i * l.n + j), want) << i << "," << j;
      }
    }
    EXPECT_EQ(r->details.at("accumulation"), "fp32 (split accumulator)");
  }
}

// A 1 x 1 layer's single scales fit either recipe, and the configuration's
// scaling decides the order. Hand-derived with acc = 1.5 * 2 = 3 and
// s = 1 + 2^-23 for both: per tensor fl32(s * s) = 1 + 2^-22 and
// 3 (1 + 2^-22) = 3 + 3 * 2^-22 exactly; row-wise 3 s = 3 + 1.5 * 2^-22
// ties to 3 + 2^-21, times s is 3 + 3.5 * 2^-22 + 2^-44, rounded to
// 3 + 2^-20.
TEST(CpuFp8Test, TheScalingOfTheConfigurationOrdersTheScaleProducts) {
  auto cpu = NewBackend();
  const float s = 1.0f + 0x1p-23f;
  Fp8Layer l{1,
             1,
             1,
             Bytes(DType::kFloat8E4M3Fn, {1, 1}, {0x3c}),
             Bytes(DType::kFloat8E4M3Fn, {1, 1}, {0x40}),
             Scale({s}),
             Scale({s}),
             {}};
  for (const auto& [scaling, want] : {std::pair{Fp8Scaling::kTensor, 3.0 + 3 * 0x1p-22},
                                      std::pair{Fp8Scaling::kRow, 3.0 + 0x1p-20}}) {
    auto r = cpu->Run(l.problem(DType::kFloat32),
                      Fp8Cfg(Precision::kFp8E4M3, BiasMode::kNone, scaling, false), {});
    ASSERT_THAT(r, IsOk());
    EXPECT_EQ(r->output.GetDouble(0), want) << Fp8ScalingName(scaling);
  }
}

// fp64 of FP8 operands: the dequantised layer, sum(xq wq) sx sw, to fp64.
TEST(CpuFp8Test, Fp64IsTheDequantisedLayer) {
  auto cpu = NewBackend();
  const Fp8Layer l = ExactLayer(3, 5, 64, /*row_wise=*/true, 9);
  auto r =
      cpu->Run(l.problem(DType::kFloat64), Config{"cpu", Precision::kFp64, BiasMode::kNone}, {});
  ASSERT_THAT(r, IsOk());
  for (int64_t i = 0; i < l.m; ++i) {
    for (int64_t j = 0; j < l.n; ++j) {
      const double want = ExactDot(l, i, j) * ScaleAt(l.sx, i) * ScaleAt(l.sw, j);
      EXPECT_NEAR(r->output.GetDouble(i * l.n + j), want, std::fabs(want) * 1e-15);
    }
  }
}

// Hand-derived: x = [448, 1, ..., 1], w = [448, 1, ..., 1], K = 32. The
// exact sum is 200704 + 31 = 200735 (exact in fp32). Fast accumulation
// aligns the ones to 200704's exponent (17) with 13 fraction bits, a
// quantum of 16: they truncate to zero, 200704.
TEST(CpuFp8Test, FastAccumulationLosesWhatTheModelSays) {
  auto cpu = NewBackend();
  std::vector<uint8_t> row(32, 0x38);  // 1.0
  row[0] = 0x7e;                       // 448
  Fp8Layer l{1,
             1,
             32,
             Bytes(DType::kFloat8E4M3Fn, {1, 32}, row),
             Bytes(DType::kFloat8E4M3Fn, {1, 32}, row),
             Scale({1.0f}),
             Scale({1.0f}),
             {}};
  auto split =
      cpu->Run(l.problem(DType::kFloat32),
               Fp8Cfg(Precision::kFp8E4M3, BiasMode::kNone, Fp8Scaling::kTensor, false), {});
  auto fast = cpu->Run(l.problem(DType::kFloat32),
                       Fp8Cfg(Precision::kFp8E4M3, BiasMode::kNone, Fp8Scaling::kTensor, true), {});
  ASSERT_THAT(split, IsOk());
  ASSERT_THAT(fast, IsOk());
  EXPECT_EQ(split->output.GetDouble(0), 200735.0);
  EXPECT_EQ(fast->output.GetDouble(0), 200704.0);
  EXPECT_THAT(fast->details.at("accumulation"), HasSubstr("13 fraction bits"));
}

// Wide operands under an fp8 precision: quantised by the recipe, written
// out here from its definition (amax, s = max / amax in fp64 rounded to
// fp32, saturating nearest FP8 of fl32(v s), dequantisation fl32(1 / s)).
// The values are chosen so that the quantised sums are exact in fp32.
TEST(CpuFp8Test, WideOperandsAreQuantisedByTheConfigurationsRecipe) {
  auto cpu = NewBackend();
  const int64_t m = 4, n = 3, k = 16;
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> u(-2.0, 2.0);
  std::vector<double> x(m * k), w(n * k);
  for (double& v : x) v = RefRound(u(rng), kBf16Format);
  for (double& v : w) v = RefRound(u(rng), kBf16Format);
  const Tensor xt = *FromDoubles(DType::kBFloat16, {m, k}, x);
  const Tensor wt = *FromDoubles(DType::kBFloat16, {n, k}, w);
  LinearProblem p;
  p.input = &xt;
  p.weight = &wt;
  p.output_dtype = DType::kFloat32;
  p.m = m;
  p.n = n;
  p.k = k;
  for (Fp8Scaling scaling : {Fp8Scaling::kTensor, Fp8Scaling::kRow}) {
    for (Precision precision : {Precision::kFp8E4M3, Precision::kFp8E5M2E4M3}) {
      SCOPED_TRACE(absl::StrCat(PrecisionName(precision), " ", Fp8ScalingName(scaling)));
      const bool x_e4m3 = precision == Precision::kFp8E4M3;
      // The recipe, per group of `count` values starting at `v`.
      auto quantise = [&](const std::vector<double>& v, int64_t rows, bool e4m3,
                          std::vector<double>* q, std::vector<float>* dequant) {
        const int64_t groups = scaling == Fp8Scaling::kRow ? rows : 1;
        const int64_t per = static_cast<int64_t>(v.size()) / groups;
        q->assign(v.size(), 0);
        dequant->assign(static_cast<size_t>(groups), 0);
        for (int64_t g = 0; g < groups; ++g) {
          double amax = 0;
          for (int64_t e = g * per; e < (g + 1) * per; ++e) amax = std::max(amax, std::fabs(v[e]));
          const float s = static_cast<float>((e4m3 ? 448.0 : 57344.0) / amax);
          (*dequant)[static_cast<size_t>(g)] = 1.0f / s;
          for (int64_t e = g * per; e < (g + 1) * per; ++e) {
            (*q)[static_cast<size_t>(e)] =
                RefFp8Value(*RefFp8Nearest(static_cast<float>(v[e]) * s, e4m3), e4m3);
          }
        }
      };
      std::vector<double> xq, wq;
      std::vector<float> dx, dw;
      quantise(x, m, x_e4m3, &xq, &dx);
      quantise(w, n, /*e4m3=*/true, &wq, &dw);
      auto r = cpu->Run(p, Fp8Cfg(precision, BiasMode::kNone, scaling, false), {});
      ASSERT_THAT(r, IsOk());
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          double exact = 0, magnitude = 0;
          for (int64_t t = 0; t < k; ++t) {
            exact += xq[i * k + t] * wq[j * k + t];
            magnitude += std::fabs(xq[i * k + t] * wq[j * k + t]);
          }
          const float sx = dx[dx.size() == 1 ? 0 : i], sw = dw[dw.size() == 1 ? 0 : j];
          const double want =
              scaling == Fp8Scaling::kRow ? exact * sx * sw : exact * static_cast<float>(sx * sw);
          // fp32 summation of 16 terms in any order, and two scale roundings.
          const double slack =
              (16 * magnitude * 0x1p-24) * std::fabs(sx * sw) + std::fabs(want) * 0x1p-22;
          EXPECT_NEAR(r->output.GetDouble(i * n + j), want, slack) << i << "," << j;
        }
      }
      EXPECT_EQ(r->details.at("fp8_scaling"), Fp8ScalingName(scaling));
    }
  }
}

// One GEMM per arithmetic: fused and unfused share; split and fast do not.
TEST(CpuFp8Test, BatchSharesTheGemmOfOneArithmeticOnly) {
  auto cpu = NewBackend();
  Fp8Layer l = ExactLayer(2, 4, 64, false, 3);
  l.bias = *FromFloats(DType::kBFloat16, {4}, std::vector<float>{1, 2, 3, 4});
  const std::vector<Config> configs = {
      Fp8Cfg(Precision::kFp8E4M3, BiasMode::kFused, Fp8Scaling::kTensor, false),
      Fp8Cfg(Precision::kFp8E4M3, BiasMode::kUnfused, Fp8Scaling::kTensor, false),
      Fp8Cfg(Precision::kFp8E4M3, BiasMode::kFused, Fp8Scaling::kTensor, true)};
  std::vector<RunResult> results(configs.size());
  ASSERT_THAT(cpu->RunBatch(l.problem(DType::kBFloat16), configs, {},
                            [&](size_t i, RunResult r) {
                              results[i] = std::move(r);
                              return absl::OkStatus();
                            }),
              IsOk());
  EXPECT_EQ(results[1].shared_computation, configs[0].ToString());
  EXPECT_EQ(results[2].shared_computation, "");
  for (size_t i = 0; i < configs.size(); ++i) {
    auto alone = cpu->Run(l.problem(DType::kBFloat16), configs[i], {});
    ASSERT_THAT(alone, IsOk());
    EXPECT_EQ(alone->output.bytes(), results[i].output.bytes()) << configs[i].ToString();
  }
}

TEST(CpuFp8Test, MissingScalesAndFp8OutputsAreRefused) {
  auto cpu = NewBackend();
  const Fp8Layer l = ExactLayer(2, 2, 8, false, 1);
  LinearProblem p = l.problem(DType::kBFloat16);
  p.weight_scale = nullptr;
  const Config c = Fp8Cfg(Precision::kFp8E4M3, BiasMode::kNone, Fp8Scaling::kTensor, false);
  EXPECT_THAT(cpu->Run(p, c, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("weight_scale")));
  EXPECT_THAT(cpu->Run(l.problem(DType::kFloat8E4M3Fn), c, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("output_dtype")));
}

}  // namespace
}  // namespace tensorcheck
