// FP8 requests through the engine: the rules of docs/numerics.md ("FP8"),
// each refusal naming its field, and diagnoses that name the precision,
// the scaling and the accumulation an output came from.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "server/engine/engine.h"
#include "tests/testing/engine_testing.h"
#include "tests/testing/stats_testing.h"
#include "tests/testing/status_matchers.h"

namespace tensorcheck {
namespace {

using ::tensorcheck::testing::IsOk;
using ::tensorcheck::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class Fp8EngineTest : public ::tensorcheck::testing::BuiltinEngineTest {
 protected:
  // Random FP8 patterns (finite, both signs) of `dtype`.
  static Tensor RandomFp8(DType dtype, std::vector<int64_t> shape, uint32_t seed) {
    std::mt19937 rng(seed);
    const int top = dtype == DType::kFloat8E4M3Fn ? 0x5f : 0x5b;  // |v| <= 15 or 1536
    std::uniform_int_distribution<int> magnitude(0x20, top), sign(0, 1);
    int64_t count = 1;
    for (int64_t d : shape) count *= d;
    std::string bytes(static_cast<size_t>(count), '\0');
    for (char& b : bytes) b = static_cast<char>(magnitude(rng) | (sign(rng) ? 0x80 : 0));
    return *Tensor::FromBytes(dtype, std::move(shape), bytes);
  }

  static Tensor Scales(std::vector<int64_t> shape, float value) {
    int64_t count = 1;
    for (int64_t d : shape) count *= d;
    return *FromFloats(DType::kFloat32, std::move(shape),
                       std::vector<float>(static_cast<size_t>(count), value));
  }

  static LinearRequest Fp8Request(int64_t m, int64_t n, int64_t k, bool row_wise,
                                  DType x = DType::kFloat8E4M3Fn, DType w = DType::kFloat8E4M3Fn) {
    LinearRequest r;
    r.input = RandomFp8(x, {m, k}, 1);
    r.weight = RandomFp8(w, {n, k}, 2);
    r.input_scale = row_wise ? Scales({m, 1}, 0.03125f) : Scales({}, 0.03125f);
    r.weight_scale = row_wise ? Scales({n}, 0.0625f) : Scales({1}, 0.0625f);
    return r;
  }

  // The operands of `r` (copies).
  static LinearRequest Operands(const LinearRequest& r) {
    LinearRequest c;
    c.input = r.input.Clone();
    c.weight = r.weight.Clone();
    c.output_dtype = r.output_dtype;
    return c;
  }
};

TEST_F(Fp8EngineTest, VerifiesFp8OperandsAgainstTheDequantisedFp64Layer) {
  LinearRequest r = Fp8Request(4, 8, 64, /*row_wise=*/true);
  r.configs = {"cpu:fp8e4m3", "cpu:fp8e4m3@fast_accum"};
  auto out = engine_->Verify(r);
  ASSERT_THAT(out, IsOk());
  EXPECT_EQ(out->reference.config, "cpu:fp64:none");
  ASSERT_EQ(out->results.size(), 2u);
  // The scales' shapes fix the scaling; the output defaults to bf16.
  EXPECT_EQ(out->results[0].config, "cpu:fp8e4m3:none@scaling=row");
  EXPECT_EQ(out->results[1].config, "cpu:fp8e4m3:none@scaling=row,fast_accum");
  EXPECT_EQ(out->results[0].vs_reference.compared_dtype, DType::kBFloat16);
  // The split accumulator in fp32 is within bf16's rounding of fp64.
  EXPECT_TRUE(out->results[0].vs_reference.passed);
}

TEST_F(Fp8EngineTest, EveryRuleBrokenIsInvalidArgumentNamingTheField) {
  struct Case {
    const char* name;
    void (*mutate)(LinearRequest*);
    const char* field;
  };
  const Case cases[] = {
      {"wide weight",
       [](LinearRequest* r) {
         r->weight = Scales({8, 64}, 1.0f);
       },
       "op.weight.dtype"},
      {"no input scale", [](LinearRequest* r) { r->input_scale.reset(); }, "op.input_scale"},
      {"bf16 scale",
       [](LinearRequest* r) { r->weight_scale = *FromFloats(DType::kBFloat16, {1}, {1.0f}); },
       "op.weight_scale.dtype"},
      {"scale of 3", [](LinearRequest* r) { r->input_scale = Scales({3}, 1.0f); },
       "op.input_scale.shape"},
      {"one row-wise, one not", [](LinearRequest* r) { r->input_scale = Scales({4}, 1.0f); },
       "op.weight_scale.shape"},
      {"fp8 output", [](LinearRequest* r) { r->output_dtype = DType::kFloat8E4M3Fn; },
       "op.output_dtype"},
      {"fp8 bias", [](LinearRequest* r) { r->bias = RandomFp8(DType::kFloat8E4M3Fn, {8}, 3); },
       "op.bias.dtype"},
      {"wide config", [](LinearRequest* r) { r->configs = {"cpu:bf16"}; }, "configs[0]"},
      {"other format", [](LinearRequest* r) { r->configs = {"cpu:fp8e5m2"}; }, "configs[0]"},
      {"other scaling", [](LinearRequest* r) { r->configs = {"cpu:fp8e4m3@scaling=row"}; },
       "scaling=row"},
      {"option on bf16",
       [](LinearRequest* r) {
         r->configs = {"cpu:fp64"};
         r->reference = "cpu:fp64@fast_accum";
       },
       "fp8 precisions only"},
      {"scales with wide operands",
       [](LinearRequest* r) {
         r->input = Scales({4, 64}, 1.0f);
         r->weight = Scales({8, 64}, 1.0f);
       },
       "op.input_scale"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    LinearRequest r = Fp8Request(4, 8, 64, /*row_wise=*/false);
    c.mutate(&r);
    EXPECT_THAT(engine_->Verify(r),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.field)));
  }
}

// Every element of a scale must be finite and positive: the message names
// the field, the element (for a scale with dimensions) and the value, and
// the engine answers a good request afterwards. The messages are written
// out here from the rule in docs/numerics.md ("FP8").
TEST_F(Fp8EngineTest, ScaleThatIsNotFiniteAndPositiveIsInvalidArgumentNamingTheElement) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  struct Case {
    const char* name;
    bool row_wise;
    void (*mutate)(LinearRequest*, float);
    float value;
    const char* message;
  };
  // Per tensor: input_scale has shape [], weight_scale [1]; row-wise:
  // input_scale [4, 1], weight_scale [8].
  auto set_input = [](LinearRequest* r, float v) { r->input_scale->data<float>()[0] = v; };
  auto set_weight = [](LinearRequest* r, float v) { r->weight_scale->data<float>()[0] = v; };
  auto set_weight_5 = [](LinearRequest* r, float v) { r->weight_scale->data<float>()[5] = v; };
  auto set_input_3 = [](LinearRequest* r, float v) { r->input_scale->data<float>()[3] = v; };
  const Case cases[] = {
      {"NaN input scale", false, set_input, nan,
       "op.input_scale: a finite, positive float32 scale expected, got NaN"},
      {"+Inf weight scale", false, set_weight, inf,
       "op.weight_scale[0]: a finite, positive float32 scale expected, got +Inf"},
      {"-Inf weight scale", false, set_weight, -inf,
       "op.weight_scale[0]: a finite, positive float32 scale expected, got -Inf"},
      {"zero input scale", false, set_input, 0.0f,
       "op.input_scale: a finite, positive float32 scale expected, got 0"},
      {"negative zero weight scale", false, set_weight, -0.0f,
       "op.weight_scale[0]: a finite, positive float32 scale expected, got -0"},
      {"-1 weight scale", false, set_weight, -1.0f,
       "op.weight_scale[0]: a finite, positive float32 scale expected, got -1"},
      {"NaN in one row-wise weight scale", true, set_weight_5, nan,
       "op.weight_scale[5]: a finite, positive float32 scale expected, got NaN"},
      {"-1 in one row-wise input scale", true, set_input_3, -1.0f,
       "op.input_scale[3]: a finite, positive float32 scale expected, got -1"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    LinearRequest r = Fp8Request(4, 8, 64, c.row_wise);
    c.mutate(&r, c.value);
    EXPECT_THAT(engine_->Verify(r),
                StatusIs(absl::StatusCode::kInvalidArgument, ::testing::Eq(c.message)));
    // Diagnose takes the same rule (the wrong scale would otherwise be
    // blamed on the column or row it scales).
    r.observed = *FromFloats(DType::kBFloat16, {4, 8}, std::vector<float>(32, 0.0f));
    EXPECT_THAT(engine_->Diagnose(r),
                StatusIs(absl::StatusCode::kInvalidArgument, ::testing::Eq(c.message)));
  }
  // The smallest positive float32 (a subnormal, 2^-149) is a valid scale,
  // and a good request is answered after the refusals.
  for (bool row_wise : {false, true}) {
    LinearRequest r = Fp8Request(4, 8, 64, row_wise);
    r.weight_scale->data<float>()[0] = std::ldexp(1.0f, -149);
    r.configs = {"cpu:fp8e4m3"};
    EXPECT_THAT(engine_->Verify(r), IsOk());
  }
}

TEST_F(Fp8EngineTest, DiagnoseWithDefaultCandidatesTakesTheScalesScaling) {
  for (bool row_wise : {false, true}) {
    LinearRequest r = Fp8Request(3, 5, 64, row_wise);
    r.observed = *FromFloats(DType::kBFloat16, {3, 5}, std::vector<float>(15, 0.0f));
    auto out = engine_->Diagnose(r);
    ASSERT_THAT(out, IsOk());
    ASSERT_EQ(out->results.size(), 2u);
    EXPECT_THAT(out->results[0].config, HasSubstr(row_wise ? "scaling=row" : "scaling=tensor"));
  }
}

TEST_F(Fp8EngineTest, MixedFormatsRunUnderTheirPrecisionAndE5m2TimesE5m2Too) {
  for (auto [x, w, precision] :
       {std::tuple{DType::kFloat8E4M3Fn, DType::kFloat8E5M2, "fp8e4m3e5m2"},
        std::tuple{DType::kFloat8E5M2, DType::kFloat8E4M3Fn, "fp8e5m2e4m3"},
        std::tuple{DType::kFloat8E5M2, DType::kFloat8E5M2, "fp8e5m2"}}) {
    SCOPED_TRACE(precision);
    LinearRequest r = Fp8Request(2, 3, 32, false, x, w);
    r.configs = {std::string("cpu:") + precision};
    auto out = engine_->Verify(r);
    ASSERT_THAT(out, IsOk());
    EXPECT_EQ(out->results[0].config, std::string("cpu:") + precision + ":none@scaling=tensor");
  }
}

TEST_F(Fp8EngineTest, DefaultCandidatesAreTheOperandsPrecisionSplitAndFast) {
  EXPECT_THAT(engine_->DefaultCandidates(DType::kFloat8E4M3Fn, DType::kFloat8E5M2, false,
                                         Activation::kNone),
              ElementsAre("cpu:fp8e4m3e5m2:none@scaling=tensor",
                          "cpu:fp8e4m3e5m2:none@scaling=tensor,fast_accum"));
  EXPECT_THAT(
      engine_->DefaultCandidates(DType::kFloat8E4M3Fn, DType::kFloat8E4M3Fn, false,
                                 Activation::kNone, Fp8Scaling::kRow),
      ElementsAre("cpu:fp8e4m3:none@scaling=row", "cpu:fp8e4m3:none@scaling=row,fast_accum"));
  // Wide operands: no fp8 candidate unless asked for by name.
  for (const std::string& c :
       engine_->DefaultCandidates(DType::kBFloat16, DType::kBFloat16, true, Activation::kNone)) {
    EXPECT_THAT(c, ::testing::Not(HasSubstr("fp8")));
  }
}

// An output of each FP8 configuration is diagnosed as that configuration:
// the precision, the scaling (from the recipe, for wide operands) and the
// accumulation.
TEST_F(Fp8EngineTest, DiagnosisNamesScalingAndAccumulation) {
  LinearRequest base;
  base.input = ::tensorcheck::testing::RandomNormal({16, 512}, 1.0, 21, DType::kBFloat16);
  base.weight = ::tensorcheck::testing::RandomNormal({24, 512}, 0.05, 22, DType::kBFloat16);
  base.output_dtype = DType::kFloat32;  // every low bit of the accumulation shows
  // Rows of very different magnitudes: row-wise and per-tensor scaling
  // quantise them differently.
  for (int64_t i = 0; i < 16 * 512; ++i) {
    if ((i / 512) % 2 == 1) {
      base.input.data<uint16_t>()[i] =
          static_cast<uint16_t>(base.input.data<uint16_t>()[i] - 0x0300);
    }
  }
  const std::vector<std::string> candidates = {
      "cpu:fp8e4m3@scaling=tensor", "cpu:fp8e4m3@scaling=tensor,fast_accum",
      "cpu:fp8e4m3@scaling=row", "cpu:fp8e4m3@scaling=row,fast_accum", "cpu:bf16"};
  for (const std::string& truth : {candidates[1], candidates[2], candidates[3]}) {
    SCOPED_TRACE(truth);
    LinearRequest produce = Operands(base);
    produce.configs = {truth};
    produce.return_outputs = true;
    auto made = engine_->Verify(produce);
    ASSERT_THAT(made, IsOk());
    LinearRequest r = Operands(base);
    r.observed = std::move(*made->results[0].output);
    r.configs = candidates;
    auto out = engine_->Diagnose(r);
    ASSERT_THAT(out, IsOk());
    ASSERT_TRUE(out->diagnosis->best.has_value()) << out->diagnosis->explanation;
    EXPECT_EQ(*out->diagnosis->best, made->results[0].config);
  }
}

}  // namespace
}  // namespace tensorcheck
