// Tests of the whole-model renderer and its JSON report read back
// (internal/sweep_render.h): the golden fixtures of tests/golden/model_check
// (tests/golden/README.md), bad report files, and the JSON round trip.
//
// TENSORCHECK_UPDATE_GOLDEN=1 rewrites each fixture's report.json,
// summary.txt and junit.xml from what render makes of its report.json,
// instead of comparing: only after an intended change, and the diff read.
#include "client/cli/internal/sweep_render.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tensorcheck::cli::internal {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteFile(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

bool UpdateGolden() {
  const char* v = std::getenv("TENSORCHECK_UPDATE_GOLDEN");
  return v != nullptr && std::string(v) == "1";
}

// Every fixture's exit code, as the sweep that gave these responses exits
// (docs/model-checks.md, "Exit codes"). A new case is listed here too.
const std::map<std::string, int>& ExpectedExitCodes() {
  static const auto* codes = new std::map<std::string, int>{
      {"consensus_pass", 0},
      {"other_configuration", 1},
      {"defect_nan_error", 3},
      {"no_diagnose", 1},
  };
  return *codes;
}

std::vector<std::filesystem::path> Cases() {
  std::vector<std::filesystem::path> out;
  for (const auto& e : std::filesystem::directory_iterator(TENSORCHECK_GOLDEN_DIR)) {
    if (e.is_directory()) out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(GoldenModelCheckTest, EveryCaseIsListedWithItsExitCode) {
  std::vector<std::string> names;
  for (const auto& dir : Cases()) names.push_back(dir.filename().string());
  std::vector<std::string> listed;
  for (const auto& [name, code] : ExpectedExitCodes()) listed.push_back(name);
  std::sort(listed.begin(), listed.end());
  EXPECT_EQ(names, listed);
}

TEST(GoldenModelCheckTest, RenderGivesTheExpectedTextJsonAndJUnit) {
  const bool update = UpdateGolden();
  for (const auto& dir : Cases()) {
    SCOPED_TRACE(dir.string());
    const std::string report_json = ReadFile(dir / "report.json");
    auto report = ParseSweepReport(report_json);
    ASSERT_TRUE(report.ok()) << report.status();
    SweepRenderRequest text, json, junit;
    text.text = true;
    json.json = true;
    junit.junit = true;
    auto t = RenderSweep(*report, text);
    auto j = RenderSweep(*report, json);
    auto x = RenderSweep(*report, junit);
    ASSERT_TRUE(t.ok() && j.ok() && x.ok());
    if (update) {
      WriteFile(dir / "report.json", j->stdout_text);
      WriteFile(dir / "summary.txt", t->stdout_text);
      WriteFile(dir / "junit.xml", x->junit);
      continue;
    }
    // The report is both the input and the expected JSON: nothing is lost
    // or decided differently on the way through.
    EXPECT_EQ(j->stdout_text, report_json);
    EXPECT_EQ(t->stdout_text, ReadFile(dir / "summary.txt"));
    EXPECT_EQ(x->junit, ReadFile(dir / "junit.xml"));
    const auto code = ExpectedExitCodes().find(dir.filename().string());
    ASSERT_NE(code, ExpectedExitCodes().end());
    EXPECT_EQ(t->exit_code, code->second);
  }
}

// A small valid report, to be broken one key at a time.
constexpr char kValidReport[] = R"({
  "layers": [
    {"name": "fc", "call": 0, "input_shape": [2, 4], "weight_shape": [8, 4],
     "weight_layout": "out_in", "dtype": "bfloat16", "status": "passed",
     "error": null, "error_code": null,
     "report": {"uploaded_bytes": 64, "reused_bytes": 0},
     "response": {"verdict": "VERDICT_PASS",
                  "observedVsReference": {"total": "16", "boundRatio": 0.5},
                  "diagnosis": {"best": "cpu:bf16:fused", "confidence": 0.9,
                                "verdict": "VERDICT_ROUNDING"},
                  "call": {"explained": true, "explaining": ["cpu:bf16:fused"],
                           "boundThreshold": 3}}},
    {"name": "fc", "call": 1, "input_shape": [2, 4], "weight_shape": [8, 4],
     "weight_layout": "out_in", "dtype": "bfloat16", "status": "error",
     "error": "server: Diagnose (INVALID_ARGUMENT): op.bias: 7 values, 8 expected",
     "error_code": "INVALID_ARGUMENT", "report": null, "response": null},
    {"name": "lm_head", "call": 0, "input_shape": [2, 4], "weight_shape": [4, 8],
     "weight_layout": "in_out", "dtype": "float32", "status": "not_checked",
     "error": null, "error_code": null, "report": null, "response": null}
  ],
  "uploaded_bytes": 64, "reused_bytes": 0, "diagnose": true, "bound_threshold": null
})";

