// Split-K with the partial results reduced in the output type
// (docs/numerics.md, "Split-K"): the CPU emulation against the definition
// redone here, and diagnoses that name the split count and the reduction
// of outputs this test makes with its own loops, the public report's case
// among them, while plain bf16 and fp16-accumulated outputs keep their
// names.
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
using ::tensorcheck::testing::kBf16Format;
using ::tensorcheck::testing::kFp16Format;
using ::tensorcheck::testing::RefRound;
using ::tensorcheck::testing::StatusIs;
using ::testing::HasSubstr;

class SplitKTest : public ::tensorcheck::testing::BuiltinEngineTest {};

// The slices of the definition: ceil(K / s) rounded up to a multiple of 8,
// the last one what is left.
std::vector<std::pair<int64_t, int64_t>> Slices(int64_t k, int s) {
  const int64_t size = ((k + s - 1) / s + 7) / 8 * 8;
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t k0 = 0; k0 < k; k0 += size) out.push_back({k0, std::min(k, k0 + size)});
  return out;
}

// y = reduce(partials) (+ b, fused), for x [m, k] and w [n, k] given as
// doubles; each partial summed in fp64 and rounded to fp32 (exact where
// the test chooses values whose sums are), then rounded to the output
// format and added left to right in it (`in_output`), or added in fp32.
std::vector<double> SplitKOutput(const std::vector<double>& x, const std::vector<double>& w,
                                 const std::vector<double>& b, int64_t m, int64_t n, int64_t k,
                                 int s, bool in_output, const ::tensorcheck::testing::Format& out) {
  std::vector<double> y(static_cast<size_t>(m * n));
  const auto slices = Slices(k, s);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double r = 0;
      for (size_t q = 0; q < slices.size(); ++q) {
        double partial = 0;
        for (int64_t t = slices[q].first; t < slices[q].second; ++t) {
          partial += x[static_cast<size_t>(i * k + t)] * w[static_cast<size_t>(j * k + t)];
        }
        const double p = static_cast<float>(partial);
        if (in_output) {
          const double pr = RefRound(p, out);
          r = q == 0 ? pr : RefRound(static_cast<float>(r + pr), out);
        } else {
          r = q == 0 ? p : static_cast<float>(r + p);
        }
      }
      const double bj = b.empty() ? 0.0 : b[static_cast<size_t>(j)];
      y[static_cast<size_t>(i * n + j)] = RefRound(static_cast<float>(r + bj), out);
    }
  }
  return y;
}

std::vector<double> Values(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  ToDouble(t, v.data());
  return v;
}

TEST(SplitKGrammarTest, SplitKParsesOnSixteenBitPrecisionsAndPrintsCanonically) {
  auto spec = ParseConfigSpec("cpu:bf16:fused@splitk=4");
  ASSERT_THAT(spec, IsOk());
  const Config c = ResolveConfig(*spec, true, Activation::kNone, BiasMode::kFused);
  EXPECT_EQ(c.ToString(), "cpu:bf16:fused@splitk=4,reduce=output");
  auto fp32 = ParseConfigSpec("cpu:fp16@splitk=3,reduce=fp32,algo=0");
  ASSERT_THAT(fp32, IsOk());
  EXPECT_EQ(ResolveConfig(*fp32, false, Activation::kNone, BiasMode::kFused).ToString(),
            "cpu:fp16:none@splitk=3,reduce=fp32,algo=0");
  for (const auto& [text, message] : std::vector<std::pair<const char*, const char*>>{
           {"cpu:fp32@splitk=4", "applies to the bf16 and fp16 precisions only, not fp32"},
           {"cpu:bf16@splitk=1", "splitk=N expects an integer N from 2 to 64"},
           {"cpu:bf16@splitk=65", "splitk=N expects an integer N from 2 to 64"},
           {"cpu:bf16@reduce=output", "option 'reduce' needs splitk=N"},
           {"cpu:bf16@splitk=2,reduce=bf16", "unknown split-K reduction 'bf16'"},
           {"cpu:bf16@splitk=2,splitk=3", "unknown or repeated option 'splitk=3'"}}) {
    SCOPED_TRACE(text);
    EXPECT_THAT(ParseConfigSpec(text),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(message)));
  }
}

// Small integers: every partial and every sum is exact in fp32, so the
// emulation must equal the definition bit for bit, in both weight layouts,
// for an even split and for an uneven last slice.
TEST_F(SplitKTest, EmulationIsTheDefinitionBitForBit) {
  for (const auto& [m, n, k, s] : std::vector<std::tuple<int64_t, int64_t, int64_t, int>>{
           {3, 5, 64, 4}, {2, 7, 1000, 3}, {4, 3, 200, 16}}) {
    std::mt19937 rng(static_cast<uint32_t>(k + s));
    std::uniform_int_distribution<int> value(-4, 4);
    std::vector<double> x(static_cast<size_t>(m * k)), w(static_cast<size_t>(n * k)),
        b(static_cast<size_t>(n));
    for (double& v : x) v = value(rng) * 0.25;
    for (double& v : w) v = value(rng) * 0.5;
    for (double& v : b) v = value(rng) * 0.125;
    for (bool in_output : {true, false}) {
      for (bool in_out : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << m << "x" << k << "->" << n << " splitk=" << s
                     << (in_output ? " output" : " fp32") << (in_out ? " IN_OUT" : ""));
        LinearRequest r;
        r.input = *FromDoubles(DType::kBFloat16, {m, k}, x);
        if (in_out) {
          std::vector<double> wt(w.size());
          for (int64_t j = 0; j < n; ++j) {
            for (int64_t t = 0; t < k; ++t)
              wt[static_cast<size_t>(t * n + j)] = w[static_cast<size_t>(j * k + t)];
          }
          r.weight = *FromDoubles(DType::kBFloat16, {k, n}, wt);
          r.layout = WeightLayout::kInOut;
        } else {
          r.weight = *FromDoubles(DType::kBFloat16, {n, k}, w);
        }
        r.bias = *FromDoubles(DType::kBFloat16, {n}, b);
        r.configs = {absl::StrCat("cpu:bf16:fused@splitk=", s,
                                  in_output ? ",reduce=output" : ",reduce=fp32")};
        r.return_outputs = true;
        auto out = engine_->Verify(r);
        ASSERT_THAT(out, IsOk());
        const std::vector<double> want = SplitKOutput(x, w, b, m, n, k, s, in_output, kBf16Format);
        const std::vector<double> got = Values(*out->results[0].output);
        EXPECT_EQ(got, want);
        EXPECT_EQ(out->results[0].details.at("splitk"), absl::StrCat(s));
      }
    }
  }
}

