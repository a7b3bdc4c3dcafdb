// Tests of the cuBLAS / cuBLASLt backends.
//
// Tests named Gpu* need a CUDA device and GTEST_SKIP() without one. The
// others run anywhere: configuration errors (checked before the device),
// the no-device contract, and the CUDA-error -> Status mapping.
//
// Expected values come from an fp64 reference computed here, never from
// the code under test. GPU tests print tables (lines starting "| ") for
// the validation record in docs/gpu-validation.md.
#include "server/backends/cuda/cuda_backends.h"

#include <cuda_runtime.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/float_formats.h"
#include "core/mx_formats.h"
#include "core/status_macros.h"
#include "core/tensor.h"
#include "server/backends/cpu/cpu_backend.h"
#include "server/backends/cuda/cuda_status.h"
#include "server/backends/cuda/internal/cuda_session.h"
#include "server/backends/device_session.h"
#include "tests/testing/cuda_test_backends.h"
#include "tests/testing/status_matchers.h"

namespace tensorcheck {
namespace {

using ::tensorcheck::testing::IsOk;
using ::tensorcheck::testing::StatusIs;
using ::tensorcheck::testing::TestBackend;
using ::tensorcheck::testing::TestCpuBackend;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// ---------------------------------------------------------------- helpers

// A linear layer whose tensors outlive the problem that points at them.
struct Layer {
  Tensor x, w, b;
  bool has_bias = false;
  LinearProblem problem;
};

std::vector<double> Uniform(size_t count, double lo, double hi, std::mt19937* rng) {
  std::uniform_real_distribution<double> d(lo, hi);
  std::vector<double> v(count);
  for (double& e : v) e = d(*rng);
  return v;
}

// x: [lead, m/lead, k] when lead > 1, else [m, k].
std::unique_ptr<Layer> MakeLayer(int64_t m, int64_t n, int64_t k, DType storage,
                                 WeightLayout layout, bool bias, Activation act, DType out,
                                 uint32_t seed, int64_t lead = 1) {
  std::mt19937 rng(seed);
  auto layer = std::make_unique<Layer>();
  std::vector<int64_t> xshape =
      lead > 1 ? std::vector<int64_t>{lead, m / lead, k} : std::vector<int64_t>{m, k};
  std::vector<int64_t> wshape =
      layout == WeightLayout::kOutIn ? std::vector<int64_t>{n, k} : std::vector<int64_t>{k, n};
  layer->x = *FromDoubles(storage, xshape, Uniform(static_cast<size_t>(m * k), -1, 1, &rng));
  layer->w = *FromDoubles(storage, wshape, Uniform(static_cast<size_t>(n * k), -1, 1, &rng));
  layer->has_bias = bias;
  if (bias) layer->b = *FromDoubles(storage, {n}, Uniform(static_cast<size_t>(n), -1, 1, &rng));
  LinearProblem& p = layer->problem;
  p.input = &layer->x;
  p.weight = &layer->w;
  p.layout = layout;
  p.bias = bias ? &layer->b : nullptr;
  p.activation = act;
  p.output_dtype = out;
  p.m = m;
  p.n = n;
  p.k = k;
  return layer;
}

double GeluTanh(double v) {
  return 0.5 * v * (1.0 + std::tanh(0.79788456080286535588 * (v + 0.044715 * v * v * v)));
}

// fp64 reference of y = act(x W^T + b) from the stored values, plus what
// the error bound scales with.
struct Reference {
  std::vector<double> y, acc, pre, abs_dot;  // [m*n]
  std::vector<double> bias;                  // [n], 0 without bias
};

Reference ComputeReference(const Layer& l) {
  const LinearProblem& p = l.problem;
  const int64_t m = p.m, n = p.n, k = p.k;
  std::vector<double> x(static_cast<size_t>(m * k)), w(static_cast<size_t>(n * k));
  ToDouble(l.x, x.data());
  ToDouble(l.w, w.data());
  Reference r;
  r.bias.assign(static_cast<size_t>(n), 0.0);
  if (l.has_bias) ToDouble(l.b, r.bias.data());
  r.y.resize(static_cast<size_t>(m * n));
  r.acc.resize(r.y.size());
  r.pre.resize(r.y.size());
  r.abs_dot.resize(r.y.size());
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      long double acc = 0, mag = 0;
      for (int64_t kk = 0; kk < k; ++kk) {
        const double wv = p.layout == WeightLayout::kOutIn ? w[static_cast<size_t>(j * k + kk)]
                                                           : w[static_cast<size_t>(kk * n + j)];
        const double xv = x[static_cast<size_t>(i * k + kk)];
        acc += static_cast<long double>(xv) * wv;
        mag += std::fabs(static_cast<long double>(xv) * wv);
      }
      const size_t e = static_cast<size_t>(i * n + j);
      r.acc[e] = static_cast<double>(acc);
      r.abs_dot[e] = static_cast<double>(mag);
      r.pre[e] = r.acc[e] + r.bias[static_cast<size_t>(j)];
      const double v = r.pre[e];
      r.y[e] = p.activation == Activation::kRelu       ? (v < 0 ? 0.0 : v)
               : p.activation == Activation::kGeluTanh ? GeluTanh(v)
                                                       : v;
    }
  }
  return r;
}

double UnitRoundoff(DType d) {
  switch (d) {
    case DType::kFloat64:
      return 0x1p-53;
    case DType::kFloat32:
      return 0x1p-24;
    case DType::kFloat16:
      return 0x1p-11;
    case DType::kBFloat16:
      return 0x1p-8;
    case DType::kFloat8E4M3Fn:  // not an output dtype
      return 0x1p-4;
    case DType::kFloat8E5M2:
      return 0x1p-3;
    case DType::kFloat4E2M1Fn:  // not output dtypes either
      return 0x1p-2;
    case DType::kFloat8E8M0Fnu:
      return 0.5;
  }
  return 0;
}

// Worst-case (deterministic) bound on |gpu - reference| for one element:
// input rounding of both operands, K-term accumulation, the epilogue and
// output roundings (up to three for unfused), GELU's approximation on the
// device (a tanh that may be an approximate instruction), all times 1.25.
double Bound(Precision p, DType storage, DType out, int64_t k, Activation act, const Reference& r,
             size_t e) {
  double u_in = 0;
  switch (p) {
    case Precision::kFp64:
      break;
    case Precision::kFp32:
      u_in = storage == DType::kFloat64 ? 0x1p-24 : 0;
      break;
    case Precision::kTf32:
    case Precision::kTf32Rna:
    case Precision::kTf32Trunc:
      u_in = 0x1p-10;  // truncation errs up to a whole TF32 unit
      break;
    case Precision::kBf16:
      u_in = 0x1p-8;
      break;
    case Precision::kFp16:
    case Precision::kFp16Acc:
      u_in = 0x1p-11;
      break;
    case Precision::kFp8E4M3:  // the CUDA backends run no fp8 configuration
    case Precision::kFp8E5M2:
    case Precision::kFp8E4M3E5M2:
    case Precision::kFp8E5M2E4M3:
      u_in = 0x1p-3;
      break;
    case Precision::kMxFp8E4M3:  // not asked of Bound: their tests compare with the cpu backend
    case Precision::kMxFp8E5M2:
      u_in = 0x1p-3;
      break;
    case Precision::kNvFp4:
      u_in = 0x1p-2;
      break;
    case Precision::kBf16x3:  // the split leaves out what u_input says
    case Precision::kBf16x6:
    case Precision::kBf16x9:
    case Precision::kTf32x3:
      u_in = GetPrecisionInfo(p).u_input;
      break;
  }
  const double u_acc = p == Precision::kFp64      ? 0x1p-53
                       : p == Precision::kFp16Acc ? 0x1p-11
                                                  : 0x1p-24;
  const double u_out = std::max(UnitRoundoff(out), u_acc);
  const double mags = std::fabs(r.acc[e]) + std::fabs(r.pre[e]) + std::fabs(r.y[e]);
  double b = (2 * u_in + u_in * u_in + static_cast<double>(k) * u_acc) * r.abs_dot[e] +
             4 * u_out * (mags + 1e-30);
  if (act == Activation::kGeluTanh) b += 0x1p-10 * std::fabs(r.pre[e]);
  // fp16 inputs: values below fp16's normal range round to multiples of 2^-24.
  if (p == Precision::kFp16 || p == Precision::kFp16Acc) b += static_cast<double>(k) * 0x1p-23;
  return 1.25 * b;
}

// Element e of a tensor as double (exact).
double At(const Tensor& t, size_t e) { return t.GetDouble(static_cast<int64_t>(e)); }

// Distance in units in the last place of the tensors' dtype (both the same
// dtype): the count of representable values between them.
int64_t Ordered(const Tensor& t, size_t e) {
  switch (t.dtype()) {
    case DType::kFloat64: {
      const int64_t b = static_cast<int64_t>(t.data<uint64_t>()[e]);
      return b < 0 ? INT64_MIN - b : b;
    }
    case DType::kFloat32: {
      const int32_t b = static_cast<int32_t>(t.data<uint32_t>()[e]);
      return b < 0 ? static_cast<int64_t>(INT32_MIN) - b : b;
    }
    default: {
      const int16_t b = static_cast<int16_t>(t.data<uint16_t>()[e]);
      return b < 0 ? static_cast<int64_t>(INT16_MIN) - b : b;
    }
  }
}
uint64_t UlpDistance(const Tensor& a, const Tensor& b, size_t e) {
  const int64_t x = Ordered(a, e), y = Ordered(b, e);
  return x > y ? static_cast<uint64_t>(x) - static_cast<uint64_t>(y)
               : static_cast<uint64_t>(y) - static_cast<uint64_t>(x);
}

struct Agreement {
  double bitwise_share = 0;
  uint64_t max_ulp = 0;
  double mean_ulp = 0;
};
Agreement Compare(const Tensor& a, const Tensor& b) {
  Agreement g;
  const size_t count = static_cast<size_t>(a.numel());
  size_t equal = 0;
  double sum = 0;
  for (size_t e = 0; e < count; ++e) {
    const uint64_t u = UlpDistance(a, b, e);
    equal += u == 0;
    g.max_ulp = std::max(g.max_ulp, u);
    sum += static_cast<double>(u);
  }
  g.bitwise_share = count == 0 ? 1.0 : static_cast<double>(equal) / static_cast<double>(count);
  g.mean_ulp = count == 0 ? 0.0 : sum / static_cast<double>(count);
  return g;
}

Config MakeConfig(LinearBackend* backend, Precision p, const Layer& l) {
  ConfigSpec spec;
  spec.backend = std::string(backend->name());
  spec.precision = p;
  return ResolveConfig(spec, l.has_bias, l.problem.activation, backend->default_bias_mode());
}

class CudaGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(TestBackend("cublaslt"), nullptr);
    ASSERT_NE(TestBackend("cublas"), nullptr);
    const absl::Status s = TestBackend("cublaslt")->Available();
    if (!s.ok()) GTEST_SKIP() << s.message();
    ASSERT_NE(TestCpuBackend(), nullptr);
  }
};

Config Fp8Config(absl::string_view backend, Precision p, bool bias, Fp8Scaling scaling,
                 bool fast_accum = false) {
  Config c;
  c.backend = std::string(backend);
  c.precision = p;
  c.bias = !bias ? BiasMode::kNone : backend == "cublas" ? BiasMode::kUnfused : BiasMode::kFused;
  c.scaling = scaling;
  c.fast_accum = fast_accum;
  return c;
}

// An FP8 layer whose sums are exact in any order, in fp32 and in the
// narrower accumulator Hopper's FP8 tensor cores keep inside an MMA: every
// row of x and every output feature of W holds one 448 (so the recipe's
// scales are powers of two and quantising changes no value), x's in the
// first half of k and W's in the second so that two never meet; the rest
// are integers in [-4, 4]. The products are then multiples of the smallest
// one and every partial sum stays below 2 * 448 * 4 + k * 16 of them, under
// 2^13 for k <= 288. (On an H200, 2026-12-04, 448 * 448 products made the
// fp32 outputs differ from an fp32 sum: docs/gpu-validation.md.) The bias
// holds multiples of 1/8. `fp8`: x and W stored as FP8 (`p`'s formats)
// with power-of-two scales; else stored as `storage`, quantised by the
// configuration's recipe.
struct Fp8Layer {
  Tensor x, w, b, x_scale, w_scale;
  bool has_bias = false;
  LinearProblem problem;
};