// kValidReport with `from` replaced by `to` (which must occur once).
std::string Broken(const std::string& from, const std::string& to) {
  const std::string valid = kValidReport;
  EXPECT_EQ(absl::StrReplaceAll(valid, {{from, ""}}).size() + from.size(), valid.size()) << from;
  return absl::StrReplaceAll(valid, {{from, to}});
}

std::string ParseError(const std::string& text) {
  auto r = ParseSweepReport(text);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(r.status().message());
}

TEST(ParseSweepReportTest, ValidReportRebuildsEachLayerCall) {
  auto r = ParseSweepReport(kValidReport);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->layers.size(), 3u);
  const LayerResult& fc = r->layers[0];
  EXPECT_EQ(fc.rpc, LayerRpc::kOk);
  EXPECT_EQ(fc.input_shape, (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(fc.dtype, DType::kBFloat16);
  EXPECT_EQ(fc.uploaded_bytes, 64);
  EXPECT_EQ(fc.response.observed_vs_reference().total(), 16);
  EXPECT_EQ(fc.response.diagnosis().best(), "cpu:bf16:fused");
  EXPECT_EQ(r->layers[1].rpc, LayerRpc::kError);
  EXPECT_EQ(r->layers[1].call, 1);
  EXPECT_EQ(r->layers[1].error_code, static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(r->layers[2].rpc, LayerRpc::kNotChecked);
  EXPECT_TRUE(r->layers[2].in_out);
  EXPECT_EQ(r->layers[2].dtype, DType::kFloat32);
  EXPECT_TRUE(r->options.diagnose);
  EXPECT_FALSE(r->options.bound_threshold.has_value());
  // A rejected request and a call never sent: exit 3 outranks 2.
  auto out = RenderSweep(*std::move(r), SweepRenderRequest{});
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->exit_code, 3);
}

TEST(ParseSweepReportTest, MissingKeyNamesItsPath) {
  EXPECT_EQ(ParseError(Broken(R"("dtype": "float32", )", "")), "layers[2].dtype: missing");
  EXPECT_EQ(ParseError(Broken(R"("diagnose": true, )", "")), "diagnose: missing");
  EXPECT_EQ(ParseError(Broken(R"("error_code": "INVALID_ARGUMENT", )", "")),
            "layers[1].error_code: missing");
  EXPECT_EQ(ParseError(Broken(R"("uploaded_bytes": 64, "reused_bytes": 0},)", R"("x": 0},)")),
            "layers[0].report.uploaded_bytes: missing");
}

TEST(ParseSweepReportTest, WrongTypeNamesThePathAndWhatCame) {
  EXPECT_EQ(ParseError(Broken(R"("input_shape": [2, 4], "weight_shape": [4, 8])",
                              R"("input_shape": "2x4", "weight_shape": [4, 8])")),
            "layers[2].input_shape: an array expected, found a string");
  EXPECT_EQ(ParseError(Broken(R"("name": "lm_head")", R"("name": 7)")),
            "layers[2].name: a string expected, found an integer");
  EXPECT_EQ(ParseError(Broken(R"("call": 1)", R"("call": -1)")),
            "layers[1].call: a non-negative integer expected, found -1");
  EXPECT_EQ(ParseError(Broken(R"("weight_layout": "in_out")", R"("weight_layout": "kn")")),
            "layers[2].weight_layout: \"out_in\" or \"in_out\" expected, found \"kn\"");
  EXPECT_THAT(ParseError(Broken(R"("dtype": "float32")", R"("dtype": "int8")")),
              StartsWith("layers[2].dtype: \"float64\""));
  EXPECT_EQ(ParseError(Broken(R"("diagnose": true)", R"("diagnose": "yes")")),
            "diagnose: true or false expected, found a string");
  EXPECT_EQ(ParseError(Broken(R"("bound_threshold": null)", R"("bound_threshold": -1)")),
            "bound_threshold: a positive number or null expected, found -1");
  EXPECT_EQ(ParseError(Broken(R"("error_code": "INVALID_ARGUMENT")", R"("error_code": "BAD")")),
            "layers[1].error_code: a gRPC status code name (\"INVALID_ARGUMENT\", ...) expected, "
            "found \"BAD\"");
  EXPECT_EQ(ParseError(Broken(R"("status": "passed")", R"("status": "ok")")),
            "layers[0].status: \"passed\", \"failed\", \"error\" or \"not_checked\" expected, "
            "found \"ok\"");
  EXPECT_EQ(ParseError(Broken(R"("uploaded_bytes": 64, "reused_bytes": 0},)",
                              R"("uploaded_bytes": -1, "reused_bytes": 0},)")),
            "layers[0].report.uploaded_bytes: a non-negative integer expected, found -1");
  EXPECT_EQ(ParseError("[1, 2]"),
            "a JSON object (the report of tensorcheck sweep --json) expected, found an array");
  EXPECT_EQ(ParseError(R"({"layers": {}, "uploaded_bytes": 0, "reused_bytes": 0,
                           "diagnose": true, "bound_threshold": null})"),
            "layers: an array expected, found an object");
}

