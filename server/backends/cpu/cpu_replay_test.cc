// Kernel replays on the CPU backend (docs/numerics.md, "Kernel K order"):
// `mma=` configurations against KernelOrderDot, the definition (itself
// checked against an independent implementation in
// core/tensor_core_model_test.cc), and against hand-derived values.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/float_formats.h"
#include "core/linear_config.h"
#include "core/tensor_core_model.h"
#include "server/backends/cpu/cpu_backend.h"
#include "tests/testing/status_matchers.h"

namespace tensorcheck {
namespace {

using ::tensorcheck::testing::IsOk;
using ::tensorcheck::testing::StatusIs;
using ::testing::HasSubstr;

std::unique_ptr<CpuBackend> NewBackend() {
  auto backend = CpuBackend::Create({});
  EXPECT_THAT(backend, IsOk());
  return std::move(*backend);
}

Config Parse(const std::string& spec) {
  absl::StatusOr<ConfigSpec> s = ParseConfigSpec(spec);
  EXPECT_THAT(s, IsOk()) << spec;
  return ResolveConfig(*s, /*has_bias=*/false, Activation::kNone, BiasMode::kFused);
}

struct Layer {
  Tensor x, w;
  LinearProblem p;
};

// x [m, k] and W [n, k] (OUT_IN) holding `x` and `w`, fp32 storage and
// output.
std::unique_ptr<Layer> MakeLayer(int64_t m, int64_t n, int64_t k, const std::vector<float>& x,
                                 const std::vector<float>& w, DType storage = DType::kFloat32) {
  auto l = std::make_unique<Layer>();
  l->x = *FromFloats(storage, {m, k}, x);
  l->w = *FromFloats(storage, {n, k}, w);
  l->p.input = &l->x;
  l->p.weight = &l->w;
  l->p.output_dtype = DType::kFloat32;
  l->p.m = m;
  l->p.n = n;
  l->p.k = k;
  return l;
}

std::vector<float> Output(CpuBackend& cpu, const LinearProblem& p, const Config& c) {
  absl::StatusOr<RunResult> r = cpu.Run(p, c, RunOptions{});
  EXPECT_THAT(r, IsOk()) << c.ToString();
  if (!r.ok()) return {};
  std::vector<float> out(static_cast<size_t>(r->output.numel()));
  ToFloat(r->output, out.data());
  return out;
}

uint32_t Bits(float v) {
  uint32_t u;
  std::memcpy(&u, &v, sizeof(u));
  return u;
}

// Random values of a 16-bit format: normal, then rounded to it.
std::vector<float> RandomValues(int64_t count, DType format, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(count));
  for (float& e : v) e = RoundToDType(d(rng), format);
  return v;
}

// Hand-derived: 1 + 1.5 2^-24, two bf16 products. fp32 addition rounds to
// nearest, 1 + 2^-23; the tensor cores align to 2^0 with 25 fraction bits
// (3 units of 2^-25 survive) and truncate the sum to 24 bits: 1.
TEST(CpuReplayTest, TruncationDecidesWhereFp32RoundsUp) {
  auto l = MakeLayer(1, 1, 2, {1.0f, 1.0f}, {1.0f, 0x1.8p-24f});
  auto cpu = NewBackend();
  EXPECT_EQ(Output(*cpu, l->p, Parse("cpu:bf16"))[0], 1.0f + 0x1p-23f);
  for (const char* gpu : {"sm80", "sm90", "sm100"}) {
    EXPECT_EQ(Output(*cpu, l->p, Parse(absl::StrCat("cpu:bf16@mma=", gpu)))[0], 1.0f) << gpu;
  }
}

// Every element against KernelOrderDot of the rounded operands, for each
// generation and 16-/19-bit precision, with odd shapes, a tile with the
// residue first, and both weight layouts.
TEST(CpuReplayTest, EveryElementIsKernelOrderDot) {
  constexpr int64_t kM = 5, kN = 9, kK = 147;
  const std::vector<float> x = RandomValues(kM * kK, DType::kFloat32, 1);
  const std::vector<float> w = RandomValues(kN * kK, DType::kFloat32, 2);
  auto cpu = NewBackend();
  for (const char* spec :
       {"cpu:bf16@mma=sm80", "cpu:bf16@mma=sm90", "cpu:fp16@mma=sm100,tile_k=32,residue=first",
        "cpu:tf32@mma=sm90,tile_k=64", "cpu:tf32rna@mma=sm80", "cpu:bf16@mma=sm90,tile_k=64"}) {
    SCOPED_TRACE(spec);
    const Config c = Parse(spec);
    const std::optional<KernelOrder> order = KernelOrderOf(c);
    ASSERT_TRUE(order.has_value());
    std::vector<float> xr(x), wr(w);
    for (float& v : xr) v = RoundInput(c.precision, v);
    for (float& v : wr) v = RoundInput(c.precision, v);
    for (WeightLayout layout : {WeightLayout::kOutIn, WeightLayout::kInOut}) {
      std::vector<float> stored(w);
      if (layout == WeightLayout::kInOut) {
        for (int64_t j = 0; j < kN; ++j)
          for (int64_t t = 0; t < kK; ++t) stored[t * kN + j] = w[j * kK + t];
      }
      auto l = MakeLayer(kM, kN, kK, x, stored);
      l->w = *FromFloats(DType::kFloat32,
                         layout == WeightLayout::kOutIn ? std::vector<int64_t>{kN, kK}
                                                        : std::vector<int64_t>{kK, kN},
                         stored);
      l->p.layout = layout;
      const std::vector<float> got = Output(*cpu, l->p, c);
      ASSERT_EQ(got.size(), static_cast<size_t>(kM * kN));
      int mismatches = 0;
      for (int64_t i = 0; i < kM; ++i) {
        for (int64_t j = 0; j < kN; ++j) {
          const float want = KernelOrderDot(&xr[i * kK], &wr[j * kK], 1, kK, *order);
          if (Bits(got[i * kN + j]) != Bits(want)) ++mismatches;
        }
      }
      EXPECT_EQ(mismatches, 0);
    }
  }
}

// Split-K with a replay: each slice (CUTLASS's cut) the kernel's walk from
// zero, the partials added in fp32 left to right.
TEST(CpuReplayTest, SplitKSlicesAreKernelWalksReducedInFp32) {
  constexpr int64_t kM = 3, kN = 4, kK = 200;
  const std::vector<float> x = RandomValues(kM * kK, DType::kBFloat16, 3);
  const std::vector<float> w = RandomValues(kN * kK, DType::kBFloat16, 4);
  auto l = MakeLayer(kM, kN, kK, x, w, DType::kBFloat16);
  auto cpu = NewBackend();
  const Config c = Parse("cpu:bf16@splitk=3,reduce=fp32,mma=sm90");
  const KernelOrder order = *KernelOrderOf(c);
  const std::vector<float> got = Output(*cpu, l->p, c);
  const int64_t slice = SplitKSlice(kK, 3);
  ASSERT_EQ(slice, 72);  // ceil(200 / 3) = 67, up to a multiple of 8
  for (int64_t i = 0; i < kM; ++i) {
    for (int64_t j = 0; j < kN; ++j) {
      float want = 0.0f;
      for (int64_t k0 = 0; k0 < kK; k0 += slice) {
        const float part =
            KernelOrderDot(&x[i * kK + k0], &w[j * kK + k0], 1, std::min(slice, kK - k0), order);
        want = k0 == 0 ? part : want + part;
      }
      EXPECT_EQ(Bits(got[i * kN + j]), Bits(want)) << i << "," << j;
    }
  }
}

// FP8 operands (scales 1): without fast accumulation the model's partials
// are promoted every tile_k (128 unset); with it one chain. K = 300
// crosses two promotions.
TEST(CpuReplayTest, Fp8PromotesOncePerTile) {
  constexpr int64_t kM = 2, kN = 3, kK = 300;
  std::vector<float> x = RandomValues(kM * kK, DType::kFloat32, 5);
  std::vector<float> w = RandomValues(kN * kK, DType::kFloat32, 6);
  for (float& v : x) v = RoundToDType(v * 8, DType::kFloat8E4M3Fn);
  for (float& v : w) v = RoundToDType(v * 8, DType::kFloat8E4M3Fn);
  auto l = MakeLayer(kM, kN, kK, x, w, DType::kFloat8E4M3Fn);
  Tensor one = *FromFloats(DType::kFloat32, {}, {1.0f});
  l->p.input_scale = &one;
  l->p.weight_scale = &one;
  auto cpu = NewBackend();
  for (const char* spec :
       {"cpu:fp8e4m3@scaling=tensor,mma=sm90", "cpu:fp8e4m3@scaling=tensor,mma=sm90,tile_k=64",
        "cpu:fp8e4m3@scaling=tensor,fast_accum,mma=sm90", "cpu:fp8e4m3@scaling=tensor,mma=sm100"}) {
    SCOPED_TRACE(spec);
    const Config c = Parse(spec);
    const KernelOrder order = *KernelOrderOf(c);
    EXPECT_EQ(order.promote, c.fast_accum ? 0 : (c.tile_k > 0 ? c.tile_k : 128));
    const std::vector<float> got = Output(*cpu, l->p, c);
    ASSERT_EQ(got.size(), static_cast<size_t>(kM * kN));
    for (int64_t i = 0; i < kM; ++i) {
      for (int64_t j = 0; j < kN; ++j) {
        const float want = KernelOrderDot(&x[i * kK], &w[j * kK], 1, kK, order);
        EXPECT_EQ(Bits(got[i * kN + j]), Bits(want)) << i << "," << j;
      }
    }
  }
}

// bf16 values are TF32 ones: the three TF32 roundings' replays multiply
// the same values in the same model, one arithmetic.
TEST(CpuReplayTest, Tf32RoundingsOfTf32ValuesAreOneReplay) {
  constexpr int64_t kM = 3, kN = 5, kK = 40;
  auto l = MakeLayer(kM, kN, kK, RandomValues(kM * kK, DType::kBFloat16, 7),
                     RandomValues(kN * kK, DType::kBFloat16, 8), DType::kBFloat16);
  auto cpu = NewBackend();
  const std::vector<float> tf32 = Output(*cpu, l->p, Parse("cpu:tf32@mma=sm90"));
  for (const char* spec : {"cpu:tf32rna@mma=sm90", "cpu:tf32trunc@mma=sm90"}) {
    const std::vector<float> other = Output(*cpu, l->p, Parse(spec));
    ASSERT_EQ(other.size(), tf32.size());
    for (size_t e = 0; e < tf32.size(); ++e) EXPECT_EQ(Bits(other[e]), Bits(tf32[e])) << spec;
  }
}

TEST(CpuReplayTest, DetailsNameTheModelAndOrder) {
  auto l = MakeLayer(1, 1, 2, {1.0f, 1.0f}, {1.0f, 1.0f});
  auto cpu = NewBackend();
  absl::StatusOr<RunResult> r =
      cpu->Run(l->p, Parse("cpu:bf16@mma=sm90,tile_k=64,residue=first"), RunOptions{});
  ASSERT_THAT(r, IsOk());
  EXPECT_THAT(r->details.at("replay"), HasSubstr("sm90 tensor-core model: blocks of 16"));
  EXPECT_THAT(r->details.at("replay"), HasSubstr("K tiles of 64, residue first"));
  EXPECT_EQ(r->details.count("blas"), 0u);
}

TEST(CpuReplayTest, BlockWiseFp8ReplayIsRefused) {
  auto l = MakeLayer(1, 1, 2, {1.0f, 1.0f}, {1.0f, 1.0f});
  auto cpu = NewBackend();
  Config c = Parse("cpu:fp8e4m3@mma=sm90");
  c.scaling = Fp8Scaling::kBlock128;  // as a request's block scales resolve it
  EXPECT_THAT(cpu->Supports(c, DType::kFloat32),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not modelled")));
}

}  // namespace
}  // namespace tensorcheck