// The rest of an exact FP8 layer, after its operands and scales: a bf16
// bias of multiples of 1/8 in [-1/2, 1/2] drawn from `rng` when `bias`,
// and the problem's tensors, layout, activation, output and shape.
void FinishExactFp8Layer(Fp8Layer* l, int64_t m, int64_t n, int64_t k, WeightLayout layout,
                         bool bias, Activation act, DType out, std::mt19937& rng) {
  LinearProblem& pr = l->problem;
  if (bias) {
    std::uniform_int_distribution<int> small(-4, 4);
    std::vector<double> b(static_cast<size_t>(n));
    for (double& v : b) v = small(rng) / 8.0;
    l->b = *FromDoubles(DType::kBFloat16, {n}, b);
    l->has_bias = true;
    pr.bias = &l->b;
  }
  pr.input = &l->x;
  pr.weight = &l->w;
  pr.layout = layout;
  pr.activation = act;
  pr.output_dtype = out;
  pr.m = m;
  pr.n = n;
  pr.k = k;
}

std::unique_ptr<Fp8Layer> MakeExactFp8Layer(int64_t m, int64_t n, int64_t k, Precision p, bool fp8,
                                            DType storage, WeightLayout layout, bool bias,
                                            Activation act, DType out, Fp8Scaling scaling,
                                            uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> small(-4, 4);
  auto l = std::make_unique<Fp8Layer>();
  const Fp8Operands formats = Fp8OperandsOf(p);
  std::vector<double> x(static_cast<size_t>(m * k)), w(static_cast<size_t>(n * k));
  for (double& v : x) v = small(rng);
  for (double& v : w) v = small(rng);
  const int64_t half = k / 2;
  for (int64_t i = 0; i < m; ++i) x[static_cast<size_t>(i * k + i % half)] = 448;
  const bool out_in = layout == WeightLayout::kOutIn;
  for (int64_t j = 0; j < n; ++j) {
    const int64_t kk = half + (7 * j) % (k - half);
    w[static_cast<size_t>(out_in ? j * k + kk : kk * n + j)] = 448;
  }
  l->x = *FromDoubles(fp8 ? formats.input : storage, {m, k}, x);
  l->w = *FromDoubles(fp8 ? formats.weight : storage,
                      out_in ? std::vector<int64_t>{n, k} : std::vector<int64_t>{k, n}, w);
  LinearProblem& pr = l->problem;
  if (fp8) {
    const bool row = scaling == Fp8Scaling::kRow;
    std::vector<double> sx(static_cast<size_t>(row ? m : 1)), sw(static_cast<size_t>(row ? n : 1));
    for (size_t i = 0; i < sx.size(); ++i) sx[i] = std::ldexp(1.0, -static_cast<int>(i % 3) - 1);
    for (size_t j = 0; j < sw.size(); ++j) sw[j] = std::ldexp(1.0, -static_cast<int>(j % 4) - 2);
    l->x_scale = *FromDoubles(DType::kFloat32, {static_cast<int64_t>(sx.size())}, sx);
    l->w_scale = *FromDoubles(DType::kFloat32, {static_cast<int64_t>(sw.size())}, sw);
    pr.input_scale = &l->x_scale;
    pr.weight_scale = &l->w_scale;
  }
  FinishExactFp8Layer(l.get(), m, n, k, layout, bias, act, out, rng);
  return l;
}

// Whether the device runs `c` at all (compute capability, scaling mode):
// prints why not and returns false.
bool DeviceRunsFp8(const Config& c, DType storage) {
  const absl::Status s = TestBackend("cublaslt")->Supports(c, storage);
  if (!s.ok())
    std::printf("| %s | not on this device: %s |\n", c.ToString().c_str(),
                std::string(s.message()).c_str());
  return s.ok();
}

// ------------------------------------------------------ tests without GPU

// Every cuBLASLt descriptor attribute the backend sets, with the backend's
// own code and types (internal::BuildDescriptors), accepted by the
// installed libcublasLt: descriptors need no device, so this runs on every
// host with the CUDA build. A configuration its set-up refuses (the FP8
// rules, a bias mode cuBLASLt does not run) is a rule, not a descriptor,
// and is counted apart; an attribute call the library refuses fails.
TEST(CudaBackends, EveryDescriptorAttributeTheBackendSetsIsAcceptedByLibcublasLt) {
  int built = 0, refused_by_rules = 0;
  std::set<std::string> epilogues, scale_modes;
  for (const cuda::internal::ComputeCapability cc :
       {cuda::internal::ComputeCapability{9, 0}, cuda::internal::ComputeCapability{8, 0},
        cuda::internal::ComputeCapability{10, 0}}) {
    for (Precision p : kAllPrecisions) {
      std::vector<DType> storages = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};
      if (IsFp8(p)) storages.push_back(Fp8OperandsOf(p).input);
      if (IsBlockScaled(p)) storages.push_back(BlockScaledOperandsOf(p).values);
      for (DType storage : storages) {
        for (bool bias : {false, true}) {
          for (Activation act : {Activation::kNone, Activation::kRelu, Activation::kGeluTanh}) {
            for (DType out :
                 {DType::kBFloat16, DType::kFloat16, DType::kFloat32, DType::kFloat64}) {
              for (Fp8Scaling scaling :
                   {Fp8Scaling::kTensor, Fp8Scaling::kRow, Fp8Scaling::kBlock128}) {
                for (bool fast : {false, true}) {
                  if (!IsFp8(p) && (scaling != Fp8Scaling::kTensor || fast)) continue;
                  for (bool strict_reduction : {false, true}) {
                    Config c;
                    c.backend = "cublaslt";
                    c.precision = p;
                    c.bias = bias ? BiasMode::kFused : BiasMode::kNone;
                    c.scaling = scaling;
                    c.fast_accum = fast;
                    cuda::internal::LayerTypes layer;
                    layer.input = storage;
                    layer.weight = IsFp8(storage) && IsFp8(p) ? Fp8OperandsOf(p).weight : storage;
                    if (bias) layer.bias = IsNarrow(storage) ? DType::kBFloat16 : storage;
                    layer.activation = act;
                    layer.output_dtype = out;
                    layer.layout = (built + refused_by_rules) % 2 == 0 ? WeightLayout::kOutIn
                                                                       : WeightLayout::kInOut;
                    layer.m = 64;
                    layer.n = 128;
                    layer.k = 256;
                    RunOptions options;
                    options.disallow_reduced_precision_reduction = strict_reduction;
                    std::map<std::string, std::string> details;
                    const absl::Status s = cuda::internal::BuildDescriptors(
                        c, layer, options, cc, /*workspace_bytes=*/int64_t{32} << 20, &details);
                    const std::string what =
                        absl::StrCat(c.ToString(), " storage ", DTypeShortName(storage), " out ",
                                     DTypeShortName(out), " sm_", cc.major, cc.minor);
                    if (s.ok()) {
                      ++built;
                      epilogues.insert(details["epilogue"]);
                      if (details.count("a_scale_mode")) {
                        scale_modes.insert(details["a_scale_mode"] + "/" + details["b_scale_mode"]);
                      }
                      continue;
                    }
                    // The rules answer FAILED_PRECONDITION naming the
                    // configuration; a refused call starts with its own text
                    // (cuda_status.h), `cublasLtMatmulDescSetAttribute(...)`.
                    EXPECT_THAT(s, StatusIs(absl::StatusCode::kFailedPrecondition,
                                            StartsWith("configuration cublaslt:")))
                        << what;
                    ++refused_by_rules;
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  std::printf("descriptors built: %d configurations; refused by the rules: %d; epilogues:", built,
              refused_by_rules);
  for (const std::string& e : epilogues) std::printf(" %s", e.c_str());
  std::printf("\n");
  EXPECT_GT(built, 1000);
  // The six epilogues the backend uses: none, bias, relu, gelu, each with
  // and without the bias.
  EXPECT_EQ(epilogues.size(), 6u);
  // Every scale mode the rules choose was built at least once (A/B).
  for (const char* mode :
       {"CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F/CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F",
        "CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F/CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F",
        "CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F/CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F",
        "CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0/CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0",
        "CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3/CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3"}) {
    EXPECT_TRUE(scale_modes.count(mode)) << mode;
  }
}

TEST(CudaBackends, BothAreRegisteredWithWhatTheyWouldRun) {
  LinearBackend* lt = TestBackend("cublaslt");
  LinearBackend* blas = TestBackend("cublas");
  ASSERT_NE(lt, nullptr);
  ASSERT_NE(blas, nullptr);
  for (LinearBackend* b : {lt, blas}) {
    const std::vector<Precision> p = b->precisions();
    EXPECT_NE(std::find(p.begin(), p.end(), Precision::kBf16), p.end());
    EXPECT_NE(std::find(p.begin(), p.end(), Precision::kFp16Acc), p.end());
    // The hardware decides `tf32`'s rounding; the other two are emulated
    // on the device (inputs rounded by a kernel, then strict fp32).
    EXPECT_NE(std::find(p.begin(), p.end(), Precision::kTf32Rna), p.end());
    EXPECT_NE(std::find(p.begin(), p.end(), Precision::kTf32Trunc), p.end());
    // FP8 storage with the fp8 precisions: cuBLASLt's, where the device
    // has FP8 (or, without a device, would).
    const bool fp8 = std::find(p.begin(), p.end(), Precision::kFp8E4M3) != p.end();
    EXPECT_EQ(b->storage_dtypes().size(), fp8 ? 6u : 4u) << b->name();
    EXPECT_FALSE(b->device().runtime_version.empty());
    EXPECT_THAT(b->device().cublas_version, HasSubstr("cuBLAS"));
  }
  const std::vector<Precision> blas_p = blas->precisions();
  for (Precision p : kFp8Precisions) {
    EXPECT_EQ(std::find(blas_p.begin(), blas_p.end(), p), blas_p.end()) << PrecisionName(p);
  }
  const std::vector<Precision> lt_p = lt->precisions();
  EXPECT_EQ(std::find(lt_p.begin(), lt_p.end(), Precision::kFp8E5M2), lt_p.end());
  // The multi-pass precisions (internal/multi_pass_rules.h): cuBLASLt runs
  // XLA's partial GEMMs on every device; cuBLAS its own BF16x9 from
  // Blackwell on (or, without a device, would), and no other.
  for (Precision multi : kMultiPassPrecisions) {
    EXPECT_NE(std::find(lt_p.begin(), lt_p.end(), multi), lt_p.end()) << PrecisionName(multi);
  }
  const bool blackwell =
      !blas->Available().ok() || std::stod(blas->device().compute_capability) >= 10.0;
  EXPECT_EQ(std::find(blas_p.begin(), blas_p.end(), Precision::kBf16x9) != blas_p.end(), blackwell);
  for (Precision p : {Precision::kBf16x3, Precision::kBf16x6, Precision::kTf32x3}) {
    EXPECT_EQ(std::find(blas_p.begin(), blas_p.end(), p), blas_p.end()) << PrecisionName(p);
  }
  const DeviceDescription d = lt->device();
  const bool ada_or_newer = !lt->Available().ok() || std::stod(d.compute_capability) > 8.85;
  for (Precision p : {Precision::kFp8E4M3, Precision::kFp8E4M3E5M2, Precision::kFp8E5M2E4M3}) {
    EXPECT_EQ(std::find(lt_p.begin(), lt_p.end(), p) != lt_p.end(), ada_or_newer)
        << PrecisionName(p);
  }
  EXPECT_EQ(lt->default_bias_mode(), BiasMode::kFused);
  EXPECT_EQ(blas->default_bias_mode(), BiasMode::kUnfused);
  EXPECT_THAT(lt->bias_modes(), ::testing::ElementsAre(BiasMode::kNone, BiasMode::kFused));
  EXPECT_THAT(blas->bias_modes(), ::testing::ElementsAre(BiasMode::kNone, BiasMode::kUnfused));
}

TEST(CudaBackends, CublasAskedForFusedBiasIsFailedPreconditionNamingTheConfig) {
  auto l = MakeLayer(4, 3, 8, DType::kBFloat16, WeightLayout::kOutIn,
                     /*bias=*/true, Activation::kNone, DType::kBFloat16, 1);
  Config c{"cublas", Precision::kBf16, BiasMode::kFused};
  EXPECT_THAT(TestBackend("cublas")->Run(l->problem, c, {}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("cublas:bf16:fused")));
  Config u{"cublaslt", Precision::kBf16, BiasMode::kUnfused};
  EXPECT_THAT(TestBackend("cublaslt")->Run(l->problem, u, {}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("cublaslt:bf16:unfused")));
}

TEST(CudaBackends, WithoutDeviceAvailableAndRunAreFailedPreconditionWithReason) {
  LinearBackend* lt = TestBackend("cublaslt");
  ASSERT_NE(lt, nullptr);
  if (lt->Available().ok()) GTEST_SKIP() << "a CUDA device is present";
  auto l = MakeLayer(4, 3, 8, DType::kFloat32, WeightLayout::kOutIn, true, Activation::kNone,
                     DType::kFloat32, 3);
  for (const char* name : {"cublaslt", "cublas"}) {
    LinearBackend* b = TestBackend(name);
    const absl::Status available = b->Available();
    EXPECT_THAT(available,
                StatusIs(absl::StatusCode::kFailedPrecondition, StartsWith("no CUDA device: ")));
    std::printf("%s unavailable: %s\n", name, std::string(available.message()).c_str());
    const Config c = MakeConfig(b, Precision::kFp32, *l);
    auto r = b->Run(l->problem, c, {});
    EXPECT_THAT(r, StatusIs(absl::StatusCode::kFailedPrecondition));
    EXPECT_EQ(r.status().message(), available.message());
  }
}

TEST(CudaBackends, CublasFp8IsFailedPreconditionNamingTheMissingScalePointers) {
  LinearBackend* blas = TestBackend("cublas");
  ASSERT_NE(blas, nullptr);
  const Config c = Fp8Config("cublas", Precision::kFp8E4M3, false, Fp8Scaling::kTensor);
  EXPECT_THAT(blas->Supports(c, DType::kBFloat16),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("cublas:fp8e4m3:none@scaling=tensor"),
                             HasSubstr("cublasGemmEx takes no scale pointers"))));
  auto l = MakeExactFp8Layer(16, 16, 32, Precision::kFp8E4M3, false, DType::kBFloat16,
                             WeightLayout::kOutIn, false, Activation::kNone, DType::kBFloat16,
                             Fp8Scaling::kTensor, 1);
  EXPECT_THAT(blas->Run(l->problem, c, {}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("cublasGemmEx takes no scale pointers")));
}

TEST(CudaBackends, CublasltRefusesWhatItsFp8GemmLacksNamingTheRule) {
  LinearBackend* lt = TestBackend("cublaslt");
  ASSERT_NE(lt, nullptr);
  EXPECT_THAT(lt->Supports(Fp8Config("cublaslt", Precision::kFp8E5M2, false, Fp8Scaling::kTensor),
                           DType::kFloat32),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("cuBLASLt has no FP8 GEMM with both operands float8_e5m2")));
  // The dequantised reference of FP8 operands is the CPU's.
  Config fp64{"cublaslt", Precision::kFp64, BiasMode::kNone};
  EXPECT_THAT(
      lt->Supports(fp64, DType::kFloat8E4M3Fn),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("only under an fp8 precision")));
}

TEST(CudaBackends, Fp8OperandsWithoutScalesAreInvalidArgumentBeforeTheDevice) {
  auto l = MakeExactFp8Layer(16, 16, 32, Precision::kFp8E4M3, true, DType::kBFloat16,
                             WeightLayout::kOutIn, false, Activation::kNone, DType::kBFloat16,
                             Fp8Scaling::kTensor, 2);
  l->problem.input_scale = nullptr;
  EXPECT_THAT(TestBackend("cublaslt")
                  ->Run(l->problem,
                        Fp8Config("cublaslt", Precision::kFp8E4M3, false, Fp8Scaling::kTensor), {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("input_scale")));
}

TEST(CudaBackends, CublasMultiPassOtherThanBf16x9IsFailedPreconditionNamingCublaslt) {
  LinearBackend* blas = TestBackend("cublas");
  ASSERT_NE(blas, nullptr);
  for (Precision p : {Precision::kBf16x3, Precision::kBf16x6, Precision::kTf32x3}) {
    Config c;
    c.backend = "cublas";
    c.precision = p;
    c.bias = BiasMode::kUnfused;
    EXPECT_THAT(blas->Supports(c, DType::kFloat32),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         AllOf(HasSubstr(c.ToString()), HasSubstr("BF16x9 only"),
                               HasSubstr(absl::StrCat("cublaslt:", PrecisionName(p))))));
  }
}

TEST(CudaBackends, CublasltMultiPassIsFusedOrNoneAsEveryCublasltConfiguration) {
  LinearBackend* lt = TestBackend("cublaslt");
  ASSERT_NE(lt, nullptr);
  for (Precision p : kMultiPassPrecisions) {
    Config c;
    c.backend = "cublaslt";
    c.precision = p;
    for (BiasMode b : {BiasMode::kFused, BiasMode::kNone}) {
      c.bias = b;
      EXPECT_THAT(lt->Supports(c, DType::kFloat32), IsOk()) << c.ToString();
    }
    c.bias = BiasMode::kUnfused;
    EXPECT_THAT(lt->Supports(c, DType::kFloat32),
                StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("bias mode unfused")));
  }
}

TEST(CudaBackends, BothBackendsSelectAlgorithms) {
  for (const char* name : {"cublaslt", "cublas"}) {
    LinearBackend* b = TestBackend(name);
    ASSERT_NE(b, nullptr);
    EXPECT_TRUE(b->selects_algorithms()) << name;
    Config c{name, Precision::kFp32, b->default_bias_mode()};
    c.algo = 5;
    EXPECT_THAT(b->Supports(c, DType::kFloat32), IsOk()) << name;
  }
}

TEST(CudaStatusMapping, StickyErrorIsInternalWithMarkerAndApiName) {
  const absl::Status s =
      cuda::ToStatus(cudaErrorIllegalAddress, "cudaMemcpyAsync(dst, src, n, kind, stream)");
  EXPECT_THAT(
      s, StatusIs(absl::StatusCode::kInternal, StartsWith(std::string(kStickyCudaErrorPrefix))));
  EXPECT_TRUE(IsStickyCudaError(s));
  EXPECT_THAT(std::string(s.message()), HasSubstr("cudaMemcpyAsync"));
  EXPECT_THAT(std::string(s.message()), HasSubstr(cudaGetErrorString(cudaErrorIllegalAddress)));
  EXPECT_THAT(std::string(s.message()), ::testing::Not(HasSubstr("dst")));
  EXPECT_TRUE(
      IsStickyCudaError(cuda::ToStatus(cudaErrorLaunchFailure, "cudaStreamSynchronize(s)")));
}

TEST(CudaStatusMapping, AllocationFailuresAreResourceExhaustedAndNotSticky) {
  const absl::Status s = cuda::ToStatus(cudaErrorMemoryAllocation, "cudaMalloc(&p, n)");
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("cudaMalloc")));
  EXPECT_FALSE(IsStickyCudaError(s));
  EXPECT_THAT(cuda::ToStatus(CUBLAS_STATUS_ALLOC_FAILED, "cublasLtMatmul(h, ...)"),
              StatusIs(absl::StatusCode::kResourceExhausted));
}

TEST(CudaStatusMapping, CublasErrorsCarryTheLibraryString) {
  const absl::Status s = cuda::ToStatus(CUBLAS_STATUS_NOT_SUPPORTED, "cublasGemmEx(h, ...)");
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("cublasGemmEx")));
  EXPECT_THAT(std::string(s.message()),
              HasSubstr(cublasGetStatusString(CUBLAS_STATUS_NOT_SUPPORTED)));
  EXPECT_THAT(cuda::ToStatus(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul(h)"),
              StatusIs(absl::StatusCode::kInternal));
  EXPECT_TRUE(cuda::ToStatus(cudaSuccess, "x()").ok());
}

