// Tests of `tensorcheck sweep`'s planning (internal/sweep_plan.h) and
// reports (internal/sweep_report.h), on hand-built headers and responses.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/cli/internal/sweep_plan.h"
#include "client/cli/internal/sweep_report.h"
#include "client/cli/tensor_io.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tensorcheck::cli::internal {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

SafetensorsTensorInfo Info(const std::string& name, std::vector<int64_t> shape, uint64_t begin = 0,
                           const std::string& dtype = "BF16") {
  SafetensorsTensorInfo t;
  t.name = name;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.data_begin = begin;
  t.data_end = begin + 2;
  return t;
}

std::vector<std::string> Names(const std::vector<CapturedCall>& calls) {
  std::vector<std::string> out;
  for (const CapturedCall& c : calls) out.push_back(c.name.Full());
  return out;
}

TEST(ParseLayerCallNameTest, CallIndexFollowsTheLastHash) {
  auto a = ParseLayerCallName("blocks.0.mlp.up");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->layer, "blocks.0.mlp.up");
  EXPECT_EQ(a->call, 0);
  auto b = ParseLayerCallName("blocks.0.attn.qkv#12");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->layer, "blocks.0.attn.qkv");
  EXPECT_EQ(b->call, 12);
  EXPECT_EQ(b->Full(), "blocks.0.attn.qkv#12");
}

TEST(ParseLayerCallNameTest, ZeroEmptyOrMalformedIndexIsInvalid) {
  for (const char* bad : {"fc#0", "fc#", "fc#x", "fc#01", "#1", ""}) {
    EXPECT_FALSE(ParseLayerCallName(bad).ok()) << bad;
  }
}

TEST(ParseCaptureTensorNameTest, SplitsRoleAndIgnoresOtherTensors) {
  auto in = ParseCaptureTensorName("blocks.0.mlp.up#1.input");
  ASSERT_TRUE(in.ok() && in->has_value());
  EXPECT_EQ((*in)->call.layer, "blocks.0.mlp.up");
  EXPECT_EQ((*in)->call.call, 1);
  EXPECT_EQ((*in)->role, "input");
  auto out = ParseCaptureTensorName("lm_head.output");
  ASSERT_TRUE(out.ok() && out->has_value());
  EXPECT_EQ((*out)->role, "output");
  auto w = ParseCaptureTensorName("lm_head.weight");
  ASSERT_TRUE(w.ok());
  EXPECT_FALSE(w->has_value());
}

TEST(PlanCapturesTest, WithoutMetadataTheInputsOffsetsGiveTheOrder) {
  SafetensorsIndex idx;
  // Sorted by name as the index holds them; offsets say b, a#1... order.
  idx.tensors = {Info("a#1.input", {2, 4}, 300), Info("a#1.output", {2, 4}, 310),
                 Info("a.input", {2, 4}, 100),   Info("a.output", {2, 4}, 110),
                 Info("a.weight", {4, 4}, 0),    Info("b.input", {2, 4}, 50),
                 Info("b.output", {2, 4}, 60)};
  auto calls = PlanCaptures(idx, "c.safetensors");
  ASSERT_TRUE(calls.ok()) << calls.status();
  EXPECT_THAT(Names(*calls), ElementsAre("b", "a", "a#1"));
}

TEST(PlanCapturesTest, MetadataListGivesTheOrder) {
  SafetensorsIndex idx;
  idx.tensors = {Info("a#1.input", {2, 4}, 300), Info("a#1.output", {2, 4}, 310),
                 Info("a.input", {2, 4}, 100),   Info("a.output", {2, 4}, 110),
                 Info("b.input", {2, 4}, 50),    Info("b.output", {2, 4}, 60)};
  idx.metadata[std::string(kLayersMetadataKey)] = R"(["a", "a#1", "b"])";
  auto calls = PlanCaptures(idx, "c.safetensors");
  ASSERT_TRUE(calls.ok()) << calls.status();
  EXPECT_THAT(Names(*calls), ElementsAre("a", "a#1", "b"));
}

TEST(PlanCapturesTest, MetadataMustListEveryCallOnceAndNothingElse) {
  SafetensorsIndex idx;
  idx.tensors = {Info("a.input", {2, 4}, 100), Info("a.output", {2, 4}, 110),
                 Info("b.input", {2, 4}, 50), Info("b.output", {2, 4}, 60)};
  idx.metadata[std::string(kLayersMetadataKey)] = R"(["a"])";
  EXPECT_THAT(std::string(PlanCaptures(idx, "c.st").status().message()),
              HasSubstr("does not list 'b'"));
  idx.metadata[std::string(kLayersMetadataKey)] = R"(["a", "b", "c"])";
  EXPECT_THAT(std::string(PlanCaptures(idx, "c.st").status().message()),
              HasSubstr("lists 'c', but the file has no 'c.input'"));
  idx.metadata[std::string(kLayersMetadataKey)] = R"(["a", "b", "a"])";
  EXPECT_THAT(std::string(PlanCaptures(idx, "c.st").status().message()), HasSubstr("twice"));
  idx.metadata[std::string(kLayersMetadataKey)] = "not json";
  EXPECT_THAT(std::string(PlanCaptures(idx, "c.st").status().message()),
              HasSubstr("JSON array of layer-call names expected"));
}

