#include "server/backends/cpu/cpu_backend.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <iterator>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/stats/blas_gemm.h"
#include "tests/testing/blas_probe.h"
#include "tests/testing/ref_round.h"
#include "tests/testing/status_matchers.h"

namespace tensorcheck {
namespace {

using ::tensorcheck::testing::BlasIsBlockInvariant;
using ::tensorcheck::testing::IsOk;
using ::tensorcheck::testing::StatusIs;
using ::testing::HasSubstr;

// ---- An independent reference: rounding written out from the formats'
// definitions (tests/testing/ref_round.h), not core's float_formats.

using ::tensorcheck::testing::Format;
using ::tensorcheck::testing::kBf16Format;
using ::tensorcheck::testing::kFp16Format;
using ::tensorcheck::testing::kFp32Format;
using ::tensorcheck::testing::kTf32Format;
using ::tensorcheck::testing::RefRound;
using ::tensorcheck::testing::Tie;

double RefRoundTo(DType d, double v) {
  switch (d) {
    case DType::kFloat64:
      return v;
    case DType::kFloat32:
      return RefRound(v, kFp32Format);
    case DType::kFloat16:
      return RefRound(v, kFp16Format);
    case DType::kBFloat16:
      return RefRound(v, kBf16Format);
    case DType::kFloat8E4M3Fn:
    case DType::kFloat8E5M2: {
      const bool e4m3 = d == DType::kFloat8E4M3Fn;
      const std::optional<int> b = ::tensorcheck::testing::RefFp8Nearest(v, e4m3);
      return b ? ::tensorcheck::testing::RefFp8Value(*b, e4m3)
               : std::numeric_limits<double>::quiet_NaN();
    }
    case DType::kFloat4E2M1Fn:  // never an output dtype
    case DType::kFloat8E8M0Fnu:
      break;
  }
  return v;
}

// The multiply's input as docs/numerics.md's table defines it for each precision:
// fp32-accumulate precisions see the stored value as fp32, then rounded.
double RefInput(Precision p, double v) {
  if (p == Precision::kFp64) return v;
  const double f = RefRound(v, kFp32Format);
  switch (p) {
    case Precision::kTf32:
      return RefRound(f, kTf32Format, Tie::kEven);
    case Precision::kTf32Rna:
      return RefRound(f, kTf32Format, Tie::kAway);
    case Precision::kTf32Trunc:
      return RefRound(f, kTf32Format, Tie::kTruncate);
    case Precision::kBf16:
      return RefRound(f, kBf16Format);
    case Precision::kFp16:
    case Precision::kFp16Acc:
      return RefRound(f, kFp16Format);
    default:
      return f;
  }
}

template <typename T>
T RefActivate(Activation a, T v) {
  switch (a) {
    case Activation::kNone:
      return v;
    case Activation::kRelu:
      return v < T(0) ? T(0) : v;
    case Activation::kGeluTanh: {
      // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), in double.
      const double x = v;
      const double inner = std::sqrt(2.0 / 3.14159265358979323846) * (x + 0.044715 * x * x * x);
      return static_cast<T>(0.5 * x * (1.0 + std::tanh(inner)));
    }
  }
  return v;
}

// A layer held as the exact double values the tensors store.
struct Layer {
  int64_t m = 0, n = 0, k = 0;
  std::vector<double> x;  // [m, k]
  std::vector<double> w;  // [n, k], logical OUT_IN order
  std::vector<double> b;  // [n] or empty
};

// y for `config` computed naively in the precisions the docs state:
// accumulate (fp64 sum; fp32 sums here are exact by construction of the
// data, or fp16 after every step for fp16acc), then bias and activation in
// T (fp64 for fp64, else fp32), rounding to `out` where the mode says.
template <typename T>
std::vector<double> RefLinearT(const Layer& l, Precision p, BiasMode mode, Activation act,
                               DType out) {
  auto round_out = [out](T v) -> T {
    return static_cast<T>(RefRoundTo(out, static_cast<double>(v)));
  };
  std::vector<double> y(static_cast<size_t>(l.m * l.n));
  for (int64_t i = 0; i < l.m; ++i) {
    for (int64_t j = 0; j < l.n; ++j) {
      double sum = 0.0;
      for (int64_t kk = 0; kk < l.k; ++kk) {
        const double prod = RefInput(p, l.x[i * l.k + kk]) * RefInput(p, l.w[j * l.k + kk]);
        sum = p == Precision::kFp16Acc ? RefRound(sum + prod, kFp16Format) : sum + prod;
      }
      const T acc = static_cast<T>(sum);
      const bool has_bias = !l.b.empty();
      const T b = has_bias ? static_cast<T>(l.b[j]) : T(0);
      T v;
      if (mode == BiasMode::kUnfused) {
        T u = round_out(acc);
        if (has_bias) u = round_out(u + b);
        v = round_out(RefActivate(act, u));
      } else {
        v = round_out(RefActivate(act, has_bias ? acc + b : acc));
      }
      y[i * l.n + j] = v;
    }
  }
  return y;
}

std::vector<double> RefLinear(const Layer& l, Precision p, BiasMode mode, Activation act,
                              DType out) {
  if (p == Precision::kFp64) return RefLinearT<double>(l, p, mode, act, out);
  return RefLinearT<float>(l, p, mode, act, out);
}

Tensor MakeTensor(DType d, std::vector<int64_t> shape, const std::vector<double>& v) {
  auto t = FromDoubles(d, std::move(shape), v);
  EXPECT_THAT(t, IsOk());
  // The data is chosen representable in `d`: storing is exact.
  for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(t->GetDouble(static_cast<int64_t>(i)), v[i]);
  return std::move(*t);
}

std::vector<double> Transposed(const std::vector<double>& a, int64_t rows, int64_t cols) {
  std::vector<double> t(a.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = a[r * cols + c];
  }
  return t;
}

std::vector<double> Values(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  ToDouble(t, v.data());
  return v;
}

// A nonzero multiple of 2^-6 in [-1, 1]: six significant bits at most, so
// products and short sums of such values are exact in fp32.
double CoarseValue(std::mt19937& rng) {
  std::uniform_int_distribution<int> mag(1, 64);
  std::bernoulli_distribution neg(0.5);
  const double v = mag(rng) / 64.0;
  return neg(rng) ? -v : v;
}

// `coarse` nudged away from zero by under half a unit of the last place of
// a 10-bit mantissa: every reduced input format (tf32 by any rounding,
// fp16, bf16) rounds it back to `coarse`, while fp32 keeps it.
double Nudged(double coarse, std::mt19937& rng) {
  std::uniform_real_distribution<double> frac(0.1, 0.45);
  int e = 0;
  std::frexp(std::fabs(coarse), &e);  // |coarse| in [2^(e-1), 2^e)
  const double half_ulp10 = std::ldexp(1.0, e - 1 - 10);
  return RefRound(coarse + std::copysign(frac(rng) * half_ulp10, coarse), kFp32Format);
}

// x [m, k], W [n, k], b [n]. With `nudge`, x and W carry low bits that only
// fp32 and fp64 see; after any reduced precision's input rounding every
// product and partial sum is exact in fp32, so the sgemm result does not
// depend on OpenBLAS's summation order and outputs can be compared bit for
// bit.
Layer MakeLayer(int64_t m, int64_t n, int64_t k, bool with_bias, bool nudge, uint32_t seed) {
  std::mt19937 rng(seed);
  Layer l;
  l.m = m;
  l.n = n;
  l.k = k;
  for (int64_t i = 0; i < m * k; ++i) {
    const double c = CoarseValue(rng);
    l.x.push_back(nudge ? Nudged(c, rng) : c);
  }
  for (int64_t i = 0; i < n * k; ++i) {
    const double c = CoarseValue(rng);
    l.w.push_back(nudge ? Nudged(c, rng) : c);
  }
  if (with_bias) {
    // Multiples of 2^-10 in [-2, 2]: exact in fp32, not in bf16.
    std::uniform_int_distribution<int> b(-2048, 2048);
    for (int64_t j = 0; j < n; ++j) l.b.push_back(b(rng) / 1024.0);
  }
  return l;
}

// x [m, k], W [n, k] and, with `bias`, b [n], drawn from Normal(0, stddev)
// in that order and each rounded to `format`.
Layer NormalLayer(int64_t m, int64_t n, int64_t k, double stddev, Format format, uint32_t seed,
                  bool bias) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, stddev);
  Layer l;
  l.m = m;
  l.n = n;
  l.k = k;
  for (int64_t i = 0; i < m * k; ++i) l.x.push_back(RefRound(normal(rng), format));
  for (int64_t i = 0; i < n * k; ++i) l.w.push_back(RefRound(normal(rng), format));
  if (bias) {
    for (int64_t j = 0; j < n; ++j) l.b.push_back(RefRound(normal(rng), format));
  }
  return l;
}

