// MXFP8 and NVFP4 through the engine (docs/numerics.md, "MXFP8 and
// NVFP4"): narrow operands with their block scales, plain or in cuBLASLt's
// swizzled layout, against the definition redone here; every refusal
// naming its field; and diagnoses that name the recipe, its scale rounding
// and the bias mode of outputs this test makes with its own quantisation.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "server/engine/engine.h"
#include "tests/testing/engine_testing.h"
#include "tests/testing/ref_round.h"
#include "tests/testing/stats_testing.h"
#include "tests/testing/status_matchers.h"

namespace tensorcheck {
namespace {

using ::tensorcheck::testing::IsOk;
using ::tensorcheck::testing::RefFp8Saturated;
using ::tensorcheck::testing::RefFp8Value;
using ::tensorcheck::testing::StatusIs;
using ::testing::HasSubstr;

// ---- The formats from their definitions (OCP MX v1.0, OCP FP8).

double E2m1Value(int code) {
  static const double kMagnitude[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  return (code & 8) ? -kMagnitude[code & 7] : kMagnitude[code & 7];
}

double E8m0Value(int code) { return std::ldexp(1.0, code - 127); }

// cuBLASLt's swizzled block-scale layout ("1D Block Scaling Factors
// Layout"): rows padded to 128, columns to 4; 128 x 4 tiles of 512 bytes,
// row-tile-major; inside a tile (r, c) at (r % 32) * 16 + (r / 32) * 4 + c.
std::string Swizzle(const std::vector<uint8_t>& plain, int64_t rows, int64_t cols) {
  const int64_t row_tiles = (rows + 127) / 128, col_tiles = (cols + 3) / 4;
  std::string out(static_cast<size_t>(row_tiles * col_tiles * 512), '\0');
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t tile = (r / 128) * col_tiles + c / 4;
      const int64_t rr = r % 128, cc = c % 4;
      out[static_cast<size_t>(tile * 512 + (rr % 32) * 16 + (rr / 32) * 4 + cc)] =
          static_cast<char>(plain[static_cast<size_t>(r * cols + c)]);
    }
  }
  return out;
}

Tensor Bytes(DType dtype, std::vector<int64_t> shape, const std::vector<uint8_t>& b) {
  return *Tensor::FromBytes(dtype, std::move(shape), std::string(b.begin(), b.end()));
}

// FP4 codes packed two per byte, element 2i in the low nibble.
Tensor PackedFp4(std::vector<int64_t> shape, const std::vector<uint8_t>& codes) {
  std::vector<uint8_t> packed((codes.size() + 1) / 2, 0);
  for (size_t i = 0; i < codes.size(); ++i) {
    packed[i / 2] = static_cast<uint8_t>(packed[i / 2] | ((codes[i] & 0xf) << (4 * (i % 2))));
  }
  return Bytes(DType::kFloat4E2M1Fn, std::move(shape), packed);
}

class MxEngineTest : public ::tensorcheck::testing::BuiltinEngineTest {};

// A block-scaled layer whose dequantised products sum exactly in fp32 (so
// the GEMM's order cannot change a bit): x [m, k], w [n, k] codes, scales
// [m, k / b] and [n, k / b].
struct NarrowLayer {
  int64_t m = 3, n = 40, k = 64, block = 32;
  std::vector<uint8_t> x, w, sx, sw;
  float gx = 1, gw = 1;  // NVFP4's global scales
  bool fp4 = false;
  double X(int64_t i, int64_t t) const {
    const double v = fp4 ? E2m1Value(x[static_cast<size_t>(i * k + t)])
                         : RefFp8Value(x[static_cast<size_t>(i * k + t)], true);
    const uint8_t s = sx[static_cast<size_t>(i * (k / block) + t / block)];
    return v * (fp4 ? RefFp8Value(s, true) : E8m0Value(s));
  }
  double W(int64_t j, int64_t t) const {
    const double v = fp4 ? E2m1Value(w[static_cast<size_t>(j * k + t)])
                         : RefFp8Value(w[static_cast<size_t>(j * k + t)], true);
    const uint8_t s = sw[static_cast<size_t>(j * (k / block) + t / block)];
    return v * (fp4 ? RefFp8Value(s, true) : E8m0Value(s));
  }
  // The definition: the exact sum (exact here in fp32 too), then NVFP4's
  // alpha fl32(gx * gw) in fp32.
  std::vector<float> Reference() const {
    std::vector<float> out(static_cast<size_t>(m * n));
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (int64_t t = 0; t < k; ++t) acc += X(i, t) * W(j, t);
        out[static_cast<size_t>(i * n + j)] = static_cast<float>(acc) * (gx * gw);
      }
    }
    return out;
  }
};

