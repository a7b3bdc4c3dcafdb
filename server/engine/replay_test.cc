// Replays of a named GPU's kernels in a diagnosis (docs/numerics.md,
// "Kernel K order"): the GPU names, the recorded kernel-order tables, and
// diagnoses of outputs this test makes with KernelOrderDot (the
// definition, checked against an independent implementation in
// core/tensor_core_model_test.cc) and its own epilogue.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/float_formats.h"
#include "core/tensor_core_model.h"
#include "server/engine/engine.h"
#include "server/engine/kernel_orders.h"
#include "tests/testing/engine_testing.h"
#include "tests/testing/stats_testing.h"
#include "tests/testing/status_matchers.h"

namespace tensorcheck {
namespace {

using ::tensorcheck::testing::IsOk;
using ::tensorcheck::testing::StatusIs;
using ::testing::HasSubstr;

TEST(GpuNameTest, NamesMapToTheirGenerations) {
  for (const auto& [name, gpu] :
       std::vector<std::pair<const char*, TensorCoreGpu>>{{"a100", TensorCoreGpu::kSm80},
                                                          {"H100", TensorCoreGpu::kSm90},
                                                          {"h200", TensorCoreGpu::kSm90},
                                                          {"GH200", TensorCoreGpu::kSm90},
                                                          {"b200", TensorCoreGpu::kSm100},
                                                          {"sm100", TensorCoreGpu::kSm100},
                                                          {"sm80", TensorCoreGpu::kSm80}}) {
    absl::StatusOr<TensorCoreGpu> g = ParseGpuName(name, "gpu");
    ASSERT_THAT(g, IsOk()) << name;
    EXPECT_EQ(*g, gpu) << name;
  }
  EXPECT_THAT(ParseGpuName("v100", "gpu"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("gpu"), HasSubstr("'v100'"), HasSubstr("h100"))));
}

constexpr char kTable[] = R"({
  "gpu": "sm90", "device": "NVIDIA H200", "compute_capability": "9.0",
  "cublaslt_version": 130000, "recorded": "2026-12-01",
  "kernels": [
    {"precision": "bf16", "m": 8, "n": 16, "k": 200, "options": "mma=sm90,tile_k=64,residue=first",
     "algo": "66", "algo_tile": "20", "algo_stages": "8"},
    {"precision": "tf32", "m": 8, "n": 16, "k": 200, "options": "mma=sm90,tile_k=32"}
  ]
})";

TEST(KernelOrderTableTest, ParsesAndLooksUpByPrecisionAndLayer) {
  absl::StatusOr<KernelOrderTable> t = ParseKernelOrderTable(kTable, "h200.json");
  ASSERT_THAT(t, IsOk());
  EXPECT_EQ(t->gpu, TensorCoreGpu::kSm90);
  EXPECT_EQ(t->device, "NVIDIA H200");
  ASSERT_EQ(t->kernels.size(), 2u);
  const std::vector<KernelOrderTable> tables = {*t};
  ReplayOrder r = ReplayOrderFor(tables, TensorCoreGpu::kSm90, Precision::kBf16, 8, 16, 200);
  EXPECT_EQ(r.options, "mma=sm90,tile_k=64,residue=first");
  EXPECT_THAT(r.source, HasSubstr("NVIDIA H200 (recorded 2026-12-01)"));
  // The TF32 roundings read TF32's records.
  EXPECT_EQ(ReplayOrderFor(tables, TensorCoreGpu::kSm90, Precision::kTf32Rna, 8, 16, 200).options,
            "mma=sm90,tile_k=32");
  // Another layer, precision or generation: the model from k = 0.
  for (const ReplayOrder& other :
       {ReplayOrderFor(tables, TensorCoreGpu::kSm90, Precision::kBf16, 9, 16, 200),
        ReplayOrderFor(tables, TensorCoreGpu::kSm90, Precision::kFp16, 8, 16, 200)}) {
    EXPECT_EQ(other.options, "mma=sm90");
    EXPECT_THAT(other.source, HasSubstr("no kernel recorded"));
  }
  EXPECT_EQ(ReplayOrderFor(tables, TensorCoreGpu::kSm100, Precision::kBf16, 8, 16, 200).options,
            "mma=sm100");
}

