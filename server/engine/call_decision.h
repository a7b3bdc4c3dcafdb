// The per-call decisions of a whole-model check (docs/model-checks.md,
// "The rules"): which configurations explain the output, whether the call
// diverges on its own and why, and the bound_ratio threshold's decision.
// The server makes them once; the CLI, Python and Go read them from the
// response (VerifyResponse.call) and keep only what spans calls.
//
//   VerifyOutcome outcome = ...;            // Engine::Verify or Diagnose
//   outcome.call = DecideCall(request, outcome);
//   outcome.call.explaining;                 // {"cpu:bf16:none", "cpu:bf16:fused", ...}
#pragma once

#include "server/engine/engine.h"

namespace tensorcheck {

// Decides from the outcome (its diagnosis when it has one, else its
// verdict) and the request (the bias, the threshold). Pure: no I/O.
CallDecision DecideCall(const LinearRequest& request, const VerifyOutcome& outcome);

// `b:p:none` without a bias stands for `b:p:fused` and `b:p:unfused` too:
// the configurations `explaining` lists, in order, without repeats.
std::vector<std::string> ExpandExplaining(const std::vector<std::string>& configs, bool has_bias);

}  // namespace tensorcheck