NarrowLayer MakeMx(uint32_t seed) {
  NarrowLayer l;
  std::mt19937 rng(seed);
  // Values 1 .. 7.5 in steps of 1/8, scales 2^-1 .. 2^1: dequantised
  // values on a 2^-4 grid below 16, a dot product's sum below 2^14 on a
  // 2^-8 grid: exact in fp32.
  std::uniform_int_distribution<int> magnitude(0x38, 0x4f), sign(0, 1), scale(126, 128);
  for (int64_t i = 0; i < l.m * l.k; ++i) l.x.push_back(magnitude(rng) | (sign(rng) ? 0x80 : 0));
  for (int64_t i = 0; i < l.n * l.k; ++i) l.w.push_back(magnitude(rng) | (sign(rng) ? 0x80 : 0));
  for (int64_t i = 0; i < l.m * l.k / 32; ++i) l.sx.push_back(scale(rng));
  for (int64_t i = 0; i < l.n * l.k / 32; ++i) l.sw.push_back(scale(rng));
  return l;
}

NarrowLayer MakeNvFp4(uint32_t seed) {
  NarrowLayer l;
  l.fp4 = true;
  l.block = 16;
  l.gx = 0.37f;
  l.gw = 0.011f;
  std::mt19937 rng(seed);
  // E2M1 codes of any value, E4M3 scales 0.5 .. 1.875: products on a 2^-10
  // grid below 144, sums of 64 below 2^14: exact in fp32.
  std::uniform_int_distribution<int> code(0, 15), scale(0x30, 0x3f);
  for (int64_t i = 0; i < l.m * l.k; ++i) l.x.push_back(code(rng));
  for (int64_t i = 0; i < l.n * l.k; ++i) l.w.push_back(code(rng));
  for (int64_t i = 0; i < l.m * l.k / 16; ++i) l.sx.push_back(scale(rng));
  for (int64_t i = 0; i < l.n * l.k / 16; ++i) l.sw.push_back(scale(rng));
  return l;
}

LinearRequest NarrowRequest(const NarrowLayer& l, bool in_out = false, bool swizzled = false) {
  LinearRequest r;
  const int64_t kb = l.k / l.block;
  const DType scale_dtype = l.fp4 ? DType::kFloat8E4M3Fn : DType::kFloat8E8M0Fnu;
  std::vector<uint8_t> w = l.w, sw = l.sw;
  if (in_out) {
    for (int64_t j = 0; j < l.n; ++j) {
      for (int64_t t = 0; t < l.k; ++t)
        w[static_cast<size_t>(t * l.n + j)] = l.w[static_cast<size_t>(j * l.k + t)];
      for (int64_t b = 0; b < kb; ++b)
        sw[static_cast<size_t>(b * l.n + j)] = l.sw[static_cast<size_t>(j * kb + b)];
    }
    r.layout = WeightLayout::kInOut;
  }
  const std::vector<int64_t> w_shape =
      in_out ? std::vector<int64_t>{l.k, l.n} : std::vector<int64_t>{l.n, l.k};
  if (l.fp4) {
    r.input = PackedFp4({l.m, l.k}, l.x);
    r.weight = PackedFp4(w_shape, w);
    r.input_global_scale = *FromFloats(DType::kFloat32, {}, {l.gx});
    r.weight_global_scale = *FromFloats(DType::kFloat32, {1}, {l.gw});
  } else {
    r.input = Bytes(DType::kFloat8E4M3Fn, {l.m, l.k}, l.x);
    r.weight = Bytes(DType::kFloat8E4M3Fn, w_shape, w);
  }
  if (swizzled) {
    // The swizzled layout always tiles [M or N, K / block].
    const std::string a = Swizzle(l.sx, l.m, kb), b = Swizzle(l.sw, l.n, kb);
    r.input_scale = *Tensor::FromBytes(scale_dtype, {static_cast<int64_t>(a.size())}, a);
    r.weight_scale = *Tensor::FromBytes(scale_dtype, {static_cast<int64_t>(b.size())}, b);
  } else {
    r.input_scale = Bytes(scale_dtype, {l.m, kb}, l.sx);
    r.weight_scale = Bytes(
        scale_dtype, in_out ? std::vector<int64_t>{kb, l.n} : std::vector<int64_t>{l.n, kb}, sw);
  }
  r.output_dtype = DType::kFloat32;
  r.return_outputs = true;
  return r;
}