TEST(ParseSweepReportTest, BadResponseNamesTheLayerAndTheField) {
  EXPECT_THAT(ParseError(Broken(R"("verdict": "VERDICT_PASS")", R"("verdict": "VERDICT_MAYBE")")),
              StartsWith("layers[0].response: "));
  EXPECT_THAT(ParseError(Broken(R"("verdict": "VERDICT_PASS")", R"("verdict": "VERDICT_MAYBE")")),
              HasSubstr("verdict"));
  EXPECT_THAT(ParseError(Broken(R"("observedVsReference": {)", R"("observedVsRef": {)")),
              AllOf(StartsWith("layers[0].response: "), HasSubstr("observedVsRef")));
  EXPECT_THAT(ParseError(Broken(R"("total": "16")", R"("total": "sixteen")")),
              AllOf(StartsWith("layers[0].response: "), HasSubstr("total")));
  EXPECT_THAT(ParseError(Broken(R"("explaining": ["cpu:bf16:fused"])", R"("explaining": 3)")),
              AllOf(StartsWith("layers[0].response: "), HasSubstr("explaining")));
  EXPECT_EQ(ParseError(Broken(R"("status": "not_checked",
     "error": null, "error_code": null, "report": null, "response": null)",
                              R"("status": "not_checked",
     "error": null, "error_code": null, "report": null, "response": [1])")),
            "layers[2].response: an object (a VerifyResponse in protobuf's JSON mapping) or null "
            "expected, found an array");
}

TEST(ParseSweepReportTest, LayerWithoutResponseMustBeErrorOrNotChecked) {
  EXPECT_EQ(ParseError(Broken(R"("status": "not_checked")", R"("status": "passed")")),
            "layers[2].response: null, but status is \"passed\": a layer call without a response "
            "is \"error\" or \"not_checked\"");
  EXPECT_EQ(ParseError(Broken(R"("error_code": "INVALID_ARGUMENT")", R"("error_code": null)")),
            "layers[1].error_code: null, but status is \"error\"");
}

TEST(ParseSweepReportTest, NotJsonAndTruncatedFilesAreErrorsNotCrashes) {
  EXPECT_THAT(ParseError("{\"layers\": [{\"name\": "), StartsWith("not JSON: "));
  EXPECT_THAT(ParseError(""), StartsWith("not JSON: "));
  const std::string valid = kValidReport;
  for (size_t n = 0; n < valid.size(); n += 7) {
    EXPECT_FALSE(ParseSweepReport(valid.substr(0, n)).ok()) << n;
  }
}

// A checked layer call with the outputs a --html sweep keeps, a NaN
// bound_ratio and non-ASCII text.
std::vector<LayerResult> RoundTripLayers() {
  LayerResult l;
  l.layer = "blocks.0.up";
  l.call = 2;
  l.input_shape = {1, 2};
  l.weight_shape = {2, 2};
  l.dtype = DType::kFloat32;
  l.rpc = LayerRpc::kOk;
  l.uploaded_bytes = 16;
  l.reused_bytes = 8;
  pb::VerifyResponse& r = l.response;
  r.set_verdict(pb::VERDICT_FAIL);
  r.mutable_tolerance()->set_preset(pb::Tolerance::PRESET_BOUND);
  pb::Stats* st = r.mutable_observed_vs_reference();
  st->set_total(2);
  st->set_mismatched(1);
  st->set_max_abs(0.1);
  st->set_max_ulp(UINT64_MAX);
  st->mutable_bound_ratio()->set_value(std::nan(""));
  r.mutable_reference()->set_config("cpu:fp64");
  const float ref[2] = {1.0f, -2.5f};
  pb::Tensor* out = r.mutable_reference()->mutable_output();
  out->set_dtype(pb::DTYPE_FLOAT32);
  out->add_shape(1);
  out->add_shape(2);
  out->set_data(reinterpret_cast<const char*>(ref), sizeof(ref));
  r.add_output_shape(1);
  r.add_output_shape(2);
  pb::Diagnosis* d = r.mutable_diagnosis();
  d->set_best("cpu:fp32:fused");
  d->set_confidence(1.0 / 3);
  d->set_explanation("fp32 — in full, ±0");
  d->set_verdict(pb::Diagnosis::VERDICT_ROUNDING);
  pb::ConfigResult* c = r.add_results();
  c->set_config("cpu:fp32:fused");
  *c->mutable_output() = *out;
  for (const char* key : {"m", "algo", "z", "blas", "k"}) (*c->mutable_details())[key] = key;
  pb::CallDecision* call = r.mutable_call();
  call->set_explained(true);
  call->add_explaining("cpu:fp32:fused");
  call->set_bound_threshold(2.5);
  call->set_bound_exceeded(true);
  call->set_bound_reason("bound_ratio nan exceeds 2.5");
  LayerResult gone;
  gone.layer = "lm_head";
  gone.rpc = LayerRpc::kError;
  gone.error = "server: Diagnose (UNAVAILABLE): Socket closed";
  gone.error_code = static_cast<int>(absl::StatusCode::kUnavailable);
  return {l, gone, LayerResult{}};
}