// ---------------------------------------------------------------- GPU tests

TEST_F(CudaGpuTest, GpuDeviceDescriptionIsFilled) {
  const DeviceDescription d = TestBackend("cublaslt")->device();
  EXPECT_FALSE(d.name.empty());
  EXPECT_THAT(d.compute_capability, ::testing::MatchesRegex("[0-9]+\\.[0-9]+"));
  EXPECT_GT(d.memory_bytes, 0);
  EXPECT_FALSE(d.driver_version.empty());
  std::printf("| device | %s | cc %s | %lld MiB | driver %s | runtime %s | %s |\n", d.name.c_str(),
              d.compute_capability.c_str(), static_cast<long long>(d.memory_bytes >> 20),
              d.driver_version.c_str(), d.runtime_version.c_str(), d.cublas_version.c_str());
}

TEST_F(CudaGpuTest, GpuEveryPrecisionBiasModeActivationWithinBound) {
  const DType storages[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kFloat64};
  const Activation acts[] = {Activation::kNone, Activation::kRelu, Activation::kGeluTanh};
  std::map<std::string, double> worst;  // config -> max error/bound
  std::vector<std::string> unsupported;
  uint32_t seed = 100;
  for (const char* name : {"cublaslt", "cublas"}) {
    LinearBackend* backend = TestBackend(name);
    for (Precision p : backend->precisions()) {
      if (IsFp8(p)) continue;  // GpuFp8*: their layers must fit cuBLASLt's FP8 rules
      for (DType storage : storages) {
        for (DType out : {storage, DType::kFloat32}) {
          if (out == DType::kFloat32 && storage == DType::kFloat32) continue;
          for (bool bias : {false, true}) {
            for (Activation act : acts) {
              const WeightLayout layout =
                  (seed % 2 == 0) ? WeightLayout::kOutIn : WeightLayout::kInOut;
              auto l = MakeLayer(24, 40, 64, storage, layout, bias, act, out, ++seed,
                                 /*lead=*/2);
              const Config c = MakeConfig(backend, p, *l);
              const std::string what = absl::StrCat(
                  c.ToString(), " storage=", DTypeShortName(storage), " out=", DTypeShortName(out),
                  " act=", ActivationName(act), " layout=", WeightLayoutName(layout));
              SCOPED_TRACE(what);
              auto r = backend->Run(l->problem, c, {});
              if (IsNoKernel(r.status())) {
                unsupported.push_back(what);
                // PyTorch relies on these epilogues; only fp64, fp16acc and
                // the pedantic fp32 path may lack them.
                // tf32rna and tf32trunc round on the device, then run that
                // same pedantic fp32 path.
                const bool pedantic_fp32 =
                    p == Precision::kFp32 || p == Precision::kTf32Rna || p == Precision::kTf32Trunc;
                const bool may_lack =
                    p == Precision::kFp64 || p == Precision::kFp16Acc ||
                    (pedantic_fp32 && !(storage == DType::kBFloat16 || storage == DType::kFloat16));
                EXPECT_TRUE(may_lack) << r.status();
                continue;
              }
              ASSERT_THAT(r, IsOk());
              ASSERT_EQ(r->output.dtype(), out);
              ASSERT_EQ(r->output.numel(), 24 * 40);
              const Reference ref = ComputeReference(*l);
              int violations = 0;
              double& ratio = worst[c.ToString()];
              for (size_t e = 0; e < ref.y.size(); ++e) {
                const double got = At(r->output, e);
                const double bound = Bound(p, storage, out, 64, act, ref, e);
                const double err = std::fabs(got - ref.y[e]);
                if (!(err <= bound)) {
                  if (++violations <= 3) {
                    ADD_FAILURE() << "element " << e << ": got " << got << ", fp64 " << ref.y[e]
                                  << ", error " << err << " > bound " << bound;
                  }
                }
                ratio = std::max(ratio, err / bound);
              }
              EXPECT_EQ(violations, 0);
            }
          }
        }
      }
    }
  }
  std::printf("| configuration | max error / bound |\n");
  for (const auto& [config, r] : worst) std::printf("| %s | %.3g |\n", config.c_str(), r);
  for (const std::string& u : unsupported) std::printf("no cuBLASLt algorithm: %s\n", u.c_str());
}

TEST_F(CudaGpuTest, GpuBf16FusedVsUnfusedDifferByAtMostOneUlp) {
  // The candle case in small: acc ~ 0.5, bias ~ 0.02 except every 16th
  // column, where it is 2..3 (outputs at 2..4, where a bf16 ULP is 2^-6).
  const int64_t m = 128, n = 256, k = 1024;
  std::mt19937 rng(7);
  auto l = std::make_unique<Layer>();
  l->x = *FromDoubles(DType::kBFloat16, {m, k}, Uniform(m * k, 0, 1, &rng));
  l->w = *FromDoubles(DType::kBFloat16, {n, k}, Uniform(n * k, 0, 2.0 / k, &rng));
  std::vector<double> b(n);
  for (int64_t j = 0; j < n; ++j) {
    b[j] = j % 16 == 0 ? Uniform(1, 2, 3, &rng)[0] : Uniform(1, 0, 0.04, &rng)[0];
  }
  l->b = *FromDoubles(DType::kBFloat16, {n}, b);
  l->has_bias = true;
  l->problem = LinearProblem{
      {m, n, k, WeightLayout::kOutIn, Activation::kNone, DType::kBFloat16}, &l->x, &l->w, &l->b};
  auto fused = TestBackend("cublaslt")
                   ->Run(l->problem, {"cublaslt", Precision::kBf16, BiasMode::kFused}, {});
  auto unfused =
      TestBackend("cublas")->Run(l->problem, {"cublas", Precision::kBf16, BiasMode::kUnfused}, {});
  ASSERT_THAT(fused, IsOk());
  ASSERT_THAT(unfused, IsOk());
  const Agreement g = Compare(fused->output, unfused->output);
  int64_t mism_large = 0, mism_small = 0;
  double max_abs = 0;
  int64_t max_col = -1;
  for (int64_t e = 0; e < m * n; ++e) {
    const double d = std::fabs(At(fused->output, e) - At(unfused->output, e));
    if (d > 0) ((e % n) % 16 == 0 ? mism_large : mism_small)++;
    if (d > max_abs) {
      max_abs = d;
      max_col = e % n;
    }
  }
  std::printf(
      "| cublaslt:bf16:fused vs cublas:bf16:unfused | differing %.2f%% | max "
      "ulp %llu |"
      " max abs %g (column %lld) | differing share in large-bias columns "
      "%.2f%%,"
      " elsewhere %.2f%% |\n",
      100 * (1 - g.bitwise_share), static_cast<unsigned long long>(g.max_ulp), max_abs,
      static_cast<long long>(max_col), 100.0 * mism_large / (m * (n / 16)),
      100.0 * mism_small / (m * (n - n / 16)));
  EXPECT_LE(g.max_ulp, 1u);
  EXPECT_GT(1 - g.bitwise_share, 0.001) << "fused and unfused should be told apart";
  // At magnitudes 2..4 one bf16 ULP is 2^-6 = 0.015625: the largest
  // differences sit in the large-bias columns.
  EXPECT_EQ(max_abs, 0.015625);
  EXPECT_EQ(max_col % 16, 0);
}