int64_t BitsDiffering(const Tensor& got, const std::vector<float>& want) {
  int64_t differ = 0;
  for (int64_t e = 0; e < got.numel(); ++e) {
    differ += std::memcmp(&got.data<float>()[e], &want[static_cast<size_t>(e)], 4) != 0;
  }
  return differ;
}

TEST_F(MxEngineTest, NarrowOperandsAreTheDefinitionInEveryLayoutOfWeightAndScales) {
  for (bool fp4 : {false, true}) {
    const NarrowLayer l = fp4 ? MakeNvFp4(5) : MakeMx(5);
    const std::vector<float> want = l.Reference();
    for (bool in_out : {false, true}) {
      for (bool swizzled : {false, true}) {
        SCOPED_TRACE(::testing::Message() << (fp4 ? "nvfp4" : "mxfp8") << (in_out ? " IN_OUT" : "")
                                          << (swizzled ? " swizzled" : ""));
        LinearRequest r = NarrowRequest(l, in_out, swizzled);
        r.configs = {fp4 ? "cpu:nvfp4" : "cpu:mxfp8e4m3"};
        auto out = engine_->Verify(r);
        ASSERT_THAT(out, IsOk());
        EXPECT_EQ(out->results[0].config,
                  fp4 ? "cpu:nvfp4:none" : "cpu:mxfp8e4m3:none@scaling=floor");
        EXPECT_EQ(BitsDiffering(*out->results[0].output, want), 0);
        // The fp64 reference is the dequantised layer: within fp32's
        // rounding of the exact sum.
        EXPECT_EQ(out->reference.config, "cpu:fp64:none");
        EXPECT_TRUE(out->results[0].vs_reference.passed);
      }
    }
  }
}

TEST_F(MxEngineTest, FourBitOperandsDefaultToABf16Output) {
  LinearRequest r = NarrowRequest(MakeNvFp4(2));
  r.output_dtype.reset();
  r.configs = {"cpu:nvfp4"};
  auto out = engine_->Verify(r);
  ASSERT_THAT(out, IsOk());
  EXPECT_EQ(out->results[0].output->dtype(), DType::kBFloat16);
}

TEST_F(MxEngineTest, DefaultCandidatesOfNarrowOperandsAreTheirPrecision) {
  const NarrowLayer l = MakeMx(6);
  LinearRequest r = NarrowRequest(l);
  r.observed = *FromFloats(DType::kFloat32, {l.m, l.n}, l.Reference());
  auto out = engine_->Diagnose(r);
  ASSERT_THAT(out, IsOk());
  ASSERT_TRUE(out->diagnosis->best.has_value()) << out->diagnosis->explanation;
  EXPECT_EQ(*out->diagnosis->best, "cpu:mxfp8e4m3:none@scaling=floor");
}