// The public report's case (16x14336->512 bf16, K split into 4, each
// partial rounded to bf16, the partials added left to right in bf16), and
// a shape with an uneven last slice: a default diagnosis names the split
// count and the reduction; a plain bf16 output keeps its name, and so
// does an fp16-accumulated one.
struct Case {
  const char* name;
  int64_t m, n, k;
  int splitk;  // 0: a plain fp32 accumulation
  DType storage;
  const char* best;
};

TEST_F(SplitKTest, DiagnosisNamesTheSplitAndTheReduction) {
  const Case cases[] = {
      {"the report's case", 16, 512, 14336, 4, DType::kBFloat16,
       "cpu:bf16:none@splitk=4,reduce=output"},
      {"an uneven last slice", 16, 256, 3000, 3, DType::kBFloat16,
       "cpu:bf16:none@splitk=3,reduce=output"},
      {"fp16, split in 8", 16, 256, 4096, 8, DType::kFloat16,
       "cpu:fp16:none@splitk=8,reduce=output"},
      {"plain bf16", 16, 256, 4096, 0, DType::kBFloat16, "cpu:bf16:none"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const Tensor x = ::tensorcheck::testing::RandomNormal({c.m, c.k}, 1.0, 61, c.storage);
    const Tensor w = ::tensorcheck::testing::RandomNormal(
        {c.n, c.k}, 1.0 / std::sqrt(static_cast<double>(c.k)), 62, c.storage);
    const auto& format = c.storage == DType::kBFloat16 ? kBf16Format : kFp16Format;
    const std::vector<double> y =
        SplitKOutput(Values(x), Values(w), {}, c.m, c.n, c.k, std::max(c.splitk, 1),
                     /*in_output=*/c.splitk > 0, format);
    LinearRequest r;
    r.input = x.Clone();
    r.weight = w.Clone();
    r.observed = *FromDoubles(c.storage, {c.m, c.n}, y);
    auto out = engine_->Diagnose(r);
    ASSERT_THAT(out, IsOk());
    const DiagnosisOutcome& d = *out->diagnosis;
    ASSERT_TRUE(d.best.has_value()) << d.explanation;
    EXPECT_EQ(*d.best, c.best) << d.explanation;
    EXPECT_EQ(d.verdict, DiagnosisVerdict::kRounding) << d.verdict_reason;
    EXPECT_EQ(d.candidate_tiers, c.splitk > 0 ? (std::vector<int>{1, 2}) : std::vector<int>{1});
    if (c.splitk > 0) {
      // PyTorch's switch, in the hint and in the advice back to one
      // rounding.
      const std::string flag = c.storage == DType::kBFloat16
                                   ? "allow_bf16_reduced_precision_reduction"
                                   : "allow_fp16_reduced_precision_reduction";
      EXPECT_THAT(d.framework_hint, HasSubstr(flag + " = True")) << d.framework_hint;
      EXPECT_THAT(d.advice, HasSubstr(flag + " = False")) << d.advice;
    }
  }
}

// fp16 accumulation (every multiply-add rounded to fp16, k ascending) is
// not split-K: its output keeps the name fp16acc.
TEST_F(SplitKTest, AnFp16AccumulatedOutputIsStillFp16acc) {
  const int64_t m = 8, n = 64, k = 512;
  const Tensor x = ::tensorcheck::testing::RandomNormal({m, k}, 1.0, 71, DType::kFloat16);
  const Tensor w = ::tensorcheck::testing::RandomNormal({n, k}, 0.05, 72, DType::kFloat16);
  const std::vector<double> xv = Values(x), wv = Values(w);
  std::vector<double> y(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t t = 0; t < k; ++t) {
        acc =
            RefRound(acc + xv[static_cast<size_t>(i * k + t)] * wv[static_cast<size_t>(j * k + t)],
                     kFp16Format);
      }
      y[static_cast<size_t>(i * n + j)] = acc;
    }
  }
  LinearRequest r;
  r.input = x.Clone();
  r.weight = w.Clone();
  r.observed = *FromDoubles(DType::kFloat16, {m, n}, y);
  auto out = engine_->Diagnose(r);
  ASSERT_THAT(out, IsOk());
  ASSERT_TRUE(out->diagnosis->best.has_value()) << out->diagnosis->explanation;
  EXPECT_EQ(*out->diagnosis->best, "cpu:fp16acc:none") << out->diagnosis->explanation;
}

}  // namespace
}  // namespace tensorcheck
