#include "server/engine/call_decision.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace tensorcheck {
namespace {

void AddOnce(std::vector<std::string>* out, std::string name) {
  if (std::find(out->begin(), out->end(), name) == out->end()) out->push_back(std::move(name));
}

const char* DivergingVerdictName(DiagnosisVerdict v) {
  switch (v) {
    case DiagnosisVerdict::kDefect:
      return "defect";
    case DiagnosisVerdict::kUnexplained:
      return "unexplained";
    default:
      return nullptr;
  }
}

}  // namespace

std::vector<std::string> ExpandExplaining(const std::vector<std::string>& configs, bool has_bias) {
  std::vector<std::string> out;
  for (const std::string& config : configs) {
    AddOnce(&out, config);
    if (has_bias) continue;
    const std::vector<std::string> parts = absl::StrSplit(config, ':');
    if (parts.size() == 3 && parts[2] == "none") {
      AddOnce(&out, absl::StrCat(parts[0], ":", parts[1], ":fused"));
      AddOnce(&out, absl::StrCat(parts[0], ":", parts[1], ":unfused"));
    }
  }
  return out;
}

CallDecision DecideCall(const LinearRequest& request, const VerifyOutcome& outcome) {
  CallDecision call;
  const bool has_bias = request.bias.has_value();
  if (outcome.diagnosis.has_value()) {
    const DiagnosisOutcome& d = *outcome.diagnosis;
    call.explained = d.best.has_value();
    if (call.explained) {
      std::vector<std::string> names{*d.best};
      for (const auto* list : {&d.equivalent, &d.tied}) {
        for (const std::string& e : *list) AddOnce(&names, e);
      }
      call.explaining = ExpandExplaining(names, has_bias);
    }
  } else {
    call.explained = outcome.passed;
  }

  // The call's own divergence, the first rule that holds.
  const std::optional<DiffStats>& observed = outcome.observed_vs_reference;
  const int64_t nonfinite = observed.has_value() ? observed->nan_actual + observed->inf_actual : 0;
  if (nonfinite > 0) {
    call.divergence = absl::StrCat("its observed output holds ", nonfinite, " non-finite value",
                                   nonfinite == 1 ? "" : "s");
  } else if (outcome.diagnosis.has_value()) {
    const DiagnosisOutcome& d = *outcome.diagnosis;
    if (const char* name = DivergingVerdictName(d.verdict); name != nullptr) {
      call.divergence = !d.verdict_reason.empty() ? d.verdict_reason
                                                  : absl::StrCat("the server's verdict is ", name);
    } else if (!call.explained) {
      call.divergence = "no candidate explains its output";
    }
  }

  call.bound_threshold = request.bound_threshold.value_or(kDefaultBoundThreshold);
  if (observed.has_value() && observed->bound_ratio.has_value()) {
    const double ratio = *observed->bound_ratio;
    // NaN is not within the threshold either.
    call.bound_exceeded = !(ratio <= call.bound_threshold);
    if (call.bound_exceeded) {
      call.bound_reason =
          absl::StrFormat("bound_ratio %.3g exceeds %g", ratio, call.bound_threshold);
    }
  }
  return call;
}

}  // namespace tensorcheck