TEST_F(MxEngineTest, EveryRuleBrokenIsInvalidArgumentNamingTheField) {
  struct Case {
    const char* name;
    bool fp4;
    void (*mutate)(LinearRequest*);
    const char* message;
  };
  const Case cases[] = {
      {"K not a multiple of 32", false,
       [](LinearRequest* r) {
         r->input = *Tensor::FromBytes(DType::kFloat8E4M3Fn, {3, 48}, std::string(144, '\x38'));
         r->weight = *Tensor::FromBytes(DType::kFloat8E4M3Fn, {40, 48}, std::string(1920, '\x38'));
       },
       "op.input.shape: K a multiple of 32 (MXFP8's 32-element blocks) expected, got [3, 48]"},
      {"a float32 weight scale with an e8m0 input scale", false,
       [](LinearRequest* r) {
         r->weight_scale = *FromFloats(DType::kFloat32, {40, 2}, std::vector<float>(80, 1));
       },
       "op.weight_scale.dtype: float8_e8m0fnu expected, got float32"},
      {"a scale of the wrong shape", false,
       [](LinearRequest* r) {
         r->input_scale = *Tensor::FromBytes(DType::kFloat8E8M0Fnu, {3, 3}, std::string(9, '\x7f'));
       },
       "op.input_scale.shape: [3, 2] ([M, K/32]) or [512] (cuBLASLt's swizzled layout of [3, 2]) "
       "expected, got [3, 3]"},
      {"a NaN e8m0 scale", false,
       [](LinearRequest* r) { r->weight_scale->data<uint8_t>()[7] = 0xff; },
       "op.weight_scale[7]: a finite float8_e8m0fnu block scale expected, got NaN"},
      {"a global scale with MXFP8", false,
       [](LinearRequest* r) { r->weight_global_scale = *FromFloats(DType::kFloat32, {}, {1}); },
       "op.weight_global_scale: none: a global scale goes with FP4 (nvfp4) operands expected, got "
       "[]"},
      {"E4M3 times E5M2 under MXFP8", false,
       [](LinearRequest* r) {
         r->weight = *Tensor::FromBytes(DType::kFloat8E5M2, {40, 64}, std::string(2560, '\x38'));
       },
       "op.weight.dtype: float8_e4m3fn (MXFP8 operands share their format) expected, got "
       "float8_e5m2"},
      {"an fp8 configuration for MXFP8 operands", false,
       [](LinearRequest* r) { r->configs = {"cpu:fp8e4m3"}; },
       "configs[0] 'cpu:fp8e4m3': float8_e4m3fn x float8_e4m3fn operands with float8_e8m0fnu "
       "block scales are multiplied by precision mxfp8e4m3 (or fp64, the dequantised layer), "
       "not fp8e4m3"},
      {"no global scale with FP4", true, [](LinearRequest* r) { r->input_global_scale.reset(); },
       "op.input_global_scale: a float32 per-tensor scale ([] or [1]) with FP4 operands expected, "
       "got none"},
      {"a zero global scale", true,
       [](LinearRequest* r) { r->weight_global_scale->data<float>()[0] = 0; },
       "op.weight_global_scale[0]: a finite, positive float32 scale expected, got 0"},
      {"an FP4 input with an FP8 weight", true,
       [](LinearRequest* r) {
         r->weight = *Tensor::FromBytes(DType::kFloat8E4M3Fn, {40, 64}, std::string(2560, '\x38'));
       },
       "op.weight.dtype: float4_e2m1fn (the input is float4_e2m1fn) expected, got float8_e4m3fn"},
      {"an FP4 bias", true,
       [](LinearRequest* r) { r->bias = PackedFp4({40}, std::vector<uint8_t>(40, 1)); },
       "op.bias.dtype: float64, float32, float16 or bfloat16 (FP8 and FP4 are for inputs and "
       "weights) expected, got float4_e2m1fn"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    LinearRequest r = NarrowRequest(c.fp4 ? MakeNvFp4(1) : MakeMx(1));
    c.mutate(&r);
    EXPECT_THAT(engine_->Verify(r),
                StatusIs(absl::StatusCode::kInvalidArgument, ::testing::Eq(c.message)));
  }
  // And a good request is answered after them.
  LinearRequest good = NarrowRequest(MakeMx(1));
  good.configs = {"cpu:mxfp8e4m3"};
  EXPECT_THAT(engine_->Verify(good), IsOk());
}

// The MXFP8 recipes on wide operands, written out here from the OCP spec
// and the two sources (torchao's floor: e = floor(log2 amax) - 8;
// TransformerEngine's rceil: e = the exponent of fl32(amax * fl32(1/448))
// rounded up), values fl32(v * 2^-e) rounded to the nearest E4M3 value,
// saturated; then the layer summed in fp64 from the dequantised values and
// the bias added fused (one rounding to bf16) or unfused (the product
// rounded first).
std::vector<double> MxQuantise(const std::vector<float>& v, int64_t rows, int64_t cols,
                               bool rceil) {
  std::vector<double> out(v.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c0 = 0; c0 < cols; c0 += 32) {
      double amax = 0;
      for (int64_t c = c0; c < c0 + 32; ++c) {
        amax = std::max(amax, std::fabs(static_cast<double>(v[static_cast<size_t>(r * cols + c)])));
      }
      int e = 0;
      if (amax > 0) {
        int ex = 0;
        if (!rceil) {
          std::frexp(amax, &ex);  // amax in [2^(ex-1), 2^ex)
          e = (ex - 1) - 8;
        } else {
          const float descale = static_cast<float>(amax) * (1.0f / 448.0f);
          const double m = std::frexp(static_cast<double>(descale), &ex);
          e = m == 0.5 ? ex - 1 : ex;  // a power of two stays, else up
        }
      } else {
        e = -127;
      }
      for (int64_t c = c0; c < c0 + 32; ++c) {
        const size_t i = static_cast<size_t>(r * cols + c);
        const float scaled = static_cast<float>(std::ldexp(static_cast<double>(v[i]), -e));
        out[i] = std::ldexp(RefFp8Saturated(scaled, true), e);
      }
    }
  }
  return out;
}

