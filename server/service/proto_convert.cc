#include "server/service/proto_convert.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"

namespace tensorcheck {

namespace {

std::string BitsHex(uint64_t bits, DType dtype) {
  return absl::StrFormat("0x%0*x", static_cast<int>(ItemSize(dtype) * 2), bits);
}

void GroupsToProto(const std::vector<GroupCount>& groups,
                   google::protobuf::RepeatedPtrField<v1::Group>* out) {
  for (const GroupCount& g : groups) {
    v1::Group* p = out->Add();
    p->set_index(g.index);
    p->set_mismatched(g.mismatched);
    p->set_share(g.share);
  }
}

void ElementToProto(const ElementDiff& e, DType dtype, const std::vector<int64_t>& shape,
                    v1::Element* p) {
  for (int64_t i : UnflattenIndex(e.flat_index, shape)) p->add_index(i);
  p->set_actual(e.actual);
  p->set_expected(e.expected);
  p->set_actual_bits(BitsHex(e.actual_bits, dtype));
  p->set_expected_bits(BitsHex(e.expected_bits, dtype));
  p->set_abs_diff(e.abs_diff);
  p->set_rel_diff(e.rel_diff);
  p->set_ulp(e.ulp);
}

void StatsToProto(const DiffStats& s, const std::vector<int64_t>& shape, Precision bound_precision,
                  v1::Stats* p) {
  p->set_total(s.total);
  p->set_mismatched(s.mismatched);
  p->set_max_abs(s.max_abs);
  if (s.max_abs_index >= 0) {
    for (int64_t i : UnflattenIndex(s.max_abs_index, shape)) p->add_max_abs_index(i);
  }
  p->set_max_rel(s.max_rel);
  if (s.max_rel_index >= 0) {
    for (int64_t i : UnflattenIndex(s.max_rel_index, shape)) p->add_max_rel_index(i);
  }
  p->set_mean_abs(s.mean_abs);
  p->set_rms(s.rms);
  p->set_rel_l2(s.rel_l2);
  p->set_cosine(s.cosine);
  p->set_max_ulp(s.max_ulp);
  p->set_mean_ulp(s.mean_ulp);
  for (const UlpBucket& b : s.ulp_histogram) {
    v1::UlpBucket* pb = p->add_ulp_histogram();
    pb->set_lo(b.lo);
    pb->set_hi(b.hi);
    pb->set_count(b.count);
  }
  p->set_bitwise_equal(s.bitwise_equal);
  p->set_bitwise_equal_count(s.bitwise_equal_count);
  p->set_nan_actual(s.nan_actual);
  p->set_nan_expected(s.nan_expected);
  p->set_inf_actual(s.inf_actual);
  p->set_inf_expected(s.inf_expected);
  p->set_nan_mismatch(s.nan_mismatch);
  for (const ElementDiff& e : s.worst) {
    ElementToProto(e, s.compared_dtype, shape, p->add_worst());
  }
  GroupsToProto(s.top_columns, p->mutable_top_columns());
  GroupsToProto(s.top_rows, p->mutable_top_rows());
  if (s.bound_ratio.has_value()) {
    p->mutable_bound_ratio()->set_value(*s.bound_ratio);
    p->set_bound_precision(std::string(PrecisionName(bound_precision)));
  }
  p->set_compared_dtype(DTypeToProto(s.compared_dtype));
  p->set_passed(s.passed);
  if (s.negligible.has_value()) {
    v1::NegligibleElements* n = p->mutable_negligible();
    n->set_below(s.negligible->below);
    n->set_differing(s.negligible->differing);
    n->set_max_abs(s.negligible->max_abs);
    n->set_significant_max_ulp(s.negligible->significant_max_ulp);
    n->set_note(NegligibleNote(*s.negligible));
  }
}

Precision PrecisionOf(const std::string& config) {
  auto spec = ParseConfigSpec(config);
  return spec.ok() ? spec->precision : Precision::kFp32;
}

void BatchInvarianceToProto(const BatchInvarianceOutcome& b, v1::BatchInvariance* p) {
  p->set_invariant(b.invariant);
  p->set_rows(b.rows);
  p->set_rows_differing(b.rows_differing);
  p->set_max_ulp(b.max_ulp);
  p->mutable_full_batch_details()->insert(b.full_batch_details.begin(), b.full_batch_details.end());
  for (const SubBatchOutcome& s : b.sub_batches) {
    v1::SubBatch* ps = p->add_sub_batches();
    ps->set_batch_size(s.batch_size);
    ps->set_runs(s.runs);
    ps->set_rows_differing(s.rows_differing);
    ps->set_max_ulp(s.max_ulp);
    ps->mutable_details()->insert(s.details.begin(), s.details.end());
    ps->set_tail_rows(s.tail_rows);
    ps->mutable_tail_details()->insert(s.tail_details.begin(), s.tail_details.end());
  }
}

void ConfigOutcomeToProto(const ConfigOutcome& o, const std::vector<int64_t>& shape,
                          v1::ConfigResult* p) {
  p->set_config(o.config);
  const Precision precision = PrecisionOf(o.config);
  StatsToProto(o.vs_reference, shape, precision, p->mutable_vs_reference());
  if (o.vs_observed) {
    StatsToProto(*o.vs_observed, shape, precision, p->mutable_vs_observed());
  }
  p->set_elapsed_ms(o.elapsed_ms);
  if (o.output) TensorToProto(*o.output, p->mutable_output());
  for (const auto& [k, v] : o.details) (*p->mutable_details())[k] = v;
  p->set_deterministic(o.deterministic);
  p->set_runs(o.runs);
  p->set_shared_computation(o.shared_computation);
  if (o.batch_invariance)
    BatchInvarianceToProto(*o.batch_invariance, p->mutable_batch_invariance());
}

v1::Tolerance::Preset PresetToProto(TolerancePreset p) {
  switch (p) {
    case TolerancePreset::kTorch:
      return v1::Tolerance::PRESET_TORCH;
    case TolerancePreset::kNumpy:
      return v1::Tolerance::PRESET_NUMPY;
    case TolerancePreset::kPolygraphy:
      return v1::Tolerance::PRESET_POLYGRAPHY;
    case TolerancePreset::kExplicit:
      return v1::Tolerance::PRESET_EXPLICIT;
    case TolerancePreset::kUlp:
      return v1::Tolerance::PRESET_ULP;
    case TolerancePreset::kBound:
      return v1::Tolerance::PRESET_BOUND;
  }
  return v1::Tolerance::PRESET_TORCH;
}

absl::StatusOr<TolerancePreset> PresetFromProto(int p) {
  switch (p) {
    case v1::Tolerance::PRESET_UNSPECIFIED:
    case v1::Tolerance::PRESET_TORCH:
      return TolerancePreset::kTorch;
    case v1::Tolerance::PRESET_NUMPY:
      return TolerancePreset::kNumpy;
    case v1::Tolerance::PRESET_POLYGRAPHY:
      return TolerancePreset::kPolygraphy;
    case v1::Tolerance::PRESET_EXPLICIT:
      return TolerancePreset::kExplicit;
    case v1::Tolerance::PRESET_ULP:
      return TolerancePreset::kUlp;
    case v1::Tolerance::PRESET_BOUND:
      return TolerancePreset::kBound;
  }
  return InvalidFieldError("tolerance.preset", "a Tolerance.Preset value (0..6)", absl::StrCat(p));
}

}  // namespace

absl::StatusOr<DType> DTypeFromProto(int dtype, absl::string_view field) {
  if (std::optional<DType> d = DTypeFromProto(dtype)) return *d;
  return InvalidFieldError(
      field,
      "DTYPE_FLOAT64, DTYPE_FLOAT32, DTYPE_FLOAT16, DTYPE_BFLOAT16, DTYPE_FLOAT8_E4M3FN or "
      "DTYPE_FLOAT8_E5M2",
      dtype == v1::DTYPE_UNSPECIFIED ? std::string("DTYPE_UNSPECIFIED") : absl::StrCat(dtype));
}

namespace {

// A tensor by digest: the stored bytes, borrowed (docs/api.md).
absl::StatusOr<Tensor> StoredTensor(const v1::Tensor& proto, DType dtype,
                                    const std::vector<int64_t>& shape, int64_t numel,
                                    absl::string_view field, const TensorSource& source) {
  // The prefix may be left out (the field's first documentation said so).
  std::string text = proto.digest();
  if (text.size() == 64 && text.find(':') == std::string::npos) text = "sha256:" + text;
  TC_ASSIGN_OR_RETURN(
      Digest digest, ParseDigest(text, StorageBytes(dtype, numel), absl::StrCat(field, ".digest")));
  absl::StatusOr<TensorStore::Blob> blob =
      source.store ? source.store.Get(digest)
                   : absl::NotFoundError("this server has no tensor store");
  if (!blob.ok()) {
    if (source.missing != nullptr) {
      DigestToProto(digest, source.missing->add_digests());
      source.missing->add_fields(std::string(field));
    }
    return Tensor();
  }
  const TensorStore::Blob& b = *blob;
  TC_ASSIGN_OR_RETURN(Tensor t, Tensor::Borrow(dtype, shape, b->data(), b->size(), b));
  // The digest names the bytes across requests: a GPU backend keeps the
  // tensor resident under it (docs/architecture.md, "Resident tensors"),
  // a copy per tenant, so that a fast first request never tells one
  // tenant that another used the same tensor.
  t.set_content_id(source.store.ns.whole_store()
                       ? digest.ToString()
                       : absl::StrCat(source.store.ns.tenant, "/", digest.ToString()));
  return t;
}

}  // namespace

absl::StatusOr<Tensor> TensorFromProto(const v1::Tensor& proto, absl::string_view field,
                                       const RequestLimits& limits, const TensorSource& source) {
  TC_ASSIGN_OR_RETURN(DType dtype, DTypeFromProto(proto.dtype(), absl::StrCat(field, ".dtype")));
  if (proto.source_case() != v1::Tensor::kData && proto.source_case() != v1::Tensor::kDigest) {
    return InvalidFieldError(field, "data (raw little-endian bytes) or digest", "neither");
  }
  const std::vector<int64_t> shape(proto.shape().begin(), proto.shape().end());
  // The shape must describe the bytes sent before their size is judged, so
  // that a huge declared shape with little data is INVALID_ARGUMENT however
  // huge (overflow included), and only consistent tensors over the limit
  // are RESOURCE_EXHAUSTED.
  const int64_t item = static_cast<int64_t>(ItemSize(dtype));
  TC_ASSIGN_OR_RETURN(int64_t numel,
                      CheckedNumel(shape, std::numeric_limits<int64_t>::max(), field));
  if (numel > std::numeric_limits<int64_t>::max() / item) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".shape ", ShapeString(shape), ": byte count overflows"));
  }
  if (proto.source_case() == v1::Tensor::kDigest) {
    return StoredTensor(proto, dtype, shape, numel, field, source);
  }
  const int64_t expected = StorageBytes(dtype, numel);
  if (static_cast<int64_t>(proto.data().size()) != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".data: ", expected, " bytes expected (", numel, " elements of ", DTypeName(dtype),
        " for shape ", ShapeString(shape), "), got ", proto.data().size()));
  }
  if (expected > limits.max_tensor_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(field, ": ", expected,
                                                     " bytes exceed the limit of ",
                                                     limits.max_tensor_bytes, " bytes per tensor"));
  }
  return Tensor::FromBytes(dtype, shape, proto.data());
}

