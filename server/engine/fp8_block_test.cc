// Block-wise FP8 (DeepSeek-V3's 1 x 128 input and 128 x 128 weight
// scales, `scaling=block128`) through the engine: the arithmetic of
// docs/numerics.md ("Block-wise FP8") redone here from its definition, the
// scale shapes and their refusals, and a diagnosis that names the recipe
// and the bias mode of an output this test makes itself.
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

Tensor F32(std::vector<int64_t> shape, const std::vector<float>& v) {
  return *FromFloats(DType::kFloat32, std::move(shape), v);
}

class Fp8BlockTest : public ::tensorcheck::testing::BuiltinEngineTest {};

// FP8 operands whose every 128-wide partial sum is exact in fp32 (values
// 1 .. 7.5 in steps of 1/8: products are multiples of 2^-6 below 57, a
// slice's sum below 2^13), so the split accumulator's order cannot change
// a bit; the promotion acc = fma(partial, fl32(sx * sw), acc) is then
// redone here exactly. K = 300 and N = 130 leave partial last blocks.
struct BlockLayer {
  int64_t m = 3, n = 130, k = 300;
  std::vector<uint8_t> x, w;  // codes, x [m, k], w [n, k]
  std::vector<float> sx, sw;  // [m, 3], [2, 3]
  int64_t slices() const { return (k + 127) / 128; }
  int64_t n_blocks() const { return (n + 127) / 128; }
};

BlockLayer MakeBlockLayer() {
  BlockLayer l;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> magnitude(0x38, 0x4f), sign(0, 1);
  auto codes = [&](int64_t count) {
    std::vector<uint8_t> c(static_cast<size_t>(count));
    for (uint8_t& b : c) b = static_cast<uint8_t>(magnitude(rng) | (sign(rng) ? 0x80 : 0));
    return c;
  };
  l.x = codes(l.m * l.k);
  l.w = codes(l.n * l.k);
  std::uniform_real_distribution<float> scale(0.001f, 0.1f);
  for (int64_t i = 0; i < l.m * l.slices(); ++i) l.sx.push_back(scale(rng));
  for (int64_t i = 0; i < l.n_blocks() * l.slices(); ++i) l.sw.push_back(scale(rng));
  return l;
}

// The definition, element by element.
std::vector<float> BlockReference(const BlockLayer& l) {
  std::vector<float> out(static_cast<size_t>(l.m * l.n));
  for (int64_t i = 0; i < l.m; ++i) {
    for (int64_t j = 0; j < l.n; ++j) {
      float acc = 0;
      for (int64_t s = 0; s < l.slices(); ++s) {
        double partial = 0;  // exact (see BlockLayer)
        for (int64_t t = s * 128; t < std::min(l.k, (s + 1) * 128); ++t) {
          partial += RefFp8Value(l.x[static_cast<size_t>(i * l.k + t)], true) *
                     RefFp8Value(l.w[static_cast<size_t>(j * l.k + t)], true);
        }
        const float scale = l.sx[static_cast<size_t>(i * l.slices() + s)] *
                            l.sw[static_cast<size_t>((j / 128) * l.slices() + s)];
        acc = std::fma(static_cast<float>(partial), scale, acc);
      }
      out[static_cast<size_t>(i * l.n + j)] = acc;
    }
  }
  return out;
}

LinearRequest BlockRequest(const BlockLayer& l, bool in_out) {
  LinearRequest r;
  r.input =
      *Tensor::FromBytes(DType::kFloat8E4M3Fn, {l.m, l.k}, std::string(l.x.begin(), l.x.end()));
  r.input_scale = F32({l.m, l.slices()}, l.sx);
  if (!in_out) {
    r.weight =
        *Tensor::FromBytes(DType::kFloat8E4M3Fn, {l.n, l.k}, std::string(l.w.begin(), l.w.end()));
    r.weight_scale = F32({l.n_blocks(), l.slices()}, l.sw);
  } else {
    std::string wt(static_cast<size_t>(l.n * l.k), '\0');
    for (int64_t j = 0; j < l.n; ++j) {
      for (int64_t t = 0; t < l.k; ++t) {
        wt[static_cast<size_t>(t * l.n + j)] =
            static_cast<char>(l.w[static_cast<size_t>(j * l.k + t)]);
      }
    }
    r.weight = *Tensor::FromBytes(DType::kFloat8E4M3Fn, {l.k, l.n}, wt);
    r.layout = WeightLayout::kInOut;
    std::vector<float> swt(l.sw.size());
    for (int64_t b = 0; b < l.n_blocks(); ++b) {
      for (int64_t s = 0; s < l.slices(); ++s) {
        swt[static_cast<size_t>(s * l.n_blocks() + b)] =
            l.sw[static_cast<size_t>(b * l.slices() + s)];
      }
    }
    r.weight_scale = F32({l.slices(), l.n_blocks()}, swt);
  }
  r.output_dtype = DType::kFloat32;
  return r;
}