// What fp16acc computes, naively: acc = fp16(acc + fp16(x) * fp16(w)), k
// ascending, no bias.
std::vector<double> NaiveFp16Acc(const Layer& l) {
  std::vector<double> want;
  for (int64_t i = 0; i < l.m; ++i) {
    for (int64_t j = 0; j < l.n; ++j) {
      double acc = 0.0;
      for (int64_t kk = 0; kk < l.k; ++kk) {
        acc = RefRound(acc + RefRound(l.x[i * l.k + kk], kFp16Format) *
                                 RefRound(l.w[j * l.k + kk], kFp16Format),
                       kFp16Format);
      }
      want.push_back(acc);
    }
  }
  return want;
}

// Tensors and the problem that points at them (heap-held, so the pointers
// stay valid when the holder moves).
struct Built {
  Tensor x, w, b;
  LinearProblem problem;
};

// Tensors and a problem for `l`; `input_shape` may add batch dims.
std::unique_ptr<Built> Build(const Layer& l, DType storage, WeightLayout layout, Activation act,
                             DType out, std::vector<int64_t> input_shape = {},
                             DType bias_storage = DType::kFloat32) {
  auto b = std::make_unique<Built>();
  if (input_shape.empty()) input_shape = {l.m, l.k};
  b->x = MakeTensor(storage, input_shape, l.x);
  b->w = layout == WeightLayout::kOutIn
             ? MakeTensor(storage, {l.n, l.k}, l.w)
             : MakeTensor(storage, {l.k, l.n}, Transposed(l.w, l.n, l.k));
  b->problem.input = &b->x;
  b->problem.weight = &b->w;
  b->problem.layout = layout;
  if (!l.b.empty()) {
    b->b = MakeTensor(bias_storage, {l.n}, l.b);
    b->problem.bias = &b->b;
  }
  b->problem.activation = act;
  b->problem.output_dtype = out;
  b->problem.m = l.m;
  b->problem.n = l.n;
  b->problem.k = l.k;
  return b;
}

Config Cfg(Precision p, BiasMode bias) { return Config{"cpu", p, bias}; }

std::unique_ptr<CpuBackend> NewBackend() {
  auto backend = CpuBackend::Create({});
  EXPECT_THAT(backend, IsOk());
  return std::move(*backend);
}

RunResult MustRun(CpuBackend& cpu, const LinearProblem& p, const Config& c, RunOptions o = {}) {
  auto r = cpu.Run(p, c, o);
  EXPECT_THAT(r, IsOk());
  if (!r.ok()) return RunResult{};
  return std::move(*r);
}

// One unit in the last place of `v` with `mant` fraction bits.
double Ulp(double v, int mant) {
  int e = 0;
  std::frexp(std::max(std::fabs(v), 1e-300), &e);  // |v| in [2^(e-1), 2^e)
  return std::ldexp(1.0, e - 1 - mant);
}

int MantBits(DType d) {
  switch (d) {
    case DType::kFloat64:
      return 52;
    case DType::kFloat32:
      return 23;
    case DType::kFloat16:
      return 10;
    case DType::kBFloat16:
      return 7;
    case DType::kFloat8E4M3Fn:
      return 3;
    case DType::kFloat8E5M2:
      return 2;
    case DType::kFloat4E2M1Fn:
      return 1;
    case DType::kFloat8E8M0Fnu:
      return 0;
  }
  return 52;
}

// Bitwise equal. GELU is the exception: the backend's tanh and the
// reference's differ in the working precision (fp32, or fp64 for fp64), and
// 1 + tanh cancels for negative inputs, so there a few working-precision
// units plus one unit of the output are allowed.
void ExpectMatches(const std::vector<double>& got, const std::vector<double>& want, Activation act,
                   DType out, Precision p) {
  ASSERT_EQ(got.size(), want.size());
  const int work_mant = p == Precision::kFp64 ? 52 : 23;
  const int out_mant = std::min(MantBits(out), work_mant);
  for (size_t i = 0; i < got.size(); ++i) {
    if (act == Activation::kGeluTanh) {
      const double big = std::max({std::fabs(got[i]), std::fabs(want[i]), 1.0});
      const double tol = 1.01 * Ulp(std::max(std::fabs(got[i]), std::fabs(want[i])), out_mant) +
                         32 * std::ldexp(big, -work_mant);
      EXPECT_NEAR(got[i], want[i], tol) << "element " << i;
    } else {
      EXPECT_EQ(got[i], want[i]) << "element " << i;
    }
  }
}

// ---- Every precision x bias mode x activation x output dtype.

using MatrixParam = std::tuple<Precision, BiasMode, Activation, DType>;

class CpuBackendMatrixTest : public ::testing::TestWithParam<MatrixParam> {};

TEST_P(CpuBackendMatrixTest, MatchesIndependentFp64ReferenceInBothLayouts) {
  const auto [precision, mode, act, out] = GetParam();
  const bool with_bias = mode != BiasMode::kNone;
  // fp32/fp64 see the raw inputs, so they get coarse data to stay exact.
  const bool nudge = precision != Precision::kFp32 && precision != Precision::kFp64;
  const Layer l = MakeLayer(/*m=*/3, /*n=*/5, /*k=*/16, with_bias, nudge, /*seed=*/7);
  if (nudge) {
    // The data really exercises the input rounding.
    EXPECT_NE(RefInput(precision, l.x[0]), l.x[0]);
  }
  const std::vector<double> want = RefLinear(l, precision, mode, act, out);
  auto cpu = NewBackend();
  for (WeightLayout layout : {WeightLayout::kOutIn, WeightLayout::kInOut}) {
    SCOPED_TRACE(WeightLayoutName(layout));
    auto b = Build(l, DType::kFloat32, layout, act, out);
    RunResult r = MustRun(*cpu, b->problem, Cfg(precision, mode));
    EXPECT_EQ(r.output.dtype(), out);
    EXPECT_EQ(r.output.shape(), (std::vector<int64_t>{3, 5}));
    ExpectMatches(Values(r.output), want, act, out, precision);
  }
}

std::string MatrixName(const ::testing::TestParamInfo<MatrixParam>& info) {
  const auto [p, b, a, d] = info.param;
  return absl::StrCat(PrecisionName(p), "_", BiasModeName(b), "_", ActivationName(a), "_out_",
                      DTypeShortName(d));
}

INSTANTIATE_TEST_SUITE_P(AllModes, CpuBackendMatrixTest,
                         ::testing::Combine(::testing::ValuesIn(kWidePrecisions),
                                            ::testing::Values(BiasMode::kNone, BiasMode::kFused,
                                                              BiasMode::kUnfused),
                                            ::testing::Values(Activation::kNone, Activation::kRelu,
                                                              Activation::kGeluTanh),
                                            ::testing::ValuesIn(kWideDTypes)),
                         MatrixName);

// ---- RunBatch: one GEMM per arithmetic, every output as Run's.

// Runs `configs` as one batch; results by index, in delivery order.
struct Batch {
  std::vector<RunResult> results;
  std::vector<size_t> delivered;
};
Batch MustRunBatch(CpuBackend& cpu, const LinearProblem& p, const std::vector<Config>& configs) {
  Batch b;
  b.results.resize(configs.size());
  EXPECT_THAT(cpu.RunBatch(p, configs, RunOptions{},
                           [&](size_t i, RunResult r) {
                             b.results[i] = std::move(r);
                             b.delivered.push_back(i);
                             return absl::OkStatus();
                           }),
              IsOk());
  return b;
}