absl::StatusOr<Digest> DigestFromProto(const v1::TensorDigest& proto, absl::string_view field) {
  return ParseDigest(proto.hash(), proto.size_bytes(), field);
}

void DigestToProto(const Digest& digest, v1::TensorDigest* proto) {
  proto->set_hash(digest.ToString());
  proto->set_size_bytes(digest.size);
}

void TensorToProto(const Tensor& tensor, v1::Tensor* proto) {
  proto->set_dtype(DTypeToProto(tensor.dtype()));
  proto->clear_shape();
  for (int64_t d : tensor.shape()) proto->add_shape(d);
  proto->set_data(std::string(tensor.bytes()));
}

// FAILED_PRECONDITION with a kMissingTensorsTypeUrl payload naming the
// tensors of `missing`; OK when there are none.
absl::Status MissingTensorsError(const v1::MissingTensors& missing, const StoreView& store) {
  if (missing.digests_size() == 0) return absl::OkStatus();
  std::vector<std::string> named;
  for (int i = 0; i < missing.digests_size(); ++i) {
    named.push_back(absl::StrCat(missing.fields(i), " ", missing.digests(i).hash(), " (",
                                 missing.digests(i).size_bytes(), " bytes)"));
  }
  absl::Status status = absl::FailedPreconditionError(
      absl::StrCat("tensors not in the server's store: ", absl::StrJoin(named, ", "),
                   !store ? "; this server has no store: send them as data"
                          : "; upload them (UploadTensor) and retry"));
  status.SetPayload(kMissingTensorsTypeUrl, absl::Cord(missing.SerializeAsString()));
  return status;
}