TEST(PlanCapturesTest, InputWithoutOutputNamesTheLayer) {
  SafetensorsIndex idx;
  idx.tensors = {Info("blocks.1.fc.input", {2, 4}, 0)};
  const absl::Status s = PlanCaptures(idx, "c.safetensors").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("layer 'blocks.1.fc' in c.safetensors"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("no 'blocks.1.fc.output'"));
}

TEST(PlanCapturesTest, NoCapturesIsAClearError) {
  SafetensorsIndex idx;
  idx.tensors = {Info("fc.weight", {4, 4}, 0)};
  EXPECT_EQ(PlanCaptures(idx, "m.safetensors").status().message(),
            "no layer captures found in m.safetensors: expected '{layer}.input' and "
            "'{layer}.output'");
}

CapturedCall Call(const std::string& layer, std::vector<int64_t> x, std::vector<int64_t> y,
                  const std::string& dtype = "BF16") {
  CapturedCall c;
  c.name.layer = layer;
  c.input = Info(layer + ".input", std::move(x), 0, dtype);
  c.output = Info(layer + ".output", std::move(y), 8, dtype);
  return c;
}

WeightIndex Weights(std::vector<SafetensorsTensorInfo> tensors) {
  SafetensorsIndex idx;
  idx.tensors = std::move(tensors);
  auto w = WeightIndex::Build({{"m.safetensors", idx}});
  EXPECT_TRUE(w.ok());
  return *std::move(w);
}

TEST(ResolveLayerTest, FindsOutInWeightAndBias) {
  const WeightIndex w = Weights({Info("fc.weight", {8, 4}), Info("fc.bias", {8})});
  auto p = ResolveLayer(Call("fc", {2, 3, 4}, {2, 3, 8}), "c.st", w, {});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->in_out);
  EXPECT_EQ(p->weight.Label(), "m.safetensors:fc.weight");
  ASSERT_TRUE(p->bias.has_value());
  EXPECT_EQ(p->dtype, DType::kBFloat16);
}

TEST(ResolveLayerTest, FindsInOutKernelThroughTheMap) {
  const WeightIndex w = Weights({Info("params.Dense_0.kernel", {4, 8})});
  auto p = ResolveLayer(Call("fc", {2, 4}, {2, 8}), "c.st", w, {{"fc", "params.Dense_0"}});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->in_out);
  EXPECT_FALSE(p->bias.has_value());
}