TEST(CpuBackendBatchTest, EveryOutputMatchesTheIndependentReference) {
  // fp32 storage with nudged values: every input rounding changes them, so
  // nothing but the fused/unfused pairs can share a GEMM. (The matrix test
  // above checks Run against the reference for every mode.)
  const Layer l = MakeLayer(/*m=*/3, /*n=*/5, /*k=*/16, /*with_bias=*/true,
                            /*nudge=*/true, /*seed=*/41);
  auto cpu = NewBackend();
  for (DType out : {DType::kFloat32, DType::kBFloat16}) {
    for (Activation act : {Activation::kNone, Activation::kRelu}) {
      SCOPED_TRACE(absl::StrCat(DTypeName(out), " ", ActivationName(act)));
      auto b = Build(l, DType::kFloat32, WeightLayout::kOutIn, act, out);
      std::vector<Config> configs;
      for (Precision p : kWidePrecisions) {
        for (BiasMode mode : {BiasMode::kFused, BiasMode::kUnfused}) {
          configs.push_back(Cfg(p, mode));
        }
      }
      const Batch batch = MustRunBatch(*cpu, b->problem, configs);
      ASSERT_EQ(batch.delivered.size(), configs.size());
      EXPECT_EQ(batch.delivered.front(), 0u);
      for (size_t i = 0; i < configs.size(); ++i) {
        SCOPED_TRACE(configs[i].ToString());
        const Precision p = configs[i].precision;
        // What Run gives, bit for bit; and where the inputs are rounded
        // (so that products and sums of this small problem are exact), the
        // independent reference too.
        EXPECT_EQ(batch.results[i].output.bytes(),
                  MustRun(*cpu, b->problem, configs[i]).output.bytes());
        if (p != Precision::kFp32 && p != Precision::kFp64) {
          ExpectMatches(Values(batch.results[i].output), RefLinear(l, p, configs[i].bias, act, out),
                        act, out, p);
        }
        // Only an unfused variant reuses its fused sibling's GEMM.
        EXPECT_EQ(batch.results[i].shared_computation,
                  configs[i].bias == BiasMode::kUnfused ? Cfg(p, BiasMode::kFused).ToString() : "");
      }
    }
  }
}

TEST(CpuBackendBatchTest, Bf16StorageRunsOneGemmForFp32Tf32AndBf16) {
  const Layer l = NormalLayer(4, 6, 32, 1.0, kBf16Format, 42, /*bias=*/true);
  auto cpu = NewBackend();
  auto b = Build(l, DType::kBFloat16, WeightLayout::kOutIn, Activation::kNone, DType::kBFloat16);
  const std::vector<Config> configs = {
      Cfg(Precision::kFp64, BiasMode::kFused),    Cfg(Precision::kBf16, BiasMode::kFused),
      Cfg(Precision::kFp32, BiasMode::kFused),    Cfg(Precision::kTf32, BiasMode::kUnfused),
      Cfg(Precision::kTf32Rna, BiasMode::kFused), Cfg(Precision::kTf32Trunc, BiasMode::kFused),
      Cfg(Precision::kFp64, BiasMode::kUnfused),  Cfg(Precision::kFp16Acc, BiasMode::kFused)};
  const Batch batch = MustRunBatch(*cpu, b->problem, configs);
  ASSERT_EQ(batch.delivered.size(), configs.size());
  EXPECT_EQ(batch.delivered.front(), 0u);
  const std::vector<std::string> shared = {"",
                                           "",
                                           "cpu:bf16:fused",
                                           "cpu:bf16:fused",
                                           "cpu:bf16:fused",
                                           "cpu:bf16:fused",
                                           "cpu:fp64:fused",
                                           ""};
  for (size_t i = 0; i < configs.size(); ++i) {
    SCOPED_TRACE(configs[i].ToString());
    EXPECT_EQ(batch.results[i].shared_computation, shared[i]);
    ExpectMatches(
        Values(batch.results[i].output),
        RefLinear(l, configs[i].precision, configs[i].bias, Activation::kNone, DType::kBFloat16),
        Activation::kNone, DType::kBFloat16, configs[i].precision);
  }
  // Same GEMM, same epilogue: the same bits.
  EXPECT_EQ(batch.results[1].output.bytes(), batch.results[2].output.bytes());
}

TEST(CpuBackendBatchTest, ConsumerErrorStopsTheBatch) {
  const Layer l = NormalLayer(2, 3, 8, 1.0, kBf16Format, 43, /*bias=*/true);
  auto cpu = NewBackend();
  auto b = Build(l, DType::kBFloat16, WeightLayout::kOutIn, Activation::kNone, DType::kBFloat16);
  int calls = 0;
  const absl::Status s = cpu->RunBatch(
      b->problem,
      {Cfg(Precision::kBf16, BiasMode::kFused), Cfg(Precision::kFp32, BiasMode::kFused)},
      RunOptions{}, [&](size_t, RunResult) {
        ++calls;
        return absl::CancelledError("stop");
      });
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(calls, 1);
}

// ---- Storage dtypes, batch dims, output dtypes.

TEST(CpuBackendTest, BatchDimsFlattenIntoRows) {
  const Layer l = MakeLayer(/*m=*/6, /*n=*/4, /*k=*/8, /*with_bias=*/true,
                            /*nudge=*/false, /*seed=*/11);
  auto cpu = NewBackend();
  auto b = Build(l, DType::kFloat32, WeightLayout::kOutIn, Activation::kRelu, DType::kFloat32,
                 /*input_shape=*/{2, 3, 8});
  RunResult r = MustRun(*cpu, b->problem, Cfg(Precision::kFp32, BiasMode::kFused));
  EXPECT_EQ(r.output.shape(), (std::vector<int64_t>{6, 4}));
  ExpectMatches(
      Values(r.output),
      RefLinear(l, Precision::kFp32, BiasMode::kFused, Activation::kRelu, DType::kFloat32),
      Activation::kRelu, DType::kFloat32, Precision::kFp32);
}

TEST(CpuBackendTest, Bf16InputsWithFp32OutputRoundOnceToFp32) {
  const Layer l = MakeLayer(/*m=*/4, /*n=*/6, /*k=*/32, /*with_bias=*/true,
                            /*nudge=*/false, /*seed=*/12);
  auto cpu = NewBackend();
  for (BiasMode mode : {BiasMode::kFused, BiasMode::kUnfused}) {
    auto b = Build(l, DType::kBFloat16, WeightLayout::kInOut, Activation::kNone, DType::kFloat32,
                   {}, /*bias_storage=*/DType::kFloat32);
    RunResult r = MustRun(*cpu, b->problem, Cfg(Precision::kBf16, mode));
    EXPECT_EQ(r.output.dtype(), DType::kFloat32);
    // At fp32 output, acc + b is exact here: both modes give the exact sum.
    ExpectMatches(Values(r.output),
                  RefLinear(l, Precision::kBf16, mode, Activation::kNone, DType::kFloat32),
                  Activation::kNone, DType::kFloat32, Precision::kBf16);
  }
}

TEST(CpuBackendTest, EveryStorageDtypeIsReadExactly) {
  const Layer l = MakeLayer(/*m=*/3, /*n=*/4, /*k=*/8, /*with_bias=*/true,
                            /*nudge=*/false, /*seed=*/13);
  auto cpu = NewBackend();
  for (DType storage : kWideDTypes) {
    for (DType bias_storage : {DType::kFloat64, DType::kFloat32}) {
      for (Precision p : {Precision::kFp64, Precision::kFp32, Precision::kBf16}) {
        SCOPED_TRACE(absl::StrCat(DTypeName(storage), " bias ", DTypeName(bias_storage), " ",
                                  PrecisionName(p)));
        auto b = Build(l, storage, WeightLayout::kOutIn, Activation::kNone,
                       /*out=*/storage, {}, bias_storage);
        RunResult r = MustRun(*cpu, b->problem, Cfg(p, BiasMode::kUnfused));
        ExpectMatches(Values(r.output),
                      RefLinear(l, p, BiasMode::kUnfused, Activation::kNone, storage),
                      Activation::kNone, storage, p);
      }
    }
  }
}

TEST(CpuBackendTest, Bf16BiasStorageIsReadExactly) {
  // A bf16 bias (values with 8 significant bits) with fp16 inputs.
  Layer l = MakeLayer(/*m=*/2, /*n=*/3, /*k=*/4, /*with_bias=*/false,
                      /*nudge=*/false, /*seed=*/14);
  l.b = {0.375, -1.5, 1.0078125};  // 1 + 2^-7: bf16, not fp16-exact sums
  auto cpu = NewBackend();
  auto b = Build(l, DType::kFloat16, WeightLayout::kOutIn, Activation::kNone, DType::kFloat32, {},
                 /*bias_storage=*/DType::kBFloat16);
  RunResult r = MustRun(*cpu, b->problem, Cfg(Precision::kFp16, BiasMode::kFused));
  ExpectMatches(
      Values(r.output),
      RefLinear(l, Precision::kFp16, BiasMode::kFused, Activation::kNone, DType::kFloat32),
      Activation::kNone, DType::kFloat32, Precision::kFp16);
}

