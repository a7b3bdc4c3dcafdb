// The JSON report of docs/json-report.md and the capabilities as JSON
// (declared in report.h).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "client/cli/internal/json_values.h"
#include "client/cli/internal/report_format.h"
#include "client/cli/report.h"

namespace tensorcheck::cli {

using internal::DTypeJson;
using internal::JsonGroups;
using internal::JsonNumber;
using internal::JsonStrings;
using internal::JsonUlp;
using internal::kUlpInfinite;
using internal::NegligibleJson;
using internal::PresetName;
using internal::VerdictName;

namespace internal {

nlohmann::ordered_json JsonNumber(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

nlohmann::ordered_json JsonUlp(uint64_t v) {
  if (v == kUlpInfinite) return "inf";
  return v;
}

nlohmann::ordered_json JsonGroups(const google::protobuf::RepeatedPtrField<pb::Group>& groups) {
  nlohmann::ordered_json a = nlohmann::ordered_json::array();
  for (const pb::Group& g : groups) {
    nlohmann::ordered_json j;
    j["index"] = g.index();
    j["mismatched"] = g.mismatched();
    j["share"] = JsonNumber(g.share());
    a.push_back(std::move(j));
  }
  return a;
}

nlohmann::ordered_json JsonStrings(const google::protobuf::RepeatedPtrField<std::string>& v) {
  nlohmann::ordered_json a = nlohmann::ordered_json::array();
  for (const std::string& x : v) a.push_back(x);
  return a;
}

nlohmann::ordered_json NegligibleJson(const pb::Stats& s) {
  if (!s.has_negligible()) return nullptr;
  const pb::NegligibleElements& n = s.negligible();
  nlohmann::ordered_json j;
  j["below"] = JsonNumber(n.below());
  j["differing"] = n.differing();
  j["max_abs"] = JsonNumber(n.max_abs());
  j["significant_max_ulp"] = JsonUlp(n.significant_max_ulp());
  j["note"] = n.note();
  return j;
}

}  // namespace internal

namespace {

using Json = nlohmann::ordered_json;

Json Wrapped(bool has, const google::protobuf::DoubleValue& v) {
  if (!has) return nullptr;
  return JsonNumber(v.value());
}

template <typename Repeated>
Json IntList(const Repeated& r) {
  Json a = Json::array();
  for (auto v : r) a.push_back(v);
  return a;
}

Json ElementJson(const pb::Element& e) {
  Json j;
  j["index"] = IntList(e.index());
  j["actual"] = JsonNumber(e.actual());
  j["expected"] = JsonNumber(e.expected());
  j["actual_bits"] = e.actual_bits();
  j["expected_bits"] = e.expected_bits();
  j["abs_diff"] = JsonNumber(e.abs_diff());
  j["rel_diff"] = JsonNumber(e.rel_diff());
  j["ulp"] = JsonUlp(e.ulp());
  return j;
}

Json StatsJson(const pb::Stats& s) {
  Json j;
  j["total"] = s.total();
  j["mismatched"] = s.mismatched();
  j["max_abs"] = JsonNumber(s.max_abs());
  j["max_abs_index"] = IntList(s.max_abs_index());
  j["max_rel"] = JsonNumber(s.max_rel());
  j["max_rel_index"] = IntList(s.max_rel_index());
  j["mean_abs"] = JsonNumber(s.mean_abs());
  j["rms"] = JsonNumber(s.rms());
  j["rel_l2"] = JsonNumber(s.rel_l2());
  j["cosine"] = JsonNumber(s.cosine());
  j["max_ulp"] = JsonUlp(s.max_ulp());
  j["mean_ulp"] = JsonNumber(s.mean_ulp());
  j["bitwise_equal"] = s.bitwise_equal();
  j["bitwise_equal_count"] = s.bitwise_equal_count();
  Json hist = Json::array();
  for (const pb::UlpBucket& b : s.ulp_histogram()) {
    Json h;
    h["lo"] = JsonUlp(b.lo());
    h["hi"] = JsonUlp(b.hi());
    h["count"] = b.count();
    hist.push_back(std::move(h));
  }
  j["ulp_histogram"] = std::move(hist);
  j["nan_actual"] = s.nan_actual();
  j["nan_expected"] = s.nan_expected();
  j["inf_actual"] = s.inf_actual();
  j["inf_expected"] = s.inf_expected();
  j["nan_mismatch"] = s.nan_mismatch();
  Json worst = Json::array();
  for (const pb::Element& e : s.worst()) worst.push_back(ElementJson(e));
  j["worst"] = std::move(worst);
  j["top_columns"] = JsonGroups(s.top_columns());
  j["top_rows"] = JsonGroups(s.top_rows());
  j["bound_ratio"] = Wrapped(s.has_bound_ratio(), s.bound_ratio());
  j["bound_precision"] = s.bound_precision();
  j["compared_dtype"] = DTypeJson(s.compared_dtype());
  j["passed"] = s.passed();
  j["negligible"] = NegligibleJson(s);
  return j;
}

// A proto map as a JSON object, keys sorted: proto maps have no order.
Json DetailsJson(const google::protobuf::Map<std::string, std::string>& m) {
  std::vector<std::pair<std::string, std::string>> details(m.begin(), m.end());
  std::sort(details.begin(), details.end());
  Json d = Json::object();
  for (const auto& [k, v] : details) d[k] = v;
  return d;
}

Json BatchInvarianceJson(const pb::BatchInvariance& b) {
  Json j;
  j["invariant"] = b.invariant();
  j["rows"] = b.rows();
  j["rows_differing"] = b.rows_differing();
  j["max_ulp"] = JsonUlp(b.max_ulp());
  j["full_batch_details"] = DetailsJson(b.full_batch_details());
  Json subs = Json::array();
  for (const pb::SubBatch& s : b.sub_batches()) {
    Json sj;
    sj["batch_size"] = s.batch_size();
    sj["runs"] = s.runs();
    sj["rows_differing"] = s.rows_differing();
    sj["max_ulp"] = JsonUlp(s.max_ulp());
    sj["details"] = DetailsJson(s.details());
    sj["tail_rows"] = s.tail_rows();
    sj["tail_details"] = DetailsJson(s.tail_details());
    subs.push_back(std::move(sj));
  }
  j["sub_batches"] = std::move(subs);
  return j;
}

Json ConfigResultJson(const pb::ConfigResult& c) {
  Json j;
  j["config"] = c.config();
  j["vs_reference"] = c.has_vs_reference() ? StatsJson(c.vs_reference()) : Json();
  j["vs_observed"] = c.has_vs_observed() ? StatsJson(c.vs_observed()) : Json();
  j["elapsed_ms"] = JsonNumber(c.elapsed_ms());
  j["details"] = DetailsJson(c.details());
  j["deterministic"] = c.deterministic();
  j["runs"] = c.runs();
  j["shared_computation"] = c.shared_computation();
  // null when the request did not ask (unset messages are null).
  j["batch_invariance"] =
      c.has_batch_invariance() ? BatchInvarianceJson(c.batch_invariance()) : Json();
  return j;
}

Json ToleranceJson(const pb::Tolerance& t) {
  Json j;
  j["preset"] = PresetName(t.preset());
  j["atol"] = Wrapped(t.has_atol(), t.atol());
  j["rtol"] = Wrapped(t.has_rtol(), t.rtol());
  j["max_ulp"] = JsonUlp(t.max_ulp());
  // "0 means 1" in the API; the report shows the factor as applied.
  j["bound_factor"] = JsonNumber(t.bound_factor() == 0 ? 1.0 : t.bound_factor());
  j["nan_equal"] = t.nan_equal();
  return j;
}

Json DefectGroupsJson(const google::protobuf::RepeatedPtrField<pb::DefectGroup>& groups) {
  Json a = Json::array();
  for (const pb::DefectGroup& g : groups) {
    Json j;
    j["index"] = g.index();
    j["disagreements"] = g.disagreements();
    j["expected_disagreements"] = JsonNumber(g.expected_disagreements());
    j["p_value"] = JsonNumber(g.p_value());
    j["beyond_threshold"] = g.beyond_threshold();
    j["max_ulp"] = JsonUlp(g.max_ulp());
    j["max_sigma"] = JsonNumber(g.max_sigma());
    j["shift_t"] = JsonNumber(g.shift_t());
    j["shift_p_value"] = JsonNumber(g.shift_p_value());
    a.push_back(std::move(j));
  }
  return a;
}

Json DefectJson(const pb::Defect& f) {
  Json j;
  j["element_threshold_sigma"] = JsonNumber(f.element_threshold_sigma());
  j["false_alarm_rate"] = JsonNumber(f.false_alarm_rate());
  j["element_count"] = f.element_count();
  Json elements = Json::array();
  for (const pb::DefectElement& e : f.elements()) {
    Json x;
    x["element"] = e.has_element() ? ElementJson(e.element()) : Json();
    x["sigma"] = JsonNumber(e.sigma());
    elements.push_back(std::move(x));
  }
  j["elements"] = std::move(elements);
  j["columns"] = DefectGroupsJson(f.columns());
  j["rows"] = DefectGroupsJson(f.rows());
  j["max_ulp"] = JsonUlp(f.max_ulp());
  j["max_sigma"] = JsonNumber(f.max_sigma());
  j["where_to_look"] = f.where_to_look();
  return j;
}

Json DiagnosisJson(const pb::Diagnosis& d) {
  Json j;
  j["best"] = d.best().empty() ? Json() : Json(d.best());
  j["equivalent"] = JsonStrings(d.equivalent());
  j["tied"] = JsonStrings(d.tied());
  j["confidence"] = JsonNumber(d.confidence());
  Json ranking = Json::array();
  for (const pb::RankedCandidate& c : d.ranking()) {
    Json r;
    r["config"] = c.config();
    r["bitwise_equal_fraction"] = JsonNumber(c.bitwise_equal_fraction());
    r["max_ulp"] = JsonUlp(c.max_ulp());
    r["mean_ulp"] = JsonNumber(c.mean_ulp());
    r["bound_ratio"] = Wrapped(c.has_bound_ratio(), c.bound_ratio());
    r["equivalent"] = JsonStrings(c.equivalent());
    r["disagreements"] = c.disagreements();
    r["expected_disagreements"] = JsonNumber(c.expected_disagreements());
    r["plausibility_p"] = JsonNumber(c.plausibility_p());
    r["plausible"] = c.plausible();
    r["consistent_fraction"] = JsonNumber(c.consistent_fraction());
    r["compared_elements"] = c.compared_elements();
    r["ruled_out"] = c.ruled_out();
    r["shared_computation"] = c.shared_computation();
    r["exact"] = c.exact();
    r["details"] = DetailsJson(c.details());
    r["framework_default"] = c.framework_default();
    r["accepted"] = c.accepted();
    ranking.push_back(std::move(r));
  }
  j["ranking"] = std::move(ranking);
  j["framework_hint"] = d.framework_hint();
  Json loc;
  loc["columns"] = JsonGroups(d.localization().columns());
  loc["rows"] = JsonGroups(d.localization().rows());
  Json outliers = Json::array();
  for (const pb::Element& e : d.localization().outliers()) {
    outliers.push_back(ElementJson(e));
  }
  loc["outliers"] = std::move(outliers);
  j["localization"] = std::move(loc);
  j["explanation"] = d.explanation();
  // The server's verdict, after the older keys ("" and null from a server
  // that predates it).
  j["verdict"] = VerdictName(d.verdict());
  j["verdict_reason"] = d.verdict_reason();
  j["defect"] = d.has_defect() ? DefectJson(d.defect()) : Json();
  // The answer in words, what to change, and the acceptance ("" and false
  // from a server that predates them).
  j["headline"] = d.headline();
  j["advice"] = d.advice();
  j["accepted"] = d.accepted();
  j["accepted_as"] = d.accepted_as();
  // The tiers of default candidates that ran: [1], or [1, 2] when the
  // second tier ran too; [] when the request named its candidates (or from
  // a server that predates the tiers).
  Json tiers = Json::array();
  for (int32_t t : d.candidate_tiers()) tiers.push_back(t);
  j["candidate_tiers"] = std::move(tiers);
  return j;
}

Json VerdictJson(pb::Verdict v) {
  switch (v) {
    case pb::VERDICT_PASS:
      return "pass";
    case pb::VERDICT_FAIL:
      return "fail";
    default:
      return nullptr;
  }
}

}  // namespace

nlohmann::ordered_json VerifyResponseToJson(const pb::VerifyResponse& r) {
  Json j;
  j["verdict"] = VerdictJson(r.verdict());
  j["tolerance"] = ToleranceJson(r.tolerance());
  j["observed_vs_reference"] =
      r.has_observed_vs_reference() ? StatsJson(r.observed_vs_reference()) : Json();
  j["reference"] = r.has_reference() ? ConfigResultJson(r.reference()) : Json();
  Json results = Json::array();
  for (const pb::ConfigResult& c : r.results()) results.push_back(ConfigResultJson(c));
  j["results"] = std::move(results);
  j["output_shape"] = IntList(r.output_shape());
  j["notes"] = JsonStrings(r.notes());
  j["diagnosis"] = r.has_diagnosis() ? DiagnosisJson(r.diagnosis()) : Json();
  return j;
}

nlohmann::ordered_json CompareResponseToJson(const pb::CompareResponse& r) {
  Json j;
  j["headline"] = r.headline();
  Json outputs = Json::array();
  for (const pb::ComparedOutput& o : r.outputs()) {
    Json x;
    x["name"] = o.name();
    x["vs_reference"] = o.has_vs_reference() ? StatsJson(o.vs_reference()) : Json();
    x["diagnosis"] = o.has_diagnosis() ? DiagnosisJson(o.diagnosis()) : Json();
    outputs.push_back(std::move(x));
  }
  j["outputs"] = std::move(outputs);
  if (r.has_pair()) {
    const pb::OutputPair& p = r.pair();
    Json x;
    x["a"] = p.a();
    x["b"] = p.b();
    x["stats"] = p.has_stats() ? StatsJson(p.stats()) : Json();
    x["rounding"] = p.rounding();
    x["configs_max_abs"] = JsonNumber(p.configs_max_abs());
    x["expected_max_abs"] = JsonNumber(p.expected_max_abs());
    x["advice_b_to_a"] = p.advice_b_to_a();
    x["advice_a_to_b"] = p.advice_a_to_b();
    j["pair"] = std::move(x);
  } else {
    j["pair"] = nullptr;
  }
  j["reference"] = r.reference();
  j["output_shape"] = IntList(r.output_shape());
  j["notes"] = JsonStrings(r.notes());
  j["verdict"] = VerdictJson(r.verdict());
  return j;
}

nlohmann::ordered_json CapabilitiesToJson(const pb::GetCapabilitiesResponse& r) {
  Json j;
  j["server_version"] = r.server_version();
  Json backends = Json::array();
  for (const pb::BackendInfo& b : r.backends()) {
    Json x;
    x["name"] = b.name();
    x["available"] = b.available();
    x["unavailable_reason"] = b.unavailable_reason();
    x["precisions"] = JsonStrings(b.precisions());
    x["bias_modes"] = JsonStrings(b.bias_modes());
    x["configs"] = JsonStrings(b.configs());
    if (b.has_device()) {
      Json d;
      d["name"] = b.device().name();
      d["compute_capability"] = b.device().compute_capability();
      d["memory_bytes"] = b.device().memory_bytes();
      d["driver_version"] = b.device().driver_version();
      d["runtime_version"] = b.device().runtime_version();
      d["cublas_version"] = b.device().cublas_version();
      x["device"] = std::move(d);
    } else {
      x["device"] = nullptr;
    }
    Json dtypes = Json::array();
    for (int d : b.storage_dtypes()) dtypes.push_back(DTypeJson(static_cast<pb::DType>(d)));
    x["storage_dtypes"] = std::move(dtypes);
    backends.push_back(std::move(x));
  }
  j["backends"] = std::move(backends);
  if (r.has_limits()) {
    Json l;
    l["max_message_bytes"] = r.limits().max_message_bytes();
    l["max_tensor_bytes"] = r.limits().max_tensor_bytes();
    l["max_configs"] = r.limits().max_configs();
    l["max_rank"] = r.limits().max_rank();
    l["max_top_k"] = r.limits().max_top_k();
    l["max_repeat"] = r.limits().max_repeat();
    j["limits"] = std::move(l);
  } else {
    j["limits"] = nullptr;
  }
  j["default_reference"] = r.default_reference();
  j["tolerance_presets"] = JsonStrings(r.tolerance_presets());
  j["tensor_store"] = r.tensor_store();
  if (r.has_store()) {
    const pb::StoreInfo& s = r.store();
    Json st;
    st["present"] = s.present();
    st["budget_bytes"] = s.budget_bytes();
    st["bytes_used"] = s.bytes_used();
    st["tensor_count"] = s.tensor_count();
    st["largest_tensor_bytes"] = s.largest_tensor_bytes();
    st["chunk_bytes"] = s.chunk_bytes();
    st["max_tensor_bytes"] = s.max_tensor_bytes();
    st["persistent"] = s.persistent();
    st["partial_upload_seconds"] = s.partial_upload_seconds();
    st["inline_output_bytes"] = s.inline_output_bytes();
    st["uploads"] = s.uploads();
    st["uploaded_bytes"] = s.uploaded_bytes();
    st["evictions"] = s.evictions();
    st["partial_uploads"] = s.partial_uploads();
    st["partial_bytes"] = s.partial_bytes();
    j["store"] = std::move(st);
  } else {
    j["store"] = nullptr;
  }
  return j;
}

}  // namespace tensorcheck::cli