TEST_F(CudaGpuTest, GpuCpuEmulationAgreementPerMode) {
  struct Row {
    Precision p;
    DType storage;
  };
  const Row rows[] = {
      {Precision::kFp64, DType::kFloat64},      {Precision::kFp32, DType::kFloat32},
      {Precision::kTf32, DType::kFloat32},      {Precision::kTf32Rna, DType::kFloat32},
      {Precision::kTf32Trunc, DType::kFloat32}, {Precision::kBf16, DType::kBFloat16},
      {Precision::kBf16, DType::kFloat32},      {Precision::kFp16, DType::kFloat16},
      {Precision::kFp16Acc, DType::kFloat16}};
  std::printf(
      "| gpu configuration | storage | cpu configuration | bitwise equal | max "
      "ulp | mean ulp |\n");
  std::printf("|---|---|---|---|---|---|\n");
  uint32_t seed = 900;
  for (const char* name : {"cublaslt", "cublas"}) {
    LinearBackend* backend = TestBackend(name);
    for (const Row& row : rows) {
      for (Activation act : {Activation::kNone, Activation::kGeluTanh}) {
        auto l = MakeLayer(64, 96, 256, row.storage, WeightLayout::kOutIn, true, act, row.storage,
                           ++seed);
        const Config c = MakeConfig(backend, row.p, *l);
        Config cpu_c = c;
        cpu_c.backend = "cpu";
        SCOPED_TRACE(c.ToString());
        auto g = backend->Run(l->problem, c, {});
        if (IsNoKernel(g.status())) {
          std::printf("| %s | %s | - | no cuBLASLt algorithm | | |\n", c.ToString().c_str(),
                      std::string(DTypeShortName(row.storage)).c_str());
          continue;
        }
        ASSERT_THAT(g, IsOk());
        auto cpu = TestCpuBackend()->Run(l->problem, cpu_c, {});
        ASSERT_THAT(cpu, IsOk());
        const Agreement a = Compare(g->output, cpu->output);
        std::printf("| %s%s | %s | %s | %.2f%% | %llu | %.3g |\n", c.ToString().c_str(),
                    act == Activation::kGeluTanh ? " +gelu" : "",
                    std::string(DTypeShortName(row.storage)).c_str(), cpu_c.ToString().c_str(),
                    100 * a.bitwise_share, static_cast<unsigned long long>(a.max_ulp), a.mean_ulp);
        // Both sides are within the bound of the fp64 reference.
        const Reference ref = ComputeReference(*l);
        for (size_t e = 0; e < ref.y.size(); ++e) {
          const double d = std::fabs(At(g->output, e) - At(cpu->output, e));
          ASSERT_LE(d, 2 * Bound(row.p, row.storage, row.storage, 256, act, ref, e))
              << "element " << e;
        }
      }
    }
  }
}

// The multi-pass precisions on cuBLASLt against the CPU emulation, where
// every partial GEMM is exact (k = 1: one product of two bf16 or TF32
// parts, exact in fp32, whatever the kernel): the split, the set of
// products, the order of the partial sums, the NaN guard and the epilogue
// are then the only things that decide the bits, and they must be the
// CPU's, bit for bit.
TEST_F(CudaGpuTest, GpuMultiPassMatchesTheCpuBitwiseWhereEveryPartialIsExact) {
  std::printf("| configuration | layout | bias | out | bitwise equal | max ulp |\n");
  std::printf("|---|---|---|---|---|---|\n");
  uint32_t seed = 1500;
  LinearBackend* lt = TestBackend("cublaslt");
  for (Precision p : kMultiPassPrecisions) {
    for (WeightLayout layout : {WeightLayout::kOutIn, WeightLayout::kInOut}) {
      for (bool bias : {false, true}) {
        for (DType out : {DType::kFloat32, DType::kBFloat16}) {
          const Activation act = bias ? Activation::kRelu : Activation::kNone;
          auto l = MakeLayer(64, 96, 1, DType::kFloat32, layout, bias, act, out, ++seed);
          const Config c = MakeConfig(lt, p, *l);
          Config cpu_c = c;
          cpu_c.backend = "cpu";
          SCOPED_TRACE(absl::StrCat(c.ToString(), " ", WeightLayoutName(layout), " out ",
                                    DTypeShortName(out)));
          auto g = lt->Run(l->problem, c, {});
          ASSERT_THAT(g, IsOk());
          auto cpu = TestCpuBackend()->Run(l->problem, cpu_c, {});
          ASSERT_THAT(cpu, IsOk());
          ASSERT_EQ(g->output.dtype(), out);
          const Agreement a = Compare(g->output, cpu->output);
          std::printf("| %s | %s | %s | %s | %.2f%% | %llu |\n", c.ToString().c_str(),
                      std::string(WeightLayoutName(layout)).c_str(), bias ? "fp32" : "-",
                      std::string(DTypeShortName(out)).c_str(), 100 * a.bitwise_share,
                      static_cast<unsigned long long>(a.max_ulp));
          EXPECT_EQ(a.max_ulp, 0u);
          EXPECT_EQ(g->details["partial_sum_order"], cpu->details["partial_sum_order"]);
        }
      }
    }
  }
}

// XLA's guard: an infinite input makes the low parts NaN, and the sum
// before high x high has its NaNs zeroed, so y = x * w = +inf, not NaN
// (docs/numerics.md, "Multi-pass precisions").
TEST_F(CudaGpuTest, GpuMultiPassAnInfiniteInputGivesAnInfiniteOutputNotNaN) {
  for (Precision p : kMultiPassPrecisions) {
    auto l = MakeLayer(1, 1, 1, DType::kFloat32, WeightLayout::kOutIn, false, Activation::kNone,
                       DType::kFloat32, 1600);
    l->x.data<float>()[0] = std::numeric_limits<float>::infinity();
    l->w.data<float>()[0] = 1.5f;
    const Config c = MakeConfig(TestBackend("cublaslt"), p, *l);
    auto g = TestBackend("cublaslt")->Run(l->problem, c, {});
    ASSERT_THAT(g, IsOk());
    EXPECT_EQ(g->output.data<float>()[0], std::numeric_limits<float>::infinity()) << c.ToString();
  }
}

// Random layers, where the partial GEMMs round: the device's passes and the
// CPU's (another order inside each partial GEMM) both within the bound of
// the fp64 reference; the table is what the GPU validation records.
TEST_F(CudaGpuTest, GpuMultiPassRandomLayersAgainstTheCpuWithinTheBound) {
  std::printf("| configuration | storage | bitwise equal to cpu | max ulp | mean ulp |\n");
  std::printf("|---|---|---|---|---|\n");
  uint32_t seed = 1700;
  LinearBackend* lt = TestBackend("cublaslt");
  for (Precision p : kMultiPassPrecisions) {
    for (DType storage : {DType::kFloat32, DType::kBFloat16}) {
      for (Activation act : {Activation::kNone, Activation::kGeluTanh}) {
        auto l = MakeLayer(64, 96, 256, storage, WeightLayout::kOutIn, true, act, storage, ++seed);
        const Config c = MakeConfig(lt, p, *l);
        Config cpu_c = c;
        cpu_c.backend = "cpu";
        SCOPED_TRACE(c.ToString());
        auto g = lt->Run(l->problem, c, {});
        ASSERT_THAT(g, IsOk());
        auto cpu = TestCpuBackend()->Run(l->problem, cpu_c, {});
        ASSERT_THAT(cpu, IsOk());
        const Agreement a = Compare(g->output, cpu->output);
        std::printf("| %s%s | %s | %.2f%% | %llu | %.3g |\n", c.ToString().c_str(),
                    act == Activation::kGeluTanh ? " +gelu" : "",
                    std::string(DTypeShortName(storage)).c_str(), 100 * a.bitwise_share,
                    static_cast<unsigned long long>(a.max_ulp), a.mean_ulp);
        const Reference ref = ComputeReference(*l);
        for (size_t e = 0; e < ref.y.size(); ++e) {
          const double d = std::fabs(At(g->output, e) - At(cpu->output, e));
          ASSERT_LE(d, 2 * Bound(p, storage, storage, 256, act, ref, e)) << "element " << e;
        }
      }
    }
  }
}

// cuBLAS's own BF16x9 (CUBLAS_COMPUTE_32F_EMULATED_16BFX9): before Blackwell
// refused naming the rule; from compute capability 10.0 within bf16x9's
// bound of the fp64 reference (its split and order are cuBLAS's, so no bits
// are expected), and how often it equals XLA's order (cublaslt:bf16x9) and
// strict fp32 is printed for the GPU validation.
TEST_F(CudaGpuTest, GpuCublasBf16x9IsEmulatedFromBlackwellAndRefusedBefore) {
  LinearBackend* blas = TestBackend("cublas");
  const std::vector<Precision> listed = blas->precisions();
  const bool blackwell = std::stod(blas->device().compute_capability) >= 10.0;
  EXPECT_EQ(std::find(listed.begin(), listed.end(), Precision::kBf16x9) != listed.end(), blackwell);
  if (!blackwell) {
    auto l = MakeLayer(8, 16, 32, DType::kFloat32, WeightLayout::kOutIn, false, Activation::kNone,
                       DType::kFloat32, 1799);
    EXPECT_THAT(blas->Run(l->problem, MakeConfig(blas, Precision::kBf16x9, *l), {}).status(),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         AllOf(HasSubstr("compute capability 10.0 or later"),
                               HasSubstr("cublaslt:bf16x9"))));
    return;
  }
  auto l = MakeLayer(64, 96, 256, DType::kFloat32, WeightLayout::kOutIn, true, Activation::kNone,
                     DType::kFloat32, 1800);
  const Config c = MakeConfig(blas, Precision::kBf16x9, *l);
  auto g = blas->Run(l->problem, c, {});
  ASSERT_THAT(g, IsOk());
  EXPECT_EQ(g->details["compute_type"], "CUBLAS_COMPUTE_32F_EMULATED_16BFX9");
  EXPECT_EQ(g->details["emulation_strategy"], "CUBLAS_EMULATION_STRATEGY_EAGER");
  const Reference ref = ComputeReference(*l);
  for (size_t e = 0; e < ref.y.size(); ++e) {
    ASSERT_LE(
        std::fabs(At(g->output, e) - ref.y[e]),
        Bound(Precision::kBf16x9, DType::kFloat32, DType::kFloat32, 256, Activation::kNone, ref, e))
        << "element " << e;
  }
  auto xla = TestBackend("cublaslt")
                 ->Run(l->problem, MakeConfig(TestBackend("cublaslt"), Precision::kBf16x9, *l), {});
  ASSERT_THAT(xla, IsOk());
  auto fp32 = blas->Run(l->problem, MakeConfig(blas, Precision::kFp32, *l), {});
  ASSERT_THAT(fp32, IsOk());
  std::printf(
      "cublas:bf16x9 equal to cublaslt:bf16x9 (XLA's order): %.2f%%, to cublas:fp32: %.2f%%\n",
      100 * Compare(g->output, xla->output).bitwise_share,
      100 * Compare(g->output, fp32->output).bitwise_share);
}