TEST_F(Fp8BlockTest, SplitAccumulationIsTheDefinitionBitForBitInBothLayouts) {
  const BlockLayer l = MakeBlockLayer();
  const std::vector<float> want = BlockReference(l);
  for (bool in_out : {false, true}) {
    SCOPED_TRACE(in_out ? "IN_OUT" : "OUT_IN");
    LinearRequest r = BlockRequest(l, in_out);
    r.configs = {"cpu:fp8e4m3"};
    r.return_outputs = true;
    auto out = engine_->Verify(r);
    ASSERT_THAT(out, IsOk());
    // The scales' shapes fix the scaling.
    EXPECT_EQ(out->results[0].config, "cpu:fp8e4m3:none@scaling=block128");
    const Tensor& got = *out->results[0].output;
    ASSERT_EQ(got.numel(), l.m * l.n);
    int64_t differ = 0;
    for (int64_t e = 0; e < got.numel(); ++e) {
      differ += std::memcmp(&got.data<float>()[e], &want[static_cast<size_t>(e)], 4) != 0;
    }
    EXPECT_EQ(differ, 0);
    // Against the dequantised layer in fp64 (the default reference).
    EXPECT_EQ(out->reference.config, "cpu:fp64:none");
    EXPECT_LT(out->results[0].vs_reference.max_abs, 1e-3);
  }
}

