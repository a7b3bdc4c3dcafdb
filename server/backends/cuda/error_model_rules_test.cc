// What one thread of the error-model kernels (error_model_kernels.cu) does
// with each of its elements, run on the host: the per-element rules of
// server/stats/error_model_rules.h with the per-request constants the host
// computes (SigmaConstantsOf, BoundConstantsOf, FlipConstantsOf), against
// stats' whole-array PredictSigma, PredictPairSigma,
// PredictPairAccumulationSigma, HardBound and FlipGrid (themselves tested
// against hand-derived values in error_model_test.cc), bit for bit, over
// random and edge inputs; OutputSpacing and TF32 rounding against values
// derived by hand or from std::nextafter. In a build without CUDA too.
#include "server/stats/error_model_rules.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/float_formats.h"
#include "core/linear_config.h"
#include "core/tf32_rounding.h"
#include "server/stats/error_model.h"
#include "server/stats/ulp.h"

namespace tensorcheck {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr float kInfF = std::numeric_limits<float>::infinity();
constexpr float kNanF = std::numeric_limits<float>::quiet_NaN();

uint64_t Bits(double v) { return DoubleBits(v); }

// Per-element operands: every combination of the edge values, then random
// ones of mixed magnitudes and signs.
struct Operands {
  std::vector<float> abs_dot, sq_dot, pre_bias;
  std::vector<double> value;
  int64_t count() const { return static_cast<int64_t>(value.size()); }
};

Operands MakeOperands() {
  const float dots[] = {0.0f, 1e-45f, 1e-40f, 1.17549435e-38f, 0.75f,
                        3.5f, 1e30f,  3e38f,  kInfF,           kNanF};
  const double values[] = {0.0,   -0.0, 5e-324, 1e-310, 1e-300, 1e-45, 1.0,   -2.5,
                           65504, 1e10, 3e38,   1e50,   1e200,  kInf,  -kInf, kNan};
  const float pre_biases[] = {0.0f, -0.0f, 1e-45f, -1.0f, 7.25f, 1e30f, 3.4e38f, -kInfF, kNanF};
  Operands op;
  for (float d : dots) {
    for (double v : values) {
      for (float p : pre_biases) {
        op.abs_dot.push_back(d);
        op.sq_dot.push_back(d);
        op.value.push_back(v);
        op.pre_bias.push_back(p);
      }
    }
  }
  std::mt19937 rng(17);
  std::uniform_real_distribution<double> exponent(-60.0, 60.0);
  std::uniform_int_distribution<int> sign(0, 1);
  auto draw = [&] { return (sign(rng) ? -1.0 : 1.0) * std::exp2(exponent(rng)); };
  for (int i = 0; i < 4000; ++i) {
    const float abs_dot = static_cast<float>(std::fabs(draw()));
    op.abs_dot.push_back(abs_dot);
    op.sq_dot.push_back(abs_dot / static_cast<float>(1 + i % 5));
    op.pre_bias.push_back(static_cast<float>(draw()));
    op.value.push_back(draw());
  }
  return op;
}

// Float bit patterns, so that -0 and +0 differ; any NaN equals any NaN
// (IEEE 754 leaves the sign and payload of an operation's NaN open: x86
// makes -nan of inf - inf at run time, a compiler's constant folding +nan,
// so they differ between builds of the same code).
void ExpectSameFloats(const std::vector<float>& expected, const std::vector<float>& actual,
                      const std::string& what) {
  ASSERT_EQ(expected.size(), actual.size());
  int reported = 0;
  for (size_t i = 0; i < expected.size() && reported < 5; ++i) {
    if (std::isnan(expected[i]) && std::isnan(actual[i])) continue;
    if (FloatBits(expected[i]) != FloatBits(actual[i])) {
      ADD_FAILURE() << what << " element " << i << ": expected " << expected[i] << " got "
                    << actual[i];
      ++reported;
    }
  }
}

TEST(ErrorModelRulesTest, SigmaConstantsMatchHandComputation) {
  ErrorModelInput in;
  in.precision = Precision::kBf16;
  in.k = 4096;
  in.output_dtype = DType::kFloat32;
  rules::SigmaConstants c = SigmaConstantsOf(in, SigmaKind::kSingle);
  EXPECT_EQ(c.u_in2, 0x1p-16);
  EXPECT_EQ(c.u_acc2, 0x1p-48);
  EXPECT_EQ(c.u_out2, 0x1p-48);
  EXPECT_EQ(c.k, 4096.0);
  EXPECT_EQ(c.product_term, 0.0);
  EXPECT_EQ(c.floor, 0x1p-149);  // 2^-24 * 2^-126 is below the least float
  EXPECT_EQ(c.input_weight, 1.0);
  EXPECT_EQ(c.other_weight, 1.0);
  EXPECT_EQ(c.output_weight, 1.0);
  EXPECT_FALSE(c.unfused_bias);
  EXPECT_FALSE(c.has_pre_bias);

  in.precision = Precision::kFp16Acc;
  in.output_dtype = DType::kFloat16;
  in.k = -3;  // taken as 0
  in.unfused_bias = true;
  const float pre_bias = 1.0f;
  in.pre_bias = &pre_bias;
  in.inputs_exact = true;
  c = SigmaConstantsOf(in, SigmaKind::kSingle);
  EXPECT_EQ(c.k, 0.0);
  EXPECT_EQ(c.product_term, 0x1p-22 / 3);
  EXPECT_EQ(c.floor, 0x1p-25);  // u_out 2^-11 times fp16's least normal 2^-14
  EXPECT_EQ(c.input_weight, 0.0);
  EXPECT_TRUE(c.unfused_bias);
  EXPECT_TRUE(c.has_pre_bias);

  c = SigmaConstantsOf(in, SigmaKind::kPair);
  EXPECT_EQ(c.input_weight, 0.0);
  EXPECT_EQ(c.other_weight, 2.0);
  EXPECT_EQ(c.output_weight, 1.0);
  c = SigmaConstantsOf(in, SigmaKind::kPairAccumulation);
  EXPECT_EQ(c.output_weight, 0.0);
  EXPECT_EQ(c.floor, 0x1p-149);  // no output rounding, no output floor

  in.unfused_bias = false;  // x.w is read only with an unfused bias
  EXPECT_FALSE(SigmaConstantsOf(in, SigmaKind::kSingle).has_pre_bias);
}

TEST(ErrorModelRulesTest, BoundAndFlipConstantsMatchHandComputation) {
  ErrorModelInput in;
  in.precision = Precision::kBf16;
  in.k = 64;
  in.output_dtype = DType::kFloat16;
  rules::BoundConstants b = BoundConstantsOf(in, /*c=*/3.0);
  EXPECT_EQ(b.scale, 3.0 * 0x1p-8 * 8.0);
  EXPECT_EQ(b.u_out, 0x1p-11);
  EXPECT_EQ(b.out, 2 * 0x1p-11);  // the output's rounding and the reference's
  EXPECT_FALSE(b.has_pre_bias);
  in.inputs_exact = true;  // bf16 inputs are not rounded again: fp32's unit
  EXPECT_EQ(BoundConstantsOf(in, 3.0).scale, 3.0 * 0x1p-24 * 8.0);
  in.inputs_exact = false;
  in.unfused_bias = true;  // without x.w: |y| three times
  EXPECT_EQ(BoundConstantsOf(in, 3.0).out, 3 * 0x1p-11);
  const float pre_bias = 1.0f;
  in.pre_bias = &pre_bias;
  b = BoundConstantsOf(in, 3.0);
  EXPECT_EQ(b.out, 2 * 0x1p-11);
  EXPECT_TRUE(b.has_pre_bias);

  FlipGridInput g;
  g.output_dtype = DType::kBFloat16;
  g.unfused_bias = true;
  g.activation = Activation::kGeluTanh;
  const rules::FlipConstants f = FlipConstantsOf(g);
  EXPECT_EQ(f.output, rules::ElemType::kBF16);
  EXPECT_TRUE(f.unfused_bias);
  EXPECT_EQ(f.activation, rules::kActivationGeluTanh);
  EXPECT_EQ(FlipConstantsOf(FlipGridInput{}).activation, rules::kActivationNone);
  g.activation = Activation::kRelu;
  EXPECT_EQ(FlipConstantsOf(g).activation, rules::kActivationRelu);
}

// The rules with SigmaConstantsOf give PredictSigma's (PredictPairSigma's,
// PredictPairAccumulationSigma's) sigma bit for bit, and their squares
// summed in element order its sum, for every precision, output dtype,
// bias placement and input exactness.
TEST(ErrorModelRulesTest, ElementSigmaIsPredictSigmaBitForBit) {
  const Operands op = MakeOperands();
  const int64_t n = op.count();
  std::vector<float> expected(n), actual(n);
  for (Precision p : kAllPrecisions) {
    for (DType out : kWideDTypes) {
      for (int variant = 0; variant < 8; ++variant) {
        const bool unfused = variant & 1, with_pre_bias = variant & 2, exact = variant & 4;
        ErrorModelInput in{p,
                           variant < 4 ? 4096 : 7,
                           out,
                           unfused,
                           op.abs_dot.data(),
                           op.sq_dot.data(),
                           op.value.data(),
                           n};
        in.inputs_exact = exact;
        in.pre_bias = with_pre_bias ? op.pre_bias.data() : nullptr;
        const std::string what = std::string(PrecisionName(p)) + " " + std::string(DTypeName(out)) +
                                 " variant " + std::to_string(variant);
        for (SigmaKind kind :
             {SigmaKind::kSingle, SigmaKind::kPair, SigmaKind::kPairAccumulation}) {
          SCOPED_TRACE(what + " kind " + std::to_string(static_cast<int>(kind)));
          double expected_sum = 0;
          switch (kind) {
            case SigmaKind::kSingle:
              expected_sum = PredictSigma(in, expected.data());
              break;
            case SigmaKind::kPair:
              expected_sum = PredictPairSigma(in, expected.data());
              break;
            case SigmaKind::kPairAccumulation:
              PredictPairAccumulationSigma(in, expected.data());
              break;
          }
          const rules::SigmaConstants c = SigmaConstantsOf(in, kind);
          double sum = 0;
          for (int64_t i = 0; i < n; ++i) {
            actual[i] = rules::ElementSigma(c, op.sq_dot[i], op.value[i],
                                            c.has_pre_bias ? op.pre_bias[i] : 0.0f);
            sum += static_cast<double>(actual[i]) * actual[i];
          }
          ExpectSameFloats(expected, actual, "sigma");
          if (kind != SigmaKind::kPairAccumulation) {
            EXPECT_EQ(Bits(sum), Bits(expected_sum));
          }
        }
      }
    }
  }
}

TEST(ErrorModelRulesTest, ElementHardBoundIsHardBoundBitForBit) {
  const Operands op = MakeOperands();
  const int64_t n = op.count();
  std::vector<float> expected(n), actual(n);
  for (Precision p : kAllPrecisions) {
    for (DType out : kWideDTypes) {
      for (int variant = 0; variant < 4; ++variant) {
        const bool unfused = variant & 1, with_pre_bias = variant & 2;
        ErrorModelInput in{
            p, 4096, out, unfused, op.abs_dot.data(), op.sq_dot.data(), op.value.data(), n};
        in.pre_bias = with_pre_bias ? op.pre_bias.data() : nullptr;
        for (double factor : {1.0, 3.5}) {
          SCOPED_TRACE(std::string(PrecisionName(p)) + " " + std::string(DTypeName(out)) +
                       " variant " + std::to_string(variant) + " c " + std::to_string(factor));
          HardBound(in, factor, expected.data());
          const rules::BoundConstants c = BoundConstantsOf(in, factor);
          for (int64_t i = 0; i < n; ++i) {
            actual[i] = rules::ElementHardBound(c, op.abs_dot[i], op.value[i],
                                                c.has_pre_bias ? op.pre_bias[i] : 0.0f);
          }
          ExpectSameFloats(expected, actual, "bound");
        }
      }
    }
  }
}

TEST(ErrorModelRulesTest, ElementFlipGridIsFlipGridBitForBit) {
  const Operands op = MakeOperands();
  const int64_t n = op.count(), cols = 7;
  std::vector<double> bias = {0.0, -1.0, 0.25, 1e-300, -7.25, 3e38, -1e300};
  std::vector<float> expected(n), actual(n);
  for (DType out : kWideDTypes) {
    for (Activation act : {Activation::kNone, Activation::kRelu, Activation::kGeluTanh}) {
      for (int variant = 0; variant < 4; ++variant) {
        SCOPED_TRACE(std::string(DTypeName(out)) + " " + std::string(ActivationName(act)) +
                     " variant " + std::to_string(variant));
        FlipGridInput in;
        in.output_dtype = out;
        in.unfused_bias = variant & 1;
        in.activation = act;
        in.pre_bias = op.pre_bias.data();
        in.bias = variant & 2 ? bias.data() : nullptr;
        in.cols = cols;
        in.count = n;
        FlipGrid(in, expected.data());
        const rules::FlipConstants c = FlipConstantsOf(in);
        for (int64_t i = 0; i < n; ++i) {
          const bool has_bias = in.bias != nullptr;
          actual[i] =
              rules::ElementFlipGrid(c, op.pre_bias[i], has_bias, has_bias ? bias[i % cols] : 0);
        }
        ExpectSameFloats(expected, actual, "grid");
      }
    }
  }
}

// std::nextafter's step above |v| in the type, where v is a finite value
// of it below its largest.
double StepAboveDouble(double v) {
  const double a = std::fabs(v);
  return std::nextafter(a, kInf) - a;
}
double StepAboveFloat(float v) {
  const float a = std::fabs(v);
  return static_cast<double>(std::nextafter(a, kInfF) - a);
}

TEST(ErrorModelRulesTest, OutputSpacingIsNextafterStepInFp64AndFp32) {
  for (double v : {1.0, 1.5, -3.0, 0.0, 1e-300, 0x1p-1022, -0x1.8p-1021, 1e-310, 5e-324, 1e300,
                   -7.25, 0x1.fffffffffffffp1022}) {
    SCOPED_TRACE(v);
    EXPECT_EQ(rules::OutputSpacing(v, rules::ElemType::kF64), StepAboveDouble(v));
  }
  for (float v :
       {1.0f, 1.5f, -3.0f, 0.0f, 1e-40f, 1e-45f, 1.17549435e-38f, -5.5f, 3e38f, 0x1.fffffcp127f}) {
    SCOPED_TRACE(v);
    EXPECT_EQ(rules::OutputSpacing(v, rules::ElemType::kF32), StepAboveFloat(v));
  }
}

TEST(ErrorModelRulesTest, OutputSpacingMatchesHandDerivedSteps) {
  using rules::ElemType;
  // bf16: 7 mantissa bits, fp32's exponent range.
  EXPECT_EQ(rules::OutputSpacing(1.0, ElemType::kBF16), 0x1p-7);
  EXPECT_EQ(rules::OutputSpacing(-3.0, ElemType::kBF16), 0x1p-6);
  EXPECT_EQ(rules::OutputSpacing(1e-40, ElemType::kBF16), 0x1p-133);  // subnormal
  EXPECT_EQ(rules::OutputSpacing(3e38, ElemType::kBF16), 0x1p120);
  // fp16: 10 mantissa bits, least normal 2^-14.
  EXPECT_EQ(rules::OutputSpacing(65504.0, ElemType::kF16), 32.0);
  EXPECT_EQ(rules::OutputSpacing(0x1p-14, ElemType::kF16), 0x1p-24);
  EXPECT_EQ(rules::OutputSpacing(1e-6, ElemType::kF16), 0x1p-24);   // subnormal
  EXPECT_EQ(rules::OutputSpacing(1e300, ElemType::kF16), 0x1p986);  // 2^996 in 2^(996 - 10)
  // Infinities and NaN: the smallest step; double subnormals: the type's.
  EXPECT_EQ(rules::OutputSpacing(kInf, ElemType::kF16), 0x1p-24);
  EXPECT_EQ(rules::OutputSpacing(-kInf, ElemType::kF64), 0x1p-1074);
  EXPECT_EQ(rules::OutputSpacing(kNan, ElemType::kF32), 0x1p-149);
  EXPECT_EQ(rules::OutputSpacing(1e-310, ElemType::kF32), 0x1p-149);
  EXPECT_EQ(rules::OutputSpacing(-1e-310, ElemType::kBF16), 0x1p-133);
  // Steps among fp64's subnormals, built from their bits: 2^-1073 at 2^-1021.
  EXPECT_EQ(rules::OutputSpacing(0x1p-1021, ElemType::kF64), 0x1p-1073);
  // The public face keyed by DType is the same function.
  for (DType d : kWideDTypes) {
    EXPECT_EQ(OutputSpacing(0.1, d), rules::OutputSpacing(0.1, ElemTypeOf(d)));
  }
}

TEST(ErrorModelRulesTest, ActivationAndSlopeMatchHandValues) {
  rules::ActivationSlope r = rules::ActivationAndSlope(rules::kActivationNone, -2.5);
  EXPECT_EQ(r.value, -2.5);
  EXPECT_EQ(r.slope, 1.0);
  r = rules::ActivationAndSlope(rules::kActivationRelu, 2.0);
  EXPECT_EQ(r.value, 2.0);
  EXPECT_EQ(r.slope, 1.0);
  r = rules::ActivationAndSlope(rules::kActivationRelu, -0.5);
  EXPECT_EQ(r.value, 0.0);
  EXPECT_EQ(r.slope, 0.0);
  r = rules::ActivationAndSlope(rules::kActivationRelu, 0.0);  // cut at 0
  EXPECT_EQ(r.slope, 0.0);
  r = rules::ActivationAndSlope(rules::kActivationGeluTanh, 0.0);  // tanh(0) = 0
  EXPECT_EQ(r.value, 0.0);
  EXPECT_EQ(r.slope, 0.5);
  // GELU(v) = v/2 (1 + tanh(sqrt(2/pi)(v + 0.044715 v^3))), in long double;
  // its slope by central differences.
  auto gelu = [](long double v) {
    return 0.5L * v *
           (1 + std::tanh(0.797884560802865355879892119869L * (v + 0.044715L * v * v * v)));
  };
  for (double v : {-3.0, -0.75, 0.5, 1.75, 6.0}) {
    SCOPED_TRACE(v);
    r = rules::ActivationAndSlope(rules::kActivationGeluTanh, v);
    EXPECT_NEAR(r.value, static_cast<double>(gelu(v)), 1e-15);
    const long double h = 1e-6L;
    const double slope = static_cast<double>(std::fabs((gelu(v + h) - gelu(v - h)) / (2 * h)));
    EXPECT_NEAR(r.slope, slope, 1e-9);
  }
  r = rules::ActivationAndSlope(rules::kActivationGeluTanh, kNan);
  EXPECT_TRUE(std::isnan(r.value));
}

// The rules' saturation: a finite sigma past the largest float stores as
// that float, infinities and NaN as themselves.
TEST(ErrorModelRulesTest, ToFloatSaturatedKeepsNanAndInfinity) {
  EXPECT_EQ(rules::ToFloatSaturated(1e300), std::numeric_limits<float>::max());
  EXPECT_EQ(rules::ToFloatSaturated(kInf), kInfF);
  EXPECT_TRUE(std::isnan(rules::ToFloatSaturated(kNan)));
  EXPECT_EQ(rules::ToFloatSaturated(0x1p-149), 0x1p-149f);
  EXPECT_EQ(rules::ToFloatSaturated(1.5), 1.5f);
}

// TF32 rounding (core/tf32_rounding.h, what LaunchRoundTf32 runs)
// against hand-derived bit patterns: TF32 keeps 10 of fp32's 23 mantissa
// bits, so 0x1000 is half its quantum (2^-11 at 1).
TEST(Tf32RoundingTest, BitPatternsMatchHandDerivedRoundings) {
  struct Case {
    uint32_t in, nearest_even, ties_away, truncate;
  };
  const Case cases[] = {
      {0x3f800000u, 0x3f800000u, 0x3f800000u, 0x3f800000u},  // 1: exact
      {0x3f801000u, 0x3f800000u, 0x3f802000u, 0x3f800000u},  // 1 + 2^-11: tie, even below
      {0x3f803000u, 0x3f804000u, 0x3f804000u, 0x3f802000u},  // tie, odd below
      {0x3f801001u, 0x3f802000u, 0x3f802000u, 0x3f800000u},  // just above the tie
      {0x3f800fffu, 0x3f800000u, 0x3f800000u, 0x3f800000u},  // just below it
      {0xbf801000u, 0xbf800000u, 0xbf802000u, 0xbf800000u},  // -(1 + 2^-11): away is down
      {0x3fffffffu, 0x40000000u, 0x40000000u, 0x3fffe000u},  // carry into the exponent
      {0x7f7fffffu, 0x7f800000u, 0x7f800000u, 0x7f7fe000u},  // largest float: to infinity
      {0x00001000u, 0x00000000u, 0x00002000u, 0x00000000u},  // subnormal tie
      {0x00000fffu, 0x00000000u, 0x00000000u, 0x00000000u},  // below half the quantum
      {0x80000000u, 0x80000000u, 0x80000000u, 0x80000000u},  // -0
      {0x7f800000u, 0x7f800000u, 0x7f800000u, 0x7f800000u},  // +inf
      {0xff800000u, 0xff800000u, 0xff800000u, 0xff800000u},  // -inf
      {0x7fc00001u, 0x7fc00001u, 0x7fc00001u, 0x7fc00001u},  // NaN: payload kept
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.in);
    EXPECT_EQ(Tf32Bits(c.in, Tf32Rounding::kNearestEven), c.nearest_even);
    EXPECT_EQ(Tf32Bits(c.in, Tf32Rounding::kTiesAway), c.ties_away);
    EXPECT_EQ(Tf32Bits(c.in, Tf32Rounding::kTruncate), c.truncate);
    EXPECT_EQ(FloatBits(RoundToTf32(BitsToFloat(c.in), Tf32Rounding::kNearestEven)),
              c.nearest_even);
    EXPECT_EQ(FloatBits(RoundToTf32(BitsToFloat(c.in), Tf32Rounding::kTiesAway)), c.ties_away);
    EXPECT_EQ(FloatBits(RoundToTf32(BitsToFloat(c.in), Tf32Rounding::kTruncate)), c.truncate);
  }
  // The launchers' int modes are the enum's values.
  EXPECT_EQ(static_cast<int>(Tf32Rounding::kNearestEven), 0);
  EXPECT_EQ(static_cast<int>(Tf32Rounding::kTiesAway), 1);
  EXPECT_EQ(static_cast<int>(Tf32Rounding::kTruncate), 2);
}

}  // namespace
}  // namespace tensorcheck