TEST(CpuBackendTest, Fp16StorageRoundedToBf16ForBf16Precision) {
  // fp16 inputs with 11 significant bits: the bf16 precision must round them.
  Layer l;
  l.m = 1;
  l.n = 1;
  l.k = 2;
  l.x = {1.0 + 5.0 / 1024, 1.0};  // 1 + 5*2^-10 -> bf16 1 + 2^-7 (nearest)
  l.w = {1.0, 1.0 + 1.0 / 1024};  // 1 + 2^-10   -> bf16 1.0
  auto cpu = NewBackend();
  auto b = Build(l, DType::kFloat16, WeightLayout::kOutIn, Activation::kNone, DType::kFloat32);
  RunResult r = MustRun(*cpu, b->problem, Cfg(Precision::kBf16, BiasMode::kNone));
  EXPECT_EQ(Values(r.output)[0], 2.0 + 1.0 / 128);
  RunResult fp16 = MustRun(*cpu, b->problem, Cfg(Precision::kFp16, BiasMode::kNone));
  EXPECT_EQ(Values(fp16.output)[0], 2.0 + 6.0 / 1024);
}

TEST(CpuBackendTest, Fp64AccumulatorRoundsOnceToBf16Output) {
  // 1 + 2^-8 + 2^-30 is above the bf16 tie 1 + 2^-8; going through fp32
  // first would land on the tie and round to even (1.0).
  Layer l;
  l.m = 1;
  l.n = 1;
  l.k = 2;
  l.x = {1.0 + 1.0 / 256, 1.0};
  l.w = {1.0, std::ldexp(1.0, -30)};
  auto cpu = NewBackend();
  auto b = Build(l, DType::kFloat64, WeightLayout::kOutIn, Activation::kNone, DType::kBFloat16);
  RunResult r = MustRun(*cpu, b->problem, Cfg(Precision::kFp64, BiasMode::kNone));
  EXPECT_EQ(Values(r.output)[0], 1.0 + 1.0 / 128);
  // fp16: 1 + 2^-11 + 2^-30 is above the fp16 tie 1 + 2^-11.
  l.x = {1.0 + 1.0 / 2048, 1.0};
  auto b16 = Build(l, DType::kFloat64, WeightLayout::kOutIn, Activation::kNone, DType::kFloat16);
  RunResult r16 = MustRun(*cpu, b16->problem, Cfg(Precision::kFp64, BiasMode::kNone));
  EXPECT_EQ(Values(r16.output)[0], 1.0 + 1.0 / 1024);
}

// ---- Hand-derived cases.

TEST(CpuBackendTest, Bf16FusedAndUnfusedBiasDifferByExactlyOneUlp) {
  // acc = 1*2 + 1*(3*2^-9) = 2.005859375, b = 3*2^-9 (all bf16 values).
  // bf16 ULP at [2, 4) is 2^-6 = 0.015625.
  //   fused:   bf16(2.005859375 + 0.005859375) = bf16(2 + 0.75 ULP) = 2.015625
  //   unfused: bf16(2.005859375) = 2 (0.375 ULP), bf16(2 + 0.005859375) = 2
  Layer l;
  l.m = 1;
  l.n = 1;
  l.k = 2;
  l.x = {1.0, 1.0};
  l.w = {2.0, 3.0 / 512};
  l.b = {3.0 / 512};
  auto cpu = NewBackend();
  auto b = Build(l, DType::kBFloat16, WeightLayout::kOutIn, Activation::kNone, DType::kBFloat16, {},
                 /*bias_storage=*/DType::kBFloat16);
  RunResult fused = MustRun(*cpu, b->problem, Cfg(Precision::kBf16, BiasMode::kFused));
  RunResult unfused = MustRun(*cpu, b->problem, Cfg(Precision::kBf16, BiasMode::kUnfused));
  EXPECT_EQ(fused.output.data<uint16_t>()[0], 0x4001);    // 2.015625
  EXPECT_EQ(unfused.output.data<uint16_t>()[0], 0x4000);  // 2.0
  EXPECT_EQ(Values(fused.output)[0] - Values(unfused.output)[0], 0.015625);
}

TEST(CpuBackendTest, Tf32VariantsDifferOnATieInTheDroppedBits) {
  // 1 + 2^-11 sits exactly halfway between TF32 neighbours 1 and 1 + 2^-10;
  // 1 + 3*2^-11 halfway between 1 + 2^-10 (odd) and 1 + 2^-9 (even).
  struct Row {
    double x, tf32, tf32rna, tf32trunc;
  };
  const Row rows[] = {
      {1.0 + 1.0 / 2048, 1.0, 1.0 + 1.0 / 1024, 1.0},
      {1.0 + 3.0 / 2048, 1.0 + 1.0 / 512, 1.0 + 1.0 / 512, 1.0 + 1.0 / 1024},
      {-(1.0 + 1.0 / 2048), -1.0, -(1.0 + 1.0 / 1024), -1.0},
  };
  auto cpu = NewBackend();
  for (const Row& row : rows) {
    SCOPED_TRACE(row.x);
    Layer l;
    l.m = l.n = l.k = 1;
    l.x = {row.x};
    l.w = {1.0};
    auto b = Build(l, DType::kFloat32, WeightLayout::kOutIn, Activation::kNone, DType::kFloat32);
    auto value = [&](Precision p) {
      return Values(MustRun(*cpu, b->problem, Cfg(p, BiasMode::kNone)).output)[0];
    };
    EXPECT_EQ(value(Precision::kFp32), row.x);
    EXPECT_EQ(value(Precision::kTf32), row.tf32);
    EXPECT_EQ(value(Precision::kTf32Rna), row.tf32rna);
    EXPECT_EQ(value(Precision::kTf32Trunc), row.tf32trunc);
  }
}

TEST(CpuBackendTest, Tf32DetailsNameTheInputRounding) {
  Layer l = MakeLayer(1, 1, 1, false, false, 1);
  auto cpu = NewBackend();
  auto b = Build(l, DType::kFloat32, WeightLayout::kOutIn, Activation::kNone, DType::kFloat32);
  EXPECT_EQ(
      MustRun(*cpu, b->problem, Cfg(Precision::kTf32, BiasMode::kNone)).details["tf32_rounding"],
      "nearest_even");
  EXPECT_EQ(
      MustRun(*cpu, b->problem, Cfg(Precision::kTf32Rna, BiasMode::kNone)).details["tf32_rounding"],
      "ties_away");
  RunResult fp32 = MustRun(*cpu, b->problem, Cfg(Precision::kFp32, BiasMode::kNone));
  EXPECT_EQ(fp32.details["blas"], "openblas");
  EXPECT_EQ(fp32.details.count("tf32_rounding"), 0u);
  // fp16acc accumulates in this project's own loops, not OpenBLAS.
  RunResult fp16acc = MustRun(*cpu, b->problem, Cfg(Precision::kFp16Acc, BiasMode::kNone));
  EXPECT_EQ(fp16acc.details.count("blas"), 0u);
  EXPECT_THAT(fp16acc.details["kernel"], ::testing::HasSubstr("tensorcheck loops"));
}

// ---- fp16acc against a naive fp16-accumulating loop, bit for bit.

TEST(CpuBackendTest, Fp16AccMatchesNaiveFp16AccumulationBitwise) {
  // Scales: unit values; tiny ones whose sums live in fp16's subnormal
  // range (quantum 2^-24); large ones with sums in the thousands.
  for (double scale : {1.0, 1e-3, 16.0}) {
    SCOPED_TRACE(scale);
    // n = 11: not a multiple of any column blocking; k = 300: long enough
    // for the fp16 running sum to lose bits.
    const Layer l = NormalLayer(5, 11, 300, scale, kFp32Format, 21, /*bias=*/false);
    const std::vector<double> want = NaiveFp16Acc(l);
    // The accumulation really is fp16: fp32 accumulation gives other values.
    const std::vector<double> fp32_acc =
        RefLinear(l, Precision::kFp16, BiasMode::kNone, Activation::kNone, DType::kFloat64);
    EXPECT_NE(want, fp32_acc);
    auto cpu = NewBackend();
    for (WeightLayout layout : {WeightLayout::kOutIn, WeightLayout::kInOut}) {
      for (DType out : {DType::kFloat32, DType::kFloat16}) {
        SCOPED_TRACE(absl::StrCat(WeightLayoutName(layout), " ", DTypeName(out)));
        auto b = Build(l, DType::kFloat32, layout, Activation::kNone, out);
        RunResult r = MustRun(*cpu, b->problem, Cfg(Precision::kFp16Acc, BiasMode::kNone));
        EXPECT_EQ(Values(r.output), want);
      }
    }
  }
}

TEST(CpuBackendTest, Fp16AccSplitsLargeProblemsAcrossThreadsBitwise) {
  // Large enough (m*n*k >= 2^20) for the row-parallel path.
  const Layer l = NormalLayer(37, 70, 512, 1.0, kFp16Format, 22, /*bias=*/false);
  const std::vector<double> want = NaiveFp16Acc(l);
  CpuBackend::Options o;
  o.threads = 3;
  auto cpu = CpuBackend::Create(o);
  ASSERT_THAT(cpu, IsOk());
  auto b = Build(l, DType::kFloat16, WeightLayout::kOutIn, Activation::kNone, DType::kFloat16);
  RunResult r = MustRun(**cpu, b->problem, Cfg(Precision::kFp16Acc, BiasMode::kNone));
  EXPECT_EQ(Values(r.output), want);
}