absl::StatusOr<LinearRequest> FromProto(const v1::VerifyRequest& r, const RequestLimits& limits,
                                        StoreView store) {
  LinearRequest req;
  if (!r.has_op()) return InvalidFieldError("op", "a LinearOp", "none");
  const v1::LinearOp& op = r.op();
  if (!op.has_input()) return InvalidFieldError("op.input", "a tensor", "none");
  if (!op.has_weight()) return InvalidFieldError("op.weight", "a tensor", "none");
  if (r.configs_size() > limits.max_configs) {
    return absl::InvalidArgumentError(absl::StrCat("configs: at most ", limits.max_configs,
                                                   " configurations expected, got ",
                                                   r.configs_size()));
  }
  switch (op.weight_layout()) {
    case v1::WEIGHT_LAYOUT_UNSPECIFIED:
    case v1::WEIGHT_LAYOUT_OUT_IN:
      req.layout = WeightLayout::kOutIn;
      break;
    case v1::WEIGHT_LAYOUT_IN_OUT:
      req.layout = WeightLayout::kInOut;
      break;
    default:
      return InvalidFieldError("op.weight_layout", "WEIGHT_LAYOUT_OUT_IN or WEIGHT_LAYOUT_IN_OUT",
                               absl::StrCat(op.weight_layout()));
  }
  switch (op.activation()) {
    case v1::ACTIVATION_UNSPECIFIED:
    case v1::ACTIVATION_NONE:
      req.activation = Activation::kNone;
      break;
    case v1::ACTIVATION_RELU:
      req.activation = Activation::kRelu;
      break;
    case v1::ACTIVATION_GELU_TANH:
      req.activation = Activation::kGeluTanh;
      break;
    default:
      return InvalidFieldError("op.activation",
                               "ACTIVATION_NONE, ACTIVATION_RELU or ACTIVATION_GELU_TANH",
                               absl::StrCat(op.activation()));
  }
  if (op.output_dtype() != v1::DTYPE_UNSPECIFIED) {
    TC_ASSIGN_OR_RETURN(req.output_dtype, DTypeFromProto(op.output_dtype(), "op.output_dtype"));
  }
  v1::MissingTensors missing;
  const TensorSource source{store, &missing};
  TC_ASSIGN_OR_RETURN(req.input, TensorFromProto(op.input(), "op.input", limits, source));
  TC_ASSIGN_OR_RETURN(req.weight, TensorFromProto(op.weight(), "op.weight", limits, source));
  if (op.has_bias()) {
    TC_ASSIGN_OR_RETURN(req.bias, TensorFromProto(op.bias(), "op.bias", limits, source));
  }
  if (op.has_input_scale()) {
    TC_ASSIGN_OR_RETURN(req.input_scale,
                        TensorFromProto(op.input_scale(), "op.input_scale", limits, source));
  }
  if (op.has_weight_scale()) {
    TC_ASSIGN_OR_RETURN(req.weight_scale,
                        TensorFromProto(op.weight_scale(), "op.weight_scale", limits, source));
  }
  if (op.has_input_global_scale()) {
    TC_ASSIGN_OR_RETURN(
        req.input_global_scale,
        TensorFromProto(op.input_global_scale(), "op.input_global_scale", limits, source));
  }
  if (op.has_weight_global_scale()) {
    TC_ASSIGN_OR_RETURN(
        req.weight_global_scale,
        TensorFromProto(op.weight_global_scale(), "op.weight_global_scale", limits, source));
  }
  if (r.has_observed()) {
    TC_ASSIGN_OR_RETURN(req.observed, TensorFromProto(r.observed(), "observed", limits, source));
  }
  TC_RETURN_IF_ERROR(MissingTensorsError(missing, store));
  req.configs.assign(r.configs().begin(), r.configs().end());
  req.reference = r.reference();
  if (r.has_tolerance()) {
    const v1::Tolerance& t = r.tolerance();
    TC_ASSIGN_OR_RETURN(req.tolerance.preset, PresetFromProto(t.preset()));
    if (t.has_atol()) req.tolerance.atol = t.atol().value();
    if (t.has_rtol()) req.tolerance.rtol = t.rtol().value();
    req.tolerance.max_ulp = t.max_ulp();
    req.tolerance.bound_factor = t.bound_factor();
    req.tolerance.nan_equal = t.nan_equal();
    req.tolerance.bound_precision = t.bound_precision();
  }
  if (r.has_output()) {
    req.return_outputs = r.output().return_outputs();
    req.top_k = r.output().top_k();
    req.top_groups = r.output().top_groups();
  }
  req.repeat = r.repeat();
  req.disallow_reduced_precision_reduction = r.disallow_reduced_precision_reduction();
  req.algorithm_sweep = r.algorithm_sweep();
  req.batch_invariance = r.batch_invariance().enabled();
  req.batch_sizes.assign(r.batch_invariance().batch_sizes().begin(),
                         r.batch_invariance().batch_sizes().end());
  req.accept.assign(r.accept().begin(), r.accept().end());
  if (r.has_bound_threshold()) {
    const double threshold = r.bound_threshold().value();
    if (!(threshold > 0) || std::isinf(threshold)) {
      return InvalidFieldError("bound_threshold", "a positive finite number",
                               absl::StrCat(threshold));
    }
    req.bound_threshold = threshold;
  }
  req.gpu = r.gpu();  // checked by the engine (ParseGpuName)
  return req;
}