// Which TF32 input rounding does cuBLAS use? Inputs are chosen so that
// every partial sum is exact in fp32 (multiples of 2^-10 below 2^8): the
// output then depends only on how each operand was rounded to TF32, not on
// the summation order, and exactly one CPU rounding mode can match it.
TEST_F(CudaGpuTest, GpuTf32InputRoundingThatMatchesCublas) {
  const int64_t m = 96, n = 80, k = 16;
  std::mt19937 rng(11);
  // A value in [1, 2) with random low 13 bits; a third are exact ties
  // (low 13 bits 0x1000), where nearest-even and ties-away differ.
  auto probe = [&rng]() {
    uint32_t bits = 0x3f800000u | (rng() & 0x7fffffu);
    if (rng() % 3 == 0) bits = (bits & ~0x1fffu) | 0x1000u;
    return static_cast<double>(BitsToFloat(bits));
  };
  std::uniform_int_distribution<int> small(-3, 3);
  std::printf(
      "| backend | operand probed | cpu:tf32 (nearest-even) | cpu:tf32rna "
      "(ties away) |"
      " cpu:tf32trunc (truncate) | best |\n|---|---|---|---|---|---|\n");
  for (const char* name : {"cublaslt", "cublas"}) {
    for (const char* operand : {"input", "weight"}) {
      const bool probe_x = std::strcmp(operand, "input") == 0;
      std::vector<double> x(m * k), w(n * k);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t kk = 0; kk < k; ++kk) {
          x[i * k + kk] = kk == 0 ? (probe_x ? probe() : 1.5) : kk == 1 ? 1.0 : small(rng);
        }
      }
      for (int64_t j = 0; j < n; ++j) {
        for (int64_t kk = 0; kk < k; ++kk) {
          w[j * k + kk] = kk == 0 ? 1.0 : kk == 1 ? (probe_x ? 1.25 : probe()) : small(rng);
        }
      }
      auto l = std::make_unique<Layer>();
      l->x = *FromDoubles(DType::kFloat32, {m, k}, x);
      l->w = *FromDoubles(DType::kFloat32, {n, k}, w);
      l->problem = LinearProblem{
          {m, n, k, WeightLayout::kOutIn, Activation::kNone, DType::kFloat32}, &l->x, &l->w};
      auto gpu = TestBackend(name)->Run(l->problem, {name, Precision::kTf32, BiasMode::kNone}, {});
      ASSERT_THAT(gpu, IsOk());
      double best = -1;
      std::string best_mode;
      std::string cells;
      for (Precision p : {Precision::kTf32, Precision::kTf32Rna, Precision::kTf32Trunc}) {
        auto cpu = TestCpuBackend()->Run(l->problem, {"cpu", p, BiasMode::kNone}, {});
        ASSERT_THAT(cpu, IsOk());
        const Agreement a = Compare(gpu->output, cpu->output);
        char cell[96];
        std::snprintf(cell, sizeof(cell), " %.2f%% bitwise, max %llu ulp |", 100 * a.bitwise_share,
                      static_cast<unsigned long long>(a.max_ulp));
        cells += cell;
        if (a.bitwise_share > best) {
          best = a.bitwise_share;
          best_mode = std::string(PrecisionName(p));
        }
      }
      std::printf("| %s | %s |%s %s |\n", name, operand, cells.c_str(), best_mode.c_str());
      std::printf(
          "TF32 rounding of %s's %s operand: best match cpu:%s (%.2f%% "
          "bitwise)\n",
          name, operand, best_mode.c_str(), 100 * best);
      // The sums are exact, so the right mode matches every element.
      EXPECT_EQ(best, 1.0) << "no CPU TF32 rounding reproduces " << name
                           << " exactly; see the table";
    }
  }
}

// The device kernels round once, to nearest even, from the exact value:
// with k = 1 and a weight of 1 the layer's output is the rounded input (or
// the rounded output), compared bit for bit with the host's rounding. The
// values include exact ties and near-ties a double rounding through fp32
// would get wrong.
TEST_F(CudaGpuTest, GpuDeviceRoundingIsSingleNearestEven) {
  std::mt19937_64 rng(5);
  std::vector<double> v;
  std::uniform_real_distribution<double> d(-4, 4);
  for (int i = 0; i < 256; ++i) v.push_back(d(rng));
  for (int i = 0; i < 64; ++i) {
    // Midpoints between neighbouring bf16 (7-bit) and fp16 (10-bit)
    // values, exactly and 2^-30 relative above and below.
    for (int bits : {7, 10}) {
      const double lo = std::ldexp(std::floor(std::ldexp(1 + d(rng) / 8, bits)), -bits);
      const double mid = lo + std::ldexp(1.0, -bits - 1);
      for (double x : {mid, mid * (1 + 0x1p-30), mid * (1 - 0x1p-30)}) {
        v.push_back(x);
        v.push_back(-x);
      }
    }
  }
  // (No -0.0: the GEMM's +0 accumulator would turn it into +0.)
  for (double x : {0.0, 3e-6, 5.960464477539063e-08, 70000.0, 1e-40, 65519.99}) {
    v.push_back(x);
  }
  const int64_t m = static_cast<int64_t>(v.size()), n = 8;
  auto l = std::make_unique<Layer>();
  l->x = *FromDoubles(DType::kFloat64, {m, 1}, v);
  l->w = *FromDoubles(DType::kFloat64, {n, 1}, std::vector<double>(n, 1.0));
  struct Case {
    Precision p;
    DType out;
    const char* what;
  };
  const Case cases[] = {{Precision::kBf16, DType::kFloat32, "input fp64->bf16"},
                        {Precision::kFp16, DType::kFloat32, "input fp64->fp16"},
                        {Precision::kFp32, DType::kFloat32, "input fp64->fp32"},
                        {Precision::kFp64, DType::kBFloat16, "output fp64->bf16"},
                        {Precision::kFp64, DType::kFloat16, "output fp64->fp16"}};
  for (const char* name : {"cublaslt", "cublas"}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(absl::StrCat(name, " ", c.what));
      l->problem =
          LinearProblem{{m, n, 1, WeightLayout::kOutIn, Activation::kNone, c.out}, &l->x, &l->w};
      auto r = TestBackend(name)->Run(l->problem, {name, c.p, BiasMode::kNone}, {});
      ASSERT_THAT(r, IsOk());
      int wrong = 0;
      for (int64_t i = 0; i < m; ++i) {
        const double x = v[static_cast<size_t>(i)];
        double want = 0;
        if (c.p == Precision::kBf16 || c.out == DType::kBFloat16) {
          want = Bf16BitsToFloat(DoubleToBf16Bits(x));
        } else if (c.p == Precision::kFp16 || c.out == DType::kFloat16) {
          want = Fp16BitsToFloat(DoubleToFp16Bits(x));
        } else {
          want = static_cast<float>(x);
        }
        for (int64_t j = 0; j < n; ++j) {
          const double got = At(r->output, static_cast<size_t>(i * n + j));
          if (std::memcmp(&got, &want, sizeof(got)) != 0 && ++wrong <= 3) {
            ADD_FAILURE() << std::hexfloat << "x = " << x << ": got " << got << ", want " << want;
          }
        }
      }
      EXPECT_EQ(wrong, 0);
    }
  }
}

TEST_F(CudaGpuTest, GpuRepeatedRunsAreBitwiseDeterministic) {
  for (const char* name : {"cublaslt", "cublas"}) {
    for (Precision p : {Precision::kBf16, Precision::kTf32, Precision::kFp32}) {
      const DType storage = p == Precision::kBf16 ? DType::kBFloat16 : DType::kFloat32;
      auto l = MakeLayer(512, 384, 2048, storage, WeightLayout::kOutIn, true, Activation::kGeluTanh,
                         storage, 31);
      const Config c = MakeConfig(TestBackend(name), p, *l);
      SCOPED_TRACE(c.ToString());
      for (bool disallow : {false, true}) {
        RunOptions o;
        o.repeat = 5;
        o.disallow_reduced_precision_reduction = disallow;
        auto many = TestBackend(name)->Run(l->problem, c, o);
        if (IsNoKernel(many.status())) {
          std::printf("no cuBLASLt algorithm: %s\n", c.ToString().c_str());
          continue;
        }
        ASSERT_THAT(many, IsOk());
        EXPECT_EQ(many->runs, 5);
        EXPECT_TRUE(many->deterministic);
        RunOptions once;
        once.disallow_reduced_precision_reduction = disallow;
        auto one = TestBackend(name)->Run(l->problem, c, once);
        ASSERT_THAT(one, IsOk());
        EXPECT_EQ(one->runs, 1);
        EXPECT_EQ(many->output.bytes(), one->output.bytes());
        std::printf(
            "| %s | repeat 5 | deterministic %s | disallow reduced-precision "
            "reduction %s |"
            " algo %s |\n",
            c.ToString().c_str(), many->deterministic ? "yes" : "NO", disallow ? "yes" : "no",
            many->details.count("algo") ? many->details.at("algo").c_str() : "?");
      }
    }
  }
}

// ---------------------------------------------------------------- FP8