TEST(CpuBackendTest, Fp16AccOverflowsToInfinity) {
  // 200 * 200 = 40000, twice: 80000 > 65504 (and past the 65520 tie).
  Layer l;
  l.m = l.n = 1;
  l.k = 2;
  l.x = {200.0, 200.0};
  l.w = {200.0, 200.0};
  auto cpu = NewBackend();
  auto b = Build(l, DType::kFloat32, WeightLayout::kOutIn, Activation::kNone, DType::kFloat32);
  EXPECT_EQ(Values(MustRun(*cpu, b->problem, Cfg(Precision::kFp16Acc, BiasMode::kNone)).output)[0],
            std::numeric_limits<double>::infinity());
  EXPECT_EQ(Values(MustRun(*cpu, b->problem, Cfg(Precision::kFp16, BiasMode::kNone)).output)[0],
            80000.0);
}

// ---- fp16acc: the vectorised path and the portable one against a scalar
// loop, bit for bit (signed zeros, infinities and NaN included), on data
// built to hit fp16 subnormals, rounding ties and overflow.

// Forces the portable fp16acc path while alive (cpu_backend.cc reads
// TENSORCHECK_FP16ACC_SCALAR on every run).
class ScopedScalarFp16Acc {
 public:
  explicit ScopedScalarFp16Acc(bool on) : on_(on) {
    if (on_) setenv("TENSORCHECK_FP16ACC_SCALAR", "1", 1);
  }
  ~ScopedScalarFp16Acc() {
    if (on_) unsetenv("TENSORCHECK_FP16ACC_SCALAR");
  }

 private:
  bool on_;
};

// A random fp16 value: sign, exponent in [emin, emax] (below -14: the
// subnormal quantum 2^-24), 10 random fraction bits.
double RandomHalf(std::mt19937& rng, int emin, int emax) {
  std::uniform_int_distribution<int> exp(emin, emax);
  std::uniform_int_distribution<int> frac(0, 1023);
  std::bernoulli_distribution neg(0.5);
  const int e = exp(rng);
  const double v = e < -14 ? std::ldexp(frac(rng), -24) : std::ldexp(1024 + frac(rng), e - 10);
  return neg(rng) ? -v : v;
}

// One of several regimes per element, so that a running sum sees all of
// them: wide exponent spans (subnormal sums, long-span double sums), small
// integers (sums past 2048 where odd steps are exact ties), large values
// (overflow to +-inf, then inf - inf = NaN), tiny values (products below
// half the smallest subnormal: +-0, including -0) and exact zeros.
double RegimeValue(std::mt19937& rng) {
  std::uniform_int_distribution<int> regime(0, 9);
  std::uniform_int_distribution<int> small_int(-15, 15);
  switch (regime(rng)) {
    case 0:
    case 1:
    case 2:
      return RandomHalf(rng, -20, 4);
    case 3:
    case 4:
    case 5:
      return small_int(rng);
    case 6:
      return RandomHalf(rng, 5, 9);
    case 7:
    case 8:
      return RandomHalf(rng, -24, -12);
    default:
      return 0.0;
  }
}

// fp16(... fp16(fp16(0 + x_i0 w_j0) + x_i1 w_j1) ...) with the sum of two
// doubles rounded by the test's own RefRound (sign of zero kept).

// Same value and sign (so -0 != +0), or both NaN.
bool SameValue(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return a == b && std::signbit(a) == std::signbit(b);
}

TEST(CpuBackendTest, Fp16AccFastAndPortablePathsMatchScalarLoopBitwise) {
  struct Shape {
    int64_t m, n, k;
    bool tiny;  // only values below 2^-13: every sum rounds to +-0
  };
  // Odd n (not a multiple of 4, 8 or 12), k past one 256-step block, n past
  // one 288-column block, and sizes over 2^20 multiply-adds that split rows
  // across threads. The tiny ones end in -0 about half the time.
  const Shape shapes[] = {{1, 1, 1, false},     {3, 5, 7, false},     {5, 13, 300, false},
                          {9, 25, 513, false},  {6, 301, 260, false}, {17, 130, 600, false},
                          {37, 70, 512, false}, {2, 4, 0, false},     {5, 27, 40, true},
                          {20, 61, 1000, true}};
  uint32_t seed = 100;
  for (const Shape& s : shapes) {
    SCOPED_TRACE(absl::StrCat("m=", s.m, " n=", s.n, " k=", s.k, s.tiny ? " tiny" : ""));
    std::mt19937 rng(seed++);
    auto value = [&] { return s.tiny ? RandomHalf(rng, -24, -14) : RegimeValue(rng); };
    Layer l;
    l.m = s.m;
    l.n = s.n;
    l.k = s.k;
    for (int64_t i = 0; i < l.m * l.k; ++i) l.x.push_back(value());
    for (int64_t i = 0; i < l.n * l.k; ++i) l.w.push_back(value());
    const std::vector<double> want = NaiveFp16Acc(l);
    if (s.tiny) {
      EXPECT_GT(std::count_if(want.begin(), want.end(),
                              [](double v) { return v == 0.0 && std::signbit(v); }),
                l.m * l.n / 4);
    }
    CpuBackend::Options o;
    o.threads = 3;
    auto cpu = CpuBackend::Create(o);
    ASSERT_THAT(cpu, IsOk());
    for (bool portable : {false, true}) {
      ScopedScalarFp16Acc force(portable);
      for (WeightLayout layout : {WeightLayout::kOutIn, WeightLayout::kInOut}) {
        for (DType out : {DType::kFloat32, DType::kFloat16}) {
          SCOPED_TRACE(absl::StrCat(portable ? "portable " : "default ", WeightLayoutName(layout),
                                    " ", DTypeName(out)));
          auto b = Build(l, DType::kFloat16, layout, Activation::kNone, out);
          RunResult r = MustRun(**cpu, b->problem, Cfg(Precision::kFp16Acc, BiasMode::kNone));
          const std::vector<double> got = Values(r.output);
          ASSERT_EQ(got.size(), want.size());
          int bad = 0;
          for (size_t e = 0; e < got.size() && bad < 5; ++e) {
            if (!SameValue(got[e], want[e])) {
              ++bad;
              ADD_FAILURE() << "element " << e << ": got " << got[e] << ", want " << want[e];
            }
          }
        }
      }
    }
  }
}

TEST(CpuBackendTest, Fp16AccDataReallyHitsSubnormalsTiesAndOverflow) {
  // Guards the previous test's data: its running sums do reach each case.
  std::mt19937 rng(100 + 4);  // the {6, 301, 260} shape's seed
  Layer l;
  l.m = 6;
  l.n = 301;
  l.k = 260;
  for (int64_t i = 0; i < l.m * l.k; ++i) l.x.push_back(RegimeValue(rng));
  for (int64_t i = 0; i < l.n * l.k; ++i) l.w.push_back(RegimeValue(rng));
  int subnormal = 0, ties = 0, overflow = 0, neg_zero = 0;
  for (int64_t i = 0; i < l.m; ++i) {
    for (int64_t j = 0; j < l.n; ++j) {
      double acc = 0.0;
      for (int64_t kk = 0; kk < l.k; ++kk) {
        const double s = acc + l.x[i * l.k + kk] * l.w[j * l.k + kk];
        acc = RefRound(s, kFp16Format);
        if (acc != 0.0 && std::fabs(acc) < 0x1p-14) ++subnormal;
        if (std::isfinite(s) && std::fabs(s) >= 0x1p-14 && std::fabs(s - acc) == Ulp(acc, 10) / 2)
          ++ties;
        if (std::isfinite(s) && std::isinf(acc)) ++overflow;
        if (acc == 0.0 && std::signbit(acc)) ++neg_zero;
      }
    }
  }
  EXPECT_GT(subnormal, 100);
  EXPECT_GT(ties, 100);
  EXPECT_GT(overflow, 10);
  EXPECT_GT(neg_zero, 10);
}