absl::StatusOr<CompareInput> FromProto(v1::CompareRequest* r, const RequestLimits& limits,
                                       StoreView store) {
  // The layer and the options as a VerifyRequest's (its tensors moved, not
  // copied), then each named output.
  v1::VerifyRequest as_verify;
  as_verify.mutable_op()->Swap(r->mutable_op());
  *as_verify.mutable_configs() = r->configs();
  as_verify.set_reference(r->reference());
  if (r->has_output()) *as_verify.mutable_output() = r->output();
  *as_verify.mutable_accept() = r->accept();
  CompareInput in;
  TC_ASSIGN_OR_RETURN(in.request, FromProto(as_verify, limits, store));
  v1::MissingTensors missing;
  const TensorSource source{store, &missing};
  for (int i = 0; i < r->observed_size(); ++i) {
    const v1::NamedTensor& named = r->observed(i);
    if (!named.has_tensor()) {
      return InvalidFieldError(absl::StrCat("observed[", i, "].tensor"), "a tensor", "none");
    }
    TC_ASSIGN_OR_RETURN(
        Tensor t,
        TensorFromProto(named.tensor(), absl::StrCat("observed[", i, "].tensor"), limits, source));
    in.observed.emplace_back(named.name(), std::move(t));
  }
  TC_RETURN_IF_ERROR(MissingTensorsError(missing, store));
  return in;
}