TEST(KernelOrderTableTest, MalformedTablesNameTheProblem) {
  for (const auto& [json, message] : std::vector<std::pair<std::string, const char*>>{
           {"[]", "not a JSON object"},
           {R"({"gpu": "sm70", "device": "x", "recorded": "d", "kernels": []})", "sm70"},
           {R"({"gpu": "sm90", "recorded": "d", "kernels": []})", "'device'"},
           {R"({"gpu": "sm90", "device": "x", "recorded": "d"})", "'kernels'"},
           {R"({"gpu": "sm90", "device": "x", "recorded": "d", "kernels": [
              {"precision": "fp32", "m": 1, "n": 1, "k": 1, "options": "mma=sm90"}]})",
            "kernels[0].options"},
           {R"({"gpu": "sm90", "device": "x", "recorded": "d", "kernels": [
              {"precision": "bf16", "m": 1, "n": 1, "k": 1, "options": "mma=sm80"}]})",
            "mma=sm90 expected"},
           {R"({"gpu": "sm90", "device": "x", "recorded": "d", "kernels": [
              {"precision": "bf16", "m": 0, "n": 1, "k": 1, "options": "mma=sm90"}]})",
            "kernels[0].m"},
       }) {
    EXPECT_THAT(ParseKernelOrderTable(json, "t.json"),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("t.json"), HasSubstr(message))))
        << json;
  }
}

std::vector<float> Floats(const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  ToFloat(t, v.data());
  return v;
}

// A bf16 layer's fp32 output as the kernel computes it: each element
// KernelOrderDot, the bias added in fp32 (fused).
Tensor ReplayedOutput(const Tensor& x, const Tensor& w, const Tensor& b, const KernelOrder& order) {
  const int64_t m = x.shape()[0], k = x.shape()[1], n = w.shape()[0];
  const std::vector<float> xv = Floats(x), wv = Floats(w), bv = Floats(b);
  std::vector<float> y(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const float acc = KernelOrderDot(&xv[i * k], &wv[j * k], 1, k, order);
      y[static_cast<size_t>(i * n + j)] = acc + bv[static_cast<size_t>(j)];
    }
  }
  return *FromFloats(DType::kFloat32, {m, n}, y);
}

class ReplayDiagnosisTest : public ::tensorcheck::testing::BuiltinEngineTest {
 protected:
  // A bf16 layer with fp32 output and a wide range of magnitudes (a few
  // large inputs), so that the tensor cores' truncation shows against
  // fp32 accumulation.
  void MakeLayer(int64_t m, int64_t n, int64_t k) {
    std::vector<float> xv = Floats(::tensorcheck::testing::RandomNormal({m, k}, 1.0, 71));
    for (size_t i = 0; i < xv.size(); i += 7) xv[i] *= 4096.0f;
    x_ = *FromFloats(DType::kBFloat16, {m, k}, xv);
    w_ = ::tensorcheck::testing::RandomNormal({n, k}, 0.05, 72, DType::kBFloat16);
    b_ = ::tensorcheck::testing::RandomNormal({n}, 1.0, 73, DType::kBFloat16);
  }
  LinearRequest Request(const Tensor& observed, const std::string& gpu) const {
    LinearRequest r;
    r.input = x_.Clone();
    r.weight = w_.Clone();
    r.bias = b_.Clone();
    r.observed = observed.Clone();
    r.output_dtype = DType::kFloat32;
    r.gpu = gpu;
    return r;
  }
  Tensor x_, w_, b_;
};