TEST_F(MxEngineTest, DiagnosisNamesTheMxRecipeItsRoundingAndTheBiasMode) {
  const int64_t m = 8, n = 64, k = 512;
  LinearRequest base;
  base.input = ::tensorcheck::testing::RandomNormal({m, k}, 1.0, 41, DType::kBFloat16);
  base.weight = ::tensorcheck::testing::RandomNormal({n, k}, 0.05, 42, DType::kBFloat16);
  base.bias = ::tensorcheck::testing::RandomNormal({n}, 0.5, 43, DType::kBFloat16);
  std::vector<float> x(static_cast<size_t>(m * k)), w(static_cast<size_t>(n * k)), b(n);
  ToFloat(base.input, x.data());
  ToFloat(base.weight, w.data());
  ToFloat(*base.bias, b.data());
  for (bool rceil : {false, true}) {
    const std::vector<double> xq = MxQuantise(x, m, k, rceil), wq = MxQuantise(w, n, k, rceil);
    for (bool fused : {true, false}) {
      SCOPED_TRACE(::testing::Message()
                   << (rceil ? "rceil" : "floor") << (fused ? " fused" : " unfused"));
      const std::vector<float> y =
          ::tensorcheck::testing::Bf16LayerOutput(xq, wq, b, m, n, k, fused);
      LinearRequest r;
      r.input = base.input.Clone();
      r.weight = base.weight.Clone();
      r.bias = base.bias->Clone();
      r.observed = *FromFloats(DType::kBFloat16, {m, n}, y);
      const std::string want = std::string("cpu:mxfp8e4m3:") + (fused ? "fused" : "unfused") +
                               "@scaling=" + (rceil ? "rceil" : "floor");
      for (const char* rounding : {"floor", "rceil"}) {
        for (const char* bias : {"fused", "unfused"}) {
          r.configs.push_back(std::string("cpu:mxfp8e4m3:") + bias + "@scaling=" + rounding);
        }
      }
      r.configs.push_back("cpu:fp8e4m3:fused@scaling=row");
      r.configs.push_back("cpu:nvfp4:fused");
      r.configs.push_back("cpu:bf16");
      auto out = engine_->Diagnose(r);
      ASSERT_THAT(out, IsOk());
      ASSERT_TRUE(out->diagnosis->best.has_value()) << out->diagnosis->explanation;
      EXPECT_EQ(*out->diagnosis->best, want);
      // Without being told: the first tier leaves it unexplained, the
      // second names it.
      r.configs.clear();
      auto found = engine_->Diagnose(r);
      ASSERT_THAT(found, IsOk());
      EXPECT_EQ(found->diagnosis->candidate_tiers, (std::vector<int>{1, 2}));
      ASSERT_TRUE(found->diagnosis->best.has_value()) << found->diagnosis->explanation;
      EXPECT_EQ(*found->diagnosis->best, want);
    }
  }
}

}  // namespace
}  // namespace tensorcheck