namespace {

v1::Diagnosis::Verdict VerdictToProto(DiagnosisVerdict v) {
  switch (v) {
    case DiagnosisVerdict::kRounding:
      return v1::Diagnosis::VERDICT_ROUNDING;
    case DiagnosisVerdict::kDefect:
      return v1::Diagnosis::VERDICT_DEFECT;
    case DiagnosisVerdict::kUnexplained:
      return v1::Diagnosis::VERDICT_UNEXPLAINED;
    case DiagnosisVerdict::kUnspecified:
      break;
  }
  return v1::Diagnosis::VERDICT_UNSPECIFIED;
}

void DefectGroupsToProto(const std::vector<DefectGroup>& groups,
                         google::protobuf::RepeatedPtrField<v1::DefectGroup>* out) {
  for (const DefectGroup& g : groups) {
    v1::DefectGroup* p = out->Add();
    p->set_index(g.index);
    p->set_disagreements(g.disagreements);
    p->set_expected_disagreements(g.expected_disagreements);
    p->set_p_value(g.p_value);
    p->set_beyond_threshold(g.beyond_threshold);
    p->set_max_ulp(g.max_ulp);
    p->set_max_sigma(g.max_sigma);
    p->set_shift_t(g.shift_t);
    p->set_shift_p_value(g.shift_p_value);
  }
}

void DefectToProto(const DefectReport& d, DType compared, const std::vector<int64_t>& shape,
                   v1::Defect* p) {
  p->set_element_threshold_sigma(d.element_threshold_sigma);
  p->set_false_alarm_rate(d.false_alarm_rate);
  p->set_element_count(d.element_count);
  for (const DefectElement& e : d.elements) {
    v1::DefectElement* pe = p->add_elements();
    ElementToProto(e.element, compared, shape, pe->mutable_element());
    pe->set_sigma(e.sigma);
  }
  DefectGroupsToProto(d.columns, p->mutable_columns());
  DefectGroupsToProto(d.rows, p->mutable_rows());
  p->set_max_ulp(d.max_ulp);
  p->set_max_sigma(d.max_sigma);
  p->set_where_to_look(d.where_to_look);
}

void DiagnosisToProto(const DiagnosisOutcome& d, const std::vector<int64_t>& shape,
                      v1::Diagnosis* pd) {
  if (d.best) pd->set_best(*d.best);
  for (const auto& e : d.equivalent) pd->add_equivalent(e);
  for (const auto& e : d.tied) pd->add_tied(e);
  pd->set_confidence(d.confidence);
  for (const RankedCandidate& c : d.ranking) {
    v1::RankedCandidate* pc = pd->add_ranking();
    pc->set_config(c.config);
    pc->set_bitwise_equal_fraction(c.bitwise_equal_fraction);
    pc->set_max_ulp(c.max_ulp);
    pc->set_mean_ulp(c.mean_ulp);
    if (c.bound_ratio) pc->mutable_bound_ratio()->set_value(*c.bound_ratio);
    for (const auto& e : c.equivalent) pc->add_equivalent(e);
    pc->set_disagreements(c.disagreements);
    pc->set_expected_disagreements(c.expected_disagreements);
    pc->set_plausibility_p(c.plausibility_p);
    pc->set_plausible(c.plausible);
    pc->set_consistent_fraction(c.consistent_fraction);
    pc->set_compared_elements(c.compared_elements);
    pc->set_ruled_out(c.ruled_out);
    pc->set_shared_computation(c.shared_computation);
    pc->set_exact(c.exact);
    pc->mutable_details()->insert(c.details.begin(), c.details.end());
    pc->set_framework_default(c.framework_default);
    pc->set_accepted(c.accepted);
  }
  pd->set_framework_hint(d.framework_hint);
  GroupsToProto(d.columns, pd->mutable_localization()->mutable_columns());
  GroupsToProto(d.rows, pd->mutable_localization()->mutable_rows());
  for (const ElementDiff& e : d.outliers) {
    ElementToProto(e, d.compared_dtype, shape, pd->mutable_localization()->add_outliers());
  }
  pd->set_explanation(d.explanation);
  pd->set_verdict(VerdictToProto(d.verdict));
  pd->set_verdict_reason(d.verdict_reason);
  if (d.defect) DefectToProto(*d.defect, d.compared_dtype, shape, pd->mutable_defect());
  pd->set_headline(d.headline);
  pd->set_advice(d.advice);
  pd->set_accepted(d.accepted);
  pd->set_accepted_as(d.accepted_as);
  for (int tier : d.candidate_tiers) pd->add_candidate_tiers(tier);
}

}  // namespace