TEST(ResolveLayerTest, MissingWeightNamesWhatWasLookedFor) {
  const WeightIndex w = Weights({Info("other.weight", {8, 4})});
  const absl::Status s = ResolveLayer(Call("fc", {2, 4}, {2, 8}), "c.st", w, {}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("layer 'fc' (c.st)"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("'fc.weight' or 'fc.kernel'"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("m.safetensors"));
}

TEST(ResolveLayerTest, ShapeMismatchNamesLayerTensorsAndShapes) {
  const WeightIndex w = Weights({Info("fc.weight", {8, 5})});
  const absl::Status s = ResolveLayer(Call("fc", {2, 4}, {2, 8}), "c.st", w, {}).status();
  EXPECT_THAT(std::string(s.message()), HasSubstr("layer 'fc'"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("fc.input [2, 4]"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("m.safetensors:fc.weight [8, 5]"));

  const WeightIndex w2 = Weights({Info("fc.weight", {8, 4}), Info("fc.bias", {7})});
  EXPECT_THAT(
      std::string(ResolveLayer(Call("fc", {2, 4}, {2, 8}), "c.st", w2, {}).status().message()),
      HasSubstr("bias [8] expected"));
  EXPECT_THAT(
      std::string(ResolveLayer(Call("fc", {2, 4}, {3, 8}), "c.st", w, {}).status().message()),
      HasSubstr("layer 'fc'"));
}

TEST(ResolveLayerTest, DtypeMismatchIsAnError) {
  SafetensorsTensorInfo wt = Info("fc.weight", {8, 4}, 0, "F32");
  const WeightIndex w = Weights({wt});
  const absl::Status s = ResolveLayer(Call("fc", {2, 4}, {2, 8}), "c.st", w, {}).status();
  EXPECT_THAT(std::string(s.message()), HasSubstr("one dtype expected, found BF16"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("F32 (m.safetensors:fc.weight)"));
}

TEST(ResolveLayerTest, Fp8WeightIsRefusedPointingAtVerifyWithScales) {
  const WeightIndex w = Weights({Info("fc.weight", {8, 4}, 0, "F8_E4M3")});
  const absl::Status s = ResolveLayer(Call("fc", {2, 4}, {2, 8}), "c.st", w, {}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("m.safetensors:fc.weight"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("found F8_E4M3 (float8_e4m3fn)"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("--input-scale/--weight-scale"));
}

TEST(WeightIndexTest, NameInTwoFilesNamesBoth) {
  SafetensorsIndex a, b;
  a.tensors = {Info("fc.weight", {8, 4})};
  b.tensors = {Info("fc.weight", {8, 4})};
  const absl::Status s =
      WeightIndex::Build({{"s1.safetensors", a}, {"s2.safetensors", b}}).status();
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("'fc.weight' is in both s1.safetensors and s2.safetensors"));
}

using WeightFiles = std::vector<std::pair<std::string, SafetensorsIndex>>;

SafetensorsIndex Index(const std::vector<std::string>& names) {
  SafetensorsIndex idx;
  for (const std::string& n : names) idx.tensors.push_back(Info(n, {4}));
  return idx;
}

TEST(CheckWeightsFilesUsedTest, FileUnderAPrefixIsAnErrorWithTheMapToWrite) {
  // The captures file holds the weights too: without the check, the
  // checkpoint would go unused.
  const WeightFiles files = {
      {"ckpt.safetensors",
       Index({"model.up.weight", "model.up.bias", "model.norm.weight", "model.down.weight"})},
      {"c.st", Index({"up.input", "up.output", "down.input", "down.output", "up.weight", "up.bias",
                      "down.weight"})}};
  const absl::Status s =
      CheckWeightsFilesUsed(files, {Call("up", {2, 4}, {2, 8}), Call("down", {2, 8}, {2, 4})}, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "--weights ckpt.safetensors: no captured layer call takes a weight or bias from it; "
            "its 4 tensors: 'model.down.weight', 'model.norm.weight', 'model.up.bias', "
            "'model.up.weight'; they all start with \"model.\": map each layer to its name under "
            "that prefix with --map FILE ({\"up\": \"model.up\", ...})");
}

TEST(CheckWeightsFilesUsedTest, ListsTenSortedAndCountsTheRest) {
  std::vector<std::string> names;
  for (int i = 11; i >= 0; --i) names.push_back(absl::StrCat("x", i, ".weight"));
  const absl::Status s =
      CheckWeightsFilesUsed({{"w.st", Index(names)}}, {Call("fc", {2, 4}, {2, 8})}, {});
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("its 12 tensors: 'x0.weight', 'x1.weight', 'x10.weight', 'x11.weight', "
                        "'x2.weight', 'x3.weight', 'x4.weight', 'x5.weight', 'x6.weight', "
                        "'x7.weight', ... (2 more) (a layer's weights are"));
  EXPECT_THAT(std::string(s.message()), ::testing::Not(HasSubstr("they all start with")));
}

TEST(CheckWeightsFilesUsedTest, OtherTensorsOfAFileThatIsUsedAndCapturesAreFine) {
  const std::vector<CapturedCall> calls = {Call("fc", {2, 4}, {2, 8})};
  // A norm's weights and an embedding beside the layer's: the sweep cannot
  // tell them from anything else, and they are not an error.
  EXPECT_TRUE(CheckWeightsFilesUsed(
                  {{"w.st", Index({"fc.weight", "norm.weight", "norm.bias", "emb.weight"})},
                   {"c.st", Index({"fc.input", "fc.output"})}},
                  calls, {})
                  .ok());
  // Through the map: a bias alone uses the file.
  EXPECT_TRUE(CheckWeightsFilesUsed({{"a.st", Index({"ckpt.fc.kernel"})},
                                     {"b.st", Index({"ckpt.fc.bias", "ln.scale"})}},
                                    calls, {{"fc", "ckpt.fc"}})
                  .ok());
  // The same names without the map match nothing: the shortest prefix that
  // makes them match is the hint.
  EXPECT_THAT(
      std::string(
          CheckWeightsFilesUsed({{"a.st", Index({"ckpt.fc.kernel"})}}, calls, {}).message()),
      HasSubstr("they all start with \"ckpt.\": map each layer to its name under that "
                "prefix with --map FILE ({\"fc\": \"ckpt.fc\", ...})"));
}

TEST(ParseLayerMapTest, BadJsonAndWrongTypesAreErrors) {
  EXPECT_FALSE(ParseLayerMap("{", "m.json").ok());
  EXPECT_THAT(std::string(ParseLayerMap("[1]", "m.json").status().message()),
              HasSubstr("a JSON object"));
  EXPECT_THAT(std::string(ParseLayerMap(R"({"fc": 3})", "m.json").status().message()),
              HasSubstr("'fc': a non-empty string expected"));
  auto m = ParseLayerMap(R"({"fc": "model.fc"})", "m.json");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->at("fc"), "model.fc");
}

TEST(ReadSafetensorsIndexTest, KeepsMetadataAndOffsets) {
  const std::string header = R"({"__metadata__":{"tensorcheck.layers":"[\"b\",\"a\"]","n":7},)"
                             R"("a.input":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},)"
                             R"("b.input":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  std::string file(8, '\0');
  for (int i = 0; i < 8; ++i) file[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  file += header + std::string(8, '\0');
  const std::string path = testing::TempDir() + "/sweep_index_test.safetensors";
  std::ofstream(path, std::ios::binary) << file;
  auto idx = ReadSafetensorsIndex(path);
  std::remove(path.c_str());
  ASSERT_TRUE(idx.ok()) << idx.status();
  EXPECT_EQ(idx->metadata.at("tensorcheck.layers"), R"(["b","a"])");
  EXPECT_EQ(idx->metadata.at("n"), "7");
  ASSERT_EQ(idx->tensors.size(), 2u);
  EXPECT_EQ(idx->tensors[0].name, "a.input");
  EXPECT_EQ(idx->tensors[0].data_begin, 4u);
}

// ---- reports

// The server's decision about a call (CallDecision) as it makes it for
// these layers, which have no bias: `b:p:none` is followed by both bias
// placements, no best diverges, a bound_ratio over `threshold` exceeds it.
void Decide(LayerResult* l, double threshold = 3) {
  const pb::Diagnosis& d = l->response.diagnosis();
  pb::CallDecision* call = l->response.mutable_call();
  call->Clear();
  call->set_bound_threshold(threshold);
  const double ratio = l->response.observed_vs_reference().bound_ratio().value();
  if (ratio > threshold) {
    call->set_bound_exceeded(true);
    call->set_bound_reason(absl::StrCat("bound_ratio ", ratio, " exceeds ", threshold));
  }
  if (!l->response.has_diagnosis()) {
    call->set_explained(l->response.verdict() == pb::VERDICT_PASS);
    return;
  }
  if (d.verdict() == pb::Diagnosis::VERDICT_DEFECT ||
      d.verdict() == pb::Diagnosis::VERDICT_UNEXPLAINED) {
    call->set_divergence(d.verdict_reason());
  }
  if (d.best().empty()) {
    if (call->divergence().empty()) call->set_divergence("no candidate explains its output");
    return;
  }
  call->set_explained(true);
  std::vector<std::string> names{d.best()};
  names.insert(names.end(), d.equivalent().begin(), d.equivalent().end());
  names.insert(names.end(), d.tied().begin(), d.tied().end());
  for (const std::string& n : names) {
    call->add_explaining(n);
    if (absl::EndsWith(n, ":none")) {
      const std::string precision = n.substr(0, n.size() - 5);
      call->add_explaining(precision + ":fused");
      call->add_explaining(precision + ":unfused");
    }
  }
}

// A checked layer whose diagnosis names `best` (empty: none explains it).
LayerResult Diagnosed(const std::string& name, const std::string& best, double bound_ratio = 1.0,
                      std::vector<std::string> equivalent = {}) {
  LayerResult l;
  l.layer = name;
  l.input_shape = {2, 4};
  l.weight_shape = {8, 4};
  l.dtype = DType::kBFloat16;
  l.rpc = LayerRpc::kOk;
  l.response.set_verdict(pb::VERDICT_PASS);
  pb::Diagnosis* d = l.response.mutable_diagnosis();
  d->set_best(best);
  d->set_confidence(0.9);
  for (const std::string& e : equivalent) d->add_equivalent(e);
  pb::Stats* ref = l.response.mutable_observed_vs_reference();
  ref->mutable_bound_ratio()->set_value(bound_ratio);
  if (!best.empty()) {
    pb::RankedCandidate* c = d->add_ranking();
    c->set_config(best);
    // The ranking's own bound_ratio is not the layer's.
    c->mutable_bound_ratio()->set_value(bound_ratio + 100);
    ref->set_max_abs(0.5);
    ref->set_max_ulp(3);
  } else {
    ref->set_max_ulp(UINT64_MAX);
  }
  Decide(&l);
  return l;
}

TEST(SummarizeTest, ConsensusFlagsTheLayerThatMatchesAnotherConfiguration) {
  std::vector<LayerResult> layers = {
      Diagnosed("l0", "cpu:bf16:fused"), Diagnosed("l1", "cpu:bf16:fused"),
      Diagnosed("l2", "cpu:bf16:unfused"), Diagnosed("l3", "cpu:bf16:fused")};
  const SweepSummary s = Summarize(layers, SweepOptions{});
  ASSERT_TRUE(s.consensus.has_value());
  EXPECT_EQ(*s.consensus, "cpu:bf16:fused");
  EXPECT_EQ(s.consensus_count, 3);
  EXPECT_EQ(s.checked, 4);
  ASSERT_TRUE(s.first_divergence.has_value());
  EXPECT_EQ(*s.first_divergence, 2u);
  EXPECT_EQ(s.layers[2].reason,
            "matches cpu:bf16:unfused, while 3 of 4 layers match cpu:bf16:fused");
  EXPECT_EQ(s.layers[0].status, LayerStatus::kPassed);
  EXPECT_FALSE(s.passed);
  EXPECT_EQ(SweepExitCode(layers, s), 1);
}

TEST(SummarizeTest, ConsensusNeedsMoreThanHalf) {
  std::vector<LayerResult> layers = {
      Diagnosed("l0", "cpu:bf16:fused"), Diagnosed("l1", "cpu:bf16:fused"),
      Diagnosed("l2", "cpu:bf16:unfused"), Diagnosed("l3", "cpu:bf16:unfused")};
  const SweepSummary s = Summarize(layers, SweepOptions{});
  EXPECT_FALSE(s.consensus.has_value());
  EXPECT_FALSE(s.first_divergence.has_value());
  EXPECT_TRUE(s.passed);
  EXPECT_EQ(SweepExitCode(layers, s), 0);
}

TEST(SummarizeTest, LayerWithoutBiasAgreesWithEitherBiasMode) {
  std::vector<LayerResult> layers = {Diagnosed("l0", "cpu:bf16:fused"),
                                     Diagnosed("l1", "cpu:bf16:none"),
                                     Diagnosed("l2", "cpu:bf16:fused")};
  const SweepSummary s = Summarize(layers, SweepOptions{});
  ASSERT_TRUE(s.consensus.has_value());
  EXPECT_EQ(*s.consensus, "cpu:bf16:fused");
  EXPECT_EQ(s.consensus_count, 3);
  EXPECT_TRUE(s.passed);
}

TEST(SummarizeTest, EquivalentAndTiedCountAsExplaining) {
  std::vector<LayerResult> layers = {Diagnosed("l0", "cpu:fp32:fused"),
                                     Diagnosed("l1", "cpu:tf32:fused", 1.0, {"cpu:fp32:fused"}),
                                     Diagnosed("l2", "cpu:fp32:fused")};
  layers[2].response.mutable_diagnosis()->add_tied("cpu:tf32:fused");
  Decide(&layers[2]);
  const SweepSummary s = Summarize(layers, SweepOptions{});
  EXPECT_EQ(*s.consensus, "cpu:fp32:fused");
  EXPECT_TRUE(s.passed);
}

TEST(SummarizeTest, TieGoesToTheConfigurationMoreOftenBest) {
  // Both explain every layer; cpu:fp32:fused is best in two of three.
  std::vector<LayerResult> layers = {Diagnosed("l0", "cpu:fp32:fused", 1.0, {"cpu:bf16:fused"}),
                                     Diagnosed("l1", "cpu:bf16:fused", 1.0, {"cpu:fp32:fused"}),
                                     Diagnosed("l2", "cpu:fp32:fused", 1.0, {"cpu:bf16:fused"})};
  EXPECT_EQ(*Summarize(layers, SweepOptions{}).consensus, "cpu:fp32:fused");
}

TEST(SummarizeTest, VerdictFailFailsTheLayerWithoutDiverging) {
  std::vector<LayerResult> layers = {Diagnosed("l0", "cpu:bf16:fused"),
                                     Diagnosed("l1", "cpu:bf16:fused")};
  layers[1].response.set_verdict(pb::VERDICT_FAIL);
  const SweepSummary s = Summarize(layers, SweepOptions{});
  EXPECT_EQ(s.layers[1].status, LayerStatus::kFailed);
  EXPECT_THAT(s.layers[1].reason, HasSubstr("not within tolerance of the reference"));
  EXPECT_FALSE(s.first_divergence.has_value());
  EXPECT_EQ(SweepExitCode(layers, s), 1);
  EXPECT_THAT(FormatSweepText(layers, s, SweepOptions{}),
              HasSubstr("No divergence, but #1 l1 (of 2 layer calls) failed: observed output not"));
}

TEST(SummarizeTest, UnexplainedAndBoundRatioDiverge) {
  std::vector<LayerResult> layers = {Diagnosed("l0", "cpu:bf16:fused"),
                                     Diagnosed("l1", "cpu:bf16:fused", 7.2),
                                     Diagnosed("l2", "", 40)};
  const SweepSummary s = Summarize(layers, SweepOptions{});
  EXPECT_EQ(s.layers[1].reason, "bound_ratio 7.2 exceeds 3");
  EXPECT_EQ(s.layers[2].reason, "no candidate explains its output");
  EXPECT_EQ(*s.layers[2].bound_ratio, 40);
  EXPECT_EQ(*s.first_divergence, 1u);
  // The server decides the threshold the request names.
  for (LayerResult& l : layers) Decide(&l, 10);
  EXPECT_EQ(*Summarize(layers, SweepOptions{}).first_divergence, 2u);
}

TEST(SummarizeTest, DefectVerdictIsTheFirstDivergenceWithTheServersReason) {
  // l1 matches the consensus and its bound_ratio is ordinary: only the
  // server's verdict says that one column is not rounding.
  const std::string why =
      "Defect: cpu:bf16:fused explains the bulk of the output, but not all of it: 1 element(s) "
      "lie beyond 5.2 predicted standard errors of it (largest 2 ULP, 40 sigma). Look at output "
      "column 3 \xe2\x86\x94 weight row 3 (out_in layout) and bias element 3.";
  std::vector<LayerResult> layers = {Diagnosed("l0", "cpu:bf16:fused"),
                                     Diagnosed("l1", "cpu:bf16:fused"),
                                     Diagnosed("l2", "cpu:bf16:fused", 7.2)};
  for (LayerResult& l : layers) {
    l.response.mutable_diagnosis()->set_verdict(pb::Diagnosis::VERDICT_ROUNDING);
  }
  pb::Diagnosis* d = layers[1].response.mutable_diagnosis();
  d->set_verdict(pb::Diagnosis::VERDICT_DEFECT);
  d->set_verdict_reason(why);
  Decide(&layers[1]);
  const SweepSummary s = Summarize(layers, SweepOptions{});
  EXPECT_EQ(*s.consensus, "cpu:bf16:fused");
  EXPECT_EQ(s.layers[0].status, LayerStatus::kPassed);
  EXPECT_EQ(s.layers[1].status, LayerStatus::kFailed);
  EXPECT_TRUE(s.layers[1].diverged);
  EXPECT_EQ(s.layers[1].reason, why);
  EXPECT_EQ(*s.first_divergence, 1u);
  EXPECT_EQ(SweepExitCode(layers, s), 1);
  EXPECT_THAT(FormatSweepText(layers, s, SweepOptions{}),
              HasSubstr(absl::StrCat("First divergence: #1 l1 (of 3 layer calls): ", why)));

  const nlohmann::ordered_json j = SweepToJson(layers, s, SweepCounts{}, SweepOptions{});
  EXPECT_EQ(j["layers"][0]["diagnosis_verdict"], "rounding");
  EXPECT_EQ(j["layers"][1]["diagnosis_verdict"], "defect");
  EXPECT_EQ(j["layers"][1]["verdict_reason"], why);
  EXPECT_EQ(j["layers"][1]["verdict"], "pass");
  EXPECT_EQ(j["first_divergence"]["reason"], why);
}

TEST(SummarizeTest, UnexplainedVerdictWithABestMatchDiverges) {
  std::vector<LayerResult> layers = {Diagnosed("l0", "cpu:bf16:fused"),
                                     Diagnosed("l1", "cpu:bf16:fused")};
  pb::Diagnosis* d = layers[0].response.mutable_diagnosis();
  d->set_verdict(pb::Diagnosis::VERDICT_UNEXPLAINED);
  d->set_verdict_reason("Unexplained: no candidate explains the bulk of the output.");
  Decide(&layers[0]);
  const SweepSummary s = Summarize(layers, SweepOptions{});
  EXPECT_EQ(*s.first_divergence, 0u);
  EXPECT_EQ(s.layers[0].reason, "Unexplained: no candidate explains the bulk of the output.");
  EXPECT_EQ(s.layers[1].status, LayerStatus::kPassed);
}

TEST(SummarizeTest, ServerWithoutVerdictKeepsTheOtherRules) {
  // A server that predates the verdict: nothing changes, and the JSON
  // carries null.
  std::vector<LayerResult> layers = {Diagnosed("l0", "cpu:bf16:fused"),
                                     Diagnosed("l1", "cpu:bf16:fused")};
  const SweepSummary s = Summarize(layers, SweepOptions{});
  EXPECT_TRUE(s.passed);
  EXPECT_FALSE(s.first_divergence.has_value());
  const nlohmann::ordered_json j = SweepToJson(layers, s, SweepCounts{}, SweepOptions{});
  EXPECT_TRUE(j["layers"][0]["diagnosis_verdict"].is_null());
  EXPECT_TRUE(j["layers"][0]["verdict_reason"].is_null());
}

TEST(SummarizeTest, WithoutDiagnosisOnlyBoundRatioDiverges) {
  std::vector<LayerResult> layers = {Diagnosed("l0", "cpu:bf16:fused", 1.0),
                                     Diagnosed("l1", "cpu:bf16:fused", 4.5)};
  for (LayerResult& l : layers) {
    l.response.clear_diagnosis();
    Decide(&l);
  }
  SweepOptions verify;
  verify.diagnose = false;
  const SweepSummary s = Summarize(layers, verify);
  EXPECT_FALSE(s.consensus.has_value());
  EXPECT_EQ(s.layers[0].status, LayerStatus::kPassed);
  EXPECT_EQ(s.layers[1].reason, "bound_ratio 4.5 exceeds 3");
  EXPECT_EQ(*s.first_divergence, 1u);
}

TEST(SummarizeTest, ServerGoneLeavesNotCheckedAndExitsThree) {
  std::vector<LayerResult> layers = {Diagnosed("l0", "cpu:bf16:fused"), LayerResult{},
                                     LayerResult{}};
  layers[1].layer = "l1";
  layers[1].rpc = LayerRpc::kError;
  layers[1].error = "server: Diagnose (UNAVAILABLE): connection refused";
  layers[1].error_code = static_cast<int>(absl::StatusCode::kUnavailable);
  layers[2].layer = "l2";
  const SweepSummary s = Summarize(layers, SweepOptions{});
  EXPECT_EQ(s.layers[1].status, LayerStatus::kError);
  EXPECT_EQ(s.layers[2].status, LayerStatus::kNotChecked);
  EXPECT_EQ(s.checked, 1);
  EXPECT_FALSE(s.passed);
  EXPECT_EQ(SweepExitCode(layers, s), 3);

  layers[1].error_code = static_cast<int>(absl::StatusCode::kInvalidArgument);
  layers.pop_back();
  EXPECT_EQ(SweepExitCode(layers, Summarize(layers, SweepOptions{})), 2);
}

TEST(SweepToJsonTest, KeysAndValuesAsDocumented) {
  std::vector<LayerResult> layers = {Diagnosed("blocks.0.fc", "cpu:bf16:fused"),
                                     Diagnosed("blocks.0.fc", "", 9.5), LayerResult{}};
  layers[1].call = 1;
  layers[1].in_out = true;
  layers[2].layer = "lm_head";
  layers[0].uploaded_bytes = 64;
  pb::NegligibleElements* n =
      layers[0].response.mutable_observed_vs_reference()->mutable_negligible();
  n->set_below(0.25);
  n->set_differing(2);
  n->set_max_abs(1e-7);
  n->set_significant_max_ulp(1);
  n->set_note("leaving out 2 elements near zero");
  const SweepSummary s = Summarize(layers, SweepOptions{});
  const nlohmann::ordered_json j = SweepToJson(layers, s, SweepCounts{128, 32}, SweepOptions{});
  std::vector<std::string> keys;
  for (auto it = j.begin(); it != j.end(); ++it) keys.push_back(it.key());
  EXPECT_THAT(
      keys, ElementsAre("layers", "first_divergence", "consensus", "layers_checked", "layers_total",
                        "passed", "uploaded_bytes", "reused_bytes", "diagnose", "bound_threshold"));
  std::vector<std::string> layer_keys;
  for (auto it = j["layers"][0].begin(); it != j["layers"][0].end(); ++it) {
    layer_keys.push_back(it.key());
  }
  EXPECT_THAT(layer_keys,
              ElementsAre("name", "call", "input_shape", "weight_shape", "weight_layout", "dtype",
                          "status", "verdict", "diagnosis_verdict", "verdict_reason", "best",
                          "confidence", "equivalent", "tied", "explained", "max_abs", "max_ulp",
                          "negligible", "bound_ratio", "columns", "rows", "explanation", "error",
                          "report", "error_code", "response"));
  const auto& l0 = j["layers"][0];
  EXPECT_EQ(l0["name"], "blocks.0.fc");
  EXPECT_EQ(l0["dtype"], "bfloat16");
  EXPECT_EQ(l0["status"], "passed");
  EXPECT_EQ(l0["verdict"], "pass");
  EXPECT_EQ(l0["best"], "cpu:bf16:fused");
  EXPECT_EQ(l0["max_abs"], 0.5);
  EXPECT_EQ(l0["max_ulp"], 3);
  EXPECT_EQ(l0["negligible"],
            nlohmann::ordered_json::parse(R"({"below": 0.25, "differing": 2, "max_abs": 1e-07,
                                              "significant_max_ulp": 1,
                                              "note": "leaving out 2 elements near zero"})"));
  EXPECT_EQ(l0["report"]["uploaded_bytes"], 64);
  EXPECT_EQ(l0["report"]["diagnosis"]["best"], "cpu:bf16:fused");
  const auto& l1 = j["layers"][1];
  EXPECT_EQ(l1["call"], 1);
  EXPECT_EQ(l1["weight_layout"], "in_out");
  EXPECT_EQ(l1["status"], "failed");
  EXPECT_TRUE(l1["best"].is_null());
  EXPECT_TRUE(l1["confidence"].is_null());
  EXPECT_EQ(l1["max_ulp"], "inf");
  EXPECT_TRUE(l1["negligible"].is_null());
  EXPECT_EQ(l1["bound_ratio"], 9.5);
  EXPECT_EQ(j["layers"][2]["status"], "not_checked");
  EXPECT_TRUE(j["layers"][2]["report"].is_null());
  EXPECT_TRUE(j["layers"][2]["verdict"].is_null());
  EXPECT_EQ(j["first_divergence"]["name"], "blocks.0.fc");
  EXPECT_EQ(j["first_divergence"]["call"], 1);
  EXPECT_EQ(j["first_divergence"]["index"], 1);
  EXPECT_EQ(j["first_divergence"]["reason"], "no candidate explains its output");
  // One of two checked layers explains cpu:bf16:fused: not more than half.
  EXPECT_TRUE(j["consensus"].is_null());
  EXPECT_EQ(j["layers_checked"], 2);
  EXPECT_EQ(j["layers_total"], 3);
  EXPECT_EQ(j["passed"], false);
  EXPECT_EQ(j["uploaded_bytes"], 128);
  EXPECT_EQ(j["reused_bytes"], 32);
}

TEST(FormatSweepTextTest, RowPerCallThenFirstDivergence) {
  std::vector<LayerResult> layers = {
      Diagnosed("l0", "cpu:bf16:fused"), Diagnosed("l1", "cpu:bf16:fused"),
      Diagnosed("l1", "cpu:bf16:unfused", 1.0, {"cpu:fp32:unfused"})};
  layers[2].call = 1;
  const SweepSummary s = Summarize(layers, SweepOptions{});
  const std::string text = FormatSweepText(layers, s, SweepOptions{});
  EXPECT_THAT(text, HasSubstr("[2,4]x[8,4]"));
  EXPECT_THAT(text, HasSubstr("l1#1"));
  EXPECT_THAT(text, HasSubstr("cpu:bf16:unfused = cpu:fp32:unfused"));
  EXPECT_THAT(text, HasSubstr("First divergence: #2 l1#1 (of 3 layer calls): matches "
                              "cpu:bf16:unfused, while 2 of 3 layers match cpu:bf16:fused"));
  layers.pop_back();
  EXPECT_THAT(FormatSweepText(layers, Summarize(layers, SweepOptions{}), SweepOptions{}),
              HasSubstr("No divergence: all 2 layer calls explained by cpu:bf16:fused"));
}

TEST(FormatSweepTextTest, MaxUlpLeavesOutTheElementsNearZeroAndCountsThem) {
  std::vector<LayerResult> layers = {Diagnosed("l0", "cpu:fp32:fused")};
  pb::Stats* st = layers[0].response.mutable_observed_vs_reference();
  st->set_max_ulp(1901874441);
  st->mutable_negligible()->set_differing(3);
  st->mutable_negligible()->set_significant_max_ulp(2);
  const std::string text =
      FormatSweepText(layers, Summarize(layers, SweepOptions{}), SweepOptions{});
  EXPECT_THAT(text, HasSubstr("2 (3 near 0)"));
  EXPECT_THAT(text, Not(HasSubstr("1901874441")));
}

TEST(FormatSweepTextTest, StatusWordsAndLayerNumbersAreThePythonClients) {
  std::vector<LayerResult> layers = {Diagnosed("l0", "cpu:bf16:fused"),
                                     Diagnosed("l1", "cpu:bf16:unfused"),
                                     Diagnosed("l2", "cpu:bf16:fused"), LayerResult{}};
  layers[3].layer = "l3";
  const SweepSummary s = Summarize(layers, SweepOptions{});
  ASSERT_EQ(s.layers[1].status, LayerStatus::kFailed);
  const std::string text = FormatSweepText(layers, s, SweepOptions{});
  EXPECT_THAT(text, HasSubstr(" PASS "));
  EXPECT_THAT(text, HasSubstr(" FAIL "));
  EXPECT_THAT(text, Not(HasSubstr("FAILED")));
  EXPECT_THAT(text, Not(HasSubstr("passed")));
  const std::string md = FormatSweepGithubSummary(layers, s);
  EXPECT_THAT(md, HasSubstr("| 0 | `l0` |"));
  EXPECT_THAT(md, HasSubstr("| 1 | `l1` | `cpu:bf16:unfused` | 0.90 | **FAIL** |"));
  EXPECT_THAT(md, HasSubstr("| 3 | `l3` | - | - | - |"));
  const std::string html = FormatSweepHtml(layers, s, SweepOptions{});
  EXPECT_THAT(html, HasSubstr("<h2>0. <code>l0</code>: <span class=\"pass\">PASS</span></h2>"));
  EXPECT_THAT(html, HasSubstr("<h2>1. <code>l1</code>: <span class=\"fail\">FAIL</span></h2>"));
}

TEST(FormatSweepTextTest, ClassesOfMoreThanTwoAreCountedInTheTable) {
  std::vector<LayerResult> layers = {Diagnosed(
      "l0", "cpu:bf16:fused", 1.0, {"cpu:fp32:fused", "cpu:tf32:fused", "cpu:fp16:fused"})};
  const std::string text =
      FormatSweepText(layers, Summarize(layers, SweepOptions{}), SweepOptions{});
  EXPECT_THAT(text, HasSubstr("cpu:bf16:fused (+3 same bits)"));
  EXPECT_THAT(text, Not(HasSubstr("cpu:tf32:fused")));
}

TEST(FormatSweepJUnitTest, OneTestCasePerLayerCall) {
  std::vector<LayerResult> layers = {Diagnosed("a", "cpu:bf16:fused"), Diagnosed("b", "")};
  const std::string xml = FormatSweepJUnit(layers, Summarize(layers, SweepOptions{}));
  EXPECT_THAT(xml, HasSubstr("tests=\"2\" failures=\"1\""));
  EXPECT_THAT(xml, HasSubstr("<testcase classname=\"tensorcheck.sweep\" name=\"a\"/>"));
  EXPECT_THAT(xml, HasSubstr("<failure message=\"no candidate explains its output\">"));
}

TEST(FormatSweepHtmlTest, ChartAndSectionsWithoutExternalReferences) {
  std::vector<LayerResult> layers = {Diagnosed("a", "cpu:bf16:fused"), Diagnosed("b", "", 5)};
  layers[0].html_section = "<h2>Summary</h2><h3>Ruled out</h3>";
  const std::string page = FormatSweepHtml(layers, Summarize(layers, SweepOptions{}), {});
  EXPECT_THAT(page, HasSubstr("<svg"));
  EXPECT_THAT(page, HasSubstr("first divergence: b"));
  EXPECT_THAT(page, HasSubstr("<h3>Summary</h3><h4>Ruled out</h4>"));
  EXPECT_EQ(page.find("http"), std::string::npos);
}

TEST(FormatSweepHtmlTest, ZeroBoundRatioIsChartedOnTheBottomLine) {
  // Bitwise what the best candidate computes: bound_ratio 0, no log.
  std::vector<LayerResult> layers = {Diagnosed("a", "cpu:bf16:fused", 0.0),
                                     Diagnosed("b", "cpu:bf16:fused", 0.5)};
  const std::string page = FormatSweepHtml(layers, Summarize(layers, SweepOptions{}), {});
  EXPECT_THAT(page, HasSubstr("<title>a: cpu:bf16:fused, bound_ratio 0</title>"));
  EXPECT_THAT(page, HasSubstr("<title>b: cpu:bf16:fused, bound_ratio 0.5</title>"));
  EXPECT_EQ(page.find("nan"), std::string::npos);
  EXPECT_EQ(page.find("inf"), std::string::npos);
}

}  // namespace
}  // namespace tensorcheck::cli::internal