TEST(CpuBackendTest, Fp16AccEpilogueMatchesReferenceInBothPaths) {
  // Bias (fused and unfused) and activations after fp16 accumulation, on
  // a shape with full and partial register tiles.
  const Layer l = NormalLayer(7, 29, 70, 1.0, kFp16Format, 31, /*bias=*/true);
  auto cpu = NewBackend();
  for (bool portable : {false, true}) {
    ScopedScalarFp16Acc force(portable);
    for (BiasMode mode : {BiasMode::kFused, BiasMode::kUnfused}) {
      for (Activation act : {Activation::kNone, Activation::kRelu, Activation::kGeluTanh}) {
        for (DType out : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
          for (WeightLayout layout : {WeightLayout::kOutIn, WeightLayout::kInOut}) {
            SCOPED_TRACE(absl::StrCat(portable ? "portable " : "default ", BiasModeName(mode), " ",
                                      ActivationName(act), " ", DTypeName(out), " ",
                                      WeightLayoutName(layout)));
            auto b = Build(l, DType::kFloat16, layout, act, out, {}, DType::kFloat16);
            RunResult r = MustRun(*cpu, b->problem, Cfg(Precision::kFp16Acc, mode));
            ExpectMatches(Values(r.output), RefLinear(l, Precision::kFp16Acc, mode, act, out), act,
                          out, Precision::kFp16Acc);
          }
        }
      }
    }
  }
}

// ---- Run options and edge shapes.

TEST(CpuBackendTest, RepeatThreeIsDeterministic) {
  const Layer l = NormalLayer(33, 65, 129, 1.0, kFp32Format, 5, /*bias=*/true);
  auto cpu = NewBackend();
  auto b = Build(l, DType::kFloat32, WeightLayout::kOutIn, Activation::kGeluTanh, DType::kBFloat16);
  RunOptions opts;
  opts.repeat = 3;
  for (Precision p : kWidePrecisions) {
    SCOPED_TRACE(PrecisionName(p));
    RunResult once = MustRun(*cpu, b->problem, Cfg(p, BiasMode::kFused));
    RunResult thrice = MustRun(*cpu, b->problem, Cfg(p, BiasMode::kFused), opts);
    EXPECT_EQ(thrice.runs, 3);
    EXPECT_TRUE(thrice.deterministic);
    EXPECT_EQ(once.output.bytes(), thrice.output.bytes());
  }
}

TEST(CpuBackendTest, ZeroKGivesActivationOfBias) {
  Layer l;
  l.m = 2;
  l.n = 3;
  l.k = 0;
  l.b = {-1.0, 0.5, 2.0};
  auto cpu = NewBackend();
  auto b = Build(l, DType::kFloat32, WeightLayout::kOutIn, Activation::kRelu, DType::kFloat32);
  RunResult r = MustRun(*cpu, b->problem, Cfg(Precision::kFp32, BiasMode::kFused));
  EXPECT_EQ(Values(r.output), (std::vector<double>{0.0, 0.5, 2.0, 0.0, 0.5, 2.0}));
}

TEST(CpuBackendTest, ZeroRowsGiveEmptyOutput) {
  Layer l;
  l.m = 0;
  l.n = 3;
  l.k = 4;
  l.w.assign(12, 1.0);
  auto cpu = NewBackend();
  auto b = Build(l, DType::kFloat32, WeightLayout::kOutIn, Activation::kNone, DType::kFloat32);
  RunResult r = MustRun(*cpu, b->problem, Cfg(Precision::kFp32, BiasMode::kNone));
  EXPECT_EQ(r.output.shape(), (std::vector<int64_t>{0, 3}));
}

// ---- Sanity errors: never a crash.

TEST(CpuBackendTest, NullInputIsInvalidArgument) {
  auto cpu = NewBackend();
  LinearProblem p;
  EXPECT_THAT(cpu->Run(p, Cfg(Precision::kFp32, BiasMode::kNone), {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("input")));
}

TEST(CpuBackendTest, ShapeMismatchesAreInvalidArgumentNamingTheTensor) {
  Layer l = MakeLayer(2, 3, 4, /*with_bias=*/true, false, 3);
  auto cpu = NewBackend();
  const Config c = Cfg(Precision::kFp32, BiasMode::kFused);
  {
    auto b = Build(l, DType::kFloat32, WeightLayout::kOutIn, Activation::kNone, DType::kFloat32);
    b->problem.k = 5;
    EXPECT_THAT(cpu->Run(b->problem, c, {}),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("input")));
  }
  {
    auto b = Build(l, DType::kFloat32, WeightLayout::kOutIn, Activation::kNone, DType::kFloat32);
    b->problem.layout = WeightLayout::kInOut;  // [3, 4] is not [k, n] = [4, 3]
    EXPECT_THAT(cpu->Run(b->problem, c, {}),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("weight")));
  }
  {
    auto b = Build(l, DType::kFloat32, WeightLayout::kOutIn, Activation::kNone, DType::kFloat32);
    Tensor short_bias = *Tensor::Create(DType::kFloat32, {2});
    b->problem.bias = &short_bias;
    EXPECT_THAT(cpu->Run(b->problem, c, {}),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bias")));
  }
  {
    auto b = Build(l, DType::kFloat32, WeightLayout::kOutIn, Activation::kNone, DType::kFloat32);
    b->problem.m = -1;
    EXPECT_THAT(cpu->Run(b->problem, c, {}),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("problem.m")));
  }
}

TEST(CpuBackendTest, NegativeThreadsIsInvalidArgument) {
  CpuBackend::Options o;
  o.threads = -2;
  EXPECT_THAT(CpuBackend::Create(o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("threads")));
}

TEST(CpuBackendTest, AdvertisesEveryPrecisionBiasModeAndStorageDtype) {
  auto cpu = NewBackend();
  EXPECT_EQ(cpu->name(), "cpu");
  EXPECT_THAT(cpu->Available(), IsOk());
  EXPECT_EQ(cpu->precisions().size(), std::size(kAllPrecisions));
  EXPECT_EQ(cpu->bias_modes().size(), 3u);
  EXPECT_EQ(cpu->storage_dtypes().size(), std::size(kAllDTypes));
  EXPECT_EQ(cpu->default_bias_mode(), BiasMode::kFused);
}

// ---- The Flax case (README.md) on CPU: 2x768 -> 512, fp32.

TEST(CpuBackendTest, FlaxCaseTf32DiffersFromFp32ByTf32SizedErrors) {
  constexpr int64_t kM = 2, kK = 768, kN = 512;
  std::mt19937 rng(2024);
  std::normal_distribution<float> x_dist(0.0f, 1.0f);
  std::normal_distribution<float> w_dist(0.0f, 1.0f / std::sqrt(768.0f));
  std::vector<float> x(kM * kK), w(kN * kK);
  for (float& v : x) v = x_dist(rng);
  for (float& v : w) v = w_dist(rng);
  auto xt = FromFloats(DType::kFloat32, {kM, kK}, x);
  auto wt = FromFloats(DType::kFloat32, {kN, kK}, w);
  auto bt = Tensor::Create(DType::kFloat32, {kN});  // b = 0
  ASSERT_THAT(xt, IsOk());
  ASSERT_THAT(wt, IsOk());
  ASSERT_THAT(bt, IsOk());
  LinearProblem p;
  p.input = &*xt;
  p.weight = &*wt;
  p.bias = &*bt;
  p.output_dtype = DType::kFloat32;
  p.m = kM;
  p.n = kN;
  p.k = kK;
  auto cpu = NewBackend();
  const std::vector<double> tf32 =
      Values(MustRun(*cpu, p, Cfg(Precision::kTf32, BiasMode::kFused)).output);
  const std::vector<double> fp32 =
      Values(MustRun(*cpu, p, Cfg(Precision::kFp32, BiasMode::kFused)).output);
  const std::vector<double> fp64 =
      Values(MustRun(*cpu, p, Cfg(Precision::kFp64, BiasMode::kFused)).output);
  double tf32_vs_fp32 = 0.0, fp32_vs_fp64 = 0.0;
  for (size_t i = 0; i < fp32.size(); ++i) {
    tf32_vs_fp32 = std::max(tf32_vs_fp32, std::fabs(tf32[i] - fp32[i]));
    fp32_vs_fp64 = std::max(fp32_vs_fp64, std::fabs(fp32[i] - fp64[i]));
  }
  // The figures of docs/performance.md.
  EXPECT_GE(tf32_vs_fp32, 3e-4);
  EXPECT_LE(tf32_vs_fp32, 3e-3);
  EXPECT_LT(fp32_vs_fp64, 1e-5);
}

// ---- Large weights: converted block by block along N, bit for bit as
// unblocked (docs/architecture.md, "Large weights: blocks along N").

// Every output of `configs` in one batch, as doubles (the tests below ask
// for fp64 outputs, which hold every bit of either accumulator).
std::vector<std::vector<double>> BatchValues(CpuBackend& cpu, const LinearProblem& p,
                                             const std::vector<Config>& configs) {
  Batch batch = MustRunBatch(cpu, p, configs);
  std::vector<std::vector<double>> out;
  for (const RunResult& r : batch.results) out.push_back(Values(r.output));
  return out;
}