TEST_F(ReplayDiagnosisTest, NamingTheGpuFindsItsKernelBitForBit) {
  MakeLayer(8, 16, 200);
  KernelOrder order;
  order.model = *TensorCoreModelFor(TensorCoreGpu::kSm90, TensorCoreInput::kBf16);
  const Tensor observed = ReplayedOutput(x_, w_, b_, order);
  // Without the GPU the best is plain bf16, and not bit for bit: the
  // truncation shows somewhere in this layer.
  auto plain = engine_->Diagnose(Request(observed, ""));
  ASSERT_THAT(plain, IsOk());
  ASSERT_TRUE(plain->diagnosis->best.has_value());
  EXPECT_EQ(*plain->diagnosis->best, "cpu:bf16:fused");
  ASSERT_FALSE(plain->diagnosis->ranking.front().exact)
      << "the layer does not tell the replay from fp32 accumulation";
  auto named = engine_->Diagnose(Request(observed, "h100"));
  ASSERT_THAT(named, IsOk());
  const DiagnosisOutcome& d = *named->diagnosis;
  ASSERT_TRUE(d.best.has_value()) << d.explanation;
  EXPECT_EQ(*d.best, "cpu:bf16:fused@mma=sm90") << d.explanation;
  EXPECT_TRUE(d.ranking.front().exact);
  EXPECT_EQ(d.verdict, DiagnosisVerdict::kRounding);
  std::string notes;
  for (const std::string& n : named->notes) notes += n + "\n";
  EXPECT_THAT(notes, HasSubstr("Replays of h100's kernels (sm90"));
  EXPECT_THAT(notes, HasSubstr("no kernel recorded for this layer"));
  // The other generations' models are other functions: an A100's replay
  // does not match an H100's output bit for bit here.
  auto a100 = engine_->Diagnose(Request(observed, "a100"));
  ASSERT_THAT(a100, IsOk());
  for (const RankedCandidate& c : a100->diagnosis->ranking) EXPECT_FALSE(c.exact) << c.config;
}

TEST_F(ReplayDiagnosisTest, RecordedKernelOrdersAreReplayed) {
  MakeLayer(8, 16, 200);
  EngineOptions options;
  options.kernel_orders = {*ParseKernelOrderTable(kTable, "h200.json")};
  auto engine = Engine::Create(options, &registry_);
  ASSERT_THAT(engine, IsOk());
  KernelOrder order;
  order.model = *TensorCoreModelFor(TensorCoreGpu::kSm90, TensorCoreInput::kBf16);
  order.tile_k = 64;
  order.residue = KResidue::kFirst;
  auto out = (*engine)->Diagnose(Request(ReplayedOutput(x_, w_, b_, order), "h200"));
  ASSERT_THAT(out, IsOk());
  const DiagnosisOutcome& d = *out->diagnosis;
  ASSERT_TRUE(d.best.has_value()) << d.explanation;
  EXPECT_EQ(*d.best, "cpu:bf16:fused@mma=sm90,tile_k=64,residue=first") << d.explanation;
  EXPECT_TRUE(d.ranking.front().exact);
  std::string notes;
  for (const std::string& n : out->notes) notes += n + "\n";
  EXPECT_THAT(notes, HasSubstr("NVIDIA H200 (recorded 2026-12-01)"));
}

TEST_F(ReplayDiagnosisTest, AnUnknownGpuIsInvalidArgumentNamingTheField) {
  MakeLayer(2, 4, 16);
  EXPECT_THAT(engine_->Diagnose(Request(
                  *FromFloats(DType::kFloat32, {2, 4}, std::vector<float>(8, 0.0f)), "tpu")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("gpu: unknown GPU 'tpu'")));
}

TEST_F(ReplayDiagnosisTest, NamedConfigurationsKeepTheirsAndSaySo) {
  MakeLayer(2, 4, 16);
  LinearRequest r =
      Request(*FromFloats(DType::kFloat32, {2, 4}, std::vector<float>(8, 0.0f)), "b200");
  r.configs = {"cpu:bf16:fused"};
  auto out = engine_->Diagnose(r);
  ASSERT_THAT(out, IsOk());
  ASSERT_EQ(out->diagnosis->ranking.size(), 1u);
  std::string notes;
  for (const std::string& n : out->notes) notes += n + "\n";
  EXPECT_THAT(notes, HasSubstr("adds replays to a diagnosis's default candidates only"));
}

}  // namespace
}  // namespace tensorcheck