TEST(RenderSweepTest, JsonReportRoundTripsAndRendersTheSamePage) {
  SweepOptions options;
  options.bound_threshold = 2.5;
  const SweepReport original{RoundTripLayers(), SweepCounts{24, 8}, options};
  SweepRenderRequest all;
  all.json = all.junit = all.html = all.github = true;
  auto first = RenderSweep(original, all);
  ASSERT_TRUE(first.ok()) << first.status();
  auto parsed = ParseSweepReport(first->stdout_text);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->layers[0].response.reference().output().data() ==
              original.layers[0].response.reference().output().data());
  EXPECT_EQ(parsed->options.bound_threshold, 2.5);
  auto again = RenderSweep(*std::move(parsed), all);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->stdout_text, first->stdout_text);
  EXPECT_EQ(again->junit, first->junit);
  EXPECT_EQ(again->html, first->html);
  EXPECT_EQ(again->github_annotations, first->github_annotations);
  EXPECT_EQ(again->github_summary, first->github_summary);
  EXPECT_EQ(again->exit_code, first->exit_code);
  EXPECT_EQ(first->exit_code, 3);
  // The page drew the layer's section from its response.
  EXPECT_THAT(first->html, HasSubstr("<h3>Summary</h3>"));
  const auto j = nlohmann::ordered_json::parse(first->stdout_text);
  EXPECT_EQ(j["diagnose"], true);
  EXPECT_EQ(j["bound_threshold"], 2.5);
  EXPECT_EQ(j["layers"][0]["response"]["observedVsReference"]["boundRatio"], "NaN");
  EXPECT_EQ(j["layers"][1]["error_code"], "UNAVAILABLE");
  EXPECT_TRUE(j["layers"][1]["response"].is_null());
  EXPECT_TRUE(j["layers"][2]["error_code"].is_null());
  // A proto map prints in one order, its keys sorted: the same response,
  // the same text.
  std::vector<std::string> keys;
  for (const auto& [key, value] : j["layers"][0]["response"]["results"][0]["details"].items()) {
    keys.push_back(key);
  }
  EXPECT_EQ(keys, (std::vector<std::string>{"algo", "blas", "k", "m", "z"}));
}

TEST(RenderSweepTest, TheFrameworkAndModelTitleThePageAndRoundTrip) {
  SweepReport report = *ParseSweepReport(
      Broken(R"("diagnose": true)", R"("diagnose": true, "framework": "torch", "model": "gpt2")"));
  EXPECT_EQ(report.options.framework, "torch");
  EXPECT_EQ(report.options.model, "gpt2");
  SweepRenderRequest want;
  want.json = want.html = true;
  auto out = RenderSweep(report, want);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(out->html, HasSubstr("<title>tensorcheck torch gpt2 report</title>"));
  EXPECT_THAT(out->html, HasSubstr("<h1>tensorcheck torch gpt2</h1>"));
  const auto j = nlohmann::ordered_json::parse(out->stdout_text);
  EXPECT_EQ(j["framework"], "torch");
  EXPECT_EQ(j["model"], "gpt2");
  // Without them: the sweep's own title, and no keys.
  auto plain = RenderSweep(*ParseSweepReport(kValidReport), want);
  ASSERT_TRUE(plain.ok());
  EXPECT_THAT(plain->html, HasSubstr("<h1>tensorcheck sweep</h1>"));
  EXPECT_FALSE(nlohmann::ordered_json::parse(plain->stdout_text).contains("model"));
  EXPECT_EQ(ParseError(Broken(R"("diagnose": true)", R"("diagnose": true, "model": 7)")),
            "model: a string expected, found 7");
}

TEST(RenderSweepTest, CapturesWithoutTheLayersOutputIsAnError) {
  SweepRenderRequest want;
  want.html = true;
  want.captures = "/nonexistent/captures.safetensors";
  auto out = RenderSweep(SweepReport{RoundTripLayers(), {}, {}}, want);
  ASSERT_FALSE(out.ok());
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("/nonexistent/captures.safetensors"));
}

}  // namespace
}  // namespace tensorcheck::cli::internal