// NormalLayer with values `storage` holds: rounded to fp32, bf16 or fp16,
// or for fp64 as drawn (so that fp32-accumulate precisions round them too).
Layer StoredNormalLayer(DType storage, int64_t m, int64_t n, int64_t k, double stddev,
                        uint32_t seed, bool bias) {
  switch (storage) {
    case DType::kFloat32:
      return NormalLayer(m, n, k, stddev, kFp32Format, seed, bias);
    case DType::kBFloat16:
      return NormalLayer(m, n, k, stddev, kBf16Format, seed, bias);
    case DType::kFloat16:
      return NormalLayer(m, n, k, stddev, kFp16Format, seed, bias);
    case DType::kFloat64:
    case DType::kFloat8E4M3Fn:  // not a storage these layers are drawn in
    case DType::kFloat8E5M2:
    case DType::kFloat4E2M1Fn:
    case DType::kFloat8E8M0Fnu:
      break;
  }
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, stddev);
  Layer l;
  l.m = m;
  l.n = n;
  l.k = k;
  for (int64_t i = 0; i < m * k; ++i) l.x.push_back(normal(rng));
  for (int64_t i = 0; i < n * k; ++i) l.w.push_back(normal(rng));
  if (bias) {
    for (int64_t j = 0; j < n; ++j) l.b.push_back(normal(rng));
  }
  return l;
}

std::unique_ptr<CpuBackend> BackendWithBlocks(int threads, int64_t block_columns) {
  CpuBackend::Options o;
  o.threads = threads;
  o.weight_block_columns = block_columns;
  auto backend = CpuBackend::Create(o);
  EXPECT_THAT(backend, IsOk());
  return std::move(*backend);
}

TEST(CpuBackendBlocksTest, TinyBlocksGiveTheUnblockedOutputBitForBit) {
  // Bit for bit where OpenBLAS itself does not depend on the call's width
  // (docs/architecture.md, "Large weights: blocks along N"); elsewhere the
  // blocks may only move an element by summation-order noise, far below
  // what a misplaced or missing column would.
  // Normal values: sums depend on the order of their terms, so any change
  // in how an element's dot product is computed shows in its bits. Three
  // shapes: BLAS blocks at the least width the plan allows (64 columns at
  // m = 16, k = 8192), one raised past the alignment (m = 33, k = 2048: 128
  // columns), and one too small to block for BLAS at all; fp16acc takes the
  // 5 columns asked for everywhere.
  struct Shape {
    int64_t m, n, k;
    int64_t fp32_blocks, fp64_blocks;  // PlanWeightBlocks' count for 5 columns
  };
  const Shape shapes[] = {{16, 229, 8192, 3, 3}, {33, 300, 2048, 2, 2}, {3, 40, 20, 1, 1}};
  constexpr int64_t kTiny = 5;
  constexpr int64_t kUnblocked = int64_t{1} << 40;
  for (const Shape& shape : shapes) {
    EXPECT_EQ(PlanWeightBlocks(shape.m, shape.n, shape.k, sizeof(float), kTiny).count,
              shape.fp32_blocks);
    EXPECT_EQ(PlanWeightBlocks(shape.m, shape.n, shape.k, sizeof(double), kTiny).count,
              shape.fp64_blocks);
    EXPECT_EQ(
        PlanWeightBlocks(shape.m, shape.n, shape.k, sizeof(float), kTiny, /*blas=*/false).count,
        shape.n / kTiny);
    EXPECT_EQ(PlanWeightBlocks(shape.m, shape.n, shape.k, sizeof(float), kUnblocked).count, 1);
    for (const bool bias : {false, true}) {
      std::vector<Config> configs;
      for (Precision p : kWidePrecisions) {
        if (bias) {
          configs.push_back(Cfg(p, BiasMode::kFused));
          configs.push_back(Cfg(p, BiasMode::kUnfused));
        } else {
          configs.push_back(Cfg(p, BiasMode::kNone));
        }
      }
      for (DType storage : kWideDTypes) {
        const Layer l = StoredNormalLayer(storage, shape.m, shape.n, shape.k, 0.5,
                                          static_cast<uint32_t>(shape.n + bias), bias);
        for (WeightLayout layout : {WeightLayout::kOutIn, WeightLayout::kInOut}) {
          // OpenBLAS sums some edge columns in another order single-threaded
          // than with threads: both.
          for (const int threads : {1, 2}) {
            auto probe_threads = BackendWithBlocks(threads, 0);  // sets OpenBLAS's threads
            const bool invariant = BlasIsBlockInvariant(shape.m, shape.n, shape.k);
            SCOPED_TRACE(absl::StrCat("m=", shape.m, " n=", shape.n, " k=", shape.k, " bias=", bias,
                                      " storage=", DTypeName(storage), " ",
                                      WeightLayoutName(layout), " threads=", threads));
            auto b = Build(l, storage, layout, Activation::kNone, DType::kFloat64, {}, storage);
            auto unblocked = BackendWithBlocks(threads, kUnblocked);
            auto blocked = BackendWithBlocks(threads, kTiny);
            const auto want = BatchValues(*unblocked, b->problem, configs);
            const auto got = BatchValues(*blocked, b->problem, configs);
            ASSERT_EQ(got.size(), configs.size());
            for (size_t c = 0; c < configs.size(); ++c) {
              SCOPED_TRACE(configs[c].ToString());
              ASSERT_EQ(got[c].size(), want[c].size());
              int64_t differ = 0;
              double largest = 0, worst = 0;
              for (size_t i = 0; i < got[c].size(); ++i) {
                differ += std::memcmp(&got[c][i], &want[c][i], sizeof(double)) != 0;
                largest = std::max(largest, std::fabs(want[c][i]));
                worst = std::max(worst, std::fabs(got[c][i] - want[c][i]));
              }
              if (invariant || configs[c].precision == Precision::kFp16Acc) {
                EXPECT_EQ(differ, 0);
              } else {
                EXPECT_LE(worst, 1e-3 * largest) << differ << " elements differ";
              }
            }
          }
        }
      }
    }
  }
}

TEST(CpuBackendBlocksTest, BlockedFp16AccMatchesTheNaiveLoop) {
  // Blocks of 3 columns (13 blocks, the last of 4) against the naive loop,
  // both layouts.
  const Layer l = NormalLayer(5, 40, 300, 0.25, kFp16Format, 31, /*bias=*/false);
  const std::vector<double> want = NaiveFp16Acc(l);
  auto cpu = BackendWithBlocks(/*threads=*/2, /*block_columns=*/3);
  for (WeightLayout layout : {WeightLayout::kOutIn, WeightLayout::kInOut}) {
    SCOPED_TRACE(WeightLayoutName(layout));
    auto b = Build(l, DType::kFloat16, layout, Activation::kNone, DType::kFloat32);
    const std::vector<double> got =
        Values(MustRun(*cpu, b->problem, Cfg(Precision::kFp16Acc, BiasMode::kNone)).output);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i], want[i]) << "element " << i;
    }
  }
}

TEST(CpuBackendBlocksTest, StopBetweenBlocksIsReturned) {
  const Layer l = NormalLayer(16, 229, 8192, 0.5, kBf16Format, 5, /*bias=*/false);
  auto b = Build(l, DType::kBFloat16, WeightLayout::kOutIn, Activation::kNone, DType::kFloat32);
  auto cpu = BackendWithBlocks(/*threads=*/2, /*block_columns=*/5);
  StopSignal stop;
  stop.Cancel(StopSignal::Reason::kClientCancelled);
  RunOptions o;
  o.stop = &stop;
  for (Precision p : {Precision::kFp64, Precision::kBf16, Precision::kFp16Acc}) {
    SCOPED_TRACE(PrecisionName(p));
    EXPECT_THAT(cpu->Run(b->problem, Cfg(p, BiasMode::kNone), o),
                StatusIs(absl::StatusCode::kCancelled));
  }
}

// ---- Multi-pass precisions (docs/numerics.md, "Multi-pass precisions")

// The test's own split of a stored value: the value as fp32, then high
// parts cut toward zero (bf16) or rounded ties-away (TF32) and the last
// part of the rest rounded to nearest even (bf16) or truncated (TF32).
// Every rest is exact in fp64.
std::vector<double> RefParts(Precision p, double v) {
  const bool tf32 = p == Precision::kTf32x3;
  const int count = (p == Precision::kBf16x6 || p == Precision::kBf16x9) ? 3 : 2;
  const Format f = tf32 ? kTf32Format : kBf16Format;
  std::vector<double> parts;
  double rest = RefRound(v, kFp32Format);
  for (int i = 0; i + 1 < count; ++i) {
    parts.push_back(RefRound(rest, f, tf32 ? Tie::kAway : Tie::kTruncate));
    rest -= parts.back();
  }
  parts.push_back(RefRound(rest, f, tf32 ? Tie::kTruncate : Tie::kEven));
  return parts;
}