// cuBLASLt's FP8 GEMM against the CPU backend, the specification of its
// numbers. docs/numerics.md ("What an fp8 configuration computes") claims
// the split accumulator's emulation is exact "but for the summation
// order": so bitwise agreement is asserted only on layers whose sums are
// exact in fp32 in any order (MakeExactFp8Layer), with power-of-two scales
// (exact in either order of the scale products) and the bias and ReLU in
// the epilogue, which round once either way.
TEST_F(CudaGpuTest, GpuFp8SplitAccumulatorMatchesTheCpuBitwiseWhereSumsAreExact) {
  std::printf("| configuration | operands | layout | bias | out | bitwise equal | max ulp |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  uint32_t seed = 1200;
  std::vector<std::string> no_kernel;
  for (Precision p : {Precision::kFp8E4M3, Precision::kFp8E4M3E5M2, Precision::kFp8E5M2E4M3}) {
    for (Fp8Scaling scaling : {Fp8Scaling::kTensor, Fp8Scaling::kRow}) {
      for (bool fp8 : {false, true}) {
        if (fp8 && p != Precision::kFp8E4M3) continue;
        for (WeightLayout layout : {WeightLayout::kOutIn, WeightLayout::kInOut}) {
          for (bool bias : {false, true}) {
            for (DType out : {DType::kBFloat16, DType::kFloat32}) {
              const Activation act = bias ? Activation::kRelu : Activation::kNone;
              const Config c = Fp8Config("cublaslt", p, bias, scaling);
              auto l = MakeExactFp8Layer(48, 64, 96, p, fp8, DType::kBFloat16, layout, bias, act,
                                         out, scaling, ++seed);
              if (!DeviceRunsFp8(c, l->x.dtype())) continue;
              Config cpu_c = c;
              cpu_c.backend = "cpu";
              SCOPED_TRACE(absl::StrCat(c.ToString(), fp8 ? " fp8 operands" : " bf16 operands", " ",
                                        WeightLayoutName(layout), " out ", DTypeShortName(out)));
              auto g = TestBackend("cublaslt")->Run(l->problem, c, {});
              // Whether sm_90 has a kernel for each of these (row-wise with a
              // bias epilogue, RELU_BIAS with an fp32 output) is what the run
              // finds out: listed, not failed, and the loop goes on.
              if (IsNoKernel(g.status())) {
                no_kernel.push_back(absl::StrCat(c.ToString(), " ", WeightLayoutName(layout),
                                                 " out ", DTypeShortName(out)));
                continue;
              }
              EXPECT_THAT(g, IsOk());
              if (!g.ok()) continue;
              auto cpu = TestCpuBackend()->Run(l->problem, cpu_c, {});
              ASSERT_THAT(cpu, IsOk());
              ASSERT_EQ(g->output.dtype(), out);
              const Agreement a = Compare(g->output, cpu->output);
              std::printf("| %s | %s | %s | %s | %s | %.2f%% | %llu |\n", c.ToString().c_str(),
                          fp8 ? "fp8 + scales" : "bf16, quantised",
                          std::string(WeightLayoutName(layout)).c_str(), bias ? "bf16" : "-",
                          std::string(DTypeShortName(out)).c_str(), 100 * a.bitwise_share,
                          static_cast<unsigned long long>(a.max_ulp));
              EXPECT_EQ(a.max_ulp, 0u);
              EXPECT_EQ(g->details["fp8_scaling"], Fp8ScalingName(scaling));
              EXPECT_EQ(g->details["fast_accum"], "false");
              EXPECT_EQ(g->details["a_scale_mode"],
                        scaling == Fp8Scaling::kRow ? "CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F"
                                                    : "CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F");
            }
          }
        }
      }
    }
  }
  for (const std::string& what : no_kernel) std::printf("no cuBLASLt kernel: %s\n", what.c_str());
}

// Random layers, where the sums round: the split accumulator within the
// bound of an fp32 sum of k exact products, and fast accumulation
// (CUBLASLT_MATMUL_DESC_FAST_ACCUM) against the CPU's parametrised model
// (FastAccumModel), within a loose tolerance; the tables are what the GPU
// validation fits the model with (docs/gpu-validation.md).
TEST_F(CudaGpuTest, GpuFp8RandomLayersAgainstTheCpuWithinTolerance) {
  std::printf(
      "| configuration | bias | bitwise equal | max ulp | mean ulp | max |gpu-cpu| / "
      "sum|x w| |\n");
  std::printf("|---|---|---|---|---|---|\n");
  uint32_t seed = 1300;
  const int64_t m = 64, n = 128, k = 1024;
  for (bool fast : {false, true}) {
    for (Fp8Scaling scaling : {Fp8Scaling::kTensor, Fp8Scaling::kRow}) {
      for (bool bias : {false, true}) {
        const Config c = Fp8Config("cublaslt", Precision::kFp8E4M3, bias, scaling, fast);
        if (!DeviceRunsFp8(c, DType::kBFloat16)) continue;
        auto l = MakeLayer(m, n, k, DType::kBFloat16, WeightLayout::kOutIn, bias, Activation::kNone,
                           DType::kBFloat16, ++seed);
        Config cpu_c = c;
        cpu_c.backend = "cpu";
        SCOPED_TRACE(c.ToString());
        auto g = TestBackend("cublaslt")->Run(l->problem, c, {});
        ASSERT_THAT(g, IsOk());
        auto cpu = TestCpuBackend()->Run(l->problem, cpu_c, {});
        ASSERT_THAT(cpu, IsOk());
        const Reference ref = ComputeReference(*l);
        const Agreement a = Compare(g->output, cpu->output);
        double worst = 0;
        for (size_t e = 0; e < ref.y.size(); ++e) {
          const double d = std::fabs(At(g->output, e) - At(cpu->output, e));
          // Quantisation moves sum|x w| by at most 2 * 2^-4 of it.
          const double mags = 1.25 * ref.abs_dot[e];
          worst = std::max(worst, d / mags);
          // Split: k fp32 roundings; fast: the model's 13 fraction bits
          // against the hardware's, whichever it keeps, with room. Both
          // plus one bf16 rounding of the output each.
          const double tol = (fast ? 0x1p-9 : static_cast<double>(k) * 0x1p-24) * mags +
                             2 * 0x1p-8 * std::fabs(At(cpu->output, e));
          EXPECT_LE(d, tol) << "element " << e;
        }
        std::printf("| %s | %s | %.2f%% | %llu | %.3g | %.3g |\n", c.ToString().c_str(),
                    bias ? "bf16" : "-", 100 * a.bitwise_share,
                    static_cast<unsigned long long>(a.max_ulp), a.mean_ulp, worst);
        EXPECT_EQ(g->details["fast_accum"], fast ? "true" : "false");
      }
    }
  }
}

// ---------------------------------------------------------------- algo=N

TEST_F(CudaGpuTest, GpuAlgorithmsListWhatAlgoNRunsAndAlgo0IsTheDefault) {
  const std::vector<std::string> lt_keys = {"algo",
                                            "algo_tile",
                                            "algo_stages",
                                            "algo_splitk",
                                            "algo_reduction_scheme",
                                            "algo_custom_option",
                                            "algo_workspace_bytes",
                                            "workspace_limit_bytes",
                                            "waves_count"};
  const std::vector<std::string> blas_keys = {"algo", "algo_name"};
  // The whole kernel a detail map names: many heuristic entries share an
  // algorithm id and differ in tile, stages, split-K or the rest.
  auto tuple = [&](const std::map<std::string, std::string>& d, const char* backend) {
    std::string t;
    for (const std::string& key : backend == std::string("cublaslt") ? lt_keys : blas_keys) {
      if (key == "workspace_limit_bytes" || key == "waves_count") continue;
      auto it = d.find(key);
      absl::StrAppend(&t, key, "=", it == d.end() ? "?" : it->second, " ");
    }
    return t;
  };
  for (const char* name : {"cublaslt", "cublas"}) {
    LinearBackend* b = TestBackend(name);
    auto l = MakeLayer(96, 128, 256, DType::kBFloat16, WeightLayout::kOutIn, true,
                       Activation::kNone, DType::kBFloat16, 77);
    const Config c = MakeConfig(b, Precision::kBf16, *l);
    SCOPED_TRACE(c.ToString());
    auto algos = b->Algorithms(l->problem, c, {}, 8);
    ASSERT_THAT(algos, IsOk());
    // At least two distinct kernels, or "entry N is what algo=N runs"
    // below could not tell one entry from another.
    ASSERT_GE(algos->size(), 2u);
    ASSERT_LE(algos->size(), 8u);
    std::set<std::string> distinct;
    for (const AlgorithmInfo& a : *algos) distinct.insert(tuple(a.details, name));
    EXPECT_GE(distinct.size(), 2u) << "every listed algorithm is the same kernel";
    for (size_t i = 0; i < algos->size(); ++i) {
      const AlgorithmInfo& a = (*algos)[i];
      EXPECT_EQ(a.index, static_cast<int>(i));
      for (const std::string& key : name == std::string("cublaslt") ? lt_keys : blas_keys) {
        EXPECT_EQ(a.details.count(key), 1u) << "algorithm " << i << " lacks " << key;
      }
      std::printf(
          "| %s | algo=%zu | algo %s | tile %s | splitk %s | workspace %s |\n",
          c.ToString().c_str(), i, a.details.count("algo") ? a.details.at("algo").c_str() : "?",
          a.details.count("algo_tile") ? a.details.at("algo_tile").c_str() : "-",
          a.details.count("algo_splitk") ? a.details.at("algo_splitk").c_str() : "-",
          a.details.count("algo_workspace_bytes") ? a.details.at("algo_workspace_bytes").c_str()
                                                  : "-");
    }
    // No algo and algo=0: the same algorithm, the same bits.
    auto plain = b->Run(l->problem, c, {});
    ASSERT_THAT(plain, IsOk());
    Config zero = c;
    zero.algo = 0;
    auto first = b->Run(l->problem, zero, {});
    ASSERT_THAT(first, IsOk());
    EXPECT_EQ(plain->output.bytes(), first->output.bytes());
    EXPECT_EQ(plain->details["algo_index"], "0");
    EXPECT_EQ(tuple(first->details, name), tuple((*algos)[0].details, name));
    EXPECT_EQ(tuple(plain->details, name), tuple((*algos)[0].details, name));
    // Entry N is what algo=N runs.
    const Reference ref = ComputeReference(*l);
    for (size_t i = 1; i < std::min<size_t>(algos->size(), 4); ++i) {
      Config ci = c;
      ci.algo = static_cast<int>(i);
      auto r = b->Run(l->problem, ci, {});
      ASSERT_THAT(r, IsOk()) << "algo=" << i;
      EXPECT_EQ(r->details["algo_index"], absl::StrCat(i));
      EXPECT_EQ(tuple(r->details, name), tuple((*algos)[i].details, name));
      for (size_t e = 0; e < ref.y.size(); ++e) {
        ASSERT_LE(std::fabs(At(r->output, e) - ref.y[e]),
                  Bound(Precision::kBf16, DType::kBFloat16, DType::kBFloat16, 256,
                        Activation::kNone, ref, e))
            << "algo=" << i << " element " << e;
      }
    }
    // Past the list: FAILED_PRECONDITION naming how many there are.
    Config past = c;
    past.algo = name == std::string("cublaslt") ? kMaxAlgorithmIndex : 25;
    EXPECT_THAT(b->Run(l->problem, past, {}),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         AllOf(HasSubstr("offers only"), HasSubstr("is out of range"))));
  }
}

TEST_F(CudaGpuTest, GpuFp8AlgorithmsAreListedForTheFp8Descriptors) {
  const Config c = Fp8Config("cublaslt", Precision::kFp8E4M3, true, Fp8Scaling::kTensor);
  if (!DeviceRunsFp8(c, DType::kBFloat16)) GTEST_SKIP() << "no FP8 GEMM on this device";
  auto l = MakeExactFp8Layer(32, 64, 128, Precision::kFp8E4M3, false, DType::kBFloat16,
                             WeightLayout::kOutIn, true, Activation::kNone, DType::kBFloat16,
                             Fp8Scaling::kTensor, 5);
  auto algos = TestBackend("cublaslt")->Algorithms(l->problem, c, {}, 4);
  ASSERT_THAT(algos, IsOk());
  ASSERT_GE(algos->size(), 1u);
  Config zero = c;
  zero.algo = 0;
  auto r = TestBackend("cublaslt")->Run(l->problem, zero, {});
  ASSERT_THAT(r, IsOk());
  for (const char* key : {"algo", "algo_tile", "algo_stages", "algo_splitk",
                          "algo_reduction_scheme", "algo_custom_option", "algo_workspace_bytes"}) {
    EXPECT_EQ(r->details[key], (*algos)[0].details.at(key)) << key;
  }
}

// Two registries in one process (as tests make), both with the default
// budget: one budget, not 90% of the free memory each; and the process's
// default memory pool keeps its settings (the devices allocate from a pool
// of their own).
TEST_F(CudaGpuTest, GpuDefaultBudgetDevicesShareOneBudgetAndLeaveTheDefaultPoolAlone) {
  cudaMemPool_t default_pool = nullptr;
  ASSERT_EQ(cudaDeviceGetDefaultMemPool(&default_pool, 0), cudaSuccess);
  uint64_t threshold_before = 0, threshold_after = 0;
  ASSERT_EQ(
      cudaMemPoolGetAttribute(default_pool, cudaMemPoolAttrReleaseThreshold, &threshold_before),
      cudaSuccess);
  BackendRegistry first, second;
  ASSERT_THAT(RegisterCudaBackends(&first, BuiltinBackendOptions{}), IsOk());
  ASSERT_THAT(RegisterCudaBackends(&second, BuiltinBackendOptions{}), IsOk());
  const ComputeDevice* a = (*first.Find("cublaslt"))->compute_device();
  const ComputeDevice* b = (*second.Find("cublaslt"))->compute_device();
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  size_t free_bytes = 0, total_bytes = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
  EXPECT_GT(a->memory().budget_bytes, 0);
  EXPECT_EQ(a->memory().budget_bytes, b->memory().budget_bytes);
  EXPECT_LE(a->memory().budget_bytes, static_cast<int64_t>(total_bytes));
  // What either draws counts against both: the lanes' workspaces of the
  // two (and of this fixture's) devices at least.
  EXPECT_EQ(a->memory().used_bytes, b->memory().used_bytes);
  EXPECT_GE(a->memory().used_bytes, 2 * 4 * BuiltinBackendOptions{}.cublaslt_workspace_bytes);
  ASSERT_EQ(
      cudaMemPoolGetAttribute(default_pool, cudaMemPoolAttrReleaseThreshold, &threshold_after),
      cudaSuccess);
  EXPECT_EQ(threshold_after, threshold_before);
}

// A sticky error first seen while making a converted form (a resident
// tensor's, or a session's own) poisons the device at once: every later
// session is refused with it. The error is made up (the make callback
// returns it), so the real CUDA context stays usable; the device is this
// test's own.
TEST_F(CudaGpuTest, GpuAStickyErrorSeenByAFormPoisonsTheDevice) {
  for (bool resident : {false, true}) {
    SCOPED_TRACE(resident ? "a resident tensor's form" : "a session's own form");
    BackendRegistry registry;  // a device of this round's own
    ASSERT_THAT(RegisterCudaBackends(&registry, BuiltinBackendOptions{}), IsOk());
    auto* device =
        dynamic_cast<cuda::CudaComputeDevice*>((*registry.Find("cublaslt"))->compute_device());
    ASSERT_NE(device, nullptr);
    {
      auto session = device->OpenCudaSession(nullptr);
      ASSERT_THAT(session, IsOk());
      Tensor w = *FromDoubles(DType::kFloat32, {4, 4}, std::vector<double>(16, 1.0));
      if (resident) w.set_content_id("sha256:sticky-form-test");
      auto ref = (*session)->Upload(w);
      ASSERT_THAT(ref, IsOk());
      auto form = (*session)->Form(*ref, "sticky", DType::kFloat32, [](void*) {
        return cuda::ToStatus(cudaErrorIllegalAddress, "a kernel that faulted");
      });
      EXPECT_FALSE(form.ok());
      EXPECT_TRUE(IsFatalDeviceError(form.status())) << form.status();
      EXPECT_FALSE(device->health().ok());
    }
    EXPECT_FALSE(device->OpenCudaSession(nullptr).ok());
  }
}