TEST_F(Fp8BlockTest, ScaleShapesAndScalingsAreCheckedNamingTheField) {
  const BlockLayer l = MakeBlockLayer();
  struct Case {
    const char* name;
    void (*mutate)(LinearRequest*);
    const char* message;
  };
  const Case cases[] = {
      {"input scale one slice short",
       [](LinearRequest* r) {
         r->input_scale = F32({3, 2}, std::vector<float>(6, 1.0f));
       },
       "op.input_scale.shape: [] or [1] (per tensor), [3] (M, row-wise) or [3, 3] "
       "([M, ceil(K/128)], block-wise) expected, got [3, 2]"},
      {"row-wise input with block-wise weight",
       [](LinearRequest* r) { r->input_scale = F32({3}, std::vector<float>(3, 1.0f)); },
       "op.weight_scale.shape: row-wise like the other scale: [130] expected, got [2, 3]"},
      {"block-wise input with a per-tensor weight",
       [](LinearRequest* r) { r->weight_scale = F32({}, {1.0f}); },
       "op.weight_scale.shape: block-wise like the other scale: [2, 3] expected, got []"},
      {"scaling=row named with block-wise scales",
       [](LinearRequest* r) { r->configs = {"cpu:fp8e4m3@scaling=row"}; },
       "configs[0] 'cpu:fp8e4m3@scaling=row': scaling=row but op.input_scale and "
       "op.weight_scale are block-wise (scaling=block128)"},
      {"a NaN block scale",
       [](LinearRequest* r) { r->weight_scale->data<float>()[4] = std::nanf(""); },
       "op.weight_scale[4]: a finite, positive float32 scale expected, got NaN"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    LinearRequest r = BlockRequest(l, false);
    r.configs = {"cpu:fp8e4m3"};
    c.mutate(&r);
    EXPECT_THAT(engine_->Verify(r),
                StatusIs(absl::StatusCode::kInvalidArgument, ::testing::Eq(c.message)));
  }
}

TEST_F(Fp8BlockTest, FastAccumulationRunsWithinEachSlice) {
  const BlockLayer l = MakeBlockLayer();
  LinearRequest r = BlockRequest(l, false);
  r.configs = {"cpu:fp8e4m3@fast_accum"};
  r.return_outputs = true;
  auto out = engine_->Verify(r);
  ASSERT_THAT(out, IsOk());
  EXPECT_EQ(out->results[0].config, "cpu:fp8e4m3:none@scaling=block128,fast_accum");
  // Each slice's sum is below 2^13 with products on a 2^-6 grid: up to 19
  // bits, more than the model's 14, so fast accumulation loses bits in
  // some elements against the exact slices of the definition, but no more
  // than its truncations allow (a few units of 2^-13 relative per slice).
  const std::vector<float> exact = BlockReference(l);
  const Tensor& got = *out->results[0].output;
  int64_t differ = 0;
  double worst = 0;
  for (int64_t e = 0; e < got.numel(); ++e) {
    const double want = exact[static_cast<size_t>(e)];
    differ += got.data<float>()[e] != want;
    worst = std::max(worst, std::fabs(got.data<float>()[e] - want) / std::fabs(want));
  }
  EXPECT_GT(differ, 0);
  EXPECT_LT(worst, 1e-2);
}

// The block-wise recipe on wide operands, written out here (amax per
// block in fp64, s = fl32(448 / amax), q = the nearest E4M3 value of
// fl32(v * s) saturated, dequantisation fl32(1 / s)), the layer summed in
// fp64 from the dequantised values, the bias added fused (one rounding)
// or unfused (the product rounded to bf16 first): the diagnosis names the
// recipe, against per-tensor and row-wise scaling, and the bias mode.
TEST_F(Fp8BlockTest, DiagnosisNamesTheBlockRecipeAndTheBiasMode) {
  const int64_t m = 8, n = 256, k = 512;
  LinearRequest base;
  base.input = ::tensorcheck::testing::RandomNormal({m, k}, 1.0, 31, DType::kBFloat16);
  base.weight = ::tensorcheck::testing::RandomNormal({n, k}, 0.05, 32, DType::kBFloat16);
  base.bias = ::tensorcheck::testing::RandomNormal({n}, 0.5, 33, DType::kBFloat16);
  // Slices and weight blocks of very different magnitudes: only block-wise
  // scales keep the small ones' bits.
  std::vector<float> x(static_cast<size_t>(m * k)), w(static_cast<size_t>(n * k)), b(n);
  ToFloat(base.input, x.data());
  ToFloat(base.weight, w.data());
  ToFloat(*base.bias, b.data());
  for (int64_t i = 0; i < m * k; ++i) {
    if ((i % k) / 128 % 2 == 1) x[static_cast<size_t>(i)] *= 1.0f / 64;
  }
  for (int64_t i = 0; i < n * k; ++i) {
    if ((i / k) / 128 == 1 && (i % k) / 128 >= 2) w[static_cast<size_t>(i)] *= 1.0f / 256;
  }
  base.input = *FromFloats(DType::kBFloat16, {m, k}, x);
  base.weight = *FromFloats(DType::kBFloat16, {n, k}, w);
  ToFloat(base.input, x.data());
  ToFloat(base.weight, w.data());

  // Quantises [rows, cols] in blocks of br x bc; returns dequantised values.
  auto quantise = [](const std::vector<float>& v, int64_t rows, int64_t cols, int64_t br,
                     int64_t bc) {
    std::vector<double> out(v.size());
    for (int64_t r0 = 0; r0 < rows; r0 += br) {
      for (int64_t c0 = 0; c0 < cols; c0 += bc) {
        double amax = 0;
        for (int64_t r = r0; r < std::min(rows, r0 + br); ++r) {
          for (int64_t c = c0; c < std::min(cols, c0 + bc); ++c) {
            amax = std::max(amax,
                            std::fabs(static_cast<double>(v[static_cast<size_t>(r * cols + c)])));
          }
        }
        const float s = static_cast<float>(448.0 / std::max(amax, 1e-12));
        const float deq = 1.0f / s;
        for (int64_t r = r0; r < std::min(rows, r0 + br); ++r) {
          for (int64_t c = c0; c < std::min(cols, c0 + bc); ++c) {
            const size_t e = static_cast<size_t>(r * cols + c);
            out[e] = RefFp8Saturated(static_cast<double>(v[e] * s), true) * deq;
          }
        }
      }
    }
    return out;
  };
  const std::vector<double> xq = quantise(x, m, k, 1, 128);
  const std::vector<double> wq = quantise(w, n, k, 128, 128);
  for (bool fused : {true, false}) {
    SCOPED_TRACE(fused ? "fused" : "unfused");
    const std::vector<float> y = ::tensorcheck::testing::Bf16LayerOutput(xq, wq, b, m, n, k, fused);
    LinearRequest r;
    r.input = base.input.Clone();
    r.weight = base.weight.Clone();
    r.bias = base.bias->Clone();
    r.observed = *FromFloats(DType::kBFloat16, {m, n}, y);
    for (const char* scaling : {"tensor", "row", "block128"}) {
      for (const char* bias : {"fused", "unfused"}) {
        r.configs.push_back(std::string("cpu:fp8e4m3:") + bias + "@scaling=" + scaling);
      }
    }
    r.configs.push_back("cpu:bf16");
    auto out = engine_->Diagnose(r);
    ASSERT_THAT(out, IsOk());
    ASSERT_TRUE(out->diagnosis->best.has_value()) << out->diagnosis->explanation;
    EXPECT_EQ(*out->diagnosis->best,
              std::string("cpu:fp8e4m3:") + (fused ? "fused" : "unfused") + "@scaling=block128");
  }
}

}  // namespace
}  // namespace tensorcheck