// {input part, weight part} of each partial GEMM in XLA's summation order
// (0 the high part), written out from XLA's sources as docs/numerics.md
// quotes them.
std::vector<std::pair<int, int>> RefPartials(Precision p) {
  switch (p) {
    case Precision::kBf16x6:
      return {{1, 1}, {0, 2}, {2, 0}, {0, 1}, {1, 0}, {0, 0}};
    case Precision::kBf16x9:
      return {{2, 2}, {1, 2}, {2, 1}, {1, 1}, {2, 0}, {0, 2}, {1, 0}, {0, 1}, {0, 0}};
    default:
      return {{1, 0}, {0, 1}, {0, 0}};
  }
}

// y of a multi-pass precision for K <= 2: each partial GEMM's element is
// one or two exact products (at most 22 significant bits each), summed
// exactly in fp64 and rounded once to fp32, which is what any fp32 GEMM
// gives for K <= 2; the partials are then summed in fp32 in XLA's order,
// NaNs zeroed before the high x high partial; then the bias and the output
// rounding as RefLinearT (no activation).
std::vector<double> RefMultiPass(const Layer& l, Precision p, BiasMode mode, DType out) {
  EXPECT_LE(l.k, 2);
  const std::vector<std::pair<int, int>> partials = RefPartials(p);
  std::vector<double> y;
  for (int64_t i = 0; i < l.m; ++i) {
    for (int64_t j = 0; j < l.n; ++j) {
      float acc = 0.0f;
      for (size_t t = 0; t < partials.size(); ++t) {
        double exact = 0.0;
        for (int64_t kk = 0; kk < l.k; ++kk) {
          exact += RefParts(p, l.x[i * l.k + kk])[static_cast<size_t>(partials[t].first)] *
                   RefParts(p, l.w[j * l.k + kk])[static_cast<size_t>(partials[t].second)];
        }
        const float partial = static_cast<float>(RefRound(exact, kFp32Format));
        if (t == 0) {
          acc = partial;
          continue;
        }
        if (t + 1 == partials.size() && std::isnan(acc)) acc = 0.0f;
        acc = acc + partial;
      }
      const float b = l.b.empty() ? 0.0f : static_cast<float>(l.b[j]);
      double v;
      if (mode == BiasMode::kUnfused) {
        const float u = static_cast<float>(RefRoundTo(out, acc));
        v = RefRoundTo(out, static_cast<float>(u + b));
      } else {
        v = RefRoundTo(out, static_cast<float>(acc + b));
      }
      y.push_back(v);
    }
  }
  return y;
}

TEST(CpuMultiPassTest, MatchesIndependentSplitProductsAndOrderBitForBit) {
  for (Precision p : kMultiPassPrecisions) {
    for (int64_t k : {1, 2}) {
      // Full 24-bit fp32 values: every part is non-zero.
      const Layer l = NormalLayer(6, 5, k, 1.0, kFp32Format, /*seed=*/17 + k, /*bias=*/true);
      for (BiasMode mode : {BiasMode::kFused, BiasMode::kUnfused}) {
        for (DType out : {DType::kFloat32, DType::kBFloat16}) {
          for (WeightLayout layout : {WeightLayout::kOutIn, WeightLayout::kInOut}) {
            SCOPED_TRACE(absl::StrCat(PrecisionName(p), " k=", k, " ", BiasModeName(mode), " ",
                                      DTypeName(out), " ", WeightLayoutName(layout)));
            auto b = Build(l, DType::kFloat32, layout, Activation::kNone, out);
            auto cpu = NewBackend();
            const RunResult r = MustRun(*cpu, b->problem, Cfg(p, mode));
            const std::vector<double> want = RefMultiPass(l, p, mode, out);
            const std::vector<double> got = Values(r.output);
            ASSERT_EQ(got.size(), want.size());
            for (size_t e = 0; e < got.size(); ++e) EXPECT_EQ(got[e], want[e]) << "element " << e;
            EXPECT_THAT(r.details.at("partial_sum_order"), HasSubstr("NaN -> 0"));
          }
        }
      }
    }
  }
}

TEST(CpuMultiPassTest, TheOrderIsVisibleAndNotFp32s) {
  // bf16x3 leaves lo x lo out (about 2^-16 of each product): its outputs
  // are not an fp32 GEMM's, so the test above does not pass by accident
  // of one.
  const Layer l = NormalLayer(16, 16, 2, 1.0, kFp32Format, /*seed=*/5, /*bias=*/false);
  auto b = Build(l, DType::kFloat32, WeightLayout::kOutIn, Activation::kNone, DType::kFloat32);
  auto cpu = NewBackend();
  const std::vector<double> fp32 =
      Values(MustRun(*cpu, b->problem, Cfg(Precision::kFp32, BiasMode::kNone)).output);
  const std::vector<double> x3 =
      Values(MustRun(*cpu, b->problem, Cfg(Precision::kBf16x3, BiasMode::kNone)).output);
  EXPECT_NE(fp32, x3);
}

TEST(CpuMultiPassTest, NaNOfTheLowPartialsIsZeroedSoAnInfinitySurvives) {
  // x = inf: its high part is inf, the rest inf - inf = NaN, so the low
  // partials are NaN; XLA zeroes them before adding high x high = inf.
  Layer l;
  l.m = 1;
  l.n = 1;
  l.k = 1;
  l.x = {std::numeric_limits<double>::infinity()};
  l.w = {1.0};
  auto b = Build(l, DType::kFloat32, WeightLayout::kOutIn, Activation::kNone, DType::kFloat32);
  auto cpu = NewBackend();
  for (Precision p : kMultiPassPrecisions) {
    const RunResult r = MustRun(*cpu, b->problem, Cfg(p, BiasMode::kNone));
    EXPECT_EQ(Values(r.output)[0], std::numeric_limits<double>::infinity()) << PrecisionName(p);
  }
}

TEST(CpuMultiPassTest, Bf16TensorsUnderBf16x3AreOneBf16Pass) {
  // bf16 values are their own high part: the low partials are 0 and the
  // result is the bf16 GEMM's (a fused bias keeps zeros' signs apart).
  const Layer l = NormalLayer(8, 12, 96, 1.0, kBf16Format, /*seed=*/9, /*bias=*/true);
  auto b = Build(l, DType::kBFloat16, WeightLayout::kOutIn, Activation::kNone, DType::kFloat32);
  auto cpu = NewBackend();
  EXPECT_EQ(Values(MustRun(*cpu, b->problem, Cfg(Precision::kBf16x3, BiasMode::kFused)).output),
            Values(MustRun(*cpu, b->problem, Cfg(Precision::kBf16, BiasMode::kFused)).output));
}

TEST(CpuMultiPassTest, LongReductionsStayWithinTheirInputUnitOfTheExactProduct) {
  // K = 512: each partial GEMM rounds in OpenBLAS's order, so compare
  // against fp64 with the error model's scale: |y - exact| within a few
  // (u_input + u_fp32 sqrt(K)) * sum |x||w|.
  const Layer l = NormalLayer(4, 6, 512, 1.0, kFp32Format, /*seed=*/21, /*bias=*/false);
  auto b = Build(l, DType::kFloat32, WeightLayout::kOutIn, Activation::kNone, DType::kFloat32);
  auto cpu = NewBackend();
  for (Precision p : kMultiPassPrecisions) {
    const std::vector<double> got =
        Values(MustRun(*cpu, b->problem, Cfg(p, BiasMode::kNone)).output);
    const double u = GetPrecisionInfo(p).u_input + std::ldexp(1.0, -24) * std::sqrt(512.0);
    for (int64_t i = 0; i < l.m; ++i) {
      for (int64_t j = 0; j < l.n; ++j) {
        double exact = 0.0, abs_dot = 0.0;
        for (int64_t kk = 0; kk < l.k; ++kk) {
          exact += l.x[i * l.k + kk] * l.w[j * l.k + kk];
          abs_dot += std::fabs(l.x[i * l.k + kk] * l.w[j * l.k + kk]);
        }
        EXPECT_LE(std::fabs(got[i * l.n + j] - exact), 4 * u * abs_dot) << PrecisionName(p);
      }
    }
  }
}

}  // namespace
}  // namespace tensorcheck