TEST_F(CudaGpuTest, GpuOverTheMemoryBudgetIsResourceExhaustedAndTheBackendKeepsWorking) {
  BackendRegistry registry;
  BuiltinBackendOptions options;
  options.gpu_memory_budget_bytes = 64 << 10;
  options.cublaslt_workspace_bytes = 0;  // the lanes' workspaces count against the budget
  options.gpu_lanes = 1;
  ASSERT_THAT(RegisterCudaBackends(&registry, options), IsOk());
  const ComputeDevice* device = (*registry.Find("cublaslt"))->compute_device();
  ASSERT_NE(device, nullptr);
  const ComputeDevice::Memory idle = device->memory();  // what the metrics report
  EXPECT_EQ(idle.budget_bytes, 64 << 10);
  EXPECT_LE(idle.used_bytes, idle.budget_bytes);
  for (const char* name : {"cublaslt", "cublas"}) {
    LinearBackend* b = *registry.Find(name);
    auto big = MakeLayer(256, 256, 256, DType::kFloat32, WeightLayout::kOutIn, false,
                         Activation::kNone, DType::kFloat32, 41);
    const Config c = MakeConfig(b, Precision::kFp32, *big);
    EXPECT_THAT(b->Run(big->problem, c, {}),
                StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("budget")));
    auto small = MakeLayer(4, 6, 8, DType::kFloat32, WeightLayout::kOutIn, false, Activation::kNone,
                           DType::kFloat32, 42);
    auto r = b->Run(small->problem, MakeConfig(b, Precision::kFp32, *small), {});
    ASSERT_THAT(r, IsOk());
    const Reference ref = ComputeReference(*small);
    for (size_t e = 0; e < ref.y.size(); ++e) {
      EXPECT_LE(
          std::fabs(At(r->output, e) - ref.y[e]),
          Bound(Precision::kFp32, DType::kFloat32, DType::kFloat32, 8, Activation::kNone, ref, e));
    }
    EXPECT_THAT(b->Run(big->problem, c, {}), StatusIs(absl::StatusCode::kResourceExhausted));
    EXPECT_THAT(b->Available(), IsOk());
    // Finished runs hold nothing: back to what the idle device held.
    EXPECT_EQ(device->memory().used_bytes, idle.used_bytes) << name;
  }
}

TEST_F(CudaGpuTest, GpuDeviceOutOfMemoryIsResourceExhaustedAndTheBackendKeepsWorking) {
  // The budget lets it through; the device cannot hold a 1 TiB output.
  const int64_t side = int64_t{1} << 19;
  const int64_t needed = side * side * 4;
  if (TestBackend("cublaslt")->device().memory_bytes * 2 > needed) {
    GTEST_SKIP() << "device memory too large for this test";
  }
  BackendRegistry registry;
  BuiltinBackendOptions options;
  options.gpu_memory_budget_bytes = int64_t{1} << 50;
  ASSERT_THAT(RegisterCudaBackends(&registry, options), IsOk());
  LinearBackend* b = *registry.Find("cublaslt");
  auto huge = MakeLayer(side, side, 1, DType::kFloat32, WeightLayout::kOutIn, false,
                        Activation::kNone, DType::kFloat32, 51);
  EXPECT_THAT(b->Run(huge->problem, MakeConfig(b, Precision::kFp32, *huge), {}),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("out of memory")));
  auto small = MakeLayer(8, 8, 8, DType::kFloat32, WeightLayout::kOutIn, false, Activation::kNone,
                         DType::kFloat32, 52);
  EXPECT_THAT(b->Run(small->problem, MakeConfig(b, Precision::kFp32, *small), {}), IsOk());
  EXPECT_THAT(b->Available(), IsOk());
}

// ---------------------------------------------------------------- block-wise

// A block128 layer whose sums are exact in any order (MakeExactFp8Layer's
// argument, per 128-wide slice of k): in every slice each row of x holds
// one 448 in the slice's first half and each output feature of W one in
// its second half, the rest integers in [-4, 4]. So every 1 x 128 block of
// x and every 128 x 128 block of W has amax 448 (the recipe's scales are 1
// and quantising changes nothing), no two 448s meet, and each slice's
// partial sum stays under 2^13. `fp8`: x and W stored as E4M3 with
// power-of-two block scales (x [m, s]; W [nb, s] or IN_OUT [s, nb]); else
// bf16, quantised by the recipe.
std::unique_ptr<Fp8Layer> MakeExactBlock128Layer(int64_t m, int64_t n, int64_t k, bool fp8,
                                                 WeightLayout layout, bool bias, DType out,
                                                 uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> small(-4, 4);
  auto l = std::make_unique<Fp8Layer>();
  const int64_t s = (k + 127) / 128, nb = (n + 127) / 128;
  const bool out_in = layout == WeightLayout::kOutIn;
  std::vector<double> x(static_cast<size_t>(m * k)), w(static_cast<size_t>(n * k));
  for (double& v : x) v = small(rng);
  for (double& v : w) v = small(rng);
  for (int64_t c = 0; c < s; ++c) {
    for (int64_t i = 0; i < m; ++i) x[static_cast<size_t>(i * k + c * 128 + i % 64)] = 448;
    for (int64_t j = 0; j < n; ++j) {
      const int64_t kk = c * 128 + 64 + (7 * j) % 64;
      w[static_cast<size_t>(out_in ? j * k + kk : kk * n + j)] = 448;
    }
  }
  const DType storage = fp8 ? DType::kFloat8E4M3Fn : DType::kBFloat16;
  l->x = *FromDoubles(storage, {m, k}, x);
  l->w = *FromDoubles(storage, out_in ? std::vector<int64_t>{n, k} : std::vector<int64_t>{k, n}, w);
  LinearProblem& pr = l->problem;
  if (fp8) {
    std::vector<double> sx(static_cast<size_t>(m * s)), sw(static_cast<size_t>(nb * s));
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t c = 0; c < s; ++c) {
        sx[static_cast<size_t>(i * s + c)] = std::ldexp(1.0, -static_cast<int>((i + c) % 3) - 1);
      }
    }
    for (int64_t jb = 0; jb < nb; ++jb) {
      for (int64_t c = 0; c < s; ++c) {
        const double v = std::ldexp(1.0, -static_cast<int>((jb + 2 * c) % 4) - 2);
        sw[static_cast<size_t>(out_in ? jb * s + c : c * nb + jb)] = v;
      }
    }
    l->x_scale = *FromDoubles(DType::kFloat32, {m, s}, sx);
    l->w_scale = *FromDoubles(
        DType::kFloat32, out_in ? std::vector<int64_t>{nb, s} : std::vector<int64_t>{s, nb}, sw);
    pr.input_scale = &l->x_scale;
    pr.weight_scale = &l->w_scale;
    pr.scale_blocks = ScaleBlocks{128, 128};
  }
  FinishExactFp8Layer(l.get(), m, n, k, layout, bias, bias ? Activation::kRelu : Activation::kNone,
                      out, rng);
  return l;
}

bool DeviceIsHopper() {
  return TestBackend("cublaslt")->device().compute_capability.rfind("9.", 0) == 0;
}

double ComputeCapabilityOf(LinearBackend* b) { return std::stod(b->device().compute_capability); }

// scaling=block128 on cuBLASLt (BLK128x128_32F for W, VEC128_32F for x)
// against the CPU emulation (DeepGEMM's promotion per 128-wide slice) on
// layers whose every partial sum is exact: bitwise. Elsewhere than compute
// capability 9.0, refused naming the rule.
TEST_F(CudaGpuTest, GpuFp8Block128MatchesTheCpuBitwiseWhereSumsAreExactAndIsRefusedOffHopper) {
  LinearBackend* lt = TestBackend("cublaslt");
  if (!DeviceIsHopper()) {
    auto l = MakeExactBlock128Layer(32, 64, 256, false, WeightLayout::kOutIn, false,
                                    DType::kFloat32, 2000);
    EXPECT_THAT(
        lt->Run(l->problem,
                Fp8Config("cublaslt", Precision::kFp8E4M3, false, Fp8Scaling::kBlock128), {})
            .status(),
        StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("compute capability 9.0 only")));
    return;
  }
  std::printf("| configuration | operands | layout | bias | out | bitwise equal | max ulp |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  uint32_t seed = 2000;
  std::vector<std::string> no_kernel;
  for (bool fp8 : {false, true}) {
    for (WeightLayout layout : {WeightLayout::kOutIn, WeightLayout::kInOut}) {
      for (bool bias : {false, true}) {
        for (DType out : {DType::kBFloat16, DType::kFloat32}) {
          // n = 192: a partial last block of W; k = 384: three slices.
          auto l = MakeExactBlock128Layer(48, 192, 384, fp8, layout, bias, out, ++seed);
          const Config c = Fp8Config("cublaslt", Precision::kFp8E4M3, bias, Fp8Scaling::kBlock128);
          Config cpu_c = c;
          cpu_c.backend = "cpu";
          SCOPED_TRACE(absl::StrCat(c.ToString(), fp8 ? " fp8" : " bf16", " ",
                                    WeightLayoutName(layout), " out ", DTypeShortName(out)));
          auto g = lt->Run(l->problem, c, {});
          if (IsNoKernel(g.status())) {
            no_kernel.push_back(absl::StrCat(c.ToString(), " ", WeightLayoutName(layout), " out ",
                                             DTypeShortName(out)));
            continue;
          }
          ASSERT_THAT(g, IsOk());
          auto cpu = TestCpuBackend()->Run(l->problem, cpu_c, {});
          ASSERT_THAT(cpu, IsOk());
          const Agreement a = Compare(g->output, cpu->output);
          std::printf("| %s | %s | %s | %s | %s | %.2f%% | %llu |\n", c.ToString().c_str(),
                      fp8 ? "fp8 + block scales" : "bf16, quantised",
                      std::string(WeightLayoutName(layout)).c_str(), bias ? "bf16" : "-",
                      std::string(DTypeShortName(out)).c_str(), 100 * a.bitwise_share,
                      static_cast<unsigned long long>(a.max_ulp));
          EXPECT_EQ(a.max_ulp, 0u);
          EXPECT_EQ(g->details["a_scale_mode"], "CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F");
          EXPECT_EQ(g->details["b_scale_mode"], "CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F");
        }
      }
    }
  }
  for (const std::string& what : no_kernel) std::printf("no cuBLASLt kernel: %s\n", what.c_str());
}

// An exact MXFP8 or NVFP4 layer of narrow operands: values small (E4M3
// integers in [-4, 4]; E2M1 codes of 0, ±0.5 ... ±6), block scales powers
// of two (UE8M0 2^-1 .. 2^1; UE4M3 0.5, 1, 2), NVFP4's global scales 0.5
// and 0.25: every product and partial sum exact in fp32.
struct BlockLayer {
  Tensor x, w, xs, ws, gx, gw;
  LinearProblem problem;
};

std::unique_ptr<BlockLayer> MakeExactBlockScaledLayer(Precision p, int64_t m, int64_t n, int64_t k,
                                                      WeightLayout layout, DType out,
                                                      uint32_t seed) {
  std::mt19937 rng(seed);
  auto l = std::make_unique<BlockLayer>();
  const BlockScaledOperands b = BlockScaledOperandsOf(p);
  const bool out_in = layout == WeightLayout::kOutIn;
  const bool fp4 = b.values == DType::kFloat4E2M1Fn;
  const std::vector<int64_t> wshape =
      out_in ? std::vector<int64_t>{n, k} : std::vector<int64_t>{k, n};
  auto fill = [&](const std::vector<int64_t>& shape, Tensor* t) {
    const int64_t count = shape[0] * shape[1];
    if (fp4) {
      *t = *Tensor::Create(DType::kFloat4E2M1Fn, shape);
      std::uniform_int_distribution<int> code(0, 15);
      for (int64_t e = 0; e < count; ++e) SetFp4Code(t->data<uint8_t>(), e, code(rng));
    } else {
      std::uniform_int_distribution<int> small(-4, 4);
      std::vector<double> v(static_cast<size_t>(count));
      for (double& d : v) d = small(rng);
      *t = *FromDoubles(b.values, shape, v);
    }
  };
  fill({m, k}, &l->x);
  fill(wshape, &l->w);
  const int64_t kb = k / b.block;
  auto scales = [&](std::vector<int64_t> shape, Tensor* t) {
    *t = *Tensor::Create(b.scales, shape);
    std::uniform_int_distribution<int> e(-1, 1);
    for (int64_t i = 0; i < shape[0] * shape[1]; ++i) {
      // UE8M0 2^e: 127 + e; UE4M3 2^e: (7 + e) << 3.
      t->data<uint8_t>()[i] =
          fp4 ? static_cast<uint8_t>((7 + e(rng)) << 3) : static_cast<uint8_t>(127 + e(rng));
    }
  };
  scales({m, kb}, &l->xs);
  scales(out_in ? std::vector<int64_t>{n, kb} : std::vector<int64_t>{kb, n}, &l->ws);
  LinearProblem& pr = l->problem;
  pr.input = &l->x;
  pr.weight = &l->w;
  pr.input_scale = &l->xs;
  pr.weight_scale = &l->ws;
  pr.scale_blocks = ScaleBlocks{b.block, 1};
  if (fp4) {
    l->gx = *FromDoubles(DType::kFloat32, {1}, std::vector<double>{0.5});
    l->gw = *FromDoubles(DType::kFloat32, {1}, std::vector<double>{0.25});
    pr.input_global_scale = &l->gx;
    pr.weight_global_scale = &l->gw;
  }
  pr.layout = layout;
  pr.output_dtype = out;
  pr.m = m;
  pr.n = n;
  pr.k = k;
  return l;
}