void ToProto(const VerifyOutcome& o, v1::VerifyResponse* p) {
  p->set_verdict(o.passed ? v1::VERDICT_PASS : v1::VERDICT_FAIL);
  v1::Tolerance* t = p->mutable_tolerance();
  t->set_preset(PresetToProto(o.tolerance.preset));
  t->mutable_atol()->set_value(o.tolerance.atol);
  t->mutable_rtol()->set_value(o.tolerance.rtol);
  t->set_max_ulp(o.tolerance.max_ulp);
  t->set_bound_factor(o.tolerance.bound_factor);
  t->set_nan_equal(o.tolerance.nan_equal);
  if (o.observed_vs_reference) {
    StatsToProto(*o.observed_vs_reference, o.output_shape, o.observed_bound_precision,
                 p->mutable_observed_vs_reference());
    t->set_bound_precision(std::string(PrecisionName(o.observed_bound_precision)));
  }
  ConfigOutcomeToProto(o.reference, o.output_shape, p->mutable_reference());
  for (const ConfigOutcome& c : o.results) {
    ConfigOutcomeToProto(c, o.output_shape, p->add_results());
  }
  for (int64_t d : o.output_shape) p->add_output_shape(d);
  for (const std::string& n : o.notes) p->add_notes(n);
  if (o.diagnosis) DiagnosisToProto(*o.diagnosis, o.output_shape, p->mutable_diagnosis());
  v1::CallDecision* call = p->mutable_call();
  call->set_explained(o.call.explained);
  for (const std::string& c : o.call.explaining) call->add_explaining(c);
  call->set_divergence(o.call.divergence);
  call->set_bound_threshold(o.call.bound_threshold);
  call->set_bound_exceeded(o.call.bound_exceeded);
  call->set_bound_reason(o.call.bound_reason);
}