// MXFP8 and NVFP4 on cuBLASLt (VEC32_UE8M0, VEC16_UE4M3) against the CPU
// emulation on exact layers, bitwise, where the device has Blackwell's
// block-scaled tensor cores (compute capability 10.0 or later); elsewhere
// (the pack's H200) the backend must not list them and must refuse them
// naming the rule, so the CPU emulation runs them.
TEST_F(CudaGpuTest, GpuMxFp8AndNvFp4MatchTheCpuBitwiseFromBlackwellAndAreRefusedBefore) {
  LinearBackend* lt = TestBackend("cublaslt");
  const std::vector<Precision> listed = lt->precisions();
  const bool blackwell = ComputeCapabilityOf(lt) >= 10.0;
  for (Precision p : {Precision::kMxFp8E4M3, Precision::kNvFp4}) {
    SCOPED_TRACE(PrecisionName(p));
    EXPECT_EQ(std::find(listed.begin(), listed.end(), p) != listed.end(), blackwell);
    for (WeightLayout layout : {WeightLayout::kOutIn, WeightLayout::kInOut}) {
      for (DType out : {DType::kBFloat16, DType::kFloat32}) {
        auto l = MakeExactBlockScaledLayer(p, 32, 64, 128, layout, out, 2100);
        Config c;
        c.backend = "cublaslt";
        c.precision = p;
        c.bias = BiasMode::kNone;
        auto g = lt->Run(l->problem, c, {});
        if (!blackwell) {
          EXPECT_THAT(g.status(), StatusIs(absl::StatusCode::kFailedPrecondition,
                                           HasSubstr("compute capability 10.0 or later")));
          continue;
        }
        if (IsNoKernel(g.status())) {
          std::printf("no cuBLASLt kernel: %s\n", c.ToString().c_str());
          continue;
        }
        ASSERT_THAT(g, IsOk());
        Config cpu_c = c;
        cpu_c.backend = "cpu";
        auto cpu = TestCpuBackend()->Run(l->problem, cpu_c, {});
        ASSERT_THAT(cpu, IsOk());
        const Agreement a = Compare(g->output, cpu->output);
        std::printf("| %s | %s | %s | %.2f%% | %llu |\n", c.ToString().c_str(),
                    std::string(WeightLayoutName(layout)).c_str(),
                    std::string(DTypeShortName(out)).c_str(), 100 * a.bitwise_share,
                    static_cast<unsigned long long>(a.max_ulp));
        EXPECT_EQ(a.max_ulp, 0u);
      }
    }
  }
}

// ------------------------------------------------------------ split-K
// `@splitk=N,reduce=output|fp32` (internal/splitk_rules.h): cublaslt sets
// the split on an algorithm that takes it; cublas refuses it.

Config SplitConfig(absl::string_view backend, Precision p, int splitk, SplitKReduce reduce,
                   bool bias = true) {
  Config c;
  c.backend = std::string(backend);
  c.precision = p;
  c.bias = !bias ? BiasMode::kNone : backend == "cublas" ? BiasMode::kUnfused : BiasMode::kFused;
  c.splitk = splitk;
  c.reduce = reduce;
  return c;
}

TEST(CudaBackends, SplitKIsCublasltsAndCublasRefusesItNamingTheRule) {
  LinearBackend* lt = TestBackend("cublaslt");
  LinearBackend* blas = TestBackend("cublas");
  ASSERT_NE(lt, nullptr);
  ASSERT_NE(blas, nullptr);
  for (Precision p : {Precision::kBf16, Precision::kFp16}) {
    const DType storage = p == Precision::kBf16 ? DType::kBFloat16 : DType::kFloat16;
    for (SplitKReduce r : {SplitKReduce::kOutput, SplitKReduce::kFp32}) {
      EXPECT_THAT(lt->Supports(SplitConfig("cublaslt", p, 4, r), storage), IsOk());
      EXPECT_THAT(blas->Supports(SplitConfig("cublas", p, 4, r), storage),
                  StatusIs(absl::StatusCode::kFailedPrecondition,
                           AllOf(HasSubstr("cublasGemmEx takes no split-K count"),
                                 HasSubstr("cublaslt:"))));
    }
  }
}

TEST(CudaBackends, SplitKReduceOutputWithAnFp32DIsFailedPreconditionBeforeTheDevice) {
  // bf16 input, weight and output, an fp32 bias: D is fp32 (gemm_plan.h),
  // so OUTPUT_TYPE would reduce in fp32, not in bf16.
  auto l = MakeLayer(4, 16, 64, DType::kBFloat16, WeightLayout::kOutIn, /*bias=*/true,
                     Activation::kNone, DType::kBFloat16, 5);
  l->b = *FromDoubles(DType::kFloat32, {16}, std::vector<double>(16, 0.1));
  LinearBackend* lt = TestBackend("cublaslt");
  ASSERT_NE(lt, nullptr);
  EXPECT_THAT(
      lt->Prepare(l->problem, SplitConfig("cublaslt", Precision::kBf16, 2, SplitKReduce::kOutput))
          .status(),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               AllOf(HasSubstr("cublaslt:bf16:fused@splitk=2,reduce=output"),
                     HasSubstr("D is float32"))));
  // reduce=fp32 is not refused by the rules (the heuristic decides, on a
  // device).
  const PreparedRun fp32 =
      lt->Prepare(l->problem, SplitConfig("cublaslt", Precision::kBf16, 2, SplitKReduce::kFp32));
  if (!lt->Available().ok()) {
    EXPECT_THAT(fp32.status(), IsOk());
  }
}

// The shape (16 x 14336 -> 512) and one whose last slice is uneven
// (k = 1000 in 3: CUTLASS's slices 336, 336, 328): the chosen algorithm's
// details say the requested split and scheme, the output is within a
// deterministic bound of the fp64 reference (fp32 accumulation, and for
// reduce=output each partial and each addition rounded to the output
// type), and its bitwise share against the CPU emulation of the same split
// is printed for docs/gpu-validation.md. The inputs are stored in the
// precision's type, so that nothing but the GEMM rounds.
TEST_F(CudaGpuTest, GpuSplitKRunsTheRequestedSplitAndSchemeWithinTheBound) {
  struct Shape {
    int64_t m, n, k;
    int splitk;
  };
  const Shape shapes[] = {{16, 512, 14336, 4}, {8, 96, 1000, 3}};
  LinearBackend* lt = TestBackend("cublaslt");
  std::printf("| configuration | m x k -> n | bitwise equal to cpu | max ulp | algo source |\n");
  std::printf("|---|---|---|---|---|\n");
  uint32_t seed = 3500;
  for (const Shape& sh : shapes) {
    for (Precision p : {Precision::kBf16, Precision::kFp16}) {
      const DType storage = p == Precision::kBf16 ? DType::kBFloat16 : DType::kFloat16;
      auto l = MakeLayer(sh.m, sh.n, sh.k, storage, WeightLayout::kOutIn, /*bias=*/true,
                         Activation::kNone, storage, ++seed);
      const Reference ref = ComputeReference(*l);
      for (SplitKReduce reduce : {SplitKReduce::kOutput, SplitKReduce::kFp32}) {
        const Config c = SplitConfig("cublaslt", p, sh.splitk, reduce);
        SCOPED_TRACE(c.ToString());
        auto g = lt->Run(l->problem, c, {});
        ASSERT_THAT(g, IsOk());
        const std::map<std::string, std::string>& d = g->details;
        EXPECT_EQ(d.at("algo_splitk"), absl::StrCat(sh.splitk));
        // cublasLt.h: COMPUTE_TYPE 2, OUTPUT_TYPE 4.
        EXPECT_EQ(d.at("algo_reduction_scheme"), reduce == SplitKReduce::kOutput ? "4" : "2");
        EXPECT_EQ(d.at("config"), c.ToString());
        EXPECT_EQ(d.at("d_type"), std::string(DTypeName(storage)));
        const double u_out = UnitRoundoff(storage);
        for (size_t e = 0; e < ref.y.size(); ++e) {
          const double mags = std::fabs(ref.acc[e]) + std::fabs(ref.pre[e]) + std::fabs(ref.y[e]);
          double bound =
              static_cast<double>(sh.k) * 0x1p-24 * ref.abs_dot[e] + 4 * u_out * (mags + 1e-30);
          if (reduce == SplitKReduce::kOutput) {
            // Each partial rounded (at most u_out of its magnitude) and each
            // of the splitk - 1 additions (of a sum at most abs_dot).
            bound += 2 * sh.splitk * u_out * ref.abs_dot[e];
          }
          if (p == Precision::kFp16) bound += static_cast<double>(sh.k) * 0x1p-23;
          ASSERT_LE(std::fabs(At(g->output, e) - ref.y[e]), 1.25 * bound) << "element " << e;
        }
        // The CPU emulation of the same split (docs/numerics.md, "Split-K"),
        // by name.
        Config cpu_c = c;
        cpu_c.backend = "cpu";
        auto cpu = TestCpuBackend()->Run(l->problem, cpu_c, {});
        const std::string source =
            d.count("split_k_algo_source") ? d.at("split_k_algo_source") : "-";
        if (!cpu.ok()) {
          std::printf("| %s | %lldx%lld -> %lld | cpu: %s | - | %s |\n", c.ToString().c_str(),
                      static_cast<long long>(sh.m), static_cast<long long>(sh.k),
                      static_cast<long long>(sh.n), cpu.status().ToString().c_str(),
                      source.c_str());
          continue;
        }
        const Agreement a = Compare(g->output, cpu->output);
        std::printf("| %s | %lldx%lld -> %lld | %.2f%% | %llu | %s |\n", c.ToString().c_str(),
                    static_cast<long long>(sh.m), static_cast<long long>(sh.k),
                    static_cast<long long>(sh.n), 100 * a.bitwise_share,
                    static_cast<unsigned long long>(a.max_ulp), source.c_str());
      }
    }
  }
}

TEST_F(CudaGpuTest, GpuSplitKEveryListedAlgoTakesTheSplit) {
  auto l = MakeLayer(16, 512, 4096, DType::kBFloat16, WeightLayout::kOutIn, /*bias=*/true,
                     Activation::kNone, DType::kBFloat16, 3600);
  LinearBackend* lt = TestBackend("cublaslt");
  const Config c = SplitConfig("cublaslt", Precision::kBf16, 4, SplitKReduce::kOutput);
  auto algos = lt->Algorithms(l->problem, c, {}, 8);
  ASSERT_THAT(algos, IsOk());
  ASSERT_FALSE(algos->empty());
  for (const AlgorithmInfo& a : *algos) {
    EXPECT_EQ(a.details.at("algo_splitk"), "4") << "algo=" << a.index;
    EXPECT_EQ(a.details.at("algo_reduction_scheme"), "4") << "algo=" << a.index;
  }
  // algo=N runs entry N of that list.
  Config last = c;
  last.algo = static_cast<int>(algos->size()) - 1;
  auto g = lt->Run(l->problem, last, {});
  ASSERT_THAT(g, IsOk());
  EXPECT_EQ(g->details.at("algo"), algos->back().details.at("algo"));
  EXPECT_EQ(g->details.at("algo_tile"), algos->back().details.at("algo_tile"));
}

TEST_F(CudaGpuTest, GpuSplitKReduceOutputUnderDisallowReducedPrecisionReductionIsRefused) {
  auto l = MakeLayer(16, 64, 512, DType::kBFloat16, WeightLayout::kOutIn, /*bias=*/false,
                     Activation::kNone, DType::kBFloat16, 3700);
  LinearBackend* lt = TestBackend("cublaslt");
  RunOptions strict;
  strict.disallow_reduced_precision_reduction = true;
  EXPECT_THAT(
      lt->Run(l->problem,
              SplitConfig("cublaslt", Precision::kBf16, 2, SplitKReduce::kOutput, false), strict),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               HasSubstr("disallow_reduced_precision_reduction forbids reduce=output")));
  auto g = lt->Run(
      l->problem, SplitConfig("cublaslt", Precision::kBf16, 2, SplitKReduce::kFp32, false), strict);
  ASSERT_THAT(g, IsOk());
  EXPECT_EQ(g->details.at("algo_reduction_scheme"), "2");
}

}  // namespace
}  // namespace tensorcheck