void ToProto(const CompareOutcome& o, v1::CompareResponse* p) {
  p->set_headline(o.headline);
  for (const ComparedOutcome& c : o.outputs) {
    v1::ComparedOutput* pc = p->add_outputs();
    pc->set_name(c.name);
    StatsToProto(c.vs_reference, o.output_shape, c.bound_precision, pc->mutable_vs_reference());
    DiagnosisToProto(c.diagnosis, o.output_shape, pc->mutable_diagnosis());
  }
  v1::OutputPair* pair = p->mutable_pair();
  pair->set_a(o.pair.a);
  pair->set_b(o.pair.b);
  if (!o.outputs.empty()) {
    StatsToProto(o.pair.stats, o.output_shape, o.outputs[0].bound_precision, pair->mutable_stats());
  }
  pair->set_rounding(o.pair.rounding);
  pair->set_configs_max_abs(o.pair.configs_max_abs);
  pair->set_expected_max_abs(o.pair.expected_max_abs);
  pair->set_advice_b_to_a(o.pair.advice_b_to_a);
  pair->set_advice_a_to_b(o.pair.advice_a_to_b);
  p->set_reference(o.reference);
  for (int64_t d : o.output_shape) p->add_output_shape(d);
  for (const std::string& n : o.notes) p->add_notes(n);
  if (o.verdict_set) p->set_verdict(o.passed ? v1::VERDICT_PASS : v1::VERDICT_FAIL);
}

}  // namespace tensorcheck
